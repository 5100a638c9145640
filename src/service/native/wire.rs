//! The native `RateLimiter`'s server: `Check`, the decision every caller pays for, served
//! by [`crate::service::unary`] (one small future, tonic's answers for every malformed
//! body); its other methods by tonic's generated server, as before.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use prost::Message;
use tonic::server::NamedService;

use super::RateLimiterService;
use crate::proto::v1 as pb;
use pb::rate_limiter_server::{RateLimiter, RateLimiterServer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// The served path of the native `Check`.
pub const CHECK: &str = "/cellrate.v1.RateLimiter/Check";

/// `cellrate.v1.RateLimiter`, as a tower service a tonic server mounts.
#[derive(Clone)]
pub struct NativeServer {
    inner: Arc<RateLimiterService>,
    generated: RateLimiterServer<RateLimiterService>,
    max_decoding: usize,
}

impl NativeServer {
    /// Serves `service`, refusing requests over `max_decoding` bytes before decoding them
    /// (OUT_OF_RANGE), on every method.
    pub fn new(service: RateLimiterService, max_decoding: usize) -> NativeServer {
        let inner = Arc::new(service);
        let generated =
            RateLimiterServer::from_arc(inner.clone()).max_decoding_message_size(max_decoding);
        NativeServer {
            inner,
            generated,
            max_decoding,
        }
    }
}

impl NamedService for NativeServer {
    const NAME: &'static str = <RateLimiterServer<RateLimiterService> as NamedService>::NAME;
}

impl<B> tower_service::Service<http::Request<B>> for NativeServer
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != CHECK {
            return self.generated.call(request);
        }
        let (inner, max) = (self.inner.clone(), self.max_decoding);
        Box::pin(async move {
            let call = |request| RateLimiter::check(&*inner, request);
            let write =
                |response: pb::CheckResponse, framed: &mut BytesMut| response.encode_raw(framed);
            let answer = crate::service::unary::serve(request, max, call, write).await;
            Ok(answer.unwrap_or_else(tonic::Status::into_http))
        })
    }
}
