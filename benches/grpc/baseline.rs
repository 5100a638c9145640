//! The physical limit of this stack: a tonic server that answers every `ShouldRateLimit`
//! and `Check` with a constant OK (one empty status per descriptor; `allowed` alone),
//! built with the same tonic, tokio runtime and release profile as cellrate. It decodes
//! requests and encodes responses of the same types, and does nothing else. Run: `cargo
//! run --release --example baseline -- 127.0.0.1:PORT`; `-- ADDR inline` serves the same
//! through hyper with an executor that answers each stream in the connection's task (an
//! experiment for #37, BENCHMARKS.md).
//!
//! `-- ADDR shaped` answers with the same fields and sizes as cellrate answers the
//! benchmarks' limits (benches/grpc/limits): a descriptor's limit status, and the
//! `Retry-After` header and dynamic metadata of a denial; a Check's decision with its
//! limit and key. The answer is chosen by the limit's name alone, a constant per name:
//! the floor of a server that answers what cellrate answers, and decides nothing
//! (scripts/bench-peers*.sh, #62).

use cellrate::proto::v1 as pb;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{value, Duration, Struct, Value};
use tonic::{Request, Response, Status};

// The same allocator as cellrate's binary: the baseline differs only in doing nothing.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: cellrate_alloc::MiMalloc = cellrate_alloc::MiMalloc;

#[derive(Clone, Copy)]
struct Baseline {
    /// Answer the smallest valid message, not cellrate's shapes (unless `shaped`).
    minimal: bool,
}

/// The limit a benchmark's descriptor key names: (name, number, count, period in s,
/// denies), as benches/grpc/limits has it.
fn limit_of(key: &str) -> (&'static str, u32, u64, u64, bool) {
    match key {
        "BenchHot" => ("BenchHot", 900, 1_000_000_000, 1, false),
        "BenchDenied" => ("BenchDenied", 902, 1, 3600, true),
        "BenchMillion" => ("BenchMillion", 904, 100, 3600, false),
        "remote_address" => ("BenchIp", 906, 100, 1, false),
        _ => ("BenchKeys", 901, 100, 1, false),
    }
}

/// The time one request's share of an allowed limit takes to drain (1 ns at 10^9 a
/// second, 10 ms at 100).
fn reset_nanos(count: u64) -> i32 {
    (1_000_000_000 / count) as i32
}

fn text(s: &str) -> Value {
    Value {
        kind: Some(value::Kind::StringValue(s.into())),
    }
}

#[tonic::async_trait]
impl RateLimitService for Baseline {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        if self.minimal {
            let status = DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            };
            return Ok(Response::new(RateLimitResponse {
                overall_code: Code::Ok as i32,
                statuses: vec![status; request.descriptors.len()],
                ..Default::default()
            }));
        }
        let mut answer = RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        };
        for descriptor in &request.descriptors {
            let key = descriptor.entries.first().map_or("", |e| e.key.as_str());
            let (name, _, count, period, denies) = limit_of(key);
            let unit = if period == 1 {
                Unit::Second
            } else {
                Unit::Hour
            };
            let code = if denies { Code::OverLimit } else { Code::Ok };
            answer.statuses.push(DescriptorStatus {
                code: code as i32,
                current_limit: Some(RateLimit {
                    name: name.into(),
                    requests_per_unit: count as u32,
                    unit: unit as i32,
                }),
                limit_remaining: if denies { 0 } else { count as u32 - 1 },
                duration_until_reset: Some(if denies {
                    Duration {
                        seconds: 3599,
                        nanos: 709_552_663,
                    }
                } else {
                    Duration {
                        seconds: 0,
                        nanos: reset_nanos(count),
                    }
                }),
                ..Default::default()
            });
            if denies && answer.overall_code == Code::Ok as i32 {
                answer.overall_code = Code::OverLimit as i32;
                answer.response_headers_to_add.push(HeaderValue {
                    key: "Retry-After".into(),
                    value: "3600".into(),
                    ..Default::default()
                });
                answer.dynamic_metadata = Some(Struct {
                    fields: [
                        (
                            "descriptor_index".to_string(),
                            Value {
                                kind: Some(value::Kind::NumberValue(0.0)),
                            },
                        ),
                        ("limit".to_string(), text(name)),
                        ("overall_code".to_string(), text("OVER_LIMIT")),
                    ]
                    .into_iter()
                    .collect(),
                });
            }
        }
        Ok(Response::new(answer))
    }
}

/// A Check's decision on `item`, as cellrate answers it to the benchmarks' limits.
fn decision(item: &pb::Item, minimal: bool) -> pb::Decision {
    if minimal {
        return pb::Decision {
            allowed: true,
            ..Default::default()
        };
    }
    let (name, number, count, period, denies) = limit_of(&item.name);
    let wait = if denies {
        prost_types::Duration {
            seconds: 3599,
            nanos: 815_353_285,
        }
    } else {
        prost_types::Duration::default()
    };
    pb::Decision {
        allowed: !denies,
        remaining: if denies { 0 } else { count as i64 - 1 },
        retry_after: Some(wait),
        reset_after: Some(if denies {
            wait
        } else {
            prost_types::Duration {
                seconds: 0,
                nanos: reset_nanos(count),
            }
        }),
        limit: Some(pb::LimitInfo {
            name: name.into(),
            burst: count,
            count,
            period: Some(prost_types::Duration {
                seconds: period as i64,
                nanos: 0,
            }),
            key: format!("{number}:{}", item.id),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl pb::rate_limiter_server::RateLimiter for Baseline {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let items: Vec<pb::Decision> = request
            .get_ref()
            .items
            .iter()
            .map(|item| decision(item, self.minimal))
            .collect();
        Ok(Response::new(pb::CheckResponse {
            overall: items.first().cloned(),
            items,
            headers: Vec::new(),
        }))
    }

    async fn refund(
        &self,
        request: Request<pb::RefundRequest>,
    ) -> Result<Response<pb::RefundResponse>, Status> {
        let allowed = decision(&pb::Item::default(), true);
        Ok(Response::new(pb::RefundResponse {
            overall: Some(allowed.clone()),
            items: vec![allowed; request.get_ref().items.len()],
        }))
    }

    async fn settle(
        &self,
        request: Request<pb::SettleRequest>,
    ) -> Result<Response<pb::SettleResponse>, Status> {
        Ok(Response::new(pb::SettleResponse {
            items: vec![decision(&pb::Item::default(), true); request.get_ref().costs.len()],
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
async fn serve_inline(listener: tokio::net::TcpListener, baseline: Baseline) {
    let routes = tonic::service::Routes::new(RateLimitServiceServer::new(baseline))
        .add_service(pb::rate_limiter_server::RateLimiterServer::new(baseline))
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
    let mode = std::env::args().nth(2);
    let baseline = Baseline {
        minimal: mode.as_deref() != Some("shaped"),
    };
    if mode.as_deref() == Some("inline") {
        return serve_inline(listener, baseline).await;
    }
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(baseline))
        .add_service(pb::rate_limiter_server::RateLimiterServer::new(baseline))
        // TCP_NODELAY, as cellrate sets it.
        // Ends on SIGTERM by returning from main, so that a profile-instrumented build
        // writes its profile as it exits (scripts/bench-pgo.sh).
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut term) => drop(term.recv().await),
                    Err(_) => std::future::pending().await,
                }
            },
        )
        .await
        .expect("serve");
}
