//! What an RLQS bucket is told to do ([`Strategy`]): allow, deny, or a token bucket of a
//! share of a limit, as [`super::quota_book`] assigns it.

use cellrate_core::clock::SECOND;
use cellrate_core::gcra::Limit;

/// Fill intervals offered to Envoy, in seconds (Envoy reads whole seconds only).
const FILL_SECONDS: [u32; 6] = [1, 10, 60, 600, 3_600, 86_400];

/// What a bucket is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    AllowAll,
    DenyAll,
    /// Envoy's token bucket: `max_tokens`, refilled at `tokens_per_fill / fill_seconds`
    /// per second (continuously).
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_seconds: u32,
    },
}

impl Strategy {
    /// Requests per second this strategy admits in the long run (`inf` for allow-all).
    pub fn rate(&self) -> f64 {
        match *self {
            Strategy::AllowAll => f64::INFINITY,
            Strategy::DenyAll => 0.0,
            Strategy::TokenBucket {
                tokens_per_fill,
                fill_seconds,
                ..
            } => f64::from(tokens_per_fill) / f64::from(fill_seconds),
        }
    }

    /// The token bucket for `fraction` of `limit`: never a faster rate nor a larger burst
    /// than the fraction (rounded down), but at least one token held, and one token a day.
    pub fn share(limit: &Limit, fraction: f64) -> Strategy {
        let fraction = fraction.clamp(0.0, 1.0);
        let rate = per_second(limit) * fraction;
        let max_tokens = ((limit.burst() as f64 * fraction).floor()).clamp(1.0, u32::MAX as f64);
        // The shortest interval that expresses the rate to 1 % (100 tokens a fill or more).
        let (mut tokens, mut seconds) = (0.0, FILL_SECONDS[FILL_SECONDS.len() - 1]);
        for s in FILL_SECONDS {
            tokens = (rate * f64::from(s)).floor();
            seconds = s;
            if tokens >= 100.0 {
                break;
            }
        }
        Strategy::TokenBucket {
            max_tokens: max_tokens as u32,
            tokens_per_fill: tokens.clamp(1.0, u32::MAX as f64) as u32,
            fill_seconds: seconds,
        }
    }

    /// The more restrictive of two strategies (the lower rate; then the smaller burst).
    pub(super) fn stricter(self, other: Strategy) -> Strategy {
        let burst = |s: &Strategy| match s {
            Strategy::TokenBucket { max_tokens, .. } => *max_tokens,
            Strategy::AllowAll => u32::MAX,
            Strategy::DenyAll => 0,
        };
        let (a, b) = ((self.rate(), burst(&self)), (other.rate(), burst(&other)));
        if b.0 < a.0 || (b.0 == a.0 && b.1 < a.1) {
            other
        } else {
            self
        }
    }
}

/// A limit's rate in requests per second.
pub(super) fn per_second(limit: &Limit) -> f64 {
    limit.count() as f64 * SECOND as f64 / limit.period() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::quota_book::tests::per_second_limit;

    #[test]
    fn shares_are_token_buckets_never_above_their_fraction() {
        let limit = per_second_limit(100);
        assert_eq!(
            Strategy::share(&limit, 0.5),
            Strategy::TokenBucket {
                max_tokens: 50,
                tokens_per_fill: 500,
                fill_seconds: 10
            }
        );
        assert_eq!(
            Strategy::share(&limit, 1.0),
            Strategy::TokenBucket {
                max_tokens: 100,
                tokens_per_fill: 100,
                fill_seconds: 1
            }
        );
        // 300 per 3 hours: whole seconds, to 1 %, never faster than the limit.
        let slow = Limit::new(300, 300, 10_800 * SECOND).unwrap();
        let share = Strategy::share(&slow, 1.0);
        assert!(share.rate() <= 300.0 / 10_800.0 && share.rate() >= 0.99 * 300.0 / 10_800.0);
        // A share under one token a day is one token a day, and a burst of at least one.
        let tiny = Strategy::share(&slow, 1e-6);
        assert_eq!(
            tiny,
            Strategy::TokenBucket {
                max_tokens: 1,
                tokens_per_fill: 1,
                fill_seconds: 86_400
            }
        );
    }
}
