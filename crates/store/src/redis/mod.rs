//! The Redis store: TATs shared by many replicas, standalone, behind Sentinel, or Redis
//! Cluster.
//!
//! Every batch is one server-side script (`batch.lua`, sent with EVALSHA and loaded
//! again on NOSCRIPT): it reads the batch's TATs, decides all-or-nothing which to write,
//! writes them with an expiry at the TAT, and returns `now` and the TATs it read. The
//! reported decisions are then computed here by [`cellrate_core::gcra`], the same code the memory
//! store runs, so the two stores answer identically for the same `now` and state. Under
//! load the batches that wait while a node's calls are in flight go together in one script
//! call, decided in arrival order, each all-or-nothing (`coalesce.rs`).
//!
//! **Temporary overrides** (admin `SetOverride`) live in one hash, `<prefix>overrides`,
//! reached over a second connection ([`RedisOverrides`]); every replica copies it into
//! memory when it changes. **Checks kept for `Settle`** live under `<prefix>{settle}:`
//! ([`RedisSettlements`]), so that a settlement counts once whichever replica it reaches.
//!
//! **Leases** of concurrency limits are a sorted set per key, read and written by the same
//! script call as the batch's TATs (`leases.rs`, docs/concurrency.md): a batch mixing
//! leases and rates stays all-or-nothing, and every replica sees every lease.
//!
//! Time comes from Redis `TIME` (replicas' clocks drift; the store's clock is the one they
//! share), at microsecond resolution, or from cellrate's clock with [`RedisClock::Local`].
//!
//! **Redis Cluster.** Keys are grouped by hash slot and the groups run in parallel, each
//! atomically. When a cross-slot batch has a group that denies while others spent, the
//! spent groups are refunded (a compensation, counted in
//! `cellrate_store_compensations_total`); between the spend and the refund another request
//! may see those tokens gone, so a cross-slot batch is all-or-nothing in its result but
//! not isolated. Tag a name's keys by id (`--redis-tag-by-id`) so that one id's limits share
//! a slot and its batches stay single-slot. Ids are escaped (`{` `}` `%`) so that callers
//! cannot pick slots.
//!
//! **Failures.** Every call has a deadline (default 50 ms, below the examples' 100 ms RLS
//! timeout; chosen from measurement: BENCHMARKS.md, "The Redis deadline"). A circuit
//! breaker per slot (one for standalone) fails fast after repeated errors and lets exactly
//! one trial through after a cool-down (half-open). On failure the [`FailurePolicy`] decides: UNAVAILABLE (the
//! default; Envoy's `failure_mode_deny` then decides), allow, deny, or decide locally in
//! memory with a share of each limit. Connections re-establish by themselves. Failures and
//! breaker turns are logged at WARN, a few lines a minute at most (`failure_log.rs`); the
//! first call, at start, logs whether Redis answered.
//!
//! **Sentinel.** The sentinels name the master; a failover is followed (`sentinel.rs`).

mod settings;
pub use settings::{
    url_problem, Coalescing, FailurePolicy, RedisClock, RedisModule, RedisSettings, RedisTls,
    SentinelSettings, MAX_TLS_FILE_BYTES, SENTINEL_TLS_REFUSED,
};

#[cfg(feature = "redis")]
mod breaker;
#[cfg(feature = "redis")]
mod bucket_keys;
#[cfg(feature = "redis")]
mod cluster;
#[cfg(feature = "redis")]
mod coalesce;
#[cfg(feature = "redis")]
mod connection;
#[cfg(feature = "redis")]
mod demand;
#[cfg(feature = "redis")]
mod deny_cache;
#[cfg(feature = "redis")]
mod errors;
#[cfg(feature = "redis")]
mod failure;
#[cfg(feature = "redis")]
mod failure_log;
#[cfg(feature = "redis")]
mod invocation;
#[cfg(feature = "redis")]
mod items;
#[cfg(feature = "redis")]
mod lease_keys;
#[cfg(feature = "redis")]
mod leases;
#[cfg(feature = "redis")]
mod once;
#[cfg(feature = "redis")]
mod overrides;
#[cfg(feature = "redis")]
mod sentinel;
#[cfg(feature = "redis")]
mod settlements;
#[cfg(feature = "redis")]
mod store;
#[cfg(feature = "redis")]
mod tls;
#[cfg(feature = "redis")]
mod wire;

#[cfg(feature = "redis")]
pub use bucket_keys::{BucketClaim, BucketKeys, Written};
#[cfg(feature = "redis")]
pub use cluster::slot;
#[cfg(feature = "redis")]
pub use demand::RedisDemand;
#[cfg(feature = "redis")]
pub use lease_keys::{Claim, LeaseKeys, Settled};
#[cfg(feature = "redis")]
pub use overrides::RedisOverrides;
#[cfg(feature = "redis")]
pub use settlements::RedisSettlements;
#[cfg(feature = "redis")]
pub use store::RedisStore;
