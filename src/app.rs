//! The composition root: builds the store and the decider, assembles the tonic services
//! on their listeners, serves until shutdown, then drains.
//!
//! `run` takes already-bound listeners, a clock and a shutdown future, so that `main`
//! passes real ones and tests pass `127.0.0.1:0`, a [`crate::clock::FakeClock`] and a
//! oneshot.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

use crate::clock::Clock;
use crate::limits::config::LimitTable;
use crate::proto::v1::admin_server::AdminServer;
use crate::proto::v1::rate_limiter_server::RateLimiterServer;
use crate::service::envoy::{EnvoyOptions, EnvoyRateLimitService};
use crate::service::native::{AdminService, RateLimiterService};
use crate::service::Decider;
use crate::store::MemoryStore;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// How the service runs, beyond its listeners.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Bound on live buckets in the memory store.
    pub max_buckets: usize,
    /// How often expired buckets are swept from the memory store.
    pub sweep_interval: Duration,
    /// How long in-flight RPCs may take to finish after shutdown begins.
    pub grace: Duration,
    /// How Envoy's ShouldRateLimit answers (headers, global shadow mode).
    pub envoy: EnvoyOptions,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_buckets: crate::store::memory::DEFAULT_MAX_BUCKETS,
            sweep_interval: Duration::from_secs(10),
            grace: Duration::from_secs(10),
            envoy: EnvoyOptions::default(),
        }
    }
}

/// The bound sockets the service answers on.
pub struct Listeners {
    /// `RateLimiter`, Envoy's `RateLimitService`, health, reflection.
    pub decisions: TcpListener,
    /// `Admin`, health, reflection. Loopback by default.
    pub admin: TcpListener,
}

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("serving: {0}")]
    Transport(#[from] tonic::transport::Error),
}

const RATE_LIMITER: &str = "cellrate.v1.RateLimiter";
const ADMIN: &str = "cellrate.v1.Admin";
const HEALTH: &str = "grpc.health.v1.Health";
const REFLECTION_V1: &str = "grpc.reflection.v1.ServerReflection";
const REFLECTION_V1ALPHA: &str = "grpc.reflection.v1alpha.ServerReflection";

/// Reflection listing exactly `services` (the descriptor set holds both of our services;
/// each listener advertises only what it serves). Both v1 and v1alpha, so that every
/// grpcurl version works.
macro_rules! reflection {
    ($build:ident, $services:expr) => {{
        let mut builder = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
        for service in $services {
            builder = builder.with_service_name(service);
        }
        builder.$build()?
    }};
}

/// Serves until `shutdown` resolves, then drains in-flight RPCs for up to `grace`.
pub async fn run(
    limits: LimitTable,
    listeners: Listeners,
    clock: Arc<dyn Clock>,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let store = Arc::new(MemoryStore::with_capacity(
        clock,
        crate::store::memory::DEFAULT_SHARDS,
        settings.max_buckets,
    ));
    let limits = Arc::new(ArcSwap::from_pointee(limits));
    let decider = Arc::new(Decider::new(limits, store.clone()));

    // The sweeper drops expired buckets; it holds only the store and is aborted below.
    let sweeper = tokio::spawn({
        let store = store.clone();
        let every = settings.sweep_interval;
        async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let dropped = store.sweep();
                tracing::debug!(dropped, "swept expired buckets");
            }
        }
    });

    // One health service for both listeners, so that shutdown flips both at once.
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimiterServer<RateLimiterService>>()
        .await;
    health.set_serving::<AdminServer<AdminService>>().await;
    health
        .set_serving::<RateLimitServiceServer<EnvoyRateLimitService>>()
        .await;

    let services = [RATE_LIMITER, HEALTH, REFLECTION_V1, REFLECTION_V1ALPHA];
    let admin_services = [ADMIN, HEALTH, REFLECTION_V1, REFLECTION_V1ALPHA];

    // Both servers stop when `stop` flips; each gets its own receiver.
    let (stop, stopped) = watch::channel(false);
    let until_stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };

    let decisions = Server::builder()
        .add_service(health_service.clone())
        .add_service(reflection!(build_v1, services))
        .add_service(reflection!(build_v1alpha, services))
        .add_service(RateLimiterServer::new(RateLimiterService::new(
            decider.clone(),
        )))
        .add_service(RateLimitServiceServer::new(EnvoyRateLimitService::new(
            decider.clone(),
            settings.envoy,
        )))
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listeners.decisions),
            until_stopped(stopped.clone()),
        );
    let admin = Server::builder()
        .add_service(health_service)
        .add_service(reflection!(build_v1, admin_services))
        .add_service(reflection!(build_v1alpha, admin_services))
        .add_service(AdminServer::new(AdminService::new(decider)))
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listeners.admin),
            until_stopped(stopped),
        );
    let servers = async { tokio::try_join!(decisions, admin).map(|_| ()) };
    tokio::pin!(servers);

    tokio::select! {
        result = &mut servers => {
            sweeper.abort();
            return result.map_err(ServeError::from);
        }
        _ = shutdown => {}
    }

    tracing::info!("shutting down: health NOT_SERVING, draining in-flight RPCs");
    health
        .set_not_serving::<RateLimiterServer<RateLimiterService>>()
        .await;
    health.set_not_serving::<AdminServer<AdminService>>().await;
    health
        .set_not_serving::<RateLimitServiceServer<EnvoyRateLimitService>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let _ = stop.send(true);
    let result = match tokio::time::timeout(settings.grace, &mut servers).await {
        Ok(result) => result.map_err(ServeError::from),
        Err(_) => {
            tracing::warn!(grace = ?settings.grace, "grace period over; abandoning in-flight RPCs");
            Ok(())
        }
    };
    sweeper.abort();
    result
}
