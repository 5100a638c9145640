//! The metrics listener's routes: `/metrics` (the Prometheus series of
//! [`crate::observe::metrics`]), `/healthz` and `/readyz` (the state of
//! [`crate::observe::health`]), served by [`crate::server::listener::serve_http1`].

use std::sync::Arc;

use crate::observe::health::Health;
use crate::observe::metrics::Metrics;

/// The metrics listener's routes: `/metrics` (or `metrics_path`, which
/// `--metrics-path`'s parser has checked: a literal path no other route has), `/healthz`,
/// `/readyz` and `/healthcheck`.
pub fn http_routes(metrics: Arc<Metrics>, health: Arc<Health>, metrics_path: &str) -> axum::Router {
    use axum::http::{header, StatusCode};
    use axum::routing::get;
    let for_health = health.clone();
    let for_check = health.clone();
    axum::Router::new()
        .route(
            metrics_path,
            get(move || {
                let body = metrics.render();
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body) }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let body = for_health.body();
                async move { ([(header::CONTENT_TYPE, "application/json")], body) }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let ready = health.ready();
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
                    }
                }
            }),
        )
        // envoyproxy/ratelimit's probe path: "OK" while ready, 500 otherwise, as there.
        .route(
            "/healthcheck",
            get(move || {
                let ready = for_check.ready();
                async move {
                    if ready {
                        (StatusCode::OK, "OK")
                    } else {
                        (StatusCode::INTERNAL_SERVER_ERROR, "not ready")
                    }
                }
            }),
        )
}
