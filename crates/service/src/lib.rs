//! cellrate-service: the APIs over one Decider, and gRPC as they are served.
//!
//! Requests come in through a front end (Envoy's RLS, [`service::envoy`]; the native API,
//! [`service::native`]; Envoy's RLQS, [`service::rlqs`]; redis-cell's commands over RESP,
//! [`resp`]), become items in domain terms ([`service::ItemSpec`]), and are decided by one
//! [`service::Decider`] in one call to a store (`cellrate-store`). Settlements (holds,
//! kept Checks, the ledger) are a domain room below the front ends ([`service::settle`]).
//! [`grpc`] is the one route table of every RPC; [`proto`] the generated messages of
//! `proto/` (at the repository's root, where `grpcurl` reads it too). Listeners, flags
//! and the process are the binary's (`cellrate`), above this crate.
//!
//! # Layout
//!
//! Every file, by room (a test keeps this map equal to the files):
//!
//! ```text
//! lib.rs                           the rooms, the generated protobuf types; this map
//!
//! service/                         the APIs over one Decider
//! service/mod.rs                   requests in domain terms -> one store batch -> decisions
//! service/request.rs               items, options, answers, whichever API they came through
//! service/decider.rs               the Decider: one store call per batch
//! service/resolve.rs               names, ids, caller limits, rules, costs -> buckets
//! service/caller_limits.rs         bounds on caller-given limits
//! service/retry_hint.rs            how soon leases and holds give capacity back, learned
//!                                  per limit: a denial's Retry-After
//! service/errors.rs                why a request was not decided, mapped to gRPC statuses
//! service/overrides/mod.rs         temporary overrides: set, looked up, synced, expired
//! service/overrides/entries.rs     where an override applies: a name's id, a ratelimit-format bucket
//! service/overrides/ratelimit.rs   a ratelimit-format bucket overridden: named, its limit checked
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
//! service/envoy/held.rs            the check-0, charge-later pattern held (--zero-check-holds)
//! service/envoy/respond.rs         the answer: overall code, statuses, headers
//! service/envoy/ratelimit.rs       domains in envoyproxy/ratelimit's file format
//! service/envoy/upstream.rs        envoyproxy/ratelimit's shape of an answer
//! service/settle/mod.rs            settlements, below the front ends: Checks kept, decided
//! service/settle/adjust.rs         a settle: the record claimed once, charged or refunded
//! service/settle/record/mod.rs     a kept Check's versioned format (3ebe882's read too)
//! service/settle/record/ratelimit.rs  its items of envoyproxy/ratelimit-format buckets
//! service/settle/facts.rs          what a kept Check spent, per item
//! service/settle/holds.rs          reservation policies at Check
//! service/settle/anonymous.rs      holds without a request id, settled oldest first
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
//! service/ratelimit_bucket.rs      an envoyproxy/ratelimit-format descriptor's bucket, and its readable name
//!
//! resp/                            the Redis protocol (beside service/)
//! resp/mod.rs                      CL.THROTTLE, GCRA, RL.THROTTLE over RESP
//! resp/protocol.rs                 RESP framing in
//! resp/replies.rs                  RESP replies out (RESP2, RESP3)
//! resp/frame.rs                    where a read command's arguments lie (in place)
//! resp/server.rs                   one connection of --resp-listen
//! resp/command.rs                  the commands known (names, arities, flags)
//! resp/commands.rs                 their dispatch
//! resp/auth.rs                     HELLO and AUTH
//! resp/lockout.rs                  wrong AUTH tokens counted per address
//!
//! grpc/                            gRPC as served (beside service/)
//! grpc/mod.rs                      the route table: every RPC's path, label and kind, once;
//!                                  read by the RPC histogram, the in-flight bound and both stacks
//! grpc/unary.rs                    ShouldRateLimit and Check served by hand, or by tonic's
//!                                  unary code (--grpc-unary)
//! ```

pub mod grpc;
pub mod resp;
pub mod service;

/// Generated protobuf types and tonic stubs.
pub mod proto {
    /// `cellrate.v1`: the native and admin APIs.
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("cellrate.v1");

        /// A mode on the wire as the core's.
        impl From<Mode> for cellrate_core::gcra::Mode {
            fn from(mode: Mode) -> cellrate_core::gcra::Mode {
                use cellrate_core::gcra::Mode as Core;
                match mode {
                    Mode::CheckAndSpend => Core::CheckAndSpend,
                    Mode::CheckOnly => Core::CheckOnly,
                    Mode::SpendOnly => Core::SpendOnly,
                    Mode::Charge => Core::Charge,
                    Mode::Acquire => Core::Acquire,
                    Mode::Release => Core::Release,
                }
            }
        }
    }

    /// The encoded descriptor set of the repository's `proto/`, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/cellrate_descriptor.bin"));

    /// The encoded descriptors of Envoy's `envoy/service/ratelimit/v3/rls.proto` and
    /// `envoy/service/rate_limit_quota/v3/rlqs.proto` and every file they import, as
    /// `envoy-types` ships them (`proto/README.md`), for server reflection.
    pub const ENVOY_RLS_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../proto/envoy_rate_limit_services.binpb"
    ));
}
