//! A small HTTP/1.1 client for the Envoy tests: one keep-alive connection, requests in
//! turn, every header of the answer kept (in order, repeats included) so that the tests see
//! exactly what a client of Envoy sees. Every read is bounded in time.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Bodies above this are a test failure, not something to buffer.
const MAX_BODY: usize = 1 << 20;

/// An HTTP answer: status, headers (names lower-cased) and body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// Every value of header `name`, in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The value of header `name` when it is present exactly once (a repeat fails the test).
    pub fn header(&self, name: &str) -> Option<&str> {
        let all = self.all(name);
        assert!(all.len() <= 1, "header {name} repeated: {all:?}");
        all.first().copied()
    }
}

/// One client connection.
pub struct Http1 {
    stream: BufReader<TcpStream>,
    host: String,
}

impl Http1 {
    pub async fn connect(addr: SocketAddr) -> Http1 {
        Http1::from_stream(TcpStream::connect(addr).await.unwrap(), addr)
    }

    /// A connection from the loopback address `source` (any 127.0.0.0/8 address works on
    /// Linux), so that a server sees another client address.
    pub async fn connect_from(source: std::net::IpAddr, addr: SocketAddr) -> Http1 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(source, 0)).unwrap();
        Http1::from_stream(socket.connect(addr).await.unwrap(), addr)
    }

    fn from_stream(stream: TcpStream, addr: SocketAddr) -> Http1 {
        stream.set_nodelay(true).unwrap();
        Http1 {
            stream: BufReader::new(stream),
            host: addr.to_string(),
        }
    }

    /// GET `path` with `headers`; the connection stays open for the next request.
    pub async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
        self.get_bytes(path, &headers).await
    }

    /// GET `path` with headers whose values are any bytes (not always UTF-8), as a client
    /// may send them.
    pub async fn get_bytes(&mut self, path: &str, headers: &[(&str, &[u8])]) -> Reply {
        let mut request = format!("GET {path} HTTP/1.1\r\nhost: {}\r\n", self.host).into_bytes();
        for (name, value) in headers {
            request.extend_from_slice(name.as_bytes());
            request.extend_from_slice(b": ");
            request.extend_from_slice(value);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"\r\n");
        self.stream.get_mut().write_all(&request).await.unwrap();
        tokio::time::timeout(READ_TIMEOUT, read_reply(&mut self.stream))
            .await
            .unwrap_or_else(|_| panic!("no answer to GET {path} within {READ_TIMEOUT:?}"))
    }
}

impl Http1 {
    /// `method` `path` with `headers` and `body` (its length sent); the connection stays
    /// open for the next request.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        // A `host` among `headers` is the request's host (AI Gateway's tests send
        // `Host: openai.com`); else the address connected to.
        let is_host = |name: &str| name.eq_ignore_ascii_case("host");
        let host = headers
            .iter()
            .find(|(name, _)| is_host(name))
            .map_or(self.host.as_str(), |(_, value)| value);
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (name, value) in headers.iter().filter(|(name, _)| !is_host(name)) {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        self.stream
            .get_mut()
            .write_all(request.as_bytes())
            .await
            .unwrap();
        tokio::time::timeout(READ_TIMEOUT, read_reply(&mut self.stream))
            .await
            .unwrap_or_else(|_| panic!("no answer to {method} {path} within {READ_TIMEOUT:?}"))
    }
}

async fn read_line(stream: &mut BufReader<TcpStream>) -> String {
    let mut line = String::new();
    let n = stream.read_line(&mut line).await.unwrap();
    assert!(n > 0, "connection closed before the answer ended");
    line.trim_end_matches(['\r', '\n']).to_string()
}

async fn read_reply(stream: &mut BufReader<TcpStream>) -> Reply {
    let status_line = read_line(stream).await;
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP status line: {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let line = read_line(stream).await;
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').expect("header line has a colon");
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        assert!(headers.len() < 200, "too many headers");
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(length) = find("content-length") {
        let length: usize = length.parse().unwrap();
        assert!(length <= MAX_BODY, "body of {length} bytes");
        body.resize(length, 0);
        stream.read_exact(&mut body).await.unwrap();
    } else if find("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        loop {
            let size = read_line(stream).await;
            let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
            assert!(
                body.len() + size <= MAX_BODY,
                "chunked body over {MAX_BODY} bytes"
            );
            let start = body.len();
            body.resize(start + size, 0);
            stream.read_exact(&mut body[start..]).await.unwrap();
            read_line(stream).await; // the CRLF after the chunk (or the trailer's end)
            if size == 0 {
                break;
            }
        }
    }
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// The server side, for the tests' own backends: the next request's head (request line
/// and headers) read from `stream`, past what `buffer` holds already (what follows the
/// head stays in `buffer`); `None` when the connection ends first or the head passes
/// 64 KiB (Envoy sends a few hundred bytes).
pub async fn read_head(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<String> {
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buffer.len() > 65_536 {
            return None;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buffer[..end]).to_string();
    buffer.drain(..end);
    Some(head)
}

/// The value of header `name` (any case) in a request head, trimmed.
pub fn head_header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, value) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// A test backend on a free loopback port: each connection served by `serve` with a
/// share of `state`, until the test's runtime ends.
pub async fn backend<S, F>(
    state: std::sync::Arc<S>,
    serve: fn(TcpStream, std::sync::Arc<S>) -> F,
) -> SocketAddr
where
    S: Send + Sync + 'static,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, state.clone()));
        }
    });
    addr
}
