//! Hardening round 4 (#58): the memory store's bucket table has a share per limit name
//! (`--bucket-name-share`), and a spend that needs a new bucket the table has no room for
//! is denied, never an error. The attacker sends ever-new values of a header that a
//! per-key daily limit takes as its id (`api_key` -> ApiRequestsPerKeyDaily, buckets that
//! live a day). On 3ebe882 the table filled after 450 such requests (two buckets each,
//! 900 for configured limits) and every request needing a new bucket, a new client
//! address on the per-IP sign-up limit included, was UNAVAILABLE, which Envoy's default
//! (`failure_mode_deny: false`) lets through unlimited.

use std::path::Path;

use crate::common::{check, descriptor, item, Served};
use cellrate::limits::config::LimitTable;
use cellrate::server::Settings;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// The example configuration, on a store of 1 000 buckets: 900 for configured limits
/// (10 % for caller-given ones), 225 per limit name (the default 25 %).
async fn small_store() -> Served {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let limits = LimitTable::load_dir(&config).expect("the example configuration loads");
    let settings = Settings {
        max_buckets: 1_000,
        ..Settings::default()
    };
    Served::with_settings(limits, settings).await
}

/// One ShouldRateLimit in the example's `edge` domain; an error fails the test (it is
/// what Envoy's default lets through).
async fn ask(s: &mut Served, descriptor: RateLimitDescriptor) -> RateLimitResponse {
    s.envoy
        .should_rate_limit(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor],
            hits_addend: 0,
        })
        .await
        .expect("decided, not an error (an error passes Envoy unlimited)")
        .into_inner()
}

fn signup(ip: &str) -> RateLimitDescriptor {
    descriptor(&[("generic_key", "signup"), ("remote_address", ip)])
}

#[tokio::test]
async fn a_flood_of_new_ids_on_one_limit_leaves_the_others_deciding() {
    let mut s = small_store().await;
    // The flood: fresh api_keys until one is not allowed (bounded: 2 000 requests).
    let mut first_refused = None;
    for n in 0..2_000 {
        let r = ask(&mut s, descriptor(&[("api_key", &format!("attacker-{n}"))])).await;
        if r.overall_code != OK {
            assert_eq!(r.overall_code, OVER, "key {n}: {r:?}");
            first_refused = Some(n);
            break;
        }
    }
    // Each key is two buckets (per second and per day, names 100 and 101): both shares
    // of 225 are full after 225 keys, with 450 buckets of the table left.
    assert_eq!(first_refused, Some(225));
    // The flooded limit's new ids: denied, nothing offered, not an error.
    for n in 0..20 {
        let r = ask(&mut s, descriptor(&[("api_key", &format!("more-{n}"))])).await;
        assert_eq!(r.overall_code, OVER, "{r:?}");
        assert!(r.statuses.iter().all(|st| st.limit_remaining == 0), "{r:?}");
    }
    // Another limit's new ids: every one decided, and allowed.
    for n in 0..200 {
        let ip = format!("10.0.{}.{}", n / 250, n % 250);
        let r = ask(&mut s, signup(&ip)).await;
        assert_eq!(r.overall_code, OK, "{ip}: {r:?}");
    }
    // The flooded limit's existing ids keep working.
    let r = ask(&mut s, descriptor(&[("api_key", "attacker-0")])).await;
    assert_eq!(r.overall_code, OK, "{r:?}");
    // The native API answers a denial too: not allowed, nothing remaining.
    let denied = check(
        &mut s,
        vec![item("ApiRequestsPerKeyDaily", "native-new", None)],
    )
    .await
    .expect("a decision, not an error");
    let overall = denied.overall.expect("an overall decision");
    assert!(!overall.allowed && overall.remaining == 0, "{overall:?}");
    let existing = check(
        &mut s,
        vec![item("ApiRequestsPerKeyDaily", "attacker-1", None)],
    )
    .await
    .expect("a decision");
    assert!(existing.overall.expect("overall").allowed);
    s.stop().await;
}

/// envoyproxy/ratelimit's format, where every rule's buckets are number 99 in their text
/// (`99:<digest>`): each rule has a share of its own (by its label), as a name does. A
/// flood of fresh `api_key` values on one rule is denied past that rule's share (225 of
/// the 900 configured buckets), and fresh addresses on another rule are still decided and
/// allowed. Before (one number, no share for any of these rules), the flood took the
/// whole configured table, 900 buckets, and every other rule's new bucket was denied after
/// it.
#[tokio::test]
async fn in_envoyproxy_ratelimits_format_each_rule_has_its_share() {
    use cellrate::service::envoy::{EnvoyOptions, RatelimitCounting};
    let config = "
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
";
    let dir = crate::common::directory(&[("config.yaml", config)]);
    let settings = Settings {
        max_buckets: 1_000,
        envoy: EnvoyOptions {
            ratelimit_counting: RatelimitCounting::FixedWindow,
            ..EnvoyOptions::default()
        },
        ..Settings::default()
    };
    let limits = LimitTable::load_dir(dir.path()).expect("the directory loads");
    let mut s = Served::with_settings(limits, settings).await;
    let mut first_refused = None;
    for n in 0..1_000 {
        let r = ask(&mut s, descriptor(&[("api_key", &format!("attacker-{n}"))])).await;
        if r.overall_code != OK {
            assert_eq!(r.overall_code, OVER, "key {n}: {r:?}");
            first_refused.get_or_insert(n);
        }
    }
    assert_eq!(first_refused, Some(225), "the rule's share, then denials");
    for n in 0..200 {
        let ip = format!("10.1.{}.{}", n / 250, n % 250);
        let r = ask(&mut s, descriptor(&[("remote_address", &ip)])).await;
        assert_eq!(r.overall_code, OK, "{ip}: {r:?}");
    }
    let existing = ask(&mut s, descriptor(&[("api_key", "attacker-0")])).await;
    assert_eq!(existing.overall_code, OK, "a counted value keeps working");
    s.stop().await;
}
