//! Coalescing: the batches that arrive while a lane's spend calls are in flight (a lane is
//! the standalone server, or one cluster slot; at most two calls at a time, so that Redis
//! runs one while the next is prepared and sent) wait, and go to Redis together in the next
//! call, one script run that decides them in arrival order, each all-or-nothing against the
//! state the batches before it left. Under load Redis then runs one script call for many
//! decisions (and one MGET for the call, one SET per distinct key written) instead of one
//! per decision; a request that finds a call free goes straight out, as it would without
//! coalescing. Calls of one lane share one connection, so Redis runs them in the order they
//! were sent.
//!
//! A call in flight belongs to no request: when the request that made a lane's first call
//! finishes or is dropped (its caller went away), a task takes over the lane's queue, so
//! that one caller's cancellation never fails or delays another's decision. Every request
//! keeps its own deadline, counted from when it asked; a batch whose request gave up while
//! it waited is never sent. The calls are bounded (items, bytes), and so is each lane's
//! queue: beyond it a request fails at once and the failure policy answers.

use parking_lot::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::wire::{Op, Read, Wire};
use super::RedisStore;
use crate::{StoreError, StoreEvent};

/// A batch waiting for the next call of its lane.
struct Waiting {
    batch: Vec<Wire>,
    /// What the batch adds to a call (see [`Wire::bytes`]), counted once.
    bytes: usize,
    reply: oneshot::Sender<Result<Read, StoreError>>,
}

/// One lane: its spend calls in flight, and the batches waiting for the next one.
#[derive(Default)]
pub(super) struct Lane {
    in_flight: usize,
    queue: VecDeque<Waiting>,
    queued_items: usize,
}

/// The lanes of a store: one for a standalone server, one per slot for a cluster (a script
/// call cannot span slots).
pub(super) struct Lanes(Box<[Mutex<Lane>]>);

impl Lanes {
    pub(super) fn new(count: usize) -> Lanes {
        Lanes((0..count).map(|_| Mutex::default()).collect())
    }

    fn lock(&self, slot: usize) -> MutexGuard<'_, Lane> {
        self.0[slot % self.0.len()].lock()
    }
}

/// Whether a batch goes out now (its lane was idle) or waits for the next call.
enum Turn {
    Now(Vec<Wire>),
    Wait(oneshot::Receiver<Result<Read, StoreError>>),
}

/// Releases a lane when the request that made its call is done with it, however it ends.
struct Release<'a> {
    store: &'a RedisStore,
    slot: usize,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.store.release(self.slot);
    }
}

impl RedisStore {
    /// Spends one slot group's `batch`: now if its lane is idle, else with the batches that
    /// wait for the lane's next call. Answers within the store's deadline from now.
    pub(super) async fn spend_group(
        &self,
        slot: usize,
        batch: Vec<Wire>,
    ) -> Result<Read, StoreError> {
        let timeout = self.settings.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let turn = {
            let mut lane = self.lanes.lock(slot);
            if lane.in_flight < self.settings.coalescing.calls_in_flight.max(1) {
                lane.in_flight += 1;
                Turn::Now(batch)
            } else if lane.queued_items + batch.len() > self.settings.coalescing.queued_items {
                return Err(StoreError::Backlog {
                    queued: lane.queued_items,
                });
            } else {
                let (reply, answer) = oneshot::channel();
                let items = batch.len();
                lane.queued_items += items;
                let bytes = batch.iter().map(Wire::bytes).sum();
                lane.queue.push_back(Waiting {
                    batch,
                    bytes,
                    reply,
                });
                // Under the lane's lock, as is the count of those leaving, so that the
                // gauge never reads below zero.
                self.observer.event(StoreEvent::Queued(items as i64));
                Turn::Wait(answer)
            }
        };
        let answer = match turn {
            Turn::Now(batch) => {
                let _release = Release { store: self, slot };
                let mut reads = self.call_spend(slot, &[&batch], None).await?.into_iter();
                return reads.next().unwrap_or(Err(StoreError::MalformedReply));
            }
            Turn::Wait(answer) => answer,
        };
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(read)) => read,
            // The lane's task could not run (the runtime is shutting down).
            Ok(Err(_)) => Err(StoreError::Inconsistent(
                "redis: a coalesced call was abandoned".into(),
            )),
            Err(_) => Err(StoreError::Timeout {
                op: Op::Spend.name(),
                timeout,
            }),
        }
    }

    /// A call of the lane is over: one fewer in flight, or a task sends what waits.
    fn release(&self, slot: usize) {
        let mut lane = self.lanes.lock(slot);
        if lane.queue.is_empty() {
            lane.in_flight -= 1;
            return;
        }
        let runtime = tokio::runtime::Handle::try_current();
        match (self.me.upgrade(), runtime) {
            (Some(store), Ok(runtime)) => {
                drop(lane);
                runtime.spawn(async move { store.drain(slot).await });
            }
            // No runtime to run a call on: the waiting requests hear that at once.
            _ => {
                let dropped = std::mem::take(&mut lane.queued_items);
                lane.queue.clear();
                lane.in_flight -= 1;
                self.observer.event(StoreEvent::Queued(-(dropped as i64)));
            }
        }
    }

    /// Sends the lane's waiting batches, a bounded call at a time, until none wait.
    async fn drain(self: Arc<Self>, slot: usize) {
        loop {
            let taken = self.take(slot);
            if taken.is_empty() {
                return;
            }
            let batches: Vec<&[Wire]> = taken.iter().map(|w| w.batch.as_slice()).collect();
            match self.call_spend(slot, &batches, None).await {
                Ok(reads) => {
                    for (waiting, read) in taken.into_iter().zip(reads) {
                        // The request may have given up meanwhile; nothing to tell it.
                        let _ = waiting.reply.send(read);
                    }
                }
                Err(e) => {
                    for waiting in taken {
                        let _ = waiting.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// The batches of the lane's next call, in arrival order, within the call's bounds
    /// (always at least the first); those whose request gave up are dropped unsent. Empty
    /// when none wait, and the caller's call is then no longer in flight.
    fn take(&self, slot: usize) -> Vec<Waiting> {
        let bounds = self.settings.coalescing;
        let mut lane = self.lanes.lock(slot);
        let (mut items, mut bytes, mut taken, mut removed) = (0, 0, Vec::new(), 0);
        while let Some(next) = lane.queue.pop_front() {
            let size = next.batch.len();
            let next_bytes = next.bytes;
            let live = !next.reply.is_closed();
            if live
                && !taken.is_empty()
                && (items + size > bounds.call_items || bytes + next_bytes > bounds.call_bytes)
            {
                lane.queue.push_front(next);
                break;
            }
            lane.queued_items -= size;
            removed += size;
            if live {
                items += size;
                bytes += next_bytes;
                taken.push(next);
            }
        }
        if taken.is_empty() {
            lane.in_flight -= 1;
        }
        if removed > 0 {
            self.observer.event(StoreEvent::Queued(-(removed as i64)));
        }
        taken
    }
}
