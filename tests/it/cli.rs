//! The `cellrate` binary's `simulate` and `validate` commands, run as processes.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_cellrate");
const MS: i64 = 1_000_000;

fn simulate(args: &[&str], input: &str) -> Vec<Value> {
    let mut child = Command::new(BIN)
        .arg("simulate")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "simulate failed: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn spend_at(at_ns: i64) -> String {
    format!("{{\"at_ns\": {at_ns}, \"op\": \"spend\"}}\n")
}

#[test]
fn seed_000_walkthrough_through_simulate() {
    let mut input = String::new();
    for _ in 0..21 {
        input += &spend_at(0);
    }
    input += &spend_at(50 * MS - 1);
    input += &spend_at(50 * MS);
    input += &spend_at(14 * 86_400 * 1_000 * MS);
    let out = simulate(&["--limit", "api=20/20/1s"], &input);
    assert_eq!(out.len(), 24);
    for (i, line) in out[..20].iter().enumerate() {
        assert_eq!(line["allowed"], true, "request {}", i + 1);
        assert_eq!(line["remaining"], 19 - i as i64);
    }
    assert_eq!(out[19]["reset_in_ns"], 1_000 * MS);
    assert_eq!(out[20]["allowed"], false);
    assert_eq!(out[20]["retry_in_ns"], 50 * MS);
    assert_eq!(out[20]["remaining"], 0);
    assert_eq!(out[21]["allowed"], false);
    assert_eq!(out[21]["retry_in_ns"], 1);
    assert_eq!(out[22]["allowed"], true);
    assert_eq!(out[22]["retry_in_ns"], 50 * MS);
    assert_eq!(out[23]["allowed"], true);
    assert_eq!(out[23]["remaining"], 19);
}

#[test]
fn simulate_batches_checks_refunds_and_resets() {
    let input = r#"{"at_ns": 0, "op": "spend", "bucket": "a", "cost": 2}
{"at_ns": 0, "op": "check", "bucket": "a", "cost": 1}
{"at_ns": 0, "op": "spend", "items": [{"bucket": "b"}, {"bucket": "a"}]}
{"at_ns": 0, "op": "refund", "bucket": "a", "cost": 1}
{"at_ns": 0, "op": "spend", "items": [{"bucket": "b"}, {"bucket": "a", "mode": "spend_only", "cost": 2}]}
{"at_ns": 0, "op": "reset", "bucket": "b"}
"#;
    let out = simulate(&["--limit", "a=2/2/1s", "--limit", "b=5/5/1s"], input);
    assert_eq!(
        (out[0]["allowed"].clone(), out[0]["remaining"].clone()),
        (true.into(), 0.into())
    );
    assert_eq!(out[1]["allowed"], false);
    // a is empty: the batch is denied and b is not spent.
    assert_eq!(out[2]["allowed"], false);
    assert_eq!(out[2]["items"][0]["allowed"], true);
    assert_eq!(out[2]["items"][0]["remaining"], 5);
    assert_eq!(out[2]["items"][1]["retry_in_ns"], 500 * MS);
    assert_eq!(
        (out[3]["allowed"].clone(), out[3]["remaining"].clone()),
        (true.into(), 1.into())
    );
    // spend_only a lacks two tokens: left out, b is spent.
    assert_eq!(out[4]["allowed"], true);
    assert_eq!(out[4]["items"][0]["remaining"], 4);
    assert_eq!(out[4]["items"][1]["allowed"], false);
    assert_eq!(out[5]["remaining"], 5);
}

#[test]
fn simulate_with_a_config_directory() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    let input = r#"{"at_ns": 0, "op": "spend", "bucket": "NewOrdersPerAccount:12345678"}
{"at_ns": 0, "op": "spend", "bucket": "NewOrdersPerAccount:1"}
{"at_ns": 0, "op": "spend", "bucket": "NoSuch:1"}
"#;
    let out = simulate(&["--config", config], input);
    assert_eq!(out[0]["reset_in_ns"], 18_000 * MS);
    assert_eq!(out[1]["reset_in_ns"], 36_000 * MS);
    assert!(out[2]["error"]
        .as_str()
        .unwrap()
        .contains("unknown limit name"));
}

#[test]
fn validate_prints_ok_or_every_error_with_exit_78() {
    let good = Command::new(BIN)
        .args(["validate", concat!(env!("CARGO_MANIFEST_DIR"), "/config")])
        .output()
        .unwrap();
    assert_eq!(good.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&good.stdout).starts_with("OK"));

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "NewOrdersPerAccount: {burst: 0, count: 1, period: 1s}\nNope: {burst: 1, count: 1, period: 1s}\n",
    )
    .unwrap();
    let bad = Command::new(BIN)
        .arg("validate")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(78));
    let text = String::from_utf8_lossy(&bad.stdout);
    assert!(
        text.contains("defaults.yaml: NewOrdersPerAccount: burst must be at least 1"),
        "{text}"
    );
    assert!(
        text.contains("defaults.yaml: Nope: unknown limit name"),
        "{text}"
    );
}

#[test]
fn serve_exits_78_on_bad_config_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("defaults.yaml"), "garbage: [").unwrap();
    let out = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("defaults.yaml"));
}

/// Every listener on loopback, port 0.
const LOOPBACK: [&str; 6] = [
    "--listen",
    "127.0.0.1:0",
    "--admin-listen",
    "127.0.0.1:0",
    "--metrics-listen",
    "127.0.0.1:0",
];

#[test]
fn serve_exits_64_on_an_empty_admin_token() {
    // An empty Secret value must not become a token that `Bearer ` satisfies.
    for (flag, env) in [(Some(""), None), (None, Some("   ")), (Some(" \t"), None)] {
        let mut command = Command::new(BIN);
        command
            .arg("serve")
            .args(LOOPBACK)
            .args(["--config", concat!(env!("CARGO_MANIFEST_DIR"), "/config")]);
        if let Some(token) = flag {
            command.args(["--admin-token", token]);
        }
        if let Some(token) = env {
            command.env("CELLRATE_ADMIN_TOKEN", token);
        }
        let out = command.output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{flag:?} {env:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("admin-token"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A Redis URL that is no URL is refused when the flags are read, before any port is
/// bound (it bound them and exited 1 later), without echoing it (it may hold a password).
#[test]
fn serve_exits_64_on_a_redis_url_that_is_no_url() {
    for (flag, url) in [
        ("--redis-url", "localhost:abc"),
        ("--redis-url", "redis://u:secret/pw@host:1"),
        ("--redis-cluster-nodes", "redis://a:1,not a host"),
    ] {
        let out = Command::new(BIN)
            .arg("serve")
            .args(LOOPBACK)
            .args(["--store", "redis", flag, url])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{url}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("not a Redis URL"),
            "{stderr}"
        );
        assert!(
            !stderr.contains("secret") && !stderr.contains("serving"),
            "{stderr}"
        );
    }
}

/// The Redis TLS files: one that cannot be read or holds no PEM certificate (or key) is
/// named, exit 78 as for the other TLS files; a CA or client certificate with a plain
/// redis:// URL (never used) or with Sentinel (not served) is a command-line fault, 64.
/// All before any port is bound, and without echoing the URL's password.
#[test]
fn serve_refuses_redis_tls_files_it_cannot_use() {
    let pki = crate::common::pki::Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.write(dir.path());
    let file = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let not_pem = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    // A file past the bound is refused before it is parsed (a CA file that is a disk image).
    let huge = file("huge.pem");
    std::fs::write(&huge, "x".repeat((4 << 20) + 1)).unwrap();
    let rediss = ["--redis-url", "rediss://127.0.0.1:1"];
    let cases: [(&[&str], i32, String); 9] = [
        (
            &["--redis-tls-ca", &huge],
            78,
            "larger than a PEM file needs".into(),
        ),
        (
            &["--redis-tls-ca", "/nonexistent/ca.pem"],
            78,
            "--redis-tls-ca /nonexistent/ca.pem".into(),
        ),
        (
            &["--redis-tls-ca", not_pem],
            78,
            "no PEM certificate in it".into(),
        ),
        (
            &[
                "--redis-tls-client-cert",
                &cert,
                "--redis-tls-client-key",
                &cert,
            ],
            78,
            format!("--redis-tls-client-key {cert}: no PEM key in it"),
        ),
        (
            &[
                "--redis-tls-client-cert",
                &key,
                "--redis-tls-client-key",
                &key,
            ],
            78,
            format!("--redis-tls-client-cert {key}: no PEM certificate in it"),
        ),
        (
            &[
                "--redis-url",
                "redis://:secret@127.0.0.1:1",
                "--redis-tls-ca",
                &ca,
            ],
            64,
            "are for rediss:// (TLS); 127.0.0.1:1 is not".into(),
        ),
        (
            &[
                "--redis-cluster-nodes",
                "rediss://127.0.0.1:1,redis://127.0.0.1:2",
                "--redis-tls-client-cert",
                &cert,
                "--redis-tls-client-key",
                &key,
            ],
            64,
            "redis://127.0.0.1:2 is not".into(),
        ),
        (
            &[
                "--redis-sentinel",
                "127.0.0.1:1",
                "--redis-sentinel-master",
                "m",
                "--redis-tls-ca",
                &ca,
            ],
            64,
            "not served with --redis-sentinel".into(),
        ),
        // Good files, a TLS URL: the flags are taken (then nothing answers on port 1).
        (
            &[
                "--redis-tls-ca",
                &ca,
                "--redis-tls-client-cert",
                &cert,
                "--redis-tls-client-key",
                &key,
            ],
            0,
            String::new(),
        ),
    ];
    for (flags, code, says) in cases {
        let mut command = Command::new(BIN);
        command
            .arg("serve")
            .args(LOOPBACK)
            .args(["--config", concat!(env!("CARGO_MANIFEST_DIR"), "/config")])
            .args(["--store", "redis"])
            .args(flags);
        if !flags.iter().any(|f| {
            f.starts_with("--redis-url")
                || f.starts_with("--redis-cluster")
                || f.starts_with("--redis-sentinel")
        }) {
            command.args(rediss);
        }
        if code == 0 {
            // Serving: checked to start, then stopped.
            command.args(["--grace-seconds", "1"]);
            let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
            let lines = crate::common::stderr_lines(&mut child);
            let serving = (0..1000)
                .map_while(|_| lines.recv_timeout(std::time::Duration::from_secs(20)).ok())
                .any(|line| line.contains("cellrate serving"));
            let _ = child.kill();
            let _ = child.wait();
            assert!(serving, "{flags:?}: did not start");
            continue;
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{flags:?}: {stderr}");
        assert!(stderr.contains(&says), "{flags:?}: {stderr}");
        assert!(!stderr.contains("secret"), "{flags:?}: {stderr}");
    }
}

/// Every exit code of the documented set, each from the command that gives it.
#[test]
fn exit_codes_are_one_documented_set() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    let bad = tempfile::tempdir().unwrap();
    std::fs::write(bad.path().join("defaults.yaml"), "garbage: [").unwrap();
    let bad = bad.path().to_str().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve"];
        args.extend(LOOPBACK);
        args.extend(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (vec!["--help".into()], 0, "help"),
        (vec!["--version".into()], 0, "version"),
        (
            vec!["validate".into(), config.into()],
            0,
            "a valid directory",
        ),
        (vec![], 64, "no command"),
        (
            vec!["serve".into(), "--no-such-flag".into()],
            64,
            "an unknown flag",
        ),
        (
            serve(&["--max-connections", "many"]),
            64,
            "a bad flag value",
        ),
        (vec!["validate".into()], 64, "a missing argument"),
        (serve(&["--store", "redis"]), 64, "redis without an address"),
        (
            serve(&["--redis-calls-in-flight", "0"]),
            64,
            "no Redis call in flight",
        ),
        (
            serve(&["--redis-call-max-items", "5000"]),
            64,
            "a Redis call beyond its bound",
        ),
        (serve(&["--admin-token", ""]), 64, "an empty admin token"),
        (
            serve(&["--resp-token", " "]),
            64,
            "a blank Redis-protocol token",
        ),
        (vec!["simulate".into()], 64, "simulate without limits"),
        (
            vec!["validate".into(), bad.into()],
            78,
            "an invalid directory",
        ),
        (
            serve(&["--config", bad]),
            78,
            "serve on an invalid directory",
        ),
        (
            serve(&[
                "--tls-cert",
                "/nonexistent/cert.pem",
                "--tls-key",
                "/nonexistent/key.pem",
            ]),
            78,
            "unreadable TLS files",
        ),
        (
            vec!["simulate".into(), "--config".into(), bad.into()],
            78,
            "simulate on an invalid directory",
        ),
        (
            vec![
                "serve".into(),
                "--listen".into(),
                taken.clone(),
                "--admin-listen".into(),
                "127.0.0.1:0".into(),
                "--metrics-listen".into(),
                "127.0.0.1:0".into(),
            ],
            1,
            "a port in use",
        ),
    ];
    for (args, code, what) in cases {
        let out = Command::new(BIN)
            .args(&args)
            .env("CELLRATE_CONFIG", config)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{what}: cellrate {args:?}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn human_logs_off_a_terminal_are_plain_text() {
    // stderr is a pipe here, as it is for a file or a log collector: no colour codes, and
    // fields as values (`config=...`, not `config=Some(...)`). The process is stopped by
    // SIGTERM once it has announced itself; its whole stderr is then read.
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(LOOPBACK)
        .args(["--log-format", "human", "--config"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rx = crate::common::stderr_lines(&mut child);
    let wait = std::time::Duration::from_secs(20);
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.contains("cellrate serving"))
    {
        lines.push(rx.recv_timeout(wait).expect("cellrate announces itself"));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    // The reader ends when the process closes its stderr.
    while let Ok(line) = rx.recv_timeout(wait) {
        lines.push(line);
    }
    assert!(child.wait().unwrap().success());
    let text = lines.join("\n");
    assert!(text.contains("cellrate serving"), "{text}");
    assert!(!text.contains('\u{1b}'), "colour codes in: {text:?}");
    assert!(
        text.contains(&format!("config={}/config", env!("CARGO_MANIFEST_DIR"))),
        "{text}"
    );
    assert!(!text.contains("Some("), "{text}");
}

#[test]
fn simulate_charges_into_debt_and_refill_repays_it() {
    // 10 a second (one token per 100 ms): a charge of 15 leaves a debt of 5; a spend waits
    // for the debt and one token (600 ms), and passes then, not a nanosecond sooner.
    let out = simulate(
        &["--limit", "tok=10/10/1s"],
        concat!(
            r#"{"at_ns": 0, "op": "charge", "bucket": "tok", "cost": 15}"#,
            "\n",
            r#"{"at_ns": 0, "op": "spend", "items": [{"bucket": "tok", "mode": "charge", "cost": 0}]}"#,
            "\n",
            r#"{"at_ns": 599999999, "op": "check", "bucket": "tok"}"#,
            "\n",
            r#"{"at_ns": 600000000, "op": "spend", "bucket": "tok"}"#,
            "\n",
        ),
    );
    assert_eq!(out[0]["allowed"], false);
    assert_eq!(out[0]["remaining"], -5);
    assert_eq!(out[0]["retry_in_ns"], 600_000_000);
    assert_eq!(out[1]["remaining"], -5, "a charge of nothing only looks");
    assert_eq!(out[2]["allowed"], false);
    assert_eq!(out[3]["allowed"], true);
    assert_eq!(out[3]["remaining"], 0);
}
