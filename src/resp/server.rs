//! The Redis-protocol listener (`--resp-listen`): `CL.THROTTLE` for any Redis client, and
//! the handful of commands clients send on their own (`HELLO`, `AUTH`, `CLIENT SETNAME`,
//! `COMMAND`, ...).
//!
//! Each connection runs as one task: it reads, answers every complete command in what it
//! read (pipelining), writes the answers in one go, and reads again. What a client can hold:
//! - a place under the listener's connection bound, for as long as it sends something
//!   within the idle timeout (see [`crate::server::listener`]);
//! - one partial command, bounded by [`Bounds`], which must be complete within the
//!   command timeout of its first byte (else the connection is closed);
//! - the answers to what it sent, at most [`FLUSH_AT`] bytes plus one reply before they
//!   are written; a client that does not read them stops being read (and is closed once
//!   a write has been stuck for the idle timeout);
//! - `CL.THROTTLE` buckets in the caller-given share of the store, each under the bounds
//!   of caller-given limits, in a key space (`0:c/<key>`) no gRPC caller can reach.
//!
//! With a token, every command but `AUTH`, `HELLO` and `QUIT` needs the connection to have
//! authenticated; [`MAX_AUTH_FAILURES`] wrong tokens close it, and an address that gave
//! too many across its connections is refused for a while ([`super::lockout`]).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::lockout::AuthLockout;
use super::protocol::{Bounds, Parser, Replies};
use super::throttle::{reply, Cell, CellError};
use crate::gcra::Mode;
use crate::limits::names::BucketKey;
use crate::observe::metrics::Metrics;
use crate::server::admin::Token;
use crate::server::listener::{GuardedListener, GuardedStream};
use crate::service::CallerLimits;
use crate::store::{Store, StoreItem};

/// Answers are written once this many bytes are waiting, even mid-pipeline.
pub const FLUSH_AT: usize = 64 * 1024;

/// The longest `CL.THROTTLE` key, in bytes.
pub const MAX_KEY: usize = 512;

/// The longest client name (`CLIENT SETNAME`, `HELLO ... SETNAME`) or library attribute.
pub const MAX_CLIENT_NAME: usize = 256;

/// Wrong tokens a connection may give before it is closed.
pub const MAX_AUTH_FAILURES: u32 = 3;

/// What a closing connection discards of the client's bytes, at most.
const DRAIN_BYTES: usize = 1024 * 1024;
const DRAIN_TIME: Duration = Duration::from_millis(200);

/// Bytes read at a time.
const READ_CHUNK: usize = 16 * 1024;

/// redis-cell's usage error, word for word.
const THROTTLE_USAGE: &str =
    "Cell error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]";

/// How the listener runs.
#[derive(Debug, Clone, Default)]
pub struct RespSettings {
    /// Required through `AUTH` (or `HELLO ... AUTH`) before any other command.
    pub token: Option<String>,
    /// Size limits on commands.
    pub bounds: Bounds,
}

/// The Redis-protocol service: answers connections from a [`GuardedListener`].
pub struct RespServer {
    store: Arc<dyn Store>,
    caller: CallerLimits,
    token: Option<Token>,
    metrics: Arc<Metrics>,
    bounds: Bounds,
    /// Time for a command, once begun, to arrive whole.
    command_timeout: Duration,
    /// After a stop, time for connections to finish what they were doing.
    grace: Duration,
    next_id: AtomicU64,
    lockout: AuthLockout,
}

/// The commands this server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Throttle,
    Ping,
    Echo,
    Hello,
    Auth,
    Client,
    Commands,
    Select,
    Quit,
    Other,
}

/// Name, arity (negative: at least), flags, for `COMMAND`.
const COMMANDS: [(Command, &str, i64, &str); 9] = [
    (Command::Throttle, "cl.throttle", -5, "write"),
    (Command::Ping, "ping", -1, "fast"),
    (Command::Echo, "echo", 2, "fast"),
    (Command::Hello, "hello", -1, "fast"),
    (Command::Auth, "auth", -2, "fast"),
    (Command::Client, "client", -2, "fast"),
    (Command::Commands, "command", -1, "loading"),
    (Command::Select, "select", 2, "fast"),
    (Command::Quit, "quit", -1, "fast"),
];

impl Command {
    fn of(name: &[u8]) -> Command {
        COMMANDS
            .iter()
            .find(|(_, text, _, _)| name.eq_ignore_ascii_case(text.as_bytes()))
            .map_or(Command::Other, |c| c.0)
    }

    fn label(self) -> &'static str {
        COMMANDS
            .iter()
            .find(|c| c.0 == self)
            .map_or("other", |c| c.1)
    }
}

/// One connection's state.
struct Connection {
    id: u64,
    authenticated: bool,
    auth_failures: u32,
    /// The client's address (wrong tokens count against it across connections).
    peer: IpAddr,
    name: Option<Bytes>,
    parser: Parser,
    replies: Replies,
}

/// Consecutive `CL.THROTTLE`s of a pipeline, waiting to be decided together; at most
/// [`RUN_COMMANDS`] commands and [`RUN_BYTES`] bytes of arguments.
#[derive(Default)]
struct Run {
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
    fn push(&mut self, args: Vec<Bytes>) -> bool {
        self.bytes += args.iter().map(Bytes::len).sum::<usize>();
        self.commands.push(args);
        self.commands.len() < RUN_COMMANDS && self.bytes < RUN_BYTES
    }
}

/// What to do after a command.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Close(&'static str),
}

/// A command's failure: the error reply's text (its code first), and whether the
/// connection ends.
struct Failure(String, Flow);

fn fail(text: impl Into<String>) -> Failure {
    Failure(text.into(), Flow::Continue)
}

fn arity(command: &str) -> Failure {
    fail(format!(
        "ERR wrong number of arguments for '{command}' command"
    ))
}

/// Keeps the open-connections gauge right however a connection ends.
struct Open(Arc<Metrics>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.resp_connections.dec();
    }
}

impl RespServer {
    pub fn new(
        store: Arc<dyn Store>,
        caller: CallerLimits,
        settings: &RespSettings,
        metrics: Arc<Metrics>,
        command_timeout: Duration,
        grace: Duration,
    ) -> Arc<RespServer> {
        Arc::new(RespServer {
            store,
            caller,
            token: settings.token.as_deref().map(Token::new),
            metrics,
            bounds: settings.bounds,
            command_timeout,
            grace,
            next_id: AtomicU64::new(1),
            lockout: AuthLockout::new(),
        })
    }

    /// Accepts connections until `stop`; each then finishes what it has read (within the
    /// grace period) and closes. Connection tasks join `tasks`.
    pub async fn serve(
        self: Arc<Self>,
        listener: GuardedListener,
        stop: CancellationToken,
        tasks: TaskTracker,
    ) {
        let mut listener = listener.with_handshake_bytes(1);
        loop {
            let (stream, peer) = tokio::select! {
                (stream, peer) = listener.accept() => (stream, peer.ip()),
                _ = stop.cancelled() => return,
            };
            let server = self.clone();
            let stop = stop.clone();
            tasks.spawn(async move {
                let grace = server.grace;
                let metrics = server.metrics.clone();
                tokio::select! {
                    _ = server.connection(stream, peer, stop.clone()) => {}
                    _ = async { stop.cancelled().await; tokio::time::sleep(grace).await } => {
                        metrics.resp_closed("shutdown");
                    }
                }
            });
        }
    }

    async fn connection(&self, mut stream: GuardedStream, peer: IpAddr, stop: CancellationToken) {
        self.metrics.resp_connections.inc();
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
        let mut run = Run::default();
        loop {
            // Answer every complete command read so far, in order.
            let mut completed = false;
            loop {
                let args = match conn.parser.next(&mut buf) {
                    Ok(Some(args)) => {
                        completed = true;
                        args
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.throttle_run(&mut conn, &mut run).await;
                        conn.replies.error(&format!("ERR {e}"));
                        self.metrics.resp_closed("protocol_error");
                        return close(stream, &conn.replies.out).await;
                    }
                };
                if conn.authenticated && Command::of(&args[0]) == Command::Throttle {
                    // Decided with the ones next to it in the pipeline (see Run).
                    if run.push(args) {
                        continue;
                    }
                    self.throttle_run(&mut conn, &mut run).await;
                } else {
                    self.throttle_run(&mut conn, &mut run).await;
                    if let Flow::Close(reason) = self.execute(&mut conn, &args).await {
                        if !reason.is_empty() {
                            self.metrics.resp_closed(reason);
                        }
                        return close(stream, &conn.replies.out).await;
                    }
                }
                if conn.replies.out.len() >= FLUSH_AT {
                    if stream.write_all(&conn.replies.out).await.is_err() {
                        return;
                    }
                    conn.replies.out.clear();
                }
            }
            self.throttle_run(&mut conn, &mut run).await;
            if !conn.replies.out.is_empty() {
                if stream.write_all(&conn.replies.out).await.is_err() {
                    return;
                }
                conn.replies.out.clear();
            }
            // A command begun must arrive whole within the command timeout. A partial command
            // after complete ones is a new command (a busy pipeline's reads end anywhere).
            begun = match begun {
                _ if !conn.parser.in_command(&buf) => None,
                Some(at) if !completed => Some(at),
                _ => Some(Instant::now()),
            };
            buf.reserve(READ_CHUNK);
            let read = match begun {
                Some(at) => {
                    let deadline = at + self.command_timeout;
                    match tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await {
                        Ok(read) => read,
                        Err(_) => {
                            conn.replies.error(&format!(
                                "ERR Protocol error: a command must arrive whole within {}s",
                                self.command_timeout.as_secs_f64()
                            ));
                            self.metrics.resp_closed("timeout");
                            return close(stream, &conn.replies.out).await;
                        }
                    }
                }
                None => tokio::select! {
                    read = stream.read_buf(&mut buf) => read,
                    _ = stop.cancelled() => {
                        self.metrics.resp_closed("shutdown");
                        return;
                    }
                },
            };
            match read {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) => {
                    if e.kind() == std::io::ErrorKind::TimedOut {
                        self.metrics.resp_closed("timeout");
                    }
                    return;
                }
            }
        }
    }

    /// Runs one command, its reply appended to the connection's replies.
    async fn execute(&self, conn: &mut Connection, args: &[Bytes]) -> Flow {
        let command = Command::of(&args[0]);
        if !conn.authenticated && !matches!(command, Command::Auth | Command::Hello | Command::Quit)
        {
            conn.replies.error("NOAUTH Authentication required.");
            self.metrics.resp_command(command.label(), false);
            return Flow::Continue;
        }
        let outcome = match command {
            Command::Throttle => {
                let answer = self.throttle(args).await;
                return self.throttle_reply(conn, answer);
            }
            Command::Ping => match args.len() {
                1 => {
                    conn.replies.simple("PONG");
                    Ok(())
                }
                2 => {
                    conn.replies.bulk(&args[1]);
                    Ok(())
                }
                _ => Err(arity("ping")),
            },
            Command::Echo => match args {
                [_, message] => {
                    conn.replies.bulk(message);
                    Ok(())
                }
                _ => Err(arity("echo")),
            },
            Command::Hello => self.hello(conn, args),
            Command::Auth => self.auth(conn, args),
            Command::Client => client(conn, args),
            Command::Commands => command_info(conn, args),
            Command::Select => select(conn, args),
            Command::Quit => {
                conn.replies.simple("OK");
                self.metrics.resp_command("quit", true);
                return Flow::Close("");
            }
            Command::Other => Err(fail(unknown_command(args))),
        };
        let label = command.label();
        match outcome {
            Ok(()) => {
                self.metrics.resp_command(label, true);
                Flow::Continue
            }
            Err(Failure(text, flow)) => {
                conn.replies.error(&text);
                self.metrics.resp_command(label, false);
                flow
            }
        }
    }

    /// Decides the throttles of `run`, their replies appended in order. With a store that
    /// waits (Redis) each is its own store call, all started together in pipeline order:
    /// those that find the node's calls busy are coalesced into one script call, decided
    /// in that order, so that a pipeline costs a few round trips instead of one each, with
    /// the answers they would have had one after another.
    async fn throttle_run(&self, conn: &mut Connection, run: &mut Run) {
        if run.commands.len() > 1 && self.store.waits() {
            let answers =
                futures_util::future::join_all(run.commands.iter().map(|a| self.throttle(a))).await;
            for answer in answers {
                self.throttle_reply(conn, answer);
            }
        } else {
            // A store that answers at once (memory) gains nothing from starting them
            // together.
            for args in &run.commands {
                let answer = self.throttle(args).await;
                self.throttle_reply(conn, answer);
            }
        }
        run.commands.clear();
        run.bytes = 0;
    }

    /// Appends a `CL.THROTTLE` answer (five numbers, or an error) and counts it.
    fn throttle_reply(&self, conn: &mut Connection, answer: Result<[i64; 5], Failure>) -> Flow {
        match answer {
            Ok(reply) => {
                self.metrics.resp_throttled(reply[0] == 0);
                conn.replies.array(5);
                for n in reply {
                    conn.replies.integer(n);
                }
                Flow::Continue
            }
            Err(Failure(text, flow)) => {
                conn.replies.error(&text);
                self.metrics.resp_command(Command::Throttle.label(), false);
                flow
            }
        }
    }

    /// `CL.THROTTLE key max_burst count period [quantity]`: the five numbers.
    async fn throttle(&self, args: &[Bytes]) -> Result<[i64; 5], Failure> {
        if args.len() != 5 && args.len() != 6 {
            return Err(fail(THROTTLE_USAGE));
        }
        let integer = |arg: &Bytes| {
            std::str::from_utf8(arg)
                .ok()
                .and_then(|text| text.parse::<i64>().ok())
                .ok_or_else(|| {
                    fail(format!(
                        "Cell error: Couldn't parse as integer: {}",
                        String::from_utf8_lossy(arg)
                    ))
                })
        };
        let cell = Cell {
            max_burst: integer(&args[2])?,
            count: integer(&args[3])?,
            period: integer(&args[4])?,
            quantity: args.get(5).map_or(Ok(1), integer)?,
        };
        let key = std::str::from_utf8(&args[1])
            .map_err(|_| fail("Cell error: key must be UTF-8 text"))?;
        if key.len() > MAX_KEY {
            return Err(fail(format!(
                "Cell error: a key of {} bytes is above this server's maximum of {MAX_KEY}",
                key.len()
            )));
        }
        let spend = cell
            .spend()
            .map_err(|e: CellError| fail(format!("Cell error: {e}")))?;
        if spend.limit.burst() > self.caller.max_burst {
            return Err(fail(format!(
                "Cell error: max_burst {} is above this server's maximum of {} \
                 (--caller-limit-max-burst minus one)",
                cell.max_burst,
                self.caller.max_burst.saturating_sub(1)
            )));
        }
        if spend.limit.burst_offset() > self.caller.max_period {
            let seconds = |n: i64| n as f64 / crate::clock::SECOND as f64;
            return Err(fail(format!(
                "Cell error: a full burst takes {}s to come back ((max_burst + 1) x period / \
                 count), above this server's maximum of {}s (--caller-limit-max-period)",
                seconds(spend.limit.burst_offset()),
                seconds(self.caller.max_period)
            )));
        }
        let items = [StoreItem {
            key: BucketKey::caller_key('c', key),
            limit: spend.limit,
            cost: spend.cost,
            mode: Mode::CheckAndSpend,
        }];
        let outcome = match self.store.try_spend_now(&items) {
            Some(outcome) => outcome,
            None => self.store.spend(&items).await,
        };
        let outcome = outcome.map_err(|e| fail(format!("ERR store unavailable: {e}")))?;
        match outcome.decisions.first() {
            Some(decision) => Ok(reply(&spend, decision)),
            None => Err(fail("ERR store unavailable: no decision")),
        }
    }

    /// `HELLO [protover [AUTH username password] [SETNAME name]]`.
    fn hello(&self, conn: &mut Connection, args: &[Bytes]) -> Result<(), Failure> {
        let mut resp3 = conn.replies.resp3;
        if let Some(version) = args.get(1) {
            match std::str::from_utf8(version)
                .ok()
                .and_then(|v| v.parse::<i64>().ok())
            {
                Some(2) => resp3 = false,
                Some(3) => resp3 = true,
                Some(_) => return Err(fail("NOPROTO unsupported protocol version")),
                None => {
                    return Err(fail(
                        "ERR Protocol version is not an integer or out of range",
                    ))
                }
            }
        }
        let mut auth = None;
        let mut name = None;
        let mut at = 2;
        while at < args.len() {
            let option = &args[at];
            if option.eq_ignore_ascii_case(b"AUTH") && at + 2 < args.len() {
                auth = Some((&args[at + 1], &args[at + 2]));
                at += 3;
            } else if option.eq_ignore_ascii_case(b"SETNAME") && at + 1 < args.len() {
                name = Some(&args[at + 1]);
                at += 2;
            } else {
                return Err(fail(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(option)
                )));
            }
        }
        if let Some((user, password)) = auth {
            self.check_token(conn, Some(user), password)?;
        }
        if !conn.authenticated {
            return Err(fail(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise \
                 the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the \
                 client and select the RESP protocol version at the same time",
            ));
        }
        if let Some(name) = name {
            conn.name = Some(client_name(name)?);
        }
        conn.replies.resp3 = resp3;
        let r = &mut conn.replies;
        r.map(7);
        r.bulk(b"server");
        r.bulk(b"cellrate");
        r.bulk(b"version");
        r.bulk(env!("CARGO_PKG_VERSION").as_bytes());
        r.bulk(b"proto");
        r.integer(if resp3 { 3 } else { 2 });
        r.bulk(b"id");
        r.integer(conn.id as i64);
        r.bulk(b"mode");
        r.bulk(b"standalone");
        r.bulk(b"role");
        r.bulk(b"master");
        r.bulk(b"modules");
        r.array(0);
        Ok(())
    }

    /// `AUTH [username] password`.
    fn auth(&self, conn: &mut Connection, args: &[Bytes]) -> Result<(), Failure> {
        let (user, password) = match args {
            [_, password] => (None, password),
            [_, user, password] => (Some(user), password),
            _ => return Err(arity("auth")),
        };
        if self.token.is_none() {
            return Err(fail(
                "ERR AUTH <password> called without any password configured for the default \
                 user. Are you sure your configuration is correct?",
            ));
        }
        self.check_token(conn, user, password)?;
        conn.replies.simple("OK");
        Ok(())
    }

    /// Authenticates the connection if `password` is the token (user `default`, if given).
    fn check_token(
        &self,
        conn: &mut Connection,
        user: Option<&Bytes>,
        password: &[u8],
    ) -> Result<(), Failure> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        if let Err(wait) = self.lockout.check(conn.peer) {
            // Not compared: a locked-out guesser learns nothing from its guess.
            tracing::warn!(
                connection = conn.id,
                peer = %conn.peer,
                "redis protocol: too many wrong tokens from this address; closing the connection"
            );
            return Err(Failure(
                format!(
                    "ERR too many wrong tokens from this address; retry in {} s",
                    wait.as_secs().max(1)
                ),
                Flow::Close("auth_locked"),
            ));
        }
        let user_ok = user.is_none_or(|u| &u[..] == b"default");
        if token.matches(password) && user_ok {
            conn.authenticated = true;
            return Ok(());
        }
        self.lockout.failed(conn.peer);
        conn.auth_failures += 1;
        let flow = if conn.auth_failures >= MAX_AUTH_FAILURES {
            tracing::warn!(
                connection = conn.id,
                failures = conn.auth_failures,
                "redis protocol: wrong tokens; closing the connection"
            );
            Flow::Close("auth_failures")
        } else {
            Flow::Continue
        };
        Err(Failure(
            "WRONGPASS invalid username-password pair or user is disabled.".to_string(),
            flow,
        ))
    }
}

/// Ends a connection with its last answers: writes them, closes the sending side, and
/// discards what the client still sends for a moment (at most [`DRAIN_BYTES`], for at most
/// [`DRAIN_TIME`]), so that its kernel does not reset the connection and drop the answers
/// (the last of which says why it ends) before the client reads them.
async fn close(mut stream: GuardedStream, last: &[u8]) {
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

/// A client name as Redis accepts it: printable, no spaces, bounded.
fn client_name(name: &Bytes) -> Result<Bytes, Failure> {
    if name.len() > MAX_CLIENT_NAME {
        return Err(fail(format!(
            "ERR Client names are at most {MAX_CLIENT_NAME} bytes here"
        )));
    }
    if !name.iter().all(|b| b.is_ascii_graphic()) {
        return Err(fail(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(name.clone())
}

/// `CLIENT SETNAME | GETNAME | ID | SETINFO`.
fn client(conn: &mut Connection, args: &[Bytes]) -> Result<(), Failure> {
    let Some(sub) = args.get(1) else {
        return Err(arity("client"));
    };
    let is = |name: &str| sub.eq_ignore_ascii_case(name.as_bytes());
    match args.len() {
        3 if is("SETNAME") => {
            conn.name = Some(client_name(&args[2])?);
            conn.replies.simple("OK");
        }
        2 if is("GETNAME") => match &conn.name {
            Some(name) => conn.replies.bulk(name),
            None => conn.replies.null(),
        },
        2 if is("ID") => conn.replies.integer(conn.id as i64),
        // Libraries announce themselves (redis-py, Jedis): accepted, not kept.
        4 if is("SETINFO") => {
            if args[3].len() > MAX_CLIENT_NAME {
                return Err(fail(format!(
                    "ERR CLIENT SETINFO values are at most {MAX_CLIENT_NAME} bytes here"
                )));
            }
            conn.replies.simple("OK");
        }
        _ if ["SETNAME", "GETNAME", "ID", "SETINFO"].into_iter().any(is) => {
            return Err(fail(format!(
                "ERR wrong number of arguments for 'client|{}' command",
                String::from_utf8_lossy(sub).to_lowercase()
            )))
        }
        _ => {
            return Err(fail(format!(
                "ERR unknown subcommand '{}'. Try CLIENT HELP.",
                truncated(sub)
            )))
        }
    }
    Ok(())
}

/// `COMMAND`, `COMMAND COUNT | LIST | INFO name... | DOCS [name...]`: enough for clients
/// that look the commands up (redis-cli's hints, cluster-aware clients' key positions).
fn command_info(conn: &mut Connection, args: &[Bytes]) -> Result<(), Failure> {
    let r = &mut conn.replies;
    let info = |r: &mut Replies, c: &(Command, &str, i64, &str)| {
        let keys = if c.0 == Command::Throttle { 1 } else { 0 };
        r.array(10);
        r.bulk(c.1.as_bytes());
        r.integer(c.2);
        r.array(1);
        r.simple(c.3);
        r.integer(keys);
        r.integer(keys);
        r.integer(keys);
        for _ in 0..4 {
            r.array(0);
        }
    };
    let Some(sub) = args.get(1) else {
        r.array(COMMANDS.len());
        for c in &COMMANDS {
            info(r, c);
        }
        return Ok(());
    };
    let is = |name: &str| sub.eq_ignore_ascii_case(name.as_bytes());
    if is("COUNT") && args.len() == 2 {
        r.integer(COMMANDS.len() as i64);
    } else if is("LIST") && args.len() == 2 {
        r.array(COMMANDS.len());
        for c in &COMMANDS {
            r.bulk(c.1.as_bytes());
        }
    } else if is("INFO") {
        r.array(args.len() - 2);
        for name in &args[2..] {
            match COMMANDS
                .iter()
                .find(|c| name.eq_ignore_ascii_case(c.1.as_bytes()))
            {
                Some(c) => info(r, c),
                None => r.null(),
            }
        }
    } else if is("DOCS") {
        r.map(0);
    } else {
        return Err(fail(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try COMMAND HELP.",
            truncated(sub)
        )));
    }
    Ok(())
}

/// `SELECT 0`: there is one database.
fn select(conn: &mut Connection, args: &[Bytes]) -> Result<(), Failure> {
    let [_, index] = args else {
        return Err(arity("select"));
    };
    match std::str::from_utf8(index)
        .ok()
        .and_then(|i| i.parse::<i64>().ok())
    {
        Some(0) => {
            conn.replies.simple("OK");
            Ok(())
        }
        Some(_) => Err(fail("ERR DB index is out of range")),
        None => Err(fail("ERR value is not an integer or out of range")),
    }
}

/// At most 128 bytes of a client's argument, for an error message.
fn truncated(arg: &[u8]) -> String {
    String::from_utf8_lossy(&arg[..arg.len().min(128)]).into_owned()
}

/// Redis's words for a command it does not know, quoting at most 128 bytes of arguments.
fn unknown_command(args: &[Bytes]) -> String {
    let mut quoted = String::new();
    for arg in &args[1..] {
        if quoted.len() >= 128 {
            break;
        }
        let room = 128 - quoted.len();
        quoted.push('\'');
        quoted.push_str(&truncated(&arg[..arg.len().min(room)]));
        quoted.push_str("' ");
    }
    format!(
        "ERR unknown command '{}', with args beginning with: {quoted}",
        truncated(&args[0])
    )
}
