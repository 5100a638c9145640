//! RESP, the Redis serialization protocol: commands in (arrays of bulk strings, or inline
//! lines as typed at a terminal); the replies out are [`super::replies`].
//!
//! The parser is incremental and bounded: it keeps what it has parsed of a command between
//! reads (so a command trickled byte by byte is never re-scanned from its start), refuses
//! arrays, bulk strings, inline lines and whole commands above [`Bounds`], and answers a
//! malformed stream with a [`ProtocolError`] worded as Redis words it (the server replies
//! with it and closes the connection).

use bytes::{Buf, BytesMut};

use super::frame::{split_inline, Frame};

/// Size limits on what a client may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Elements in one command's array.
    pub max_args: usize,
    /// Bytes in one bulk string.
    pub max_bulk: usize,
    /// Bytes in one inline command line.
    pub max_inline: usize,
    /// Bytes in one whole command (headers included).
    pub max_command: usize,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            max_args: 64,
            max_bulk: 16 * 1024,
            max_inline: 16 * 1024,
            max_command: 64 * 1024,
        }
    }
}

/// A stream that is not RESP, or goes past [`Bounds`]: the connection ends after the reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

/// The longest `*<n>` or `$<n>` header line (sign, 19 digits and some slack).
const MAX_HEADER: usize = 32;

/// An incremental command parser (one per connection).
#[derive(Debug, Default)]
pub struct Parser {
    bounds: Bounds,
    /// Elements still due in the array under way (`None`: between commands).
    due: Option<usize>,
    /// The announced length of the bulk string under way.
    bulk: Option<usize>,
    /// Bytes of the read buffer the command under way has been read to (its arguments'
    /// spans are counted from the buffer's start, where the command begins).
    pos: usize,
    /// Bytes of the buffer already searched for the current line's end.
    scanned: usize,
    /// Bytes the command under way has taken so far.
    taken: usize,
    /// Bytes of the buffer the last command returned took: consumed at the next call.
    spent: usize,
}

impl Parser {
    pub fn new(bounds: Bounds) -> Parser {
        Parser {
            bounds,
            ..Parser::default()
        }
    }

    /// Whether a command has begun and is not complete (its bytes are due in time).
    pub fn in_command(&self, buf: &BytesMut) -> bool {
        self.due.is_some() || buf.len() > self.spent
    }

    /// Reads the next complete command in `buf` into `frame` (whose arguments are then
    /// [`Frame::args`] of `buf`, until the next call, which consumes its bytes); `false`
    /// if more bytes are needed. Empty commands (`*0`, `*-1`, blank lines) are skipped, as
    /// Redis skips them.
    pub fn next(&mut self, buf: &mut BytesMut, frame: &mut Frame) -> Result<bool, ProtocolError> {
        buf.advance(std::mem::take(&mut self.spent));
        loop {
            let Some(due) = self.due else {
                let Some(&first) = buf.first() else {
                    return Ok(false);
                };
                if first != b'*' {
                    match self.inline(buf, frame)? {
                        true if frame.spans.is_empty() => continue,
                        complete => return Ok(complete),
                    }
                }
                let Some((_, n)) = self.header(buf, "invalid multibulk length")? else {
                    return Ok(false);
                };
                let n = n.ok_or_else(|| error("invalid multibulk length"))?;
                if n > self.bounds.max_args as i64 {
                    return Err(ProtocolError(format!(
                        "a command of {n} arguments is above this server's maximum of {}",
                        self.bounds.max_args
                    )));
                }
                if n <= 0 {
                    buf.advance(std::mem::take(&mut self.pos));
                    self.taken = 0;
                    continue;
                }
                self.due = Some(n as usize);
                frame.begin_array(n as usize);
                continue;
            };
            if due == 0 {
                self.due = None;
                self.taken = 0;
                self.spent = std::mem::take(&mut self.pos);
                return Ok(true);
            }
            let len = match self.bulk {
                Some(len) => len,
                None => {
                    let Some((kind, len)) = self.header(buf, "invalid bulk length")? else {
                        return Ok(false);
                    };
                    if kind != b'$' {
                        return Err(ProtocolError(format!(
                            "expected '$', got '{}'",
                            printable(kind)
                        )));
                    }
                    let len = len
                        .filter(|&n| n >= 0)
                        .ok_or_else(|| error("invalid bulk length"))?
                        as usize;
                    if len > self.bounds.max_bulk {
                        return Err(ProtocolError(format!(
                            "a bulk string of {len} bytes is above this server's maximum of {}",
                            self.bounds.max_bulk
                        )));
                    }
                    self.bulk = Some(len);
                    len
                }
            };
            let start = self.pos;
            if buf.len() < start + len + 2 {
                self.charge(0, len + 2)?;
                return Ok(false);
            }
            if &buf[start + len..start + len + 2] != b"\r\n" {
                return Err(error("bulk string not ended by CRLF"));
            }
            self.charge(len + 2, 0)?;
            frame.spans.push((start, start + len));
            self.pos = start + len + 2;
            self.bulk = None;
            self.due = Some(due - 1);
        }
    }

    /// Counts `consumed` bytes against the command bound (and `pending` more to come).
    fn charge(&mut self, consumed: usize, pending: usize) -> Result<(), ProtocolError> {
        if self.taken + consumed + pending > self.bounds.max_command {
            return Err(ProtocolError(format!(
                "a command above this server's maximum of {} bytes",
                self.bounds.max_command
            )));
        }
        self.taken += consumed;
        Ok(())
    }

    /// One CRLF- (or LF-) ended header line of at most [`MAX_HEADER`] bytes at `pos`, read
    /// past: its first byte and the decimal length after it (`None` when that is not one).
    fn header(
        &mut self,
        buf: &BytesMut,
        too_long: &str,
    ) -> Result<Option<(u8, Option<i64>)>, ProtocolError> {
        // What clients send, read in one pass: the kind, 1 to 18 digits, CRLF. Anything
        // else (a sign, more digits, a bare LF, a line not yet whole) takes the general
        // path below, which reads it the same way.
        let rest = &buf[self.pos.min(buf.len())..];
        let digits = rest
            .iter()
            .skip(1)
            .take(18)
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits > 0 && rest.get(digits + 1..digits + 3) == Some(b"\r\n") {
            self.charge(digits + 3, 0)?;
            let n = rest[1..=digits]
                .iter()
                .fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'));
            self.pos += digits + 3;
            self.scanned = 0;
            return Ok(Some((rest[0], Some(n))));
        }
        let from = self.scanned.max(self.pos).min(buf.len());
        match buf[from..].iter().position(|&b| b == b'\n') {
            Some(at) => {
                let end = from + at;
                self.scanned = 0;
                if end - self.pos > MAX_HEADER {
                    return Err(error(too_long));
                }
                self.charge(end + 1 - self.pos, 0)?;
                let line = &buf[self.pos..end];
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let Some((&kind, digits)) = line.split_first() else {
                    return Err(error(too_long));
                };
                self.pos = end + 1;
                Ok(Some((kind, parse_length(digits))))
            }
            None if buf.len() - self.pos > MAX_HEADER => Err(error(too_long)),
            None => {
                self.scanned = buf.len();
                Ok(None)
            }
        }
    }

    /// An inline command: one line split into arguments as Redis splits it, into `frame`
    /// (the line is consumed at once).
    fn inline(&mut self, buf: &mut BytesMut, frame: &mut Frame) -> Result<bool, ProtocolError> {
        let from = self.scanned.min(buf.len());
        let Some(at) = buf[from..].iter().position(|&b| b == b'\n') else {
            if buf.len() > self.bounds.max_inline {
                return Err(error("too big inline request"));
            }
            self.scanned = buf.len();
            return Ok(false);
        };
        let end = from + at;
        self.scanned = 0;
        self.taken = 0;
        if end > self.bounds.max_inline {
            return Err(error("too big inline request"));
        }
        split_inline(&buf[..end], frame).map_err(|_| error("unbalanced quotes in request"))?;
        buf.advance(end + 1);
        if frame.spans.len() > self.bounds.max_args {
            return Err(ProtocolError(format!(
                "a command of {} arguments is above this server's maximum of {}",
                frame.spans.len(),
                self.bounds.max_args
            )));
        }
        Ok(true)
    }
}

fn error(what: &str) -> ProtocolError {
    ProtocolError(what.to_string())
}

fn printable(b: u8) -> char {
    if b.is_ascii_graphic() {
        b as char
    } else {
        '?'
    }
}

/// A decimal length (`-1`, `0`, `42`), as Redis reads it: digits only after an optional
/// minus sign, at most 19 of them.
fn parse_length(digits: &[u8]) -> Option<i64> {
    let (negative, digits) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    // Folded by hand from the bytes: a UTF-8 check and `str::parse` read them twice more,
    // some 50 instructions a length, and every command has six or seven (#62).
    let n = digits.iter().try_fold(0i64, |n, &d| match d {
        b'0'..=b'9' => n.checked_mul(10)?.checked_add(i64::from(d - b'0')),
        _ => None,
    })?;
    Some(if negative { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8], bounds: Bounds) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut parser = Parser::new(bounds);
        let mut buf = BytesMut::from(input);
        let mut frame = Frame::default();
        let mut out = Vec::new();
        while parser.next(&mut buf, &mut frame)? {
            out.push(frame.args(&buf).iter().map(|a| a.to_vec()).collect());
        }
        Ok(out)
    }

    /// The commands parsed from `parts` read one after another, and whether the parser is
    /// then between commands with nothing left in its buffer.
    fn fed<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> (Vec<Vec<Vec<u8>>>, bool) {
        let mut parser = Parser::new(Bounds::default());
        let mut frame = Frame::default();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for part in parts {
            buf.extend_from_slice(part);
            while parser.next(&mut buf, &mut frame).unwrap() {
                got.push(frame.args(&buf).iter().map(|a| a.to_vec()).collect());
            }
        }
        (got, buf.is_empty() && !parser.in_command(&buf))
    }

    fn args(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    #[test]
    fn arrays_and_inline_commands_pipelined() {
        let input =
            b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\nPING\r\n*0\r\n*-1\r\n\r\nCL.THROTTLE k 1 2 3\n";
        assert_eq!(
            all(input, Bounds::default()).unwrap(),
            vec![
                args(&["ECHO", "hi"]),
                args(&["PING"]),
                args(&["CL.THROTTLE", "k", "1", "2", "3"])
            ]
        );
    }

    #[test]
    fn a_command_trickled_byte_by_byte_is_parsed_once_complete() {
        let input = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nv\r\nxy\r\nPING hello\r\n";
        let (got, idle) = fed(input.chunks(1));
        assert_eq!(
            got,
            vec![
                vec![b"SET".to_vec(), b"k".to_vec(), b"v\r\nxy".to_vec()],
                args(&["PING", "hello"])
            ]
        );
        assert!(idle);
    }

    #[test]
    fn a_header_reads_the_same_on_its_fast_path_and_its_general_one() {
        let mut lines: Vec<Vec<u8>> = Vec::new();
        for kind in [b'$', b'*', b'x'] {
            for digits in ["", "0", "7", "-1", "+3", "3a", "00012", "-0"] {
                lines.push([&[kind][..], digits.as_bytes()].concat());
            }
            for len in 1..=21 {
                lines.push([&[kind][..], "9".repeat(len).as_bytes()].concat());
                lines.push([&[kind][..], "1".repeat(len).as_bytes()].concat());
            }
        }
        for line in lines {
            for end in [&b"\r\n"[..], b"\n"] {
                let input = [&line[..], end, b"rest"].concat();
                let mut parser = Parser::new(Bounds::default());
                let got = parser.header(&BytesMut::from(&input[..]), "bad");
                let expected = (line[0], parse_length(&line[1..]));
                match got {
                    Ok(Some(header)) => {
                        assert_eq!(header, expected, "{input:?}");
                        assert_eq!(parser.pos, line.len() + end.len(), "{input:?}");
                    }
                    other => assert!(line.len() > MAX_HEADER, "{input:?}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_pipeline_read_in_two_parts_at_every_cut_gives_the_same_commands() {
        let input: &[u8] = b"*3\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n$0\r\n\r\n*0\r\n\
            PING 'a b'\r\n\r\n*2\r\n$4\r\nECHO\r\n$4\r\nx\r\ny\r\n\"q\\x41\" z\n*-1\r\n";
        let whole = all(input, Bounds::default()).unwrap();
        assert_eq!(whole.len(), 4, "{whole:?}");
        assert_eq!(whole[1], vec![b"PING".to_vec(), b"a b".to_vec()]);
        assert_eq!(whole[3], vec![b"qA".to_vec(), b"z".to_vec()]);
        for cut in 0..=input.len() {
            let (got, idle) = fed([&input[..cut], &input[cut..]]);
            assert_eq!(got, whole, "cut at {cut}");
            assert!(idle, "cut at {cut}");
        }
    }

    #[test]
    fn malformed_streams_are_protocol_errors() {
        for (input, message) in [
            (&b"*x\r\n"[..], "invalid multibulk length"),
            (b"*2\r\nfoo\r\n", "expected '$', got 'f'"),
            (b"*1\r\n$-3\r\n", "invalid bulk length"),
            (b"*1\r\n$3\r\nabcde\r\n", "bulk string not ended by CRLF"),
            (b"*1\r\n$99999999999999999999\r\n", "invalid bulk length"),
            (b"*1\r\n$9223372036854775808\r\n", "invalid bulk length"),
            (b"*1\r\n$+3\r\n", "invalid bulk length"),
            (b"*1\r\n$3a\r\n", "invalid bulk length"),
            (b"*-\r\n", "invalid multibulk length"),
            (b"\"unbalanced\r\n", "unbalanced quotes in request"),
        ] {
            let err = all(input, Bounds::default()).unwrap_err();
            assert_eq!(err.0, message, "{input:?}");
        }
    }

    #[test]
    fn bounds_are_refused_before_the_bytes_arrive() {
        let bounds = Bounds {
            max_args: 3,
            max_bulk: 10,
            max_inline: 20,
            max_command: 36,
        };
        // Each refused on its header alone: nothing of the announced size is buffered.
        let err = all(b"*4\r\n", bounds).unwrap_err();
        assert!(err.0.contains("4 arguments"), "{err}");
        let err = all(b"*1\r\n$11\r\n", bounds).unwrap_err();
        assert!(err.0.contains("11 bytes"), "{err}");
        let err = all(b"*3\r\n$10\r\n0123456789\r\n$10\r\n", bounds).unwrap_err();
        assert!(err.0.contains("maximum of 36 bytes"), "{err}");
        // An inline line past its bound, with or without its end yet.
        assert!(all(&[b'a'; 21], bounds).is_err());
        assert!(all(b"a b c d\r\n", bounds).is_err());
        // A header line that never ends.
        assert!(all(&[b'*'; 40], bounds).is_err());
        // Within every bound: fine.
        assert_eq!(
            all(b"*2\r\n$4\r\nECHO\r\n$10\r\n0123456789\r\n", bounds)
                .unwrap()
                .len(),
            1
        );
    }
}
