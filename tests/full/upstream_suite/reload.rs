//! Upstream's testConfigReload (TestBasicReloadConfig's ReloadWithoutWatchRoot; the xDS
//! one is in `xds.rs`) and TestShareThreshold, on one Redis.

use super::base::{response, start_all, upstream_runtime, Upstream, Variant, RELOAD};
use crate::common::ratelimit_answers::{request, status};
use crate::common::redis_server::RedisServer;
use crate::common::{http_get_async, sample};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use std::future::Future;
use std::time::{Duration, Instant};

/// What upstream's `config_load_success` counts here: a series of cellrate's metrics.
pub const FILE_LOADS: &str = "cellrate_config_reloads_total{result=\"success\"}";

/// The series `loads` as `u` exports it now (0 when not there yet).
pub async fn read(u: &Upstream, loads: &str) -> f64 {
    let addr = u.serving.metrics.parse().unwrap();
    let (_, text) = http_get_async(addr, "/metrics").await;
    sample(&text, loads).unwrap_or(0.0)
}

/// Upstream's waitForConfigReload: polls `loads` until it passes `before` (upstream: once a
/// second for at most 120 s; here every 50 ms for at most 20 s).
pub async fn wait_for_config_reload(u: &Upstream, loads: &str, before: f64) -> (f64, bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let after = read(u, loads).await;
        if after > before || Instant::now() > deadline {
            return (after, after > before);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// testConfigReload's assertions: `reload` unknown, then (after `reload_config`, seen in
/// `loads`) known with key1's 50 a second; after `restore`, `loads` counts again.
pub async fn test_config_reload<R, S>(u: &Upstream, loads: &str, reload_config: R, restore: S)
where
    R: Future<Output = ()>,
    S: Future<Output = ()>,
{
    let name = &u.variant.name;
    let mut c = u.client().await;
    let block = request("reload", &[&[(&u.variant.key("block"), "foo")]]);
    let r = c.should_rate_limit(block).await.unwrap().into_inner();
    let unknown = DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    };
    assert_eq!(r, response(Code::Ok, vec![unknown]), "{name}: before");
    let before = read(u, loads).await;

    reload_config.await;
    let (after, reloaded) = wait_for_config_reload(u, loads, before).await;
    assert!(reloaded, "{name}: reloaded ({before} then {after})");
    assert!(after > before);

    let key1 = super::base::unique("foo", &u.variant);
    let r = request("reload", &[&[(&u.variant.key("key1"), &key1)]]);
    let r = c.should_rate_limit(r).await.unwrap().into_inner();
    let want = status(Code::Ok, 50, Unit::Second, 49, &r.statuses[0]);
    assert_eq!(r, response(Code::Ok, vec![want]), "{name}: after");

    restore.await;
    let before = after;
    let (after, reloaded) = wait_for_config_reload(u, loads, before).await;
    assert!(
        reloaded,
        "{name}: the removal reloaded ({before} then {after})"
    );
    assert!(after > before);
}

#[tokio::test]
async fn test_basic_reload_config_and_share_threshold() {
    let redis = RedisServer::start();
    let url = format!("127.0.0.1:{}", redis.port);
    let base = [("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", url.as_str())];
    let reload = Variant::new(
        "TestBasicReloadConfig/ReloadWithoutWatchRoot",
        &[],
        &[("RUNTIME_WATCH_ROOT", "false")],
    );
    let share = Variant::new("TestShareThreshold/WithoutPerSecondRedis", &[], &[]);
    // Each its own runtime: the reload case writes into its directory.
    let (reload_root, share_root) = (upstream_runtime(), upstream_runtime());
    let (reloading, sharing) = std::thread::scope(|s| {
        let one = s.spawn(|| start_all(reload_root.path(), &base, &[reload]));
        let two = s.spawn(|| start_all(share_root.path(), &base, &[share]));
        (one.join().unwrap(), two.join().unwrap())
    });
    let file = reload_root
        .path()
        .join("current/ratelimit/config/reload.yaml");
    let reloading = test_config_reload(
        &reloading[0],
        FILE_LOADS,
        async { std::fs::write(&file, RELOAD).unwrap() },
        async { std::fs::remove_file(&file).unwrap() },
    );
    tokio::join!(reloading, test_share_threshold(&sharing[0]));
}

/// testShareThreshold: `files/*` with share_threshold counts every matching value in one
/// bucket; `files_no_share/*` counts each value apart.
async fn test_share_threshold(u: &Upstream) {
    let mut c = u.client().await;
    let domain = "share-threshold-test";
    // The eleven requests in one hour window.
    super::base::clear_of_a_window_end(3_600, 5).await;
    for i in 0..10 {
        let r = request(domain, &[&[("files", "files/a.pdf")]]);
        let r = c.should_rate_limit(r).await.unwrap().into_inner();
        let ok_or_over = [Code::Ok as i32, Code::OverLimit as i32];
        assert!(ok_or_over.contains(&r.overall_code), "request {i}: {r:?}");
    }
    let r = request(domain, &[&[("files", "files/b.csv")]]);
    let r = c.should_rate_limit(r).await.unwrap().into_inner();
    let want = status(Code::OverLimit, 10, Unit::Hour, 0, &r.statuses[0]);
    assert_eq!(r, response(Code::OverLimit, vec![want]), "files/b.csv");

    let base = super::base::unique("files_no_share", &u.variant);
    for i in 0..10 {
        let value = format!("files_no_share/{base}-{i}");
        let r = request(domain, &[&[("files_no_share", &value)]]);
        let r = c.should_rate_limit(r).await.unwrap().into_inner();
        let want = status(Code::Ok, 10, Unit::Hour, 9, &r.statuses[0]);
        assert_eq!(r, response(Code::Ok, vec![want]), "{value}");
    }
}
