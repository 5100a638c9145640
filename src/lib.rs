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
//! link here): every file, by room, the rooms from the top floor down. Imports point down
//! the floors, never up; `tests/it/structure.rs` checks it, that this map names every file
//! and no other (and that no file is over 600 lines before its tests, no function over 100):
//!
//! ```text
//! main.rs                          the binary: flags parsed, tracing started, a command run  (top)
//!
//! cli/                             the command line
//! cli/mod.rs                       the commands and their flags, each with an environment fallback
//! cli/args.rs                      clap flags with env fallbacks; no logic
//! cli/bucket_args.rs               serve: the memory store's bucket table shares
//! cli/envoy_args.rs                serve: Envoy's ShouldRateLimit answers
//! cli/flag_values.rs               the checks of flag values clap cannot parse
//! cli/memcache_args.rs             serve: --store memcache
//! cli/redis_args.rs                serve: Redis standalone, Sentinel, Cluster
//! cli/xds_args.rs                  serve: limits from an xDS control plane
//! cli/shares.rs                    serve: the shared tables' per-tenant shares
//! cli/serve.rs                     serve's flags turned into the server's settings
//! cli/ratelimit_env.rs             `cellrate ratelimit`: envoyproxy/ratelimit's environment
//! cli/ratelimit_behaviour.rs       its behaviour, answer and statistics variables translated
//! cli/ratelimit_listeners.rs       its listener variables: gRPC TLS, connection age, admin port
//! cli/ratelimit_xds.rs             its CONFIG_TYPE and the CONFIG_GRPC_XDS_*, XDS_CLIENT_* ones
//! cli/ratelimit_redis.rs           its BACKEND_TYPE=redis and REDIS_* variables
//! cli/ratelimit_memcache.rs        its BACKEND_TYPE=memcache and MEMCACHE_* variables
//! cli/ratelimit_warned.rs          its variables accepted with a warning
//! cli/simulate.rs                  `cellrate simulate`: a scripted timeline on a fake clock
//! cli/client/mod.rs                the client commands: check, refund, admin ...
//! cli/client/transport.rs          reaching the server: channel, TLS, deadline
//! cli/client/decide.rs             check and refund
//! cli/client/admin.rs              admin inspect, reset, top
//! cli/client/overrides.rs          admin override set, clear, list
//! cli/client/render.rs             answers as aligned tables or JSON
//!
//! server/                          the process, the composition root
//! server/mod.rs                    run, serve, drain: the store, decider and reloader assembled
//! server/settings.rs               the server's settings and their defaults
//! server/store.rs                  the store --store names
//! server/grpc.rs                   the two gRPC stacks
//! server/shortcut.rs               the decision RPCs' way past tonic's router
//! server/rpc_metrics.rs            every gRPC request timed and counted (a tower layer)
//! server/in_flight.rs              the bound on requests in flight, in all and per address
//! server/per_address.rs            connections counted per client address
//! server/listener.rs               every listener's bounds and timeouts; the HTTP/1 server
//! server/connection_age.rs         GOAWAY at a jittered age
//! server/unix_socket.rs            --grpc-uds: the socket file
//! server/uds_authority.rs          a socket path as :authority read as localhost
//! server/hpack.rs                  HPACK decoding, as uds_authority.rs needs it
//! server/tls.rs                    handshakes; certificates re-read when their files change
//! server/admin.rs                  the admin API's bearer token and TLS
//! server/reload.rs                 the limits directory watched, debounced, swapped
//! server/xds/mod.rs                the ADS client that feeds reloads
//! server/xds/wire.rs               xDS updates bounded before they are decoded
//! server/http.rs                   /metrics, /healthz, /readyz
//! server/tasks.rs                  background tasks: sweeper, override copy, RESP accept loop
//! server/shutdown.rs               SIGINT or SIGTERM, as a future
//!
//! service/                         the APIs over one Decider
//! service/mod.rs                   requests in domain terms -> one store batch -> decisions
//! service/request.rs               items, options, answers, whichever API they came through
//! service/decider.rs               the Decider: one store call per batch
//! service/resolve.rs               names, ids, caller limits, rules, costs -> buckets
//! service/caller_limits.rs         bounds on caller-given limits
//! service/errors.rs                why a request was not decided, mapped to gRPC statuses
//! service/overrides/mod.rs         temporary overrides: set, looked up, synced, expired
//! service/overrides/record.rs      an override's policy checked, its shared record written, read
//! service/token.rs                 secrets callers present (admin token, RESP AUTH)
//! service/trace.rs                 W3C trace context into the logs
//! service/native/mod.rs            cellrate.v1: RateLimiter and Admin
//! service/native/wire.rs           Check served by grpc/unary.rs, the other methods by tonic
//! service/native/convert.rs        its messages to and from ItemSpecs
//! service/native/in_flight.rs      admin Top of the leases held
//! service/envoy/mod.rs             Envoy RLS v3
//! service/envoy/wire.rs            ShouldRateLimit served, its metadata encoded once
//! service/envoy/decide.rs          a request's bounds checked, descriptors mapped, decided
//! service/envoy/batch.rs           descriptors as one batch of items
//! service/envoy/values.rs          a client's bytes made decidable
//! service/envoy/refusal.rs         what cannot be decided as it came, by the invalid_id policy
//! service/envoy/reserve.rs         reservations held and settled by the Settler
//! service/envoy/respond.rs         the answer: overall code, statuses, headers
//! service/envoy/ratelimit.rs       domains in envoyproxy/ratelimit's file format
//! service/envoy/upstream.rs        envoyproxy/ratelimit's shape of an answer
//! service/settle/mod.rs            settlements, below the front ends: Checks kept, decided
//! service/settle/adjust.rs         a settle: the record claimed once, charged or refunded
//! service/settle/record.rs         a kept Check's versioned format (3ebe882's read too)
//! service/settle/facts.rs          what a kept Check spent, per item
//! service/settle/holds.rs          reservation policies at Check
//! service/settle/release.rs        holds not settled in time released (the sweeper's work)
//! service/settle/unknown.rs        kept Checks whose spend is unknown, resolved
//! service/headers/mod.rs           the rate-limit headers both answers carry, in styles
//! service/headers/openai.rs        OpenAI's headers
//! service/headers/trio.rs          descriptor statuses and envoyproxy/ratelimit's three headers
//! service/rlqs/mod.rs              Envoy RLQS
//! service/rlqs/stream.rs           one RLQS stream within its work budgets
//! service/rlqs/resolve.rs          a report's domain and bucket ids checked
//! service/quota_book.rs            RLQS's arithmetic: who reports demand for what
//! service/quota_share.rs           a reporter's share: division by demand, steps, hysteresis
//! service/quota_strategy.rs        what an RLQS bucket is told to do
//!
//! resp/                            the Redis protocol (beside service/)
//! resp/mod.rs                      CL.THROTTLE, GCRA, RL.THROTTLE over RESP
//! resp/protocol.rs                 RESP framing in and out
//! resp/server.rs                   one connection of --resp-listen
//! resp/command.rs                  the commands known (names, arities, flags)
//! resp/commands.rs                 their dispatch
//! resp/auth.rs                     HELLO and AUTH
//! resp/lockout.rs                  wrong AUTH tokens counted per address
//! resp/throttle.rs                 redis-cell's numbers
//! resp/gcra.rs                     Redis 8.8's GCRA command
//!
//! grpc/                            gRPC as served (beside service/)
//! grpc/mod.rs                      the route table: every RPC's path, label and kind, once;
//!                                  read by the RPC histogram, the in-flight bound and both stacks
//! grpc/unary.rs                    ShouldRateLimit and Check served by hand, or by tonic's
//!                                  unary code (--grpc-unary)
//!
//! store/                           where buckets live
//! store/mod.rs                     the Store trait, StoreError, StoreObserver
//! store/measured.rs                timing; the observer for Metrics
//! store/shared.rs                  ports for shared overrides, RLQS demand, settlements
//! store/settlements.rs             settlements kept in memory
//! store/table.rs                   the memory store's open-addressing TAT table
//! store/memory/mod.rs              sharded, all-or-nothing
//! store/memory/shares.rs           the buckets' bounds per name and the denial when full
//! store/memory/leases.rs           concurrency limits' leases
//! store/memory/lease_shares.rs     their bounds in all and per name
//! store/memory/snapshot.rs         the snapshot file
//! store/redis/mod.rs               the Redis store
//! store/redis/store.rs             its state and the batches of every operation
//! store/redis/settings.rs          how to reach Redis (compiled without the feature too)
//! store/redis/connection.rs        the connection and the one script call
//! store/redis/wire.rs              the vocabulary of a script call
//! store/redis/cluster.rs           hash slots and groups of keys
//! store/redis/sentinel.rs          failover followed
//! store/redis/tls.rs               TLS to a single Redis
//! store/redis/breaker.rs           circuit breakers per slot
//! store/redis/errors.rs            Redis errors classified
//! store/redis/failure.rs           the failure policy
//! store/redis/failure_log.rs       store failures in the log, once per kind
//! store/redis/coalesce.rs          batches coalesced per lane
//! store/redis/deny_cache.rs        the local deny cache
//! store/redis/leases.rs            leases as the script reads them
//! store/redis/lease_keys.rs        lease keys counted per name: this replica's share
//! store/redis/settlements.rs       settlements in Redis
//! store/redis/once.rs              a kept Check's spend under a token, resolved once
//! store/redis/overrides.rs         the overrides' shared table
//! store/redis/demand.rs            RLQS demand shared between replicas
//! store/memcache/mod.rs            envoyproxy/ratelimit's fixed windows in memcached
//! store/memcache/store.rs          the MemcacheStore
//! store/memcache/client.rs         its pool of connections
//! store/memcache/wire.rs           memcached's text protocol
//!
//! limits/                          pure configuration
//! limits/mod.rs                    names, ids, the validated configuration
//! limits/names.rs                  limit names and bucket keys
//! limits/ids.rs                    id formats and canonical ids
//! limits/descriptors.rs            Envoy descriptors -> names and ids
//! limits/duration.rs               durations as written (1s, 1h30m, 7d)
//! limits/hash.rs                   the maps' hasher
//! limits/config/mod.rs             YAML -> validated, immutable LimitTable
//! limits/config/build.rs           the table assembled
//! limits/config/files.rs           the directory read, bounded
//! limits/config/raw.rs             the files as written
//! limits/config/reservation.rs     a limit's reservation policy
//! limits/ratelimit_format/mod.rs   envoyproxy/ratelimit's file format
//! limits/ratelimit_format/read.rs  its YAML read
//! limits/ratelimit_format/xds.rs   its xDS resources
//! limits/ratelimit_format/wildcards.rs  its wildcard entries
//!
//! observe/                         leaves: what the process tells its operators
//! observe/mod.rs                   metrics, health, top
//! observe/health.rs                /healthz and /readyz state
//! observe/top.rs                   who is being limited
//! observe/metrics/mod.rs           every Prometheus series, and nothing else
//! observe/metrics/groups.rs        the series by what they watch
//! observe/metrics/counters.rs      decisions counted without a lookup
//! observe/metrics/extra_labels.rs  labels on every series (EXTRA_TAGS)
//! observe/metrics/ratelimit_keys.rs    envoyproxy/ratelimit's statistics keys
//! observe/metrics/statsd_mapping.rs    a statsd_exporter mapping file
//!
//! crates/core/                     gcra/, clock.rs, text.rs: the crate cellrate-core,
//!                                  re-exported here at the same paths
//!
//! fuzzing/mod.rs                   fuzz harnesses (feature `fuzzing`)
//! fuzzing/framing.rs               the gRPC framing compared, by hand and by tonic
//! fuzzing/seeds.rs                 their starting inputs, from the examples
//! lib.rs                           this map
//! ```
//!
//! A request flows: tower layers (RPC metrics, in-flight bound, [`server::shortcut`]) -> tonic
//! service -> [`service::native`] (or [`service::envoy`]) converts it to
//! [`service::ItemSpec`]s -> [`service::Decider`] resolves names and ids against the current
//! [`limits::config::LimitTable`] and makes one [`store::Store`] call -> the store runs
//! [`gcra`] atomically over the batch's TATs.

pub mod cli;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod grpc;
pub mod limits;
pub mod observe;
pub mod resp;
pub mod server;
pub mod service;
pub mod store;

/// The floor, from `cellrate-core` (crates/core), at the paths the code has always used.
pub use cellrate_core::{clock, gcra, text};

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
