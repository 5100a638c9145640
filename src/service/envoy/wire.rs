//! ShouldRateLimit's server, written here rather than generated, so that an answer's
//! `dynamic_metadata` can leave as bytes encoded once, and a call is one small future.
//!
//! envoy-types' generated server encodes the whole `RateLimitResponse` with prost, whose
//! map code sizes, walks and encodes the metadata `Struct` on every answer, after the
//! service has copied it (a flood of denials by one limit says the same thing every
//! time). That was about 2 700 instructions of a denied request's 54 000 (BENCHMARKS.md,
//! "Instructions per request"). Here the service answers an [`Answer`]: the response
//! without that `Struct`, and the `Struct`'s encoding, shared by reference count;
//! [`encode`] writes the response's fields in field order with the bytes in field 6's
//! place, so a client reads exactly the message prost would have written.
//!
//! The call itself is served here too, not by tonic's unary handling (a streaming
//! decoder and an encoding body, two boxed futures, about 1 800 bytes moved into the
//! first): [`read_one`] reads the one message, the answer leaves as one data frame and
//! the OK trailers. What a client sees is the generated server's: the same path, the same
//! UNIMPLEMENTED for another method and for a compressed request (none is enabled), the
//! same bound on a request's size checked from the message's prefix before the rest is
//! read, the same INTERNAL for a body cut short or not protobuf (`tests/it/
//! hostile_clients.rs` sends each), requests decoded by prost.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf as pbw;
use http::{HeaderName, HeaderValue};
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;
use tonic::metadata::MetadataValue;
use tonic::Status;

use super::EnvoyRateLimitService;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `RateLimitResponse.dynamic_metadata`'s field number.
const METADATA_FIELD: u32 = 6;
/// `RateLimitResponse.quota`'s, the one field after it.
const QUOTA_FIELD: u32 = 7;

/// ShouldRateLimit's answer: the response, and its `dynamic_metadata` encoded (a
/// `google.protobuf.Struct`'s bytes) when the service had it so. At most one of
/// `metadata` and `response.dynamic_metadata` is set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    pub response: RateLimitResponse,
    pub metadata: Option<Bytes>,
}

impl Answer {
    /// The response as a client decodes it: the encoded metadata read back into its
    /// `Struct` (for callers in this process, such as the fuzz harness).
    pub fn into_response(self) -> RateLimitResponse {
        let mut response = self.response;
        if let Some(bytes) = self.metadata {
            // Bytes this process encoded from a `Struct`: they decode.
            response.dynamic_metadata = pbw::Struct::decode(bytes).ok();
        }
        response
    }
}

impl From<RateLimitResponse> for Answer {
    fn from(response: RateLimitResponse) -> Answer {
        Answer {
            response,
            metadata: None,
        }
    }
}

/// Writes `answer` as the `RateLimitResponse` it stands for, fields in order.
pub fn encode(answer: Answer, dst: &mut impl BufMut) {
    let Answer {
        mut response,
        metadata,
    } = answer;
    let quota = response.quota.take();
    response.encode_raw(dst);
    if let Some(bytes) = metadata {
        encode_key(METADATA_FIELD, WireType::LengthDelimited, dst);
        encode_varint(bytes.len() as u64, dst);
        dst.put_slice(&bytes);
    }
    if let Some(quota) = quota {
        prost::encoding::message::encode(QUOTA_FIELD, &quota, dst);
    }
}

/// The served path of ShouldRateLimit.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// A gRPC message's prefix: a compression flag and the message's length (big-endian).
const PREFIX: usize = 5;

/// Envoy's `RateLimitService` as a tower service a tonic server mounts.
#[derive(Clone)]
pub struct RlsServer {
    inner: Arc<EnvoyRateLimitService>,
    max_decoding: usize,
}

impl RlsServer {
    /// Serves `inner`, refusing requests over `max_decoding` bytes before decoding them
    /// (OUT_OF_RANGE, as the generated server's `max_decoding_message_size`;
    /// `tests/it/input_limits.rs` plays the client that sends one).
    pub fn new(inner: EnvoyRateLimitService, max_decoding: usize) -> RlsServer {
        RlsServer {
            inner: Arc::new(inner),
            max_decoding,
        }
    }
}

impl tonic::server::NamedService for RlsServer {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

impl<B> tower_service::Service<http::Request<B>> for RlsServer
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            // Another method of this service: as the generated server answers it.
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let (inner, max) = (self.inner.clone(), self.max_decoding);
        Box::pin(async move {
            Ok(match unary(&inner, request, max).await {
                Ok(response) => response,
                Err(status) => status.into_http(),
            })
        })
    }
}

/// One ShouldRateLimit call, as tonic's unary handling serves it with no compression
/// enabled (the same statuses, in the same cases), in one future: tonic's is a streaming
/// decoder and an encoding body, about 1 800 bytes moved into their box and some 2 000
/// instructions a request (BENCHMARKS.md, #52).
async fn unary<B>(
    inner: &EnvoyRateLimitService,
    request: http::Request<B>,
    max: usize,
) -> Result<http::Response<tonic::body::Body>, Status>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
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
    let (message, trailers) = read_one(body, max).await?;
    if let Some(trailers) = trailers {
        parts.headers.extend(trailers);
    }
    let message = RateLimitRequest::decode(message).map_err(|e| Status::internal(e.to_string()))?;
    let request = tonic::Request::from_http(http::Request::from_parts(parts, message));
    let (metadata, answer, extensions) = inner.should_rate_limit(request).await?.into_parts();
    let mut framed = BytesMut::with_capacity(256);
    framed.put_bytes(0, PREFIX);
    encode(answer, &mut framed);
    let length = u32::try_from(framed.len() - PREFIX)
        .map_err(|_| Status::internal("the answer is over 4 GiB"))?;
    framed[1..PREFIX].copy_from_slice(&length.to_be_bytes());
    let mut response = http::Response::new(tonic::body::Body::new(Unary {
        message: Some(framed.freeze()),
        trailers: true,
    }));
    *response.version_mut() = http::Version::HTTP_2;
    *response.headers_mut() = metadata.into_headers();
    (response.headers_mut()).insert(http::header::CONTENT_TYPE, GRPC);
    *response.extensions_mut() = extensions;
    Ok(response)
}

/// `grpc-encoding`, `grpc-accept-encoding`, and gRPC's content type.
const ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
const ACCEPT_ENCODING: &str = "grpc-accept-encoding";
const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// The body so far: one frame's bytes as they came, or several joined.
enum Received {
    One(Bytes),
    Joined(BytesMut),
}

impl Received {
    fn push(&mut self, data: Bytes) {
        match self {
            Received::One(first) if first.is_empty() => *first = data,
            Received::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + data.len());
                joined.extend_from_slice(first);
                joined.extend_from_slice(&data);
                *self = Received::Joined(joined);
            }
            Received::Joined(joined) => joined.extend_from_slice(&data),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Received::One(b) => b,
            Received::Joined(b) => b,
        }
    }
}

/// A unary request's one message and its trailers, read to the body's end. Refused as
/// tonic refuses them: a compressed or oversized message (checked from its prefix, before
/// the rest is read), a body that ends within a message, a body without one; and, as the
/// decisions listener refuses it, a second message (so what is held is at most one
/// message and one frame).
async fn read_one<B>(body: B, max: usize) -> Result<(Bytes, Option<http::HeaderMap>), Status>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut received = Received::One(Bytes::new());
    let mut trailers: Option<http::HeaderMap> = None;
    let mut length: Option<usize> = None;
    loop {
        let frame = match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                let status = Status::from_error(e.into());
                // A cancelled request body ends the message, as in tonic.
                if status.code() == tonic::Code::Cancelled {
                    break;
                }
                return Err(status);
            }
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    trailers.get_or_insert_with(Default::default).extend(more);
                }
                continue;
            }
        };
        received.push(data);
        let bytes = received.bytes();
        if length.is_none() && bytes.len() >= PREFIX {
            length = Some(prefix(&bytes[..PREFIX], max)?);
        }
        if length.is_some_and(|n| bytes.len() > PREFIX + n) {
            return Err(Status::invalid_argument(
                "request: a unary call carries exactly one message; a second one followed",
            ));
        }
    }
    let bytes = received.bytes();
    match length {
        _ if bytes.is_empty() => Err(Status::internal("Missing request message.")),
        Some(n) if bytes.len() == PREFIX + n => {
            let message = match received {
                Received::One(b) => b,
                Received::Joined(b) => b.freeze(),
            };
            Ok((message.slice(PREFIX..), trailers))
        }
        _ => Err(Status::internal("Unexpected EOF decoding stream.")),
    }
}

/// A message's length from its prefix, refused as tonic refuses it when compressed (none
/// is enabled) or over `max`.
fn prefix(prefix: &[u8], max: usize) -> Result<usize, Status> {
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
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if length > max {
        return Err(Status::out_of_range(format!(
            "Error, decoded message length too large: found {length} bytes, the limit is: \
             {max} bytes"
        )));
    }
    Ok(length)
}

/// A unary answer's body: the framed message, then the OK status in trailers.
struct Unary {
    message: Option<Bytes>,
    trailers: bool,
}

impl http_body::Body for Unary {
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

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        Code, DescriptorStatus, Quota,
    };
    use pbw::value::Kind;

    fn metadata() -> pbw::Struct {
        let string = |s: &str| pbw::Value {
            kind: Some(Kind::StringValue(s.to_string())),
        };
        pbw::Struct {
            fields: [
                ("overall_code".to_string(), string("OVER_LIMIT")),
                ("limit".to_string(), string("NewOrdersPerAccount")),
            ]
            .into(),
        }
    }

    fn response() -> RateLimitResponse {
        RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![DescriptorStatus {
                code: Code::OverLimit as i32,
                limit_remaining: 0,
                ..Default::default()
            }],
            raw_body: b"denied".to_vec(),
            quota: Some(Quota {
                requests: 3,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn encoded_metadata_reads_back_as_the_message_prost_writes() {
        let whole = RateLimitResponse {
            dynamic_metadata: Some(metadata()),
            ..response()
        };
        let answer = Answer {
            response: response(),
            metadata: Some(metadata().encode_to_vec().into()),
        };
        let mut written = Vec::new();
        encode(answer.clone(), &mut written);
        assert_eq!(RateLimitResponse::decode(&written[..]).unwrap(), whole);
        // Fields in order: the same bytes as prost's, whenever the map's order is the same.
        assert_eq!(written.len(), whole.encoded_len());
        let mut tags = Vec::new();
        let mut rest = &written[..];
        while !rest.is_empty() {
            let (tag, wire) = prost::encoding::decode_key(&mut rest).unwrap();
            tags.push(tag);
            prost::encoding::skip_field(wire, tag, &mut rest, Default::default()).unwrap();
        }
        assert_eq!(tags, [1, 2, 5, 6, 7]);
        assert_eq!(answer.into_response(), whole);
    }

    #[test]
    fn an_answer_without_encoded_metadata_is_prosts_message() {
        let whole = RateLimitResponse {
            dynamic_metadata: Some(metadata()),
            ..response()
        };
        let mut written = Vec::new();
        encode(Answer::from(whole.clone()), &mut written);
        assert_eq!(written, whole.encode_to_vec());
    }
}
