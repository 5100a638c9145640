//! testBasicBaseConfig, the scenario most of upstream's integration tests run under their
//! settings: its answers compared whole, its statistics after every request, its reset
//! durations; and upstream's test runtime (`test/integration/runtime/current/ratelimit`).

use crate::common::ratelimit_answers::{client, request, start_serving, status, Serving};
use crate::common::{http_get_async, sample};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::path::Path;
use std::time::Duration;
use tonic::transport::Channel;

/// Upstream's `config/basic.yaml`.
pub const BASIC: &str = "
domain: basic
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: key1_local
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
";

/// Upstream's `config/another.yaml`.
pub const ANOTHER: &str = "
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key2_local
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3_local
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key4
    rate_limit: {unit: day, requests_per_unit: 20}
  - key: key4_local
    rate_limit: {unit: day, requests_per_unit: 20}
";

/// Upstream's `config/share_threshold.yaml`.
pub const SHARE_THRESHOLD: &str = "
domain: share-threshold-test
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    rate_limit: {unit: hour, requests_per_unit: 10}
";

/// Upstream's `reload.yaml` (copied into `config/` by its reload test).
pub const RELOAD: &str = "
domain: reload
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: block
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
";

/// Upstream's test runtime: its three files under `current/ratelimit/config`.
pub fn upstream_runtime() -> tempfile::TempDir {
    crate::common::ratelimit_answers::runtime(&[
        ("basic.yaml", BASIC),
        ("another.yaml", ANOTHER),
        ("share_threshold.yaml", SHARE_THRESHOLD),
    ])
}

/// One of upstream's `t.Run` cases: its name and its settings as variables.
#[derive(Clone, Debug)]
pub struct Variant {
    pub name: String,
    pub vars: Vec<(String, String)>,
}

impl Variant {
    /// `vars` on top of `base` (a later setting wins).
    pub fn new(name: &str, base: &[(&str, &str)], vars: &[(&str, &str)]) -> Variant {
        let mut all: Vec<(String, String)> = Vec::new();
        for (k, v) in base.iter().chain(vars) {
            all.retain(|(name, _)| name != k);
            all.push((k.to_string(), v.to_string()));
        }
        Variant {
            name: name.to_string(),
            vars: all,
        }
    }

    fn var(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// upstream's `enable_local_cache`: LOCAL_CACHE_SIZE_IN_BYTES > 0.
    fn local_cache(&self) -> bool {
        self.var("LOCAL_CACHE_SIZE_IN_BYTES")
            .is_some_and(|n| n.parse::<u64>().is_ok_and(|n| n > 0))
    }

    fn stop_increment(&self) -> bool {
        self.var("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT") == Some("true")
    }

    /// upstream's `getCacheKey`: the descriptor key, `_local` with a local cache.
    pub fn key(&self, key: &str) -> String {
        match self.local_cache() {
            true => format!("{key}_local"),
            false => key.to_string(),
        }
    }
}

/// Upstream's four combinations of REDIS_PERSECOND and LOCAL_CACHE_SIZE_IN_BYTES=1000
/// (`prefix` and `/WithoutPerSecondRedis`... names as its t.Run cases), on `base`.
pub fn four(prefix: &str, base: &[(&str, &str)]) -> Vec<Variant> {
    let per_second = ("REDIS_PERSECOND", "true");
    let local = ("LOCAL_CACHE_SIZE_IN_BYTES", "1000");
    vec![
        Variant::new(&format!("{prefix}/WithoutPerSecondRedis"), base, &[]),
        Variant::new(&format!("{prefix}/WithPerSecondRedis"), base, &[per_second]),
        Variant::new(
            &format!("{prefix}/WithoutPerSecondRedisWithLocalCache"),
            base,
            &[local],
        ),
        Variant::new(
            &format!("{prefix}/WithPerSecondRedisWithLocalCache"),
            base,
            &[per_second, local],
        ),
    ]
}

/// A started `ratelimit` and the case it serves.
pub struct Upstream {
    pub variant: Variant,
    pub serving: Serving,
}

impl Upstream {
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        client(&self.serving.listen).await
    }

    /// Upstream's `ratelimit.service.rate_limit.<key>.<stat>` counter: 0 until counted,
    /// as a Go stats store's `NewCounter(..).Value()` reads one never incremented.
    pub async fn counter(&self, key: &str, stat: &str) -> u64 {
        let addr = self.serving.metrics.parse().expect("a metrics listener");
        let (code, text) = http_get_async(addr, "/metrics").await;
        assert_eq!(code, 200, "{}: /metrics", self.variant.name);
        let series = format!("cellrate_ratelimit_hits_total{{key=\"{key}\",stat=\"{stat}\"}}");
        sample(&text, &series).map_or(0, |v| v as u64)
    }
}

/// Starts one `ratelimit` per case in `root` (in parallel), each with `common` (the
/// backend's variables) and the Prometheus listener upstream's statistics are read from.
pub fn start_all(root: &Path, common: &[(&str, &str)], variants: &[Variant]) -> Vec<Upstream> {
    std::thread::scope(|scope| {
        let started: Vec<_> = variants
            .iter()
            .map(|v| {
                scope.spawn(move || {
                    let mut vars: Vec<(&str, &str)> = common.to_vec();
                    vars.extend([
                        ("USE_PROMETHEUS", "true"),
                        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
                    ]);
                    vars.extend(v.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                    Upstream {
                        variant: v.clone(),
                        serving: start_serving(root, &vars),
                    }
                })
            })
            .collect();
        started.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// Runs testBasicBaseConfig on every started case at once.
pub async fn base_config_on_each(started: &[Upstream]) {
    futures_util::future::join_all(started.iter().map(basic_base_config)).await;
}

pub fn response(code: Code, statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        ..Default::default()
    }
}

/// A value no other case or run uses: upstream's `rand.Int()` values.
pub fn unique(what: &str, variant: &Variant) -> String {
    let now = crate::common::ratelimit_answers::unix_seconds();
    let name = variant.name.replace('/', "-");
    format!("{what}-{}-{now}-{name}", std::process::id())
}

/// Waits, when fewer than `margin` seconds are left in the current window of `unit`
/// seconds, for the next one: the scenario must not straddle a window's end (upstream's
/// takes that chance).
pub async fn clear_of_a_window_end(unit: i64, margin: i64) {
    let left = unit - crate::common::ratelimit_answers::unix_seconds() % unit;
    if left < margin {
        tokio::time::sleep(Duration::from_millis(left as u64 * 1_000 + 200)).await;
    }
}

async fn ask(c: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(r).await.expect("no error").into_inner()
}

/// testBasicBaseConfig, upstream's assertions in order: the unknown domain, `key1` once, 25
/// requests of `key2` (the last 5 over), 15 of `key2` and `key3` together (the last 5 over
/// `key3`'s hour), each answer compared whole and the hit and over-limit counters read
/// after it; then `key4`'s reset, smaller 2 s later. The local cache's gauges and
/// `over_limit_with_local_cache` are not read: cellrate has no local cache (see
/// docs/upstream-suite.md).
pub async fn basic_base_config(u: &Upstream) {
    let v = &u.variant;
    let name = &v.name;
    let mut c = u.client().await;
    let r = ask(&mut c, request("foo", &[&[(&v.key("hello"), "world")]])).await;
    let unknown = DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    };
    assert_eq!(
        r,
        response(Code::Ok, vec![unknown]),
        "{name}: unknown domain"
    );

    let key1 = unique("foo", v);
    let r = ask(&mut c, request("basic", &[&[(&v.key("key1"), &key1)]])).await;
    let want = status(Code::Ok, 50, Unit::Second, 49, &r.statuses[0]);
    assert_eq!(r, response(Code::Ok, vec![want]), "{name}: key1");
    let stat_key1 = format!("basic.{}", v.key("key1"));
    assert_eq!(
        u.counter(&stat_key1, "total_hits").await,
        1,
        "{name}: key1 hits"
    );

    // The minute and hour windows of key2 and key3.
    clear_of_a_window_end(60, 8).await;
    one_key_over_its_minute(u, &mut c).await;
    two_keys_until_the_hour_is_over(u, &mut c).await;

    // key4's day, over 2 s.
    clear_of_a_window_end(86_400, 5).await;
    let key4 = v.key("key4");
    let d = &[&[(key4.as_str(), "durTest")][..]];
    let first = ask(&mut c, request("another", d)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let second = ask(&mut c, request("another", d)).await;
    let reset = |r: &RateLimitResponse| r.statuses[0].duration_until_reset.unwrap();
    assert!(
        reset(&second).seconds < reset(&first).seconds,
        "{name}: {:?} then {:?}",
        reset(&first),
        reset(&second)
    );
}

async fn one_key_over_its_minute(u: &Upstream, c: &mut RateLimitServiceClient<Channel>) {
    let v = &u.variant;
    let value = unique("key2", v);
    let stat_key2 = format!("another.{}", v.key("key2"));
    for i in 0..25u64 {
        let r = ask(c, request("another", &[&[(&v.key("key2"), &value)]])).await;
        let (code, left) = match i >= 20 {
            true => (Code::OverLimit, 0),
            false => (Code::Ok, 20 - (i as u32 + 1)),
        };
        let want = status(code, 20, Unit::Minute, left, &r.statuses[0]);
        assert_eq!(r, response(code, vec![want]), "{}: key2 {i}", v.name);
        let hits = u.counter(&stat_key2, "total_hits").await;
        assert_eq!(hits, i + 1, "{}: key2 hits after {i}", v.name);
        let over = u.counter(&stat_key2, "over_limit").await;
        let want_over = if i >= 20 { i - 19 } else { 0 };
        assert_eq!(over, want_over, "{}: key2 over_limit after {i}", v.name);
    }
}

async fn two_keys_until_the_hour_is_over(u: &Upstream, c: &mut RateLimitServiceClient<Channel>) {
    let v = &u.variant;
    let value = unique("both", v);
    let (key2, key3) = (v.key("key2"), v.key("key3"));
    let (stat_key2, stat_key3) = (format!("another.{key2}"), format!("another.{key3}"));
    for i in 0..15u64 {
        let d: &[&[(&str, &str)]] = &[&[(&key2, &value)], &[(&key3, &value)]];
        let r = ask(c, request("another", d)).await;
        let mut left1 = 20 - (i as u32 + 1);
        let (code, left2) = match i >= 10 {
            true => (Code::OverLimit, 0),
            false => (Code::Ok, 10 - (i as u32 + 1)),
        };
        // Upstream: "the remaining limit should remain unaltered" (not for memcache).
        if i >= 10 && v.stop_increment() {
            left1 = 10;
        }
        let want = vec![
            status(Code::Ok, 20, Unit::Minute, left1, &r.statuses[0]),
            status(code, 10, Unit::Hour, left2, &r.statuses[1]),
        ];
        assert_eq!(r, response(code, want), "{}: both {i}", v.name);
        let n = &v.name;
        assert_eq!(
            u.counter(&stat_key2, "total_hits").await,
            i + 26,
            "{n}: {i}"
        );
        assert_eq!(u.counter(&stat_key2, "over_limit").await, 5, "{n}: {i}");
        assert_eq!(u.counter(&stat_key3, "total_hits").await, i + 1, "{n}: {i}");
        let over3 = if i >= 10 { i - 9 } else { 0 };
        assert_eq!(u.counter(&stat_key3, "over_limit").await, over3, "{n}: {i}");
    }
}
