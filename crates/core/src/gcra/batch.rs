//! Batches: every item decided against the current state, the spends written only if
//! every counting item is allowed (all-or-nothing), and the one-item case without vectors.

use super::{charge, spend, Decision, Limit};
use crate::clock::Nanos;

/// How an item takes part in a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Decide, and spend when the whole batch is allowed.
    #[default]
    CheckAndSpend,
    /// Decide what a spend of the cost would get and count toward the batch, never spend
    /// (Boulder's `Check`): an allowed item in an allowed batch reports the bucket as the
    /// spend would leave it. Cost 0 is the peek.
    CheckOnly,
    /// Left out of the batch's decision; spent only when this bucket has the tokens and
    /// the batch is allowed.
    SpendOnly,
    /// Decide and count, never spend, and report the bucket as it stands: for the items
    /// of a batch already known to be denied (a deny-listed or oversize item), whose
    /// answers must say what is there, not what a spend would leave.
    Probe,
    /// Decide and count, and always spend, into debt if need be (see [`charge`]): for costs
    /// known only afterwards (tokens a response used) and limits declared `overdraw`. The
    /// charge is recorded even when the batch is denied, by it or by another item.
    Charge,
    /// Take a lease of a concurrency limit under the item's lease id ([`super::lease::acquire`]):
    /// counts toward the batch, written only when the batch is allowed.
    Acquire,
    /// Free the lease under the item's lease id ([`super::lease::release`]): does not count
    /// toward the batch, and is applied whatever the batch decides.
    Release,
}

impl Mode {
    /// Whether the item's decision counts toward the batch's.
    pub fn counts(self) -> bool {
        !matches!(self, Mode::SpendOnly | Mode::Release)
    }

    /// Whether the item acquires or releases a lease (a concurrency limit's modes).
    pub fn is_lease(self) -> bool {
        matches!(self, Mode::Acquire | Mode::Release)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SECOND;

    use crate::gcra::fixtures::{seed_limit, MS, T0};

    #[test]
    fn a_denied_batch_still_records_its_charges() {
        let ample = Limit::new(10, 10, 1_000).unwrap();
        let tight = Limit::new(1, 1, 1_000).unwrap();
        let items = [
            BatchItem {
                limit: &ample,
                cost: 2,
                mode: Mode::CheckAndSpend,
            },
            BatchItem {
                limit: &ample,
                cost: 4,
                mode: Mode::Charge,
            },
            BatchItem {
                limit: &tight,
                cost: 1,
                mode: Mode::CheckAndSpend,
            },
        ];
        let out = spend_batch(0, &items, &[None, None, Some(1_000)]);
        assert!(!out.allowed);
        assert_eq!(out.writes, vec![None, Some(400), None]);
        assert_eq!(out.decisions[1].remaining, 6);
    }

    #[test]
    fn batch_is_all_or_nothing() {
        let ample = seed_limit();
        let tat_full = Some(T0 + SECOND);
        let items = [
            BatchItem {
                limit: &ample,
                cost: 1,
                mode: Mode::CheckAndSpend,
            },
            BatchItem {
                limit: &ample,
                cost: 1,
                mode: Mode::CheckAndSpend,
            },
        ];
        let out = spend_batch(T0, &items, &[None, tat_full]);
        assert!(!out.allowed);
        assert_eq!(out.writes, vec![None, None]);
        assert!(out.decisions[0].allowed);
        assert_eq!(out.decisions[0].remaining, 20);
        assert!(!out.decisions[1].allowed);
        let overall = strictest(&out.decisions).unwrap();
        assert_eq!((overall.allowed, overall.retry_in), (false, 50 * MS));

        let out = spend_batch(T0, &items, &[None, None]);
        assert!(out.allowed);
        assert_eq!(out.writes, vec![Some(T0 + 50 * MS); 2]);
        assert_eq!(out.decisions[0].remaining, 19);
    }

    #[test]
    fn check_only_decides_but_never_writes() {
        let limit = seed_limit();
        let items = [BatchItem {
            limit: &limit,
            cost: 3,
            mode: Mode::CheckOnly,
        }];
        let out = spend_batch(T0, &items, &[None]);
        assert!(out.allowed);
        assert_eq!(out.writes, vec![None]);
        // What a spend of 3 would leave: 17 tokens, full again in 150 ms.
        assert_eq!(
            (out.decisions[0].remaining, out.decisions[0].reset_in),
            (17, 150 * MS)
        );
        let out = spend_batch(T0, &items, &[Some(T0 + SECOND)]);
        assert!(!out.allowed);
        // Beside an item that denies the batch, it reports the bucket as it stands.
        let empty = Limit::new(1, 1, SECOND).unwrap();
        let items = [
            items[0],
            BatchItem {
                limit: &empty,
                cost: 1,
                mode: Mode::CheckAndSpend,
            },
        ];
        let out = spend_batch(T0, &items, &[None, Some(T0 + SECOND)]);
        assert!(!out.allowed);
        assert!(out.decisions[0].allowed);
        assert_eq!(
            (out.decisions[0].remaining, out.decisions[0].reset_in),
            (20, 0)
        );
    }

    #[test]
    fn a_probe_reports_the_bucket_as_it_stands() {
        let limit = seed_limit();
        let items = [BatchItem {
            limit: &limit,
            cost: 3,
            mode: Mode::Probe,
        }];
        let out = spend_batch(T0, &items, &[None]);
        assert_eq!(out.writes, vec![None]);
        assert!(out.decisions[0].allowed);
        assert_eq!(out.decisions[0].remaining, 20);
        let out = spend_batch(T0, &items, &[Some(T0 + SECOND)]);
        assert!(!out.allowed && !out.decisions[0].allowed);
    }

    #[test]
    fn spend_only_is_best_effort() {
        let limit = seed_limit();
        let spend_only = BatchItem {
            limit: &limit,
            cost: 1,
            mode: Mode::SpendOnly,
        };
        let normal = BatchItem {
            mode: Mode::CheckAndSpend,
            ..spend_only
        };
        // An empty spend-only bucket does not deny the batch and is not written.
        let out = spend_batch(T0, &[normal, spend_only], &[None, Some(T0 + SECOND)]);
        assert!(out.allowed);
        assert_eq!(out.writes, vec![Some(T0 + 50 * MS), None]);
        assert!(!out.decisions[1].allowed);
        // A denied batch writes no spend-only item either.
        let out = spend_batch(T0, &[normal, spend_only], &[Some(T0 + SECOND), None]);
        assert!(!out.allowed);
        assert_eq!(out.writes, vec![None, None]);
    }

    #[test]
    fn strictest_orders_denied_then_retry_then_remaining() {
        let d = |allowed, remaining, retry_in| Decision {
            allowed,
            remaining,
            retry_in,
            reset_in: 0,
        };
        let all = [
            d(true, 5, 0),
            d(true, 2, 0),
            d(false, 9, 10),
            d(false, 1, 30),
            d(false, 0, 30),
        ];
        assert_eq!(strictest(&all), Some(d(false, 0, 30)));
        assert_eq!(strictest(&all[..2]), Some(d(true, 2, 0)));
        assert_eq!(strictest(&[]), None);
    }
}
