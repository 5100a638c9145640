//! The floor of the Redis protocol on this stack: a tokio server that parses commands with
//! cellrate's own RESP parser and answers every one with a constant, the shape of a
//! `CL.THROTTLE` answer (five integers; `PING` gets `PONG`). One task per connection, each
//! read's commands answered in one write: what any RESP server has to do before it
//! decides anything. Run: `cargo run --release --example resp_floor -- 127.0.0.1:PORT`
//! (scripts/bench-peers-resp.sh).

use bytes::BytesMut;
use cellrate::resp::frame::Frame;
use cellrate::resp::protocol::{Bounds, Parser};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// The same allocator as cellrate's binary: the floor differs only in deciding nothing.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: cellrate_alloc::MiMalloc = cellrate_alloc::MiMalloc;

/// An allowed `CL.THROTTLE` answer: allowed, limit 15, 14 left, no retry, reset in 2 s.
const THROTTLED: &[u8] = b"*5\r\n:0\r\n:15\r\n:14\r\n:-1\r\n:2\r\n";

async fn serve(mut stream: tokio::net::TcpStream) {
    let mut parser = Parser::new(Bounds::default());
    let mut frame = Frame::default();
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut output = Vec::with_capacity(16 * 1024);
    loop {
        match stream.read_buf(&mut input).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        loop {
            match parser.next(&mut input, &mut frame) {
                Ok(true) => {
                    let args = frame.args(&input);
                    let name = args.first().map(|a| a.to_ascii_uppercase());
                    output.extend_from_slice(match name.as_deref() {
                        Some(b"PING") => b"+PONG\r\n",
                        // redis-benchmark asks for these at start; an empty map is Redis's
                        // answer for a setting it does not have.
                        Some(b"CONFIG") => b"*0\r\n",
                        _ => THROTTLED,
                    });
                }
                Ok(false) => break,
                Err(_) => return,
            }
        }
        if !output.is_empty() {
            if stream.write_all(&output).await.is_err() {
                return;
            }
            output.clear();
        }
    }
}

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:16379".into());
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    eprintln!("resp floor listening on {}", listener.local_addr().unwrap());
    loop {
        let (stream, _) = listener.accept().await.expect("accept");
        stream.set_nodelay(true).expect("nodelay");
        tokio::spawn(serve(stream));
    }
}
