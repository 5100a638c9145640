//! ShouldRateLimit's answer: the overall code, one status per descriptor, the rate-limit
//! headers in the configured style (draft 03, the IETF fields or OpenAI's, built by
//! [`crate::service::headers`]) with `Retry-After`, and dynamic metadata saying which limit
//! fired and which denied in shadow mode.
//!
//! A limit configured `headers: hidden` still decides, but nothing of it leaves in the
//! answer: not in a status (Envoy builds its own `x-ratelimit-*` fields from them), a
//! header, `Retry-After` or the metadata. When only hidden limits deny, the answer is
//! OVER_LIMIT and says no more.

use std::cell::RefCell;
use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf as pbw;
use prost::Message;

use super::wire::Answer;
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
        owner: impl Fn(usize) -> usize + Copy,
        results: &[ItemResult],
    ) -> Answer {
        // Items are in descriptor order: each descriptor's items are one run of `results`.
        let mut statuses = Vec::with_capacity(descriptors);
        let mut start = 0;
        for d in 0..descriptors {
            let run = (start..results.len())
                .take_while(|&i| owner(i) == d)
                .count();
            statuses.push(descriptor_status(
                &results[start..start + run],
                self.options.resets,
            ));
            start += run;
        }
        let over = results.iter().any(enforced_denial);

        let mut headers = Vec::new();
        // The strictest visible item, found once: the headers, Retry-After and the
        // metadata all speak of it.
        let top = fired(results);
        // envoyproxy/ratelimit's three are made from the statuses once quota mode has
        // spoken (`upstream.rs`).
        rate_limit_headers(self.options.headers, top, results, &mut headers);
        if self.options.retry_after {
            retry_after(self.options.headers, top, &mut headers);
        }
        let denied_by = top.filter(|i| enforced_denial(i));
        Answer {
            response: RateLimitResponse {
                overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
                statuses,
                response_headers_to_add: headers.into_iter().map(header_value).collect(),
                ..Default::default()
            },
            // Only when there is something to say: building it costs allocations.
            metadata: (self.options.metadata == MetadataStyle::Cellrate
                && (over || results.iter().any(|i| shadow_denial(&i))))
            .then(|| metadata(over, denied_by, owner, results)),
        }
    }
}

/// A denial in shadow mode of a visible limit (reported in the metadata).
fn shadow_denial(item: &&ItemResult) -> bool {
    item.shadow && restricts(item) && !item.decision.allowed && visible(item)
}

/// The encoded metadata of the last enforced denial answered on this thread, by the limit
/// that fired (the `Arc` it was named by: the one name, for as long as this holds it) and
/// its descriptor's index.
type LastDenial = Option<(Arc<str>, usize, Bytes)>;

thread_local! {
    static LAST_DENIAL: RefCell<LastDenial> = const { RefCell::new(None) };
}

/// `dynamic_metadata`, encoded: which visible limit fired (or none), and which visible
/// limits denied in shadow. A flood of denials by one limit gets the same metadata every
/// time: the thread's last encoding is shared (a reference count), which spares building,
/// hashing, encoding and dropping the `Struct`'s map (`wire.rs` writes the bytes).
fn metadata(
    over: bool,
    fired: Option<&ItemResult>,
    owner: impl Fn(usize) -> usize,
    results: &[ItemResult],
) -> Bytes {
    let index = fired.and_then(|item| results.iter().position(|r| std::ptr::eq(r, item)));
    let d = index.map(&owner);
    let fresh = || Bytes::from(build_metadata(over, fired, d, results).encode_to_vec());
    let plain = over && !results.iter().any(|i| shadow_denial(&i));
    let (Some(item), true) = (fired, plain) else {
        return fresh();
    };
    let Some(d) = d else {
        return fresh();
    };
    LAST_DENIAL.with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some((name, at, fields)) if Arc::ptr_eq(name, &item.name) && *at == d => fields.clone(),
            _ => {
                let fields = fresh();
                *last = Some((item.name.clone(), d, fields.clone()));
                fields
            }
        }
    })
}

/// The metadata's `Struct`; `d` is the descriptor of the item that `fired`.
fn build_metadata(
    over: bool,
    fired: Option<&ItemResult>,
    d: Option<usize>,
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
            if let Some(d) = d {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::Rule;
    use cellrate_core::gcra::{Decision, Limit, Mode};
    use cellrate_limits::names::BucketKey;

    fn denied(name: &Arc<str>) -> ItemResult {
        ItemResult {
            decision: Decision {
                allowed: false,
                remaining: 0,
                retry_in: 5,
                reset_in: 5,
            },
            rule: Rule::Limited(Limit::new(1, 1, 10).unwrap()),
            name: name.clone(),
            key: BucketKey::new(7, "id"),
            shadow: false,
            oversize: false,
            mode: Mode::CheckAndSpend,
            headers: Default::default(),
        }
    }

    #[test]
    fn the_last_denials_metadata_is_reused_only_for_the_same_limit_and_descriptor() {
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("A"), Arc::from("B"));
        let [ra, rb] = [denied(&a), denied(&b)];
        let shadow = ItemResult {
            shadow: true,
            ..denied(&b)
        };
        let cases: [(&[ItemResult], &[usize]); 6] = [
            (std::slice::from_ref(&ra), &[0]),
            (std::slice::from_ref(&ra), &[0]),
            (std::slice::from_ref(&ra), &[3]),
            (std::slice::from_ref(&rb), &[3]),
            (std::slice::from_ref(&ra), &[0]),
            (&[ra.clone(), shadow], &[0, 1]),
        ];
        for (results, owner) in cases {
            let fired = Some(&results[0]);
            let encoded = metadata(true, fired, |i| owner[i], results);
            assert_eq!(
                pbw::Struct::decode(encoded).unwrap(),
                build_metadata(true, fired, Some(owner[0]), results)
            );
        }
        let once = metadata(true, Some(&ra), |_| 3, std::slice::from_ref(&ra));
        let once = pbw::Struct::decode(once).unwrap();
        let index = &once.fields["descriptor_index"];
        assert_eq!(index.kind, Some(pbw::value::Kind::NumberValue(3.0)));
    }
}
