//! The fast tier: the integration tests that need nothing but Rust (in-process servers on
//! the memory store, real gRPC and HTTP on loopback, the `cellrate` binary itself), as
//! modules of one test binary: the crate is linked once, not once per file. The tests that
//! need redis-server, Valkey, Envoy, Helm, Prometheus, grpcurl, Python or redis-cell are the
//! full tier, `tests/full/` (`scripts/test.sh` runs both). `common` is the harness both
//! share, the crate `cellrate-test-support` (`tests/support/`).

// A test binary has no API: `pub` here only shares helpers between its modules.
#![allow(unreachable_pub)]
// A test bounds its own waits in real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its tests.
#![allow(clippy::disallowed_methods)]

use cellrate_test_support as common;

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
mod held_checks;
mod hostile_clients;
mod hostile_requests;
mod in_flight_share;
mod input_limits;
mod leases;
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
mod retry_after;
mod rlqs;
mod rpc_labels;
mod runtime_overrides;
mod settle;
mod settle_attacks;
mod snapshot_file;
/// The store scenarios (`common::store_scenarios`) on this tier's store, the memory store:
/// one test per scenario, `store_scenarios::memory_store::<scenario>`, each on a fresh store
/// (the full tier runs the same scenarios on Redis and Valkey).
mod store_scenarios {
    macro_rules! memory_store {
        ($($scenario:ident),* $(,)?) => {
            mod memory_store {
                use crate::common::store_scenarios::{self as scenarios, memory};
                $(
                    #[tokio::test]
                    async fn $scenario() {
                        scenarios::$scenario(&memory()).await;
                    }
                )*
            }
        };
    }
    crate::common::every_store_scenario!(memory_store);
}
mod structure;
mod tls_rotation;
mod unix_socket;
mod xds;
