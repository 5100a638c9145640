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
mod bucket;
mod calendar;
#[cfg(test)]
mod fixtures;
pub mod lease;
pub mod stored;
pub use batch::{
    no_room, spend_alone, spend_batch, spend_batch_with, strictest, BatchItem, BatchOutcome, Mode,
};
pub use bucket::{charge, refund, spend, Decision};
pub use calendar::MAX_CALENDAR_COUNT;

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
    /// A calendar window that records every hit charged to it (envoyproxy/ratelimit's
    /// counter, [`Limit::fixed_window`]): its use is bounded by the window's room, not by
    /// one count of debt. What the limit is, not a number: scaling keeps it.
    every_hit: bool,
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
            every_hit: false,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SECOND;

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
}
