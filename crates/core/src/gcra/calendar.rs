//! Calendar windows: at most `count` per window, counted in the bucket as the window's
//! end plus what it used (`W + used`), so that one stored number tells the window and its
//! use apart from any other window's ([`CalendarPeriod::max_count`] keeps the use, debt
//! included, below the next window's end).

use super::{Decision, Limit, LimitError, Window};
use crate::clock::{CalendarPeriod, Nanos};

/// The largest count of any calendar limit: `2 x count` must stay exact in a double (the
/// Redis script's numbers). A window's own bound ([`CalendarPeriod::max_count`]) is lower
/// for short windows.
pub const MAX_CALENDAR_COUNT: u64 = 1 << 52;

impl Limit {
    /// A calendar limit: at most `count` per window of `period` (UTC). Its burst is
    /// `count`, its period and burst offset the longest window (31 days for a month).
    ///
    /// ```
    /// use cellrate_core::clock::CalendarPeriod;
    /// use cellrate_core::gcra::{Limit, Window};
    /// let monthly = Limit::calendar(1_000_000, CalendarPeriod::Month).unwrap();
    /// assert_eq!(monthly.window(), Window::Calendar(CalendarPeriod::Month));
    /// assert_eq!(monthly.burst(), 1_000_000);
    /// ```
    pub fn calendar(count: u64, period: CalendarPeriod) -> Result<Limit, LimitError> {
        if count == 0 {
            return Err(LimitError::ZeroCount);
        }
        let max = period.max_count().min(MAX_CALENDAR_COUNT);
        if count > max {
            return Err(LimitError::TooManyPerWindow { count, period, max });
        }
        let limit = Limit::new(count, count, period.longest())?;
        Ok(Limit {
            window: Window::Calendar(period),
            ..limit
        })
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::DAY;
    use crate::gcra::{charge, refund, spend};

    /// 2024-02-15T12:00:00Z, and the end of its month (2024-03-01).
    const MID_FEB: Nanos = 19_768 * crate::clock::DAY + crate::clock::DAY / 2;
    const MARCH: Nanos = 19_783 * crate::clock::DAY;

    #[test]
    fn a_calendar_window_allows_its_count_then_waits_for_the_next_window() {
        let monthly = Limit::calendar(3, CalendarPeriod::Month).unwrap();
        let mut stored = None;
        for left in [2, 1, 0] {
            let (d, write) = spend(&monthly, MID_FEB, stored, 1);
            assert!(d.allowed);
            assert_eq!((d.remaining, d.reset_in), (left, MARCH - MID_FEB));
            stored = write;
        }
        assert_eq!(stored, Some(MARCH + 3));
        // The fourth waits for March, not a nanosecond less.
        let (d, write) = spend(&monthly, MID_FEB, stored, 1);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_in),
            (false, 0, MARCH - MID_FEB)
        );
        assert_eq!(write, None);
        assert!(!spend(&monthly, MARCH - 1, stored, 1).0.allowed);
        let (d, write) = spend(&monthly, MARCH, stored, 1);
        assert_eq!((d.allowed, d.remaining), (true, 2));
        assert_eq!(
            write,
            Some(19_814 * crate::clock::DAY + 1),
            "April 1st + 1 used"
        );
        // A peek of an untouched bucket: full, nothing to reset.
        assert_eq!(spend(&monthly, MID_FEB, None, 0).0.reset_in, 0);
    }

    #[test]
    fn a_calendar_charge_goes_into_debt_until_the_window_ends() {
        let monthly = Limit::calendar(3, CalendarPeriod::Month).unwrap();
        let (_, stored) = spend(&monthly, MID_FEB, None, 3);
        let (d, stored) = charge(&monthly, MID_FEB, stored, 5);
        // Debt at most one count deep: 3 used, 3 owed (the rest forgiven).
        assert_eq!((d.allowed, d.remaining), (false, -3));
        assert_eq!(stored, Some(MARCH + 6));
        assert!(!spend(&monthly, MARCH - 1, stored, 0).0.allowed);
        // The debt ends with its window.
        assert_eq!(spend(&monthly, MARCH, stored, 1).0.remaining, 2);
    }

    #[test]
    fn a_calendar_refund_gives_back_to_the_current_window_only() {
        let daily = Limit::calendar(10, CalendarPeriod::Day).unwrap();
        let (_, stored) = spend(&daily, MID_FEB, None, 4);
        let (d, stored) = refund(&daily, MID_FEB, stored, 6);
        assert_eq!((d.allowed, d.remaining, d.reset_in), (true, 10, 0));
        // None used: full, no bucket (as a GCRA refund to full), not the window's end.
        assert_eq!(stored, Some(MID_FEB));
        let (_, later) = spend(&daily, MID_FEB, stored, 2);
        let tomorrow = MID_FEB + crate::clock::DAY;
        let (d, write) = refund(&daily, tomorrow, later, 1);
        assert_eq!((d.allowed, d.remaining, write), (false, 10, None));
    }

    #[test]
    fn calendar_counts_are_bounded() {
        assert!(Limit::calendar(MAX_CALENDAR_COUNT, CalendarPeriod::Year).is_ok());
        assert_eq!(
            Limit::calendar(MAX_CALENDAR_COUNT + 1, CalendarPeriod::Year),
            Err(LimitError::TooManyPerWindow {
                count: MAX_CALENDAR_COUNT + 1,
                period: CalendarPeriod::Year,
                max: MAX_CALENDAR_COUNT,
            })
        );
        // A second holds at most 499 999 999: twice that must stay below 10^9 ns.
        let max = CalendarPeriod::Second.max_count();
        assert_eq!(max, 499_999_999);
        assert!(Limit::calendar(max, CalendarPeriod::Second).is_ok());
        assert!(Limit::calendar(max + 1, CalendarPeriod::Second).is_err());
        assert!(Limit::calendar(600_000_000, CalendarPeriod::Second).is_err());
        // A month's bound is its shortest (February's 28 days).
        let month = CalendarPeriod::Month.max_count();
        assert_eq!(month, ((28 * DAY - 1) / 2) as u64);
    }

    #[test]
    fn the_deepest_calendar_debt_ends_with_its_window_at_every_bound() {
        // The debt of a window stays below the next window's end, so the next window
        // starts empty, for the largest count of each period (it leaked before: 6 x 10^8
        // a second, charged 1.2 x 10^9, left 2 x 10^8 used in the next second).
        for period in [
            CalendarPeriod::Second,
            CalendarPeriod::Minute,
            CalendarPeriod::Day,
            CalendarPeriod::Month,
            CalendarPeriod::Week,
        ] {
            let count = period.max_count();
            let limit = Limit::calendar(count, period).unwrap();
            // The last nanosecond of February 2024's window (the shortest month near it).
            let now = MARCH - 1;
            let (d, stored) = charge(&limit, now, None, 2 * count);
            assert_eq!(d.remaining, -(count as i64), "{period}");
            let next = period.window_end(now);
            let (d, _) = spend(&limit, next, stored, 1);
            assert!(d.allowed, "{period}");
            assert_eq!(
                d.remaining,
                count as i64 - 1,
                "{period}: the next window is fresh"
            );
        }
    }
}
