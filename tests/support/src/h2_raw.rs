//! HTTP/2 by hand over a real socket: a client that does exactly what a test says (sends
//! a call's headers and holds its body back, ignores GOAWAY, never answers a PING), which
//! no well-behaved client library can be made to do.

use std::time::Duration;

use cellrate::proto::v1 as pb;
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const ACK: u8 = 0x1;

/// One frame, as sent on the wire.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK literal fields without indexing, no Huffman (every length below 127).
pub fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0x00);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// The headers of a native `Check` (HPACK literals, no Huffman), its body still to come:
/// until it comes, the stream stays open, waiting.
pub fn check_headers(stream: u32) -> Vec<u8> {
    let block = header_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/cellrate.v1.RateLimiter/Check"),
        (":authority", "cellrate"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]);
    frame(HEADERS, END_HEADERS, stream, &block)
}

/// The body of a `Check` of `items`, ending the stream.
pub fn check_body(stream: u32, items: Vec<pb::Item>) -> Vec<u8> {
    let message = pb::CheckRequest {
        items,
        ..Default::default()
    }
    .encode_to_vec();
    let mut body = vec![0u8];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(&message);
    frame(DATA, END_STREAM, stream, &body)
}

/// Sends the client preface and an empty SETTINGS frame.
pub async fn start(stream: &mut (impl AsyncWrite + Unpin)) {
    stream.write_all(PREFACE).await.unwrap();
    stream.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
}

/// Connects to `addr` and sends the client preface and an empty SETTINGS frame.
pub async fn connect(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    start(&mut stream).await;
    stream
}

/// One frame: (type, flags, stream, payload); `None` at EOF or on an error.
pub async fn read_frame(stream: &mut (impl AsyncRead + Unpin)) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).await.ok()?;
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], id, payload))
}

/// Frames until one of type `kind` (returned with the frames before it), EOF (`None`), or
/// `within` passing (a panic).
pub async fn read_until(
    stream: &mut (impl AsyncRead + Unpin),
    kind: u8,
    within: Duration,
) -> Option<(u8, u8, u32, Vec<u8>)> {
    tokio::time::timeout(within, async {
        loop {
            let frame = read_frame(stream).await?;
            if frame.0 == kind {
                return Some(frame);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no frame of type {kind} nor EOF within {within:?}"))
}

/// One gRPC message frame: flag 0, big-endian length, the message.
pub fn grpc_frame(message: &impl prost::Message) -> Vec<u8> {
    let body = message.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
    framed.extend(body);
    framed
}

/// A raw HTTP/2 client on `addr`, its connection driven by a task of its own.
pub async fn h2_client(addr: std::net::SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    client
}

/// What a client saw of a call: the response's headers (but `date`, which tells the
/// second), its grpc-status and grpc-message (trailers-only, or in the trailers), and its
/// data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub headers: Vec<(String, String)>,
    pub status: Option<String>,
    pub message: Option<String>,
    pub data: Vec<u8>,
}

/// A call to `path` with `headers` added, as `chunks` of body (none: the headers end the
/// request), then `trailers` if any, the request ending there when `end`.
pub async fn exchange(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    chunks: &[&[u8]],
    end: bool,
    trailers: &[(&str, &str)],
) -> Exchange {
    let mut request = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let only_headers = end && chunks.is_empty() && trailers.is_empty();
    let (response, mut send) = client
        .send_request(request.body(()).unwrap(), only_headers)
        .unwrap();
    for (i, chunk) in chunks.iter().enumerate() {
        let last = end && trailers.is_empty() && i + 1 == chunks.len();
        send.send_data(bytes::Bytes::copy_from_slice(chunk), last)
            .unwrap();
    }
    if end && !trailers.is_empty() {
        let mut map = http::HeaderMap::new();
        for (name, value) in trailers {
            map.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_str(value).unwrap(),
            );
        }
        send.send_trailers(map).unwrap();
    }
    let response = response.await.unwrap();
    let text = |v: &http::HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
    let field = |map: &http::HeaderMap, name: &str| map.get(name).map(text);
    let mut seen = Exchange {
        headers: (response.headers().iter())
            .filter(|(name, _)| *name != "date")
            .map(|(name, value)| (name.to_string(), text(value)))
            .collect(),
        status: field(response.headers(), "grpc-status"),
        message: field(response.headers(), "grpc-message"),
        data: Vec::new(),
    };
    seen.headers.sort();
    let mut recv = response.into_body();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.unwrap();
        seen.data.extend_from_slice(&chunk);
        let _ = recv.flow_control().release_capacity(chunk.len());
    }
    if let Some(trailers) = recv.trailers().await.unwrap() {
        seen.status = seen.status.or(field(&trailers, "grpc-status"));
        seen.message = seen.message.or(field(&trailers, "grpc-message"));
    }
    seen
}
