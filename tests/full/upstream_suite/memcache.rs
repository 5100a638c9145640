//! Upstream's testBasicBaseConfig cases on memcached: TestBasicConfigMemcache,
//! TestConfigMemcacheWithMaxIdleConns and TestMultiNodeMemcache, one server for the
//! single-node families and two for the multi-node one, as upstream's tests start them
//! (`common.WithMultiMemcache`), each case a `ratelimit` of its own with
//! `BACKEND_TYPE=memcache`, started in parallel.

use super::base::{base_config_on_each, start_all, upstream_runtime, Variant};
use crate::common::memcached::Memcached;

#[tokio::test]
async fn test_basic_config_memcache_max_idle_conns_and_multi_node() {
    let (single, first, second) = (Memcached::start(), Memcached::start(), Memcached::start());
    let one = single.address();
    let both = format!("{},{}", first.address(), second.address());
    let on_one = [("MEMCACHE_HOST_PORT", one.as_str())];
    let variants = [
        Variant::new("TestBasicConfigMemcache/Memcache", &on_one, &[]),
        Variant::new(
            "TestBasicConfigMemcache/MemcacheWithLocalCache",
            &on_one,
            &[("LOCAL_CACHE_SIZE_IN_BYTES", "1000")],
        ),
        Variant::new(
            "TestBasicConfigMemcache/MemcacheWithPrefix",
            &on_one,
            &[("CACHE_KEY_PREFIX", "prefix:")],
        ),
        // MEMCACHE_MAX_IDLE_CONNS unset: its default, 2, as upstream asserts of its
        // settings (here `ratelimit_memcache`'s unit tests read the flag it becomes).
        Variant::new(
            "TestConfigMemcacheWithMaxIdleConns/MemcacheWithDefaultMaxIdleConns",
            &on_one,
            &[],
        ),
        Variant::new(
            "TestConfigMemcacheWithMaxIdleConns/MemcacheWithSpecifiedMaxIdleConns",
            &on_one,
            &[("MEMCACHE_MAX_IDLE_CONNS", "100")],
        ),
        Variant::new(
            "TestMultiNodeMemcache/MemcacheMultipleNodes",
            &[("MEMCACHE_HOST_PORT", both.as_str())],
            &[],
        ),
        // Not upstream's: cellrate honours STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT on
        // memcached as on Redis (upstream's memcache ignores it), so this case's answers
        // are the Redis cases' with it (`key2` stays at 10 left once `key3` is over).
        Variant::new(
            "cellrate/MemcacheWithStopCacheKeyIncrementWhenOverlimit",
            &on_one,
            &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
        ),
    ];
    let root = upstream_runtime();
    let started = start_all(root.path(), &[("BACKEND_TYPE", "memcache")], &variants);
    base_config_on_each(&started).await;
    drop(started);
    // Upstream asserts no key; here each case's `key4` counter is where and what it should
    // be: envoyproxy/ratelimit's key (`<prefix><domain>_<key>_<value>_<window start>`),
    // each case's two hits, the four unprefixed cases' on one key.
    let day = crate::common::ratelimit_answers::unix_seconds() / 86_400 * 86_400;
    let key4 = |prefix: &str, key: &str| format!("{prefix}another_{key}_durTest_{day}");
    assert_eq!(single.counter(&key4("", "key4")), Some(8));
    assert_eq!(single.counter(&key4("prefix:", "key4")), Some(2));
    assert_eq!(single.counter(&key4("", "key4_local")), Some(2));
    let on = [&first, &second].map(|node| node.counter(&key4("", "key4")));
    assert!(matches!(on, [Some(2), None] | [None, Some(2)]), "{on:?}");
    for node in [&first, &second] {
        assert!(node.items() > 0, "both nodes hold counters");
    }
}
