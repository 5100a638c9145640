//! A bucket's arithmetic on its stored number alone: the steps [`spend`](super::spend),
//! [`charge`](super::charge) and [`refund`](super::refund) take, without the answer they
//! report. The memory store reaches them through those functions; the Redis module calls
//! them on the numbers the Redis script's call carries (an increment, `ei x cost`, and a
//! burst offset; a window's end, cost, count and most used), so that a bucket decided in
//! either place moves the same way.

use crate::clock::Nanos;

/// A GCRA spend of `increment` nanoseconds at `now` from a bucket whose TAT is `tat`
/// (`None`: no bucket): where it starts (the TAT, or `now` when that has passed), the TAT
/// it would store, and whether that fits under the burst offset (`now` is at least the
/// new TAT minus the burst offset).
///
/// ```
/// use cellrate_core::gcra::stored::advance;
/// assert_eq!(advance(100, None, 50, 1_000), (100, 150, true));
/// assert_eq!(advance(100, Some(1_080), 50, 1_000), (1_080, 1_130, false));
/// ```
pub fn advance(
    now: Nanos,
    tat: Option<Nanos>,
    increment: Nanos,
    burst_offset: Nanos,
) -> (Nanos, Nanos, bool) {
    let start = tat.map_or(now, |tat| tat.max(now));
    let new_tat = start.saturating_add(increment);
    let fits = now.saturating_sub(new_tat.saturating_sub(burst_offset)) >= 0;
    (start, new_tat, fits)
}

/// The TAT a charge that does not fit stores: the spend's `new_tat` ([`advance`]), in debt
/// at most one burst deep (at most `now + 2 x burst_offset`), never before `start`.
///
/// ```
/// use cellrate_core::gcra::stored::into_debt;
/// assert_eq!(into_debt(0, 900, 5_000, 1_000), 2_000);
/// assert_eq!(into_debt(0, 2_500, 3_000, 1_000), 2_500);
/// ```
pub fn into_debt(now: Nanos, start: Nanos, new_tat: Nanos, burst_offset: Nanos) -> Nanos {
    let cap = now.saturating_add(burst_offset.saturating_mul(2));
    new_tat.min(cap).max(start)
}

/// A GCRA give-back of `increment` nanoseconds at `now` to a bucket whose TAT is `tat`:
/// the TAT it leaves (never before `now`: never fuller than full), or `None` when there is
/// no bucket or it is full already (its TAT has passed).
///
/// ```
/// use cellrate_core::gcra::stored::give_back;
/// assert_eq!(give_back(100, Some(500), 150), Some(350));
/// assert_eq!(give_back(100, Some(500), 1_000), Some(100));
/// assert_eq!(give_back(100, Some(50), 10), None);
/// ```
pub fn give_back(now: Nanos, tat: Option<Nanos>, increment: Nanos) -> Option<Nanos> {
    let tat = tat.filter(|&tat| tat >= now)?;
    Some(tat.saturating_sub(increment).max(now))
}

/// Tokens a calendar bucket whose stored value is `stored` (`W + used`) has used in the
/// window that ends at `end`: none when it belongs to an earlier window (or there is none).
///
/// ```
/// use cellrate_core::gcra::stored::window_used;
/// assert_eq!(window_used(1_000, Some(1_007)), 7);
/// assert_eq!(window_used(1_000, Some(990)), 0);
/// ```
pub fn window_used(end: Nanos, stored: Option<Nanos>) -> i64 {
    stored.filter(|&v| v >= end).map_or(0, |v| v - end)
}

/// A window's spend of `cost` tokens on `used` of `count`: whether it fits, and the use a
/// recorded spend leaves: `used + cost`, or for a charge that does not fit at most `most`
/// (the window's bound on debt) and never less than `used`.
///
/// ```
/// use cellrate_core::gcra::stored::window_after;
/// assert_eq!(window_after(3, 2, 10, 20), (true, 5));
/// assert_eq!(window_after(9, 50, 10, 20), (false, 20));
/// ```
pub fn window_after(used: i64, cost: i64, count: i64, most: i64) -> (bool, i64) {
    let after = used.saturating_add(cost);
    (after <= count, after.min(most).max(used))
}

/// A window's give-back of `cost` tokens on `used`: the use it leaves, never below none.
///
/// ```
/// use cellrate_core::gcra::stored::window_give_back;
/// assert_eq!((window_give_back(5, 2), window_give_back(5, 9)), (3, 0));
/// ```
pub fn window_give_back(used: i64, cost: i64) -> i64 {
    used.saturating_sub(cost).max(0)
}
