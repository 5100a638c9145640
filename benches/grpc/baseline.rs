//! The physical limit of this stack: a tonic server that answers every `ShouldRateLimit`
//! and `Check` with a constant OK, built with the same tonic, tokio runtime and release
//! profile as cellrate. It decodes requests and encodes responses of the same shapes, and
//! does nothing else. Run: `cargo run --release --example baseline -- 127.0.0.1:PORT`;
//! `-- 127.0.0.1:PORT inline` serves the same through hyper with an executor that answers
//! each stream in the connection's task (an experiment for #37, BENCHMARKS.md).

use cellrate::proto::v1 as pb;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

// The same allocator as cellrate's binary: the baseline differs only in doing nothing.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Baseline;

#[tonic::async_trait]
impl RateLimitService for Baseline {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let status = DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![status; request.get_ref().descriptors.len()],
            ..Default::default()
        }))
    }
}

fn allowed() -> pb::Decision {
    pb::Decision {
        allowed: true,
        ..Default::default()
    }
}

#[tonic::async_trait]
impl pb::rate_limiter_server::RateLimiter for Baseline {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        Ok(Response::new(pb::CheckResponse {
            overall: Some(allowed()),
            items: vec![allowed(); request.get_ref().items.len()],
            headers: Vec::new(),
        }))
    }

    async fn refund(
        &self,
        request: Request<pb::RefundRequest>,
    ) -> Result<Response<pb::RefundResponse>, Status> {
        Ok(Response::new(pb::RefundResponse {
            overall: Some(allowed()),
            items: vec![allowed(); request.get_ref().items.len()],
        }))
    }

    async fn settle(
        &self,
        request: Request<pb::SettleRequest>,
    ) -> Result<Response<pb::SettleResponse>, Status> {
        Ok(Response::new(pb::SettleResponse {
            items: vec![allowed(); request.get_ref().costs.len()],
            already_settled: false,
        }))
    }
}

/// An executor that polls each HTTP/2 stream's future once where hyper hands it over (in
/// the connection's task) and spawns it only if it is not done: a stream answered at once
/// costs no task, no wake-up, and its frames leave with the connection's next write,
/// together with the others answered in the same turn.
#[derive(Clone, Copy)]
struct InlineFirst;

impl<F> hyper::rt::Executor<F> for InlineFirst
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        let mut future = Box::pin(future);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if future.as_mut().poll(&mut cx).is_pending() {
            // Polled again at once by the runtime, with a waker that works.
            tokio::spawn(future);
        }
    }
}

/// The same services served by hyper directly with [`InlineFirst`] (`baseline ADDR
/// inline`): what the executor alone changes, everything else equal.
async fn serve_inline(listener: tokio::net::TcpListener) {
    let routes = tonic::service::Routes::new(RateLimitServiceServer::new(Baseline))
        .add_service(pb::rate_limiter_server::RateLimiterServer::new(Baseline))
        .prepare();
    loop {
        let (stream, _) = listener.accept().await.expect("accept");
        stream.set_nodelay(true).expect("nodelay");
        let service = hyper_util::service::TowerToHyperService::new(routes.clone());
        tokio::spawn(async move {
            let _ = hyper::server::conn::http2::Builder::new(InlineFirst)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18081".into());
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    eprintln!("baseline listening on {}", listener.local_addr().unwrap());
    if std::env::args().nth(2).as_deref() == Some("inline") {
        return serve_inline(listener).await;
    }
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Baseline))
        .add_service(pb::rate_limiter_server::RateLimiterServer::new(Baseline))
        // TCP_NODELAY, as cellrate sets it.
        .serve_with_incoming(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        )
        .await
        .expect("serve");
}
