//! The fast tier: the integration tests that need nothing but Rust (in-process servers on
//! the memory store, real gRPC and HTTP on loopback, the `cellrate` binary itself), as
//! modules of one test binary: the crate is linked once, not once per file. The tests that
//! need redis-server, Valkey, Envoy, Helm, Prometheus, grpcurl, Python or redis-cell are the
//! full tier, `tests/full/` (`scripts/test.sh` runs both). `common` is their harness.

// A test bounds its own waits in real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its tests.
#![allow(clippy::disallowed_methods)]

mod common;

mod bucket_shares;
mod budgets;
mod calendar;
mod caller_limits;
mod cli;
mod client_cli;
mod concurrency;
mod connection_age;
mod defaults;
mod doc_lists;
mod envoy_descriptors;
mod envoy_leases;
mod envoy_reservations;
mod envoy_rls;
mod exact_answers;
mod examples;
#[cfg(feature = "fuzzing")]
mod fuzz_regressions;
mod grpc_native;
mod grpc_parity;
mod header_visibility;
mod hostile_clients;
mod hostile_requests;
mod in_flight_share;
mod input_limits;
mod leases;
mod memcache_store;
mod native_headers;
mod operations;
mod process_ops;
mod proptests;
mod ratelimit_answers;
mod ratelimit_format;
mod ratelimit_ports;
mod ratelimit_vars;
mod readme;
mod release_sweep;
mod reservation_shares;
mod reservations;
mod resp;
mod resp_gcra;
mod rlqs;
mod rpc_labels;
mod runtime_overrides;
mod settle;
mod settle_attacks;
mod snapshot_file;
/// `store_scenarios.rs`'s tests on this tier's store, the memory store: one test per
/// scenario, `store_scenarios::memory_store::<scenario>`, each on a fresh store (the full
/// tier runs the same scenarios on Redis and Valkey).
macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod memory_store {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(&super::memory()).await;
                }
            )*
        }
    };
}
#[allow(dead_code, unused_imports)] // the Redis stores' part is the full tier's
mod store_scenarios;
mod structure;
mod tls_rotation;
mod unix_socket;
mod xds;
