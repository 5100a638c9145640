//! The `grpc_framing` harness: a unary call's body as a client may frame it, sent to the
//! decision RPCs' hand-written server (`grpc/unary.rs`) and to tonic's unary handling
//! behind the in-flight layer's one-message check (`--grpc-unary tonic`), in process.
//!
//! Input: a selector byte (the size bound, and a `grpc-encoding` header or none), a count
//! of cuts and the cuts (where the body is split into data frames), then the body.
//! Properties: never a panic; both servers answer the same headers, status, message and
//! answer bytes, with the body cut as given and whole.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tonic::Status;

use crate::grpc::unary::{Answered, Decision, Server, Unimplemented};
use crate::grpc::Unary;
use crate::server::in_flight::OneMessage;

/// A decision that answers the message it read: the answer shows what was read.
struct Echo;

impl Decision for Echo {
    const SERVICE: &'static str = crate::grpc::RATE_LIMITER;
    // A decision's path, so that the in-flight layer checks it when tonic serves it.
    const PATH: &'static str = crate::grpc::CHECK.path;
    type Message = prost_types::Duration;
    type Answer = prost_types::Duration;

    fn decide(
        &self,
        request: tonic::Request<prost_types::Duration>,
    ) -> impl Future<Output = Result<tonic::Response<prost_types::Duration>, Status>> + Send {
        std::future::ready(Ok(tonic::Response::new(request.into_inner())))
    }

    fn encode(answer: prost_types::Duration, framed: &mut BytesMut) {
        prost::Message::encode_raw(&answer, framed)
    }
}

/// A request body of data frames as given.
struct Frames(std::collections::VecDeque<Bytes>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        Poll::Ready(
            self.0
                .pop_front()
                .map(|data| Ok(http_body::Frame::data(data))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a client sees of an answer: its headers, status and message (trailers-only or
/// in the trailers), and its data.
#[derive(Debug, PartialEq)]
pub(crate) struct Seen {
    headers: Vec<(String, String)>,
    status: Option<String>,
    message: Option<String>,
    data: Vec<u8>,
}

async fn seen(answer: Answered) -> Seen {
    let (parts, mut body) = answer.into_parts();
    // Header values as text (lossy only for bytes no server here writes).
    let text = |value: &http::HeaderValue| String::from_utf8_lossy(value.as_bytes()).into_owned();
    let mut headers: Vec<(String, String)> = (parts.headers.iter())
        .map(|(name, value)| (name.to_string(), text(value)))
        .collect();
    headers.sort();
    let field = |map: &http::HeaderMap, name: &str| map.get(name).map(text);
    let (mut status, mut message) = (
        field(&parts.headers, "grpc-status"),
        field(&parts.headers, "grpc-message"),
    );
    let mut data = Vec::new();
    // A unary answer is at most one message and the trailers: bounded.
    for _ in 0..16 {
        let frame =
            std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut body), cx)).await;
        let Some(Ok(frame)) = frame else { break };
        match frame.into_data() {
            Ok(bytes) => data.extend_from_slice(&bytes),
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    status = status.or(field(&trailers, "grpc-status"));
                    message = message.or(field(&trailers, "grpc-message"));
                }
            }
        }
    }
    Seen {
        headers,
        status,
        message,
        data,
    }
}

/// The size bounds and the `grpc-encoding` headers a selector byte picks from.
const MAXES: [usize; 6] = [0, 1, 4, 16, 255, 4096];
const ENCODINGS: [Option<&str>; 4] = [None, None, Some("identity"), Some("gzip")];

/// `body` cut at `cuts`, sent to `D::PATH` on the server `unary` says (behind the
/// in-flight layer's check, as on the decisions listener): what a client sees.
pub(crate) fn answer(
    unary: Unary,
    max: usize,
    encoding: Option<&str>,
    body: &[u8],
    cuts: &[usize],
) -> Seen {
    let mut frames = std::collections::VecDeque::new();
    let mut at = 0;
    for &cut in cuts.iter().filter(|&&c| c <= body.len()) {
        if cut >= at {
            frames.push_back(Bytes::copy_from_slice(&body[at..cut]));
            at = cut;
        }
    }
    frames.push_back(Bytes::copy_from_slice(&body[at..]));
    let mut request = http::Request::post(Echo::PATH).header("content-type", "application/grpc");
    if let Some(encoding) = encoding {
        request = request.header("grpc-encoding", encoding);
    }
    let request = request.body(Frames(frames)).expect("a request");
    let request = OneMessage::wrap(request, None, unary);
    let mut server = Server::with(Arc::new(Echo), Unimplemented, max).serving(unary);
    super::block_on(async move {
        let answer = tower_service::Service::call(&mut server, request).await;
        seen(answer.unwrap_or_else(|never| match never {})).await
    })
}

/// The harness (see the module's doc).
pub fn grpc_framing(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (max, encoding) = (
        MAXES[usize::from(selector) % MAXES.len()],
        ENCODINGS[usize::from(selector / 8) % ENCODINGS.len()],
    );
    let (count, rest) = rest.split_first().map_or((0, rest), |(&n, r)| (n % 4, r));
    let count = usize::from(count).min(rest.len());
    let (cuts, body) = rest.split_at(count);
    let cuts: Vec<usize> = cuts.iter().map(|&c| usize::from(c)).collect();
    // What is refused first depends on where the frames end (tonic reads a frame's
    // prefix before the next frame comes), so the same cuts on both, and then none.
    for cuts in [&cuts[..], &[]] {
        let direct = answer(Unary::Direct, max, encoding, body, cuts);
        let tonic = answer(Unary::Tonic, max, encoding, body, cuts);
        let case = format!("body {body:?}, cuts {cuts:?}, max {max}, {encoding:?}");
        assert_eq!(direct, tonic, "by hand and by tonic: {case}");
    }
}
