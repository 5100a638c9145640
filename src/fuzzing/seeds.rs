//! The fuzzers' starting inputs, built from the examples (config/, the documented
//! requests): `fuzz/seeds/` holds them (`cargo run --features fuzzing --example
//! fuzz_seeds` writes them) and the test suite runs them.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;

use super::{EXAMPLE_CONFIG, FORMATS};
use crate::clock::SECOND;
use crate::proto::v1 as pb;

/// Seed inputs for `target`, built from the examples (config/, the documented requests):
/// the fuzzers' starting corpus (`cargo run --features fuzzing --example fuzz_seeds` writes them to
/// `fuzz/seeds/`), and inputs the test suite runs.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "limits_config" => config_seeds(),
        "id_canonicalisation" => id_seeds(),
        "descriptor_mapping" => SEED_DESCRIPTORS
            .iter()
            .flat_map(|entries| {
                ["edge", "any"].map(|domain| {
                    let mut text = domain.to_string();
                    for (key, value) in entries.iter() {
                        text.push_str(&format!("\n{key}={value}"));
                    }
                    text.into_bytes()
                })
            })
            .collect(),
        "should_rate_limit" => should_rate_limit_seeds(),
        "check" => check_seeds(),
        "uds_authority" => uds_authority_seeds(),
        "grpc_framing" => framing_seeds(),
        _ => Vec::new(),
    }
}

/// The descriptors of the seeds: the example config's rules, a deny-listed key, an id in
/// a format's odd spelling, and one no rule maps.
const SEED_DESCRIPTORS: [&[(&str, &str)]; 6] = [
    &[("generic_key", "signup"), ("remote_address", "192.0.2.1")],
    &[("api_key", "key-1")],
    &[("api_key", "key-revoked-0001")],
    &[("NewOrdersPerAccount", "012345678")],
    &[("remote_address", "2001:db8::1")],
    &[("path", "/"), ("method", "GET")],
];

fn config_seeds() -> Vec<Vec<u8>> {
    let all: Vec<&str> = EXAMPLE_CONFIG.iter().map(|(_, text)| *text).collect();
    vec![
        all.join("\0").into_bytes(),
        all[0].as_bytes().to_vec(),
        format!("\0{}", all[1]).into_bytes(),
        b"\0\0\0".to_vec(),
    ]
}

fn id_seeds() -> Vec<Vec<u8>> {
    let ids = [
        "192.0.2.1",
        "2001:DB8:0::1",
        "::ffff:192.0.2.1",
        "2001:db8:1::/48",
        "012345678",
        "WWW.Example.CO.UK.",
        "b.example.com,A.example.com",
        "key-1",
        "12345:www.example.com",
    ];
    let mut seeds = Vec::new();
    for (selector, _) in FORMATS.iter().enumerate() {
        for id in ids {
            let mut seed = vec![selector as u8];
            seed.extend_from_slice(id.as_bytes());
            seeds.push(seed);
        }
    }
    seeds
}

fn should_rate_limit_seeds() -> Vec<Vec<u8>> {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;

    let descriptor =
        |entries: &[(&str, &str)], limit: Option<RateLimitOverride>| RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| Entry {
                    key: key.to_string(),
                    value: value.to_string(),
                })
                .collect(),
            limit,
            ..Default::default()
        };
    let mut seeds: Vec<Vec<u8>> = SEED_DESCRIPTORS
        .iter()
        .map(|entries| RateLimitRequest {
            domain: "edge".to_string(),
            descriptors: vec![descriptor(entries, None)],
            hits_addend: 0,
        })
        .map(|r| r.encode_to_vec())
        .collect();
    seeds.push(
        RateLimitRequest {
            domain: "edge".to_string(),
            descriptors: SEED_DESCRIPTORS
                .iter()
                .map(|e| descriptor(e, None))
                .collect(),
            hits_addend: 3,
        }
        .encode_to_vec(),
    );
    seeds.push(
        RateLimitRequest {
            domain: "any".to_string(),
            descriptors: vec![descriptor(
                &[("user", "u1")],
                Some(RateLimitOverride {
                    requests_per_unit: 2,
                    unit: 1,
                }),
            )],
            hits_addend: 5,
        }
        .encode_to_vec(),
    );
    // The reservations example: a hold of 500 tokens, its settlement, and an estimate over
    // the tenth of the budget one hold may take (denied, nothing held).
    let tokens = |hits: u64, settle: bool| RateLimitRequest {
        domain: "tokens".to_string(),
        descriptors: vec![RateLimitDescriptor {
            is_negative_hits: settle,
            ..descriptor(&[("tenant", "acme"), ("request", "req-1")], None)
        }],
        hits_addend: u32::try_from(hits).unwrap_or(u32::MAX),
    };
    for (hits, settle) in [(500, false), (500, true), (200_000, false)] {
        seeds.push(tokens(hits, settle).encode_to_vec());
    }
    seeds
}

fn check_seeds() -> Vec<Vec<u8>> {
    let named = |name: &str, id: &str, cost: Option<u64>, mode: pb::Mode| pb::Item {
        name: name.to_string(),
        id: id.to_string(),
        inline: None,
        cost,
        mode: mode as i32,
        lease_id: String::new(),
    };
    let inline = pb::Item {
        inline: Some(pb::InlineLimit {
            key: "export:42".to_string(),
            burst: 5,
            count: 1,
            period: Some(crate::service::native::duration(SECOND)),
            calendar: String::new(),
        }),
        cost: Some(2),
        ..Default::default()
    };
    let requests = [
        vec![named(
            "NewOrdersPerAccount",
            "12345678",
            None,
            pb::Mode::CheckAndSpend,
        )],
        vec![
            named(
                "NewOrdersPerAccount",
                "42",
                Some(1),
                pb::Mode::CheckAndSpend,
            ),
            named(
                "CertificatesPerDomain",
                "www.example.com",
                Some(0),
                pb::Mode::CheckOnly,
            ),
            named("ApiRequestsPerKey", "key-1", Some(3), pb::Mode::SpendOnly),
        ],
        vec![named(
            "ApiRequestsPerKey",
            "key-revoked-0001",
            None,
            pb::Mode::CheckAndSpend,
        )],
        vec![
            named(
                "NewRegistrationsPerIPAddress",
                "2001:db8::1",
                None,
                pb::Mode::CheckAndSpend,
            ),
            inline.clone(),
        ],
        vec![inline.clone()],
        // A calendar window (the fuzzer finds its way to bad window names from here).
        vec![pb::Item {
            inline: Some(pb::InlineLimit {
                period: None,
                burst: 0,
                calendar: "1mo".to_string(),
                ..inline.inline.clone().unwrap_or_default()
            }),
            mode: pb::Mode::Charge as i32,
            ..inline
        }],
    ];
    requests
        .into_iter()
        .zip([0, 1, 2, 3, 4].into_iter().cycle()) // every header style
        .map(|(items, headers)| {
            pb::CheckRequest {
                items,
                headers,
                ..Default::default()
            }
            .encode_to_vec()
        })
        .collect()
}

/// Header blocks: RFC 7541's first request (literal, then Huffman-coded), its second
/// (indexing the first's authority), and gRPC requests naming a socket as grpcio and
/// grpcurl do.
fn uds_authority_seeds() -> Vec<Vec<u8>> {
    let hex = |text: &str| -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
            .collect()
    };
    let mut first = hex("828684410f7777772e6578616d706c652e636f6d");
    first.extend(hex("828684be58086e6f2d6361636865"));
    let grpc = |authority: &[u8]| {
        let mut block = vec![0x83, 0x86, 0x44, 0x1c];
        block.extend_from_slice(b"/grpc.health.v1.Health/Check");
        block.extend_from_slice(&[0x41, authority.len() as u8]);
        block.extend_from_slice(authority);
        block.extend_from_slice(&[0x5f, 0x10]);
        block.extend_from_slice(b"application/grpc");
        block
    };
    vec![
        hex("828684410f7777772e6578616d706c652e636f6d"),
        hex("828684418cf1e3c2e5f23a6ba0ab90f4ff"),
        first,
        grpc(b"tmp%2Fx.sock"),
        grpc(b"/tmp/x.sock"),
        grpc(b"localhost"),
    ]
}

/// Unary bodies (a selector byte: the size bound 4096, or 16, or a `grpc-encoding`; a cut
/// count and the cuts; the body): a `Duration` message whole and cut at awkward places,
/// empty, compressed and unknown flags, cut short, two messages, trailing bytes, a
/// prefix over the bound, and under `gzip`.
fn framing_seeds() -> Vec<Vec<u8>> {
    let message = prost_types::Duration {
        seconds: 90,
        nanos: 5,
    }
    .encode_to_vec();
    let framed = |flag: u8, length: usize, payload: &[u8]| {
        let mut body = vec![flag];
        body.extend_from_slice(&(length as u32).to_be_bytes());
        body.extend_from_slice(payload);
        body
    };
    let one = framed(0, message.len(), &message);
    let input = |selector: u8, cuts: &[u8], body: &[u8]| {
        let mut input = vec![selector, cuts.len() as u8];
        input.extend_from_slice(cuts);
        input.extend_from_slice(body);
        input
    };
    vec![
        input(5, &[], &one),
        input(5, &[2, 7], &one),
        input(5, &[], &[]),
        input(5, &[], &framed(0, 0, &[])),
        input(5, &[], &framed(1, message.len(), &message)),
        input(5, &[], &framed(7, message.len(), &message)),
        input(5, &[], &one[..one.len() - 1]),
        input(5, &[3], &[one.clone(), one.clone()].concat()),
        input(5, &[], &[one.clone(), vec![0, 0]].concat()),
        input(3, &[], &one),
        input(5, &[], &[0, 0xff, 0xff, 0xff, 0xff]),
        input(5, &[], &framed(0, 3, &[0xff, 0xff, 0xff])),
        input(29, &[], &one),
    ]
}
