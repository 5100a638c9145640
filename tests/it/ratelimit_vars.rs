//! Run as `ratelimit`, envoyproxy/ratelimit's configuration and statistics variables do
//! what they do there: `PROMETHEUS_PATH` moves the metrics,
//! `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` keeps `/healthcheck` and gRPC health's
//! `ratelimit` failing until limits are loaded, `QUOTA_MODE` puts every descriptor in quota mode, `MERGE_DOMAIN_CONFIG` merges
//! the files of one domain, `EXTRA_TAGS`, `NEAR_LIMIT_RATIO` and `DISABLE_STATS` shape the
//! statistics, and hostile values cannot grow or forge upstream's mapped series. Through a
//! real process and real HTTP and gRPC clients.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::ratelimit_answers::{client, ratelimit_at, request, runtime, start, Running};
use crate::common::{grpc_health, http_get};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic_health::pb::health_check_response::ServingStatus;

/// The binary run as `ratelimit` over `root` (limits in `root/config`) with `vars`; the
/// child and the `cellrate serving` line's fields.
fn serve_as_ratelimit(root: &Path, vars: &[(&str, &str)]) -> (Running, serde_json::Value) {
    let admin = [("CELLRATE_ADMIN_LISTEN", "127.0.0.1:0")];
    let (child, serving, _) = ratelimit_at(root, &[&admin[..], vars].concat());
    (child, serving)
}

/// A limits directory `root/config` with `files`.
fn config_root(files: &[(&str, &str)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("config")).unwrap();
    for (name, text) in files {
        std::fs::write(root.path().join("config").join(name), text).unwrap();
    }
    root
}

const RL: &str = "domain: rl\ndescriptors:\n  - key: foo\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

/// PROMETHEUS_PATH moves the metrics; EXTRA_TAGS labels every series.
#[test]
fn prometheus_path_moves_the_metrics_as_upstream() {
    let root = config_root(&[("rl.yaml", RL)]);
    let vars = [
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
        ("PROMETHEUS_PATH", "/stats/prometheus"),
        ("EXTRA_TAGS", "env:prod,cluster:eu-1"),
    ];
    let (_child, serving) = serve_as_ratelimit(root.path(), &vars);
    let metrics = serving["metrics"].as_str().unwrap();
    let (status, body) = http_get(metrics, "/stats/prometheus");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("cellrate_config_info{"), "{body}");
    // EXTRA_TAGS: on every series.
    let samples: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(samples.len() > 20, "{body}");
    for sample in samples {
        assert!(sample.contains("env=\"prod\""), "{sample}");
        assert!(sample.contains("cluster=\"eu-1\""), "{sample}");
    }
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
    let root = config_root(&[]);
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

/// `ratelimit`'s gRPC health at `listen`, polled every 50 ms until it is `want` (at most
/// 10 s).
async fn ratelimit_health_becomes(listen: &str, want: ServingStatus) -> ServingStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = grpc_health(listen, "ratelimit").await.unwrap();
        if status == want || Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// As upstream's health checker registers it: the gRPC health service answers for
/// `ratelimit`, SERVING with limits; with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED,
/// NOT_SERVING while no domain is loaded and SERVING once one is, as `/healthcheck`. The
/// server as a whole ("") is SERVING throughout, as there; a name nobody registered is
/// NOT_FOUND.
#[tokio::test]
async fn grpc_health_answers_for_ratelimit_as_upstream() {
    let (serving, not_serving) = (ServingStatus::Serving, ServingStatus::NotServing);
    let root = config_root(&[("rl.yaml", RL)]);
    let (_plain, fields) = serve_as_ratelimit(root.path(), &[]);
    let listen = fields["listen"].as_str().unwrap();
    assert_eq!(grpc_health(listen, "ratelimit").await, Ok(serving));
    assert_eq!(grpc_health(listen, "").await, Ok(serving));
    for unknown in ["ratelimit.v3", "RATELIMIT", "x"] {
        let answer = grpc_health(listen, unknown).await;
        assert_eq!(answer, Err(tonic::Code::NotFound), "{unknown}");
    }

    let root = config_root(&[]);
    let vars = [("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")];
    let (_child, fields) = serve_as_ratelimit(root.path(), &vars);
    let listen = fields["listen"].as_str().unwrap();
    let health = fields["metrics"].as_str().unwrap();
    assert_eq!(grpc_health(listen, "ratelimit").await, Ok(not_serving));
    assert_eq!(grpc_health(listen, "").await, Ok(serving));
    let file = root.path().join("config/rl.yaml");
    std::fs::write(&file, RL).unwrap();
    assert_eq!(ratelimit_health_becomes(listen, serving).await, serving);
    assert_eq!(http_get(health, "/healthcheck").0, 200);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(
        ratelimit_health_becomes(listen, not_serving).await,
        not_serving
    );
    assert_eq!(http_get(health, "/healthcheck").0, 500);
}

/// Limits with no `quota_mode` of their own.
const QUOTA: &str = "
domain: quota-domain
descriptors:
  - key: foo
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: hello
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: free
    rate_limit: {unlimited: true}
";

/// The overall code and each status's code of `descriptors` asked of `c`.
async fn codes(
    c: &mut RateLimitServiceClient<tonic::transport::Channel>,
    descriptors: &[&[(&str, &str)]],
) -> (Code, Vec<Code>) {
    let answer = c
        .should_rate_limit(request("quota-domain", descriptors))
        .await
        .unwrap()
        .into_inner();
    let code = |c: i32| Code::try_from(c).unwrap();
    let statuses = answer.statuses.iter().map(|s| code(s.code)).collect();
    (code(answer.overall_code), statuses)
}

/// Upstream's global QUOTA_MODE (TestServiceGlobalQuotaMode and its service code): every
/// descriptor but an unlimited one is in quota mode, so a request is OVER_LIMIT only
/// when all of them are over; a descriptor over its limit keeps its OVER_LIMIT status.
/// An unmatched descriptor is never over, so it keeps the request OK. Without the
/// variable, one descriptor over denies.
#[tokio::test]
async fn quota_mode_denies_only_when_every_descriptor_is_over() {
    let (ok, over) = (Code::Ok, Code::OverLimit);
    let foo: &[(&str, &str)] = &[("foo", "bar")];
    let hello: &[(&str, &str)] = &[("hello", "world")];
    let free: &[(&str, &str)] = &[("free", "x")];
    let unknown: &[(&str, &str)] = &[("unknown", "x")];
    for quota in [true, false] {
        let root = runtime(&[("quota.yaml", QUOTA)]);
        let mut vars = vec![("BACKEND_TYPE", "memory")];
        if quota {
            vars.push(("QUOTA_MODE", "true"));
        }
        let (_child, listen) = start(root.path(), &vars);
        let mut c = client(&listen).await;
        assert_eq!(codes(&mut c, &[foo]).await, (ok, vec![ok]));
        let foo_and_hello = codes(&mut c, &[foo, hello]).await;
        let foo_and_unknown = codes(&mut c, &[foo, unknown]).await;
        let foo_and_free = codes(&mut c, &[foo, free]).await;
        if quota {
            assert_eq!(foo_and_hello, (ok, vec![over, ok]));
            assert_eq!(foo_and_unknown, (ok, vec![over, ok]));
            // The unlimited descriptor is not a quota: foo is every quota, and over.
            assert_eq!(foo_and_free.0, over);
        } else {
            assert_eq!(foo_and_hello, (over, vec![over, ok]));
            assert_eq!(foo_and_unknown, (over, vec![over, ok]));
            assert_eq!(foo_and_free.0, over);
        }
        assert_eq!(codes(&mut c, &[foo]).await, (over, vec![over]));
    }
}

/// MERGE_DOMAIN_CONFIG: two files of one domain (say, one per team) are merged, each
/// file's limits answered; without it the second is a duplicate domain and startup fails.
#[tokio::test]
async fn merge_domain_config_serves_one_domain_from_two_files() {
    let first = "domain: quota-domain\ndescriptors:\n  - key: foo\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let second = "domain: quota-domain\ndescriptors:\n  - key: hello\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let root = runtime(&[("a.yaml", first), ("b.yaml", second)]);
    let vars = [("BACKEND_TYPE", "memory"), ("MERGE_DOMAIN_CONFIG", "true")];
    let (_child, listen) = start(root.path(), &vars);
    let mut c = client(&listen).await;
    let (ok, over) = (Code::Ok, Code::OverLimit);
    let foo: &[(&str, &str)] = &[("foo", "bar")];
    let hello: &[(&str, &str)] = &[("hello", "world")];
    assert_eq!(codes(&mut c, &[foo]).await, (ok, vec![ok]));
    assert_eq!(codes(&mut c, &[foo]).await, (over, vec![over]));
    assert_eq!(codes(&mut c, &[hello]).await, (ok, vec![ok]));
    assert_eq!(codes(&mut c, &[hello]).await, (ok, vec![ok]));
    assert_eq!(codes(&mut c, &[hello]).await, (over, vec![over]));
    // `cellrate validate` checks the directory the same way when told to merge.
    let dir = root.path().join("current/ratelimit/config");
    let validate = |merge: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_cellrate"))
            .arg("validate")
            .args(merge)
            .arg(&dir)
            .env_clear()
            .output()
            .unwrap()
    };
    assert_eq!(validate(&["--merge-domains"]).status.code(), Some(0));
    let refused = validate(&[]);
    assert_eq!(refused.status.code(), Some(78));
    let said = String::from_utf8_lossy(&refused.stdout);
    assert!(said.contains("duplicate domain 'quota-domain'"), "{said}");
}

/// NEAR_LIMIT_RATIO: `near_limit` counts the hits above floor(limit x ratio), as
/// upstream: of 4 hits on a limit of 4, two past 0.5 (2), one past the default 0.8 (3).
/// DISABLE_STATS: none of upstream's statistics is kept (cellrate's own metrics are).
#[tokio::test]
async fn near_limit_ratio_and_disable_stats_shape_upstreams_statistics() {
    let limit = "domain: quota-domain\ndescriptors:\n  - key: hello\n    rate_limit: {unit: hour, requests_per_unit: 4}\n";
    let cases = [
        (Some(("NEAR_LIMIT_RATIO", "0.5")), Some(2.0)),
        (None, Some(1.0)),
        (Some(("DISABLE_STATS", "true")), None),
    ];
    for (var, near) in cases {
        let root = config_root(&[("rl.yaml", limit)]);
        let vars: Vec<(&str, &str)> = var.into_iter().collect();
        let (_child, serving) = serve_as_ratelimit(root.path(), &vars);
        let mut c = client(serving["listen"].as_str().unwrap()).await;
        for _ in 0..4 {
            let answer = codes(&mut c, &[&[("hello", "world")]]).await;
            assert_eq!(answer.0, Code::Ok);
        }
        let (_, body) = http_get(serving["metrics"].as_str().unwrap(), "/metrics");
        let line = "cellrate_ratelimit_hits_total{key=\"quota-domain.hello\",stat=\"near_limit\"}";
        assert_eq!(crate::common::sample(&body, line), near, "{var:?}");
        assert_eq!(
            near.is_some(),
            body.contains("cellrate_ratelimit_hits_total")
        );
        assert!(body.contains("cellrate_decisions_total{"), "{body}");
    }
}

/// Plays the attacker: with upstream's statistic names on (USE_PROMETHEUS), descriptor
/// values reach the mapped series' labels through `detailed_metric`. 10 100 distinct
/// values written as label syntax give at most the key space's 10 000 series (the rest
/// count under cellrate's `overflow` key, in no mapped series), and no label or line of
/// their own in the exposition.
#[tokio::test]
async fn hostile_values_cannot_grow_or_forge_the_mapped_series() {
    let limit = "domain: quota-domain\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";
    let root = config_root(&[("rl.yaml", limit)]);
    let vars = [
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
    ];
    let (_child, serving) = serve_as_ratelimit(root.path(), &vars);
    let mut c = client(serving["listen"].as_str().unwrap()).await;
    let keys = cellrate::observe::metrics::MAX_RATELIMIT_KEYS;
    for i in 0..keys + 100 {
        let value = format!("{i}\",evil=\"1\"}} 9 # x{{y=\"");
        let answer = codes(&mut c, &[&[("user", value.as_str())]]).await;
        assert_eq!(answer.0, Code::Ok);
    }
    let (_, body) = http_get(serving["metrics"].as_str().unwrap(), "/metrics");
    let mapped: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
        .collect();
    assert_eq!(mapped.len(), keys, "one series per admitted key, no more");
    for line in &mapped {
        assert!(
            line.starts_with(
                "ratelimit_service_rate_limit_total_hits{domain=\"quota-domain\",key1=\"user_"
            ),
            "{line}"
        );
        assert!(line.ends_with(r#"y=\"",key2=""} 1"#), "{line}");
    }
    assert!(!body.contains("evil=\"1\""), "no label forged");
    assert!(!body.lines().any(|l| l.starts_with("x{")), "no line forged");
    let overflow = "cellrate_ratelimit_hits_total{key=\"overflow\",stat=\"total_hits\"}";
    assert_eq!(crate::common::sample(&body, overflow), Some(100.0));
}
