//! envoyproxy/ratelimit's example (`examples/ratelimit/`) through a real Envoy, and its
//! environment as Envoy Gateway sets it with a real redis-server (the file format itself is
//! the fast tier's `tests/it/ratelimit_format.rs`).
use std::path::Path;
use std::process::Command;

use crate::common::descriptor;
use crate::common::ratelimit_format::{served, statuses, OK, OVER};
use cellrate::clock::SECOND;
use cellrate::service::envoy::RatelimitCounting;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// examples/ratelimit/: limits in envoyproxy/ratelimit's format and an Envoy route config
/// in the spirit of its own example, through the real Envoy: each answer as
/// envoyproxy/ratelimit gives it (fixed windows, every hit counted, replaces, a zero
/// limit, shadow mode, unlimited, a wildcard), with its X-RateLimit headers.
#[tokio::test]
async fn envoyproxy_ratelimits_example_through_the_real_envoy() {
    use crate::common::envoy::Envoy;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ratelimit");
    let s = served(&root.join("config"), RatelimitCounting::FixedWindow).await;
    let envoy = Envoy::example_of("examples/ratelimit/envoy.yaml", s.decisions_addr, |_| {}).await;
    let mut client = envoy.client().await;
    let client = &mut client;
    // Every user: 2 a minute.
    assert_eq!(
        statuses(client, &[("x-user", "alice")], "/api", 3).await,
        [200, 200, 429]
    );
    // The free plan: 1 a minute, and the hit on the user's own limit counts too.
    let bob = [("x-user", "bob"), ("x-plan", "free")];
    assert_eq!(statuses(client, &bob, "/api", 2).await, [200, 429]);
    assert_eq!(
        statuses(client, &[("x-user", "bob")], "/api", 1).await,
        [429],
        "bob's 3rd hit"
    );
    // The account category replaces the free plan's limit: the user's 2 decide.
    let carol = [
        ("x-user", "carol"),
        ("x-plan", "free"),
        ("x-category", "account"),
    ];
    assert_eq!(statuses(client, &carol, "/api", 3).await, [200, 200, 429]);
    // Zero a minute: always over.
    assert_eq!(
        statuses(
            client,
            &[("x-user", "dave"), ("x-plan", "banned")],
            "/api",
            1
        )
        .await,
        [429]
    );
    // Shadow mode: the trial plan's limit is over from the 2nd request, answered OK.
    let erin = [("x-user", "erin"), ("x-plan", "trial")];
    assert_eq!(statuses(client, &erin, "/api", 3).await, [200, 200, 429]);
    // Unlimited plan: only the user's limit.
    let frank = [("x-user", "frank"), ("x-plan", "internal")];
    assert_eq!(statuses(client, &frank, "/api", 3).await, [200, 200, 429]);
    // A wildcard: 3 a minute for each path under /static/; others unlimited.
    assert_eq!(
        statuses(client, &[], "/static/app.css", 4).await,
        [200, 200, 200, 429]
    );
    assert_eq!(statuses(client, &[], "/static/app.js", 1).await, [200]);
    assert_eq!(statuses(client, &[], "/other", 5).await, [200; 5]);
    // The answer carries envoyproxy/ratelimit's draft-03 headers.
    let limited = client.get("/api", &[("x-user", "alice")]).await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(limited.header("x-ratelimit-reset"), Some("40"));
    // The next minute (T0 is 22:13:20): everyone starts afresh.
    s.clock.advance(40 * SECOND);
    assert_eq!(
        statuses(client, &[("x-user", "alice")], "/api", 1).await,
        [200]
    );
    drop(envoy);
    s.stop().await;
}

/// The binary run as `ratelimit` (the image's /bin/ratelimit) with envoyproxy/ratelimit's
/// environment, as Envoy Gateway sets it: the limits from RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
/// config, the Redis store, gRPC on GRPC_PORT, `/healthcheck` on PORT, metrics on
/// PROMETHEUS_ADDR; a variable that does not apply gets one warning, a bad value stops
/// startup naming it.
#[tokio::test]
async fn run_as_ratelimit_it_reads_envoyproxy_ratelimits_environment() {
    use crate::common::redis_server::RedisServer;
    use crate::common::{http_get, stderr_lines};
    use std::process::Stdio;
    use std::time::Duration;

    let redis = RedisServer::start();
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    let hourly = "domain: rl\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    std::fs::write(config.join("config.yaml"), hourly).unwrap();
    let bin = root.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cellrate"), &bin).unwrap();
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let environment = |command: &mut Command| {
        command
            .env_clear()
            .env("RUNTIME_ROOT", root.path().join("current"))
            .env("RUNTIME_SUBDIRECTORY", "ratelimit")
            .env("REDIS_SOCKET_TYPE", "tcp")
            .env("REDIS_URL", &redis_url)
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", "0")
            .env("HOST", "127.0.0.1")
            .env("PORT", "0")
            .env("USE_PROMETHEUS", "true")
            .env("PROMETHEUS_ADDR", "127.0.0.1:0")
            .env("USE_STATSD", "false")
            .env("LOG_FORMAT", "json")
            .env("LOG_LEVEL", "info")
            .env("CELLRATE_ADMIN_LISTEN", "127.0.0.1:0");
    };

    // A bad value stops startup, naming the variable.
    let mut bad = Command::new(&bin);
    environment(&mut bad);
    let out = bad.env("GRPC_PORT", "eighty").output().unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("GRPC_PORT=\"eighty\""));

    let mut command = Command::new(&bin);
    environment(&mut command);
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let lines = stderr_lines(&mut child);
    let mut warned = false;
    let mut announced = None;
    for line in (0..1_000).map_while(|_| lines.recv_timeout(Duration::from_secs(20)).ok()) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        let fields = &v["fields"];
        let message = fields["message"].as_str().unwrap_or_default();
        warned |= message.starts_with("USE_STATSD is accepted and not used");
        if message == "cellrate serving" {
            let field = |name: &str| fields[name].as_str().unwrap_or_default().to_string();
            announced = Some((field("listen"), field("metrics"), field("health")));
            break;
        }
    }
    let Some((listen, metrics, health)) = announced else {
        let _ = child.kill();
        panic!("no serving line");
    };
    assert!(warned, "USE_STATSD got its warning");
    assert_eq!(http_get(&health, "/healthcheck"), (200, "OK".to_string()));
    let (status, body) = http_get(&metrics, "/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("cellrate_decisions_total"), "{body}");

    let channel = tonic::transport::Channel::from_shared(format!("http://{listen}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut envoy = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(channel);
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = envoy
            .should_rate_limit(RateLimitRequest {
                domain: "rl".to_string(),
                descriptors: vec![descriptor(&[("remote_address", "10.1.1.1")])],
                hits_addend: 0,
            })
            .await
            .unwrap()
            .into_inner();
        codes.push(r.overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER]);
    // Counted in Redis, in the fixed window's bucket.
    let keys = redis.cli(&["KEYS", "cellrate:99@1h:*"]).unwrap();
    assert_eq!(keys.lines().count(), 1, "{keys}");
    let _ = child.kill();
    let _ = child.wait();
}
