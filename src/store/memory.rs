//! The in-memory store: TATs in a fixed number of mutex-guarded shards, each an
//! open-addressing table (`TatTable`, in `table.rs`) keyed by a 64-bit keyed hash of the bucket key: 16
//! bytes a slot whatever the id's length, 20-29 bytes of table a live bucket. The
//! number of shards grows with the bound on buckets ([`MemoryStore::shards_for`]), so that
//! a shard stays small enough to sweep in well under a millisecond.
//!
//! A batch locks the shards its keys fall in, in ascending shard order (so overlapping
//! batches cannot deadlock), decides with [`crate::gcra::spend_batch`] and writes before
//! unlocking: batches are atomic without a global lock, and batches on disjoint shards run
//! in parallel.
//!
//! Expired buckets (TAT <= now) are full buckets and carry no information; [`MemoryStore::sweep`]
//! drops them (the app runs it on a timer).
//!
//! **Bound on live buckets.** Each shard holds at most `max_buckets / shards` (rounded up)
//! buckets. Buckets under caller-given limits ([`BucketKey::is_caller_given`]) live in
//! tables of their own with their own bound (a share of `max_buckets`), so that callers
//! who choose their own limits cannot crowd out the configured ones. A batch that would create buckets in a full shard first sweeps that shard's
//! expired buckets; if it is still full, the batch fails with a transient [`StoreError`]
//! ("bucket capacity reached"), which the service answers with UNAVAILABLE, and writes
//! nothing. Existing buckets keep working, denials and refunds are unaffected. Envoy's
//! `failure_mode_deny` then decides whether such requests pass.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::clock::{Clock, Nanos};
use crate::gcra::{self, BatchItem, Decision};
use crate::limits::names::BucketKey;
use crate::store::table::{TatTable, MIN_PRINT};
use crate::store::{Outcome, Store, StoreError, StoreFuture, StoreItem};

/// The least number of shards: enough that two batches rarely meet.
pub const DEFAULT_SHARDS: usize = 128;

/// Buckets per shard that [`MemoryStore::shards_for`] aims at: a sweep of a shard this full
/// holds its lock for a few hundred microseconds at most (BENCHMARKS.md).
const BUCKETS_PER_SHARD: usize = 25_000;

/// The most shards [`MemoryStore::shards_for`] chooses.
const MAX_SHARDS: usize = 8_192;

/// Default bound on live buckets.
pub const DEFAULT_MAX_BUCKETS: usize = 10_000_000;

/// A bucket key's 64-bit keyed hash (SipHash-1-3 with process-random keys), stored instead
/// of the key: 8 bytes whatever the id's length, and no allocation per bucket. Two distinct
/// keys share a bucket only if their hashes collide: with 10 M live buckets a chance of
/// about 3 in a million that any two do, with 100 M about 3 in ten thousand; the keys are
/// secret, so callers cannot aim for it (see docs/operations.md, "Sizing").
type Fingerprint = u64;

/// Which table of a shard a bucket lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Space {
    Configured = 0,
    CallerGiven = 1,
}

impl Space {
    fn of(key: &BucketKey) -> Space {
        if key.is_caller_given() {
            Space::CallerGiven
        } else {
            Space::Configured
        }
    }
}

/// A shard's tables, one per [`Space`].
#[derive(Default)]
struct Tables([TatTable; 2]);

impl Tables {
    fn get(&self, (print, space): (Fingerprint, Space)) -> Option<Nanos> {
        self.0[space as usize].get(print)
    }

    fn table(&mut self, space: Space) -> &mut TatTable {
        &mut self.0[space as usize]
    }

    fn len(&self) -> usize {
        self.0.iter().map(TatTable::len).sum()
    }
}

/// One shard, on its own cache lines so that neighbouring locks do not share one.
#[repr(align(128))]
struct Shard(Mutex<Tables>);

/// TATs in memory, sharded. See the module docs.
pub struct MemoryStore {
    shards: Box<[Shard]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    /// Bucket bound per shard, by [`Space`].
    per_shard: [usize; 2],
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
        let caller = (max_buckets as u128 * caller_percent.min(100) as u128 / 100) as usize;
        let configured = max_buckets - caller;
        MemoryStore {
            shards: (0..shards)
                .map(|_| Shard(Mutex::new(Tables::default())))
                .collect(),
            hasher: RandomState::new(),
            clock,
            per_shard: [
                configured.div_ceil(shards).max(1),
                caller.div_ceil(shards).max(1),
            ],
        }
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
        self.shards[shard]
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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

    /// Decides a batch now (the synchronous core of [`Store::spend`]).
    pub fn spend_now(&self, items: &[StoreItem]) -> Result<Outcome, StoreError> {
        if let [item] = items {
            return self.spend_one(item);
        }
        let prints: Vec<(Fingerprint, Space)> =
            items.iter().map(|i| self.fingerprint(&i.key)).collect();
        let (mut guards, positions) = self.lock_all(&prints);
        let now = self.clock.now();
        let tats: Vec<Option<Nanos>> = prints
            .iter()
            .zip(&positions)
            .map(|(&print, &p)| guards[p].get(print))
            .collect();
        let batch: Vec<BatchItem<'_>> = items
            .iter()
            .map(|i| BatchItem {
                limit: &i.limit,
                cost: i.cost,
                mode: i.mode,
            })
            .collect();
        let out = gcra::spend_batch(now, &batch, &tats);
        self.make_room(&mut guards, &prints, &positions, &tats, &out.writes, now)?;
        for ((&(print, space), &p), write) in prints.iter().zip(&positions).zip(&out.writes) {
            if let Some(tat) = *write {
                guards[p].table(space).insert(print, tat);
            }
        }
        Ok(Outcome {
            allowed: out.allowed,
            decisions: out.decisions,
        })
    }

    /// The single-item batch (most requests): one shard lock, one hash lookup for an
    /// existing bucket, no bookkeeping vectors.
    fn spend_one(&self, item: &StoreItem) -> Result<Outcome, StoreError> {
        let (print, space) = self.fingerprint(&item.key);
        let mut tables = self.lock(self.shard_of((print, space)));
        let shard = tables.table(space);
        let now = self.clock.now();
        let batch = [BatchItem {
            limit: &item.limit,
            cost: item.cost,
            mode: item.mode,
        }];
        let out = match shard.get_mut(print) {
            Some(stored) => {
                let out = gcra::spend_batch(now, &batch, &[Some(*stored)]);
                if let Some(tat) = out.writes[0] {
                    *stored = tat;
                }
                out
            }
            None => {
                let out = gcra::spend_batch(now, &batch, &[None]);
                if let Some(tat) = out.writes[0] {
                    if shard.len() >= self.per_shard[space as usize] {
                        shard.sweep(now);
                        if shard.len() >= self.per_shard[space as usize] {
                            return Err(self.full(space));
                        }
                    }
                    shard.insert(print, tat);
                }
                out
            }
        };
        Ok(Outcome {
            allowed: out.allowed,
            decisions: out.decisions,
        })
    }

    fn full(&self, space: Space) -> StoreError {
        StoreError::Capacity(match space {
            Space::Configured => format!(
                "bucket capacity reached ({} live buckets per shard)",
                self.per_shard[0]
            ),
            Space::CallerGiven => format!(
                "bucket capacity for caller-given limits reached ({} live buckets per shard)",
                self.per_shard[1]
            ),
        })
    }

    /// Checks that every shard receiving new buckets has room, sweeping it if not.
    fn make_room(
        &self,
        guards: &mut [MutexGuard<'_, Tables>],
        prints: &[(Fingerprint, Space)],
        positions: &[usize],
        tats: &[Option<Nanos>],
        writes: &[Option<Nanos>],
        now: Nanos,
    ) -> Result<(), StoreError> {
        let mut new_per_guard = vec![[0usize; 2]; guards.len()];
        for (((&p, (_, space)), tat), write) in positions.iter().zip(prints).zip(tats).zip(writes) {
            if tat.is_none() && write.is_some() {
                new_per_guard[p][*space as usize] += 1;
            }
        }
        for (guard, new) in guards.iter_mut().zip(new_per_guard) {
            for space in [Space::Configured, Space::CallerGiven] {
                let (new, bound) = (new[space as usize], self.per_shard[space as usize]);
                let table = guard.table(space);
                if new > 0 && table.len() + new > bound {
                    table.sweep(now);
                    if table.len() + new > bound {
                        return Err(self.full(space));
                    }
                }
            }
        }
        Ok(())
    }

    /// Refunds a batch now (the synchronous core of [`Store::refund`]).
    pub fn refund_now(&self, items: &[StoreItem]) -> Vec<Decision> {
        let prints: Vec<(Fingerprint, Space)> =
            items.iter().map(|i| self.fingerprint(&i.key)).collect();
        let (mut guards, positions) = self.lock_all(&prints);
        let now = self.clock.now();
        items
            .iter()
            .zip(&prints)
            .zip(&positions)
            .map(|((item, &(print, space)), &p)| {
                let shard = guards[p].table(space);
                let (decision, write) = gcra::refund(&item.limit, now, shard.get(print), item.cost);
                match write {
                    // Refunded to full: a full bucket is no bucket.
                    Some(tat) if tat <= now => {
                        shard.remove(print);
                    }
                    Some(tat) => {
                        if let Some(stored) = shard.get_mut(print) {
                            *stored = tat;
                        }
                    }
                    None => {}
                }
                decision
            })
            .collect()
    }

    /// Deletes buckets now; returns how many were not full.
    pub fn reset_now(&self, keys: &[BucketKey]) -> u32 {
        let prints: Vec<(Fingerprint, Space)> = keys.iter().map(|k| self.fingerprint(k)).collect();
        let (mut guards, positions) = self.lock_all(&prints);
        let now = self.clock.now();
        prints
            .iter()
            .zip(&positions)
            .filter(|(&(print, space), &p)| {
                guards[p]
                    .table(space)
                    .remove(print)
                    .is_some_and(|tat| tat > now)
            })
            .count() as u32
    }

    /// Drops every bucket whose TAT has passed; returns how many.
    pub fn sweep(&self) -> usize {
        (0..self.shards.len()).map(|s| self.sweep_shard(s)).sum()
    }

    /// Drops the expired buckets of one shard, holding its lock throughout (the sweeper's
    /// pause for the requests on that shard); returns how many. `shard` < [`Self::shard_count`].
    pub fn sweep_shard(&self, shard: usize) -> usize {
        let mut tables = self.lock(shard);
        let now = self.clock.now();
        tables.0.iter_mut().map(|t| t.sweep(now)).sum()
    }

    /// The number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Buckets held, including expired ones not yet swept.
    pub fn live_buckets(&self) -> usize {
        (0..self.shards.len()).map(|s| self.lock(s).len()).sum()
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{FakeClock, SECOND};
    use crate::gcra::{Limit, Mode};

    const T0: Nanos = 1_700_000_000 * SECOND;

    fn item(key: &str, cost: u64) -> StoreItem {
        StoreItem {
            key: BucketKey::new(100, key),
            limit: Limit::new(2, 2, SECOND).unwrap(),
            cost,
            mode: Mode::CheckAndSpend,
        }
    }

    #[test]
    fn bound_is_enforced_after_sweeping_and_writes_nothing() {
        let clock = FakeClock::new(T0);
        let store = MemoryStore::with_capacity(Arc::new(clock.clone()), 1, 2);
        assert!(store.spend_now(&[item("a", 1)]).unwrap().allowed);
        assert!(store.spend_now(&[item("b", 1)]).unwrap().allowed);
        let err = store.spend_now(&[item("a", 1), item("c", 1)]).unwrap_err();
        assert!(
            matches!(&err, StoreError::Capacity(m) if m.contains("capacity")),
            "{err}"
        );
        // Nothing of the failed batch was written: "a" still has one token left.
        assert_eq!(store.tat(&item("a", 1).key), Some(T0 + SECOND / 2));
        // Existing buckets keep working; a denial needs no room.
        assert!(store.spend_now(&[item("a", 1)]).unwrap().allowed);
        assert!(!store.spend_now(&[item("a", 1)]).unwrap().allowed);
        // Once buckets expire there is room again, without waiting for the sweeper.
        clock.advance(2 * SECOND);
        assert!(store.spend_now(&[item("c", 1)]).unwrap().allowed);
        assert_eq!(store.live_buckets(), 1);
    }

    #[test]
    fn caller_given_buckets_have_their_own_share() {
        let clock = FakeClock::new(T0);
        // 100 buckets, 10 % for caller-given limits, one shard so the bound is exact.
        let store = MemoryStore::with_caller_share(Arc::new(clock.clone()), 1, 100, 10);
        let limit = Limit::new(1, 1, 3_600 * SECOND).unwrap();
        let caller = |i: usize| StoreItem {
            key: BucketKey::caller_given('i', &limit, &format!("k{i}")),
            limit,
            cost: 1,
            mode: Mode::CheckAndSpend,
        };
        for i in 0..10 {
            assert!(store.spend_now(&[caller(i)]).unwrap().allowed);
        }
        let err = store.spend_now(&[caller(10)]).unwrap_err();
        assert!(err.to_string().contains("caller-given"), "{err}");
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
        assert!(store.spend_now(&[item("c90", 1)]).is_err());
        // A batch mixing both spaces is refused whole when one space is full.
        let mixed = store.spend_now(&[item("c0", 1), caller(11)]);
        assert!(mixed.is_err());
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
    fn refund_to_full_removes_the_bucket_and_reset_counts_live_ones() {
        let clock = FakeClock::new(T0);
        let store = MemoryStore::new(Arc::new(clock.clone()));
        store.spend_now(&[item("a", 1), item("b", 1)]).unwrap();
        let d = store.refund_now(&[item("a", 5), item("never", 1)]);
        assert!(d[0].allowed && !d[1].allowed);
        assert_eq!(store.tat(&item("a", 1).key), None);
        assert_eq!(store.tat(&item("never", 1).key), None);
        let keys = [item("a", 1).key, item("b", 1).key];
        assert_eq!(store.reset_now(&keys), 1);
        assert_eq!(store.live_buckets(), 0);
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
