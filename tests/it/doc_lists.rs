//! Lists the documentation says are complete, held against what the code has: the admin
//! RPCs wherever they are listed (`serve --help`, the chart's values, the operations and
//! native API pages) against the service reflection describes, the description reflection
//! serves for temporary overrides against where the Redis store keeps them, and every
//! metric the server registers against docs/metrics-and-alerts.md's table ("every metric",
//! says the README).

use prost::Message;
use prost_types::FileDescriptorSet;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(ROOT).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn descriptors() -> FileDescriptorSet {
    FileDescriptorSet::decode(cellrate::proto::FILE_DESCRIPTOR_SET).unwrap()
}

/// The methods of `cellrate.v1.Admin`, as reflection describes the service.
fn admin_rpcs() -> Vec<String> {
    let set = descriptors();
    let file = set
        .file
        .iter()
        .find(|f| f.name() == "cellrate/v1/admin.proto")
        .expect("admin.proto in the descriptor set");
    let service = file.service.iter().find(|s| s.name() == "Admin").unwrap();
    let rpcs: Vec<String> = service
        .method
        .iter()
        .map(|m| m.name().to_string())
        .collect();
    assert!(rpcs.len() >= 6, "{rpcs:?}");
    rpcs
}

/// The text from the line holding `start` up to the first blank line (or the end).
fn paragraph<'a>(text: &'a str, start: &str) -> &'a str {
    let at = text
        .find(start)
        .unwrap_or_else(|| panic!("no {start:?} in {text}"));
    let from = text[..at].rfind('\n').map_or(0, |n| n + 1);
    let rest = &text[from..];
    &rest[..rest.find("\n\n").unwrap_or(rest.len())]
}

fn missing<'a>(rpcs: &'a [String], text: &str) -> Vec<&'a String> {
    rpcs.iter()
        .filter(|rpc| {
            !text
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|w| w == rpc.as_str())
        })
        .collect()
}

#[test]
fn every_admin_rpc_is_named_wherever_the_admin_rpcs_are_listed() {
    let rpcs = admin_rpcs();
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_cellrate"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    let values = read("helm/cellrate/values.yaml");
    let operations = read("docs/operations.md");
    let native = read("docs/native-api.md");
    for (place, text) in [
        (
            "serve --help, --admin-listen",
            paragraph(&help, "--admin-listen"),
        ),
        (
            "serve --help, --admin-token",
            paragraph(&help, "--admin-token"),
        ),
        ("values.yaml, ports.admin", paragraph(&values, "# Admin:")),
        (
            "operations.md, the listeners' table",
            paragraph(&operations, "| admin (gRPC) |"),
        ),
        (
            "native-api.md, the listeners",
            paragraph(&native, "The decision listener"),
        ),
    ] {
        let absent = missing(&rpcs, text);
        assert!(absent.is_empty(), "{place} leaves out {absent:?}:\n{text}");
    }
}

/// What grpcurl's `describe cellrate.v1.Admin` shows over SetOverride: the comment in the
/// descriptor set that reflection serves.
#[test]
fn the_override_description_reflection_serves_says_where_each_store_keeps_them() {
    let set = descriptors();
    let file = set
        .file
        .iter()
        .find(|f| f.name() == "cellrate/v1/admin.proto")
        .unwrap();
    let service = file
        .service
        .iter()
        .position(|s| s.name() == "Admin")
        .unwrap();
    let method = file.service[service]
        .method
        .iter()
        .position(|m| m.name() == "SetOverride")
        .unwrap();
    // FileDescriptorProto.service = 6, ServiceDescriptorProto.method = 2.
    let path = [6, service as i32, 2, method as i32];
    let info = file
        .source_code_info
        .as_ref()
        .expect("source info is served");
    let comment = info
        .location
        .iter()
        .find(|l| l.path == path)
        .and_then(|l| l.leading_comments.clone())
        .expect("SetOverride has a description");
    let text = comment.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        text.contains("With the memory store, kept by this replica only")
            && text.contains("With the Redis store, kept in Redis")
            && text.contains("--redis-override-sync-ms"),
        "{text}"
    );
}

/// Every metric name registered in `crates/observe/src/metrics/` (each is a string literal given
/// to the registry there) is a row of docs/metrics-and-alerts.md's table.
#[test]
fn every_registered_metric_is_in_the_metrics_table() {
    let page = read("docs/metrics-and-alerts.md");
    let rows: std::collections::BTreeSet<&str> = page
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .filter(|name| name.starts_with("cellrate_"))
        .collect();
    let mut registered = std::collections::BTreeSet::new();
    let dir = std::path::Path::new(ROOT).join("crates/observe/src/metrics");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let source = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for piece in source.split('"').skip(1).step_by(2) {
            if piece.starts_with("cellrate_")
                && piece.len() > "cellrate_".len()
                && piece.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            {
                registered.insert(piece.to_string());
            }
        }
    }
    assert!(registered.len() > 40, "{registered:?}");
    let absent: Vec<&String> = registered
        .iter()
        .filter(|name| !rows.contains(name.as_str()))
        .collect();
    assert!(
        absent.is_empty(),
        "registered, but not rows of docs/metrics-and-alerts.md's table: {absent:?}"
    );
}
