//! Wrong `AUTH` tokens counted per client address, across connections.
//!
//! A connection is closed after [`super::auth::MAX_AUTH_FAILURES`] wrong tokens, but a
//! client can open another one; this bounds the guessing of one address whatever the
//! number of its connections: `burst` wrong tokens (`--resp-auth-failure-burst`, default
//! [`FAILURE_BURST`]), then one more every `period / burst` (`--resp-auth-failure-period-
//! seconds`, default [`FAILURE_PERIOD`]): a GCRA bucket per address, from the crate's own
//! arithmetic. While an address has none left, its `AUTH` is refused without the
//! token being compared, so a locked-out guesser learns nothing; a right token from
//! another address is unaffected.
//!
//! IPv6 addresses count by their /64 (what one host usually holds). At most
//! `--resp-auth-max-addresses` (default [`MAX_ADDRESSES`]) addresses are tracked; when the table is full of live buckets, the
//! failures of untracked addresses share one bucket, so that spraying addresses does not
//! lift the bound on guesses (at the cost of locking out those addresses together).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use cellrate_core::clock::{Clock, Nanos, SystemClock};
use cellrate_core::gcra::{self, Limit};

/// Wrong tokens an address may give at once.
pub const FAILURE_BURST: u64 = 10;

/// Time for an address's allowance of wrong tokens to refill.
pub const FAILURE_PERIOD: Duration = Duration::from_secs(60);

/// Addresses tracked at most.
pub const MAX_ADDRESSES: usize = 10_000;

/// Whose failures a bucket counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Address(IpAddr),
    /// Every address that found the table full.
    Untracked,
}

/// The lockout's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockoutSettings {
    /// Wrong tokens an address may give at once.
    pub burst: u64,
    /// Time for that allowance to refill.
    pub period: Duration,
    /// Addresses tracked at most.
    pub max_addresses: usize,
}

impl Default for LockoutSettings {
    fn default() -> LockoutSettings {
        LockoutSettings {
            burst: FAILURE_BURST,
            period: FAILURE_PERIOD,
            max_addresses: MAX_ADDRESSES,
        }
    }
}

/// The per-address failure buckets of one listener.
pub struct AuthLockout {
    limit: Limit,
    max_addresses: usize,
    /// Whose [`Clock::monotonic`] time the buckets count in (a test skips a lockout by
    /// advancing a fake clock).
    clock: Arc<dyn Clock>,
    /// Each bucket's TAT, in the clock's monotonic nanoseconds.
    buckets: Mutex<HashMap<Source, Nanos>>,
}

impl Default for AuthLockout {
    fn default() -> AuthLockout {
        AuthLockout::new(LockoutSettings::default(), Arc::new(SystemClock))
    }
}

impl AuthLockout {
    /// A lockout with `settings` (a burst of 0 counts as 1; the flags' ranges keep the rest
    /// valid, and an invalid period falls back to the default).
    pub fn new(settings: LockoutSettings, clock: Arc<dyn Clock>) -> AuthLockout {
        let burst = settings.burst.max(1);
        let period = i64::try_from(settings.period.as_nanos()).unwrap_or(i64::MAX);
        let limit = Limit::new(burst, burst, period).unwrap_or_else(|_| {
            let period = FAILURE_PERIOD.as_nanos() as i64;
            Limit::new(FAILURE_BURST, FAILURE_BURST, period).expect("a valid default limit")
        });
        AuthLockout {
            limit,
            max_addresses: settings.max_addresses.max(1),
            clock,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn now(&self) -> Nanos {
        self.clock.monotonic()
    }

    /// Whether `address` may have a token compared now: `Err` with the time until it may.
    pub fn check(&self, address: IpAddr) -> Result<(), Duration> {
        let now = self.now();
        let buckets = self.buckets.lock();
        let source = Source::Address(source_of(address));
        let tat = match buckets.get(&source) {
            Some(tat) => Some(*tat),
            // An address the table has no room for counts with the other untracked ones.
            None if buckets.len() >= self.max_addresses => buckets.get(&Source::Untracked).copied(),
            None => None,
        };
        let (decision, _) = gcra::spend(&self.limit, now, tat, 1);
        if decision.allowed {
            Ok(())
        } else {
            Err(Duration::from_nanos(decision.retry_in.unsigned_abs()))
        }
    }

    /// Counts a wrong token from `address`.
    pub fn failed(&self, address: IpAddr) {
        let now = self.now();
        let mut buckets = self.buckets.lock();
        let mut source = Source::Address(source_of(address));
        if !buckets.contains_key(&source) && buckets.len() >= self.max_addresses {
            // Full buckets hold nothing worth keeping.
            buckets.retain(|_, tat| *tat > now);
            if buckets.len() >= self.max_addresses {
                source = Source::Untracked;
            }
        }
        let tat = buckets.get(&source).copied();
        if let (_, Some(tat)) = gcra::spend(&self.limit, now, tat, 1) {
            buckets.insert(source, tat);
        }
    }
}

/// What an address counts as: itself, or for IPv6 its /64 (what one host usually holds);
/// an IPv4-mapped IPv6 address as its IPv4 address.
pub fn source_of(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::{FakeClock, SECOND};

    fn v4(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn the_numbers_are_settings() {
        let lockout = AuthLockout::new(
            LockoutSettings {
                burst: 2,
                period: Duration::from_secs(3600),
                max_addresses: 1,
            },
            Arc::new(SystemClock),
        );
        for _ in 0..2 {
            assert!(lockout.check(v4(1)).is_ok());
            lockout.failed(v4(1));
        }
        let wait = lockout.check(v4(1)).unwrap_err();
        assert!(wait > Duration::from_secs(1_700), "{wait:?}");
        // A second address finds the table full: it counts with the untracked ones.
        lockout.failed(v4(2));
        assert_eq!(lockout.buckets.lock().len(), 2);
    }

    #[test]
    fn an_address_gets_its_burst_then_waits_and_others_are_unaffected() {
        let lockout = AuthLockout::default();
        for _ in 0..FAILURE_BURST {
            assert!(lockout.check(v4(1)).is_ok());
            lockout.failed(v4(1));
        }
        let wait = lockout.check(v4(1)).unwrap_err();
        // One more every 6 s.
        assert!(wait > Duration::from_secs(5) && wait <= Duration::from_secs(6));
        assert!(lockout.check(v4(2)).is_ok());
    }

    #[test]
    fn a_locked_out_address_may_try_again_once_its_clock_has_moved_on() {
        let clock = FakeClock::new(0);
        let settings = LockoutSettings {
            burst: 2,
            ..LockoutSettings::default()
        };
        let lockout = AuthLockout::new(settings, Arc::new(clock.clone()));
        for _ in 0..2 {
            lockout.failed(v4(1));
        }
        // Two per minute: one more every 30 s.
        let wait = lockout.check(v4(1)).unwrap_err();
        assert!(wait > Duration::from_secs(29), "{wait:?}");
        clock.advance(29 * SECOND);
        assert!(lockout.check(v4(1)).is_err(), "not before its time");
        clock.advance(wait.as_nanos() as Nanos - 29 * SECOND);
        assert!(lockout.check(v4(1)).is_ok(), "at its time, without waiting");
    }

    #[test]
    fn ipv6_counts_by_its_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(source_of(a), source_of(b));
        assert_ne!(source_of(a), source_of(c));
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(source_of(mapped), v4(1));
    }

    #[test]
    fn a_full_table_shares_one_bucket_among_the_untracked() {
        let lockout = AuthLockout::default();
        for i in 0..MAX_ADDRESSES as u32 {
            lockout.failed(IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
        }
        // New addresses share the untracked bucket: ten failures among them, then none.
        let sprayed = |i: u32| IpAddr::from((0x0b00_0000 + i).to_be_bytes());
        for i in 0..FAILURE_BURST as u32 {
            assert!(lockout.check(sprayed(i)).is_ok());
            lockout.failed(sprayed(i));
        }
        assert!(lockout.check(sprayed(1_000)).is_err());
        // A tracked address keeps its own bucket.
        assert!(lockout.check(IpAddr::from([10, 0, 0, 1])).is_ok());
        assert!(lockout.buckets.lock().len() <= MAX_ADDRESSES + 1);
    }
}
