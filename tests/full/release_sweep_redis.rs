//! The sweeper of held reservations on a real redis-server (#58 items 6 and 7, and the
//! sweep's speed): holds of a limit a reload removed starve no other hold; a `Check` cut
//! short by its caller's deadline (below `--redis-timeout-ms`) still gets its estimate
//! back at its hold's end; a large batch of due holds is released within a sweep or so.
//! The memory store's: `tests/it/release_sweep.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::redis_server::RedisServer;
use crate::common::release_sweep::{limits, remove_gone, Captured};
use crate::common::reservations::{eventually, hold, holds};
use crate::common::{http_get_async, item, remaining, watching, Served};
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::{Settings, StoreSettings};
use cellrate::store::redis::RedisSettings;

const HOLDS: &str = "cellrate:{settle}:holds";

fn record(id: &str) -> String {
    format!("cellrate:{{settle}}:r:{id}")
}

/// Makes every live hold due now (Redis's clock cannot be faked).
fn all_due(redis: &RedisServer) {
    let script = "for _, k in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do \
                    redis.call('ZADD', KEYS[1], 0, k) redis.call('HSET', k, 'u', 0) end";
    redis.cli(&["EVAL", script, "1", HOLDS]).unwrap();
}

async fn held(s: &Served, event: &str) -> f64 {
    holds(&http_get_async(s.metrics_addr, "/metrics").await.1, event)
}

/// Before: the 300 orphans were claimed, failed and reopened 64 times a sweep, the
/// victim's hold never released. Now each is given up once, and the victim's released.
#[tokio::test]
async fn on_redis_holds_of_a_removed_limit_starve_no_other_hold() {
    let log = Captured::warnings();
    let redis = RedisServer::start();
    let dir = limits();
    let settings = Settings {
        sweep_interval: Duration::from_millis(20),
        store: redis.settings().store,
        ..watching(dir.path(), Duration::from_millis(50))
    };
    let mut s = Served::with_settings(LimitTable::load_dir(dir.path()).unwrap(), settings).await;
    for i in 0..300 {
        let id = format!("orphan-{i}");
        assert!(hold(&mut s, &id, "Gone", "attacker", 1).await.unwrap());
    }
    assert!(hold(&mut s, "victim", "Released", "victim", 2_000)
        .await
        .unwrap());
    remove_gone(dir.path());
    eventually("the reload without Gone", async || {
        let inspect = pb::InspectRequest {
            items: vec![item("Gone", "attacker", None)],
        };
        s.admin.inspect(inspect).await.is_err().then_some(())
    })
    .await;
    all_due(&redis);
    // The victim's due after the orphans', as a later hold's would be.
    redis.cli(&["ZADD", HOLDS, "1", &record("victim")]).unwrap();
    let mut left = 0;
    for _ in 0..100 {
        left = remaining(&mut s, "Released", "victim").await;
        if left == 10_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines = log.lines_with("hold");
    assert_eq!(
        left,
        10_000,
        "the victim's hold not released; {} WARN lines about holds, the first: {:?}",
        lines.len(),
        lines.first()
    );
    eventually("the orphans given up", async || {
        (held(&s, "given_up").await >= 300.0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(held(&s, "given_up").await, 300.0, "given up once each");
    let lines = log.lines_with("hold");
    assert!(
        lines.len() <= 2,
        "{} lines: {:?}",
        lines.len(),
        lines.first()
    );
    s.stop().await;
}

/// A TCP proxy to `upstream` that holds back, by `delay`, the reply to each bucket
/// script call (`spend`): the call is made at once, its answer comes late, as from a
/// Redis that is slow to answer.
async fn slow_spend_replies(upstream: String, delay: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(&upstream).await.unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let spend = Arc::new(AtomicBool::new(false));
            let seen = spend.clone();
            tokio::spawn(async move {
                let mut buffer = vec![0; 65_536];
                while let Ok(n @ 1..) = client_read.read(&mut buffer).await {
                    let chunk = &buffer[..n];
                    // A spend, with or without a kept Check's token (`once:<ttl>`).
                    let spends = |w: &[u8]| w == b"\r\nspend\r\n" || w.starts_with(b"\r\nonce:");
                    if chunk.windows(9).any(spends) {
                        seen.store(true, Ordering::SeqCst);
                    }
                    if server_write.write_all(chunk).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buffer = vec![0; 65_536];
                while let Ok(n @ 1..) = server_read.read(&mut buffer).await {
                    if spend.swap(false, Ordering::SeqCst) {
                        tokio::time::sleep(delay).await;
                    }
                    if client_write.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    format!("redis://{address}")
}

/// Before: the caller's 20 ms deadline dropped the Check after its spend and before its
/// record was decided; the record stayed pending, the sweeper let it go, and the 2 000
/// tokens stayed spent (8 000 left) whatever `unsettled: release` said. Now the Check
/// runs to its end without its caller: the record is decided, and released at its end.
#[tokio::test]
async fn on_redis_a_check_cut_short_by_its_callers_deadline_is_released_at_its_end() {
    let redis = RedisServer::start();
    let slow = slow_spend_replies(
        redis.url().replace("redis://", ""),
        Duration::from_millis(300),
    )
    .await;
    let dir = crate::common::reservations::limits();
    let settings = Settings {
        sweep_interval: Duration::from_millis(20),
        store: StoreSettings::Redis {
            settings: Box::new(RedisSettings {
                url: Some(slow),
                timeout: Duration::from_millis(2_000),
                ..RedisSettings::default()
            }),
            required_for_ready: false,
        },
        ..Settings::default()
    };
    let mut s = Served::with_settings(LimitTable::load_dir(dir.path()).unwrap(), settings).await;
    let mut request = tonic::Request::new(pb::CheckRequest {
        items: vec![item("Released", "acme", Some(2_000))],
        request_id: "cut-short".into(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(20));
    let cut = s.decisions.check(request).await;
    assert!(cut.is_err(), "answered within 20 ms: {cut:?}");
    let state = || {
        redis
            .cli(&["HGET", &record("cut-short"), "s"])
            .unwrap_or_default()
    };
    eventually("the cut-short Check's record decided", async || {
        (state().trim() == "d").then_some(())
    })
    .await;
    assert_eq!(remaining(&mut s, "Released", "acme").await, 8_000, "spent");
    all_due(&redis);
    eventually("the cut-short hold released", async || {
        (held(&s, "released").await >= 1.0).then_some(())
    })
    .await;
    assert_eq!(remaining(&mut s, "Released", "acme").await, 10_000);
    s.stop().await;
}

/// The sweep's speed: N due holds (`CELLRATE_SWEEP_HOLDS`, 2 000 unless set) are all
/// released, and the time they took is printed (docs/concurrency.md has the figures).
#[tokio::test]
async fn on_redis_a_large_batch_of_due_holds_is_released() {
    let n: usize = std::env::var("CELLRATE_SWEEP_HOLDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    let redis = RedisServer::start();
    let dir = crate::common::reservations::limits();
    let settings = Settings {
        sweep_interval: Duration::from_millis(20),
        ..redis.settings()
    };
    let s = Served::with_settings(LimitTable::load_dir(dir.path()).unwrap(), settings).await;
    let client = s.decisions.clone();
    let checks = (0..n).map(|i| {
        let mut c = client.clone();
        async move {
            let answer = c
                .check(pb::CheckRequest {
                    items: vec![item("Released", &format!("t-{}", i % 100), Some(1))],
                    request_id: format!("h-{i}"),
                    ..Default::default()
                })
                .await;
            assert!(answer.unwrap().into_inner().overall.unwrap().allowed);
        }
    });
    let mut pending = futures_util::stream::iter(checks).buffer_unordered(32);
    while pending.next().await.is_some() {}
    drop(pending);
    let started = Instant::now();
    all_due(&redis);
    let mut released = 0.0;
    for _ in 0..1_200 {
        released = held(&s, "released").await;
        if released >= n as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "{n} due holds on Redis: {released} released in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(released, n as f64);
    s.stop().await;
}
