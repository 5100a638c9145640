//! The check-0, charge-later pattern held (`--zero-check-holds`), as both tiers drive it
//! (`tests/it/held_checks.rs` on the memory store, `tests/full/held_checks_redis.rs` on
//! Redis, Redis Cluster and Valkey): Envoy Gateway's token limit asks with 0 hits when a
//! request starts and charges the usage when its stream ends, on one descriptor.

use std::time::Duration;

use crate::Served;
use cellrate::limits::config::LimitTable;
use cellrate::server::Settings;
use cellrate::service::envoy::{EnvoyOptions, Estimate, ZeroCheckHolds};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

pub const OK: i32 = Code::Ok as i32;
pub const OVER: i32 = Code::OverLimit as i32;

/// The domain and its budget: 10 000 tokens an hour per tenant.
pub const DOMAIN: &str = "ai";
pub const BUDGET: u32 = 10_000;

/// The limits: envoyproxy/ratelimit's format, as Envoy Gateway's xDS serves them.
pub fn limits() -> LimitTable {
    let file = format!(
        "domain: {DOMAIN}\ndescriptors:\n  - key: tenant\n    rate_limit: {{unit: hour, \
         requests_per_unit: {BUDGET}}}\n"
    );
    LimitTable::from_files(&[("ai.yaml".to_string(), file)]).expect("the limits load")
}

/// The same budget in cellrate's own files, held by its reservation policy
/// (`zero_checks:`) rather than by a flag: GCRA, burst 10 000, over an hour.
pub fn limits_held_by_file() -> LimitTable {
    let files = [
        ("names.yaml", "Tokens: {number: 121, format: string}\n".to_string()),
        (
            "defaults.yaml",
            format!(
                "Tokens:\n  burst: {BUDGET}\n  count: {BUDGET}\n  period: 1h\n  \
                 reservation: {{hold: 10m, zero_checks: 1000}}\n"
            ),
        ),
        (
            "descriptors.yaml",
            format!("{DOMAIN}:\n  - match: [{{key: tenant}}]\n    limits: [Tokens]\n    id: \"{{tenant}}\"\n"),
        ),
    ];
    let files: Vec<(String, String)> = files.into_iter().map(|(f, t)| (f.to_string(), t)).collect();
    LimitTable::from_files(&files).expect("the limits load")
}

/// `settings` with holds of `estimate` on the domain, each lasting `hold`.
pub fn held(settings: Settings, estimate: Estimate, hold: Duration) -> Settings {
    Settings {
        envoy: EnvoyOptions {
            zero_check_holds: ZeroCheckHolds {
                scopes: vec![(DOMAIN.to_string(), estimate)],
                hold: hold.as_nanos() as i64,
            },
            ..settings.envoy.clone()
        },
        ..settings
    }
}

/// Tenant `tenant`'s descriptor at `hits`.
pub fn descriptor(tenant: &str, hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: "tenant".to_string(),
            value: tenant.to_string(),
        }],
        hits_addend: Some(UInt64Value { value: hits }),
        ..Default::default()
    }
}

/// One ShouldRateLimit of `tenant` at `hits`.
pub async fn ask(s: &Served, tenant: &str, hits: u64) -> RateLimitResponse {
    let mut envoy = s.envoy.clone();
    let request = RateLimitRequest {
        domain: DOMAIN.to_string(),
        descriptors: vec![descriptor(tenant, hits)],
        hits_addend: 0,
    };
    let answer = envoy.should_rate_limit(request).await;
    answer.expect("ShouldRateLimit answers").into_inner()
}

/// A request's start: its check of 0 hits; whether it was admitted.
pub async fn start(s: &Served, tenant: &str) -> bool {
    ask(s, tenant, 0).await.overall_code == OK
}

/// A stream's end: its charge; what the window has left, as answered.
pub async fn end(s: &Served, tenant: &str, tokens: u64) -> u32 {
    ask(s, tenant, tokens).await.statuses[0].limit_remaining
}

/// `n` requests of `tenant` started at once over `replicas` in turn: how many were
/// admitted.
pub async fn start_many(replicas: &[&Served], tenant: &str, n: usize) -> usize {
    let asks = (0..n).map(|i| start(replicas[i % replicas.len()], tenant));
    let admitted = futures_util::future::join_all(asks).await;
    admitted.into_iter().filter(|&a| a).count()
}

/// The scenario every store passes, over one or more replicas sharing it: holds keep a
/// budget from being overspent by concurrent streams, a charge settles the oldest hold
/// to its cost, and a charge with no hold is charged in full (never tokens created).
pub async fn holds_keep_the_budget(replicas: &[&Served]) {
    let a = replicas[0];
    let b = replicas[replicas.len() - 1];
    // 64 streams start at once: 10 holds of 1 000 fit the 10 000, no more.
    assert_eq!(
        start_many(replicas, "acme", 64).await,
        10,
        "10 of 64 admitted"
    );
    // A response counts its own hold: the budget is all held.
    let full = ask(a, "acme", 0).await;
    assert_eq!(
        (full.overall_code, full.statuses[0].limit_remaining),
        (OVER, 0)
    );
    // Three streams end at 600 tokens: each settles a hold (400 back each).
    for s in [a, b, a] {
        end(s, "acme", 600).await;
    }
    // 1 800 spent, 7 000 held: room for one more hold of 1 000, not two.
    assert!(start(b, "acme").await, "1 200 left: one more fits");
    assert!(!start(a, "acme").await, "200 left: no hold of 1 000 fits");
    // The other 8 streams end at 1 000: their holds become their cost exactly.
    for i in 0..7 {
        end(replicas[i % replicas.len()], "acme", 1_000).await;
    }
    assert_eq!(
        end(b, "acme", 1_000).await,
        200,
        "9 800 spent, nothing held"
    );
    // A duplicate stream end settles another stream's hold early; that stream's own end
    // then finds none and is charged in full: counted twice, never given back twice.
    assert!(start(a, "dup").await && start(b, "dup").await);
    assert_eq!(end(a, "dup", 500).await, 10_000 - 500 - 1_000);
    assert_eq!(end(b, "dup", 500).await, 10_000 - 1_000, "the duplicate");
    assert_eq!(end(a, "dup", 700).await, 10_000 - 1_700, "charged in full");
    // Another tenant's budget is its own.
    assert!(start(b, "other").await);
}
