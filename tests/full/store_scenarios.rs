//! The store scenarios (`common::store_scenarios`) on Redis and Valkey, standalone and
//! clustered: one test per scenario and store, `store_scenarios::<store>::<scenario>`, each
//! on a server or cluster of its own (the fast tier runs the same scenarios on the memory
//! store).

use std::sync::Arc;

use cellrate::clock::FakeClock;
use cellrate::observe::metrics::Metrics;
use cellrate::store::redis::{RedisClock, RedisSettings, RedisStore};

use crate::common::redis_server::{RedisCluster, RedisServer};
use crate::common::store_scenarios::{Subject, T0};

/// The Redis store on `url` (standalone) or `nodes` (a cluster), keys under `prefix`, on a
/// fake clock at `T0` that the store passes to its script.
fn redis(url: Option<String>, nodes: Vec<String>, prefix: &str) -> Subject {
    let clock = FakeClock::new(T0);
    let metrics = Metrics::new();
    let cluster = !nodes.is_empty();
    let settings = RedisSettings {
        url,
        cluster_nodes: nodes,
        prefix: prefix.to_string(),
        // Generous: debug builds on a shared 2-core machine. Deadlines are tested apart.
        timeout: std::time::Duration::from_secs(2),
        clock: RedisClock::Local,
        ..RedisSettings::default()
    };
    let store = RedisStore::new(settings, Arc::new(clock.clone()), metrics.clone()).unwrap();
    Subject {
        store,
        clock,
        metrics,
        cluster_slot: cluster.then_some(cellrate::store::redis::slot as fn(&str) -> usize),
    }
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod redis_standalone {
            use super::{redis, RedisServer};
            use crate::common::store_scenarios as scenarios;
            $(
                #[tokio::test]
                async fn $scenario() {
                    let server = RedisServer::start();
                    scenarios::$scenario(&redis(Some(server.url()), vec![], "t:")).await;
                }
            )*
        }

        mod valkey_standalone {
            use super::{redis, RedisServer};
            use crate::common::store_scenarios as scenarios;
            $(
                #[tokio::test]
                async fn $scenario() {
                    let server = RedisServer::start_valkey();
                    scenarios::$scenario(&redis(Some(server.url()), vec![], "t:")).await;
                }
            )*
        }

        mod valkey_cluster {
            use super::{redis, RedisCluster};
            use crate::common::store_scenarios as scenarios;
            $(
                #[tokio::test]
                async fn $scenario() {
                    let cluster = RedisCluster::start_valkey();
                    scenarios::$scenario(&redis(None, cluster.urls(), "t:")).await;
                }
            )*
        }

        mod redis_cluster {
            use super::{redis, RedisCluster};
            use crate::common::store_scenarios as scenarios;
            $(
                #[tokio::test]
                async fn $scenario() {
                    // The all-or-nothing scenario checks slots with the prefix "t:".
                    let cluster = RedisCluster::start();
                    scenarios::$scenario(&redis(None, cluster.urls(), "t:")).await;
                }
            )*
        }
    };
}
crate::common::every_store_scenario!(on_every_store);
