//! Faults under load (bounded, loopback only): the limits directory replaced by garbage and
//! then by a good config while requests flow; SIGTERM while requests flow; Redis killed
//! and restarted while requests flow.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{item, sample, Served};
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use tonic::Code;

/// Counts of what a load task saw.
#[derive(Default)]
struct Seen {
    ok: AtomicU64,
    unavailable: AtomicU64,
    other: AtomicU64,
}

/// Waits (at most 10 s) until the load has had `n` answers of `kind`, so that what follows
/// happens under load however slow the machine; returns the count.
async fn answered(seen: &Seen, n: u64, kind: fn(&Seen) -> &AtomicU64) -> u64 {
    crate::common::poll_until(
        Duration::from_secs(10),
        async || kind(seen).load(Ordering::Relaxed),
        |&count| count >= n,
    )
    .await
}

/// Sends Check requests on `client` until `stop`, at most `limit` of them.
async fn hammer(
    mut client: pb::rate_limiter_client::RateLimiterClient<tonic::transport::Channel>,
    name: &'static str,
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
    limit: u64,
) {
    for i in 0..limit {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let request = pb::CheckRequest {
            items: vec![item(name, &format!("k{}", i % 500), None)],
            ..Default::default()
        };
        match client.check(request).await {
            Ok(_) => seen.ok.fetch_add(1, Ordering::Relaxed),
            // Refusals: UNAVAILABLE (store down, or listener closed); CANCELLED (the client's
            // connection ended, GOAWAY, before it sent the request); INTERNAL "h2 protocol
            // error" (a stream racing the server's GOAWAY at shutdown). None was answered.
            Err(e) if matches!(e.code(), Code::Unavailable | Code::Cancelled) => {
                seen.unavailable.fetch_add(1, Ordering::Relaxed)
            }
            Err(e) if e.code() == Code::Internal && e.message().contains("h2 protocol error") => {
                seen.unavailable.fetch_add(1, Ordering::Relaxed)
            }
            Err(e) => {
                eprintln!("unexpected status: {:?} {}", e.code(), e.message());
                seen.other.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

/// A server on the example limits and `redis` (100 ms deadlines, UNAVAILABLE while Redis
/// fails, a breaker that opens after 3 failures for 200 ms).
async fn served_on_redis(redis: cellrate::store::redis::RedisSettings) -> Served {
    use cellrate::server::StoreSettings;
    use cellrate::store::redis::{FailurePolicy, RedisSettings};
    let limits =
        LimitTable::load_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config").as_ref()).unwrap();
    let settings = Settings {
        store: StoreSettings::Redis {
            settings: Box::new(RedisSettings {
                timeout: Duration::from_millis(100),
                failure: FailurePolicy::Unavailable,
                breaker_threshold: 3,
                breaker_cooldown: Duration::from_millis(200),
                ..redis
            }),
            required_for_ready: false,
        },
        ..Settings::default()
    };
    Served::full(limits, settings, None).await
}

/// Four clients checking in a loop (at most `limit` each) until the flag is set.
fn under_load(
    s: &Served,
    limit: u64,
) -> (Arc<AtomicBool>, Arc<Seen>, Vec<tokio::task::JoinHandle<()>>) {
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Seen::default()));
    let load = (0..4)
        .map(|_| {
            tokio::spawn(hammer(
                s.decisions.clone(),
                "ApiRequestsPerKeyDaily",
                stop.clone(),
                seen.clone(),
                limit,
            ))
        })
        .collect();
    (stop, seen, load)
}

/// Whether `more` decisions are answered OK within `within`, counting from now.
async fn answers_grow(seen: &Seen, more: u64, within: Duration) -> bool {
    let from = seen.ok.load(Ordering::Relaxed);
    crate::common::poll_until(
        within,
        async || seen.ok.load(Ordering::Relaxed) > from + more,
        |&ok| ok,
    )
    .await
}

/// Stops the load of [`under_load`] and waits for its clients (each within 10 s).
async fn stop_load(stop: &AtomicBool, load: Vec<tokio::task::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for task in load {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("no hang")
            .unwrap();
    }
}

/// A good limits directory: the name `Api` with `burst` per second.
fn write_limits(dir: &std::path::Path, burst: u32) {
    std::fs::write(
        dir.join("names.yaml"),
        "Api: {number: 100, format: string}\n",
    )
    .unwrap();
    let defaults = format!("Api: {{burst: {burst}, count: {burst}, period: 1s}}\n");
    std::fs::write(dir.join("defaults.yaml"), defaults).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_config_mid_load_keeps_the_old_limits_then_a_good_one_applies() {
    let dir = tempfile::tempdir().unwrap();
    write_limits(dir.path(), 10);
    let settings = crate::common::watching(dir.path(), Duration::from_millis(50));
    let s = Served::full(LimitTable::load_dir(dir.path()).unwrap(), settings, None).await;
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Seen::default()));
    let load: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(hammer(
                s.decisions.clone(),
                "Api",
                stop.clone(),
                seen.clone(),
                100_000,
            ))
        })
        .collect();
    assert!(answered(&seen, 100, |s| &s.ok).await >= 100, "no load");

    // Garbage of every kind the loader might choke on, written over the good files.
    std::fs::write(
        dir.path().join("defaults.yaml"),
        b"\xff\xfe\x00garbage: [{{{",
    )
    .unwrap();
    std::fs::write(dir.path().join("names.yaml"), "Api: {number: 7}").unwrap();
    let failures = crate::common::poll_until(
        Duration::from_secs(2),
        async || {
            sample(
                &crate::common::http_get_async(s.metrics_addr, "/metrics")
                    .await
                    .1,
                "cellrate_config_reloads_total{result=\"failure\"}",
            )
        },
        |failures| failures.unwrap_or(0.0) >= 1.0,
    )
    .await;
    assert!(
        failures.unwrap_or(0.0) >= 1.0,
        "the garbage was not seen and rejected"
    );
    let peek = |mut admin: pb::admin_client::AdminClient<tonic::transport::Channel>| async move {
        let r = admin
            .inspect(pb::InspectRequest {
                items: vec![item("Api", "probe", None)],
            })
            .await
            .unwrap();
        r.into_inner().items[0].limit.as_ref().unwrap().burst
    };
    assert_eq!(
        peek(s.admin.clone()).await,
        10,
        "the old limits stay in force"
    );

    // A good config again: it applies, under load.
    write_limits(dir.path(), 30);
    let burst = crate::common::poll_until(
        Duration::from_secs(2),
        async || peek(s.admin.clone()).await,
        |&b| b == 30,
    )
    .await;
    assert_eq!(burst, 30, "the good config did not apply within 2 s");
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    assert!(
        seen.ok.load(Ordering::Relaxed) > 100,
        "too little load to mean anything"
    );
    assert_eq!(
        seen.unavailable.load(Ordering::Relaxed) + seen.other.load(Ordering::Relaxed),
        0,
        "requests failed during the reloads"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_drains_and_exits_cleanly() {
    let mut p = crate::common::serve();
    let client =
        pb::rate_limiter_client::RateLimiterClient::connect(format!("http://{}", p.listen))
            .await
            .unwrap();
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Seen::default()));
    let load: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(hammer(
                client.clone(),
                "ApiRequestsPerKey",
                stop.clone(),
                seen.clone(),
                100_000,
            ))
        })
        .collect();
    answered(&seen, 100, |s| &s.ok).await;
    let before = seen.ok.load(Ordering::Relaxed);
    assert!(before > 0, "no load before SIGTERM");
    assert_eq!(
        seen.unavailable.load(Ordering::Relaxed),
        0,
        "refusals before SIGTERM"
    );
    std::process::Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = p.child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "no exit within 20 s of SIGTERM under load"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    stop.store(true, Ordering::Relaxed);
    for task in load {
        let _ = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("load tasks end: no hang");
    }
    assert_eq!(exit.code(), Some(0));
    // Requests either completed or were refused as UNAVAILABLE once the listener closed:
    // never a broken answer.
    assert_eq!(
        seen.other.load(Ordering::Relaxed),
        0,
        "requests failed other than UNAVAILABLE"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_under_load_honours_the_policy_and_recovers() {
    use cellrate::store::redis::RedisSettings;
    let mut redis = crate::common::redis_server::RedisServer::start();
    let s = served_on_redis(RedisSettings {
        url: Some(redis.url()),
        ..RedisSettings::default()
    })
    .await;
    let (stop, seen, load) = under_load(&s, 100_000);
    assert!(answered(&seen, 100, |s| &s.ok).await >= 100, "no load");
    redis.kill();
    let unavailable_while_down = answered(&seen, 1, |s| &s.unavailable).await;
    assert!(
        unavailable_while_down > 0,
        "no UNAVAILABLE while Redis was down"
    );
    let breakers_open = async || {
        let (_, text) = crate::common::http_get_async(s.metrics_addr, "/metrics").await;
        crate::common::sample(&text, "cellrate_store_breakers_open")
    };
    let open =
        crate::common::poll_until(Duration::from_secs(5), breakers_open, |&v| v == Some(1.0)).await;
    assert_eq!(open, Some(1.0), "the open breaker shows in the gauge");
    redis.restart();
    // Recovery: successes resume without restarting cellrate.
    let recovered = answers_grow(&seen, 50, Duration::from_secs(5)).await;
    stop_load(&stop, load).await;
    assert!(
        recovered,
        "decisions did not resume within 5 s of Redis restarting"
    );
    let closed =
        crate::common::poll_until(Duration::from_secs(5), breakers_open, |&v| v == Some(0.0)).await;
    assert_eq!(closed, Some(0.0), "the closed breaker leaves the gauge");
    assert_eq!(
        seen.other.load(Ordering::Relaxed),
        0,
        "failures other than UNAVAILABLE"
    );
}

/// Redis behind Sentinel: the master is killed under load. Decisions answer UNAVAILABLE
/// (the failure policy) until the sentinels promote the replica, then resume on it without
/// restarting cellrate; the old master, back as a replica, is never written to.
/// A server following `set`'s master through its sentinels, under load; then the master is
/// killed: UNAVAILABLE meanwhile (and nothing else), the sentinels promote the replica, and
/// decisions answer again on it. Returns the server and its load, still running.
async fn a_killed_master_is_followed(
    set: &mut crate::common::redis_server::RedisSentinels,
    what: &str,
) -> (
    Served,
    Arc<AtomicBool>,
    Arc<Seen>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    use crate::common::redis_server::SENTINEL_MASTER;
    use cellrate::store::redis::{RedisSettings, SentinelSettings};
    let s = served_on_redis(RedisSettings {
        sentinel: Some(SentinelSettings {
            nodes: set.addresses(),
            master: SENTINEL_MASTER.to_string(),
            password: None,
            tls: false,
        }),
        ..RedisSettings::default()
    })
    .await;
    let (stop, seen, load) = under_load(&s, 1_000_000);
    assert!(answered(&seen, 100, |s| &s.ok).await >= 100, "no load");
    let written = set.master.cli(&["DBSIZE"]).unwrap();
    assert_ne!(written.trim(), "0", "the master holds no bucket");

    set.master.kill();
    let killed = Instant::now();
    assert!(
        answered(&seen, 1, |s| &s.unavailable).await > 0,
        "no UNAVAILABLE while the master was down"
    );
    // The sentinels notice (1 s without answers), agree and promote the replica.
    let promoted = crate::common::poll_until(
        Duration::from_secs(30),
        async || set.master_port(),
        |&p| p == Some(set.replica.port),
    )
    .await;
    assert_eq!(promoted, Some(set.replica.port), "no promotion within 30 s");
    let promoted_at = killed.elapsed();
    let resumed = answers_grow(&seen, 50, Duration::from_secs(10)).await;
    let resumed_at = killed.elapsed();
    eprintln!(
        "{what} sentinel failover: promoted {promoted_at:?} after the kill, decisions answered \
         again {:?} after the promotion",
        resumed_at.saturating_sub(promoted_at)
    );
    assert!(
        resumed,
        "decisions did not resume within 10 s of the promotion"
    );
    assert!(
        set.replica
            .cli(&["INFO", "replication"])
            .is_some_and(|i| i.contains("role:master")),
        "the replica was not promoted"
    );
    assert!(
        set.replica
            .cli(&["DBSIZE"])
            .is_some_and(|n| n.trim() != "0"),
        "the new master holds no bucket"
    );
    (s, stop, seen, load)
}

/// Valkey's own sentinels (its server run with `--sentinel`) and a Valkey master and
/// replica: the same failover as with Redis's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_sentinel_failover_under_load_follows_the_new_master() {
    let mut set = crate::common::redis_server::RedisSentinels::start_valkey();
    let (_s, stop, seen, load) = a_killed_master_is_followed(&mut set, "Valkey").await;
    stop_load(&stop, load).await;
    assert_eq!(
        seen.other.load(Ordering::Relaxed),
        0,
        "failures other than UNAVAILABLE"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_under_load_follows_the_new_master() {
    use crate::common::redis_server::{RedisSentinels, SENTINEL_MASTER};
    let mut set = RedisSentinels::start();
    let old_port = set.master.port;
    let (_s, stop, seen, load) = a_killed_master_is_followed(&mut set, "Redis").await;

    // The old master comes back (empty) and the sentinels make it a replica of the new one:
    // cellrate goes on writing to the new master only. The sentinels convert a returning
    // master after a few of their 2 s hello periods; on a loaded machine that can take long,
    // and there (down-after is 1 s) they may even judge the new master down and fail over
    // back to the old one between two looks (CI saw it once): then the old master is the
    // sentinels' master again, which the switchover below wants anyway.
    set.master.restart();
    assert_eq!(set.master.port, old_port);
    let settled = crate::common::poll_until(
        Duration::from_secs(60),
        async || (set.master.cli(&["INFO", "replication"]), set.master_port()),
        |(info, master)| {
            info.as_ref().is_some_and(|i| {
                i.contains("role:slave") || (*master == Some(old_port) && i.contains("role:master"))
            })
        },
    )
    .await;
    let back_as_master = settled.1 == Some(old_port);
    assert!(
        settled.0.as_ref().is_some_and(|i| i.contains("role:slave")) || back_as_master,
        "the old master was not made a replica within 60 s: {:?}\nsentinel: {:?}",
        settled.0,
        set.sentinels[0].cli(&["SENTINEL", "REPLICAS", SENTINEL_MASTER])
    );
    let more = answers_grow(&seen, 200, Duration::from_secs(10)).await;
    assert!(more, "decisions stopped after the old master came back");
    if !back_as_master {
        let stats = set.master.cli(&["INFO", "commandstats"]).unwrap();
        assert!(
            !stats.contains("cmdstat_evalsha") && !stats.contains("cmdstat_eval:"),
            "a script ran on the old master, now a replica: {stats}"
        );
    }

    // A switchover: the sentinels demote the live master (cellrate's connection to it stays
    // open, and it answers READONLY) and promote the old one back. cellrate follows, and
    // sends the demoted node nothing more.
    let scripts_on = |node: &crate::common::redis_server::RedisServer| {
        let stats = node.cli(&["INFO", "commandstats"]).unwrap_or_default();
        stats
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .map(str::to_string)
    };
    // The sentinels agree only to a replica that is in sync and that they have seen as one
    // for a while (NOGOODSLAVE until then), and a failover they start can still be aborted
    // (no good replica after all): ask again every 2 s until the old master is back.
    if !back_as_master {
        let synced = crate::common::poll_until(
            Duration::from_secs(60),
            async || set.master.cli(&["INFO", "replication"]),
            |i| {
                i.as_ref()
                    .is_some_and(|i| i.contains("master_link_status:up"))
            },
        )
        .await;
        assert!(
            synced
                .as_ref()
                .is_some_and(|i| i.contains("master_link_status:up")),
            "the old master did not sync as a replica within 60 s: {synced:?}"
        );
    }
    let sentinel = &set.sentinels[0];
    let mut asked = Vec::new();
    let switched = crate::common::poll_until(
        Duration::from_secs(120),
        async || {
            if set.master_port() == Some(old_port) {
                return Some(old_port);
            }
            asked.push(sentinel.cli(&["SENTINEL", "FAILOVER", SENTINEL_MASTER]));
            tokio::time::sleep(Duration::from_secs(2)).await;
            set.master_port()
        },
        |&p| p == Some(old_port),
    )
    .await;
    assert_eq!(
        switched,
        Some(old_port),
        "no switchover within 120 s; the sentinel answered {asked:?}"
    );
    let demoted = crate::common::poll_until(
        Duration::from_secs(60),
        async || set.replica.cli(&["INFO", "replication"]),
        |i| i.as_ref().is_some_and(|i| i.contains("role:slave")),
    )
    .await;
    assert!(
        demoted.is_some_and(|i| i.contains("role:slave")),
        "not demoted"
    );
    let followed = answers_grow(&seen, 100, Duration::from_secs(10)).await;
    assert!(followed, "decisions did not resume after the switchover");
    let on_demoted = scripts_on(&set.replica);
    let more = answers_grow(&seen, 200, Duration::from_secs(10)).await;
    stop_load(&stop, load).await;
    assert!(more, "decisions stopped after the switchover");
    assert_eq!(
        scripts_on(&set.replica),
        on_demoted,
        "scripts went on reaching the demoted master"
    );
    assert!(
        set.master.cli(&["DBSIZE"]).is_some_and(|n| n.trim() != "0"),
        "the master of the switchover holds no bucket"
    );
    assert_eq!(
        seen.other.load(Ordering::Relaxed),
        0,
        "failures other than UNAVAILABLE"
    );
}
