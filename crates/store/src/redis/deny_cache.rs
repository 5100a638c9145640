//! The local deny cache (off by default; see [`DenyCache`]).

use super::wire::Read;
use super::{RedisClock, RedisStore};
use crate::{Outcome, StoreEvent, StoreItem};
use cellrate_core::clock::Nanos;
use cellrate_core::gcra::{self, Mode};

/// The local deny cache: a denied bucket's TAT is a lower bound (TATs only grow, but for
/// refunds and resets), so later requests for that bucket can be denied here, without a
/// round trip, while that bound still proves the denial.
///
/// Time is anchored on the monotonic clock at *send* time of the request that learned the
/// TAT: Redis read `now` after that, so the local estimate of Redis's time runs ahead of
/// it, and an estimate-based denial is never one Redis would have allowed (unless another
/// replica refunded or reset the bucket; refunds and resets through this replica, and
/// reloads, clear the entries). Single-item batches only; bounded in size. The numbers it
/// reports are computed at the estimated time, so they may differ from Redis's by the
/// round-trip time.
pub(super) struct DenyCache {
    pub(super) entries: parking_lot::Mutex<DenyEntries>,
    pub(super) capacity: usize,
}

/// The cache's map, and its keys in insertion order for O(1) eviction of the oldest (a
/// full cache under attack must not scan itself on every new denial). Keys removed from
/// the map stay in `order` until they reach its front, or until `order` grows past twice
/// the capacity and is compacted.
#[derive(Default)]
pub(super) struct DenyEntries {
    map: std::collections::HashMap<String, DenyEntry>,
    order: std::collections::VecDeque<String>,
}

impl DenyEntries {
    fn insert(&mut self, key: &str, entry: DenyEntry, capacity: usize) {
        if let Some(existing) = self.map.get_mut(key) {
            *existing = entry;
            return;
        }
        while self.map.len() >= capacity {
            match self.order.pop_front() {
                Some(oldest) => {
                    self.map.remove(&oldest);
                }
                None => break,
            }
        }
        self.map.insert(key.to_string(), entry);
        self.order.push_back(key.to_string());
        if self.order.len() > 2 * capacity {
            let map = &self.map;
            self.order.retain(|k| map.contains_key(k));
        }
    }

    fn get(&self, key: &str) -> Option<DenyEntry> {
        self.map.get(key).copied()
    }

    fn remove(&mut self, key: &str) {
        self.map.remove(key);
    }

    pub(super) fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }
}

#[derive(Clone, Copy)]
pub(super) struct DenyEntry {
    tat: Nanos,
    /// Redis's `now` when the TAT was read.
    now: Nanos,
    /// The monotonic time (ns since the store started) when that request was sent.
    sent: i64,
}

impl DenyCache {
    pub(super) fn lock(&self) -> parking_lot::MutexGuard<'_, DenyEntries> {
        self.entries.lock()
    }
}

impl RedisStore {
    /// A denial proven by the deny cache, for a single counting item.
    pub(super) fn cached_denial(&self, items: &[StoreItem], key: &str) -> Option<Outcome> {
        let cache = self.deny_cache.as_ref()?;
        let [item] = items else { return None };
        // A charge must reach Redis: it is recorded whatever the bucket holds.
        // A calendar window's end is the store's to judge: near it, an estimated `now` could
        // deny what the next window allows.
        if !item.mode.counts()
            || item.mode == Mode::Charge
            || item.limit.window() != gcra::Window::Gcra
        {
            return None;
        }
        let mut entries = cache.lock();
        let entry = entries.get(key)?;
        let estimated_now = match self.settings.clock {
            RedisClock::Local => self.clock.now(),
            RedisClock::Redis => entry.now.saturating_add(self.mono() - entry.sent),
        };
        let (decision, _) = gcra::spend(&item.limit, estimated_now, Some(entry.tat), item.cost);
        if decision.allowed {
            entries.remove(key);
            return None;
        }
        self.observer.event(StoreEvent::DenyCacheHit);
        Some(Outcome {
            allowed: false,
            decisions: vec![decision],
        })
    }

    /// Remembers (or forgets) a single item's outcome in the deny cache.
    pub(super) fn learn(
        &self,
        items: &[StoreItem],
        key: &str,
        sent: i64,
        read: &Read,
        allowed: bool,
    ) {
        let Some(cache) = &self.deny_cache else {
            return;
        };
        let [item] = items else { return };
        let mut entries = cache.lock();
        match read.tats.first().copied().flatten() {
            Some(tat) if !allowed && item.mode.counts() => {
                // Full: the oldest entry goes (it is the likeliest to prove nothing now).
                let entry = DenyEntry {
                    tat,
                    now: read.now,
                    sent,
                };
                entries.insert(key, entry, cache.capacity);
            }
            _ => {
                entries.remove(key);
            }
        }
    }

    /// Forgets cached denials of `keys` (a refund or reset through this replica).
    pub(super) fn forget(&self, keys: &[String]) {
        if let Some(cache) = &self.deny_cache {
            let mut entries = cache.lock();
            for key in keys {
                entries.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deny_cache_evicts_its_oldest_entry_when_full() {
        let entry = |tat| DenyEntry {
            tat,
            now: 0,
            sent: 0,
        };
        let mut cache = DenyEntries::default();
        for i in 0..1_000 {
            cache.insert(&format!("k{i}"), entry(i), 100);
            assert!(cache.map.len() <= 100);
            assert!(cache.order.len() <= 200);
        }
        assert_eq!(cache.get("k999").map(|e| e.tat), Some(999));
        assert!(cache.get("k899").is_none(), "the oldest went first");
        assert_eq!(cache.get("k900").map(|e| e.tat), Some(900));
        // Removed keys leave the queue in time; updates keep their place.
        for i in 900..1_000 {
            cache.remove(&format!("k{i}"));
        }
        cache.insert("fresh", entry(1), 100);
        cache.insert("fresh", entry(2), 100);
        assert_eq!(cache.get("fresh").map(|e| e.tat), Some(2));
        assert_eq!(cache.map.len(), 1);
    }
}
