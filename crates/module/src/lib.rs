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
//! - `CELLRATE.BATCH numkeys key [key ...] arg [arg ...]`: one call of cellrate's Redis
//!   store (spend, refund, reset; GCRA, calendar windows, debt, leases, a kept Check's
//!   marker), with exactly the keys and arguments of `EVALSHA` of the store's `batch.lua`
//!   and its answer (`batch/`): cellrate sends it instead of the script when the server
//!   has the module (`--redis-module`).
//! - `CELLRATE.SETTLE numkeys key [key ...] arg [arg ...]`: the same for the settlement
//!   ledger's `settle.lua` (kept Checks and holds).
//!
//! The two store commands name their keys as `EVALSHA` does (`getkeys-api`), so that a
//! cluster checks their slot. A command's writes are replicated as their effect (`SET key value PXAT ms`, `DEL`, the
//! sorted-set writes of a lease key), never as the command: a replica, or an AOF replayed
//! later, reads another clock; a replica needs no module.
//!
//! Bad input gets an error and changes nothing: a wrong number of arguments, a number that
//! is not an integer or that redis-cell would compute nonsense with, a key of another type
//! (WRONGTYPE), a value that is no bucket; every argument and key type is checked before
//! the first write.
//!
//! # Layout
//!
//! ```text
//! lib.rs                 the module's registration
//! throttle.rs            CL.THROTTLE, RL.THROTTLE, GCRA: redis-cell's buckets
//! keys.rs                strings read and written as the script does, replicated as SET/DEL
//! batch/mod.rs           CELLRATE.BATCH: its keys, op, now and a kept Check's marker
//! batch/shapes.rs        the call's numbers, checked whole; each shape's decision (core)
//! batch/spend.rs         spend: batches, all or nothing, in order
//! batch/leases.rs        lease keys: sorted sets, through the server's commands
//! batch/give_back.rs     refund and reset
//! settle.rs              CELLRATE.SETTLE: settle.lua's ledger steps, its arguments
//! settle/ops.rs          each op as the script does it
//! settle/ledger.rs       the ledger's keys, through the server's commands
//! ```

mod batch;
mod keys;
mod settle;
mod throttle;

use batch::batch;
use redis_module::redis_module;
use throttle::{cl_throttle, gcra, rl_throttle};

redis_module! {
    name: "cellrate",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    commands: [
        ["CL.THROTTLE", cl_throttle, "write deny-oom fast", 1, 1, 1, ""],
        ["RL.THROTTLE", rl_throttle, "write deny-oom fast", 1, 1, 1, ""],
        ["GCRA", gcra, "write deny-oom fast", 1, 1, 1, ""],
        ["CELLRATE.BATCH", batch, "write deny-oom getkeys-api", 0, 0, 0, ""],
        [settle::NAME, settle::command, "write deny-oom getkeys-api", 0, 0, 0, ""],
    ],
}
