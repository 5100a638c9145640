//! Run as `ratelimit`, envoyproxy/ratelimit's configuration and statistics variables do
//! what they do there: `PROMETHEUS_PATH` moves the metrics,
//! `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` keeps `/healthcheck` failing until limits are
//! loaded. Through a real process and a real HTTP client.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{http_get, stderr_lines};

/// The binary run as `ratelimit` over `root` (limits in `root/config`) with `vars`; the
/// child and the `cellrate serving` line's fields.
fn serve_as_ratelimit(root: &Path, vars: &[(&str, &str)]) -> (Killed, serde_json::Value) {
    let bin = root.join("ratelimit");
    if !bin.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cellrate"), &bin).unwrap();
    }
    let mut child = Command::new(&bin)
        .env_clear()
        .env("RUNTIME_ROOT", root)
        .env("BACKEND_TYPE", "memory")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("LOG_FORMAT", "json")
        .env("CELLRATE_ADMIN_LISTEN", "127.0.0.1:0")
        .envs(vars.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = stderr_lines(&mut child);
    let child = Killed(child);
    let mut seen = Vec::new();
    for line in (0..1_000).map_while(|_| lines.recv_timeout(Duration::from_secs(10)).ok()) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["fields"]["message"] == "cellrate serving" {
            return (child, v["fields"].clone());
        }
        seen.push(line);
    }
    panic!("no serving line: {seen:#?}");
}

/// A limits directory `root/config` with `files`.
fn limits(files: &[(&str, &str)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("config")).unwrap();
    for (name, text) in files {
        std::fs::write(root.path().join("config").join(name), text).unwrap();
    }
    root
}

const RL: &str = "domain: rl\ndescriptors:\n  - key: foo\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

#[test]
fn prometheus_path_moves_the_metrics_as_upstream() {
    let root = limits(&[("rl.yaml", RL)]);
    let vars = [
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
        ("PROMETHEUS_PATH", "/stats/prometheus"),
    ];
    let (_child, serving) = serve_as_ratelimit(root.path(), &vars);
    let metrics = serving["metrics"].as_str().unwrap();
    let (status, body) = http_get(metrics, "/stats/prometheus");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("cellrate_config_info{"), "{body}");
    assert_eq!(http_get(metrics, "/metrics").0, 404);
    // The probes stay where they were.
    assert_eq!(
        http_get(serving["health"].as_str().unwrap(), "/healthcheck").0,
        200
    );
}

/// `/healthcheck` at `addr`'s status, polled every 50 ms until it is `want` (at most 10 s).
fn healthcheck_becomes(addr: &str, want: u16) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = http_get(addr, "/healthcheck").0;
        if status == want || Instant::now() > deadline {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// As upstream's health checker: unhealthy (500) while the limits in force hold no
/// domain, healthy once a load holds one, unhealthy again when a reload holds none.
/// Without the variable, an empty directory is healthy, as there.
#[test]
fn healthy_with_at_least_one_config_loaded_waits_for_a_domain() {
    let root = limits(&[]);
    let (_plain, serving) = serve_as_ratelimit(root.path(), &[]);
    let plain = serving["metrics"].as_str().unwrap().to_string();
    assert_eq!(http_get(&plain, "/healthcheck").0, 200);

    let vars = [("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")];
    let (_child, serving) = serve_as_ratelimit(root.path(), &vars);
    let health = serving["metrics"].as_str().unwrap();
    assert_eq!(http_get(health, "/healthcheck").0, 500);
    assert_eq!(http_get(health, "/readyz").0, 503);
    let file = root.path().join("config/rl.yaml");
    std::fs::write(&file, RL).unwrap();
    assert_eq!(healthcheck_becomes(health, 200), 200, "a domain loaded");
    assert_eq!(http_get(health, "/readyz").0, 200);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(healthcheck_becomes(health, 500), 500, "no domain left");
}

/// Kills the child when the test ends, passed or not.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
