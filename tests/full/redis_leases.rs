//! Concurrency limits on the Redis store (docs/concurrency.md, "Stores"), against real
//! redis-server and Valkey processes and a Redis Cluster: leases answer as the memory
//! store's, exactly, through a script call per decision; a key's layout in Redis; two
//! replicas sharing one server; the failure policies; Inspect and Reset; and the attacks of
//! docs/concurrency.md ("Bounds and memory").

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis_server::{RedisCluster, RedisServer};
use crate::common::{check, item, Served};
use cellrate::clock::{Clock, FakeClock, Nanos, DAY, SECOND};
use cellrate::gcra::{Decision, Limit, Mode, Window};
use cellrate::limits::config::LimitTable;
use cellrate::limits::names::BucketKey;
use cellrate::observe::metrics::Metrics;
use cellrate::proto::v1 as pb;
use cellrate::store::redis::{FailurePolicy, RedisClock, RedisSettings, RedisStore};
use cellrate::store::{MemoryStore, Outcome, Store, StoreError, StoreItem};

const T0: Nanos = 1_700_000_000 * SECOND + 123_456_789;
const HOLD: Nanos = 30 * SECOND;

fn settings(url: &str) -> RedisSettings {
    RedisSettings {
        url: Some(url.to_string()),
        timeout: Duration::from_secs(5),
        clock: RedisClock::Local,
        prefix: "l:".to_string(),
        ..RedisSettings::default()
    }
}

fn redis(settings: RedisSettings, clock: &FakeClock) -> (Arc<RedisStore>, Arc<Metrics>) {
    let metrics = Metrics::new();
    let store = RedisStore::new(settings, Arc::new(clock.clone()), metrics.clone()).unwrap();
    (store, metrics)
}

fn lease_limit(count: u64, hold: Nanos) -> Limit {
    Limit::concurrency(count, hold).unwrap()
}

fn key(id: &str) -> BucketKey {
    BucketKey::windowed(100, id, Window::Concurrency)
}

fn lease_with(id: &str, limit: Limit, mode: Mode, lease: &str) -> StoreItem {
    StoreItem {
        key: key(id),
        limit,
        cost: 1,
        mode,
        lease: mode.is_lease().then(|| Arc::from(lease)),
    }
}

fn lease(id: &str, count: u64, mode: Mode, lease: &str) -> StoreItem {
    lease_with(id, lease_limit(count, HOLD), mode, lease)
}

fn rate(id: &str, burst: u64) -> StoreItem {
    StoreItem {
        key: BucketKey::new(101, id),
        limit: Limit::new(burst, burst, SECOND).unwrap(),
        cost: 1,
        mode: Mode::CheckAndSpend,
        lease: None,
    }
}

async fn one(store: &dyn Store, item: StoreItem) -> Decision {
    store.spend(&[item]).await.unwrap().decisions[0]
}

/// Runs `batch` on both stores; they must answer alike. Returns the answer.
async fn both(memory: &MemoryStore, redis: &RedisStore, batch: &[StoreItem]) -> Outcome {
    let m = memory.spend(batch).await.unwrap();
    let r = redis.spend(batch).await.unwrap();
    assert_eq!(m, r, "memory and redis differ on {batch:?}");
    r
}

/// A scripted timeline on both stores, on one fake clock at nanoseconds that are not
/// whole microseconds: acquires, retries, releases, a full key, expiry to the nanosecond,
/// a batch mixing a lease and a rate, and 40 days of a key that is never empty (its
/// scores re-based, see batch.lua), every answer identical. Then the key as Redis holds
/// it: member the lease id as given, a base member, an expiry at the latest lease.
async fn leases_answer_as_in_memory(server: RedisServer) {
    let clock = FakeClock::new(T0);
    let memory = MemoryStore::new(Arc::new(clock.clone()));
    let (store, _) = redis(settings(&server.url()), &clock);
    let a = |id: &str| lease("t", 3, Mode::Acquire, id);
    let r = |id: &str| lease("t", 3, Mode::Release, id);
    for (i, id) in ["r0", "r1", "r2"].into_iter().enumerate() {
        let out = both(&memory, &store, &[a(id)]).await;
        assert!(out.allowed && out.decisions[0].remaining == 2 - i as i64);
        clock.advance(SECOND + 7);
    }
    let full = both(&memory, &store, &[a("r3")]).await;
    assert!(!full.allowed);
    assert_eq!(full.decisions[0].retry_in, HOLD - 3 * (SECOND + 7));
    assert!(both(&memory, &store, &[a("r1")]).await.allowed, "a retry");
    assert!(both(&memory, &store, &[r("r1")]).await.decisions[0].allowed);
    assert!(!both(&memory, &store, &[r("r1")]).await.decisions[0].allowed);
    assert!(!both(&memory, &store, &[r("never")]).await.decisions[0].allowed);
    // A lease and a rate: the rate cannot pay, nothing is acquired.
    let mut rate1 = rate("t", 1);
    rate1.cost = 2;
    let out = both(&memory, &store, &[a("r4"), rate1.clone()]).await;
    assert!(!out.allowed && out.decisions[0].remaining == 1);
    rate1.cost = 1;
    assert!(
        both(&memory, &store, &[a("r4"), rate1.clone()])
            .await
            .allowed
    );
    // The first lease expires to the nanosecond: one before, still held; at it, gone.
    clock.set(T0 + HOLD - 1);
    assert_eq!(
        both(&memory, &store, &[r("zz")]).await.decisions[0].remaining,
        0
    );
    clock.set(T0 + HOLD);
    let d = both(&memory, &store, &[r("r0")]).await.decisions[0];
    assert_eq!(
        (d.allowed, d.remaining),
        (false, 1),
        "r0 expired, not released"
    );
    // Both stores counted the same: r0, r1, r2, r4 taken (not the retry, not the denied
    // r3 and r4), r1 released, r0 found expired.
    memory.sweep();
    let events =
        [memory.lease_events(), store.lease_events()].map(|e| (e.acquired, e.released, e.expired));
    assert_eq!(events, [(4, 1, 1), (4, 1, 1)]);
    // The key as Redis holds it.
    let redis_key = store.redis_key(&key("t"));
    assert_eq!(redis_key, "l:100@lease:t");
    let members = server
        .cli(&["ZRANGE", &redis_key, "0", "-1"])
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert_eq!(members.len(), 3, "{members:?}: the base, r2 and r4");
    assert!(members.contains(&"r2".to_string()) && members.contains(&"r4".to_string()));
    let ttl: i64 = server
        .cli(&["PTTL", &redis_key])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        ttl > 0 && ttl <= HOLD / 1_000_000,
        "expires with its latest lease: {ttl}"
    );

    // 40 days, a lease every 12 hours and the one before released: the key never empties.
    let day_limit = lease_limit(2, DAY);
    let at = |id: String, mode| lease_with("busy", day_limit, mode, &id);
    for step in 0..80 {
        clock.advance(DAY / 2 + 13);
        let out = both(&memory, &store, &[at(format!("d{step}"), Mode::Acquire)]).await;
        assert!(out.allowed, "step {step}");
        if step > 0 {
            let freed = both(
                &memory,
                &store,
                &[at(format!("d{}", step - 1), Mode::Release)],
            )
            .await;
            assert!(freed.decisions[0].allowed, "step {step}");
        }
    }
    let busy = store.redis_key(&key("busy"));
    let base = server.cli(&["ZRANGE", &busy, "0", "0"]).unwrap();
    let base: i64 = base.trim().parse().unwrap();
    assert!(
        clock.now() / SECOND - base < 25 * 86_400,
        "the base moved with the clock: {base}"
    );
}

#[tokio::test]
async fn leases_on_redis_answer_as_in_memory() {
    leases_answer_as_in_memory(RedisServer::start()).await;
}

#[tokio::test]
async fn leases_on_valkey_answer_as_in_memory() {
    leases_answer_as_in_memory(RedisServer::start_valkey()).await;
}

/// An attacker's flood of acquires with fresh ids on one key is denied once the key is
/// full and pushes out no lease held; a flood over many keys holds at most `count` leases
/// a key (plus the key's base member), and each key goes with its latest lease.
#[tokio::test]
async fn a_flood_of_fresh_ids_is_bounded_per_key_and_evicts_nothing() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let (store, _) = redis(settings(&server.url()), &clock);
    assert!(
        one(&*store, lease("victim", 5, Mode::Acquire, "v1"))
            .await
            .allowed
    );
    let mut allowed = 0;
    for i in 0..1_000 {
        let item = lease("victim", 5, Mode::Acquire, &format!("x{i}"));
        allowed += usize::from(one(&*store, item).await.allowed);
    }
    assert_eq!(allowed, 4, "the key's 4 free slots, then nothing");
    let victim_key = store.redis_key(&key("victim"));
    let card = server.cli(&["ZCARD", &victim_key]).unwrap();
    assert_eq!(card.trim(), "6", "5 leases and the base member");
    let released = one(&*store, lease("victim", 5, Mode::Release, "v1")).await;
    assert!(released.allowed, "the victim's lease was not pushed out");

    // Many keys, as many fresh ids each as the attacker likes.
    for k in 0..200 {
        for i in 0..8 {
            one(
                &*store,
                lease(&format!("k{k}"), 5, Mode::Acquire, &format!("x{i}")),
            )
            .await;
        }
    }
    let keys = server.cli(&["KEYS", "l:100@lease:k*"]).unwrap();
    let keys: Vec<&str> = keys.split_whitespace().collect();
    assert_eq!(keys.len(), 200);
    for k in &keys {
        assert_eq!(server.cli(&["ZCARD", k]).unwrap().trim(), "6", "{k}");
        let ttl: i64 = server.cli(&["PTTL", k]).unwrap().trim().parse().unwrap();
        assert!(ttl > 0 && ttl <= HOLD / 1_000_000, "{k} expires: {ttl}");
    }
    let bytes = server.cli(&["MEMORY", "USAGE", keys[0]]).unwrap();
    eprintln!("a key of 5 leases takes {} bytes in Redis", bytes.trim());
}

/// A tenant id cannot pick a cluster slot or another key (`{`, `}` and `%` escaped); a
/// lease id is a member, stored as given, `{` and `%` and colons included; an id the
/// service would refuse (a space, empty, over 128 bytes) is refused by the store too,
/// before Redis, and changes nothing.
#[tokio::test]
async fn ids_are_escaped_or_refused() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let (store, _) = redis(settings(&server.url()), &clock);
    let tenant = "a{b}%7B";
    let item = lease(tenant, 2, Mode::Acquire, "{x}%20:y");
    assert!(one(&*store, item).await.allowed);
    let redis_key = store.redis_key(&key(tenant));
    assert_eq!(redis_key, "l:100@lease:a%7Bb%7D%257B");
    let members = server.cli(&["ZRANGE", &redis_key, "1", "-1"]).unwrap();
    assert_eq!(members.trim(), "{x}%20:y");
    let again = one(&*store, lease(tenant, 2, Mode::Acquire, "{x}%20:y")).await;
    assert_eq!((again.allowed, again.remaining), (true, 1), "a retry");
    let long = "x".repeat(129);
    for bad in [" 1700000000", "", "a b", "\u{7f}", long.as_str()] {
        let e = store
            .spend(&[lease("odd", 2, Mode::Acquire, bad)])
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Config(_)), "{bad:?}: {e}");
        assert!(e.to_string().contains("lease id"), "{e}");
    }
    assert_eq!(server.cli(&["DBSIZE"]).unwrap().trim(), "1");
}

/// Inspect (a probe of a lease key) reports free slots and the oldest lease's expiry
/// without taking one; Reset frees every lease of the key at once and counts the key as
/// deleted when it held a live lease.
#[tokio::test]
async fn inspect_and_reset_reach_lease_keys() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let (store, _) = redis(settings(&server.url()), &clock);
    let memory = MemoryStore::new(Arc::new(clock.clone()));
    for id in ["a", "b"] {
        both(&memory, &store, &[lease("t", 2, Mode::Acquire, id)]).await;
        clock.advance(SECOND);
    }
    let peek = both(&memory, &store, &[lease("t", 2, Mode::Probe, "")]).await;
    let d = peek.decisions[0];
    assert_eq!(
        (d.allowed, d.remaining, d.retry_in),
        (false, 0, HOLD - 2 * SECOND)
    );
    assert_eq!(store.reset(&[key("t"), key("none")]).await.unwrap(), 1);
    assert_eq!(memory.reset(&[key("t"), key("none")]).await.unwrap(), 1);
    assert_eq!(server.cli(&["DBSIZE"]).unwrap().trim(), "0");
    let d = both(&memory, &store, &[lease("t", 2, Mode::Acquire, "c")]).await;
    assert_eq!(d.decisions[0].remaining, 1, "the key starts empty");
    assert_eq!(store.reset(&[key("t")]).await.unwrap(), 1);
    assert_eq!(store.reset(&[key("t")]).await.unwrap(), 0, "nothing left");
    // A lease key Redis holds in a shape cellrate did not write is reset all the same.
    let odd = store.redis_key(&key("odd"));
    server.cli(&["ZADD", &odd, "5", "x"]).unwrap();
    let e = store.spend(&[lease("odd", 2, Mode::Acquire, "a")]).await;
    assert!(e.is_err(), "{e:?}");
    assert_eq!(store.reset(&[key("odd")]).await.unwrap(), 0);
    assert_eq!(server.cli(&["EXISTS", &odd]).unwrap().trim(), "0");
}

/// What a Redis failure does to leases (docs/concurrency.md): `allow` admits an acquire
/// without taking a lease anywhere and frees nothing on a release (`allowed = false`, not
/// a count going down), `deny` denies acquires, `local` keeps lease semantics on this
/// replica's share of the count (4 / 2 = 2), the default fails.
#[tokio::test]
async fn failure_policies_for_leases() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let make = |failure| {
        let s = RedisSettings {
            failure,
            timeout: Duration::from_millis(50),
            local_divisor: 2,
            breaker_threshold: 1_000,
            ..settings(&server.url())
        };
        redis(s, &clock).0
    };
    let (unavailable, allow, deny, local) = (
        make(FailurePolicy::Unavailable),
        make(FailurePolicy::Allow),
        make(FailurePolicy::Deny),
        make(FailurePolicy::Local),
    );
    let a = |id: &str| lease("t", 4, Mode::Acquire, id);
    let r = |id: &str| lease("t", 4, Mode::Release, id);
    assert!(one(&*allow, a("held")).await.allowed, "before the failure");
    server.kill();

    assert!(unavailable.spend(&[a("x")]).await.is_err());
    for i in 0..10 {
        let d = one(&*allow, a(&format!("x{i}"))).await;
        assert_eq!((d.allowed, d.remaining), (true, 4));
    }
    let out = allow.spend(&[r("held")]).await.unwrap();
    assert!(
        !out.decisions[0].allowed,
        "allow frees nothing it cannot see"
    );
    assert!(!one(&*deny, a("x")).await.allowed);
    let out = deny.spend(&[r("held")]).await.unwrap();
    assert!(
        out.allowed && !out.decisions[0].allowed,
        "a release is no denial"
    );
    let mut decided = Vec::new();
    for id in ["l1", "l2", "l3", "l1"] {
        decided.push(one(&*local, a(id)).await.allowed);
    }
    assert_eq!(
        decided,
        [true, true, false, true],
        "a share of 2, and a retry"
    );
    assert!(one(&*local, r("l1")).await.allowed);
    assert!(one(&*local, a("l3")).await.allowed, "the freed slot");
    assert!(
        !one(&*local, r("held")).await.allowed,
        "held on Redis, not here"
    );
    clock.advance(HOLD);
    assert_eq!(
        one(&*local, a("l4")).await.remaining,
        1,
        "local leases expire"
    );
}

/// On a Redis Cluster a request's keys fall in several slots: when a slot other than the
/// lease's denies, the lease its group took is taken back (a compensation), so the denied
/// request holds no slot; a lease the id already held (a retried acquire) is left alone.
#[tokio::test]
async fn a_cluster_takes_back_the_lease_of_a_denied_cross_slot_request() {
    let cluster = RedisCluster::start();
    let clock = FakeClock::new(T0);
    let settings = RedisSettings {
        url: None,
        cluster_nodes: cluster.urls(),
        ..settings("unused")
    };
    let (store, metrics) = redis(settings, &clock);
    let (tenant, payer) = ("tenant-a", "payer-b");
    let slot = |k: &BucketKey| cellrate::store::redis::slot(&store.redis_key(k));
    assert_ne!(slot(&key(tenant)), slot(&BucketKey::new(101, payer)));
    let a = |id: &str| lease(tenant, 2, Mode::Acquire, id);
    assert!(
        one(&*store, rate(payer, 1)).await.allowed,
        "the rate is now empty"
    );
    let out = store.spend(&[a("new"), rate(payer, 1)]).await.unwrap();
    assert!(!out.allowed);
    assert_eq!(out.decisions[0].remaining, 2, "reported as it stands");
    assert!(metrics
        .render()
        .contains("cellrate_store_compensations_total 1"));
    let peek = one(&*store, lease(tenant, 2, Mode::Probe, "")).await;
    assert_eq!(peek.remaining, 2, "the denied request holds no lease");
    assert!(one(&*store, a("held")).await.allowed);
    let out = store.spend(&[a("held"), rate(payer, 1)]).await.unwrap();
    assert!(!out.allowed);
    let released = one(&*store, lease(tenant, 2, Mode::Release, "held")).await;
    assert!(released.allowed, "a retried acquire's lease stays held");
}

/// The state machine of docs/concurrency.md on Redis: acquires (a retry is an acquire of
/// an id again), releases (a crash is one that never comes), clock advances and replica
/// switches (two stores on one server, as two cellrate processes) against a reference
/// model, per key a map of id to expiry: every answer's `allowed`, `remaining` and
/// `retry_in` as the model says.
#[test]
fn leases_on_two_replicas_agree_with_a_model() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    #[derive(Debug, Clone)]
    enum Step {
        Acquire(u8, u8),
        Release(u8, u8),
        Advance(Nanos),
        Switch,
    }
    let step = prop_oneof![
        4 => (0..3u8, 0..6u8).prop_map(|(k, id)| Step::Acquire(k, id)),
        3 => (0..3u8, 0..6u8).prop_map(|(k, id)| Step::Release(k, id)),
        1 => (0..HOLD).prop_map(Step::Advance),
        2 => Just(Step::Switch),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let replicas = [0, 1].map(|_| {
        runtime
            .block_on(async { redis(settings(&server.url()), &clock) })
            .0
    });
    let runs = std::cell::Cell::new(0u32);
    let (switches, denials) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let steps = proptest::collection::vec(step, 1..60);
    let result = runner.run(&steps, |steps| {
        runs.set(runs.get() + 1);
        clock.set(T0);
        let mut model: BTreeMap<(u8, u8), Nanos> = BTreeMap::new();
        let mut on = 0;
        for step in steps {
            let now = clock.now();
            model.retain(|_, expires| *expires > now);
            let (k, id, mode) = match step {
                Step::Advance(by) => {
                    clock.advance(by);
                    continue;
                }
                Step::Switch => {
                    on = 1 - on;
                    switches.set(switches.get() + 1);
                    continue;
                }
                Step::Acquire(k, id) => (k, id, Mode::Acquire),
                Step::Release(k, id) => (k, id, Mode::Release),
            };
            let held = model.keys().filter(|(key, _)| *key == k).count();
            let expect = match mode {
                Mode::Acquire if model.contains_key(&(k, id)) => true,
                Mode::Acquire if held < 3 => {
                    model.insert((k, id), now + HOLD);
                    true
                }
                Mode::Acquire => false,
                _ => model.remove(&(k, id)).is_some(),
            };
            let item = lease(&format!("p{}k{k}", runs.get()), 3, mode, &format!("id{id}"));
            let d = runtime.block_on(one(&*replicas[on], item));
            let live: Vec<Nanos> = model
                .iter()
                .filter(|((key, _), _)| *key == k)
                .map(|(_, &e)| e)
                .collect();
            let free = 3 - live.len() as i64;
            let retry = match free {
                0 => live.iter().min().unwrap() - now,
                _ => 0,
            };
            denials.set(denials.get() + usize::from(!d.allowed));
            prop_assert_eq!((d.allowed, d.remaining, d.retry_in), (expect, free, retry));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (switches, denials) = (switches.get(), denials.get());
    assert!(
        switches > 100 && denials > 100,
        "{switches} switches, {denials} denials"
    );
}

/// InFlight: 3 leases a tenant, held at most 30 s; Requests: 1 a second.
fn served_limits() -> LimitTable {
    let dir = crate::common::directory(&[
        (
            "names.yaml",
            "InFlight: {number: 100, format: string}\nRequests: {number: 101, format: string}\n",
        ),
        (
            "defaults.yaml",
            "InFlight: {window: concurrency, count: 3, period: 30s}\n\
             Requests: {burst: 1, count: 1, period: 1s}\n",
        ),
    ]);
    LimitTable::load_dir(dir.path()).expect("the limits load")
}

fn grpc_lease(mode: pb::Mode, id: &str) -> pb::Item {
    pb::Item {
        mode: mode as i32,
        lease_id: id.to_string(),
        ..item("InFlight", "acme", None)
    }
}

async fn grpc_one(s: &mut Served, mode: pb::Mode, id: &str) -> (bool, i64) {
    let d = check(s, vec![grpc_lease(mode, id)]).await.unwrap().items[0].clone();
    (d.allowed, d.remaining)
}

/// Two cellrate replicas on one Redis (or Valkey), over gRPC: leases taken on either count
/// on both; a retry or a release reaches the lease another replica took; a lease id with a
/// space is refused (INVALID_ARGUMENT naming the field) and changes nothing; `{`, `%` and
/// colons in a lease id are taken as given; Inspect and Reset reach the leases.
async fn replicas_share_leases(server: RedisServer) {
    use pb::Mode::{Acquire, Release};
    let mut a = Served::with_settings(served_limits(), server.settings()).await;
    let mut b = Served::with_settings(served_limits(), server.settings()).await;
    assert_eq!(grpc_one(&mut a, Acquire, "r1").await, (true, 2));
    assert_eq!(grpc_one(&mut b, Acquire, "r2").await, (true, 1));
    assert_eq!(grpc_one(&mut a, Acquire, "{r3}%:").await, (true, 0));
    assert_eq!(grpc_one(&mut b, Acquire, "r4").await, (false, 0));
    assert_eq!(grpc_one(&mut b, Acquire, "r1").await, (true, 0), "a retry");
    assert_eq!(grpc_one(&mut b, Release, "r1").await, (true, 1));
    assert_eq!(
        grpc_one(&mut a, Release, "r1").await,
        (false, 1),
        "released"
    );
    let keys = server.cli(&["DBSIZE"]).unwrap();
    for bad in ["a b", " r2", ""] {
        let e = check(&mut a, vec![grpc_lease(Acquire, bad)])
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}: {e}");
        assert!(
            e.message().starts_with("items[0].lease_id"),
            "{}",
            e.message()
        );
    }
    assert_eq!(server.cli(&["DBSIZE"]).unwrap(), keys, "nothing written");
    // A denied request takes no lease: the rate is spent first.
    let rate = || item("Requests", "acme", None);
    assert!(check(&mut a, vec![rate()]).await.unwrap().items[0].allowed);
    let out = check(&mut b, vec![grpc_lease(Acquire, "r5"), rate()])
        .await
        .unwrap();
    assert!(!out.overall.unwrap().allowed);
    let inspect = |s: &mut Served| {
        let mut admin = s.admin.clone();
        async move {
            let request = pb::InspectRequest {
                items: vec![item("InFlight", "acme", None)],
            };
            admin.inspect(request).await.unwrap().into_inner().items[0].remaining
        }
    };
    assert_eq!(inspect(&mut a).await, 1, "r5 was not taken");
    let reset = b
        .admin
        .reset(pb::ResetRequest {
            items: vec![item("InFlight", "acme", None)],
        })
        .await
        .unwrap();
    assert_eq!(reset.into_inner().deleted, 1);
    assert_eq!(inspect(&mut a).await, 3);
    assert_eq!(
        grpc_one(&mut a, Release, "r2").await,
        (false, 3),
        "reset freed it"
    );
}

#[tokio::test]
async fn replicas_on_redis_share_leases_over_grpc() {
    replicas_share_leases(RedisServer::start()).await;
}

#[tokio::test]
async fn replicas_on_valkey_share_leases_over_grpc() {
    replicas_share_leases(RedisServer::start_valkey()).await;
}

/// One script call per decision: an acquire, a release, and a request mixing a lease with
/// a rate each cost Redis one EVALSHA, and nothing else from cellrate (Redis counts the
/// commands the script runs too: they are all of the script's kinds).
#[tokio::test]
async fn one_script_call_per_decision() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let (store, _) = redis(settings(&server.url()), &clock);
    one(&*store, rate("warm", 5)).await; // loads the script
    let script_commands = [
        "mget",
        "set",
        "get",
        "del",
        "type",
        "zrange",
        "zcard",
        "zscore",
        "zadd",
        "zrem",
        "zremrangebyscore",
        "pexpire",
    ];
    let calls = || -> Vec<(String, u64)> {
        let stats = server.cli(&["INFO", "commandstats"]).unwrap();
        stats
            .lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter(|l| !l.starts_with("info") && !l.starts_with("config"))
            .map(|l| {
                let (name, rest) = l.split_once(':').unwrap();
                let calls = rest.split(',').next().unwrap().trim_start_matches("calls=");
                (name.to_string(), calls.parse().unwrap())
            })
            .collect()
    };
    let requests = [
        vec![lease("t", 2, Mode::Acquire, "a")],
        vec![lease("t", 2, Mode::Release, "a")],
        vec![lease("t", 2, Mode::Acquire, "b"), rate("t", 5)],
    ];
    for request in requests {
        server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
        assert!(store.spend(&request).await.unwrap().allowed);
        let seen = calls();
        assert!(seen.contains(&("evalsha".to_string(), 1)), "{seen:?}");
        for (name, _) in &seen {
            assert!(
                name == "evalsha" || script_commands.contains(&name.as_str()),
                "{name}: {seen:?}"
            );
        }
    }
}

/// Admin `Top` in flight on the Redis store (docs/concurrency.md, "What operators see"):
/// UNIMPLEMENTED saying why, not an empty list that would read as "nothing in flight";
/// Top of denials and Inspect still answer.
#[tokio::test]
async fn top_in_flight_on_redis_says_it_cannot_list_leases() {
    let server = RedisServer::start();
    let mut s = Served::with_settings(served_limits(), server.settings()).await;
    assert_eq!(grpc_one(&mut s, pb::Mode::Acquire, "r1").await, (true, 2));
    let request = pb::TopRequest {
        in_flight: true,
        ..Default::default()
    };
    let e = s.admin.top(request).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    assert!(
        e.message().contains("cannot list the keys holding leases"),
        "{}",
        e.message()
    );
    let denials = s.admin.top(pb::TopRequest::default()).await.unwrap();
    assert!(denials.into_inner().in_flight.is_empty());
    let request = pb::InspectRequest {
        items: vec![item("InFlight", "acme", None)],
    };
    let inspect = s.admin.inspect(request).await.unwrap().into_inner();
    assert_eq!(inspect.items[0].remaining, 2);
}

/// The lease keys of name `number` in Redis.
fn lease_keys(server: &RedisServer, number: u32) -> usize {
    server.count_keys(&format!("l:{number}@lease:*"))
}

/// Issue #58 on Redis: one caller floods acquires over fresh keys of one concurrency limit
/// name (a tenant id it chooses). Before, every acquire made a lease key in Redis (about
/// 150 bytes and more), without bound until `maxmemory`, when every tenant's writes fail.
/// Now each replica counts the lease keys it has taken leases in, per name: a name holds
/// at most its share (`--lease-name-share` of `--max-leases`; here 25 % of 400, 100 keys)
/// per replica, and an acquire beyond is denied as the memory store denies it (the same
/// answers for the same flood), never an error; acquires into counted keys, releases and
/// another name's acquires proceed; a release that empties a key frees its place; a second
/// replica adds its own share, no more.
#[tokio::test]
async fn one_callers_fresh_lease_keys_take_only_their_names_share() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let bounded = |url: &str| RedisSettings {
        max_lease_keys: 400,
        lease_name_share: 25,
        ..settings(url)
    };
    let (store, metrics) = redis(bounded(&server.url()), &clock);
    let memory = MemoryStore::new(Arc::new(clock.clone())).with_lease_bounds(400, 25);
    let named = |number: u32, key: &str, mode: Mode, id: &str| StoreItem {
        key: BucketKey::windowed(number, key, Window::Concurrency),
        ..lease(key, 5, mode, id)
    };
    one(&*store, rate("warm", 5)).await; // loads the script
    let before = server.used_memory();
    let (mut allowed, mut answers) = (0, Vec::new());
    for i in 0..2_000 {
        let item = named(100, &format!("fresh-{i}"), Mode::Acquire, &format!("x{i}"));
        let out = store
            .spend(std::slice::from_ref(&item))
            .await
            .expect("a denial, never an error");
        allowed += usize::from(out.allowed);
        answers.push((item, out));
    }
    let flooded = server.used_memory();
    let keys = lease_keys(&server, 100);
    let one_key = store.redis_key(&BucketKey::windowed(100, "fresh-0", Window::Concurrency));
    let usage = server.cli(&["MEMORY", "USAGE", &one_key]).unwrap();
    eprintln!(
        "2 000 acquires over fresh keys: {allowed} allowed, {keys} lease keys in Redis, \
         used_memory {before} -> {flooded} bytes (+{} a key), MEMORY USAGE of one: {}",
        (flooded - before) / keys.max(1) as i64,
        usage.trim()
    );
    assert_eq!(
        (allowed, keys),
        (100, 100),
        "the name's share, then denials"
    );
    for (item, out) in answers {
        let alike = memory.spend(std::slice::from_ref(&item)).await.unwrap();
        assert_eq!(alike, out, "memory and redis differ on {item:?}");
        let d = out.decisions[0];
        if !out.allowed {
            assert_eq!((d.remaining, d.retry_in), (0, HOLD), "no slot offered");
        }
    }
    assert_eq!(store.lease_events().refused, 1_900);
    assert!(metrics.render().contains("cellrate_leases_total"));
    // A refused acquire in a batch spends nothing beside it.
    let out = both(
        &memory,
        &store,
        &[named(100, "new", Mode::Acquire, "y"), rate("r", 3)],
    )
    .await;
    assert!(!out.allowed && !out.decisions[0].allowed);
    assert_eq!(
        one(&*store, rate("r", 3)).await.remaining,
        2,
        "the rate was not spent"
    );
    // Another tenant's name takes leases as before.
    for i in 0..50 {
        let item = named(102, &format!("other-{i}"), Mode::Acquire, "o");
        assert!(one(&*store, item).await.allowed, "another name's key {i}");
    }
    // A counted key takes more leases (up to its count); a retry of a lease proceeds.
    let counted = |id: &str| named(100, "fresh-7", Mode::Acquire, id);
    assert!(one(&*store, counted("second")).await.allowed);
    assert!(one(&*store, counted("x7")).await.allowed, "a retry");
    // A release that empties a key frees its place for a fresh key.
    assert!(
        one(&*store, named(100, "fresh-3", Mode::Release, "x3"))
            .await
            .allowed
    );
    assert!(
        one(&*store, named(100, "new-a", Mode::Acquire, "y"))
            .await
            .allowed
    );
    assert!(
        !one(&*store, named(100, "new-b", Mode::Acquire, "y"))
            .await
            .allowed
    );
    assert_eq!(lease_keys(&server, 100), 100);
    // Expired keys leave the count: after the hold the name takes its share again.
    clock.advance(HOLD);
    assert!(
        one(&*store, named(100, "later", Mode::Acquire, "z"))
            .await
            .allowed
    );
    // A second replica has a share of its own: Redis holds at most replicas x share.
    let (other, _) = redis(bounded(&server.url()), &clock);
    let mut taken = 0;
    for i in 0..500 {
        let item = named(100, &format!("second-{i}"), Mode::Acquire, "s");
        taken += usize::from(one(&*other, item).await.allowed);
    }
    assert_eq!(taken, 100);
}

/// Through `ShouldRateLimit` on the Redis store (Envoy's path, `failure_mode_deny: false`
/// by default): a flood of fresh tenants is OVER_LIMIT beyond its name's share, never an
/// error (which Envoy would let through), and Redis holds the share's keys, no more.
#[tokio::test]
async fn a_flood_of_fresh_tenants_on_redis_is_over_limit_beyond_its_share() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let server = RedisServer::start();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/concurrency/limits");
    let limits = LimitTable::load_dir(&dir).expect("the limits load");
    let settings = cellrate::server::Settings {
        max_leases: 200,
        lease_name_share: 25,
        ..server.settings()
    };
    let s = Served::with_settings(limits, settings).await;
    let ask = |tenant: String| {
        let mut envoy = s.envoy.clone();
        async move {
            let request = RateLimitRequest {
                domain: "inflight".to_string(),
                descriptors: vec![crate::common::descriptor(&[
                    ("tenant", &tenant),
                    ("lease", "r"),
                ])],
                hits_addend: 0,
            };
            let answer = envoy.should_rate_limit(request).await;
            answer.unwrap_or_else(|e| panic!("{tenant}: an error is a bypass: {e}"))
        }
    };
    let (mut ok, mut over) = (0, 0);
    for i in 0..300 {
        match ask(format!("fresh-{i}")).await.into_inner().overall_code {
            c if c == Code::Ok as i32 => ok += 1,
            c if c == Code::OverLimit as i32 => over += 1,
            c => panic!("code {c}"),
        }
    }
    assert_eq!((ok, over), (50, 250));
    assert_eq!(count_all_lease_keys(&server), 50);
}

/// Every lease key in Redis, whatever its name.
fn count_all_lease_keys(server: &RedisServer) -> usize {
    let out = server.cli(&["KEYS", "*@lease:*"]).unwrap();
    out.split_whitespace().count()
}

/// On a Redis Cluster, a request whose acquire is refused for its name's share of lease
/// keys, beside a rate in another slot: denied whole, the rate's spend taken back (a
/// compensation), and answered as a refusal (no slot offered, a retry after the hold).
#[tokio::test]
async fn on_a_cluster_a_refused_acquire_spends_nothing_in_other_slots() {
    let cluster = RedisCluster::start();
    let clock = FakeClock::new(T0);
    let settings = RedisSettings {
        url: None,
        cluster_nodes: cluster.urls(),
        max_lease_keys: 4,
        lease_name_share: 50,
        ..settings("unused")
    };
    let (store, _) = redis(settings, &clock);
    for i in 0..2 {
        assert!(
            one(&*store, lease(&format!("k{i}"), 2, Mode::Acquire, "a"))
                .await
                .allowed
        );
    }
    let (fresh, payer) = (key("fresh"), BucketKey::new(101, "payer"));
    let slot = |k: &BucketKey| cellrate::store::redis::slot(&store.redis_key(k));
    assert_ne!(slot(&fresh), slot(&payer));
    let out = store
        .spend(&[lease("fresh", 2, Mode::Acquire, "a"), rate("payer", 2)])
        .await
        .expect("a denial, never an error");
    assert!(!out.allowed);
    let d = out.decisions[0];
    assert_eq!((d.allowed, d.remaining, d.retry_in), (false, 0, HOLD));
    assert_eq!(
        one(&*store, rate("payer", 2)).await.remaining,
        1,
        "nothing spent"
    );
    assert!(
        one(&*store, lease("k0", 2, Mode::Acquire, "b"))
            .await
            .allowed,
        "a counted key"
    );
}
