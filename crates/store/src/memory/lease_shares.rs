//! The shares of the memory store's leases (docs/concurrency.md, "Bounds and memory"): at
//! most `lease_bound` leases in all and, per name number, at most a share of them
//! (`--lease-name-share`), each counted exactly (expired leases until dropped). A key keeps
//! its name's count ([`Share`]), so only a key's first lease looks the name up.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::MemoryStore;

/// The leases one name number holds in the whole store (expired ones until dropped).
pub(super) type Share = Arc<AtomicUsize>;

/// The default share of the store's leases one name may hold, in percent
/// (`--lease-name-share`).
pub const DEFAULT_LEASE_NAME_SHARE_PERCENT: usize = 25;

/// Leases held per name number (caller-given concurrency limits all count under the
/// inline number, 0), and the bound on each: one name whose ids a client chooses cannot
/// take the whole table from the others. Names come from the configuration, so the map
/// stays as small as it is; a key keeps its name's count, so only a key's first lease
/// looks it up.
pub(super) struct NameShares {
    bound: usize,
    held: RwLock<HashMap<u32, Share>>,
}

impl NameShares {
    /// `percent` (1 to 100) of `max_leases` per name, at least 1.
    pub(super) fn new(max_leases: usize, percent: usize) -> NameShares {
        let bound = (max_leases as u128 * percent.clamp(1, 100) as u128 / 100) as usize;
        NameShares {
            bound: bound.max(1),
            held: RwLock::new(HashMap::new()),
        }
    }

    /// The count of name `number`'s leases.
    pub(super) fn of(&self, number: u32) -> Share {
        let read = self.held.read();
        if let Some(share) = read.get(&number) {
            return share.clone();
        }
        drop(read);
        let mut write = self.held.write();
        write.entry(number).or_default().clone()
    }

    /// Leases a name holds now (tests and `Top`), expired ones until dropped.
    pub(super) fn held(&self, number: u32) -> usize {
        let read = self.held.read();
        read.get(&number).map_or(0, |s| s.load(Ordering::Acquire))
    }
}

impl MemoryStore {
    /// Counts one lease for each of `shares`, or none if one does not fit.
    pub(super) fn reserve_all(&self, shares: &[Option<Share>]) -> bool {
        let wanted: Vec<&Share> = shares.iter().flatten().collect();
        for (k, share) in wanted.iter().enumerate() {
            if !self.reserve_lease_room(share) {
                for taken in &wanted[..k] {
                    self.leases_dropped(taken, 1);
                }
                return false;
            }
        }
        true
    }

    /// Counts one more lease in all and in its name's `share`, if both bounds allow it.
    pub(super) fn reserve_lease_room(&self, share: &AtomicUsize) -> bool {
        let name = (share, self.lease_names.bound);
        super::shares::take_both(name, (&self.leases_held, self.lease_bound), 1).is_ok()
    }

    /// Counts `n` leases dropped, in all and from their name's `share`.
    pub(super) fn leases_dropped(&self, share: &AtomicUsize, n: usize) {
        if n > 0 {
            share.fetch_sub(n, Ordering::AcqRel);
            self.leases_held.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// This store with at most `n` leases held in all, and at most `name_percent` of them
    /// (1 to 100) per name number.
    pub fn with_lease_bounds(mut self, n: usize, name_percent: usize) -> MemoryStore {
        self.lease_bound = n;
        self.lease_names = NameShares::new(n, name_percent);
        self
    }

    /// This store with at most `n` leases held in all, and the default share of them per
    /// name.
    pub fn with_lease_bound(self, n: usize) -> MemoryStore {
        self.with_lease_bounds(n, DEFAULT_LEASE_NAME_SHARE_PERCENT)
    }

    /// Leases held by name `number`, including expired ones not yet dropped.
    pub fn name_leases(&self, number: u32) -> usize {
        self.lease_names.held(number)
    }
}
