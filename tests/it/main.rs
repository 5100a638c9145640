//! The integration tests, as modules of one test binary: the crate is linked once, not
//! once per file. Each module tests one area against real parts (real sockets, a real
//! redis-server, real grpcurl and Python clients); `common` is their harness.

// A test bounds its own waits in real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its tests.
#![allow(clippy::disallowed_methods)]

mod common;

mod budgets;
mod calendar;
mod caller_limits;
mod cli;
mod client_cli;
mod concurrency;
mod deploy;
mod doc_lists;
mod envoy_descriptors;
mod envoy_e2e;
mod envoy_rls;
mod exact_answers;
mod examples;
mod faults;
#[cfg(feature = "fuzzing")]
mod fuzz_regressions;
mod grpc_native;
mod grpcurl;
mod header_visibility;
mod hostile_clients;
mod hostile_requests;
mod input_limits;
mod istio_e2e;
mod leases;
mod observability;
mod operations;
mod process_ops;
mod proptests;
mod python_envoy;
mod ratelimit_answers;
mod ratelimit_format;
mod readme;
#[cfg(feature = "redis")]
mod redis_coalescing;
#[cfg(feature = "redis")]
mod redis_store;
mod resp;
mod resp_clients;
mod resp_differential;
mod resp_gcra;
mod rlqs;
mod rlqs_e2e;
mod runtime_overrides;
mod settle;
mod settle_attacks;
mod settle_promise;
#[cfg(feature = "redis")]
mod shared_overrides;
mod snapshot_file;
#[cfg(feature = "redis")]
mod store_differential;
#[cfg(feature = "redis")]
mod store_log;
mod store_scenarios;
mod structure;
mod xds;
