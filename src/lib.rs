//! cellrate: an exact GCRA rate-limit decision service over gRPC.
//!
//! Callers ask "may this happen now?" and get an exact answer. Envoy and Istio ask through
//! Envoy's Rate Limit Service protocol; services use the native API (`Check`, `Refund`);
//! operators use the admin API (`Reset`, `Inspect`, `Top`, temporary overrides), `grpcurl`
//! and the CLI.
//!
//! # Layout
//!
//! This map and those of the floor crates (`crates/*/src/lib.rs`, named at its end) are the
//! one description of the code's shape (README and `docs/architecture.md` link here): every
//! file, by room, the rooms from the top floor down. Imports point down the floors, never
//! up; `tests/it/structure.rs` checks it, that each map names every file of its crate and no
//! other (and that no file is over 600 lines counting its tests, no function over 100):
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
//! crates/alloc/                    the crate cellrate-alloc: the global allocator (mimalloc,
//!                                  its plain entry points where they are aligned enough)
//! crates/core/                     gcra/, clock.rs, text.rs, cell.rs, redis_gcra.rs: the
//!                                  crate cellrate-core, re-exported here at the same paths
//! crates/limits/                   the crate cellrate-limits, re-exported as limits/:
//!                                  pure configuration
//! crates/observe/                  the crate cellrate-observe, re-exported as observe/:
//!                                  leaves, what the process tells its operators
//! crates/store/                    the crate cellrate-store, re-exported as store/: where
//!                                  buckets live
//! crates/service/                  the crate cellrate-service, re-exported as service/,
//!                                  resp/, grpc/ and proto: the APIs over one Decider
//! crates/module/                   the crate cellrate-redis-module: CL.THROTTLE and
//!                                  RL.THROTTLE inside Redis and Valkey, from the core
//!                                  (not a default member: its build needs libclang)
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
pub mod server;

/// The floor, from `cellrate-core` (crates/core), at the paths the code has always used.
pub use cellrate_core::{cell, clock, gcra, redis_gcra, text};
pub use cellrate_limits as limits;
pub use cellrate_observe as observe;
pub use cellrate_service::{grpc, proto, resp, service};
pub use cellrate_store as store;
