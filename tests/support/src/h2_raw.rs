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
