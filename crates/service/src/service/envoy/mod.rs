//! Envoy's Rate Limit Service v3 (`envoy.service.ratelimit.v3.RateLimitService`):
//! descriptors -> one all-or-nothing batch -> statuses, headers and metadata.
//!
//! Protocol facts the code relies on:
//! - the request's `hits_addend` 0 means 1; a descriptor's own `hits_addend` (a
//!   `UInt64Value`) wins when present, and an explicit 0 asks without spending;
//! - Envoy treats UNKNOWN as "allow" and cannot act on a per-descriptor error, so a cost
//!   above the burst is OVER_LIMIT for that descriptor, and a store failure is UNAVAILABLE;
//! - `overall_code` is OK or OVER_LIMIT, never UNKNOWN.
//!
//! `decide.rs` checks the request and maps its descriptors to one batch; `respond.rs`
//! turns the batch's answer into statuses, rate-limit headers and dynamic metadata
//! (the headers by [`crate::service::headers`], shared with the native `Check`), leaving
//! out limits configured `headers: hidden`; `wire.rs` serves the RPC and writes the answer,
//! its metadata as bytes encoded once.

mod batch;
mod decide;
mod held;
mod ratelimit;
mod refusal;
mod reserve;
mod respond;
mod upstream;
mod values;
mod wire;

use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::{Request, Response, Status};

use crate::service::settle::Settler;
use crate::service::{trace, Decider};
use cellrate_core::clock::SECOND;
use cellrate_core::gcra::Limit;
use cellrate_core::text::LogEvery;
use cellrate_observe::metrics::Metrics;
use cellrate_store::shared::Settlements;

pub use held::{parse_zero_check_hold, Estimate, ZeroCheckHolds, LEARNED_CHARGES, MAX_LEARNED};
use refusal::{malformed, Refusal};
pub use reserve::ENVOY_REQUEST_IDS;
pub use values::{decode_request, stand_in, STAND_IN_PREFIX};
pub use wire::{Answer, RlsServer};

/// Which rate-limit headers go into `response_headers_to_add` (`--rate-limit-headers`),
/// how `duration_until_reset` is given, the names of envoyproxy/ratelimit's three.
pub use crate::service::headers::{requests_per_unit, HeaderNames, HeaderStyle, ResetStyle};

/// What `dynamic_metadata` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MetadataStyle {
    /// cellrate's: on OVER_LIMIT (or a shadow denial), which limit fired and which
    /// denied in shadow mode.
    #[default]
    Cellrate,
    /// envoyproxy/ratelimit's (its RESPONSE_DYNAMIC_METADATA): on every answer, the
    /// domain, the descriptors, and the `metadata` of the matched limits that passed.
    Ratelimit,
    /// None.
    Off,
}

/// A header name Envoy accepts: 1 to 128 bytes of an HTTP token (RFC 9110), not a
/// pseudo-header.
///
/// ```
/// use cellrate_service::service::envoy::check_header_name;
/// assert!(check_header_name("RateLimit-Limit").is_ok());
/// assert!(check_header_name("bad name").unwrap_err().contains("token"));
/// ```
pub fn check_header_name(name: &str) -> Result<(), String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > 128 {
        return Err("a header name is 1 to 128 bytes".to_string());
    }
    if !name.bytes().all(token) {
        return Err(format!(
            "{:?} is not an HTTP token (letters, digits, !#$%&'*+-.^_`|~)",
            cellrate_core::text::printable(cellrate_core::text::cut_bytes(name, 64))
        ));
    }
    Ok(())
}

/// How limits from envoyproxy/ratelimit's file format count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RatelimitCounting {
    /// As envoyproxy/ratelimit: fixed windows aligned to the unit, every hit counted on
    /// every descriptor, a denied one too.
    #[default]
    FixedWindow,
    /// cellrate's exact GCRA (burst = requests_per_unit), all-or-nothing across the
    /// request's descriptors.
    Gcra,
}

/// How ShouldRateLimit answers. The defaults are cellrate's (`serve`); the `ratelimit`
/// personality sets envoyproxy/ratelimit's.
#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    pub headers: HeaderStyle,
    /// The names of [`HeaderStyle::Ratelimit`]'s headers.
    pub header_names: HeaderNames,
    /// envoyproxy/ratelimit's three fields for the upstream request
    /// (`request_headers_to_add`), under these names (its LIMIT_REQUEST_HEADERS_ENABLED).
    pub request_header_names: Option<HeaderNames>,
    /// Global shadow mode: decide, spend and count, but always answer OK.
    pub shadow: bool,
    /// How envoyproxy/ratelimit-format limits count.
    pub ratelimit_counting: RatelimitCounting,
    /// `current_limit.name` of a limit in envoyproxy/ratelimit's format: its `name`, else
    /// its full key (true); its `name`, else empty, as there (false).
    pub limit_names: bool,
    pub resets: ResetStyle,
    /// `Retry-After` on OVER_LIMIT.
    pub retry_after: bool,
    pub metadata: MetadataStyle,
    /// envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, for its
    /// fixed-window counting: when a request takes some descriptor over its limit, only
    /// the descriptors it takes over are counted.
    pub stop_increment_when_over_limit: bool,
    /// Buckets of envoyproxy/ratelimit-format limits named by its key text
    /// (`<domain>_<key>_<value>_...`) instead of a digest: for the memcache store, whose
    /// keys are envoyproxy/ratelimit's.
    pub upstream_keys: bool,
    /// With `upstream_keys`: each value as it is, exactly envoyproxy/ratelimit's key (a
    /// value holding `_<key>_` then names another descriptor's counter, as there);
    /// otherwise `%` and `_` in a value are written `%25` and `%5F`, so that no value can.
    pub exact_upstream_keys: bool,
    /// envoyproxy/ratelimit's global QUOTA_MODE: every descriptor of a domain in its
    /// format that is not unlimited is in quota mode, as if each limit said `quota_mode`.
    pub quota_mode: bool,
    /// envoyproxy/ratelimit's NEAR_LIMIT_RATIO: `near_limit` counts hits above this share
    /// of a limit (its threshold computed in float32, as there).
    pub near_limit_ratio: f32,
    /// The check-0, charge-later pattern held on these limits (`--zero-check-holds`).
    pub zero_check_holds: ZeroCheckHolds,
}

impl EnvoyOptions {
    /// What shapes the buckets of envoyproxy/ratelimit-format limits under these options
    /// (the admin commands name them back with it: [`crate::service::Decider`]).
    pub fn ratelimit_shape(&self) -> crate::service::RatelimitShape {
        crate::service::RatelimitShape {
            fixed_window: self.ratelimit_counting == RatelimitCounting::FixedWindow,
            upstream_keys: self.upstream_keys,
            exact_upstream_keys: self.exact_upstream_keys,
        }
    }
}

impl Default for EnvoyOptions {
    fn default() -> EnvoyOptions {
        EnvoyOptions {
            headers: HeaderStyle::Off,
            header_names: HeaderNames::default(),
            request_header_names: None,
            shadow: false,
            ratelimit_counting: RatelimitCounting::FixedWindow,
            limit_names: true,
            resets: ResetStyle::Exact,
            retry_after: true,
            metadata: MetadataStyle::Cellrate,
            stop_increment_when_over_limit: false,
            upstream_keys: false,
            exact_upstream_keys: false,
            quota_mode: false,
            near_limit_ratio: 0.8,
            zero_check_holds: ZeroCheckHolds::default(),
        }
    }
}

/// The RLS service, served on the decision listener.
pub struct EnvoyRateLimitService {
    decider: Arc<Decider>,
    options: EnvoyOptions,
    metrics: Arc<Metrics>,
    /// The invalid-id lines: at most one a second, timed from `started`.
    invalid_ids: LogEvery,
    started: Instant,
    /// Where reservations (`reserve` rules) are kept for their settlement (none: a
    /// reservation is UNIMPLEMENTED).
    settler: Option<Settler>,
    /// Held buckets' recent charges (`held.rs`).
    learned: held::Learned,
}

impl EnvoyRateLimitService {
    pub fn new(
        decider: Arc<Decider>,
        options: EnvoyOptions,
        metrics: Arc<Metrics>,
    ) -> EnvoyRateLimitService {
        EnvoyRateLimitService {
            decider,
            options,
            metrics,
            invalid_ids: LogEvery::new(Duration::from_secs(1)),
            started: Instant::now(),
            settler: None,
            learned: held::Learned::default(),
        }
    }

    /// Keeps reservations in `table`, the table the native `Settle` uses.
    pub fn with_settlements(mut self, table: Arc<dyn Settlements>) -> EnvoyRateLimitService {
        self.settler = Some(Settler::new(table, self.metrics.clone()));
        self
    }
}

/// Input limits of ShouldRateLimit (each a clear INVALID_ARGUMENT when exceeded).
pub const MAX_DOMAIN: usize = 256;
pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 16;
pub const MAX_ENTRY_KEY: usize = 256;
pub const MAX_ENTRY_VALUE: usize = 1024;

/// A descriptor's `limit`: `requests_per_unit` per `unit`, burst = `requests_per_unit`;
/// more than one a nanosecond refills at one a nanosecond (4 294 967 295 a second means
/// "no practical limit", and must not fail to build and deny).
fn override_limit(o: &RateLimitOverride) -> Result<Limit, String> {
    let unit = match RateLimitUnit::try_from(o.unit) {
        Ok(RateLimitUnit::Second) => SECOND,
        Ok(RateLimitUnit::Minute) => 60 * SECOND,
        Ok(RateLimitUnit::Hour) => 3_600 * SECOND,
        Ok(RateLimitUnit::Day) => 86_400 * SECOND,
        Ok(RateLimitUnit::Month) => 30 * 86_400 * SECOND,
        Ok(RateLimitUnit::Year) => 365 * 86_400 * SECOND,
        // WEEK is 7 in newer Envoy protos.
        _ if o.unit == 7 => 7 * 86_400 * SECOND,
        _ => return Err(format!("unit {} is not a known time unit", o.unit)),
    };
    let n = u64::from(o.requests_per_unit);
    Limit::new(n, n.min(unit as u64), unit).map_err(|e| e.to_string())
}

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

impl EnvoyRateLimitService {
    /// ShouldRateLimit, as [`RlsServer`] serves it.
    pub async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<Answer>, Status> {
        let (metadata, _, request) = request.into_parts();
        let answer = self.decide(request, &metadata).await;
        trace::log_failed("envoy", &metadata, answer).map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_units() {
        let o = |requests_per_unit, unit| RateLimitOverride {
            requests_per_unit,
            unit,
        };
        assert_eq!(
            override_limit(&o(5, RateLimitUnit::Minute as i32)),
            Ok(Limit::new(5, 5, 60 * SECOND).unwrap())
        );
        assert_eq!(
            override_limit(&o(5, 7)),
            Ok(Limit::new(5, 5, 7 * 86_400 * SECOND).unwrap())
        );
        assert!(override_limit(&o(5, 0)).unwrap_err().contains("unit 0"));
        assert!(override_limit(&o(0, 1)).unwrap_err().contains("burst"));
    }
}
