//! The Redis store against real redis-server processes: script reloading, expiry, exact
//! values, Redis TIME, failures and recovery, a killed cluster primary, two cellrate
//! processes sharing one Redis (and one Valkey), and Sentinel with passwords.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::redis_server::{RedisCluster, RedisServer};
use crate::common::spend_item as spend;
use cellrate::clock::{CalendarPeriod, FakeClock, Nanos, SECOND};
use cellrate::gcra::{Limit, Window};
use cellrate::limits::names::BucketKey;
use cellrate::observe::metrics::Metrics;
use cellrate::store::redis::{FailurePolicy, RedisClock, RedisSettings, RedisStore, RedisTls};
use cellrate::store::{Store, StoreError, StoreItem};

const T0: Nanos = 1_700_000_000 * SECOND + 123_456_789;

fn settings(url: &str) -> RedisSettings {
    RedisSettings {
        url: Some(url.to_string()),
        timeout: Duration::from_millis(500),
        clock: RedisClock::Local,
        ..RedisSettings::default()
    }
}

fn store(settings: RedisSettings, clock: &FakeClock) -> (Arc<RedisStore>, Arc<Metrics>) {
    let metrics = Metrics::new();
    (
        RedisStore::new(settings, Arc::new(clock.clone()), metrics.clone()).unwrap(),
        metrics,
    )
}

fn per_10s() -> Limit {
    Limit::new(10, 1, 10 * SECOND).unwrap() // ei 10s, bo 100s
}

#[tokio::test]
async fn noscript_after_script_flush_is_reloaded() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let (store, _) = store(settings(&server.url()), &clock);
    assert!(
        store
            .spend(&[spend("ns", per_10s(), 1)])
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).unwrap().trim(), "OK");
    let out = store.spend(&[spend("ns", per_10s(), 1)]).await.unwrap();
    assert!(out.allowed);
    assert_eq!(out.decisions[0].remaining, 8);
}

#[tokio::test]
async fn values_are_exact_nanoseconds_and_expire_at_the_tat() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let (store, _) = store(settings(&server.url()), &clock);
    store.spend(&[spend("exact", per_10s(), 1)]).await.unwrap();
    let key = store.redis_key(&BucketKey::new(100, "exact"));
    assert_eq!(key, "cellrate:100:exact");
    // T0 has nanoseconds that a double would lose: stored to the digit.
    let stored = server.cli(&["GET", &key]).unwrap();
    assert_eq!(stored.trim(), (T0 + 10 * SECOND).to_string());
    let pttl: i64 = server.cli(&["PTTL", &key]).unwrap().trim().parse().unwrap();
    assert!(
        (9_000..=10_000).contains(&pttl),
        "PTTL {pttl} is not the 10 s until the TAT"
    );
    // A second spend moves the TAT and the expiry with it.
    store.spend(&[spend("exact", per_10s(), 2)]).await.unwrap();
    assert_eq!(
        server.cli(&["GET", &key]).unwrap().trim(),
        (T0 + 30 * SECOND).to_string()
    );
    let pttl: i64 = server.cli(&["PTTL", &key]).unwrap().trim().parse().unwrap();
    assert!((29_000..=30_000).contains(&pttl), "PTTL {pttl}");
    // A refund to full deletes the key; a denial writes nothing.
    store.refund(&[spend("exact", per_10s(), 3)]).await.unwrap();
    assert_eq!(server.cli(&["EXISTS", &key]).unwrap().trim(), "0");
    // Ids cannot pick slots: braces are escaped; tagged names put the id in a hash tag.
    let escaped = store.redis_key(&BucketKey::new(100, "{x}"));
    assert_eq!(escaped, "cellrate:100:%7Bx%7D");
    let tagged = RedisSettings {
        tag_by_id: None,
        ..settings(&server.url())
    };
    let (tagged, _) = self::store(tagged, &clock);
    assert_eq!(
        tagged.redis_key(&BucketKey::new(3, "42")),
        "cellrate:3:{42}"
    );
    // A calendar limit's bucket names its window after the number, beside the id's tag:
    // another key than the same id's GCRA bucket, in the same slot.
    let monthly = Window::Calendar(CalendarPeriod::Month);
    assert_eq!(
        tagged.redis_key(&BucketKey::windowed(3, "42", monthly)),
        "cellrate:3@1mo:{42}"
    );
    assert_eq!(
        store.redis_key(&BucketKey::windowed(100, "{x}", monthly)),
        "cellrate:100@1mo:%7Bx%7D"
    );
}

#[tokio::test]
async fn redis_time_decides_by_default() {
    let server = RedisServer::start();
    // The local clock is far in the past: with Redis TIME it must not matter.
    let clock = FakeClock::new(1);
    let settings = RedisSettings {
        clock: RedisClock::Redis,
        ..settings(&server.url())
    };
    let (store, _) = store(settings, &clock);
    let limit = Limit::new(3, 3, 3_600 * SECOND).unwrap();
    for left in [2, 1, 0] {
        let out = store.spend(&[spend("time", limit, 1)]).await.unwrap();
        assert_eq!((out.allowed, out.decisions[0].remaining), (true, left));
    }
    let out = store.spend(&[spend("time", limit, 1)]).await.unwrap();
    assert!(!out.allowed);
    // The stored TAT is about now (Redis's clock) plus three tokens of 20 minutes.
    let stored: i64 = server
        .cli(&["GET", "cellrate:100:time"])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let wall = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .unwrap()
        .as_nanos() as i64;
    assert!(
        (stored - wall - 3_600 * SECOND).abs() < 60 * SECOND,
        "TAT {stored} vs wall {wall}"
    );
    // The one difference from the memory store: Redis TIME has microsecond resolution, so
    // `now` (and a TAT made of now plus whole emission intervals) is a multiple of 1000 ns.
    assert_eq!(stored % 1_000, 0, "now was not Redis TIME's microseconds");
}

/// #51: a zoned window is decided on Redis's clock too. cellrate places four boundaries
/// around its own clock (here a day behind) from the zone database; the script decides in
/// the window among them that holds Redis TIME, and refuses when none does.
#[tokio::test]
async fn a_zoned_window_is_decided_on_redis_time() {
    let server = RedisServer::start();
    let wall = || {
        std::time::SystemTime::UNIX_EPOCH
            .elapsed()
            .unwrap()
            .as_nanos() as i64
    };
    let day = CalendarPeriod::parse("1d@Pacific/Kiritimati").unwrap();
    let clock = FakeClock::new(wall() - 86_400 * SECOND);
    let settings = RedisSettings {
        clock: RedisClock::Redis,
        ..settings(&server.url())
    };
    let (store, _) = store(settings, &clock);
    let limit = Limit::calendar(5, day).unwrap();
    let item = StoreItem {
        key: BucketKey::windowed(100, "kiri", limit.window()),
        ..spend("kiri", limit, 2)
    };
    let before = day.window_end(wall());
    let out = store.spend(std::slice::from_ref(&item)).await.unwrap();
    let after = day.window_end(wall());
    assert_eq!(out.decisions[0].remaining, 3);
    let key = store.redis_key(&item.key);
    assert!(key.contains("@1d@Pacific/Kiritimati:"), "{key}");
    let stored: i64 = server.cli(&["GET", &key]).unwrap().trim().parse().unwrap();
    // Redis's window (which ends at a Kiritimati midnight, 10:00Z), not cellrate's a day
    // earlier: W + used.
    assert!(
        stored == before + 2 || stored == after + 2,
        "stored {stored}, Redis's window ends {before}"
    );
    assert_eq!(before.rem_euclid(86_400 * SECOND), 10 * 3_600 * SECOND);
    let reset = out.decisions[0].reset_in;
    assert!(reset > 0 && reset <= 86_400 * SECOND, "{reset}");
    // cellrate's clock three days away: no window of its four holds Redis's now.
    clock.set(wall() - 3 * 86_400 * SECOND);
    let refused = store.spend(std::slice::from_ref(&item)).await;
    assert!(refused.is_err(), "{refused:?}");
    let kept: i64 = server.cli(&["GET", &key]).unwrap().trim().parse().unwrap();
    assert_eq!(kept, stored, "a refused call writes nothing");
}

#[tokio::test]
async fn failure_policies_deadline_and_recovery() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let make = |policy| {
        let s = RedisSettings {
            failure: policy,
            timeout: Duration::from_millis(50),
            local_divisor: 2,
            breaker_threshold: 1_000,
            ..settings(&server.url())
        };
        store(s, &clock)
    };
    let (unavailable, _) = make(FailurePolicy::Unavailable);
    let (allow, metrics) = make(FailurePolicy::Allow);
    let (deny, _) = make(FailurePolicy::Deny);
    let (local, _) = make(FailurePolicy::Local);
    let limit = Limit::new(4, 4, SECOND).unwrap();
    for s in [&unavailable, &allow, &deny, &local] {
        assert!(
            s.spend(&[spend("f", limit, 1)]).await.unwrap().allowed,
            "before the failure"
        );
    }
    server.kill();

    let started = Instant::now();
    let e = unavailable
        .spend(&[spend("f", limit, 1)])
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Timeout { .. } | StoreError::Backend { .. } | StoreError::CircuitOpen
        ),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no answer within the deadline: {:?}",
        started.elapsed()
    );
    assert!(allow.spend(&[spend("f", limit, 1)]).await.unwrap().allowed);
    assert!(metrics
        .render()
        .contains("cellrate_store_fallbacks_total{policy=\"allow\"} 1"));
    assert!(!deny.spend(&[spend("f", limit, 1)]).await.unwrap().allowed);
    // Local: this replica's share, 4 / 2 = 2 tokens.
    let decided: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(local.spend(&[spend("f", limit, 1)]).await.unwrap().allowed);
        }
        v
    };
    assert_eq!(decided, vec![true, true, false]);
    // A cost the share cannot cover is denied, not cut to the share (each of the two
    // replicas admitted 3 tokens of a 4-token limit before: 6).
    let big = local.spend(&[spend("big", limit, 3)]).await.unwrap();
    assert!(!big.allowed, "a cost of 3 passed a local share of 2");
    // A calendar limit stays a calendar limit: 4 a day shares 2 a day, and a denial waits
    // for the day's end, not for a refill (GCRA's half day).
    let daily = Limit::calendar(4, CalendarPeriod::Day).unwrap();
    let day_key = |id: &str| StoreItem {
        key: BucketKey::windowed(100, id, daily.window()),
        ..spend(id, daily, 1)
    };
    for _ in 0..2 {
        assert!(local.spend(&[day_key("d")]).await.unwrap().allowed);
    }
    let denied = local.spend(&[day_key("d")]).await.unwrap();
    assert!(!denied.allowed);
    let day_end = CalendarPeriod::Day.window_end(T0);
    assert_eq!(denied.decisions[0].retry_in, day_end - T0);
    clock.set(day_end);
    assert!(
        local.spend(&[day_key("d")]).await.unwrap().allowed,
        "the local share of a calendar limit resets at the window's end"
    );
    clock.set(T0);

    // Redis comes back (empty): the same store recovers without a restart.
    server.restart();
    let mut recovered = false;
    for _ in 0..100 {
        if let Ok(out) = unavailable.spend(&[spend("back", limit, 1)]).await {
            assert_eq!(out.decisions[0].remaining, 3);
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        recovered,
        "the store did not recover within 5 s of Redis restarting"
    );
}

#[tokio::test]
async fn a_poisoned_bucket_fails_alone_and_never_opens_the_breaker() {
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let s = RedisSettings {
        breaker_threshold: 2,
        breaker_cooldown: Duration::from_secs(60),
        failure: FailurePolicy::Allow,
        ..settings(&server.url())
    };
    let (store, metrics) = store(s, &clock);
    // A TAT above the int64 range, as an unbounded limit once made the script store.
    let key = store.redis_key(&BucketKey::new(100, "poisoned"));
    server
        .cli(&["SET", &key, "9300000000000000000000"])
        .unwrap();
    for _ in 0..10 {
        let e = store
            .spend(&[spend("poisoned", per_10s(), 1)])
            .await
            .expect_err("a poisoned bucket cannot be decided");
        assert!(
            matches!(&e, StoreError::Data(m) if m.contains("no TAT")),
            "{e}"
        );
        // Redis answers fine, so the breaker stays closed for everyone else.
        let ok = store.spend(&[spend("healthy", per_10s(), 1)]).await;
        assert!(ok.is_ok(), "{ok:?}");
    }
    let text = metrics.render();
    assert!(
        !text.contains("cellrate_store_breaker_rejections_total 1"),
        "{text}"
    );
    // The fail-open policy did not turn the data error into an allow.
    for policy in ["allow", "deny", "local"] {
        let series = format!("cellrate_store_fallbacks_total{{policy=\"{policy}\"}}");
        assert_eq!(crate::common::sample(&text, &series), Some(0.0), "{text}");
    }
    // A reset clears it.
    assert_eq!(
        store
            .reset(&[BucketKey::new(100, "poisoned")])
            .await
            .unwrap(),
        1
    );
    assert!(
        store
            .spend(&[spend("poisoned", per_10s(), 1)])
            .await
            .unwrap()
            .allowed
    );
}

#[tokio::test]
async fn a_half_open_breaker_lets_one_trial_through() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new(T0);
    // An hour: the test skips it on the fake clock (a real wait would never end).
    let cooldown = 3_600 * SECOND;
    let s = RedisSettings {
        breaker_threshold: 2,
        breaker_cooldown: Duration::from_nanos(cooldown as u64),
        timeout: Duration::from_millis(100),
        ..settings(&server.url())
    };
    let (store, metrics) = store(s, &clock);
    let store = Arc::new(store);
    assert!(store.spend(&[spend("h", per_10s(), 1)]).await.is_ok());
    server.kill();
    for _ in 0..2 {
        assert!(store.spend(&[spend("h", per_10s(), 1)]).await.is_err());
    }
    let rejections =
        |text: &str| crate::common::sample(text, "cellrate_store_breaker_rejections_total");
    assert_eq!(rejections(&metrics.render()), Some(0.0), "open only now");
    // Not before the cool-down: the next call fails fast.
    assert!(store.spend(&[spend("h", per_10s(), 1)]).await.is_err());
    assert_eq!(rejections(&metrics.render()), Some(1.0), "still open");
    // After the cool-down (skipped on the store's clock, not waited for), ten concurrent
    // calls: one trial reaches Redis, nine fail fast.
    clock.advance(cooldown);
    let calls = (0..10).map(|_| {
        let store = store.clone();
        async move { store.spend(&[spend("h", per_10s(), 1)]).await }
    });
    let results = futures_util::future::join_all(calls).await;
    assert!(results.iter().all(Result::is_err));
    assert_eq!(
        rejections(&metrics.render()),
        Some(10.0),
        "exactly one trial"
    );
    // The trial failed: open again at once.
    assert!(store.spend(&[spend("h", per_10s(), 1)]).await.is_err());
    assert_eq!(rejections(&metrics.render()), Some(11.0));
    // Redis back: after the cool-down the trial succeeds and closes the breaker.
    server.restart();
    // A trial every cool-down (skipped) until one closes it; the real waits between them
    // are for redis-rs to reconnect to the restarted server (its backoff, not our timer).
    let mut closed = false;
    for _ in 0..100 {
        clock.advance(cooldown);
        if store.spend(&[spend("h2", per_10s(), 1)]).await.is_ok() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(closed, "the breaker never closed after Redis came back");
    for _ in 0..5 {
        assert!(store.spend(&[spend("h2", per_10s(), 1)]).await.is_ok());
    }
}

#[tokio::test]
async fn an_open_breaker_fails_fast() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let s = RedisSettings {
        breaker_threshold: 2,
        breaker_cooldown: Duration::from_secs(60),
        timeout: Duration::from_millis(50),
        ..settings(&server.url())
    };
    let (store, metrics) = store(s, &clock);
    server.kill();
    for _ in 0..5 {
        assert!(store.spend(&[spend("b", per_10s(), 1)]).await.is_err());
    }
    let text = metrics.render();
    assert!(
        text.contains("cellrate_store_breaker_rejections_total 3"),
        "{text}"
    );
}

#[tokio::test]
async fn healthy_cluster_slots_keep_working_when_a_primary_dies() {
    let mut cluster = RedisCluster::start();
    let clock = FakeClock::new(T0);
    let s = RedisSettings {
        url: None,
        cluster_nodes: cluster.urls(),
        breaker_threshold: 1_000,
        ..settings("unused")
    };
    let (store, _) = store(s, &clock);
    // One id per node.
    let mut by_node: Vec<Option<String>> = vec![None; 3];
    for i in 0..200 {
        let id = format!("node-{i}");
        let slot = cellrate::store::redis::slot(&store.redis_key(&BucketKey::new(100, &id)));
        let node = cluster.node_of_slot(slot);
        by_node[node].get_or_insert(id);
    }
    let ids: Vec<String> = by_node
        .into_iter()
        .map(|id| id.expect("an id for every node"))
        .collect();
    for id in &ids {
        assert!(
            store
                .spend(&[spend(id, per_10s(), 1)])
                .await
                .unwrap()
                .allowed
        );
    }
    cluster.nodes[0].kill();
    assert!(
        store.spend(&[spend(&ids[0], per_10s(), 1)]).await.is_err(),
        "the dead node's slots answered"
    );
    for id in &ids[1..] {
        let mut ok = false;
        for _ in 0..50 {
            if let Ok(out) = store.spend(&[spend(id, per_10s(), 1)]).await {
                assert!(out.allowed);
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(ok, "slots of a healthy node stopped working");
    }
    // Readiness follows Redis as a whole, not whichever slot answered last.
    let healthy = store.healthy();
    assert!(store.spend(&[spend(&ids[0], per_10s(), 1)]).await.is_err());
    assert!(
        healthy.load(std::sync::atomic::Ordering::Relaxed),
        "one dead primary made the store unready"
    );
    // A refund across slots runs on each; the error says what was applied.
    let e = store
        .refund(&[spend(&ids[0], per_10s(), 1), spend(&ids[1], per_10s(), 1)])
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "refund applied to 100:{}; not to 100:{}",
            ids[1], ids[0]
        )),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cellrate_processes_sharing_redis_admit_no_more_than_one() {
    two_processes_sharing(RedisServer::start()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cellrate_processes_sharing_valkey_admit_no_more_than_one() {
    two_processes_sharing(RedisServer::start_valkey()).await;
}

/// Two cellrate processes on one server admit exactly the limit between them, and Envoy
/// gets UNAVAILABLE once the server is gone.
async fn two_processes_sharing(server: RedisServer) {
    use cellrate::proto::v1 as pb;
    let dir = tempfile::tempdir().unwrap();
    // 50 per hour: nothing comes back during the test.
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "NewOrdersPerAccount: {burst: 50, count: 50, period: 1h}\n",
    )
    .unwrap();
    let url = server.url();
    let flags = [
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "1000",
    ];
    let a = crate::common::serve_with(dir.path(), &flags);
    let b = crate::common::serve_with(dir.path(), &flags);
    let hammer = |addr: String| async move {
        let mut client =
            pb::rate_limiter_client::RateLimiterClient::connect(format!("http://{addr}"))
                .await
                .unwrap();
        let mut allowed = 0;
        for _ in 0..60 {
            let r = client
                .check(pb::CheckRequest {
                    items: vec![crate::common::item("NewOrdersPerAccount", "777", None)],
                    ..Default::default()
                })
                .await
                .unwrap();
            if r.into_inner().overall.unwrap().allowed {
                allowed += 1;
            }
        }
        allowed
    };
    let (x, y) = tokio::join!(
        tokio::spawn(hammer(a.listen.clone())),
        tokio::spawn(hammer(b.listen.clone()))
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x + y, 50, "two replicas admitted {x} + {y}");
    assert!(x > 0 && y > 0, "both replicas decided: {x} and {y}");
    // With Redis gone, Envoy gets UNAVAILABLE (its failure_mode_deny decides).
    drop(server);
    let mut envoy = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://{}", a.listen),
    )
    .await
    .unwrap();
    let request = crate::common::envoy_request("edge", &[&[("NewOrdersPerAccount", "778")]]);
    let e = envoy.should_rate_limit(request).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
}

#[tokio::test]
async fn the_deny_cache_answers_repeat_denials_without_redis() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let s = RedisSettings {
        deny_cache: 100,
        timeout: Duration::from_millis(200),
        ..settings(&server.url())
    };
    let (store, metrics) = store(s, &clock);
    let one = Limit::new(1, 1, 10 * SECOND).unwrap();
    assert!(store.spend(&[spend("dc", one, 1)]).await.unwrap().allowed);
    let denied = store.spend(&[spend("dc", one, 1)]).await.unwrap();
    assert!(!denied.allowed);
    // Redis is gone, yet the repeat is denied: the cache answered, with Redis's numbers.
    server.kill();
    let cached = store.spend(&[spend("dc", one, 1)]).await.unwrap();
    assert_eq!(cached.decisions, denied.decisions);
    assert!(metrics
        .render()
        .contains("cellrate_store_deny_cache_hits_total 1"));
    // Once the denial is no longer provable, the request goes to Redis again.
    server.restart();
    clock.advance(10 * SECOND);
    // The first call after the restart may meet the dead connection; it reconnects.
    let mut answer = None;
    for _ in 0..50 {
        if let Ok(out) = store.spend(&[spend("dc", one, 1)]).await {
            answer = Some(out.allowed);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(answer, Some(true), "Redis was asked again and allowed");
    assert!(!store.spend(&[spend("dc", one, 1)]).await.unwrap().allowed);
    // A refund through this replica clears the entry: the next request asks Redis.
    store.refund(&[spend("dc", one, 1)]).await.unwrap();
    assert!(store.spend(&[spend("dc", one, 1)]).await.unwrap().allowed);
    assert!(metrics
        .render()
        .contains("cellrate_store_deny_cache_hits_total 1"));
}

/// Sentinels and a master that ask for passwords: the sentinels' password (a flag, or in a
/// sentinel's URL) and the master's login (`--redis-url`'s user and password) are each
/// used where they belong, and a wrong or missing one gets no decision.
#[tokio::test]
async fn sentinel_with_passwords_logs_in_to_sentinels_and_master() {
    use crate::common::redis_server::{RedisSentinels, SENTINEL_MASTER};
    use cellrate::store::redis::SentinelSettings;
    let set = RedisSentinels::start_with(Some(("data-pw", "sentinel-pw")));
    let clock = FakeClock::new(T0);
    let make = |nodes: Vec<String>, sentinel_pw: Option<&str>, master_url: Option<&str>| {
        let s = RedisSettings {
            url: master_url.map(str::to_string),
            sentinel: Some(SentinelSettings {
                nodes,
                master: SENTINEL_MASTER.to_string(),
                password: sentinel_pw.map(str::to_string),
                tls: false,
            }),
            timeout: Duration::from_millis(300),
            clock: RedisClock::Local,
            ..RedisSettings::default()
        };
        store(s, &clock).0
    };
    let limit = per_10s();
    let good = make(
        set.addresses(),
        Some("sentinel-pw"),
        Some("redis://:data-pw@master"),
    );
    let out = good.spend(&[spend("pw", limit, 1)]).await.unwrap();
    assert_eq!(out.decisions[0].remaining, 9);
    // The password in each sentinel's URL instead of the flag.
    let in_urls: Vec<String> = set
        .addresses()
        .iter()
        .map(|a| format!("redis://:sentinel-pw@{a}"))
        .collect();
    let by_url = make(in_urls, None, Some("redis://:data-pw@master"));
    let out = by_url.spend(&[spend("pw", limit, 1)]).await.unwrap();
    assert_eq!(
        out.decisions[0].remaining, 8,
        "the same bucket, on the master"
    );

    let wrong = [
        (
            "no sentinel password",
            make(set.addresses(), None, Some("redis://:data-pw@master")),
        ),
        (
            "a wrong sentinel password",
            make(
                set.addresses(),
                Some("guess"),
                Some("redis://:data-pw@master"),
            ),
        ),
        (
            "no master login",
            make(set.addresses(), Some("sentinel-pw"), None),
        ),
        (
            "a wrong master password",
            make(
                set.addresses(),
                Some("sentinel-pw"),
                Some("redis://:guess@master"),
            ),
        ),
    ];
    for (what, store) in wrong {
        for _ in 0..3 {
            let e = store.spend(&[spend("pw", limit, 1)]).await;
            assert!(e.is_err(), "{what}: decided {:?}", e.map(|o| o.allowed));
            tokio::time::sleep(Duration::from_millis(120)).await;
        }
    }
    // Nothing the refused stores tried was spent.
    let out = good.spend(&[spend("pw", limit, 1)]).await.unwrap();
    assert_eq!(out.decisions[0].remaining, 7);
}

/// rediss:// to a server with a private CA that asks clients for certificates: decisions
/// go through with the CA and the client pair (`--redis-tls-ca`, `--redis-tls-client-*`).
/// Without the CA, the server's certificate is not trusted (the Mozilla roots do not know
/// it); without the client pair, the server refuses the connection. Neither spends.
#[tokio::test]
async fn tls_with_a_private_ca_and_a_client_certificate() {
    let pki = crate::common::pki::Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.write(dir.path());
    let (server, tls_port) = RedisServer::start_tls(dir.path());
    let clock = FakeClock::new(T0);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let ca = Some(pki.ca.clone().into_bytes());
    let client = Some((
        pki.client_cert.clone().into_bytes(),
        pki.client_key.clone().into_bytes(),
    ));
    let over_tls = |tls: RedisTls| {
        store(
            RedisSettings {
                tls,
                ..settings(&url)
            },
            &clock,
        )
        .0
    };
    let keys = || server.cli(&["DBSIZE"]).unwrap().trim().to_string();

    let refused = [
        (
            "no CA",
            RedisTls {
                ca: None,
                client: client.clone(),
            },
        ),
        (
            "no client certificate",
            RedisTls {
                ca: ca.clone(),
                client: None,
            },
        ),
    ];
    for (what, tls) in refused {
        let result = over_tls(tls).spend(&[spend("tls", per_10s(), 1)]).await;
        eprintln!("{what}: {result:?}");
        assert!(
            matches!(
                result,
                Err(StoreError::Backend { .. } | StoreError::Timeout { .. })
            ),
            "{what}: {result:?}"
        );
        assert_eq!(keys(), "0", "{what}: something was written");
    }

    let good = over_tls(RedisTls { ca, client });
    for expected in [true, true, false] {
        let outcome = good
            .spend(&[spend("tls", Limit::new(2, 1, 10 * SECOND).unwrap(), 1)])
            .await
            .expect("decided over TLS");
        assert_eq!(outcome.allowed, expected);
    }
    assert_eq!(keys(), "1");
}
