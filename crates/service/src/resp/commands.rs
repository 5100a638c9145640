//! The commands of the Redis-protocol listener: the dispatch, the three rate-limit commands
//! on one key space (`CL.THROTTLE` answered as redis-cell answers, `RL.THROTTLE` its Valkey
//! proposal, `GCRA` as Redis 8.8's clients parse it: their arguments checked against the
//! caller-given bounds, decided by the store), and what clients send on their own (`PING`, `ECHO`, `CLIENT`, `COMMAND`,
//! `SELECT`, `QUIT`). `HELLO` and `AUTH` are [`super::auth`].

use bytes::Bytes;

use super::command::{Command, Flow, COMMANDS};
use super::gcra;
use super::replies::Replies;
use super::server::{Connection, RespServer};
use super::throttle::{reply, Cell, CellError, Spend, USAGE};
use cellrate_core::gcra::{Decision, Mode};
use cellrate_limits::names::BucketKey;
use cellrate_store::StoreItem;

/// The longest key of `CL.THROTTLE`, `RL.THROTTLE` and `GCRA`, in bytes.
pub const MAX_KEY: usize = 512;

/// The answer to a command that decides while the first xDS update is awaited: Redis's
/// own error while it loads its data, which redis-rs and redis-py wait on and retry.
pub const LOADING: &str = "LOADING waiting for the first xDS update: no limits in force yet";

/// The longest client name (`CLIENT SETNAME`, `HELLO ... SETNAME`) or library attribute.
pub const MAX_CLIENT_NAME: usize = 256;

/// A command's failure: the error reply's text (its code first), and whether the
/// connection ends.
pub(super) struct Failure(pub(super) String, pub(super) Flow);

pub(super) fn fail(text: impl Into<String>) -> Failure {
    Failure(text.into(), Flow::Continue)
}

pub(super) fn arity(command: &str) -> Failure {
    fail(format!(
        "ERR wrong number of arguments for '{command}' command"
    ))
}

impl RespServer {
    /// Runs one command, its reply appended to the connection's replies.
    pub(super) async fn execute(&self, conn: &mut Connection, args: &[&[u8]]) -> Flow {
        let command = Command::of(args[0]);
        if !conn.authenticated && !matches!(command, Command::Auth | Command::Hello | Command::Quit)
        {
            conn.replies.error("NOAUTH Authentication required.");
            self.metrics.resp_command(command.label(), false);
            return Flow::Continue;
        }
        if self.waiting() && command.waits_for_limits() {
            conn.replies.error(LOADING);
            self.metrics.resp_command(command.label(), false);
            return Flow::Continue;
        }
        let outcome = match command {
            Command::Throttle => {
                let answer = self.throttle(args).await;
                return self.throttle_reply(conn, answer);
            }
            Command::RlThrottle => self.rl_throttle(conn, args).await,
            Command::Gcra => self.gcra(conn, args).await,
            Command::Ping => match args.len() {
                1 => {
                    conn.replies.simple("PONG");
                    Ok(())
                }
                2 => {
                    conn.replies.bulk(args[1]);
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

    /// Appends a `CL.THROTTLE` answer (five numbers, or an error) and counts it.
    pub(super) fn throttle_reply(
        &self,
        conn: &mut Connection,
        answer: Result<[i64; 5], Failure>,
    ) -> Flow {
        match answer {
            Ok(reply) => {
                self.metrics.resp_throttled(reply[0] == 0);
                conn.replies.integers(&reply);
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
    pub(super) async fn throttle(&self, args: &[&[u8]]) -> Result<[i64; 5], Failure> {
        if args.len() != 5 && args.len() != 6 {
            return Err(fail(USAGE));
        }
        // The three or four numbers, without an allocation per call.
        let mut numbers: [&[u8]; 4] = [&[]; 4];
        for (slot, arg) in numbers.iter_mut().zip(&args[2..]) {
            *slot = arg;
        }
        let cell = Cell::parse(&numbers[..args.len() - 2]).map_err(fail)?;
        let key = key_text(args[1], "Cell error:")?;
        let spend = cell
            .spend()
            .map_err(|e: CellError| fail(format!("Cell error: {e}")))?;
        let decision = self.decide(key, &spend, "Cell error:").await?;
        Ok(reply(&spend, &decision))
    }

    /// `RL.THROTTLE key max_burst count period [quantity]` (valkey-io/valkey#4081): the
    /// arguments, bucket and five numbers of `CL.THROTTLE`, with Valkey's `ERR` errors.
    async fn rl_throttle(&self, conn: &mut Connection, args: &[&[u8]]) -> Result<(), Failure> {
        if args.len() != 5 && args.len() != 6 {
            return Err(arity("rl.throttle"));
        }
        let answer = self.throttle(args).await.map_err(|Failure(text, flow)| {
            let text = match text.strip_prefix("Cell error: ") {
                Some(rest) => format!("ERR {rest}"),
                None => text,
            };
            Failure(text, flow)
        })?;
        integers(conn, &answer);
        Ok(())
    }

    /// `GCRA key max_burst tokens_per_period period [TOKENS count]` as Redis 8.8 answers it
    /// ([`gcra`]), on the bucket `CL.THROTTLE` of the same key uses.
    async fn gcra(&self, conn: &mut Connection, args: &[&[u8]]) -> Result<(), Failure> {
        let call = gcra::parse(args).map_err(fail)?;
        let key = key_text(args[1], "ERR")?;
        let spend = call.spend().map_err(fail)?;
        let decision = self.decide(key, &spend, "ERR").await?;
        integers(conn, &gcra::reply(&spend, &decision));
        Ok(())
    }

    /// Decides `spend` on the caller-given bucket of `key`, within the caller-given bounds;
    /// errors begin with `prefix`.
    async fn decide(&self, key: &str, spend: &Spend, prefix: &str) -> Result<Decision, Failure> {
        if spend.limit.burst() > self.caller.max_burst {
            return Err(fail(format!(
                "{prefix} max_burst {} is above this server's maximum of {} \
                 (--caller-limit-max-burst minus one)",
                spend.limit.burst() - 1,
                self.caller.max_burst.saturating_sub(1)
            )));
        }
        if spend.limit.burst_offset() > self.caller.max_period {
            let seconds = |n: i64| n as f64 / cellrate_core::clock::SECOND as f64;
            return Err(fail(format!(
                "{prefix} a full burst takes {}s to come back ((max_burst + 1) x period / \
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
            lease: None,
        }];
        let outcome = match self.store.try_spend_now(&items) {
            Some(outcome) => outcome,
            None => self.store.spend(&items).await,
        };
        let outcome = outcome.map_err(|e| fail(format!("ERR store unavailable: {e}")))?;
        match outcome.decisions.first() {
            Some(decision) => Ok(*decision),
            None => Err(fail("ERR store unavailable: no decision")),
        }
    }
}

/// A key as the rate-limit commands take it: UTF-8, at most [`MAX_KEY`] bytes.
fn key_text<'a>(arg: &'a [u8], prefix: &str) -> Result<&'a str, Failure> {
    let key =
        std::str::from_utf8(arg).map_err(|_| fail(format!("{prefix} key must be UTF-8 text")))?;
    if key.len() > MAX_KEY {
        return Err(fail(format!(
            "{prefix} a key of {} bytes is above this server's maximum of {MAX_KEY}",
            key.len()
        )));
    }
    Ok(key)
}

/// An array of integers.
fn integers(conn: &mut Connection, numbers: &[i64]) {
    conn.replies.integers(numbers);
}

/// A client name as Redis accepts it: printable, no spaces, bounded.
pub(super) fn client_name(name: &[u8]) -> Result<Bytes, Failure> {
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
    Ok(Bytes::copy_from_slice(name))
}

/// `CLIENT SETNAME | GETNAME | ID | SETINFO`.
fn client(conn: &mut Connection, args: &[&[u8]]) -> Result<(), Failure> {
    let Some(sub) = args.get(1) else {
        return Err(arity("client"));
    };
    let is = |name: &str| sub.eq_ignore_ascii_case(name.as_bytes());
    match args.len() {
        3 if is("SETNAME") => {
            conn.name = Some(client_name(args[2])?);
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
fn command_info(conn: &mut Connection, args: &[&[u8]]) -> Result<(), Failure> {
    let r = &mut conn.replies;
    let info = |r: &mut Replies, c: &(Command, &str, i64, &str)| {
        let keys = i64::from(matches!(
            c.0,
            Command::Throttle | Command::RlThrottle | Command::Gcra
        ));
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
fn select(conn: &mut Connection, args: &[&[u8]]) -> Result<(), Failure> {
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
fn unknown_command(args: &[&[u8]]) -> String {
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
        truncated(args[0])
    )
}
