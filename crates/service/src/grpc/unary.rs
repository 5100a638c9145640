//! A unary gRPC call served by hand, for the decision RPCs (`ShouldRateLimit`, the native
//! `Check`): tonic's unary handling is a streaming decoder and an encoding body, two boxed
//! futures, the first about 1 800 bytes moved into its box, and some 4 000 instructions a
//! call beyond what a unary call needs (BENCHMARKS.md, #52, fourth round).
//!
//! What a client sees is what tonic's generated servers answer with no compression enabled:
//! UNIMPLEMENTED for a compressed request, the size bound checked from the message's
//! prefix before the rest is read (OUT_OF_RANGE), INTERNAL for a compressed or unknown
//! flag, a body cut short, one without a message or a message that is not protobuf (each
//! with tonic's words), a request's trailers merged into its metadata, and the answer as
//! one data frame and the OK trailers. A second message is INVALID_ARGUMENT, as the
//! decisions listener's in-flight layer answers it for the other unary calls
//! (`tests/it/hostile_clients.rs` sends each malformed body).
//!
//! With `--grpc-unary tonic` ([`super::Unary::Tonic`]) the same RPCs are served by
//! tonic's `Grpc::unary`, as its generated servers serve them, with the service's own
//! decoding and encoding ([`Codec`]). `tests/it/grpc_parity.rs` sends both settings the
//! same bodies and requires the same status, message and answer, byte for byte, but for
//! what is listed there: ShouldRateLimit's message over the size bound is answered
//! OVER_LIMIT here ([`Decision::oversized`]) and refused OUT_OF_RANGE by tonic.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderName, HeaderValue};
use tonic::metadata::MetadataValue;
use tonic::server::NamedService;
use tonic::Status;

use super::{declared_length, PREFIX};

use super::Unary;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// What a server of a tonic router answers.
pub type Answered = http::Response<tonic::body::Body>;
/// A server's boxed future, as tonic's generated servers have it.
pub type BoxFuture = Pin<Box<dyn Future<Output = Result<Answered, Infallible>> + Send + 'static>>;

/// A unary RPC answered by hand.
pub trait Decision: Send + Sync + 'static {
    /// The gRPC service's name, and the served path (`/<service>/<method>`).
    const SERVICE: &'static str;
    const PATH: &'static str;
    type Message: prost::Message + Default + Send + 'static;
    type Answer: Send + 'static;
    fn decide(
        &self,
        request: tonic::Request<Self::Message>,
    ) -> impl Future<Output = Result<tonic::Response<Self::Answer>, Status>> + Send;
    /// Writes the answer's message (its fields; the prefix is written before it).
    fn encode(answer: Self::Answer, framed: &mut BytesMut);
    /// Reads the message (prost's decoding, unless the service reads more leniently).
    fn decode(message: Bytes) -> Result<Self::Message, prost::DecodeError> {
        prost::Message::decode(message)
    }
    /// The answer to a message of `length` bytes, over the size bound, if the service
    /// answers one rather than refusing it (OUT_OF_RANGE), its body left unread.
    fn oversized(&self, length: usize) -> Option<Self::Answer> {
        let _ = length;
        None
    }
}

/// A service's server: `D`'s path answered by [`serve`] (or by tonic, as `unary` says),
/// every other path by `other` (tonic's generated server of the rest of the service).
pub struct Server<D, O> {
    decision: Arc<D>,
    other: O,
    max_decoding: usize,
    unary: Unary,
}

impl<D, O: Clone> Clone for Server<D, O> {
    fn clone(&self) -> Self {
        Server {
            decision: self.decision.clone(),
            other: self.other.clone(),
            max_decoding: self.max_decoding,
            unary: self.unary,
        }
    }
}

impl<D, O> Server<D, O> {
    /// Serves `decision` with requests over `max_decoding` bytes refused before decoding
    /// (OUT_OF_RANGE), and the rest with `other`.
    pub fn with(decision: Arc<D>, other: O, max_decoding: usize) -> Server<D, O> {
        Server {
            decision,
            other,
            max_decoding,
            unary: Unary::Direct,
        }
    }

    /// The decision's calls served as `unary` says.
    pub fn serving(mut self, unary: Unary) -> Server<D, O> {
        self.unary = unary;
        self
    }
}

impl<D: Decision, O> NamedService for Server<D, O> {
    const NAME: &'static str = D::SERVICE;
}

impl<D, O, B> tower_service::Service<http::Request<B>> for Server<D, O>
where
    D: Decision,
    O: tower_service::Service<
        http::Request<B>,
        Response = Answered,
        Error = Infallible,
        Future = BoxFuture,
    >,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send + 'static,
{
    type Response = Answered;
    type Error = Infallible;
    type Future = BoxFuture;

    /// `other`'s readiness (tonic's generated servers are always ready).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.other.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> BoxFuture {
        if request.uri().path() != D::PATH {
            return self.other.call(request);
        }
        let (decision, max) = (self.decision.clone(), self.max_decoding);
        if self.unary == Unary::Tonic {
            return Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(Codec::<D>(std::marker::PhantomData))
                    .apply_max_message_size_config(Some(max), None);
                Ok(grpc.unary(Handler(decision), request).await)
            });
        }
        Box::pin(async move {
            let call = |request| decision.decide(request);
            let oversized = |length| decision.oversized(length);
            let answer = serve(request, max, (call, oversized), D::decode, D::encode).await;
            Ok(answer.unwrap_or_else(Status::into_http))
        })
    }
}

/// `D`'s calls as tonic's `Grpc::unary` calls a service.
struct Handler<D>(Arc<D>);

impl<D: Decision> tower_service::Service<tonic::Request<D::Message>> for Handler<D> {
    type Response = tonic::Response<D::Answer>;
    type Error = Status;
    type Future = BoxAnswer<D::Answer>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<D::Message>) -> Self::Future {
        let decision = self.0.clone();
        Box::pin(async move { decision.decide(request).await })
    }
}

/// A decision's boxed future, as the generated servers box their services' calls.
type BoxAnswer<A> = Pin<Box<dyn Future<Output = Result<tonic::Response<A>, Status>> + Send>>;

/// `D`'s message and answer as tonic reads and writes them: [`Decision::decode`] and
/// [`Decision::encode`], refusals in tonic-prost's words.
pub struct Codec<D>(std::marker::PhantomData<fn() -> D>);

impl<D: Decision> tonic::codec::Codec for Codec<D>
where
    D::Answer: Send + 'static,
{
    type Encode = D::Answer;
    type Decode = D::Message;
    type Encoder = Codec<D>;
    type Decoder = Codec<D>;

    fn encoder(&mut self) -> Codec<D> {
        Codec(std::marker::PhantomData)
    }

    fn decoder(&mut self) -> Codec<D> {
        Codec(std::marker::PhantomData)
    }
}

impl<D: Decision> tonic::codec::Encoder for Codec<D> {
    type Item = D::Answer;
    type Error = Status;

    fn encode(
        &mut self,
        answer: D::Answer,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), Status> {
        let mut framed = BytesMut::new();
        D::encode(answer, &mut framed);
        dst.put_slice(&framed);
        Ok(())
    }
}

impl<D: Decision> tonic::codec::Decoder for Codec<D> {
    type Item = D::Message;
    type Error = Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<D::Message>, Status> {
        let message = bytes::Buf::copy_to_bytes(src, bytes::Buf::remaining(src));
        (D::decode(message).map(Some)).map_err(|e| Status::internal(e.to_string()))
    }
}

/// What a unary call with a second message is told (INVALID_ARGUMENT), here and by the
/// in-flight layer for the other unary calls.
pub const SECOND_MESSAGE: &str =
    "request: a unary call carries exactly one message; a second one followed";

/// The other methods of a service that has none: UNIMPLEMENTED, as a generated server
/// answers an unknown method.
#[derive(Clone, Copy)]
pub struct Unimplemented;

impl<B> tower_service::Service<http::Request<B>> for Unimplemented {
    type Response = Answered;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<B>) -> BoxFuture {
        Box::pin(async { Ok(Status::unimplemented("").into_http()) })
    }
}

/// Serves one unary call: its message (at most `max` bytes) read by `decode`, answered by
/// `call` (a message over `max`: by `oversized`, if it answers), the answer written by
/// `encode`; a refusal is the error, for the caller to send
/// as its status (`Status::into_http`). Awaited directly by the server's own future:
/// every async layer between them would move this future's whole state once more.
///
/// `decode` and `encode` are type parameters, not function pointers: zero-sized in the
/// future's state and called directly (BENCHMARKS.md #59).
pub async fn serve<B, M, R, C, F, O, Dec, Enc>(
    request: http::Request<B>,
    max: usize,
    (call, oversized): (C, O),
    decode: Dec,
    encode: Enc,
) -> Result<Answered, Status>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    C: FnOnce(tonic::Request<M>) -> F,
    F: Future<Output = Result<tonic::Response<R>, Status>>,
    O: FnOnce(usize) -> Option<R>,
    Dec: Fn(Bytes) -> Result<M, prost::DecodeError>,
    Enc: FnOnce(R, &mut BytesMut),
{
    if let Some(encoding) = (request.headers().get(ENCODING)).filter(|e| *e != "identity") {
        let mut status = Status::unimplemented(format!(
            "Content is compressed with `{}` which isn't supported",
            String::from_utf8_lossy(encoding.as_bytes())
        ));
        (status.metadata_mut()).insert(ACCEPT_ENCODING, MetadataValue::from_static("identity"));
        return Err(status);
    }
    let (mut parts, body) = request.into_parts();
    // Read here, not in an async fn of its own, whose future would be built and moved
    // into this one's on every call.
    let mut message = None;
    let trailers = {
        let mut body = std::pin::pin!(body);
        let mut reading = Reading::new(max);
        let mut cancelled = false;
        while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            match frame {
                Ok(frame) => {
                    if let Err(status) = reading.frame(frame) {
                        let length = reading.oversized.take();
                        if let Some(answer) = length.and_then(oversized) {
                            return answered(tonic::metadata::MetadataMap::new(), answer, encode);
                        }
                        return Err(status);
                    }
                    // Decoded once whole, as tonic decodes it: a message that does not
                    // decode is refused before the rest of the body is read.
                    if let (None, Some(whole)) = (&message, reading.whole()) {
                        message = Some(decode(whole).map_err(|e| Status::internal(e.to_string()))?);
                    }
                }
                Err(e) => {
                    let status = Status::from_error(e.into());
                    // A cancelled request body ends the message, as in tonic (which then
                    // looks no further at what it holds).
                    if status.code() == tonic::Code::Cancelled {
                        cancelled = true;
                        break;
                    }
                    return Err(status);
                }
            }
        }
        match cancelled {
            true => reading.trailers,
            false => reading.finish()?,
        }
    };
    let message = message.ok_or_else(|| Status::internal("Missing request message."))?;
    if let Some(trailers) = trailers {
        parts.headers.extend(trailers);
    }
    let request = tonic::Request::from_http(http::Request::from_parts(parts, message));
    let (metadata, answer, extensions) = call(request).await?.into_parts();
    let mut response = answered(metadata, answer, encode)?;
    *response.extensions_mut() = extensions;
    Ok(response)
}

/// The response of a unary call that answered `answer`, written by `encode`, with
/// `metadata` as its headers.
fn answered<R>(
    metadata: tonic::metadata::MetadataMap,
    answer: R,
    encode: impl FnOnce(R, &mut BytesMut),
) -> Result<Answered, Status> {
    let mut framed = BytesMut::with_capacity(256);
    framed.put_bytes(0, PREFIX);
    encode(answer, &mut framed);
    let length = u32::try_from(framed.len() - PREFIX)
        .map_err(|_| Status::internal("the answer is over 4 GiB"))?;
    framed[1..PREFIX].copy_from_slice(&length.to_be_bytes());
    let mut response = http::Response::new(tonic::body::Body::new(AnswerBody {
        message: Some(framed.freeze()),
        trailers: true,
    }));
    *response.version_mut() = http::Version::HTTP_2;
    *response.headers_mut() = metadata.into_headers();
    (response.headers_mut()).insert(http::header::CONTENT_TYPE, GRPC);
    Ok(response)
}

/// `grpc-encoding`, `grpc-accept-encoding`, and gRPC's content type.
const ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
const ACCEPT_ENCODING: &str = "grpc-accept-encoding";
const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// A unary request's body as it is read: its one message and its trailers. Refused as
/// tonic refuses them: a compressed or oversized message (checked from its prefix, before
/// the rest is read), a body that ends within a message, a body without one; and, as the
/// decisions listener refuses it, a second message (so what is held is at most one
/// message and one frame).
struct Reading {
    received: Received,
    trailers: Option<http::HeaderMap>,
    /// The message's length, once its prefix is in.
    length: Option<usize>,
    max: usize,
    /// The length of a message refused as over `max`.
    oversized: Option<usize>,
}

/// The body so far: one frame's bytes as they came, or several joined.
enum Received {
    One(Bytes),
    Joined(BytesMut),
}

impl Reading {
    fn new(max: usize) -> Reading {
        Reading {
            received: Received::One(Bytes::new()),
            trailers: None,
            length: None,
            max,
            oversized: None,
        }
    }

    fn frame(&mut self, frame: http_body::Frame<Bytes>) -> Result<(), Status> {
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    (self.trailers.get_or_insert_with(Default::default)).extend(more);
                }
                return Ok(());
            }
        };
        if data.is_empty() {
            return Ok(());
        }
        match &mut self.received {
            Received::One(first) if first.is_empty() => *first = data,
            Received::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + data.len());
                joined.extend_from_slice(first);
                joined.extend_from_slice(&data);
                self.received = Received::Joined(joined);
            }
            Received::Joined(joined) => joined.extend_from_slice(&data),
        }
        let bytes = self.bytes();
        let (seen, prefixed) = (bytes.len(), bytes.first_chunk::<PREFIX>());
        if let (None, Some(bytes)) = (self.length, prefixed) {
            // A second message that came with the prefix is refused before the prefix is
            // read, as the in-flight layer refuses the frame before tonic reads it.
            let declared = declared_length(bytes);
            if seen > PREFIX + declared as usize {
                return Err(Status::invalid_argument(SECOND_MESSAGE));
            }
            match prefix(bytes, self.max) {
                Ok(length) => self.length = Some(length),
                Err(status) => {
                    let oversized = status.code() == tonic::Code::OutOfRange;
                    self.oversized = oversized.then_some(declared as usize);
                    return Err(status);
                }
            }
        }
        if self.length.is_some_and(|n| seen > PREFIX + n) {
            return Err(Status::invalid_argument(SECOND_MESSAGE));
        }
        Ok(())
    }

    fn bytes(&self) -> &[u8] {
        match &self.received {
            Received::One(b) => b,
            Received::Joined(b) => b,
        }
    }

    /// The message, once all of it is in (and until more comes).
    fn whole(&mut self) -> Option<Bytes> {
        let n = self.length?;
        if self.bytes().len() != PREFIX + n {
            return None;
        }
        if let Received::Joined(joined) = &mut self.received {
            self.received = Received::One(std::mem::take(joined).freeze());
        }
        match &self.received {
            Received::One(bytes) => Some(bytes.slice(PREFIX..)),
            Received::Joined(_) => None,
        }
    }

    /// The trailers, once the body has ended with its message whole.
    fn finish(self) -> Result<Option<http::HeaderMap>, Status> {
        let seen = self.bytes().len();
        match self.length {
            _ if seen == 0 => Err(Status::internal("Missing request message.")),
            Some(n) if seen == PREFIX + n => Ok(self.trailers),
            // tonic takes a prefix off its buffer once read: a body that ends right after
            // one leaves nothing over, so it says no message came (the fuzz target found it).
            Some(_) if seen == PREFIX => Err(Status::internal("Missing request message.")),
            _ => Err(Status::internal("Unexpected EOF decoding stream.")),
        }
    }
}

/// A message's length from its prefix, refused as tonic refuses it when compressed (none
/// is enabled) or over `max`.
fn prefix(prefix: &[u8; PREFIX], max: usize) -> Result<usize, Status> {
    match prefix[0] {
        0 => {}
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding \
                 was specified",
            ))
        }
        flag => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {flag} \
                 (valid flags are 0 and 1), while sending request"
            )))
        }
    }
    let length = declared_length(prefix) as usize;
    if length > max {
        return Err(Status::out_of_range(format!(
            "Error, decoded message length too large: found {length} bytes, the limit is: \
             {max} bytes"
        )));
    }
    Ok(length)
}

/// A unary answer's body: the framed message, then the OK status in trailers.
struct AnswerBody {
    message: Option<Bytes>,
    trailers: bool,
}

impl http_body::Body for AnswerBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        if let Some(message) = self.message.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(message))));
        }
        if std::mem::take(&mut self.trailers) {
            let mut trailers = http::HeaderMap::with_capacity(1);
            trailers.insert(Status::GRPC_STATUS, HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && !self.trailers
    }
}
