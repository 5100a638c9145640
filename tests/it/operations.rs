//! Operations in-process: hot reload (every way files get replaced), metrics, the admin
//! token, TLS and mTLS, and a graceful shutdown with an RPC in flight.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{http_get_async, item, poll_until, sample, Served};
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use tonic::Code;

fn defaults(burst: u64) -> String {
    format!("ApiRequestsPerKey: {{burst: {burst}, count: {burst}, period: 1s}}\n")
}

const NAMES: &str = "ApiRequestsPerKey: {number: 100, format: string}\n";

fn reload_settings(dir: &Path) -> Settings {
    crate::common::watching(dir, Duration::from_millis(100))
}

/// The burst in force for ApiRequestsPerKey, as Inspect reports it.
async fn burst(s: &mut Served) -> u64 {
    let r = s
        .admin
        .inspect(pb::InspectRequest {
            items: vec![item("ApiRequestsPerKey", "k", None)],
        })
        .await
        .unwrap()
        .into_inner();
    r.items[0].limit.as_ref().unwrap().burst
}

/// Polls until the burst in force is `want`, for at most 2 s (the bound).
async fn burst_becomes(s: &mut Served, want: u64) {
    let now = poll_until(
        Duration::from_secs(2),
        async || burst(s).await,
        |&b| b == want,
    )
    .await;
    assert_eq!(now, want, "the burst did not become {want} within 2 s");
}

async fn scrape(s: &Served) -> String {
    let (status, body) = http_get_async(s.metrics_addr, "/metrics").await;
    assert_eq!(status, 200);
    body
}

async fn served_on(dir: &Path) -> Served {
    let limits = LimitTable::load_dir(dir).unwrap();
    Served::full(limits, reload_settings(dir), None).await
}

#[tokio::test]
async fn reload_after_an_in_place_write() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("names.yaml"), NAMES).unwrap();
    std::fs::write(dir.path().join("defaults.yaml"), defaults(10)).unwrap();
    let mut s = served_on(dir.path()).await;
    // Spend 4 tokens: the TAT must survive the reload.
    s.decisions
        .check(pb::CheckRequest {
            items: vec![item("ApiRequestsPerKey", "k", Some(4))],
            ..Default::default()
        })
        .await
        .unwrap();
    std::fs::write(dir.path().join("defaults.yaml"), defaults(20)).unwrap();
    burst_becomes(&mut s, 20).await;
    let peek = s
        .admin
        .inspect(pb::InspectRequest {
            items: vec![item("ApiRequestsPerKey", "k", None)],
        })
        .await
        .unwrap();
    // The old TAT (4 tokens of 100ms) read under the new limit (50ms each): 8 tokens used.
    assert_eq!(peek.into_inner().items[0].remaining, 12);
    let metrics = scrape(&s).await;
    assert_eq!(
        sample(
            &metrics,
            "cellrate_config_reloads_total{result=\"success\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn reload_after_write_temp_then_rename() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("names.yaml"), NAMES).unwrap();
    std::fs::write(dir.path().join("defaults.yaml"), defaults(10)).unwrap();
    let mut s = served_on(dir.path()).await;
    // Editors write a hidden temporary file, then rename it over the original.
    let temp = dir.path().join(".defaults.yaml.tmp");
    std::fs::write(&temp, defaults(30)).unwrap();
    std::fs::rename(&temp, dir.path().join("defaults.yaml")).unwrap();
    burst_becomes(&mut s, 30).await;
}

#[cfg(unix)]
#[tokio::test]
async fn reload_after_a_kubernetes_configmap_symlink_swap() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The layout the kubelet makes: files are links into ..data, a link to a timestamped dir.
    std::fs::create_dir(d.join("..2026_11_22_01_00_00.1")).unwrap();
    std::fs::write(d.join("..2026_11_22_01_00_00.1/names.yaml"), NAMES).unwrap();
    std::fs::write(
        d.join("..2026_11_22_01_00_00.1/defaults.yaml"),
        defaults(10),
    )
    .unwrap();
    symlink("..2026_11_22_01_00_00.1", d.join("..data")).unwrap();
    symlink("..data/names.yaml", d.join("names.yaml")).unwrap();
    symlink("..data/defaults.yaml", d.join("defaults.yaml")).unwrap();
    let mut s = served_on(d).await;
    assert_eq!(burst(&mut s).await, 10);
    // An update: a new timestamped dir, a temporary link to it, renamed over ..data.
    std::fs::create_dir(d.join("..2026_11_22_01_05_00.2")).unwrap();
    std::fs::write(d.join("..2026_11_22_01_05_00.2/names.yaml"), NAMES).unwrap();
    std::fs::write(
        d.join("..2026_11_22_01_05_00.2/defaults.yaml"),
        defaults(40),
    )
    .unwrap();
    symlink("..2026_11_22_01_05_00.2", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    std::fs::remove_dir_all(d.join("..2026_11_22_01_00_00.1")).unwrap();
    burst_becomes(&mut s, 40).await;
}

#[tokio::test]
async fn an_invalid_file_keeps_the_old_limits_and_counts_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("names.yaml"), NAMES).unwrap();
    std::fs::write(dir.path().join("defaults.yaml"), defaults(10)).unwrap();
    let mut s = served_on(dir.path()).await;
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "ApiRequestsPerKey: {burst: 0, count: 1, period: 1s}\n",
    )
    .unwrap();
    let failures = poll_until(
        Duration::from_secs(2),
        async || {
            sample(
                &scrape(&s).await,
                "cellrate_config_reloads_total{result=\"failure\"}",
            )
        },
        |failures| failures.unwrap_or(0.0) >= 1.0,
    )
    .await;
    assert_eq!(failures, Some(1.0), "the failed reload is counted");
    assert_eq!(burst(&mut s).await, 10, "the old limits stay in force");
    let (_, health) = http_get_async(s.metrics_addr, "/healthz").await;
    assert!(
        health.contains("defaults.yaml: ApiRequestsPerKey: burst must be at least 1"),
        "{health}"
    );
    // Fixing the file recovers.
    std::fs::write(dir.path().join("defaults.yaml"), defaults(15)).unwrap();
    burst_becomes(&mut s, 15).await;
    let (_, health) = http_get_async(s.metrics_addr, "/healthz").await;
    assert!(health.contains("\"last_reload_error\":null"), "{health}");
}

#[tokio::test]
async fn metrics_count_decisions_rpcs_store_calls_and_config() {
    let limits =
        LimitTable::load_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config").as_ref()).unwrap();
    let version = limits.version().to_string();
    let settings = Settings {
        sweep_interval: Duration::from_millis(20),
        ..Settings::default()
    };
    let mut s = Served::full(limits, settings, None).await;
    for _ in 0..12 {
        let _ = s
            .decisions
            .check(pb::CheckRequest {
                items: vec![item("ApiRequestsPerKey", "m", None)],
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let _ = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![item("CertificatesPerDomain", "example.com", None)],
            ..Default::default()
        })
        .await
        .unwrap();
    let _ = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![item("Nope", "x", None)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    // Refused while converting the request, before any decision: timed and counted too.
    let mut both = item("ApiRequestsPerKey", "m", None);
    both.inline = Some(pb::InlineLimit::default());
    let _ = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![both],
            ..Default::default()
        })
        .await
        .unwrap_err();
    let m = scrape(&s).await;
    let series = |name: &str| sample(&m, name);
    assert_eq!(series("cellrate_decisions_total{api=\"native\",limit=\"ApiRequestsPerKey\",result=\"allowed\"}"), Some(10.0));
    assert_eq!(series("cellrate_decisions_total{api=\"native\",limit=\"ApiRequestsPerKey\",result=\"denied\"}"), Some(2.0));
    assert_eq!(
        series("cellrate_decisions_total{api=\"native\",limit=\"CertificatesPerDomain\",result=\"not_configured\"}"),
        Some(1.0)
    );
    assert_eq!(
        series("cellrate_rpc_duration_seconds_count{rpc=\"Check\"}"),
        Some(15.0)
    );
    assert_eq!(
        series("cellrate_rpc_requests_total{code=\"OK\",rpc=\"Check\"}"),
        Some(13.0)
    );
    assert_eq!(
        series("cellrate_rpc_requests_total{code=\"INVALID_ARGUMENT\",rpc=\"Check\"}"),
        Some(2.0)
    );
    assert_eq!(
        series("cellrate_store_operation_duration_seconds_count{operation=\"spend\"}"),
        Some(12.0)
    );
    assert_eq!(
        series(&format!("cellrate_config_info{{version=\"{version}\"}}")),
        Some(1.0)
    );
    assert_eq!(
        series("cellrate_config_loaded_timestamp_seconds"),
        Some(1_700_000_000.0)
    );
    // The sweeper keeps the live-bucket gauge current.
    let live = poll_until(
        Duration::from_secs(2),
        async || sample(&scrape(&s).await, "cellrate_live_buckets"),
        |live| *live == Some(1.0),
    )
    .await;
    assert_eq!(live, Some(1.0));
    let (status, _) = http_get_async(s.metrics_addr, "/readyz").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn ten_thousand_distinct_ids_make_no_new_series() {
    let mut s = Served::start(None).await;
    let envoy_request = |ip: String| {
        crate::common::envoy_request(
            "edge",
            &[&[("generic_key", "signup"), ("remote_address", &ip)]],
        )
    };
    // Warm up every series these requests touch.
    s.decisions
        .check(pb::CheckRequest {
            items: vec![item("ApiRequestsPerKey", "warm", None)],
            ..Default::default()
        })
        .await
        .unwrap();
    s.envoy
        .should_rate_limit(envoy_request("10.255.255.255".into()))
        .await
        .unwrap();
    let series_count = |m: &str| m.lines().filter(|l| !l.starts_with('#')).count();
    let before = series_count(&scrape(&s).await);
    for batch in 0..157 {
        let items = (0..64)
            .map(|i| item("ApiRequestsPerKey", &format!("id-{batch}-{i}"), None))
            .collect();
        s.decisions
            .check(pb::CheckRequest {
                items,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    for i in 0..200u32 {
        s.envoy
            .should_rate_limit(envoy_request(format!("10.{}.{}.1", i / 256, i % 256)))
            .await
            .unwrap();
    }
    let after = scrape(&s).await;
    assert_eq!(series_count(&after), before, "distinct ids created series");
    assert!(!after.contains("id-1-1"));
    assert!(
        sample(&after, "cellrate_decisions_total{api=\"native\",limit=\"ApiRequestsPerKey\",result=\"allowed\"}").unwrap() >= 10_048.0
    );
}

#[tokio::test]
async fn the_admin_token_is_required_when_set() {
    let limits =
        LimitTable::load_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config").as_ref()).unwrap();
    let settings = Settings {
        admin_token: Some("s3cret-token".into()),
        ..Settings::default()
    };
    let mut s = Served::full(limits, settings, None).await;
    let request = |token: Option<&str>| {
        let mut r = tonic::Request::new(pb::InspectRequest {
            items: vec![item("ApiRequestsPerKey", "t", None)],
        });
        if let Some(t) = token {
            r.metadata_mut().insert("authorization", t.parse().unwrap());
        }
        r
    };
    let e = s.admin.inspect(request(None)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = s
        .admin
        .inspect(request(Some("Bearer wrong")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = s
        .admin
        .reset(tonic::Request::new(pb::ResetRequest {
            items: vec![item("ApiRequestsPerKey", "t", None)],
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(s
        .admin
        .inspect(request(Some("Bearer s3cret-token")))
        .await
        .is_ok());
    // Health on the admin port needs no token (probes).
    assert_eq!(
        crate::common::health_status(s.admin_addr).await,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn tls_on_both_listeners_and_client_certificates_on_admin() {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

    let pki = crate::common::pki::Pki::new();
    let (ca_pem, client_cert, client_key) = (pki.ca.clone(), pki.client_cert, pki.client_key);
    let limits =
        LimitTable::load_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config").as_ref()).unwrap();
    let settings = Settings {
        tls: Some(cellrate::server::admin::TlsPem {
            cert: pki.server_cert.into_bytes(),
            key: pki.server_key.into_bytes(),
            admin_client_ca: Some(pki.ca.into_bytes()),
            client_ca: None,
            client_san: None,
        }),
        ..Settings::default()
    };
    let s = Served::full(limits, settings, None).await;
    let tls = || {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&ca_pem))
            .domain_name("localhost")
    };
    let connect = |addr: std::net::SocketAddr, config: ClientTlsConfig| async move {
        Channel::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(config)
            .unwrap()
            .connect()
            .await
    };

    // Decisions over TLS.
    let channel = connect(s.decisions_addr, tls()).await.unwrap();
    let mut client = pb::rate_limiter_client::RateLimiterClient::new(channel);
    let r = client
        .check(pb::CheckRequest {
            items: vec![item("ApiRequestsPerKey", "tls", None)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(r.into_inner().overall.unwrap().allowed);
    // Plaintext is refused.
    let mut plain = s.decisions.clone();
    assert!(plain
        .check(pb::CheckRequest {
            items: vec![item("ApiRequestsPerKey", "tls", None)],
            ..Default::default()
        })
        .await
        .is_err());

    // Admin needs a client certificate from the CA.
    let inspect = pb::InspectRequest {
        items: vec![item("ApiRequestsPerKey", "tls", None)],
    };
    let without = match connect(s.admin_addr, tls()).await {
        Ok(channel) => pb::admin_client::AdminClient::new(channel)
            .inspect(inspect.clone())
            .await
            .is_ok(),
        Err(_) => false,
    };
    assert!(!without, "admin answered a client without a certificate");
    let with = tls().identity(Identity::from_pem(client_cert, client_key));
    let channel = connect(s.admin_addr, with).await.unwrap();
    let r = pb::admin_client::AdminClient::new(channel)
        .inspect(inspect)
        .await
        .unwrap();
    assert_eq!(r.into_inner().items[0].remaining, 9);
}

#[tokio::test]
async fn client_certificates_on_the_decision_listener() {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

    let pki = crate::common::pki::Pki::new();
    let settings = Settings {
        tls: Some(cellrate::server::admin::TlsPem {
            cert: pki.server_cert.clone().into_bytes(),
            key: pki.server_key.clone().into_bytes(),
            admin_client_ca: None,
            client_ca: Some(pki.ca.clone().into_bytes()),
            client_san: None,
        }),
        ..Settings::default()
    };
    let limits =
        LimitTable::load_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config").as_ref()).unwrap();
    let s = Served::full(limits, settings, None).await;
    let tls = || {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&pki.ca))
            .domain_name("localhost")
    };
    let check = |config: ClientTlsConfig| async move {
        let channel = Channel::from_shared(format!("https://{}", s.decisions_addr))
            .unwrap()
            .tls_config(config)
            .unwrap()
            .connect()
            .await;
        match channel {
            Ok(channel) => pb::rate_limiter_client::RateLimiterClient::new(channel)
                .check(pb::CheckRequest {
                    items: vec![item("ApiRequestsPerKey", "mtls", None)],
                    ..Default::default()
                })
                .await
                .is_ok(),
            Err(_) => false,
        }
    };
    assert!(
        !check(tls()).await,
        "a client without a certificate was answered"
    );
    // A certificate from another CA is refused too.
    let other = crate::common::pki::Pki::new();
    let stranger = tls().identity(Identity::from_pem(&other.client_cert, &other.client_key));
    assert!(
        !check(stranger).await,
        "a stranger's certificate was accepted"
    );
    let with = tls().identity(Identity::from_pem(&pki.client_cert, &pki.client_key));
    assert!(check(with).await);
}

/// A store that holds `spend` until released, to have an RPC in flight.
struct StallStore {
    inner: cellrate::store::MemoryStore,
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl cellrate::store::Store for StallStore {
    fn spend<'a>(
        &'a self,
        items: &'a [cellrate::store::StoreItem],
    ) -> cellrate::store::StoreFuture<'a, cellrate::store::Outcome> {
        Box::pin(async move {
            self.entered.notify_one();
            self.release.notified().await;
            self.inner.spend_now(items)
        })
    }
    fn refund<'a>(
        &'a self,
        items: &'a [cellrate::store::StoreItem],
    ) -> cellrate::store::StoreFuture<'a, Vec<cellrate::gcra::Decision>> {
        Box::pin(async move { Ok(self.inner.refund_now(items)) })
    }
    fn reset<'a>(
        &'a self,
        keys: &'a [cellrate::limits::names::BucketKey],
    ) -> cellrate::store::StoreFuture<'a, u32> {
        Box::pin(async move { Ok(self.inner.reset_now(keys)) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flips_health_and_drains_the_rpc_in_flight() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let clock = Arc::new(cellrate::clock::FakeClock::new(crate::common::T0));
    let store = Arc::new(StallStore {
        inner: cellrate::store::MemoryStore::new(clock),
        entered: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
    });
    let limits =
        LimitTable::load_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config").as_ref()).unwrap();
    let settings = Settings {
        // Long enough that a loaded machine still sees the delay (health answers during it).
        shutdown_delay: Duration::from_secs(2),
        grace: Duration::from_secs(10),
        ..Settings::default()
    };
    let mut s = Served::full(limits, settings, Some(store.clone())).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.decisions_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status =
        |h: &mut tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>| {
            let mut h = h.clone();
            async move {
                h.check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .unwrap()
                .into_inner()
                .status
            }
        };
    assert_eq!(status(&mut health).await, ServingStatus::Serving as i32);

    let mut client = s.decisions.clone();
    let in_flight = tokio::spawn(async move {
        client
            .check(pb::CheckRequest {
                items: vec![item("ApiRequestsPerKey", "drain", None)],
                ..Default::default()
            })
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), store.entered.notified())
        .await
        .expect("the RPC reached the store");
    s.begin_stop();
    // During the shutdown delay health says NOT_SERVING while the server still answers.
    let mut flipped = false;
    let watch_until = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < watch_until {
        if status(&mut health).await == ServingStatus::NotServing as i32 {
            flipped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(flipped, "health did not flip to NOT_SERVING");
    // envoyproxy/ratelimit's name for the service flips with it.
    let ratelimit = tonic_health::pb::HealthCheckRequest {
        service: "ratelimit".into(),
    };
    let answer = health.check(ratelimit).await.unwrap().into_inner();
    assert_eq!(answer.status, ServingStatus::NotServing as i32);
    let (ready, _) = http_get_async(s.metrics_addr, "/readyz").await;
    assert_eq!(ready, 503);
    store.release.notify_one();
    let answer = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .unwrap()
        .unwrap();
    assert!(
        answer
            .expect("the in-flight RPC completes")
            .into_inner()
            .overall
            .unwrap()
            .allowed
    );
    tokio::time::timeout(Duration::from_secs(15), s.finished())
        .await
        .expect("the server stops after draining");
}
