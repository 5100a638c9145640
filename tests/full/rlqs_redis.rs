//! RLQS replicas sharing one real redis-server (one replica's RLQS is the fast tier's
//! `tests/it/rlqs.rs`; through a real Envoy, `rlqs_e2e.rs`).
use std::time::Duration;

use cellrate::server::Settings;

use crate::common::rlqs::{bucket, config, report, served, token_bucket, Stream};
use crate::common::{http_get_async, sample};

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_redis_divide_a_limit_among_all_their_streams() {
    let mut redis = crate::common::redis_server::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 100);
    let on_redis = || Settings {
        rlqs: cellrate::service::rlqs::RlqsSettings {
            sync: Duration::from_millis(100),
            ..Default::default()
        },
        ..redis.settings()
    };
    let one = served(dir.path(), on_redis()).await;
    let two = served(dir.path(), on_redis()).await;
    let account = || bucket(&[("name", "api"), ("account", "7")]);
    let mut a = Stream::open(&one).await.unwrap();
    let mut b = Stream::open(&two).await.unwrap();
    a.send(report("edge", account(), 1, 0)).await;
    assert_eq!(token_bucket(&a.strategy().await).0, 100.0, "alone: all");
    // B reports to the other replica: once they have exchanged demand, A's share is pushed
    // down and B's first answer (or a push right after it) is the other half.
    b.send(report("edge", account(), 1, 0)).await;
    let mut rb = token_bucket(&b.strategy().await).0;
    let ra = token_bucket(&a.strategy().await).0;
    if rb + ra > 100.0 {
        rb = token_bucket(&b.strategy().await).0;
    }
    assert!(ra + rb <= 100.0, "{ra} + {rb}");
    assert!(ra >= 45.0 && rb >= 45.0, "{ra} {rb}");
    // With Redis gone, after three intervals each replica divides among its own: A gets
    // the whole limit back (pushed), with a sync failure counted.
    redis.kill();
    let back = token_bucket(&a.strategy().await).0;
    assert_eq!(back, 100.0);
    let metrics = http_get_async(one.metrics_addr, "/metrics").await.1;
    assert!(sample(
        &metrics,
        "cellrate_rlqs_refusals_total{reason=\"sync_failure\"}"
    )
    .is_some_and(|n| n >= 1.0));
}
