//! Calendar windows: at most `count` per window, counted in the bucket as the window's
//! end plus what it used (`W + used`), so that one stored number tells the window and its
//! use apart from any other window's ([`CalendarPeriod::max_count`] keeps the use, debt
//! included, below the next window's end).

use super::{Decision, Limit};
use crate::clock::{CalendarPeriod, Nanos};

/// Tokens used in the window that holds `now` by a calendar bucket whose stored value is
/// `stored` (`W + used`), and that window's end `W`.
fn window_used(period: CalendarPeriod, now: Nanos, stored: Option<Nanos>) -> (i64, Nanos) {
    let end = period.window_end(now);
    let used = stored.filter(|&v| v >= end).map_or(0, |v| v - end);
    (used, end)
}

/// [`spend`] and [`charge`] on a calendar window: at most `count` spends per window; a
/// charge goes into debt, at most one `count` deep, and a window's debt ends with it.
pub(super) fn window_spend(
    limit: &Limit,
    period: CalendarPeriod,
    now: Nanos,
    stored: Option<Nanos>,
    cost: u64,
    charge: bool,
) -> (Decision, Option<Nanos>) {
    let (used, end) = window_used(period, now, stored);
    let count = limit.count;
    let cost = i64::try_from(cost).unwrap_or(i64::MAX);
    let after = used.saturating_add(cost);
    let fits = after <= count;
    let until_end = end - now;
    let recorded = fits || (charge && cost > 0);
    if !recorded {
        let decision = Decision {
            allowed: false,
            remaining: count - used,
            retry_in: until_end,
            reset_in: if used > 0 { until_end } else { 0 },
        };
        return (decision, None);
    }
    let new_used = after.min(2 * count).max(used);
    let remaining = count - new_used;
    let decision = Decision {
        allowed: fits,
        remaining,
        retry_in: if fits && remaining >= cost {
            0
        } else {
            until_end
        },
        reset_in: if new_used > 0 { until_end } else { 0 },
    };
    (decision, (cost > 0).then_some(end + new_used))
}

/// [`refund`] on a calendar window: gives tokens back to the current window, never below
/// none used; a bucket of an earlier window (or none) is full and stays as it is. A bucket
/// refunded to none used is full: its value is `now`, no bucket (as a GCRA refund to full
/// stores), not `W + 0`, which would outlive it as a bucket that is not full (a reset would
/// count it).
pub(super) fn window_refund(
    limit: &Limit,
    period: CalendarPeriod,
    now: Nanos,
    stored: Option<Nanos>,
    cost: u64,
) -> (Decision, Option<Nanos>) {
    let (used, end) = window_used(period, now, stored);
    let cost = i64::try_from(cost).unwrap_or(i64::MAX);
    let new_used = used.saturating_sub(cost).max(0);
    let decision = Decision {
        allowed: new_used != used,
        remaining: limit.count - new_used,
        retry_in: 0,
        reset_in: if new_used > 0 { end - now } else { 0 },
    };
    let write = if new_used > 0 { end + new_used } else { now };
    (decision, decision.allowed.then_some(write))
}
