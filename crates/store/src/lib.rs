//! cellrate-store: where bucket TATs live, the [`Store`] trait and its implementations.
//!
//! A store owns the read-decide-write of a batch: it reads every item's TAT, runs the pure
//! arithmetic of [`cellrate_core::gcra`] (or, for Redis, the same arithmetic server-side), writes the
//! new TATs only when the batch is allowed, and returns every item's [`Decision`]. A store
//! also owns its clock: the memory store reads an injected [`cellrate_core::clock::Clock`]; a
//! shared store may use its own server's time so that replicas agree.
//!
//! ```
//! use std::sync::Arc;
//! use cellrate_core::clock::{FakeClock, SECOND};
//! use cellrate_core::gcra::{Limit, Mode};
//! use cellrate_limits::names::BucketKey;
//! use cellrate_store::{MemoryStore, StoreItem};
//!
//! // Two a second for alice: a batch of two spends is allowed, the third spend is not.
//! let store = MemoryStore::new(Arc::new(FakeClock::new(1_000 * SECOND)));
//! let item = StoreItem {
//!     key: BucketKey::new(100, "alice"),
//!     limit: Limit::new(2, 2, SECOND).unwrap(),
//!     cost: 1,
//!     mode: Mode::CheckAndSpend,
//!     lease: None,
//! };
//! assert!(store.spend_now(&[item.clone()]).unwrap().allowed);
//! assert!(store.spend_now(&[item.clone()]).unwrap().allowed);
//! assert!(!store.spend_now(&[item]).unwrap().allowed);
//! ```
//!
//! # Layout
//!
//! Every file, by room (a test keeps this map equal to the files):
//!
//! ```text
//! lib.rs                    the Store trait, StoreError, StoreObserver; this map
//! measured.rs               timing; the observer for Metrics
//! shared.rs                 ports for shared overrides, RLQS demand, settlements
//! settlements/mod.rs        settlements kept in memory
//! settlements/ledger.rs     its indexes: by expiry, by due, per key, anonymous queues
//! table.rs                  the memory store's open-addressing TAT table
//! memory/mod.rs             sharded, all-or-nothing: shards, bounds, locks, sweeps
//! memory/batch.rs           a batch's spend, refund and reset under its shards' locks
//! memory/shares.rs          the buckets' bounds per name and the denial when full
//! memory/leases/mod.rs      concurrency limits' leases: a batch holding them decided
//! memory/leases/one.rs      a request of one lease item, and the shard's spare list
//! memory/leases/map.rs      a shard's leases by key, their hashers, the sweep
//! memory/leases/in_flight.rs the keys holding the most leases, for admin Top in flight
//! memory/lease_shares.rs    their bounds in all and per name
//! memory/snapshot/mod.rs    the snapshot file: written, restored
//! memory/snapshot/format.rs its layout, and the check of a whole file
//! memory/snapshot/file.rs   the file on disk: trusted before it is read, written privately
//! redis/mod.rs              the Redis store
//! redis/store.rs            its state and the batches of every operation
//! redis/settings.rs         how to reach Redis (compiled without the feature too)
//! redis/connection.rs       the connection and the one script call
//! redis/wire.rs             the vocabulary of a script call
//! redis/cluster.rs          hash slots and groups of keys
//! redis/sentinel.rs         failover followed
//! redis/tls.rs              TLS to a single Redis
//! redis/breaker.rs          circuit breakers per slot
//! redis/errors.rs           Redis errors classified
//! redis/failure.rs          the failure policy
//! redis/failure_log.rs      store failures in the log, once per kind
//! redis/coalesce.rs         batches coalesced per lane
//! redis/deny_cache.rs       the local deny cache
//! redis/invocation.rs       a call: EVALSHA of the script, or cellrate's module's command
//! redis/leases.rs           leases as the script reads them
//! redis/lease_keys.rs       lease keys counted per name: this replica's share
//! redis/bucket_keys.rs      bucket keys counted per name: this replica's share
//! redis/items.rs            a slot group's items as the script reads them
//! redis/settlements.rs      settlements in Redis
//! redis/once.rs             a kept Check's spend under a token, resolved once
//! redis/overrides.rs        the overrides' shared table
//! redis/demand.rs           RLQS demand shared between replicas
//! memcache/mod.rs           envoyproxy/ratelimit's fixed windows in memcached
//! memcache/store.rs         the MemcacheStore
//! memcache/client.rs        its pool of connections
//! memcache/wire.rs          memcached's text protocol
//! ```
//!
//! Contract for every implementation (the store scenario tests hold each one to it):
//! - a batch is atomic: no other batch sees some of its writes and not others;
//! - all-or-nothing: spends are written only when every counting item is allowed;
//! - a denial, a check-only item and a cost-0 peek write nothing;
//! - a refund never creates a bucket and never makes one fuller than full;
//! - items of one batch name distinct buckets (the caller checks).

use std::future::Future;
use std::pin::Pin;

use cellrate_core::gcra::{Decision, Limit, Mode};
use cellrate_limits::names::BucketKey;

pub mod measured;
pub mod memcache;
pub mod memory;
pub mod redis;
pub mod settlements;
pub mod shared;
mod table;

pub use memory::MemoryStore;

/// A boxed future returned by [`Store`] methods (the trait is used as `dyn Store`).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// One bucket of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreItem {
    pub key: BucketKey,
    pub limit: Limit,
    pub cost: u64,
    pub mode: Mode,
    /// The lease id of a [`Mode::Acquire`] or [`Mode::Release`] item (docs/concurrency.md).
    pub lease: Option<std::sync::Arc<str>>,
}

/// The answer of a spend batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Whether every counting item was allowed, so the spends were written.
    pub allowed: bool,
    /// One decision per item, in order.
    pub decisions: Vec<Decision>,
}

/// Why a store could not answer. Being rate limited is never an error: it is a
/// [`Decision`] with `allowed == false`. Every variant becomes UNAVAILABLE in exactly one
/// place (`cellrate::service::store_unavailable`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// No answer within the deadline.
    #[error("{}: no answer within {timeout:?}", backend_named(op))]
    Timeout {
        op: &'static str,
        timeout: std::time::Duration,
    },
    /// Too many items already wait for a call to the same Redis node (slot).
    #[error("redis: {queued} items already wait for a call to this node")]
    Backlog { queued: usize },
    /// An open circuit breaker failed the call fast.
    #[error("redis: circuit open after repeated failures")]
    CircuitOpen,
    /// The bound on live buckets is reached (the reason says which share).
    #[error("{0}")]
    Capacity(String),
    /// The server's answer is not a script reply.
    #[error("redis: malformed script reply")]
    MalformedReply,
    /// A bucket holds a value that is no TAT: a fault of that bucket's data, not of the
    /// store, which must not count toward the breaker nor be decided by a failure policy.
    #[error("{0}")]
    Data(String),
    /// The backend failed (connection refused, a Redis error reply, ...); `kind` says how,
    /// as classified where the backend's error was seen.
    #[error("{}: {source}", backend_named(context))]
    Backend {
        context: &'static str,
        kind: FailureKind,
        #[source]
        source: std::sync::Arc<dyn std::error::Error + Send + Sync>,
    },
    /// Settings that cannot work.
    #[error("{0}")]
    Config(String),
    /// The store broke its contract (e.g. fewer decisions than items).
    #[error("{0}")]
    Inconsistent(String),
    /// Applied to some buckets and not to others (parallel slot groups).
    #[error("{source}: {op} applied to {applied}; not to {missing}")]
    Partial {
        op: &'static str,
        applied: String,
        missing: String,
        #[source]
        source: Box<StoreError>,
    },
}

/// An operation's name with its backend's: `redis spend`, unless it names its own
/// (`memcache spend`).
fn backend_named(op: &str) -> std::borrow::Cow<'_, str> {
    match op.starts_with("memcache ") {
        true => op.into(),
        false => format!("redis {op}").into(),
    }
}

/// How a store failed to answer, for the operator: what to look at differs by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// No answer within the call's deadline.
    Deadline,
    /// The connection was refused (nothing listens at the address).
    Refused,
    /// The connection broke: reset, broken pipe, closed mid-call.
    Reset,
    /// Anything else (an error reply, a malformed answer, a TLS or login failure, ...).
    Other,
}

impl FailureKind {
    /// Every kind, in the order of [`FailureKind::index`].
    pub const ALL: [FailureKind; 4] = [
        FailureKind::Deadline,
        FailureKind::Refused,
        FailureKind::Reset,
        FailureKind::Other,
    ];

    /// The kind's name in logs.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Deadline => "deadline",
            FailureKind::Refused => "refused",
            FailureKind::Reset => "reset",
            FailureKind::Other => "other",
        }
    }

    /// Its position in [`FailureKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl StoreError {
    /// A backend failure of no particular kind, keeping the backend's error as the source.
    pub fn backend(
        context: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::backend_of(FailureKind::Other, context, source)
    }

    /// A backend failure of `kind`, keeping the backend's error as the source.
    pub fn backend_of(
        kind: FailureKind,
        context: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::Backend {
            context,
            kind,
            source: std::sync::Arc::new(source),
        }
    }

    /// How the store failed to answer, for errors that say the store did not answer:
    /// `None` for a refusal of our own (an open breaker, a full queue or table), a bad
    /// bucket or bad settings.
    pub fn failure_kind(&self) -> Option<FailureKind> {
        match self {
            StoreError::Timeout { .. } => Some(FailureKind::Deadline),
            StoreError::Backend { kind, .. } => Some(*kind),
            StoreError::MalformedReply => Some(FailureKind::Other),
            StoreError::Partial { source, .. } => source.failure_kind(),
            StoreError::Backlog { .. }
            | StoreError::CircuitOpen
            | StoreError::Capacity(_)
            | StoreError::Data(_)
            | StoreError::Config(_)
            | StoreError::Inconsistent(_) => None,
        }
    }

    /// Whether this is a data error ([`StoreError::Data`]).
    pub fn is_data_error(&self) -> bool {
        matches!(self, StoreError::Data(_))
    }

    /// Whether the same call may succeed if retried later: the store was slow, unreachable,
    /// busy, full or behind an open breaker. Not: a bucket's data, the settings, or a
    /// store that broke its contract, which a retry meets again.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Timeout { .. }
            | StoreError::Backlog { .. }
            | StoreError::CircuitOpen
            | StoreError::Capacity(_)
            | StoreError::Backend { .. } => true,
            StoreError::Partial { source, .. } => source.is_transient(),
            StoreError::MalformedReply
            | StoreError::Data(_)
            | StoreError::Config(_)
            | StoreError::Inconsistent(_) => false,
        }
    }

    /// Whether the failed call may still have changed buckets: it reached the store's data
    /// and its answer was lost or late (a missed deadline, a broken connection, a reply that
    /// could not be read), or it was applied in part. `false` only when the call surely
    /// changed nothing (refused before it reached the data), which is what lets a caller
    /// retry a write without making it twice.
    pub fn may_have_applied(&self) -> bool {
        match self {
            // A refused connection sent nothing.
            StoreError::Backend { kind, .. } => *kind != FailureKind::Refused,
            StoreError::Timeout { .. }
            | StoreError::MalformedReply
            | StoreError::Inconsistent(_)
            | StoreError::Partial { .. } => true,
            StoreError::Backlog { .. }
            | StoreError::CircuitOpen
            | StoreError::Capacity(_)
            | StoreError::Data(_)
            | StoreError::Config(_) => false,
        }
    }
}

/// Equal when they say the same (the backend's error has no equality of its own).
impl PartialEq for StoreError {
    fn eq(&self, other: &StoreError) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for StoreError {}

/// Something that happened in a store, beyond its operations' timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreEvent {
    /// A request answered by the failure policy (`allow`, `deny` or `local`).
    Fallback(&'static str),
    /// A cross-slot batch's spent groups refunded because another group denied.
    Compensation,
    /// A request denied by the local deny cache without a round trip.
    DenyCacheHit,
    /// A call failed fast by an open circuit breaker.
    BreakerRejection,
    /// A closed circuit breaker opened (after its threshold of consecutive failures).
    BreakerOpened,
    /// An open (or half-open) circuit breaker closed (its trial call succeeded).
    BreakerClosed,
    /// Redis answered a spend call that carried this many requests' batches (coalescing).
    SpendCall { batches: usize },
    /// Items began (positive) or stopped (negative) waiting for a coalesced call.
    Queued(i64),
}

/// Who hears what a store does (the metrics): the store knows nothing of them.
pub trait StoreObserver: Send + Sync {
    /// One operation (`spend`, `refund`, `reset`) took `seconds`, and failed unless `ok`.
    fn operation(&self, op: &'static str, seconds: f64, ok: bool);
    /// Something else happened.
    fn event(&self, event: StoreEvent);
}

/// An observer that hears nothing (tests, tools).
pub struct NoObserver;

impl StoreObserver for NoObserver {
    fn operation(&self, _: &'static str, _: f64, _: bool) {}
    fn event(&self, _: StoreEvent) {}
}

/// Leases of concurrency limits a store counted since it started: taken, freed by their
/// release, and dropped unreleased after their hold (leaked: their caller never released);
/// and acquires refused because the store's table of leases, or its name's share of it,
/// was full (the memory store's bounds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseEvents {
    pub acquired: u64,
    pub released: u64,
    pub expired: u64,
    pub refused: u64,
}

/// The counters behind [`LeaseEvents`], kept by a store.
#[derive(Debug, Default)]
pub struct LeaseCounters([std::sync::atomic::AtomicU64; 4]);

impl LeaseCounters {
    /// Counts leases taken, released and found expired.
    pub fn add(&self, acquired: u64, released: u64, expired: u64) {
        for (counter, n) in self.0.iter().zip([acquired, released, expired]) {
            if n > 0 {
                counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Counts an acquire refused for a full table or share.
    pub fn refused(&self) {
        self.0[3].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn get(&self) -> LeaseEvents {
        let [a, r, e, f] = &self.0;
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        LeaseEvents {
            acquired: load(a),
            released: load(r),
            expired: load(e),
            refused: load(f),
        }
    }
}

/// A key of a concurrency limit with leases held now, for admin `Top` in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightKey {
    pub key: BucketKey,
    /// Live leases the key holds.
    pub leases: u64,
    /// The limit's `count` the key's latest lease was taken under.
    pub count: u64,
}

/// The keys of one name number holding the most leases now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightName {
    pub number: u32,
    /// Live leases of the name, over every key (listed or not).
    pub leases: u64,
    /// The most leases first, then by key.
    pub keys: Vec<InFlightKey>,
}

/// A spend made at most once under a token (a kept Check's, docs/concurrency.md "A Check
/// cut short"): a store that keeps tokens ([`Store::keeps_tokens`]) writes a marker with
/// it, so that when the spend's outcome is not known (its call missed its deadline or
/// lost its connection) [`Store::resolve_once`] can learn it, and make sure that a spend
/// still on its way spends nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Once {
    /// Random, one per kept Check.
    pub token: u128,
    /// How long the marker is kept: at least as long as its record may be resolved.
    pub ttl: cellrate_core::clock::Nanos,
}

/// A place to keep TATs and decide batches atomically.
pub trait Store: Send + Sync + 'static {
    /// Decides `items` all-or-nothing and writes the spends if allowed.
    fn spend<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Outcome>;

    /// Whether [`Store::spend_once`] writes markers that [`Store::resolve_once`] reads.
    fn keeps_tokens(&self) -> bool {
        false
    }

    /// [`Store::spend`] under `once`'s token: a spend already resolved under it
    /// spends nothing (an error, never applied). Without tokens: [`Store::spend`].
    fn spend_once<'a>(
        &'a self,
        items: &'a [StoreItem],
        once: &'a Once,
    ) -> StoreFuture<'a, Outcome> {
        let _ = once;
        self.spend(items)
    }

    /// What the spend of `items` under `once`'s token did, for good: the outcome it had
    /// (replayed) when it spent, all of it; else (it never ran, was denied, or only part
    /// of a cross-slot batch spent, which is then given back) not allowed, nothing
    /// spent, and no spend under the token will ever spend.
    fn resolve_once<'a>(
        &'a self,
        items: &'a [StoreItem],
        once: &'a Once,
    ) -> StoreFuture<'a, Outcome> {
        let _ = (items, once);
        Box::pin(std::future::ready(Err(StoreError::Config(
            "this store keeps no spend tokens".into(),
        ))))
    }

    /// [`Store::spend`] at once, for a store that never waits (the memory store); `None`
    /// means "await `spend`". Saves the request path a boxed future per decorator.
    fn try_spend_now(&self, _items: &[StoreItem]) -> Option<Result<Outcome, StoreError>> {
        None
    }

    /// Whether a spend may wait (a round trip): then callers with many independent spends
    /// start them together rather than one after another.
    fn waits(&self) -> bool {
        true
    }

    /// Refunds each item's cost (its mode is ignored). Per item, `allowed` says whether
    /// the bucket changed. Items are applied in order: a bucket named twice (the service
    /// never sends one, it refuses a bucket twice per request) is refunded twice.
    fn refund<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Vec<Decision>>;

    /// Deletes buckets (each becomes full); returns how many were not full before (a
    /// bucket named twice counts once).
    fn reset<'a>(&'a self, keys: &'a [BucketKey]) -> StoreFuture<'a, u32>;

    /// Drops expired buckets, for stores that must do so themselves; returns how many.
    fn sweep(&self) -> usize {
        0
    }

    /// Buckets held, for stores that can tell cheaply.
    fn live_buckets(&self) -> Option<usize> {
        None
    }

    /// Spends denied since the store started because a new bucket had no room, by the
    /// bound that was full: the table, a limit name's share, caller-given limits' share
    /// (the memory store's bounds; `cellrate_buckets_refused_total`).
    fn bucket_refusals(&self) -> [u64; 3] {
        [0; 3]
    }

    /// Leases counted since the store started (see [`LeaseEvents`]).
    fn lease_events(&self) -> LeaseEvents {
        LeaseEvents::default()
    }

    /// The limits changed (a reload): drop anything derived from the old ones.
    fn limits_changed(&self) {}

    /// Per name number (or only `only`), the `per_name` keys holding the most live leases
    /// now, names with the most leases first; `None`: this store cannot tell (only the
    /// memory store can: docs/concurrency.md). A blocking scan: call it off the runtime.
    fn in_flight(&self, _per_name: usize, _only: Option<u32>) -> Option<Vec<InFlightName>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(kind: FailureKind) -> StoreError {
        StoreError::Backend {
            context: "spend",
            kind,
            source: std::sync::Arc::new(std::io::Error::other("x")),
        }
    }

    /// Each error says once whether a retry may help and whether the call may have
    /// changed buckets; Settle reopens a record only on errors that surely changed none.
    #[test]
    fn errors_say_whether_to_retry_and_whether_they_may_have_applied() {
        let timeout = StoreError::Timeout {
            op: "spend",
            timeout: std::time::Duration::from_millis(10),
        };
        let partial = StoreError::Partial {
            op: "spend",
            applied: "slot 1".into(),
            missing: "slot 2".into(),
            source: Box::new(StoreError::CircuitOpen),
        };
        // (error, transient, may have applied)
        let cases = [
            (timeout, true, true),
            (backend(FailureKind::Refused), true, false),
            (backend(FailureKind::Deadline), true, true),
            (backend(FailureKind::Reset), true, true),
            (StoreError::Backlog { queued: 9 }, true, false),
            (StoreError::CircuitOpen, true, false),
            (StoreError::Capacity("full".into()), true, false),
            (partial, true, true),
            (StoreError::MalformedReply, false, true),
            (StoreError::Inconsistent("short".into()), false, true),
            (StoreError::Data("not a TAT".into()), false, false),
            (StoreError::Config("no url".into()), false, false),
        ];
        for (e, transient, applied) in cases {
            assert_eq!(e.is_transient(), transient, "{e}");
            assert_eq!(e.may_have_applied(), applied, "{e}");
        }
    }
}
