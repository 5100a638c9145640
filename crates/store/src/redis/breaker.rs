//! Circuit breakers, one per slot (one for standalone), and readiness from them.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};

use super::RedisStore;
use crate::StoreEvent;

/// A circuit breaker: counts consecutive failures; after `breaker_threshold` it opens
/// (calls fail fast) until a deadline on the store clock's monotonic time (a test skips
/// the cool-down by advancing its fake clock), then is half-open: exactly one call goes
/// through as a trial, the others still fail fast; the trial's success closes it, its
/// failure opens it for another cool-down.
#[derive(Default)]
pub(super) struct Breaker {
    failures: AtomicU32,
    /// 0: closed; else the monotonic time (at least 1) it opened until.
    open_until: AtomicI64,
    /// Half-open: a trial call is in flight.
    trial: AtomicBool,
    /// Whether the last call through this breaker failed (for readiness).
    failing: AtomicBool,
    /// Whether any call went through this breaker (cluster slots).
    used: AtomicBool,
}

impl RedisStore {
    pub(super) fn breaker(&self, slot: usize) -> &Breaker {
        &self.breakers[slot % self.breakers.len()]
    }

    /// Whether a call to `slot` may go ahead: the breaker is closed, or this call is the
    /// half-open breaker's one trial.
    pub(super) fn admit(&self, slot: usize) -> bool {
        let breaker = self.breaker(slot);
        let open_until = breaker.open_until.load(Ordering::Relaxed);
        let admitted = open_until == 0
            || (self.clock.monotonic() >= open_until
                && breaker
                    .trial
                    .compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok());
        if admitted && self.breakers.len() > 1 && !breaker.used.swap(true, Ordering::Relaxed) {
            self.used_slot_count.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    pub(super) fn note(&self, slot: usize, ok: bool) {
        let breaker = self.breaker(slot);
        let was_failing = breaker.failing.swap(!ok, Ordering::Relaxed);
        if was_failing == ok {
            if ok {
                self.failing_slots.fetch_sub(1, Ordering::Relaxed);
            } else {
                self.failing_slots.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Ready while some slot answers: in a cluster, one dead primary must not make
        // every replica unready (its slots fail; the others serve), nor may readiness
        // follow whichever slot answered last.
        let failing = self.failing_slots.load(Ordering::Relaxed);
        self.healthy.store(
            failing == 0 || failing < self.used_slots(),
            Ordering::Relaxed,
        );
        // Transitions are seen by whoever swaps `open_until` from 0 or to 0, exactly once
        // each, so that the open-breakers gauge counts them without a lock.
        if ok {
            breaker.failures.store(0, Ordering::Relaxed);
            if breaker.open_until.swap(0, Ordering::Relaxed) != 0 {
                self.observer.event(StoreEvent::BreakerClosed);
                self.failure_log.breaker_turned(false, slot);
            }
            breaker.trial.store(false, Ordering::Relaxed);
            return;
        }
        let failures = breaker.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let half_open = breaker.open_until.load(Ordering::Relaxed) != 0;
        if half_open || failures >= self.settings.breaker_threshold {
            let cooldown = i64::try_from(self.settings.breaker_cooldown.as_nanos());
            let until = (self.clock.monotonic()).saturating_add(cooldown.unwrap_or(i64::MAX));
            if breaker.open_until.swap(until.max(1), Ordering::Relaxed) == 0 {
                self.observer.event(StoreEvent::BreakerOpened);
                self.failure_log.breaker_turned(true, slot);
            }
            breaker.trial.store(false, Ordering::Relaxed);
        }
    }

    /// Breakers that have seen a call.
    pub(super) fn used_slots(&self) -> usize {
        if self.breakers.len() == 1 {
            return 1;
        }
        self.used_slot_count.load(Ordering::Relaxed)
    }
}
