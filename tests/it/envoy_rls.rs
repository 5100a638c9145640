//! Envoy's ShouldRateLimit through a real tonic client built from envoy-types, against a
//! served cellrate on a fake clock.

use std::sync::Arc;

use crate::common::{descriptor, item, remaining, Served, MS};
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use cellrate::service::envoy::{EnvoyOptions, HeaderStyle};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::Code as Grpc;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

fn signup(ip: &str) -> RateLimitDescriptor {
    descriptor(&[("generic_key", "signup"), ("remote_address", ip)])
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(s: &mut Served, r: RateLimitRequest) -> RateLimitResponse {
    s.envoy
        .should_rate_limit(r)
        .await
        .expect("ShouldRateLimit succeeds")
        .into_inner()
}

fn header<'a>(r: &'a RateLimitResponse, key: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == key)
        .map(|h| h.value.as_str())
}

fn reset_ns(
    status: &envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus,
) -> i64 {
    let d = status.duration_until_reset.as_ref().unwrap();
    d.seconds * 1_000 * MS + i64::from(d.nanos)
}

async fn served(headers: HeaderStyle, shadow: bool) -> Served {
    let limits =
        LimitTable::load_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config").as_ref()).unwrap();
    let settings = Settings {
        envoy: EnvoyOptions {
            headers,
            shadow,
            ..EnvoyOptions::default()
        },
        ..Settings::default()
    };
    Served::with_settings(limits, settings).await
}

#[tokio::test]
async fn seed_000_walkthrough_via_remote_address() {
    let mut s = served(HeaderStyle::Off, false).await;
    for i in 1..=20u32 {
        let r = ask(&mut s, request("edge", vec![signup("172.23.45.22")])).await;
        assert_eq!(r.overall_code, OK, "request {i}");
        let status = &r.statuses[0];
        assert_eq!(status.limit_remaining, 20 - i);
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!(limit.name, "NewRegistrationsPerIPAddress");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (20, Unit::Second as i32)
        );
        assert!(header(&r, "Retry-After").is_none());
    }
    let r = ask(&mut s, request("edge", vec![signup("172.23.45.22")])).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[0].code, OVER);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(reset_ns(&r.statuses[0]), 50 * MS);
    assert_eq!(header(&r, "Retry-After"), Some("1"));
    let meta = r.dynamic_metadata.unwrap();
    assert!(format!("{:?}", meta.fields["limit"]).contains("NewRegistrationsPerIPAddress"));
    s.clock.advance(50 * MS);
    let r = ask(&mut s, request("edge", vec![signup("172.23.45.22")])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    // The bucket is the native API's bucket: same key, same state.
    assert_eq!(
        remaining(&mut s, "NewRegistrationsPerIPAddress", "172.23.45.22").await,
        0
    );
}

#[tokio::test]
async fn convention_and_rules_including_two_limits_on_one_descriptor() {
    let mut s = served(HeaderStyle::Off, false).await;
    // Convention, in any domain: the key is a limit name.
    let r = ask(
        &mut s,
        request(
            "anything",
            vec![descriptor(&[("NewOrdersPerAccount", "12345678")])],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    // 600 per 180m is 4800 per day.
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit, limit.unit),
        ("NewOrdersPerAccount", 4_800, Unit::Day as i32)
    );
    assert_eq!(r.statuses[0].limit_remaining, 299);

    // A rule mapping one descriptor to a per-second and a per-day limit.
    let r = ask(
        &mut s,
        request("edge", vec![descriptor(&[("api_key", "key-1")])]),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    let status = &r.statuses[0];
    assert_eq!(
        status.current_limit.as_ref().unwrap().name,
        "ApiRequestsPerKey"
    );
    assert_eq!(status.limit_remaining, 9);
    assert_eq!(
        remaining(&mut s, "ApiRequestsPerKeyDaily", "key-1").await,
        9_999
    );

    // Rules are per domain: in another domain the same descriptor is unmatched.
    let r = ask(
        &mut s,
        request("other", vec![descriptor(&[("api_key", "key-1")])]),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(remaining(&mut s, "ApiRequestsPerKey", "key-1").await, 9);
}

#[tokio::test]
async fn one_exhausted_descriptor_spends_nothing_anywhere() {
    let mut s = served(HeaderStyle::Off, false).await;
    let mut exhaust = request("edge", vec![descriptor(&[("api_key", "key-2")])]);
    exhaust.hits_addend = 10;
    assert_eq!(ask(&mut s, exhaust).await.overall_code, OK);
    let before = remaining(&mut s, "NewOrdersPerAccount", "1").await;
    assert_eq!(before, 300);
    let r = ask(
        &mut s,
        request(
            "edge",
            vec![
                descriptor(&[("NewOrdersPerAccount", "1")]),
                descriptor(&[("api_key", "key-2")]),
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!((r.statuses[0].code, r.statuses[1].code), (OK, OVER));
    assert_eq!(
        r.statuses[0].limit_remaining, 300,
        "reports the unspent bucket"
    );
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "1").await, before);
    assert_eq!(
        remaining(&mut s, "ApiRequestsPerKeyDaily", "key-2").await,
        9_990
    );
}

#[tokio::test]
async fn hits_addend_request_level_per_descriptor_and_zero_checks() {
    let mut s = served(HeaderStyle::Off, false).await;
    let mut r = request("edge", vec![signup("10.1.1.1")]);
    r.hits_addend = 3;
    assert_eq!(ask(&mut s, r).await.statuses[0].limit_remaining, 17);

    let mut d = signup("10.1.1.1");
    d.hits_addend = Some(UInt64Value { value: 5 });
    let mut r = request("edge", vec![d]);
    r.hits_addend = 3; // the descriptor's own wins
    assert_eq!(ask(&mut s, r).await.statuses[0].limit_remaining, 12);

    let mut peek = signup("10.1.1.1");
    peek.hits_addend = Some(UInt64Value { value: 0 });
    let r = ask(&mut s, request("edge", vec![peek])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 12));
    assert_eq!(
        remaining(&mut s, "NewRegistrationsPerIPAddress", "10.1.1.1").await,
        12
    );

    // More than the burst can never pass: OVER_LIMIT, not an error, and nothing spent.
    let mut huge = signup("10.1.1.1");
    huge.hits_addend = Some(UInt64Value { value: 21 });
    let r = ask(
        &mut s,
        request(
            "edge",
            vec![huge, descriptor(&[("NewOrdersPerAccount", "2")])],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(
        (r.statuses[0].code, r.statuses[0].limit_remaining),
        (OVER, 12)
    );
    assert!(header(&r, "Retry-After").is_none(), "no wait makes it pass");
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "2").await, 300);
}

#[tokio::test]
async fn descriptor_limit_overrides_the_configured_limit() {
    let mut s = served(HeaderStyle::Off, false).await;
    let limited = || {
        let mut d = descriptor(&[("NewOrdersPerAccount", "5")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: 2,
        }); // 2 per minute
        d
    };
    for left in [1, 0] {
        let r = ask(&mut s, request("edge", vec![limited()])).await;
        assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, left));
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (2, Unit::Minute as i32)
        );
    }
    let r = ask(&mut s, request("edge", vec![limited()])).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(reset_ns(&r.statuses[0]), 30_000 * MS);
    assert_eq!(header(&r, "Retry-After"), Some("30"));

    // An unmatched descriptor with its own limit is limited by it.
    let path = || {
        let mut d = descriptor(&[("path", "/expensive")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 1,
        });
        d
    };
    assert_eq!(
        ask(&mut s, request("edge", vec![path()]))
            .await
            .overall_code,
        OK
    );
    assert_eq!(
        ask(&mut s, request("edge", vec![path()]))
            .await
            .overall_code,
        OVER
    );
    let bad = RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 99,
        }),
        ..path()
    };
    // A unit it does not know: that descriptor is denied (the domain's default
    // `invalid_id` policy), never an error Envoy would let through.
    let r = ask(&mut s, request("edge", vec![bad])).await;
    assert_eq!((r.overall_code, r.statuses[0].code), (OVER, OVER));
}

#[tokio::test]
async fn unmatched_descriptors_are_ok_and_unlimited() {
    let mut s = served(HeaderStyle::Ietf, false).await;
    for _ in 0..50 {
        let r = ask(
            &mut s,
            request(
                "edge",
                vec![descriptor(&[("path", "/"), ("method", "GET")])],
            ),
        )
        .await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses.len(), 1);
        assert!(r.statuses[0].current_limit.is_none());
        assert!(r.response_headers_to_add.is_empty());
    }
}

#[tokio::test]
async fn shadow_mode_per_limit_and_global() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "NewRegistrationsPerIPAddress: {burst: 2, count: 2, period: 1s, shadow: true}\n\
         NewOrdersPerAccount: {burst: 2, count: 2, period: 1s}\n",
    )
    .unwrap();
    let limits = LimitTable::load_dir(dir.path()).unwrap();
    let mut s = Served::with_settings(limits.clone(), Settings::default()).await;
    for _ in 0..5 {
        let r = ask(
            &mut s,
            request(
                "edge",
                vec![descriptor(&[("NewRegistrationsPerIPAddress", "10.0.0.1")])],
            ),
        )
        .await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].code, OK);
    }
    let r = ask(
        &mut s,
        request(
            "edge",
            vec![descriptor(&[("NewRegistrationsPerIPAddress", "10.0.0.1")])],
        ),
    )
    .await;
    assert_eq!(
        r.statuses[0].limit_remaining, 0,
        "decided for real: the bucket is empty"
    );
    let meta = format!("{:?}", r.dynamic_metadata.unwrap().fields["shadow_denied"]);
    assert!(meta.contains("NewRegistrationsPerIPAddress"), "{meta}");
    // A shadow limit's denial does not block an enforced one in the same request.
    let r = ask(
        &mut s,
        request(
            "edge",
            vec![
                descriptor(&[("NewRegistrationsPerIPAddress", "10.0.0.1")]),
                descriptor(&[("NewOrdersPerAccount", "1")]),
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "1").await, 1);
    // The native API reports the truth.
    let native = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![item("NewRegistrationsPerIPAddress", "10.0.0.1", None)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!native.into_inner().overall.unwrap().allowed);
    s.stop().await;

    // Global shadow: every limit reports OK.
    let settings = Settings {
        envoy: EnvoyOptions {
            headers: HeaderStyle::Off,
            shadow: true,
            ..EnvoyOptions::default()
        },
        ..Settings::default()
    };
    let mut s = Served::with_settings(limits, settings).await;
    for _ in 0..4 {
        let r = ask(
            &mut s,
            request("edge", vec![descriptor(&[("NewOrdersPerAccount", "9")])]),
        )
        .await;
        assert_eq!(r.overall_code, OK);
        assert!(header(&r, "Retry-After").is_none());
    }
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "9").await, 0);
}

#[tokio::test]
async fn draft03_headers_and_retry_after_rounding() {
    let mut s = served(HeaderStyle::Draft03, false).await;
    let r = ask(
        &mut s,
        request("edge", vec![descriptor(&[("api_key", "key-h")])]),
    )
    .await;
    assert_eq!(
        header(&r, "X-RateLimit-Limit"),
        Some("10, 10;w=1, 10000;w=86400")
    );
    assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("9"));
    assert_eq!(header(&r, "X-RateLimit-Reset"), Some("1")); // 100ms rounds up
                                                            // Retry-After counts whole seconds, rounded up, on a 1-per-minute descriptor limit.
    let slow = || {
        let mut d = descriptor(&[("path", "/slow")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 2,
        }); // 1 per minute
        d
    };
    ask(&mut s, request("edge", vec![slow()])).await;
    for (wait, expected) in [
        (0, "60"),
        (500 * MS, "60"),
        (59_000 * MS, "1"),
        (499 * MS, "1"),
    ] {
        s.clock.advance(wait);
        let r = ask(&mut s, request("edge", vec![slow()])).await;
        assert_eq!(r.overall_code, OVER);
        assert_eq!(
            header(&r, "Retry-After"),
            Some(expected),
            "after {wait}ns more"
        );
        assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("0"));
    }
    s.clock.advance(MS);
    assert_eq!(
        ask(&mut s, request("edge", vec![slow()]))
            .await
            .overall_code,
        OK
    );
}

#[tokio::test]
async fn ietf_headers_name_every_limit() {
    let mut s = served(HeaderStyle::Ietf, false).await;
    let r = ask(
        &mut s,
        request(
            "edge",
            vec![
                descriptor(&[("api_key", "key-i")]),
                signup("10.2.2.2"),
                signup("10.2.2.3"),
            ],
        ),
    )
    .await;
    assert_eq!(
        header(&r, "RateLimit-Policy"),
        Some("\"ApiRequestsPerKey\";q=10;w=1, \"ApiRequestsPerKeyDaily\";q=10000;w=86400, \"NewRegistrationsPerIPAddress\";q=20;w=1, \"NewRegistrationsPerIPAddress-2\";q=20;w=1")
    );
    assert_eq!(
        header(&r, "RateLimit"),
        Some("\"ApiRequestsPerKey\";r=9;t=1, \"ApiRequestsPerKeyDaily\";r=9999;t=9, \"NewRegistrationsPerIPAddress\";r=19;t=1, \"NewRegistrationsPerIPAddress-2\";r=19;t=1")
    );
}

/// What Envoy's configuration alone sets (the domain, whether there are descriptors) is
/// INVALID_ARGUMENT when malformed; a descriptor that cannot be decided as it came is
/// denied by itself (the domain's default `invalid_id` policy), and nothing is spent.
#[tokio::test]
async fn malformed_requests_are_invalid_argument_and_malformed_descriptors_denied() {
    let mut s = served(HeaderStyle::Off, false).await;
    for (r, d) in [
        (
            request("edge", vec![signup("10.0.0.1"), descriptor(&[])]),
            1,
        ),
        (
            request(
                "edge",
                vec![signup("10.0.0.1"), descriptor(&[("a", "b"), ("", "x")])],
            ),
            1,
        ),
        // Before the others: its own status is the denial all the same.
        (
            request("edge", vec![descriptor(&[]), signup("10.0.0.1")]),
            0,
        ),
    ] {
        let r = ask(&mut s, r).await;
        assert_eq!(r.statuses.len(), 2);
        assert_eq!((r.overall_code, r.statuses[d].code), (OVER, OVER));
    }
    let cases = [
        (request("", vec![signup("10.0.0.1")]), "domain: empty"),
        (request("edge", vec![]), "descriptors: empty"),
    ];
    // (An id that does not fit its format follows the domain's invalid_id policy:
    // tests/exact_answers.rs.)
    for (r, expected) in cases {
        let e = s.envoy.should_rate_limit(r).await.unwrap_err();
        assert_eq!(e.code(), Grpc::InvalidArgument, "{expected}");
        assert!(
            e.message().contains(expected),
            "{:?} does not contain {expected:?}",
            e.message()
        );
    }
    assert_eq!(
        remaining(&mut s, "NewRegistrationsPerIPAddress", "10.0.0.1").await,
        20
    );
}

/// Two descriptors of one request that name the same bucket (Envoy's `rate_limits` of a
/// virtual host and of its route both making `remote_address`, or a header the client
/// sets to the value another action takes): the bucket is decided once with both hits,
/// and both descriptors answer that decision. Refusing the request instead (the old
/// answer, INVALID_ARGUMENT) let it through uncounted behind Envoy's default
/// `failure_mode_deny: false`: a client choosing the header's value got around the limit.
#[tokio::test]
async fn one_bucket_named_by_two_descriptors_is_counted_twice() {
    let mut s = served(HeaderStyle::Off, false).await;
    let twice = |ip: &str| {
        request(
            "edge",
            vec![
                signup(ip),
                descriptor(&[("NewRegistrationsPerIPAddress", ip)]),
            ],
        )
    };
    // Burst 20: ten requests of two hits each.
    for i in 1..=10u32 {
        let r = ask(&mut s, twice("10.0.0.1")).await;
        assert_eq!(r.overall_code, OK, "request {i}");
        for status in &r.statuses {
            assert_eq!((status.code, status.limit_remaining), (OK, 20 - 2 * i));
        }
    }
    let r = ask(&mut s, twice("10.0.0.1")).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses.len(), 2);
    assert!(r.statuses.iter().all(|status| status.code == OVER));
    // The bucket is the one the native API reads: empty, and the denial spent nothing.
    assert_eq!(
        remaining(&mut s, "NewRegistrationsPerIPAddress", "10.0.0.1").await,
        0
    );
    // One hit left is not enough for two: all-or-nothing holds for the merged item.
    s.clock.advance(50 * MS);
    let r = ask(&mut s, twice("10.0.0.1")).await;
    assert_eq!(r.overall_code, OVER);
    let r = ask(&mut s, request("edge", vec![signup("10.0.0.1")])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    // The same bucket reached through two spellings of one address (the id format
    // canonicalises it): merged all the same, not an error Envoy would let through.
    let spelled = request(
        "edge",
        vec![
            signup("2001:db8::1"),
            descriptor(&[("NewRegistrationsPerIPAddress", "2001:0DB8:0:0::1")]),
        ],
    );
    let r = ask(&mut s, spelled).await;
    assert_eq!(r.overall_code, OK);
    for status in &r.statuses {
        assert_eq!((status.code, status.limit_remaining), (OK, 18));
    }
    // A request given back twice (is_negative_hits on both) repays both hits.
    let mut back = twice("10.0.0.1");
    for d in &mut back.descriptors {
        d.is_negative_hits = true;
    }
    let r = ask(&mut s, back).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        remaining(&mut s, "NewRegistrationsPerIPAddress", "10.0.0.1").await,
        2
    );
}

/// The error a store gets when its server refuses the connection.
fn refused() -> cellrate::store::StoreError {
    cellrate::store::StoreError::backend(
        "connection",
        std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"),
    )
}

/// A store that always fails, to see what Envoy gets.
struct BrokenStore;

impl cellrate::store::Store for BrokenStore {
    fn spend<'a>(
        &'a self,
        _: &'a [cellrate::store::StoreItem],
    ) -> cellrate::store::StoreFuture<'a, cellrate::store::Outcome> {
        Box::pin(async { Err(refused()) })
    }
    fn refund<'a>(
        &'a self,
        _: &'a [cellrate::store::StoreItem],
    ) -> cellrate::store::StoreFuture<'a, Vec<cellrate::gcra::Decision>> {
        Box::pin(async { Err(refused()) })
    }
    fn reset<'a>(
        &'a self,
        _: &'a [cellrate::limits::names::BucketKey],
    ) -> cellrate::store::StoreFuture<'a, u32> {
        Box::pin(async { Err(refused()) })
    }
}

#[tokio::test]
async fn a_failing_store_is_unavailable_never_unknown() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let limits =
        LimitTable::load_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config").as_ref()).unwrap();
    let decider = Arc::new(cellrate::service::Decider::new(
        Arc::new(arc_swap::ArcSwap::from_pointee(limits)),
        Arc::new(BrokenStore),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = cellrate::service::envoy::EnvoyRateLimitService::new(
        decider,
        EnvoyOptions::default(),
        cellrate::observe::metrics::Metrics::new(),
    );
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(cellrate::service::envoy::RlsServer::new(service, 1 << 20))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let e = client
        .should_rate_limit(request("edge", vec![signup("10.0.0.1")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Grpc::Unavailable);
    assert!(
        e.message().contains("connection refused"),
        "{}",
        e.message()
    );
    // A request that maps to no limit needs no store and is answered OK.
    let r = client
        .should_rate_limit(request("edge", vec![descriptor(&[("path", "/")])]))
        .await
        .unwrap();
    assert_eq!(r.into_inner().overall_code, OK);
    server.abort();
}

#[tokio::test]
async fn unlimited_and_deny_listed_ids() {
    let mut s = served(HeaderStyle::Off, false).await;
    let mut big = descriptor(&[("api_key", "key-internal-batch")]);
    // The per-second limit is lifted for this key; the daily one still counts.
    big.hits_addend = Some(UInt64Value { value: 500 });
    assert_eq!(
        ask(&mut s, request("edge", vec![big])).await.overall_code,
        OK
    );
    assert_eq!(
        remaining(&mut s, "ApiRequestsPerKeyDaily", "key-internal-batch").await,
        9_500
    );
    let r = ask(
        &mut s,
        request("edge", vec![descriptor(&[("api_key", "key-revoked-0001")])]),
    )
    .await;
    assert_eq!((r.overall_code, r.statuses[0].code), (OVER, OVER));
    assert!(r.statuses[0].current_limit.is_none());
}
