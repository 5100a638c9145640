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
//! (`openai.rs`: OpenAI's header fields), leaving out limits configured `headers: hidden`.

mod batch;
mod decide;
mod openai;
mod ratelimit;
mod respond;
mod upstream;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tokio::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::clock::{CalendarPeriod, Nanos, ZonedUnit, SECOND};
use crate::gcra::{Limit, Window};
use crate::observe::metrics::Metrics;
use crate::service::{trace, Decider, ItemResult};

/// Which rate-limit headers go into `response_headers_to_add`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HeaderStyle {
    /// No rate-limit fields (`Retry-After` is still sent on OVER_LIMIT unless turned off).
    #[default]
    Off,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (Envoy's draft 03).
    Draft03,
    /// The IETF `RateLimit-Policy` and `RateLimit` structured fields, every limit named.
    Ietf,
    /// envoyproxy/ratelimit's three: the limit, the remaining and the reset of the
    /// descriptor closest to its limit (an over-limit one first), RateLimit-Limit,
    /// -Remaining and -Reset unless renamed.
    Ratelimit,
    /// OpenAI's: `x-ratelimit-limit-`, `-remaining-` and `-reset-requests` for the
    /// strictest limit that `measures: requests`, the same `-tokens` for the strictest
    /// that `measures: tokens`; resets as `1s`, `6m0s`, `20ms`; `retry-after-ms` beside
    /// `Retry-After`.
    Openai,
}

/// How `duration_until_reset` is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ResetStyle {
    /// To the nanosecond: until the bucket is full (allowed) or the cost passes (denied).
    #[default]
    Exact,
    /// The same time in whole seconds, rounded up: for a fixed window, the seconds left
    /// in it as envoyproxy/ratelimit computes them (`unit - now % unit`).
    WholeSeconds,
}

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

/// The names of the three headers of [`HeaderStyle::Ratelimit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> HeaderNames {
        HeaderNames {
            limit: "RateLimit-Limit".to_string(),
            remaining: "RateLimit-Remaining".to_string(),
            reset: "RateLimit-Reset".to_string(),
        }
    }
}

/// `LIMIT,REMAINING,RESET`, as `--ratelimit-header-names` takes them.
impl std::fmt::Display for HeaderNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{},{},{}", self.limit, self.remaining, self.reset)
    }
}

/// A header name Envoy accepts: 1 to 128 bytes of an HTTP token (RFC 9110), not a
/// pseudo-header.
///
/// ```
/// use cellrate::service::envoy::check_header_name;
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
            crate::text::printable(crate::text::cut_bytes(name, 64))
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
}

impl Default for EnvoyOptions {
    fn default() -> EnvoyOptions {
        EnvoyOptions {
            headers: HeaderStyle::Off,
            header_names: HeaderNames::default(),
            shadow: false,
            ratelimit_counting: RatelimitCounting::FixedWindow,
            limit_names: true,
            resets: ResetStyle::Exact,
            retry_after: true,
            metadata: MetadataStyle::Cellrate,
            stop_increment_when_over_limit: false,
        }
    }
}

/// The RLS service, served on the decision listener.
pub struct EnvoyRateLimitService {
    decider: Arc<Decider>,
    options: EnvoyOptions,
    metrics: Arc<Metrics>,
    /// Invalid-id descriptors not yet logged, and the second (since start) of the last line.
    invalid_unlogged: AtomicU64,
    invalid_logged_at: AtomicU64,
    started: Instant,
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
            invalid_unlogged: AtomicU64::new(0),
            invalid_logged_at: AtomicU64::new(0),
            started: Instant::now(),
        }
    }
}

/// Input limits of ShouldRateLimit (each a clear INVALID_ARGUMENT when exceeded).
pub const MAX_DOMAIN: usize = 256;
pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 16;
pub const MAX_ENTRY_KEY: usize = 256;
pub const MAX_ENTRY_VALUE: usize = 1024;

/// Unit lengths as envoyproxy/ratelimit counts them (a month is 30 days, a year 365).
const UNITS: [(Unit, Nanos); 7] = [
    (Unit::Second, SECOND),
    (Unit::Minute, 60 * SECOND),
    (Unit::Hour, 3_600 * SECOND),
    (Unit::Day, 86_400 * SECOND),
    (Unit::Week, 7 * 86_400 * SECOND),
    (Unit::Month, 30 * 86_400 * SECOND),
    (Unit::Year, 365 * 86_400 * SECOND),
];

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

/// `count` per `period` as Envoy's `requests_per_unit` per `unit`: the smallest unit at
/// least as long as the period, with the count scaled to it and rounded down (at least 1).
/// Exact whenever the period divides the unit (1s, 500ms, 15m, 180m, 1d, ...).
///
/// ```
/// use cellrate::gcra::Limit;
/// use cellrate::service::envoy::requests_per_unit;
/// use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
/// let s = 1_000_000_000;
/// assert_eq!(requests_per_unit(&Limit::new(20, 20, s).unwrap()), (20, Unit::Second));
/// assert_eq!(requests_per_unit(&Limit::new(300, 300, 10_800 * s).unwrap()), (2_400, Unit::Day));
/// assert_eq!(requests_per_unit(&Limit::new(5, 5, s / 2).unwrap()), (10, Unit::Second));
/// ```
pub fn requests_per_unit(limit: &Limit) -> (u32, Unit) {
    if let Window::Calendar(period) = limit.window() {
        // A calendar window is one of Envoy's units: exact.
        let unit = match period {
            CalendarPeriod::Second => Unit::Second,
            CalendarPeriod::Minute => Unit::Minute,
            CalendarPeriod::Hour => Unit::Hour,
            CalendarPeriod::Day => Unit::Day,
            CalendarPeriod::Month | CalendarPeriod::Days30 => Unit::Month,
            CalendarPeriod::Year | CalendarPeriod::Days365 => Unit::Year,
            CalendarPeriod::Week => Unit::Week,
            CalendarPeriod::Zoned(zoned) => match zoned.unit() {
                ZonedUnit::Day => Unit::Day,
                ZonedUnit::Week => Unit::Week,
                ZonedUnit::Month => Unit::Month,
                ZonedUnit::Year => Unit::Year,
            },
        };
        return (limit.count().min(u64::from(u32::MAX)) as u32, unit);
    }
    let period = limit.period();
    let (unit, unit_ns) = UNITS
        .iter()
        .copied()
        .find(|&(_, ns)| ns >= period)
        .unwrap_or(UNITS[UNITS.len() - 1]);
    let scaled = i128::from(limit.count()) * i128::from(unit_ns) / i128::from(period);
    (scaled.clamp(1, i128::from(u32::MAX)) as u32, unit)
}

/// Whole seconds, rounded up.
fn ceil_seconds(nanos: Nanos) -> i64 {
    let nanos = nanos.max(0);
    nanos / SECOND + i64::from(nanos % SECOND != 0)
}

/// An item the answer may describe: its limit is not `headers: hidden`.
fn visible(item: &ItemResult) -> bool {
    !item.headers.hidden
}

/// The strictest of `items` by the batch rule, if any.
fn strictest<'a>(items: impl Iterator<Item = &'a ItemResult>) -> Option<&'a ItemResult> {
    items.fold(None, |best: Option<&ItemResult>, item| match best {
        Some(b) if !item.decision.is_stricter_than(&b.decision) => Some(b),
        _ => Some(item),
    })
}

/// A header for `response_headers_to_add`.
fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value,
        ..Default::default()
    }
}

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

#[tonic::async_trait]
impl RateLimitService for EnvoyRateLimitService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let answer = self.decide(request, &metadata).await;
        trace::log_failed("envoy", &metadata, answer).map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_rounding() {
        let s = SECOND;
        let l = |b, c, p| Limit::new(b, c, p).unwrap();
        assert_eq!(requests_per_unit(&l(1, 1, 60 * s)), (1, Unit::Minute));
        let calendar = |count, period| Limit::calendar(count, period).unwrap();
        assert_eq!(
            requests_per_unit(&calendar(1_000_000, CalendarPeriod::Month)),
            (1_000_000, Unit::Month)
        );
        assert_eq!(
            requests_per_unit(&calendar(3, CalendarPeriod::Hour)),
            (3, Unit::Hour)
        );
        assert_eq!(
            requests_per_unit(&calendar(1 << 40, CalendarPeriod::Year)),
            (u32::MAX, Unit::Year)
        );
        assert_eq!(requests_per_unit(&l(7, 7, 45 * s)), (9, Unit::Minute)); // 9.33 -> 9
        assert_eq!(
            requests_per_unit(&l(10_000, 10_000, 86_400 * s)),
            (10_000, Unit::Day)
        );
        assert_eq!(
            requests_per_unit(&l(1, 1, 2 * 365 * 86_400 * s)),
            (1, Unit::Year)
        ); // 0.5 -> 1
        assert_eq!(ceil_seconds(1), 1);
        assert_eq!(ceil_seconds(SECOND), 1);
        assert_eq!(ceil_seconds(SECOND + 1), 2);
        assert_eq!(ceil_seconds(0), 0);
    }

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
