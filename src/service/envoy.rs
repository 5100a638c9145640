//! Envoy's Rate Limit Service v3 (`envoy.service.ratelimit.v3.RateLimitService`):
//! descriptors -> one all-or-nothing batch -> statuses, headers and metadata.
//!
//! Protocol facts the code relies on:
//! - the request's `hits_addend` 0 means 1; a descriptor's own `hits_addend` (a
//!   `UInt64Value`) wins when present, and an explicit 0 asks without spending;
//! - Envoy treats UNKNOWN as "allow" and cannot act on a per-descriptor error, so a cost
//!   above the burst is OVER_LIMIT for that descriptor, and a store failure is UNAVAILABLE;
//! - `overall_code` is OK or OVER_LIMIT, never UNKNOWN.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf as pbw;
use tonic::{Request, Response, Status};

use crate::clock::{Nanos, SECOND};
use crate::gcra::{Decision, Limit, Mode};
use crate::limits::descriptors::Mapping;
use crate::observe::metrics::Metrics;
use crate::service::{
    count_decisions, store_unavailable, trace, CheckOptions, DecideError, Decider, ItemResult,
    ItemSpec, Rule, Target,
};

/// Which rate-limit headers go into `response_headers_to_add`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HeaderStyle {
    /// No rate-limit fields (`Retry-After` is still sent on OVER_LIMIT).
    #[default]
    Off,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (Envoy's draft 03).
    Draft03,
    /// The IETF `RateLimit-Policy` and `RateLimit` structured fields, every limit named.
    Ietf,
}

/// How ShouldRateLimit answers.
#[derive(Debug, Clone, Copy, Default)]
pub struct EnvoyOptions {
    pub headers: HeaderStyle,
    /// Global shadow mode: decide, spend and count, but always answer OK.
    pub shadow: bool,
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

/// A descriptor's `limit`: `requests_per_unit` per `unit`, burst = `requests_per_unit`.
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
    Limit::new(n, n, unit).map_err(|e| e.to_string())
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

impl EnvoyRateLimitService {
    async fn decide(
        &self,
        request: RateLimitRequest,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<RateLimitResponse, Status> {
        if request.domain.is_empty() {
            return Err(invalid("domain: empty".to_string()));
        }
        if request.descriptors.is_empty() {
            return Err(invalid("descriptors: empty".to_string()));
        }
        if request.domain.len() > MAX_DOMAIN {
            return Err(invalid(format!("domain: longer than {MAX_DOMAIN} bytes")));
        }
        if request.descriptors.len() > MAX_DESCRIPTORS {
            return Err(invalid(format!(
                "descriptors: {} descriptors, at most {MAX_DESCRIPTORS}",
                request.descriptors.len()
            )));
        }
        // One snapshot for mapping and deciding: a reload never splits a request.
        let table = self.decider.limits();
        // hits_addend 0 means 1.
        let request_cost = u64::from(request.hits_addend.max(1));
        let mut items: Vec<ItemSpec> = Vec::new();
        let mut owner: Vec<usize> = Vec::new();
        // Counted once the request is decided (a rejected request decided nothing).
        let mut unmatched = 0;
        for (d, descriptor) in request.descriptors.iter().enumerate() {
            if descriptor.entries.is_empty() {
                return Err(invalid(format!("descriptors[{d}].entries: empty")));
            }
            if descriptor.entries.len() > MAX_ENTRIES {
                return Err(invalid(format!(
                    "descriptors[{d}].entries: {} entries, at most {MAX_ENTRIES}",
                    descriptor.entries.len()
                )));
            }
            if let Some(e) = descriptor.entries.iter().position(|e| e.key.is_empty()) {
                return Err(invalid(format!("descriptors[{d}].entries[{e}].key: empty")));
            }
            for (e, entry) in descriptor.entries.iter().enumerate() {
                if entry.key.len() > MAX_ENTRY_KEY {
                    return Err(invalid(format!(
                        "descriptors[{d}].entries[{e}].key: longer than {MAX_ENTRY_KEY} bytes"
                    )));
                }
                if entry.value.len() > MAX_ENTRY_VALUE {
                    return Err(invalid(format!(
                        "descriptors[{d}].entries[{e}].value: longer than {MAX_ENTRY_VALUE} bytes"
                    )));
                }
            }
            if descriptor.is_negative_hits {
                return Err(invalid(format!(
                    "descriptors[{d}].is_negative_hits: not supported (use cellrate.v1 Refund)"
                )));
            }
            let given = descriptor
                .limit
                .as_ref()
                .map(override_limit)
                .transpose()
                .map_err(|e| invalid(format!("descriptors[{d}].limit: {e}")))?
                // Caller-given limits turned off: the field is ignored.
                .filter(|_| self.decider.caller_limits().enabled);
            let cost = descriptor
                .hits_addend
                .map_or(request_cost, |explicit| explicit.value);
            // At most MAX_ENTRIES (checked above): on the stack.
            let mut entry_buf = [("", ""); MAX_ENTRIES];
            for (slot, e) in entry_buf.iter_mut().zip(&descriptor.entries) {
                *slot = (e.key.as_str(), e.value.as_str());
            }
            let entries = &entry_buf[..descriptor.entries.len()];
            let spec = |target| ItemSpec {
                target,
                cost: Some(cost),
                mode: Mode::CheckAndSpend,
                limit: given,
            };
            match table
                .descriptors()
                .map(table.names(), &request.domain, entries)
            {
                Mapping::Limits { names, id } => {
                    for name in names {
                        items.push(spec(Target::Named {
                            name: Cow::Borrowed(name),
                            id: id.clone(),
                        }));
                        owner.push(d);
                    }
                }
                // An unmatched descriptor that brings its own limit is limited by it, on a
                // bucket named after the domain and entries (as envoyproxy/ratelimit does).
                Mapping::Unmatched => {
                    if given.is_none() {
                        unmatched += 1;
                    }
                    if let Some(limit) = given {
                        items.push(spec(Target::Descriptor {
                            digest: descriptor_digest(&request.domain, entries),
                            limit,
                        }));
                        owner.push(d);
                    }
                }
            }
        }

        let results = if items.is_empty() {
            Vec::new()
        } else {
            let options = CheckOptions {
                invalid_ids: table.descriptors().invalid_ids(&request.domain),
                oversize_denies: true,
                honour_shadow: true,
                shadow_all: self.options.shadow,
            };
            match self.decider.check_with(&table, &items, options).await {
                Ok(result) => result.items,
                Err(DecideError::Invalid(e)) => {
                    // Envoy's fields: an id is built from the descriptor's entries.
                    let message = match e.item {
                        Some(i) => format!(
                            "descriptors[{}]{}: {}",
                            owner[i],
                            if e.field == ".id" {
                                ".entries"
                            } else {
                                e.field
                            },
                            e.message
                        ),
                        None => format!("descriptors: {}", e.message),
                    };
                    return Err(invalid(message));
                }
                Err(DecideError::Store(e)) => return Err(store_unavailable(&e)),
            }
        };
        for _ in 0..unmatched {
            self.metrics.decision("envoy", "", "unmatched");
        }
        self.log_invalid_ids(&request, &owner, &results);
        count_decisions(&self.metrics, "envoy", &results);
        trace::log_denied("envoy", metadata, &results);
        Ok(self.respond(request.descriptors.len(), &owner, &results))
    }
}

impl EnvoyRateLimitService {
    /// Logs descriptors whose id did not fit its name's format: at most one line a
    /// second (a client sending garbage must not flood the logs), with how many there were.
    fn log_invalid_ids(&self, request: &RateLimitRequest, owner: &[usize], results: &[ItemResult]) {
        let Some(i) = results
            .iter()
            .position(|r| matches!(r.rule, Rule::InvalidId { .. }))
        else {
            return;
        };
        let count = results
            .iter()
            .filter(|r| matches!(r.rule, Rule::InvalidId { .. }))
            .count() as u64;
        let pending = self.invalid_unlogged.fetch_add(count, Ordering::Relaxed) + count;
        // Seconds since start, plus one, so that the first line is written at once.
        let now = self.started.elapsed().as_secs() + 1;
        let last = self.invalid_logged_at.load(Ordering::Relaxed);
        if now > last
            && self
                .invalid_logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.invalid_unlogged.fetch_sub(pending, Ordering::Relaxed);
            let descriptor = &request.descriptors[owner[i]];
            let entries: Vec<String> = descriptor
                .entries
                .iter()
                .map(|e| format!("{}={}", short(&e.key), short(&e.value)))
                .collect();
            tracing::warn!(
                domain = short(&request.domain),
                limit = %results[i].name,
                example = entries.join(","),
                since_last_line = pending,
                "descriptors with an id that does not fit the limit's format"
            );
        }
    }
}

/// At most 64 characters of a caller's text, for a log line.
fn short(text: &str) -> &str {
    match text.char_indices().nth(64) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// Identifies an unmatched descriptor with its own limit: the SHA-256 (hex) of its domain
/// and entries, each length-prefixed, so that no two different descriptors (nor a domain
/// and an entry, nor `a=b|c=d` and two entries) share a bucket, and the key stays short
/// whatever the entries' lengths.
fn descriptor_digest(domain: &str, entries: &[(&str, &str)]) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    let mut field = |text: &str| {
        hash.update((text.len() as u64).to_le_bytes());
        hash.update(text.as_bytes());
    };
    field(domain);
    for (key, value) in entries {
        field(key);
        field(value);
    }
    hex::encode(hash.finalize())
}

/// An item that decides: limited (including shadow) or deny-listed.
fn restricts(item: &ItemResult) -> bool {
    item.rule.restricts()
}

/// A denial that is enforced (not in shadow mode).
fn enforced_denial(item: &ItemResult) -> bool {
    restricts(item) && !item.decision.allowed && !item.shadow
}

/// The strictest of `items` by the batch rule, if any.
fn strictest<'a>(items: impl Iterator<Item = &'a ItemResult>) -> Option<&'a ItemResult> {
    items.fold(None, |best: Option<&ItemResult>, item| match best {
        Some(b) if !item.decision.is_stricter_than(&b.decision) => Some(b),
        _ => Some(item),
    })
}

/// Time to report: until the cost passes when denied, until full when allowed.
fn until_reset(d: &Decision) -> Nanos {
    if d.allowed {
        d.reset_in
    } else {
        d.retry_in
    }
}

impl EnvoyRateLimitService {
    fn respond(
        &self,
        descriptors: usize,
        owner: &[usize],
        results: &[ItemResult],
    ) -> RateLimitResponse {
        // Items are in descriptor order: each descriptor's items are one run of `results`.
        let mut statuses = Vec::with_capacity(descriptors);
        let mut start = 0;
        for d in 0..descriptors {
            let run = owner[start..].iter().take_while(|&&o| o == d).count();
            statuses.push(descriptor_status(&results[start..start + run]));
            start += run;
        }
        let over = results.iter().any(enforced_denial);

        // The item that fired (or, when allowed, the one closest to firing).
        let fired = if over {
            strictest(results.iter().filter(|i| enforced_denial(i)))
        } else {
            strictest(results.iter().filter(|i| restricts(i) && !i.shadow))
        };
        let mut headers = Vec::new();
        match self.options.headers {
            HeaderStyle::Off => {}
            HeaderStyle::Draft03 => {
                if let Some(item) = fired.filter(|i| matches!(i.rule, Rule::Limited(_))) {
                    draft03_headers(item, results, &mut headers);
                }
            }
            HeaderStyle::Ietf => ietf_headers(results, &mut headers),
        }
        if over {
            let retry = fired.map_or(0, |i| i.decision.retry_in);
            if retry > 0 {
                headers.push(header("Retry-After", ceil_seconds(retry).to_string()));
            }
        }
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers,
            // Only when there is something to say: building it costs allocations.
            dynamic_metadata: (over
                || results
                    .iter()
                    .any(|i| i.shadow && restricts(i) && !i.decision.allowed))
            .then(|| metadata(over, fired, owner, results)),
            ..Default::default()
        }
    }
}

fn descriptor_status(items: &[ItemResult]) -> DescriptorStatus {
    let over = items.iter().any(enforced_denial);
    let shown = if over {
        strictest(items.iter().filter(|i| enforced_denial(i)))
    } else {
        strictest(items.iter().filter(|i| restricts(i)))
    };
    let Some(item) = shown else {
        // Unmatched, unlimited or not configured.
        return DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        };
    };
    let current_limit = match item.rule {
        Rule::Limited(limit) => {
            let (requests_per_unit, unit) = requests_per_unit(&limit);
            Some(RateLimit {
                name: item.name.to_string(),
                requests_per_unit,
                unit: unit as i32,
            })
        }
        _ => None,
    };
    let d = item.decision;
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit,
        limit_remaining: d.remaining.clamp(0, i64::from(u32::MAX)) as u32,
        duration_until_reset: Some(pbw::Duration {
            seconds: until_reset(&d) / SECOND,
            nanos: (until_reset(&d) % SECOND) as i32,
        }),
        ..Default::default()
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value,
        ..Default::default()
    }
}

/// `q` and `w`: count per period, the period in whole seconds (rounded up).
fn quota(limit: &Limit) -> (u64, i64) {
    (limit.count(), ceil_seconds(limit.period()).max(1))
}

/// Envoy's draft 03: the limit closest to firing first, then every limit's policy.
fn draft03_headers(fired: &ItemResult, results: &[ItemResult], headers: &mut Vec<HeaderValue>) {
    let Rule::Limited(limit) = fired.rule else {
        return;
    };
    let (q, _) = quota(&limit);
    let mut policies = vec![q.to_string()];
    for item in results.iter().filter(|i| !i.shadow) {
        if let Rule::Limited(limit) = item.rule {
            let (q, w) = quota(&limit);
            policies.push(format!("{q};w={w}"));
        }
    }
    headers.push(header("X-RateLimit-Limit", policies.join(", ")));
    headers.push(header(
        "X-RateLimit-Remaining",
        fired.decision.remaining.max(0).to_string(),
    ));
    headers.push(header(
        "X-RateLimit-Reset",
        ceil_seconds(until_reset(&fired.decision)).to_string(),
    ));
}

/// The IETF fields, one member per limit, named (repeated names get `-2`, `-3`, ...).
fn ietf_headers(results: &[ItemResult], headers: &mut Vec<HeaderValue>) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut policy = Vec::new();
    let mut state = Vec::new();
    for item in results.iter().filter(|i| !i.shadow) {
        let Rule::Limited(limit) = item.rule else {
            continue;
        };
        let n = seen.entry(&item.name).or_insert(0);
        *n += 1;
        let name = if *n == 1 {
            item.name.to_string()
        } else {
            format!("{}-{n}", item.name)
        };
        let name = sf_string(&name);
        let (q, w) = quota(&limit);
        policy.push(format!("{name};q={q};w={w}"));
        let d = item.decision;
        state.push(format!(
            "{name};r={};t={}",
            d.remaining.max(0),
            ceil_seconds(until_reset(&d))
        ));
    }
    if !policy.is_empty() {
        headers.push(header("RateLimit-Policy", policy.join(", ")));
        headers.push(header("RateLimit", state.join(", ")));
    }
}

/// A structured-field string (RFC 8941): quoted, with `"` and `\` escaped, printable ASCII.
fn sf_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// `dynamic_metadata`: which limit fired (or none), and which limits denied in shadow.
fn metadata(
    over: bool,
    fired: Option<&ItemResult>,
    owner: &[usize],
    results: &[ItemResult],
) -> pbw::Struct {
    use pbw::value::Kind;
    let string = |s: String| pbw::Value {
        kind: Some(Kind::StringValue(s)),
    };
    let mut fields = std::collections::BTreeMap::new();
    fields.insert(
        "overall_code".to_string(),
        string(if over { "OVER_LIMIT" } else { "OK" }.to_string()),
    );
    if over {
        if let Some(item) = fired {
            fields.insert("limit".to_string(), string(item.name.to_string()));
            let index = results.iter().position(|r| std::ptr::eq(r, item));
            if let Some(d) = index.map(|i| owner[i]) {
                fields.insert(
                    "descriptor_index".to_string(),
                    pbw::Value {
                        kind: Some(Kind::NumberValue(d as f64)),
                    },
                );
            }
        }
    }
    let shadow_denied: Vec<pbw::Value> = results
        .iter()
        .filter(|i| i.shadow && restricts(i) && !i.decision.allowed)
        .map(|i| string(i.name.to_string()))
        .collect();
    if !shadow_denied.is_empty() {
        fields.insert(
            "shadow_denied".to_string(),
            pbw::Value {
                kind: Some(Kind::ListValue(pbw::ListValue {
                    values: shadow_denied,
                })),
            },
        );
    }
    pbw::Struct {
        fields: fields.into_iter().collect(),
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

    #[test]
    fn structured_field_strings_are_escaped() {
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_string("é"), "\"?\"");
    }
}
