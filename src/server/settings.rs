//! How the server runs: its settings (each with the default the flags document), the
//! bounds and timeouts on its listeners, where buckets live, and the sockets it answers on.

use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::Server;

use super::admin::TlsPem;
use super::connection_age::MaxConnectionAge;
use super::listener::ConnectionLimits;
use super::reload::ReloadSettings;
use crate::resp::RespSettings;
use crate::service::envoy::EnvoyOptions;
use crate::service::CallerLimits;
use crate::store::redis::RedisSettings;

/// How the service runs, beyond its listeners.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Bound on live buckets in the memory store.
    pub max_buckets: usize,
    /// Percent of `max_buckets` that buckets under caller-given limits may hold.
    pub caller_bucket_share: usize,
    /// Percent of the configured limits' buckets one limit name may hold (100: no share).
    pub bucket_name_share: usize,
    /// Bound on leases of concurrency limits in the memory store, and the percent of it
    /// that the leases of one limit name may hold.
    pub max_leases: usize,
    pub lease_name_share: usize,
    /// Bounds on limits that callers give (or none at all).
    pub caller: CallerLimits,
    /// Temporary overrides: at most this many in force, each for at most this long.
    pub max_runtime_overrides: usize,
    pub max_override_ttl: crate::clock::Nanos,
    /// Checks kept for `Settle`: each for this long, at most this many.
    pub settle_window: crate::clock::Nanos,
    pub settle_max_records: usize,
    /// Live holds (reservations) counted against one bucket key at most.
    pub settle_max_holds_per_key: usize,
    /// Envoy's RLQS on the decision listener: bounds and timings.
    pub rlqs: crate::service::rlqs::RlqsSettings,
    /// How often expired buckets are swept from the memory store.
    pub sweep_interval: Duration,
    /// After SIGTERM, how long health reports NOT_SERVING while requests are still served
    /// (so that load balancers stop sending before the listeners close).
    pub shutdown_delay: Duration,
    /// Then, how long in-flight RPCs may take to finish.
    pub grace: Duration,
    /// How Envoy's ShouldRateLimit answers (headers, global shadow mode).
    pub envoy: EnvoyOptions,
    /// Hot reload of the limits directory; `None`: the limits never change.
    pub reload: Option<ReloadSettings>,
    /// Limits over xDS from a control plane (with the directory's, if any).
    pub xds: Option<super::xds::XdsSettings>,
    /// Bearer token required on admin RPCs.
    pub admin_token: Option<String>,
    /// TLS on both gRPC listeners.
    pub tls: Option<TlsPem>,
    /// Where `tls` was read from, to re-read it when the files change (`None`: fixed).
    pub tls_files: Option<super::tls::TlsFiles>,
    /// Where buckets live.
    pub store: StoreSettings,
    /// The memory store's snapshot file (restored at start, written at shutdown).
    pub snapshot: Option<SnapshotSettings>,
    /// Bounds and timeouts on every listener.
    pub server: ServerLimits,
    /// The Redis-protocol listener's token and command bounds (when it listens).
    pub resp: RespSettings,
    /// envoyproxy/ratelimit's statistics also under a statsd mapping's names and labels.
    pub stats_mapping: Option<std::sync::Arc<crate::observe::metrics::StatsdMapping>>,
    /// Where the HTTP listeners serve the metrics (`--metrics-path`, checked there).
    pub metrics_path: String,
    /// Readiness (`/readyz`, `/healthcheck`) also needs limits in force.
    pub ready_needs_limits: bool,
    /// Labels on every series (`--metrics-labels`).
    pub metrics_labels: crate::observe::metrics::ExtraLabels,
    /// envoyproxy/ratelimit's per-descriptor statistics are kept (`--ratelimit-stats`).
    pub ratelimit_stats: bool,
    /// How the decision RPCs' unary calls are served (`--grpc-unary`).
    pub grpc_unary: crate::grpc::Unary,
}

/// The memory store's snapshot file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSettings {
    pub path: std::path::PathBuf,
    /// Also written this often while serving (a crash then loses at most this much).
    pub interval: Option<Duration>,
}

/// Bounds and timeouts on the listeners (see [`crate::server::listener`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    pub decisions: ConnectionLimits,
    pub admin: ConnectionLimits,
    pub metrics: ConnectionLimits,
    pub resp: ConnectionLimits,
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS` on both gRPC listeners.
    pub max_streams_per_connection: u32,
    /// Requests handled at once by each gRPC server; more are refused (UNAVAILABLE).
    pub max_in_flight: usize,
    /// Of those, at most this many from one client address (IPv6: its /64); 0: no share;
    /// `None`: a quarter of `max_in_flight` ([`ServerLimits::in_flight_per_address`]).
    pub max_in_flight_per_address: Option<usize>,
    /// Longest a unary request's body may take to arrive, from the first wait for it.
    pub body_timeout: Duration,
    /// Longest time a gRPC request may take, body included (a caller's shorter
    /// `grpc-timeout` wins).
    pub request_timeout: Duration,
    /// The longest a connection to a gRPC listener lives (`None`: no end).
    pub max_connection_age: Option<MaxConnectionAge>,
}

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        ServerLimits {
            decisions: ConnectionLimits::default(),
            admin: ConnectionLimits {
                max_connections: 256,
                ..ConnectionLimits::default()
            },
            metrics: ConnectionLimits {
                max_connections: 64,
                idle_timeout: METRICS_MAX_IDLE,
                ..ConnectionLimits::default()
            },
            resp: ConnectionLimits {
                max_connections: 1024,
                ..ConnectionLimits::default()
            },
            max_streams_per_connection: 100,
            max_in_flight: 4096,
            max_in_flight_per_address: None,
            body_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            max_connection_age: None,
        }
    }
}

/// By default one client address may hold this part of `max_in_flight`: a quarter, as of
/// a listener's connections.
pub const IN_FLIGHT_SHARE_DIVISOR: usize = 4;

/// The longest the metrics listener keeps an idle connection, whatever
/// `--idle-timeout-seconds` says: HTTP/1 scrapes and probes come and go.
pub const METRICS_MAX_IDLE: Duration = Duration::from_secs(60);

/// Descriptors kept free for everything but connections (files, Redis, logs).
const RESERVED_FDS: u64 = 256;

impl ServerLimits {
    /// These limits with connection bounds that fit the process's descriptor limit
    /// (raised to its hard limit first).
    pub(super) fn fitted(mut self) -> ServerLimits {
        let wanted = [
            self.decisions.max_connections,
            self.admin.max_connections,
            self.metrics.max_connections,
            self.resp.max_connections,
        ];
        let fitted = super::listener::fit_to_fd_limit(
            &wanted,
            super::listener::raise_fd_limit(),
            RESERVED_FDS,
        );
        if fitted != wanted {
            tracing::warn!(
                ?wanted,
                ?fitted,
                "connection bounds lowered to fit the open-files limit (raise `ulimit -n`)"
            );
        }
        self.decisions.max_connections = fitted[0];
        self.admin.max_connections = fitted[1];
        self.metrics.max_connections = fitted[2];
        self.resp.max_connections = fitted[3];
        self
    }

    /// The requests in flight one client address may hold: as set (at most
    /// `max_in_flight`), else a quarter of `max_in_flight` (at least 1); 0: no share.
    pub fn in_flight_per_address(&self) -> usize {
        match self.max_in_flight_per_address {
            Some(n) => n.min(self.max_in_flight),
            None => (self.max_in_flight / IN_FLIGHT_SHARE_DIVISOR).max(1),
        }
    }

    /// A gRPC server builder with the HTTP/2 limits.
    pub(super) fn grpc_server(&self) -> Server {
        Server::builder()
            .max_concurrent_streams(self.max_streams_per_connection)
            .timeout(self.request_timeout)
            // tonic passes None for both, which disables h2's defences against reset floods.
            .http2_max_pending_accept_reset_streams(Some(20))
            .http2_max_local_error_reset_streams(Some(1024))
            .http2_max_header_list_size(16 * 1024)
    }
}

/// Where buckets live.
#[derive(Debug, Clone, Default)]
pub enum StoreSettings {
    /// This process's memory (the default).
    #[default]
    Memory,
    /// Redis, shared by replicas; `required_for_ready` makes `/readyz` fail while Redis does.
    Redis {
        /// Boxed: far larger than the other variant.
        settings: Box<RedisSettings>,
        required_for_ready: bool,
    },
    /// memcached: envoyproxy/ratelimit's fixed windows only.
    Memcache(Box<crate::store::memcache::MemcacheSettings>),
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_buckets: crate::store::memory::DEFAULT_MAX_BUCKETS,
            caller_bucket_share: crate::store::memory::DEFAULT_CALLER_SHARE_PERCENT,
            bucket_name_share: crate::store::memory::DEFAULT_BUCKET_NAME_SHARE_PERCENT,
            max_leases: crate::store::memory::DEFAULT_MAX_LEASES,
            lease_name_share: crate::store::memory::DEFAULT_LEASE_NAME_SHARE_PERCENT,
            caller: CallerLimits::default(),
            max_runtime_overrides: 10_000,
            max_override_ttl: 7 * 86_400 * crate::clock::SECOND,
            settle_window: 3_600 * crate::clock::SECOND,
            settle_max_records: 100_000,
            settle_max_holds_per_key: crate::store::shared::DEFAULT_MAX_HOLDS_PER_KEY,
            rlqs: crate::service::rlqs::RlqsSettings::default(),
            sweep_interval: Duration::from_secs(10),
            shutdown_delay: Duration::ZERO,
            grace: Duration::from_secs(10),
            envoy: EnvoyOptions::default(),
            reload: None,
            xds: None,
            admin_token: None,
            tls: None,
            tls_files: None,
            store: StoreSettings::Memory,
            snapshot: None,
            server: ServerLimits::default(),
            resp: RespSettings::default(),
            stats_mapping: None,
            metrics_path: "/metrics".to_string(),
            ready_needs_limits: false,
            metrics_labels: Default::default(),
            ratelimit_stats: true,
            grpc_unary: crate::grpc::Unary::Direct,
        }
    }
}

/// The bound sockets the service answers on.
pub struct Listeners {
    /// `RateLimiter`, Envoy's `RateLimitService`, health, reflection; on TCP, or on a
    /// Unix socket (`--grpc-uds`).
    pub decisions: super::unix_socket::Bound,
    /// `Admin`, health, reflection. Loopback by default.
    pub admin: TcpListener,
    /// HTTP: `/metrics`, `/healthz`, `/readyz`, `/healthcheck`.
    pub metrics: Option<TcpListener>,
    /// A second HTTP listener with the same routes (envoyproxy/ratelimit's `PORT`, its
    /// probes' `/healthcheck`, apart from the metrics port).
    pub health: Option<TcpListener>,
    /// The Redis protocol (`CL.THROTTLE`); off unless given.
    pub resp: Option<TcpListener>,
}
