//! TLS to a single Redis made here when `--redis-tls-ca` is given, so that a self-signed
//! server certificate named in that file is accepted as it is by upstream ratelimit (Go)
//! and by `redis-cli --cacert`: its own Makefile makes such a certificate (`openssl req
//! -x509`, which marks it as a CA) and points `REDIS_TLS_CACERT` at it. webpki refuses a
//! CA certificate presented as the server's (`CaUsedAsEndEntity`), and redis-rs takes no
//! certificate verifier, hence a connection of our own.
//!
//! Only that one case is added: a server certificate byte-for-byte equal to a configured
//! trust anchor, valid at the time (webpki checks the dates before the CA flag), for the
//! host of the URL. Every other certificate goes through webpki's verification unchanged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::pem::PemObject;

use super::errors::store_error;
use crate::StoreError;

/// The webpki verifier, and one more acceptance: a server certificate that is itself one
/// of the trust anchors (a self-signed certificate trusted directly).
#[derive(Debug)]
struct DirectTrust {
    webpki: Arc<WebPkiServerVerifier>,
    anchors: Vec<CertificateDer<'static>>,
}

impl ServerCertVerifier for DirectTrust {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let refused = match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => return Ok(verified),
            Err(e) => e,
        };
        // webpki checks the dates before the CA flag: this error says they held.
        let ca_as_server = matches!(
            &refused,
            rustls::Error::InvalidCertificate(CertificateError::Other(other))
                if matches!(other.0.downcast_ref::<webpki::Error>(), Some(webpki::Error::CaUsedAsEndEntity))
        );
        let anchor = self
            .anchors
            .iter()
            .any(|a| a.as_ref() == end_entity.as_ref());
        if !(ca_as_server && anchor) {
            return Err(refused);
        }
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, server_name)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// The client configuration for `ca` (PEM certificates, the only trust anchors) and the
/// optional client certificate and key (PEM).
fn client_config(
    ca: &[u8],
    client: Option<&(Vec<u8>, Vec<u8>)>,
) -> Result<rustls::ClientConfig, String> {
    let anchors = CertificateDer::pem_slice_iter(ca)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--redis-tls-ca: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for anchor in &anchors {
        roots
            .add(anchor.clone())
            .map_err(|e| format!("--redis-tls-ca: {e}"))?;
    }
    let webpki = WebPkiServerVerifier::builder(Arc::new(roots))
        .build()
        .map_err(|e| format!("--redis-tls-ca: {e}"))?;
    let builder = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(DirectTrust { webpki, anchors }));
    match client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("--redis-tls-client-cert: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("--redis-tls-client-key: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("--redis-tls-client-cert: {e}"))
        }
    }
}

/// A reconnecting connection to one Redis over TLS of our own: made on first use, and
/// again on the call after one that found it broken.
pub(super) struct TlsLink {
    host: String,
    port: u16,
    name: ServerName<'static>,
    login: redis::RedisConnectionInfo,
    connector: tokio_rustls::TlsConnector,
    connect_timeout: Duration,
    response_timeout: Duration,
    current: tokio::sync::Mutex<Option<(u64, MultiplexedConnection)>>,
    generations: AtomicU64,
    /// A `READONLY` answer drops the connection too (see `RedisSettings`).
    reconnect_on_readonly: bool,
}

impl TlsLink {
    /// A link for `url` if it is a `rediss://` URL with `tls.ca` set (and not `#insecure`);
    /// `None` leaves the connection to redis-rs. Fails on unusable settings.
    pub(super) fn for_url(
        url: &str,
        tls: &super::RedisTls,
        connect_timeout: Duration,
        response_timeout: Duration,
        reconnect_on_readonly: bool,
    ) -> Result<Option<TlsLink>, StoreError> {
        use redis::IntoConnectionInfo;
        let Some(ca) = &tls.ca else { return Ok(None) };
        let info = url
            .into_connection_info()
            .map_err(|e| StoreError::Config(format!("redis url: {e}")))?;
        let redis::ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            ..
        } = info.addr()
        else {
            return Ok(None);
        };
        let name = ServerName::try_from(host.clone())
            .map_err(|e| StoreError::Config(format!("redis url: host {host:?}: {e}")))?;
        let config = client_config(ca, tls.client.as_ref())
            .map_err(|e| StoreError::Config(format!("redis: {e}")))?;
        Ok(Some(TlsLink {
            host: host.clone(),
            port: *port,
            name,
            login: info.redis_settings().clone(),
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            connect_timeout,
            response_timeout,
            current: tokio::sync::Mutex::new(None),
            generations: AtomicU64::new(0),
            reconnect_on_readonly,
        }))
    }

    /// Runs `invocation` once over the connection, made first if there is none.
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &super::invocation::Invocation<'_>,
        context: &'static str,
    ) -> Result<T, StoreError> {
        let (generation, mut connection) = self.connection().await?;
        let result = invocation.invoke_async::<T>(&mut connection).await;
        if let Err(e) = &result {
            let replica = self.reconnect_on_readonly && super::errors::read_only(e);
            if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() || replica
            {
                let mut current = self.current.lock().await;
                if current.as_ref().is_some_and(|(g, _)| *g == generation) {
                    *current = None;
                }
            }
        }
        result.map_err(|e| store_error(context, e))
    }

    async fn connection(&self) -> Result<(u64, MultiplexedConnection), StoreError> {
        let mut current = self.current.lock().await;
        if let Some(made) = current.as_ref() {
            return Ok(made.clone());
        }
        let connection = match tokio::time::timeout(self.connect_timeout, self.connect()).await {
            Ok(made) => made.map_err(|e| store_error("connection", e))?,
            Err(_) => {
                let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS connect timed out");
                return Err(store_error("connection", e.into()));
            }
        };
        let made = (self.generations.fetch_add(1, Ordering::Relaxed), connection);
        *current = Some(made.clone());
        Ok(made)
    }

    async fn connect(&self) -> redis::RedisResult<MultiplexedConnection> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port)).await?;
        tcp.set_nodelay(true)?;
        let stream = self.connector.connect(self.name.clone(), tcp).await?;
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(self.response_timeout));
        let (connection, driver) =
            MultiplexedConnection::new_with_config(&self.login, stream, config).await?;
        tokio::spawn(driver);
        Ok(connection)
    }
}
