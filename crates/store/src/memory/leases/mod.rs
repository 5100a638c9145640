//! The memory store's leases of concurrency limits (docs/concurrency.md): per shard, a map
//! from a key's fingerprint to its leases, each a keyed hash of its lease id
//! ([`LeaseIdHasher`]) and its expiry. A batch
//! holding a lease item is decided here under the same shard locks as its rate items, so
//! it stays atomic and all-or-nothing: the acquires are decided first, and the rate items
//! are spent only if every acquire is allowed (and the other way round).
//!
//! **Bounds.** At most `lease_bound` leases in all (expired ones count until dropped), besides
//! the buckets' bound; at most a share of that per name number ([`NameShares`]), so that
//! a client choosing fresh ids of one limit cannot fill the table for every other limit;
//! at most `count` a key by the arithmetic. A batch that would take leases beyond a bound
//! first drops the expired leases of the shards it holds, then is denied (its acquires
//! [`lease::refused`], nothing written; counted as `refused`): never an error, which
//! Envoy's `failure_mode_deny: false` would let through. Leases held are never pushed out.
//!
//! Its parts: a shard's map of leases (`map.rs`: its hashers, a key's leases, the sweep),
//! a request of one lease item (`one.rs`: most are, and the shard's spare list they use),
//! the ranking of keys by leases held for admin `Top` in flight (`in_flight.rs`); here,
//! the decision of a batch holding lease items.

use parking_lot::MutexGuard;
use std::sync::atomic::Ordering;

use super::lease_shares::Share;
use super::{Fingerprint, MemoryStore, Space, Tables};
use crate::{Outcome, StoreError, StoreItem};
use cellrate_core::clock::Nanos;
use cellrate_core::gcra::lease::{self, Lease, LeaseWrite};
use cellrate_core::gcra::{self, BatchItem, Decision, Mode, Window};

mod in_flight;
mod map;
mod one;
use map::Held;
#[cfg(feature = "redis")]
pub(crate) use map::PrintHasher;
pub(super) use map::{sweep, LeaseIdHasher, LeaseMap};

/// The default bound on leases held in all.
pub const DEFAULT_MAX_LEASES: usize = 1_000_000;

/// Whether an item names a concurrency limit's key (its leases, not a TAT).
pub(super) fn is_lease(item: &StoreItem) -> bool {
    item.limit.window() == Window::Concurrency
}

/// The leases a key holds in a shard (expired ones included).
fn held_by(tables: &Tables, print: Fingerprint) -> &[Lease] {
    tables.1.get(&print).map_or(&[], |h| h.leases.as_slice())
}

/// A lease item's decision and write against `held`, its key's leases as they stand, for
/// the hash of its lease id. An item in any other mode (a probe of a batch known to be
/// denied) reports the key.
fn decide(
    item: &StoreItem,
    now: Nanos,
    held: &[Lease],
    id: Option<u64>,
) -> (Decision, Option<LeaseWrite>) {
    match (item.mode, id) {
        (Mode::Acquire, Some(id)) => lease::acquire(&item.limit, now, held, id),
        (Mode::Release, Some(id)) => lease::release(&item.limit, now, held, id),
        _ => (lease::peek(&item.limit, now, held), None),
    }
}

/// The count of an item's limit, as a key's leases keep it (at most
/// `MAX_LEASES_PER_KEY`: fits).
fn count_of(item: &StoreItem) -> u32 {
    item.limit.count().min(u64::from(u32::MAX)) as u32
}

/// A batch's lease decisions: per item, for lease items, the decision and the write.
type Leased = Vec<Option<(Decision, Option<LeaseWrite>)>>;

impl MemoryStore {
    /// Decides a batch that holds lease items (the lease-aware core of `spend_now`).
    pub(super) fn spend_with_leases(&self, items: &[StoreItem]) -> Result<Outcome, StoreError> {
        let prints: Vec<(Fingerprint, Space)> =
            items.iter().map(|i| self.fingerprint(&i.key)).collect();
        let (mut guards, positions) = self.lock_all(&prints);
        let now = self.clock.now();
        // The leases first: whether every acquire may take its lease.
        let mut leased: Leased = items
            .iter()
            .zip(&prints)
            .zip(&positions)
            .map(|((item, &(print, _)), &p)| {
                is_lease(item).then(|| self.decide_lease(&guards[p], print, item, now))
            })
            .collect();
        let acquired = items
            .iter()
            .zip(&leased)
            .all(|(item, decided)| match decided {
                Some((d, _)) if item.mode == Mode::Acquire => d.allowed,
                _ => true,
            });
        // Then the rates, denied unless the acquires are allowed.
        let rates: Vec<usize> = (0..items.len()).filter(|&i| leased[i].is_none()).collect();
        let tats: Vec<Option<Nanos>> = rates
            .iter()
            .map(|&i| guards[positions[i]].get(prints[i]))
            .collect();
        let batch: Vec<BatchItem<'_>> = rates
            .iter()
            .map(|&i| BatchItem {
                limit: &items[i].limit,
                cost: items[i].cost,
                mode: items[i].mode,
            })
            .collect();
        let mut out = gcra::spend_batch_with(now, &batch, &tats, acquired);
        // An acquire of a denied batch takes nothing: it reports the key as it stands.
        if !out.allowed {
            self.acquire_nothing(items, &prints, &positions, &guards, &mut leased, now, false);
        }
        // The new leases, counted against the bounds: a batch that they do not fit is
        // denied as a full key would deny it (nothing written; never an error, which
        // Envoy's default would let through).
        let reserved = self.reserve_leases(&mut guards, items, &prints, &positions, &leased, now);
        let shares = reserved.unwrap_or_else(|| {
            out = gcra::spend_batch_with(now, &batch, &tats, false);
            self.acquire_nothing(items, &prints, &positions, &guards, &mut leased, now, true);
            Vec::new()
        });
        let rate_prints: Vec<(Fingerprint, Space)> = rates.iter().map(|&i| prints[i]).collect();
        let key = |k: usize| &items[rates[k]].key;
        let was_allowed = out.allowed;
        let rooms = self.make_room(&mut guards, key, &rate_prints, &batch, &tats, &mut out, now);
        // A rate refused room denies the batch: its acquires take nothing either.
        let shares = match (was_allowed, out.allowed) {
            (true, false) => {
                for share in shares.iter().flatten() {
                    self.leases_dropped(share, 1);
                }
                self.acquire_nothing(items, &prints, &positions, &guards, &mut leased, now, false);
                Vec::new()
            }
            _ => shares,
        };
        for (k, &i) in rates.iter().enumerate() {
            if let Some(tat) = out.writes[k] {
                let (print, space) = prints[i];
                let table = guards[positions[i]].table(space);
                self.write(table, (print, space), tat, rooms[k]);
            }
        }
        Ok(self.finish(
            items,
            &prints,
            &positions,
            &mut guards,
            leased,
            out,
            &shares,
            now,
        ))
    }

    /// Turns a batch's acquires into reports of their keys, taking nothing: as they stand
    /// (a denied batch), or `refused` (the leases do not fit the bounds) for those that
    /// would have taken a lease.
    #[allow(clippy::too_many_arguments)]
    fn acquire_nothing(
        &self,
        items: &[StoreItem],
        prints: &[(Fingerprint, Space)],
        positions: &[usize],
        guards: &[MutexGuard<'_, Tables>],
        leased: &mut Leased,
        now: Nanos,
        refused: bool,
    ) {
        for (i, decided) in leased.iter_mut().enumerate() {
            if let Some((decision, write)) = decided {
                if items[i].mode == Mode::Acquire {
                    let held = held_by(&guards[positions[i]], prints[i].0);
                    *decision = match (refused, &write) {
                        (true, Some(LeaseWrite::Add(_))) => {
                            lease::refused(&items[i].limit, now, held)
                        }
                        _ => lease::peek(&items[i].limit, now, held),
                    };
                    *write = None;
                }
            }
        }
        if refused {
            self.lease_events.refused();
        }
    }

    /// Writes a decided batch's leases (`shares`: per item, the name count its new lease
    /// was reserved in) and returns its outcome, the decisions in order.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        items: &[StoreItem],
        prints: &[(Fingerprint, Space)],
        positions: &[usize],
        guards: &mut [MutexGuard<'_, Tables>],
        leased: Leased,
        out: gcra::BatchOutcome,
        shares: &[Option<Share>],
        now: Nanos,
    ) -> Outcome {
        let mut rate_decisions = out.decisions.into_iter();
        let mut decisions = Vec::with_capacity(items.len());
        let (mut adds, mut change, mut released) = (0i64, 0i64, 0i64);
        for (i, decided) in leased.into_iter().enumerate() {
            match decided {
                Some((decision, write)) => {
                    let (print, _) = prints[i];
                    adds += i64::from(matches!(write, Some(LeaseWrite::Add(_))));
                    released += i64::from(matches!(write, Some(LeaseWrite::Remove(_))));
                    let tables = &mut guards[positions[i]];
                    let share = shares.get(i).cloned().flatten();
                    change += self.write_lease(tables, print, &items[i], now, write, share);
                    decisions.push(decision);
                }
                None => decisions.push(rate_decisions.next().unwrap_or(DENIED)),
            }
        }
        let expired = (adds - released - change).max(0);
        self.lease_events
            .add(adds as u64, released as u64, expired as u64);
        Outcome {
            allowed: out.allowed,
            decisions,
        }
    }

    /// A lease item's decision and write against the key's leases as they stand
    /// ([`decide`]).
    fn decide_lease(
        &self,
        tables: &Tables,
        print: Fingerprint,
        item: &StoreItem,
        now: Nanos,
    ) -> (Decision, Option<LeaseWrite>) {
        let id = item.lease.as_deref().map(|id| self.lease_ids.hash(id));
        decide(item, now, held_by(tables, print), id)
    }

    /// Applies `item`'s write to its key's leases (dropping its expired ones, from the
    /// counts too); returns the change in leases held. `share`: where an added lease was
    /// counted.
    fn write_lease(
        &self,
        tables: &mut Tables,
        print: Fingerprint,
        item: &StoreItem,
        now: Nanos,
        write: Option<LeaseWrite>,
        share: Option<Share>,
    ) -> i64 {
        let adds = i64::from(matches!(write, Some(LeaseWrite::Add(_))));
        let Some(held) = (match (write, share) {
            (Some(LeaseWrite::Add(_)), Some(share)) => {
                let count = count_of(item);
                let held = tables.1.entry(print).or_insert_with(|| Held {
                    key: item.key.clone(),
                    count,
                    share,
                    leases: Vec::with_capacity(1),
                });
                held.count = count;
                Some(held)
            }
            _ => tables.1.get_mut(&print),
        }) else {
            return 0;
        };
        let change = lease::apply(&mut held.leases, now, write);
        self.leases_dropped(&held.share, (adds - change).max(0) as usize);
        if held.leases.is_empty() {
            tables.1.remove(&print);
        }
        change
    }

    /// Counts a batch's new leases against the bounds (the whole table's and each one's
    /// name's), dropping the expired leases of the held shards if they do not fit; returns
    /// per item the count its new lease is in, or `None` (counting nothing) if they still
    /// do not fit.
    fn reserve_leases(
        &self,
        guards: &mut [MutexGuard<'_, Tables>],
        items: &[StoreItem],
        prints: &[(Fingerprint, Space)],
        positions: &[usize],
        leased: &Leased,
        now: Nanos,
    ) -> Option<Vec<Option<Share>>> {
        let shares: Vec<Option<Share>> = leased
            .iter()
            .enumerate()
            .map(|(i, decided)| match decided {
                Some((_, Some(LeaseWrite::Add(_)))) => {
                    Some(match guards[positions[i]].1.get(&prints[i].0) {
                        Some(held) => held.share.clone(),
                        None => self.lease_names.of(items[i].key.parts().0),
                    })
                }
                _ => None,
            })
            .collect();
        if self.reserve_all(&shares) {
            return Some(shares);
        }
        for guard in guards.iter_mut() {
            let dropped = sweep(&mut guard.1, now);
            self.leases_held.fetch_sub(dropped, Ordering::AcqRel);
            self.lease_events.add(0, 0, dropped as u64);
        }
        self.reserve_all(&shares).then_some(shares)
    }

    /// Leases held, including expired ones not yet dropped.
    pub fn live_leases(&self) -> usize {
        self.leases_held.load(Ordering::Acquire)
    }
}

/// What a store that broke its own count would report (never: one decision per rate item).
const DENIED: Decision = Decision {
    allowed: false,
    remaining: 0,
    retry_in: 0,
    reset_in: 0,
};

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use cellrate_core::clock::{FakeClock, SECOND};
    use cellrate_core::gcra::Limit;
    use cellrate_limits::names::BucketKey;

    pub(super) const T0: Nanos = 1_700_000_000 * SECOND;
    pub(super) const HOLD: Nanos = 30 * SECOND;

    pub(super) fn store(clock: &FakeClock) -> MemoryStore {
        MemoryStore::with_capacity(Arc::new(clock.clone()), 4, 1_000)
    }

    pub(super) fn lease(key: &str, n: u64, mode: Mode, id: &str) -> StoreItem {
        let limit = Limit::concurrency(n, HOLD).unwrap();
        StoreItem {
            key: BucketKey::windowed(100, key, limit.window()),
            limit,
            cost: 1,
            mode,
            lease: Some(Arc::from(id)),
        }
    }

    pub(super) fn one(store: &MemoryStore, item: StoreItem) -> Decision {
        store.spend_now(&[item]).unwrap().decisions[0]
    }

    /// N acquires, the next denied; a release frees one, a repeated one nothing; a leaked
    /// lease is back after the hold, and the sweeper drops it from the count.
    #[test]
    fn acquire_release_and_expiry_on_the_store() {
        let clock = FakeClock::new(T0);
        let store = store(&clock);
        for i in 0..3 {
            assert!(one(&store, lease("t", 3, Mode::Acquire, &format!("r{i}"))).allowed);
        }
        let denied = one(&store, lease("t", 3, Mode::Acquire, "r3"));
        assert_eq!((denied.allowed, denied.remaining), (false, 0));
        assert_eq!(denied.retry_in, HOLD);
        assert!(
            one(&store, lease("t", 3, Mode::Acquire, "r0")).allowed,
            "a retry"
        );
        assert_eq!(store.live_leases(), 3);
        let freed = one(&store, lease("t", 3, Mode::Release, "r1"));
        assert_eq!((freed.allowed, freed.remaining), (true, 1));
        assert!(!one(&store, lease("t", 3, Mode::Release, "r1")).allowed);
        assert!(!one(&store, lease("t", 3, Mode::Release, "never")).allowed);
        assert_eq!(store.live_leases(), 2);
        clock.advance(HOLD);
        assert_eq!(store.sweep(), 0, "no buckets");
        assert_eq!(
            store.live_leases(),
            0,
            "the sweeper dropped the expired leases"
        );
        assert_eq!(one(&store, lease("t", 3, Mode::Acquire, "r9")).remaining, 2);
        // Counted: r0, r1, r2 and r9 taken (the retry of r0 is none), r1 released, r0 and
        // r2 dropped expired.
        let events = crate::Store::lease_events(&store);
        assert_eq!(
            (events.acquired, events.released, events.expired),
            (4, 1, 2)
        );
    }

    /// A denied batch acquires nothing, and an acquire that is denied spends no rate.
    #[test]
    fn batches_with_leases_are_all_or_nothing() {
        let clock = FakeClock::new(T0);
        let store = store(&clock);
        let rate = |cost| StoreItem {
            key: BucketKey::new(101, "t"),
            limit: Limit::new(2, 2, SECOND).unwrap(),
            cost,
            mode: Mode::CheckAndSpend,
            lease: None,
        };
        let key = BucketKey::new(101, "t");
        // The rate cannot pay 3: the acquire does not happen.
        let out = store
            .spend_now(&[lease("t", 1, Mode::Acquire, "a"), rate(3)])
            .unwrap();
        assert!(!out.allowed);
        assert_eq!(store.live_leases(), 0);
        assert_eq!(out.decisions[0].remaining, 1, "the key as it stands");
        // Both fit: both written.
        let out = store
            .spend_now(&[lease("t", 1, Mode::Acquire, "a"), rate(1)])
            .unwrap();
        assert!(out.allowed);
        assert_eq!(
            (store.live_leases(), store.tat(&key)),
            (1, Some(T0 + SECOND / 2))
        );
        // The key is full: the rate is not spent.
        let out = store
            .spend_now(&[lease("t", 1, Mode::Acquire, "b"), rate(1)])
            .unwrap();
        assert!(!out.allowed);
        assert_eq!(store.tat(&key), Some(T0 + SECOND / 2));
        // A release is applied whatever the batch decides.
        let out = store
            .spend_now(&[lease("t", 1, Mode::Release, "a"), rate(2)])
            .unwrap();
        assert!(!out.allowed && out.decisions[0].allowed);
        assert_eq!(store.live_leases(), 0);
    }

    /// Fresh ids on one key never pass its count; fresh keys stop at the store's bound,
    /// denied (never an error: Envoy would let an error through), nothing written, without
    /// pushing out the leases already held; a refused acquire of a batch spends nothing.
    #[test]
    fn a_flood_of_fresh_ids_is_bounded_per_key_and_in_all() {
        let clock = FakeClock::new(T0);
        let store = store(&clock).with_lease_bounds(50, 100);
        assert!(one(&store, lease("victim", 5, Mode::Acquire, "v1")).allowed);
        let allowed = (0..1_000)
            .filter(|i| {
                one(
                    &store,
                    lease("attacker", 5, Mode::Acquire, &format!("x{i}")),
                )
                .allowed
            })
            .count();
        assert_eq!(allowed, 5);
        let mut refused = 0;
        for i in 0..1_000 {
            let out = store.spend_now(&[lease(&format!("k{i}"), 5, Mode::Acquire, "x")]);
            let out = out.expect("a full table denies, never fails");
            if !out.allowed {
                let d = out.decisions[0];
                assert_eq!((d.remaining, d.retry_in), (0, HOLD), "no slot offered");
                refused += 1;
            }
        }
        assert_eq!((store.live_leases(), refused), (50, 1_000 - 44));
        assert_eq!(crate::Store::lease_events(&store).refused, 956);
        // In a batch: the acquire is refused and the rate beside it not spent.
        let rate = StoreItem {
            key: BucketKey::new(101, "r"),
            limit: Limit::new(5, 5, SECOND).unwrap(),
            cost: 1,
            mode: Mode::CheckAndSpend,
            lease: None,
        };
        let out = store
            .spend_now(&[lease("fresh", 5, Mode::Acquire, "x"), rate.clone()])
            .unwrap();
        assert!(!out.allowed && !out.decisions[0].allowed);
        assert_eq!(store.tat(&rate.key), None, "nothing spent");
        let victim = one(&store, lease("victim", 5, Mode::Release, "v1"));
        assert!(victim.allowed, "the victim's lease was not pushed out");
        // Its slot is free for another key, in a batch too.
        let out = store
            .spend_now(&[lease("fresh", 5, Mode::Acquire, "x"), rate.clone()])
            .unwrap();
        assert!(out.allowed);
        assert_eq!(store.live_leases(), 50);
    }

    /// One name's fresh keys fill its share of the table (a quarter), not the table: the
    /// other names' keys still take leases (each up to its own share), while the flooded
    /// name's keys are denied until its leases go (expired ones dropped when the share is
    /// full, in the shards the request holds, and by the sweeper).
    #[test]
    fn one_names_flood_takes_only_its_share() {
        let clock = FakeClock::new(T0);
        let store = store(&clock).with_lease_bounds(400, 25);
        let named = |number: u32, key: &str, id: &str| {
            let mut item = lease(key, 5, Mode::Acquire, id);
            item.key = BucketKey::windowed(number, key, item.limit.window());
            item
        };
        let fill = |number: u32, tries: usize| {
            (0..tries)
                .filter(|i| one(&store, named(number, &format!("k{i}"), "x")).allowed)
                .count()
        };
        assert_eq!(fill(100, 1_000), 100, "the attacker's name: its share");
        assert_eq!(fill(101, 50), 50, "another name, untouched");
        assert_eq!(fill(102, 200), 100, "a third, up to its own share");
        assert_eq!(store.live_leases(), 250);
        assert_eq!((store.name_leases(100), store.name_leases(101)), (100, 50));
        // The attacker's leases expire: its share is free again.
        clock.advance(HOLD);
        assert!(one(&store, named(100, "next", "x")).allowed);
        store.sweep();
        assert_eq!((store.live_leases(), store.name_leases(100)), (1, 1));
        assert_eq!(store.name_leases(101), 0);
    }
}
