//! A batch's spend, refund and reset: the shards of its keys locked (in ascending order,
//! `lock_all`), their TATs read, decided by [`cellrate_core::gcra`] and written before the
//! locks go; and the single-item spend (most requests), with one lock and one lookup.

use super::{leases, shares, Fingerprint, MemoryStore, Space};
use crate::table::{Tag, TatTable};
use crate::{Outcome, StoreError, StoreItem};
use cellrate_core::clock::Nanos;
use cellrate_core::gcra::{self, BatchItem, Decision};
use cellrate_limits::names::BucketKey;

impl MemoryStore {
    /// Decides a batch now (the synchronous core of [`Store::spend`]).
    pub fn spend_now(&self, items: &[StoreItem]) -> Result<Outcome, StoreError> {
        if items.iter().any(leases::is_lease) {
            if let [item] = items {
                return self.spend_one_lease(item);
            }
            return self.spend_with_leases(items);
        }
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
        let mut out = gcra::spend_batch(now, &batch, &tats);
        let key = |k: usize| &items[k].key;
        let rooms = self.make_room(&mut guards, key, &prints, &batch, &tats, &mut out, now);
        for (k, (&(print, space), &p)) in prints.iter().zip(&positions).enumerate() {
            if let Some(tat) = out.writes[k] {
                self.write(guards[p].table(space), (print, space), tat, rooms[k]);
            }
        }
        Ok(Outcome {
            allowed: out.allowed,
            decisions: out.decisions,
        })
    }

    /// Writes `tat` for `print` in `table`; `room` is the tag a new bucket was counted
    /// under ([`MemoryStore::make_room`]), given back when the bucket was there already (a
    /// key named twice in a batch is counted twice and added once).
    pub(super) fn write(
        &self,
        table: &mut TatTable,
        (print, space): (Fingerprint, Space),
        tat: Nanos,
        room: Option<Tag>,
    ) {
        let added = table.insert(print, tat, room.unwrap_or(0));
        match room {
            Some(tag) if !added => self.dropped(space, tag, 1),
            _ => debug_assert!(!added || room.is_some(), "a bucket added uncounted"),
        }
    }

    /// The single-item batch (most requests): one shard lock, one hash lookup for an
    /// existing bucket, no bookkeeping vectors.
    fn spend_one(&self, item: &StoreItem) -> Result<Outcome, StoreError> {
        let (print, space) = self.fingerprint(&item.key);
        let mut tables = self.lock(self.shard_of((print, space)));
        let shard = tables.table(space);
        let now = self.clock.now();
        let batch = BatchItem {
            limit: &item.limit,
            cost: item.cost,
            mode: item.mode,
        };
        let (allowed, decision) = match shard.get_mut(print) {
            Some(stored) => {
                let (allowed, decision, write) = gcra::spend_alone(now, &batch, Some(*stored));
                if let Some(tat) = write {
                    *stored = tat;
                }
                (allowed, decision)
            }
            None => {
                let (allowed, decision, write) = gcra::spend_alone(now, &batch, None);
                if let Some(tat) = write {
                    let tag = shares::tag_of(&item.key);
                    let mut room = self.reserve(space, tag, 1);
                    if room.is_err() && self.sweep_for_room(&mut tables, now) {
                        room = self.reserve(space, tag, 1);
                    }
                    if let Err(full) = room {
                        // No room: denied (or, best effort, not written), never an error.
                        self.room.names.refused(full);
                        let counts = item.mode.counts();
                        let decision = match counts {
                            true => gcra::no_room(&item.limit, now),
                            false => gcra::spend(&item.limit, now, None, 0).0,
                        };
                        return Ok(Outcome {
                            allowed: !counts,
                            decisions: vec![decision],
                        });
                    }
                    tables.table(space).insert(print, tat, tag);
                }
                (allowed, decision)
            }
        };
        Ok(Outcome {
            allowed,
            decisions: vec![decision],
        })
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
                        if let Some((_, tag)) = shard.remove(print) {
                            self.dropped(space, tag, 1);
                        }
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

    /// Deletes buckets (and frees leases) now; returns how many were not full (empty).
    pub fn reset_now(&self, keys: &[BucketKey]) -> u32 {
        let prints: Vec<(Fingerprint, Space)> = keys.iter().map(|k| self.fingerprint(k)).collect();
        let (mut guards, positions) = self.lock_all(&prints);
        let now = self.clock.now();
        prints
            .iter()
            .zip(&positions)
            .filter(|(&(print, space), &p)| {
                let removed = guards[p].table(space).remove(print);
                if let Some((_, tag)) = removed {
                    self.dropped(space, tag, 1);
                }
                // A concurrency limit's key: its leases are freed.
                let leases = match guards[p].1.remove(&print) {
                    Some(held) => {
                        self.leases_dropped(&held.share, held.leases.len());
                        held.leases
                    }
                    None => Vec::new(),
                };
                removed.is_some_and(|(tat, _)| tat > now) || leases.iter().any(|l| l.expires > now)
            })
            .count() as u32
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::tests::{item, T0};
    use super::*;
    use cellrate_core::clock::{FakeClock, SECOND};

    #[test]
    fn bound_is_enforced_after_sweeping_and_writes_nothing() {
        let clock = FakeClock::new(T0);
        let store = MemoryStore::with_caller_share(Arc::new(clock.clone()), 1, 2, 0)
            .with_bucket_name_share(100);
        assert!(store.spend_now(&[item("a", 1)]).unwrap().allowed);
        assert!(store.spend_now(&[item("b", 1)]).unwrap().allowed);
        let out = store.spend_now(&[item("a", 1), item("c", 1)]).unwrap();
        assert!(!out.allowed);
        // "a" could spend (a peek: allowed, nothing spent); "c" has no room.
        let no_room = gcra::no_room(&item("c", 1).limit, T0);
        assert_eq!(out.decisions[1], no_room);
        assert!(out.decisions[0].allowed && out.decisions[0].remaining == 1);
        // Nothing of the denied batch was written: "a" still has one token left.
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
}
