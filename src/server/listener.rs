//! Accepting connections from a hostile network: the bounds and timeouts every listener
//! shares (both gRPC listeners, the metrics listener).
//!
//! A rate limiter must survive the abuse it protects others from, so no client gets to
//! hold resources without limit:
//!
//! - **Connections** are bounded per listener ([`ConnectionLimits::max_connections`]): at
//!   the bound the listener stops accepting (new clients wait in the kernel's backlog)
//!   until a connection closes. The bound is clamped below the process's file-descriptor
//!   limit, so that no listener can starve the others of descriptors. One client address
//!   holds at most [`ConnectionLimits::per_address_bound`] of them (`per_address.rs`):
//!   the flag's bound, but never more than a quarter of the listener's total, so that one
//!   address cannot fill a small listener (the metrics port's probes) by itself.
//! - **Accept errors back off** (10 ms doubling to 1 s) instead of spinning on a full
//!   descriptor table.
//! - **Handshake timeout**: a connection must deliver its first 16 bytes (of the HTTP/2
//!   preface, a TLS ClientHello, an HTTP/1 request line) within
//!   [`ConnectionLimits::handshake_timeout`]; HTTP/1 headers must be complete by then.
//! - **Idle timeout**: a connection from which nothing was read for
//!   [`ConnectionLimits::idle_timeout`] is closed (between one and two idle periods after
//!   its last byte). A client that stops reading is closed the same way once a write has
//!   been stuck for that long.
//! - **TCP keepalive** finds peers that vanished without a FIN.
//!
//! The HTTP/2 limits (streams per connection, local resets, request timeout) are set where
//! the servers are built, in [`crate::server`]; the in-flight bound in `in_flight.rs`.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::either::Either;

use super::unix_socket::Bound;

/// Bounds and timeouts of one listener's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at most; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// Open connections from one client address at most (0: no such bound); more are
    /// closed as they are accepted. Capped per listener by [`Self::per_address_bound`].
    pub max_per_address: usize,
    /// Time for a new connection's first bytes (and, with TLS, its whole handshake).
    pub handshake_timeout: Duration,
    /// Time without a byte read (or with a write stuck) before a connection is closed.
    pub idle_timeout: Duration,
    /// Idle time before TCP keepalive probes start.
    pub tcp_keepalive: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: 4096,
            max_per_address: DEFAULT_MAX_PER_ADDRESS,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            tcp_keepalive: Duration::from_secs(60),
        }
    }
}

/// The default of [`ConnectionLimits::max_per_address`]: an Envoy holds a few connections
/// per worker thread, so a few hundred leave room for many Envoys behind one NAT address
/// while keeping one client from a listener's whole bound.
pub const DEFAULT_MAX_PER_ADDRESS: usize = 512;

/// The largest part of a listener's connections one client address may hold: a quarter,
/// so that at least three other addresses (a kubelet's probe, Prometheus, an operator) find
/// room whatever one address does.
pub const PER_ADDRESS_SHARE_DIVISOR: usize = 4;

impl ConnectionLimits {
    /// The per-address bound in force on this listener (0: none): `max_per_address`, but at
    /// most `max_connections / PER_ADDRESS_SHARE_DIVISOR` (at least 1). Without the cap, the
    /// default 512 per address was above the metrics listener's whole bound (64): one
    /// address holding 64 keep-alive connections kept every probe out.
    pub fn per_address_bound(&self) -> usize {
        if self.max_per_address == 0 {
            return 0;
        }
        let share = (self.max_connections / PER_ADDRESS_SHARE_DIVISOR).max(1);
        self.max_per_address.min(share)
    }
}

/// Raises the soft limit on open files to the hard limit (as Go's runtime does) and
/// returns the limit now in force, or `None` where it cannot be read.
pub fn raise_fd_limit() -> Option<u64> {
    rlimit::increase_nofile_limit(u64::MAX).ok()
}

/// Clamps each listener's connection bound so that together they stay below `fd_limit`,
/// keeping `reserve` descriptors for everything else (config files, Redis, logs).
/// Returns the clamped bounds in the same order.
pub fn fit_to_fd_limit(wanted: &[usize], fd_limit: Option<u64>, reserve: u64) -> Vec<usize> {
    let Some(limit) = fd_limit else {
        return wanted.to_vec();
    };
    let available = limit.saturating_sub(reserve).max(wanted.len() as u64) as u128;
    let total: u128 = wanted.iter().map(|&w| w as u128).sum();
    if total <= available {
        return wanted.to_vec();
    }
    // Shrink every listener in proportion, each keeping at least one connection.
    wanted
        .iter()
        .map(|&w| ((w as u128 * available / total) as usize).max(1))
        .collect()
}

/// A listener that applies [`ConnectionLimits`].
pub struct GuardedListener {
    listener: Bound,
    limits: ConnectionLimits,
    permits: Arc<Semaphore>,
    /// Pause after the next accept error.
    backoff: Duration,
    /// Which listener, for logs.
    name: &'static str,
    /// Bytes a connection must send within the handshake timeout.
    handshake_bytes: usize,
    /// Connections (and requests in flight) by client address.
    per_address: Arc<super::per_address::PerAddress>,
    /// On a Unix socket, whether HTTP/2 header blocks pass `uds_authority.rs`.
    fix_authority: bool,
}

/// What a connection must send within the handshake timeout: as long as an HTTP/1 request
/// line (`GET / HTTP/1.1\r\n`), less than the HTTP/2 preface or a TLS ClientHello. A
/// client trickling its first bytes is closed.
const HANDSHAKE_BYTES: usize = 16;

const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

impl GuardedListener {
    pub fn new(listener: impl Into<Bound>, limits: ConnectionLimits, name: &'static str) -> Self {
        GuardedListener {
            listener: listener.into(),
            permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            limits,
            backoff: FIRST_BACKOFF,
            name,
            handshake_bytes: HANDSHAKE_BYTES,
            // Kept without a bound too: requests in flight are counted per address.
            per_address: super::per_address::PerAddress::new(match limits.per_address_bound() {
                0 => usize::MAX,
                bound => bound,
            }),
            fix_authority: false,
        }
    }

    /// On a Unix socket, an `:authority` h2 would refuse (a socket path) is read as
    /// `localhost` (`uds_authority.rs`): for gRPC in cleartext only.
    pub fn with_authority_fix(mut self, on: bool) -> Self {
        self.fix_authority = on;
        self
    }

    /// Requires only `bytes` (at least 1) within the handshake timeout instead of
    /// `HANDSHAKE_BYTES`: for protocols whose first request may be shorter (a Redis
    /// client's `PING\r\n`), which bound partial requests themselves.
    pub fn with_handshake_bytes(mut self, bytes: usize) -> Self {
        self.handshake_bytes = bytes.max(1);
        self
    }

    /// The next connection, once the bound leaves room for one, with its peer's address
    /// (`None` on a Unix socket).
    pub async fn accept(&mut self) -> (GuardedStream, Option<SocketAddr>) {
        loop {
            // Taken before accepting: at the bound, connections wait in the backlog.
            let Ok(permit) = self.permits.clone().acquire_owned().await else {
                // The semaphore is never closed; wait forever rather than spin.
                std::future::pending::<()>().await;
                continue;
            };
            let accepted = match &self.listener {
                Bound::Tcp(listener) => listener
                    .accept()
                    .await
                    .map(|(s, p)| (Either::Left(s), Some(p))),
                Bound::Unix(listener, _) => listener.accept().await.map(|(s, _)| {
                    let fixed = super::uds_authority::AuthorityFix::new(s, self.fix_authority);
                    (Either::Right(Box::new(fixed)), None)
                }),
            };
            match accepted {
                Ok((stream, peer)) => {
                    self.backoff = FIRST_BACKOFF;
                    let slot = match peer {
                        Some(peer) => match self.per_address.take(peer.ip()) {
                            Some(slot) => Some(slot),
                            None => {
                                // Closed at once: this address holds its share already.
                                tracing::debug!(listener = self.name, %peer, "connection over the per-address bound closed");
                                continue;
                            }
                        },
                        // Every peer of a Unix socket is local: its file's mode decides.
                        _ => None,
                    };
                    if let Either::Left(stream) = &stream {
                        configure(stream, &self.limits);
                    }
                    let mut stream = GuardedStream::new(stream, permit, &self.limits);
                    stream.handshake_due = self.handshake_bytes;
                    stream._address = slot;
                    return (stream, peer);
                }
                // The failed connection's own problem: the next accept is fine.
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    // Typically EMFILE/ENFILE: accepting again at once would spin.
                    tracing::warn!(listener = self.name, error = %e, pause = ?self.backoff, "accept failed; pausing");
                    drop(permit);
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// The connections as a stream, for tonic's `serve_with_incoming_shutdown`.
    pub fn into_stream(
        self,
    ) -> impl futures_util::Stream<Item = Result<GuardedStream, io::Error>> + Send + 'static {
        futures_util::stream::unfold(self, |mut listener| async move {
            let (stream, _) = listener.accept().await;
            Some((Ok(stream), listener))
        })
    }

    /// Where it listens, for logs.
    pub fn describe(&self) -> String {
        self.listener.describe()
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
    )
}

/// TCP_NODELAY (rate-limit RPCs are small: Nagle's algorithm with delayed ACKs would hold
/// answers back by tens of milliseconds) and TCP keepalive.
fn configure(stream: &TcpStream, limits: &ConnectionLimits) {
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new().with_time(limits.tcp_keepalive);
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive);
}

/// An accepted connection: holds its place under the connection bound until dropped, and
/// fails its reads and writes with `TimedOut` when the handshake or idle timeout passes.
pub struct GuardedStream {
    stream: Io,
    _permit: OwnedSemaphorePermit,
    /// Its place in its address's count (`None` on a Unix socket).
    _address: Option<super::per_address::AddressSlot>,
    remote: Option<SocketAddr>,
    /// Fires at the end of the current read window.
    read_deadline: Pin<Box<Sleep>>,
    /// Whether anything was read in the current window (no clock read per read).
    read_in_window: bool,
    /// Bytes still due before the handshake deadline.
    handshake_due: usize,
    idle: Duration,
    /// Armed while a write is stuck (the peer does not read).
    write_deadline: Option<Pin<Box<Sleep>>>,
    /// When set, reads and writes fail from then on (a connection's age and grace over).
    cutoff: Option<Pin<Box<Sleep>>>,
}

impl GuardedStream {
    fn new(stream: Io, permit: OwnedSemaphorePermit, limits: &ConnectionLimits) -> Self {
        GuardedStream {
            remote: match &stream {
                Either::Left(stream) => stream.peer_addr().ok(),
                Either::Right(_) => None,
            },
            stream,
            _permit: permit,
            _address: None,
            read_deadline: Box::pin(tokio::time::sleep(limits.handshake_timeout)),
            read_in_window: false,
            handshake_due: HANDSHAKE_BYTES,
            idle: limits.idle_timeout,
            write_deadline: None,
            cutoff: None,
        }
    }

    /// From `deadline` on, every read and write fails (`TimedOut`): the server then drops
    /// the connection, whatever the peer does.
    pub fn cut_off_at(&mut self, deadline: Instant) {
        self.cutoff = Some(Box::pin(tokio::time::sleep_until(deadline)));
    }

    /// Whether the cutoff has passed (registering for a wake-up at it when not).
    fn cut_off(&mut self, cx: &mut Context<'_>) -> bool {
        self.cutoff
            .as_mut()
            .is_some_and(|cutoff| cutoff.as_mut().poll(cx).is_ready())
    }

    /// The peer's address, if known.
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.remote
    }

    fn timed_out(what: &str) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, what.to_string())
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.cut_off(cx) {
            return Poll::Ready(Err(GuardedStream::timed_out(CUT_OFF)));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                let read = buf.filled().len() - before;
                if read > 0 {
                    this.read_in_window = true;
                    this.handshake_due = this.handshake_due.saturating_sub(read);
                }
                return Poll::Ready(result);
            }
            Poll::Pending => {}
        }
        // Nothing to read: is the window over?
        loop {
            ready!(this.read_deadline.as_mut().poll(cx));
            if this.handshake_due > 0 || !this.read_in_window {
                return Poll::Ready(Err(GuardedStream::timed_out(
                    "too few bytes from the peer within the handshake or idle timeout",
                )));
            }
            this.read_in_window = false;
            let next = Instant::now() + this.idle;
            this.read_deadline.as_mut().reset(next);
        }
    }
}

impl GuardedStream {
    /// A write's outcome, with a deadline while the peer does not read: a write that
    /// stays stuck for the idle timeout fails.
    fn watch_write(
        &mut self,
        cx: &mut Context<'_>,
        outcome: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if self.cut_off(cx) {
            return Poll::Ready(Err(GuardedStream::timed_out(CUT_OFF)));
        }
        if outcome.is_ready() {
            self.write_deadline = None;
            return outcome;
        }
        let idle = self.idle;
        let deadline = self
            .write_deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        ready!(deadline.as_mut().poll(cx));
        Poll::Ready(Err(GuardedStream::timed_out(
            "the peer has not read for the idle timeout",
        )))
    }
}

/// An accepted connection's socket: TCP, or a Unix socket with its `:authority` made
/// acceptable to h2 (`uds_authority.rs`).
type Io = Either<TcpStream, Box<super::uds_authority::AuthorityFix<UnixStream>>>;

/// Why a connection cut off at its deadline fails.
const CUT_OFF: &str = "the connection's age and grace are over";

impl AsyncWrite for GuardedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.watch_write(cx, outcome)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.watch_write(cx, outcome)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// What a request knows of its connection (tonic puts it in every request's extensions):
/// the addresses, and the count of requests in flight from the client's address, which the
/// in-flight bound keeps a share of (`None` on a Unix socket: every peer is local).
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    pub tcp: tonic::transport::server::TcpConnectInfo,
    pub address_in_flight: Option<super::per_address::InFlightCount>,
}

impl tonic::transport::server::Connected for GuardedStream {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnectionInfo {
            tcp: tonic::transport::server::TcpConnectInfo {
                local_addr: match &self.stream {
                    Either::Left(stream) => stream.local_addr().ok(),
                    Either::Right(_) => None,
                },
                remote_addr: self.remote,
            },
            address_in_flight: self._address.as_ref().map(|a| a.in_flight().clone()),
        }
    }
}

/// Serves `router` over HTTP/1.1 on `listener` until `shutdown` resolves, then lets
/// requests in progress finish for up to `grace`. Request headers must arrive within the
/// handshake timeout and fit in 16 KiB.
pub async fn serve_http1(
    mut listener: GuardedListener,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send,
    grace: Duration,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(listener.limits.handshake_timeout)
        .max_buf_size(16 * 1024);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            (stream, _) = listener.accept() => {
                let service = hyper_util::service::TowerToHyperService::new(router.clone());
                let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    let _ = connection.await;
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(grace, graceful.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_shrink_to_the_descriptor_limit() {
        assert_eq!(
            fit_to_fd_limit(&[4096, 4096, 64], Some(1_048_576), 256),
            vec![4096, 4096, 64]
        );
        assert_eq!(
            fit_to_fd_limit(&[4096, 4096, 64], None, 256),
            vec![4096, 4096, 64]
        );
        let fitted = fit_to_fd_limit(&[4096, 4096, 64], Some(1024), 256);
        assert!(fitted.iter().sum::<usize>() <= 1024 - 256, "{fitted:?}");
        assert!(fitted.iter().all(|&n| n >= 1), "{fitted:?}");
        assert_eq!(fit_to_fd_limit(&[10, 10], Some(4), 256), vec![1, 1]);
    }

    #[test]
    fn one_address_gets_at_most_a_quarter_of_a_listener() {
        let bound = |max_connections, max_per_address| {
            ConnectionLimits {
                max_connections,
                max_per_address,
                ..ConnectionLimits::default()
            }
            .per_address_bound()
        };
        assert_eq!(bound(4096, 512), 512, "the flag, below a quarter");
        assert_eq!(bound(64, 512), 16, "the metrics listener's quarter");
        assert_eq!(bound(256, 512), 64, "the admin listener's quarter");
        assert_eq!(bound(3, 512), 1, "at least one");
        assert_eq!(bound(64, 0), 0, "0: no bound at all");
    }
}
