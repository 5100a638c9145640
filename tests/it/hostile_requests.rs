//! Hardening round 3 (#46): what an attacker did with request fields and configurations
//! added last round, each replayed through a real gRPC client against a served cellrate.
//! Every test here failed before its fix.

use std::path::Path;

use crate::common::{descriptor, directory, http_get_async, Served};
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use cellrate::service::envoy::{EnvoyOptions, RatelimitCounting};
use cellrate::service::CallerLimits;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// A domain in envoyproxy/ratelimit's format.
const RL: &str = "
domain: rl
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: huge
    rate_limit: {unit: second, requests_per_unit: 4294967295}
";

async fn served(dir: &Path, settings: Settings) -> Served {
    let limits = LimitTable::load_dir(dir).expect("the directory loads");
    Served::with_settings(limits, settings).await
}

async fn ask(
    s: &mut Served,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    s.envoy
        .should_rate_limit(RateLimitRequest {
            domain: domain.to_string(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .expect("answered")
        .into_inner()
}

/// `entries` with the descriptor's own limit of `n` per `unit` (Envoy's unit numbers).
fn with_limit(entries: &[(&str, &str)], n: u32, unit: i32) -> RateLimitDescriptor {
    RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: n,
            unit,
        }),
        ..descriptor(entries)
    }
}

/// Envoy's YEAR.
const YEAR: i32 = 6;
/// Envoy's SECOND.
const SECOND_UNIT: i32 = 1;

/// Item 1: a descriptor's own `limit` (and `detailed_metric`) put the request's entries
/// in statistics keys, up to 16 KiB each with terminal controls; 3 400 requests took RSS
/// to 655 MB and every scrape to 403 MB. Keys are now bounded, escaped and capped in
/// bytes.
#[tokio::test]
async fn request_values_never_grow_the_statistics_without_bound_nor_reach_them_raw() {
    let dir = directory(&[("rl.yaml", RL)]);
    let mut s = served(dir.path(), Settings::default()).await;
    let hostile = "\u{1b}]0;pwned\u{7}\u{202e}\0\r";
    let long = "v".repeat(1000);
    for i in 0..300 {
        let values: Vec<String> = (0..16).map(|j| format!("{hostile}{long}{i}-{j}")).collect();
        let entries: Vec<(String, &str)> = (0..16)
            .map(|j| (format!("k{j}"), values[j].as_str()))
            .collect();
        let entries: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let r = ask(&mut s, "rl", vec![with_limit(&entries, 5, YEAR)]).await;
        assert_eq!(r.overall_code, OK);
        // detailed_metric: the request's value in the key.
        let user = format!("{hostile}{long}{i}");
        ask(&mut s, "rl", vec![descriptor(&[("user", &user)])]).await;
    }
    let (_, metrics) = http_get_async(s.metrics_addr, "/metrics").await;
    eprintln!(
        "a scrape after 600 hostile requests: {} bytes",
        metrics.len()
    );
    // 600 keys of 16 KiB and 1 KiB, five series each, were 25 MB of exposition.
    assert!(
        metrics.len() < 2 << 20,
        "a scrape after 600 hostile requests is {} bytes",
        metrics.len()
    );
    for raw in ['\u{1b}', '\u{202e}', '\0', '\r', '\u{7}'] {
        assert!(!metrics.contains(raw), "{raw:?} reached the exposition raw");
    }
    assert!(
        metrics.contains("\\\\u{001B}]0;pwned"),
        "escaped keys are shown"
    );
    let keys = metrics
        .lines()
        .filter(|l| l.starts_with("cellrate_ratelimit_hits_total{") && l.contains("total_hits"))
        .count();
    assert!((2..=601).contains(&keys), "{keys} keys");
    s.stop().await;
}

/// Item 2: a descriptor's own `limit` in an envoyproxy/ratelimit domain was stored as a
/// configured bucket, outside `--caller-limit-bucket-share` and `--caller-limit-max-burst`:
/// one client filled the store with `1 per YEAR` buckets and configured limits answered
/// UNAVAILABLE for new ids.
#[tokio::test]
async fn caller_given_limits_in_ratelimit_domains_stay_in_the_caller_share() {
    let dir = directory(&[("rl.yaml", RL)]);
    let settings = Settings {
        max_buckets: 400,
        caller: CallerLimits {
            max_burst: 100,
            ..CallerLimits::default()
        },
        ..Settings::default()
    };
    let mut s = served(dir.path(), settings).await;
    // Above --caller-limit-max-burst: denied, never stored.
    let r = ask(
        &mut s,
        "rl",
        vec![with_limit(&[("tenant", "big")], 1_000, YEAR)],
    )
    .await;
    assert_eq!(
        r.overall_code, OVER,
        "a burst of 1000 passed a bound of 100"
    );
    // The flood: 1 000 fresh ids, each a bucket for a year.
    for i in 0..1_000 {
        let id = format!("attacker-{i}");
        let r = s
            .envoy
            .should_rate_limit(RateLimitRequest {
                domain: "rl".into(),
                descriptors: vec![with_limit(&[("tenant", &id)], 1, YEAR)],
                hits_addend: 0,
            })
            .await;
        // Past the caller share: refused one way or another, never a configured bucket.
        if let Ok(r) = r {
            let _ = r.into_inner();
        }
    }
    // Every configured limit still answers for new ids (80: within the rule's own share
    // of the configured buckets, 25 % of 360).
    for i in 0..80 {
        let ip = format!("10.0.{}.{}", i / 250, i % 250);
        let r = ask(&mut s, "rl", vec![descriptor(&[("remote_address", &ip)])]).await;
        assert_eq!(
            r.overall_code, OK,
            "{ip}: the configured limit lost its buckets"
        );
    }
    s.stop().await;
}

/// Item 8: `requests_per_unit` above 10^9 a second (4 294 967 295: "no practical limit")
/// validated, then denied every request; it now lets traffic through, in both countings
/// and as a descriptor's own limit.
#[tokio::test]
async fn a_limit_above_a_billion_a_second_lets_traffic_through() {
    let dir = directory(&[
        ("rl.yaml", RL),
        (
            "defaults.yaml",
            "NewOrdersPerAccount: {burst: 5, count: 5, period: 1s}\n",
        ),
    ]);
    for counting in [RatelimitCounting::FixedWindow, RatelimitCounting::Gcra] {
        let settings = Settings {
            envoy: EnvoyOptions {
                ratelimit_counting: counting,
                ..EnvoyOptions::default()
            },
            // A descriptor's own limit is a caller-given one: without this, its burst
            // is above --caller-limit-max-burst and denied for that reason.
            caller: CallerLimits {
                max_burst: u64::MAX,
                ..CallerLimits::default()
            },
            ..Settings::default()
        };
        let mut s = served(dir.path(), settings).await;
        for _ in 0..5 {
            let r = ask(&mut s, "rl", vec![descriptor(&[("huge", "x")])]).await;
            assert_eq!(r.overall_code, OK, "{counting:?}");
            let r = ask(
                &mut s,
                "rl",
                vec![with_limit(&[("tenant", "t")], u32::MAX, SECOND_UNIT)],
            )
            .await;
            assert_eq!(r.overall_code, OK, "{counting:?}: a descriptor's own limit");
            let r = ask(
                &mut s,
                "edge",
                vec![with_limit(&[("unmatched", "t")], u32::MAX, SECOND_UNIT)],
            )
            .await;
            assert_eq!(
                r.overall_code, OK,
                "{counting:?}: an unmatched descriptor's own limit"
            );
        }
        s.stop().await;
    }
}

/// Item 12: 20 000 `*mid*` wildcards cost about a second of CPU per request, tried in
/// turn; a domain may now hold at most 256 wildcards that cannot be indexed.
#[test]
fn a_domain_of_unindexable_wildcards_is_refused_naming_the_bound() {
    let file = |n: usize| {
        let mut text = String::from("domain: w\ndescriptors:\n");
        for i in 0..n {
            text.push_str(&format!(
                "  - key: path\n    value: \"*mid{i}*\"\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            ));
        }
        // Prefixes and suffixes are indexed: as many as a file may hold.
        for i in 0..1_000 {
            text.push_str(&format!(
                "  - key: path\n    value: \"/team-{i}/*\"\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            ));
        }
        text
    };
    let max = cellrate::limits::ratelimit_format::MAX_SCANNED_WILDCARDS;
    let dir = directory(&[("w.yaml", &file(max))]);
    assert!(LimitTable::load_dir(dir.path()).is_ok());
    let dir = directory(&[("w.yaml", &file(20_000))]);
    let e = LimitTable::load_dir(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("more than 256 wildcard values in one domain"),
        "{e}"
    );
}

/// Item 7: a temporary override of a `shadow: true` limit enforced it: raising a shadow
/// limit in an incident produced 429s. The override changes the numbers only.
#[tokio::test]
async fn a_temporary_override_of_a_shadow_limit_stays_in_shadow() {
    let dir = directory(&[(
        "defaults.yaml",
        "NewRegistrationsPerIPAddress: {burst: 2, count: 2, period: 1h, shadow: true}\n",
    )]);
    let mut s = served(dir.path(), Settings::default()).await;
    s.admin
        .set_override(pb::SetOverrideRequest {
            name: "NewRegistrationsPerIPAddress".into(),
            id: "10.0.0.1".into(),
            burst: 3,
            count: 3,
            period: Some(prost_types::Duration {
                seconds: 3600,
                nanos: 0,
            }),
            ttl: Some(prost_types::Duration {
                seconds: 600,
                nanos: 0,
            }),
            comment: "incident 7".into(),
            author: "ops".into(),
            ..Default::default()
        })
        .await
        .expect("the override is set");
    for i in 0..6 {
        let r = ask(
            &mut s,
            "edge",
            vec![descriptor(&[("NewRegistrationsPerIPAddress", "10.0.0.1")])],
        )
        .await;
        assert_eq!(
            r.overall_code, OK,
            "request {i} was denied by a shadow limit"
        );
        if i == 5 {
            // Decided for real under the override's numbers: 3, then empty.
            assert_eq!(r.statuses[0].limit_remaining, 0);
            assert_eq!(
                r.statuses[0]
                    .current_limit
                    .as_ref()
                    .unwrap()
                    .requests_per_unit,
                3
            );
        }
    }
    s.stop().await;
}

fn negative(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        is_negative_hits: true,
        ..descriptor(entries)
    }
}

/// Item 14: one descriptor with `is_negative_hits` (Envoy 1.38+) failed the whole
/// request INVALID_ARGUMENT, so its positive descriptors went uncounted (and with Envoy's
/// default failure mode, through). Now the positive ones are decided and spent, the
/// negative one gives back, never past full.
#[tokio::test]
async fn negative_hits_give_back_and_the_rest_of_the_request_still_counts() {
    let dir = directory(&[
        ("rl.yaml", RL),
        (
            "defaults.yaml",
            "NewOrdersPerAccount: {burst: 3, count: 3, period: 1h}\n\
             NewRegistrationsPerIPAddress: {burst: 3, count: 3, period: 1h}\n",
        ),
    ]);
    let mut s = served(dir.path(), Settings::default()).await;
    let orders = || descriptor(&[("NewOrdersPerAccount", "7")]);
    let regs = || descriptor(&[("NewRegistrationsPerIPAddress", "10.0.0.9")]);
    // Spend 2 of 3 registrations.
    for _ in 0..2 {
        assert_eq!(ask(&mut s, "edge", vec![regs()]).await.overall_code, OK);
    }
    // One request: an order spent, two registrations given back.
    let r = ask(
        &mut s,
        "edge",
        vec![
            orders(),
            negative(&[("NewRegistrationsPerIPAddress", "10.0.0.9")], 2),
        ],
    )
    .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 2, "the order was counted");
    assert_eq!(r.statuses[1].code, OK);
    assert_eq!(
        r.statuses[1].limit_remaining, 3,
        "both registrations came back"
    );
    // Never past full.
    let r = ask(
        &mut s,
        "edge",
        vec![negative(
            &[("NewRegistrationsPerIPAddress", "10.0.0.9")],
            50,
        )],
    )
    .await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 3));
    for _ in 0..3 {
        assert_eq!(ask(&mut s, "edge", vec![regs()]).await.overall_code, OK);
    }
    assert_eq!(ask(&mut s, "edge", vec![regs()]).await.overall_code, OVER);
    // In envoyproxy/ratelimit's fixed windows: given back, floored at none used.
    for _ in 0..3 {
        ask(&mut s, "rl", vec![descriptor(&[("user", "ann")])]).await;
    }
    let r = ask(&mut s, "rl", vec![negative(&[("user", "ann")], 10)]).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 3));
    // Counted in their own statistic, not as hits.
    let (_, metrics) = http_get_async(s.metrics_addr, "/metrics").await;
    let stat = |stat: &str| {
        crate::common::sample(
            &metrics,
            &format!("cellrate_ratelimit_hits_total{{key=\"rl.user_ann\",stat=\"{stat}\"}}"),
        )
    };
    assert_eq!(stat("total_hits"), Some(3.0));
    assert_eq!(stat("total_negative_hits"), Some(10.0));
    s.stop().await;
}

/// Hardening round 4 (#58): a hit count is the client's (Envoy's `hits_addend` format takes
/// it from a header). Whatever its size, on every kind of limit (GCRA, an overdraw budget,
/// a calendar window, envoyproxy/ratelimit's fixed windows and cellrate's GCRA for them),
/// spent or given back: answered, never an error that Envoy would let through, and the
/// bucket is not wrapped: the next request of one hit is decided as if the huge one had
/// been denied (spend) or had given back at most to full (refund).
#[tokio::test]
async fn hit_counts_of_any_size_are_decided_and_never_wrap_a_bucket() {
    let dir = directory(&[
        (
            "names.yaml",
            "Gcra: {number: 100, format: string}\n\
             Budget: {number: 101, format: string}\n\
             Daily: {number: 102, format: string}\n",
        ),
        (
            "defaults.yaml",
            "Gcra: {burst: 5, count: 5, period: 1h}\n\
             Budget: {burst: 5, count: 5, period: 1h, overdraw: true}\n\
             Daily: {window: calendar, count: 5, period: 1d}\n",
        ),
        (
            "descriptors.yaml",
            "d:\n  - match: [{key: g}]\n    limits: [Gcra]\n    id: \"{g}\"\n\
             \x20 - match: [{key: b}]\n    limits: [Budget]\n    id: \"{b}\"\n\
             \x20 - match: [{key: c}]\n    limits: [Daily]\n    id: \"{c}\"\n",
        ),
        ("rl.yaml", RL),
    ]);
    let huge = [
        u64::MAX,
        u64::MAX - 7,
        1 << 63,
        (1 << 63) - 1,
        (1 << 53) + 1,
        u64::from(u32::MAX) + 1,
    ];
    for counting in [RatelimitCounting::FixedWindow, RatelimitCounting::Gcra] {
        let settings = Settings {
            envoy: EnvoyOptions {
                ratelimit_counting: counting,
                ..EnvoyOptions::default()
            },
            ..Settings::default()
        };
        let mut s = served(dir.path(), settings).await;
        for (domain, key) in [("d", "g"), ("d", "b"), ("d", "c"), ("rl", "user")] {
            for (n, &hits) in huge.iter().enumerate() {
                let id = format!("{key}-{n}");
                for negative in [false, true] {
                    let d = RateLimitDescriptor {
                        hits_addend: Some(UInt64Value { value: hits }),
                        is_negative_hits: negative,
                        ..descriptor(&[(key, &id)])
                    };
                    let r = s.envoy.should_rate_limit(RateLimitRequest {
                        domain: domain.to_string(),
                        descriptors: vec![d],
                        hits_addend: 0,
                    });
                    let r = r.await;
                    assert!(
                        r.is_ok(),
                        "{counting:?} {domain} {key} {hits} {negative}: {r:?}"
                    );
                }
                // One hit after the huge ones: the bucket is as a client of one hit
                // expects it (the limit's first hit; the budget's too, since a huge
                // charge past its debt bound is denied).
                let one = ask(&mut s, domain, vec![descriptor(&[(key, &id)])]).await;
                assert_eq!(
                    (one.overall_code, one.statuses[0].limit_remaining),
                    (OK, if key == "user" { 2 } else { 4 }),
                    "{counting:?} {domain} {key} after {hits}: {one:?}"
                );
            }
        }
        s.stop().await;
    }
}

/// Hardening round 4 (#58): descriptors that a client's headers add, each mapped to two
/// limits, past the 64 items a batch takes: the descriptor past the bound is decided by
/// the domain's policy (denied), never INVALID_ARGUMENT, which Envoy lets through; and
/// nothing is spent.
#[tokio::test]
async fn descriptors_past_the_batch_bound_deny_and_spend_nothing() {
    let mut s = Served::start(None).await;
    // `api_key` maps to ApiRequestsPerKey and ApiRequestsPerKeyDaily: 33 of them are 66.
    let many: Vec<RateLimitDescriptor> = (0..33)
        .map(|i| descriptor(&[("api_key", &format!("k{i}"))]))
        .collect();
    let r = ask(&mut s, "edge", many).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(
        crate::common::remaining(&mut s, "ApiRequestsPerKey", "k0").await,
        10,
        "nothing spent"
    );
    // 32 (64 items) are decided as usual.
    let fewer: Vec<RateLimitDescriptor> = (0..32)
        .map(|i| descriptor(&[("api_key", &format!("k{i}"))]))
        .collect();
    assert_eq!(ask(&mut s, "edge", fewer).await.overall_code, OK);
    s.stop().await;
}

/// A request that spends and gives back at once, whose give-back part cannot be decided
/// (here past the batch bound: 33 descriptors of two limits each) after its spend was made:
/// the spend is answered as made (allowed, spent once), the give-back gives back nothing;
/// the request is not decided again as denied with its spend standing.
#[tokio::test]
async fn a_give_back_that_cannot_be_decided_after_a_spend_leaves_the_spend_answered() {
    let mut s = Served::start(None).await;
    let mut descriptors = vec![descriptor(&[
        ("generic_key", "signup"),
        ("remote_address", "10.9.9.9"),
    ])];
    descriptors.extend((0..33).map(|i| negative(&[("api_key", &format!("g{i}"))], 1)));
    let r = ask(&mut s, "edge", descriptors).await;
    assert_eq!(r.overall_code, OK, "{r:?}");
    assert_eq!(
        crate::common::remaining(&mut s, "NewRegistrationsPerIPAddress", "10.9.9.9").await,
        19,
        "spent once"
    );
    s.stop().await;
}
