//! The ports through which replicas share state other than buckets, beside the store that
//! implements them (the Redis store, `store::redis`): temporary overrides
//! ([`SharedOverrides`], used by `crate::service::overrides`) and RLQS demand
//! ([`SharedDemand`], used by `crate::service::rlqs`). They live here, below the services
//! that use them, so that a store never imports a service.

use std::sync::Arc;

use crate::clock::Nanos;
use crate::store::StoreFuture;

/// A table of temporary overrides shared by replicas (see `crate::service::overrides`). Fields are
/// `"<number>:<override id>"`; records are opaque to the table, which keeps each with its
/// expiry, in its own clock.
pub trait SharedOverrides: Send + Sync + 'static {
    /// Writes `record` under `field` for `ttl`, after dropping the expired, unless `field`
    /// is new and `max` others are in force.
    fn put<'a>(
        &'a self,
        field: &'a str,
        record: &'a str,
        ttl: Nanos,
        max: usize,
    ) -> StoreFuture<'a, Put>;
    /// Removes `field`; whether it was in force.
    fn remove<'a>(&'a self, field: &'a str) -> StoreFuture<'a, bool>;
    /// The table unless its version is `known` (`""` before the first fetch).
    fn fetch<'a>(&'a self, known: &'a str) -> StoreFuture<'a, Fetched>;
}

/// What [`SharedOverrides::put`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    Written,
    /// Nothing written: `held` overrides are in force.
    Full(usize),
}

/// What [`SharedOverrides::fetch`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    Unchanged,
    Changed {
        version: String,
        /// Every unexpired entry: field, record, time left (`None`: unreadable expiry).
        entries: Vec<(String, String, Option<Nanos>)>,
    },
}

/// The reporters of one key, summed up: how many, how many with a known demand, and the
/// sum of the known demands (capped). What replicas share with each other.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Aggregate {
    pub reporters: u64,
    pub known: u64,
    pub sum: f64,
}

/// Demand for limit keys shared by replicas (the Redis store): see docs/rlqs.md. `crate::service::rlqs`
/// exchanges its [`Aggregate`]s through it.
pub trait SharedDemand: Send + Sync + 'static {
    /// Publishes this replica's reporters of each key and returns, in the same order, the
    /// other replicas' reporters of it.
    fn exchange<'a>(&'a self, mine: &'a [(Arc<str>, Aggregate)])
        -> StoreFuture<'a, Vec<Aggregate>>;
}
