//! What can be checked of the deployment files without Docker, Kubernetes or helm: they
//! parse, the chart's templates use only values that exist, ports and paths agree between
//! the Dockerfile, the chart and the binary, and the binary starts with the arguments and
//! environment the Dockerfile and the chart give it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::CommandFactory;
use serde_yaml_ng::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml_documents(path: &str) -> Vec<Value> {
    let text = read(path);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}")))
        .collect()
}

fn values() -> Value {
    yaml_documents("helm/cellrate/values.yaml").remove(0)
}

/// The default of a `serve` flag, from the binary's own command line definition.
fn serve_default(flag: &str) -> String {
    let cli = cellrate::cli::Cli::command();
    let serve = cli.find_subcommand("serve").unwrap();
    let arg = serve
        .get_arguments()
        .find(|a| a.get_long() == Some(flag))
        .unwrap();
    arg.get_default_values()[0].to_string_lossy().into_owned()
}

fn port_of(addr: &str) -> u64 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

/// The Dockerfile's instruction lines of `kind` (after `kind `), continuations joined.
fn dockerfile(kind: &str) -> Vec<String> {
    let text = read("Dockerfile").replace("\\\n", " ");
    text.lines()
        .filter_map(|l| l.strip_prefix(&format!("{kind} ")))
        .map(|s| s.trim().to_string())
        .collect()
}

#[test]
fn every_yaml_file_parses() {
    let chart = yaml_documents("helm/cellrate/Chart.yaml").remove(0);
    assert_eq!(chart["name"], "cellrate");
    assert_eq!(chart["apiVersion"], "v2");
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert!(values()["ports"].is_mapping());
    for path in [
        "examples/envoy/envoy.yaml",
        "examples/envoy/docker-compose.yaml",
        "examples/istio/ratelimit-envoyfilter.yaml",
        "examples/istio/values.yaml",
    ] {
        assert!(!yaml_documents(path).is_empty(), "{path} is empty");
    }
    assert_eq!(
        yaml_documents("examples/istio/ratelimit-envoyfilter.yaml").len(),
        2
    );
}

/// Every `.Values.a.b` path in the templates exists in values.yaml.
#[test]
fn templates_use_only_values_that_exist() {
    let values = values();
    let dir = Path::new(ROOT).join("helm/cellrate/templates");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for (at, _) in text.match_indices(".Values.") {
            let rest = &text[at + ".Values.".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_'))
                .unwrap_or(rest.len());
            let dotted = rest[..end].trim_end_matches('.');
            let mut node = &values;
            for part in dotted.split('.') {
                node = node.get(part).unwrap_or_else(|| {
                    panic!("{}: .Values.{dotted} is not in values.yaml", path.display())
                });
            }
            checked += 1;
        }
    }
    assert!(checked > 40, "only {checked} value references found");
}

#[test]
fn ports_and_paths_agree_between_dockerfile_chart_and_binary() {
    let values = values();
    let grpc = port_of(&serve_default("listen"));
    let admin = port_of(&serve_default("admin-listen"));
    let metrics = port_of(&serve_default("metrics-listen"));
    assert_eq!((grpc, admin, metrics), (8081, 8082, 9090));
    assert_eq!(values["ports"]["grpc"].as_u64(), Some(grpc));
    assert_eq!(values["ports"]["admin"].as_u64(), Some(admin));
    assert_eq!(values["ports"]["metrics"].as_u64(), Some(metrics));
    assert_eq!(
        dockerfile("EXPOSE"),
        vec![format!("{grpc} {admin} {metrics}")]
    );
    // The admin listener stays on loopback unless asked.
    assert!(serve_default("admin-listen").starts_with("127.0.0.1:"));

    // The config directory: the image copies the examples where the chart mounts its ConfigMap.
    let mount = values["config"]["mountPath"].as_str().unwrap();
    assert!(dockerfile("COPY").contains(&format!("config {mount}")));
    assert!(dockerfile("ENV")
        .iter()
        .any(|e| e.contains(&format!("CELLRATE_CONFIG={mount}"))));

    // Readiness asks grpc.health.v1 on the decision port, liveness /healthz on the metrics
    // port (which both serve: tested by running).
    let deployment = read("helm/cellrate/templates/deployment.yaml");
    assert_eq!(
        deployment
            .matches("grpc:\n              port: {{ .Values.ports.grpc }}")
            .count(),
        1
    );
    assert!(deployment.contains(
        "httpGet:\n              path: /healthz\n              port: {{ .Values.ports.metrics }}"
    ));
    assert!(deployment.contains("mountPath: {{ .Values.config.mountPath }}"));
    assert!(
        !deployment.contains("subPath"),
        "a subPath mount would not see ConfigMap updates"
    );

    // Envoy and Istio examples reach the decision port.
    assert!(read("examples/envoy/envoy.yaml").contains(&format!("port_value: {grpc}")));
    assert!(
        read("examples/istio/ratelimit-envoyfilter.yaml").contains(&format!(
            "outbound|{grpc}||cellrate.cellrate.svc.cluster.local"
        ))
    );
}

/// The files the templates read with `.Files.Get` exist in the chart, are what their
/// consumers parse (the dashboard JSON, the rules a PrometheusRule's spec), and both
/// objects are off by default.
#[test]
fn the_chart_ships_the_dashboard_and_rules_it_renders() {
    let dir = Path::new(ROOT).join("helm/cellrate");
    let mut got = Vec::new();
    for entry in std::fs::read_dir(dir.join("templates")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for (at, _) in text.match_indices(".Files.Get \"") {
            let rest = &text[at + ".Files.Get \"".len()..];
            got.push(rest[..rest.find('"').unwrap()].to_string());
        }
    }
    got.sort();
    assert_eq!(
        got,
        ["dashboards/cellrate.json", "rules/cellrate.rules.yaml"]
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("helm/cellrate/dashboards/cellrate.json")).unwrap();
    assert_eq!(dashboard["uid"], "cellrate-overview");
    let rules = yaml_documents("helm/cellrate/rules/cellrate.rules.yaml").remove(0);
    let groups = rules["groups"].as_sequence().unwrap();
    assert!(groups.iter().all(|g| g["rules"].as_sequence().is_some()));
    let values = values();
    assert_eq!(values["grafanaDashboard"]["enabled"].as_bool(), Some(false));
    assert_eq!(
        values["grafanaDashboard"]["labels"]["grafana_dashboard"].as_str(),
        Some("1")
    );
    assert_eq!(values["prometheusRule"]["enabled"].as_bool(), Some(false));
    // Helm parses every template as a Go template: Prometheus's own `{{ $labels }}` must
    // stay in the rules file, which .Files.Get does not parse.
    let rule_template = read("helm/cellrate/templates/prometheusrule.yaml");
    assert!(!rule_template.contains("$labels") && !rule_template.contains("$value"));
}

#[test]
fn the_chart_ships_exactly_the_example_limits() {
    let values = values();
    let limits = values["config"]["limits"].as_mapping().unwrap();
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(Path::new(ROOT).join("config")).unwrap() {
        let path = entry.unwrap().path();
        files.insert(
            path.file_name().unwrap().to_string_lossy().into_owned(),
            std::fs::read_to_string(&path).unwrap(),
        );
    }
    let chart: BTreeMap<String, String> = limits
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().unwrap().to_string(),
                v.as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        chart, files,
        "helm/cellrate/values.yaml config.limits differs from config/"
    );
}

/// Starts the binary with `args` and `env`, listeners moved to loopback port 0, and checks
/// that it serves health and readiness.
fn starts_and_answers_health(args: &[String], env: &[(String, String)]) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cellrate"));
    command.args(args).envs(env.iter().map(|(k, v)| (k, v)));
    // Loopback only in tests; everything else as deployed.
    command
        .env("CELLRATE_LISTEN", "127.0.0.1:0")
        .env("CELLRATE_ADMIN_LISTEN", "127.0.0.1:0")
        .env("CELLRATE_METRICS_LISTEN", "127.0.0.1:0")
        .env("CELLRATE_CONFIG", Path::new(ROOT).join("config"))
        .env("CELLRATE_LOG_FORMAT", "json")
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let lines = crate::common::stderr_lines(&mut child);
    let started = (0..10_000)
        .map_while(|_| lines.recv_timeout(Duration::from_secs(20)).ok())
        .find_map(|line| {
            let v = serde_json::from_str::<serde_json::Value>(&line).ok()?;
            (v["fields"]["message"] == "cellrate serving").then(|| {
                (
                    v["fields"]["listen"].as_str().unwrap().to_string(),
                    v["fields"]["metrics"].as_str().unwrap().to_string(),
                )
            })
        })
        .ok_or("no announcement");
    let result = std::panic::catch_unwind(|| {
        let (listen, metrics) = started.expect("cellrate starts with the deployed arguments");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listen: std::net::SocketAddr = listen.parse().unwrap();
        let status = runtime.block_on(crate::common::health_status(listen));
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
        assert_eq!(crate::common::http_get(&metrics, "/readyz").0, 200);
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn the_binary_starts_with_the_dockerfile_arguments() {
    let entrypoint: Vec<String> = serde_json::from_str(&dockerfile("ENTRYPOINT")[0]).unwrap();
    let cmd: Vec<String> = serde_json::from_str(&dockerfile("CMD")[0]).unwrap();
    assert_eq!(entrypoint, vec!["/usr/local/bin/cellrate"]);
    let env: Vec<(String, String)> = dockerfile("ENV")
        .join(" ")
        .split_whitespace()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    assert!(env.iter().any(|(k, _)| k == "CELLRATE_LOG_FORMAT"));
    starts_and_answers_health(&cmd, &env);
}

#[test]
fn the_binary_starts_with_the_chart_arguments_and_environment() {
    let values = values();
    let args: Vec<String> = values["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let deployment = read("helm/cellrate/templates/deployment.yaml");
    // The variables the template sets from values (listeners and config are moved to
    // loopback and the repository's config by the helper).
    let scalar = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => serde_yaml_ng::to_string(other).unwrap().trim().to_string(),
    };
    let env = vec![
        (
            "CELLRATE_LOG_FORMAT".to_string(),
            scalar(&values["logFormat"]),
        ),
        (
            "CELLRATE_RATE_LIMIT_HEADERS".to_string(),
            scalar(&values["rateLimitHeaders"]),
        ),
        ("CELLRATE_SHADOW".to_string(), scalar(&values["shadow"])),
        (
            "CELLRATE_SHUTDOWN_DELAY_SECONDS".to_string(),
            scalar(&values["shutdown"]["delaySeconds"]),
        ),
        (
            "CELLRATE_GRACE_SECONDS".to_string(),
            scalar(&values["shutdown"]["graceSeconds"]),
        ),
    ];
    for (name, _) in &env {
        assert!(
            deployment.contains(&format!("name: {name}")),
            "the chart does not set {name}"
        );
    }
    starts_and_answers_health(&args, &env);
}
