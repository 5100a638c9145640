//! The composition root: builds the store, the decider and the reloader, assembles the
//! tonic services on their listeners, serves until shutdown, then drains.
//!
//! [`run`] takes already-bound listeners, a clock and a shutdown future, so that `main`
//! passes real ones and tests pass `127.0.0.1:0`, a [`crate::clock::FakeClock`] and a
//! oneshot. [`run_with_store`] also takes the store, so that tests can bring a store that
//! fails or stalls.
//!
//! Beside it, the process plumbing it wires: its settings ([`Settings`]), where buckets
//! live ([`store`]), the two gRPC stacks (`grpc.rs`), the background tasks ([`tasks`]),
//! every listener's bounds ([`listener`]), the tower layers of the gRPC stacks
//! ([`rpc_metrics`], [`shortcut`]), admin security ([`admin`]), the config reloader
//! ([`reload`]) and the xDS client that feeds it ([`xds`]), the HTTP routes ([`http`]) and
//! the shutdown signal ([`shutdown`]).

pub mod admin;
pub mod connection_age;
mod grpc;
mod hpack;
pub mod http;
pub mod in_flight;
pub mod listener;
pub mod per_address;
pub mod reload;
pub mod rpc_metrics;
mod settings;
pub mod shortcut;
pub mod shutdown;
pub mod store;
pub mod tasks;
pub mod tls;
pub(crate) mod uds_authority;
pub mod unix_socket;
pub mod xds;

pub use settings::{
    Listeners, ServerLimits, Settings, SnapshotSettings, StoreSettings, IN_FLIGHT_SHARE_DIVISOR,
    METRICS_MAX_IDLE,
};
pub use store::no_redis;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::limits::config::LimitTable;
use crate::observe::health::Health;
use crate::observe::metrics::Metrics;
use crate::observe::top::DenialTracker;
use crate::resp::RespServer;
use crate::service::overrides::RuntimeOverrides;
use crate::service::rlqs::RlqsService;
use crate::service::settle::Settler;
use crate::service::Decider;
use crate::store::measured::MeasuredStore;
use crate::store::shared::Settlements;
use crate::store::{Store, StoreError};
use grpc::{GrpcHealth, Stacks};
use listener::GuardedListener;
use reload::Reloader;
use store::{StartProbe, Stores};

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("serving: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("TLS: {0}")]
    Tls(String),
}

/// Serves with the store `settings.store` names until `shutdown` resolves, then drains.
pub async fn run(
    limits: LimitTable,
    listeners: Listeners,
    clock: Arc<dyn Clock>,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let metrics = Metrics::configured(
        settings.stats_mapping.clone(),
        settings.metrics_labels.clone(),
        settings.ratelimit_stats,
    );
    let health = Health::new();
    if settings.ready_needs_limits {
        health.require_limits();
    }
    let stores = Stores::build(&settings, &clock, &metrics, &health)?;
    let server = Server {
        limits,
        listeners,
        stores,
        clock,
        metrics,
        health,
    };
    server.serve(settings, shutdown).await
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
    let server = Server {
        limits,
        listeners,
        stores: Stores::only(store).settling_here(&settings, &clock),
        clock,
        metrics: Metrics::configured(
            settings.stats_mapping.clone(),
            settings.metrics_labels.clone(),
            settings.ratelimit_stats,
        ),
        health: Health::new(),
    };
    server.serve(settings, shutdown).await
}

/// What the running server's parts share (the reloader, the tasks, the services).
#[derive(Clone)]
pub struct Shared {
    /// The limits in force; a reload swaps them.
    pub limits: Arc<ArcSwap<LimitTable>>,
    /// The store, measured.
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

/// A server, before it serves: what it is made of, besides its settings.
struct Server {
    limits: LimitTable,
    listeners: Listeners,
    stores: Stores,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// The background tasks: they end when `stop` is cancelled, after the drain; `tasks`
/// waits for them (and for the Redis-protocol connections).
struct Background {
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Server {
    /// Serves until `shutdown` resolves: health NOT_SERVING, wait the shutdown delay, stop
    /// accepting, drain in-flight RPCs for up to the grace period. Then, with a snapshot
    /// file, writes the memory store's buckets to it.
    async fn serve(
        self,
        settings: Settings,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let last = self.stores.snapshot.clone().zip(settings.snapshot.clone());
        let metrics = self.metrics.clone();
        let result = self.serve_until(settings, shutdown).await;
        if let Some((store, snapshot)) = last {
            tasks::write_snapshot(store, snapshot.path, metrics).await;
        }
        result
    }

    async fn serve_until(
        self,
        settings: Settings,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let addresses = Addresses::of(&self.listeners);
        let denials = Arc::new(DenialTracker::new(self.clock.clone()));
        self.report_loaded(&denials);
        let runtime = self.runtime_overrides(&settings);
        let shared = Shared {
            limits: Arc::new(ArcSwap::from_pointee(self.limits)),
            store: Arc::new(MeasuredStore::new(self.stores.store, self.metrics.clone())),
            clock: self.clock,
            metrics: self.metrics,
            health: self.health,
        };
        let decider = Arc::new(
            Decider::new(shared.limits.clone(), shared.store.clone())
                .with_caller_limits(settings.caller)
                .with_runtime_overrides(runtime.clone())
                .with_ratelimit_shape(settings.envoy.ratelimit_shape())
                .with_clock(shared.clock.clone()),
        );
        let background = Background {
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        };
        let limits = settings.server.fitted();
        let http = [self.listeners.metrics, self.listeners.health];
        let mut first_config = background.start(&shared, &runtime, &settings, limits, http);
        let (snapshot, probe) = (self.stores.snapshot.as_ref(), self.stores.start_probe);
        let holds = (self.stores.settlements.clone(), decider.clone());
        background.store_tasks(snapshot, probe, holds, &settings, &shared.metrics);
        tokio::pin!(shutdown);

        // Both gRPC servers stop accepting when `stop_servers` is cancelled; RLQS streams
        // end then too (Envoys reconnect to another replica). A child of the tasks' token:
        // however serving ends, the Redis-protocol connections end.
        let stop_servers = background.stop.child_token();
        let mut rlqs = RlqsService::new(
            decider.clone(),
            shared.metrics.clone(),
            settings.rlqs,
            stop_servers.clone(),
            shared.clock.clone(),
        );
        if let Some(demand) = self.stores.shared_demand {
            rlqs = rlqs.with_shared_demand(demand);
        }
        let health = GrpcHealth::serving(shared.health.clone()).await;
        background
            .tasks
            .spawn(health.follow(background.stop.clone()));
        // Without FORCE_START_WITHOUT_INITIAL_CONFIG (--xds-force-start): decisions only
        // once the control plane's limits are in force, as envoyproxy/ratelimit; meanwhile
        // the decision listener answers every request UNAVAILABLE, never leaving a
        // connection it accepted unanswered.
        let waiting = first_config
            .is_some()
            .then(|| Arc::new(AtomicBool::new(true)));
        let stacks = Stacks {
            tls: background.tls(&settings, &shared.metrics, &stop_servers)?,
            settings: &settings,
            limits,
            decider,
            metrics: shared.metrics.clone(),
            health: &health,
            settlements: self.stores.settlements.clone(),
            stop: stop_servers.clone(),
            waiting: waiting.clone(),
        };
        let decisions = stacks.decisions(self.listeners.decisions, rlqs, &addresses.admin)?;
        let admin = stacks.admin(self.listeners.admin, denials)?;
        let servers = async { tokio::try_join!(decisions, admin).map(|_| ()) };
        tokio::pin!(servers);
        // While the first xDS update is awaited, commands that decide are answered LOADING.
        if let Some(listener) = self.listeners.resp {
            let stop = stop_servers.clone();
            let gate = waiting.clone();
            background.serve_resp(listener, &shared, &settings, limits, stop, gate);
        }
        if let (Some(first_config), Some(waiting)) = (first_config.as_mut(), &waiting) {
            let gate = FirstUpdate {
                ready: first_config,
                waiting,
                health: &shared.health,
                addresses: &addresses,
                grace: settings.grace,
            };
            if let Some(ended) = gate
                .wait(servers.as_mut(), shutdown.as_mut(), &stop_servers)
                .await
            {
                return background.finish(ended).await;
            }
        }
        addresses.announce(&settings, shared.limits.load().version());
        let result = drain(servers, shutdown, &settings, &health, stop_servers).await;
        background.finish(result).await
    }

    /// Tells the counters and health which limits are loaded.
    fn report_loaded(&self, denials: &Arc<DenialTracker>) {
        let (metrics, health) = (&self.metrics, &self.health);
        metrics.config_loaded(self.limits.version(), self.clock.now());
        metrics.known_limits(self.limits.names().iter().map(|name| &*name.text));
        metrics.track_denials(denials.clone());
        health.config_loaded(self.limits.version());
        health.limits_loaded(self.limits.has_limits());
    }

    /// Temporary overrides, shared with other replicas when the store shares them.
    fn runtime_overrides(&self, settings: &Settings) -> Arc<RuntimeOverrides> {
        let mut runtime = RuntimeOverrides::new(
            self.clock.clone(),
            settings.max_runtime_overrides,
            settings.max_override_ttl,
        )
        .with_ratelimit_shape(settings.envoy.ratelimit_shape());
        if let Some(shared) = &self.stores.shared_overrides {
            runtime = runtime.shared(shared.clone());
        }
        Arc::new(runtime)
    }
}

impl Background {
    /// Starts the sweeper, the copy of shared overrides, the reloader, the xDS client
    /// and the metrics listener (which serves until the tasks stop, so that a drain can
    /// be watched). With xDS and without `force_start`: what says when a first update is
    /// in force.
    /// TLS for the gRPC listeners, re-read while serving when its files are known.
    fn tls(
        &self,
        settings: &Settings,
        metrics: &Arc<Metrics>,
        stop: &CancellationToken,
    ) -> Result<Option<Arc<tls::LiveTls>>, ServeError> {
        let Some(pem) = &settings.tls else {
            return Ok(None);
        };
        let live = Arc::new(tls::LiveTls::new(pem).map_err(ServeError::Tls)?);
        if let Some(files) = &settings.tls_files {
            let watch = live
                .clone()
                .watch(files.clone(), metrics.clone(), stop.clone());
            self.tasks.spawn(watch);
        }
        Ok(Some(live))
    }

    fn start(
        &self,
        shared: &Shared,
        runtime: &Arc<RuntimeOverrides>,
        settings: &Settings,
        limits: ServerLimits,
        http_listeners: [Option<TcpListener>; 2],
    ) -> Option<watch::Receiver<bool>> {
        let (stop, metrics) = (&self.stop, &shared.metrics);
        self.tasks.spawn(tasks::sweep(
            shared.store.clone(),
            metrics.clone(),
            settings.sweep_interval,
            stop.clone(),
        ));
        // Replicas sharing temporary overrides copy them when they change.
        if runtime.is_shared() {
            let every = match &settings.store {
                StoreSettings::Redis { settings, .. } => settings.override_sync,
                StoreSettings::Memory | StoreSettings::Memcache(_) => Duration::from_secs(1),
            };
            self.tasks.spawn(tasks::sync_overrides(
                runtime.clone(),
                shared.limits.clone(),
                metrics.clone(),
                every,
                stop.clone(),
            ));
        }
        // The reloader swaps new limits in; decisions in flight keep the snapshot they
        // started with.
        let dir = settings.reload.as_ref().map(|r| r.dir.clone());
        let reloader = Arc::new(Reloader::new(dir, settings.xds.is_some(), shared.clone()));
        if let Some(reload) = settings.reload.clone() {
            reloader.clone().spawn(reload, stop.clone(), &self.tasks);
        }
        for listener in http_listeners.into_iter().flatten() {
            let (metrics, health) = (metrics.clone(), shared.health.clone());
            let routes = http::http_routes(metrics, health, &settings.metrics_path);
            let listener = GuardedListener::new(listener, limits.metrics, "metrics");
            let stopped = stop.clone().cancelled_owned();
            let serve = listener::serve_http1(listener, routes, stopped, Duration::from_secs(1));
            self.tasks.spawn(serve);
        }
        let xds = settings.xds.clone()?;
        let (ready, first_config) = watch::channel(false);
        let force_start = xds.force_start;
        let client = xds::XdsClient {
            settings: xds,
            reloader,
            metrics: metrics.clone(),
            ready,
        };
        self.tasks.spawn(client.run(stop.clone()));
        (!force_start).then_some(first_config)
    }

    /// The store's own tasks: the first call to a shared store (which logs whether it
    /// answered), the release of holds not settled in time (with a settlements table),
    /// and with a snapshot file and an interval, writing the memory store's snapshot every
    /// interval.
    fn store_tasks(
        &self,
        store: Option<&Arc<crate::store::MemoryStore>>,
        probe: Option<StartProbe>,
        holds: (Option<Arc<dyn Settlements>>, Arc<Decider>),
        settings: &Settings,
        metrics: &Arc<Metrics>,
    ) {
        if let Some(probe) = probe {
            self.tasks.spawn(probe);
        }
        // Every replica releases the holds not settled in time (the table claims each once).
        if let (Some(table), decider) = holds {
            let settler = Settler::new(table, metrics.clone());
            let every = settings.sweep_interval;
            let release = tasks::release_holds(settler, decider, every, self.stop.clone());
            self.tasks.spawn(release);
        }
        let (Some(store), Some(snapshot)) = (store, &settings.snapshot) else {
            return;
        };
        if let Some(every) = snapshot.interval {
            self.tasks.spawn(tasks::snapshots(
                store.clone(),
                snapshot.path.clone(),
                metrics.clone(),
                every,
                self.stop.clone(),
            ));
        }
    }

    /// The Redis-protocol listener's accept loop, until `stop` (the servers' token).
    fn serve_resp(
        &self,
        listener: TcpListener,
        shared: &Shared,
        settings: &Settings,
        limits: ServerLimits,
        stop: CancellationToken,
        waiting: Option<Arc<AtomicBool>>,
    ) {
        let resp = RespServer::new(
            shared.store.clone(),
            settings.caller,
            &settings.resp,
            shared.metrics.clone(),
            shared.clock.clone(),
            limits.resp.handshake_timeout,
            settings.grace,
        )
        .waiting_for(waiting);
        let listener = GuardedListener::new(listener, limits.resp, "resp");
        let resp = Arc::new(resp);
        let accept = tasks::accept_resp(resp, listener, stop, self.tasks.clone());
        self.tasks.spawn(accept);
    }

    /// Stops the background tasks, waits for them, and returns the servers' result.
    async fn finish(self, result: Result<(), ServeError>) -> Result<(), ServeError> {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        result
    }
}

/// Resolves once the xDS client has put a first update in force.
/// The wait for the first xDS update in force, the decision listener answering
/// UNAVAILABLE meanwhile (`waiting`, cleared when it comes).
struct FirstUpdate<'a> {
    ready: &'a mut watch::Receiver<bool>,
    waiting: &'a AtomicBool,
    health: &'a Health,
    addresses: &'a Addresses,
    grace: Duration,
}

impl FirstUpdate<'_> {
    /// `None` once the update is in force; `Some` when serving ended first (the servers
    /// failed, or shutdown came: the servers are then stopped within the grace period).
    async fn wait(
        self,
        mut servers: std::pin::Pin<&mut impl Future<Output = Result<(), tonic::transport::Error>>>,
        shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
        stop_servers: &CancellationToken,
    ) -> Option<Result<(), ServeError>> {
        self.health.set_waiting_for_config(true);
        tracing::info!(
            listen = %self.addresses.decisions,
            metrics = %self.addresses.metrics,
            health = %self.addresses.health,
            resp = %self.addresses.resp,
            "waiting for the first xDS update before serving"
        );
        tokio::select! {
            _ = first_update(self.ready) => {}
            result = servers.as_mut() => return Some(result.map_err(ServeError::from)),
            _ = shutdown => {
                stop_servers.cancel();
                let _ = tokio::time::timeout(self.grace, servers).await;
                return Some(Ok(()));
            }
        }
        self.waiting.store(false, Ordering::Release);
        self.health.set_waiting_for_config(false);
        None
    }
}

async fn first_update(ready: &mut watch::Receiver<bool>) {
    loop {
        let in_force = *ready.borrow_and_update();
        if in_force || ready.changed().await.is_err() {
            return;
        }
    }
}

/// The listeners' addresses, for the line that announces the server.
struct Addresses {
    decisions: String,
    admin: String,
    metrics: String,
    health: String,
    resp: String,
}

impl Addresses {
    fn of(listeners: &Listeners) -> Addresses {
        let addr = |l: &TcpListener| {
            l.local_addr()
                .map_or_else(|_| "?".to_string(), |a| a.to_string())
        };
        let off = |l: &Option<TcpListener>| l.as_ref().map_or_else(|| "off".to_string(), addr);
        Addresses {
            decisions: listeners.decisions.describe(),
            admin: addr(&listeners.admin),
            metrics: off(&listeners.metrics),
            health: off(&listeners.health),
            resp: off(&listeners.resp),
        }
    }

    /// Announced once everything is in place (tests and operators wait for this line).
    fn announce(&self, settings: &Settings, version: &str) {
        tracing::info!(
            listen = %self.decisions,
            admin = %self.admin,
            metrics = %self.metrics,
            health = %self.health,
            resp = %self.resp,
            tls = settings.tls.is_some(),
            admin_token = settings.admin_token.is_some(),
            config = %settings
                .reload
                .as_ref()
                .map_or_else(
                    || match settings.xds.is_some() {
                        true => "(none: xDS alone)".into(),
                        false => "(fixed)".into(),
                    },
                    |r| r.dir.display().to_string()
                ),
            version = %version,
            tzdb = crate::clock::TZDB_VERSION,
            "cellrate serving"
        );
    }
}

/// Serves until `shutdown`, then: health NOT_SERVING (gRPC and `/readyz`) while requests
/// are still served for the shutdown delay (load balancers move away first), then stop
/// accepting and give in-flight RPCs the grace period.
async fn drain(
    servers: impl Future<Output = Result<(), tonic::transport::Error>>,
    shutdown: impl Future<Output = ()>,
    settings: &Settings,
    grpc_health: &GrpcHealth,
    stop_servers: CancellationToken,
) -> Result<(), ServeError> {
    tokio::pin!(servers);
    tokio::select! {
        result = &mut servers => return result.map_err(ServeError::from),
        _ = shutdown => {}
    }
    tracing::info!(
        delay = ?settings.shutdown_delay,
        grace = ?settings.grace,
        "shutting down: health NOT_SERVING, then draining in-flight RPCs"
    );
    grpc_health.not_serving().await;
    tokio::select! {
        _ = tokio::time::sleep(settings.shutdown_delay) => {}
        result = &mut servers => return result.map_err(ServeError::from),
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
