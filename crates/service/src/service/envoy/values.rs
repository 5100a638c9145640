//! A client's bytes in a descriptor, made decidable. Envoy copies a header's value into
//! a descriptor as it came: any bytes (not always UTF-8), any length up to its header
//! limit. An error answered for such a value is a bypass (Envoy's `failure_mode_deny:
//! false`, its default, lets the request through with every other descriptor skipped),
//! so a value is never refused for its bytes: a value that is not UTF-8, or longer than
//! [`MAX_ENTRY_VALUE`] bytes, **stands for itself** as `sha256:` and the 64 lowercase hex
//! digits of the SHA-256 of its bytes. It is then matched and decided as that text: on a
//! bucket of its own (one per distinct value, short whatever the value's length), and
//! against an id format as any other value is (a format that takes no such text makes it
//! an invalid id, which the domain's `invalid_id` policy decides).

use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use prost::Message;

use super::MAX_ENTRY_VALUE;

/// What a value that stands for itself begins with.
pub const STAND_IN_PREFIX: &str = "sha256:";

/// The text `bytes` stand for: `sha256:` and the hex of their SHA-256.
///
/// ```
/// use cellrate_service::service::envoy::stand_in;
/// assert_eq!(
///     stand_in(b""),
///     "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
/// );
/// assert_ne!(stand_in(b"\xff"), stand_in(b"\xfe"));
/// ```
pub fn stand_in(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut text = String::with_capacity(STAND_IN_PREFIX.len() + 64);
    text.push_str(STAND_IN_PREFIX);
    text.push_str(&hex::encode(Sha256::digest(bytes)));
    text
}

/// Replaces every entry value longer than [`MAX_ENTRY_VALUE`] bytes by its stand-in.
pub(super) fn stand_in_long_values(request: &mut RateLimitRequest) {
    for descriptor in &mut request.descriptors {
        for entry in &mut descriptor.entries {
            if entry.value.len() > MAX_ENTRY_VALUE {
                entry.value = stand_in(entry.value.as_bytes());
            }
        }
    }
}

/// Decodes a `RateLimitRequest`. One whose strings are not all UTF-8 (which prost refuses:
/// proto3 strings are UTF-8) is read again with its strings as bytes, each string that is
/// not UTF-8 replaced by its stand-in; a message that is not a `RateLimitRequest` at all
/// stays the first error.
pub fn decode_request(message: Bytes) -> Result<RateLimitRequest, prost::DecodeError> {
    match RateLimitRequest::decode(message.clone()) {
        Ok(request) => Ok(request),
        Err(first) => match RawRequest::decode(message) {
            Ok(raw) => Ok(raw.into_request()),
            Err(_) => Err(first),
        },
    }
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| stand_in(e.as_bytes()))
}

/// `RateLimitRequest` with its strings as bytes (the same field numbers and types).
#[derive(Clone, PartialEq, Message)]
struct RawRequest {
    #[prost(bytes = "vec", tag = "1")]
    domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<RawDescriptor>,
    #[prost(uint32, tag = "3")]
    hits_addend: u32,
}

/// `RateLimitDescriptor`, its entries' strings as bytes.
#[derive(Clone, PartialEq, Message)]
struct RawDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<RawEntry>,
    #[prost(message, optional, tag = "2")]
    limit: Option<RateLimitOverride>,
    #[prost(message, optional, tag = "3")]
    hits_addend: Option<UInt64Value>,
    #[prost(bool, tag = "4")]
    is_negative_hits: bool,
}

#[derive(Clone, PartialEq, Message)]
struct RawEntry {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

impl RawRequest {
    fn into_request(self) -> RateLimitRequest {
        RateLimitRequest {
            domain: text(self.domain),
            descriptors: (self.descriptors.into_iter())
                .map(|d| RateLimitDescriptor {
                    entries: (d.entries.into_iter())
                        .map(|e| Entry {
                            key: text(e.key),
                            value: text(e.value),
                        })
                        .collect(),
                    limit: d.limit,
                    hits_addend: d.hits_addend,
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
            hits_addend: self.hits_addend,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(value: &str) -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".to_string(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".to_string(),
                    value: value.to_string(),
                }],
                hits_addend: Some(UInt64Value { value: 3 }),
                is_negative_hits: true,
                ..Default::default()
            }],
            hits_addend: 2,
        }
    }

    /// The encoded request with its one value's bytes replaced by `value`.
    fn with_value(value: &[u8]) -> Bytes {
        let marker = "\u{1}marker\u{1}";
        let encoded = request(marker).encode_to_vec();
        let at = (encoded.windows(marker.len()))
            .position(|w| w == marker.as_bytes())
            .unwrap();
        assert_eq!(value.len(), marker.len(), "same length keeps the prefixes");
        let mut bytes = encoded.clone();
        bytes[at..at + marker.len()].copy_from_slice(value);
        Bytes::from(bytes)
    }

    #[test]
    fn a_value_that_is_not_utf8_stands_for_itself_and_the_rest_is_kept() {
        let raw = b"al\xffce\xfe\x00\x01";
        assert!(
            RateLimitRequest::decode(with_value(raw)).is_err(),
            "prost refuses it"
        );
        let decoded = decode_request(with_value(raw)).unwrap();
        let mut expected = request("");
        expected.descriptors[0].entries[0].value = stand_in(raw);
        assert_eq!(decoded, expected);
        // Distinct bytes, distinct stand-ins.
        let other = decode_request(with_value(b"al\xffce\xfe\x00\x02")).unwrap();
        assert_ne!(other, decoded);
    }

    #[test]
    fn a_utf8_request_decodes_as_prost_decodes_it_and_garbage_stays_an_error() {
        let bytes = Bytes::from(request("alice").encode_to_vec());
        assert_eq!(decode_request(bytes).unwrap(), request("alice"));
        let garbage = Bytes::from_static(b"\x0a\xff\xff\xff\xff\x0f");
        let error = decode_request(garbage.clone()).unwrap_err();
        assert_eq!(
            error.to_string(),
            RateLimitRequest::decode(garbage).unwrap_err().to_string()
        );
    }

    #[test]
    fn long_values_stand_for_themselves_and_short_ones_stay() {
        let long = "x".repeat(MAX_ENTRY_VALUE + 1);
        let mut r = request(&long);
        stand_in_long_values(&mut r);
        assert_eq!(r.descriptors[0].entries[0].value, stand_in(long.as_bytes()));
        let exact = "x".repeat(MAX_ENTRY_VALUE);
        let mut r = request(&exact);
        stand_in_long_values(&mut r);
        assert_eq!(r.descriptors[0].entries[0].value, exact);
    }
}
