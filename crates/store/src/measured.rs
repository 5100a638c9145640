//! A store decorator that times every operation and reports its errors to a
//! [`StoreObserver`].

use std::sync::Arc;
use tokio::time::Instant;

use crate::{Outcome, Store, StoreError, StoreEvent, StoreFuture, StoreItem, StoreObserver};
use cellrate_core::gcra::Decision;
use cellrate_limits::names::BucketKey;
use cellrate_observe::metrics::Metrics;

/// `inner`, timed: each operation reports its duration and whether it failed.
pub struct MeasuredStore {
    inner: Arc<dyn Store>,
    observer: Arc<dyn StoreObserver>,
}

impl MeasuredStore {
    pub fn new(inner: Arc<dyn Store>, observer: Arc<dyn StoreObserver>) -> MeasuredStore {
        MeasuredStore { inner, observer }
    }

    fn observe<T>(&self, op: &'static str, start: Instant, result: &Result<T, StoreError>) {
        self.observer
            .operation(op, start.elapsed().as_secs_f64(), result.is_ok());
    }

    /// `call`, timed from its first poll and reported as `op`.
    fn timed<'a, T: 'a>(
        &'a self,
        op: &'static str,
        call: StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let start = Instant::now();
            let result = call.await;
            self.observe(op, start, &result);
            result
        })
    }
}

impl Store for MeasuredStore {
    fn spend<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Outcome> {
        self.timed("spend", self.inner.spend(items))
    }

    fn keeps_tokens(&self) -> bool {
        self.inner.keeps_tokens()
    }

    fn spend_once<'a>(
        &'a self,
        items: &'a [StoreItem],
        once: &'a crate::Once,
    ) -> StoreFuture<'a, Outcome> {
        self.timed("spend", self.inner.spend_once(items, once))
    }

    fn resolve_once<'a>(
        &'a self,
        items: &'a [StoreItem],
        once: &'a crate::Once,
    ) -> StoreFuture<'a, Outcome> {
        self.timed("spend", self.inner.resolve_once(items, once))
    }

    fn try_spend_now(&self, items: &[StoreItem]) -> Option<Result<Outcome, StoreError>> {
        let start = Instant::now();
        let result = self.inner.try_spend_now(items)?;
        self.observe("spend", start, &result);
        Some(result)
    }

    fn waits(&self) -> bool {
        self.inner.waits()
    }

    fn refund<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Vec<Decision>> {
        self.timed("refund", self.inner.refund(items))
    }

    fn reset<'a>(&'a self, keys: &'a [BucketKey]) -> StoreFuture<'a, u32> {
        self.timed("reset", self.inner.reset(keys))
    }

    fn sweep(&self) -> usize {
        self.inner.sweep()
    }

    fn live_buckets(&self) -> Option<usize> {
        self.inner.live_buckets()
    }

    fn bucket_refusals(&self) -> [u64; 3] {
        self.inner.bucket_refusals()
    }

    fn lease_events(&self) -> crate::LeaseEvents {
        self.inner.lease_events()
    }

    fn limits_changed(&self) {
        self.inner.limits_changed()
    }

    fn in_flight(&self, per_name: usize, only: Option<u32>) -> Option<Vec<crate::InFlightName>> {
        self.inner.in_flight(per_name, only)
    }
}

/// The Prometheus series are the store's observer in a server.
impl StoreObserver for Metrics {
    fn operation(&self, op: &'static str, seconds: f64, ok: bool) {
        self.store_operation(op, seconds, ok);
    }

    fn event(&self, event: StoreEvent) {
        match event {
            StoreEvent::Fallback(policy) => self.store_fallback(policy),
            StoreEvent::Compensation => self.store_compensation(),
            StoreEvent::DenyCacheHit => self.deny_cache_hit(),
            StoreEvent::BreakerRejection => self.breaker_rejection(),
            StoreEvent::BreakerOpened => self.breaker_turned(true),
            StoreEvent::BreakerClosed => self.breaker_turned(false),
            StoreEvent::SpendCall { batches } => self.redis_spend_call(batches),
            StoreEvent::Queued(items) => self.redis_queued(items),
        }
    }
}
