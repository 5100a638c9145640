//! `ratelimit_answers`'s tests that need a real redis-server; the rest are the fast tier's,
//! `tests/it/ratelimit_answers.rs`.

use crate::common::ratelimit_answers::{
    ask, clear_of_a_minute_end, client, request, runtime, start, status, unix_seconds, ANOTHER,
};
use crate::common::redis_server::RedisServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

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

/// envoyproxy/ratelimit's integration configuration, as its test runtime holds it: the
/// `basic` and `another` domains (written here for these tests).
pub(crate) const BASIC: &str = "
domain: basic
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
";

/// testBasicBaseConfig's answers (its statistics aside): an unknown domain, a second
/// limit, a minute limit taken 5 over, then two limits in one request until the hour one
/// is over. With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT the minute limit stops counting
/// once the hour limit is over (remaining stays 10), as its test expects.
pub(crate) async fn basic_base_config(listen: &str, stop_increment: bool) {
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

fn response(code: Code, statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        ..Default::default()
    }
}
