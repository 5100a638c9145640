//! A concurrency limit's lease key, as `batch.lua` keeps it: a sorted set whose members
//! are lease ids scored by their expiry in nanoseconds after the key's base, a whole
//! second kept as the member `" <seconds>"` at score -inf. Scores stay exact integers in a
//! double: the base moves to now, and every score with it, once it is [`REBASE`] seconds
//! old. A lease is live while now is before its expiry; the key expires with its latest.
//!
//! Sorted sets are rare next to buckets (one per concurrency limit's key), so they are
//! driven through the server's own commands, each write replicated as itself.

use cellrate_core::clock::{Nanos, SECOND};
use redis_module::{CallOptionsBuilder, CallResult, Context, RedisError, RedisString, RedisValue};

/// Seconds after which a key's base moves to now (2^21: scores stay below 2^53).
const REBASE: i64 = 2_097_152;
/// The longest hold in seconds: a key whose base is older than both holds no live lease.
const LONGEST_HOLD: i64 = 86_400;

/// Runs `command` on the server; a write is replicated as itself.
fn run(
    ctx: &Context,
    write: bool,
    command: &str,
    args: &[&[u8]],
) -> Result<RedisValue, RedisError> {
    let mut options = CallOptionsBuilder::new().errors_as_replies();
    if write {
        options = options.replicate();
    }
    let result: CallResult = ctx.call_ext(command, &options.build(), args);
    result
        .map(|reply| RedisValue::from(&reply))
        .map_err(|e| RedisError::String(e.to_utf8_string().unwrap_or_default()))
}

fn text(value: &RedisValue) -> Option<String> {
    match value {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s.clone()),
        RedisValue::StringBuffer(b) => String::from_utf8(b.clone()).ok(),
        RedisValue::Integer(i) => Some(i.to_string()),
        RedisValue::Float(f) => Some(f.to_string()),
        _ => None,
    }
}

fn integer(value: &RedisValue) -> i64 {
    match value {
        RedisValue::Integer(i) => *i,
        other => text(other).and_then(|t| t.parse().ok()).unwrap_or(0),
    }
}

fn items(value: RedisValue) -> Vec<RedisValue> {
    match value {
        RedisValue::Array(items) => items,
        _ => Vec::new(),
    }
}

/// A score as an integer (scores are exact integers below 2^53).
fn score(value: &RedisValue) -> Nanos {
    text(value)
        .and_then(|t| t.parse::<f64>().ok())
        .map_or(0, |f| f as Nanos)
}

fn card(ctx: &Context, key: &[u8]) -> Result<i64, RedisError> {
    Ok(integer(&run(ctx, false, "ZCARD", &[key])?))
}

fn del(ctx: &Context, key: &[u8]) -> Result<(), RedisError> {
    run(ctx, true, "DEL", &[key]).map(|_| ())
}

/// A key's base after [`open`]: its whole second, and now in nanoseconds after it.
#[derive(Clone, Copy)]
pub(super) struct Base {
    pub(super) seconds: i64,
    pub(super) rel: Nanos,
}

/// The key's base and now after it, once its expired leases are dropped (`None` when it
/// holds none: the key is gone), and how many it dropped.
pub(super) fn open(
    ctx: &Context,
    key: &[u8],
    now: Nanos,
) -> Result<(Option<Base>, i64), RedisError> {
    let (nows, nown) = (now.div_euclid(SECOND), now.rem_euclid(SECOND));
    let first = items(run(ctx, false, "ZRANGE", &[key, b"0", b"0"])?);
    let Some(first) = first.first().and_then(text) else {
        return Ok((None, 0));
    };
    let base = first
        .strip_prefix(' ')
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| {
            RedisError::String(format!(
                "cellrate: lease key {} has no base; reset it",
                String::from_utf8_lossy(key)
            ))
        })?;
    let age = nows - base;
    if age > REBASE + LONGEST_HOLD + 1 {
        let dropped = card(ctx, key)? - 1;
        del(ctx, key)?;
        return Ok((None, dropped));
    }
    let mut rel = age * SECOND + nown;
    let upto = rel.to_string();
    let dropped = integer(&run(
        ctx,
        true,
        "ZREMRANGEBYSCORE",
        &[key, b"(-inf", upto.as_bytes()],
    )?);
    if card(ctx, key)? <= 1 {
        del(ctx, key)?;
        return Ok((None, dropped));
    }
    let mut seconds = base;
    if age > REBASE {
        let live = items(run(
            ctx,
            false,
            "ZRANGE",
            &[key, b"1", b"-1", b"WITHSCORES"],
        )?);
        run(ctx, true, "ZREM", &[key, first.as_bytes()])?;
        let member = format!(" {nows}");
        run(ctx, true, "ZADD", &[key, b"-inf", member.as_bytes()])?;
        for pair in live.chunks(2) {
            if let [member, old] = pair {
                let moved = (score(old) - age * SECOND).to_string();
                let member = text(member).unwrap_or_default();
                run(
                    ctx,
                    true,
                    "ZADD",
                    &[key, moved.as_bytes(), member.as_bytes()],
                )?;
            }
        }
        seconds = nows;
        rel = nown;
    }
    Ok((Some(Base { seconds, rel }), dropped))
}

/// A score after `base` as Unix nanoseconds (text).
fn time_of(base: i64, value: &RedisValue) -> String {
    (base * SECOND + score(value)).to_string()
}

/// The key's live leases as `<count>,<oldest>,<latest>`, and the count; with `expire`, the
/// key is set to expire with its latest lease (deleted when it holds none).
pub(super) fn summary(
    ctx: &Context,
    key: &[u8],
    base: Option<Base>,
    expire: bool,
) -> Result<(String, i64), RedisError> {
    let Some(base) = base else {
        return Ok(("0,0,0".into(), 0));
    };
    let n = card(ctx, key)? - 1;
    if n <= 0 {
        del(ctx, key)?;
        return Ok(("0,0,0".into(), 0));
    }
    let lo = items(run(
        ctx,
        false,
        "ZRANGE",
        &[key, b"1", b"1", b"WITHSCORES"],
    )?);
    let hi = items(run(
        ctx,
        false,
        "ZRANGE",
        &[key, b"-1", b"-1", b"WITHSCORES"],
    )?);
    let (lo, hi) = (
        lo.get(1).unwrap_or(&RedisValue::Null),
        hi.get(1).unwrap_or(&RedisValue::Null),
    );
    if expire {
        let ms = ((score(hi) - base.rel) as f64 / 1_000_000.0).ceil() as i64;
        let ms = ms.max(1).to_string();
        run(ctx, true, "PEXPIRE", &[key, ms.as_bytes()])?;
    }
    let text = format!(
        "{n},{},{}",
        time_of(base.seconds, lo),
        time_of(base.seconds, hi)
    );
    Ok((text, n))
}

/// A lease item's decision against its key as it stands.
pub(super) struct Decided {
    base: Option<Base>,
    held: bool,
    before: String,
    /// An acquire may take (or already holds) its lease; a release frees one.
    pub(super) ok: bool,
    dropped: i64,
}

/// Decides a lease item: `acquire` (else a release or a peek), at most `count` leases.
pub(super) fn decide(
    ctx: &Context,
    key: &[u8],
    now: Nanos,
    acquire: bool,
    count: i64,
    id: Option<&[u8]>,
) -> Result<Decided, RedisError> {
    let (base, dropped) = open(ctx, key, now)?;
    let held = match (base, id) {
        (Some(_), Some(id)) => !matches!(run(ctx, false, "ZSCORE", &[key, id])?, RedisValue::Null),
        _ => false,
    };
    let (before, n) = summary(ctx, key, base, false)?;
    let ok = if acquire { held || n < count } else { held };
    Ok(Decided {
        base,
        held,
        before,
        ok,
        dropped,
    })
}

/// Applies a decided lease item (an acquire when its batch is allowed, a release whatever
/// it decides; neither when the batch cannot be decided): its reply, and whether it wrote.
#[allow(clippy::too_many_arguments)]
pub(super) fn write(
    ctx: &Context,
    key: &[u8],
    now: Nanos,
    (acquire, release): (bool, bool),
    hold: Nanos,
    id: Option<&[u8]>,
    mut d: Decided,
    (decidable, allowed): (bool, bool),
) -> Result<(String, bool), RedisError> {
    let id = id.unwrap_or_default();
    let mut wrote = false;
    if decidable && acquire && allowed && d.ok && !d.held {
        let base = match d.base {
            Some(base) => base,
            None => {
                let (nows, nown) = (now.div_euclid(SECOND), now.rem_euclid(SECOND));
                let member = format!(" {nows}");
                run(ctx, true, "ZADD", &[key, b"-inf", member.as_bytes()])?;
                Base {
                    seconds: nows,
                    rel: nown,
                }
            }
        };
        d.base = Some(base);
        let expiry = (base.rel + hold).to_string();
        run(ctx, true, "ZADD", &[key, expiry.as_bytes(), id])?;
        wrote = true;
    } else if decidable && release && d.held {
        run(ctx, true, "ZREM", &[key, id])?;
        wrote = true;
    }
    let after = if wrote {
        summary(ctx, key, d.base, true)?.0
    } else {
        d.before.clone()
    };
    let held = if d.held { '1' } else { '0' };
    Ok((format!("L{held},{},{after},{}", d.before, d.dropped), wrote))
}

/// Takes back the lease `id` (a cross-slot batch's compensation): the key is dropped when
/// it holds no other.
pub(super) fn take_back(ctx: &Context, key: &[u8], id: &[u8]) -> Result<(), RedisError> {
    run(ctx, true, "ZREM", &[key, id])?;
    if card(ctx, key)? <= 1 {
        del(ctx, key)?;
    }
    Ok(())
}

/// A lease key read by a reset: its latest live expiry (`None` when none, or when it has
/// no base), the key deleted.
pub(super) fn reset(
    ctx: &Context,
    key: &RedisString,
    now: Nanos,
) -> Result<Option<String>, RedisError> {
    let name = key.as_slice();
    let latest = match open(ctx, name, now) {
        Ok((Some(base), _)) => {
            let hi = items(run(
                ctx,
                false,
                "ZRANGE",
                &[name, b"-1", b"-1", b"WITHSCORES"],
            )?);
            hi.get(1).map(|v| time_of(base.seconds, v))
        }
        _ => None,
    };
    del(ctx, name)?;
    Ok(latest)
}
