//! One bucket: what a request does to it, [`spend`], [`charge`] (into a bounded debt) and
//! [`refund`], and the [`Decision`] each answers. A calendar limit's bucket is handed to
//! its window's arithmetic (`calendar.rs`).

use super::calendar::{window_refund, window_spend};
use super::{stored, Limit, Window};
use crate::clock::Nanos;

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
    let inc = limit.increment(cost);
    let (t, new_tat, fits) = stored::advance(now, tat, inc, limit.bo);
    let diff = now.saturating_sub(new_tat.saturating_sub(limit.bo));
    if !fits {
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
    let (t, spent, _) = stored::advance(now, tat, limit.increment(cost), limit.bo);
    let new_tat = stored::into_debt(now, t, spent, limit.bo);
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
    let Some(new_tat) = stored::give_back(now, tat, limit.increment(cost)) else {
        return (full, None);
    };
    let decision = Decision {
        allowed: Some(new_tat) != tat,
        remaining: limit.balance(now, new_tat),
        retry_in: 0,
        reset_in: new_tat - now,
    };
    (decision, decision.allowed.then_some(new_tat))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SECOND;

    use crate::gcra::fixtures::{seed_limit, MS, T0};

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
}
