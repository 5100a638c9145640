//! `CELLRATE.SETTLE numkeys key [key ...] arg [arg ...]`: the settlement ledger's atomic
//! steps (`crates/store/src/redis/settle.lua`) without Lua. It takes the script's KEYS
//! and ARGV as `EVALSHA` does (so Redis Cluster routes it by its keys' slot), does what
//! the script does, one server command for each of the script's, and returns the
//! script's reply: a deployment moves between the script and the module, either way,
//! without losing a record, a hold or a queue.
//!
//! Bad input gets an error and changes nothing. Where the script answers, the module
//! answers the same; where the script would fail half-way (a number that is none, a key
//! of another type met after a write), the module checks first and refuses before any
//! write: `open`'s five arguments are checked before anything, and every op needs the
//! keys the store sends (four; five for `queue` and `oldest`; `decide` two).

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

mod ledger;
mod ops;

use ledger::{lines, Field, Ledger};

/// How much later a pending hold handed out by `due` is due again (the script's).
const RESOLVE_AGAIN_MS: i64 = 1000;
/// The last place of a queue looked at per `oldest` (the script's QUEUE_LOOK - 1: 32
/// records at most).
const QUEUE_LAST: &[u8] = b"31";
/// The longest window or hold, in ms (about 35 years): far beyond any setting, and short
/// enough that every sum the script makes of them and Redis's time stays exact.
const MAX_MS: i64 = 1 << 40;

fn error(text: &'static str) -> RedisError {
    RedisError::Str(text)
}

/// Lua 5.1's `tonumber` of a string, as the script reads its numbers: a decimal (or
/// `inf`, `nan`) with spaces around it, or a hex integer.
fn lua_number(text: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(text).ok()?.trim_ascii();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok().map(|n| n as f64),
        None => text.parse().ok(),
    }
}

/// A number that Redis reads as an integer when the script passes it on (`double2ll`).
fn lua_integer(text: &[u8]) -> Option<i64> {
    let n = lua_number(text)?;
    (n.fract() == 0.0 && n.abs() <= (i64::MAX / 2) as f64).then_some(n as i64)
}

/// A reply of the script: an array of bulk strings, `false` a null.
fn reply(items: Vec<Field>) -> RedisValue {
    RedisValue::Array(
        items
            .into_iter()
            .map(|item| item.map_or(RedisValue::Null, RedisValue::StringBuffer))
            .collect(),
    )
}

fn text(s: &[u8]) -> Field {
    Some(s.to_vec())
}

/// `open`'s arguments (ARGV[2..]).
struct Open<'a> {
    check: &'a [u8],
    window: i64,
    max: f64,
    /// 0 for no hold (the script's `hold > 0` is false).
    hold: i64,
    most: f64,
    names: Vec<&'a [u8]>,
}

impl<'a> Open<'a> {
    fn parse(args: &[&'a [u8]]) -> Result<Open<'a>, RedisError> {
        let (Some(&check), Some(window), Some(max), Some(hold)) = (
            args.first(),
            args.get(1).and_then(|w| lua_integer(w)),
            args.get(2).and_then(|m| lua_number(m)),
            args.get(3).and_then(|h| lua_number(h)),
        ) else {
            return Err(error(
                "ERR CELLRATE.SETTLE open: check, window (ms), most records and hold (ms) expected",
            ));
        };
        if !(1..=MAX_MS).contains(&window) {
            return Err(error("ERR CELLRATE.SETTLE open: window out of range"));
        }
        let hold = match hold > 0.0 {
            false => 0,
            true => match lua_integer(args[3]) {
                Some(h) if h <= MAX_MS => h,
                _ => return Err(error("ERR CELLRATE.SETTLE open: hold out of range")),
            },
        };
        let names: Vec<&[u8]> = args.get(5..).unwrap_or_default().to_vec();
        let most = match (hold > 0 && !names.is_empty(), args.get(4)) {
            (false, _) => 0.0,
            (true, most) => most.and_then(|m| lua_number(m)).ok_or_else(|| {
                error("ERR CELLRATE.SETTLE open: most live holds per key expected")
            })?,
        };
        Ok(Open {
            check,
            window,
            max,
            hold,
            most,
            names,
        })
    }
}

/// The command (registered by lib.rs: `write deny-oom`, its keys given by [`init`]).
pub(crate) fn command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let args: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
    let (keys, argv) = split(&args)?;
    // Asked for its keys (registered with `getkeys-api`): by Redis Cluster, to check their
    // slot and redirect, and by ACLs; the `numkeys` arguments after the count, as
    // EVALSHA's.
    if ctx.is_keys_position_request() {
        for at in 2..2 + keys.len() {
            ctx.key_at_pos(at as i32);
        }
        return Ok(RedisValue::NoReply);
    }
    let op = argv.first().copied().unwrap_or_default();
    let least = match op {
        b"decide" => 2,
        b"queue" | b"oldest" => 5,
        _ => 4,
    };
    if keys.len() < least {
        return Err(error("ERR CELLRATE.SETTLE: too few keys for the operation"));
    }
    let rest = argv.get(1..).unwrap_or_default();
    let opened = match op {
        b"open" => Some(Open::parse(rest)?),
        _ => None,
    };
    let ledger = Ledger::new(ctx, keys.to_vec())?;
    let arg = rest.first().copied();
    let items = match (op, opened) {
        (b"open", Some(open)) => ops::open(&ledger, &open)?,
        (b"decide", _) => ops::decide(&ledger, arg)?,
        (b"forget", _) => ops::forget(&ledger)?,
        (b"claim", _) => ops::claim(&ledger, arg)?,
        (b"reopen", _) => ops::reopen(&ledger, arg)?,
        (b"due", _) => {
            let most = arg.and_then(lua_integer);
            ops::due(
                &ledger,
                most.ok_or_else(|| error("ERR CELLRATE.SETTLE due: most expected"))?,
            )?
        }
        (b"queue", _) => ops::queue(&ledger)?,
        (b"oldest", _) => ops::oldest(&ledger, arg)?,
        _ => return Err(error("unknown operation")),
    };
    Ok(reply(items))
}

/// Arguments, KEYS or ARGV.
type Args<'a> = &'a [&'a [u8]];

/// KEYS and ARGV, split as `EVALSHA` splits them, with its errors.
fn split<'a>(args: Args<'a>) -> Result<(Args<'a>, Args<'a>), RedisError> {
    let numkeys = args.get(1).ok_or(RedisError::WrongArity)?;
    let numkeys: i64 = std::str::from_utf8(numkeys)
        .ok()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| error("ERR value is not an integer or out of range"))?;
    let rest = &args[2..];
    match usize::try_from(numkeys) {
        Err(_) => Err(error("ERR Number of keys can't be negative")),
        Ok(n) if n > rest.len() => Err(error(
            "ERR Number of keys can't be greater than number of args",
        )),
        Ok(n) => Ok(rest.split_at(n)),
    }
}

/// The name the command is registered under.
pub(crate) const NAME: &str = "CELLRATE.SETTLE";
