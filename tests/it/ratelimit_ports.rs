//! Run as `ratelimit`, upstream's ports are served as set even where they are cellrate's
//! own defaults: `PORT=8082` (upstream's HTTP port, here `/healthcheck`) takes the admin
//! listener's default port, and the admin listener moves to a loopback port the kernel
//! chooses instead of failing startup. Through a real process, HTTP and gRPC client.

use std::time::Duration;

use crate::common::ratelimit_answers::ratelimit_at;
use crate::common::{descriptor, http_get};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// The tests here take port 8082 in turn.
static PORT_8082: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits (bounded) until nothing else holds 127.0.0.1:`port`.
fn until_free(port: u16) {
    for _ in 0..100 {
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("127.0.0.1:{port} stayed busy for 10 s");
}

/// A runtime root whose `config` holds domain `rl`: `foo`, 2 a minute.
fn rules() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    let rl = "domain: rl\ndescriptors:\n  - key: foo\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    std::fs::write(config.join("rl.yaml"), rl).unwrap();
    root
}

#[tokio::test]
async fn port_8082_as_ratelimit_starts_and_serves() {
    let _turn = PORT_8082.lock().await;
    let root = rules();
    until_free(8082);
    let (_child, serving, _) = ratelimit_at(root.path(), &[("PORT", "8082")]);

    assert_eq!(serving["metrics"], "127.0.0.1:8082");
    let admin: std::net::SocketAddr = serving["admin"].as_str().unwrap().parse().unwrap();
    assert!(admin.ip().is_loopback() && admin.port() != 8082, "{admin}");
    assert_eq!(http_get("127.0.0.1:8082", "/healthcheck").0, 200);

    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes(&serving, 3).await, [ok, ok, over]);
}

/// The codes of `times` requests for `foo=a` to the `ratelimit` whose serving line is
/// `serving`.
async fn codes(serving: &serde_json::Value, times: usize) -> Vec<i32> {
    let listen = serving["listen"].as_str().unwrap();
    let mut envoy = RateLimitServiceClient::connect(format!("http://{listen}"))
        .await
        .unwrap();
    let mut codes = Vec::new();
    for _ in 0..times {
        let answer = envoy
            .should_rate_limit(RateLimitRequest {
                domain: "rl".into(),
                descriptors: vec![descriptor(&[("foo", "a")])],
                hits_addend: 0,
            })
            .await
            .expect("answered");
        codes.push(answer.into_inner().overall_code);
    }
    codes
}

/// A second `ratelimit` on the same host (the admin listener's default port taken by the
/// first) starts and serves, its admin listener moved to a kernel port with a warning,
/// where it exited 1 on `--admin-listen 127.0.0.1:8082`, a flag nobody passed.
#[tokio::test]
async fn a_second_ratelimit_on_the_host_moves_its_admin_listener_and_serves() {
    let _turn = PORT_8082.lock().await;
    let root = rules();
    until_free(8082);
    let (_first, first, _) = ratelimit_at(root.path(), &[]);
    assert_eq!(first["admin"], "127.0.0.1:8082");
    let (_second, second, log) = ratelimit_at(root.path(), &[]);
    let admin: std::net::SocketAddr = second["admin"].as_str().unwrap().parse().unwrap();
    assert!(admin.ip().is_loopback() && admin.port() != 8082, "{admin}");
    let warned = log.iter().any(|l| {
        l.contains("WARN") && l.contains("default port is taken") && l.contains(&admin.to_string())
    });
    assert!(warned, "{log:#?}");
    for serving in [&first, &second] {
        assert_eq!(codes(serving, 1).await, [Code::Ok as i32]);
    }
}
