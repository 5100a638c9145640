//! Per-limit header visibility and OpenAI's header style (#51): a limit configured
//! `headers: hidden` denies without a word of it in the answer (statuses, headers,
//! `Retry-After`, metadata), in every header style; visible limits show as OpenAI's
//! `x-ratelimit-*-requests` and `-tokens`. Through a real tonic client on loopback (the
//! full tier shows the same through a real Envoy 1.40, `header_visibility_envoy.rs`).

use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use cellrate::service::envoy::{EnvoyOptions, HeaderStyle, MetadataStyle};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

use crate::common::header_visibility::{limits, served};
use crate::common::{descriptor, item, Served};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// The guard, the two request limits and the token budget (50 tokens) of `key`.
fn all_limits(key: &str) -> RateLimitRequest {
    let mut tokens = descriptor(&[("TokensPerKey", key)]);
    tokens.hits_addend = Some(UInt64Value { value: 50 });
    RateLimitRequest {
        domain: "edge".to_string(),
        descriptors: vec![
            descriptor(&[("AbuseGuardPerKey", key)]),
            descriptor(&[("ApiRequestsPerKey", key)]),
            descriptor(&[("ApiRequestsPerKeyDaily", key)]),
            tokens,
        ],
        hits_addend: 0,
    }
}

fn visible_only(key: &str) -> RateLimitRequest {
    let mut r = all_limits(key);
    r.descriptors.remove(0);
    r
}

async fn ask(s: &mut Served, r: RateLimitRequest) -> RateLimitResponse {
    s.envoy.should_rate_limit(r).await.unwrap().into_inner()
}

fn headers(r: &RateLimitResponse) -> Vec<(&str, &str)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect()
}

fn header<'a>(r: &'a RateLimitResponse, key: &str) -> Option<&'a str> {
    headers(r)
        .into_iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

#[tokio::test]
async fn a_hidden_limit_denies_without_a_word_of_it_in_any_style() {
    for style in [
        HeaderStyle::Off,
        HeaderStyle::Draft03,
        HeaderStyle::Ietf,
        HeaderStyle::Ratelimit,
        HeaderStyle::Openai,
    ] {
        let mut s = served(style).await;
        for n in 0..3 {
            let r = ask(&mut s, all_limits("k")).await;
            assert_eq!(r.overall_code, OK, "{style:?}: request {n}");
        }
        let denied = ask(&mut s, all_limits("k")).await;
        assert_eq!(denied.overall_code, OVER, "{style:?}");
        let text = format!("{denied:?}");
        assert!(!text.contains("AbuseGuard"), "{style:?} names it: {text}");
        // Its status: the code alone (Envoy builds x-ratelimit-* from statuses).
        let guard = &denied.statuses[0];
        assert_eq!(guard.code, OVER, "{style:?}");
        assert_eq!(guard.current_limit, None, "{style:?}");
        assert_eq!(guard.limit_remaining, 0, "{style:?}");
        assert_eq!(guard.duration_until_reset, None, "{style:?}");
        // No Retry-After: an abuse guard does not say when to come back.
        for key in ["Retry-After", "retry-after-ms"] {
            assert_eq!(header(&denied, key), None, "{style:?}: {key}");
        }
        // Nor its numbers (3 a minute) in a policy or a limit field.
        for (key, value) in headers(&denied) {
            assert!(!value.contains("3;w=60"), "{style:?}: {key}: {value}");
            assert!(!value.contains("q=3;"), "{style:?}: {key}: {value}");
        }
        // The metadata says OVER_LIMIT, not which limit.
        let metadata = denied.dynamic_metadata.clone().unwrap_or_default();
        assert!(!metadata.fields.contains_key("limit"), "{style:?}");
        assert!(
            !metadata.fields.contains_key("descriptor_index"),
            "{style:?}"
        );
        // The visible limits of the same request are shown as they stand (nothing spent).
        assert_eq!(denied.statuses[1].limit_remaining, 7, "{style:?}");
        let shown = match style {
            HeaderStyle::Off => vec![],
            HeaderStyle::Draft03 => vec![("X-RateLimit-Remaining", "7")],
            HeaderStyle::Ietf => vec![("RateLimit-Policy", "\"ApiRequestsPerKey\";q=10;w=1, \"ApiRequestsPerKeyDaily\";q=10000;w=86400, \"TokensPerKey\";q=1000;w=60")],
            // envoyproxy/ratelimit's closest descriptor, the guard's passed over.
            HeaderStyle::Ratelimit => vec![("RateLimit-Limit", "10"), ("RateLimit-Remaining", "7")],
            HeaderStyle::Openai => vec![
                ("x-ratelimit-remaining-requests", "7"),
                ("x-ratelimit-remaining-tokens", "850"),
            ],
        };
        for (key, value) in shown {
            assert_eq!(header(&denied, key), Some(value), "{style:?}");
        }
        s.stop().await;
    }
}

/// Asserts that `r` denies and says nothing of the guard: no name, no status numbers, no
/// Retry-After.
fn denied_silently(r: &RateLimitResponse, what: &str) {
    assert_eq!(r.overall_code, OVER, "{what}");
    let text = format!("{r:?}");
    assert!(!text.contains("AbuseGuard"), "{what} names it: {text}");
    assert_eq!(r.statuses[0].current_limit, None, "{what}");
    assert_eq!(r.statuses[0].duration_until_reset, None, "{what}");
    assert_eq!(header(r, "Retry-After"), None, "{what}");
}

#[tokio::test]
async fn overrides_of_a_hidden_limit_stay_hidden() {
    let mut s = served(HeaderStyle::Openai).await;
    // A deny-listed key of the guard (overrides.yaml).
    let r = ask(&mut s, all_limits("banned")).await;
    denied_silently(&r, "deny list");
    // A temporary override that lowers the guard to 1 a minute for one key: new numbers,
    // still hidden.
    let lowered = pb::SetOverrideRequest {
        name: "AbuseGuardPerKey".into(),
        id: "suspect".into(),
        burst: 1,
        count: 1,
        period: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        ttl: Some(prost_types::Duration {
            seconds: 600,
            nanos: 0,
        }),
        ..Default::default()
    };
    s.admin.set_override(lowered).await.unwrap();
    assert_eq!(ask(&mut s, all_limits("suspect")).await.overall_code, OK);
    let r = ask(&mut s, all_limits("suspect")).await;
    denied_silently(&r, "temporary override");
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), Some("9"));
    s.stop().await;
}

#[tokio::test]
async fn envoyproxy_ratelimits_metadata_leaves_out_the_hidden_descriptor() {
    let settings = Settings {
        envoy: EnvoyOptions {
            metadata: MetadataStyle::Ratelimit,
            ..EnvoyOptions::default()
        },
        ..Settings::default()
    };
    let mut s = Served::with_settings(limits(), settings).await;
    for overall in [OK, OK, OK, OVER] {
        let r = ask(&mut s, all_limits("k")).await;
        assert_eq!(r.overall_code, overall);
        let text = format!("{r:?}");
        assert!(!text.contains("AbuseGuard"), "{text}");
        // The three visible descriptors are echoed, the guard's is not.
        let metadata = r.dynamic_metadata.unwrap();
        assert!(text.contains("ApiRequestsPerKeyDaily=k"), "{text}");
        assert_eq!(
            format!("{:?}", metadata.fields["descriptors"])
                .matches("=k")
                .count(),
            3,
            "{metadata:?}"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn visible_limits_are_still_shown_beside_a_hidden_one() {
    let mut s = served(HeaderStyle::Draft03).await;
    let r = ask(&mut s, all_limits("k")).await;
    assert_eq!(
        header(&r, "X-RateLimit-Limit"),
        Some("10, 10;w=1, 10000;w=86400, 1000;w=60"),
        "the guard's 3;w=60 is left out"
    );
    assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("9"));
    s.stop().await;

    let mut s = served(HeaderStyle::Ietf).await;
    let r = ask(&mut s, all_limits("k")).await;
    assert_eq!(
        header(&r, "RateLimit-Policy"),
        Some("\"ApiRequestsPerKey\";q=10;w=1, \"ApiRequestsPerKeyDaily\";q=10000;w=86400, \"TokensPerKey\";q=1000;w=60")
    );
    s.stop().await;
}

#[tokio::test]
async fn openai_headers_show_the_strictest_request_and_token_limits() {
    let mut s = served(HeaderStyle::Openai).await;
    let r = ask(&mut s, visible_only("k")).await;
    assert_eq!(r.overall_code, OK);
    // The per-second limit is stricter than the daily one; the clock stands still, so each
    // request spent 100 ms of the second's refill and 50 of the 1 000 tokens (3 s).
    assert_eq!(
        headers(&r),
        [
            ("x-ratelimit-limit-requests", "10"),
            ("x-ratelimit-remaining-requests", "9"),
            ("x-ratelimit-reset-requests", "100ms"),
            ("x-ratelimit-limit-tokens", "1000"),
            ("x-ratelimit-remaining-tokens", "950"),
            ("x-ratelimit-reset-tokens", "3s"),
        ]
    );
    for _ in 0..9 {
        assert_eq!(ask(&mut s, visible_only("k")).await.overall_code, OK);
    }
    // The eleventh in the same instant: denied by the visible per-second limit, which
    // says when to retry (100 ms: Retry-After rounds up to 1, retry-after-ms is exact).
    let denied = ask(&mut s, visible_only("k")).await;
    assert_eq!(denied.overall_code, OVER);
    assert_eq!(header(&denied, "x-ratelimit-remaining-requests"), Some("0"));
    assert_eq!(header(&denied, "x-ratelimit-reset-requests"), Some("1s"));
    assert_eq!(header(&denied, "x-ratelimit-remaining-tokens"), Some("500"));
    assert_eq!(header(&denied, "x-ratelimit-reset-tokens"), Some("30s"));
    assert_eq!(header(&denied, "Retry-After"), Some("1"));
    assert_eq!(header(&denied, "retry-after-ms"), Some("100"));
    let metadata = denied.dynamic_metadata.unwrap();
    assert!(format!("{:?}", metadata.fields["limit"]).contains("ApiRequestsPerKey"));
    s.stop().await;
}

#[tokio::test]
async fn the_native_check_still_names_a_hidden_limit_to_its_trusted_caller() {
    // The native API answers with decisions, not headers: a service that asks is trusted
    // with which limit denied it, hidden or not.
    let mut s = served(HeaderStyle::Openai).await;
    let check = || pb::CheckRequest {
        items: vec![
            item("AbuseGuardPerKey", "k", None),
            item("ApiRequestsPerKey", "k", None),
        ],
        ..Default::default()
    };
    for _ in 0..3 {
        let r = s.decisions.check(check()).await.unwrap().into_inner();
        assert!(r.overall.unwrap().allowed);
    }
    let r = s.decisions.check(check()).await.unwrap().into_inner();
    let overall = r.overall.unwrap();
    assert!(!overall.allowed);
    assert_eq!(overall.limit.unwrap().name, "AbuseGuardPerKey");
    assert_eq!(r.items[0].limit.as_ref().unwrap().burst, 3);
    assert_eq!(r.items[1].remaining, 7);
    s.stop().await;
}
