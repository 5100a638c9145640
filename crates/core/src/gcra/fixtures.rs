//! What the bucket and batch tests share: their times and the limit the seed's figures
//! are for.

use super::Limit;
use crate::clock::{Nanos, SECOND};

/// A millisecond.
pub(super) const MS: Nanos = 1_000_000;
/// A time well after the epoch.
pub(super) const T0: Nanos = 1_700_000_000 * SECOND;

/// 20 a second, a burst of 20: the seed's example limit.
pub(super) fn seed_limit() -> Limit {
    Limit::new(20, 20, SECOND).unwrap()
}
