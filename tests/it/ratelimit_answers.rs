//! Run as `ratelimit` (the image's /bin/ratelimit), with envoyproxy/ratelimit's environment
//! and runtime layout, ShouldRateLimit answers as envoyproxy/ratelimit answers: whole
//! responses compared with `==`, as its tests compare them with `proto.Equal`. The
//! scenarios are re-expressed from its repository (test/integration/integration_test.go's
//! testBasicBaseConfig, with and without STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, and
//! test/service/ratelimit_test.go's custom headers and dynamic metadata cases), through a
//! real gRPC client over loopback; cellrate's own answers are opt-in there.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::redis_server::RedisServer;
use crate::common::{descriptor, stderr_lines};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf as pbw;
use tonic::transport::Channel;

/// envoyproxy/ratelimit's integration configuration, as its test runtime holds it: the
/// `basic` and `another` domains (written here for these tests).
const BASIC: &str = "
domain: basic
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
";
const ANOTHER: &str = "
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key4
    rate_limit: {unit: day, requests_per_unit: 20}
";
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

/// A child killed when dropped, so that a failed assertion leaves no process behind.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The binary run as `ratelimit` in `root` (its runtime under `current/ratelimit/config`)
/// with `vars` beside the test's own; the child and its gRPC address.
fn start(root: &Path, vars: &[(&str, &str)]) -> (Running, String) {
    let bin = root.join("ratelimit");
    if !bin.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cellrate"), &bin).unwrap();
    }
    let mut command = Command::new(&bin);
    command
        .env_clear()
        .env("RUNTIME_ROOT", root.join("current"))
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("USE_STATSD", "false")
        .env("LOG_FORMAT", "json")
        .env("CELLRATE_ADMIN_LISTEN", "127.0.0.1:0");
    command.envs(vars.iter().copied());
    let mut child = Running(command.stderr(Stdio::piped()).spawn().unwrap());
    let lines = stderr_lines(&mut child.0);
    for line in (0..1_000).map_while(|_| lines.recv_timeout(Duration::from_secs(20)).ok()) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["fields"]["message"] == "cellrate serving" {
            let listen = v["fields"]["listen"].as_str().unwrap().to_string();
            return (child, listen);
        }
    }
    drop(child);
    panic!("no serving line");
}

fn runtime(files: &[(&str, &str)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    for (name, text) in files {
        std::fs::write(config.join(name), text).unwrap();
    }
    root
}

async fn client(listen: &str) -> RateLimitServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{listen}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    RateLimitServiceClient::new(channel)
}

fn unix_seconds() -> i64 {
    use cellrate::clock::{Clock, SystemClock, SECOND};
    SystemClock.now() / SECOND
}

/// Waits, when fewer than 8 seconds are left in the current minute, for the next one: the
/// scenarios count in minute and hour windows and must not straddle their end.
fn clear_of_a_minute_end() {
    let left = 60 - unix_seconds() % 60;
    if left < 8 {
        std::thread::sleep(Duration::from_millis(left as u64 * 1_000 + 200));
    }
}

/// envoyproxy/ratelimit's request: `entries` per descriptor, hits_addend 1.
fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: descriptors.iter().map(|e| descriptor(e)).collect(),
        hits_addend: 1,
    }
}

/// Asks, and checks every status's `duration_until_reset` is whole seconds computed as
/// envoyproxy/ratelimit computes it (`unit - now % unit`, now read before or after).
async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
    units: &[i64],
) -> RateLimitResponse {
    let before = unix_seconds();
    let response = c.should_rate_limit(r).await.unwrap().into_inner();
    let after = unix_seconds();
    for (status, unit) in response.statuses.iter().zip(units) {
        let Some(d) = &status.duration_until_reset else {
            continue;
        };
        let allowed = [unit - before % unit, unit - after % unit];
        assert!(
            d.nanos == 0 && allowed.contains(&d.seconds),
            "{d:?} is not one of {allowed:?}"
        );
    }
    response
}

/// envoyproxy/ratelimit's `newDescriptorStatus`: no name, the reset as answered.
fn status(
    code: Code,
    n: u32,
    unit: Unit,
    remaining: u32,
    reset: &DescriptorStatus,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: String::new(),
            requests_per_unit: n,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(pbw::Duration {
            seconds: reset
                .duration_until_reset
                .as_ref()
                .map_or(-1, |d| d.seconds),
            nanos: 0,
        }),
        ..Default::default()
    }
}

fn response(code: Code, statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        ..Default::default()
    }
}

/// testBasicBaseConfig's answers (its statistics aside): an unknown domain, a second
/// limit, a minute limit taken 5 over, then two limits in one request until the hour one
/// is over. With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT the minute limit stops counting
/// once the hour limit is over (remaining stays 10), as its test expects.
async fn basic_base_config(listen: &str, stop_increment: bool) {
    let mut c = client(listen).await;
    let unique = format!("{}-{}-{stop_increment}", std::process::id(), unix_seconds());
    clear_of_a_minute_end();
    let r = ask(&mut c, request("foo", &[&[("hello", "world")]]), &[]).await;
    let unknown = DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    };
    assert_eq!(r, response(Code::Ok, vec![unknown]));

    let r = ask(&mut c, request("basic", &[&[("key1", &unique)]]), &[1]).await;
    let want = status(Code::Ok, 50, Unit::Second, 49, &r.statuses[0]);
    assert_eq!(r, response(Code::Ok, vec![want]));

    for i in 0..25u32 {
        let r = ask(&mut c, request("another", &[&[("key2", &unique)]]), &[60]).await;
        let (code, left) = match i >= 20 {
            true => (Code::OverLimit, 0),
            false => (Code::Ok, 20 - (i + 1)),
        };
        let want = status(code, 20, Unit::Minute, left, &r.statuses[0]);
        assert_eq!(r, response(code, vec![want]), "request {i}");
    }

    let both = format!("{unique}-both");
    for i in 0..15u32 {
        let descriptors: &[&[(&str, &str)]] = &[&[("key2", &both)], &[("key3", &both)]];
        let r = ask(&mut c, request("another", descriptors), &[60, 3_600]).await;
        let mut left1 = 20 - (i + 1);
        let (code, left2) = match i >= 10 {
            true => (Code::OverLimit, 0),
            false => (Code::Ok, 10 - (i + 1)),
        };
        if i >= 10 && stop_increment {
            left1 = 10;
        }
        let want = vec![
            status(Code::Ok, 20, Unit::Minute, left1, &r.statuses[0]),
            status(code, 10, Unit::Hour, left2, &r.statuses[1]),
        ];
        assert_eq!(r, response(code, want), "request {i} of both");
    }
}

#[tokio::test]
async fn run_as_ratelimit_its_integration_answers_hold() {
    let redis = RedisServer::start();
    let root = runtime(&[("basic.yaml", BASIC), ("another.yaml", ANOTHER)]);
    let url = format!("127.0.0.1:{}", redis.port);
    for stop in [false, true] {
        let mut vars = vec![("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", url.as_str())];
        if stop {
            vars.push(("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"));
        }
        let (child, listen) = start(root.path(), &vars);
        basic_base_config(&listen, stop).await;
        drop(child);
    }
}

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
