//! The full tier: the integration tests that need more than Rust: a real redis-server,
//! Valkey, Envoy, Helm, Prometheus, grpcurl, Python clients or redis-cell. Each fails, never
//! skips, when what it needs is missing (`scripts/test.sh` installs it all). The fast tier,
//! `tests/it/`, holds the rest, and the harness both use (`common`).

// A test binary has no API: `pub` here only shares helpers between its modules.
#![allow(unreachable_pub)]
// A test bounds its own waits in real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its tests.
#![allow(clippy::disallowed_methods)]

#[path = "../it/common/mod.rs"]
mod common;

mod budgets;
mod calendar;
mod concurrency_envoy;
mod deploy;
mod envoy_e2e;
mod fail_open;
mod faults;
mod grpcurl;
mod header_visibility;
mod istio_e2e;
mod memcache;
mod observability;
mod python_envoy;
mod ratelimit_dashboard;
mod ratelimit_format;
mod readme;
#[cfg(feature = "redis")]
mod redis_coalescing;
#[cfg(feature = "redis")]
mod redis_leases;
#[cfg(feature = "redis")]
mod redis_store;
#[cfg(feature = "redis")]
mod redis_tls;
#[cfg(feature = "redis")]
mod release_sweep;
#[cfg(feature = "redis")]
mod reservations;
mod reservations_envoy;
mod resp_clients;
mod resp_differential;
#[cfg(feature = "redis")]
mod resp_gcra;
#[cfg(feature = "redis")]
mod rlqs;
mod rlqs_e2e;
mod settle;
mod settle_attacks;
mod settle_promise;
#[cfg(feature = "redis")]
mod shared_overrides;
#[cfg(feature = "redis")]
mod spend_once;
#[cfg(feature = "redis")]
mod store_differential;
#[cfg(feature = "redis")]
mod store_log;
#[cfg(feature = "redis")]
mod upstream_suite;

/// `store_scenarios.rs`'s tests on Redis and Valkey, standalone and clustered: one test
/// per scenario and store, `store_scenarios::<store>::<scenario>`, each on a server or
/// cluster of its own (the fast tier runs the same scenarios on the memory store).
#[cfg(feature = "redis")]
macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        #[cfg(feature = "redis")]
        mod redis_standalone {
            use super::RedisServer;
            $(
                #[tokio::test]
                async fn $scenario() {
                    let server = RedisServer::start();
                    super::$scenario(&super::redis(Some(server.url()), vec![], "t:")).await;
                }
            )*
        }

        #[cfg(feature = "redis")]
        mod valkey_standalone {
            use super::RedisServer;
            $(
                #[tokio::test]
                async fn $scenario() {
                    let server = RedisServer::start_valkey();
                    super::$scenario(&super::redis(Some(server.url()), vec![], "t:")).await;
                }
            )*
        }

        #[cfg(feature = "redis")]
        mod valkey_cluster {
            use super::RedisCluster;
            $(
                #[tokio::test]
                async fn $scenario() {
                    let cluster = RedisCluster::start_valkey();
                    super::$scenario(&super::redis(None, cluster.urls(), "t:")).await;
                }
            )*
        }

        #[cfg(feature = "redis")]
        mod redis_cluster {
            use super::RedisCluster;
            $(
                #[tokio::test]
                async fn $scenario() {
                    // The all-or-nothing scenario checks slots with the prefix "t:".
                    let cluster = RedisCluster::start();
                    super::$scenario(&super::redis(None, cluster.urls(), "t:")).await;
                }
            )*
        }
    };
}
#[cfg(feature = "redis")]
#[allow(dead_code, unused_imports)] // the memory store's part is the fast tier's
#[path = "../it/store_scenarios.rs"]
mod store_scenarios;
