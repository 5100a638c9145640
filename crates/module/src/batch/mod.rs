//! `CELLRATE.BATCH numkeys key [key ...] arg [arg ...]`: one call of cellrate's Redis store,
//! decided in the server by cellrate's core, with no Lua. It takes exactly the keys and
//! arguments `EVALSHA` of the store's `batch.lua` takes (its header documents them) and
//! answers exactly what the script answers, over the same keys, values and TTLs, so that
//! cellrate sends one call to either and a deployment switches between them in either
//! direction without losing a bucket, a lease or a kept Check's marker.
//!
//! Where the script would write part of a call and then fail (a key of another type, a
//! bucket that holds no TAT in a refund), the command checks first and changes nothing.

use cellrate_core::clock::{Clock, Nanos, SystemClock, MICROSECOND};
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::keys::{self, Stored};
use shapes::{bad, number, utf8};

mod give_back;
mod leases;
mod shapes;
mod spend;

/// A marker's "nothing was spent, nothing will be".
const VOID: &str = "void";

/// The server's clock, as the script's `TIME` reads it (microseconds).
fn server_now() -> Nanos {
    let now = SystemClock.now();
    now - now.rem_euclid(MICROSECOND)
}

fn reply(values: Vec<String>) -> RedisValue {
    RedisValue::Array(values.into_iter().map(RedisValue::BulkString).collect())
}

/// `CELLRATE.BATCH`, registered with `getkeys-api`: asked for its keys (by Redis Cluster,
/// to check their slot and redirect, and by ACLs), it names the `numkeys` arguments after
/// the count, as `EVALSHA`'s are found.
pub(crate) fn batch(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let count = args.get(1).ok_or(RedisError::WrongArity)?;
    let n = usize::try_from(number(utf8(count)?)?).map_err(|_| bad("too many keys"))?;
    if args.len() < 2 + n + 2 {
        return Err(RedisError::WrongArity);
    }
    if ctx.is_keys_position_request() {
        for at in 2..2 + n {
            ctx.key_at_pos(at as i32);
        }
        return Ok(RedisValue::NoReply);
    }
    let (mut keys, argv) = (&args[2..2 + n], &args[2 + n..]);
    let mut op = utf8(&argv[0])?;
    let mut marker = None;
    if !matches!(op, "spend" | "refund" | "reset") {
        let (name, ttl) = op
            .split_once(':')
            .ok_or_else(|| bad(&format!("unknown op {op}")))?;
        let ttl = number(ttl)?;
        let (last, rest) = keys
            .split_last()
            .ok_or_else(|| bad("an op under a token needs its marker"))?;
        keys = rest;
        marker = Some((last, ttl));
        let found = match keys::read(ctx, last)? {
            Stored::Absent => None,
            Stored::Text(text) => Some(String::from_utf8_lossy(&text).into_owned()),
            Stored::Other(_) => return Err(keys::wrong_type()),
        };
        match (name, found) {
            ("undo", Some(found)) if found != VOID => {
                let now = now_of(argv)?;
                let out = give_back::refund(ctx, keys, &argv[2..], now)?;
                keys::set(ctx, last, VOID, ttl)?;
                return Ok(reply(out));
            }
            ("undo", found) => {
                if found.is_none() {
                    keys::set(ctx, last, VOID, ttl)?;
                }
                return Ok(reply(vec![VOID.into()]));
            }
            ("once" | "resolve", Some(found)) if found == VOID => {
                return Ok(reply(vec![VOID.into()]))
            }
            ("once" | "resolve", Some(found)) => {
                return Ok(reply(
                    found.split_terminator('\n').map(String::from).collect(),
                ));
            }
            ("resolve", None) => {
                keys::set(ctx, last, VOID, ttl)?;
                return Ok(reply(vec![VOID.into()]));
            }
            ("once", None) => op = "spend",
            _ => return Err(bad(&format!("unknown op {}", utf8(&argv[0])?))),
        }
    }
    let now = now_of(argv)?;
    let out = match op {
        "spend" => {
            let (out, wrote) = spend::spend(ctx, keys, &argv[2..], now)?;
            if let (Some((marker, ttl)), true) = (marker, wrote) {
                let mut kept = out.join("\n");
                kept.push('\n');
                keys::set(ctx, marker, &kept, ttl)?;
            }
            out
        }
        "refund" => give_back::refund(ctx, keys, &argv[2..], now)?,
        _ => give_back::reset(ctx, keys, now)?,
    };
    Ok(reply(out))
}

/// The call's now: ARGV[2] in nanoseconds, or the server's clock when it is empty.
fn now_of(argv: &[RedisString]) -> Result<Nanos, RedisError> {
    let text = utf8(argv.get(1).ok_or(RedisError::WrongArity)?)?;
    if text.is_empty() {
        return Ok(server_now());
    }
    number(text)
}
