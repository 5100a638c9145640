//! Upstream's testBasicBaseConfig cases on Redis: TestBasicConfig, TestBasicAuthConfig,
//! TestBasicTLSConfig, TestBasicAuthConfigWithRedisCluster,
//! TestBasicAuthConfigWithRedisSentinel and TestBasicReloadConfig's BasicWithoutWatchRoot,
//! one server (or cluster, or sentinel set) per family, as upstream's Makefile starts them,
//! each case a `ratelimit` of its own started in parallel.

use super::base::{base_config_on_each, four, start_all, upstream_runtime, Variant};
use crate::common::redis_server::{RedisCluster, RedisSentinels, RedisServer, SENTINEL_MASTER};

const PASSWORD: &str = "password123";

/// TestBasicConfig's nine cases and BasicWithoutWatchRoot, on one Redis; the keys the
/// CACHE_KEY_PREFIX case left in it all bear its prefix.
#[tokio::test]
async fn test_basic_config_and_without_watch_root() {
    let redis = RedisServer::start();
    let url = format!("127.0.0.1:{}", redis.port);
    // Upstream's per-second Redis is another server; cellrate warns and uses REDIS_URL's.
    let base = [
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
        ("REDIS_PERSECOND_URL", url.as_str()),
    ];
    let stop = ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true");
    let per_second = ("REDIS_PERSECOND", "true");
    let local = ("LOCAL_CACHE_SIZE_IN_BYTES", "1000");
    let name = |case: &str| format!("TestBasicConfig/{case}");
    let mut variants = four("TestBasicConfig", &[]);
    variants.extend([
        Variant::new(
            &name("WithoutPerSecondRedisWithCachePrefix"),
            &[],
            &[("CACHE_KEY_PREFIX", "prefix:")],
        ),
        Variant::new(
            &name("WithoutPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig"),
            &[],
            &[stop],
        ),
        Variant::new(
            &name("WithPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig"),
            &[],
            &[per_second, stop],
        ),
        Variant::new(
            &name("WithoutPerSecondRedisWithLocalCacheAndstopCacheKeyIncrementWhenOverlimitConfig"),
            &[],
            &[local, stop],
        ),
        Variant::new(
            &name("WithPerSecondRedisWithLocalCacheAndstopCacheKeyIncrementWhenOverlimitConfig"),
            &[],
            &[per_second, local, stop],
        ),
        Variant::new(
            "TestBasicReloadConfig/BasicWithoutWatchRoot",
            &[],
            &[("RUNTIME_WATCH_ROOT", "false")],
        ),
    ]);
    let root = upstream_runtime();
    let started = start_all(root.path(), &base, &variants);
    base_config_on_each(&started).await;
    drop(started);

    // Upstream asserts no Redis key; the migration page's shape of them is checked here:
    // `<prefix>99@<window>:<digest>`, CACHE_KEY_PREFIX's or `cellrate:`.
    let all = redis.cli(&["--scan"]).unwrap();
    let windows = |prefix: &str| -> Vec<String> {
        let mut windows: Vec<String> = all
            .lines()
            .filter_map(|k| k.strip_prefix(prefix))
            .map(|k| bucket_window(k).unwrap_or_else(|| panic!("{prefix}{k}")))
            .collect();
        windows.sort();
        windows
    };
    let prefixed = windows("prefix:");
    // key2, key2 and key3 together, key4; key1's second may be over and its key gone.
    let with_key1 = ["1d", "1h", "1m", "1m", "1s"].map(String::from);
    assert!(
        prefixed == with_key1[..4] || prefixed == with_key1,
        "{prefixed:?}"
    );
    // The nine other cases': key2's and key2's with key3 each their own, key3 each its own,
    // key4's and key4_local's `durTest` shared; key1's seconds gone or not.
    let others: Vec<String> = windows("cellrate:")
        .into_iter()
        .filter(|w| w != "1s")
        .collect();
    let mut want = vec!["1d"; 2];
    want.extend(["1h"; 9]);
    want.extend(["1m"; 18]);
    assert_eq!(others, want, "the other cases' keys");
    let seconds = windows("cellrate:").len() - others.len();
    assert_eq!(
        seconds + others.len() + prefixed.len(),
        all.lines().count(),
        "{all}"
    );
}

/// The window of a bucket's key without its prefix, `99@<window>:<digest>` (the digest 64
/// hexadecimal digits), or None when the key is not of that shape.
fn bucket_window(key: &str) -> Option<String> {
    let (window, digest) = key.strip_prefix("99@")?.split_once(':')?;
    let hex = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| window.to_string())
}

/// TestBasicAuthConfig: Redis asking for a password, REDIS_AUTH giving it.
#[tokio::test]
async fn test_basic_auth_config() {
    let redis = RedisServer::start_with_args(&["--requirepass", PASSWORD]);
    let url = format!("127.0.0.1:{}", redis.port);
    let base = [("REDIS_URL", url.as_str()), ("REDIS_AUTH", PASSWORD)];
    let variants = four("TestBasicAuthConfig", &[("REDIS_PERSECOND_AUTH", PASSWORD)]);
    let root = upstream_runtime();
    let started = start_all(root.path(), &base, &variants);
    base_config_on_each(&started).await;
    assert!(redis.cli(&["DBSIZE"]).unwrap().trim() != "0");
}

/// TestBasicTLSConfig: Redis behind TLS with upstream's self-signed certificate (its
/// Makefile's `bootstrap_redis_tls`), trusted through REDIS_TLS_CACERT (upstream installs
/// it in the system's trust store instead), with a password; and its client-certificate
/// case, Redis checking the client's certificate (the same self-signed one) against it.
#[tokio::test]
async fn test_basic_tls_config() {
    let dir = tempfile::tempdir().unwrap();
    crate::redis_tls::upstream_self_signed(dir.path(), "cert");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::rename(dir.path().join("cert.key"), &key).unwrap();
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let tls_args = |auth_clients: &'static str, port: &str| {
        let args = [
            "--tls-port",
            port,
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
        ];
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.extend(
            [
                "--tls-ca-cert-file",
                cert,
                "--tls-auth-clients",
                auth_clients,
            ]
            .map(String::from),
        );
        args.extend(["--requirepass", PASSWORD].map(String::from));
        args
    };
    let ports = [free_port(), free_port()];
    let plain = tls_args("no", &ports[0].to_string());
    let verify_peer = tls_args("yes", &ports[1].to_string());
    fn as_str(a: &[String]) -> Vec<&str> {
        a.iter().map(String::as_str).collect()
    }
    let _redis = RedisServer::start_with_args(&as_str(&plain));
    let _verifying = RedisServer::start_with_args(&as_str(&verify_peer));
    let url = |port: u16| format!("localhost:{port}");
    let (url0, url1) = (url(ports[0]), url(ports[1]));
    let tls = [
        ("REDIS_TLS", "true"),
        ("REDIS_PERSECOND_TLS", "true"),
        ("REDIS_AUTH", PASSWORD),
        ("REDIS_PERSECOND_AUTH", PASSWORD),
        ("REDIS_TLS_CACERT", cert),
    ];
    let mut variants = four("TestBasicTLSConfig", &[("REDIS_URL", &url0)]);
    variants.push(Variant::new(
        "TestBasicTLSConfig/WithoutPerSecondRedisTLSWithClientCert",
        &[("REDIS_URL", &url1)],
        &[
            ("REDIS_TLS_CLIENT_CERT", cert),
            ("REDIS_TLS_CLIENT_KEY", key),
        ],
    ));
    let root = upstream_runtime();
    let started = start_all(root.path(), &tls, &variants);
    base_config_on_each(&started).await;
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// TestBasicAuthConfigWithRedisCluster: three masters asking for a password.
#[tokio::test]
async fn test_basic_auth_config_with_redis_cluster() {
    let cluster = RedisCluster::start_with_password(PASSWORD);
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let nodes = nodes.join(",");
    let base = [
        ("REDIS_TYPE", "cluster"),
        ("REDIS_URL", nodes.as_str()),
        ("REDIS_AUTH", PASSWORD),
        ("REDIS_PERSECOND_TYPE", "cluster"),
        ("REDIS_PERSECOND_URL", nodes.as_str()),
        ("REDIS_PERSECOND_AUTH", PASSWORD),
        ("REDIS_PIPELINE_WINDOW", "150us"),
        ("REDIS_PERSECOND_PIPELINE_WINDOW", "150us"),
    ];
    let variants = four("TestBasicAuthConfigWithRedisCluster", &[]);
    let root = upstream_runtime();
    let started = start_all(root.path(), &base, &variants);
    base_config_on_each(&started).await;
}

/// TestBasicAuthConfigWithRedisSentinel: a master and replica asking for a password, three
/// sentinels asking for none (upstream's `conf/sentinel.conf`: only `auth-pass`).
#[tokio::test]
async fn test_basic_auth_config_with_redis_sentinel() {
    let set = RedisSentinels::start_with(Some((PASSWORD, "")));
    let url = format!("{SENTINEL_MASTER},{}", set.addresses().join(","));
    let base = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_AUTH", PASSWORD),
        ("REDIS_PERSECOND_TYPE", "sentinel"),
        ("REDIS_PERSECOND_URL", url.as_str()),
        ("REDIS_PERSECOND_AUTH", PASSWORD),
    ];
    let variants = four("TestBasicAuthConfigWithRedisSentinel", &[]);
    let root = upstream_runtime();
    let started = start_all(root.path(), &base, &variants);
    base_config_on_each(&started).await;
    assert!(set.master.cli(&["DBSIZE"]).unwrap().trim() != "0");
}
