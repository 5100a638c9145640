//! TLS on the gRPC listeners, its files re-read when they change.
//!
//! The handshake is made here (rustls, as tonic would), not by tonic, so that the
//! certificate, key and client CAs in force can be swapped while serving: each new
//! connection is accepted with the configuration in force at its first byte; connections
//! already open keep theirs. The files are watched (their directories, not recursively,
//! so that Kubernetes' swap of a Secret's `..data` symlink is seen) and re-checked every
//! `--reload-interval-seconds` besides, as a watch can be lost. A change is read whole;
//! a file over [`MAX_TLS_FILE_BYTES`], a PEM that does not parse, a key that does not
//! match its certificate: the configuration in force stays, the error is logged and
//! counted (`cellrate_tls_reloads_total{result="failure"}`). A change that is only half
//! written (the certificate renewed, not yet its key) fails the same way, and the next
//! event or re-check, once the key is there too, succeeds.
//!
//! Handshakes run side by side (each within the handshake timeout), as tonic runs them:
//! one client that stalls its handshake holds up nobody else's.

use parking_lot::Mutex;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::stream::{FuturesUnordered, StreamExt};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;

use super::admin::TlsPem;
use super::listener::{GuardedListener, GuardedStream};
use crate::observe::metrics::Metrics;

/// The largest TLS file read: a certificate chain or a CA bundle is a few KiB.
pub const MAX_TLS_FILE_BYTES: u64 = 1 << 20;

/// Where the TLS material is read from, to re-read it when it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    pub admin_client_ca: Option<PathBuf>,
    /// The name a decision-listener client certificate must bear (`--client-san`).
    pub client_san: Option<String>,
    /// Re-checked this often besides the watch.
    pub recheck: Duration,
}

impl TlsFiles {
    /// Reads every file (through symlinks), each at most [`MAX_TLS_FILE_BYTES`].
    pub fn read(&self) -> Result<TlsPem, String> {
        let optional = |path: &Option<PathBuf>| path.as_deref().map(read_bounded).transpose();
        Ok(TlsPem {
            cert: read_bounded(&self.cert)?,
            key: read_bounded(&self.key)?,
            client_ca: optional(&self.client_ca)?,
            admin_client_ca: optional(&self.admin_client_ca)?,
            client_san: self.client_san.clone(),
        })
    }

    /// The directories to watch: each file's own.
    fn dirs(&self) -> Vec<PathBuf> {
        let files = [Some(&self.cert), Some(&self.key)]
            .into_iter()
            .chain([self.client_ca.as_ref(), self.admin_client_ca.as_ref()])
            .flatten();
        let mut dirs: Vec<PathBuf> = files
            .map(|f| match f.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
                _ => PathBuf::from("."),
            })
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs
    }
}

/// `path`'s bytes, refused beyond [`MAX_TLS_FILE_BYTES`] (read no further).
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    let failed = |e: io::Error| format!("{}: {e}", path.display());
    let bytes = read_regular(path, MAX_TLS_FILE_BYTES).map_err(failed)?;
    if bytes.len() as u64 > MAX_TLS_FILE_BYTES {
        return Err(format!(
            "{}: over {MAX_TLS_FILE_BYTES} bytes",
            path.display()
        ));
    }
    Ok(bytes)
}

/// At most `most + 1` bytes of the regular file at `path` (through symlinks), or an error
/// that says what else it is. Never waits: a FIFO is refused before it is opened (opening
/// one waits for a writer, reading one waits for its data, and either would stop
/// rotation and shutdown for good), the file is opened without blocking, and looked at
/// again through the open file (what is read is what was checked).
pub fn read_regular(path: &Path, most: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let regular = |meta: std::fs::Metadata| match meta.is_file() {
        true => Ok(()),
        false => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file (a {})", file_kind(&meta)),
        )),
    };
    regular(std::fs::metadata(path)?)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    regular(file.metadata()?)?;
    let mut bytes = Vec::new();
    file.take(most + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    match () {
        _ if kind.is_dir() => "directory",
        _ if kind.is_fifo() => "FIFO",
        _ if kind.is_socket() => "socket",
        _ if kind.is_block_device() || kind.is_char_device() => "device",
        _ => "special file",
    }
}

/// A rustls server configuration: `cert`'s chain and `key` (which must match), client
/// certificates required from `ca` when given (bearing the name `san` when given too),
/// HTTP/2 by ALPN.
fn server_config(
    pem: &TlsPem,
    ca: Option<&[u8]>,
    san: Option<&str>,
) -> Result<ServerConfig, String> {
    let chain = CertificateDer::pem_slice_iter(&pem.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate: {e}"))?;
    if chain.is_empty() {
        return Err("the certificate: no CERTIFICATE in the PEM".to_string());
    }
    let key = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|e| format!("the key: {e}"))?;
    let builder = ServerConfig::builder();
    let builder = match ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| format!("the client CA: {e}"))?;
                roots.add(cert).map_err(|e| format!("the client CA: {e}"))?;
            }
            let webpki = WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|e| format!("the client CA: {e}"))?;
            match san {
                None => builder.with_client_cert_verifier(webpki),
                Some(san) => {
                    let name = client_name(san)?;
                    builder.with_client_cert_verifier(Arc::new(NamedClient { webpki, name }))
                }
            }
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// `san` as the name a client certificate must bear: a DNS name or an IP address.
pub fn client_name(san: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(san.to_string())
        .map_err(|_| format!("the client name {san:?}: neither a DNS name nor an IP address"))
}

/// webpki's verification of a client certificate (its chain to the client CA, its dates,
/// its client-authentication usage), and one more requirement: the certificate names
/// `name` among its subject alternative names, as envoyproxy/ratelimit checks
/// `GRPC_CLIENT_TLS_SAN` (Go's `VerifyOptions.DNSName`).
#[derive(Debug)]
struct NamedClient {
    webpki: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for NamedClient {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .webpki
            .verify_client_cert(end_entity, intermediates, now)?;
        let named = webpki::EndEntityCert::try_from(end_entity)
            .and_then(|cert| cert.verify_is_valid_for_subject_name(&self.name));
        match named {
            Ok(()) => Ok(verified),
            Err(_) => Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName,
            )),
        }
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

/// The TLS configurations in force on both gRPC listeners, and what they were built from.
pub struct LiveTls {
    decisions: ArcSwap<ServerConfig>,
    admin: ArcSwap<ServerConfig>,
    /// The material in force (a re-read equal to it changes nothing).
    in_force: Mutex<TlsPem>,
    /// The last rejected material's error, so that a file left bad is logged once.
    rejected: Mutex<Option<String>>,
}

impl LiveTls {
    pub fn new(pem: &TlsPem) -> Result<LiveTls, String> {
        Ok(LiveTls {
            decisions: ArcSwap::from_pointee(server_config(
                pem,
                pem.client_ca.as_deref(),
                pem.client_san.as_deref(),
            )?),
            admin: ArcSwap::from_pointee(server_config(pem, pem.admin_client_ca.as_deref(), None)?),
            in_force: Mutex::new(pem.clone()),
            rejected: Mutex::new(None),
        })
    }

    /// Re-reads `files`; a change is swapped in if valid, else logged and counted.
    pub fn recheck(&self, files: &TlsFiles, metrics: &Metrics) {
        let built = files.read().and_then(|pem| {
            if same(&pem, &self.in_force.lock()) {
                return Ok(None);
            }
            let decisions =
                server_config(&pem, pem.client_ca.as_deref(), pem.client_san.as_deref())?;
            let admin = server_config(&pem, pem.admin_client_ca.as_deref(), None)?;
            Ok(Some((pem, decisions, admin)))
        });
        let mut rejected = self.rejected.lock();
        match built {
            Ok(None) => *rejected = None,
            Ok(Some((pem, decisions, admin))) => {
                self.decisions.store(Arc::new(decisions));
                self.admin.store(Arc::new(admin));
                *self.in_force.lock() = pem;
                *rejected = None;
                metrics.tls_reload("success");
                tracing::info!(cert = %files.cert.display(), "new TLS certificate in force for new connections");
            }
            Err(error) => {
                if rejected.as_deref() != Some(error.as_str()) {
                    metrics.tls_reload("failure");
                    tracing::error!(%error, "TLS files rejected; the certificate in force stays");
                    *rejected = Some(error);
                }
            }
        }
    }

    /// Re-checks on every change in the files' directories and every `files.recheck`,
    /// until `stop`.
    pub async fn watch(
        self: Arc<Self>,
        files: TlsFiles,
        metrics: Arc<Metrics>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        let _watcher = watch_dirs(&files.dirs(), tx);
        let mut every = tokio::time::interval(files.recheck);
        every.tick().await;
        loop {
            tokio::select! {
                _ = every.tick() => {}
                Some(()) = rx.recv() => {}
                _ = stop.cancelled() => return,
            }
            let (live, files, metrics) = (self.clone(), files.clone(), metrics.clone());
            // Files are read off the runtime's threads.
            let _ = tokio::task::spawn_blocking(move || live.recheck(&files, &metrics)).await;
        }
    }

    /// An acceptor with the configuration in force on one listener.
    fn acceptor(&self, admin: bool) -> tokio_rustls::TlsAcceptor {
        let config = match admin {
            true => self.admin.load_full(),
            false => self.decisions.load_full(),
        };
        tokio_rustls::TlsAcceptor::from(config)
    }
}

/// Whether two sets of material are the same bytes.
fn same(a: &TlsPem, b: &TlsPem) -> bool {
    a.cert == b.cert
        && a.key == b.key
        && a.client_ca == b.client_ca
        && a.admin_client_ca == b.admin_client_ca
}

type Watcher = notify_debouncer_full::Debouncer<
    notify::RecommendedWatcher,
    notify_debouncer_full::RecommendedCache,
>;

/// Watches `dirs` (not recursively), asking for a re-check after each debounced batch of
/// events; `None` (logged) when watching is impossible: the periodic re-check remains.
fn watch_dirs(dirs: &[PathBuf], tx: tokio::sync::mpsc::Sender<()>) -> Option<Watcher> {
    let handler = move |result: notify_debouncer_full::DebounceEventResult| {
        let changed = result.map_or(true, |events| {
            events
                .iter()
                .any(|e| !matches!(e.event.kind, notify::EventKind::Access(_)))
        });
        if changed {
            let _ = tx.try_send(());
        }
    };
    let debounce = Duration::from_millis(100);
    let mut watcher = match notify_debouncer_full::new_debouncer(debounce, None, handler) {
        Ok(watcher) => watcher,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the TLS files; re-checking them on the timer only");
            return None;
        }
    };
    for dir in dirs {
        if let Err(e) = watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
            tracing::warn!(error = %e, dir = %dir.display(), "cannot watch the TLS files' directory; re-checking on the timer only");
        }
    }
    Some(watcher)
}

/// An accepted gRPC connection: plain, or TLS over it (a type of ours only so that it
/// can say its peer to tonic: `Connected`).
pub struct Conn(Either<GuardedStream, Box<TlsStream<GuardedStream>>>);

impl Conn {
    /// The connection under any TLS.
    pub fn guarded_mut(&mut self) -> &mut GuardedStream {
        match &mut self.0 {
            Either::Left(stream) => stream,
            Either::Right(stream) => stream.get_mut().0,
        }
    }

    fn io(self: Pin<&mut Self>) -> Pin<&mut Either<GuardedStream, Box<TlsStream<GuardedStream>>>> {
        Pin::new(&mut self.get_mut().0)
    }
}

/// A listener's connections, handshaken.
pub type Incoming = Pin<Box<dyn futures_util::Stream<Item = io::Result<Conn>> + Send>>;

/// `listener`'s connections, through a TLS handshake (with the configuration in force for
/// the admin listener or the decision one) when `tls` is given.
pub fn incoming(
    listener: GuardedListener,
    tls: Option<(Arc<LiveTls>, bool)>,
    handshake_timeout: Duration,
) -> Incoming {
    let Some((live, admin)) = tls else {
        return Box::pin(futures_util::stream::unfold(
            listener,
            |mut listener| async move {
                let (stream, _) = listener.accept().await;
                Some((Ok(Conn(Either::Left(stream))), listener))
            },
        ));
    };
    let handshakes = FuturesUnordered::new();
    Box::pin(futures_util::stream::unfold(
        (listener, handshakes),
        move |(mut l, mut handshakes)| {
            let live = live.clone();
            async move {
                loop {
                    tokio::select! {
                        (stream, _) = l.accept() => {
                            let accept = live.acceptor(admin).accept(stream);
                            handshakes.push(tokio::time::timeout(handshake_timeout, accept));
                        }
                        Some(done) = handshakes.next(), if !handshakes.is_empty() => match done {
                            Ok(Ok(stream)) => return Some((Ok(Conn(Either::Right(Box::new(stream)))), (l, handshakes))),
                            Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                            Err(_) => tracing::debug!("TLS handshake not done within the handshake timeout"),
                        },
                    }
                }
            }
        },
    ))
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.io().poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.io().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.io().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io().poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = super::listener::ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match &self.0 {
            Either::Left(s) => s.connect_info(),
            Either::Right(s) => s.get_ref().0.connect_info(),
        }
    }
}
