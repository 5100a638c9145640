//! Caller-given limits (native inline limits, Envoy descriptor `limit`s) as an attacker
//! would use them: to poison configured buckets or other callers' buckets, to outlive
//! every sweep, or to fill the store. Each bound is checked through a real gRPC client.

use crate::common::{check, example_limits, item, remaining, Served, MS};
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use cellrate::service::CallerLimits;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::Code as Grpc;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;
// Envoy's RateLimitUnit values.
const SECOND: i32 = 1;
const HOUR: i32 = 3;
const DAY: i32 = 4;
const MONTH: i32 = 5;
const YEAR: i32 = 6;

fn with_override(entries: &[(&str, &str)], limit: Option<(u32, i32)>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
            requests_per_unit,
            unit,
        }),
        ..crate::common::descriptor(entries)
    }
}

async fn ask(s: &mut Served, domain: &str, d: RateLimitDescriptor) -> RateLimitResponse {
    s.envoy
        .should_rate_limit(RateLimitRequest {
            domain: domain.to_string(),
            descriptors: vec![d],
            hits_addend: 0,
        })
        .await
        .expect("ShouldRateLimit succeeds")
        .into_inner()
}

fn inline(key: &str, burst: u64, count: u64, seconds: i64, cost: Option<u64>) -> pb::Item {
    pb::Item {
        inline: Some(pb::InlineLimit {
            key: key.to_string(),
            burst,
            count,
            period: Some(prost_types::Duration { seconds, nanos: 0 }),
            ..Default::default()
        }),
        cost,
        ..Default::default()
    }
}

async fn refund(s: &mut Served, items: Vec<pb::Item>) -> pb::RefundResponse {
    s.decisions
        .refund(pb::RefundRequest { items })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn a_descriptor_limit_never_touches_the_configured_bucket() {
    // A server that takes caller-given limits of at most a day.
    let settings = Settings {
        caller: CallerLimits {
            max_period: 86_400 * 1_000 * MS,
            ..CallerLimits::default()
        },
        ..Settings::default()
    };
    let mut s = Served::with_settings(example_limits(), settings).await;
    // 1 per hour on account 42's descriptor: the caller's own bucket.
    let one_per_hour = || with_override(&[("NewOrdersPerAccount", "42")], Some((1, HOUR)));
    assert_eq!(ask(&mut s, "edge", one_per_hour()).await.overall_code, OK);
    let r = ask(&mut s, "edge", one_per_hour()).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OVER, 0));
    // The configured bucket of account 42 (300 per 180 minutes) is untouched.
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "42").await, 300);
    // Envoy without the override spends from the configured bucket as usual.
    let plain = with_override(&[("NewOrdersPerAccount", "42")], None);
    let r = ask(&mut s, "edge", plain).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 299));

    // 1 per year is beyond this server's maximum period (1 day): over limit, nothing
    // stored, no Retry-After, the configured bucket untouched.
    let r = ask(
        &mut s,
        "edge",
        with_override(&[("NewOrdersPerAccount", "42")], Some((1, YEAR))),
    )
    .await;
    assert_eq!(r.overall_code, OVER);
    assert!(!r
        .response_headers_to_add
        .iter()
        .any(|h| h.key == "Retry-After"));
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "42").await, 299);
    s.stop().await;
}

#[tokio::test]
async fn callers_with_other_limits_on_one_key_never_share_a_bucket() {
    let mut s = Served::start(None).await;
    // Caller A: 1 per hour on "shared".
    let r = check(&mut s, vec![inline("shared", 1, 1, 3_600, None)])
        .await
        .unwrap();
    assert_eq!(r.overall.unwrap().remaining, 0);
    // Caller B, same key, 10 per second: a bucket of its own, full.
    let r = check(&mut s, vec![inline("shared", 10, 10, 1, None)])
        .await
        .unwrap();
    assert_eq!(r.overall.unwrap().remaining, 9);
    // Caller B cannot spend caller A's bucket down...
    let r = check(&mut s, vec![inline("shared", 10, 10, 1, Some(9))])
        .await
        .unwrap();
    assert_eq!(r.overall.unwrap().remaining, 0);
    // ...nor refill it with a refund under another (long) limit.
    let r = refund(&mut s, vec![inline("shared", 1, 1, 86_400, Some(1))]).await;
    assert!(
        !r.items[0].allowed,
        "a refund under another limit changed a bucket"
    );
    let r = check(&mut s, vec![inline("shared", 1, 1, 3_600, Some(0))])
        .await
        .unwrap();
    let a = r.overall.unwrap();
    assert_eq!(a.remaining, 0, "caller A's bucket is still empty");
    assert_eq!(crate::common::nanos(&a.reset_after), 3_600_000 * MS);
    s.stop().await;
}

#[tokio::test]
async fn caller_limits_beyond_the_server_bounds_are_refused() {
    let settings = Settings {
        caller: CallerLimits {
            max_burst: 100,
            max_period: 60 * 1_000 * MS,
            ..CallerLimits::default()
        },
        ..Settings::default()
    };
    let mut s = Served::with_settings(example_limits(), settings).await;
    let cases = [
        (inline("k", 101, 1, 1, None), "burst 101"),
        (inline("k", 1, 1, 61, None), "period 61s"),
        // 100 tokens of 1 s each: a full burst takes 100 s to come back.
        (inline("k", 100, 1, 1, None), "refill"),
    ];
    for (item, what) in cases {
        let e = check(&mut s, vec![item]).await.unwrap_err();
        assert_eq!(e.code(), Grpc::InvalidArgument, "{what}: {e:?}");
        assert!(e.message().starts_with("items[0].inline:"), "{what}: {e:?}");
        assert!(e.message().contains("maximum"), "{what}: {e:?}");
    }
    // Within the bounds: fine.
    assert!(check(&mut s, vec![inline("k", 60, 1, 1, None)])
        .await
        .is_ok());
    s.stop().await;
}

#[tokio::test]
async fn caller_limits_can_be_turned_off() {
    let settings = Settings {
        caller: CallerLimits {
            enabled: false,
            ..CallerLimits::default()
        },
        ..Settings::default()
    };
    let mut s = Served::with_settings(example_limits(), settings).await;
    let e = check(&mut s, vec![inline("k", 5, 5, 1, None)])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Grpc::InvalidArgument);
    assert!(e.message().contains("turned off"), "{e:?}");
    // Envoy's descriptor limit is ignored: the configured limit decides.
    let r = ask(
        &mut s,
        "edge",
        with_override(&[("NewOrdersPerAccount", "7")], Some((1, HOUR))),
    )
    .await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 299));
    // An unmatched descriptor with a limit is then simply unmatched.
    for _ in 0..3 {
        let r = ask(
            &mut s,
            "edge",
            with_override(&[("path", "/x")], Some((1, HOUR))),
        )
        .await;
        assert_eq!(r.overall_code, OK);
    }
    s.stop().await;
}

#[tokio::test]
async fn descriptor_buckets_are_unambiguous_and_take_long_values() {
    let mut s = Served::start(None).await;
    let one = Some((1, SECOND));
    // These used to be one bucket ("0:edge|a=b|c=d"): now four.
    let spellings = [
        ("edge", vec![("a", "b|c=d")]),
        ("edge", vec![("a", "b"), ("c", "d")]),
        ("edge|a=b", vec![("c", "d")]),
    ];
    for (domain, entries) in &spellings {
        let r = ask(&mut s, domain, with_override(entries, one)).await;
        assert_eq!(
            r.overall_code, OK,
            "{domain} {entries:?} found a spent bucket"
        );
    }
    let r = check(&mut s, vec![inline("edge|a=b|c=d", 1, 1, 1, None)])
        .await
        .unwrap();
    assert!(
        r.overall.unwrap().allowed,
        "the native inline key shared a descriptor's bucket"
    );
    // A 1 000-byte value with a limit works (the key is a digest).
    let long = "v".repeat(1_000);
    let r = ask(&mut s, "edge", with_override(&[("path", &long)], one)).await;
    assert_eq!(r.overall_code, OK);
    let r = ask(&mut s, "edge", with_override(&[("path", &long)], one)).await;
    assert_eq!(r.overall_code, OVER);
    s.stop().await;
}

#[tokio::test]
async fn configured_limits_keep_working_when_the_caller_share_is_full() {
    // 1 280 buckets, 10 % (128, one per shard) for caller-given limits, filled with the
    // longest-lived buckets the default bounds take (a year to refill: they never expire
    // during the attack).
    let settings = Settings {
        max_buckets: 1_280,
        ..Settings::default()
    };
    let mut s = Served::with_settings(example_limits(), settings).await;
    let mut full = None;
    for i in 0..10_000 {
        let r = check(
            &mut s,
            vec![inline(&format!("fill-{i}"), 1, 1, 365 * 86_400, None)],
        )
        .await
        .expect("a full share is a denial, not an error");
        if !r.overall.as_ref().expect("overall").allowed {
            full = Some(r);
            break;
        }
    }
    let denied = full.expect("the caller share fills up").overall.unwrap();
    assert_eq!(denied.remaining, 0, "{denied:?}");
    // New configured buckets are still created and decided.
    for id in 0..5 {
        let r = check(
            &mut s,
            vec![item("NewOrdersPerAccount", &id.to_string(), None)],
        )
        .await
        .expect("configured limits keep working");
        assert_eq!(r.overall.unwrap().remaining, 299);
    }
    s.stop().await;
}

#[tokio::test]
async fn monthly_and_yearly_limits_work_with_the_default_bounds() {
    let mut s = Served::with_settings(example_limits(), Settings::default()).await;
    // Envoy Gateway's per-tenant limits arrive as descriptor limits in any unit up to YEAR.
    for (unit, name) in [(DAY, "day"), (MONTH, "month"), (YEAR, "year")] {
        let tenant = format!("tenant-{name}");
        let d = || with_override(&[("tenant", tenant.as_str())], Some((1_000, unit)));
        let first = ask(&mut s, "budgets", d()).await;
        assert_eq!(first.overall_code, OK, "1 000 per {name}: {first:?}");
        assert_eq!(first.statuses[0].limit_remaining, 999, "1 000 per {name}");
    }
    // And natively: 1 000 000 tokens a year, and a redis-cell style yearly quota whose
    // full burst takes a little more than a year (1 001 tokens at 1 000 a year).
    let big = check(
        &mut s,
        vec![inline("tokens", 1_000_000, 1_000_000, 365 * 86_400, None)],
    )
    .await
    .expect("a yearly budget is accepted");
    assert_eq!(big.overall.unwrap().remaining, 999_999);
    let cell = check(
        &mut s,
        vec![inline("cell", 1_001, 1_000, 365 * 86_400, None)],
    )
    .await
    .expect("a redis-cell yearly quota is accepted");
    assert_eq!(cell.overall.unwrap().remaining, 1_000);
    // Beyond two years to refill: still refused, with the flag named.
    let e = check(&mut s, vec![inline("k", 3, 1, 365 * 86_400, None)])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Grpc::InvalidArgument, "{e:?}");
    assert!(e.message().contains("maximum"), "{e:?}");
    s.stop().await;
}
