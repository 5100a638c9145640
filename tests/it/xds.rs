//! Limits over xDS (#36, part 4): cellrate subscribes to envoyproxy/ratelimit's
//! `RateLimitConfig` resources over ADS (state of the world) from a small control plane in
//! the suite that sends what Envoy Gateway sends, applies each update atomically with the
//! directory's files, ACKs it, NACKs an invalid one with the errors and keeps the last
//! good limits, opens the stream again after a disconnect, waits for the first update
//! unless forced, and speaks TLS and mTLS. Decisions go through a real gRPC client.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::ads::{entry, gateway_config, response, Ads};
use crate::common::pki::Pki;
use crate::common::resp_client::{Reply, RespClient};
use crate::common::{
    descriptor, http_get, http_get_async, poll_until, sample, serve_with, stderr_lines, watching,
    Served,
};
use cellrate::limits::config::LimitTable;
use cellrate::resp::commands::LOADING;
use cellrate::server::xds::{XdsSettings, MAX_ELEMENTS, MAX_RESOURCES};
use cellrate::server::Settings;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitUnit,
};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;
const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";
const WAIT: Duration = Duration::from_secs(10);

/// The codes of `times` requests by `user` on Envoy Gateway's route in `domain`.
async fn codes(
    envoy: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    user: &str,
    times: usize,
) -> Vec<i32> {
    let mut codes = Vec::new();
    for _ in 0..times {
        let request = RateLimitRequest {
            domain: domain.to_string(),
            descriptors: vec![descriptor(&[
                ("first-route", "first-route"),
                ("rule-0-match-0", user),
            ])],
            hits_addend: 0,
        };
        codes.push(
            envoy
                .should_rate_limit(request)
                .await
                .unwrap()
                .into_inner()
                .overall_code,
        );
    }
    codes
}

fn settings(ads: &Ads) -> XdsSettings {
    XdsSettings {
        node_id: "envoy-ratelimit".to_string(),
        node_metadata: vec![("zone".to_string(), "a".to_string())],
        headers: {
            let mut headers = tonic::metadata::MetadataMap::new();
            headers.insert("x-token", "t0ken".parse().unwrap());
            headers
        },
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        ..XdsSettings::new(ads.addr.to_string())
    }
}

async fn metric(s: &Served, series: &str) -> f64 {
    let (_, body) = http_get_async(s.metrics_addr, "/metrics").await;
    sample(&body, series).unwrap_or(-1.0)
}

#[tokio::test]
async fn envoy_gateways_updates_are_applied_acked_nacked_and_survive_a_disconnect() {
    let mut ads = Ads::start().await;
    ads.set_configs(
        "1",
        &[gateway_config(
            "default/eg/http",
            "first-route",
            5,
            RateLimitUnit::Second,
        )],
    );
    // A file domain beside them: both apply.
    let dir = tempfile::tempdir().unwrap();
    let file = "domain: files\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    std::fs::write(dir.path().join("config.yaml"), file).unwrap();
    let limits = LimitTable::load_dir(dir.path()).unwrap();
    let served = Settings {
        xds: Some(settings(&ads)),
        ..watching(dir.path(), Duration::from_millis(50))
    };
    // Ready only once the first update is in force.
    let s = Served::with_settings(limits, served).await;

    // The subscription, then the ACK of version 1.
    let first = ads.next(WAIT).await;
    let node = first.request.node.clone().unwrap();
    assert_eq!(node.id, "envoy-ratelimit");
    let zone = node.metadata.as_ref().and_then(|m| m.fields.get("zone"));
    assert_eq!(
        zone.and_then(|v| v.kind.clone()),
        Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
            "a".into()
        )),
        "{node:?}"
    );
    assert_eq!(first.request.type_url, TYPE_URL);
    assert!(first.request.version_info.is_empty() && first.request.response_nonce.is_empty());
    assert!(
        first.request.resource_names.is_empty(),
        "every resource (wildcard)"
    );
    let ack = ads.next_answer(WAIT).await.request;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("1", "s1-n1")
    );
    assert!(ack.error_detail.is_none());
    assert_eq!(ads.headers()[0].get("x-token").unwrap(), "t0ken");

    let envoy = &mut s.envoy.clone();
    assert_eq!(
        codes(envoy, "default/eg/http", "ann", 6).await,
        [OK, OK, OK, OK, OK, OVER]
    );
    let files = envoy
        .should_rate_limit(RateLimitRequest {
            domain: "files".into(),
            descriptors: vec![descriptor(&[("k", "v")])],
            hits_addend: 2,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        files.overall_code, OVER,
        "the file's limit of 1 applies beside xDS"
    );

    // An update: 2 per second, and a second listener.
    ads.set_configs(
        "2",
        &[
            gateway_config("default/eg/http", "first-route", 2, RateLimitUnit::Second),
            gateway_config("default/eg/https", "first-route", 1, RateLimitUnit::Minute),
        ],
    );
    let ack = ads.next_answer(WAIT).await.request;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("2", "s1-n2")
    );
    assert_eq!(
        codes(envoy, "default/eg/http", "bob", 3).await,
        [OK, OK, OVER]
    );
    assert_eq!(codes(envoy, "default/eg/https", "bob", 2).await, [OK, OVER]);

    // An invalid update (a descriptor without a key): NACKed with the error, naming the
    // resource and the entry; version 2 stays in force.
    let mut bad = gateway_config("default/eg/http", "first-route", 100, RateLimitUnit::Second);
    bad.descriptors[0].descriptors[0].key.clear();
    ads.set_configs("3", &[bad]);
    let nack = ads.next_answer(WAIT).await.request;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("2", "s1-n3")
    );
    let error = nack.error_detail.unwrap();
    assert_eq!(error.code, tonic::Code::InvalidArgument as i32);
    assert!(
        error.message.contains("xds:default/eg/http")
            && error.message.contains("descriptor has empty key"),
        "{}",
        error.message
    );
    assert_eq!(
        codes(envoy, "default/eg/http", "cat", 3).await,
        [OK, OK, OVER]
    );

    // A domain the files already configure: NACKed, nothing changes.
    let mut clash = gateway_config("files", "r", 9, RateLimitUnit::Second);
    clash.name = "clash".into();
    ads.set_configs("4", &[clash]);
    let nack = ads.next_answer(WAIT).await.request;
    assert_eq!(nack.version_info, "2");
    let message = nack.error_detail.unwrap().message;
    assert!(message.contains("duplicate domain 'files'"), "{message}");

    // Counted, and the stream is up.
    assert_eq!(
        metric(&s, "cellrate_xds_updates_total{result=\"applied\"}").await,
        2.0
    );
    assert_eq!(
        metric(&s, "cellrate_xds_updates_total{result=\"rejected\"}").await,
        2.0
    );
    assert_eq!(metric(&s, "cellrate_xds_connected").await, 1.0);

    // The control plane goes away and comes back with a good version: the client opens a
    // new stream from the last version it ACKed, and the limits in force never lapse.
    ads.set_configs(
        "5",
        &[gateway_config(
            "default/eg/http",
            "first-route",
            3,
            RateLimitUnit::Second,
        )],
    );
    let ack = ads.next_answer(WAIT).await.request;
    assert_eq!(ack.version_info, "5");
    assert_eq!(ads.streams(), 1);
    ads.disconnect();
    let reopened = ads.next(WAIT).await;
    assert_eq!(reopened.stream, 2);
    assert_eq!(
        reopened.request.version_info, "5",
        "the new stream resumes from 5"
    );
    assert!(reopened.request.response_nonce.is_empty());
    let ack = ads.next_answer(WAIT).await;
    assert_eq!((ack.stream, ack.request.version_info.as_str()), (2, "5"));
    assert_eq!(
        codes(envoy, "default/eg/http", "dan", 4).await,
        [OK, OK, OK, OVER]
    );
    assert_eq!(
        metric(&s, "cellrate_xds_updates_total{result=\"unchanged\"}").await,
        1.0
    );

    // A file reload keeps the xDS domains.
    let file2 = file.replace("requests_per_unit: 1", "requests_per_unit: 2");
    std::fs::write(dir.path().join("config.yaml"), file2).unwrap();
    let reloaded = poll_until(
        WAIT,
        async || metric(&s, "cellrate_config_reloads_total{result=\"success\"}").await,
        |n| *n >= 1.0,
    )
    .await;
    assert_eq!(reloaded, 1.0);
    assert_eq!(
        codes(envoy, "default/eg/http", "eve", 4).await,
        [OK, OK, OK, OVER]
    );
    s.stop().await;
    ads.stop();
}

/// A RateLimitConfig of `n` domains, each with one keyed entry.
fn domains(n: usize) -> Vec<RateLimitConfig> {
    (0..n)
        .map(|i| RateLimitConfig {
            name: format!("r{i}"),
            domain: format!("d{i}"),
            descriptors: vec![entry("k", "", Some((1, RateLimitUnit::Second)), vec![])],
        })
        .collect()
}

#[tokio::test]
async fn a_hostile_control_plane_is_nacked_or_left_and_the_last_good_limits_stay() {
    let mut ads = Ads::start().await;
    ads.set_configs(
        "good",
        &[gateway_config(
            "gw",
            "first-route",
            2,
            RateLimitUnit::Second,
        )],
    );
    let xds = XdsSettings {
        max_message_bytes: 256 * 1024,
        ..settings(&ads)
    };
    let served = Settings {
        xds: Some(xds),
        ..Settings::default()
    };
    let s = Served::with_settings(LimitTable::empty(), served).await;
    let ack = ads.next_answer(WAIT).await.request;
    assert_eq!(ack.version_info, "good");
    let envoy = &mut s.envoy.clone();
    assert_eq!(codes(envoy, "gw", "a", 3).await, [OK, OK, OVER]);

    let mut hostile: Vec<(
        &str,
        envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse,
    )> = Vec::new();
    // Too many resources.
    hostile.push((
        "more than 1000 resources",
        response("h1", &domains(MAX_RESOURCES + 1)),
    ));
    // A hundred thousand and one empty descriptors, 200 KB on the wire.
    let flat = RateLimitConfig {
        name: "flat".into(),
        domain: "flat".into(),
        descriptors: vec![RateLimitDescriptor::default(); MAX_ELEMENTS + 1],
    };
    hostile.push((
        "descriptors and replaces entries in one update",
        response("h2", &[flat]),
    ));
    // Nesting deeper than Envoy sends.
    let mut deep = entry("k", "", Some((1, RateLimitUnit::Second)), vec![]);
    for _ in 0..20 {
        deep = entry("k", "", None, vec![deep]);
    }
    let deep = RateLimitConfig {
        name: "deep".into(),
        domain: "deep".into(),
        descriptors: vec![deep],
    };
    hostile.push(("nested deeper than 16 levels", response("h3", &[deep])));
    // Another type, and bytes that are not a RateLimitConfig.
    let mut other = response("h4", &domains(1));
    other.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
    hostile.push(("only type.googleapis.com/ratelimit", other));
    let mut garbage = response("h5", &[]);
    garbage.resources.push(Any {
        type_url: TYPE_URL.into(),
        value: vec![0x1a, 0x7f, 0x01],
    });
    hostile.push(("malformed protobuf", garbage));
    // A unit from a newer control plane: refused by the config checks.
    let mut unit = gateway_config("gw", "first-route", 1, RateLimitUnit::Second);
    unit.descriptors[0].descriptors[0]
        .rate_limit
        .as_mut()
        .unwrap()
        .unit = 99;
    hostile.push(("invalid rate limit unit '99'", response("h6", &[unit])));

    for (says, response) in hostile {
        ads.set(response);
        let nack = ads.next_answer(WAIT).await.request;
        let error = nack.error_detail.unwrap_or_default();
        assert_eq!(nack.version_info, "good", "{says}: {}", error.message);
        assert!(error.message.contains(says), "{says}: {}", error.message);
        assert!(error.message.len() <= 4096);
        // The good limits answer throughout.
        assert_eq!(codes(envoy, "gw", says, 3).await, [OK, OK, OVER], "{says}");
    }

    // A message over --xds-max-message-bytes cannot be answered: the stream is left and
    // opened again (with backoff), and the last good version is what it resumes from.
    let streams = ads.streams();
    let huge = RateLimitConfig {
        name: "huge".into(),
        domain: "x".repeat(300 * 1024),
        descriptors: Vec::new(),
    };
    ads.set(response("h7", &[huge]));
    let reopened = poll_until(WAIT, async || ads.streams(), |n| *n > streams).await;
    assert!(
        reopened > streams,
        "a new stream after the oversized message"
    );
    assert_eq!(codes(envoy, "gw", "huge", 3).await, [OK, OK, OVER]);
    // Back to good: applied on the new stream.
    ads.set_configs(
        "better",
        &[gateway_config(
            "gw",
            "first-route",
            3,
            RateLimitUnit::Second,
        )],
    );
    let ack = loop {
        let seen = ads.next_answer(WAIT).await.request;
        if seen.version_info == "better" {
            break seen;
        }
    };
    assert!(ack.error_detail.is_none());
    assert_eq!(codes(envoy, "gw", "b", 4).await, [OK, OK, OK, OVER]);
    s.stop().await;
    ads.stop();
}

/// `cellrate` run as `ratelimit` with `vars`, its stderr as JSON lines.
fn ratelimit(vars: &[(&str, String)]) -> (Child, std::sync::mpsc::Receiver<String>) {
    ratelimit_in(&tempfile::tempdir().unwrap().keep(), vars)
}

/// As [`ratelimit`], in `dir` (its runtime directory is `dir/data/ratelimit/config`).
fn ratelimit_in(
    dir: &std::path::Path,
    vars: &[(&str, String)],
) -> (Child, std::sync::mpsc::Receiver<String>) {
    let bin = dir.join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cellrate"), &bin).unwrap();
    let mut command = Command::new(&bin);
    command
        .env_clear()
        // Envoy Gateway's own: a runtime directory that does not exist in the image.
        .env("RUNTIME_ROOT", dir.join("data"))
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_IGNOREDOTFILES", "true")
        .env("BACKEND_TYPE", "memory")
        .env("CONFIG_TYPE", "GRPC_XDS_SOTW")
        .env("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit")
        .env("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "50ms")
        .env("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "200ms")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("LOG_FORMAT", "json")
        .env("CELLRATE_ADMIN_LISTEN", "127.0.0.1:0");
    for (name, value) in vars {
        command.env(name, value);
    }
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let lines = stderr_lines(&mut child);
    (child, lines)
}

/// The fields of the first log line whose message is `message`.
fn line(lines: &std::sync::mpsc::Receiver<String>, message: &str) -> Option<serde_json::Value> {
    (0..1_000)
        .map_while(|_| lines.recv_timeout(WAIT).ok())
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .map(|v| v["fields"].clone())
        .find(|f| f["message"] == message)
}

async fn client(listen: &str) -> RateLimitServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{listen}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_millis(500))
        .connect_lazy();
    RateLimitServiceClient::new(channel)
}

// Two workers: the control plane serves in this process while the test blocks on the
// child's log lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_envoy_gateway_deploys_it_mtls_and_the_first_update_gates_serving() {
    let pki = Pki::new();
    let certs = tempfile::tempdir().unwrap();
    pki.write(certs.path());
    let path = |name: &str| certs.path().join(name).display().to_string();
    let mut ads = Ads::start_tls(&pki).await;
    let port = ads.addr.port();
    let tls = |with_client_cert: bool| {
        let mut vars = vec![
            ("CONFIG_GRPC_XDS_SERVER_URL", format!("localhost:{port}")),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".to_string()),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", path("ca.pem")),
        ];
        if with_client_cert {
            vars.push(("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", path("client.pem")));
            vars.push(("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", path("client.key")));
        }
        vars
    };

    // Without FORCE_START_WITHOUT_INITIAL_CONFIG: the process waits for the first update,
    // not ready and not answering decisions meanwhile.
    let (mut waiting, lines) = ratelimit(&tls(true));
    let Some(fields) = line(&lines, "waiting for the first xDS update before serving") else {
        let _ = waiting.kill();
        panic!("no waiting line");
    };
    let listen = fields["listen"].as_str().unwrap().to_string();
    let metrics = fields["metrics"].as_str().unwrap().to_string();
    let first = ads.next(WAIT).await.request;
    assert_eq!(first.node.unwrap().id, "envoy-ratelimit");
    assert_eq!(http_get(&metrics, "/readyz").0, 503);
    let mut envoy = client(&listen).await;
    let early = envoy
        .should_rate_limit(RateLimitRequest {
            domain: "gw".into(),
            ..Default::default()
        })
        .await;
    // Answered at once (UNAVAILABLE), not left hanging on an accepted connection.
    let early = early.expect_err("no decisions before the first update");
    assert_eq!(early.code(), tonic::Code::Unavailable, "{early:?}");
    assert!(early.message().contains("waiting for the first xDS update"));

    ads.set_configs(
        "1",
        &[gateway_config(
            "gw",
            "first-route",
            2,
            RateLimitUnit::Minute,
        )],
    );
    assert!(line(&lines, "cellrate serving").is_some());
    assert_eq!(http_get(&metrics, "/readyz").0, 200);
    assert_eq!(codes(&mut envoy, "gw", "u", 3).await, [OK, OK, OVER]);
    let _ = waiting.kill();
    let _ = waiting.wait();

    // Without a client certificate the mTLS control plane refuses the handshake; forced,
    // the process serves at once, keeps trying, and says why it cannot subscribe.
    let streams = ads.streams();
    let mut vars = tls(false);
    vars.push(("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".to_string()));
    let (mut forced, lines) = ratelimit(&vars);
    let Some(fields) = line(&lines, "cellrate serving") else {
        let _ = forced.kill();
        panic!("no serving line");
    };
    let mut envoy = client(fields["listen"].as_str().unwrap()).await;
    assert_eq!(
        codes(&mut envoy, "gw", "u", 3).await,
        [OK, OK, OK],
        "no limits yet"
    );
    let ended = line(
        &lines,
        "xDS stream ended; the limits in force stay; trying again",
    );
    let _ = forced.kill();
    let _ = forced.wait();
    let error = ended.expect("the failure is logged")["error"].to_string();
    // Rustls's client learns of the refusal after its handshake: the stream cannot open.
    assert!(
        error.contains("connecting") || error.contains("opening the stream"),
        "{error}"
    );
    assert_eq!(
        ads.streams(),
        streams,
        "no stream without a client certificate"
    );
    ads.stop();
}

/// A control plane that sends bad update after bad update: every one is NACKed and counted,
/// but the log holds the first rejection and then at most one line per 10 s (it held one
/// line, of up to 4 KiB, per rejection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_updates_are_all_counted_but_logged_sparingly() {
    const BAD: usize = 500;
    const REJECTED: &str = "xDS update rejected";
    let mut ads = Ads::start().await;
    ads.set_configs(
        "good",
        &[gateway_config(
            "gw",
            "first-route",
            2,
            RateLimitUnit::Second,
        )],
    );
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let addr = ads.addr.to_string();
    let server = serve_with(&config, &["--xds-server", &addr]);
    assert_eq!(ads.next_answer(WAIT).await.request.version_info, "good");
    let started = std::time::Instant::now();
    for i in 0..BAD {
        ads.set(DiscoveryResponse {
            version_info: format!("bad-{i}"),
            type_url: "type.googleapis.com/not.a.RateLimitConfig".to_string(),
            ..Default::default()
        });
        let nack = ads.next_answer(WAIT).await.request;
        assert!(nack.error_detail.is_some(), "update {i} NACKed: {nack:?}");
    }
    let elapsed = started.elapsed();
    let (_, metrics) = http_get(&server.metrics, "/metrics");
    assert_eq!(
        sample(&metrics, "cellrate_xds_updates_total{result=\"rejected\"}"),
        Some(BAD as f64),
        "every rejection counted"
    );
    // The log lines are written before the counter moves: they are all in the pipe now.
    let rejected: Vec<serde_json::Value> = (0..100_000)
        .map_while(|_| server.logs.recv_timeout(Duration::from_millis(500)).ok())
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .map(|v| v["fields"].clone())
        .filter(|f| {
            f["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(REJECTED))
        })
        .collect();
    let allowed = 1 + elapsed.as_secs() as usize / 10 + 1;
    assert!(
        !rejected.is_empty() && rejected.len() <= allowed,
        "{} lines for {BAD} rejections in {elapsed:?}",
        rejected.len()
    );
    let first = rejected[0]["error"].to_string();
    assert!(first.contains("not.a.RateLimitConfig"), "{first}");
    ads.stop();
}

/// As `ratelimit` over xDS, the runtime directory is not read (upstream reads no file
/// there): a file in it for the domain the control plane sends (Envoy Gateway's image may
/// hold one) no longer makes the first update a NACKed duplicate that keeps the process
/// waiting, and its limit does not apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_ratelimit_over_xds_the_runtime_directory_is_not_read() {
    let dir = tempfile::tempdir().unwrap().keep();
    let config = dir.join("data/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("gw.yaml"),
        "domain: gw\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .unwrap();
    let mut ads = Ads::start().await;
    ads.set_configs(
        "1",
        &[gateway_config(
            "gw",
            "first-route",
            2,
            RateLimitUnit::Minute,
        )],
    );
    let url = ("CONFIG_GRPC_XDS_SERVER_URL", ads.addr.to_string());
    let (mut child, lines) = ratelimit_in(&dir, &[url]);
    let answer = ads.next_answer(WAIT).await.request;
    let serving = line(&lines, "cellrate serving");
    let _ = (answer.error_detail.is_some() || serving.is_none()).then(|| child.kill());
    assert!(answer.error_detail.is_none(), "NACKed: {answer:?}");
    let serving = serving.expect("serving after the first update");
    let mut envoy = client(serving["listen"].as_str().unwrap()).await;
    assert_eq!(codes(&mut envoy, "gw", "u", 3).await, [OK, OK, OVER]);
    let _ = child.kill();
    let _ = child.wait();
    ads.stop();
}

/// While the first xDS update is awaited (a control plane that never sends), the
/// Redis-protocol listener answers each command that decides `LOADING` at once, as Redis
/// while it loads its data (redis-rs and redis-py wait and retry), where it used to hold
/// the connection unanswered; the connection's own commands are answered as usual. Once
/// an update is in force, `CL.THROTTLE` decides on the same connection. gRPC health's
/// `ratelimit` says NOT_SERVING meanwhile (it used to be refused UNAVAILABLE with the rest),
/// SERVING after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resp_listener_answers_loading_until_the_first_update() {
    let ads = Ads::start().await;
    let (mut child, lines) = ratelimit(&[
        ("CONFIG_GRPC_XDS_SERVER_URL", ads.addr.to_string()),
        ("CELLRATE_RESP_LISTEN", "127.0.0.1:0".to_string()),
        ("CELLRATE_HANDSHAKE_TIMEOUT_SECONDS", "1".to_string()),
    ]);
    let Some(fields) = line(&lines, "waiting for the first xDS update before serving") else {
        let _ = child.kill();
        panic!("no waiting line");
    };
    let listen = fields["listen"].as_str().unwrap().to_string();
    // gRPC health answers through the gate: `ratelimit` is not ready yet.
    let early_health = crate::common::grpc_health(&listen, "ratelimit").await;
    let resp = fields["resp"].as_str().unwrap().to_string();
    // A client that sends nothing is under the listener's bounds meanwhile too: closed
    // after the handshake timeout (1 s), not held.
    let silent = resp.clone();
    let silent = tokio::task::spawn_blocking(move || {
        let mut c = RespClient::connect(&silent);
        let opened = std::time::Instant::now();
        c.stream()
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        (c.read().map_err(|e| e.kind()), opened.elapsed())
    });
    let mut c = tokio::task::spawn_blocking(move || RespClient::connect(&resp))
        .await
        .unwrap();
    c.stream()
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let (waiting, mut c) = tokio::task::spawn_blocking(move || {
        let mut answers = Vec::new();
        for command in [
            &["CL.THROTTLE", "k", "1", "1", "60"][..],
            &["GCRA", "k", "1", "1", "60"],
            &["PING"],
            &["CLIENT", "SETNAME", "app"],
            &["SELECT", "0"],
        ] {
            c.send(command);
            let asked = std::time::Instant::now();
            answers.push((c.read().map_err(|e| e.kind()), asked.elapsed()));
        }
        (answers, c)
    })
    .await
    .unwrap();
    let silent = silent.await.unwrap();
    ads.set_configs("1", &[gateway_config("gw", "r", 2, RateLimitUnit::Minute)]);
    let serving = line(&lines, "cellrate serving");
    let after = tokio::task::spawn_blocking(move || c.call(&["CL.THROTTLE", "k", "1", "1", "60"]))
        .await
        .unwrap();
    let late_health = crate::common::grpc_health(&listen, "ratelimit").await;
    let _ = child.kill();
    let _ = child.wait();
    ads.stop();
    assert_eq!(early_health, Ok(ServingStatus::NotServing));
    assert_eq!(late_health, Ok(ServingStatus::Serving));
    let loading = Reply::Error(LOADING.to_string());
    let ok = Reply::Simple("OK".to_string());
    let expected = [loading.clone(), loading.clone(), loading, ok.clone(), ok];
    for ((answer, took), expected) in waiting.into_iter().zip(expected) {
        assert_eq!(answer, Ok(expected));
        assert!(
            took < Duration::from_millis(400),
            "answered at once: {took:?}"
        );
    }
    assert!(serving.is_some());
    assert_eq!(after.integers()[..3], [0, 2, 1], "{after:?}");
    let (closed, after) = silent;
    assert_eq!(closed, Err(std::io::ErrorKind::UnexpectedEof), "{after:?}");
    assert!(after < Duration::from_secs(4), "closed after {after:?}");
}

/// A first update that is NACKed leaves the process waiting, its decision listener
/// answering every request UNAVAILABLE at once (it accepted connections and never answered
/// them), and `/readyz` 503; the next good update puts limits in force and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nacked_first_update_leaves_the_decision_listener_answering_unavailable() {
    let mut ads = Ads::start().await;
    ads.set(DiscoveryResponse {
        version_info: "bad".to_string(),
        type_url: "type.googleapis.com/not.a.RateLimitConfig".to_string(),
        ..Default::default()
    });
    let (mut child, lines) = ratelimit(&[("CONFIG_GRPC_XDS_SERVER_URL", ads.addr.to_string())]);
    let waiting = line(&lines, "waiting for the first xDS update before serving");
    let nack = ads.next_answer(WAIT).await.request;
    let Some(fields) = waiting.filter(|_| nack.error_detail.is_some()) else {
        let _ = child.kill();
        panic!("no waiting line, or not NACKed: {nack:?}");
    };
    let mut envoy = client(fields["listen"].as_str().unwrap()).await;
    let asked = std::time::Instant::now();
    let early = envoy
        .should_rate_limit(RateLimitRequest {
            domain: "gw".into(),
            ..Default::default()
        })
        .await;
    let took = asked.elapsed();
    let metrics = fields["metrics"].as_str().unwrap();
    let ready = http_get(metrics, "/readyz").0;
    ads.set_configs(
        "1",
        &[gateway_config(
            "gw",
            "first-route",
            2,
            RateLimitUnit::Minute,
        )],
    );
    let serving = line(&lines, "cellrate serving");
    let after = codes(&mut envoy, "gw", "u", 3).await;
    let _ = child.kill();
    let _ = child.wait();
    ads.stop();
    let early = early.expect_err("no decisions while waiting");
    assert_eq!(early.code(), tonic::Code::Unavailable, "{early:?}");
    assert!(early.message().contains("waiting for the first xDS update"));
    assert!(
        took < Duration::from_millis(400),
        "answered at once: {took:?}"
    );
    assert_eq!(ready, 503);
    assert!(serving.is_some());
    assert_eq!(after, [OK, OK, OVER]);
}
