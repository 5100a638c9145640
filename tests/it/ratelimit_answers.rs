//! Run as `ratelimit` (the image's /bin/ratelimit), with envoyproxy/ratelimit's environment
//! and runtime layout, ShouldRateLimit answers as envoyproxy/ratelimit answers: whole
//! responses compared with `==`, as its tests compare them with `proto.Equal`. The
//! scenarios are re-expressed from its repository (test/integration/integration_test.go's
//! testBasicBaseConfig, with and without STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, and
//! test/service/ratelimit_test.go's custom headers and dynamic metadata cases), through a
//! real gRPC client over loopback; cellrate's own answers are opt-in there.

use crate::common::ratelimit_answers::{
    ask, clear_of_a_minute_end, client, request, runtime, start, status, ANOTHER,
};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf as pbw;

/// Names, metadata and quota mode (the service tests' limits, in a file; its global
/// QUOTA_MODE there, quota_mode on each limit here).
const QUOTA: &str = "
domain: quota-domain
descriptors:
  - key: regular
    quota_mode: true
    metadata: {name: service_1, tier: {level: 1}}
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: quota
    quota_mode: true
    metadata: {name: service_2, tier: {level: 2, extra: x}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: named
    metadata: {other: service_3}
    rate_limit: {name: tenant, unit: minute, requests_per_unit: 1}
";

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value,
        ..Default::default()
    }
}

fn text(s: &str) -> pbw::Value {
    pbw::Value {
        kind: Some(pbw::value::Kind::StringValue(s.to_string())),
    }
}

fn object(fields: Vec<(&str, pbw::Value)>) -> pbw::Value {
    pbw::Value {
        kind: Some(pbw::value::Kind::StructValue(pbw::Struct {
            fields: fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        })),
    }
}

fn list(values: Vec<pbw::Value>) -> pbw::Value {
    pbw::Value {
        kind: Some(pbw::value::Kind::ListValue(pbw::ListValue { values })),
    }
}

fn number(n: f64) -> pbw::Value {
    pbw::Value {
        kind: Some(pbw::value::Kind::NumberValue(n)),
    }
}

/// envoyproxy/ratelimit's dynamic metadata of `request` with `merged` descriptor metadata.
fn upstream_metadata(request: &RateLimitRequest, merged: Option<pbw::Value>) -> pbw::Struct {
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let entries = d
                .entries
                .iter()
                .map(|e| text(&format!("{}={}", e.key, e.value)))
                .collect();
            object(vec![("entries", list(entries))])
        })
        .collect();
    let mut fields = vec![
        ("domain", text(&request.domain)),
        ("descriptors", list(descriptors)),
        ("hitsAddend", number(f64::from(request.hits_addend))),
    ];
    fields.extend(merged.map(|m| ("metadata", m)));
    match object(fields).kind {
        Some(pbw::value::Kind::StructValue(s)) => s,
        _ => unreachable!(),
    }
}

/// TestServiceWithCustomRatelimitHeaders (its headers named by LIMIT_*_HEADER: the
/// over-limit descriptor's limit, remaining 0 and the seconds left in its window) and the
/// dynamic metadata tests (TestMetadataReturnedForPassedDescriptors: a quota descriptor
/// over its limit gives no metadata and leaves the answer OK;
/// TestOverlappingMetadataReturnsTheFirstValue; TestMetadataReturnedForAllPassedDescriptors),
/// with a limit named in the YAML answered with that name and the others unnamed.
#[tokio::test]
async fn run_as_ratelimit_headers_names_and_metadata_are_envoyproxy_ratelimits() {
    let root = runtime(&[("quota-domain.yaml", QUOTA)]);
    let (_child, listen) = start(
        root.path(),
        &[
            ("BACKEND_TYPE", "memory"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_LIMIT_HEADER", "A-Ratelimit-Limit"),
            ("LIMIT_REMAINING_HEADER", "A-Ratelimit-Remaining"),
            ("LIMIT_RESET_HEADER", "A-Ratelimit-Reset"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
        ],
    );
    let mut c = client(&listen).await;
    clear_of_a_minute_end();
    let both: &[&[(&str, &str)]] = &[&[("regular", "limit")], &[("quota", "limit")]];
    let reset = |r: &RateLimitResponse, d: usize| {
        r.statuses[d]
            .duration_until_reset
            .as_ref()
            .unwrap()
            .seconds
            .to_string()
    };
    let headers = |n: u32, left: u32, reset: String| {
        vec![
            header("A-Ratelimit-Limit", n.to_string()),
            header("A-Ratelimit-Remaining", left.to_string()),
            header("A-Ratelimit-Reset", reset),
        ]
    };
    // Both pass: both metadata merged, the first value of `name` kept, `tier` merged.
    let req = request("quota-domain", both);
    let r = ask(&mut c, req.clone(), &[60, 60]).await;
    let merged = object(vec![
        ("name", text("service_1")),
        (
            "tier",
            object(vec![("level", number(1.0)), ("extra", text("x"))]),
        ),
    ]);
    let want = RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![
            status(Code::Ok, 10, Unit::Minute, 9, &r.statuses[0]),
            status(Code::Ok, 1, Unit::Minute, 0, &r.statuses[1]),
        ],
        response_headers_to_add: headers(1, 0, reset(&r, 1)),
        dynamic_metadata: Some(upstream_metadata(&req, Some(merged))),
        ..Default::default()
    };
    assert_eq!(r, want);
    // The quota descriptor over its limit: OK overall, its status OVER_LIMIT, only the
    // passed descriptor's metadata; the headers of the closest one (the quota one, 0 left).
    let r = ask(&mut c, req.clone(), &[60, 60]).await;
    let passed = object(vec![
        ("name", text("service_1")),
        ("tier", object(vec![("level", number(1.0))])),
    ]);
    let want = RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![
            status(Code::Ok, 10, Unit::Minute, 8, &r.statuses[0]),
            status(Code::OverLimit, 1, Unit::Minute, 0, &r.statuses[1]),
        ],
        response_headers_to_add: headers(1, 0, reset(&r, 1)),
        dynamic_metadata: Some(upstream_metadata(&req, Some(passed))),
        ..Default::default()
    };
    assert_eq!(r, want);
    // A limit named in the YAML is answered with its name; over it, no Retry-After, the
    // headers of the over-limit descriptor, no metadata of its own.
    let named: &[&[(&str, &str)]] = &[&[("named", "a")], &[("hello", "world")]];
    let req = request("quota-domain", named);
    let tenant = |r: &RateLimitResponse, code| {
        let mut s = status(code, 1, Unit::Minute, 0, &r.statuses[0]);
        s.current_limit.as_mut().unwrap().name = "tenant".to_string();
        s
    };
    let r = ask(&mut c, req.clone(), &[60]).await;
    let first = tenant(&r, Code::Ok);
    let unknown = DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    };
    let other = object(vec![("other", text("service_3"))]);
    let want = RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![first, unknown.clone()],
        response_headers_to_add: headers(1, 0, reset(&r, 0)),
        dynamic_metadata: Some(upstream_metadata(&req, Some(other))),
        ..Default::default()
    };
    assert_eq!(r, want);
    let r = ask(&mut c, req.clone(), &[60]).await;
    let want = RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        statuses: vec![tenant(&r, Code::OverLimit), unknown],
        response_headers_to_add: headers(1, 0, reset(&r, 0)),
        dynamic_metadata: Some(upstream_metadata(&req, None)),
        ..Default::default()
    };
    assert_eq!(r, want);
}

/// Run as `ratelimit`, cellrate's richer answers are there on request, each through its
/// variable: limit names (the full key), exact resets, Retry-After, its own metadata and
/// headers.
#[tokio::test]
async fn run_as_ratelimit_cellrates_answers_are_opt_in() {
    let root = runtime(&[("another.yaml", ANOTHER)]);
    let (_child, listen) = start(
        root.path(),
        &[
            ("BACKEND_TYPE", "memory"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("CELLRATE_RATE_LIMIT_HEADERS", "draft03"),
            ("CELLRATE_ENVOY_LIMIT_NAMES", "true"),
            ("CELLRATE_RETRY_AFTER", "true"),
            ("CELLRATE_ENVOY_METADATA", "cellrate"),
            ("CELLRATE_ENVOY_RESETS", "exact"),
        ],
    );
    let mut c = client(&listen).await;
    clear_of_a_minute_end();
    let mut last = RateLimitResponse::default();
    for _ in 0..21 {
        let r = request("another", &[&[("key2", "opt-in")]]);
        last = c.should_rate_limit(r).await.unwrap().into_inner();
    }
    assert_eq!(last.overall_code, Code::OverLimit as i32);
    let limit = last.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(limit.name, "another.key2");
    let keys: Vec<&str> = last
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "X-RateLimit-Limit",
            "X-RateLimit-Remaining",
            "X-RateLimit-Reset",
            "Retry-After"
        ]
    );
    let fields = &last.dynamic_metadata.as_ref().unwrap().fields;
    assert_eq!(fields.get("limit"), Some(&text("another.key2")));
}

/// A limit of zero (`requests_per_unit: 0`, envoyproxy/ai-gateway's suspended tenant):
/// as upstream, a check of no hits passes while nothing is counted in the window, and a
/// hit is over, each answered with the limit and the seconds left in its window, so that
/// Envoy's headers say why; once a hit is counted (the usage charged at stream end), a
/// check of no hits is over too ("a 0 budget denies from the second call"); another
/// tenant's window is its own; a zero in shadow mode denies nothing.
#[tokio::test]
async fn run_as_ratelimit_a_zero_limit_admits_no_hits_and_denies_the_first_with_its_limit() {
    const ZERO: &str = "
domain: zero
descriptors:
  - key: suspended
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: watched
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
";
    let root = runtime(&[("zero.yaml", ZERO)]);
    let (_child, listen) = start(
        root.path(),
        &[
            ("BACKEND_TYPE", "memory"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ],
    );
    let mut c = client(&listen).await;
    clear_of_a_minute_end();
    // The descriptor's own hits_addend, as Envoy Gateway's token limits send it (0 on the
    // request path); the request's 0 means 1.
    let at = |hits: u64, key: &str| {
        let mut r = request("zero", &[&[(key, "tenant-a")]]);
        r.descriptors[0].hits_addend = Some(pbw::UInt64Value { value: hits });
        r
    };
    let check = ask(&mut c, at(0, "suspended"), &[60]).await;
    assert_eq!(check.overall_code, Code::Ok as i32, "{check:?}");
    assert_eq!(
        check.statuses,
        [status(Code::Ok, 0, Unit::Minute, 0, &check.statuses[0])]
    );
    for _ in 0..2 {
        let charged = ask(&mut c, at(1, "suspended"), &[60]).await;
        assert_eq!(charged.overall_code, Code::OverLimit as i32, "{charged:?}");
        let reset = &charged.statuses[0];
        assert_eq!(
            charged.statuses,
            [status(Code::OverLimit, 0, Unit::Minute, 0, reset)]
        );
        let left = reset.duration_until_reset.as_ref().unwrap().seconds;
        assert_eq!(
            charged.response_headers_to_add,
            [
                header("RateLimit-Limit", "0".to_string()),
                header("RateLimit-Remaining", "0".to_string()),
                header("RateLimit-Reset", left.to_string()),
            ]
        );
    }
    let again = ask(&mut c, at(0, "suspended"), &[60]).await;
    assert_eq!(again.overall_code, Code::OverLimit as i32, "{again:?}");
    let mut other = at(0, "suspended");
    other.descriptors[0].entries[0].value = "tenant-b".to_string();
    let other = ask(&mut c, other, &[60]).await;
    assert_eq!(other.overall_code, Code::Ok as i32, "{other:?}");
    let shadow = ask(&mut c, at(5, "watched"), &[3_600]).await;
    assert_eq!(shadow.overall_code, Code::Ok as i32, "{shadow:?}");
}

/// A descriptor's own limit (AI Gateway's budget from dynamic metadata) counts in the
/// descriptor's window whatever the limit, every hit, as upstream's counter (keyed by
/// descriptor and window, INCRBY without bound): a tenant charged 10 on a budget of 2,
/// then given 6 within the window, is over (10 > 6: a fresh window, and one that kept at
/// most twice 2, admitted it), and given 20 has 10 left; a suspended tenant (0) charged 2,
/// then given 2, has none left, and its next hit is over. The headers stay sane: nothing
/// remaining, never a negative count.
#[tokio::test]
async fn run_as_ratelimit_a_descriptor_limit_that_changes_keeps_its_window() {
    const BUDGETS: &str = "
domain: budgets
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 4}
";
    let root = runtime(&[("budgets.yaml", BUDGETS)]);
    let (_child, listen) = start(
        root.path(),
        &[
            ("BACKEND_TYPE", "memory"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ],
    );
    let mut c = client(&listen).await;
    clear_of_a_minute_end();
    let at = |tenant: &str, budget: u32, hits: u64| {
        let mut r = request("budgets", &[&[("tenant", tenant)]]);
        let d = &mut r.descriptors[0];
        d.hits_addend = Some(pbw::UInt64Value { value: hits });
        d.limit = Some(RateLimitOverride {
            requests_per_unit: budget,
            unit: Unit::Minute as i32,
        });
        r
    };
    let cases = [
        ("a", 2, 10, Code::OverLimit, 0),
        ("a", 6, 0, Code::OverLimit, 0),
        ("a", 20, 0, Code::Ok, 10),
        ("s", 0, 2, Code::OverLimit, 0),
        ("s", 2, 0, Code::Ok, 0),
        ("s", 2, 1, Code::OverLimit, 0),
    ];
    for (tenant, budget, hits, code, left) in cases {
        let r = ask(&mut c, at(tenant, budget, hits), &[60]).await;
        let reset = &r.statuses[0];
        let expected = status(code, budget, Unit::Minute, left, reset);
        assert_eq!(r.statuses, [expected], "{tenant}: {budget}, {hits} hits");
        assert_eq!(r.overall_code, code as i32);
        assert_eq!(
            r.response_headers_to_add[1],
            header("RateLimit-Remaining", left.to_string()),
            "{tenant}: {budget}, {hits} hits"
        );
    }
}

/// LOG_LEVEL=debug (upstream's compose files set it) logs cellrate's decisions, allowed
/// ones too, and not the HTTP/2 library's frames (1 672 of 1 682 lines for 10 calls
/// before): those only under an explicit RUST_LOG.
#[tokio::test]
async fn run_as_ratelimit_log_level_debug_logs_decisions_not_frames() {
    let root = runtime(&[("another.yaml", ANOTHER)]);
    let serving = crate::common::ratelimit_answers::start_serving(
        root.path(),
        &[("BACKEND_TYPE", "memory"), ("LOG_LEVEL", "debug")],
    );
    let mut c = client(&serving.listen).await;
    for _ in 0..10 {
        let r = request("another", &[&[("key2", "logged")]]);
        c.should_rate_limit(r).await.unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (mut decisions, mut libraries, mut lines) = (0, 0, 0);
    while decisions < 10 && std::time::Instant::now() < deadline {
        let Ok(line) = serving.log.recv_timeout(std::time::Duration::from_secs(1)) else {
            continue;
        };
        lines += 1;
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        let target = v["target"].as_str().unwrap_or_default();
        if v["fields"]["message"] == "decision: allowed" {
            assert_eq!(v["fields"]["limit"], "another.key2", "{line}");
            decisions += 1;
        } else if !target.starts_with("cellrate") && v["level"] == "DEBUG" {
            libraries += 1;
        }
    }
    assert_eq!(decisions, 10, "{lines} lines read");
    assert_eq!(libraries, 0, "library debug lines among {lines}");
}

/// LIMIT_REQUEST_HEADERS_ENABLED and its three names (envoyproxy/ratelimit's PR #1168):
/// the limit, remaining and seconds to reset of the descriptor the response headers speak
/// of, for the upstream request (`request_headers_to_add`), on an OK answer and an
/// OVER_LIMIT one alike; beside LIMIT_RESPONSE_HEADERS_ENABLED the two carry the same
/// values; off by default.
#[tokio::test]
async fn run_as_ratelimit_request_headers_carry_the_closest_limit_to_the_upstream() {
    let root = runtime(&[("another.yaml", ANOTHER)]);
    let vars = [
        ("BACKEND_TYPE", "memory"),
        ("LIMIT_REQUEST_HEADERS_ENABLED", "true"),
        ("LIMIT_REQUEST_LIMIT_HEADER", "X-Upstream-Limit"),
        ("LIMIT_REQUEST_REMAINING_HEADER", "X-Upstream-Remaining"),
        ("LIMIT_REQUEST_RESET_HEADER", "X-Upstream-Reset"),
    ];
    let (_child, listen) = start(root.path(), &vars);
    let (_both, both) = start(
        root.path(),
        &[&vars[..], &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]].concat(),
    );
    let (_plain, plain) = start(root.path(), &[("BACKEND_TYPE", "memory")]);
    clear_of_a_minute_end();
    let three = |limit: u32, remaining: u32, reset: &DescriptorStatus| {
        let reset = reset.duration_until_reset.as_ref().unwrap().seconds;
        vec![
            header("X-Upstream-Limit", limit.to_string()),
            header("X-Upstream-Remaining", remaining.to_string()),
            header("X-Upstream-Reset", reset.to_string()),
        ]
    };
    let mut c = client(&listen).await;
    // key3: 10 an hour, key2: 20 a minute; the one with the fewest left speaks.
    let r = || request("another", &[&[("key2", "req")], &[("key3", "req")]]);
    let first = ask(&mut c, r(), &[60, 3_600]).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(
        first.request_headers_to_add,
        three(10, 9, &first.statuses[1])
    );
    assert!(first.response_headers_to_add.is_empty());
    let mut last = first;
    for _ in 0..10 {
        last = ask(&mut c, r(), &[60, 3_600]).await;
    }
    assert_eq!(last.overall_code, Code::OverLimit as i32);
    assert_eq!(last.request_headers_to_add, three(10, 0, &last.statuses[1]));
    let mut c = client(&both).await;
    let answer = ask(&mut c, r(), &[60, 3_600]).await;
    let names = ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"];
    let upstream = three(10, 9, &answer.statuses[1]);
    let response: Vec<HeaderValue> = (upstream.iter().zip(names))
        .map(|(h, name)| header(name, h.value.clone()))
        .collect();
    assert_eq!(answer.request_headers_to_add, upstream);
    assert_eq!(answer.response_headers_to_add, response);
    let mut c = client(&plain).await;
    let answer = ask(&mut c, r(), &[60, 3_600]).await;
    assert!(answer.request_headers_to_add.is_empty());
}

/// The operators' toolkit on a limit of envoyproxy/ratelimit's format: `top` names the
/// denied bucket by the limit's label and a readable name of the descriptor
/// (`domain/key=value`, escaped), where it showed a 64-character digest; `inspect` and
/// `reset` take both back and reach the bucket Envoy's requests count on, and so does a
/// temporary override.
#[tokio::test]
async fn run_as_ratelimit_admin_commands_name_ratelimit_limits_readably() {
    use cellrate::proto::v1 as pb;
    let root = runtime(&[("another.yaml", ANOTHER)]);
    let serving =
        crate::common::ratelimit_answers::start_serving(root.path(), &[("BACKEND_TYPE", "memory")]);
    let mut c = client(&serving.listen).await;
    clear_of_a_minute_end();
    let value = "a/b=c d";
    for _ in 0..21 {
        let r = request("another", &[&[("key2", value)]]);
        c.should_rate_limit(r).await.unwrap();
    }
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", serving.admin))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut admin = pb::admin_client::AdminClient::new(channel);
    let top = admin
        .top(pb::TopRequest {
            minutes: 1,
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let name = top.names.iter().find(|n| n.name == "another.key2").unwrap();
    let id = &name.ids[0].id;
    assert_eq!(id, "another/key2=a%2Fb%3Dc%20d");
    assert_eq!(name.ids[0].denials, 1);
    let item = |id: &str| pb::Item {
        name: "another.key2".to_string(),
        id: id.to_string(),
        ..Default::default()
    };
    let inspected = admin
        .inspect(pb::InspectRequest {
            items: vec![item(id)],
        })
        .await
        .unwrap()
        .into_inner();
    // 21 hits counted in a window of 20 (every hit counts, as there).
    assert_eq!(inspected.items[0].remaining, -1, "{inspected:?}");
    let reset = admin
        .reset(pb::ResetRequest {
            items: vec![item(id)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reset.deleted, 1);
    let r = request("another", &[&[("key2", value)]]);
    let answer = c.should_rate_limit(r).await.unwrap().into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(answer.statuses[0].limit_remaining, 19);
    // Another descriptor's name does not reach this bucket.
    let other = admin
        .inspect(pb::InspectRequest {
            items: vec![item("another/key2=other")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(other.items[0].remaining, 20);
    // A temporary override takes the same pair: a deny, for that bucket only.
    let set = admin
        .set_override(pb::SetOverrideRequest {
            name: "another.key2".to_string(),
            id: id.clone(),
            deny: true,
            ttl: Some(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(set.entry.unwrap().id, *id);
    let r = request("another", &[&[("key2", value)]]);
    let answer = c.should_rate_limit(r).await.unwrap().into_inner();
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
    let r = request("another", &[&[("key2", "other")]]);
    let answer = c.should_rate_limit(r).await.unwrap().into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
}
