//! `CL.THROTTLE key max_burst count period [quantity]` decided exactly as redis-cell 0.2.2
//! decides it, so that its callers get the same five numbers from cellrate.
//!
//! redis-cell's arithmetic is not cellrate's exact integer GCRA, and is reproduced as it is
//! (read from its source, `src/cell/mod.rs` and `src/lib.rs` of the 0.2.2 crate):
//! - the emission interval is `period x 1e9 / count` computed in `f64` and truncated to
//!   whole nanoseconds; `limit = max_burst + 1`; the tolerance is `emission x limit`;
//! - a call costs `emission x quantity`; it is limited when
//!   `now < max(now, tat) + cost - tolerance`; then `retry_after` is the difference, but only
//!   when the cost fits the tolerance (else -1 s), and `reset_after = tat - now`; otherwise
//!   the new TAT is stored with a time to live of `new_tat - now`, its `reset_after`;
//! - `remaining` is `(tolerance - reset_after)` in whole microseconds over the emission
//!   interval in whole microseconds, in `f64`, truncated, when that difference exceeds minus
//!   one interval, else 0;
//! - both times are replied in whole seconds truncated toward zero.
//!
//! Unlike redis-cell, which wraps around on overflow, arguments whose products do not fit
//! 64 bits are refused here (the listener bounds them further).

use crate::clock::{Nanos, SECOND};

/// The parameters of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    pub max_burst: i64,
    pub count: i64,
    /// Seconds.
    pub period: i64,
    pub quantity: i64,
}

/// What a call answers, and what it stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    /// `[limited, limit, remaining, retry_after, reset_after]`, as replied.
    pub reply: [i64; 5],
    /// The new TAT and its time to live, when the call was allowed.
    pub write: Option<(Nanos, Nanos)>,
}

/// Why a call cannot be decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CellError {
    #[error("count and period must be positive")]
    Rate,
    #[error("max_burst and quantity must not be negative")]
    Negative,
    #[error("arguments too large")]
    Overflow,
}

/// Decides `cell` for a key whose stored TAT is `tat` (`None`: no key) at `now`.
pub fn throttle(cell: &Cell, tat: Option<Nanos>, now: Nanos) -> Result<Throttled, CellError> {
    if cell.count <= 0 || cell.period <= 0 {
        return Err(CellError::Rate);
    }
    if cell.max_burst < 0 || cell.quantity < 0 {
        return Err(CellError::Negative);
    }
    let period = cell.period.checked_mul(SECOND).ok_or(CellError::Overflow)?;
    let emission = (period as f64 / cell.count as f64) as i64;
    let limit = cell.max_burst.checked_add(1).ok_or(CellError::Overflow)?;
    let tolerance = emission.checked_mul(limit).ok_or(CellError::Overflow)?;
    let increment = emission
        .checked_mul(cell.quantity)
        .ok_or(CellError::Overflow)?;
    let tat = tat.unwrap_or(now);
    let new_tat = now
        .max(tat)
        .checked_add(increment)
        .ok_or(CellError::Overflow)?;
    let diff = now - (new_tat - tolerance);
    let (limited, retry_after, ttl, write) = if diff < 0 {
        let retry = if increment <= tolerance {
            -diff
        } else {
            -SECOND
        };
        (true, retry, tat - now, None)
    } else {
        let ttl = new_tat - now;
        (false, -SECOND, ttl, Some((new_tat, ttl)))
    };
    let next = tolerance - ttl;
    let remaining = if next > -emission {
        ((next / 1_000) as f64 / (emission / 1_000) as f64) as i64
    } else {
        0
    };
    Ok(Throttled {
        reply: [
            i64::from(limited),
            limit,
            remaining,
            retry_after / SECOND,
            ttl / SECOND,
        ],
        write,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Nanos = 1_700_000_000 * SECOND;

    fn cell(max_burst: i64, count: i64, period: i64, quantity: i64) -> Cell {
        Cell {
            max_burst,
            count,
            period,
            quantity,
        }
    }

    #[test]
    fn redis_cells_own_example() {
        // redis-cell's README: CL.THROTTLE user123 15 30 60 1 -> 0 16 15 -1 2.
        let first = throttle(&cell(15, 30, 60, 1), None, NOW).unwrap();
        assert_eq!(first.reply, [0, 16, 15, -1, 2]);
        assert_eq!(first.write, Some((NOW + 2 * SECOND, 2 * SECOND)));
    }

    #[test]
    fn a_burst_spent_then_limited_with_the_wait() {
        let c = cell(15, 30, 60, 1);
        let mut tat = None;
        for spent in 1..=16 {
            let t = throttle(&c, tat, NOW).unwrap();
            assert_eq!(t.reply[..3], [0, 16, 16 - spent], "call {spent}");
            tat = t.write.map(|(tat, _)| tat);
        }
        let limited = throttle(&c, tat, NOW).unwrap();
        assert_eq!(limited.reply, [1, 16, 0, 2, 32]);
        assert_eq!(limited.write, None);
        // 1.5 s later: still limited, the wait truncated to whole seconds (0.5 s -> 0).
        let later = throttle(&c, tat, NOW + 1_500_000_000).unwrap();
        assert_eq!(later.reply, [1, 16, 0, 0, 30]);
        // 2 s later: one token came back.
        let back = throttle(&c, tat, NOW + 2 * SECOND).unwrap();
        assert_eq!(back.reply, [0, 16, 0, -1, 32]);
    }

    #[test]
    fn peeks_oversized_costs_and_float_intervals() {
        // Quantity 0 on a fresh key: allowed, nothing spent.
        let peek = throttle(&cell(15, 30, 60, 0), None, NOW).unwrap();
        assert_eq!(peek.reply, [0, 16, 16, -1, 0]);
        // A cost over the whole burst: limited, and no wait helps (-1).
        let over = throttle(&cell(15, 30, 60, 17), None, NOW).unwrap();
        assert_eq!(over.reply, [1, 16, 16, -1, 0]);
        // 1 per 3 s... and 3 per 10 s: the interval is 10e9 / 3 in f64, truncated.
        let thirds = throttle(&cell(0, 3, 10, 1), None, NOW).unwrap();
        assert_eq!(thirds.write, Some((NOW + 3_333_333_333, 3_333_333_333)));
        assert_eq!(thirds.reply, [0, 1, 0, -1, 3]);
    }

    #[test]
    fn arguments_redis_cell_would_wrap_are_refused() {
        assert_eq!(
            throttle(&cell(1, 0, 60, 1), None, NOW),
            Err(CellError::Rate)
        );
        assert_eq!(throttle(&cell(1, 1, 0, 1), None, NOW), Err(CellError::Rate));
        assert_eq!(
            throttle(&cell(-1, 1, 1, 1), None, NOW),
            Err(CellError::Negative)
        );
        assert_eq!(
            throttle(&cell(1, 1, 1, -1), None, NOW),
            Err(CellError::Negative)
        );
        assert_eq!(
            throttle(&cell(i64::MAX, 1, 1, 1), None, NOW),
            Err(CellError::Overflow)
        );
        assert_eq!(
            throttle(&cell(1, 1, i64::MAX / 2, 1), None, NOW),
            Err(CellError::Overflow)
        );
    }
}
