//! cellrate: an exact GCRA rate-limit decision service over gRPC.
//!
//! Callers ask "may this happen now?" and get an exact answer. Envoy and Istio ask through
//! Envoy's Rate Limit Service protocol; services use the native API (`Check`, `Refund`);
//! operators use the admin API (`Reset`, `Inspect`), `grpcurl` and the CLI.
//!
//! # Layout
//!
//! Dependencies point one way, from the edges to a core that knows no I/O:
//!
//! ```text
//! main.rs                  parse flags, init tracing, dispatch to server / cli
//! cli/                     the command line: args.rs (clap flags with env fallbacks; no
//!                          logic), client.rs (check, refund, admin ... against a running
//!                          server), simulate.rs (a scripted timeline on a fake clock)
//! server/                  the process: mod.rs (the composition root: store, limits,
//!                          tonic services, serve, drain), listener.rs (every listener's
//!                          bounds and timeouts: connections, handshake, idle, accept
//!                          back-off, requests in flight; the HTTP/1 server), rpc_metrics.rs
//!                          and shortcut.rs (tower layers: every gRPC request timed and
//!                          counted; the decision services reached without tonic's router),
//!                          admin.rs (bearer token, TLS settings), reload.rs (watch,
//!                          debounce, swap), shutdown.rs (SIGINT | SIGTERM as a future)
//! resp/                    the Redis protocol (`--resp-listen`): protocol.rs (RESP in,
//!                          bounded; RESP2/3 out), throttle.rs (redis-cell's five numbers
//!                          from a GCRA decision), server.rs (connections, commands),
//!                          lockout.rs (wrong AUTH tokens per client address)
//! service/                 Decider (request -> batch -> decision; StoreError -> Status),
//!                          native.rs (protobuf <-> domain for cellrate.v1),
//!                          envoy.rs (Envoy RLS v3: descriptors -> batch -> statuses),
//!                          rlqs.rs over quota_book.rs (Envoy RLQS: streams, shares)
//! store/                   Store trait, StoreError (one variant per cause), StoreObserver;
//!                          memory.rs (sharded, all-or-nothing batches), measured.rs
//!                          (timing decorator), redis/ (script call, cluster slots,
//!                          breaker, deny cache, failure policy, shared overrides and
//!                          RLQS demand)
//! limits/                  names.rs (names, id formats, bucket keys), config.rs (YAML ->
//!                          validated, immutable LimitTable), descriptors.rs (Envoy
//!                          descriptors -> names and ids), runtime.rs (temporary overrides)
//! observe/                 metrics.rs (Prometheus series only; the store reports through
//!                          StoreObserver), health.rs (/healthz, /readyz state and the
//!                          metrics listener's routes), top.rs (who is being limited)
//! gcra.rs                  pure arithmetic: Limit, spend, refund, batches, strictest
//! clock.rs                 Nanos, Clock, SystemClock, FakeClock (the only OS clock read)
//! fuzzing.rs               fuzz harnesses (bytes in, properties checked) for fuzz/ and the
//!                          tests (feature `fuzzing`; `redis`, on by default, adds store/redis)
//! ```
//!
//! A request flows: tower layers (RPC metrics, in-flight bound, [`server::shortcut`]) -> tonic
//! service -> [`service::native`] (or [`service::envoy`]) converts it to
//! [`service::ItemSpec`]s -> [`service::Decider`] resolves names and ids against the current
//! [`limits::config::LimitTable`] and makes one [`store::Store`] call -> the store runs
//! [`gcra`] atomically over the batch's TATs.

pub mod cli;
pub mod clock;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod gcra;
pub mod limits;
pub mod observe;
pub mod resp;
pub mod server;
pub mod service;
pub mod store;

/// Generated protobuf types and tonic stubs.
pub mod proto {
    /// `cellrate.v1`: the native and admin APIs.
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("cellrate.v1");
    }

    /// The encoded descriptor set of `proto/`, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/cellrate_descriptor.bin"));

    /// The encoded descriptors of Envoy's `envoy/service/ratelimit/v3/rls.proto` and
    /// `envoy/service/rate_limit_quota/v3/rlqs.proto` and every file they import, as
    /// `envoy-types` ships them (`proto/README.md`), for server reflection.
    pub const ENVOY_RLS_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/proto/envoy_rate_limit_services.binpb"
    ));
}
