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
//! The call itself is served by [`crate::grpc::unary`], not by tonic's unary handling:
//! one small future, the one message read by its prefix, the answer one data frame and the
//! OK trailers, and what a client sees the generated server's (the same path, the same
//! UNIMPLEMENTED for another method, the same statuses for a malformed body).

use std::future::Future;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf as pbw;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;
use tonic::Status;

use super::EnvoyRateLimitService;
use crate::grpc::unary::{Decision, Server, Unimplemented};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

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
pub(super) fn encode(answer: Answer, dst: &mut impl BufMut) {
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

/// Envoy's `RateLimitService` as a tower service a tonic server mounts: ShouldRateLimit,
/// its one method; another is UNIMPLEMENTED, as the generated server answers it.
pub type RlsServer = Server<EnvoyRateLimitService, Unimplemented>;

impl RlsServer {
    /// Serves `inner`, refusing requests over `max_decoding` bytes before decoding them
    /// (OUT_OF_RANGE, as the generated server's `max_decoding_message_size`;
    /// `tests/it/input_limits.rs` plays the client that sends one).
    pub fn new(inner: EnvoyRateLimitService, max_decoding: usize) -> RlsServer {
        Server::with(Arc::new(inner), Unimplemented, max_decoding)
    }
}

impl Decision for EnvoyRateLimitService {
    const SERVICE: &'static str = crate::grpc::ENVOY_RLS;
    const PATH: &'static str = crate::grpc::SHOULD_RATE_LIMIT.path;
    type Message = RateLimitRequest;
    type Answer = Answer;

    fn decide(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> impl Future<Output = Result<tonic::Response<Answer>, Status>> + Send {
        self.should_rate_limit(request)
    }

    fn encode(answer: Answer, framed: &mut BytesMut) {
        encode(answer, framed)
    }

    /// A value that is not UTF-8 (Envoy copies a header's bytes as they came) stands for
    /// itself ([`super::values`]): refusing the message would let the request through.
    fn decode(message: Bytes) -> Result<RateLimitRequest, prost::DecodeError> {
        super::values::decode_request(message)
    }

    /// A message over the size bound cannot be read, so it cannot be decided; refusing it
    /// would let the request through (Envoy's default), and a client makes it so by
    /// sending a large header that Envoy copies into several descriptors. It is denied:
    /// OVER_LIMIT with no descriptor's status (none was read), counted as `oversized`.
    fn oversized(&self, _length: usize) -> Option<Answer> {
        self.metrics.decision("envoy", "", "oversized");
        Some(Answer::from(RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            ..RateLimitResponse::default()
        }))
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
