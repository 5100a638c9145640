//! The composition root: builds the store, the decider and the reloader, assembles the
//! tonic services on their listeners, serves until shutdown, then drains.
//!
//! `run` takes already-bound listeners, a clock and a shutdown future, so that `main`
//! passes real ones and tests pass `127.0.0.1:0`, a [`crate::clock::FakeClock`] and a
//! oneshot. [`run_with_store`] also takes the store, so that tests can bring a store that
//! fails or stalls.
//!
//! Beside it, the process plumbing it wires: every listener's bounds ([`listener`]), the
//! tower layers of the gRPC stacks ([`rpc_metrics`], [`shortcut`]), admin security
//! ([`admin`]), the config reloader ([`reload`]) and the shutdown signal ([`shutdown`]).

pub mod admin;
pub mod http;
pub mod listener;
pub mod reload;
pub mod rpc_metrics;
pub mod shortcut;
pub mod shutdown;
pub mod tasks;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Server;

use crate::clock::Clock;
use crate::limits::config::LimitTable;
use crate::observe::health::Health;
use crate::observe::metrics::Metrics;
use crate::proto::v1::admin_server::AdminServer;
use crate::proto::v1::rate_limiter_server::RateLimiterServer;
use crate::resp::{RespServer, RespSettings};
use crate::server::admin::{AdminAuth, TlsPem};
use crate::server::listener::{ConnectionLimits, GuardedListener, InFlightLayer};
use crate::server::reload::{ReloadSettings, Reloader};
use crate::server::rpc_metrics::RpcMetricsLayer;
use crate::server::shortcut::ShortcutLayer;
use crate::service::envoy::{EnvoyOptions, EnvoyRateLimitService};
use crate::service::native::{AdminElsewhere, AdminService, RateLimiterService};
use crate::service::overrides::RuntimeOverrides;
use crate::service::rlqs::RlqsService;
use crate::service::{CallerLimits, Decider, MAX_MESSAGE_BYTES};
use crate::store::measured::MeasuredStore;
use crate::store::redis::RedisSettings;
#[cfg(feature = "redis")]
use crate::store::redis::{RedisOverrides, RedisStore};
use crate::store::shared::SharedOverrides;
use crate::store::{MemoryStore, Store, StoreError};

/// How the service runs, beyond its listeners.
#[derive(Clone)]
pub struct Settings {
    /// Bound on live buckets in the memory store.
    pub max_buckets: usize,
    /// Percent of `max_buckets` that buckets under caller-given limits may hold.
    pub caller_bucket_share: usize,
    /// Bounds on limits that callers give (or none at all).
    pub caller: CallerLimits,
    /// Temporary overrides: at most this many in force, each for at most this long.
    pub max_runtime_overrides: usize,
    pub max_override_ttl: crate::clock::Nanos,
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
    /// Bearer token required on admin RPCs.
    pub admin_token: Option<String>,
    /// TLS on both gRPC listeners.
    pub tls: Option<TlsPem>,
    /// Where buckets live.
    pub store: StoreSettings,
    /// Bounds and timeouts on every listener.
    pub server: ServerLimits,
    /// The Redis-protocol listener's token and command bounds (when it listens).
    pub resp: RespSettings,
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
    /// Longest time a gRPC request may take, body included (a caller's shorter
    /// `grpc-timeout` wins).
    pub request_timeout: Duration,
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
                idle_timeout: Duration::from_secs(60),
                ..ConnectionLimits::default()
            },
            resp: ConnectionLimits {
                max_connections: 1024,
                ..ConnectionLimits::default()
            },
            max_streams_per_connection: 100,
            max_in_flight: 4096,
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// Descriptors kept free for everything but connections (files, Redis, logs).
const RESERVED_FDS: u64 = 256;

impl ServerLimits {
    /// These limits with connection bounds that fit the process's descriptor limit
    /// (raised to its hard limit first).
    fn fitted(mut self) -> ServerLimits {
        let wanted = [
            self.decisions.max_connections,
            self.admin.max_connections,
            self.metrics.max_connections,
            self.resp.max_connections,
        ];
        let fitted = crate::server::listener::fit_to_fd_limit(
            &wanted,
            crate::server::listener::raise_fd_limit(),
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

    /// A gRPC server builder with the HTTP/2 limits.
    fn grpc_server(&self) -> Server {
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
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_buckets: crate::store::memory::DEFAULT_MAX_BUCKETS,
            caller_bucket_share: crate::store::memory::DEFAULT_CALLER_SHARE_PERCENT,
            caller: CallerLimits::default(),
            max_runtime_overrides: 10_000,
            max_override_ttl: 7 * 86_400 * crate::clock::SECOND,
            rlqs: crate::service::rlqs::RlqsSettings::default(),
            sweep_interval: Duration::from_secs(10),
            shutdown_delay: Duration::ZERO,
            grace: Duration::from_secs(10),
            envoy: EnvoyOptions::default(),
            reload: None,
            admin_token: None,
            tls: None,
            store: StoreSettings::Memory,
            server: ServerLimits::default(),
            resp: RespSettings::default(),
        }
    }
}

/// The bound sockets the service answers on.
pub struct Listeners {
    /// `RateLimiter`, Envoy's `RateLimitService`, health, reflection.
    pub decisions: TcpListener,
    /// `Admin`, health, reflection. Loopback by default.
    pub admin: TcpListener,
    /// HTTP: `/metrics`, `/healthz`, `/readyz`.
    pub metrics: Option<TcpListener>,
    /// The Redis protocol (`CL.THROTTLE`); off unless given.
    pub resp: Option<TcpListener>,
}

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("serving: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("{0}")]
    Store(#[from] StoreError),
}

const RATE_LIMITER: &str = "cellrate.v1.RateLimiter";
const ENVOY_RLS: &str = "envoy.service.ratelimit.v3.RateLimitService";
const ENVOY_RLQS: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
const ADMIN: &str = "cellrate.v1.Admin";
const HEALTH: &str = "grpc.health.v1.Health";
const REFLECTION_V1: &str = "grpc.reflection.v1.ServerReflection";
const REFLECTION_V1ALPHA: &str = "grpc.reflection.v1alpha.ServerReflection";

/// A reflection builder listing exactly `services` (the descriptor set holds both of our
/// services; each listener advertises only what it serves). Built as v1 and as v1alpha,
/// so that every grpcurl version works.
fn reflection(services: &[&'static str]) -> tonic_reflection::server::Builder<'static> {
    let mut builder = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    if services.contains(&ENVOY_RLS) || services.contains(&ENVOY_RLQS) {
        builder =
            builder.register_encoded_file_descriptor_set(crate::proto::ENVOY_RLS_DESCRIPTOR_SET);
    }
    services.iter().fold(builder, |builder, service| {
        builder.with_service_name(*service)
    })
}

/// Why `--store redis` cannot work in this build.
pub fn no_redis() -> StoreError {
    StoreError::Config(
        "this cellrate was built without the `redis` feature: --store redis is not available"
            .to_string(),
    )
}

/// Serves with the store `settings.store` names until `shutdown` resolves, then drains.
pub async fn run(
    limits: LimitTable,
    listeners: Listeners,
    clock: Arc<dyn Clock>,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let metrics = Metrics::new();
    let health = Health::new();
    // Set by the Redis store (a build without it never changes them).
    #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
    let mut shared_overrides: Option<Arc<dyn SharedOverrides>> = None;
    #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
    let mut shared_demand: Option<Arc<dyn crate::store::shared::SharedDemand>> = None;
    let store: Arc<dyn Store> = match &settings.store {
        StoreSettings::Memory => Arc::new(MemoryStore::with_caller_share(
            clock.clone(),
            MemoryStore::shards_for(settings.max_buckets),
            settings.max_buckets,
            settings.caller_bucket_share,
        )),
        #[cfg(feature = "redis")]
        StoreSettings::Redis {
            settings: redis,
            required_for_ready,
        } => {
            let store = RedisStore::new((**redis).clone(), clock.clone(), metrics.clone())?;
            shared_overrides = Some(Arc::new(RedisOverrides::new(redis)?));
            shared_demand = Some(Arc::new(crate::store::redis::RedisDemand::new(
                redis,
                3 * settings.rlqs.sync,
            )?));
            if *required_for_ready {
                health.require_store_health(store.healthy());
            }
            store
        }
        #[cfg(not(feature = "redis"))]
        StoreSettings::Redis { .. } => return Err(ServeError::Store(no_redis())),
    };
    if let StoreSettings::Memory = settings.store {
        metrics.max_buckets.set(settings.max_buckets as i64);
    }
    let parts = Parts {
        limits,
        listeners,
        store,
        clock,
        metrics,
        health,
        shared_overrides,
        shared_demand,
    };
    serve(parts, settings, shutdown).await
}

/// Serves with `store` until `shutdown` resolves (tests bring stores that fail or stall).
pub async fn run_with_store(
    limits: LimitTable,
    listeners: Listeners,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let parts = Parts {
        limits,
        listeners,
        store,
        clock,
        metrics: Metrics::new(),
        health: Health::new(),
        shared_overrides: None,
        shared_demand: None,
    };
    serve(parts, settings, shutdown).await
}

/// Copies the shared temporary overrides every `every` (at once first) until `stopped`.
/// A failure keeps the last copy in force (each override still expiring on time).
async fn sync_overrides(
    runtime: Arc<RuntimeOverrides>,
    limits: Arc<ArcSwap<LimitTable>>,
    metrics: Arc<Metrics>,
    every: Duration,
    stopped: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.cancelled() => return,
        }
        let table = limits.load_full();
        match runtime.sync(table.names()).await {
            Ok(synced) => {
                if failing {
                    tracing::info!("temporary overrides: copied from redis again");
                    failing = false;
                }
                if synced.changed {
                    tracing::info!(
                        applied = synced.applied,
                        unknown_names = synced.unknown_names,
                        "temporary overrides changed in redis: copied"
                    );
                }
                if !synced.rejected.is_empty() {
                    tracing::warn!(
                        rejected = synced.rejected.len(),
                        first = ?&synced.rejected[..synced.rejected.len().min(5)],
                        "temporary overrides in redis that are no valid override here were left out"
                    );
                }
            }
            Err(e) => {
                metrics.override_sync_failures.inc();
                if !failing {
                    tracing::warn!(
                        error = %e,
                        "temporary overrides: cannot copy them from redis; the last copy stays in force"
                    );
                    failing = true;
                }
            }
        }
    }
}

/// What a server is made of, besides its settings.
struct Parts {
    limits: LimitTable,
    listeners: Listeners,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// Where temporary overrides are shared with other replicas (the Redis store).
    shared_overrides: Option<Arc<dyn SharedOverrides>>,
    /// Where RLQS demand is shared with other replicas (the Redis store).
    shared_demand: Option<Arc<dyn crate::store::shared::SharedDemand>>,
}

/// Serves until `shutdown` resolves: health NOT_SERVING, wait the shutdown delay, stop
/// accepting, drain in-flight RPCs for up to the grace period.
async fn serve(
    parts: Parts,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let Parts {
        limits,
        listeners,
        store,
        clock,
        metrics,
        health,
        shared_overrides,
        shared_demand,
    } = parts;
    let addr = |l: &TcpListener| {
        l.local_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string())
    };
    let decisions_addr = addr(&listeners.decisions);
    let admin_addr = addr(&listeners.admin);
    let metrics_addr = listeners
        .metrics
        .as_ref()
        .map_or_else(|| "off".to_string(), addr);
    let resp_addr = listeners
        .resp
        .as_ref()
        .map_or_else(|| "off".to_string(), addr);
    metrics.config_loaded(limits.version(), clock.now());
    metrics.known_limits(limits.names().iter().map(|name| &*name.text));
    let denials = Arc::new(crate::observe::top::DenialTracker::new(clock.clone()));
    metrics.track_denials(denials.clone());
    health.config_loaded(limits.version());
    let store: Arc<dyn Store> = Arc::new(MeasuredStore::new(store, metrics.clone()));
    let limits = Arc::new(ArcSwap::from_pointee(limits));
    let mut runtime = RuntimeOverrides::new(
        clock.clone(),
        settings.max_runtime_overrides,
        settings.max_override_ttl,
    );
    if let Some(shared) = shared_overrides {
        runtime = runtime.shared(shared);
    }
    let runtime = Arc::new(runtime);
    let decider = Arc::new(
        Decider::new(limits.clone(), store.clone())
            .with_caller_limits(settings.caller)
            .with_runtime_overrides(runtime.clone()),
    );

    // The background tasks (sweeper, reloader, metrics listener) end when `stop_tasks` is
    // cancelled, after the drain; `tasks` waits for them.
    let stop_tasks = CancellationToken::new();
    let tasks = TaskTracker::new();

    // The sweeper drops expired buckets and keeps the live-bucket gauge current.
    tasks.spawn({
        let (store, metrics) = (store.clone(), metrics.clone());
        let every = settings.sweep_interval;
        let stopped = stop_tasks.clone();
        async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.cancelled() => return,
                }
                let dropped = store.sweep();
                metrics.swept_buckets.inc_by(dropped as u64);
                if let Some(live) = store.live_buckets() {
                    metrics.live_buckets.set(live as i64);
                }
            }
        }
    });

    // Replicas sharing temporary overrides copy them when they change.
    if runtime.is_shared() {
        let every = match &settings.store {
            StoreSettings::Redis { settings, .. } => settings.override_sync,
            StoreSettings::Memory => Duration::from_secs(1),
        };
        tasks.spawn(sync_overrides(
            runtime.clone(),
            limits.clone(),
            metrics.clone(),
            every,
            stop_tasks.clone(),
        ));
    }

    // The reloader swaps new limits into `limits`; decisions in flight keep the snapshot
    // they started with.
    if let Some(reload) = settings.reload.clone() {
        let reloader = Arc::new(Reloader::new(
            reload.dir.clone(),
            limits.clone(),
            metrics.clone(),
            health.clone(),
            clock.clone(),
            store.clone(),
        ));
        reloader.spawn(reload, stop_tasks.clone(), &tasks);
    }

    // The metrics listener serves until the tasks stop, so that a drain can be watched.
    let server_limits = settings.server.fitted();
    if let Some(listener) = listeners.metrics {
        let routes = crate::server::http::http_routes(metrics.clone(), health.clone());
        let listener = GuardedListener::new(listener, server_limits.metrics, "metrics");
        let stopped = stop_tasks.clone().cancelled_owned();
        tasks.spawn(crate::server::listener::serve_http1(
            listener,
            routes,
            stopped,
            Duration::from_secs(1),
        ));
    }

    // One health service for both listeners, so that shutdown flips both at once.
    let (grpc_health, health_service) = tonic_health::server::health_reporter();
    let health_service = health_service.max_decoding_message_size(MAX_MESSAGE_BYTES);
    grpc_health
        .set_serving::<RateLimiterServer<RateLimiterService>>()
        .await;
    grpc_health
        .set_serving::<RateLimitServiceServer<EnvoyRateLimitService>>()
        .await;
    grpc_health.set_serving::<AdminServer<AdminService>>().await;

    let services = [
        RATE_LIMITER,
        ENVOY_RLS,
        ENVOY_RLQS,
        HEALTH,
        REFLECTION_V1,
        REFLECTION_V1ALPHA,
    ];
    let admin_services = [ADMIN, HEALTH, REFLECTION_V1, REFLECTION_V1ALPHA];

    // Both gRPC servers stop accepting when `stop_servers` is cancelled; RLQS streams end
    // then too (Envoys reconnect to another replica).
    // A child of `stop_tasks`: however serving ends, the Redis-protocol connections end.
    let stop_servers = stop_tasks.child_token();

    if let Some(listener) = listeners.resp {
        let resp = RespServer::new(
            store.clone(),
            settings.caller,
            &settings.resp,
            metrics.clone(),
            server_limits.resp.handshake_timeout,
            settings.grace,
        );
        let listener = GuardedListener::new(listener, server_limits.resp, "resp");
        tasks.spawn(tasks::accept_resp(
            resp,
            listener,
            stop_servers.clone(),
            tasks.clone(),
        ));
    }

    let mut rlqs = RlqsService::new(
        decider.clone(),
        metrics.clone(),
        settings.rlqs,
        stop_servers.clone(),
    );
    if let Some(demand) = shared_demand {
        rlqs = rlqs.with_shared_demand(demand);
    }
    let mut decisions_server = server_limits.grpc_server();
    let mut admin_server = server_limits.grpc_server();
    if let Some(tls) = &settings.tls {
        // The whole TLS handshake within the handshake timeout: else a client that stalls
        // after its first bytes holds a connection until the idle timeout.
        decisions_server = decisions_server.tls_config(
            tls.decisions()
                .timeout(server_limits.decisions.handshake_timeout),
        )?;
        admin_server =
            admin_server.tls_config(tls.admin().timeout(server_limits.admin.handshake_timeout))?;
    }
    let decisions_incoming =
        GuardedListener::new(listeners.decisions, server_limits.decisions, "decisions");
    let admin_incoming = GuardedListener::new(listeners.admin, server_limits.admin, "admin");
    let native = RateLimiterServer::new(RateLimiterService::new(decider.clone(), metrics.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let envoy = RateLimitServiceServer::new(EnvoyRateLimitService::new(
        decider.clone(),
        settings.envoy,
        metrics.clone(),
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let decisions = decisions_server
        .layer(RpcMetricsLayer::new(metrics.clone()))
        .layer(InFlightLayer::new(server_limits.max_in_flight))
        // Innermost: the decision RPCs skip the router (and are mounted in it too).
        .layer(ShortcutLayer::new(envoy.clone(), native.clone()))
        .add_service(health_service.clone())
        .add_service(
            reflection(&services)
                .build_v1()?
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            reflection(&services)
                .build_v1alpha()?
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(native)
        .add_service(envoy)
        .add_service(
            RateLimitQuotaServiceServer::new(rlqs)
                .max_decoding_message_size(crate::service::rlqs::MAX_MESSAGE_BYTES),
        )
        // Admin calls that reach the decision port are told where to go.
        .add_service(
            AdminServer::new(AdminElsewhere::new(&admin_addr))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(
            decisions_incoming.into_stream(),
            stop_servers.clone().cancelled_owned(),
        );
    let admin = admin_server
        .layer(RpcMetricsLayer::new(metrics.clone()))
        .layer(InFlightLayer::new(server_limits.max_in_flight))
        .add_service(health_service)
        .add_service(
            reflection(&admin_services)
                .build_v1()?
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            reflection(&admin_services)
                .build_v1alpha()?
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(tonic::service::interceptor::InterceptedService::new(
            AdminServer::new(
                AdminService::new(decider)
                    .with_denials(denials)
                    .with_metrics(metrics.clone()),
            )
            .max_decoding_message_size(MAX_MESSAGE_BYTES),
            AdminAuth::new(settings.admin_token.as_deref()),
        ))
        .serve_with_incoming_shutdown(
            admin_incoming.into_stream(),
            stop_servers.clone().cancelled_owned(),
        );
    // Announced once everything is in place (tests and operators wait for this line).
    tracing::info!(
        listen = %decisions_addr,
        admin = %admin_addr,
        metrics = %metrics_addr,
        resp = %resp_addr,
        tls = settings.tls.is_some(),
        admin_token = settings.admin_token.is_some(),
        config = %settings
            .reload
            .as_ref()
            .map_or_else(|| "(fixed)".into(), |r| r.dir.display().to_string()),
        version = %limits.load().version(),
        "cellrate serving"
    );
    let servers = async { tokio::try_join!(decisions, admin).map(|_| ()) };
    tokio::pin!(servers);

    let result = tokio::select! {
        result = &mut servers => result.map_err(ServeError::from),
        _ = shutdown => {
            tracing::info!(
                delay = ?settings.shutdown_delay,
                grace = ?settings.grace,
                "shutting down: health NOT_SERVING, then draining in-flight RPCs"
            );
            grpc_health
                .set_not_serving::<RateLimiterServer<RateLimiterService>>()
                .await;
            grpc_health
                .set_not_serving::<RateLimitServiceServer<EnvoyRateLimitService>>()
                .await;
            grpc_health.set_not_serving::<AdminServer<AdminService>>().await;
            grpc_health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            health.set_not_ready();
            // Still serving: load balancers see NOT_SERVING and move away first.
            tokio::select! {
                _ = tokio::time::sleep(settings.shutdown_delay) => {}
                result = &mut servers => return finish(result.map_err(ServeError::from), stop_tasks, tasks).await,
            }
            stop_servers.cancel();
            match tokio::time::timeout(settings.grace, &mut servers).await {
                Ok(result) => result.map_err(ServeError::from),
                Err(_) => {
                    tracing::warn!(grace = ?settings.grace, "grace period over; abandoning in-flight RPCs");
                    Ok(())
                }
            }
        }
    };
    finish(result, stop_tasks, tasks).await
}

/// Stops the background tasks, waits for them, and returns the servers' result.
async fn finish(
    result: Result<(), ServeError>,
    stop_tasks: CancellationToken,
    tasks: TaskTracker,
) -> Result<(), ServeError> {
    stop_tasks.cancel();
    tasks.close();
    tasks.wait().await;
    result
}
