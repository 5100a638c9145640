//! ShouldRateLimit's answer: the overall code, one status per descriptor, the rate-limit
//! headers in the configured style (draft 03, the IETF fields or OpenAI's) with
//! `Retry-After`, and dynamic metadata saying which limit fired and which denied in shadow
//! mode.
//!
//! A limit configured `headers: hidden` still decides, but nothing of it leaves in the
//! answer: not in a status (Envoy builds its own `x-ratelimit-*` fields from them), a
//! header, `Retry-After` or the metadata. When only hidden limits deny, the answer is
//! OVER_LIMIT and says no more.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf as pbw;

use super::openai::{ceil_millis, openai_headers};
use super::{
    ceil_seconds, header, requests_per_unit, strictest, visible, EnvoyRateLimitService,
    HeaderStyle, MetadataStyle, ResetStyle,
};
use crate::clock::{Nanos, SECOND};
use crate::gcra::{Decision, Limit};
use crate::service::{ItemResult, Rule};

/// An item that decides: limited (including shadow) or deny-listed.
fn restricts(item: &ItemResult) -> bool {
    item.rule.restricts()
}

/// A denial that is enforced (not in shadow mode).
fn enforced_denial(item: &ItemResult) -> bool {
    restricts(item) && !item.decision.allowed && !item.shadow
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
    pub(super) fn respond(
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
            statuses.push(descriptor_status(
                &results[start..start + run],
                self.options.resets,
            ));
            start += run;
        }
        let over = results.iter().any(enforced_denial);

        // The visible item that fired (or, when none did, the one closest to firing).
        let shown = || results.iter().filter(|i| visible(i));
        let fired = if shown().any(enforced_denial) {
            strictest(shown().filter(|i| enforced_denial(i)))
        } else {
            strictest(shown().filter(|i| restricts(i) && !i.shadow))
        };
        let mut headers = Vec::new();
        match self.options.headers {
            // envoyproxy/ratelimit's, made from the statuses once quota mode has spoken.
            HeaderStyle::Off | HeaderStyle::Ratelimit => {}
            HeaderStyle::Draft03 => {
                if let Some(item) = fired.filter(|i| matches!(i.rule, Rule::Limited(_))) {
                    draft03_headers(item, results, &mut headers);
                }
            }
            HeaderStyle::Ietf => ietf_headers(results, &mut headers),
            HeaderStyle::Openai => openai_headers(results, &mut headers),
        }
        // Only a visible limit's denial says when to retry: an abuse guard does not tell.
        let denied_by = fired.filter(|i| enforced_denial(i));
        if let Some(item) = denied_by.filter(|_| self.options.retry_after) {
            let retry = item.decision.retry_in;
            if retry > 0 {
                headers.push(header("Retry-After", ceil_seconds(retry).to_string()));
                if self.options.headers == HeaderStyle::Openai {
                    headers.push(header("retry-after-ms", ceil_millis(retry).to_string()));
                }
            }
        }
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers,
            // Only when there is something to say: building it costs allocations.
            dynamic_metadata: (self.options.metadata == MetadataStyle::Cellrate
                && (over || results.iter().any(|i| shadow_denial(&i))))
            .then(|| metadata(over, denied_by, owner, results)),
            ..Default::default()
        }
    }
}

/// A denial in shadow mode of a visible limit (reported in the metadata).
fn shadow_denial(item: &&ItemResult) -> bool {
    item.shadow && restricts(item) && !item.decision.allowed && visible(item)
}

fn descriptor_status(items: &[ItemResult], resets: ResetStyle) -> DescriptorStatus {
    let over = items.iter().any(enforced_denial);
    let visible = || items.iter().filter(|i| visible(i));
    let shown = if visible().any(enforced_denial) {
        strictest(visible().filter(|i| enforced_denial(i)))
    } else {
        strictest(visible().filter(|i| restricts(i)))
    };
    let Some(item) = shown else {
        // Unmatched, unlimited, not configured, or only hidden limits: the code alone.
        return DescriptorStatus {
            code: if over { Code::OverLimit } else { Code::Ok } as i32,
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
        duration_until_reset: Some(match resets {
            ResetStyle::Exact => pbw::Duration {
                seconds: until_reset(&d) / SECOND,
                nanos: (until_reset(&d) % SECOND) as i32,
            },
            ResetStyle::WholeSeconds => pbw::Duration {
                seconds: ceil_seconds(until_reset(&d)),
                nanos: 0,
            },
        }),
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
    for item in results.iter().filter(|i| !i.shadow && visible(i)) {
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
    for item in results.iter().filter(|i| !i.shadow && visible(i)) {
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

/// `dynamic_metadata`: which visible limit fired (or none), and which visible limits denied
/// in shadow.
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
        .filter(shadow_denial)
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
    fn structured_field_strings_are_escaped() {
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_string("é"), "\"?\"");
    }
}
