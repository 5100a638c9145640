//! Bounds on caller-given limits: the server's word on how long a caller may make a
//! bucket live and how large it may make it.

use cellrate_core::clock::Nanos;
use cellrate_core::gcra::Limit;
#[cfg(doc)]
use cellrate_limits::names::BucketKey;

/// Bounds on limits that callers give (native inline limits, Envoy descriptor `limit`s).
///
/// A caller-given limit chooses how long its bucket lives, so without bounds one client
/// could fill the store with buckets that never expire. Their buckets live in a key space
/// of their own whose keys include the limit ([`BucketKey::caller_given`]), under a share
/// of the store's bucket bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallerLimits {
    /// Off: native inline limits are INVALID_ARGUMENT, and Envoy's descriptor `limit`s are
    /// ignored (the configured limits apply).
    pub enabled: bool,
    /// Longest period, and longest time to refill a whole burst (how long a bucket lives).
    pub max_period: Nanos,
    /// Largest burst.
    pub max_burst: u64,
}

/// The default longest period, and longest full-burst refill, of a caller-given limit: two
/// 366-day years. Every Envoy unit up to YEAR (365 days) is accepted, so are calendar years,
/// and redis-cell's `N N <a year>` quotas for every N (a full burst of N + 1 takes at most
/// two years to come back). What bounds a flood of long-lived buckets is the caller share
/// of the store (`--caller-limit-bucket-share`), not the period.
pub(super) const DEFAULT_MAX_PERIOD: Nanos = 732 * 86_400 * cellrate_core::clock::SECOND;

impl Default for CallerLimits {
    fn default() -> CallerLimits {
        CallerLimits {
            enabled: true,
            max_period: DEFAULT_MAX_PERIOD,
            max_burst: 1_000_000,
        }
    }
}

impl CallerLimits {
    /// No bounds beyond GCRA's own (for operators' tools such as `simulate`).
    pub fn unbounded() -> CallerLimits {
        CallerLimits {
            enabled: true,
            max_period: Nanos::MAX,
            max_burst: u64::MAX,
        }
    }

    /// Why `limit` is not accepted from a caller, if it is not.
    pub fn refuse(&self, limit: &Limit) -> Option<String> {
        let seconds = |n: Nanos| n as f64 / cellrate_core::clock::SECOND as f64;
        if limit.burst() > self.max_burst {
            return Some(format!(
                "burst {} is above this server's maximum {} for caller-given limits",
                limit.burst(),
                self.max_burst
            ));
        }
        if limit.period() > self.max_period {
            return Some(format!(
                "period {}s is above this server's maximum {}s for caller-given limits",
                seconds(limit.period()),
                seconds(self.max_period)
            ));
        }
        if limit.burst_offset() > self.max_period {
            return Some(format!(
                "a full burst takes {}s to refill, above this server's maximum {}s for \
                 caller-given limits",
                seconds(limit.burst_offset()),
                seconds(self.max_period)
            ));
        }
        None
    }
}
