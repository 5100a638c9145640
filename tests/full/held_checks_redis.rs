//! The check-0, charge-later pattern held (`--zero-check-holds`) on Redis, Redis Cluster
//! and Valkey with real servers: two replicas share the holds and the buckets, so 64
//! streams started at once over both are held to the budget exactly, a stream end on
//! either settles the bucket's oldest hold once, and a hold no stream end settles (Envoy
//! killed) is released at its due by whichever replica's sweeper claims it. The due is
//! brought forward by rewriting it in Redis (Redis's clock cannot be faked). The memory
//! store's tests are `tests/it/held_checks.rs`.

use std::time::Duration;

use crate::common::held::{held, holds_keep_the_budget, limits, start_many};
use crate::common::redis_server::{RedisCluster, RedisServer};
use crate::common::reservations::eventually;
use crate::common::{http_get_async, Served};
use cellrate::server::Settings;
use cellrate::service::envoy::Estimate;

const HOLDS: &str = "cellrate:{settle}:holds";

/// Waits out the last 30 s of an hour of the real clock: the holds' times are Redis's,
/// and a stream end gives back only into the window its hold was spent in.
async fn clear_of_an_hour_end() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let left = 3_600 - now % 3_600;
    if left < 30 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

fn settings(store: Settings) -> Settings {
    let store = Settings {
        sweep_interval: Duration::from_millis(20),
        ..store
    };
    held(store, Estimate::Fixed(1_000), Duration::from_secs(600))
}

async fn released(replicas: &[&Served]) -> usize {
    let mut n = 0;
    for s in replicas {
        let metrics = http_get_async(s.metrics_addr, "/metrics").await.1;
        let line = metrics
            .lines()
            .find(|l| l.starts_with("cellrate_holds_total{event=\"released\"}"));
        n += line
            .and_then(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
            .unwrap_or(0);
    }
    n
}

/// Two replicas over `store`; `node` keeps the holds.
async fn held_across_replicas(store: Settings, node: &RedisServer) {
    clear_of_an_hour_end().await;
    let a = Served::with_settings(limits(), settings(store.clone())).await;
    let b = Served::with_settings(limits(), settings(store)).await;
    holds_keep_the_budget(&[&a, &b]).await;

    // Envoy killed: 10 holds taken, no stream end. At their due, each is released once
    // (both sweepers race for them), and the budget is back.
    assert_eq!(start_many(&[&a, &b], "killed", 30).await, 10);
    let due = node.cli(&["ZRANGE", HOLDS, "0", "-1"]).unwrap_or_default();
    let due: Vec<&str> = due.lines().filter(|k| !k.is_empty()).collect();
    assert_eq!(due.len(), 11, "these 10, and the scenario's last (`other`)");
    for key in &due {
        node.cli(&["ZADD", HOLDS, "0", key]).unwrap();
        node.cli(&["HSET", key, "u", "0"]).unwrap();
    }
    eventually("the 11 holds released", async || {
        (released(&[&a, &b]).await >= 11).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(released(&[&a, &b]).await, 11, "each released once");
    // The queues hold live holds only: every hold settled or released has left its queue.
    let queues = node.cli(&["--scan", "--pattern", "cellrate:{settle}:q:*"]);
    let queued: usize = (queues.unwrap_or_default().lines())
        .filter(|k| !k.is_empty())
        .map(|k| {
            node.cli(&["ZCARD", k])
                .unwrap()
                .trim()
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    assert_eq!(queued, 0, "no hold left in a queue");
    assert_eq!(
        start_many(&[&a, &b], "killed", 30).await,
        10,
        "the budget is back"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn holds_are_exact_across_replicas_on_redis() {
    let redis = RedisServer::start();
    held_across_replicas(redis.settings(), &redis).await;
}

#[tokio::test]
async fn holds_are_exact_across_replicas_on_valkey() {
    let valkey = RedisServer::start_valkey();
    held_across_replicas(valkey.settings(), &valkey).await;
}

#[tokio::test]
async fn holds_are_exact_across_replicas_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let settings = cluster.settings();
    let node = &cluster.nodes[cluster.node_of_slot(cellrate::store::redis::slot(HOLDS))];
    held_across_replicas(settings, node).await;
}
