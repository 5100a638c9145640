//! Upstream's xds_sotw_integration_test.go: TestXdsProviderBasicConfig (testBasicBaseConfig
//! with its limits over xDS, state of the world) and TestXdsProviderBasicConfigReload
//! (testConfigReload, the `reload` domain added by a second snapshot and taken away by a
//! third), `tests/support/src/ads.rs` as the control plane, node `init-test-node`. The
//! runtime directory holds upstream's files as there: in this mode none is read.

use super::base::{base_config_on_each, four, start_all, upstream_runtime, Variant};
use super::reload::test_config_reload;
use crate::common::ads::{entry, Ads};
use crate::common::redis_server::RedisServer;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{RateLimitConfig, RateLimitUnit};

/// What upstream's `config_load_success` counts in this mode.
const XDS_LOADS: &str = "cellrate_xds_updates_total{result=\"applied\"}";

fn config(domain: &str, limits: &[(&str, u32, RateLimitUnit)]) -> RateLimitConfig {
    RateLimitConfig {
        name: domain.to_string(),
        domain: domain.to_string(),
        descriptors: limits
            .iter()
            .map(|(key, n, unit)| entry(key, "", Some((*n, *unit)), vec![]))
            .collect(),
    }
}

/// Upstream's initialXdsBasicConfig: `basic` and `another`, as its files hold them.
fn initial() -> Vec<RateLimitConfig> {
    use RateLimitUnit::{Day, Hour, Minute, Second};
    vec![
        config(
            "basic",
            &[
                ("key1", 50, Second),
                ("key1_local", 50, Second),
                ("one_per_minute", 1, Minute),
            ],
        ),
        config(
            "another",
            &[
                ("key2", 20, Minute),
                ("key3", 10, Hour),
                ("key2_local", 20, Minute),
                ("key3_local", 10, Hour),
                ("key4", 20, Day),
                ("key4_local", 20, Day),
            ],
        ),
    ]
}

/// Upstream's newConfigWithXdsConfigProvider: the initial set and `reload`.
fn with_reload() -> Vec<RateLimitConfig> {
    use RateLimitUnit::{Minute, Second};
    let mut configs = initial();
    let reload = [
        ("key1", 50, Second),
        ("block", 0, Second),
        ("one_per_minute", 1, Minute),
    ];
    configs.push(config("reload", &reload));
    configs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_xds_provider_basic_config_and_reload() {
    let redis = RedisServer::start();
    let url = format!("127.0.0.1:{}", redis.port);
    let (ads, reload_ads) = (Ads::start().await, Ads::start().await);
    ads.set_configs("1", &initial());
    reload_ads.set_configs("1", &initial());
    let server = |ads: &Ads| ads.addr.to_string();
    let (server1, server2) = (server(&ads), server(&reload_ads));
    let xds = |server: &str| {
        vec![
            ("REDIS_URL", url.clone()),
            ("REDIS_SOCKET_TYPE", "tcp".to_string()),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_string()),
            ("CONFIG_GRPC_XDS_NODE_ID", "init-test-node".to_string()),
            ("CONFIG_GRPC_XDS_SERVER_URL", server.to_string()),
        ]
    };
    let (vars1, vars2) = (xds(&server1), xds(&server2));
    fn as_str<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
        v.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }
    let (vars1, vars2) = (as_str(&vars1), as_str(&vars2));
    let root = upstream_runtime();
    let variants = four("TestXdsProviderBasicConfig", &[]);
    let reload = [Variant::new(
        "TestXdsProviderBasicConfigReload/ReloadConfigWithXdsServer",
        &[],
        &[],
    )];
    let (started, reloading) = std::thread::scope(|s| {
        let one = s.spawn(|| start_all(root.path(), &vars1, &variants));
        let two = s.spawn(|| start_all(root.path(), &vars2, &reload));
        (one.join().unwrap(), two.join().unwrap())
    });
    let reload_ads = &reload_ads;
    let reloading = test_config_reload(
        &reloading[0],
        XDS_LOADS,
        async move { reload_ads.set_configs("2", &with_reload()) },
        async move { reload_ads.set_configs("3", &initial()) },
    );
    tokio::join!(base_config_on_each(&started), reloading);
}
