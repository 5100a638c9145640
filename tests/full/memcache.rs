//! The memcache store (`BACKEND_TYPE=memcache`), against a real memcached and against ones
//! played by the test.
//!
//! Against a real memcached: run as `ratelimit` (upstream's memcache integration cases are
//! `upstream_suite::memcache`'s), cellrate spreads keys over nodes as gomemcache does, writes
//! its keys with its expiry, survives memcached's restart, and keeps callers' descriptor text
//! out of memcached's command line.
//!
//! Against a hostile "memcached" (a listener in the test that answers an endless line, a
//! huge value, values it was not asked for, garbage, or nothing) the store reads no more
//! than its bounds, fails within its deadline, never panics, and connects again after the
//! server drops a connection; against a scripted one it counts as envoyproxy/ratelimit does;
//! and what memcached cannot count is refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellrate::clock::{CalendarPeriod, FakeClock};
use cellrate::gcra::{Limit, Mode, Window};
use cellrate::limits::names::{BucketKey, RATELIMIT_NUMBER};
use cellrate::store::memcache::{MemcacheSettings, MemcacheStore};
use cellrate::store::{Store, StoreError, StoreItem};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::memcached::Memcached;
use crate::common::ratelimit_answers::{
    ask, clear_of_a_minute_end, client, request, runtime, start, start_serving, unix_seconds,
    ANOTHER,
};
use crate::common::{sample, T0};
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

const DEADLINE: Duration = Duration::from_millis(1_500);

/// How the fake server answers each command it reads.
#[derive(Clone, Copy)]
enum Hostile {
    /// One line that never ends.
    EndlessLine,
    /// `VALUE <key> 0 4294967295` and bytes without end.
    HugeValue,
    /// The same key's value again and again.
    RepeatedValue,
    /// A value of a key not asked for.
    UnaskedKey,
    /// Bytes of no protocol.
    Garbage,
    /// Nothing at all (the connection stays open).
    Silent,
}

/// A fake memcached answering as `how`; the address and the bytes it managed to send.
async fn hostile(how: Hostile) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(answer(stream, how, counted.clone()));
        }
    });
    (address, sent)
}

async fn answer(mut stream: TcpStream, how: Hostile, sent: Arc<AtomicU64>) {
    let mut request = [0u8; 4096];
    if stream.read(&mut request).await.unwrap_or(0) == 0 {
        return;
    }
    let key = String::from_utf8_lossy(&request)
        .split_whitespace()
        .nth(1)
        .unwrap_or("k")
        .to_string();
    let (head, body): (Vec<u8>, Vec<u8>) = match how {
        Hostile::EndlessLine => (Vec::new(), vec![b'9'; 65_536]),
        Hostile::HugeValue => (
            format!("VALUE {key} 0 4294967295\r\n").into_bytes(),
            vec![b'1'; 65_536],
        ),
        Hostile::RepeatedValue => (
            Vec::new(),
            format!("VALUE {key} 0 1\r\n1\r\n")
                .repeat(4_096)
                .into_bytes(),
        ),
        Hostile::UnaskedKey => (b"VALUE other 0 1\r\n1\r\nEND\r\n".to_vec(), Vec::new()),
        Hostile::Garbage => (
            (0..4_096u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect(),
            Vec::new(),
        ),
        Hostile::Silent => {
            // Hold the connection open, answering nothing.
            let _ = stream.read(&mut request).await;
            return;
        }
    };
    if stream.write_all(&head).await.is_err() {
        return;
    }
    sent.fetch_add(head.len() as u64, Ordering::Relaxed);
    // Without end (at most 1 GiB), until the client goes away.
    for _ in 0..16_384 {
        if body.is_empty() || stream.write_all(&body).await.is_err() {
            return;
        }
        sent.fetch_add(body.len() as u64, Ordering::Relaxed);
    }
}

fn store(address: String) -> MemcacheStore {
    let settings = MemcacheSettings {
        servers: vec![address],
        timeout: DEADLINE,
        ..MemcacheSettings::default()
    };
    MemcacheStore::new(&settings, Arc::new(FakeClock::new(T0))).unwrap()
}

/// A descriptor's counter of 10 a minute, spending `cost` (0: a read, `get`).
fn minute_counter(cost: u64) -> StoreItem {
    StoreItem {
        key: BucketKey::windowed(
            RATELIMIT_NUMBER,
            "d_k_v_",
            Window::Calendar(CalendarPeriod::Minute),
        ),
        limit: Limit::calendar(10, CalendarPeriod::Minute).unwrap(),
        cost,
        mode: Mode::Charge,
        lease: None,
    }
}

/// Spends `cost` on a fresh store of the hostile server; the error and how long it took.
async fn refused(how: Hostile, cost: u64) -> (StoreError, Duration, u64) {
    let (address, sent) = hostile(how).await;
    let store = store(address);
    let started = Instant::now();
    let e = store.spend(&[minute_counter(cost)]).await.unwrap_err();
    (e, started.elapsed(), sent.load(Ordering::Relaxed))
}

/// An endless reply line, to `get` and to `incr`: refused at 512 bytes, at once (not at
/// the deadline, having read all the server sent).
#[tokio::test]
async fn an_endless_line_is_refused_at_its_bound() {
    for cost in [0, 1] {
        let (e, took, sent) = refused(Hostile::EndlessLine, cost).await;
        assert!(
            e.to_string().contains("a line longer than 512 bytes"),
            "{e}"
        );
        assert!(took < DEADLINE / 2, "{took:?} (sent {sent} bytes)");
    }
}

/// `VALUE` announcing 4 GiB: refused before a byte of it is read.
#[tokio::test]
async fn a_huge_value_is_refused_before_it_is_read() {
    let (e, took, _) = refused(Hostile::HugeValue, 0).await;
    assert!(e.to_string().contains("a value over 32 bytes"), "{e}");
    assert!(took < DEADLINE / 2, "{took:?}");
}

/// Values of keys not asked for, or the same key's again and again, are malformed: a
/// server cannot make the store collect values without end.
#[tokio::test]
async fn values_not_asked_for_are_refused() {
    for how in [Hostile::UnaskedKey, Hostile::RepeatedValue] {
        let (e, took, _) = refused(how, 0).await;
        assert!(e.to_string().contains("a key not asked for"), "{e}");
        assert!(took < DEADLINE / 2, "{took:?}");
    }
}

/// Garbage is an error (no panic), at once.
#[tokio::test]
async fn garbage_is_an_error_not_a_panic() {
    for cost in [0, 1] {
        let (e, took, _) = refused(Hostile::Garbage, cost).await;
        assert!(e.to_string().starts_with("memcache spend"), "{e}");
        assert!(took < DEADLINE / 2, "{took:?}");
    }
}

/// A server that answers nothing: the call ends at its deadline, not later.
#[tokio::test]
async fn a_silent_server_is_given_up_at_the_deadline() {
    let (e, took, _) = refused(Hostile::Silent, 1).await;
    assert!(matches!(e, StoreError::Timeout { .. }), "{e}");
    assert!(
        took >= DEADLINE && took < DEADLINE + Duration::from_millis(500),
        "{took:?}"
    );
}

/// A server that closes each connection after one answer: the next call sees the idle
/// connection closed and connects again, instead of failing on it.
#[tokio::test]
async fn a_connection_the_server_dropped_is_not_reused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::Relaxed) + 1;
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            let _ = stream.write_all(format!("{n}\r\n").as_bytes()).await;
            // Closed once answered, as a restarting server closes its connections.
        }
    });
    let store = store(address);
    for n in 1..=3 {
        let outcome = store.spend(&[minute_counter(1)]).await.unwrap();
        assert_eq!(outcome.decisions[0].remaining, 10 - n, "call {n}");
        // Let the close reach this side before the next call looks at the connection.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(accepted.load(Ordering::Relaxed), 3);
}

/// What memcached cannot count is refused, UNAVAILABLE with the reason, never allowed and
/// never sent: cellrate's own limits (GCRA, all-or-nothing) over the native API, and
/// envoyproxy/ratelimit's limits counted by GCRA (`--ratelimit-counting gcra`, which
/// `serve` refuses at start with `--store memcache`).
#[tokio::test]
async fn what_memcached_cannot_count_is_unavailable_never_allowed() {
    use cellrate::limits::config::LimitTable;
    use cellrate::service::envoy::RatelimitCounting;
    let nothing_there = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = nothing_there.local_addr().unwrap().to_string();
    drop(nothing_there);
    let rl = "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let dir = crate::common::directory(&[("rl.yaml", rl)]);
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    for (limits, counting) in [
        (
            LimitTable::load_dir(&config).unwrap(),
            RatelimitCounting::FixedWindow,
        ),
        (
            LimitTable::load_dir(dir.path()).unwrap(),
            RatelimitCounting::Gcra,
        ),
    ] {
        let mut settings = crate::common::harness_settings();
        settings.envoy.upstream_keys = true;
        settings.envoy.ratelimit_counting = counting;
        let store: Arc<dyn Store> = Arc::new(store(address.clone()));
        let mut s = crate::common::Served::full(limits, settings, Some(store)).await;
        let e = match counting {
            RatelimitCounting::FixedWindow => {
                let item = crate::common::item("NewOrdersPerAccount", "12345", None);
                crate::common::check(&mut s, vec![item]).await.unwrap_err()
            }
            RatelimitCounting::Gcra => {
                let request = crate::common::envoy_request("rl", &[&[("k", "v")]]);
                s.envoy.should_rate_limit(request).await.unwrap_err()
            }
        };
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        assert!(
            e.message()
                .contains("the memcache store counts only envoyproxy/ratelimit's fixed windows"),
            "{}",
            e.message()
        );
        s.stop().await;
    }
}

/// `serve --store memcache` refuses at start, exit 64 naming what is wrong, what it could
/// not count: GCRA counting of envoyproxy/ratelimit's limits, or no server given.
#[test]
fn serve_refuses_what_memcached_cannot_count_at_start() {
    let cases: [(&[&str], &str); 3] = [
        (
            &["--memcache", "127.0.0.1:1", "--ratelimit-counting", "gcra"],
            "--ratelimit-counting gcra",
        ),
        (&[], "needs --memcache"),
        (&["--memcache", "no-port"], "is no HOST:PORT"),
    ];
    for (args, named) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cellrate"))
            .args(["serve", "--store", "memcache"])
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
}

/// envoyproxy/ratelimit's increment dance, against a scripted server: `incr` of a missing
/// counter, `add` with the window's length as its expiry, which another replica won
/// (`NOT_STORED`), then `incr` again; the decision is the counter that `incr` returned.
#[tokio::test]
async fn a_lost_add_race_is_counted_by_incr_again() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let script = [
        ("incr #KEY 1\r\n", "NOT_FOUND\r\n"),
        ("add #KEY 0 60 1\r\n1\r\n", "NOT_STORED\r\n"),
        ("incr #KEY 1\r\n", "7\r\n"),
    ];
    let served = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        for (asked, answer) in script {
            let mut got = vec![0u8; asked.len() + "d_k_v_".len() + 20];
            let mut n = 0;
            while !got[..n].ends_with(b"\r\n")
                || (asked.starts_with("add") && !got[..n].ends_with(b"1\r\n1\r\n"))
            {
                n += stream.read(&mut got[n..]).await.unwrap();
            }
            seen.push(String::from_utf8_lossy(&got[..n]).into_owned());
            stream.write_all(answer.as_bytes()).await.unwrap();
        }
        seen
    });
    let store = store(address);
    let outcome = store.spend(&[minute_counter(1)]).await.unwrap();
    assert_eq!(outcome.decisions[0].remaining, 3, "10 a minute, 7 counted");
    let start = T0 / cellrate::clock::SECOND / 60 * 60;
    let key = format!("d_k_v_{start}");
    let want: Vec<String> = script
        .iter()
        .map(|(asked, _)| asked.replace("#KEY", &key))
        .collect();
    assert_eq!(served.await.unwrap(), want);
}

/// A slow server and 300 requests at once: at most 128 connections are in use at any time
/// (counted by the server as commands waiting for its answer, each on a connection the
/// store holds; the rest wait for one within their deadline, and are answered), and once
/// the burst is over only `--memcache-max-idle-conns` (2) stay open.
#[tokio::test]
async fn connections_to_a_slow_server_are_bounded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let open = Arc::new(AtomicU64::new(0));
    let waiting = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let (o, w, p) = (open.clone(), waiting.clone(), peak.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            o.fetch_add(1, Ordering::SeqCst);
            let (o, w, p) = (o.clone(), w.clone(), p.clone());
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                while stream.read(&mut request).await.unwrap_or(0) > 0 {
                    p.fetch_max(w.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    // No longer waiting before the answer can free the connection.
                    w.fetch_sub(1, Ordering::SeqCst);
                    if stream.write_all(b"1\r\n").await.is_err() {
                        break;
                    }
                }
                o.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    let store = Arc::new(store(address));
    let calls = (0..300).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { store.spend(&[minute_counter(1)]).await.map(|o| o.allowed) })
    });
    for call in futures_util::future::join_all(calls).await {
        assert_eq!(call.unwrap(), Ok(true));
    }
    let most = peak.load(Ordering::SeqCst);
    assert!(most <= 128 && most > 2, "{most} in use at once");
    let left = crate::common::poll_until(
        Duration::from_secs(2),
        async || open.load(Ordering::SeqCst),
        |&n| n <= 2,
    )
    .await;
    assert!(left <= 2, "{left} left open");
}

/// A descriptor sent twice is counted once with both hits (as on every store), and the
/// error of a store that cannot be reached names no key: a caller's value (on this store
/// in envoyproxy/ratelimit's key text) never comes back raw.
#[tokio::test]
async fn a_descriptor_sent_twice_reaches_the_store_and_its_error_echoes_no_text() {
    use cellrate::limits::config::LimitTable;
    let rl = "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let dir = crate::common::directory(&[("rl.yaml", rl)]);
    let mut settings = crate::common::harness_settings();
    settings.envoy.upstream_keys = true;
    let store: Arc<dyn Store> = Arc::new(store("127.0.0.1:1".to_string()));
    let limits = LimitTable::load_dir(dir.path()).unwrap();
    let mut s = crate::common::Served::full(limits, settings, Some(store)).await;
    let value = "\x1b[2J".repeat(200);
    let twice: &[&[(&str, &str)]] = &[&[("k", &value)], &[("k", &value)]];
    let request = crate::common::envoy_request("rl", twice);
    let e = s.envoy.should_rate_limit(request).await.unwrap_err();
    // Not refused as a duplicate: decided, so the unreachable store answers.
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(!e.message().contains('\x1b'), "escaped: {:?}", e.message());
    assert!(
        e.message().len() < 1_000,
        "cut: {} bytes",
        e.message().len()
    );
    s.stop().await;
}
