//! Input limits: every one is a clear INVALID_ARGUMENT (or, for the message size, a refusal
//! before decoding), and nothing is spent; on Envoy's path, what a descriptor brings is
//! decided, never refused (an error there lets the request through).

use crate::common::{item, Served};
use cellrate::proto::v1 as pb;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as Rls;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Code;

const OK: i32 = Rls::Ok as i32;
const OVER: i32 = Rls::OverLimit as i32;

fn sized_descriptor(entries: usize, key_len: usize, value_len: usize) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: (0..entries)
            .map(|i| {
                // Distinct keys of exactly `key_len` bytes.
                let prefix = i.to_string();
                let key = format!(
                    "{prefix}{}",
                    "k".repeat(key_len.saturating_sub(prefix.len()))
                );
                Entry {
                    key,
                    value: "v".repeat(value_len),
                }
            })
            .collect(),
        ..Default::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

#[tokio::test]
async fn envoy_request_limits() {
    let mut s = Served::start(None).await;
    let cases = [
        (
            request(&"d".repeat(257), vec![sized_descriptor(1, 4, 4)]),
            "domain: longer than 256 bytes",
        ),
        (
            request("edge", (0..65).map(|_| sized_descriptor(1, 4, 4)).collect()),
            "descriptors: 65 descriptors, at most 64",
        ),
    ];
    for (r, expected) in cases {
        let e = s.envoy.should_rate_limit(r).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{expected}");
        assert!(
            e.message().contains(expected),
            "{:?} does not contain {expected:?}",
            e.message()
        );
    }
    // A descriptor over its bounds (entries, a key: Envoy's configuration sets them) is
    // denied by itself, never an error that Envoy would let through; nothing is spent.
    for r in [
        request("edge", vec![sized_descriptor(17, 4, 4)]),
        request("edge", vec![sized_descriptor(1, 257, 4)]),
    ] {
        let answer = s.envoy.should_rate_limit(r).await.unwrap().into_inner();
        assert_eq!(answer.overall_code, OVER);
        assert_eq!(answer.statuses[0].code, OVER);
    }
    // A value over 1 024 bytes (a client's header) stands for itself: decided, OK here
    // (the descriptor matches no limit).
    let answer = (s.envoy)
        .should_rate_limit(request("edge", vec![sized_descriptor(1, 4, 1025)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, OK);
    // At each limit exactly, the request is fine (the 64 KiB message limit bounds the total).
    for r in [
        request(
            &"d".repeat(256),
            (0..64).map(|_| sized_descriptor(1, 8, 8)).collect(),
        ),
        request("edge", vec![sized_descriptor(16, 256, 1024)]),
    ] {
        let ok = s.envoy.should_rate_limit(r).await;
        assert!(ok.is_ok(), "{ok:?}");
    }
}

#[tokio::test]
async fn native_request_limits() {
    let mut s = Served::start(None).await;
    let e = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![item(&"N".repeat(129), "x", None)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("items[0].name: longer than 128 bytes"),
        "{}",
        e.message()
    );
    // Ids longer than their format allows are rejected with a shortened echo.
    let e = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![item("ApiRequestsPerKey", &"x".repeat(10_000), None)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("must be 1 to 256 bytes, is 10000"),
        "{}",
        e.message()
    );
    assert!(
        e.message().len() < 300,
        "the error echoes the whole id: {} bytes",
        e.message().len()
    );
}

#[tokio::test]
async fn oversized_messages_are_refused_before_decoding() {
    let mut s = Served::start(None).await;
    // 64 items of 1 KiB ids: above the 64 KiB message limit.
    let items = (0..64)
        .map(|i| {
            item(
                "ApiRequestsPerKey",
                &format!("{i}{}", "x".repeat(1_100)),
                None,
            )
        })
        .collect();
    let e = s
        .decisions
        .check(pb::CheckRequest {
            items,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    let r = s
        .admin
        .inspect(pb::InspectRequest {
            items: vec![item("ApiRequestsPerKey", "0", None)],
        })
        .await
        .unwrap();
    assert_eq!(r.into_inner().items[0].remaining, 10, "nothing was spent");
}

/// A ShouldRateLimit over the 64 KiB bound cannot be read, so it cannot be decided; it is
/// denied unread (OVER_LIMIT, no status: none was read), never refused: an error would
/// let it through, and a client makes one by sending a large header that Envoy copies
/// into several descriptors.
#[tokio::test]
async fn an_oversized_should_rate_limit_is_denied_unread() {
    let mut s = Served::start(None).await;
    // 40 descriptors of 2 entries with 1 000-byte values: about 80 KiB, above the 64 KiB cap
    // (each part within its own bound, so only the size denies it).
    let big = request(
        "edge",
        (0..40).map(|_| sized_descriptor(2, 4, 1_000)).collect(),
    );
    let answer = s.envoy.should_rate_limit(big).await.unwrap().into_inner();
    assert_eq!(answer.overall_code, OVER);
    assert!(answer.statuses.is_empty(), "{answer:?}");
    // The same connection still answers a request within the bounds.
    let small = request("edge", vec![sized_descriptor(1, 4, 4)]);
    assert!(s.envoy.should_rate_limit(small).await.is_ok());
}

#[tokio::test]
async fn health_and_reflection_share_the_message_cap() {
    let s = Served::start(None).await;
    for addr in [s.decisions_addr, s.admin_addr] {
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        // Health: a 70 KiB service name.
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
        let e = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "x".repeat(70 * 1024),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::OutOfRange, "health on {addr}: {e:?}");
        // Reflection: a 70 KiB request on its stream is not decoded (tonic-reflection then
        // ends the stream without an answer); the same request at 1 KiB is answered.
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::{server_reflection_request, ServerReflectionRequest};
        let mut reflection = ServerReflectionClient::new(channel);
        let mut ask = async |host_len: usize| {
            let request = ServerReflectionRequest {
                host: "x".repeat(host_len),
                message_request: Some(server_reflection_request::MessageRequest::ListServices(
                    String::new(),
                )),
            };
            match reflection
                .server_reflection_info(tokio_stream::iter(vec![request]))
                .await
            {
                Err(e) => Err(e),
                Ok(response) => response.into_inner().message().await,
            }
        };
        let small = ask(1024).await;
        assert!(
            matches!(small, Ok(Some(_))),
            "reflection on {addr}: {:?}",
            small.err()
        );
        let big = ask(70 * 1024).await;
        assert!(
            matches!(big, Ok(None) | Err(_)),
            "reflection on {addr} answered a 70 KiB request"
        );
    }
}
