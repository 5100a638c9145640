//! Settlements on a real redis-server, standalone and Cluster, across replicas (on the
//! memory store: the fast tier's `tests/it/settle.rs`).

use crate::common::redis_server::RedisServer;
use crate::common::serve_with;
use crate::common::settle::{code, connect, estimate, limits, settle};
use tonic::Code;

/// Two replicas on one Redis: a Check kept on one is settled on the other, once; the retry
/// on the first counts nothing. As real `cellrate serve --store redis` processes.
#[tokio::test]
async fn a_settlement_counts_once_across_replicas_on_redis() {
    let redis = RedisServer::start();
    let dir = limits();
    let flags = [
        "--store",
        "redis",
        "--redis-url",
        &redis.url(),
        "--redis-timeout-ms",
        "1000",
    ];
    let (a, b) = (
        serve_with(dir.path(), &flags),
        serve_with(dir.path(), &flags),
    );
    let (mut on_a, mut on_b) = (connect(&a.listen).await, connect(&b.listen).await);
    estimate(&mut on_a, "order-77", "acme", 2_000)
        .await
        .unwrap();
    let settled = settle(&mut on_b, "order-77", &[2_500]).await.unwrap();
    assert!(!settled.already_settled);
    // Redis time refills the bucket a little between calls (10 000 a day: one token per
    // 8.64 s), so allow a token of drift.
    let after = settled.items[0].remaining;
    assert!((7_500..=7_501).contains(&after), "{after}");
    let retried = settle(&mut on_a, "order-77", &[2_500]).await.unwrap();
    assert!(retried.already_settled);
    assert!((after..=after + 1).contains(&retried.items[0].remaining));
    let (status, _) = code(estimate(&mut on_b, "order-77", "acme", 1).await);
    assert_eq!(
        status,
        Code::AlreadyExists,
        "the id is kept for every replica"
    );
    // The record is in Redis, under the settle tag, with its window as expiry.
    let keys = redis.cli(&["KEYS", "*settle*"]).unwrap();
    assert!(keys.contains("cellrate:{settle}:r:order-77"), "{keys}");
    let ttl: i64 = redis
        .cli(&["PTTL", "cellrate:{settle}:r:order-77"])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!((3_500_000..=3_600_000).contains(&ttl), "{ttl}");
}

/// The same on a 3-master Redis Cluster: the records share one slot (`{settle}`), so each
/// call is atomic there too, and pushing out the oldest works within it.
#[tokio::test]
async fn settlements_work_on_a_redis_cluster() {
    let cluster = crate::common::redis_server::RedisCluster::start();
    let dir = limits();
    let nodes = cluster.urls().join(",");
    let flags = [
        "--store",
        "redis",
        "--redis-cluster-nodes",
        nodes.as_str(),
        "--redis-timeout-ms",
        "1000",
        "--settle-max-records",
        "2",
    ];
    let (a, b) = (
        serve_with(dir.path(), &flags),
        serve_with(dir.path(), &flags),
    );
    let (mut on_a, mut on_b) = (connect(&a.listen).await, connect(&b.listen).await);
    for id in ["c-1", "c-2", "c-3"] {
        estimate(&mut on_a, id, "acme", 100).await.unwrap();
    }
    let (status, _) = code(settle(&mut on_b, "c-1", &[0]).await);
    assert_eq!(status, Code::NotFound, "the oldest was pushed out");
    let settled = settle(&mut on_b, "c-3", &[0]).await.unwrap();
    assert!(!settled.already_settled);
    assert!(
        settle(&mut on_a, "c-3", &[0])
            .await
            .unwrap()
            .already_settled
    );
    settle(&mut on_a, "c-2", &[50]).await.unwrap();
    // 300 spent, 100 and 50 given back: 150 (and a little refill) taken.
    let left = settle(&mut on_b, "c-2", &[50]).await.unwrap().items[0].remaining;
    assert!((9_850..=9_851).contains(&left), "{left}");
}

/// After an upgrade on one Redis, a Check the previous release (3ebe882) kept there, in
/// its format (an encoded `CheckRequest`, and the facts as they still are), is read and
/// settled by a freshly started process of this one, once; not reported unknown.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_check_kept_in_redis_by_the_previous_release_is_settled_after_an_upgrade() {
    use cellrate::clock::SECOND;
    use cellrate::proto::v1 as pb;
    use cellrate::store::redis::{RedisSettings, RedisSettlements};
    use cellrate::store::shared::Settlements;
    use prost::Message;

    let redis = RedisServer::start();
    let dir = limits();
    let flags = ["--store", "redis", "--redis-url", &redis.url()];
    // What the previous release kept under `cellrate:{settle}:`: the Check's items as an
    // encoded CheckRequest, decided with what it spent (2 000 tokens, no window, no hold).
    let settings = RedisSettings {
        url: Some(redis.url()),
        ..RedisSettings::default()
    };
    let table = RedisSettlements::new(&settings, 3_600 * SECOND, 100).unwrap();
    let record = pb::CheckRequest {
        items: vec![crate::common::item("TokensPerTenant", "acme", Some(2_000))],
        ..Default::default()
    }
    .encode_to_vec();
    assert!(
        table
            .open("old-order", &record, None, &[])
            .await
            .unwrap()
            .written
    );
    let mut facts = 2_000u64.to_le_bytes().to_vec();
    facts.push(0);
    assert!(table.decide("old-order", &facts).await.unwrap());

    let process = serve_with(dir.path(), &flags);
    let mut client = connect(&process.listen).await;
    // Its estimate, spent as the previous release's Check spent it.
    let spend = pb::CheckRequest {
        items: vec![crate::common::item("TokensPerTenant", "acme", Some(2_000))],
        ..Default::default()
    };
    client.check(spend).await.unwrap();
    let settled = settle(&mut client, "old-order", &[500]).await;
    let settled = settled.expect("read and settled, not unknown");
    assert!(!settled.already_settled);
    let after = settled.items[0].remaining;
    assert!((9_500..=9_501).contains(&after), "1 500 refunded: {after}");
    let retried = settle(&mut client, "old-order", &[500]).await.unwrap();
    assert!(retried.already_settled);
    assert!((after..=after + 1).contains(&retried.items[0].remaining));
}
