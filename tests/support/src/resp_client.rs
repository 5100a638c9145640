//! A small blocking Redis-protocol client for tests: sends commands as arrays of bulk
//! strings (or raw bytes, to play a broken or hostile client) and reads RESP2/RESP3 replies.
//! The same client talks to cellrate's listener and to a real redis-server, so that their
//! answers are compared byte for byte where it matters.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    /// The integers of an array reply (panics on anything else: a test failure).
    pub fn integers(&self) -> Vec<i64> {
        match self {
            Reply::Array(items) => items
                .iter()
                .map(|i| match i {
                    Reply::Integer(n) => *n,
                    other => panic!("not an integer: {other:?}"),
                })
                .collect(),
            other => panic!("not an array: {other:?}"),
        }
    }
}

pub struct RespClient {
    reader: BufReader<TcpStream>,
}

impl RespClient {
    /// Connects to `addr`.
    pub fn connect(addr: &str) -> RespClient {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        RespClient::on(stream)
    }

    /// Connects to `addr` from the loopback address `local` (e.g. 127.0.0.2, another client
    /// host as the server sees it).
    pub async fn connect_from(addr: std::net::SocketAddr, local: std::net::IpAddr) -> RespClient {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(std::net::SocketAddr::new(local, 0)).unwrap();
        let stream = socket.connect(addr).await.unwrap().into_std().unwrap();
        stream.set_nonblocking(false).unwrap();
        RespClient::on(stream)
    }

    /// A client on a connected `stream`, with 10 s read and write timeouts.
    fn on(stream: TcpStream) -> RespClient {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        RespClient {
            reader: BufReader::new(stream),
        }
    }

    pub fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }

    /// Writes raw bytes.
    pub fn raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.reader.get_mut().write_all(bytes)
    }

    /// The encoding of one command.
    pub fn encode(args: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// Sends one command without reading its reply.
    pub fn send(&mut self, args: &[&str]) {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.raw(&RespClient::encode(&args)).unwrap();
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&str]) -> Reply {
        self.send(args);
        self.read()
            .unwrap_or_else(|e| panic!("reply to {args:?}: {e}"))
    }

    /// Reads one reply.
    pub fn read(&mut self) -> std::io::Result<Reply> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line)?;
        if line.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        if !line.ends_with(b"\r\n") {
            return Err(std::io::Error::other(format!("unended line {line:?}")));
        }
        let text = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        let number = || -> std::io::Result<i64> {
            text.parse()
                .map_err(|_| std::io::Error::other(format!("bad number {text:?}")))
        };
        Ok(match line[0] {
            b'+' => Reply::Simple(text.clone()),
            b'-' => Reply::Error(text.clone()),
            b':' => Reply::Integer(number()?),
            b'_' => Reply::Null,
            b'$' => {
                let len = number()?;
                if len < 0 {
                    return Ok(Reply::Null);
                }
                let mut value = vec![0; len as usize + 2];
                self.reader.read_exact(&mut value)?;
                value.truncate(len as usize);
                Reply::Bulk(value)
            }
            b'*' => {
                let len = number()?;
                if len < 0 {
                    return Ok(Reply::Null);
                }
                let mut items = Vec::new();
                for _ in 0..len {
                    items.push(self.read()?);
                }
                Reply::Array(items)
            }
            b'%' => {
                let len = number()?;
                let mut pairs = Vec::new();
                for _ in 0..len {
                    pairs.push((self.read()?, self.read()?));
                }
                Reply::Map(pairs)
            }
            other => {
                return Err(std::io::Error::other(format!(
                    "unknown reply type {:?}",
                    other as char
                )))
            }
        })
    }

    /// Whether the server closed the connection (reads end of file within 10 s).
    pub fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        match self.reader.read_to_end(&mut rest) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// The same client on tokio's sockets, for tests on paused time (`start_paused`): its waits
/// are the runtime's, so the pace it keeps and the server's deadlines read one clock that
/// the runtime moves on when nothing else can happen, and nothing waits in real time.
/// It reads the replies such tests need: simple strings, errors, integers, bulk strings,
/// arrays.
pub struct AsyncRespClient {
    reader: tokio::io::BufReader<tokio::net::TcpStream>,
}

impl AsyncRespClient {
    pub async fn connect(addr: std::net::SocketAddr) -> AsyncRespClient {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_nodelay(true).unwrap();
        AsyncRespClient {
            reader: tokio::io::BufReader::new(stream),
        }
    }

    /// Writes raw bytes.
    pub async fn raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.reader.get_mut().write_all(bytes).await
    }

    /// Sends one command without reading its reply.
    pub async fn send(&mut self, args: &[&str]) -> std::io::Result<()> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.raw(&RespClient::encode(&args)).await
    }

    /// Sends one command and reads its reply.
    pub async fn call(&mut self, args: &[&str]) -> Reply {
        self.send(args).await.unwrap();
        self.read()
            .await
            .unwrap_or_else(|e| panic!("reply to {args:?}: {e}"))
    }

    /// Reads one reply (within 10 s of the runtime's clock).
    pub async fn read(&mut self) -> std::io::Result<Reply> {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt};
        let within = Duration::from_secs(10);
        let mut line = Vec::new();
        tokio::time::timeout(within, self.reader.read_until(b'\n', &mut line)).await??;
        if line.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if !line.ends_with(b"\r\n") {
            return Err(std::io::Error::other(format!("unended line {line:?}")));
        }
        let text = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        let number = || {
            text.parse::<i64>()
                .map_err(|_| std::io::Error::other(format!("bad number {text:?}")))
        };
        Ok(match line[0] {
            b'+' => Reply::Simple(text.clone()),
            b'-' => Reply::Error(text.clone()),
            b':' => Reply::Integer(number()?),
            b'$' => {
                let mut value = vec![0; number()?.max(0) as usize + 2];
                self.reader.read_exact(&mut value).await?;
                value.truncate(value.len() - 2);
                Reply::Bulk(value)
            }
            b'*' => {
                let mut items = Vec::new();
                for _ in 0..number()?.max(0) {
                    items.push(Box::pin(self.read()).await?);
                }
                Reply::Array(items)
            }
            other => {
                return Err(std::io::Error::other(format!(
                    "not a reply this client reads: {:?}",
                    other as char
                )))
            }
        })
    }

    /// Whether the server closed the connection (reads end of file within 10 s of the
    /// runtime's clock).
    pub async fn closed(&mut self) -> bool {
        use tokio::io::AsyncReadExt;
        let mut rest = Vec::new();
        let within = Duration::from_secs(10);
        match tokio::time::timeout(within, self.reader.read_to_end(&mut rest)).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Err(_) => false,
        }
    }
}
