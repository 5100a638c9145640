//! Operations on a `cellrate serve` process: SIGHUP reloads, metrics over HTTP.

use std::time::Duration;

use crate::common::{http_get, item, sample, serve_with};
use cellrate::proto::v1 as pb;

fn defaults(burst: u64) -> String {
    format!("NewOrdersPerAccount: {{burst: {burst}, count: {burst}, period: 1h}}\n")
}

async fn burst(admin: &str) -> u64 {
    let mut client = pb::admin_client::AdminClient::connect(format!("http://{admin}"))
        .await
        .unwrap();
    let r = client
        .inspect(pb::InspectRequest {
            items: vec![item("NewOrdersPerAccount", "1", None)],
        })
        .await
        .unwrap();
    r.into_inner().items[0].limit.as_ref().unwrap().burst
}

#[tokio::test]
async fn sighup_reloads_when_watching_is_off() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("defaults.yaml"), defaults(5)).unwrap();
    let p = serve_with(
        dir.path(),
        &[
            "--watch-config",
            "false",
            "--reload-interval-seconds",
            "3600",
        ],
    );
    assert_eq!(burst(&p.admin).await, 5);
    std::fs::write(dir.path().join("defaults.yaml"), defaults(7)).unwrap();
    // Longer than the debounce: a watcher would have reloaded by now (a fixed wait on
    // purpose: the absence of a reload is what is tested).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        burst(&p.admin).await,
        5,
        "reloaded without SIGHUP although watching is off"
    );
    let status = std::process::Command::new("kill")
        .args(["-HUP", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let now = crate::common::poll_until(
        Duration::from_secs(2),
        async || burst(&p.admin).await,
        |&b| b == 7,
    )
    .await;
    assert_eq!(now, 7, "SIGHUP did not reload within 2 s");
    let metrics = http_get(&p.metrics, "/metrics").1;
    assert_eq!(
        sample(
            &metrics,
            "cellrate_config_reloads_total{result=\"success\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn metrics_listener_serves_metrics_health_and_readiness() {
    let p = crate::common::serve();
    let (status, body) = http_get(&p.metrics, "/metrics");
    assert_eq!(status, 200);
    assert!(
        body.contains("# TYPE cellrate_decisions_total counter")
            || body.contains("cellrate_config_info"),
        "{body}"
    );
    let (status, body) = http_get(&p.metrics, "/healthz");
    assert_eq!(status, 200);
    assert!(body.contains("\"config_version\""), "{body}");
    assert_eq!(http_get(&p.metrics, "/readyz").0, 200);
    assert_eq!(http_get(&p.metrics, "/nope").0, 404);
}

/// What `admin inspect` says is left of `id`'s budget on the process at `admin`.
pub async fn budget_left(admin: &str, id: &str) -> i64 {
    let mut client = pb::admin_client::AdminClient::connect(format!("http://{admin}"))
        .await
        .unwrap();
    let r = client
        .inspect(pb::InspectRequest {
            items: vec![item("Budget", id, None)],
        })
        .await
        .unwrap();
    r.into_inner().items[0].remaining
}

/// Spends `cost` of `id`'s budget on the process at `listen`.
pub async fn spend_budget(listen: &str, id: &str, cost: u64) {
    let mut client =
        pb::rate_limiter_client::RateLimiterClient::connect(format!("http://{listen}"))
            .await
            .unwrap();
    let r = client
        .check(pb::CheckRequest {
            items: vec![item("Budget", id, Some(cost))],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(r.into_inner().overall.unwrap().allowed);
}

pub fn metric(process: &crate::common::Process, series: &str) -> Option<f64> {
    let (_, text) = http_get(&process.metrics, "/metrics");
    sample(&text, series)
}

/// Stops `process` with SIGTERM and waits for its exit (successful).
pub fn terminate(mut process: crate::common::Process) {
    let pid = process.child.id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = process.child.try_wait().unwrap() {
            assert!(status.success(), "exit after SIGTERM: {status}");
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exit within 20 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `--snapshot-file`: a restarted process goes on where the stopped one left each bucket,
/// after a graceful stop and (with `--snapshot-interval-seconds`) after a crash; a damaged
/// file is ignored with its metric, and the process serves with empty buckets.
#[tokio::test]
async fn the_memory_store_survives_restarts_through_its_snapshot() {
    // 10 000 a month: a token comes back every 259 s, never during the test.
    let limits = crate::common::budget_limits();
    let config = limits.path().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("buckets.snapshot");
    // The test's idle client connections would hold each drain for its whole grace.
    let flags = [
        "--snapshot-file",
        file.to_str().unwrap(),
        "--grace-seconds",
        "1",
    ];

    let first = serve_with(config.as_ref(), &flags);
    assert_eq!(
        metric(
            &first,
            "cellrate_snapshot_ignored_total{reason=\"missing\"}"
        ),
        Some(1.0),
        "a first start has no file"
    );
    spend_budget(&first.listen, "key-1", 300).await;
    spend_budget(&first.listen, "key-2", 7).await;
    assert_eq!(budget_left(&first.admin, "key-1").await, 9_700);
    terminate(first);
    assert!(file.exists(), "no snapshot written at shutdown");

    // Restarted: the same buckets.
    let second = serve_with(config.as_ref(), &flags);
    assert_eq!(
        metric(&second, "cellrate_snapshot_restored_buckets"),
        Some(2.0)
    );
    assert_eq!(budget_left(&second.admin, "key-1").await, 9_700);
    assert_eq!(budget_left(&second.admin, "key-2").await, 9_993);
    spend_budget(&second.listen, "key-1", 1).await;
    assert_eq!(budget_left(&second.admin, "key-1").await, 9_699);
    terminate(second);

    // A crash: with an interval, what was written before it is restored.
    let interval = [
        "--snapshot-file",
        file.to_str().unwrap(),
        "--snapshot-interval-seconds",
        "1",
    ];
    let mut third = serve_with(config.as_ref(), &interval);
    spend_budget(&third.listen, "key-3", 50).await;
    let written = crate::common::poll_until(
        Duration::from_secs(10),
        async || metric(&third, "cellrate_snapshot_writes_total{result=\"ok\"}"),
        |w| w.is_some_and(|w| w >= 1.0),
    )
    .await;
    assert!(written.is_some_and(|w| w >= 1.0), "no periodic write");
    third.child.kill().unwrap();
    third.child.wait().unwrap();
    let fourth = serve_with(config.as_ref(), &flags);
    assert_eq!(budget_left(&fourth.admin, "key-3").await, 9_950);
    assert_eq!(budget_left(&fourth.admin, "key-1").await, 9_699);
    terminate(fourth);

    // A damaged file (one byte changed): ignored with its reason, the server starts empty.
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 20;
    bytes[last] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();
    let fifth = serve_with(config.as_ref(), &flags);
    assert_eq!(
        metric(
            &fifth,
            "cellrate_snapshot_ignored_total{reason=\"corrupt\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&fifth, "cellrate_snapshot_restored_buckets"),
        Some(0.0)
    );
    assert_eq!(budget_left(&fifth.admin, "key-1").await, 10_000);
    terminate(fifth);
    // Garbage of another kind: the same.
    std::fs::write(&file, b"REDIS0011 not ours").unwrap();
    let sixth = serve_with(config.as_ref(), &flags);
    assert_eq!(
        metric(
            &sixth,
            "cellrate_snapshot_ignored_total{reason=\"foreign\"}"
        ),
        Some(1.0)
    );
    terminate(sixth);
}
