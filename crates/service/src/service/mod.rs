//! The [`Decider`]: requests in domain terms -> one store batch -> decisions.
//!
//! Both front ends (the native API and Envoy's RLS) convert their protobuf requests into
//! [`ItemSpec`]s and call the decider, which resolves names and ids against the current
//! [`LimitTable`](cellrate_limits::config::LimitTable), checks the batch (size, duplicates, cost <= burst), sends the limited
//! items to the [`Store`](cellrate_store::Store) in one call and assembles per-item and overall decisions.
//! This is also the single place where a [`StoreError`](cellrate_store::StoreError) becomes a `tonic::Status`.
//!
//! The request and result types are [`request`]; the decider is `decider.rs`, and how it
//! turns an item into a bucket, a rule and a cost is `resolve.rs`.

mod caller_limits;
mod decider;
pub mod envoy;
mod errors;
pub mod headers;
pub mod native;
pub mod overrides;
pub mod quota_book;
mod quota_share;
mod quota_strategy;
pub mod ratelimit_bucket;
pub mod request;
mod resolve;
pub mod retry_hint;
pub mod rlqs;
pub mod settle;
pub mod token;
pub mod trace;

pub use caller_limits::CallerLimits;
pub use cellrate_limits::descriptors::InvalidIds;
pub use decider::Decider;
pub use errors::{store_unavailable, DecideError, Invalid};
pub use ratelimit_bucket::RatelimitShape;
pub use request::{
    count_decisions, outcome, BatchResult, CheckOptions, ItemResult, ItemSpec, OnceSpend, Rule,
    Target,
};
pub use resolve::MAX_LEASE_ID;

/// The most items one request may name.
pub const MAX_BATCH: usize = 64;

/// The longest limit name a request may give (declared names are at most 128 bytes).
pub const MAX_NAME: usize = 128;

/// The largest request message any gRPC service decodes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The name reported for inline limits.
pub const INLINE_NAME: &str = "inline";
