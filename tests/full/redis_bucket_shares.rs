//! Hardening round 4 (#58) on the Redis store: a share of bucket keys per limit name.
//! Each replica counts the bucket keys it writes (`store/redis/bucket_keys.rs`, under the
//! memory store's flags `--max-buckets`, `--caller-limit-bucket-share` and
//! `--bucket-name-share`), so that a client sending ever-new ids on one per-key limit can
//! no longer make a Redis key each until `maxmemory` (when every tenant's writes fail and
//! the failure policy, UNAVAILABLE by default, lets everyone through Envoy). Against a real
//! redis-server.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis_server::RedisServer;
use crate::common::{descriptor, Served};
use cellrate::clock::{Clock, FakeClock, Nanos, DAY, SECOND};
use cellrate::gcra::{self, Limit, Mode};
use cellrate::limits::config::LimitTable;
use cellrate::limits::names::BucketKey;
use cellrate::observe::metrics::Metrics;
use cellrate::store::redis::{RedisClock, RedisSettings, RedisStore};
use cellrate::store::{MemoryStore, Outcome, Store, StoreItem};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

const T0: Nanos = 1_700_000_000 * SECOND + 123_456_789;

/// 1 000 keys a replica, 10 % of them for caller-given limits: a configured name's share
/// is 25 % of 900, 225 keys.
fn bounded(url: &str, prefix: &str) -> RedisSettings {
    RedisSettings {
        url: Some(url.to_string()),
        timeout: Duration::from_secs(5),
        clock: RedisClock::Local,
        prefix: prefix.to_string(),
        max_bucket_keys: 1_000,
        caller_bucket_share: 10,
        bucket_name_share: 25,
        ..RedisSettings::default()
    }
}

fn redis(settings: RedisSettings, clock: &FakeClock) -> Arc<RedisStore> {
    RedisStore::new(settings, Arc::new(clock.clone()), Metrics::new()).unwrap()
}

/// A spend of 1 on name `number`'s id `id`: 5 a day (a key lives 4.8 hours a spend).
fn daily(number: u32, id: &str) -> StoreItem {
    StoreItem {
        key: BucketKey::new(number, id),
        limit: Limit::new(5, 5, DAY).unwrap(),
        cost: 1,
        mode: Mode::CheckAndSpend,
        lease: None,
    }
}

async fn spend(store: &RedisStore, batch: &[StoreItem]) -> Outcome {
    store
        .spend(batch)
        .await
        .expect("a decision, never an error")
}

/// Fresh ids of name 100 through `store`; how many were allowed.
async fn flood(store: &RedisStore, from: usize, count: usize) -> usize {
    let mut allowed = 0;
    for n in from..from + count {
        let out = spend(store, &[daily(100, &format!("fresh-{n}"))]).await;
        allowed += usize::from(out.allowed);
    }
    allowed
}

/// The attack, before and after. Before (no share, as on 3ebe882: a replica bounded by
/// nothing, here the share at 100 % of a million keys), 2 000 fresh ids of one name make
/// 2 000 Redis keys. After, the replica writes its name's share (225) and denies the rest
/// exactly as the memory store with the same bounds denies them (`no_room`: nothing
/// offered), counted as `name` refusals; the flooded name's counted ids keep spending, a
/// refused id beside another limit denies the batch and spends nothing, another name
/// writes its own share, a second replica adds its share, no more, and the count frees
/// room once the keys' TATs pass.
#[tokio::test]
async fn one_callers_fresh_bucket_keys_take_only_their_names_share() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let open = redis(
        RedisSettings {
            max_bucket_keys: 1_000_000,
            bucket_name_share: 100,
            ..bounded(&server.url(), "open:")
        },
        &clock,
    );
    spend(&open, &[daily(1, "warm")]).await; // loads the script
    let before = server.used_memory();
    assert_eq!(flood(&open, 0, 2_000).await, 2_000);
    let open_keys = server.count_keys("open:100:*");
    let grown = server.used_memory() - before;
    eprintln!(
        "without the share: 2 000 fresh ids, {open_keys} Redis keys, used_memory +{grown} \
         bytes ({} a key)",
        grown / open_keys.max(1) as i64
    );
    assert_eq!(open_keys, 2_000, "the attack makes a key an id");

    let store = redis(bounded(&server.url(), "b:"), &clock);
    let memory = MemoryStore::with_caller_share(Arc::new(clock.clone()), 8, 1_000, 10)
        .with_bucket_name_share(25);
    let mut allowed = 0;
    for n in 0..2_000 {
        let batch = [daily(100, &format!("fresh-{n}"))];
        let out = spend(&store, &batch).await;
        let alike = memory.spend(&batch).await.unwrap();
        assert_eq!(out, alike, "memory and redis differ on id {n}");
        if !out.allowed {
            let none = gcra::no_room(&batch[0].limit, clock.now());
            assert_eq!(out.decisions, vec![none], "nothing offered");
        }
        allowed += usize::from(out.allowed);
    }
    assert_eq!((allowed, server.count_keys("b:100:*")), (225, 225));
    assert_eq!(store.bucket_refusals(), [0, 1_775, 0]);
    // Counted ids keep spending (and are denied by their own limit, not by room).
    let id = daily(100, "fresh-3");
    for spent in 2..=5 {
        let out = spend(&store, std::slice::from_ref(&id)).await;
        assert!(out.allowed, "spend {spent} of a counted id");
    }
    assert!(!spend(&store, &[id]).await.allowed, "its own limit");
    // A refused id beside another limit's counted id: denied whole, nothing spent.
    let rate = daily(101, "r");
    assert!(spend(&store, std::slice::from_ref(&rate)).await.allowed);
    let out = spend(&store, &[daily(100, "new"), rate.clone()]).await;
    assert!(!out.allowed);
    assert_eq!(out.decisions[1].remaining, 4, "the rate as it stands");
    let after = spend(&store, &[rate]).await;
    assert_eq!(
        after.decisions[0].remaining, 3,
        "the denied batch spent nothing"
    );
    // Another name writes its own share.
    for n in 0..225 {
        let out = spend(&store, &[daily(102, &format!("other-{n}"))]).await;
        assert!(out.allowed, "another name's new id {n}");
    }
    assert_eq!(server.count_keys("b:102:*"), 225);
    // A second replica: a share of its own, no more.
    let second = redis(bounded(&server.url(), "b:"), &clock);
    assert_eq!(flood(&second, 10_000, 500).await, 225);
    assert_eq!(server.count_keys("b:100:*"), 450, "replicas x share");
    // Once the keys' TATs pass (a spend's: 4.8 hours; the counted id's: a day), the
    // count frees room for new ids again.
    clock.advance(DAY + SECOND);
    assert_eq!(flood(&store, 20_000, 300).await, 225);
}

/// Through `ShouldRateLimit` on the Redis store (the example configuration, 1 000 keys a
/// replica): fresh `api_key` values (a per-second and a daily limit each, names 100 and
/// 101) are OVER_LIMIT once the names' shares are full, never an error (which Envoy's
/// default would let through), Redis holds the shares' keys and no more, and new client
/// addresses on the per-IP sign-up limit are still decided and allowed.
#[tokio::test]
async fn a_flood_of_fresh_api_keys_on_redis_is_over_limit_beyond_its_share() {
    let server = RedisServer::start();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let limits = LimitTable::load_dir(&config).expect("the example configuration loads");
    let settings = cellrate::server::Settings {
        max_buckets: 1_000,
        ..server.settings()
    };
    let s = Served::with_settings(limits, settings).await;
    let ask = |entries: Vec<(&'static str, String)>| {
        let mut envoy = s.envoy.clone();
        async move {
            let pairs: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let request = RateLimitRequest {
                domain: "edge".to_string(),
                descriptors: vec![descriptor(&pairs)],
                hits_addend: 0,
            };
            let answer = envoy.should_rate_limit(request).await;
            answer
                .unwrap_or_else(|e| panic!("an error is a bypass: {e}"))
                .into_inner()
                .overall_code
        }
    };
    let mut first_refused = None;
    for n in 0..400 {
        let code = ask(vec![("api_key", format!("attacker-{n}"))]).await;
        if code != Code::Ok as i32 {
            assert_eq!(code, Code::OverLimit as i32, "key {n}");
            first_refused.get_or_insert(n);
        }
    }
    assert_eq!(first_refused, Some(225));
    let keys = server.count_keys("*");
    assert!(keys <= 450, "{keys} keys: at most two names' shares");
    for n in 0..100 {
        let ip = format!("10.0.{}.{}", n / 250, n % 250);
        let signup = vec![
            ("generic_key", "signup".to_string()),
            ("remote_address", ip),
        ];
        assert_eq!(ask(signup).await, Code::Ok as i32, "new address {n}");
    }
    let existing = ask(vec![("api_key", "attacker-0".to_string())]).await;
    assert_eq!(existing, Code::Ok as i32, "a counted id keeps working");
}
