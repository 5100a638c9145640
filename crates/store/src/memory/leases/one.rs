//! A request of one lease item (most are): one shard lock, one lookup of the key's
//! leases, no bookkeeping vectors; and the spare list a shard keeps so that a key holding
//! one lease at a time costs no allocation.

use std::collections::hash_map::Entry;

use super::map::Held;
use super::{count_of, decide};
use crate::memory::{MemoryStore, Tables};
use crate::{Outcome, StoreError, StoreItem};
use cellrate_core::gcra::lease::{self, Lease, LeaseWrite};
use cellrate_core::gcra::Mode;

impl MemoryStore {
    /// A request of one lease item (most are): one shard lock, one lookup of the key's
    /// leases, no bookkeeping vectors; the same decision as
    /// [`MemoryStore::spend_with_leases`] would make (which it leaves to that when a
    /// lease bound is reached: the expired leases are dropped there).
    pub(in crate::memory) fn spend_one_lease(
        &self,
        item: &StoreItem,
    ) -> Result<Outcome, StoreError> {
        let (print, space) = self.fingerprint(&item.key);
        let mut guard = self.lock(self.shard_of((print, space)));
        let now = self.clock.now();
        let id = item.lease.as_deref().map(|id| self.lease_ids.hash(id));
        let tables: &mut Tables = &mut guard;
        let entry = tables.1.entry(print);
        let (held, share) = match &entry {
            Entry::Occupied(e) => (e.get().leases.as_slice(), Some(&e.get().share)),
            Entry::Vacant(_) => (&[][..], None),
        };
        let (decision, write) = decide(item, now, held, id);
        let adds = i64::from(matches!(write, Some(LeaseWrite::Add(_))));
        let share = match (adds, share) {
            (0, _) => None,
            (_, Some(share)) => Some(share.clone()),
            (_, None) => Some(self.lease_names.of(item.key.parts().0)),
        };
        if share.as_ref().is_some_and(|s| !self.reserve_lease_room(s)) {
            drop(guard);
            return self.spend_with_leases(std::slice::from_ref(item));
        }
        let change = match (entry, write, share) {
            (Entry::Occupied(mut e), write, _) => {
                let held = e.get_mut();
                if adds > 0 {
                    held.count = count_of(item);
                }
                let change = lease::apply(&mut held.leases, now, write);
                self.leases_dropped(&held.share, (adds - change).max(0) as usize);
                if held.leases.is_empty() {
                    keep_spare(&mut tables.2, e.remove().leases);
                }
                change
            }
            (Entry::Vacant(v), Some(LeaseWrite::Add(lease)), Some(share)) => {
                v.insert(Held {
                    key: item.key.clone(),
                    count: count_of(item),
                    share,
                    leases: first_list(&mut tables.2, lease),
                });
                1
            }
            (Entry::Vacant(_), _, _) => 0,
        };
        let released = i64::from(matches!(write, Some(LeaseWrite::Remove(_))));
        let expired = (adds - released - change).max(0);
        self.lease_events
            .add(adds as u64, released as u64, expired as u64);
        Ok(Outcome {
            // Only an acquire counts toward the request's decision.
            allowed: item.mode != Mode::Acquire || decision.allowed,
            decisions: vec![decision],
        })
    }
}

/// The most leases a shard's spare list may have room for (128 bytes).
const SPARE_ROOM: usize = 8;

/// Keeps the list of a key left with no lease as its shard's spare (if small), for the
/// next key that takes one: a key that holds one lease at a time (acquire, release,
/// acquire...) then costs no allocation.
fn keep_spare(spare: &mut Vec<Lease>, mut emptied: Vec<Lease>) {
    if emptied.capacity() <= SPARE_ROOM {
        emptied.clear();
        *spare = emptied;
    }
}

/// The list for a key's first lease: the shard's spare, else room for exactly one (a
/// `Vec`'s first push makes room for four: 48 bytes that a key of one lease never uses).
fn first_list(spare: &mut Vec<Lease>, lease: Lease) -> Vec<Lease> {
    let mut leases = std::mem::take(spare);
    leases.reserve_exact(1);
    leases.push(lease);
    leases
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::super::tests::{lease, one, store, HOLD, T0};
    use super::*;
    use cellrate_core::clock::{Clock, FakeClock, Nanos};

    /// A shard keeps the list of the key it emptied for the next key (no allocation for a
    /// key that holds one lease at a time), but only a small one: a key emptied of 20
    /// leases leaves no spare with room for more than 8 (docs/concurrency.md, "Bounds and
    /// memory").
    #[test]
    fn a_shards_spare_list_is_small() {
        let store = store(&FakeClock::new(T0));
        let spare = |key: &str| {
            let print = store.fingerprint(&lease(key, 20, Mode::Acquire, "x").key);
            store.lock(store.shard_of(print)).2.capacity()
        };
        assert!(one(&store, lease("one", 20, Mode::Acquire, "a")).allowed);
        assert!(one(&store, lease("one", 20, Mode::Release, "a")).allowed);
        let kept = spare("one");
        assert!((1..=SPARE_ROOM).contains(&kept), "{kept}");
        for i in 0..20 {
            assert!(one(&store, lease("many", 20, Mode::Acquire, &format!("r{i}"))).allowed);
        }
        for i in 0..20 {
            assert!(one(&store, lease("many", 20, Mode::Release, &format!("r{i}"))).allowed);
        }
        assert_eq!(store.live_leases(), 0);
        assert!(spare("many") <= SPARE_ROOM, "{}", spare("many"));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Acquire(u8, u8),
        Release(u8, u8),
        Advance(Nanos),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..3u8, 0..6u8).prop_map(|(k, id)| Step::Acquire(k, id)),
            3 => (0..3u8, 0..6u8).prop_map(|(k, id)| Step::Release(k, id)),
            1 => (0..HOLD).prop_map(Step::Advance),
        ]
    }

    proptest! {
        /// Acquires (a retry is an acquire of an id again), releases (a crash is one that
        /// never comes) and clock advances agree with a reference model: per key a map of
        /// id to expiry.
        #[test]
        fn the_store_agrees_with_a_model(steps in proptest::collection::vec(step(), 1..80)) {
            let clock = FakeClock::new(T0);
            let store = store(&clock);
            let mut model: BTreeMap<(u8, u8), Nanos> = BTreeMap::new();
            for step in steps {
                let now = clock.now();
                model.retain(|_, expires| *expires > now);
                let (k, id, mode) = match step {
                    Step::Advance(by) => { clock.advance(by); continue; }
                    Step::Acquire(k, id) => (k, id, Mode::Acquire),
                    Step::Release(k, id) => (k, id, Mode::Release),
                };
                let held = model.keys().filter(|(key, _)| *key == k).count() as i64;
                let expect = match mode {
                    Mode::Acquire if model.contains_key(&(k, id)) => true,
                    Mode::Acquire if held < 3 => { model.insert((k, id), now + HOLD); true }
                    Mode::Acquire => false,
                    _ => model.remove(&(k, id)).is_some(),
                };
                let d = one(&store, lease(&format!("k{k}"), 3, mode, &format!("id{id}")));
                let free = 3 - model.keys().filter(|(key, _)| *key == k).count() as i64;
                prop_assert_eq!((d.allowed, d.remaining), (expect, free));
            }
            let now = clock.now();
            store.sweep();
            let live = model.values().filter(|&&e| e > now).count();
            prop_assert_eq!(store.live_leases(), live);
            prop_assert_eq!(store.name_leases(100), live, "the name's count agrees");
        }
    }
}
