//! The xDS stream's messages on the wire, bounded before they are built.
//!
//! A protobuf message can hold a million empty sub-messages in 2 MB, and decoding builds
//! each of them, so a response within the message-size bound could still cost hundreds
//! of megabytes. The decoder here therefore walks the raw bytes first, without
//! allocating, and counts what decoding would build: resources (at most
//! [`MAX_RESOURCES`]), descriptors at every level and `replaces` entries (together at
//! most [`MAX_ELEMENTS`] per update), nesting (at most [`MAX_DEPTH`] levels). Only a
//! response within them is decoded; one beyond them is answered with a NACK that says
//! which bound, and is never built. The messages are declared with the fields read here,
//! so that the rest (a descriptor's `metadata`, the response's `resource_errors`) is
//! skipped instead of built.

use bytes::Buf;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use prost::encoding::decode_varint;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use crate::limits::ratelimit_format::{MAX_DEPTH, MAX_DESCRIPTORS};

/// The most resources (domains) in one update: as many as the limits directory may hold
/// files.
pub const MAX_RESOURCES: usize = crate::limits::config::MAX_DIR_ENTRIES;

/// The most descriptors (every level) and `replaces` entries in one update, all domains
/// together: as many as one file may hold.
pub const MAX_ELEMENTS: usize = MAX_DESCRIPTORS;
/// Bytes of descriptor `metadata` one update may carry (encoded): what it costs decoded
/// (a `Struct`'s maps, each value boxed) is some times that, kept with the limits.
pub(super) const MAX_METADATA_BYTES: usize = 256 * 1024;

/// `envoy.service.discovery.v3.DiscoveryResponse`, with the fields read here.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Response {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<prost_types::Any>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// The same response without its resources: what a refused response is answered from.
#[derive(Clone, PartialEq, prost::Message)]
struct Envelope {
    #[prost(string, tag = "1")]
    version_info: String,
    #[prost(string, tag = "5")]
    nonce: String,
}

/// A response as received.
#[derive(Debug)]
pub(super) enum Received {
    /// Within the bounds, decoded.
    Response(Response),
    /// Beyond a bound or malformed inside a resource: not decoded; to be NACKed.
    Refused {
        version_info: String,
        nonce: String,
        reason: String,
    },
}

/// One field: its tag, and its bytes when length-delimited.
fn next_field<'a>(buf: &mut &'a [u8]) -> Result<(u64, Option<&'a [u8]>), String> {
    let malformed = |_| "malformed protobuf".to_string();
    let key = decode_varint(buf).map_err(malformed)?;
    let skip = |buf: &mut &'a [u8], n: usize| match buf.len() >= n {
        true => {
            buf.advance(n);
            Ok(())
        }
        false => Err("malformed protobuf (truncated)".to_string()),
    };
    match key & 7 {
        0 => decode_varint(buf)
            .map(|_| (key >> 3, None))
            .map_err(malformed),
        1 => skip(buf, 8).map(|()| (key >> 3, None)),
        5 => skip(buf, 4).map(|()| (key >> 3, None)),
        2 => {
            let len = decode_varint(buf).map_err(malformed)?;
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            if len > buf.len() {
                return Err("malformed protobuf (truncated)".to_string());
            }
            let (body, rest) = buf.split_at(len);
            *buf = rest;
            Ok((key >> 3, Some(body)))
        }
        wire => Err(format!("malformed protobuf (wire type {wire})")),
    }
}

/// Calls `each` with the body of every length-delimited field `tag` of `message`.
fn each_field<'a>(
    mut message: &'a [u8],
    tag: u64,
    mut each: impl FnMut(&'a [u8]) -> Result<(), String>,
) -> Result<(), String> {
    while !message.is_empty() {
        if let (t, Some(body)) = next_field(&mut message)? {
            if t == tag {
                each(body)?;
            }
        }
    }
    Ok(())
}

/// Counts what decoding one update would build.
#[derive(Default)]
struct Count {
    elements: usize,
    /// Bytes of the descriptors' `metadata`, at most [`MAX_METADATA_BYTES`] an update.
    metadata: usize,
}

impl Count {
    fn one(&mut self) -> Result<(), String> {
        self.elements += 1;
        match self.elements > MAX_ELEMENTS {
            true => Err(format!(
                "more than {MAX_ELEMENTS} descriptors and replaces entries in one update"
            )),
            false => Ok(()),
        }
    }

    /// A `RateLimitDescriptor` at `depth` (1: a domain's own), and everything under it.
    fn descriptor(&mut self, body: &[u8], depth: usize) -> Result<(), String> {
        self.one()?;
        if depth > MAX_DEPTH {
            return Err(format!("descriptors nested deeper than {MAX_DEPTH} levels"));
        }
        let mut message = body;
        while !message.is_empty() {
            match next_field(&mut message)? {
                // rate_limit: its replaces.
                (3, Some(policy)) => each_field(policy, 5, |_| self.one())?,
                (4, Some(child)) => self.descriptor(child, depth + 1)?,
                (8, Some(metadata)) => {
                    self.metadata += metadata.len();
                    if self.metadata > MAX_METADATA_BYTES {
                        return Err(format!(
                            "more than {MAX_METADATA_BYTES} bytes of descriptor metadata in one \
                             update"
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Checks a response's bounds without building it: `Err(Some(reason))` refuses its
/// resources; `Err(None)` when the envelope itself is not a message.
fn scan(bytes: &[u8]) -> Result<(), Option<String>> {
    let (mut message, mut resources, mut count) = (bytes, 0usize, Count::default());
    let mut refusal = None;
    while !message.is_empty() {
        let (tag, body) = next_field(&mut message).map_err(|_| None)?;
        let (2, Some(any)) = (tag, body) else {
            continue;
        };
        resources += 1;
        if refusal.is_some() {
            continue;
        }
        if resources > MAX_RESOURCES {
            refusal = Some(format!("more than {MAX_RESOURCES} resources in one update"));
            continue;
        }
        // Any.value: a RateLimitConfig, whose descriptors are field 3.
        let scanned = each_field(any, 2, |config| {
            each_field(config, 3, |descriptor| count.descriptor(descriptor, 1))
        });
        refusal = scanned.err();
    }
    refusal.map_or(Ok(()), |reason| Err(Some(reason)))
}

/// Decodes a response after checking its bounds.
fn receive(bytes: &[u8]) -> Result<Received, Status> {
    let malformed = |e: prost::DecodeError| {
        Status::internal(format!(
            "malformed DiscoveryResponse from the control plane: {e}"
        ))
    };
    match scan(bytes) {
        Ok(()) => Response::decode(bytes)
            .map(Received::Response)
            .map_err(malformed),
        Err(Some(reason)) => {
            let envelope = Envelope::decode(bytes).map_err(malformed)?;
            Ok(Received::Refused {
                version_info: envelope.version_info,
                nonce: envelope.nonce,
                reason,
            })
        }
        Err(None) => Err(Status::internal(
            "malformed DiscoveryResponse from the control plane",
        )),
    }
}

/// The ADS stream's codec: requests encoded with prost, responses checked then decoded.
#[derive(Default)]
pub(super) struct XdsCodec;

pub(super) struct RequestEncoder;
pub(super) struct ResponseDecoder;

impl Codec for XdsCodec {
    type Encode = DiscoveryRequest;
    type Decode = Received;
    type Encoder = RequestEncoder;
    type Decoder = ResponseDecoder;

    fn encoder(&mut self) -> RequestEncoder {
        RequestEncoder
    }

    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

impl Encoder for RequestEncoder {
    type Item = DiscoveryRequest;
    type Error = Status;

    fn encode(&mut self, item: DiscoveryRequest, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding a DiscoveryRequest: {e}")))
    }
}

impl Decoder for ResponseDecoder {
    type Item = Received;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Received>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        receive(&bytes).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::ratelimit_format::{
        RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, TYPE_URL,
    };

    fn response(configs: Vec<RateLimitConfig>) -> Vec<u8> {
        Response {
            version_info: "7".into(),
            resources: configs
                .iter()
                .map(|c| prost_types::Any {
                    type_url: TYPE_URL.into(),
                    value: c.encode_to_vec(),
                })
                .collect(),
            type_url: TYPE_URL.into(),
            nonce: "n1".into(),
        }
        .encode_to_vec()
    }

    fn domain(descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
        RateLimitConfig {
            name: "r".into(),
            domain: "d".into(),
            descriptors,
        }
    }

    fn refusal(bytes: &[u8]) -> String {
        match receive(bytes).unwrap() {
            Received::Refused {
                reason,
                nonce,
                version_info,
                ..
            } => {
                assert_eq!((nonce.as_str(), version_info.as_str()), ("n1", "7"));
                reason
            }
            Received::Response(r) => panic!("accepted {} resources", r.resources.len()),
        }
    }

    #[test]
    fn a_response_within_the_bounds_is_decoded() {
        let one = RateLimitDescriptor {
            key: "k".into(),
            ..Default::default()
        };
        let bytes = response(vec![domain(vec![one; 10])]);
        match receive(&bytes).unwrap() {
            Received::Response(r) => {
                assert_eq!((r.nonce.as_str(), r.resources.len()), ("n1", 1));
                let config = RateLimitConfig::decode(&r.resources[0].value[..]).unwrap();
                assert_eq!(config.descriptors.len(), 10);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn empty_descriptors_by_the_million_are_counted_not_built() {
        // 2 bytes each: 200 001 of them in 400 KB, each a struct when built.
        let bytes = response(vec![domain(vec![
            RateLimitDescriptor::default();
            MAX_ELEMENTS + 1
        ])]);
        assert!(bytes.len() < 500_000);
        assert_eq!(
            refusal(&bytes),
            format!("more than {MAX_ELEMENTS} descriptors and replaces entries in one update")
        );
        // Spread over domains, and replaces count too.
        let half = MAX_ELEMENTS / 2;
        let replaces = RateLimitDescriptor {
            rate_limit: Some(RateLimitPolicy {
                replaces: vec![RateLimitReplace::default(); half],
                ..Default::default()
            }),
            ..Default::default()
        };
        let spread = response(vec![
            domain(vec![RateLimitDescriptor::default(); half]),
            domain(vec![replaces]),
        ]);
        assert!(refusal(&spread).starts_with("more than"));
        // Exactly at the bound: decoded.
        let at = response(vec![domain(vec![
            RateLimitDescriptor::default();
            MAX_ELEMENTS
        ])]);
        assert!(matches!(receive(&at).unwrap(), Received::Response(_)));
    }

    /// Plays the attacker (a control plane gone wrong): descriptor metadata is bounded in
    /// bytes per update before any of it is built; up to the bound it is decoded.
    #[test]
    fn descriptor_metadata_beyond_its_bytes_is_refused_unbuilt() {
        use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
        let with = |bytes: usize| RateLimitDescriptor {
            key: "k".into(),
            metadata: Some(Struct {
                fields: [(
                    "m".to_string(),
                    Value {
                        kind: Some(Kind::StringValue("x".repeat(bytes))),
                    },
                )]
                .into(),
            }),
            ..Default::default()
        };
        let tenth = MAX_METADATA_BYTES / 10;
        let over = response(vec![domain(vec![with(tenth); 11])]);
        assert_eq!(
            refusal(&over),
            format!("more than {MAX_METADATA_BYTES} bytes of descriptor metadata in one update")
        );
        let under = response(vec![domain(vec![with(tenth - 16); 10])]);
        assert!(matches!(receive(&under).unwrap(), Received::Response(_)));
    }

    #[test]
    fn too_many_resources_and_too_deep_nesting_are_refused() {
        let many = response(vec![domain(vec![]); MAX_RESOURCES + 1]);
        assert_eq!(
            refusal(&many),
            format!("more than {MAX_RESOURCES} resources in one update")
        );
        let mut deep = RateLimitDescriptor::default();
        for _ in 0..MAX_DEPTH {
            deep = RateLimitDescriptor {
                descriptors: vec![deep],
                ..Default::default()
            };
        }
        assert_eq!(
            refusal(&response(vec![domain(vec![deep.clone()])])),
            format!("descriptors nested deeper than {MAX_DEPTH} levels")
        );
        // One level less is fine.
        let fits = deep.descriptors.pop().unwrap();
        assert!(matches!(
            receive(&response(vec![domain(vec![fits])])).unwrap(),
            Received::Response(_)
        ));
    }

    #[test]
    fn malformed_bytes_are_refused_or_end_the_stream() {
        // A resource whose value is not a message: NACKed.
        let mut bad = Response {
            version_info: "7".into(),
            resources: vec![prost_types::Any {
                type_url: TYPE_URL.into(),
                value: vec![0x1a, 0x05, 0x0a],
            }],
            type_url: TYPE_URL.into(),
            nonce: "n1".into(),
        };
        assert!(refusal(&bad.encode_to_vec()).starts_with("malformed protobuf"));
        // An envelope that is not a message: the stream ends (no nonce to answer).
        bad.resources.clear();
        let mut bytes = bad.encode_to_vec();
        bytes.extend([0x12, 0x7f]);
        assert!(receive(&bytes).is_err());
        assert!(receive(&[0x0f]).is_err());
    }
}
