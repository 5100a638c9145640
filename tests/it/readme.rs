//! The README as a new user reads it: the quick start's commands run as written (the serve
//! command's build is the test binary, and its listeners are moved to loopback port 0, the
//! only change) and print what the README shows; every metric the README lists is exported
//! from the start, and every `serve` flag is named.

use std::process::Command;

use serde_json::Value;

use crate::common::{http_get, serve};

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

/// The text of section `heading` (a `## ` line) up to the next `## ` heading.
fn section(text: &str, heading: &str) -> String {
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("README has no {heading:?}"));
    let rest = &text[start + heading.len() + 2..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    rest[..end].to_string()
}

/// The fenced code blocks of `text`: (info string, content).
fn code_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(info) = line.strip_prefix("```") {
            let mut body = Vec::new();
            for line in lines.by_ref() {
                if line.starts_with("```") {
                    break;
                }
                body.push(line);
            }
            blocks.push((info.trim().to_string(), body.join("\n")));
        }
    }
    blocks
}

/// Runs a README shell command (continuation lines joined) in the repository.
fn sh(command: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(command.replace("\\\n", " "))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

#[test]
fn the_quick_start_works_as_written() {
    let quick = section(&readme(), "## Quick start");
    let blocks = code_blocks(&quick);
    let find = |needle: &str| {
        blocks
            .iter()
            .position(|(_, body)| body.contains(needle))
            .unwrap_or_else(|| panic!("the quick start has no block with {needle:?}"))
    };
    assert_eq!(blocks[find("-- serve")].1, "cargo run --release -- serve");

    // The server, as `serve` with its defaults (the example config, the memory store).
    let server = serve();
    let request = find("grpcurl");
    let command = blocks[request]
        .1
        .replace("localhost:8081", &server.listen)
        .replace("grpcurl ", "grpcurl -max-time 10 ");
    let out = sh(&command);
    assert!(
        out.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (info, shown) = &blocks[request + 1];
    assert_eq!(info, "json", "the first request's output follows it");
    let shown: Value = serde_json::from_str(shown).unwrap();
    assert_eq!(
        printed, shown,
        "the first request prints what the README shows"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        blocks[request + 1].1.trim(),
        "exactly, whitespace included"
    );

    let validate = find("cellrate validate");
    let command = blocks[validate]
        .1
        .replace("target/release/cellrate", env!("CARGO_BIN_EXE_cellrate"));
    let out = sh(&command);
    assert_eq!(out.status.code(), Some(0), "{command}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        blocks[validate + 1].1.trim(),
        "validate prints what the README shows"
    );

    assert!(blocks.iter().any(|(_, body)| body == "scripts/test.sh"));
}

#[test]
fn every_metric_the_readme_lists_is_exported_from_the_start() {
    let text = readme();
    let listed: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("| `cellrate_"))
        .filter_map(|rest| rest.split('`').next())
        .collect();
    assert!(listed.len() >= 10, "the metrics table: {listed:?}");
    // Those named in the prose of the Redis section too.
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
        "named in the README, absent from a fresh server's /metrics: {missing:?}"
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
fn the_redis_protocol_examples_print_what_the_readme_shows() {
    let text = section(&readme(), "## Redis protocol (CL.THROTTLE)");
    let blocks = code_blocks(&text);
    let server = crate::common::serve_with(
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config")),
        &["--resp-listen", "127.0.0.1:0"],
    );
    let port = server.resp.rsplit_once(':').unwrap().1.to_string();

    // The console: each `$ redis-cli` line runs (on the served port; `--no-raw` prints as
    // at a terminal) and prints the lines that follow it.
    let (_, console) = blocks
        .iter()
        .find(|(info, _)| info == "console")
        .expect("a console block");
    let mut runs: Vec<(String, String)> = Vec::new();
    for line in console.lines() {
        match line.strip_prefix("$ ") {
            Some(command) if command.starts_with("redis-cli") => {
                runs.push((command.to_string(), String::new()))
            }
            Some(command) => assert_eq!(command, "cellrate serve --resp-listen 127.0.0.1:6380"),
            None => {
                let (_, shown) = runs.last_mut().expect("output follows a command");
                shown.push_str(line);
                shown.push('\n');
            }
        }
    }
    assert_eq!(runs.len(), 3);
    for (command, shown) in runs {
        let command = command.replace("-p 6380", &format!("-h 127.0.0.1 -p {port} --no-raw"));
        let out = sh(&command);
        assert_eq!(String::from_utf8_lossy(&out.stdout), shown, "{command}");
    }

    // The redis-py example prints what the README shows.
    let python = std::env::var("CELLRATE_TEST_PYTHON").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/test-venv/bin/python").to_string()
    });
    let (_, code) = blocks
        .iter()
        .find(|(info, _)| info == "python")
        .expect("a python block");
    assert!(code.contains("redis.Redis(port=6380)"));
    let code = code.replace(
        "redis.Redis(port=6380)",
        &format!("redis.Redis(host='127.0.0.1', port={port})"),
    );
    let out = Command::new(&python).arg("-c").arg(&code).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, shown) = blocks
        .iter()
        .find(|(info, _)| info == "text")
        .expect("the python example's output");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), shown.trim());
}

#[test]
fn every_serve_flag_is_in_the_readme() {
    let text = readme();
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
        "serve flags the README does not name: {missing:?}"
    );
}
