//! The memory table's ledger kept in order: its records indexed by expiry and its live
//! holds by due, each bucket key's live holds counted, and the anonymous holds queued
//! (see [`Settlements::enqueue`]): per queue, the ids of its live holds in the order
//! they were queued. A record is in at most one queue,
//! and leaves it whenever it stops being a live hold (claimed by id, as the oldest or at
//! its due, forgotten, dropped), so a queue is never longer than its bucket's live holds
//! (`--settle-max-holds-per-key`) and the queues together hold no more ids than the
//! table holds live holds.
//!
//! [`Settlements::enqueue`]: crate::shared::Settlements::enqueue

use std::collections::HashMap;

use super::{Ledger, Record, State};
use crate::shared::Kept;
use cellrate_core::clock::Nanos;

/// Counts a live hold against each of `keys` (`up`), or stops counting it.
pub(super) fn count(per_key: &mut HashMap<u64, usize>, keys: &[u64], up: bool) {
    for key in keys {
        if up {
            *per_key.entry(*key).or_default() += 1;
        } else if let Some(n) = per_key.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                per_key.remove(key);
            }
        }
    }
}

impl Ledger {
    /// Drops the record of `id`, wherever it is indexed.
    pub(super) fn remove(&mut self, id: &str) {
        self.dequeue(id);
        if let Some(r) = self.records.remove(id) {
            if !self.order.remove(&(r.expires, r.seq, Box::from(id))) {
                if let Some(due) = r.due {
                    if self.holds.remove(&(due, r.seq, Box::from(id))) {
                        count(&mut self.per_key, &r.keys, false);
                    }
                }
            }
        }
    }

    /// The first of `keys` that holds `max` live holds already.
    pub(super) fn crowded(&self, keys: &[u64], max: usize) -> Option<usize> {
        keys.iter()
            .position(|key| self.per_key.get(key).is_some_and(|&n| n >= max))
    }

    /// Drops the first record of `order`; whether there was one.
    pub(super) fn pop_front(&mut self) -> bool {
        let Some((_, _, id)) = self.order.pop_first() else {
            return false;
        };
        self.dequeue(&id);
        self.records.remove(&id);
        true
    }

    /// Drops what has expired at `now` (live holds wait for their claim).
    pub(super) fn purge(&mut self, now: Nanos) {
        while self
            .order
            .first()
            .is_some_and(|(expires, ..)| *expires <= now)
        {
            self.pop_front();
        }
    }

    /// The record of `id` in force at `now`.
    pub(super) fn live(&mut self, id: &str, now: Nanos) -> Option<&mut Record> {
        self.records.get_mut(id).filter(|r| r.expires > now)
    }

    /// Moves the record of `id` from the live holds to `order` (settled, or let go).
    pub(super) fn unhold(&mut self, id: &str) {
        self.dequeue(id);
        if let Some(r) = self.records.get(id) {
            if let Some(due) = r.due {
                if self.holds.remove(&(due, r.seq, Box::from(id))) {
                    self.order.insert((r.expires, r.seq, Box::from(id)));
                    count(&mut self.per_key, &r.keys, false);
                }
            }
        }
    }

    /// Moves a reopened hold back to the live holds.
    pub(super) fn rehold(&mut self, id: &str) {
        if let Some(r) = self.records.get(id) {
            if let Some(due) = r.due {
                if self.order.remove(&(r.expires, r.seq, Box::from(id))) {
                    self.holds.insert((due, r.seq, Box::from(id)));
                    count(&mut self.per_key, &r.keys, true);
                }
            }
        }
    }
}

impl Ledger {
    /// Whether the record of `id` is a live hold.
    fn held(&self, id: &str) -> bool {
        (self.records.get(id)).is_some_and(|r| {
            r.due
                .is_some_and(|due| self.holds.contains(&(due, r.seq, Box::from(id))))
        })
    }

    /// Queues the live hold of `id` under `queue` (once).
    pub(super) fn enqueue(&mut self, queue: &str, id: &str) {
        if !self.held(id) {
            return;
        }
        let Some(r) = self.records.get_mut(id) else {
            return;
        };
        if r.queue.is_some() {
            return;
        }
        r.queue = Some(Box::from(queue));
        (self.queues.entry(Box::from(queue)).or_default()).push_back(Box::from(id));
    }

    /// Takes `id` out of its queue, if it is in one.
    pub(super) fn dequeue(&mut self, id: &str) {
        let Some(queue) = self.records.get_mut(id).and_then(|r| r.queue.take()) else {
            return;
        };
        let Some(ids) = self.queues.get_mut(&queue) else {
            return;
        };
        if ids.front().is_some_and(|front| &**front == id) {
            ids.pop_front();
        } else {
            ids.retain(|queued| &**queued != id);
        }
        if ids.is_empty() {
            self.queues.remove(&queue);
        }
    }

    /// Claims the oldest decided live hold of `queue` at `costs`.
    pub(super) fn claim_oldest(
        &mut self,
        queue: &str,
        costs: &[u8],
        now: Nanos,
    ) -> Option<(String, Kept)> {
        // Passed over: a pending one (its Check not decided yet), and one past its due
        // (its release's).
        let claimable = |r: &Record| {
            matches!(r.state, State::Decided { .. }) && r.due.is_some_and(|due| due > now)
        };
        let ids = self.queues.get(queue)?;
        let id = (ids.iter()).find(|id| self.records.get(&***id).is_some_and(claimable))?;
        let id = id.clone();
        let r = self.records.get_mut(&id)?;
        let State::Decided { at, facts } = &r.state else {
            return None;
        };
        let kept = r.kept(*at, facts, now);
        r.state = State::Settled {
            at: *at,
            facts: facts.clone(),
            costs: costs.to_vec(),
        };
        self.unhold(&id);
        Some((id.into_string(), kept))
    }
}
