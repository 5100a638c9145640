//! A tower layer that times every gRPC request and counts it by RPC and status code, on
//! both gRPC servers: requests refused early (INVALID_ARGUMENT before any decision, a
//! refused token, an overloaded server) are timed and counted like the rest.
//!
//! The status is read from the response headers: a gRPC error answered at once is
//! "trailers-only", with `grpc-status` in the headers; without it the call succeeded (a
//! unary call's OK is in its trailers, which this layer does not wait for).
//!
//! The `rpc` label is the route table's ([`crate::grpc::ROUTES`]): every RPC its own, a
//! path that names none `unknown` (a caller's text never becomes a label).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::Instant;

use crate::observe::metrics::Metrics;

/// Adds [`RpcMetrics`] to a server.
#[derive(Clone)]
pub struct RpcMetricsLayer {
    metrics: Arc<Metrics>,
}

impl RpcMetricsLayer {
    pub fn new(metrics: Arc<Metrics>) -> RpcMetricsLayer {
        RpcMetricsLayer { metrics }
    }
}

impl<S> tower_layer::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> RpcMetrics<S> {
        RpcMetrics {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service of [`RpcMetricsLayer`].
#[derive(Clone)]
pub struct RpcMetrics<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for RpcMetrics<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = RpcMetricsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        RpcMetricsFuture {
            rpc: crate::grpc::label(request.uri().path()),
            start: Instant::now(),
            metrics: self.metrics.clone(),
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`RpcMetrics`]: records when the response headers are ready.
    pub struct RpcMetricsFuture<F> {
        #[pin]
        inner: F,
        rpc: &'static str,
        start: Instant,
        metrics: Arc<Metrics>,
    }
}

/// The header of a trailers-only answer's code, named once (a `&str` key is parsed as a
/// header name on every lookup).
const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");

impl<F, R, E> Future for RpcMetricsFuture<F>
where
    F: Future<Output = Result<http::Response<R>, E>>,
{
    type Output = Result<http::Response<R>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let code = match &result {
            Ok(response) => response
                .headers()
                .get(&GRPC_STATUS)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map_or(tonic::Code::Ok, tonic::Code::from_i32),
            Err(_) => tonic::Code::Internal,
        };
        this.metrics
            .rpc(this.rpc, code, this.start.elapsed().as_secs_f64());
        Poll::Ready(result)
    }
}
