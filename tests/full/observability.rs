//! What operators watch: trace ids in the log lines of denied and failed decisions.

use std::path::Path;
use std::time::{Duration, Instant};

use cellrate::proto::v1 as pb;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::Value;

use crate::common::{envoy_request, item, serve_logging, Process};

fn example_config() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"))
}

/// A W3C `traceparent` whose trace id ends in `n` (two hex digits).
fn traceparent(n: u8) -> String {
    format!("00-4bf92f3577b34da6a3ce929d0e0e47{n:02x}-00f067aa0ba902b7-01")
}

fn trace_id(n: u8) -> String {
    format!("4bf92f3577b34da6a3ce929d0e0e47{n:02x}")
}

fn with_ids<T>(message: T, traceparent: &str, request_id: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    request
        .metadata_mut()
        .insert("x-request-id", request_id.parse().unwrap());
    request
}

/// A native `Check` of a limit name that is not configured (INVALID_ARGUMENT), with ids.
async fn failed_check(
    native: &mut pb::rate_limiter_client::RateLimiterClient<tonic::transport::Channel>,
    traceparent: &str,
    request_id: &str,
) {
    let request = pb::CheckRequest {
        items: vec![item("NoSuchLimit", "x", None)],
        ..Default::default()
    };
    let e = native
        .check(with_ids(request, traceparent, request_id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}

/// Reads `process`'s JSON log lines until one has `message` and the trace id `trace`
/// (bounded: 10 s); returns that line's fields, and every line read on the way.
fn find_line(process: &Process, message: &str, trace: &str) -> (Option<Value>, Vec<Value>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(line) = process.logs.recv_timeout(left) else {
            break;
        };
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let fields = v["fields"].clone();
        if fields["message"] == message && fields["trace_id"] == trace {
            return (Some(fields), seen);
        }
        seen.push(fields);
    }
    (None, seen)
}

#[tokio::test]
async fn decisions_log_the_callers_trace_ids_at_debug() {
    let server = serve_logging(example_config(), &[], "info,cellrate::service::trace=debug");
    let addr = format!("http://{}", server.listen);
    let mut envoy = RateLimitServiceClient::connect(addr.clone()).await.unwrap();
    let mut native = pb::rate_limiter_client::RateLimiterClient::connect(addr)
        .await
        .unwrap();

    // An allowed decision logs its line too (#60: LOG_LEVEL=debug shows every decision).
    envoy
        .should_rate_limit(with_ids(
            envoy_request("edge", &[&[("api_key", "key-fine")]]),
            &traceparent(1),
            "req-allowed",
        ))
        .await
        .unwrap();
    // A deny-listed key, through Envoy's API.
    let r = envoy
        .should_rate_limit(with_ids(
            envoy_request("edge", &[&[("api_key", "key-revoked-0001")]]),
            &traceparent(2),
            "req-envoy-denied",
        ))
        .await
        .unwrap();
    assert_eq!(r.into_inner().overall_code, 2, "OVER_LIMIT");
    let (line, before) = find_line(&server, "decision: denied", &trace_id(2));
    let line = line.expect("a debug line for the denied Envoy request");
    assert_eq!(line["api"], "envoy");
    assert_eq!(line["span_id"], "00f067aa0ba902b7");
    assert_eq!(line["request_id"], "req-envoy-denied");
    assert_eq!(line["limit"], "ApiRequestsPerKey");
    assert_eq!(line["id"], "\"key-revoked-0001\"");
    assert_eq!(line["deny_listed"], true);
    let allowed = before.iter().find(|f| f["trace_id"] == trace_id(1));
    let allowed = allowed.unwrap_or_else(|| panic!("no line for the allowed request: {before:?}"));
    assert_eq!(allowed["message"], "decision: allowed");
    assert_eq!(allowed["request_id"], "req-allowed");
    assert_eq!(allowed["limit"], "ApiRequestsPerKey");
    assert_eq!(allowed["id"], "\"key-fine\"");

    // A limit run out, through the native API: 10 allowed, the 11th denied.
    for _ in 0..10 {
        let r = native
            .check(pb::CheckRequest {
                items: vec![item("ApiRequestsPerKey", "key-busy", None)],
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(r.into_inner().overall.unwrap().allowed);
    }
    let r = native
        .check(with_ids(
            pb::CheckRequest {
                items: vec![item("ApiRequestsPerKey", "key-busy", None)],
                ..Default::default()
            },
            &traceparent(3),
            "req-native-denied",
        ))
        .await
        .unwrap();
    assert!(!r.into_inner().overall.unwrap().allowed);
    let (line, _) = find_line(&server, "decision: denied", &trace_id(3));
    let line = line.expect("a debug line for the denied native request");
    assert_eq!(line["api"], "native");
    assert_eq!(line["request_id"], "req-native-denied");
    assert_eq!(line["deny_listed"], false);
    assert!(line["retry_in_ms"].as_u64().unwrap() > 0);

    // A failed decision: an unknown limit name is INVALID_ARGUMENT.
    failed_check(&mut native, &traceparent(4), "req-failed").await;
    let (line, seen) = find_line(&server, "decision: failed", &trace_id(4));
    let line = line.unwrap_or_else(|| panic!("a debug line for the failed request: {seen:?}"));
    assert_eq!(line["code"], "InvalidArgument");
    assert!(line["error"].as_str().unwrap().contains("NoSuchLimit"));

    // The attacker's headers: a traceparent not in the W3C form and a request id with a
    // quote are left out of the line, which is still written (with a valid trace id from
    // the next request to find it by, the ids are tested one at a time).
    failed_check(&mut native, &traceparent(5).to_uppercase(), "req-ok").await;
    failed_check(&mut native, &traceparent(6), "req\"forged").await;
    let (line, before) = find_line(&server, "decision: failed", &trace_id(6));
    let line = line.expect("a debug line for the request with a forged id");
    assert!(line.get("request_id").is_none(), "{line}");
    let malformed = before
        .iter()
        .find(|f| f["message"] == "decision: failed" && f["request_id"] == "req-ok")
        .expect("the request with a malformed traceparent was logged");
    assert!(malformed.get("trace_id").is_none(), "{malformed}");
    assert!(malformed.get("span_id").is_none(), "{malformed}");
}

#[tokio::test]
async fn at_info_level_decisions_are_not_logged() {
    let server = serve_logging(example_config(), &[], "info");
    let addr = format!("http://{}", server.listen);
    let mut native = pb::rate_limiter_client::RateLimiterClient::connect(addr)
        .await
        .unwrap();
    failed_check(&mut native, &traceparent(7), "req-quiet").await;
    // Give the line time to arrive if it were written.
    let deadline = Instant::now() + Duration::from_millis(500);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        if let Ok(line) = server.logs.recv_timeout(left) {
            assert!(!line.contains("req-quiet"), "logged at info: {line}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The dashboard and the alerts, with Debian's prometheus and promtool (the test command
// installs them).

const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/helm/cellrate/rules/cellrate.rules.yaml"
);

/// Runs `tool` with `args` (and `stdin`), returning (success, stdout + stderr).
fn run_tool(tool: &str, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(tool)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{tool} does not run ({e}): scripts/test.sh installs Debian's prometheus")
        });
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    let (ok, out) = run_tool("promtool", &["check", "rules", RULES], None);
    assert!(ok, "promtool check rules: {out}");
    assert!(out.contains("SUCCESS: 9 rules found"), "{out}");
    let (ok, out) = run_tool(
        "promtool",
        &["test", "rules", "tests/prometheus/cellrate.rules.test.yaml"],
        None,
    );
    assert!(ok, "promtool test rules: {out}");
    // Every alert has a test that fires it.
    let tests = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/prometheus/cellrate.rules.test.yaml"),
    )
    .unwrap();
    let rules = std::fs::read_to_string(RULES).unwrap();
    for alert in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        assert!(
            tests.contains(&format!(
                "alertname: {alert}\n        exp_alerts:\n          - "
            )),
            "no test fires {alert}"
        );
    }
}

/// A Prometheus server on loopback with its own storage, killed when dropped.
pub(crate) struct Prometheus {
    child: std::process::Child,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes `target` every second under job `cellrate`, evaluating the shipped rules
    /// every second; returns once it answers ready (at most 30 s).
    pub(crate) fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 rule_files: [{RULES:?}]\n\
                 scrape_configs:\n  - job_name: cellrate\n    static_configs: [{{targets: [{target:?}]}}]\n"
            ),
        )
        .unwrap();
        let child = std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("prometheus runs (scripts/test.sh installs Debian's prometheus)");
        let mut prometheus = Prometheus {
            child,
            addr,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while prometheus.get("/-/ready").map(|(s, _)| s) != Some(200) {
            if let Ok(Some(status)) = prometheus.child.try_wait() {
                panic!("prometheus exited ({status}); check its configuration: {config:?}");
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        prometheus
    }

    /// A GET on Prometheus's HTTP API: (status, body), or None if it does not answer.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut stream =
            std::net::TcpStream::connect_timeout(&self.addr, Duration::from_secs(2)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let status = response.split(' ').nth(1)?.parse().ok()?;
        Some((status, response.split_once("\r\n\r\n")?.1.to_string()))
    }

    /// The instant result of `query`: its samples' label sets and values.
    pub(crate) fn query(&self, query: &str) -> Vec<(Value, f64)> {
        let (status, body) = self
            .get(&format!("/api/v1/query?query={}", url_encode(query)))
            .expect("prometheus answers");
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(status, 200, "{query}: {body}");
        assert_eq!(v["status"], "success", "{query}: {body}");
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let value = s["value"][1].as_str().unwrap().parse::<f64>().unwrap();
                (s["metric"].clone(), value)
            })
            .collect()
    }

    /// The single value of `query`, polled every 200 ms until `done` (at most 20 s).
    pub(crate) fn value_when(&self, query: &str, done: impl Fn(f64) -> bool) -> Option<f64> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let value = self.query(query).first().map(|(_, v)| *v);
            if value.is_some_and(&done) || Instant::now() > deadline {
                return value;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Each alerting rule's state (inactive, pending, firing) and health.
    fn alert_states(&self) -> std::collections::BTreeMap<String, (String, String)> {
        let (_, body) = self.get("/api/v1/rules?type=alert").expect("rules");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .map(|r| {
                (
                    r["name"].as_str().unwrap().to_string(),
                    (
                        r["state"].as_str().unwrap().to_string(),
                        r["health"].as_str().unwrap().to_string(),
                    ),
                )
            })
            .collect()
    }
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every query of the shipped dashboard, with Grafana's variables given values: (panel
/// title, query).
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("helm/cellrate/dashboards/cellrate.json"),
    )
    .unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
                .replace("$__range", "5m")
                .replace("$job", ".*");
            assert!(!expr.contains('$'), "a variable left in {expr}");
            queries.push((panel["title"].as_str().unwrap().to_string(), expr));
        }
    }
    queries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_cellrate_and_every_dashboard_query_returns_data() {
    // A copy of the example limits, so that a reload can be made to fail.
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(example_config()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let version = cellrate::limits::config::LimitTable::load_dir(dir.path())
        .unwrap()
        .version()
        .to_string();
    let server = serve_logging(dir.path(), &["--reload-debounce-ms", "50"], "info");
    let prometheus = tokio::task::block_in_place(|| Prometheus::start(&server.metrics));
    // A scrape before the traffic, so that rates and increases have a start.
    let scraped =
        tokio::task::block_in_place(|| prometheus.value_when("up{job=\"cellrate\"}", |v| v == 1.0));
    assert_eq!(scraped, Some(1.0), "prometheus scrapes cellrate");

    // The traffic: NewOrdersPerAccount (burst 300) spent 100 at a time through the native
    // API, three allowed and two denied, then once more through Envoy's (denied); an
    // Envoy descriptor no rule matches; a malformed native call.
    let addr = format!("http://{}", server.listen);
    let mut native = pb::rate_limiter_client::RateLimiterClient::connect(addr.clone())
        .await
        .unwrap();
    let mut envoy = RateLimitServiceClient::connect(addr).await.unwrap();
    let mut allowed = 0;
    for _ in 0..5 {
        let r = native
            .check(pb::CheckRequest {
                items: vec![item("NewOrdersPerAccount", "1001", Some(100))],
                ..Default::default()
            })
            .await
            .unwrap();
        allowed += u32::from(r.into_inner().overall.unwrap().allowed);
    }
    assert_eq!(allowed, 3);
    let r = envoy
        .should_rate_limit(envoy_request("edge", &[&[("NewOrdersPerAccount", "1001")]]))
        .await
        .unwrap();
    assert_eq!(r.into_inner().overall_code, 2, "OVER_LIMIT");
    envoy
        .should_rate_limit(envoy_request("edge", &[&[("no_rule_for_this", "x")]]))
        .await
        .unwrap();
    failed_check(&mut native, &traceparent(9), "req-invalid").await;
    // A failed reload: the previous limits stay in force.
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "NewOrdersPerAccount: [broken\n",
    )
    .unwrap();

    tokio::task::block_in_place(|| {
        // Named values equal what the traffic produced, once scraped.
        let exact = |query: &str, want: f64| {
            let got = prometheus.value_when(query, |v| v == want);
            assert_eq!(got, Some(want), "{query}");
        };
        exact(
            "sum(cellrate_decisions_total{limit=\"NewOrdersPerAccount\",result=\"denied\"})",
            3.0,
        );
        exact(
            "sum(cellrate_decisions_total{limit=\"NewOrdersPerAccount\",result=\"allowed\"})",
            3.0,
        );
        exact(
            "sum(cellrate_decisions_total{api=\"envoy\",limit=\"NewOrdersPerAccount\",result=\"denied\"})",
            1.0,
        );
        exact("sum(cellrate_decisions_total{result=\"unmatched\"})", 1.0);
        exact(
            "sum(cellrate_rpc_requests_total{rpc=\"Check\",code=\"INVALID_ARGUMENT\"})",
            1.0,
        );
        exact("min(cellrate_config_last_reload_successful)", 0.0);
        let failures = prometheus.value_when(
            "sum(cellrate_config_reloads_total{result=\"failure\"})",
            |v| v >= 1.0,
        );
        assert!(
            failures >= Some(1.0),
            "the failed reload is counted: {failures:?}"
        );
        // The version in force is still the one loaded at start.
        let versions =
            prometheus.query("max by (instance, version) (cellrate_config_info{job=~\".*\"} == 1)");
        assert_eq!(versions.len(), 1, "{versions:?}");
        assert_eq!(versions[0].0["version"], version.as_str());
        // Every panel's every query returns data (rates once two scrapes followed the
        // traffic: each query is polled until it has data, at most 20 s in all).
        let queries = dashboard_queries();
        assert!(queries.len() >= 20, "{} queries", queries.len());
        let deadline = Instant::now() + Duration::from_secs(20);
        for (panel, query) in &queries {
            let result = loop {
                let result = prometheus.query(query);
                if !result.is_empty() || Instant::now() > deadline {
                    break result;
                }
                std::thread::sleep(Duration::from_millis(200));
            };
            assert!(!result.is_empty(), "panel {panel:?}: no data from {query}");
        }
        // And the panels that name the traffic show it.
        let top = prometheus.query(
            "topk(10, sum by (limit) (increase(cellrate_decisions_total{job=~\".*\",result=\"denied\"}[5m])))",
        );
        assert_eq!(top[0].0["limit"], "NewOrdersPerAccount", "{top:?}");

        // The rules evaluate against the real series: the reload alert is pending (it
        // fires after 5 minutes), the others are quiet, none has an evaluation error.
        let deadline = Instant::now() + Duration::from_secs(20);
        let states = loop {
            let states = prometheus.alert_states();
            let pending = states
                .get("CellrateReloadFailing")
                .is_some_and(|(state, _)| state == "pending");
            if pending || Instant::now() > deadline {
                break states;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(states.len(), 9, "{states:?}");
        assert_eq!(states["CellrateReloadFailing"].0, "pending", "{states:?}");
        for (alert, (state, health)) in &states {
            assert_eq!(health, "ok", "{alert} does not evaluate: {states:?}");
            if [
                "CellrateStoreErrors",
                "CellrateBreakerOpen",
                "CellrateUnavailable",
                "CellrateBucketsNearBound",
                "CellrateTargetDown",
                "CellrateNotScraped",
            ]
            .contains(&alert.as_str())
            {
                assert_eq!(state, "inactive", "{alert}: {states:?}");
            }
        }
    });

    // promtool's naming conventions hold for everything cellrate exports.
    let (_, metrics) =
        crate::common::http_get_async(server.metrics.parse().unwrap(), "/metrics").await;
    assert!(metrics.contains("cellrate_decisions_total"));
    let (ok, out) = run_tool("promtool", &["check", "metrics"], Some(&metrics));
    assert!(ok && out.trim().is_empty(), "promtool check metrics: {out}");
}

/// The HTTP connection manager of an Envoy config.
fn connection_manager(config: &mut serde_yaml_ng::Value) -> &mut serde_yaml_ng::Mapping {
    fn find(value: &mut serde_yaml_ng::Value) -> Option<&mut serde_yaml_ng::Mapping> {
        match value {
            serde_yaml_ng::Value::Mapping(map) => {
                let is_hcm = map
                    .get("@type")
                    .and_then(serde_yaml_ng::Value::as_str)
                    .is_some_and(|t| {
                        t.ends_with("http_connection_manager.v3.HttpConnectionManager")
                    });
                if is_hcm {
                    return Some(map);
                }
                map.values_mut().find_map(find)
            }
            serde_yaml_ng::Value::Sequence(list) => list.iter_mut().find_map(find),
            _ => None,
        }
    }
    find(config).expect("the config has an HTTP connection manager")
}

/// What the issue asks for: one Envoy request followed into cellrate's log. A real Envoy
/// with its OpenTelemetry tracer (exporting to cellrate's port, which answers UNIMPLEMENTED:
/// Envoy insists on an exporter, and nothing may leave loopback) continues the
/// client's W3C trace and sends its own span's `traceparent` on the rate-limit call;
/// cellrate's debug line for the denial carries the client's trace id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_through_a_real_envoy_is_found_in_the_log_by_its_trace_id() {
    use crate::common::envoy::{yaml, Envoy};

    let server = serve_logging(example_config(), &[], "info,cellrate::service::trace=debug");
    let envoy = Envoy::example(server.listen.parse().unwrap(), |config| {
        connection_manager(config).insert(
            "tracing".into(),
            yaml(
                "provider:\n  name: envoy.tracers.opentelemetry\n  typed_config:\n    \
                 \"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig\n    \
                 service_name: edge\n    \
                 grpc_service: {envoy_grpc: {cluster_name: cellrate}, timeout: 1s}\n",
            ),
        );
    })
    .await;
    let mut client = envoy.client().await;
    let client_span = "00f067aa0ba902b7";
    let reply = client
        .get(
            "/api/items",
            &[
                ("x-api-key", "key-revoked-0001"),
                (
                    "traceparent",
                    &format!("00-{}-{client_span}-01", trace_id(7)),
                ),
            ],
        )
        .await;
    assert_eq!(reply.status, 429, "the deny-listed key is refused");

    let (line, seen) = find_line(&server, "decision: denied", &trace_id(7));
    let line = line.unwrap_or_else(|| panic!("no denied line with the trace id: {seen:?}"));
    assert_eq!(line["api"], "envoy");
    assert_eq!(line["limit"], "ApiRequestsPerKey");
    assert_eq!(line["deny_listed"], true);
    // The parent is Envoy's span for the rate-limit call, a child of the client's.
    let span = line["span_id"].as_str().expect("a span id");
    assert_eq!(span.len(), 16);
    assert_ne!(span, client_span, "Envoy's own span, not the client's");
}
