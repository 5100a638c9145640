//! Limits over xDS (`--xds-server`, envoyproxy/ratelimit's `CONFIG_TYPE=GRPC_XDS_SOTW`):
//! an Aggregated Discovery Service client, state of the world, subscribed to every
//! `RateLimitConfig` (envoyproxy/ratelimit's resource, what Envoy Gateway serves).
//!
//! Each response holds every resource: it is applied atomically together with the limits
//! directory's files ([`Reloader::apply_xds`]), then ACKed (its version and nonce); an
//! invalid one is NACKed with the errors (the last version ACKed and the response's
//! nonce) and changes nothing. When the stream fails it is opened again after a wait
//! that doubles from `--xds-backoff-initial` up to `--xds-backoff-max`, jittered, and
//! the limits in force stay. Bounds: `--xds-max-message-bytes` per message (gRPC's own
//! limit: a larger one ends the stream), and what one update may build ([`wire`]).

mod wire;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::reload::Reloader;
use crate::limits::ratelimit_format::{RateLimitConfig, TYPE_URL};
use crate::observe::metrics::Metrics;
use crate::text::{cut_bytes as cut, error_chain, LogEvery};
use wire::{Received, Response, XdsCodec};
pub use wire::{MAX_ELEMENTS, MAX_RESOURCES};

/// The ADS method.
const PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// How long connecting (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 pings on the stream: a control plane that stops answering them is left after
/// the timeout, and the stream opened again.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest message accepted by default (gRPC's own default).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The longest NACK message sent (the errors are cut there).
const MAX_NACK_MESSAGE: usize = 4096;

/// At most one "update rejected" log line this often: a control plane that sends bad
/// update after bad update must not flood the log (each line holds up to 4 KiB of errors;
/// 10^5 rejections wrote 10^5 lines). `cellrate_xds_updates_total{result="rejected"}`
/// still counts every one.
const REJECTION_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// TLS to the control plane (PEM contents, read at startup).
#[derive(Debug, Clone, Default)]
pub struct XdsTls {
    /// Trusted CA certificates; `None`: the Mozilla roots (webpki-roots).
    pub ca: Option<String>,
    /// A client certificate and key (mTLS).
    pub identity: Option<(String, String)>,
    /// The name the server's certificate must carry, if not the URL's host.
    pub server_name: Option<String>,
}

/// Where and how to subscribe.
#[derive(Debug, Clone)]
pub struct XdsSettings {
    /// The control plane: `host:port` or an `http://`/`https://` URL.
    pub server: String,
    /// The node id the control plane keys its snapshots by (Envoy Gateway:
    /// `envoy-ratelimit`).
    pub node_id: String,
    /// The node's metadata, string values.
    pub node_metadata: Vec<(String, String)>,
    /// Extra request headers (e.g. an authorization token), checked when parsed.
    pub headers: tonic::metadata::MetadataMap,
    pub tls: Option<XdsTls>,
    pub max_message_bytes: usize,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Serve before the first config arrives (else the gRPC listeners wait for it).
    pub force_start: bool,
}

impl XdsSettings {
    /// With the defaults of everything but the server.
    pub fn new(server: impl Into<String>) -> XdsSettings {
        XdsSettings {
            server: server.into(),
            node_id: "default".to_string(),
            node_metadata: Vec::new(),
            headers: tonic::metadata::MetadataMap::new(),
            tls: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            force_start: false,
        }
    }

    /// The endpoint to connect to: the scheme follows the TLS setting.
    fn endpoint(&self) -> Result<Endpoint, String> {
        let host = self
            .server
            .split_once("://")
            .map_or(self.server.as_str(), |(_, rest)| rest);
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{host}"))
            .map_err(|e| format!("--xds-server {:?}: {e}", self.server))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let Some(tls) = &self.tls else {
            return Ok(endpoint);
        };
        let mut config = ClientTlsConfig::new();
        config = match &tls.ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            None => config.with_webpki_roots(),
        };
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &tls.server_name {
            config = config.domain_name(name.clone());
        }
        endpoint
            .tls_config(config)
            .map_err(|e| format!("xDS TLS: {}", error_chain(&e)))
    }

    /// Whether the server's address and the TLS files make an endpoint.
    pub fn check(&self) -> Result<(), String> {
        self.endpoint().map(|_| ())
    }

    fn node(&self) -> Node {
        let fields = self
            .node_metadata
            .iter()
            .map(|(k, v)| {
                let value = Value {
                    kind: Some(Kind::StringValue(v.clone())),
                };
                (k.clone(), value)
            })
            .collect();
        Node {
            id: self.node_id.clone(),
            metadata: Some(Struct { fields }),
            user_agent_name: "cellrate".to_string(),
            ..Default::default()
        }
    }
}

/// The waits between attempts: doubling from `initial` up to `max`, each drawn from its
/// upper half (so that replicas restarted together do not reconnect together).
struct Backoff {
    next: Duration,
    initial: Duration,
    max: Duration,
    random: RandomState,
    draws: u64,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            next: initial,
            initial,
            max,
            random: RandomState::new(),
            draws: 0,
        }
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }

    fn wait(&mut self) -> Duration {
        let ceiling = self.next.min(self.max);
        self.next = (ceiling * 2).min(self.max);
        self.draws += 1;
        let fraction = (self.random.hash_one(self.draws) % 1024) as u32;
        ceiling / 2 + (ceiling / 2) * fraction / 1024
    }
}

/// Which rejections get a log line ([`LogEvery`] at [`REJECTION_LOG_INTERVAL`]), kept
/// across streams: reconnecting does not reset the throttle.
struct RejectionLog {
    origin: Instant,
    lines: LogEvery,
}

impl RejectionLog {
    fn new() -> RejectionLog {
        RejectionLog {
            origin: Instant::now(),
            lines: LogEvery::new(REJECTION_LOG_INTERVAL),
        }
    }

    /// Counts a rejection now: `Some(rejections unlogged before it)` when it is logged.
    fn note(&self) -> Option<u64> {
        self.lines.admit(self.origin.elapsed(), 1)
    }
}

/// What a session needs.
pub struct XdsClient {
    pub settings: XdsSettings,
    pub reloader: Arc<Reloader>,
    pub metrics: Arc<Metrics>,
    /// Set once a first update is in force (the listeners may wait for it).
    pub ready: watch::Sender<bool>,
}

impl XdsClient {
    /// Subscribes until `stop`, opening the stream again whenever it fails.
    pub async fn run(self, stop: CancellationToken) {
        let mut backoff = Backoff::new(self.settings.backoff_initial, self.settings.backoff_max);
        // The last version ACKed: a new stream starts from it.
        let mut acked = String::new();
        let rejections = RejectionLog::new();
        loop {
            let outcome = tokio::select! {
                outcome = self.session(&mut acked, &mut backoff, &rejections) => outcome,
                _ = stop.cancelled() => return,
            };
            self.metrics.config.xds_connected.set(0);
            let wait = backoff.wait();
            tracing::warn!(server = %self.settings.server, error = %shown(&outcome, 1024), ?wait, "xDS stream ended; the limits in force stay; trying again");
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// One stream, from connecting to its end: why it ended.
    async fn session(
        &self,
        acked: &mut String,
        backoff: &mut Backoff,
        rejections: &RejectionLog,
    ) -> String {
        let channel = match self.settings.endpoint() {
            Ok(endpoint) => match endpoint.connect().await {
                Ok(channel) => channel,
                Err(e) => return format!("connecting: {}", error_chain(&e)),
            },
            Err(e) => return e,
        };
        let (tx, rx) = mpsc::channel::<DiscoveryRequest>(4);
        let first = self.request(acked, "", None);
        if tx.send(first).await.is_err() {
            return "the request stream closed".to_string();
        }
        let mut responses = match self.open(channel, rx).await {
            Ok(responses) => responses,
            Err(e) => return format!("opening the stream: {e}"),
        };
        tracing::info!(server = %self.settings.server, node = %self.settings.node_id, "xDS stream open");
        self.metrics.config.xds_connected.set(1);
        loop {
            let received = match responses.message().await {
                Ok(Some(received)) => received,
                Ok(None) => return "the control plane closed the stream".to_string(),
                Err(status) => return status_text(&status),
            };
            // A stream that delivers is healthy: the next failure waits little again.
            backoff.reset();
            let answer = self.answer(received, acked, rejections).await;
            if tx.send(answer).await.is_err() {
                return "the request stream closed".to_string();
            }
        }
    }

    async fn open(
        &self,
        channel: Channel,
        rx: mpsc::Receiver<DiscoveryRequest>,
    ) -> Result<tonic::Streaming<Received>, String> {
        let mut grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(self.settings.max_message_bytes)
            .max_encoding_message_size(self.settings.max_message_bytes);
        grpc.ready().await.map_err(|e| error_chain(&e))?;
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        *request.metadata_mut() = self.settings.headers.clone();
        let path = http::uri::PathAndQuery::from_static(PATH);
        grpc.streaming(request, path, XdsCodec)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| status_text(&status))
    }

    /// The request that answers `received`: an ACK when it is now in force, else a NACK.
    async fn answer(
        &self,
        received: Received,
        acked: &mut String,
        rejections: &RejectionLog,
    ) -> DiscoveryRequest {
        let (version, nonce, outcome) = match received {
            Received::Refused {
                version_info,
                nonce,
                reason,
            } => (version_info, nonce, Err(reason)),
            Received::Response(response) => {
                let (version, nonce) = (response.version_info.clone(), response.nonce.clone());
                (version, nonce, self.apply(response).await)
            }
        };
        match outcome {
            Ok(()) => {
                tracing::info!(version = %shown(&version, 200), "xDS update in force (ACK)");
                *acked = version;
                self.ready.send_replace(true);
                self.request(acked, &nonce, None)
            }
            Err(reason) => {
                if let Some(unlogged) = rejections.note() {
                    tracing::error!(version = %shown(&version, 200), error = %shown(&reason, MAX_NACK_MESSAGE), rejected_unlogged_before = unlogged, "xDS update rejected (NACK); the limits in force stay; further rejections within 10 s are only counted");
                }
                self.metrics
                    .config
                    .xds_updates
                    .with_label_values(&["rejected"])
                    .inc();
                self.request(acked, &nonce, Some(reason))
            }
        }
    }

    /// Decodes the resources and puts them in force. `Err`: why not (nothing changed).
    async fn apply(&self, response: Response) -> Result<(), String> {
        if response.type_url != TYPE_URL {
            return Err(format!(
                "type_url {:?}: only {TYPE_URL} is subscribed to",
                cut(&response.type_url, 200)
            ));
        }
        let mut configs = Vec::with_capacity(response.resources.len());
        for (i, any) in response.resources.iter().enumerate() {
            if any.type_url != TYPE_URL {
                return Err(format!(
                    "resource {i}: type_url {:?} is not {TYPE_URL}",
                    cut(&any.type_url, 200)
                ));
            }
            match RateLimitConfig::decode(&any.value[..]) {
                Ok(config) => configs.push(config),
                Err(e) => return Err(format!("resource {i}: {e}")),
            }
        }
        let reloader = self.reloader.clone();
        match tokio::task::spawn_blocking(move || reloader.apply_xds(configs)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(errors)) => Err(cut(&errors.to_string(), MAX_NACK_MESSAGE).to_string()),
            Err(e) => Err(format!("applying: {e}")),
        }
    }

    fn request(&self, acked: &str, nonce: &str, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: acked.to_string(),
            node: Some(self.settings.node()),
            resource_names: Vec::new(),
            type_url: TYPE_URL.to_string(),
            response_nonce: nonce.to_string(),
            error_detail: error.map(|message| RpcStatus {
                code: tonic::Code::InvalidArgument as i32,
                message,
                details: Vec::new(),
            }),
            ..Default::default()
        }
    }
}

/// Text from the control plane as a log line shows it: cut to `max` bytes, quoted, with
/// control characters escaped (a newline in a version cannot forge a log line).
fn shown(text: &str, max: usize) -> String {
    format!("{:?}", cut(text, max))
}

/// A status as the log says it: code, message, and the transport's reason if any.
fn status_text(status: &tonic::Status) -> String {
    let mut text = format!("{}: {}", status.code(), status.message());
    if let Some(source) = std::error::Error::source(status) {
        text.push_str(": ");
        text.push_str(&error_chain(source));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waits_double_up_to_the_maximum_and_start_again_after_a_reset() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        let waits: Vec<Duration> = (0..6).map(|_| b.wait()).collect();
        let ceilings = [1, 2, 4, 8, 8, 8];
        for (wait, ceiling) in waits.iter().zip(ceilings) {
            let ceiling = Duration::from_secs(ceiling);
            assert!(*wait >= ceiling / 2 && *wait <= ceiling, "{waits:?}");
        }
        b.reset();
        assert!(b.wait() <= Duration::from_secs(1));
    }

    #[test]
    fn control_plane_text_reaches_the_log_escaped_and_cut() {
        assert_eq!(
            shown("v1\nINFO forged\u{1b}[2J", 100),
            "\"v1\\nINFO forged\\u{1b}[2J\""
        );
        assert_eq!(shown(&"x".repeat(10_000), 200).len(), 202);
    }

    #[test]
    fn the_endpoint_takes_host_port_or_a_url() {
        for server in [
            "127.0.0.1:18001",
            "http://127.0.0.1:18001",
            "https://127.0.0.1:18001",
        ] {
            let endpoint = XdsSettings::new(server).endpoint().unwrap();
            assert_eq!(endpoint.uri().to_string(), "http://127.0.0.1:18001/");
        }
        let mut tls = XdsSettings::new("envoy-gateway:18001");
        tls.tls = Some(XdsTls::default());
        assert_eq!(
            tls.endpoint().unwrap().uri().to_string(),
            "https://envoy-gateway:18001/"
        );
        assert!(XdsSettings::new("not a host").endpoint().is_err());
    }
}
