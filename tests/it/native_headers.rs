//! The native `Check`'s rate-limit headers (#51): `CheckRequest.headers` asks for a style,
//! `CheckResponse.headers` carries the fields a gateway forwards to its clients, the same
//! as Envoy's answer has for the same limits; a `headers: hidden` limit is never in them.
//! Through real tonic clients on loopback.

use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use cellrate::service::envoy::{EnvoyOptions, HeaderStyle};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;

use crate::common::{descriptor, item, Served};

/// The API's request limit (10 a second), its token budget (1 000 a minute, `measures:
/// tokens`) and a hidden abuse guard (3 a minute).
fn header_limits() -> LimitTable {
    let files = [
        (
            "names.yaml",
            "
ApiRequestsPerKey: {number: 100, format: string}
TokensPerKey: {number: 103, format: string}
AbuseGuardPerKey: {number: 102, format: string}
",
        ),
        (
            "defaults.yaml",
            "
ApiRequestsPerKey: {burst: 10, count: 10, period: 1s}
TokensPerKey: {burst: 1000, count: 1000, period: 1m, measures: tokens}
AbuseGuardPerKey: {burst: 3, count: 3, period: 1m, headers: hidden}
",
        ),
    ];
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    LimitTable::from_files(&files).unwrap()
}

/// Envoy's answer in `style` too, to compare with.
async fn served(style: HeaderStyle) -> Served {
    let settings = Settings {
        envoy: EnvoyOptions {
            headers: style,
            ..EnvoyOptions::default()
        },
        ..Settings::default()
    };
    Served::with_settings(header_limits(), settings).await
}

const STYLES: [(HeaderStyle, pb::HeaderStyle); 5] = [
    (HeaderStyle::Off, pb::HeaderStyle::None),
    (HeaderStyle::Draft03, pb::HeaderStyle::Draft03),
    (HeaderStyle::Ietf, pb::HeaderStyle::Ietf),
    (HeaderStyle::Ratelimit, pb::HeaderStyle::Ratelimit),
    (HeaderStyle::Openai, pb::HeaderStyle::Openai),
];

/// One request and 50 tokens of `key`, the guard first when `guarded`.
fn pair(key: &str, guarded: bool, style: pb::HeaderStyle) -> pb::CheckRequest {
    let mut items = vec![
        item("ApiRequestsPerKey", key, None),
        item("TokensPerKey", key, Some(50)),
    ];
    if guarded {
        items.insert(0, item("AbuseGuardPerKey", key, None));
    }
    pb::CheckRequest {
        items,
        headers: style as i32,
        ..Default::default()
    }
}

/// The same as Envoy descriptors.
fn pair_descriptors(key: &str) -> RateLimitRequest {
    let mut tokens = descriptor(&[("TokensPerKey", key)]);
    tokens.hits_addend = Some(UInt64Value { value: 50 });
    RateLimitRequest {
        domain: "api".to_string(),
        descriptors: vec![descriptor(&[("ApiRequestsPerKey", key)]), tokens],
        hits_addend: 0,
    }
}

async fn check(s: &mut Served, request: pb::CheckRequest) -> pb::CheckResponse {
    s.decisions.check(request).await.unwrap().into_inner()
}

fn fields(r: &pb::CheckResponse) -> Vec<(String, String)> {
    (r.headers.iter())
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect()
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    (pairs.iter())
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// Each style's fields after one request and 50 tokens of a fresh key (the clock stands
/// still): 9 requests left, full again in 100 ms; 950 tokens left, full in 3 s.
fn after_one(style: HeaderStyle) -> Vec<(String, String)> {
    owned(match style {
        HeaderStyle::Off => &[],
        HeaderStyle::Draft03 => &[
            ("X-RateLimit-Limit", "10, 10;w=1, 1000;w=60"),
            ("X-RateLimit-Remaining", "9"),
            ("X-RateLimit-Reset", "1"),
        ],
        HeaderStyle::Ietf => &[
            (
                "RateLimit-Policy",
                "\"ApiRequestsPerKey\";q=10;w=1, \"TokensPerKey\";q=1000;w=60",
            ),
            (
                "RateLimit",
                "\"ApiRequestsPerKey\";r=9;t=1, \"TokensPerKey\";r=950;t=3",
            ),
        ],
        HeaderStyle::Ratelimit => &[
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "9"),
            ("RateLimit-Reset", "1"),
        ],
        HeaderStyle::Openai => &[
            ("x-ratelimit-limit-requests", "10"),
            ("x-ratelimit-remaining-requests", "9"),
            ("x-ratelimit-reset-requests", "100ms"),
            ("x-ratelimit-limit-tokens", "1000"),
            ("x-ratelimit-remaining-tokens", "950"),
            ("x-ratelimit-reset-tokens", "3s"),
        ],
    })
}

#[tokio::test]
async fn each_style_names_and_values_a_request_and_a_token_limit_as_envoys_answer_does() {
    for (style, asked) in STYLES {
        let mut s = served(style).await;
        let r = check(&mut s, pair("n", false, asked)).await;
        assert!(r.overall.as_ref().unwrap().allowed, "{style:?}");
        assert_eq!(fields(&r), after_one(style), "{style:?}");
        // Envoy's answer for the same limits and costs has the same fields.
        let envoy = s.envoy.should_rate_limit(pair_descriptors("e")).await;
        let envoy: Vec<(String, String)> = (envoy.unwrap().into_inner())
            .response_headers_to_add
            .into_iter()
            .map(|h| (h.key, h.value))
            .collect();
        assert_eq!(fields(&r), envoy, "{style:?}");
        s.stop().await;
    }
}

#[tokio::test]
async fn a_denial_says_when_to_retry_in_seconds_and_in_openais_milliseconds() {
    for (style, asked) in STYLES {
        let mut s = served(style).await;
        for n in 0..10 {
            let r = check(&mut s, pair("n", false, asked)).await;
            assert!(r.overall.unwrap().allowed, "{style:?}: request {n}");
        }
        let denied = check(&mut s, pair("n", false, asked)).await;
        assert!(!denied.overall.as_ref().unwrap().allowed, "{style:?}");
        let got = fields(&denied);
        let find = |name: &str| got.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        if style == HeaderStyle::Off {
            // None asked for: nothing computed, not even Retry-After.
            assert!(got.is_empty(), "{got:?}");
            s.stop().await;
            continue;
        }
        // The next request is 100 ms away.
        assert_eq!(find("Retry-After"), Some("1"), "{style:?}: {got:?}");
        let ms = (style == HeaderStyle::Openai).then_some("100");
        assert_eq!(find("retry-after-ms"), ms, "{style:?}: {got:?}");
        s.stop().await;
    }
}

#[tokio::test]
async fn a_hidden_limit_denying_is_in_no_header_and_gives_no_retry_after() {
    for (style, asked) in STYLES {
        let mut s = served(style).await;
        let mut answers = Vec::new();
        for _ in 0..4 {
            answers.push(check(&mut s, pair("k", true, asked)).await);
        }
        let denied = answers.last().unwrap();
        let overall = denied.overall.as_ref().unwrap();
        // The decision itself still names the guard to the trusted caller.
        assert!(!overall.allowed, "{style:?}");
        assert_eq!(overall.limit.as_ref().unwrap().name, "AbuseGuardPerKey");
        for (n, answer) in answers.iter().enumerate() {
            for (name, value) in fields(answer) {
                assert!(
                    !value.contains("AbuseGuard") && !name.contains("AbuseGuard"),
                    "{style:?}, check {n}: {name}: {value}"
                );
                // Nor its numbers: 3 a minute, none left.
                assert!(!value.contains("q=3;"), "{style:?}: {name}: {value}");
                assert!(!value.contains("3;w=60"), "{style:?}: {name}: {value}");
            }
        }
        let got = fields(denied);
        for name in ["Retry-After", "retry-after-ms"] {
            assert!(
                got.iter().all(|(n, _)| n != name),
                "{style:?}: {name} in {got:?}"
            );
        }
        if style == HeaderStyle::Ratelimit {
            // The three describe the visible limit closest to its own: 6 of 10 requests left
            // (the denied Check spent nothing).
            let limit = got.iter().find(|(n, _)| n == "RateLimit-Limit");
            assert_eq!(limit.map(|(_, v)| v.as_str()), Some("10"), "{got:?}");
            let left = got.iter().find(|(n, _)| n == "RateLimit-Remaining");
            assert_eq!(left.map(|(_, v)| v.as_str()), Some("7"), "{got:?}");
        }
        s.stop().await;
    }
}

#[tokio::test]
async fn a_header_style_not_listed_is_invalid_and_spends_nothing() {
    let mut s = served(HeaderStyle::Off).await;
    for value in [5, -1, i32::MAX] {
        let mut request = pair("k", false, pb::HeaderStyle::None);
        request.headers = value;
        let status = s.decisions.check(request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{value}");
        assert!(
            status
                .message()
                .starts_with(&format!("headers: {value} is not a HeaderStyle")),
            "{value}: {}",
            status.message()
        );
    }
    // Nor kept under a request id: the same id is free for the Check that follows.
    let mut kept = pair("k", false, pb::HeaderStyle::None);
    kept.request_id = "req-1".to_string();
    kept.headers = 9;
    let status = s.decisions.check(kept.clone()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    // Nothing was spent: the first Check that counts leaves 9 of 10; one kept for Settle
    // answers with its headers too.
    kept.headers = pb::HeaderStyle::Openai as i32;
    let r = check(&mut s, kept).await;
    assert_eq!(r.items[0].remaining, 9);
    let remaining = r
        .headers
        .iter()
        .find(|h| h.name == "x-ratelimit-remaining-requests");
    assert_eq!(
        remaining.map(|h| h.value.as_str()),
        Some("9"),
        "{:?}",
        r.headers
    );
    s.stop().await;
}

#[test]
fn the_native_api_page_lists_every_header_style() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/native-api.md"))
        .unwrap();
    let mut n = 0;
    while let Ok(style) = pb::HeaderStyle::try_from(n) {
        let name = style.as_str_name();
        assert!(
            page.contains(&format!("| `{name}`")),
            "{name} is not in the table"
        );
        n += 1;
    }
    assert_eq!(n, STYLES.len() as i32);
}
