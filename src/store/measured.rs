//! A store decorator that times every operation and reports its errors to a
//! [`StoreObserver`].

use std::sync::Arc;
use std::time::Instant;

use crate::gcra::Decision;
use crate::limits::names::BucketKey;
use crate::store::{Outcome, Store, StoreError, StoreFuture, StoreItem, StoreObserver};

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
}

impl Store for MeasuredStore {
    fn spend<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Outcome> {
        Box::pin(async move {
            let start = Instant::now();
            let result = self.inner.spend(items).await;
            self.observe("spend", start, &result);
            result
        })
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
        Box::pin(async move {
            let start = Instant::now();
            let result = self.inner.refund(items).await;
            self.observe("refund", start, &result);
            result
        })
    }

    fn reset<'a>(&'a self, keys: &'a [BucketKey]) -> StoreFuture<'a, u32> {
        Box::pin(async move {
            let start = Instant::now();
            let result = self.inner.reset(keys).await;
            self.observe("reset", start, &result);
            result
        })
    }

    fn sweep(&self) -> usize {
        self.inner.sweep()
    }

    fn live_buckets(&self) -> Option<usize> {
        self.inner.live_buckets()
    }

    fn limits_changed(&self) {
        self.inner.limits_changed()
    }
}
