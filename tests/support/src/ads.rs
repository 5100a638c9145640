//! A small xDS control plane for the tests: an Aggregated Discovery Service (state of the
//! world) on loopback that serves its current response to every stream, as a snapshot
//! cache does (go-control-plane's, which Envoy Gateway runs), and records every request
//! (ACKs and NACKs) and every stream's headers. Optionally TLS, requiring a client
//! certificate (Envoy Gateway's mTLS).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::{Message, Name};
use tokio::sync::{mpsc, watch, Notify};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::pki::Pki;

/// A request the control plane received: on which stream (counted from 1).
#[derive(Debug, Clone)]
pub struct Seen {
    pub stream: usize,
    pub request: DiscoveryRequest,
}

struct State {
    /// What every stream is sent (again whenever it changes).
    current: watch::Sender<Option<DiscoveryResponse>>,
    requests: mpsc::UnboundedSender<Seen>,
    streams: AtomicUsize,
    /// Ends every open stream.
    disconnect: Notify,
    headers: Mutex<Vec<tonic::metadata::MetadataMap>>,
}

pub struct Ads {
    pub addr: SocketAddr,
    state: Arc<State>,
    requests: mpsc::UnboundedReceiver<Seen>,
    task: tokio::task::JoinHandle<()>,
}

struct Service(Arc<State>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let state = self.0.clone();
        let stream = state.streams.fetch_add(1, Ordering::SeqCst) + 1;
        state
            .headers
            .lock()
            .unwrap()
            .push(request.metadata().clone());
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let reader = state.clone();
        tokio::spawn(async move {
            while let Ok(Some(request)) = incoming.message().await {
                let _ = reader.requests.send(Seen { stream, request });
            }
        });
        tokio::spawn(async move {
            let mut current = state.current.subscribe();
            let mut sent = 0u32;
            loop {
                let response = current.borrow_and_update().clone();
                if let Some(mut response) = response {
                    sent += 1;
                    response.nonce = format!("s{stream}-n{sent}");
                    if tx.send(Ok(response)).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    changed = current.changed() => if changed.is_err() { return },
                    _ = state.disconnect.notified() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

impl Ads {
    pub async fn start() -> Ads {
        Ads::serve(None).await
    }

    /// With TLS (the PKI's server certificate), requiring a client certificate signed by
    /// its CA.
    pub async fn start_tls(pki: &Pki) -> Ads {
        Ads::serve(Some(pki)).await
    }

    async fn serve(pki: Option<&Pki>) -> Ads {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (requests_tx, requests) = mpsc::unbounded_channel();
        let state = Arc::new(State {
            current: watch::channel(None).0,
            requests: requests_tx,
            streams: AtomicUsize::new(0),
            disconnect: Notify::new(),
            headers: Mutex::new(Vec::new()),
        });
        let mut server = tonic::transport::Server::builder();
        if let Some(pki) = pki {
            let tls = tonic::transport::ServerTlsConfig::new()
                .identity(tonic::transport::Identity::from_pem(
                    &pki.server_cert,
                    &pki.server_key,
                ))
                .client_ca_root(tonic::transport::Certificate::from_pem(&pki.ca));
            server = server.tls_config(tls).unwrap();
        }
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let router = server.add_service(
            AggregatedDiscoveryServiceServer::new(Service(state.clone()))
                .max_encoding_message_size(64 << 20),
        );
        let task = tokio::spawn(async move {
            let _ = router.serve_with_incoming(incoming).await;
        });
        Ads {
            addr,
            state,
            requests,
            task,
        }
    }

    /// Serves `response` to every stream from now on (its nonce is set per stream).
    pub fn set(&self, response: DiscoveryResponse) {
        self.state.current.send_replace(Some(response));
    }

    /// Serves `configs` as version `version`.
    pub fn set_configs(&self, version: &str, configs: &[RateLimitConfig]) {
        self.set(response(version, configs));
    }

    /// Ends every open stream (the client is to open another).
    pub fn disconnect(&self) {
        self.state.disconnect.notify_waiters();
    }

    /// Streams opened so far.
    pub fn streams(&self) -> usize {
        self.state.streams.load(Ordering::SeqCst)
    }

    /// The headers each stream opened with.
    pub fn headers(&self) -> Vec<tonic::metadata::MetadataMap> {
        self.state.headers.lock().unwrap().clone()
    }

    /// The next request received, within `within`.
    pub async fn next(&mut self, within: Duration) -> Seen {
        tokio::time::timeout(within, self.requests.recv())
            .await
            .expect("a request from the xDS client in time")
            .expect("the control plane is running")
    }

    /// The next request that answers a response (skipping the first request of a stream).
    pub async fn next_answer(&mut self, within: Duration) -> Seen {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let seen = self.next(left).await;
            if !seen.request.response_nonce.is_empty() {
                return seen;
            }
        }
    }

    pub fn stop(self) {
        self.task.abort();
    }
}

/// A state-of-the-world response holding `configs`.
pub fn response(version: &str, configs: &[RateLimitConfig]) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.to_string(),
        resources: configs
            .iter()
            .map(|c| Any {
                type_url: RateLimitConfig::type_url(),
                value: c.encode_to_vec(),
            })
            .collect(),
        type_url: RateLimitConfig::type_url(),
        ..Default::default()
    }
}

/// A descriptor entry, with a limit of `n` per `unit` when given.
pub fn entry(
    key: &str,
    value: &str,
    limit: Option<(u32, RateLimitUnit)>,
    children: Vec<RateLimitDescriptor>,
) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.to_string(),
        value: value.to_string(),
        rate_limit: limit.map(|(n, unit)| RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            ..Default::default()
        }),
        descriptors: children,
        ..Default::default()
    }
}

/// What Envoy Gateway sends for a route rule "n requests per unit for each x-user-id" on
/// listener `listener` (its translator's shape: the route's generic key, then the rule's
/// header match).
pub fn gateway_config(listener: &str, route: &str, n: u32, unit: RateLimitUnit) -> RateLimitConfig {
    RateLimitConfig {
        name: listener.to_string(),
        domain: listener.to_string(),
        descriptors: vec![entry(
            route,
            route,
            None,
            vec![entry("rule-0-match-0", "", Some((n, unit)), vec![])],
        )],
    }
}
