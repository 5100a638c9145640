//! Reservations (#50) on Redis, Redis Cluster and Valkey with real servers: two replicas
//! (two served processes' worth of server, each with its own sweeper) share the holds;
//! each unsettled hold is released once whichever replica claims it, and a `Settle`
//! racing the release: exactly one of them gives the estimate back. The hold's end is
//! brought forward by rewriting its due in Redis (Redis's clock cannot be faked), so no
//! test waits for a hold. The memory store's tests are `tests/it/reservations.rs`.

use std::time::Duration;

use crate::common::redis_server::{RedisCluster, RedisServer};
use crate::common::reservations::{eventually, hold, holds, limits};
use crate::common::settle::settle;
use crate::common::{http_get_async, remaining, Served};
use cellrate::limits::config::LimitTable;
use cellrate::server::Settings;
use tonic::Code;

const HOLDS: &str = "cellrate:{settle}:holds";

fn record(id: &str) -> String {
    format!("cellrate:{{settle}}:r:{id}")
}

/// Makes the hold of `id` due now, on the node that keeps the holds.
fn make_due(node: &RedisServer, id: &str) {
    let key = record(id);
    node.cli(&["ZADD", HOLDS, "0", &key]).unwrap();
    node.cli(&["HSET", &key, "u", "0"]).unwrap();
}

async fn check(s: &mut Served, request_id: &str, tenant: &str, cost: u64) -> bool {
    hold(s, request_id, "Released", tenant, cost).await.unwrap()
}

async fn held(s: &Served, event: &str) -> f64 {
    holds(&http_get_async(s.metrics_addr, "/metrics").await.1, event)
}

/// Two replicas over `settings`; `node` keeps the holds.
async fn release_once_across_replicas(settings: Settings, node: &RedisServer) {
    let dir = limits();
    let settings = Settings {
        sweep_interval: Duration::from_millis(20),
        ..settings
    };
    let table = || LimitTable::load_dir(dir.path()).unwrap();
    let mut a = Served::with_settings(table(), settings.clone()).await;
    let mut b = Served::with_settings(table(), settings).await;
    let tenant = "acme";
    // 5 000 spent plainly, so that a second refund would show (never fuller than full).
    assert!(check(&mut a, "", tenant, 2_500).await);
    assert!(check(&mut b, "", tenant, 2_500).await);
    for i in 0..20 {
        let s = if i % 2 == 0 { &mut a } else { &mut b };
        assert!(check(s, &format!("h-{i}"), tenant, 100).await);
    }
    // Settled before its hold ends, on the other replica: exact.
    let mut on_b = b.decisions.clone();
    let settled = settle(&mut on_b, "h-0", &[40]).await.unwrap();
    assert_eq!(settled.items[0].remaining, 3_060);

    // The other 19 are due: both sweepers race for them; each is released once.
    for i in 1..20 {
        make_due(node, &format!("h-{i}"));
    }
    eventually("19 holds released", async || {
        let released = held(&a, "released").await + held(&b, "released").await;
        (released >= 19.0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = held(&a, "released").await + held(&b, "released").await;
    assert_eq!(released, 19.0, "each released once");
    assert_eq!(remaining(&mut a, "Released", tenant).await, 4_960);

    // A Settle after the release, on either replica, gives nothing back; a replayed one
    // changes nothing.
    let mut on_a = a.decisions.clone();
    let late = settle(&mut on_a, "h-5", &[0]).await.unwrap_err();
    assert_eq!(late.code(), Code::FailedPrecondition, "{}", late.message());
    assert!(late.message().contains("expired"), "{}", late.message());
    assert!(
        settle(&mut on_a, "h-0", &[40])
            .await
            .unwrap()
            .already_settled
    );
    assert_eq!(remaining(&mut b, "Released", tenant).await, 4_960);

    // A Settle racing the release: for each hold, exactly one of them gives it back.
    for i in 0..10 {
        assert!(check(&mut a, &format!("race-{i}"), tenant, 100).await);
    }
    assert_eq!(remaining(&mut a, "Released", tenant).await, 3_960);
    let mut settles = Vec::new();
    for i in 0..10 {
        let id = format!("race-{i}");
        make_due(node, &id);
        let mut client = if i % 2 == 0 {
            on_a.clone()
        } else {
            on_b.clone()
        };
        settles.push(tokio::spawn(
            async move { settle(&mut client, &id, &[0]).await },
        ));
    }
    let mut won = 0.0;
    for s in settles {
        match s.await.unwrap() {
            Ok(r) => {
                assert!(!r.already_settled);
                won += 1.0;
            }
            Err(e) => assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message()),
        }
    }
    eventually("the races' holds released", async || {
        let released = held(&a, "released").await + held(&b, "released").await;
        (released + won >= 29.0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = held(&a, "released").await + held(&b, "released").await;
    assert_eq!(released + won, 29.0, "each race won once");
    assert_eq!(remaining(&mut a, "Released", tenant).await, 4_960);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_hold_is_released_once_across_replicas_on_redis() {
    let redis = RedisServer::start();
    release_once_across_replicas(redis.settings(), &redis).await;
}

#[tokio::test]
async fn a_hold_is_released_once_across_replicas_on_valkey() {
    let valkey = RedisServer::start_valkey();
    release_once_across_replicas(valkey.settings(), &valkey).await;
}

#[tokio::test]
async fn a_hold_is_released_once_across_replicas_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let settings = cluster.settings();
    let node = &cluster.nodes[cluster.node_of_slot(cellrate::store::redis::slot(HOLDS))];
    release_once_across_replicas(settings, node).await;
}

/// On Redis: a hold of a `keep` limit stands at its end (counted kept, a late Settle
/// refused); the attacker's flood of fresh ids on one replica is refused once the shared
/// table is full of holds, and the victim's hold, made on the other, still settles exactly.
#[tokio::test]
async fn on_redis_a_kept_hold_stands_and_a_flood_cannot_push_out_a_hold() {
    let redis = RedisServer::start();
    let dir = limits();
    let settings = Settings {
        sweep_interval: Duration::from_millis(20),
        settle_max_records: 5,
        ..redis.settings()
    };
    let table = || LimitTable::load_dir(dir.path()).unwrap();
    let mut a = Served::with_settings(table(), settings.clone()).await;
    let mut b = Served::with_settings(table(), settings).await;

    assert!(hold(&mut a, "k-1", "Kept", "acme", 2_000).await.unwrap());
    make_due(&redis, "k-1");
    eventually("the kept hold swept", async || {
        let kept = held(&a, "kept").await + held(&b, "kept").await;
        (kept >= 1.0).then_some(())
    })
    .await;
    let late = settle(&mut b.decisions.clone(), "k-1", &[0])
        .await
        .unwrap_err();
    assert_eq!(late.code(), Code::FailedPrecondition, "{}", late.message());
    assert_eq!(remaining(&mut a, "Kept", "acme").await, 8_000, "it stands");

    assert!(check(&mut b, "victim", "victim", 2_000).await);
    let mut refused = 0;
    for i in 0..20 {
        match hold(&mut a, &format!("flood-{i}"), "Released", "attacker", 1).await {
            Ok(allowed) => assert!(allowed),
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
                refused += 1;
            }
        }
    }
    let settled = settle(&mut a.decisions.clone(), "victim", &[500]).await;
    let left = remaining(&mut a, "Released", "victim").await;
    let settled = settled
        .unwrap_or_else(|e| panic!("the victim's hold is gone ({e:?}): its balance stays {left}"));
    assert_eq!(settled.items[0].remaining, 9_500);
    // The kept record (settled at its end) was pushed out for the first flood hold.
    assert_eq!(refused, 16, "4 kept beside the victim's");
    a.stop().await;
    b.stop().await;
}

/// Two replicas over `settings` (`node` keeps the holds): one tenant's flood of holds, made
/// on both, gets exactly its share of the shared table (`--settle-max-holds-per-key`, the
/// default 1 000; the count lives in Redis beside the records), then RESOURCE_EXHAUSTED;
/// another tenant's hold is still taken; free holds (cost 0) hold nothing; a hold settled
/// on one replica, or released at its end, makes room on the other.
async fn one_tenant_gets_its_share_across_replicas(settings: Settings, node: &RedisServer) {
    let dir = limits();
    let settings = Settings {
        sweep_interval: Duration::from_millis(20),
        settle_max_records: 1_100,
        ..settings
    };
    let table = || LimitTable::load_dir(dir.path()).unwrap();
    let mut a = Served::with_settings(table(), settings.clone()).await;
    let mut b = Served::with_settings(table(), settings).await;
    let (mut taken, mut crowded) = (0, 0);
    for i in 0..1_100 {
        let s = if i % 2 == 0 { &mut a } else { &mut b };
        match hold(s, &format!("flood-{i}"), "Released", "attacker", 1).await {
            Ok(allowed) => {
                assert!(allowed);
                taken += 1;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
                assert!(
                    e.message().contains("--settle-max-holds-per-key"),
                    "{}",
                    e.message()
                );
                crowded += 1;
            }
        }
    }
    let victim = hold(&mut b, "victim", "Released", "victim", 2_000).await;
    assert!(victim.unwrap_or_else(|e| panic!("the victim's hold refused: {e:?}")));
    assert_eq!((taken, crowded), (1_000, 100));
    for i in 0..10 {
        assert!(hold(&mut a, &format!("free-{i}"), "Released", "victim", 0)
            .await
            .unwrap());
    }
    // Counted in Redis under the first 16 bytes of the bucket key's SHA-256.
    let count = |tenant: &str| {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(format!("100:{tenant}").as_bytes());
        let key = format!("cellrate:{{settle}}:k:{}", hex::encode(&digest[..16]));
        node.cli(&["ZCARD", &key]).unwrap().trim().to_string()
    };
    assert_eq!(count("attacker"), "1000");
    assert_eq!(count("victim"), "1", "free holds are not counted");

    settle(&mut b.decisions.clone(), "flood-0", &[1])
        .await
        .unwrap();
    assert!(check(&mut a, "more-1", "attacker", 1).await);
    let refused = hold(&mut b, "more-2", "Released", "attacker", 1).await;
    assert_eq!(refused.unwrap_err().code(), Code::ResourceExhausted);
    make_due(node, "flood-1");
    eventually("the due hold released", async || {
        let released = held(&a, "released").await + held(&b, "released").await;
        (released >= 1.0).then_some(())
    })
    .await;
    assert!(check(&mut b, "more-3", "attacker", 1).await);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn on_redis_one_tenant_gets_its_share_of_holds_across_replicas() {
    let redis = RedisServer::start();
    one_tenant_gets_its_share_across_replicas(redis.settings(), &redis).await;
}

#[tokio::test]
async fn on_a_redis_cluster_one_tenant_gets_its_share_of_holds_across_replicas() {
    let cluster = RedisCluster::start();
    let settings = cluster.settings();
    let node = &cluster.nodes[cluster.node_of_slot(cellrate::store::redis::slot(HOLDS))];
    one_tenant_gets_its_share_across_replicas(settings, node).await;
}
