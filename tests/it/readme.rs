//! The README and `docs/` as a new user reads them: the quick start's commands run as
//! written (the serve command's build is the test binary, and its listeners are moved to
//! loopback port 0, the only change) and print what the README shows; every metric the docs
//! list is exported from the start, every `serve` flag is named in the operations page,
//! every link between the pages resolves, and the README stays a front page.

use crate::common::readme::{code_blocks, doc, readme, section, ROOT};
use crate::common::{http_get, serve};

/// Every page: the README, `docs/*.md`, and the figures' pages beside the README.
fn pages() -> Vec<String> {
    let mut pages = vec![
        "README.md".to_string(),
        "BENCHMARKS.md".to_string(),
        "RELIABILITY.md".to_string(),
        "proto/README.md".to_string(),
    ];
    for entry in std::fs::read_dir(std::path::Path::new(ROOT).join("docs")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") {
            pages.push(format!("docs/{name}"));
        }
    }
    pages.sort();
    pages
}

#[test]
fn every_metric_the_docs_list_is_exported_from_the_start() {
    let text: String = pages().iter().map(|p| doc(p)).collect();
    let listed: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("| `cellrate_"))
        .filter_map(|rest| rest.split('`').next())
        .collect();
    assert!(listed.len() >= 10, "the metrics table: {listed:?}");
    // Those named in the prose too.
    let mut names: Vec<String> = listed.iter().map(|n| format!("cellrate_{n}")).collect();
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("cellrate_") && word.len() > "cellrate_".len() {
            names.push(word.to_string());
        }
    }
    names.sort();
    names.dedup();
    let server = serve();
    let (status, metrics) = http_get(&server.metrics, "/metrics");
    assert_eq!(status, 200);
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !metrics.contains(&format!("# TYPE {name} ")))
        .collect();
    assert!(
        missing.is_empty(),
        "named in the docs, absent from a fresh server's /metrics: {missing:?}"
    );
    // Counters with known labels are there at zero, not absent.
    for series in [
        "cellrate_store_errors_total{operation=\"spend\"} 0",
        "cellrate_config_reloads_total{result=\"failure\"} 0",
        "cellrate_decisions_total{api=\"envoy\",limit=\"NewOrdersPerAccount\",result=\"denied\"} 0",
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
}

#[test]
fn every_serve_flag_is_in_the_operations_pages() {
    // The Redis store's flags are on its own page, every other in the operations page.
    let text = doc("docs/operations.md") + &doc("docs/redis-store.md");
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_cellrate"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    let flags: std::collections::BTreeSet<&str> = help
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .collect();
    assert!(flags.len() > 40, "{flags:?}");
    let missing: Vec<&&str> = flags
        .iter()
        .filter(|flag| !text.contains(&format!("`{flag}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "serve flags docs/operations.md and docs/redis-store.md do not name: {missing:?}"
    );
}

/// GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            found.push(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

/// Every relative link of every page names a file that exists, and every `#anchor` a
/// heading of the page it points into.
#[test]
fn every_link_between_the_pages_resolves() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in pages() {
        let text = doc(&page);
        let dir = std::path::Path::new(&page).parent().unwrap().to_path_buf();
        let mut in_code = false;
        for line in text.lines() {
            if line.starts_with("```") {
                in_code = !in_code;
                continue;
            }
            if in_code {
                continue;
            }
            for (at, _) in line.match_indices("](") {
                let rest = &line[at + 2..];
                let Some(end) = rest.find(')') else { continue };
                let target = &rest[..end];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
                let file = if path.is_empty() {
                    std::path::PathBuf::from(&page)
                } else {
                    dir.join(path)
                };
                let full = std::path::Path::new(ROOT).join(&file);
                checked += 1;
                if !full.exists() {
                    broken.push(format!("{page}: {target} (no {})", file.display()));
                } else if !fragment.is_empty() {
                    let headings = anchors(&std::fs::read_to_string(&full).unwrap());
                    if !headings.iter().any(|a| a == fragment) {
                        broken.push(format!("{page}: {target} (no such heading)"));
                    }
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    // Every page of docs/ is reachable from the README.
    let readme = readme();
    for page in pages().iter().filter(|p| p.starts_with("docs/")) {
        assert!(
            readme.contains(&format!("({page})")),
            "the README's map lacks {page}"
        );
    }
}

/// The README is a front page: what cellrate is, why it differs, the two commands, the
/// first request, the map of the docs; the reference lives in docs/.
#[test]
fn the_readme_is_a_front_page() {
    let readme = readme();
    let lines = readme.lines().count();
    assert!(lines < 300, "README.md has {lines} lines");
    for heading in [
        "## Why it differs",
        "## Quick start",
        "## The documentation",
    ] {
        assert!(readme.contains(&format!("\n{heading}\n")), "{heading}");
    }
    let blocks = code_blocks(&section(&readme, "## Quick start"));
    let commands: Vec<&str> = blocks
        .iter()
        .filter(|(info, _)| info == "sh")
        .map(|(_, body)| body.as_str())
        .collect();
    assert!(commands.contains(&"cargo run --release -- serve"));
    assert!(commands.contains(&"scripts/test.sh"));
    // The fast tier: the unit tests and the integration tests that need only Rust.
    assert!(commands.contains(&"cargo test --lib --test it && cargo test --doc"));
    // CI runs exactly the test command.
    assert!(doc(".ci/run").lines().any(|l| l == "exec scripts/test.sh"));
}
