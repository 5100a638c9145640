//! The ports through which replicas share state other than buckets, beside the store that
//! implements them (the Redis store, `store::redis`): temporary overrides
//! ([`SharedOverrides`], used by `cellrate::service::overrides`), RLQS demand
//! ([`SharedDemand`], used by `cellrate::service::rlqs`) and settlements ([`Settlements`],
//! used by `cellrate::service::settle`; the memory store's are in-process). They live here,
//! below the services that use them, so that a store never imports a service.

use std::sync::Arc;

use crate::StoreFuture;
use cellrate_core::clock::Nanos;

/// A table of temporary overrides shared by replicas (see `cellrate::service::overrides`). Fields are
/// `"<number>:<override id>"`; records are opaque to the table, which keeps each with its
/// expiry, in its own clock.
pub trait SharedOverrides: Send + Sync + 'static {
    /// Writes `record` under `field` for `ttl`, after dropping the expired, unless `field`
    /// is new and `max` others are in force.
    fn put<'a>(
        &'a self,
        field: &'a str,
        record: &'a str,
        ttl: Nanos,
        max: usize,
    ) -> StoreFuture<'a, Put>;
    /// Removes `field`; whether it was in force.
    fn remove<'a>(&'a self, field: &'a str) -> StoreFuture<'a, bool>;
    /// The table unless its version is `known` (`""` before the first fetch).
    fn fetch<'a>(&'a self, known: &'a str) -> StoreFuture<'a, Fetched>;
    /// Puts `copy` (field, record, time left), a replica's copy of version `held`, back
    /// when the table is gone (its store restarted empty) or was put back from an older
    /// copy with no change since; whether it did.
    fn restore<'a>(
        &'a self,
        held: &'a str,
        copy: &'a [(String, String, Nanos)],
    ) -> StoreFuture<'a, bool>;
}

/// What [`SharedOverrides::put`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    Written,
    /// Nothing written: `held` overrides are in force.
    Full(usize),
}

/// What [`SharedOverrides::fetch`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    Unchanged,
    Changed {
        /// `""`: there is no table (none was ever written, or the store lost it).
        version: String,
        /// The version of the copy the table was last put back from, with no change made
        /// since (`""`: none).
        restored_from: String,
        /// Every unexpired entry: field, record, time left (`None`: unreadable expiry).
        entries: Vec<(String, String, Option<Nanos>)>,
    },
}

/// The reporters of one key, summed up: how many, how many with a known demand, and the
/// sum of the known demands (capped). What replicas share with each other.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Aggregate {
    pub reporters: u64,
    pub known: u64,
    pub sum: f64,
}

/// Demand for limit keys shared by replicas (the Redis store): see docs/rlqs.md. `cellrate::service::rlqs`
/// exchanges its [`Aggregate`]s through it.
pub trait SharedDemand: Send + Sync + 'static {
    /// Publishes this replica's reporters of each key and returns, in the same order, the
    /// other replicas' reporters of it.
    fn exchange<'a>(&'a self, mine: &'a [(Arc<str>, Aggregate)])
        -> StoreFuture<'a, Vec<Aggregate>>;
}

/// The table of Checks kept for settling (see `cellrate::service::settle`): request id ->
/// record, each for the table's window, at most the table's number of records (beyond it,
/// the oldest are pushed out). The bytes are opaque to the table; the times are the
/// table's own (its clock, or Redis's), which is also the store's.
///
/// A record opened with a hold (its limits' `reservation:`) is a **hold**: it is *due* at
/// its opening plus the hold, is never pushed out while it is decided and not claimed
/// (a table full of such holds refuses new records: [`Opened::full`]), and is kept one
/// window past its due, so that a late claim learns that it expired. From its due on, a
/// claim finds it [`Claim::Expired`], and [`Settlements::due`] claims it, once, for its
/// release.
///
/// **A share per key.** A hold counts against the bucket keys it holds tokens of (`keys`
/// of [`Settlements::open`]): while any of them has the table's most live holds per key
/// (`--settle-max-holds-per-key`), a new hold of it is refused ([`Opened::crowded`]), so
/// one tenant cannot fill the table with holds and refuse every other's. A hold is
/// counted from its opening until it is no longer live (settled, dropped, claimed at its
/// due, or let go), and again while it is reopened; exactly, in the table's one atomic step.
///
/// A record goes through three states, each change atomic in the table:
/// - **pending** ([`Settlements::open`]): its Check is being decided; it cannot be claimed;
/// - **decided** ([`Settlements::decide`]): it holds what the Check actually spent, and
///   can be claimed once;
/// - **settled** ([`Settlements::claim`]): it remembers the costs it was settled with, for
///   good, unless [`Settlements::reopen`] makes it decided again (with new facts) because
///   its adjustment was surely not made.
pub trait Settlements: Send + Sync + 'static {
    /// Keeps `check` pending under `id` unless `id` is kept already, pushing out the
    /// oldest records when the table is full.
    /// `hold`: the record is a hold, due that long after now, counted against each of
    /// `keys` (bucket keys, distinct; ignored without a hold).
    fn open<'a>(
        &'a self,
        id: &'a str,
        check: &'a [u8],
        hold: Option<Nanos>,
        keys: &'a [String],
    ) -> StoreFuture<'a, Opened>;
    /// Makes the pending record of `id` decided, with `facts` (what its Check spent).
    /// Whether it was pending (`false`: gone, e.g. pushed out).
    fn decide<'a>(&'a self, id: &'a str, facts: &'a [u8]) -> StoreFuture<'a, bool>;
    /// Drops the record of `id` (its Check was denied or failed).
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()>;
    /// Claims the decided record of `id` for settling at `costs` (opaque bytes): it is
    /// settled from then on.
    fn claim<'a>(&'a self, id: &'a str, costs: &'a [u8]) -> StoreFuture<'a, Claim>;
    /// Makes a settled record decided again, with `facts` in place of its own: its
    /// adjustment was (in part) surely not made, and a retry may make the rest.
    fn reopen<'a>(&'a self, id: &'a str, facts: &'a [u8]) -> StoreFuture<'a, ()>;
    /// Claims at most `max` decided holds that are due, each settled from then on (a
    /// claim finds it [`Claim::Expired`]): their ids and records, for their release. A
    /// hold still pending at its due is let go (its estimate stands), or, by a table that
    /// can (Redis's), handed out with empty facts for its spend's resolution and due
    /// again a little later, until it is decided or forgotten, or expires.
    fn due(&self, max: usize) -> StoreFuture<'_, Vec<(String, Kept)>>;
    /// Queues the live hold of `id` under `queue` (a bucket's anonymous holds, in the
    /// order they were queued), for [`Settlements::claim_oldest`]. A record that is no
    /// live hold is not queued. A record leaves its queue when it is claimed (by id, at
    /// its due or as the oldest), forgotten or dropped.
    fn enqueue<'a>(&'a self, queue: &'a str, id: &'a str) -> StoreFuture<'a, ()>;
    /// Claims the oldest decided live hold of `queue` at `costs`, as [`Settlements::claim`]
    /// claims one by id: its id and record, or `None` when the queue holds none (a
    /// pending hold is passed over and stays queued; one past its due is left to its
    /// release).
    fn claim_oldest<'a>(
        &'a self,
        queue: &'a str,
        costs: &'a [u8],
    ) -> StoreFuture<'a, Option<(String, Kept)>>;

    /// How long a record is kept past its hold (`--settle-window`).
    fn window(&self) -> Nanos;
}

/// What [`Settlements::open`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// Whether the record was written (`false`: the id is kept already).
    pub written: bool,
    /// Records pushed out to make room (the oldest that are no live holds).
    pub evicted: u64,
    /// Nothing written: the table holds its most records, every one a live hold.
    pub full: bool,
    /// Nothing written: the key at this index of `keys` has its most live holds.
    pub crowded: Option<usize>,
}

/// Live holds per bucket key at most, by default (`--settle-max-holds-per-key`): 1% of
/// the table's default 100 000 records, so at least a hundred tenants fill it.
pub const DEFAULT_MAX_HOLDS_PER_KEY: usize = 1_000;

/// A decided record, as a claim finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// The Check, as [`Settlements::open`] kept it.
    pub check: Vec<u8>,
    /// What it spent, as [`Settlements::decide`] (or [`Settlements::reopen`]) wrote it.
    pub facts: Vec<u8>,
    /// When it was opened (before its Check was decided), in the table's time.
    pub opened: Nanos,
    /// When it was decided (after its Check was decided).
    pub decided: Nanos,
    /// When this claim was made.
    pub now: Nanos,
}

/// What [`Settlements::claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// No record of that id.
    Unknown,
    /// Its Check is still being decided: nothing claimed.
    Pending,
    /// The decided record, now settled.
    Claimed(Kept),
    /// Settled before, at `costs`.
    Settled { kept: Kept, costs: Vec<u8> },
    /// A hold past its due: released (or kept) by [`Settlements::due`], not settled.
    Expired,
}
