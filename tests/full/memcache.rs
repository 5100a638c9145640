//! The memcache store (`BACKEND_TYPE=memcache`) against a real memcached: run as
//! `ratelimit` (upstream's memcache integration cases are `upstream_suite::memcache`'s),
//! cellrate spreads keys over nodes as gomemcache does, writes its keys with its expiry, survives memcached's restart,
//! and keeps callers' descriptor text out of memcached's command line.

use crate::common::memcached::Memcached;
use crate::common::ratelimit_answers::{
    ask, clear_of_a_minute_end, client, request, runtime, start, start_serving, unix_seconds,
    ANOTHER,
};
use crate::common::sample;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf as pbw;
use tonic::transport::Channel;

/// Over two nodes, each key is where gomemcache puts it: the server at the CRC-32 (IEEE)
/// of the key modulo their number, in MEMCACHE_HOST_PORT's order. (Upstream's memcache
/// cases, answers and statistics, are the upstream suite's: `upstream_suite::memcache`.)
#[tokio::test]
async fn over_two_nodes_each_key_is_where_gomemcache_puts_it() {
    let (one, two) = (Memcached::start(), Memcached::start());
    let root = runtime(&[("another.yaml", ANOTHER)]);
    let both = format!("{},{}", one.address(), two.address());
    let vars = [("BACKEND_TYPE", "memcache"), ("MEMCACHE_HOST_PORT", &both)];
    let (child, listen) = start(root.path(), &vars);
    let mut c = client(&listen).await;
    clear_of_a_minute_end();
    const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    let mut on = [0, 0];
    for i in 0..16 {
        let value = format!("spread-{i}-{}", unix_seconds());
        ask(&mut c, request("another", &[&[("key2", &value)]]), &[60]).await;
        let key = format!("another_key2_{value}_{}", unix_seconds() / 60 * 60);
        let at = (CRC.checksum(key.as_bytes()) % 2) as usize;
        let servers = [&one, &two];
        assert_eq!(servers[at].counter(&key), Some(1), "{key} on server {at}");
        assert_eq!(
            servers[1 - at].counter(&key),
            None,
            "{key} not on the other"
        );
        on[at] += 1;
    }
    assert!(on[0] > 0 && on[1] > 0, "{on:?}");
    drop(child);
}

/// The key is envoyproxy/ratelimit's (`<prefix><domain>_<key>_<value>_<window start>`),
/// its value the hits counted, over the limit too; it expires after the window's length
/// plus a jitter below EXPIRATION_JITTER_MAX_SECONDS (300 by default, as there). A year's
/// window (beyond memcached's 30 days of relative expiry) is given as the Unix time it
/// ends, so its counter lives (upstream's relative 365 days would be read as a time in
/// 1971: gone at once).
#[tokio::test]
async fn counters_are_upstreams_keys_with_upstreams_expiry() {
    let memcached = Memcached::start();
    let yearly = "
domain: yearly
descriptors:
  - key: k
    rate_limit: {unit: year, requests_per_unit: 2}
";
    let root = runtime(&[("another.yaml", ANOTHER), ("yearly.yaml", yearly)]);
    let address = memcached.address();
    for jitter in ["0", "300"] {
        let vars = [
            ("BACKEND_TYPE", "memcache"),
            ("MEMCACHE_HOST_PORT", address.as_str()),
            ("CACHE_KEY_PREFIX", "p:"),
            ("EXPIRATION_JITTER_MAX_SECONDS", jitter),
        ];
        let (child, listen) = start(root.path(), &vars);
        let mut c = client(&listen).await;
        clear_of_a_minute_end();
        let value = format!("v{}-{jitter}", unix_seconds());
        for _ in 0..22 {
            ask(&mut c, request("another", &[&[("key2", &value)]]), &[60]).await;
        }
        let start = unix_seconds() / 60 * 60;
        let key = format!("p:another_key2_{value}_{start}");
        assert_eq!(
            memcached.counter(&key),
            Some(22),
            "{key}: every hit counted"
        );
        let ttl = memcached.ttl(&key).unwrap();
        let most = if jitter == "0" { 60 } else { 359 };
        assert!(
            (50..=most).contains(&ttl),
            "{key}: ttl {ttl}, at most {most}"
        );
        let r = ask(&mut c, request("yearly", &[&[("k", &value)]]), &[]).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        let year = 365 * 86_400;
        let key = format!("p:yearly_k_{value}_{}", unix_seconds() / year * year);
        assert_eq!(memcached.counter(&key), Some(1), "{key} lives");
        let ttl = memcached.ttl(&key).unwrap();
        assert!(ttl > year - 100, "{key}: ttl {ttl}");
        drop(child);
    }
}

/// memcached killed mid-run: the answer is UNAVAILABLE, naming memcached, within the
/// deadline (envoyproxy/ratelimit would count 0 and allow); restarted on its port, it is
/// used again with no restart of cellrate, its counts begun anew (memcached keeps none).
#[tokio::test]
async fn memcached_killed_mid_run_is_unavailable_then_used_again() {
    let mut memcached = Memcached::start();
    let root = runtime(&[("another.yaml", ANOTHER)]);
    let address = memcached.address();
    let vars = [
        ("BACKEND_TYPE", "memcache"),
        ("MEMCACHE_HOST_PORT", address.as_str()),
    ];
    let (child, listen) = start(root.path(), &vars);
    let mut c = client(&listen).await;
    clear_of_a_minute_end();
    let value = format!("killed-{}", unix_seconds());
    for left in [19, 18] {
        let r = ask_key2(&mut c, &value).await.unwrap();
        assert_eq!(r.statuses[0].limit_remaining, left);
    }
    memcached.kill();
    let started = std::time::Instant::now();
    let e = ask_key2(&mut c, &value).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("memcache"), "{}", e.message());
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    memcached.restart();
    let r = ask_key2(&mut c, &value).await.unwrap();
    assert_eq!(
        r.statuses[0].limit_remaining, 19,
        "counted anew after the restart"
    );
    drop(child);
}

/// A descriptor's text is no memcached command: a value with `\r\n` and a command after
/// it, spaces, a control character or 300 bytes is counted under a digest of it (`#`
/// and SHA-256), and limited as any other, where envoyproxy/ratelimit's client refuses
/// the whole request's keys (and so allows it).
#[tokio::test]
async fn descriptor_values_cannot_inject_memcached_commands() {
    let memcached = Memcached::start();
    let one_a_minute = "
domain: inject
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let root = runtime(&[("inject.yaml", one_a_minute)]);
    let address = memcached.address();
    let vars = [
        ("BACKEND_TYPE", "memcache"),
        ("MEMCACHE_HOST_PORT", address.as_str()),
    ];
    let (child, listen) = start(root.path(), &vars);
    let mut c = client(&listen).await;
    clear_of_a_minute_end();
    let long = "x".repeat(300);
    let hostile = [
        "a\r\nset injected 0 0 1\r\n1\r\nget",
        "two words",
        "tab\there",
        "bell\x07",
        long.as_str(),
    ];
    for value in hostile {
        let value = format!("{value}-{}", unix_seconds());
        let first = ask(&mut c, request("inject", &[&[("k", &value)]]), &[]).await;
        let second = ask(&mut c, request("inject", &[&[("k", &value)]]), &[]).await;
        assert_eq!(
            (first.overall_code, second.overall_code),
            (Code::Ok as i32, Code::OverLimit as i32),
            "{value:?} is limited"
        );
    }
    assert_eq!(
        memcached.command("get injected\r\n").as_deref(),
        Some("END\r\n")
    );
    assert_eq!(memcached.items(), hostile.len() as u64, "one counter each");
    drop(child);
}

async fn ask_key2(
    c: &mut RateLimitServiceClient<Channel>,
    value: &str,
) -> Result<RateLimitResponse, tonic::Status> {
    let r = request("another", &[&[("key2", value)]]);
    c.should_rate_limit(r)
        .await
        .map(tonic::Response::into_inner)
}

/// envoyproxy/ratelimit's statistics as on Redis: 25 hits on 20 a minute are 20 within the
/// limit, 4 of them near it (above 80 %), 5 over. Hits given back (`is_negative_hits`) are
/// a `decr` of the window's counter, counted apart, and never take it below 0.
#[tokio::test]
async fn statistics_and_hits_given_back_are_upstreams() {
    let memcached = Memcached::start();
    let root = runtime(&[("another.yaml", ANOTHER)]);
    let address = memcached.address();
    let vars = [
        ("BACKEND_TYPE", "memcache"),
        ("MEMCACHE_HOST_PORT", address.as_str()),
    ];
    let serving = start_serving(root.path(), &vars);
    let (child, listen, metrics) = (serving.child, serving.listen, serving.metrics);
    let mut c = client(&listen).await;
    clear_of_a_minute_end();
    let value = format!("stats-{}", unix_seconds());
    for _ in 0..25 {
        ask_key2(&mut c, &value).await.unwrap();
    }
    let (_, text) = crate::common::http_get_async(metrics.parse().unwrap(), "/metrics").await;
    let stat = |name: &str| {
        let series =
            format!("cellrate_ratelimit_hits_total{{key=\"another.key2\",stat=\"{name}\"}}");
        sample(&text, &series)
    };
    let want = [
        ("total_hits", 25.0),
        ("within_limit", 20.0),
        ("near_limit", 4.0),
        ("over_limit", 5.0),
    ];
    for (name, n) in want {
        assert_eq!(stat(name), Some(n), "{name}");
    }
    let key = format!("another_key2_{value}_{}", unix_seconds() / 60 * 60);
    assert_eq!(memcached.counter(&key), Some(25));
    for (back, left) in [(3, 22), (100, 0)] {
        let mut r = request("another", &[&[("key2", &value)]]);
        r.descriptors[0].hits_addend = Some(pbw::UInt64Value { value: back });
        r.descriptors[0].is_negative_hits = true;
        let answer = c.should_rate_limit(r).await.unwrap().into_inner();
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert_eq!(memcached.counter(&key), Some(left), "{back} given back");
    }
    drop(child);
}

/// A descriptor's own `limit` counts under the same key as the file's limit would (as
/// envoyproxy/ratelimit's key has no limit in it), by its own numbers.
#[tokio::test]
async fn a_descriptors_own_limit_counts_under_the_same_key() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let memcached = Memcached::start();
    let root = runtime(&[("another.yaml", ANOTHER)]);
    let address = memcached.address();
    let vars = [
        ("BACKEND_TYPE", "memcache"),
        ("MEMCACHE_HOST_PORT", address.as_str()),
    ];
    let (child, listen) = start(root.path(), &vars);
    let mut c = client(&listen).await;
    clear_of_a_minute_end();
    let value = format!("own-{}", unix_seconds());
    let mut codes = Vec::new();
    for _ in 0..3 {
        let mut r = request("another", &[&[("key2", &value)]]);
        r.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: 2, // MINUTE
        });
        codes.push(ask(&mut c, r, &[60]).await.overall_code);
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, [ok, ok, over]);
    let key = format!("another_key2_{value}_{}", unix_seconds() / 60 * 60);
    assert_eq!(memcached.counter(&key), Some(3));
    drop(child);
}

/// Concurrent requests cannot all take a window's last hits: each is decided by the counter
/// its own `incr` returned, so 60 at once on 20 a minute are 20 allowed, 40 over, where
/// envoyproxy/ratelimit (read, answer, then increment) may allow more.
#[tokio::test]
async fn concurrent_requests_get_exactly_the_limit() {
    let memcached = Memcached::start();
    let root = runtime(&[("another.yaml", ANOTHER)]);
    let address = memcached.address();
    let vars = [
        ("BACKEND_TYPE", "memcache"),
        ("MEMCACHE_HOST_PORT", address.as_str()),
    ];
    let (child, listen) = start(root.path(), &vars);
    let c = client(&listen).await;
    clear_of_a_minute_end();
    let value = format!("concurrent-{}", unix_seconds());
    let calls = (0..60).map(|_| {
        let (mut c, value) = (c.clone(), value.clone());
        tokio::spawn(async move { ask_key2(&mut c, &value).await.unwrap().overall_code })
    });
    let codes = futures_util::future::join_all(calls).await;
    let allowed = codes
        .iter()
        .filter(|c| *c.as_ref().unwrap() == Code::Ok as i32)
        .count();
    assert_eq!(allowed, 20);
    let key = format!("another_key2_{value}_{}", unix_seconds() / 60 * 60);
    assert_eq!(memcached.counter(&key), Some(60));
    drop(child);
}

/// A `hits_addend` of 2^64 - 8 (a u64 the caller chooses) on a window that holds 11 of 20:
/// over the limit for that descriptor and not added, so the shared counter stays 11 and
/// the next 9 hits are all it has left. (Added as it was, memcached's `incr` wrapped the
/// counter round to 3, answered OK, and let the next 17 through.)
#[tokio::test]
async fn a_hit_count_that_would_wrap_the_counter_is_over_the_limit_and_not_added() {
    let memcached = Memcached::start();
    let root = runtime(&[("another.yaml", ANOTHER)]);
    let address = memcached.address();
    let vars = [
        ("BACKEND_TYPE", "memcache"),
        ("MEMCACHE_HOST_PORT", address.as_str()),
    ];
    let (child, listen) = start(root.path(), &vars);
    let mut c = client(&listen).await;
    clear_of_a_minute_end();
    let value = format!("wrap-{}", unix_seconds());
    for _ in 0..11 {
        ask_key2(&mut c, &value).await.unwrap();
    }
    let key = format!("another_key2_{value}_{}", unix_seconds() / 60 * 60);
    assert_eq!(memcached.counter(&key), Some(11));
    for hits in [u64::MAX - 7, u64::MAX, 21] {
        let mut r = request("another", &[&[("key2", &value)]]);
        r.descriptors[0].hits_addend = Some(pbw::UInt64Value { value: hits });
        let answer = c.should_rate_limit(r).await.unwrap().into_inner();
        assert_eq!(answer.overall_code, Code::OverLimit as i32, "{hits} hits");
        assert_eq!(answer.statuses[0].limit_remaining, 9, "{hits} hits");
        assert_eq!(memcached.counter(&key), Some(11), "{hits} hits not added");
    }
    let mut codes = Vec::new();
    for _ in 0..12 {
        codes.push(ask_key2(&mut c, &value).await.unwrap().overall_code);
    }
    let allowed = codes.iter().filter(|&&c| c == Code::Ok as i32).count();
    assert_eq!(allowed, 9, "the window's last 9 hits, no more: {codes:?}");
    drop(child);
}

/// A value cannot name another descriptor's counter: `user: alice_plan_pro` is
/// envoyproxy/ratelimit's key of `user: alice, plan: pro` (`amb_user_alice_plan_pro_`),
/// so there 5 of the attacker's requests spend alice's 2 a minute on her plan. Here the
/// value's `_` is written `%5F` and the attacker counts on a counter of its own; with
/// CELLRATE_MEMCACHE_EXACT_UPSTREAM_KEYS=true (a migration sharing memcached with
/// upstream's replicas) the key is upstream's exactly, ambiguity included.
#[tokio::test]
async fn a_value_cannot_name_another_descriptors_counter() {
    let memcached = Memcached::start();
    let plans = "
domain: amb
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: plan
        rate_limit: {unit: minute, requests_per_unit: 2}
";
    let root = runtime(&[("amb.yaml", plans)]);
    let address = memcached.address();
    for exact in ["false", "true"] {
        let vars = [
            ("BACKEND_TYPE", "memcache"),
            ("MEMCACHE_HOST_PORT", address.as_str()),
            ("CELLRATE_MEMCACHE_EXACT_UPSTREAM_KEYS", exact),
        ];
        let (child, listen) = start(root.path(), &vars);
        let mut c = client(&listen).await;
        clear_of_a_minute_end();
        let alice = format!("alice{exact}{}", unix_seconds());
        let hers = [("user", alice.as_str()), ("plan", "pro")];
        let first = ask(&mut c, request("amb", &[&hers]), &[60]).await;
        assert_eq!(first.overall_code, Code::Ok as i32);
        let forged = format!("{alice}_plan_pro");
        for _ in 0..5 {
            let r = ask(&mut c, request("amb", &[&[("user", &forged)]]), &[60]).await;
            assert_eq!(r.overall_code, Code::Ok as i32, "within its own 100");
        }
        let start = unix_seconds() / 60 * 60;
        let key = format!("amb_user_{alice}_plan_pro_{start}");
        let second = ask(&mut c, request("amb", &[&hers]), &[60]).await;
        if exact == "true" {
            assert_eq!(memcached.counter(&key), Some(7), "upstream's key, shared");
            assert_eq!(second.overall_code, Code::OverLimit as i32);
        } else {
            assert_eq!(memcached.counter(&key), Some(2), "only alice's own hits");
            let own = format!("amb_user_{alice}%5Fplan%5Fpro_{start}");
            assert_eq!(memcached.counter(&own), Some(5), "the attacker's own");
            assert_eq!(second.overall_code, Code::Ok as i32, "alice's second of 2");
        }
        drop(child);
    }
}
