//! The Generic Cell Rate Algorithm, in exact integer nanoseconds.
//!
//! A [`Limit`] holds `burst` tokens and refills `count` tokens per `period`. GCRA keeps no
//! token count: a bucket's whole state is its **TAT** (theoretical arrival time), the Unix
//! time at which the bucket would be full again. Two durations derive from the limit:
//!
//! - the **emission interval** `ei = period / count` (truncating), the time one token takes
//!   to come back, and
//! - the **burst offset** (tolerance, τ) `bo = ei * burst`, how far past `now` the TAT may
//!   lie before a request is denied.
//!
//! A spend of `cost` tokens moves the TAT forward by `ei * cost`, starting from `now` when
//! the TAT is in the past: a missing bucket and one whose TAT has passed are the same full
//! bucket, so expired buckets can be dropped without losing anything.
//!
//! Two variations serve budgets: a **charge** ([`charge`], [`Mode::Charge`]) is recorded
//! even when it exceeds what is left, putting the bucket into a bounded debt; and a
//! **calendar window** ([`Window::Calendar`]) allows `count` per UTC window and gives
//! everything back when the next one starts, its bucket storing `window end + used`.
//!
//! Everything here is pure: functions take the previous TAT and `now` and return a
//! [`Decision`] plus the TAT to store. The stores do the read-decide-write atomically.
//! No floats: every division truncates toward zero, as Rust's `/` on `i64` does.

use crate::clock::{CalendarPeriod, Nanos};

mod batch;
mod calendar;
pub mod lease;
pub use batch::{
    no_room, spend_alone, spend_batch, spend_batch_with, strictest, BatchItem, BatchOutcome,
};
use calendar::{window_refund, window_spend};

/// Why a limit cannot be built. Each variant's fields are the values its message names.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("burst must be at least 1")]
    ZeroBurst,
    #[error("count must be at least 1")]
    ZeroCount,
    #[error("period must be positive")]
    NonPositivePeriod,
    #[error("{field} {value} is too large (at most {max})", max = i64::MAX)]
    TooLarge { field: &'static str, value: u64 },
    #[error(
        "count {count} per period {period}ns gives an emission interval of 0ns: \
         at most one token per nanosecond"
    )]
    ZeroEmissionInterval { count: u64, period: Nanos },
    #[error("burst {burst} times the emission interval {ei}ns overflows 64-bit nanoseconds")]
    Overflow { burst: u64, ei: Nanos },
    #[error(
        "a full burst takes {days} days to refill (burst x period / count), more than the \
         {max} days a bucket may take",
        days = bo / DAY,
        max = MAX_BURST_OFFSET / DAY
    )]
    TooLong { bo: Nanos },
    #[error(
        "count {count} per {period} window is too large: at most {max} (twice the count, \
         with debt, must fit in the window's shortest length in nanoseconds)"
    )]
    TooManyPerWindow {
        count: u64,
        period: CalendarPeriod,
        max: u64,
    },
    #[error("count {count} is too large for a concurrency limit (at most {max} leases a key)", max = lease::MAX_LEASES_PER_KEY)]
    TooManyLeases { count: u64 },
    #[error("period (the hold) {hold}ns is out of range: 1ms to 1d")]
    Hold { hold: Nanos },
}

const DAY: Nanos = 86_400 * crate::clock::SECOND;

/// The longest time a whole burst may take to come back (`ei * burst`): 3 650 days.
///
/// A TAT never lies more than one burst offset past `now`, and a spend computes at most
/// `now + 2 * bo` on the way (a cost is at most the burst). Unix nanoseconds in an `i64`
/// end in 2262, so with this bound every TAT stays exact until about 2242: no accepted
/// limit can reach the saturation at which GCRA would stop counting.
pub const MAX_BURST_OFFSET: Nanos = 3_650 * DAY;

/// A validated limit: `burst` capacity, `count` tokens per `period`.
///
/// ```
/// use cellrate_core::gcra::Limit;
/// let limit = Limit::new(20, 20, 1_000_000_000).unwrap();
/// assert_eq!(limit.emission_interval(), 50_000_000); // 50ms
/// assert_eq!(limit.burst_offset(), 1_000_000_000); // 1s
/// assert!(Limit::new(1, 2_000_000_000, 1_000_000_000).is_err()); // ei would be 0
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    burst: i64,
    count: i64,
    period: Nanos,
    ei: Nanos,
    bo: Nanos,
    window: Window,
}

/// How a limit counts: GCRA's continuous refill (the default), or a calendar window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Window {
    /// `count` tokens per `period`, refilled continuously, at most `burst` at once.
    #[default]
    Gcra,
    /// At most `count` per window of the period, all back when the next window starts.
    ///
    /// A bucket's stored value is `W + used`, `W` the end of its window: it belongs to the
    /// current window while it is at least that window's end, and it expires (as a TAT
    /// does) `used` nanoseconds after its window has ended, when it means nothing any more.
    Calendar(CalendarPeriod),
    /// At most `count` leases held per key, each expiring `period` after it was taken
    /// ([`lease`]). Its keys hold leases, not TATs: only acquires and releases touch them.
    Concurrency,
}

/// The largest count of any calendar limit: `2 x count` must stay exact in a double (the
/// Redis script's numbers). A window's own bound ([`CalendarPeriod::max_count`]) is lower
/// for short windows.
pub const MAX_CALENDAR_COUNT: u64 = 1 << 52;

impl Limit {
    /// Builds a limit, rejecting zero values, an emission interval of 0 and overflow.
    pub fn new(burst: u64, count: u64, period: Nanos) -> Result<Limit, LimitError> {
        if burst == 0 {
            return Err(LimitError::ZeroBurst);
        }
        if count == 0 {
            return Err(LimitError::ZeroCount);
        }
        if period <= 0 {
            return Err(LimitError::NonPositivePeriod);
        }
        let burst_i = i64::try_from(burst).map_err(|_| LimitError::TooLarge {
            field: "burst",
            value: burst,
        })?;
        let count_i = i64::try_from(count).map_err(|_| LimitError::TooLarge {
            field: "count",
            value: count,
        })?;
        let ei = period / count_i;
        if ei == 0 {
            return Err(LimitError::ZeroEmissionInterval { count, period });
        }
        let bo = ei
            .checked_mul(burst_i)
            .ok_or(LimitError::Overflow { burst, ei })?;
        if bo > MAX_BURST_OFFSET {
            return Err(LimitError::TooLong { bo });
        }
        Ok(Limit {
            burst: burst_i,
            count: count_i,
            period,
            ei,
            bo,
            window: Window::Gcra,
        })
    }

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

    /// This limit's numbers divided by `divisor` (rounded up, at least 1), everything else
    /// kept: a calendar limit stays a window of the same period, GCRA keeps its period.
    /// The one way to scale a limit (the Redis store's local fallback shares), so that
    /// what a limit is cannot be dropped by scaling it.
    ///
    /// ```
    /// use cellrate_core::clock::CalendarPeriod;
    /// use cellrate_core::gcra::Limit;
    /// let monthly = Limit::calendar(1_000, CalendarPeriod::Month).unwrap();
    /// assert_eq!(monthly.divided(3), Limit::calendar(334, CalendarPeriod::Month).unwrap());
    /// let gcra = Limit::new(10, 100, 60_000_000_000).unwrap();
    /// assert_eq!(gcra.divided(4), Limit::new(3, 25, 60_000_000_000).unwrap());
    /// ```
    pub fn divided(&self, divisor: u64) -> Limit {
        let d = divisor.max(1);
        let numbers = match self.window {
            Window::Gcra => Limit::new(
                self.burst().div_ceil(d),
                self.count().div_ceil(d),
                self.period,
            ),
            Window::Calendar(period) => Limit::calendar(self.count().div_ceil(d), period),
            Window::Concurrency => Limit::concurrency(self.count().div_ceil(d), self.period),
        };
        match numbers {
            Ok(n) => Limit {
                burst: n.burst,
                count: n.count,
                period: n.period,
                ei: n.ei,
                bo: n.bo,
                ..*self
            },
            Err(_) => *self,
        }
    }

    /// The same numbers counted by GCRA: a calendar limit's count refilled over its
    /// longest window (where only a refilling rate can be expressed, as in RLQS).
    pub fn as_gcra(&self) -> Limit {
        Limit {
            window: Window::Gcra,
            ..*self
        }
    }

    /// How the limit counts.
    pub fn window(&self) -> Window {
        self.window
    }

    /// Bucket capacity in tokens.
    pub fn burst(&self) -> u64 {
        self.burst as u64
    }

    /// Tokens added per `period`.
    pub fn count(&self) -> u64 {
        self.count as u64
    }

    /// The refill period in nanoseconds.
    pub fn period(&self) -> Nanos {
        self.period
    }

    /// `period / count`: the time one token takes to come back.
    pub fn emission_interval(&self) -> Nanos {
        self.ei
    }

    /// `emission_interval * burst`: how far past now a TAT may lie (the tolerance τ).
    pub fn burst_offset(&self) -> Nanos {
        self.bo
    }

    /// `ei * cost`, saturating: a cost above `burst` can never pass anyway.
    fn increment(&self, cost: u64) -> Nanos {
        self.ei
            .saturating_mul(i64::try_from(cost).unwrap_or(i64::MAX))
    }

    /// Tokens in the bucket at `now` when its TAT is `t` (rounded down).
    fn balance(&self, now: Nanos, t: Nanos) -> i64 {
        now.saturating_sub(t.saturating_sub(self.bo)) / self.ei
    }
}

/// The answer for one bucket (or the overall answer of a batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the cost was (or, in a denied batch, would have been) admitted.
    pub allowed: bool,
    /// Tokens in the bucket after the call, rounded down; negative when the TAT lies
    /// beyond `now + bo` (after a limit was lowered).
    pub remaining: i64,
    /// Denied: time until `cost` tokens exist. Allowed: time before an identical request
    /// would be allowed (0 when it would be now).
    pub retry_in: Nanos,
    /// Time until the bucket is full.
    pub reset_in: Nanos,
}

impl Decision {
    /// Whether `self` is stricter than `other`: denied beats allowed, then the longer
    /// `retry_in`, then the smaller `remaining`. Equal decisions are not stricter.
    ///
    /// ```
    /// use cellrate_core::gcra::Decision;
    /// let ok = Decision { allowed: true, remaining: 0, retry_in: 5, reset_in: 9 };
    /// let no = Decision { allowed: false, remaining: 3, retry_in: 1, reset_in: 2 };
    /// assert!(no.is_stricter_than(&ok));
    /// assert!(!ok.is_stricter_than(&no));
    /// ```
    pub fn is_stricter_than(&self, other: &Decision) -> bool {
        let key = |d: &Decision| (!d.allowed, d.retry_in, -(d.remaining as i128));
        key(self) > key(other)
    }
}

/// Spends `cost` tokens at `now` from a bucket whose TAT is `tat` (`None`: no bucket).
///
/// Returns the decision and the TAT to store: `Some` only when the spend was allowed and
/// `cost > 0`; a denial or a peek (`cost == 0`) changes nothing. A `cost` above the
/// limit's burst is always denied (callers reject it as an error before getting here).
///
/// ```
/// use cellrate_core::gcra::{spend, Limit};
/// let limit = Limit::new(20, 20, 1_000_000_000).unwrap();
/// let (d, tat) = spend(&limit, 0, None, 1);
/// assert!(d.allowed);
/// assert_eq!((d.remaining, d.retry_in, tat), (19, 0, Some(50_000_000)));
/// ```
pub fn spend(
    limit: &Limit,
    now: Nanos,
    tat: Option<Nanos>,
    cost: u64,
) -> (Decision, Option<Nanos>) {
    if let Window::Calendar(period) = limit.window {
        return window_spend(limit, period, now, tat, cost, false);
    }
    let t = tat.map_or(now, |tat| tat.max(now));
    let inc = limit.increment(cost);
    let new_tat = t.saturating_add(inc);
    let diff = now.saturating_sub(new_tat.saturating_sub(limit.bo));
    if diff < 0 {
        let decision = Decision {
            allowed: false,
            remaining: limit.balance(now, t),
            retry_in: diff.saturating_neg(),
            reset_in: t - now,
        };
        return (decision, None);
    }
    let decision = Decision {
        allowed: true,
        remaining: diff / limit.ei,
        retry_in: if diff < inc { inc - diff } else { 0 },
        reset_in: new_tat - now,
    };
    (decision, (cost > 0).then_some(new_tat))
}

/// Charges `cost` tokens at `now` to a bucket whose TAT is `tat`, into debt when it has too
/// few: the charge is recorded whatever the bucket holds, and `allowed` says whether it fit.
///
/// A bucket in debt has its TAT more than one burst offset past `now`: `remaining` is
/// negative (the debt in whole tokens, rounded toward zero), and every request
/// that needs a token is denied until the debt is repaid by refill. The debt is bounded at
/// one burst: the TAT never lies more than two burst offsets past `now` (the rest of a
/// larger charge is forgiven), so that one huge charge cannot lock a bucket for a century.
/// `retry_in` is the time until one token exists again (0 when one does), `reset_in` the
/// time until the bucket is full. Returns the TAT to store (`Some` when `cost > 0`).
///
/// ```
/// use cellrate_core::gcra::{charge, Limit};
/// let s = 1_000_000_000;
/// let limit = Limit::new(10, 10, s).unwrap(); // 10 a second
/// let (d, tat) = charge(&limit, 0, None, 15); // five more than it holds
/// assert!(!d.allowed);
/// assert_eq!((d.remaining, d.retry_in, tat), (-5, 600_000_000, Some(1_500_000_000)));
/// let (d, tat) = charge(&limit, 0, tat, 1_000); // the debt stops at one burst
/// assert_eq!((d.remaining, tat), (-10, Some(2 * s)));
/// ```
pub fn charge(
    limit: &Limit,
    now: Nanos,
    tat: Option<Nanos>,
    cost: u64,
) -> (Decision, Option<Nanos>) {
    if let Window::Calendar(period) = limit.window {
        return window_spend(limit, period, now, tat, cost, true);
    }
    let (decision, write) = spend(limit, now, tat, cost);
    // What fits is a spend, and a charge of nothing is a peek.
    if decision.allowed || cost == 0 {
        return (decision, write);
    }
    let t = tat.map_or(now, |tat| tat.max(now));
    let cap = now.saturating_add(limit.bo.saturating_mul(2));
    let new_tat = t.saturating_add(limit.increment(cost)).min(cap).max(t);
    let decision = Decision {
        allowed: false,
        remaining: limit.balance(now, new_tat),
        retry_in: new_tat
            .saturating_add(limit.ei)
            .saturating_sub(limit.bo)
            .saturating_sub(now)
            .max(0),
        reset_in: new_tat - now,
    };
    (decision, (cost > 0).then_some(new_tat))
}

/// Gives `cost` tokens back at `now` to a bucket whose TAT is `tat`.
///
/// Never fuller than full and never creates a bucket: a missing or full bucket stays as
/// it is and reports `allowed = false`. Otherwise `allowed` says whether the TAT moved.
/// Returns the decision and the TAT to store (`Some` only when it changed).
///
/// ```
/// use cellrate_core::gcra::{refund, spend, Limit};
/// let limit = Limit::new(10, 10, 1_000_000_000).unwrap();
/// let (_, tat) = spend(&limit, 0, None, 3);
/// let (d, tat) = refund(&limit, 0, tat, 5); // clamped at full
/// assert!(d.allowed);
/// assert_eq!((d.remaining, tat), (10, Some(0)));
/// ```
pub fn refund(
    limit: &Limit,
    now: Nanos,
    tat: Option<Nanos>,
    cost: u64,
) -> (Decision, Option<Nanos>) {
    if let Window::Calendar(period) = limit.window {
        return window_refund(limit, period, now, tat, cost);
    }
    let full = Decision {
        allowed: false,
        remaining: limit.burst,
        retry_in: 0,
        reset_in: 0,
    };
    let Some(tat) = tat.filter(|&tat| tat >= now) else {
        return (full, None);
    };
    let new_tat = tat.saturating_sub(limit.increment(cost)).max(now);
    let decision = Decision {
        allowed: new_tat != tat,
        remaining: limit.balance(now, new_tat),
        retry_in: 0,
        reset_in: new_tat - now,
    };
    (decision, decision.allowed.then_some(new_tat))
}

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
    /// Take a lease of a concurrency limit under the item's lease id ([`lease::acquire`]):
    /// counts toward the batch, written only when the batch is allowed.
    Acquire,
    /// Free the lease under the item's lease id ([`lease::release`]): does not count
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_charge_that_fits_is_a_spend() {
        let limit = Limit::new(10, 10, 1_000).unwrap();
        for tat in [None, Some(0), Some(500)] {
            assert_eq!(charge(&limit, 0, tat, 3), spend(&limit, 0, tat, 3));
        }
    }

    #[test]
    fn a_charge_goes_into_debt_at_most_one_burst_deep() {
        // 10 tokens, one per 100 ns.
        let limit = Limit::new(10, 10, 1_000).unwrap();
        let (d, tat) = charge(&limit, 0, None, 13);
        assert_eq!((d.allowed, d.remaining, tat), (false, -3, Some(1_300)));
        // A cost-0 charge is a peek.
        assert_eq!(charge(&limit, 0, tat, 0).1, None);
        // Denied until the debt and one token have come back: 400 ns.
        assert_eq!(d.retry_in, 400);
        assert!(!spend(&limit, 399, tat, 1).0.allowed);
        assert!(spend(&limit, 400, tat, 1).0.allowed);
        // Capped at one burst of debt; never moves a TAT back (a lowered limit).
        let (d, tat) = charge(&limit, 0, tat, u64::MAX);
        assert_eq!((d.remaining, tat), (-10, Some(2_000)));
        let (_, back) = charge(&limit, 0, Some(5_000), 1);
        assert_eq!(back, Some(5_000));
    }

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

    use crate::clock::SECOND;

    const MS: Nanos = 1_000_000;
    const T0: Nanos = 1_700_000_000 * SECOND;

    fn seed_limit() -> Limit {
        Limit::new(20, 20, SECOND).unwrap()
    }

    #[test]
    fn limit_rejects_zero_values_zero_interval_and_overflow() {
        assert_eq!(Limit::new(0, 1, 1), Err(LimitError::ZeroBurst));
        assert_eq!(Limit::new(1, 0, 1), Err(LimitError::ZeroCount));
        assert_eq!(Limit::new(1, 1, 0), Err(LimitError::NonPositivePeriod));
        assert_eq!(Limit::new(1, 1, -5), Err(LimitError::NonPositivePeriod));
        assert_eq!(
            Limit::new(1, 3, 2),
            Err(LimitError::ZeroEmissionInterval {
                count: 3,
                period: 2
            })
        );
        assert!(matches!(
            Limit::new(u64::MAX, 1, 1),
            Err(LimitError::TooLarge { field: "burst", .. })
        ));
        assert!(matches!(
            Limit::new(1, u64::MAX, 1),
            Err(LimitError::TooLarge { field: "count", .. })
        ));
        assert_eq!(
            Limit::new(3, 1, i64::MAX / 2),
            Err(LimitError::Overflow {
                burst: 3,
                ei: i64::MAX / 2
            })
        );
        // count == period in ns is the finest limit there is: ei = 1ns.
        assert_eq!(Limit::new(1, 1000, 1000).unwrap().emission_interval(), 1);
        // 250 years for one token (`period: 91250d`): longer than a bucket may take.
        assert!(matches!(
            Limit::new(1, 1, 91_250 * DAY),
            Err(LimitError::TooLong { .. })
        ));
        assert!(matches!(
            Limit::new(2, 1, MAX_BURST_OFFSET),
            Err(LimitError::TooLong { .. })
        ));
        assert!(Limit::new(1, 1, MAX_BURST_OFFSET).is_ok());
    }

    #[test]
    fn the_longest_accepted_limit_admits_exactly_its_burst_until_2242() {
        // Burst 1 and the longest accepted period, near today and near the end of the
        // range: exactly one admitted, the arithmetic never saturates.
        let longest = Limit::new(1, 1, MAX_BURST_OFFSET).unwrap();
        let also = Limit::new(5, 5, MAX_BURST_OFFSET).unwrap();
        let year = 365 * DAY;
        for now in [1_700_000_000 * SECOND, 272 * year] {
            for limit in [longest, also] {
                let mut tat = None;
                let mut admitted = 0;
                for _ in 0..20 {
                    let (d, write) = spend(&limit, now, tat, 1);
                    if d.allowed {
                        admitted += 1;
                        tat = write;
                    }
                    assert!(d.retry_in >= 0 && d.reset_in >= 0, "{d:?}");
                }
                assert_eq!(admitted, limit.burst(), "at {now}");
                // The whole burst at once, on a fresh bucket: allowed, and no more.
                let (d, write) = spend(&limit, now, None, limit.burst());
                assert!(d.allowed && d.remaining == 0);
                assert!(!spend(&limit, now, write, 1).0.allowed);
            }
        }
    }

    #[test]
    fn emission_interval_truncates() {
        let limit = Limit::new(3, 3, 10).unwrap();
        assert_eq!((limit.emission_interval(), limit.burst_offset()), (3, 9));
    }

    #[test]
    fn seed_000_walkthrough_with_design_correction() {
        let limit = seed_limit();
        let mut tat = None;
        for i in 1..=20 {
            let (d, w) = spend(&limit, T0, tat, 1);
            assert!(d.allowed, "request {i}");
            assert_eq!(d.remaining, 20 - i);
            tat = w;
        }
        assert_eq!(tat, Some(T0 + SECOND));
        let (d, w) = spend(&limit, T0, tat, 1);
        assert!(!d.allowed);
        assert_eq!(
            (d.remaining, d.retry_in, d.reset_in, w),
            (0, 50 * MS, SECOND, None)
        );
        // One nanosecond early is still too early.
        assert!(!spend(&limit, T0 + 50 * MS - 1, tat, 1).0.allowed);
        let (d, w) = spend(&limit, T0 + 50 * MS, tat, 1);
        assert!(d.allowed);
        assert_eq!((d.remaining, d.retry_in), (0, 50 * MS));
        assert_eq!(w, Some(T0 + SECOND + 50 * MS));
        // Weeks of idling: the TAT is in the past, the bucket is simply full.
        let later = T0 + 14 * 86_400 * SECOND;
        let (d, w) = spend(&limit, later, w, 1);
        assert_eq!(
            (d.allowed, d.remaining, w),
            (true, 19, Some(later + 50 * MS))
        );
    }

    #[test]
    fn allowed_retry_in_is_zero_while_tokens_remain() {
        let limit = seed_limit();
        let (d, _) = spend(&limit, T0, None, 1);
        assert_eq!((d.retry_in, d.reset_in), (0, 50 * MS));
    }

    #[test]
    fn cost_zero_is_a_peek_that_writes_nothing() {
        let limit = seed_limit();
        assert_eq!(
            spend(&limit, T0, None, 0),
            (
                Decision {
                    allowed: true,
                    remaining: 20,
                    retry_in: 0,
                    reset_in: 0
                },
                None
            )
        );
        let tat = Some(T0 + 300 * MS);
        let (d, w) = spend(&limit, T0, tat, 0);
        assert_eq!(
            (d.allowed, d.remaining, d.reset_in, w),
            (true, 14, 300 * MS, None)
        );
    }

    #[test]
    fn cost_above_burst_never_passes_even_when_full() {
        let limit = seed_limit();
        let (d, w) = spend(&limit, T0, None, 21);
        assert!(!d.allowed);
        assert_eq!((d.remaining, d.retry_in, w), (20, 50 * MS, None));
        // Saturates instead of overflowing on absurd costs.
        let (d, _) = spend(&limit, T0, None, u64::MAX);
        assert!(!d.allowed);
    }

    #[test]
    fn tat_in_the_past_is_a_full_bucket() {
        let limit = seed_limit();
        let past = spend(&limit, T0, Some(T0 - 7 * SECOND), 1);
        let missing = spend(&limit, T0, None, 1);
        assert_eq!(past, missing);
    }

    #[test]
    fn remaining_goes_negative_after_a_limit_is_lowered() {
        let generous = Limit::new(100, 100, SECOND).unwrap(); // ei 10ms
        let mut tat = None;
        for _ in 0..100 {
            tat = spend(&generous, T0, tat, 1).1.or(tat);
        }
        assert_eq!(tat, Some(T0 + SECOND));
        let lowered = Limit::new(10, 10, 10 * SECOND).unwrap(); // ei 1s, bo 10s: fine
        assert_eq!(spend(&lowered, T0, tat, 0).0.remaining, 9);
        let strict = Limit::new(2, 4, SECOND).unwrap(); // ei 250ms, bo 500ms
        let (d, _) = spend(&strict, T0, tat, 1);
        assert!(!d.allowed);
        assert_eq!(d.remaining, -2);
        assert_eq!(d.retry_in, 750 * MS);
    }

    #[test]
    fn refund_clamps_at_full() {
        let limit = seed_limit();
        let (_, tat) = spend(&limit, T0, None, 5);
        let (d, w) = refund(&limit, T0, tat, 2);
        assert_eq!((d.allowed, d.remaining, d.retry_in), (true, 17, 0));
        assert_eq!(w, Some(T0 + 150 * MS));
        let (d, w) = refund(&limit, T0, w, 10);
        assert_eq!(
            (d.allowed, d.remaining, d.reset_in, w),
            (true, 20, 0, Some(T0))
        );
    }

    #[test]
    fn refund_on_missing_or_full_bucket_changes_nothing() {
        let limit = seed_limit();
        let full = Decision {
            allowed: false,
            remaining: 20,
            retry_in: 0,
            reset_in: 0,
        };
        assert_eq!(refund(&limit, T0, None, 1), (full, None));
        assert_eq!(refund(&limit, T0, Some(T0 - 1), 1), (full, None));
        assert_eq!(refund(&limit, T0, Some(T0), 1), (full, None));
    }

    #[test]
    fn refund_of_zero_reports_without_change() {
        let limit = seed_limit();
        let (d, w) = refund(&limit, T0, Some(T0 + 100 * MS), 0);
        assert_eq!((d.allowed, d.remaining, w), (false, 18, None));
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
