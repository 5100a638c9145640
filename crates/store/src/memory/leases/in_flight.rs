//! Admin `Top` in flight from the memory store: per name number, the keys holding the most
//! live leases now, counted one shard at a time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::memory::MemoryStore;
use crate::{InFlightKey, InFlightName};
use cellrate_limits::names::BucketKey;

impl MemoryStore {
    /// Per name number (or only `only`), the `per_name` keys with the most live leases,
    /// names with the most leases first. Each shard's lock is held while its own leases
    /// are counted (a shard holds about `lease_bound / shards` of them: the keys are spread
    /// by a secret hash), then let go: decisions wait for one shard's count at most.
    pub fn in_flight(&self, per_name: usize, only: Option<u32>) -> Vec<InFlightName> {
        // name number -> (its leases, its best keys: the least of them on top)
        let mut names: HashMap<u32, (u64, BinaryHeap<Reverse<Ranked>>)> = HashMap::new();
        for shard in 0..self.shards.len() {
            let tables = self.lock(shard);
            let now = self.clock.now();
            for held in tables.1.values() {
                let number = held.key.parts().0;
                if only.is_some_and(|only| only != number) {
                    continue;
                }
                let leases = held.leases.iter().filter(|l| l.expires > now).count() as u64;
                if leases == 0 {
                    continue;
                }
                let (total, top) = names.entry(number).or_default();
                *total += leases;
                let better = match top.peek() {
                    _ if top.len() < per_name => true,
                    Some(Reverse(least)) => (leases, Reverse(&held.key)) > least.rank(),
                    None => false,
                };
                if better {
                    if top.len() >= per_name {
                        top.pop();
                    }
                    top.push(Reverse(Ranked(InFlightKey {
                        key: held.key.clone(),
                        leases,
                        count: u64::from(held.count),
                    })));
                }
            }
        }
        let mut names: Vec<InFlightName> = names
            .into_iter()
            .map(|(number, (leases, top))| InFlightName {
                number,
                leases,
                // Ascending in Reverse: the most leases first.
                keys: top.into_sorted_vec().into_iter().map(|r| r.0 .0).collect(),
            })
            .collect();
        names.sort_by(|a, b| b.leases.cmp(&a.leases).then(a.number.cmp(&b.number)));
        names
    }
}

/// A key in the order of `Top` in flight: more leases rank higher, then the lesser key.
struct Ranked(InFlightKey);

impl Ranked {
    fn rank(&self) -> (u64, Reverse<&BucketKey>) {
        (self.0.leases, Reverse(&self.0.key))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Ranked) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Ranked) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Ranked) -> bool {
        self.rank() == other.rank()
    }
}

impl Eq for Ranked {}

#[cfg(test)]
mod tests {
    use super::super::tests::{lease, one, store, HOLD, T0};
    use cellrate_core::clock::{FakeClock, SECOND};
    use cellrate_core::gcra::Mode;

    /// `in_flight` ranks keys by live leases (ties by key), per name, at most N a name;
    /// released and expired leases drop out, and so do keys left with none.
    #[test]
    fn in_flight_ranks_keys_by_live_leases() {
        let clock = FakeClock::new(T0);
        let store = store(&clock);
        for (key, n) in [("a", 1), ("b", 3), ("c", 2), ("d", 2)] {
            for i in 0..n {
                assert!(one(&store, lease(key, 5, Mode::Acquire, &format!("{key}{i}"))).allowed);
            }
        }
        type Listed = (u32, u64, Vec<(String, u64, u64)>);
        let listed = |n, only| -> Vec<Listed> {
            store
                .in_flight(n, only)
                .into_iter()
                .map(|name| {
                    let keys = name.keys.iter();
                    let keys = keys.map(|k| (k.key.parts().1.to_string(), k.leases, k.count));
                    (name.number, name.leases, keys.collect())
                })
                .collect()
        };
        let s = |id: &str, n: u64| (id.to_string(), n, 5);
        assert_eq!(
            listed(3, None),
            [(100, 8, vec![s("b", 3), s("c", 2), s("d", 2)])]
        );
        assert_eq!(listed(1, Some(100)), [(100, 8, vec![s("b", 3)])]);
        assert_eq!(listed(3, Some(101)), []);
        clock.advance(SECOND);
        assert!(one(&store, lease("c", 5, Mode::Release, "c0")).allowed);
        assert!(one(&store, lease("a", 5, Mode::Acquire, "a1")).allowed);
        assert_eq!(
            listed(2, None),
            [(100, 8, vec![s("b", 3), s("a", 2)])],
            "c released one"
        );
        // The first leases expire (taken at T0): only a1 is left.
        clock.advance(HOLD - SECOND);
        assert_eq!(listed(5, None), [(100, 1, vec![s("a", 1)])]);
    }
}
