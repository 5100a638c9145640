//! Fault injection for the settlement tests: wrappers around a real store and a real
//! settlements table that fail chosen calls, either before the call (nothing happened) or
//! after it (it happened, and the caller is told it timed out, as when a reply misses
//! its deadline). (The settlements table's wrapper is in `settle_promise.rs`.)

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellrate::gcra::{Decision, Mode};
use cellrate::limits::names::BucketKey;
use cellrate::store::{Outcome, Store, StoreError, StoreFuture, StoreItem};

/// What happens to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// It goes through.
    Pass,
    /// Refused before it reaches the data (an open breaker): surely nothing happened.
    Refused,
    /// Lost before it reaches the data, but reported as a missed deadline.
    Lost,
    /// Made, then reported as a missed deadline.
    Late,
}

/// The faults to inject, one per call, in order; `Pass` once they run out.
#[derive(Default)]
pub struct Schedule(Mutex<VecDeque<Fault>>);

impl Schedule {
    pub fn set(&self, faults: impl IntoIterator<Item = Fault>) {
        *self.0.lock().unwrap() = faults.into_iter().collect();
    }

    pub fn next(&self) -> Fault {
        self.0.lock().unwrap().pop_front().unwrap_or(Fault::Pass)
    }
}

fn timeout(op: &'static str) -> StoreError {
    StoreError::Timeout {
        op,
        timeout: Duration::from_millis(10),
    }
}

/// Makes `call` under `fault` (only then: the memory store does its work when called).
pub async fn faulted<'a, T>(
    fault: Fault,
    op: &'static str,
    call: impl FnOnce() -> StoreFuture<'a, T>,
) -> Result<T, StoreError> {
    match fault {
        Fault::Pass => call().await,
        Fault::Refused => Err(StoreError::CircuitOpen),
        Fault::Lost => Err(timeout(op)),
        Fault::Late => {
            call().await?;
            Err(timeout(op))
        }
    }
}

/// A store whose calls fail as scheduled: every call, or (`adjustments_only`) only the
/// refunds and the spends that charge (what a `Settle` does, not a `Check` or a peek).
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    pub faults: Schedule,
    adjustments_only: bool,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>, adjustments_only: bool) -> Arc<FaultyStore> {
        Arc::new(FaultyStore {
            inner,
            faults: Schedule::default(),
            adjustments_only,
        })
    }
}

impl Store for FaultyStore {
    fn spend<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Outcome> {
        let charges = items.iter().any(|i| i.mode == Mode::Charge);
        let fault = match !self.adjustments_only || charges {
            true => self.faults.next(),
            false => Fault::Pass,
        };
        Box::pin(faulted(fault, "spend", || self.inner.spend(items)))
    }

    fn refund<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Vec<Decision>> {
        Box::pin(faulted(self.faults.next(), "refund", || {
            self.inner.refund(items)
        }))
    }

    fn reset<'a>(&'a self, keys: &'a [BucketKey]) -> StoreFuture<'a, u32> {
        self.inner.reset(keys)
    }
}
