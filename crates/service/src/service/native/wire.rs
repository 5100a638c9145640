//! The native `RateLimiter`'s server: `Check`, the decision every caller pays for, served
//! by [`crate::grpc::unary`] (one small future, tonic's answers for every malformed
//! body); its other methods by tonic's generated server, as before.

use std::future::Future;
use std::sync::Arc;

use bytes::BytesMut;
use prost::Message;
use tonic::Status;

use super::RateLimiterService;
use crate::grpc::unary::{Decision, Server};
use crate::proto::v1 as pb;
use pb::rate_limiter_server::{RateLimiter, RateLimiterServer};

/// `cellrate.v1.RateLimiter`, as a tower service a tonic server mounts.
pub type NativeServer = Server<RateLimiterService, RateLimiterServer<RateLimiterService>>;

impl NativeServer {
    /// Serves `service`, refusing requests over `max_decoding` bytes before decoding them
    /// (OUT_OF_RANGE), on every method.
    pub fn new(service: RateLimiterService, max_decoding: usize) -> NativeServer {
        let inner = Arc::new(service);
        let generated =
            RateLimiterServer::from_arc(inner.clone()).max_decoding_message_size(max_decoding);
        Server::with(inner, generated, max_decoding)
    }
}

impl Decision for RateLimiterService {
    const SERVICE: &'static str = crate::grpc::RATE_LIMITER;
    const PATH: &'static str = crate::grpc::CHECK.path;
    type Message = pb::CheckRequest;
    type Answer = pb::CheckResponse;

    fn decide(
        &self,
        request: tonic::Request<pb::CheckRequest>,
    ) -> impl Future<Output = Result<tonic::Response<pb::CheckResponse>, Status>> + Send {
        RateLimiter::check(self, request)
    }

    fn encode(answer: pb::CheckResponse, framed: &mut BytesMut) {
        answer.encode_raw(framed)
    }
}
