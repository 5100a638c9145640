//! The Redis-protocol listener (`--resp-listen`): `CL.THROTTLE` for any Redis client, and
//! the handful of commands clients send on their own (`HELLO`, `AUTH`, `CLIENT SETNAME`,
//! `COMMAND`, ...).
//!
//! Each connection runs as one task: it reads, answers every complete command in what it
//! read (pipelining), writes the answers in one go, and reads again. What a client can hold:
//! - a place under the listener's connection bound, for as long as it sends something
//!   within the idle timeout (the listener is `crate::server::listener`'s, its accept loop in `crate::server::tasks`);
//! - one partial command, bounded by [`Bounds`], which must be complete within the
//!   command timeout of its first byte (else the connection is closed);
//! - the answers to what it sent, at most [`FLUSH_AT`] bytes plus one reply before they
//!   are written; a client that does not read them stops being read (and is closed once
//!   a write has been stuck for the idle timeout);
//! - `CL.THROTTLE` buckets in the caller-given share of the store, each under the bounds
//!   of caller-given limits, in a key space (`0:c/<key>`) no gRPC caller can reach.
//!
//! With a token, every command but `AUTH`, `HELLO` and `QUIT` needs the connection to have
//! authenticated; [`super::auth::MAX_AUTH_FAILURES`] wrong tokens close it, and an address that gave
//! too many across its connections is refused for a while ([`super::lockout`]).
//!
//! The commands are [`super::commands`] (dispatch, `CL.THROTTLE`, the informational ones)
//! and [`super::auth`] (`HELLO`, `AUTH`).

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::command::{Command, Flow};
use super::frame::{Args, Frame};
use super::lockout::AuthLockout;
use super::protocol::{Bounds, Parser};
use super::replies::Replies;
use crate::service::token::Token;
use crate::service::CallerLimits;
use cellrate_core::clock::Clock;
use cellrate_observe::metrics::Metrics;
use cellrate_store::Store;

/// Answers are written once this many bytes are waiting, even mid-pipeline.
pub const FLUSH_AT: usize = 64 * 1024;

/// What a closing connection discards of the client's bytes, at most.
const DRAIN_BYTES: usize = 1024 * 1024;
const DRAIN_TIME: Duration = Duration::from_millis(200);

/// Bytes read at a time.
const READ_CHUNK: usize = 16 * 1024;

/// How the listener runs.
#[derive(Debug, Clone, Default)]
pub struct RespSettings {
    /// Required through `AUTH` (or `HELLO ... AUTH`) before any other command.
    pub token: Option<String>,
    /// Size limits on commands.
    pub bounds: Bounds,
    /// Wrong tokens counted per address, across connections.
    pub lockout: super::lockout::LockoutSettings,
}

/// The Redis-protocol service: answers the connections its listener accepts.
pub struct RespServer {
    pub(super) store: Arc<dyn Store>,
    pub(super) caller: CallerLimits,
    pub(super) token: Option<Token>,
    pub(super) metrics: Arc<Metrics>,
    bounds: Bounds,
    /// Time for a command, once begun, to arrive whole.
    command_timeout: Duration,
    /// After a stop, time for connections to finish what they were doing.
    grace: Duration,
    next_id: AtomicU64,
    pub(super) lockout: AuthLockout,
    /// While set, the first xDS update is awaited: commands that decide are answered
    /// `LOADING` (see [`super::commands`]).
    waiting: Option<Arc<AtomicBool>>,
}

/// One connection's state.
pub(super) struct Connection {
    pub(super) id: u64,
    pub(super) authenticated: bool,
    pub(super) auth_failures: u32,
    /// The client's address (wrong tokens count against it across connections).
    pub(super) peer: IpAddr,
    pub(super) name: Option<Bytes>,
    parser: Parser,
    pub(super) replies: Replies,
}

/// Consecutive `CL.THROTTLE`s of a pipeline, waiting to be decided together by a store that
/// waits (Redis); at most [`RUN_COMMANDS`] commands and [`RUN_BYTES`] bytes of arguments. A
/// store that answers at once (memory) decides each as it is read, its arguments read in
/// place.
#[derive(Default)]
struct Run {
    /// Each command's arguments, copied out of the read buffer.
    commands: Vec<Vec<Bytes>>,
    bytes: usize,
}

/// Throttles of a pipeline decided together, at most.
pub const RUN_COMMANDS: usize = 64;

/// Bytes of arguments of the throttles decided together, at most (the next command is
/// decided with the next run once they are reached).
pub const RUN_BYTES: usize = 64 * 1024;

impl Run {
    /// Adds a throttle; whether the run has room for more.
    fn push(&mut self, args: &[&[u8]]) -> bool {
        self.bytes += args.iter().map(|a| a.len()).sum::<usize>();
        self.commands
            .push(args.iter().map(|a| Bytes::copy_from_slice(a)).collect());
        self.commands.len() < RUN_COMMANDS && self.bytes < RUN_BYTES
    }
}

/// Keeps the open-connections gauge right however a connection ends.
struct Open(Arc<Metrics>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.resp.connections.dec();
    }
}

/// When a read must end: a command begun must arrive whole, and a connection with a token
/// to give must give it.
#[derive(Clone, Copy)]
struct Deadline {
    begun: Option<Instant>,
    auth_by: Option<Instant>,
}

/// How a connection ends.
enum End {
    /// With its last answers written (see [`close`]).
    Close,
    /// At once: the client is gone or the server stops.
    Gone,
}

impl RespServer {
    pub fn new(
        store: Arc<dyn Store>,
        caller: CallerLimits,
        settings: &RespSettings,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
        command_timeout: Duration,
        grace: Duration,
    ) -> RespServer {
        RespServer {
            store,
            caller,
            token: settings.token.as_deref().map(Token::new),
            metrics,
            bounds: settings.bounds,
            command_timeout,
            grace,
            next_id: AtomicU64::new(1),
            lockout: AuthLockout::new(settings.lockout, clock),
            waiting: None,
        }
    }

    /// Commands that decide are answered `LOADING` while `waiting` is set (the first xDS
    /// update is awaited).
    pub fn waiting_for(mut self, waiting: Option<Arc<AtomicBool>>) -> RespServer {
        self.waiting = waiting;
        self
    }

    /// Whether the first xDS update is awaited.
    pub(super) fn waiting(&self) -> bool {
        self.waiting
            .as_ref()
            .is_some_and(|w| w.load(Ordering::Acquire))
    }

    /// Serves one accepted connection until the client leaves, a bound closes it, or
    /// `stop`: then it may finish what it has read within the grace period.
    pub async fn serve_connection<S>(
        self: Arc<Self>,
        stream: S,
        peer: IpAddr,
        stop: CancellationToken,
    ) where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        tokio::select! {
            _ = self.connection(stream, peer, stop.clone()) => {}
            _ = async { stop.cancelled().await; tokio::time::sleep(self.grace).await } => {
                self.metrics.resp_closed("shutdown");
            }
        }
    }

    async fn connection<S>(&self, mut stream: S, peer: IpAddr, stop: CancellationToken)
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        self.metrics.resp.connections.inc();
        let _open = Open(self.metrics.clone());
        let mut conn = Connection {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            authenticated: self.token.is_none(),
            auth_failures: 0,
            peer,
            name: None,
            parser: Parser::new(self.bounds),
            replies: Replies::default(),
        };
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let mut begun: Option<Instant> = None;
        let mut frame = Frame::default();
        let mut run = Run::default();
        // With a token, a connection must authenticate within the handshake timeout,
        // whatever else it sends meanwhile (PINGs answered NOAUTH would hold the slot).
        let auth_by = (!conn.authenticated).then(|| Instant::now() + self.command_timeout);
        let end = loop {
            let completed = match self
                .answer(&mut conn, &mut buf, &mut frame, &mut run, &mut stream)
                .await
            {
                Ok(completed) => completed,
                Err(end) => break end,
            };
            let auth_by = auth_by.filter(|_| !conn.authenticated);
            if auth_by.is_some_and(|by| Instant::now() >= by) {
                self.auth_timed_out(&mut conn.replies);
                break End::Close;
            }
            // A command begun must arrive whole within the command timeout. A partial command
            // after complete ones is a new command (a busy pipeline's reads end anywhere).
            begun = match begun {
                _ if !conn.parser.in_command(&buf) => None,
                Some(at) if !completed => Some(at),
                _ => Some(Instant::now()),
            };
            buf.reserve(READ_CHUNK);
            let deadline = Deadline { begun, auth_by };
            let read = self.read(&mut stream, &mut buf, deadline, &stop, &mut conn.replies);
            if let Err(end) = read.await {
                break end;
            }
        };
        if let End::Close = end {
            close(stream, &conn.replies.out).await;
        }
    }

    /// Answers every complete command read so far, in order, and writes the answers;
    /// whether a command was completed.
    async fn answer<S>(
        &self,
        conn: &mut Connection,
        buf: &mut BytesMut,
        frame: &mut Frame,
        run: &mut Run,
        stream: &mut S,
    ) -> Result<bool, End>
    where
        S: AsyncWrite + Unpin,
    {
        let mut completed = false;
        loop {
            match conn.parser.next(buf, frame) {
                Ok(true) => completed = true,
                Ok(false) => break,
                Err(e) => {
                    self.throttle_run(conn, run).await;
                    conn.replies.error(&format!("ERR {e}"));
                    self.metrics.resp_closed("protocol_error");
                    return Err(End::Close);
                }
            };
            let args = frame.args(buf);
            let throttle =
                conn.authenticated && Command::of(args[0]) == Command::Throttle && !self.waiting();
            if throttle && self.store.waits() {
                // Decided with the ones next to it in the pipeline (see Run).
                if run.push(&args) {
                    continue;
                }
                self.throttle_run(conn, run).await;
            } else if throttle {
                // A store that answers at once (memory) gains nothing from a run: decided
                // here, its arguments read where they lie.
                let answer = self.throttle(&args).await;
                self.throttle_reply(conn, answer);
            } else {
                self.throttle_run(conn, run).await;
                if let Flow::Close(reason) = self.execute(conn, &args).await {
                    if !reason.is_empty() {
                        self.metrics.resp_closed(reason);
                    }
                    return Err(End::Close);
                }
            }
            if conn.replies.out.len() >= FLUSH_AT {
                flush(stream, &mut conn.replies.out).await?;
            }
        }
        self.throttle_run(conn, run).await;
        flush(stream, &mut conn.replies.out).await?;
        Ok(completed)
    }

    /// Reads more of the client's bytes: within the command timeout of `begun` while a
    /// command is begun (else the connection closes with an error answer in `replies`),
    /// or until `stop`.
    async fn read<S>(
        &self,
        stream: &mut S,
        buf: &mut BytesMut,
        deadline: Deadline,
        stop: &CancellationToken,
        replies: &mut Replies,
    ) -> Result<(), End>
    where
        S: AsyncRead + Unpin,
    {
        let command_by = deadline.begun.map(|at| at + self.command_timeout);
        let by = match (command_by, deadline.auth_by) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let read = match by {
            Some(by) => match tokio::time::timeout_at(by, stream.read_buf(buf)).await {
                Ok(read) => read,
                Err(_) if deadline.auth_by == Some(by) => {
                    self.auth_timed_out(replies);
                    return Err(End::Close);
                }
                Err(_) => {
                    replies.error(&format!(
                        "ERR Protocol error: a command must arrive whole within {}s",
                        self.command_timeout.as_secs_f64()
                    ));
                    self.metrics.resp_closed("timeout");
                    return Err(End::Close);
                }
            },
            None => tokio::select! {
                read = stream.read_buf(buf) => read,
                _ = stop.cancelled() => {
                    self.metrics.resp_closed("shutdown");
                    return Err(End::Gone);
                }
            },
        };
        match read {
            Ok(0) => Err(End::Gone),
            Ok(_) => Ok(()),
            Err(e) => {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    self.metrics.resp_closed("timeout");
                }
                Err(End::Gone)
            }
        }
    }

    /// Closes a connection that did not authenticate in time.
    fn auth_timed_out(&self, replies: &mut Replies) {
        replies.error(&format!(
            "NOAUTH Authentication required within {}s of connecting",
            self.command_timeout.as_secs_f64()
        ));
        self.metrics.resp_closed("auth_timeout");
    }

    /// Decides the throttles of `run`, their replies appended in order. With a store that
    /// waits (Redis) each is its own store call, all started together in pipeline order:
    /// those that find the node's calls busy are coalesced into one script call, decided
    /// in that order, so that a pipeline costs a few round trips instead of one each, with
    /// the answers they would have had one after another.
    async fn throttle_run(&self, conn: &mut Connection, run: &mut Run) {
        if run.commands.is_empty() {
            return;
        }
        let views: Vec<Args> = run
            .commands
            .iter()
            .map(|command| command.iter().map(|a| &a[..]).collect())
            .collect();
        let answers = futures_util::future::join_all(views.iter().map(|a| self.throttle(a))).await;
        for answer in answers {
            self.throttle_reply(conn, answer);
        }
        drop(views);
        run.commands.clear();
        run.bytes = 0;
    }
}

/// Writes the waiting answers.
async fn flush<S: AsyncWrite + Unpin>(stream: &mut S, out: &mut BytesMut) -> Result<(), End> {
    if !out.is_empty() {
        stream.write_all(out).await.map_err(|_| End::Gone)?;
        out.clear();
    }
    Ok(())
}

/// Ends a connection with its last answers: writes them, closes the sending side, and
/// discards what the client still sends for a moment (at most [`DRAIN_BYTES`], for at most
/// [`DRAIN_TIME`]), so that its kernel does not reset the connection and drop the answers
/// (the last of which says why it ends) before the client reads them.
async fn close<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, last: &[u8]) {
    if stream.write_all(last).await.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut scratch = vec![0u8; 16 * 1024];
        let mut drained = 0;
        while drained < DRAIN_BYTES {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}
