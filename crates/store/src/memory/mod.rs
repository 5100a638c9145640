//! The in-memory store: TATs in a fixed number of mutex-guarded shards, each an
//! open-addressing table (`TatTable`, in `table.rs`) keyed by a 64-bit keyed hash of the bucket key: 18
//! bytes a slot whatever the id's length, 22.5-33 bytes of table a live bucket. The
//! number of shards grows with the bound on buckets ([`MemoryStore::shards_for`]), so that
//! a shard stays small enough to sweep in well under a millisecond.
//!
//! A batch locks the shards its keys fall in, in ascending shard order (so overlapping
//! batches cannot deadlock), decides with [`cellrate_core::gcra::spend_batch`] and writes before
//! unlocking: batches are atomic without a global lock, and batches on disjoint shards run
//! in parallel (`batch.rs`: spend, refund, reset).
//!
//! Expired buckets (TAT <= now) are full buckets and carry no information; [`MemoryStore::sweep`]
//! drops them (the app runs it on a timer).
//!
//! **Bound on live buckets.** The store holds at most `max_buckets` buckets, counted
//! exactly across its shards (expired buckets count until they are swept). Buckets under
//! caller-given limits ([`BucketKey::is_caller_given`]) live in tables of their own with
//! their own bound (a share of `max_buckets`), so that callers who choose their own limits
//! cannot crowd out the configured ones; and each configured limit name may hold at most
//! a share of the configured limits' part (`--bucket-name-share`, `shares.rs`), so that
//! one name whose ids a client chooses cannot crowd out the other names. A batch that
//! would create buckets beyond a bound first sweeps the expired buckets of the shards it
//! holds (each at most once a second); if that frees too little, the spend that needs the new bucket is **denied**
//! ([`gcra::no_room`]: not allowed, `remaining` 0; the batch all-or-nothing as ever, so
//! nothing of it is written) and counted by bound ([`Full`]). Never an error: Envoy's
//! default (`failure_mode_deny: false`) lets an errored request through with every
//! descriptor skipped. Existing buckets keep working: their spends, denials, peeks,
//! refunds and resets need no room.
//!
//! **Snapshots** (`snapshot/`): the live buckets written to a file and read back at the
//! next start, so that a restart does not hand every client a full burst.

use parking_lot::{Mutex, MutexGuard};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::table::{TatTable, MIN_PRINT};
use crate::{Outcome, Store, StoreError, StoreFuture, StoreItem};
use cellrate_core::clock::{Clock, Nanos};
use cellrate_core::gcra::{self, Decision};
use cellrate_limits::names::BucketKey;

mod batch;
mod lease_shares;
mod leases;
pub(crate) mod shares;
mod snapshot;
pub use lease_shares::DEFAULT_LEASE_NAME_SHARE_PERCENT;
use leases::LeaseMap;
#[cfg(feature = "redis")]
pub(crate) use leases::PrintHasher;
pub use leases::DEFAULT_MAX_LEASES;
pub use shares::{Full, DEFAULT_BUCKET_NAME_SHARE_PERCENT};
pub use snapshot::{Ignored, Restored, Written};

/// The least number of shards: enough that two batches rarely meet.
pub const DEFAULT_SHARDS: usize = 128;

/// Buckets per shard that [`MemoryStore::shards_for`] aims at: a sweep of a shard this full
/// holds its lock for a few hundred microseconds at most (BENCHMARKS.md).
const BUCKETS_PER_SHARD: usize = 25_000;

/// The most shards [`MemoryStore::shards_for`] chooses.
const MAX_SHARDS: usize = 8_192;

/// Default bound on live buckets.
pub const DEFAULT_MAX_BUCKETS: usize = 10_000_000;

/// A bucket key's 64-bit keyed hash (SipHash-1-3 with random keys, [`BucketHasher`]),
/// stored instead of the key: 8 bytes whatever the id's length, and no allocation per
/// bucket. Two distinct keys share a bucket only if their hashes collide: with 10 M live
/// buckets a chance of about 3 in a million that any two do, with 100 M about 3 in ten
/// thousand; the keys are secret, so callers cannot aim for it (see docs/operations.md,
/// "Sizing").
type Fingerprint = u64;

/// SipHash-1-3 (what std's `RandomState` runs) with keys drawn at random when a store is
/// made, and kept in its snapshot file so that a restored store finds its buckets again.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BucketHasher {
    keys: (u64, u64),
}

impl BucketHasher {
    /// Random keys (from the operating system's randomness, through std's `RandomState`).
    fn random() -> BucketHasher {
        let seed = RandomState::new();
        BucketHasher {
            keys: (
                seed.hash_one(0x6365_6c6c_u64),
                seed.hash_one(0x7261_7465_u64),
            ),
        }
    }
}

impl BuildHasher for BucketHasher {
    type Hasher = siphasher::sip::SipHasher13;

    fn build_hasher(&self) -> Self::Hasher {
        siphasher::sip::SipHasher13::new_with_keys(self.keys.0, self.keys.1)
    }
}

/// Which table of a shard a bucket lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    Configured = 0,
    CallerGiven = 1,
}

impl Space {
    pub(crate) fn of(key: &BucketKey) -> Space {
        if key.is_caller_given() {
            Space::CallerGiven
        } else {
            Space::Configured
        }
    }
}

/// A shard's tables, one per [`Space`], and its leases (`leases/map.rs`), with a spare list of
/// leases (empty, at most a few leases of room) for the next key that takes one
/// (`leases/one.rs`).
#[derive(Default)]
struct Tables(
    [TatTable; 2],
    LeaseMap,
    Vec<gcra::lease::Lease>,
    /// When a spend last swept this shard for room (`shares.rs`): at most once a second.
    Nanos,
);

impl Tables {
    fn get(&self, (print, space): (Fingerprint, Space)) -> Option<Nanos> {
        self.0[space as usize].get(print)
    }

    fn table(&mut self, space: Space) -> &mut TatTable {
        &mut self.0[space as usize]
    }
}

/// One shard, on its own cache lines so that neighbouring locks do not share one.
#[repr(align(128))]
struct Shard(Mutex<Tables>);

/// TATs in memory, sharded. See the module docs.
pub struct MemoryStore {
    shards: Box<[Shard]>,
    hasher: BucketHasher,
    clock: Arc<dyn Clock>,
    /// Bucket bounds by [`Space`], buckets held (expired ones included, changed under a
    /// shard's lock with the table it counts), each configured name's share, refusals.
    room: shares::Room,
    /// Bound on leases of concurrency limits, and leases held (expired ones included).
    lease_bound: usize,
    leases_held: AtomicUsize,
    /// Leases held per name number, and the bound on each.
    lease_names: lease_shares::NameShares,
    /// Leases taken, released and dropped expired (for the metrics).
    lease_events: crate::LeaseCounters,
    /// The hasher of lease ids (`leases/map.rs`).
    lease_ids: leases::LeaseIdHasher,
}

/// The share of `max_buckets` that caller-given limits may hold, in percent, by default.
pub const DEFAULT_CALLER_SHARE_PERCENT: usize = 10;

impl MemoryStore {
    /// A store with the default bound.
    pub fn new(clock: Arc<dyn Clock>) -> MemoryStore {
        let shards = MemoryStore::shards_for(DEFAULT_MAX_BUCKETS);
        MemoryStore::with_capacity(clock, shards, DEFAULT_MAX_BUCKETS)
    }

    /// The shard count for a bound of `max_buckets`: a power of two, at least
    /// [`DEFAULT_SHARDS`], about 25 000 buckets a shard when full (512 shards at 10^7,
    /// 4 096 at 10^8), at most 8 192.
    pub fn shards_for(max_buckets: usize) -> usize {
        (max_buckets / BUCKETS_PER_SHARD)
            .next_power_of_two()
            .clamp(DEFAULT_SHARDS, MAX_SHARDS)
    }

    /// A store of `shards` shards holding at most about `max_buckets` live buckets, of
    /// which caller-given limits may hold the default share.
    pub fn with_capacity(clock: Arc<dyn Clock>, shards: usize, max_buckets: usize) -> MemoryStore {
        MemoryStore::with_caller_share(clock, shards, max_buckets, DEFAULT_CALLER_SHARE_PERCENT)
    }

    /// As [`MemoryStore::with_capacity`], with `caller_percent` of `max_buckets` for
    /// buckets under caller-given limits and the rest for configured limits.
    pub fn with_caller_share(
        clock: Arc<dyn Clock>,
        shards: usize,
        max_buckets: usize,
        caller_percent: usize,
    ) -> MemoryStore {
        let shards = shards.max(1);
        MemoryStore {
            shards: (0..shards)
                .map(|_| Shard(Mutex::new(Tables::default())))
                .collect(),
            hasher: BucketHasher::random(),
            clock,
            room: shares::Room::new(max_buckets, caller_percent),
            lease_bound: DEFAULT_MAX_LEASES,
            leases_held: AtomicUsize::new(0),
            lease_names: lease_shares::NameShares::new(
                DEFAULT_MAX_LEASES,
                DEFAULT_LEASE_NAME_SHARE_PERCENT,
            ),
            lease_events: Default::default(),
            lease_ids: leases::LeaseIdHasher::random(),
        }
    }

    /// This store (new, empty) with at most `percent` (1 to 100; 100: no share) of the
    /// configured limits' buckets per limit name.
    pub fn with_bucket_name_share(mut self, percent: usize) -> MemoryStore {
        self.room = self.room.with_name_share(percent);
        self
    }

    fn fingerprint(&self, key: &BucketKey) -> (Fingerprint, Space) {
        (self.hasher.hash_one(key).max(MIN_PRINT), Space::of(key))
    }

    /// The shard of a bucket: by the fingerprint's low bits (a table finds its slot by the
    /// high bits).
    fn shard_of(&self, (print, _): (Fingerprint, Space)) -> usize {
        (print % self.shards.len() as u64) as usize
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Tables> {
        // A panic while holding a shard cannot leave a TAT half-written: keep going.
        self.shards[shard].0.lock()
    }

    /// Locks the shards of `keys` in ascending order; returns each key's shard position
    /// in the returned guards.
    fn lock_all(
        &self,
        prints: &[(Fingerprint, Space)],
    ) -> (Vec<MutexGuard<'_, Tables>>, Vec<usize>) {
        let shard_ids: Vec<usize> = prints.iter().map(|&p| self.shard_of(p)).collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&s| self.lock(s)).collect();
        let positions = shard_ids
            .iter()
            .map(|s| order.binary_search(s).unwrap_or(0))
            .collect();
        (guards, positions)
    }

    /// Drops every bucket whose TAT has passed, and every expired lease; returns how many
    /// buckets.
    pub fn sweep(&self) -> usize {
        (0..self.shards.len()).map(|s| self.sweep_shard(s)).sum()
    }

    /// Drops the expired buckets of one shard, holding its lock throughout (the sweeper's
    /// pause for the requests on that shard); returns how many. `shard` < [`Self::shard_count`].
    pub fn sweep_shard(&self, shard: usize) -> usize {
        let mut tables = self.lock(shard);
        let now = self.clock.now();
        // Expired leases go too, uncounted here (the count is of buckets).
        self.sweep_leases(&mut tables, now);
        [Space::Configured, Space::CallerGiven]
            .into_iter()
            .map(|space| self.sweep_table(tables.table(space), space, now))
            .sum()
    }

    /// Drops a shard's expired leases; returns how many.
    fn sweep_leases(&self, tables: &mut Tables, now: Nanos) -> usize {
        let dropped = leases::sweep(&mut tables.1, now);
        self.leases_held.fetch_sub(dropped, Ordering::AcqRel);
        self.lease_events.add(0, 0, dropped as u64);
        dropped
    }

    /// The number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Buckets held, including expired ones not yet swept.
    pub fn live_buckets(&self) -> usize {
        self.room.held()
    }

    /// Buckets of limit name `number` held now, expired ones until dropped (0 for the
    /// numbers that have no name share: 0 and 99).
    pub fn name_buckets(&self, number: u32) -> usize {
        self.room.names.held(number)
    }

    /// Spends refused for want of room so far, by [`Full`].
    pub fn bucket_refusals(&self) -> [u64; 3] {
        self.room.names.refusals()
    }

    /// The stored TAT of `key` (tests and debugging).
    pub fn tat(&self, key: &BucketKey) -> Option<Nanos> {
        let print = self.fingerprint(key);
        self.lock(self.shard_of(print)).get(print)
    }
}

impl Store for MemoryStore {
    fn spend<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Outcome> {
        Box::pin(std::future::ready(self.spend_now(items)))
    }

    fn try_spend_now(&self, items: &[StoreItem]) -> Option<Result<Outcome, StoreError>> {
        Some(self.spend_now(items))
    }

    fn waits(&self) -> bool {
        false
    }

    fn refund<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Vec<Decision>> {
        Box::pin(std::future::ready(Ok(self.refund_now(items))))
    }

    fn reset<'a>(&'a self, keys: &'a [BucketKey]) -> StoreFuture<'a, u32> {
        Box::pin(std::future::ready(Ok(self.reset_now(keys))))
    }

    fn sweep(&self) -> usize {
        MemoryStore::sweep(self)
    }

    fn live_buckets(&self) -> Option<usize> {
        Some(MemoryStore::live_buckets(self))
    }

    fn bucket_refusals(&self) -> [u64; 3] {
        MemoryStore::bucket_refusals(self)
    }

    fn lease_events(&self) -> crate::LeaseEvents {
        self.lease_events.get()
    }

    fn in_flight(&self, per_name: usize, only: Option<u32>) -> Option<Vec<crate::InFlightName>> {
        Some(MemoryStore::in_flight(self, per_name, only))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::{FakeClock, SECOND};
    use cellrate_core::gcra::{Limit, Mode};

    pub(super) const T0: Nanos = 1_700_000_000 * SECOND;

    pub(super) fn item(key: &str, cost: u64) -> StoreItem {
        StoreItem {
            key: BucketKey::new(100, key),
            limit: Limit::new(2, 2, SECOND).unwrap(),
            cost,
            mode: Mode::CheckAndSpend,
            lease: None,
        }
    }

    /// A spend refused for want of room: denied with nothing offered, not an error.
    fn refused(out: Result<Outcome, StoreError>) -> bool {
        let out = out.expect("a decision, never an error");
        !out.allowed && out.decisions.iter().any(|d| !d.allowed && d.remaining == 0)
    }

    /// The bound is exact across shards: with 1 000 and 128 shards, 1 000 distinct ids are
    /// held (per-shard bounds of 8 refused the 374th on 2026-11-25), the next is refused,
    /// and a key named twice in a batch counts once.
    #[test]
    fn max_buckets_holds_exactly_that_many_across_shards() {
        let clock = FakeClock::new(T0);
        let store = MemoryStore::with_caller_share(Arc::new(clock.clone()), 128, 1_000, 0)
            .with_bucket_name_share(100);
        for n in 0..1_000 {
            let out = store.spend_now(&[item(&format!("id-{n}"), 1)]);
            assert!(out.unwrap().allowed, "id {n} refused");
        }
        assert_eq!(store.live_buckets(), 1_000);
        assert!(refused(store.spend_now(&[item("one-more", 1)])));
        assert!(refused(store.spend_now(&[item("x", 1), item("x", 1)])));
        assert_eq!(store.bucket_refusals(), [2, 0, 0]);
        // Room again once buckets expire and are swept; a repeated key is one bucket.
        clock.advance(2 * SECOND);
        assert_eq!(store.sweep(), 1_000);
        assert_eq!(store.live_buckets(), 0);
        assert!(
            store
                .spend_now(&[item("x", 1), item("x", 1)])
                .unwrap()
                .allowed
        );
        assert_eq!(store.live_buckets(), 1);
        store.reset_now(&[item("x", 1).key]);
        assert_eq!(store.live_buckets(), 0);
    }

    #[test]
    fn caller_given_buckets_have_their_own_share() {
        let clock = FakeClock::new(T0);
        // 100 buckets, 10 % for caller-given limits, one shard so the bound is exact.
        let store = MemoryStore::with_caller_share(Arc::new(clock.clone()), 1, 100, 10)
            .with_bucket_name_share(100);
        let limit = Limit::new(1, 1, 3_600 * SECOND).unwrap();
        let caller = |i: usize| StoreItem {
            key: BucketKey::caller_given('i', &limit, &format!("k{i}")),
            limit,
            cost: 1,
            mode: Mode::CheckAndSpend,
            lease: None,
        };
        for i in 0..10 {
            assert!(store.spend_now(&[caller(i)]).unwrap().allowed);
        }
        assert!(refused(store.spend_now(&[caller(10)])));
        assert_eq!(store.bucket_refusals(), [0, 0, 1]);
        // Configured limits keep their 90 buckets while the caller share is full.
        for i in 0..90 {
            assert!(
                store
                    .spend_now(&[item(&format!("c{i}"), 1)])
                    .unwrap()
                    .allowed,
                "{i}"
            );
        }
        assert!(refused(store.spend_now(&[item("c90", 1)])));
        // A batch mixing both spaces is denied whole when one space is full.
        assert!(refused(store.spend_now(&[item("c0", 1), caller(11)])));
        assert_eq!(store.live_buckets(), 100);
        // Resetting a caller bucket makes room in its space only.
        assert_eq!(store.reset_now(&[caller(0).key]), 1);
        assert!(store.spend_now(&[caller(11)]).unwrap().allowed);
    }

    #[test]
    fn sweep_drops_only_expired_buckets() {
        let clock = FakeClock::new(T0);
        let store = MemoryStore::new(Arc::new(clock.clone()));
        store.spend_now(&[item("short", 1)]).unwrap();
        store.spend_now(&[item("long", 2)]).unwrap();
        clock.advance(SECOND / 2);
        assert_eq!(store.sweep(), 1);
        assert_eq!(store.tat(&item("long", 1).key), Some(T0 + SECOND));
        assert_eq!(store.tat(&item("short", 1).key), None);
    }

    #[test]
    fn churn_does_not_grow_the_tables() {
        // 1 000 new keys a second, each bucket living 10 s: about 10 000 live. Were tombstones
        // not dropped, the table would grow with every key ever seen (300 000).
        let clock = Arc::new(FakeClock::new(T0));
        let store = MemoryStore::with_capacity(clock.clone(), 1, 1_000_000);
        let limit = Limit::new(1, 1, 10 * SECOND).unwrap();
        let mut largest = 0;
        for second in 0..300u64 {
            let items: Vec<StoreItem> = (0..1000)
                .map(|i| StoreItem {
                    key: BucketKey::new(100, &format!("{second}-{i}")),
                    limit,
                    cost: 1,
                    mode: Mode::CheckAndSpend,
                    lease: None,
                })
                .collect();
            for item in &items {
                assert!(store.spend_now(std::slice::from_ref(item)).unwrap().allowed);
            }
            store.sweep();
            largest = largest.max(store.lock(0).0[0].slots());
            clock.advance(SECOND);
        }
        let live = store.live_buckets();
        assert!((9_000..=11_000).contains(&live), "{live} live");
        // At most 11 000 live at the rebuilt load (55 %): under twice the live buckets.
        assert!(largest < 22_000, "a table grew to {largest} slots");
    }
}
