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
