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
//! cellrate decides a call with its own GCRA ([`crate::gcra::spend`], in its stores, so that
//! the Redis store shares the state between replicas, and in its Redis module): a limit of burst `max_burst + 1`
//! and one token per emission interval has redis-cell's tolerance, its cost is redis-cell's
//! increment, and the two decide `allowed` by the same inequality. [`reply`] then turns the
//! decision into redis-cell's five numbers. (A stored TAT already in the past counts as
//! `now` on both sides, which is what redis-cell sees once such a key has expired.)
//!
//! Arguments redis-cell computes nonsense with are refused instead (non-negotiable: bad
//! input gets a clear error and changes nothing): a zero or negative count or period, a
//! negative `max_burst` or quantity (redis-cell stores a key without expiry and then
//! answers an error), products that overflow 64 bits (redis-cell wraps them around), and
//! more than one token per nanosecond (redis-cell's interval would be 0).

use crate::clock::{Nanos, MICROSECOND, SECOND};
use crate::gcra::{Decision, Limit, LimitError};

/// The parameters of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    /// Tokens beyond the first that may be taken at once.
    pub max_burst: i64,
    /// Tokens per period.
    pub count: i64,
    /// Seconds.
    pub period: i64,
    /// Tokens this call takes (0: a peek).
    pub quantity: i64,
}

/// redis-cell's usage error, word for word.
pub const USAGE: &str =
    "Cell error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]";

impl Cell {
    /// The numbers of `CL.THROTTLE key max_burst count period [quantity]`: `numbers` are
    /// the arguments after the key (3 or 4 of them, else [`USAGE`]), each a decimal
    /// integer, with redis-cell's error word for word when one is not.
    ///
    /// ```
    /// use cellrate_core::cell::{Cell, USAGE};
    /// let cell = Cell::parse(&[b"15", b"30", b"60"]).unwrap();
    /// assert_eq!((cell.max_burst, cell.quantity), (15, 1));
    /// assert_eq!(
    ///     Cell::parse(&[b"15", b"x", b"60"]).unwrap_err(),
    ///     "Cell error: Couldn't parse as integer: x"
    /// );
    /// assert_eq!(Cell::parse(&[b"15"]).unwrap_err(), USAGE);
    /// ```
    pub fn parse(numbers: &[&[u8]]) -> Result<Cell, String> {
        if numbers.len() != 3 && numbers.len() != 4 {
            return Err(USAGE.to_string());
        }
        let integer = |arg: &[u8]| {
            decimal(arg).ok_or_else(|| {
                format!(
                    "Cell error: Couldn't parse as integer: {}",
                    String::from_utf8_lossy(arg)
                )
            })
        };
        Ok(Cell {
            max_burst: integer(numbers[0])?,
            count: integer(numbers[1])?,
            period: integer(numbers[2])?,
            quantity: numbers.get(3).map_or(Ok(1), |n| integer(n))?,
        })
    }
}

/// A decimal `i64` as `str::parse` reads one (an optional sign, then at least one digit,
/// nothing else, no overflow), folded from the bytes: no UTF-8 check and second pass over
/// the text (-250 instructions a `CL.THROTTLE`, #62).
pub fn decimal(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first()? {
        (b'-', rest) => (true, rest),
        (b'+', rest) => (false, rest),
        _ => (false, text),
    };
    if digits.is_empty() {
        return None;
    }
    let mut value: i64 = 0;
    for &b in digits {
        let digit = i64::from(b.wrapping_sub(b'0'));
        if digit > 9 {
            return None;
        }
        // Built downwards for a negative number, so that i64::MIN is reached.
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

/// A call as cellrate's stores decide it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spend {
    /// Burst `max_burst + 1`, one token per redis-cell emission interval.
    pub limit: Limit,
    /// Tokens taken (redis-cell's quantity).
    pub cost: u64,
}

/// Why a call cannot be decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CellError {
    /// A zero or negative count or period.
    #[error("count per period and period must be positive")]
    Rate,
    /// A negative burst or quantity.
    #[error("max_burst and quantity must not be negative")]
    Negative,
    /// More than one token a nanosecond.
    #[error("count per period is above one per nanosecond")]
    TooFast,
    /// Products past 64-bit nanoseconds.
    #[error("arguments too large: their products overflow 64-bit nanoseconds")]
    Overflow,
}

impl Cell {
    /// The limit and cost of this call, or why it is refused.
    pub fn spend(&self) -> Result<Spend, CellError> {
        if self.count <= 0 || self.period <= 0 {
            return Err(CellError::Rate);
        }
        if self.max_burst < 0 || self.quantity < 0 {
            return Err(CellError::Negative);
        }
        let period = self.period.checked_mul(SECOND).ok_or(CellError::Overflow)?;
        // As redis-cell: the interval in f64, truncated to whole nanoseconds.
        let emission = (period as f64 / self.count as f64) as i64;
        if emission == 0 {
            return Err(CellError::TooFast);
        }
        let burst = self.max_burst.checked_add(1).ok_or(CellError::Overflow)?;
        emission
            .checked_mul(self.quantity)
            .ok_or(CellError::Overflow)?;
        let limit = Limit::new(burst as u64, 1, emission).map_err(|e| match e {
            LimitError::ZeroEmissionInterval { .. } => CellError::TooFast,
            _ => CellError::Overflow,
        })?;
        Ok(Spend {
            limit,
            cost: self.quantity as u64,
        })
    }
}

/// `[limited, limit, remaining, retry_after, reset_after]` as redis-cell replies for
/// `spend` decided as `decision`.
pub fn reply(spend: &Spend, decision: &Decision) -> [i64; 5] {
    let emission = spend.limit.emission_interval();
    let tolerance = spend.limit.burst_offset();
    let increment = emission.saturating_mul(spend.cost as i64);
    // The bucket's distance from full: after the spend when allowed, as it is when not.
    let ttl = decision.reset_in;
    let retry_after = if !decision.allowed && increment <= tolerance {
        decision.retry_in
    } else {
        -SECOND
    };
    let next = tolerance - ttl;
    let remaining = if next > -emission {
        ((next / MICROSECOND) as f64 / (emission / MICROSECOND) as f64) as i64
    } else {
        0
    };
    [
        i64::from(!decision.allowed),
        spend.limit.burst() as i64,
        remaining,
        retry_after / SECOND,
        ttl / SECOND,
    ]
}

/// Decides `cell` for a key whose stored TAT is `tat` (`None`: no key) at `now`, as a
/// store would: the reply and the TAT to store.
pub fn throttle(
    cell: &Cell,
    tat: Option<Nanos>,
    now: Nanos,
) -> Result<([i64; 5], Option<Nanos>), CellError> {
    let spend = cell.spend()?;
    let (decision, write) = crate::gcra::spend(&spend.limit, now, tat, spend.cost);
    Ok((reply(&spend, &decision), write))
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
        assert_eq!(first.0, [0, 16, 15, -1, 2]);
        assert_eq!(first.1, Some(NOW + 2 * SECOND));
    }

    #[test]
    fn a_burst_spent_then_limited_with_the_wait() {
        let c = cell(15, 30, 60, 1);
        let mut tat = None;
        for spent in 1..=16 {
            let t = throttle(&c, tat, NOW).unwrap();
            assert_eq!(t.0[..3], [0, 16, 16 - spent], "call {spent}");
            tat = t.1;
        }
        let limited = throttle(&c, tat, NOW).unwrap();
        assert_eq!(limited.0, [1, 16, 0, 2, 32]);
        assert_eq!(limited.1, None);
        // 1.5 s later: still limited, the wait truncated to whole seconds (0.5 s -> 0).
        let later = throttle(&c, tat, NOW + 1_500_000_000).unwrap();
        assert_eq!(later.0, [1, 16, 0, 0, 30]);
        // 2 s later: one token came back.
        let back = throttle(&c, tat, NOW + 2 * SECOND).unwrap();
        assert_eq!(back.0, [0, 16, 0, -1, 32]);
    }

    #[test]
    fn peeks_oversized_costs_and_float_intervals() {
        // Quantity 0 on a fresh key: allowed, nothing spent.
        let peek = throttle(&cell(15, 30, 60, 0), None, NOW).unwrap();
        assert_eq!(peek.0, [0, 16, 16, -1, 0]);
        // A cost over the whole burst: limited, and no wait helps (-1).
        let over = throttle(&cell(15, 30, 60, 17), None, NOW).unwrap();
        assert_eq!(over.0, [1, 16, 16, -1, 0]);
        // 1 per 3 s... and 3 per 10 s: the interval is 10e9 / 3 in f64, truncated.
        let thirds = throttle(&cell(0, 3, 10, 1), None, NOW).unwrap();
        assert_eq!(thirds.1, Some(NOW + 3_333_333_333));
        assert_eq!(thirds.0, [0, 1, 0, -1, 3]);
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
            throttle(&cell(1, 2_000_000_000, 1, 1), None, NOW),
            Err(CellError::TooFast)
        );
        assert_eq!(
            throttle(&cell(1, 1, 86_400, i64::MAX / 1000), None, NOW),
            Err(CellError::Overflow)
        );
        assert_eq!(
            throttle(&cell(1, 1, i64::MAX / 2, 1), None, NOW),
            Err(CellError::Overflow)
        );
    }

    #[test]
    fn decimals_are_read_as_str_parse_reads_them() {
        let parse = |t: &[u8]| std::str::from_utf8(t).ok()?.parse::<i64>().ok();
        let mut texts: Vec<Vec<u8>> = [
            "",
            "+",
            "-",
            "0",
            "-0",
            "+0",
            "007",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "99999999999999999999",
            "1 ",
            " 1",
            "1e3",
            "0x10",
            "--1",
            "+-1",
            "١",
            "12\u{0}",
        ]
        .iter()
        .map(|t| t.as_bytes().to_vec())
        .collect();
        // Every text of up to three bytes over digits, signs and near misses.
        let alphabet = b"09+-/:a\xff";
        for a in alphabet {
            texts.push(vec![*a]);
            for b in alphabet {
                texts.push(vec![*a, *b]);
                for c in alphabet {
                    texts.push(vec![*a, *b, *c]);
                }
            }
        }
        for t in &texts {
            assert_eq!(decimal(t), parse(t), "{:?}", String::from_utf8_lossy(t));
        }
        assert_eq!(decimal(b"-9223372036854775808"), Some(i64::MIN));
    }
}
