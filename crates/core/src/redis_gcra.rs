//! `GCRA key max_burst tokens_per_period period [TOKENS count]`, the command Redis 8.8
//! announced (and held back) and client libraries already send (redisson, rueidis,
//! phpredis, go-redis), with the arguments and the five integers those clients parse.
//!
//! Redis's arithmetic, read from its `src/gcra.c` and command table, and kept here:
//! - `period` is a double of seconds, above 0 and below 1e12; the emission interval is
//!   `period x 1e6 / tokens_per_period` rounded to the nearest microsecond (at least 1);
//!   `limit = max_burst + 1`; the tolerance is `emission x limit` (as redis-cell's);
//! - `TOKENS count` spends `count` tokens (default 1); the first clients sent the older
//!   keyword `NUM_REQUESTS`, accepted as well; `TOKENS 0` peeks (the clients document it
//!   so: allowed unless the bucket is over-full, nothing spent);
//! - the reply is `[limited, max_burst + 1, remaining, retry_after, full_burst_after]`, all
//!   integers: `remaining` is `(tolerance - ttl) / emission` truncated (0 when that
//!   difference is not above minus one interval), `retry_after` the wait rounded *up* to
//!   whole seconds (-1 when allowed, and when the cost is above the whole burst),
//!   `full_burst_after` the time to a full bucket rounded up to whole seconds.
//!
//! cellrate decides the call with its own GCRA in its store (or inside Redis, in its module), on the same bucket a
//! `CL.THROTTLE` of the same key uses (a limit of burst `max_burst + 1`, one token per
//! interval, the interval in whole microseconds as nanoseconds), and [`reply`] turns the
//! decision into those numbers. Redis reads its clock in milliseconds; cellrate reads it in
//! nanoseconds, so a wait that Redis rounds up from a whole millisecond may read one second
//! more or less here only when it falls within a millisecond of a whole second.

use crate::cell::Spend;
use crate::clock::{MICROSECOND, SECOND};
use crate::gcra::{Decision, Limit};

/// The parameters of one `GCRA` call, as given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GcraCall {
    /// Tokens beyond the first that may be taken at once.
    pub max_burst: i64,
    /// Tokens per period.
    pub tokens_per_period: i64,
    /// Seconds.
    pub period: f64,
    /// Tokens this call takes (`TOKENS count`; 0: a peek).
    pub tokens: i64,
}

/// Redis's texts for arguments that are not numbers or out of their range.
const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const NOT_FLOAT: &str = "ERR value is not a valid float";

fn integer(arg: &[u8]) -> Result<i64, String> {
    crate::cell::decimal(arg).ok_or_else(|| NOT_INTEGER.to_string())
}

fn at_least(arg: &[u8], min: i64) -> Result<i64, String> {
    let n = integer(arg)?;
    if n < min {
        return Err(format!(
            "ERR value is out of range, value must between {min} and {}",
            i64::MAX
        ));
    }
    Ok(n)
}

/// Parses the arguments after the key (`args` is the whole command), with Redis's errors.
pub fn parse(args: &[impl AsRef<[u8]>]) -> Result<GcraCall, String> {
    if !(5..=7).contains(&args.len()) {
        return Err("ERR wrong number of arguments for 'gcra' command".into());
    }
    let max_burst = integer(args[2].as_ref())?;
    if max_burst < 0 {
        return Err("ERR value is out of range, must be positive".into());
    }
    let tokens_per_period = at_least(args[3].as_ref(), 1)?;
    let period = std::str::from_utf8(args[4].as_ref())
        .ok()
        .and_then(|text| text.parse::<f64>().ok())
        .filter(|p| !p.is_nan())
        .ok_or_else(|| NOT_FLOAT.to_string())?;
    if !(period > 0.0 && period < 1e12) {
        return Err("ERR period must be > 0 and < 1e12".into());
    }
    let mut tokens = 1;
    if let Some(word) = args.get(5) {
        let word = word.as_ref();
        if !word.eq_ignore_ascii_case(b"TOKENS") && !word.eq_ignore_ascii_case(b"NUM_REQUESTS") {
            return Err("ERR syntax error".into());
        }
        let Some(count) = args.get(6) else {
            return Err("ERR Missing TOKENS value".into());
        };
        tokens = at_least(count.as_ref(), 0)?;
    }
    Ok(GcraCall {
        max_burst,
        tokens_per_period,
        period,
        tokens,
    })
}

impl GcraCall {
    /// The limit and cost of this call in cellrate's stores, or why it cannot be one.
    pub fn spend(&self) -> Result<Spend, String> {
        let overflow = || {
            "ERR max_burst, tokens_per_period, period and TOKENS overflow 64-bit nanoseconds"
                .to_string()
        };
        // As Redis: the interval in microseconds, rounded to the nearest, at least 1.
        let micros = (self.period * 1e6 / self.tokens_per_period as f64 + 0.5) as i64;
        let emission = micros
            .max(1)
            .checked_mul(MICROSECOND)
            .ok_or_else(overflow)?;
        let burst = self.max_burst.checked_add(1).ok_or_else(overflow)?;
        emission.checked_mul(self.tokens).ok_or_else(overflow)?;
        let limit = Limit::new(burst as u64, 1, emission).map_err(|e| format!("ERR {e}"))?;
        Ok(Spend {
            limit,
            cost: self.tokens as u64,
        })
    }
}

/// Whole seconds of `n` nanoseconds, rounded up (as Redis's `ceil`).
fn seconds_up(n: i64) -> i64 {
    n.div_euclid(SECOND) + i64::from(n.rem_euclid(SECOND) != 0)
}

/// `[limited, max_burst + 1, remaining, retry_after, full_burst_after]` as Redis's `GCRA`
/// replies for `spend` decided as `decision`.
pub fn reply(spend: &Spend, decision: &Decision) -> [i64; 5] {
    let emission = spend.limit.emission_interval();
    let tolerance = spend.limit.burst_offset();
    let increment = emission.saturating_mul(spend.cost as i64);
    let ttl = decision.reset_in;
    let retry_after = if !decision.allowed && increment <= tolerance {
        seconds_up(decision.retry_in)
    } else {
        -1
    };
    let next = tolerance - ttl;
    let remaining = if next > -emission { next / emission } else { 0 };
    [
        i64::from(!decision.allowed),
        spend.limit.burst() as i64,
        remaining,
        retry_after,
        seconds_up(ttl),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Nanos;

    const NOW: Nanos = 1_700_000_000 * SECOND;

    fn run(
        args: &[&str],
        tat: Option<Nanos>,
        now: Nanos,
    ) -> Result<([i64; 5], Option<Nanos>), String> {
        let spend = parse(args)?.spend()?;
        let (decision, write) = crate::gcra::spend(&spend.limit, now, tat, spend.cost);
        Ok((reply(&spend, &decision), write))
    }

    #[test]
    fn the_documented_examples() {
        // 5 burst, 10 per 60 s: 6 s apart, a full bucket holds 6.
        let first = run(&["GCRA", "k", "5", "10", "60"], None, NOW).unwrap();
        assert_eq!(first.0, [0, 6, 5, -1, 6]);
        let mut tat = first.1;
        for _ in 0..5 {
            tat = run(&["GCRA", "k", "5", "10", "60"], tat, NOW).unwrap().1;
        }
        let limited = run(&["GCRA", "k", "5", "10", "60"], tat, NOW).unwrap();
        assert_eq!(limited.0, [1, 6, 0, 6, 36]);
        // Half a second later the wait rounds up: 5.5 s reads 6.
        let later = run(&["gcra", "k", "5", "10", "60"], tat, NOW + SECOND / 2).unwrap();
        assert_eq!(later.0, [1, 6, 0, 6, 36]);
        // TOKENS 0 peeks; NUM_REQUESTS is the older keyword.
        let peek = run(&["GCRA", "k", "5", "10", "60", "TOKENS", "0"], tat, NOW).unwrap();
        assert_eq!((peek.0, peek.1), ([0, 6, 0, -1, 36], None));
        let three = run(
            &["GCRA", "j", "5", "10", "60", "num_requests", "3"],
            None,
            NOW,
        )
        .unwrap();
        assert_eq!(three.0, [0, 6, 3, -1, 18]);
        // A fractional period, rounded to the nearest microsecond: 1 s / 3.
        let thirds = run(&["GCRA", "t", "0", "3", "1.0"], None, NOW).unwrap();
        assert_eq!(thirds.1, Some(NOW + 333_333_000));
    }

    #[test]
    fn bad_arguments_get_redis_errors() {
        let err = |args: &[&str]| run(args, None, NOW).unwrap_err();
        assert_eq!(
            err(&["GCRA", "k", "1", "1"]),
            "ERR wrong number of arguments for 'gcra' command"
        );
        assert_eq!(
            err(&["GCRA", "k", "-1", "1", "1"]),
            "ERR value is out of range, must be positive"
        );
        assert_eq!(err(&["GCRA", "k", "x", "1", "1"]), NOT_INTEGER);
        assert!(err(&["GCRA", "k", "1", "0", "1"]).starts_with("ERR value is out of range"));
        for period in ["nan", "x", ""] {
            assert_eq!(err(&["GCRA", "k", "1", "1", period]), NOT_FLOAT, "{period}");
        }
        for period in ["0", "-1", "inf", "1e12"] {
            assert_eq!(
                err(&["GCRA", "k", "1", "1", period]),
                "ERR period must be > 0 and < 1e12"
            );
        }
        assert_eq!(
            err(&["GCRA", "k", "1", "1", "1", "COST", "1"]),
            "ERR syntax error"
        );
        assert_eq!(
            err(&["GCRA", "k", "1", "1", "1", "TOKENS"]),
            "ERR Missing TOKENS value"
        );
        assert!(err(&["GCRA", "k", "1", "1", "1", "TOKENS", "-1"])
            .starts_with("ERR value is out of range"));
        assert!(err(&[
            "GCRA",
            "k",
            "1",
            "1",
            "9e11",
            "TOKENS",
            &i64::MAX.to_string()
        ])
        .contains("overflow"));
        assert!(err(&["GCRA", "k", &i64::MAX.to_string(), "1", "1"]).contains("overflow"));
    }
}
