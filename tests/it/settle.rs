//! Settlements (#35): a native `Check` with a `request_id` spends an estimate; `Settle`
//! adjusts it once to the actual costs (the difference charged into debt if need be, or
//! refunded, never fuller than full). A retry counts once, on the same replica or, with
//! the Redis store, on another. Through real gRPC clients.

use std::path::Path;
use std::time::Duration;

use crate::common::redis_server::RedisServer;
use crate::common::{http_get_async, item, remaining, sample, serve_with, Served};
use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use tonic::Code;

/// 10 000 tokens a day per tenant, a plain limit (no overdraw: a settlement charges anyway).
fn limits() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("names.yaml"),
        "TokensPerTenant: {number: 100, format: string}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "TokensPerTenant: {burst: 10000, count: 10000, period: 1d}\n",
    )
    .unwrap();
    dir
}

async fn served(dir: &Path, settings: Settings) -> Served {
    Served::with_settings(LimitTable::load_dir(dir).unwrap(), settings).await
}

type Client = pb::rate_limiter_client::RateLimiterClient<tonic::transport::Channel>;

/// Spends `cost` tokens of `tenant` under `request_id`.
async fn estimate(
    client: &mut Client,
    request_id: &str,
    tenant: &str,
    cost: u64,
) -> Result<pb::CheckResponse, tonic::Status> {
    Ok(client
        .check(pb::CheckRequest {
            items: vec![item("TokensPerTenant", tenant, Some(cost))],
            request_id: request_id.to_string(),
            ..Default::default()
        })
        .await?
        .into_inner())
}

pub(crate) async fn settle(
    client: &mut Client,
    request_id: &str,
    costs: &[u64],
) -> Result<pb::SettleResponse, tonic::Status> {
    Ok(client
        .settle(pb::SettleRequest {
            request_id: request_id.to_string(),
            costs: costs.to_vec(),
        })
        .await?
        .into_inner())
}

/// A client of a served process's decision listener.
async fn connect(addr: &str) -> Client {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    pb::rate_limiter_client::RateLimiterClient::new(channel)
}

fn code<T: std::fmt::Debug>(answer: Result<T, tonic::Status>) -> (Code, String) {
    let e = answer.expect_err("refused");
    (e.code(), e.message().to_string())
}

#[tokio::test]
async fn a_settlement_charges_or_refunds_the_difference_once() {
    let dir = limits();
    let mut s = served(dir.path(), Settings::default()).await;
    let mut c = s.decisions.clone();
    let left = async |s: &mut Served| remaining(s, "TokensPerTenant", "acme").await;

    // Estimate 2 000, use 3 500: 1 500 more are charged.
    assert!(
        estimate(&mut c, "req-1", "acme", 2_000)
            .await
            .unwrap()
            .overall
            .unwrap()
            .allowed
    );
    assert_eq!(left(&mut s).await, 8_000);
    let settled = settle(&mut c, "req-1", &[3_500]).await.unwrap();
    assert!(!settled.already_settled);
    assert_eq!(settled.items[0].remaining, 6_500);
    assert_eq!(left(&mut s).await, 6_500);
    // The retry counts once; other costs for it are refused; its id cannot check again.
    let again = settle(&mut c, "req-1", &[3_500]).await.unwrap();
    assert!(again.already_settled);
    assert_eq!(again.items[0].remaining, 6_500);
    let (status, message) = code(settle(&mut c, "req-1", &[100]).await);
    assert_eq!(status, Code::FailedPrecondition, "{message}");
    let (status, message) = code(estimate(&mut c, "req-1", "acme", 1).await);
    assert_eq!(status, Code::AlreadyExists, "{message}");
    assert_eq!(
        left(&mut s).await,
        6_500,
        "nothing spent by the refused calls"
    );

    // Estimate 2 000, use 800: 1 200 come back.
    estimate(&mut c, "req-2", "acme", 2_000).await.unwrap();
    assert_eq!(
        settle(&mut c, "req-2", &[800]).await.unwrap().items[0].remaining,
        5_700
    );

    // A wrong number of costs changes nothing, and the right one still settles after it.
    estimate(&mut c, "req-3", "acme", 700).await.unwrap();
    let (status, message) = code(settle(&mut c, "req-3", &[1, 2]).await);
    assert_eq!(status, Code::InvalidArgument, "{message}");
    assert!(message.contains("the Check had 1 items"), "{message}");
    assert_eq!(left(&mut s).await, 5_000);
    // Used 20 000: far beyond what is left, into debt (at most one burst).
    let debt = settle(&mut c, "req-3", &[20_000]).await.unwrap();
    assert_eq!(debt.items[0].remaining, -10_000);
    assert!(!debt.items[0].allowed);

    // A denied Check keeps nothing; an id never used is unknown.
    let denied = estimate(&mut c, "req-4", "acme", 1).await.unwrap();
    assert!(!denied.overall.unwrap().allowed);
    for id in ["req-4", "never-used"] {
        let (status, message) = code(settle(&mut c, id, &[0]).await);
        assert_eq!(status, Code::NotFound, "{id}: {message}");
        assert!(message.contains("unknown"), "{message}");
    }

    // A refund never fills past full: estimate 9 000 of a full bucket, use 0.
    estimate(&mut c, "req-5", "other", 9_000).await.unwrap();
    let back = settle(&mut c, "req-5", &[0]).await.unwrap();
    assert_eq!(back.items[0].remaining, 10_000);

    // A kept Check lasts --settle-window (1 h by default), to the nanosecond.
    estimate(&mut c, "req-6", "other", 10).await.unwrap();
    s.clock.advance(3_600 * SECOND);
    let (status, _) = code(settle(&mut c, "req-6", &[5]).await);
    assert_eq!(status, Code::NotFound);

    let (_, metrics) = http_get_async(s.metrics_addr, "/metrics").await;
    let count = |result: &str| {
        sample(
            &metrics,
            &format!("cellrate_settlements_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!(count("settled"), Some(4.0));
    assert_eq!(count("retried"), Some(1.0));
    assert_eq!(count("conflict"), Some(1.0));
    assert_eq!(count("unknown"), Some(3.0));
    s.stop().await;
}

/// A hostile caller: request ids and kept Checks are bounded, a flood of ids pushes out
/// only the oldest records (the table stays at its size), and no settlement gets more
/// back than was spent.
#[tokio::test]
async fn hostile_settlements_are_bounded() {
    let dir = limits();
    let settings = Settings {
        settle_max_records: 5,
        ..Settings::default()
    };
    let mut s = served(dir.path(), settings).await;
    let mut c = s.decisions.clone();
    let long = "x".repeat(129);
    for id in [
        long.as_str(),
        "with space",
        "tab\there",
        "\u{1b}]52;c;aGk=\u{7}",
        "é",
    ] {
        let (status, message) = code(estimate(&mut c, id, "acme", 1).await);
        assert_eq!(status, Code::InvalidArgument, "{id:?}: {message}");
        assert!(message.contains("request_id"), "{message}");
        let (status, _) = code(settle(&mut c, id, &[1]).await);
        assert_eq!(status, Code::InvalidArgument, "{id:?}");
    }
    // A kept Check is at most 1 KiB: a large one is refused before anything is spent.
    let big: Vec<pb::Item> = (0..40)
        .map(|i| {
            item(
                "TokensPerTenant",
                &format!("tenant-with-a-long-id-{i:04}"),
                Some(1),
            )
        })
        .collect();
    let answer = c
        .check(pb::CheckRequest {
            items: big,
            request_id: "big".into(),
            ..Default::default()
        })
        .await;
    let (status, message) = code(answer);
    assert_eq!(status, Code::InvalidArgument, "{message}");
    assert!(message.contains("1024"), "{message}");
    assert_eq!(
        remaining(&mut s, "TokensPerTenant", "tenant-with-a-long-id-0000").await,
        10_000
    );
    // Costs: 1 to 64 of them.
    let (status, _) = code(settle(&mut c, "any", &[]).await);
    assert_eq!(status, Code::InvalidArgument);
    let (status, _) = code(settle(&mut c, "any", &[1; 65]).await);
    assert_eq!(status, Code::InvalidArgument);

    // A flood of ids: the table keeps the newest 5; the older ones are unknown, and their
    // estimates stand.
    for i in 0..12 {
        estimate(&mut c, &format!("flood-{i}"), "acme", 1)
            .await
            .unwrap();
    }
    for i in 0..7 {
        let (status, _) = code(settle(&mut c, &format!("flood-{i}"), &[0]).await);
        assert_eq!(status, Code::NotFound, "flood-{i} was pushed out");
    }
    for i in 7..12 {
        settle(&mut c, &format!("flood-{i}"), &[0]).await.unwrap();
    }
    // 12 spent, 5 given back.
    assert_eq!(
        remaining(&mut s, "TokensPerTenant", "acme").await,
        10_000 - 7
    );
    let (_, metrics) = http_get_async(s.metrics_addr, "/metrics").await;
    assert_eq!(
        sample(
            &metrics,
            "cellrate_settlements_total{result=\"pushed_out\"}"
        ),
        Some(7.0)
    );
    s.stop().await;
}

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
