//! Real Redis clients against cellrate's Redis-protocol listener (the real binary, wall
//! clock): `redis-cli` and `redis-benchmark` from Debian's redis-tools, and redis-py (in the
//! test virtualenv `scripts/test.sh` prepares), with and without a token.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::common::{http_get, sample, serve_with, Process};

fn config() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"))
}

fn port(addr: &str) -> &str {
    addr.rsplit_once(':').unwrap().1
}

fn tool(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("{program}: {e} (scripts/test.sh installs redis-tools from Debian's packages)")
        });
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn redis_cli(server: &Process, extra: &[&str]) -> String {
    let mut args = vec!["-h", "127.0.0.1", "-p", port(&server.resp)];
    args.extend_from_slice(extra);
    String::from_utf8(tool("redis-cli", &args).stdout).unwrap()
}

#[test]
fn redis_cli_as_users_type_it() {
    let server = serve_with(config(), &["--resp-listen", "127.0.0.1:0"]);
    assert_eq!(redis_cli(&server, &["PING"]), "PONG\n");
    assert_eq!(
        redis_cli(&server, &["CL.THROTTLE", "user123", "15", "30", "60"]),
        "0\n16\n15\n-1\n2\n"
    );
    // As at a terminal. Wall clock: a moment has passed, so the 8 s to full read 7.
    assert_eq!(
        redis_cli(
            &server,
            &["--no-raw", "CL.THROTTLE", "user123", "15", "30", "60", "3"]
        ),
        "1) (integer) 0\n2) (integer) 16\n3) (integer) 12\n4) (integer) -1\n5) (integer) 7\n"
    );
    let error = redis_cli(&server, &["CL.THROTTLE", "user123", "15", "30"]);
    assert_eq!(
        error.trim(),
        "Cell error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]"
    );
    // Many commands through one redis-cli, as a script pipes them in.
    let mut child = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", port(&server.resp)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let script: String = (0..10).map(|_| "CL.THROTTLE piped 4 1 3600\n").collect();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let limited: Vec<&str> = text.lines().step_by(5).collect();
    assert_eq!(limited, ["0", "0", "0", "0", "0", "1", "1", "1", "1", "1"]);
}

#[test]
fn redis_cli_with_a_token() {
    let token = "cli-token-5d1e3b7a90";
    let server = serve_with(
        config(),
        &["--resp-listen", "127.0.0.1:0", "--resp-token", token],
    );
    assert_eq!(
        redis_cli(&server, &["PING"]).trim(),
        "NOAUTH Authentication required."
    );
    assert_eq!(
        redis_cli(&server, &["-a", token, "--no-auth-warning", "PING"]),
        "PONG\n"
    );
    assert_eq!(
        redis_cli(
            &server,
            &[
                "--user",
                "default",
                "--pass",
                token,
                "--no-auth-warning",
                "-3",
                "PING"
            ]
        ),
        "PONG\n"
    );
}

#[test]
fn redis_benchmark_runs_cl_throttle() {
    let server = serve_with(config(), &["--resp-listen", "127.0.0.1:0"]);
    let out = tool(
        "redis-benchmark",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            port(&server.resp),
            "-n",
            "20000",
            "-c",
            "8",
            "-P",
            "16",
            "-r",
            "1000",
            "-q",
            "CL.THROTTLE",
            "bench:__rand_int__",
            "15",
            "30",
            "60",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("requests per second"), "{text}");
    // Every call reached cellrate and was decided: 20 000 on 1 000 keys of 16 tokens each.
    let (_, metrics) = http_get(&server.metrics, "/metrics");
    let allowed = sample(&metrics, "cellrate_resp_throttle_allowed_total").unwrap();
    let limited = sample(&metrics, "cellrate_resp_throttle_limited_total").unwrap();
    assert_eq!(allowed + limited, 20_000.0, "{metrics}");
    assert!(
        allowed <= 16_000.0 + 1_000.0 && limited >= 3_000.0,
        "{allowed} {limited}"
    );
}

fn python() -> String {
    std::env::var("CELLRATE_TEST_PYTHON").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/test-venv/bin/python").to_string()
    })
}

fn redis_py(server: &Process, token: Option<&str>) -> Value {
    let mut command = Command::new(python());
    command
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/resp_client.py"
        ))
        .arg(&server.resp);
    if let Some(token) = token {
        command.arg(token);
    }
    let out = command.output().unwrap_or_else(|e| {
        panic!(
            "{}: {e} (scripts/test.sh installs redis-py there)",
            python()
        )
    });
    assert!(
        out.status.success(),
        "redis-py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn check_redis_py(seen: &Value) {
    for protocol in ["resp2", "resp3"] {
        let s = &seen[protocol];
        assert_eq!(s["ping"], true, "{protocol}: {s}");
        assert_eq!(
            s["first"],
            serde_json::json!([0, 16, 15, -1, 120]),
            "{protocol}"
        );
        // Wall clock: the peek comes a moment later, so the bucket is full in under 120 s.
        assert_eq!(
            s["peek"],
            serde_json::json!([0, 16, 15, -1, 119]),
            "{protocol}"
        );
        let pipelined = s["pipelined"].as_array().unwrap();
        let allowed = pipelined.iter().filter(|r| r[0] == 0).count();
        assert_eq!(allowed, 15, "{protocol}: {s}");
        assert!(pipelined[15..]
            .iter()
            .all(|r| r[0] == 1 && r[1] == 16 && r[2] == 0));
        assert_eq!(
            s["error"], "Cell error: Couldn't parse as integer: x",
            "{protocol}"
        );
        assert_eq!(s["name"], "py-client", "{protocol}");
    }
}

#[test]
fn redis_py_over_resp2_and_resp3() {
    let server = serve_with(config(), &["--resp-listen", "127.0.0.1:0"]);
    check_redis_py(&redis_py(&server, None));
    let token = "py-token-2c9f4e6a81";
    let server = serve_with(
        config(),
        &["--resp-listen", "127.0.0.1:0", "--resp-token", token],
    );
    check_redis_py(&redis_py(&server, Some(token)));
}

/// redis-py sends `GCRA` and valkey-py sends `RL.THROTTLE` to the real binary, over RESP2
/// and RESP3, and get the numbers and errors Redis's and Valkey's clients expect.
#[test]
fn gcra_from_redis_py_and_rl_throttle_from_valkey_py() {
    let server = serve_with(config(), &["--resp-listen", "127.0.0.1:0"]);
    let out = Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/gcra_client.py"
        ))
        .arg(&server.resp)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", python()));
    assert!(
        out.status.success(),
        "gcra_client.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    for protocol in ["resp2", "resp3"] {
        let s = &seen[protocol];
        let json = |v: &[i64]| serde_json::json!(v);
        // Waits are rounded up to whole seconds: a peek a moment later still reads 360.
        assert_eq!(s["first"], json(&[0, 6, 5, -1, 360]), "{protocol}: {s}");
        assert_eq!(s["peek"], json(&[0, 6, 5, -1, 360]), "{protocol}: {s}");
        assert_eq!(s["heavy"], json(&[0, 6, 2, -1, 1440]), "{protocol}: {s}");
        assert_eq!(
            s["pipelined"],
            serde_json::json!([
                [0, 6, 1, -1, 1800],
                [0, 6, 0, -1, 2160],
                [1, 6, 0, 360, 2160]
            ]),
            "{protocol}: {s}"
        );
        assert_eq!(s["error"], "value is not a valid float", "{protocol}");
        assert_eq!(
            s["rl_first"],
            json(&[0, 16, 15, -1, 120]),
            "{protocol}: {s}"
        );
        assert_eq!(
            s["rl_heavy"],
            json(&[1, 16, 15, -1, 119]),
            "{protocol}: {s}"
        );
        assert_eq!(
            s["rl_error"], "wrong number of arguments for 'rl.throttle' command",
            "{protocol}"
        );
    }
}
