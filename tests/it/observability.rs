//! What operators watch: trace ids in the log lines of denied and failed decisions.

use std::path::Path;
use std::time::{Duration, Instant};

use cellrate::proto::v1 as pb;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::Value;

use crate::common::{envoy_request, item, serve_logging, Process};

fn example_config() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"))
}

/// A W3C `traceparent` whose trace id ends in `n` (two hex digits).
fn traceparent(n: u8) -> String {
    format!("00-4bf92f3577b34da6a3ce929d0e0e47{n:02x}-00f067aa0ba902b7-01")
}

fn trace_id(n: u8) -> String {
    format!("4bf92f3577b34da6a3ce929d0e0e47{n:02x}")
}

fn with_ids<T>(message: T, traceparent: &str, request_id: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    request
        .metadata_mut()
        .insert("x-request-id", request_id.parse().unwrap());
    request
}

/// Reads `process`'s JSON log lines until one has `message` and the trace id `trace`
/// (bounded: 10 s); returns that line's fields, and every line read on the way.
fn find_line(process: &Process, message: &str, trace: &str) -> (Option<Value>, Vec<Value>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(line) = process.logs.recv_timeout(left) else {
            break;
        };
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let fields = v["fields"].clone();
        if fields["message"] == message && fields["trace_id"] == trace {
            return (Some(fields), seen);
        }
        seen.push(fields);
    }
    (None, seen)
}

#[tokio::test]
async fn denied_and_failed_decisions_log_the_callers_trace_ids_at_debug() {
    let server = serve_logging(example_config(), &[], "info,cellrate::service::trace=debug");
    let addr = format!("http://{}", server.listen);
    let mut envoy = RateLimitServiceClient::connect(addr.clone()).await.unwrap();
    let mut native = pb::rate_limiter_client::RateLimiterClient::connect(addr)
        .await
        .unwrap();

    // An allowed decision logs nothing (its trace id must not appear before the next one's).
    envoy
        .should_rate_limit(with_ids(
            envoy_request("edge", &[&[("api_key", "key-fine")]]),
            &traceparent(1),
            "req-allowed",
        ))
        .await
        .unwrap();
    // A deny-listed key, through Envoy's API.
    let r = envoy
        .should_rate_limit(with_ids(
            envoy_request("edge", &[&[("api_key", "key-revoked-0001")]]),
            &traceparent(2),
            "req-envoy-denied",
        ))
        .await
        .unwrap();
    assert_eq!(r.into_inner().overall_code, 2, "OVER_LIMIT");
    let (line, before) = find_line(&server, "decision: denied", &trace_id(2));
    let line = line.expect("a debug line for the denied Envoy request");
    assert_eq!(line["api"], "envoy");
    assert_eq!(line["span_id"], "00f067aa0ba902b7");
    assert_eq!(line["request_id"], "req-envoy-denied");
    assert_eq!(line["limit"], "ApiRequestsPerKey");
    assert_eq!(line["id"], "\"key-revoked-0001\"");
    assert_eq!(line["deny_listed"], true);
    assert!(
        !before.iter().any(|f| f["trace_id"] == trace_id(1)),
        "the allowed request was not logged: {before:?}"
    );

    // A limit run out, through the native API: 10 allowed, the 11th denied.
    for _ in 0..10 {
        let r = native
            .check(pb::CheckRequest {
                items: vec![item("ApiRequestsPerKey", "key-busy", None)],
            })
            .await
            .unwrap();
        assert!(r.into_inner().overall.unwrap().allowed);
    }
    let r = native
        .check(with_ids(
            pb::CheckRequest {
                items: vec![item("ApiRequestsPerKey", "key-busy", None)],
            },
            &traceparent(3),
            "req-native-denied",
        ))
        .await
        .unwrap();
    assert!(!r.into_inner().overall.unwrap().allowed);
    let (line, _) = find_line(&server, "decision: denied", &trace_id(3));
    let line = line.expect("a debug line for the denied native request");
    assert_eq!(line["api"], "native");
    assert_eq!(line["request_id"], "req-native-denied");
    assert_eq!(line["deny_listed"], false);
    assert!(line["retry_in_ms"].as_u64().unwrap() > 0);

    // A failed decision: an unknown limit name is INVALID_ARGUMENT.
    let e = native
        .check(with_ids(
            pb::CheckRequest {
                items: vec![item("NoSuchLimit", "x", None)],
            },
            &traceparent(4),
            "req-failed",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let (line, seen) = find_line(&server, "decision: failed", &trace_id(4));
    let line = line.unwrap_or_else(|| panic!("a debug line for the failed request: {seen:?}"));
    assert_eq!(line["code"], "InvalidArgument");
    assert!(line["error"].as_str().unwrap().contains("NoSuchLimit"));

    // The attacker's headers: a traceparent not in the W3C form and a request id with a
    // quote are left out of the line, which is still written (with a valid trace id from
    // the next request to find it by, the ids are tested one at a time).
    let e = native
        .check(with_ids(
            pb::CheckRequest {
                items: vec![item("NoSuchLimit", "x", None)],
            },
            &traceparent(5).to_uppercase(),
            "req-ok",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = native
        .check(with_ids(
            pb::CheckRequest {
                items: vec![item("NoSuchLimit", "x", None)],
            },
            &traceparent(6),
            "req\"forged",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let (line, before) = find_line(&server, "decision: failed", &trace_id(6));
    let line = line.expect("a debug line for the request with a forged id");
    assert!(line.get("request_id").is_none(), "{line}");
    let malformed = before
        .iter()
        .find(|f| f["message"] == "decision: failed" && f["request_id"] == "req-ok")
        .expect("the request with a malformed traceparent was logged");
    assert!(malformed.get("trace_id").is_none(), "{malformed}");
    assert!(malformed.get("span_id").is_none(), "{malformed}");
}

#[tokio::test]
async fn at_info_level_decisions_are_not_logged() {
    let server = serve_logging(example_config(), &[], "info");
    let addr = format!("http://{}", server.listen);
    let mut native = pb::rate_limiter_client::RateLimiterClient::connect(addr)
        .await
        .unwrap();
    let e = native
        .check(with_ids(
            pb::CheckRequest {
                items: vec![item("NoSuchLimit", "x", None)],
            },
            &traceparent(7),
            "req-quiet",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // Give the line time to arrive if it were written.
    let deadline = Instant::now() + Duration::from_millis(500);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        if let Ok(line) = server.logs.recv_timeout(left) {
            assert!(!line.contains("req-quiet"), "logged at info: {line}");
        }
    }
}
