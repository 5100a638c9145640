//! The client commands of the `cellrate` binary (`check`, `refund`, `admin inspect|reset`)
//! against real `cellrate serve` processes: plaintext, with an admin token, and with TLS and
//! client certificates; tables, JSON and exit codes as the README documents them.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::pki::Pki;
use crate::common::{serve, serve_with};

const BIN: &str = env!("CARGO_BIN_EXE_cellrate");

fn config() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"))
}

/// Runs `cellrate ARGS` with the server's addresses in the environment (as an operator
/// would export them), nothing else of the caller's.
fn cellrate(addr: &str, admin: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_clear()
        .env("CELLRATE_ADDR", addr)
        .env("CELLRATE_ADMIN_ADDR", admin)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The table's rows as whitespace-separated cells (the header's cells are words too).
fn rows(out: &Output) -> Vec<Vec<String>> {
    stdout(out)
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        })
        .collect()
}

fn json(out: &Output) -> Value {
    serde_json::from_str(&stdout(out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

#[test]
fn check_refund_inspect_and_reset_through_the_cli() {
    let server = serve();
    let run = |args: &[&str]| cellrate(&server.listen, &server.admin, args, &[]);

    // A check that is allowed: exit 0, an aligned table.
    let out = run(&["check", "NewOrdersPerAccount", "12345678"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        rows(&out),
        [
            [
                "NAME",
                "ID",
                "ALLOWED",
                "REMAINING",
                "RETRY AFTER",
                "RESET AFTER",
                "LIMIT",
                "POLICY"
            ],
            [
                "NewOrdersPerAccount",
                "12345678",
                "yes",
                "299",
                "0s",
                "18s",
                "600 per 3h, burst 300",
                "limited"
            ],
        ]
    );
    let header = stdout(&out).lines().next().unwrap().to_string();
    let value = stdout(&out).lines().nth(1).unwrap().to_string();
    assert_eq!(header.find("ALLOWED"), value.find("yes"), "columns align");

    // A check that is denied: exit 2, distinguishable from an error.
    let out = run(&[
        "check",
        "NewOrdersPerAccount",
        "12345678",
        "--cost",
        "300",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let denied = json(&out);
    assert_eq!(denied["allowed"], false);
    assert_eq!(denied["remaining"], 299);
    assert!(denied["retry_after_ns"].as_i64().unwrap() > 0);
    assert_eq!(denied["limit"]["key"], "3:12345678");

    // check-only spends nothing; refund gives one back.
    let out = run(&[
        "check",
        "NewOrdersPerAccount",
        "12345678",
        "--mode",
        "check-only",
        "--json",
    ]);
    assert_eq!(
        (out.status.code(), json(&out)["remaining"].as_i64()),
        (Some(0), Some(298))
    );
    let out = run(&["refund", "NewOrdersPerAccount", "12345678", "--json"]);
    assert_eq!(
        (out.status.code(), json(&out)["remaining"].as_i64()),
        (Some(0), Some(300))
    );

    // Admin: inspect, reset.
    run(&["check", "NewOrdersPerAccount", "12345678", "--cost", "5"]);
    let out = run(&[
        "admin",
        "inspect",
        "NewOrdersPerAccount",
        "12345678",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json(&out)["remaining"], 295);
    let out = run(&["admin", "reset", "NewOrdersPerAccount", "12345678"]);
    assert_eq!(
        rows(&out),
        [
            ["NAME", "ID", "DELETED"],
            ["NewOrdersPerAccount", "12345678", "1"]
        ]
    );
    let out = run(&[
        "admin",
        "inspect",
        "NewOrdersPerAccount",
        "12345678",
        "--json",
    ]);
    assert_eq!(json(&out)["remaining"], 300);
    // Where the limit comes from: the override entry and the id's comment.
    let out = run(&["admin", "inspect", "NewOrdersPerAccount", "87654321"]);
    let table = rows(&out);
    assert_eq!(table[0].last().map(String::as_str), Some("SOURCE"));
    assert_eq!(
        table[1].last().map(String::as_str),
        Some("overrides.yaml entry 2: doubled for a hosting provider")
    );
    let out = run(&["admin", "inspect", "NewOrdersPerAccount", "5", "--json"]);
    assert_eq!(json(&out)["source"], serde_json::json!({"kind": "default"}));

    // A deny-listed id: denied (exit 2), policy named.
    let out = run(&["check", "ApiRequestsPerKey", "key-revoked-0001", "--json"]);
    assert_eq!(
        (out.status.code(), json(&out)["policy"].as_str()),
        (Some(2), Some("denied"))
    );

    // --headers: the answer's rate-limit headers after the table, and in the JSON.
    let out = run(&["check", "NewOrdersPerAccount", "77", "--headers", "openai"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let after: Vec<&str> = text.lines().skip(2).collect();
    assert_eq!(
        after,
        [
            "x-ratelimit-limit-requests: 300",
            "x-ratelimit-remaining-requests: 299",
            "x-ratelimit-reset-requests: 36s"
        ],
        "{text}"
    );
    let out = run(&[
        "check",
        "NewOrdersPerAccount",
        "78",
        "--headers",
        "ietf",
        "--json",
    ]);
    assert_eq!(
        json(&out)["headers"],
        serde_json::json!([
            {"name": "RateLimit-Policy", "value": "\"NewOrdersPerAccount\";q=300;w=10800"},
            {"name": "RateLimit", "value": "\"NewOrdersPerAccount\";r=299;t=36"}
        ])
    );
    // Without it, none: not in the table's lines, not in the JSON.
    let out = run(&["check", "NewOrdersPerAccount", "77", "--json"]);
    assert_eq!(json(&out).get("headers"), None);

    // Errors: a refused request (65) with the server's message, no server (69), bad flags (64).
    let out = run(&["check", "NewOrderPerAccount", "1"]);
    assert_eq!(out.status.code(), Some(65));
    assert!(
        stderr(&out).contains("items[0].name: unknown limit name \"NewOrderPerAccount\" (did you mean \"NewOrdersPerAccount\"?)"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = closed.local_addr().unwrap().to_string();
    drop(closed);
    let out = cellrate(
        &nowhere,
        &nowhere,
        &["check", "NewOrdersPerAccount", "1"],
        &[],
    );
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot connect"), "{}", stderr(&out));
    let out = run(&["check", "NewOrdersPerAccount"]);
    assert_eq!(out.status.code(), Some(64));
    let out = run(&["check", "NewOrdersPerAccount", "1", "--mode", "maybe"]);
    assert_eq!(out.status.code(), Some(64));
    let out = run(&["check", "NewOrdersPerAccount", "1", "--headers", "loud"]);
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn admin_commands_send_the_token() {
    let server = serve_with(config(), &["--admin-token", "s3cret-token"]);
    let inspect = ["admin", "inspect", "ApiRequestsPerKey", "key-abc", "--json"];
    let out = cellrate(&server.listen, &server.admin, &inspect, &[]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
    assert!(stderr(&out).contains("Unauthenticated"), "{}", stderr(&out));
    // It says how to give the token.
    assert!(
        stderr(&out)
            .contains("no admin token was given: pass --admin-token or set CELLRATE_ADMIN_TOKEN"),
        "{}",
        stderr(&out)
    );
    let out = cellrate(
        &server.listen,
        &server.admin,
        &inspect,
        &[("CELLRATE_ADMIN_TOKEN", "wrong")],
    );
    assert_eq!(out.status.code(), Some(77));
    assert!(
        stderr(&out).contains(
            "the admin token given (--admin-token or CELLRATE_ADMIN_TOKEN) is not the server's"
        ),
        "{}",
        stderr(&out)
    );
    let out = cellrate(
        &server.listen,
        &server.admin,
        &inspect,
        &[("CELLRATE_ADMIN_TOKEN", "s3cret-token")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json(&out)["remaining"], 10);
    let mut with_flag = inspect.to_vec();
    with_flag.extend(["--admin-token", "s3cret-token"]);
    let out = cellrate(&server.listen, &server.admin, &with_flag, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn tls_and_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    Pki::new().write(dir.path());
    let file = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let server = serve_with(
        config(),
        &[
            "--tls-cert",
            &file("server.pem"),
            "--tls-key",
            &file("server.key"),
            "--admin-client-ca",
            &file("ca.pem"),
        ],
    );
    let ca = [("CELLRATE_TLS_CA", file("ca.pem"))];
    let ca: Vec<(&str, &str)> = ca.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let run =
        |args: &[&str], env: &[(&str, &str)]| cellrate(&server.listen, &server.admin, args, env);

    let out = run(&["check", "NewOrdersPerAccount", "4242", "--json"], &ca);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json(&out)["remaining"], 299);
    // Without the CA the client speaks plaintext to a TLS port: a failure that says why.
    let out = run(
        &[
            "check",
            "NewOrdersPerAccount",
            "4242",
            "--timeout-seconds",
            "3",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("give --tls-ca"), "{}", stderr(&out));

    // The admin listener wants a client certificate from the CA.
    let inspect = [
        "admin",
        "inspect",
        "NewOrdersPerAccount",
        "4242",
        "--json",
        "--timeout-seconds",
        "5",
    ];
    let out = run(&inspect, &ca);
    assert_ne!(
        out.status.code(),
        Some(0),
        "admin answered without a client certificate"
    );
    let mut with_cert = ca.clone();
    let (cert, key) = (file("client.pem"), file("client.key"));
    with_cert.extend([
        ("CELLRATE_CLIENT_CERT", cert.as_str()),
        ("CELLRATE_CLIENT_KEY", key.as_str()),
    ]);
    let out = run(&inspect, &with_cert);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json(&out)["remaining"], 299);

    // A TLS file that cannot be read is a configuration error (78).
    let out = run(
        &[
            "check",
            "ApiRequestsPerKey",
            "k",
            "--tls-ca",
            "/nonexistent/ca.pem",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
}

#[test]
fn admin_top_merges_replicas_with_exact_counts() {
    let (a, b) = (serve(), serve());
    let deny = |server: &crate::common::Process, name: &str, id: &str, times: usize| {
        for _ in 0..times {
            let out = cellrate(
                &server.listen,
                &server.admin,
                &["check", name, id, "--cost", "300"],
                &[],
            );
            assert!(matches!(out.status.code(), Some(0 | 2)), "{}", stderr(&out));
        }
    };
    // Each account's first 300-token check passes (the bucket was full); the rest are denied.
    deny(&a, "NewOrdersPerAccount", "42", 4); // 3 denials
    deny(&a, "NewOrdersPerAccount", "43", 2); // 1
    deny(&b, "NewOrdersPerAccount", "42", 3); // 2
    deny(&b, "ApiRequestsPerKey", "key-revoked-0001", 1); // 1 (deny list)

    let both = format!("{},{}", a.admin, b.admin);
    let out = cellrate(&a.listen, &both, &["admin", "top", "--json"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        json(&out),
        serde_json::json!({
            "minutes": 5,
            "replicas": 2,
            "names": [
                {"name": "NewOrdersPerAccount", "denials": 6, "ids": [
                    {"id": "42", "denials": 5, "error": 0},
                    {"id": "43", "denials": 1, "error": 0},
                ]},
                {"name": "ApiRequestsPerKey", "denials": 1, "ids": [
                    {"id": "key-revoked-0001", "denials": 1, "error": 0},
                ]},
            ]
        })
    );
    let out = cellrate(
        &a.listen,
        &a.admin,
        &[
            "admin",
            "top",
            "--name",
            "NewOrdersPerAccount",
            "--limit",
            "1",
        ],
        &[],
    );
    assert_eq!(
        rows(&out),
        [
            ["NAME", "ID", "DENIALS", "ERROR"]
                .map(String::from)
                .to_vec(),
            ["NewOrdersPerAccount", "(all)", "4"]
                .map(String::from)
                .to_vec(),
            ["NewOrdersPerAccount", "42", "3", "0"]
                .map(String::from)
                .to_vec(),
        ]
    );
    // Bounds are checked by the server; several addresses only for top.
    let out = cellrate(
        &a.listen,
        &a.admin,
        &["admin", "top", "--minutes", "16"],
        &[],
    );
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("minutes: 16 is not 1 to 15"),
        "{}",
        stderr(&out)
    );
    let out = cellrate(
        &a.listen,
        &both,
        &["admin", "inspect", "NewOrdersPerAccount", "42"],
        &[],
    );
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
}

/// `cellrate check --request-id` keeps a check; `cellrate settle` adjusts it once to the
/// actual cost; a retry says it was settled and changes nothing; an unknown id fails.
#[test]
fn settle_through_the_cli() {
    let server = serve();
    let run = |args: &[&str]| cellrate(&server.listen, &server.admin, args, &[]);
    let out = run(&[
        "check",
        "ApiRequestsPerKeyDaily",
        "key-cli",
        "--cost",
        "2000",
        "--request-id",
        "job-1",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json(&out)["remaining"], 8000);
    for already in [false, true] {
        let out = run(&["settle", "job-1", "3500", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let settled = json(&out);
        assert_eq!(settled["remaining"], 6500);
        assert_eq!(settled["already_settled"], already);
    }
    let out = run(&["settle", "job-1", "3500"]);
    assert_eq!(rows(&out)[1][..2], ["job-1", "6500"]);
    let out = run(&["settle", "never-kept", "1"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("unknown"), "{}", stderr(&out));
}

/// An attacker's text never acts on an operator's terminal or forges a log line: control
/// and format characters in an override's comment or author are refused (INVALID_ARGUMENT,
/// naming the character), and ids carrying them (a right-to-left override, a zero-width
/// space that makes `ad​min` look like `admin`) are shown escaped in every table and in the
/// human log, while JSON keeps them exact.
#[test]
fn control_and_format_characters_never_reach_a_terminal_or_a_log_line() {
    /// Killed when the test ends, however it ends.
    struct Server(std::process::Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut server = Server(
        Command::new(BIN)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args([
                "--metrics-listen",
                "127.0.0.1:0",
                "--log-format",
                "human",
                "--config",
            ])
            .arg(config())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let logs = crate::common::stderr_lines(&mut server.0);
    let wait = std::time::Duration::from_secs(20);
    let announced = (0..1_000)
        .map_while(|_| logs.recv_timeout(wait).ok())
        .find(|l| l.contains("cellrate serving"))
        .expect("cellrate announces itself");
    let address = |name: &str| {
        let at = announced.find(&format!("{name}=")).unwrap() + name.len() + 1;
        announced[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let (listen, admin) = (address("listen"), address("admin"));
    let set = |id: &str, comment: &str, author: &str| {
        cellrate(
            &listen,
            &admin,
            &[
                "admin",
                "override",
                "set",
                "ApiRequestsPerKey",
                id,
                "--count",
                "1",
                "--burst",
                "1",
                "--period",
                "1h",
                "--ttl",
                "10m",
                "--comment",
                comment,
                "--author",
                author,
            ],
            &[],
        )
    };
    // OSC 52 (write the clipboard), a forged log line, a C1 CSI, a bidirectional override
    // (NUL cannot be passed in argv: the unit tests of `bounded` refuse it).
    for (comment, author, code) in [
        ("copy \u{1b}]52;c;cm0gLXJmIH4=\u{7}", "ops", "U+001B"),
        ("ok", "eve\nINFO forged line", "U+000A"),
        ("ok", "eve\r", "U+000D"),
        ("C1 \u{9b}2J", "ops", "U+009B"),
        ("\u{202e}txt.exe", "ops", "U+202E"),
        ("ok", "zero\u{200b}width", "U+200B"),
    ] {
        let out = set("key-1", comment, author);
        assert_eq!(
            out.status.code(),
            Some(65),
            "{comment:?} {author:?}: {}",
            stderr(&out)
        );
        assert!(stderr(&out).contains(code), "{code}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains('\u{1b}'),
            "the error echoed the escape"
        );
    }
    let listed = cellrate(&listen, &admin, &["admin", "override", "list"], &[]);
    assert!(
        !stdout(&listed).contains("key-1"),
        "a refused override was set"
    );

    // Ids are the callers' own: kept exact, shown escaped.
    // (Control characters in ids are refused by the string format already.)
    let sneaky = "ad\u{200b}min\u{202e}\u{2028}x";
    let out = set(sneaky, "looks like admin", "ops");
    assert!(out.status.success(), "{}", stderr(&out));
    for (args, what) in [
        (&["admin", "override", "list"][..], "override list"),
        (
            &["admin", "inspect", "ApiRequestsPerKey", sneaky][..],
            "inspect",
        ),
    ] {
        let out = cellrate(&listen, &admin, args, &[]);
        assert!(out.status.success(), "{what}: {}", stderr(&out));
        let text = stdout(&out);
        assert!(
            text.contains("ad\\u{200B}min\\u{202E}\\u{2028}x"),
            "{what}: {text}"
        );
        assert!(
            text.lines()
                .all(|l| !l.chars().any(cellrate::text::unprintable)),
            "{what}: {text:?}"
        );
    }
    // Denied twice, so that `admin top` lists it.
    for _ in 0..3 {
        cellrate(
            &listen,
            &admin,
            &["check", "ApiRequestsPerKey", sneaky],
            &[],
        );
    }
    let top = cellrate(&listen, &admin, &["admin", "top"], &[]);
    assert!(stdout(&top).contains("ad\\u{200B}min"), "{}", stdout(&top));
    let top_text = stdout(&top);
    assert!(top_text
        .lines()
        .all(|l| !l.chars().any(cellrate::text::unprintable)));
    let raw = cellrate(
        &listen,
        &admin,
        &["admin", "override", "list", "--json"],
        &[],
    );
    assert!(stdout(&raw).contains("\\u200b") || stdout(&raw).contains('\u{200b}'));

    // The human log line of the override: escaped too, one line.
    let line = (0..1_000)
        .map_while(|_| logs.recv_timeout(wait).ok())
        .find(|l| l.contains("temporary override set"))
        .expect("the override is logged");
    assert!(line.contains("ad\\u{200B}min\\u{202E}\\u{2028}x"), "{line}");
    assert!(!line.chars().any(cellrate::text::unprintable), "{line:?}");
}

/// `admin override set` without `--author`: `$USER`, else `$LOGNAME`, else the user id
/// (the CLI runs here with nothing of the caller's environment, as in a container or a CI
/// job, where `USER` is often unset).
#[test]
fn an_override_always_has_an_author() {
    let server = serve();
    let uid = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid()
    };
    for (id, env, author) in [
        ("key-1", vec![], format!("uid {uid}")),
        ("key-2", vec![("LOGNAME", "logged")], "logged".to_string()),
        (
            "key-3",
            vec![("USER", "user"), ("LOGNAME", "logged")],
            "user".to_string(),
        ),
    ] {
        let args = [
            "admin",
            "override",
            "set",
            "ApiRequestsPerKey",
            id,
            "--deny",
            "--ttl",
            "1m",
            "--json",
        ];
        let out = cellrate(&server.listen, &server.admin, &args, &env);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(
            json(&out)["entries"][0]["author"],
            author.as_str(),
            "{env:?}"
        );
    }
}

/// `check --mode acquire|release --lease-id` on a concurrency limit: a retried acquire
/// takes no second slot, a full key exits 2, a release frees the slot.
#[test]
fn leases_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, text: &str| std::fs::write(dir.path().join(file), text).unwrap();
    write("names.yaml", "InFlight: {number: 100, format: string}\n");
    write(
        "defaults.yaml",
        "InFlight: {window: concurrency, count: 1, period: 30s}\n",
    );
    let server = serve_with(dir.path(), &[]);
    let run = |mode: &str, id: &str| {
        let args = [
            "check",
            "InFlight",
            "acme",
            "--mode",
            mode,
            "--lease-id",
            id,
            "--json",
        ];
        cellrate(&server.listen, &server.admin, &args, &[])
    };
    let answer = |out: &Output| {
        let v = json(out);
        (
            out.status.code(),
            v["allowed"].clone(),
            v["remaining"].clone(),
        )
    };
    let (yes, no) = (Value::Bool(true), Value::Bool(false));
    assert_eq!(
        answer(&run("acquire", "r1")),
        (Some(0), yes.clone(), 0.into())
    );
    assert_eq!(
        answer(&run("acquire", "r1")),
        (Some(0), yes.clone(), 0.into())
    );
    assert_eq!(
        answer(&run("acquire", "r2")),
        (Some(2), no.clone(), 0.into())
    );
    assert_eq!(answer(&run("release", "r1")).1, yes);
    assert_eq!(answer(&run("acquire", "r2")), (Some(0), yes, 0.into()));
    let args = [
        "check",
        "InFlight",
        "acme",
        "--mode",
        "acquire",
        "--lease-id",
        "r2",
    ];
    let table = rows(&cellrate(&server.listen, &server.admin, &args, &[]));
    assert_eq!(table[1][6], "1 in flight, hold 30s", "{table:?}");
    let out = run("acquire", "");
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("lease_id: missing"),
        "{}",
        stderr(&out)
    );
    let _ = no;
}

/// `admin top --in-flight`: the ids holding the most leases now, per concurrency limit,
/// as a table and as JSON, the leases of every replica given added up.
#[test]
fn admin_top_in_flight_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, text: &str| std::fs::write(dir.path().join(file), text).unwrap();
    write("names.yaml", "InFlight: {number: 100, format: string}\n");
    write(
        "defaults.yaml",
        "InFlight: {window: concurrency, count: 4, period: 30s}\n",
    );
    let (a, b) = (serve_with(dir.path(), &[]), serve_with(dir.path(), &[]));
    let acquire = |server: &crate::common::Process, tenant: &str, id: &str| {
        let args = [
            "check",
            "InFlight",
            tenant,
            "--mode",
            "acquire",
            "--lease-id",
            id,
        ];
        let out = cellrate(&server.listen, &server.admin, &args, &[]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    };
    for id in ["1", "2"] {
        acquire(&a, "acme", id);
        acquire(&b, "beta", id);
    }
    acquire(&b, "acme", "3");
    acquire(&b, "beta", "3");
    acquire(&a, "gamma", "1");
    let both = format!("{},{}", a.admin, b.admin);
    let out = cellrate(&a.listen, &both, &["admin", "top", "--in-flight"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let row = |cells: &[&str]| cells.iter().map(|c| c.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rows(&out),
        [
            row(&["NAME", "ID", "IN FLIGHT", "LIMIT"]),
            row(&["InFlight", "(all)", "7"]),
            row(&["InFlight", "acme", "3", "4"]),
            row(&["InFlight", "beta", "3", "4"]),
            row(&["InFlight", "gamma", "1", "4"]),
        ]
    );
    let args = ["admin", "top", "--in-flight", "--limit", "1", "--json"];
    let out = cellrate(&a.listen, &a.admin, &args, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        json(&out),
        serde_json::json!({"replicas": 1, "in_flight": [
            {"name": "InFlight", "leases": 3, "ids": [{"id": "acme", "leases": 2, "count": 4}]},
        ]})
    );
    // Denials are another view: --minutes has no meaning here.
    let args = ["admin", "top", "--in-flight", "--minutes", "5"];
    let out = cellrate(&a.listen, &a.admin, &args, &[]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("--minutes"), "{}", stderr(&out));
}
