//! Time for decisions: [`Nanos`] since the Unix epoch, read through a [`Clock`].
//!
//! This is the only module that reads the operating system's clock (`.clippy.toml` bans
//! `SystemTime::now` elsewhere). Decisions take `now` from an injected clock so that
//! tests and `cellrate simulate` move a [`FakeClock`] instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Unix time or a duration, in integer nanoseconds. `i64` covers the years 1678 to 2262.
pub type Nanos = i64;

/// Nanoseconds in one second.
pub const SECOND: Nanos = 1_000_000_000;
/// One microsecond.
pub const MICROSECOND: Nanos = 1_000;

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// The current Unix time in nanoseconds.
    fn now(&self) -> Nanos;
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one sanctioned read of the OS clock
    fn now(&self) -> Nanos {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Nanos::try_from(since.as_nanos()).unwrap_or(Nanos::MAX)
    }
}

/// A clock that stands still until told to move; clones share one time.
///
/// ```
/// use cellrate::clock::{Clock, FakeClock};
/// let clock = FakeClock::new(1_000);
/// clock.advance(500);
/// assert_eq!(clock.now(), 1_500);
/// ```
#[derive(Debug, Clone, Default)]
pub struct FakeClock(Arc<AtomicI64>);

impl FakeClock {
    /// A fake clock reading `start`.
    pub fn new(start: Nanos) -> FakeClock {
        FakeClock(Arc::new(AtomicI64::new(start)))
    }

    /// Move the clock forward (or back, with a negative `by`).
    pub fn advance(&self, by: Nanos) {
        self.0.fetch_add(by, Ordering::SeqCst);
    }

    /// Set the clock to `to`.
    pub fn set(&self, to: Nanos) {
        self.0.store(to, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Nanos {
        self.0.load(Ordering::SeqCst)
    }
}
