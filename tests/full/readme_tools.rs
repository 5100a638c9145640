//! The README's and docs' commands that need grpcurl, redis-cli and Python run as written
//! (the rest of the README's checks are the fast tier's `tests/it/readme.rs`).
use std::process::Command;

use serde_json::Value;

use crate::common::readme::{code_blocks, doc, readme, section, sh};
use crate::common::serve;

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
fn the_redis_protocol_examples_print_what_the_docs_show() {
    let text = doc("docs/redis-protocol.md");
    let blocks = code_blocks(&text);
    let server = crate::common::serve_with(
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config")),
        &["--resp-listen", "127.0.0.1:0"],
    );
    let port = server.resp.rsplit_once(':').unwrap().1.to_string();

    // The consoles: each `$ redis-cli` line runs (on the served port; `--no-raw` prints as
    // at a terminal) and prints the lines that follow it.
    let mut runs: Vec<(String, String)> = Vec::new();
    for (_, console) in blocks.iter().filter(|(info, _)| info == "console") {
        for line in console.lines() {
            match line.strip_prefix("$ ") {
                Some(command) if command.starts_with("redis-cli") => {
                    runs.push((command.to_string(), String::new()))
                }
                Some(command) => {
                    assert_eq!(command, "cellrate serve --resp-listen 127.0.0.1:6380")
                }
                None => {
                    let (_, shown) = runs.last_mut().expect("output follows a command");
                    shown.push_str(line);
                    shown.push('\n');
                }
            }
        }
    }
    // CL.THROTTLE's three, GCRA's four.
    assert_eq!(runs.len(), 7);
    for (command, shown) in runs {
        let command = command.replace("-p 6380", &format!("-h 127.0.0.1 -p {port} --no-raw"));
        let out = sh(&command);
        assert_eq!(String::from_utf8_lossy(&out.stdout), shown, "{command}");
    }

    // The redis-py and valkey-py examples print what the page shows.
    let python = std::env::var("CELLRATE_TEST_PYTHON").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/test-venv/bin/python").to_string()
    });
    let codes: Vec<&String> = blocks
        .iter()
        .filter(|(info, _)| info == "python")
        .map(|(_, code)| code)
        .collect();
    let shown: Vec<&String> = blocks
        .iter()
        .filter(|(info, _)| info == "text")
        .map(|(_, text)| text)
        .collect();
    assert_eq!((codes.len(), shown.len()), (2, 2));
    for (code, shown) in codes.into_iter().zip(shown) {
        assert!(code.contains("(port=6380)"), "{code}");
        let code = code.replace("(port=6380)", &format!("(host='127.0.0.1', port={port})"));
        let out = Command::new(&python).arg("-c").arg(&code).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), shown.trim());
    }
}
