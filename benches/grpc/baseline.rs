//! The physical limit of this stack: a tonic server that answers every `ShouldRateLimit`
//! and `Check` with a constant OK, built with the same tonic, tokio runtime and release
//! profile as cellrate. It decodes requests and encodes responses of the same shapes, and
//! does nothing else. Run: `cargo run --release --example baseline -- 127.0.0.1:PORT`.

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

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18081".into());
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    eprintln!("baseline listening on {}", listener.local_addr().unwrap());
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
