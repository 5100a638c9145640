//! Redis errors as store errors: classified once, where redis-rs's error is seen, by how
//! the call failed (the log and the breaker tell them apart).

use crate::{FailureKind, StoreError};

/// A Redis error as a store error, classified here, where the backend's error is seen.
pub(super) fn store_error(context: &'static str, e: redis::RedisError) -> StoreError {
    StoreError::backend_of(failure_kind(&e), context, e)
}

/// How a call failed, from redis-rs's error: its deadline (redis-rs's own response
/// timeout), a refused connection, a connection that broke, or anything else.
fn failure_kind(e: &redis::RedisError) -> FailureKind {
    if e.is_timeout() {
        FailureKind::Deadline
    } else if e.is_connection_refusal() {
        FailureKind::Refused
    } else if e.is_connection_dropped() {
        FailureKind::Reset
    } else {
        FailureKind::Other
    }
}

/// Whether `e` says the Redis that answered is a replica: `READONLY`, as its own reply or
/// inside a script's error (a write of the script refused).
pub(super) fn read_only(e: &redis::RedisError) -> bool {
    e.code() == Some("READONLY") || e.to_string().contains("READONLY")
}
