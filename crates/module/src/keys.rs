//! The keyspace as `batch.lua` leaves it: a bucket is a string of decimal nanoseconds
//! expiring when it is reached, a marker a string of text; every write is replicated as
//! its effect (`SET ... PXAT`, `DEL`), never as the command, which read a clock.

use cellrate_core::clock::{Clock, Nanos, SystemClock};
use redis_module::{raw, Context, KeyType, RedisError, RedisString};

/// One millisecond in nanoseconds.
const MILLISECOND: Nanos = 1_000_000;

/// What a key holds, read once: nothing, a string's bytes, or a value of another type.
pub(crate) enum Stored {
    Absent,
    Text(Vec<u8>),
    Other(KeyType),
}

/// Reads `name` without opening it for writing.
pub(crate) fn read(ctx: &Context, name: &RedisString) -> Result<Stored, RedisError> {
    let key = ctx.open_key(name);
    Ok(match key.key_type() {
        KeyType::Empty => Stored::Absent,
        KeyType::String => Stored::Text(key.read()?.map(<[u8]>::to_vec).unwrap_or_default()),
        other => Stored::Other(other),
    })
}

/// A stored value as a TAT: digits that fit an `i64`, as the script's `readable`.
pub(crate) fn tat_of(value: &[u8]) -> Option<Nanos> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Milliseconds from `now` until `until`, rounded up, at least 1 (the script's `ttl_ms`).
pub(crate) fn ttl_ms(until: Nanos, now: Nanos) -> i64 {
    (until.saturating_sub(now).saturating_add(MILLISECOND - 1) / MILLISECOND).max(1)
}

/// The server's wall clock in milliseconds, what a replica's `PXAT` is read against.
fn wall_ms() -> i64 {
    SystemClock.now() / MILLISECOND
}

/// `SET name value PX ms`, replicated as `SET name value PXAT <wall + ms>`.
pub(crate) fn set(
    ctx: &Context,
    name: &RedisString,
    value: &str,
    ms: i64,
) -> Result<(), RedisError> {
    let key = ctx.open_key_writable(name);
    // In place (a bucket's digits are nearly always as many as before): `write` made a
    // module string of the value and set it as a new one.
    key.as_string_dma()?.write(value.as_bytes())?;
    key.set_expire(std::time::Duration::from_millis(ms.max(1) as u64))?;
    replicate_set(ctx, name.as_slice(), value.as_bytes(), wall_ms() + ms);
    Ok(())
}

/// Replicates `SET name value PXAT at`, handing `RedisModule_Replicate` the bytes and the
/// number as they are (its format `bbcl`). `Context::replicate` first made a module string
/// of each argument, and each decision's write spent 4 800 instructions replicating (a
/// third of the command's per decision, callgrind; BENCHMARKS.md "The store's batches
/// through the module").
#[allow(unsafe_code)]
fn replicate_set(ctx: &Context, name: &[u8], value: &[u8], at: i64) {
    let replicate = unsafe { raw::RedisModule_Replicate }.expect("Redis exports Replicate");
    // SAFETY: `ctx.ctx` is the context Redis handed this command; each `b` is a pointer
    // and a length of bytes that outlive the call (Redis copies them), `c` is a
    // nul-terminated string, `l` a long long, in the order of the format.
    unsafe {
        replicate(
            ctx.ctx,
            c"SET".as_ptr(),
            c"bbcl".as_ptr(),
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
            c"PXAT".as_ptr(),
            at as std::ffi::c_longlong,
        );
    }
}

/// `DEL name`, replicated.
pub(crate) fn delete(ctx: &Context, name: &RedisString) -> Result<(), RedisError> {
    let key = ctx.open_key_writable(name);
    if key.key_type() != KeyType::Empty {
        key.delete()?;
        ctx.replicate("DEL", &[name.as_slice()][..]);
    }
    Ok(())
}

/// The error of a key the script's call names that holds another type.
pub(crate) fn wrong_type() -> RedisError {
    RedisError::WrongType
}
