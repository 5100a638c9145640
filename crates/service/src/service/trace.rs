//! Following one request into cellrate's logs: the W3C trace context (`traceparent`, which
//! Envoy sends on its rate-limit calls when its tracer speaks W3C, e.g. OpenTelemetry) and
//! a request id (`x-request-id`, for native callers that set one; Envoy does not send it on
//! rate-limit calls) taken from a decision RPC's gRPC metadata, and the debug-level lines
//! that carry them for every denied or failed decision.
//!
//! Both headers come from callers, so neither is logged as sent: a `traceparent` is taken
//! only when it is exactly the W3C form (lower-case hex ids that are not all zero), and a
//! request id only when it is at most [`MAX_REQUEST_ID`] bytes of letters, digits and
//! `-_.:`. Anything else is ignored, as the W3C recommendation says for a malformed
//! `traceparent`: no error, no log line forged with newlines or quotes. The work is done
//! only when debug logging is on for this module, so the decision path pays nothing
//! otherwise.

use tonic::metadata::MetadataMap;

use super::{ItemResult, Rule};

/// The target these lines are logged under: the module's path before the workspace split
/// (#59), which operators filter on (`RUST_LOG=info,cellrate::service::trace=debug`,
/// docs/metrics-and-alerts.md), kept so that a filter written for it still works.
pub const TARGET: &str = "cellrate::service::trace";

/// Longest request id that is logged.
pub const MAX_REQUEST_ID: usize = 128;

/// The ids of one request, each present only when well formed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceIds<'a> {
    /// 32 lower-case hex digits.
    pub trace_id: Option<&'a str>,
    /// The caller's span (the `traceparent`'s parent id): 16 lower-case hex digits.
    pub span_id: Option<&'a str>,
    pub request_id: Option<&'a str>,
}

impl<'a> TraceIds<'a> {
    pub fn from_metadata(metadata: &'a MetadataMap) -> TraceIds<'a> {
        let text = |name| metadata.get(name).and_then(|v| v.to_str().ok());
        let (trace_id, span_id) = text("traceparent")
            .and_then(traceparent)
            .map_or((None, None), |(t, s)| (Some(t), Some(s)));
        TraceIds {
            trace_id,
            span_id,
            request_id: text("x-request-id").filter(|id| request_id_ok(id)),
        }
    }
}

/// The trace id and parent id of a W3C `traceparent`
/// (`version-traceid-parentid-flags`, e.g.
/// `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`), or None when malformed.
/// Version `00` has exactly these four fields; a later version may append more after a
/// dash, which are ignored; version `ff` is invalid.
pub fn traceparent(value: &str) -> Option<(&str, &str)> {
    let value = value.trim_matches([' ', '\t']);
    if value.len() < 55 || !value.is_ascii() {
        return None;
    }
    let (version, trace_id, parent_id, flags) =
        (&value[0..2], &value[3..35], &value[36..52], &value[53..55]);
    let dashes = [2, 35, 52].iter().all(|&i| value.as_bytes()[i] == b'-');
    let rest = &value[55..];
    let valid = dashes
        && hex(version)
        && version != "ff"
        && hex(trace_id)
        && hex(parent_id)
        && hex(flags)
        && !all_zero(trace_id)
        && !all_zero(parent_id)
        && (rest.is_empty() || (version != "00" && rest.starts_with('-')));
    valid.then_some((trace_id, parent_id))
}

fn hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn all_zero(text: &str) -> bool {
    text.bytes().all(|b| b == b'0')
}

fn request_id_ok(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REQUEST_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// At most 64 characters of a caller's text, for a log line.
fn short(text: &str) -> &str {
    cellrate_core::text::first_chars(text, 64)
}

/// Logs a decision (at debug level): for a denial the first item that denied it and how
/// many did, for an allowed request its first item, with the request's trace ids.
#[inline]
pub fn log_decision(api: &'static str, metadata: &MetadataMap, items: &[ItemResult]) {
    if tracing::enabled!(target: TARGET, tracing::Level::DEBUG) {
        log_decision_now(api, metadata, items);
    }
}

/// [`log_decision`] once the filter let it through: out of line, so that a request
/// pays one check of the filter.
#[cold]
#[inline(never)]
fn log_decision_now(api: &'static str, metadata: &MetadataMap, items: &[ItemResult]) {
    let denies = |i: &&ItemResult| i.rule.restricts() && !i.decision.allowed && !i.shadow;
    let Some(first) = items.iter().find(denies) else {
        log_allowed(api, metadata, items);
        return;
    };
    let ids = TraceIds::from_metadata(metadata);
    let (_, id) = first.key.parts();
    tracing::debug!(
        target: TARGET,
        api,
        trace_id = ids.trace_id,
        span_id = ids.span_id,
        request_id = ids.request_id,
        limit = %first.name,
        id = ?short(id),
        deny_listed = matches!(first.rule, Rule::Denied | Rule::InvalidId { .. }),
        retry_in_ms = first.decision.retry_in / 1_000_000,
        denied_items = items.iter().filter(denies).count(),
        "decision: denied"
    );
}

/// An allowed decision's line: its first item (limit, id, what remains) and how many.
fn log_allowed(api: &'static str, metadata: &MetadataMap, items: &[ItemResult]) {
    let ids = TraceIds::from_metadata(metadata);
    let first = items.first();
    let id = first.map(|i| i.key.parts().1).unwrap_or_default();
    tracing::debug!(
        target: TARGET,
        api,
        trace_id = ids.trace_id,
        span_id = ids.span_id,
        request_id = ids.request_id,
        limit = %first.map_or("", |i| &*i.name),
        id = ?short(id),
        remaining = first.map_or(0, |i| i.decision.remaining),
        items = items.len(),
        "decision: allowed"
    );
}

/// Passes `answer` through, logging it first (at debug level) when it is a failure: its
/// gRPC code and message, and the request's trace ids.
pub fn log_failed<T>(
    api: &'static str,
    metadata: &MetadataMap,
    answer: Result<T, tonic::Status>,
) -> Result<T, tonic::Status> {
    let Err(status) = &answer else {
        return answer;
    };
    if !tracing::enabled!(target: TARGET, tracing::Level::DEBUG) {
        return answer;
    }
    let ids = TraceIds::from_metadata(metadata);
    tracing::debug!(
        target: TARGET,
        api,
        trace_id = ids.trace_id,
        span_id = ids.span_id,
        request_id = ids.request_id,
        code = ?status.code(),
        error = ?short(status.message()),
        "decision: failed"
    );
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_w3c_traceparent_gives_its_trace_and_parent_ids() {
        assert_eq!(
            traceparent(GOOD),
            Some(("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"))
        );
        // Optional whitespace around the value; a later version with more fields.
        assert!(traceparent(&format!(" {GOOD}\t")).is_some());
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(traceparent(later).is_some());
    }

    #[test]
    fn a_malformed_traceparent_is_ignored() {
        let bad = [
            "",
            "00",
            // Upper-case hex, all-zero ids, version ff, a wrong dash, a short id.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            // Version 00 with anything after its four fields.
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            // A log line forged through the header, and non-ASCII where slicing would split.
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nlevel=error",
            "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
            "gg-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for value in bad {
            assert_eq!(traceparent(value), None, "{value:?}");
        }
    }

    #[test]
    fn request_ids_are_logged_only_when_plain_and_short() {
        assert!(request_id_ok("0b3d6c2e-6f3a-4f7e-9d7c-2b1a0c9e8f7d"));
        assert!(request_id_ok("req_1.2:3"));
        assert!(!request_id_ok(""));
        assert!(!request_id_ok("a b"));
        assert!(!request_id_ok("x\"y"));
        assert!(!request_id_ok("x\ny"));
        assert!(request_id_ok(&"a".repeat(MAX_REQUEST_ID)));
        assert!(!request_id_ok(&"a".repeat(MAX_REQUEST_ID + 1)));
    }

    #[test]
    fn ids_come_from_the_metadata() {
        let mut metadata = MetadataMap::new();
        metadata.insert("traceparent", GOOD.parse().unwrap());
        metadata.insert("x-request-id", "abc-123".parse().unwrap());
        let ids = TraceIds::from_metadata(&metadata);
        assert_eq!(ids.trace_id, Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(ids.span_id, Some("00f067aa0ba902b7"));
        assert_eq!(ids.request_id, Some("abc-123"));
        assert_eq!(
            TraceIds::from_metadata(&MetadataMap::new()),
            TraceIds::default()
        );
    }
}
