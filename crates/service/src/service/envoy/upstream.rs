//! envoyproxy/ratelimit's shape of a ShouldRateLimit answer, for the `ratelimit`
//! personality: limit names as its YAML gives them, its three rate-limit headers, and its
//! dynamic metadata (the domain, the descriptors, the matched limits' `metadata`).

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

use super::batch::{Batch, Note};
use super::respond::header_value;
use super::{EnvoyRateLimitService, HeaderStyle, MetadataStyle};
use crate::service::headers::trio::{closest, trio};

impl EnvoyRateLimitService {
    /// What envoyproxy/ratelimit's answer has that cellrate's does not, as the options ask.
    pub(super) fn upstream_answer(
        &self,
        request: &RateLimitRequest,
        batch: &Batch<'_>,
        hidden: &[usize],
        response: &mut RateLimitResponse,
    ) {
        for (d, note) in &batch.notes {
            let Note::Name(name) = note else {
                continue;
            };
            if let Some(limit) = response
                .statuses
                .get_mut(*d)
                .and_then(|s| s.current_limit.as_mut())
            {
                limit.name.clone_from(name);
            }
        }
        let request_names = self.options.request_header_names.as_ref();
        if self.options.headers == HeaderStyle::Ratelimit || request_names.is_some() {
            // One descriptor for both (envoyproxy/ratelimit's PR #1168): the last over
            // its limit not in quota mode, else the first with the fewest remaining.
            if let Some(status) = closest(&response.statuses, &batch.quota()) {
                if let Some(names) = request_names {
                    let three = trio(status, names).map(header_value);
                    response.request_headers_to_add.extend(three);
                }
                if self.options.headers == HeaderStyle::Ratelimit {
                    let three = trio(status, &self.options.header_names).map(header_value);
                    // First, before a Retry-After asked for beside them.
                    response.response_headers_to_add.splice(0..0, three);
                }
            }
        }
        if self.options.metadata == MetadataStyle::Ratelimit {
            response.dynamic_metadata = Some(metadata(request, batch, hidden, &response.statuses));
        }
    }
}

fn value(kind: Kind) -> Value {
    Value { kind: Some(kind) }
}

fn string(text: String) -> Value {
    value(Kind::StringValue(text))
}

/// envoyproxy/ratelimit's dynamic metadata: `domain`, `descriptors` (each its entries as
/// `key=value`, its own `limit` in protobuf text, its `hitsAddend` when given; those that
/// map to a `headers: hidden` limit left out), the request's `hitsAddend` when not 0, and
/// `metadata`: the `metadata` of the limits of the descriptors that passed, merged in
/// descriptor order (the first value of a key stays, mappings merge).
fn metadata(
    request: &RateLimitRequest,
    batch: &Batch<'_>,
    hidden: &[usize],
    statuses: &[DescriptorStatus],
) -> Struct {
    let mut fields = std::collections::HashMap::new();
    fields.insert("domain".to_string(), string(request.domain.clone()));
    let descriptors = (request.descriptors.iter().enumerate())
        .filter(|(d, _)| !hidden.contains(d))
        .map(|(_, d)| descriptor(d))
        .collect();
    fields.insert(
        "descriptors".to_string(),
        value(Kind::ListValue(ListValue {
            values: descriptors,
        })),
    );
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_string(),
            value(Kind::NumberValue(f64::from(request.hits_addend))),
        );
    }
    let mut merged = Struct::default();
    for (d, note) in &batch.notes {
        let Note::Metadata(given) = note else {
            continue;
        };
        if statuses
            .get(*d)
            .is_some_and(|s| s.code != Code::OverLimit as i32)
        {
            merge(&mut merged, given);
        }
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_string(), value(Kind::StructValue(merged)));
    }
    Struct { fields }
}

fn descriptor(d: &RateLimitDescriptor) -> Value {
    let mut fields = std::collections::HashMap::new();
    let entries = d
        .entries
        .iter()
        .map(|e| string(format!("{}={}", e.key, e.value)))
        .collect();
    fields.insert(
        "entries".to_string(),
        value(Kind::ListValue(ListValue { values: entries })),
    );
    if let Some(limit) = &d.limit {
        fields.insert(
            "limit".to_string(),
            string(limit_text(limit.requests_per_unit, limit.unit)),
        );
    }
    if let Some(hits) = &d.hits_addend {
        fields.insert(
            "hitsAddend".to_string(),
            value(Kind::NumberValue(hits.value as f64)),
        );
    }
    value(Kind::StructValue(Struct { fields }))
}

/// A descriptor's `limit` in protobuf's text format, on one line, as Go prints it (its
/// fields at their zero value left out).
fn limit_text(requests_per_unit: u32, unit: i32) -> String {
    const UNITS: [&str; 8] = [
        "UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK",
    ];
    let mut parts = Vec::new();
    if requests_per_unit != 0 {
        parts.push(format!("requests_per_unit:{requests_per_unit}"));
    }
    match usize::try_from(unit).ok().and_then(|u| UNITS.get(u)) {
        Some(_) if unit == 0 => {}
        Some(name) => parts.push(format!("unit:{name}")),
        None => parts.push(format!("unit:{unit}")),
    }
    parts.join(" ")
}

/// Merges `from` into `into`: a key already there keeps its value, unless both are
/// mappings, which merge.
fn merge(into: &mut Struct, from: &Arc<Struct>) {
    merge_struct(into, from);
}

fn merge_struct(into: &mut Struct, from: &Struct) {
    for (key, v) in &from.fields {
        match into.fields.get_mut(key) {
            None => {
                into.fields.insert(key.clone(), v.clone());
            }
            Some(Value {
                kind: Some(Kind::StructValue(mine)),
            }) => {
                if let Some(Kind::StructValue(theirs)) = &v.kind {
                    merge_struct(mine, theirs);
                }
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_print_as_go_prints_them() {
        assert_eq!(limit_text(10, 1), "requests_per_unit:10 unit:SECOND");
        assert_eq!(limit_text(0, 2), "unit:MINUTE");
        assert_eq!(limit_text(5, 0), "requests_per_unit:5");
        assert_eq!(limit_text(5, 99), "requests_per_unit:5 unit:99");
    }

    #[test]
    fn merging_keeps_the_first_value_and_merges_mappings() {
        let s = |pairs: Vec<(&str, Value)>| Struct {
            fields: pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        };
        let text = |t: &str| string(t.to_string());
        let mut into = s(vec![
            ("a", text("first")),
            ("m", value(Kind::StructValue(s(vec![("x", text("1"))])))),
        ]);
        let from = Arc::new(s(vec![
            ("a", text("second")),
            ("b", text("new")),
            (
                "m",
                value(Kind::StructValue(s(vec![
                    ("x", text("2")),
                    ("y", text("3")),
                ]))),
            ),
        ]));
        merge(&mut into, &from);
        let want = s(vec![
            ("a", text("first")),
            ("b", text("new")),
            (
                "m",
                value(Kind::StructValue(s(vec![
                    ("x", text("1")),
                    ("y", text("3")),
                ]))),
            ),
        ]);
        assert_eq!(into, want);
    }
}
