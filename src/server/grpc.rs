//! The two gRPC stacks: the decisions listener (the native `RateLimiter`, Envoy's
//! `RateLimitService` and RLQS, health, reflection) and the admin listener (`Admin` behind
//! its token, health, reflection), each with its layers: the RPC histogram, the in-flight
//! bound, TLS and HTTP/2 limits, and on the decisions listener the shortcut past tonic's
//! router. Admin calls that reach the decisions listener are told where to go.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::transport::server::Router;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

use super::admin::AdminAuth;
use super::in_flight::InFlightLayer;
use super::listener::GuardedListener;
use super::rpc_metrics::RpcMetricsLayer;
use super::shortcut::ShortcutLayer;
use super::tls::Incoming;
use super::{ServeError, ServerLimits, Settings};
use crate::observe::health::Health;
use crate::observe::metrics::Metrics;
use crate::observe::top::DenialTracker;
use crate::proto::v1::admin_server::AdminServer;
use crate::proto::v1::rate_limiter_server::RateLimiterServer;
use crate::service::envoy::{EnvoyRateLimitService, RlsServer};
use crate::service::native::{AdminService, NativeServer, RateLimiterService};
use crate::service::rlqs::RlqsService;
use crate::service::{Decider, MAX_MESSAGE_BYTES};

use crate::grpc::{
    ADMIN, ENVOY_RLQS, ENVOY_RLS, HEALTH, RATE_LIMITER, REFLECTION_V1, REFLECTION_V1ALPHA,
};

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

/// `router` with server reflection listing exactly `services`, as v1 and as v1alpha (so
/// that every grpcurl version works).
fn with_reflection<L>(
    router: Router<L>,
    services: &[&'static str],
) -> Result<Router<L>, ServeError> {
    Ok(router
        .add_service(
            reflection(services)
                .build_v1()?
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            reflection(services)
                .build_v1alpha()?
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        ))
}

/// The health service's name for the whole rate-limit service, as envoyproxy/ratelimit
/// registers it (Kubernetes gRPC probes and Envoy Gateway ask for it).
pub(super) const RATELIMIT_HEALTH: &str = "ratelimit";

/// How often the `ratelimit` status looks at readiness unprompted (a store's health
/// changes without telling [`Health`]).
const READINESS_POLL: Duration = Duration::from_millis(250);

/// gRPC health, one service for both listeners, so that shutdown flips both at once.
/// Each of our services is SERVING until shutdown; `ratelimit` follows readiness as
/// `/readyz` and `/healthcheck` do ([`Health::ready`]), as envoyproxy/ratelimit's does;
/// the server as a whole ("") is SERVING until shutdown, as there (where it stays so).
pub(super) struct GrpcHealth {
    readiness: Readiness,
    service: HealthServer<HealthService>,
}

/// What sets `ratelimit`'s status: readiness, looked at and reported under one lock, so
/// that a look taken before shutdown cannot be reported after shutdown's.
#[derive(Clone)]
struct Readiness {
    reporter: HealthReporter,
    health: Arc<Health>,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl Readiness {
    /// Sets `ratelimit`'s status from readiness now.
    async fn refresh(&self) {
        let _held = self.lock.lock().await;
        let status = match self.health.ready() {
            true => ServingStatus::Serving,
            false => ServingStatus::NotServing,
        };
        self.reporter
            .set_service_status(RATELIMIT_HEALTH, status)
            .await;
    }
}

impl GrpcHealth {
    /// Every service SERVING; `ratelimit` as `health` is ready.
    pub(super) async fn serving(health: Arc<Health>) -> GrpcHealth {
        let reporter = HealthReporter::new();
        let service = HealthServer::new(HealthService::from_health_reporter(reporter.clone()))
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        reporter
            .set_serving::<RateLimiterServer<RateLimiterService>>()
            .await;
        reporter.set_serving::<RlsServer>().await;
        reporter.set_serving::<AdminServer<AdminService>>().await;
        let readiness = Readiness {
            reporter,
            health,
            lock: Arc::default(),
        };
        readiness.refresh().await;
        GrpcHealth { readiness, service }
    }

    /// Keeps `ratelimit`'s status on readiness until `stop`: at each change [`Health`] is
    /// told of, and every [`READINESS_POLL`].
    pub(super) fn follow(&self, stop: CancellationToken) -> impl Future<Output = ()> + Send {
        let readiness = self.readiness.clone();
        async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = readiness.health.changed() => {}
                    _ = tokio::time::sleep(READINESS_POLL) => {}
                }
                readiness.refresh().await;
            }
        }
    }

    /// Every service NOT_SERVING, the server as a whole too, and `ratelimit` (readiness
    /// is marked shutting down first).
    pub(super) async fn not_serving(&self) {
        self.readiness.health.set_not_ready();
        self.readiness.refresh().await;
        let reporter = &self.readiness.reporter;
        reporter
            .set_not_serving::<RateLimiterServer<RateLimiterService>>()
            .await;
        reporter.set_not_serving::<RlsServer>().await;
        reporter
            .set_not_serving::<AdminServer<AdminService>>()
            .await;
        reporter
            .set_service_status("", ServingStatus::NotServing)
            .await;
    }
}

/// A gRPC server, serving until its stop.
pub(super) type Serving =
    std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

/// What both stacks are built from.
pub(super) struct Stacks<'a> {
    pub(super) settings: &'a Settings,
    /// TLS in force on both listeners (swapped when its files change).
    pub(super) tls: Option<Arc<super::tls::LiveTls>>,
    /// The listeners' bounds, fitted to the descriptor limit.
    pub(super) limits: ServerLimits,
    pub(super) decider: Arc<Decider>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: &'a GrpcHealth,
    /// Where Checks are kept for `Settle`.
    pub(super) settlements: Option<Arc<dyn crate::store::shared::Settlements>>,
    /// Both servers stop accepting when this is cancelled.
    pub(super) stop: CancellationToken,
    /// While true, the decision listener answers every request UNAVAILABLE (waiting for
    /// the first xDS update).
    pub(super) waiting: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Stacks<'_> {
    /// A listener's connections, through TLS when configured (the whole handshake within
    /// the handshake timeout: else a client that stalls after its first bytes holds a
    /// connection until the idle timeout).
    fn incoming(&self, listener: GuardedListener, admin: bool) -> Incoming {
        let timeout = match admin {
            true => self.limits.admin.handshake_timeout,
            false => self.limits.decisions.handshake_timeout,
        };
        let tls = self.tls.clone().map(|live| (live, admin));
        super::tls::incoming(listener, tls, timeout)
    }

    /// The in-flight bound of a gRPC server: in all, per client address, and on bodies.
    fn in_flight(&self) -> InFlightLayer {
        InFlightLayer::new(self.limits.max_in_flight)
            .with_per_address(self.limits.in_flight_per_address())
            .with_body_timeout(self.limits.body_timeout)
            .with_unary(self.settings.grpc_unary)
    }

    /// `router` served on `incoming` until [`Self::stop`]: by one server, or with a
    /// connection age by one server per connection (`connection_age.rs`).
    fn serve<L, ResBody>(&self, router: Router<L>, incoming: Incoming) -> Serving
    where
        Router<L>: Clone + Send + 'static,
        L: tower_layer::Layer<tonic::service::Routes> + Send + 'static,
        L::Service: tower_service::Service<
                http::Request<tonic::body::Body>,
                Response = http::Response<ResBody>,
            > + Clone
            + Send
            + 'static,
        <L::Service as tower_service::Service<http::Request<tonic::body::Body>>>::Future: Send,
        <L::Service as tower_service::Service<http::Request<tonic::body::Body>>>::Error:
            Into<tonic::codegen::StdError> + Send,
        ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        ResBody::Error: Into<tonic::codegen::StdError>,
    {
        let stop = self.stop.clone();
        match self.limits.max_connection_age {
            None => Box::pin(router.serve_with_incoming_shutdown(incoming, stop.cancelled_owned())),
            Some(max_age) => Box::pin(super::connection_age::serve(
                router, incoming, max_age, stop,
            )),
        }
    }

    /// The decisions listener's server, serving until [`Self::stop`].
    pub(super) fn decisions(
        &self,
        listener: super::unix_socket::Bound,
        rlqs: RlqsService,
        admin_addr: &str,
    ) -> Result<Serving, ServeError> {
        let services = [
            RATE_LIMITER,
            ENVOY_RLS,
            ENVOY_RLQS,
            HEALTH,
            REFLECTION_V1,
            REFLECTION_V1ALPHA,
        ];
        let incoming = GuardedListener::new(listener, self.limits.decisions, "decisions")
            .with_authority_fix(self.tls.is_none());
        let incoming = self.incoming(incoming, false);
        let mut service = RateLimiterService::new(self.decider.clone(), self.metrics.clone());
        if let Some(settlements) = &self.settlements {
            service = service.with_settlements(settlements.clone());
        }
        let unary = self.settings.grpc_unary;
        let native = NativeServer::new(service, MAX_MESSAGE_BYTES).serving(unary);
        let mut rls = EnvoyRateLimitService::new(
            self.decider.clone(),
            self.settings.envoy.clone(),
            self.metrics.clone(),
        );
        if let Some(settlements) = &self.settlements {
            rls = rls.with_settlements(settlements.clone());
        }
        let envoy = RlsServer::new(rls, MAX_MESSAGE_BYTES).serving(unary);
        let router = self
            .limits
            .grpc_server()
            .layer(RpcMetricsLayer::new(self.metrics.clone()))
            .layer(self.in_flight().with_gate(self.waiting.clone()))
            // Innermost: the decision RPCs skip the router (and are mounted in it too).
            .layer(ShortcutLayer::new(envoy.clone(), native.clone()))
            .add_service(self.health.service.clone());
        let router = with_reflection(router, &services)?
            .add_service(native)
            .add_service(envoy)
            .add_service(
                RateLimitQuotaServiceServer::new(rlqs)
                    .max_decoding_message_size(crate::service::rlqs::MAX_MESSAGE_BYTES),
            )
            .add_service(AdminElsewhere::new(admin_addr));
        Ok(self.serve(router, incoming))
    }

    /// The admin listener's server, serving until [`Self::stop`].
    pub(super) fn admin(
        &self,
        listener: TcpListener,
        denials: Arc<DenialTracker>,
    ) -> Result<Serving, ServeError> {
        let services = [ADMIN, HEALTH, REFLECTION_V1, REFLECTION_V1ALPHA];
        let incoming = GuardedListener::new(listener, self.limits.admin, "admin");
        let incoming = self.incoming(incoming, true);
        let admin = AdminServer::new(
            AdminService::new(self.decider.clone())
                .with_denials(denials)
                .with_metrics(self.metrics.clone()),
        )
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let router = self
            .limits
            .grpc_server()
            .layer(RpcMetricsLayer::new(self.metrics.clone()))
            .layer(self.in_flight())
            .add_service(self.health.service.clone());
        let router = with_reflection(router, &services)?.add_service(
            tonic::service::interceptor::InterceptedService::new(
                admin,
                AdminAuth::new(self.settings.admin_token.as_deref()),
            ),
        );
        Ok(self.serve(router, incoming))
    }
}

/// Mounted as `cellrate.v1.Admin` on the decisions listener: every call is answered
/// UNIMPLEMENTED with the admin listener's address, whatever the method.
#[derive(Clone)]
struct AdminElsewhere {
    message: Arc<str>,
}

impl AdminElsewhere {
    /// `admin` is the admin listener's bound address.
    fn new(admin: &str) -> AdminElsewhere {
        AdminElsewhere {
            message: format!(
                "admin RPCs (cellrate.v1.Admin) are served on the admin listener, {admin} \
                 (--admin-listen), not on the decision listener"
            )
            .into(),
        }
    }
}

impl NamedService for AdminElsewhere {
    const NAME: &'static str = ADMIN;
}

impl<B> tower_service::Service<http::Request<B>> for AdminElsewhere {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    /// The request is not read: the answer is in the headers (a trailers-only response).
    fn call(&mut self, _: http::Request<B>) -> Self::Future {
        let status = tonic::Status::unimplemented(self.message.to_string());
        std::future::ready(Ok(status.into_http()))
    }
}
