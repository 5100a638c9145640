//! The full tier: the integration tests that need more than Rust: a real redis-server,
//! Valkey, Envoy, Helm, Prometheus, grpcurl, Python clients or redis-cell. Each fails, never
//! skips, when what it needs is missing (`scripts/test.sh` installs it all). The fast tier,
//! `tests/it/`, holds the rest. `common` is the harness both share, the crate
//! `cellrate-test-support` (`tests/support/`).

// A test binary has no API: `pub` here only shares helpers between its modules.
#![allow(unreachable_pub)]
// A test bounds its own waits in real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its tests.
#![allow(clippy::disallowed_methods)]

use cellrate_test_support as common;

#[cfg(feature = "redis")]
mod ai_gateway;
mod budgets_envoy;
mod concurrency_envoy;
mod deploy;
mod doc_pictures;
mod envoy_e2e;
mod fail_open;
mod faults;
mod grpcurl;
mod header_visibility_envoy;
mod held_checks_envoy;
#[cfg(feature = "redis")]
mod held_checks_redis;
mod istio_e2e;
mod memcache;
mod observability;
mod python_envoy;
mod ratelimit_dashboard;
mod ratelimit_example;
mod readme_tools;
#[cfg(feature = "redis")]
mod redis_bucket_shares;
#[cfg(feature = "redis")]
mod redis_coalescing;
#[cfg(feature = "redis")]
mod redis_leases;
mod redis_module;
#[cfg(feature = "redis")]
mod redis_module_batch;
mod redis_module_settle;
#[cfg(feature = "redis")]
mod redis_readonly;
#[cfg(feature = "redis")]
mod redis_store;
#[cfg(feature = "redis")]
mod redis_tls;
#[cfg(feature = "redis")]
mod release_sweep_redis;
mod reservations_envoy;
#[cfg(feature = "redis")]
mod reservations_redis;
mod resp_clients;
mod resp_differential;
#[cfg(feature = "redis")]
mod resp_gcra_redis;
mod retry_after_measured;
mod rlqs_e2e;
#[cfg(feature = "redis")]
mod rlqs_redis;
mod settle_attacks_redis;
mod settle_promise;
mod settle_redis;
#[cfg(feature = "redis")]
mod shared_overrides;
#[cfg(feature = "redis")]
mod spend_once;
#[cfg(feature = "redis")]
mod store_differential;
#[cfg(feature = "redis")]
mod store_log;
#[cfg(feature = "redis")]
mod store_scenarios;
#[cfg(feature = "redis")]
mod upstream_suite;
