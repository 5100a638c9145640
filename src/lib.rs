//! cellrate: an exact GCRA rate-limit decision service over gRPC.
//!
//! Callers ask "may this happen now?" and get an exact answer. Envoy and Istio ask through
//! Envoy's Rate Limit Service protocol; services use the native API (`Check`, `Refund`);
//! operators use the admin API (`Reset`, `Inspect`, `Top`, temporary overrides), `grpcurl`
//! and the CLI.
//!
//! # Layout
//!
//! This map is the one description of the code's shape (README and `docs/architecture.md`
//! link here). Imports point down the floors, never up; `tests/it/structure.rs` checks it
//! (and that no file is over 600 lines before its tests, no function over 100):
//!
//! ```text
//! main.rs        parse flags, init tracing, dispatch to server / cli          (top)
//! cli/           the command line: args.rs (clap flags with env fallbacks; no logic;
//!                shares.rs: the shared tables' per-tenant shares;
//!                flag_values.rs checks the values clap cannot),
//!                client/ (check, refund, admin ...: transport, decide, admin,
//!                overrides, render), simulate.rs (a scripted timeline on a fake clock)
//! server/        the process, the composition root: mod.rs (run, serve, drain),
//!                settings.rs, store.rs (the store --store names), grpc.rs (the two
//!                gRPC stacks), tasks.rs (sweeper, override copy, RESP accept loop),
//!                listener.rs (every listener's bounds and timeouts; the HTTP/1
//!                server), connection_age.rs (GOAWAY at a jittered age),
//!                unix_socket.rs (--grpc-uds: the socket file), uds_authority.rs and
//!                hpack.rs (a socket path as `:authority` read as localhost), tls.rs (handshakes,
//!                certificates re-read when their files change), rpc_metrics.rs and
//!                shortcut.rs (tower layers), admin.rs (bearer token, TLS), reload.rs
//!                (watch, debounce, swap), xds/ (the ADS client that feeds it; wire.rs
//!                bounds updates before decoding),
//!                http.rs (/metrics, /healthz, /readyz), shutdown.rs (SIGINT | SIGTERM)
//! service/       the APIs over one Decider: request.rs (items, options, answers),
//! resp/          decider.rs (one store call per batch), resolve.rs (names, ids,
//!                caller limits, rules, costs), native/ (cellrate.v1: the services,
//!                convert.rs, settle.rs: Checks kept for Settle, facts.rs: what one
//!                spent, holds.rs: reservation policies at Check, release.rs: holds
//!                not settled in time, in_flight.rs: Top of leases held, wire.rs: Check
//!                served by grpc/unary.rs, the other methods by tonic), envoy/ (RLS
//!                v3: decide, respond, reserve.rs: reservations held and settled by the
//!                native Settler, wire.rs: the RPC served, its metadata encoded
//!                once, values.rs: a client's bytes made decidable, refusal.rs: what
//!                cannot be decided as it came, by the invalid_id policy), headers/ (the rate-limit headers both
//!                answer: styles, openai.rs, trio.rs: descriptor statuses and
//!                envoyproxy/ratelimit's three), rlqs/ over quota_book.rs (Envoy RLQS),
//!                overrides.rs (temporary overrides), token.rs, trace.rs;
//!                resp/: the Redis protocol (protocol.rs, server.rs: one connection,
//!                commands.rs, auth.rs, lockout.rs, throttle.rs: redis-cell's numbers,
//!                gcra.rs: Redis 8.8's GCRA command)
//! grpc/          gRPC as served: mod.rs (every RPC's path, `rpc` label and kind, written
//!                once: the route table the RPC histogram, the in-flight bound and both
//!                stacks read; --grpc-unary), unary.rs (ShouldRateLimit and Check served
//!                by hand, or by tonic's unary code)
//! store/         Store trait, StoreError, StoreObserver; memory/ over table.rs
//!                (sharded, all-or-nothing; leases.rs: concurrency limits' leases,
//!                lease_shares.rs: their bounds in all and per name, shares.rs: the
//!                buckets' bounds per name and the denial when full, snapshot.rs),
//!                measured.rs (timing; the observer for
//!                Metrics), shared.rs (ports the services use: shared overrides, RLQS
//!                demand, settlements; settlements.rs keeps them in memory), redis/
//!                (script calls, cluster, breaker, deny cache, failure policy and
//!                failure log, coalescing, leases.rs: leases as the script reads them,
//!                shared tables), memcache/ (envoyproxy/ratelimit's fixed windows in
//!                memcached: store.rs, client.rs, wire.rs)
//! limits/        pure configuration: names.rs (names, bucket keys), ids.rs (id formats,
//!                canonical ids), config/ (YAML -> validated, immutable LimitTable:
//!                build, files, raw, reservation), descriptors.rs (Envoy descriptors -> names and
//!                ids), ratelimit_format/ (envoyproxy/ratelimit's files and xDS resources:
//!                read, xds, matching),
//!                duration.rs, hash.rs
//! observe/       leaves: metrics/ (Prometheus series only), health.rs (/healthz,
//!                /readyz state), top.rs (who is being limited)
//! gcra/          pure arithmetic: Limit (GCRA, a calendar window or a concurrency
//!                limit), spend, charge (debt), refund; batch.rs: batches (all or
//!                nothing), strictest; calendar.rs: windows; lease.rs: acquire,
//!                release                                                  (core)
//! clock.rs       Nanos, Clock (wall and monotonic), SystemClock, FakeClock (the only
//!                OS clock read: .clippy.toml bans it elsewhere); the UTC calendar's
//!                window boundaries (CalendarPeriod); clock/zoned.rs: days, ISO weeks,
//!                months, years in an IANA zone, from an anchor day
//! text.rs        caller text cut for logs and errors, an error's causes      (core)
//! fuzzing/       fuzz harnesses for fuzz/ and the tests (feature `fuzzing`); seeds.rs:
//!                their starting inputs, built from the examples
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
pub mod grpc;
pub mod limits;
pub mod observe;
pub mod resp;
pub mod server;
pub mod service;
pub mod store;
pub mod text;

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
