//! ShouldRateLimit in a domain configured in envoyproxy/ratelimit's file format: each
//! descriptor gets the limit envoyproxy/ratelimit's matching finds (or the descriptor's
//! own `limit`), limits named in another matched limit's `replaces` are left out, and
//! each limit counts on a bucket of the domain and the descriptor's entries (a
//! `share_threshold` wildcard's entries under the pattern). By default in fixed windows
//! aligned to the unit with every hit counted, as there; with `--ratelimit-counting gcra`
//! by cellrate's GCRA, all-or-nothing.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::batch::{mode_of, Batch, Item, Note, RatelimitItem};
use super::{malformed, EnvoyRateLimitService, RatelimitCounting, Refusal, MAX_ENTRIES};
use crate::service::ratelimit_bucket::{bucket_text, limit, shown};
use crate::service::request::RatelimitTarget;
use crate::service::{ItemResult, ItemSpec, Rule, Target};
use cellrate_core::gcra::Mode;
use cellrate_limits::config::LimitTable;
use cellrate_limits::ratelimit_format::{Found, Unit};

/// The name answers and metrics give a descriptor's own `limit` (its entries would make
/// the label's values unbounded).
const DESCRIPTOR_LIMIT: &str = "descriptor_limit";

impl EnvoyRateLimitService {
    /// Adds every descriptor of `request` (a domain in envoyproxy/ratelimit's format) to
    /// `batch`, but those in `skip` (decided as malformed).
    pub(super) fn add_ratelimit<'a>(
        &self,
        table: &'a LimitTable,
        request: &'a RateLimitRequest,
        request_cost: u64,
        batch: &mut Batch<'a>,
        skip: &[(usize, std::sync::Arc<str>)],
    ) -> Result<(), Refusal> {
        let domains = table.ratelimit();
        let entries: Vec<Vec<(&str, &str)>> = request
            .descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .take(MAX_ENTRIES)
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect()
            })
            .collect();
        let found: Vec<_> = entries
            .iter()
            .map(|e| domains.find(&request.domain, e))
            .collect();
        // `replaces`: a limit named by another matched limit is left out.
        let replaced = |name: &str| {
            found
                .iter()
                .flatten()
                .any(|f| f.limit.replaces.iter().any(|r| r == name))
        };
        for (d, descriptor) in request.descriptors.iter().enumerate() {
            if skip.iter().any(|&(m, _)| m == d) {
                continue;
            }
            let cost = descriptor
                .hits_addend
                .map_or(request_cost, |explicit| explicit.value);
            let given = self.given_limit(d, descriptor)?;
            let (numbers, name, shadow, shared) = match (given, &found[d]) {
                (Some(numbers), _) => (numbers, DESCRIPTOR_LIMIT.into(), false, &[][..]),
                (None, Some(f)) => match f.limit.limit {
                    // Unlimited, or replaced: nothing to count.
                    None => {
                        batch.notes.push((d, Note::Unlimited));
                        continue;
                    }
                    Some(_) if f.limit.name.as_deref().is_some_and(replaced) => continue,
                    Some(numbers) => (
                        numbers,
                        f.limit.label.clone(),
                        f.limit.shadow_mode,
                        &f.shared[..],
                    ),
                },
                (None, None) => {
                    batch.unmatched += 1;
                    continue;
                }
            };
            if found[d].as_ref().is_some_and(|f| f.limit.quota_mode) && given.is_none() {
                batch.notes.push((d, Note::Quota));
            }
            let mut counted = entries[d].clone();
            for &(i, pattern) in shared {
                if let Some(entry) = counted.get_mut(i) {
                    entry.1 = pattern;
                }
            }
            let on_file = found[d].as_ref().filter(|_| given.is_none());
            let stats_key = stats_key(on_file, &request.domain, &counted);
            self.note_answer(d, on_file, batch);
            let every_hit = self.options.ratelimit_counting == RatelimitCounting::FixedWindow;
            let spec = ItemSpec {
                target: Target::Ratelimit(RatelimitTarget {
                    digest: bucket_text(self.options.ratelimit_shape(), &request.domain, &counted),
                    limit: limit(numbers, every_hit),
                    unit: numbers.1.window(),
                    name,
                    shadow,
                    every_hit,
                    caller_given: given.is_some(),
                }),
                cost: Some(cost),
                mode: mode_of(descriptor),
                limit: None,
                lease: None,
            };
            batch.items.push(Item {
                spec,
                d,
                ratelimit: Some(Box::new(RatelimitItem {
                    stats: stats_key,
                    shown: shown(&request.domain, &counted),
                })),
            });
        }
        Ok(())
    }
}

impl EnvoyRateLimitService {
    /// Descriptor `d`'s own `limit`, when caller-given limits are on; a unit it does not
    /// know makes the descriptor malformed.
    fn given_limit(
        &self,
        d: usize,
        descriptor: &RateLimitDescriptor,
    ) -> Result<Option<(u32, Unit)>, Refusal> {
        match &descriptor.limit {
            Some(o) if self.decider.caller_limits().enabled => {
                let unit = Unit::from_envoy(o.unit).ok_or_else(|| {
                    malformed(
                        d,
                        format!(
                            "descriptors[{d}].limit: unit {} is not a known time unit",
                            o.unit
                        ),
                    )
                })?;
                Ok(Some((o.requests_per_unit, unit)))
            }
            _ => Ok(None),
        }
    }

    /// What envoyproxy/ratelimit's answer says of descriptor `d`, counted on the limit
    /// `found` (`None`: its own `limit`): its name as there, its `metadata`.
    fn note_answer(&self, d: usize, found: Option<&Found<'_>>, batch: &mut Batch<'_>) {
        if !self.options.limit_names {
            let name = found.and_then(|f| f.limit.name.clone());
            batch.notes.push((d, Note::Name(name.unwrap_or_default())));
        }
        if let Some(m) = found.and_then(|f| f.limit.metadata.clone()) {
            batch.notes.push((d, Note::Metadata(m)));
        }
    }
}

/// envoyproxy/ratelimit's `quota_mode`: a quota descriptor over its limit keeps its
/// OVER_LIMIT status but denies the request only when every quota descriptor is over
/// (any other descriptor over the limit still denies).
pub(super) fn quota_mode(response: &mut RateLimitResponse, quota: &[usize]) {
    let over = |d: usize| {
        response
            .statuses
            .get(d)
            .is_some_and(|s| s.code == Code::OverLimit as i32)
    };
    let others_over = (0..response.statuses.len()).any(|d| !quota.contains(&d) && over(d));
    let all_quota_over = quota.iter().all(|&d| over(d));
    if response.overall_code == Code::OverLimit as i32 && !others_over && !all_quota_over {
        response.overall_code = Code::Ok as i32;
        response
            .response_headers_to_add
            .retain(|h| h.key != "Retry-After");
    }
}

/// envoyproxy/ratelimit's near-limit threshold of `limit`: `floor(float32(limit) *
/// ratio)`, in float32 as there, so that the same ratio gives the same threshold.
fn near_threshold(limit: u64, ratio: f32) -> u64 {
    f64::from(limit as f32 * ratio).floor() as u64
}

/// The statistics key of a descriptor counted on the limit `found` (`None`: its own
/// `limit`): the limit's full key, or the detailed key of its `counted` entries.
fn stats_key(found: Option<&Found<'_>>, domain: &str, counted: &[(&str, &str)]) -> String {
    match found {
        Some(f) if !(f.limit.detailed_metric || f.limit.value_to_metric) => {
            f.limit.full_key.clone()
        }
        _ => detailed_key(domain, counted),
    }
}

/// envoyproxy/ratelimit's detailed statistics key: `domain.key1_value1.key2_value2`.
fn detailed_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut key = domain.to_string();
    for (k, v) in entries {
        key.push('.');
        key.push_str(k);
        if !v.is_empty() {
            key.push('_');
            key.push_str(v);
        }
    }
    key
}

impl EnvoyRateLimitService {
    /// Counts envoyproxy/ratelimit's statistics of the batch's items from its file format:
    /// hits, and of them those over the limit, near it (above `near_limit_ratio` of it,
    /// 80 % unless NEAR_LIMIT_RATIO says otherwise), within it, and over
    /// it in shadow mode, split as it splits them when a request's hits straddle a
    /// threshold.
    pub(super) fn count_ratelimit(&self, batch: &Batch<'_>, results: &[ItemResult]) {
        for (item, from) in results.iter().zip(&batch.items) {
            let (Some(RatelimitItem { stats: key, .. }), spec) =
                (from.ratelimit.as_deref(), &from.spec)
            else {
                continue;
            };
            let hits = spec.cost.unwrap_or(1);
            let key = self.metrics.ratelimit_key(key);
            let stat = |name: &str, n: u64| self.metrics.ratelimit_stat(&key, name, n);
            if spec.mode == Mode::Charge {
                // Hits given back (`is_negative_hits`) count apart, as envoyproxy/ratelimit
                // counts them.
                stat("total_negative_hits", hits);
                continue;
            }
            stat("total_hits", hits);
            let limit = match item.rule {
                Rule::Limited(limit) => limit.count(),
                // Zero a minute: every hit over.
                _ => 0,
            };
            let after = (limit as i64)
                .saturating_sub(item.decision.remaining)
                .max(0) as u64;
            let after = if item.decision.allowed {
                after
            } else {
                after.max(limit + 1)
            };
            let before = after.saturating_sub(hits);
            let near = near_threshold(limit, self.options.near_limit_ratio);
            if after > limit {
                let over = if before >= limit { hits } else { after - limit };
                stat("over_limit", over);
                stat(
                    "near_limit",
                    limit.saturating_sub(near.max(before)).min(hits - over),
                );
                if item.shadow {
                    stat("shadow_mode", over);
                }
            } else {
                stat("within_limit", hits);
                if after > near {
                    stat(
                        "near_limit",
                        if before >= near { hits } else { after - near },
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::service::ratelimit_bucket::upstream_key_text;

    #[test]
    fn a_value_cannot_hold_the_separator_unless_keys_are_exact() {
        let one = [("user", "alice_plan_pro")];
        let two = [("user", "alice"), ("plan", "pro")];
        assert_eq!(
            upstream_key_text("d", &two, false),
            "d_user_alice_plan_pro_"
        );
        assert_eq!(
            upstream_key_text("d", &one, false),
            "d_user_alice%5Fplan%5Fpro_"
        );
        // The escape escaped: `%5F` as a value is not `_`.
        assert_eq!(upstream_key_text("d", &[("k", "%5F")], false), "d_k_%255F_");
        assert_eq!(
            upstream_key_text("d", &[("k", "1.2.3.4")], false),
            "d_k_1.2.3.4_"
        );
        // envoyproxy/ratelimit's own, ambiguous as there.
        assert_eq!(
            upstream_key_text("d", &one, true),
            upstream_key_text("d", &two, true)
        );
    }
}
