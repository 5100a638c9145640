//! How soon capacity is back, learned per limit, for a denial's `Retry-After` (the native
//! `retry_after`): what a replica has seen of how long leases and holds last.
//!
//! A denied item's retry time is an upper bound: a full concurrency key has a slot back
//! at the latest when its oldest lease expires, a held budget its tokens when the bucket
//! refills. Both usually come back far sooner, when a lease is released or a hold is
//! settled (giving back what it held above its cost). So a replica remembers, per limit
//! name, the last [`SAMPLES`] durations it saw:
//! - **leases**: acquire to release, for the leases it saw both ends of (at most
//!   [`WATCHED`] watched at a time per name; one expired before its release is forgotten);
//! - **holds**: opening to settlement (or release at the due), in the settlements table's
//!   time, for every hold it settled or released, whichever replica opened it.
//!
//! From [`MIN_SAMPLES`] on, a denied acquire of a full key is told to retry after the
//! typical duration ([`typical`]: the 90th percentile of the samples) less the age of the
//! key's oldest lease (its hold less the time until it expires, as the store answered);
//! a denied item of a held budget, while a hold of its limit was settled within
//! [`fresh_for`], after the typical duration (a hold taken now is likely settled by then,
//! older ones sooner). Never under [`FLOOR`] (headers are whole seconds), never longer
//! than the bound (which stands when nothing is learned). A hint: a client that comes back
//! too early is denied again, with the hint again.
//!
//! Bounded: only configured names are learned (a caller-given limit's bucket never is),
//! and at most [`MAX_NAMES`] (all forgotten when a new one would pass it, as after many
//! reloads that renamed limits). Per replica: replicas learn apart and may answer
//! differently.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use cellrate_core::clock::{Clock, Nanos, SECOND};
use cellrate_core::gcra::{Decision, Limit, Mode, Window};

/// Durations remembered per name (the last ones).
pub const SAMPLES: usize = 32;

/// Durations seen before any is used.
pub const MIN_SAMPLES: usize = 4;

/// Leases watched per name at once, from their acquire to their release.
pub const WATCHED: usize = 64;

/// Names learned at most.
pub const MAX_NAMES: usize = 4_096;

/// The shortest hint: `Retry-After` counts whole seconds.
pub const FLOOR: Nanos = SECOND;

/// The least time a hold's durations stay in use after the last settlement seen.
const FRESH_AT_LEAST: Nanos = 10 * SECOND;

/// What one name's leases or holds have shown.
#[derive(Debug, Clone, Default)]
struct Learned {
    /// The last durations, oldest overwritten first.
    durations: Vec<Nanos>,
    next: usize,
    /// The 90th percentile and the longest of `durations`, kept as they change.
    typical: Nanos,
    longest: Nanos,
    /// When a hold of the name last ended (monotonic), `None` for a lease name.
    last_hold: Option<Nanos>,
    /// Leases watched: the hash of key and lease id, and when it was acquired (monotonic).
    watched: Vec<(u64, Nanos)>,
}

impl Learned {
    fn push(&mut self, duration: Nanos) {
        let duration = duration.max(0);
        if self.durations.len() < SAMPLES {
            self.durations.push(duration);
        } else {
            self.durations[self.next] = duration;
        }
        self.next = (self.next + 1) % SAMPLES;
        let mut sorted = self.durations.clone();
        sorted.sort_unstable();
        self.typical = typical(&sorted);
        self.longest = sorted.last().copied().unwrap_or(0);
    }

    fn learned(&self) -> bool {
        self.durations.len() >= MIN_SAMPLES
    }
}

/// The 90th percentile of `sorted` (nearest rank), 0 when empty.
///
/// ```
/// use cellrate_service::service::retry_hint::typical;
/// assert_eq!(typical(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), 9);
/// assert_eq!(typical(&[4]), 4);
/// assert_eq!(typical(&[]), 0);
/// ```
pub fn typical(sorted: &[Nanos]) -> Nanos {
    match sorted.len() {
        0 => 0,
        n => sorted[(n * 9).div_ceil(10) - 1],
    }
}

/// How long after the last settlement a held budget's durations stay in use: twice the
/// longest hold seen, at least 10 s. Past it no hold of the limit is likely outstanding,
/// and the bucket's own retry time is the answer.
pub fn fresh_for(longest: Nanos) -> Nanos {
    longest.saturating_mul(2).max(FRESH_AT_LEAST)
}

/// The learned durations of every limit name (see the module's doc).
pub struct RetryHints {
    clock: Arc<dyn Clock>,
    hashing: RandomState,
    names: Mutex<HashMap<Arc<str>, Learned>>,
    /// Some hold's duration was learned: until then a denial of a budget looks nothing up.
    holds: AtomicBool,
}

impl RetryHints {
    /// Hints learned on `clock`'s monotonic time.
    pub fn new(clock: Arc<dyn Clock>) -> RetryHints {
        RetryHints {
            clock,
            hashing: RandomState::new(),
            names: Mutex::new(HashMap::new()),
            holds: AtomicBool::new(false),
        }
    }

    /// How many names have something learned (at most [`MAX_NAMES`]).
    pub fn names(&self) -> usize {
        self.names.lock().len()
    }

    fn with_name<T>(&self, name: &Arc<str>, f: impl FnOnce(&mut Learned) -> T) -> T {
        let mut names = self.names.lock();
        if names.len() >= MAX_NAMES && !names.contains_key(name) {
            names.clear();
        }
        f(names.entry(name.clone()).or_default())
    }

    /// A lease taken under `lease` in `key`'s bucket of the concurrency limit `name`
    /// (`hold`: its limit's): watched until its release when there is room (a watched
    /// lease past its hold has expired and makes room).
    pub fn acquired(&self, name: &Arc<str>, key: &str, lease: &str, hold: Nanos) {
        let id = self.hashing.hash_one((key, lease));
        let now = self.clock.monotonic();
        self.with_name(name, |learned| {
            if learned.watched.iter().any(|&(w, _)| w == id) {
                return;
            }
            if learned.watched.len() < WATCHED {
                learned.watched.push((id, now));
            } else if let Some(slot) =
                (learned.watched.iter_mut()).find(|(_, at)| now.saturating_sub(*at) >= hold)
            {
                *slot = (id, now);
            }
        });
    }

    /// A lease released: its duration learned if it was watched.
    pub fn released(&self, name: &Arc<str>, key: &str, lease: &str) {
        let id = self.hashing.hash_one((key, lease));
        let now = self.clock.monotonic();
        let mut names = self.names.lock();
        let Some(learned) = names.get_mut(name) else {
            return;
        };
        if let Some(i) = learned.watched.iter().position(|&(w, _)| w == id) {
            let (_, at) = learned.watched.swap_remove(i);
            learned.push(now.saturating_sub(at));
        }
    }

    /// A hold of the limit `name` ended (settled, or released at its due) `duration`
    /// after it was opened.
    pub fn hold_ended(&self, name: &Arc<str>, duration: Nanos) {
        let now = self.clock.monotonic();
        self.with_name(name, |learned| {
            learned.push(duration);
            learned.last_hold = Some(now);
        });
        self.holds.store(true, Ordering::Relaxed);
    }

    /// The retry time of `decision` (an item of limit `name` in `mode`, decided against
    /// `limit`) made a hint when it is denied and something is learned: at most the
    /// store's, at least [`FLOOR`] (or the store's when shorter).
    pub fn hinted(&self, name: &Arc<str>, limit: &Limit, mode: Mode, decision: &mut Decision) {
        let bound = decision.retry_in;
        if decision.allowed || bound <= FLOOR {
            return;
        }
        let hint = match (limit.window(), mode) {
            (Window::Concurrency, Mode::Acquire) => self.lease_hint(name, limit, bound),
            (Window::Concurrency, _) => None,
            (_, Mode::CheckAndSpend | Mode::CheckOnly) if self.holds.load(Ordering::Relaxed) => {
                self.hold_hint(name)
            }
            _ => None,
        };
        if let Some(hint) = hint {
            decision.retry_in = hint.max(FLOOR).min(bound);
        }
    }

    /// A full key's: the typical lease's time left, given the oldest's age.
    fn lease_hint(&self, name: &Arc<str>, limit: &Limit, bound: Nanos) -> Option<Nanos> {
        let typical = {
            let names = self.names.lock();
            let learned = names.get(name).filter(|l| l.learned())?;
            learned.typical
        };
        // Leases are never renewed: the oldest expires its hold after it was taken.
        let age = limit.period().saturating_sub(bound).max(0);
        Some(typical.saturating_sub(age))
    }

    /// A held budget's: the typical hold, while holds of its limit are being settled.
    fn hold_hint(&self, name: &Arc<str>) -> Option<Nanos> {
        let now = self.clock.monotonic();
        let names = self.names.lock();
        let learned = names.get(name).filter(|l| l.learned())?;
        let last = learned.last_hold?;
        (now.saturating_sub(last) <= fresh_for(learned.longest)).then_some(learned.typical)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::FakeClock;

    fn hints() -> (RetryHints, FakeClock) {
        let clock = FakeClock::new(0);
        (RetryHints::new(Arc::new(clock.clone())), clock)
    }

    fn denied(retry_in: Nanos) -> Decision {
        Decision {
            allowed: false,
            remaining: 0,
            retry_in,
            reset_in: retry_in,
        }
    }

    /// Leases held 2 s: a key full since its oldest was taken 1 s ago is told 1 s, not the
    /// 29 s until that one expires; before four were seen, 29 s.
    #[test]
    fn a_full_key_is_told_the_typical_lease_s_time_left() {
        let (hints, clock) = hints();
        let name: Arc<str> = Arc::from("InFlight");
        let limit = Limit::concurrency(2, 30 * SECOND).unwrap();
        let hint = |retry_in| {
            let mut d = denied(retry_in);
            hints.hinted(&name, &limit, Mode::Acquire, &mut d);
            d.retry_in
        };
        for (n, lease) in ["a", "b", "c", "d"].into_iter().enumerate() {
            assert_eq!(hint(29 * SECOND), 29 * SECOND, "{n} seen: the bound");
            hints.acquired(&name, "100:t", lease, 30 * SECOND);
            clock.advance(2 * SECOND);
            hints.released(&name, "100:t", lease);
        }
        let told = hint(29 * SECOND);
        assert!((SECOND..2 * SECOND).contains(&told), "{told}");
        // The oldest is older than the typical lease: the floor, 1 s.
        assert_eq!(hint(20 * SECOND), SECOND);
        // Never longer than the bound.
        assert_eq!(hint(SECOND / 2), SECOND / 2);
    }

    /// A hold's duration is used while holds are settled, then the bound again.
    #[test]
    fn a_held_budget_is_told_the_typical_hold_while_holds_are_settled() {
        let (hints, clock) = hints();
        let name: Arc<str> = Arc::from("Tokens");
        let limit = Limit::new(1_000, 1_000, 3_600 * SECOND).unwrap();
        let hint = |retry_in| {
            let mut d = denied(retry_in);
            hints.hinted(&name, &limit, Mode::CheckAndSpend, &mut d);
            d.retry_in
        };
        for _ in 0..MIN_SAMPLES {
            assert_eq!(hint(360 * SECOND), 360 * SECOND);
            hints.hold_ended(&name, 3 * SECOND);
        }
        assert_eq!(hint(360 * SECOND), 3 * SECOND);
        clock.advance(FRESH_AT_LEAST + 1);
        assert_eq!(hint(360 * SECOND), 360 * SECOND, "no hold settled lately");
    }

    #[test]
    fn names_are_bounded() {
        let (hints, _) = hints();
        for n in 0..MAX_NAMES + 5 {
            hints.hold_ended(&Arc::from(n.to_string()), SECOND);
        }
        assert!(hints.names() <= MAX_NAMES);
    }
}
