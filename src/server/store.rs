//! Where buckets live: the store `--store` names (the memory store, memcached, or Redis
//! with the shared temporary overrides and RLQS demand that come with it).

use std::sync::Arc;

use super::{Settings, StoreSettings};
use crate::clock::Clock;
use crate::observe::health::Health;
use crate::observe::metrics::Metrics;
use crate::store::memcache::MemcacheStore;
#[cfg(feature = "redis")]
use crate::store::redis::{RedisDemand, RedisOverrides, RedisSettlements, RedisStore};
use crate::store::settlements::MemorySettlements;
use crate::store::shared::{Settlements, SharedDemand, SharedOverrides};
use crate::store::{MemoryStore, Store, StoreError};

/// The store, and the shared state that comes with it.
pub struct Stores {
    pub store: Arc<dyn Store>,
    /// Where temporary overrides are shared with other replicas (the Redis store).
    pub shared_overrides: Option<Arc<dyn SharedOverrides>>,
    /// Where RLQS demand is shared with other replicas (the Redis store).
    pub shared_demand: Option<Arc<dyn SharedDemand>>,
    /// Where Checks are kept for `Settle`: in this process, or in Redis for every replica.
    pub settlements: Option<Arc<dyn Settlements>>,
    /// The memory store, when its snapshot file is to be written.
    pub snapshot: Option<Arc<MemoryStore>>,
    /// The first call to a shared store, which logs whether it answered: run once the
    /// server starts (it ends by itself, within its deadline).
    pub start_probe: Option<StartProbe>,
}

/// A task that ends by itself.
pub type StartProbe = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl Stores {
    /// `store` alone: nothing shared.
    pub fn only(store: Arc<dyn Store>) -> Stores {
        Stores {
            store,
            shared_overrides: None,
            shared_demand: None,
            settlements: None,
            snapshot: None,
            start_probe: None,
        }
    }

    /// With Checks kept for `Settle` in this process.
    pub fn settling_here(self, settings: &Settings, clock: &Arc<dyn Clock>) -> Stores {
        Stores {
            settlements: Some(Arc::new(
                MemorySettlements::new(
                    clock.clone(),
                    settings.settle_window,
                    settings.settle_max_records,
                )
                .with_max_holds_per_key(settings.settle_max_holds_per_key),
            )),
            ..self
        }
    }

    /// The store `settings.store` names. The memory store's bound is published as a
    /// metric; with Redis `required_for_ready`, readiness follows Redis's health.
    pub fn build(
        settings: &Settings,
        clock: &Arc<dyn Clock>,
        metrics: &Arc<Metrics>,
        health: &Health,
    ) -> Result<Stores, StoreError> {
        match &settings.store {
            StoreSettings::Memory => {
                metrics.store.max_buckets.set(settings.max_buckets as i64);
                let mut store = MemoryStore::with_caller_share(
                    clock.clone(),
                    MemoryStore::shards_for(settings.max_buckets),
                    settings.max_buckets,
                    settings.caller_bucket_share,
                )
                .with_bucket_name_share(settings.bucket_name_share)
                .with_lease_bounds(settings.max_leases, settings.lease_name_share);
                if let Some(snapshot) = &settings.snapshot {
                    restore(&mut store, &snapshot.path, metrics);
                    if let Err(e) = MemoryStore::check_writable(&snapshot.path) {
                        // Said now rather than found out at shutdown.
                        tracing::error!(
                            path = %snapshot.path.display(),
                            error = %e,
                            "the snapshot file cannot be written there: buckets will not survive a restart"
                        );
                    }
                }
                let store = Arc::new(store);
                let snapshot = settings.snapshot.as_ref().map(|_| store.clone());
                Ok(Stores {
                    snapshot,
                    ..Stores::only(store).settling_here(settings, clock)
                })
            }
            StoreSettings::Memcache(memcache) => Ok(Stores::only(Arc::new(MemcacheStore::new(
                memcache,
                clock.clone(),
            )?))
            .settling_here(settings, clock)),
            #[cfg(feature = "redis")]
            StoreSettings::Redis {
                settings: redis,
                required_for_ready,
            } => {
                // The bounds of the keys a replica counts are the memory store's flags
                // (docs/redis-store.md).
                let bounded = crate::store::redis::RedisSettings {
                    max_lease_keys: settings.max_leases,
                    lease_name_share: settings.lease_name_share,
                    max_bucket_keys: settings.max_buckets,
                    caller_bucket_share: settings.caller_bucket_share,
                    bucket_name_share: settings.bucket_name_share,
                    ..(**redis).clone()
                };
                let store = RedisStore::new(bounded, clock.clone(), metrics.clone())?;
                if *required_for_ready {
                    health.require_store_health(store.healthy());
                }
                let probe = store.clone();
                let settlements = RedisSettlements::new(
                    redis,
                    settings.settle_window,
                    settings.settle_max_records,
                )?
                .with_max_holds_per_key(settings.settle_max_holds_per_key)
                .following(&store);
                Ok(Stores {
                    start_probe: Some(Box::pin(async move { probe.probe_at_start().await })),
                    store,
                    shared_overrides: Some(Arc::new(RedisOverrides::new(redis)?)),
                    shared_demand: Some(Arc::new(RedisDemand::new(redis, 3 * settings.rlqs.sync)?)),
                    settlements: Some(Arc::new(settlements)),
                    snapshot: None,
                })
            }
            #[cfg(not(feature = "redis"))]
            StoreSettings::Redis { .. } => {
                let _ = health;
                Err(no_redis())
            }
        }
    }
}

/// Restores the memory store from its snapshot file, if there is one to use: a file that
/// cannot be used is one warning and a metric, and the store starts empty.
fn restore(store: &mut MemoryStore, path: &std::path::Path, metrics: &Metrics) {
    let started = tokio::time::Instant::now();
    match store.restore_snapshot(path) {
        Ok(restored) => {
            metrics.store.snapshot.restored.set(restored.buckets as i64);
            metrics.store.snapshot.refused.set(restored.too_far as i64);
            tracing::info!(
                path = %path.display(),
                buckets = restored.buckets,
                expired = restored.expired,
                over_bound = restored.over_bound,
                too_far = restored.too_far,
                seconds = started.elapsed().as_secs_f64(),
                "memory store restored from its snapshot"
            );
            if restored.over_bound > 0 {
                tracing::warn!(
                    left_out = restored.over_bound,
                    "the snapshot holds more live buckets than --max-buckets allows"
                );
            }
            if restored.too_far > 0 {
                tracing::warn!(
                    path = %path.display(),
                    left_out = restored.too_far,
                    "the snapshot holds buckets further ahead than any limit can put one (more \
                     than 20 years): not restored (a forged or damaged file?)"
                );
            }
        }
        Err(ignored) => {
            metrics
                .store
                .snapshot
                .ignored
                .with_label_values(&[ignored.reason()])
                .inc();
            tracing::warn!(
                path = %path.display(),
                reason = %ignored,
                "snapshot not used: the memory store starts empty"
            );
        }
    }
}

/// Why `--store redis` cannot work in this build.
pub fn no_redis() -> StoreError {
    StoreError::Config(
        "this cellrate was built without the `redis` feature: --store redis is not available"
            .to_string(),
    )
}
