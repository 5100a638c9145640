//! Batches: every item decided against the current state, the spends written only if
//! every counting item is allowed (all-or-nothing), and the one-item case without vectors.

use super::{charge, spend, Decision, Limit, Mode};
use crate::clock::Nanos;

/// One item of a batch, as the pure decision sees it.
#[derive(Debug, Clone, Copy)]
pub struct BatchItem<'a> {
    /// The limit of the item's bucket.
    pub limit: &'a Limit,
    /// The tokens (or leases) the item asks for.
    pub cost: u64,
    /// What the item does to its bucket.
    pub mode: Mode,
}

/// What a batch decided: per-item decisions and the TATs to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Whether every counting item was allowed (so the spends were written).
    pub allowed: bool,
    /// One decision per item, in order, describing each bucket after the call.
    pub decisions: Vec<Decision>,
    /// One entry per item: the TAT to store, or `None` to leave the bucket as it is.
    pub writes: Vec<Option<Nanos>>,
}

/// Decides a batch all-or-nothing at `now`, given each item's current TAT.
///
/// Every item is decided against the current state. The spends are written only if every
/// counting item (not [`Mode::SpendOnly`]) is allowed; a spend-only item is written only if
/// it is allowed itself; a charge ([`Mode::Charge`]) is always written. A check-only item of an allowed batch reports what its spend would
/// leave (nothing is written); any other item that was allowed but not written (in a
/// denied batch, a probe) reports `allowed = true` with its bucket as it is now (a peek),
/// since nothing was spent. Items must name distinct buckets.
///
/// ```
/// use cellrate_core::gcra::{spend_batch, BatchItem, Limit, Mode};
/// let ample = Limit::new(10, 10, 1_000_000_000).unwrap();
/// let tight = Limit::new(1, 1, 1_000_000_000).unwrap();
/// let items = [
///     BatchItem { limit: &ample, cost: 1, mode: Mode::CheckAndSpend },
///     BatchItem { limit: &tight, cost: 1, mode: Mode::CheckAndSpend },
/// ];
/// // The tight bucket is empty (TAT one second ahead): nothing is spent anywhere.
/// let out = spend_batch(0, &items, &[None, Some(1_000_000_000)]);
/// assert!(!out.allowed);
/// assert_eq!(out.writes, vec![None, None]);
/// assert_eq!(out.decisions[0].remaining, 10);
/// ```
pub fn spend_batch(now: Nanos, items: &[BatchItem<'_>], tats: &[Option<Nanos>]) -> BatchOutcome {
    spend_batch_with(now, items, tats, true)
}

/// [`spend_batch`] for the rate items of a batch whose other items (a store's leases)
/// decided `others_allowed`: when that is false the batch is denied and nothing but
/// charges is written.
pub fn spend_batch_with(
    now: Nanos,
    items: &[BatchItem<'_>],
    tats: &[Option<Nanos>],
    others_allowed: bool,
) -> BatchOutcome {
    debug_assert_eq!(items.len(), tats.len());
    let mut decisions = Vec::with_capacity(items.len());
    let mut writes = Vec::with_capacity(items.len());
    let mut allowed = others_allowed;
    for (item, &tat) in items.iter().zip(tats) {
        let (decision, write) = decide_item(item, now, tat);
        allowed &= decision.allowed || !item.mode.counts();
        decisions.push(decision);
        writes.push(write);
    }
    for ((item, &tat), (decision, write)) in items
        .iter()
        .zip(tats)
        .zip(decisions.iter_mut().zip(writes.iter_mut()))
    {
        settle_item(item, now, tat, allowed, decision, write);
    }
    BatchOutcome {
        allowed,
        decisions,
        writes,
    }
}

/// [`spend_batch`] of a batch of one item, without its vectors: whether it was allowed,
/// its decision and what to write.
///
/// ```
/// use cellrate_core::gcra::{spend_alone, spend_batch, BatchItem, Limit, Mode};
/// let limit = Limit::new(2, 1, 1_000_000_000).unwrap();
/// let modes = [Mode::CheckAndSpend, Mode::CheckOnly, Mode::SpendOnly, Mode::Probe, Mode::Charge];
/// for mode in modes {
///     let item = BatchItem { limit: &limit, cost: 1, mode };
///     for tat in [None, Some(1_000_000_000), Some(3_000_000_000)] {
///         let batch = spend_batch(0, &[item], &[tat]);
///         let alone = spend_alone(0, &item, tat);
///         assert_eq!(alone, (batch.allowed, batch.decisions[0], batch.writes[0]));
///     }
/// }
/// ```
pub fn spend_alone(
    now: Nanos,
    item: &BatchItem<'_>,
    tat: Option<Nanos>,
) -> (bool, Decision, Option<Nanos>) {
    let (mut decision, mut write) = decide_item(item, now, tat);
    let allowed = decision.allowed || !item.mode.counts();
    settle_item(item, now, tat, allowed, &mut decision, &mut write);
    (allowed, decision, write)
}

/// An item's decision and write as if it stood alone.
fn decide_item(item: &BatchItem<'_>, now: Nanos, tat: Option<Nanos>) -> (Decision, Option<Nanos>) {
    match item.mode {
        Mode::Charge => charge(item.limit, now, tat, item.cost),
        _ => spend(item.limit, now, tat, item.cost),
    }
}

/// An item's decision and write once the batch's verdict (`allowed`) is known.
fn settle_item(
    item: &BatchItem<'_>,
    now: Nanos,
    tat: Option<Nanos>,
    allowed: bool,
    decision: &mut Decision,
    write: &mut Option<Nanos>,
) {
    if write.is_none() {
        return;
    }
    match (allowed, item.mode) {
        (true, Mode::CheckAndSpend | Mode::SpendOnly) | (_, Mode::Charge) => {}
        // Check-only in an allowed batch: the hypothetical spend stands, unwritten.
        (true, Mode::CheckOnly) => *write = None,
        // Allowed but not spent (a denied batch, a probe): the bucket as it stands.
        _ => {
            *decision = spend(item.limit, now, tat, 0).0;
            *write = None;
        }
    }
}

/// A spend that needs a new bucket the store has no room for (its table, or the share of
/// it the limit's name may take, is full): denied, with no token offered (`remaining` 0)
/// and a retry after the time a bucket emptied now takes to refill (a GCRA limit's burst
/// offset, a calendar window's end), by which every bucket written under the limit until
/// now has refilled and can be dropped. `reset_in` is 0: there is no bucket, so it is full.
///
/// ```
/// use cellrate_core::gcra::{no_room, Limit};
/// let limit = Limit::new(10, 10, 1_000_000_000).unwrap();
/// let d = no_room(&limit, 0);
/// assert!(!d.allowed);
/// assert_eq!((d.remaining, d.retry_in, d.reset_in), (0, 1_000_000_000, 0));
/// ```
pub fn no_room(limit: &Limit, now: Nanos) -> Decision {
    Decision {
        allowed: false,
        remaining: 0,
        retry_in: spend(limit, now, None, limit.burst()).0.reset_in,
        reset_in: 0,
    }
}

/// The overall decision of a batch: the strictest of `decisions`, or `None` if empty.
pub fn strictest<'a>(decisions: impl IntoIterator<Item = &'a Decision>) -> Option<Decision> {
    decisions.into_iter().fold(None, |acc, d| match acc {
        Some(best) if !d.is_stricter_than(&best) => Some(best),
        _ => Some(*d),
    })
}
