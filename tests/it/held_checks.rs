//! The check-0, charge-later pattern held (`--zero-check-holds`, docs/token-budgets.md) on
//! the memory store, through a real gRPC client on loopback: what Envoy Gateway's and
//! Envoy AI Gateway's token limits send (0 hits when a request starts, the usage when its
//! stream ends, on one descriptor) overspends a budget under envoyproxy/ratelimit's rule
//! and is held to it here. Redis, Redis Cluster and Valkey: `tests/full/held_checks_redis.rs`.

use std::time::Duration;

use crate::common::held::{
    ask, end, held, holds_keep_the_budget, limits, limits_held_by_file, start_many, OVER,
};
use crate::common::{harness_settings, http_get_async, Served};
use cellrate::server::Settings;
use cellrate::service::envoy::Estimate;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;

const HOUR: Duration = Duration::from_secs(3_600);

fn fixed() -> Settings {
    held(
        harness_settings(),
        Estimate::Fixed(1_000),
        Duration::from_secs(600),
    )
}

#[tokio::test]
async fn holds_keep_concurrent_streams_within_the_budget() {
    let s = Served::with_settings(limits(), fixed()).await;
    holds_keep_the_budget(&[&s]).await;
    s.stop().await;
}

/// The same, on a limit of cellrate's own files whose reservation policy says
/// `zero_checks: 1000` (no flag).
#[tokio::test]
async fn a_reservation_policy_holds_checks_of_zero() {
    let s = Served::with_settings(limits_held_by_file(), harness_settings()).await;
    holds_keep_the_budget(&[&s]).await;
    s.stop().await;
}

/// The comparison: without holds, as envoyproxy/ratelimit answers, every stream of the 64
/// is admitted (0 fits), and 64 000 tokens are charged against 10 000.
#[tokio::test]
async fn without_holds_every_check_of_zero_passes() {
    let s = Served::with_settings(limits(), harness_settings()).await;
    assert_eq!(start_many(&[&s], "acme", 64).await, 64);
    for _ in 0..64 {
        end(&s, "acme", 1_000).await;
    }
    assert_eq!(ask(&s, "acme", 0).await.overall_code, OVER);
    s.stop().await;
}

/// Envoy killed: no stream end ever comes. Each hold ends at its due and its estimate
/// comes back (the sweeper's release), so the budget is not lost for the hour.
#[tokio::test]
async fn holds_no_charge_settles_are_released_at_their_due() {
    let settings = Settings {
        sweep_interval: Duration::from_millis(20),
        ..fixed()
    };
    let s = Served::with_settings(limits(), settings).await;
    assert_eq!(start_many(&[&s], "acme", 20).await, 10);
    s.clock.advance(Duration::from_secs(601).as_nanos() as i64);
    let released = async {
        for _ in 0..500 {
            let metrics = http_get_async(s.metrics_addr, "/metrics").await.1;
            if metrics.contains("cellrate_holds_total{event=\"released\"} 10") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    };
    assert!(released.await, "the 10 holds released within 10 s");
    assert_eq!(
        start_many(&[&s], "acme", 20).await,
        10,
        "the budget is back"
    );
    assert!(HOUR.as_secs() > 601, "within the same window");
    s.stop().await;
}

/// A learned estimate: the largest of the bucket's recent charges; before any, a
/// sixteenth of the limit.
#[tokio::test]
async fn a_learned_estimate_follows_the_charges() {
    let settings = held(
        harness_settings(),
        Estimate::Learned,
        Duration::from_secs(600),
    );
    let s = Served::with_settings(limits(), settings).await;
    let first = ask(&s, "acme", 0).await.statuses[0].limit_remaining;
    assert_eq!(first, 10_000 - 625, "a sixteenth of 10 000 held");
    end(&s, "acme", 2_000).await;
    // 2 000 spent; the next check holds 2 000, the largest charge seen.
    assert_eq!(
        ask(&s, "acme", 0).await.statuses[0].limit_remaining,
        10_000 - 2_000 - 2_000
    );
    // The attacker: tiny charges cannot make the estimate tiny (and so let more streams
    // start than a sixteenth of the budget allows).
    for _ in 0..8 {
        end(&s, "tiny", 1).await;
    }
    assert_eq!(
        ask(&s, "tiny", 0).await.statuses[0].limit_remaining,
        10_000 - 8 - 625
    );
    s.stop().await;
}

/// Hits given back (`is_negative_hits`, Envoy 1.38+) on a held limit are a refund, as
/// without holds, never a charge; and a descriptor with a limit of its own on a held
/// named limit is decided as without holds, never an error (Envoy would let it through).
#[tokio::test]
async fn what_holds_do_not_apply_to_is_decided_as_without_them() {
    use crate::common::held::{descriptor, limits_held_by_file, DOMAIN, OK};
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let s = Served::with_settings(limits(), fixed()).await;
    assert_eq!(
        end(&s, "neg", 3_000).await,
        7_000,
        "no hold: charged in full"
    );
    let mut envoy = s.envoy.clone();
    let give_back = RateLimitRequest {
        domain: DOMAIN.to_string(),
        descriptors: vec![RateLimitDescriptor {
            is_negative_hits: true,
            ..descriptor("neg", 1_000)
        }],
        hits_addend: 0,
    };
    let answer = envoy
        .should_rate_limit(give_back)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, OK);
    assert_eq!(
        end(&s, "neg", 1).await,
        10_000 - 2_000 - 1,
        "1 000 given back"
    );
    s.stop().await;

    let s = Served::with_settings(limits_held_by_file(), harness_settings()).await;
    let mut envoy = s.envoy.clone();
    let own_limit = RateLimitRequest {
        domain: DOMAIN.to_string(),
        descriptors: vec![RateLimitDescriptor {
            limit: Some(RateLimitOverride {
                requests_per_unit: 50,
                unit: 3, // HOUR
            }),
            ..descriptor("own", 0)
        }],
        hits_addend: 0,
    };
    let answer = envoy.should_rate_limit(own_limit).await;
    assert_eq!(
        answer
            .expect("decided, not an error")
            .into_inner()
            .overall_code,
        OK
    );
    s.stop().await;
}

/// The attacker: one tenant opening streams without end cannot take more than its
/// bucket's share of the holds (`--settle-max-holds-per-key`): its further checks are
/// denied, and another tenant's are admitted.
#[tokio::test]
async fn one_bucket_holds_at_most_its_share() {
    let settings = Settings {
        settle_max_holds_per_key: 3,
        ..held(
            harness_settings(),
            Estimate::Fixed(10),
            Duration::from_secs(600),
        )
    };
    let s = Served::with_settings(limits(), settings).await;
    assert_eq!(start_many(&[&s], "mallory", 50).await, 3);
    assert_eq!(start_many(&[&s], "alice", 3).await, 3);
    let metrics = http_get_async(s.metrics_addr, "/metrics").await.1;
    assert!(
        metrics.contains("cellrate_anonymous_holds_total{event=\"refused\"} 47"),
        "{metrics}"
    );
    s.stop().await;
}

/// Run as `ratelimit` (Envoy Gateway's deployment, its configuration unchanged), one more
/// variable holds the check-0 pattern: 12 checks of 0 on a 10 000-token budget, 10 held
/// of 1 000 and 2 denied; without it, all 12 pass, as envoyproxy/ratelimit answers.
#[tokio::test]
async fn run_as_ratelimit_one_variable_holds_checks_of_zero() {
    use crate::common::held::{descriptor, DOMAIN, OK};
    use crate::common::ratelimit_answers::{client, runtime, start, unix_seconds};
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let file = format!(
        "domain: {DOMAIN}\ndescriptors:\n  - key: tenant\n    rate_limit: {{unit: hour, \
         requests_per_unit: 10000}}\n"
    );
    let root = runtime(&[("ai.yaml", &file)]);
    // Clear of an hour's end: the window must not turn within the test.
    let left = 3_600 - unix_seconds() % 3_600;
    if left < 10 {
        tokio::time::sleep(Duration::from_secs(left as u64 + 1)).await;
    }
    for (held, admitted) in [(true, 10), (false, 12)] {
        let mut vars = vec![("BACKEND_TYPE", "memory")];
        if held {
            vars.push(("CELLRATE_ZERO_CHECK_HOLDS", "ai=1000"));
        }
        let (_child, listen) = start(root.path(), &vars);
        let mut c = client(&listen).await;
        let mut ok = 0;
        for _ in 0..12 {
            let request = RateLimitRequest {
                domain: DOMAIN.to_string(),
                descriptors: vec![descriptor("acme", 0)],
                hits_addend: 0,
            };
            let answer = c.should_rate_limit(request).await.unwrap().into_inner();
            ok += usize::from(answer.overall_code == OK);
        }
        assert_eq!(ok, admitted, "held: {held}");
    }
}
