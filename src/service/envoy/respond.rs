//! ShouldRateLimit's answer: the overall code, one status per descriptor, the rate-limit
//! headers in the configured style (draft 03, the IETF fields or OpenAI's, built by
//! [`crate::service::headers`]) with `Retry-After`, and dynamic metadata saying which limit
//! fired and which denied in shadow mode.
//!
//! A limit configured `headers: hidden` still decides, but nothing of it leaves in the
//! answer: not in a status (Envoy builds its own `x-ratelimit-*` fields from them), a
//! header, `Retry-After` or the metadata. When only hidden limits deny, the answer is
//! OVER_LIMIT and says no more.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf as pbw;

use super::{EnvoyRateLimitService, MetadataStyle};
use crate::service::headers::trio::descriptor_status;
use crate::service::headers::{
    enforced_denial, fired, rate_limit_headers, restricts, retry_after, visible, Header,
};
use crate::service::ItemResult;

/// A header for `response_headers_to_add`.
pub(super) fn header_value(header: Header) -> HeaderValue {
    HeaderValue {
        key: header.name,
        value: header.value,
        ..Default::default()
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

        let mut headers = Vec::new();
        // envoyproxy/ratelimit's three are made from the statuses once quota mode has
        // spoken (`upstream.rs`).
        rate_limit_headers(self.options.headers, results, &mut headers);
        if self.options.retry_after {
            retry_after(self.options.headers, results, &mut headers);
        }
        let denied_by = fired(results).filter(|i| enforced_denial(i));
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers.into_iter().map(header_value).collect(),
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
    // Straight into the answer's map, sized for what a denial says (a sorted map turned
    // into it cost about 900 instructions a denied request).
    let mut fields = std::collections::HashMap::with_capacity(4);
    fields.insert(
        "overall_code".to_string(),
        string(if over { "OVER_LIMIT" } else { "OK" }.to_string()),
    );
    if over {
        if let Some(item) = fired {
            fields.insert("limit".to_string(), string(String::from(&*item.name)));
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
        .map(|i| string(String::from(&*i.name)))
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
    pbw::Struct { fields }
}
