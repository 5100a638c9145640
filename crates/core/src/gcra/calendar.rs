//! Calendar windows: at most `count` per window, counted in the bucket as the window's
//! end plus what it used (`W + used`), so that one stored number tells the window and its
//! use apart from any other window's: the use, debt included, stays below the window's
//! shortest length ([`CalendarPeriod::max_count`] keeps twice a count there; a window of
//! envoyproxy/ratelimit's, [`Limit::fixed_window`], is bounded by that length itself).

use super::{stored, Decision, Limit, LimitError, Window};
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

    /// envoyproxy/ratelimit's fixed window: [`Limit::calendar`]'s, except that a charge
    /// records every hit, as its counter's `INCRBY` does, where cellrate's own windows
    /// keep at most one count of debt. The use is bounded only by what the bucket can
    /// hold ([`Limit::most_used`]): a window of 10 charged 10 000 holds 10 000, so that a
    /// larger limit read from the same window later (a tier raised within the hour) sees
    /// what upstream's counter would.
    ///
    /// ```
    /// use cellrate_core::clock::CalendarPeriod;
    /// use cellrate_core::gcra::{charge, Limit};
    /// let hourly = Limit::fixed_window(10, CalendarPeriod::Hour).unwrap();
    /// let (d, _) = charge(&hourly, 0, None, 10_000);
    /// assert_eq!(d.remaining, -9_990);
    /// let own = Limit::calendar(10, CalendarPeriod::Hour).unwrap();
    /// assert_eq!(charge(&own, 0, None, 10_000).0.remaining, -10);
    /// ```
    pub fn fixed_window(count: u64, period: CalendarPeriod) -> Result<Limit, LimitError> {
        Ok(Limit {
            every_hit: true,
            ..Limit::calendar(count, period)?
        })
    }

    /// The most a window of this limit may have used, debt included: twice its count for
    /// cellrate's own windows (debt at most one count deep), and for envoyproxy/ratelimit's
    /// ([`Limit::fixed_window`]) the window's room: below its shortest length in
    /// nanoseconds, so that `W + used` stays below the next window's end, and at most
    /// 2^52 ([`MAX_CALENDAR_COUNT`]), exact in a double (the Redis script's numbers).
    /// `None` for a limit that is no calendar window.
    ///
    /// ```
    /// use cellrate_core::clock::CalendarPeriod;
    /// use cellrate_core::gcra::Limit;
    /// let own = Limit::calendar(10, CalendarPeriod::Hour).unwrap();
    /// assert_eq!(own.most_used(), Some(20));
    /// let upstream = Limit::fixed_window(10, CalendarPeriod::Hour).unwrap();
    /// assert_eq!(upstream.most_used(), Some(3_600_000_000_000 - 1));
    /// ```
    pub fn most_used(&self) -> Option<u64> {
        let Window::Calendar(period) = self.window else {
            return None;
        };
        Some(match self.every_hit {
            true => ((period.shortest() - 1) as u64).min(MAX_CALENDAR_COUNT),
            false => 2 * self.count as u64,
        })
    }
}

/// Tokens used in the window that holds `now` by a calendar bucket whose stored value is
/// `stored` (`W + used`), and that window's end `W`.
fn window_used(period: CalendarPeriod, now: Nanos, stored: Option<Nanos>) -> (i64, Nanos) {
    let end = period.window_end(now);
    (stored::window_used(end, stored), end)
}

/// [`spend`] and [`charge`] on a calendar window: at most `count` spends per window; a
/// charge goes into debt, at most one `count` deep (every hit, to the window's room, for
/// envoyproxy/ratelimit's: [`Limit::most_used`]), and a window's debt ends with it.
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
    let most = i64::try_from(limit.most_used().unwrap_or(0)).unwrap_or(i64::MAX);
    let (fits, new_used) = stored::window_after(used, cost, count, most);
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
    let new_used = stored::window_give_back(used, cost);
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
    fn an_upstream_window_counts_every_hit_and_the_next_window_starts_empty() {
        // envoyproxy/ratelimit's counter INCRBYs every hit: a window of 10 charged 10 000
        // holds 10 000 (cellrate's own window holds 20, one count of debt).
        let hourly = Limit::fixed_window(10, CalendarPeriod::Hour).unwrap();
        let end = CalendarPeriod::Hour.window_end(MID_FEB);
        let (d, stored) = charge(&hourly, MID_FEB, None, 10_000);
        assert_eq!((d.allowed, d.remaining), (false, -9_990));
        assert_eq!(stored, Some(end + 10_000));
        // A peek reads every hit; so does a larger limit of the same window (a tier
        // raised within the hour), which upstream's counter would deny as well.
        let (d, write) = spend(&hourly, MID_FEB, stored, 0);
        assert_eq!((d.allowed, d.remaining, write), (false, -9_990, None));
        let raised = Limit::fixed_window(6_000, CalendarPeriod::Hour).unwrap();
        assert_eq!(spend(&raised, MID_FEB, stored, 0).0.remaining, -4_000);
        let larger = Limit::fixed_window(20_000, CalendarPeriod::Hour).unwrap();
        let (d, _) = spend(&larger, MID_FEB, stored, 1);
        assert_eq!((d.allowed, d.remaining), (true, 9_999));
        // More hits keep counting; the next window starts empty.
        let (_, stored) = charge(&hourly, MID_FEB, stored, 5);
        assert_eq!(stored, Some(end + 10_005));
        let (d, write) = spend(&hourly, end, stored, 1);
        assert_eq!((d.allowed, d.remaining), (true, 9));
        assert_eq!(write, Some(end + CalendarPeriod::Hour.shortest() + 1));
        // cellrate's own calendar limits still stop at twice the count.
        let own = Limit::calendar(10, CalendarPeriod::Hour).unwrap();
        let (d, stored) = charge(&own, MID_FEB, None, 10_000);
        assert_eq!((d.remaining, stored), (-10, Some(end + 20)));
        assert_eq!(own.most_used(), Some(20));
        // Scaling keeps what the limit is.
        let shared = Limit::fixed_window(1_000, CalendarPeriod::Month).unwrap();
        assert_eq!(shared.divided(3).count(), 334);
        assert_eq!(shared.divided(3).most_used(), shared.most_used());
        assert_eq!(Limit::new(1, 1, 1).unwrap().most_used(), None);
    }

    #[test]
    fn an_upstream_window_fills_its_room_and_no_more_at_every_period() {
        // The most a window of envoyproxy/ratelimit's may hold: its shortest length less
        // a nanosecond (so W + used stays below the next window's end), at most 2^52 (exact
        // in a double); charged u64::MAX on the last nanosecond of its window, the next
        // window still starts empty.
        for period in CalendarPeriod::UNZONED {
            let limit = Limit::fixed_window(10, period).unwrap();
            let most = ((period.shortest() - 1) as u64).min(MAX_CALENDAR_COUNT);
            assert_eq!(limit.most_used(), Some(most), "{period}");
            let end = period.window_end(MARCH - 1);
            let (d, stored) = charge(&limit, end - 1, None, u64::MAX);
            assert_eq!(d.remaining, 10 - most as i64, "{period}");
            assert_eq!(stored, Some(end + most as i64), "{period}");
            assert!(stored.unwrap() < period.window_end(end), "{period}");
            let (d, _) = spend(&limit, end, stored, 1);
            assert_eq!((d.allowed, d.remaining), (true, 9), "{period}: fresh");
        }
        assert_eq!(
            Limit::fixed_window(1, CalendarPeriod::Year)
                .unwrap()
                .most_used(),
            Some(1 << 52)
        );
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
