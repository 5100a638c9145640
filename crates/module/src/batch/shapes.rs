//! The numbers of `batch.lua`'s call, parsed once and checked before anything is read or
//! written: a call's shapes (what a limit does to its key) and its batches of items.

use cellrate_core::clock::{CalendarPeriod, Nanos, SECOND};
use cellrate_core::gcra::stored;
use redis_module::{RedisError, RedisString};

/// The mode digits, exactly those of the store's `wire.rs` (`Action`) and the script's.
pub(super) const CHECK_ONLY: u8 = b'1';
pub(super) const SPEND_ONLY: u8 = b'2';
pub(super) const CHARGE: u8 = b'3';
pub(super) const ACQUIRE: u8 = b'4';
pub(super) const RELEASE: u8 = b'5';
pub(super) const HOLDERS: u8 = b'6';

/// The calendar letters, in [`CalendarPeriod::UNZONED`]'s order (the script's `FIXED`,
/// `MONTH` and `YEAR`; the store's `LETTERS`).
const LETTERS: &[u8; 9] = b"smhdoywtz";

/// The last whole second of Unix nanoseconds in an `i64` (2262): no TAT is stored past it.
pub(super) const MAX_TAT: Nanos = 9_223_372_035 * SECOND;

pub(super) fn bad(what: &str) -> RedisError {
    RedisError::String(format!("cellrate: {what}"))
}

/// An argument as text.
pub(super) fn utf8(arg: &RedisString) -> Result<&str, RedisError> {
    std::str::from_utf8(arg.as_slice()).map_err(|_| bad("an argument is not text"))
}

/// A whole number of the call (digits), at most `i64::MAX`: a larger one (a cost of
/// `u64::MAX`) is as large as any, as the script's doubles read it.
pub(super) fn number(text: &str) -> Result<i64, RedisError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(&format!("{text:?} is not a whole number")));
    }
    Ok(text.parse().unwrap_or(i64::MAX))
}

/// A calendar window's end: a letter's period, or a zoned window's four boundaries in
/// seconds around cellrate's now.
#[derive(Clone, Copy, Debug)]
pub(super) enum Calendar {
    Period(CalendarPeriod),
    Zoned([i64; 4]),
}

impl Calendar {
    /// Its letter (`o`), or `x` and its boundaries (`x<b0>,<b1>,<b2>,<b3>`).
    pub(super) fn parse(text: &str) -> Result<Calendar, RedisError> {
        let mut chars = text.bytes();
        match chars.next() {
            Some(b'x') => {
                let mut bounds = [0; 4];
                let mut parts = text[1..].split(',');
                for bound in &mut bounds {
                    *bound = number(parts.next().unwrap_or(""))?;
                }
                if parts.next().is_some() {
                    return Err(bad("a zoned window needs four boundaries"));
                }
                Ok(Calendar::Zoned(bounds))
            }
            Some(letter) if text.len() == 1 => LETTERS
                .iter()
                .position(|&l| l == letter)
                .map(|at| Calendar::Period(CalendarPeriod::UNZONED[at]))
                .ok_or_else(|| bad(&format!("unknown calendar letter {}", letter as char))),
            _ => Err(bad(&format!("unknown calendar letter {text}"))),
        }
    }

    /// The end of the window that holds `now`: a zoned window's first boundary after it
    /// (a now outside the boundaries is an error: no window is guessed).
    pub(super) fn end(self, now: Nanos) -> Result<Nanos, RedisError> {
        match self {
            Calendar::Period(period) => Ok(period.window_end(now)),
            Calendar::Zoned(bounds) => {
                let seconds = now.div_euclid(SECOND);
                (seconds >= bounds[0])
                    .then(|| bounds[1..].iter().find(|&&b| seconds < b))
                    .flatten()
                    .map(|&b| b * SECOND)
                    .ok_or_else(|| {
                        bad("the Redis clock is over a zoned window away from cellrate's")
                    })
            }
        }
    }
}

/// What one shape does to its key.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    /// GCRA: the increment (`ei x cost`) and the burst offset.
    Gcra {
        increment: Nanos,
        burst_offset: Nanos,
    },
    /// A calendar window: cost and count in tokens, and the most a window may hold.
    Window {
        calendar: Calendar,
        cost: i64,
        count: i64,
        most: i64,
    },
    /// A lease key: the hold, and the count of leases.
    Lease { hold: Nanos, count: i64 },
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) mode: u8,
    pub(super) kind: Kind,
    /// It spends nothing (its first number is `0`): never written.
    pub(super) zero: bool,
}

impl Shape {
    /// A shape's three values: its first and second numbers and its mode.
    pub(super) fn parse(first: &str, second: &str, mode: &str) -> Result<Shape, RedisError> {
        let digit = *mode
            .as_bytes()
            .first()
            .ok_or_else(|| bad("a shape has no mode"))?;
        let kind = match digit {
            ACQUIRE | RELEASE | HOLDERS if mode.len() == 1 => Kind::Lease {
                hold: number(first)?,
                count: number(second)?,
            },
            b'0'..=b'3' if mode.len() > 1 => {
                let (count, most) = match second.split_once('/') {
                    Some((count, most)) => (number(count)?, number(most)?),
                    None => {
                        let count = number(second)?;
                        (count, count.saturating_mul(2))
                    }
                };
                Kind::Window {
                    calendar: Calendar::parse(&mode[1..])?,
                    cost: number(first)?,
                    count,
                    most,
                }
            }
            b'0'..=b'3' => Kind::Gcra {
                increment: number(first)?,
                burst_offset: number(second)?,
            },
            _ => return Err(bad(&format!("unknown mode {mode}"))),
        };
        Ok(Shape {
            mode: digit,
            kind,
            zero: first == "0",
        })
    }

    pub(super) fn is_lease(&self) -> bool {
        matches!(self.kind, Kind::Lease { .. })
    }

    /// A bucket item's decision at `now` on the TAT `tat`: whether it fits and the value
    /// it would store (a charge that does not fit: its debt), through the core's steps.
    pub(super) fn decide(
        &self,
        now: Nanos,
        tat: Option<Nanos>,
    ) -> Result<(bool, Nanos), RedisError> {
        match self.kind {
            Kind::Gcra {
                increment,
                burst_offset,
            } => {
                let (start, new_tat, fits) = stored::advance(now, tat, increment, burst_offset);
                let ok = fits && new_tat < MAX_TAT;
                if !ok && self.mode == CHARGE {
                    return Ok((ok, stored::into_debt(now, start, new_tat, burst_offset)));
                }
                Ok((ok, new_tat))
            }
            Kind::Window {
                calendar,
                cost,
                count,
                most,
            } => {
                let end = calendar.end(now)?;
                let used = stored::window_used(end, tat);
                let (fits, after) = stored::window_after(used, cost, count, most);
                let value = end.saturating_add(after);
                Ok((fits && value < MAX_TAT, value))
            }
            Kind::Lease { .. } => Err(bad("a lease key decided as a bucket")),
        }
    }
}
