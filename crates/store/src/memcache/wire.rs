//! memcached's text protocol, the few commands the store sends (`get`, `incr`, `decr`,
//! `add`, `delete`), over one connection, every reply bounded: a line is at most
//! [`MAX_LINE`] bytes, a value at most [`MAX_VALUE`] (a counter is at most 20 digits), and a
//! `get` answers at most the keys it asked for, each at most once. A reply outside these
//! bounds is malformed: the connection is dropped, never read further.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest reply line read: `VALUE <key> <flags> <bytes> [<cas>]` with a 250-byte key
/// is under 300 bytes.
pub const MAX_LINE: usize = 512;

/// The largest value read: a counter is a decimal u64, at most 20 digits.
pub const MAX_VALUE: usize = 32;

/// Why a call on a connection failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum WireError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The server closed the connection.
    #[error("memcached closed the connection")]
    Closed,
    /// A reply that is not what was asked for, or beyond the bounds.
    #[error("malformed reply: {0}")]
    Malformed(String),
    /// An `ERROR`, `CLIENT_ERROR` or `SERVER_ERROR` line.
    #[error("memcached answered {0:?}")]
    Server(String),
}

/// What one `incr`, `decr` or `add` got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    /// `incr` / `decr`: the counter's new value.
    Value(u64),
    /// `incr` / `decr` / `delete` of a key that is not there.
    NotFound,
    /// `add` / `delete`: done.
    Stored,
    /// `add` of a key that is already there.
    NotStored,
}

/// One connection: the stream and what was read past the last reply line.
pub(super) struct Conn {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl Conn {
    pub(super) fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            buffer: Vec::with_capacity(MAX_LINE),
        }
    }

    /// Whether the connection may still be used: the server has not closed it and sent
    /// nothing unasked (checked without waiting before an idle connection is reused).
    pub(super) fn is_usable(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(
            self.stream.try_read(&mut probe),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        ) && self.buffer.is_empty()
    }

    /// Sends `commands` (already encoded) in one write.
    pub(super) async fn send(&mut self, commands: &[u8]) -> Result<(), WireError> {
        self.stream.write_all(commands).await?;
        Ok(())
    }

    /// Reads one line (without its `\r\n`), at most [`MAX_LINE`] bytes.
    async fn line(&mut self) -> Result<Vec<u8>, WireError> {
        loop {
            if let Some(at) = self.buffer.windows(2).position(|w| w == b"\r\n") {
                let line = self.buffer[..at].to_vec();
                self.buffer.drain(..at + 2);
                return Ok(line);
            }
            if self.buffer.len() > MAX_LINE {
                return Err(WireError::Malformed(format!(
                    "a line longer than {MAX_LINE} bytes"
                )));
            }
            self.fill().await?;
        }
    }

    /// Reads more into the buffer, never past [`MAX_LINE`] + 2 + [`MAX_VALUE`] bytes held.
    async fn fill(&mut self) -> Result<(), WireError> {
        let mut chunk = [0u8; 1024];
        let room = (MAX_LINE + 2 + MAX_VALUE + 2).saturating_sub(self.buffer.len());
        let n = self.stream.read(&mut chunk[..room.clamp(1, 1024)]).await?;
        if n == 0 {
            return Err(WireError::Closed);
        }
        self.buffer.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// Reads exactly `n` bytes and the `\r\n` after them (`n` at most [`MAX_VALUE`]).
    async fn data(&mut self, n: usize) -> Result<Vec<u8>, WireError> {
        while self.buffer.len() < n + 2 {
            self.fill().await?;
        }
        if &self.buffer[n..n + 2] != b"\r\n" {
            return Err(WireError::Malformed("a value without its \\r\\n".into()));
        }
        let value = self.buffer[..n].to_vec();
        self.buffer.drain(..n + 2);
        Ok(value)
    }

    /// Reads the reply of a `get` of `keys`: each key's counter, `None` when it is not
    /// there.
    pub(super) async fn values(&mut self, keys: &[&str]) -> Result<Vec<Option<u64>>, WireError> {
        let mut found: Vec<Option<u64>> = vec![None; keys.len()];
        let mut seen = vec![false; keys.len()];
        loop {
            let line = self.line().await?;
            if line == b"END" {
                return Ok(found);
            }
            let text = std::str::from_utf8(&line)
                .map_err(|_| WireError::Malformed("a reply line that is not text".into()))?;
            let mut words = text.split(' ');
            let (Some("VALUE"), Some(key), Some(_flags), Some(bytes)) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return Err(error_or_malformed(text));
            };
            let i = keys
                .iter()
                .position(|k| *k == key)
                .filter(|&i| !seen[i])
                .ok_or_else(|| WireError::Malformed("a value of a key not asked for".into()))?;
            seen[i] = true;
            let bytes: usize = bytes
                .parse()
                .ok()
                .filter(|&b| b <= MAX_VALUE)
                .ok_or_else(|| WireError::Malformed(format!("a value over {MAX_VALUE} bytes")))?;
            let value = self.data(bytes).await?;
            found[i] = Some(counter(&value)?);
        }
    }

    /// Reads the reply of one `incr`, `decr`, `add` or `delete`.
    pub(super) async fn reply(&mut self) -> Result<Reply, WireError> {
        let line = self.line().await?;
        match &line[..] {
            b"NOT_FOUND" => Ok(Reply::NotFound),
            b"STORED" | b"DELETED" => Ok(Reply::Stored),
            b"NOT_STORED" => Ok(Reply::NotStored),
            digits => counter(digits).map(Reply::Value).map_err(|_| {
                error_or_malformed(&String::from_utf8_lossy(&digits[..digits.len().min(64)]))
            }),
        }
    }
}

/// A counter's decimal text.
fn counter(text: &[u8]) -> Result<u64, WireError> {
    std::str::from_utf8(text)
        .ok()
        .map(str::trim_end)
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| WireError::Malformed("a value that is not a counter".into()))
}

/// An error line as [`WireError::Server`], anything else as malformed.
fn error_or_malformed(line: &str) -> WireError {
    let shown =
        cellrate_core::text::printable(cellrate_core::text::cut_bytes(line, 64)).to_string();
    match line.starts_with("ERROR")
        || line.starts_with("CLIENT_ERROR")
        || line.starts_with("SERVER_ERROR")
    {
        true => WireError::Server(shown),
        false => WireError::Malformed(shown),
    }
}

/// `get k1 k2 ...`.
pub(super) fn get(keys: &[&str]) -> Vec<u8> {
    let mut out = b"get".to_vec();
    for key in keys {
        out.push(b' ');
        out.extend_from_slice(key.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// `incr <key> <n>` or `decr <key> <n>`.
pub(super) fn arithmetic(out: &mut Vec<u8>, verb: &str, key: &str, n: u64) {
    out.extend_from_slice(format!("{verb} {key} {n}\r\n").as_bytes());
}

/// `add <key> 0 <exptime> <bytes>` and the value.
pub(super) fn add(out: &mut Vec<u8>, key: &str, value: u64, exptime: u64) {
    let value = value.to_string();
    out.extend_from_slice(
        format!("add {key} 0 {exptime} {}\r\n{value}\r\n", value.len()).as_bytes(),
    );
}

/// `delete <key>`.
pub(super) fn delete(out: &mut Vec<u8>, key: &str) {
    out.extend_from_slice(format!("delete {key}\r\n").as_bytes());
}
