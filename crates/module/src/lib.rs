//! cellrate's Redis and Valkey module: rate-limit commands decided inside the server by
//! cellrate's core ([`cellrate_core`]), with no script and no round trip per decision.
//!
//! - `CL.THROTTLE key max_burst count period [quantity]`: redis-cell 0.2.2's command and
//!   its five numbers ([`cellrate_core::cell`], the arithmetic cellrate's Redis-protocol
//!   listener answers with). A bucket is stored as redis-cell stores it (the theoretical
//!   arrival time in Unix nanoseconds, as decimal text, expiring when the bucket is full
//!   again), so a deployment moves between redis-cell and this module without losing one.
//! - `RL.THROTTLE`: the same arguments, bucket and numbers, with Valkey's `ERR` errors
//!   (valkey-io/valkey#4081's proposal), as the listener answers it.
//! - `GCRA key max_burst tokens_per_period period [TOKENS count]`: Redis 8.8's command
//!   ([`cellrate_core::redis_gcra`]), on the bucket `CL.THROTTLE` of the same key uses (on
//!   a server that has its own `GCRA`, loading the module fails: one or the other).
//!
//! A command's writes are replicated as their effect (`SET key tat PX ms`), never as the
//! command: a replica, or an AOF replayed later, reads another clock.
//!
//! Bad input gets an error and changes nothing: a wrong number of arguments, a number that
//! is not an integer or that redis-cell would compute nonsense with ([`CellError`]), a key
//! of another type (WRONGTYPE), a value that is no bucket.
//!
//! # Layout
//!
//! ```text
//! lib.rs                 the commands, and the module's registration
//! settle.rs              CELLRATE.SETTLE: settle.lua's ledger steps, its arguments
//! settle/ops.rs          each op as the script does it
//! settle/ledger.rs       the ledger's keys, through the server's commands
//! ```

mod settle;

use std::time::Duration;

use cellrate_core::cell::{self, Cell, CellError, Spend, USAGE};
use cellrate_core::clock::{Clock, Nanos, SystemClock, MICROSECOND};
use cellrate_core::gcra::Decision;
use cellrate_core::redis_gcra;
use redis_module::KeyType;
use redis_module::{redis_module, Context, RedisError, RedisResult, RedisString, RedisValue};

/// The time now in Unix nanoseconds, read as redis-cell reads it (the server's wall clock),
/// through the core's one clock.
fn now() -> Nanos {
    SystemClock.now()
}

/// Which command's errors: redis-cell's (`Cell error: ...`) or Valkey's (`ERR ...`).
#[derive(Clone, Copy)]
enum Errors {
    Cell,
    Valkey,
}

impl Errors {
    fn error(self, text: &str) -> RedisError {
        match (self, text.strip_prefix("Cell error: ")) {
            (Errors::Valkey, Some(rest)) => RedisError::String(format!("ERR {rest}")),
            _ => RedisError::String(text.to_string()),
        }
    }
}

/// A stored bucket: redis-cell's decimal nanoseconds.
fn stored(value: &[u8]) -> Option<Nanos> {
    std::str::from_utf8(value).ok()?.parse::<Nanos>().ok()
}

/// Decides `spend` on the bucket at `key_name` (a spend writes the new arrival time,
/// expiring when the bucket is full again); errors in the caller's words (`errors`).
fn spend_on(
    ctx: &Context,
    key_name: &RedisString,
    spend: &Spend,
    errors: Errors,
) -> Result<Decision, RedisError> {
    let key = ctx.open_key_writable(key_name);
    let tat = match key.key_type() {
        KeyType::Empty => None,
        KeyType::String => {
            let value = ctx.open_key(key_name).read()?.map(<[u8]>::to_vec);
            match value.as_deref().map(stored) {
                Some(Some(tat)) => Some(tat),
                _ => return Err(errors.error("Cell error: the key holds no rate-limit bucket")),
            }
        }
        _ => return Err(RedisError::WrongType),
    };
    let now = now();
    let (decision, write) = cellrate_core::gcra::spend(&spend.limit, now, tat, spend.cost);
    if let Some(tat) = write {
        // Until the bucket is full again, in whole milliseconds rounded up (at least 1).
        let millisecond = 1_000 * MICROSECOND;
        let ms = ((tat.saturating_sub(now) + millisecond - 1) / millisecond).max(1);
        let text = tat.to_string();
        key.write(&text)?;
        key.set_expire(Duration::from_millis(ms as u64))?;
        let ms = ms.to_string();
        ctx.replicate(
            "SET",
            &[key_name.as_slice(), text.as_bytes(), b"PX", ms.as_bytes()][..],
        );
    }
    Ok(decision)
}

fn integers(numbers: &[i64; 5]) -> RedisValue {
    RedisValue::Array(numbers.iter().map(|&n| RedisValue::Integer(n)).collect())
}

/// `CL.THROTTLE` or `RL.THROTTLE`: the five numbers of redis-cell.
fn throttle(ctx: &Context, args: &[RedisString], errors: Errors) -> RedisResult {
    if args.len() != 5 && args.len() != 6 {
        return Err(match errors {
            Errors::Cell => RedisError::String(USAGE.to_string()),
            Errors::Valkey => RedisError::WrongArity,
        });
    }
    let numbers: Vec<&[u8]> = args[2..].iter().map(|a| a.as_slice()).collect();
    let cell = Cell::parse(&numbers).map_err(|e| errors.error(&e))?;
    let spend = (cell.spend()).map_err(|e: CellError| errors.error(&format!("Cell error: {e}")))?;
    let decision = spend_on(ctx, &args[1], &spend, errors)?;
    Ok(integers(&cell::reply(&spend, &decision)))
}

fn cl_throttle(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    throttle(ctx, &args, Errors::Cell)
}

fn rl_throttle(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    throttle(ctx, &args, Errors::Valkey)
}

/// `GCRA key max_burst tokens_per_period period [TOKENS count]`: Redis 8.8's numbers, on
/// the bucket `CL.THROTTLE` of the same key uses.
fn gcra(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let raw: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let call = redis_gcra::parse(&raw).map_err(RedisError::String)?;
    let spend = call.spend().map_err(RedisError::String)?;
    let decision = spend_on(ctx, &args[1], &spend, Errors::Valkey)?;
    Ok(integers(&redis_gcra::reply(&spend, &decision)))
}

fn settle_init(ctx: &Context, args: &[RedisString]) -> redis_module::Status {
    settle::init(ctx, args)
}

redis_module! {
    name: "cellrate",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: settle_init,
    commands: [
        ["CL.THROTTLE", cl_throttle, "write deny-oom fast", 1, 1, 1, ""],
        ["RL.THROTTLE", rl_throttle, "write deny-oom fast", 1, 1, 1, ""],
        ["GCRA", gcra, "write deny-oom fast", 1, 1, 1, ""],
        [settle::NAME, settle::command, "write deny-oom", 0, 0, 0, ""],
    ],
}
