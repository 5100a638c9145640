//! The harness both test tiers share (`tests/it`, the fast tier, and `tests/full`, the full
//! tier): a served cellrate on loopback with a fake clock and its clients, the `cellrate`
//! binary started on free ports, the real servers the full tier starts (redis-server, Valkey,
//! memcached, Envoy), raw HTTP/2 and HTTP/1 clients, and the helpers of the topics whose tests
//! need it. Each helper is defined here once; a tier's crate root names this crate `common`.
//!
//! A crate of its own (a dev-dependency of `cellrate`, never published) rather than a module
//! each tier includes by path: one copy of each helper, compiled once for both tiers.
// A test bounds its own waits in real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its tests.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cellrate::clock::{FakeClock, Nanos, SECOND};
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::{Listeners, Settings};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// The repository's root (this crate is `tests/support/` in it).
pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

#[cfg(unix)]
pub use process::serve_as;
pub use process::{
    cellrate_bin, serve, serve_logging, serve_with, serve_with_nofile, stderr_lines, Process,
};

/// The fake clock's start in served tests.
pub const T0: Nanos = 1_700_000_000 * SECOND;
pub const MS: Nanos = 1_000_000;

/// A running server; stops when dropped.
pub struct Served {
    pub clock: FakeClock,
    pub decisions: pb::rate_limiter_client::RateLimiterClient<Channel>,
    pub admin: pb::admin_client::AdminClient<Channel>,
    pub envoy: RateLimitServiceClient<Channel>,
    pub decisions_addr: std::net::SocketAddr,
    pub admin_addr: std::net::SocketAddr,
    pub metrics_addr: std::net::SocketAddr,
    /// The second HTTP listener (`--health-listen`, envoyproxy/ratelimit's `PORT`).
    pub health_addr: std::net::SocketAddr,
    /// The Redis-protocol listener.
    pub resp_addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Served {
    /// Serves the limits in `dir` (the repository's `config/` when `None`).
    pub async fn start(dir: Option<&Path>) -> Served {
        let dir = dir.map_or_else(|| Path::new(ROOT).join("config"), Path::to_path_buf);
        let limits = LimitTable::load_dir(&dir).expect("test config loads");
        Served::with_limits(limits).await
    }

    pub async fn with_limits(limits: LimitTable) -> Served {
        Served::with_settings(limits, harness_settings()).await
    }

    pub async fn with_settings(limits: LimitTable, settings: Settings) -> Served {
        Served::full(limits, settings, None).await
    }

    /// Serves `limits` with `settings`, on `store` (the memory store when `None`), with a
    /// metrics listener. Clients connect lazily, so a TLS server does not fail the start.
    pub async fn full(
        limits: LimitTable,
        settings: Settings,
        store: Option<Arc<dyn cellrate::store::Store>>,
    ) -> Served {
        let decisions = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Served::on(decisions, limits, settings, store).await
    }

    /// As [`Served::full`], with the decision listener given (to serve again on the address
    /// of a stopped server).
    pub async fn on(
        decisions: TcpListener,
        limits: LimitTable,
        settings: Settings,
        store: Option<Arc<dyn cellrate::store::Store>>,
    ) -> Served {
        let clock = FakeClock::new(T0);
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let health = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let health_addr = health.local_addr().unwrap();
        let resp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let resp_addr = resp.local_addr().unwrap();
        let decisions_addr = decisions.local_addr().unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let metrics_addr = metrics.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listeners = Listeners {
            decisions: decisions.into(),
            admin,
            metrics: Some(metrics),
            health: Some(health),
            resp: Some(resp),
        };
        let shutdown = async move {
            let _ = stopped.await;
        };
        let clock_arc: Arc<dyn cellrate::clock::Clock> = Arc::new(clock.clone());
        let task = match store {
            None => tokio::spawn(cellrate::server::run(
                limits, listeners, clock_arc, settings, shutdown,
            )),
            Some(store) => tokio::spawn(cellrate::server::run_with_store(
                limits, listeners, store, clock_arc, settings, shutdown,
            )),
        };
        let task = tokio::spawn(async move {
            task.await.unwrap().unwrap();
        });
        // Ready once /readyz answers: the watcher, sweeper and services are then in place.
        let mut ready = false;
        for _ in 0..500 {
            if tokio::net::TcpStream::connect(metrics_addr).await.is_ok()
                && http_get_async(metrics_addr, "/readyz").await.0 == 200
            {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            ready,
            "the served cellrate did not become ready within 10 s"
        );
        let channel = |addr: std::net::SocketAddr| {
            Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_lazy()
        };
        Served {
            clock,
            decisions: pb::rate_limiter_client::RateLimiterClient::new(channel(decisions_addr)),
            admin: pb::admin_client::AdminClient::new(channel(admin_addr)),
            envoy: RateLimitServiceClient::new(channel(decisions_addr)),
            decisions_addr,
            admin_addr,
            metrics_addr,
            health_addr,
            resp_addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Begins shutdown without waiting for it.
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Waits for the server task to end (after `begin_stop`).
    pub async fn finished(mut self) {
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    /// Stops the server and waits for it to finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

/// The limits of the repository's example configuration, `config/`.
pub fn example_limits() -> LimitTable {
    LimitTable::load_dir(&Path::new(ROOT).join("config")).expect("config/ loads")
}

/// The settings a served test runs with unless it says otherwise: `Settings::default()`,
/// which `defaults::the_harness_runs_with_what_serve_runs_with_by_default` holds to what
/// `cellrate serve` runs with when given no flags.
pub fn harness_settings() -> Settings {
    Settings::default()
}

/// Settings that watch `dir` for changes and reload it `debounce` after the last one.
pub fn watching(dir: &Path, debounce: Duration) -> Settings {
    Settings {
        reload: Some(cellrate::server::reload::ReloadSettings {
            dir: dir.to_path_buf(),
            watch: true,
            debounce,
            interval: Duration::from_secs(3600),
            sighup: false,
        }),
        ..Settings::default()
    }
}

/// The tokens left in the bucket of `name` and `id`, by an admin `Inspect`.
pub async fn remaining(s: &mut Served, name: &str, id: &str) -> i64 {
    let r = s
        .admin
        .inspect(pb::InspectRequest {
            items: vec![item(name, id, None)],
        })
        .await
        .unwrap();
    r.into_inner().items[0].remaining
}

/// An Envoy descriptor of `entries` (key, value), nothing else set.
pub fn descriptor(
    entries: &[(&str, &str)],
) -> envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A `ShouldRateLimit` request of one descriptor per entry list, in `domain`.
pub fn envoy_request(
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: domain.to_string(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}

/// A native `Check` of `items`, its answer or its status.
pub async fn check(
    s: &mut Served,
    items: Vec<pb::Item>,
) -> Result<pb::CheckResponse, tonic::Status> {
    Ok(s.decisions
        .check(pb::CheckRequest {
            items,
            ..Default::default()
        })
        .await?
        .into_inner())
}

/// A named item with an optional cost.
pub fn item(name: &str, id: &str, cost: Option<u64>) -> pb::Item {
    pb::Item {
        name: name.to_string(),
        id: id.to_string(),
        cost,
        ..Default::default()
    }
}

/// A store item of `cost` on `key` in `mode`, without a lease.
pub fn store_item(
    key: &cellrate::limits::names::BucketKey,
    limit: cellrate::gcra::Limit,
    cost: u64,
    mode: cellrate::gcra::Mode,
) -> cellrate::store::StoreItem {
    cellrate::store::StoreItem {
        key: key.clone(),
        limit,
        cost,
        mode,
        lease: None,
    }
}

/// A `CheckAndSpend` of `cost` on the bucket of `id` under name number 100.
pub fn spend_item(id: &str, limit: cellrate::gcra::Limit, cost: u64) -> cellrate::store::StoreItem {
    let key = cellrate::limits::names::BucketKey::new(100, id);
    store_item(&key, limit, cost, cellrate::gcra::Mode::CheckAndSpend)
}

pub fn nanos(d: &Option<prost_types::Duration>) -> Nanos {
    let d = d.as_ref().expect("duration present");
    d.seconds * SECOND + i64::from(d.nanos)
}

/// A plain HTTP/1.0 GET on loopback: (status code, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    status_and_body(&response)
}

/// An HTTP response's status code (0 if unreadable) and body.
fn status_and_body(response: &str) -> (u16, String) {
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

/// The overall gRPC health status (`grpc.health.v1`, service "") served at `addr`.
pub async fn health_status(addr: std::net::SocketAddr) -> i32 {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let request = HealthCheckRequest {
        service: String::new(),
    };
    health.check(request).await.unwrap().into_inner().status
}

/// `service`'s status in the gRPC health service at `listen` (through tonic-health's
/// client), or the code the check failed with.
pub async fn grpc_health(listen: &str, service: &str) -> Result<ServingStatus, tonic::Code> {
    let channel = Channel::from_shared(format!("http://{listen}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let request = HealthCheckRequest {
        service: service.to_string(),
    };
    match HealthClient::new(channel).check(request).await {
        Ok(answer) => Ok(ServingStatus::try_from(answer.into_inner().status).unwrap()),
        Err(status) => Err(status.code()),
    }
}

/// An HTTP/1.0 GET on loopback from async code: (status code, body).
pub async fn http_get_async(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        stream.read_to_string(&mut response),
    )
    .await
    .expect("HTTP answer within 10 s")
    .unwrap();
    status_and_body(&response)
}

/// The value of the sample `series` (name with labels, exactly as exposed), if present.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

pub mod ads;
pub mod ai_gateway;
pub mod budgets;
pub mod envoy;
pub mod h2_raw;
pub mod header_visibility;
pub mod held;
pub mod http1;
pub mod memcached;
pub mod pki;
pub mod process;
pub mod ratelimit_answers;
pub mod ratelimit_format;
pub mod readme;
pub mod redis_cell;
pub mod redis_module;
pub mod redis_server;
pub mod release_sweep;
pub mod reservations;
pub mod resp_client;
pub mod rlqs;
pub mod settle;
pub mod settle_attacks;
pub mod store_scenarios;

/// Polls `probe` every 20 ms, for at most `within`, until `done` holds for what it
/// returns; returns the last value either way, for the caller's assertion to report.
pub async fn poll_until<T>(
    within: Duration,
    mut probe: impl AsyncFnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let every = Duration::from_millis(20);
    let tries = (within.as_millis() / every.as_millis()).max(1);
    let mut value = probe().await;
    for _ in 0..tries {
        if done(&value) {
            break;
        }
        tokio::time::sleep(every).await;
        value = probe().await;
    }
    value
}
pub mod faulty;

/// A temporary directory holding `files` (name, text): a limits directory for a test.
pub fn directory(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (file, text) in files {
        std::fs::write(dir.path().join(file), text).unwrap();
    }
    dir
}

/// A small deterministic generator (xorshift64*), so that a failing seed can be rerun.
pub struct Rng(pub u64);

impl Rng {
    // Never ends, so not an `Iterator`: `next` as generators name it.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A limits directory of one name, `Budget`: 10 000 a month, so that no token comes back
/// during a test (one every 259 s).
pub fn budget_limits() -> tempfile::TempDir {
    directory(&[
        ("names.yaml", "Budget: {number: 107, format: string}\n"),
        (
            "defaults.yaml",
            "Budget: {burst: 10000, count: 10000, period: 720h}\n",
        ),
    ])
}

/// The naive in-flight counter the concurrency tests compare leases with: `Counter`, 8 of
/// an hour's worth per tenant (domain `inflight`), spent on the request path and given back
/// with `is_negative_hits` at stream end.
pub fn naive_in_flight_counter() -> cellrate::limits::config::LimitTable {
    cellrate::limits::config::LimitTable::from_files(&[
        (
            "names.yaml".into(),
            "Counter: {number: 100, format: string}\n".into(),
        ),
        (
            "defaults.yaml".into(),
            "Counter: {burst: 8, count: 8, period: 1h}\n".into(),
        ),
        (
            "descriptors.yaml".into(),
            "inflight:\n  - match: [{key: tenant}]\n    limits: [Counter]\n".into(),
        ),
    ])
    .unwrap()
}
