//! gRPC as cellrate serves it: every RPC, written once, and the unary calls served by hand.
//!
//! [`ROUTES`] names each RPC of both listeners: its path, the label the RPC histogram
//! counts it under, and how it is served ([`Kind`]). The RPC histogram
//! (`server/rpc_metrics.rs`), the in-flight bound's one-message check
//! (`server/in_flight.rs`) and the two gRPC stacks (`server/grpc.rs`, and the servers'
//! [`unary::Decision`] impls) read it; no path is written anywhere else.
//! `tests/it/grpc_routes.rs` checks the table against the services' descriptors, so a new
//! method cannot be served without a label.
//!
//! [`unary`] serves the decision RPCs (ShouldRateLimit, the native Check) by hand, or
//! through tonic's own unary handling with `--grpc-unary tonic` ([`Unary`]);
//! `tests/it/grpc_parity.rs` sends both the same bodies and requires the same answers.

pub mod unary;

/// How a request reaches its service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One request message (health's Watch too, whose answers stream), served by tonic's
    /// generated server; the in-flight layer refuses a second and times the body.
    Unary,
    /// The client streams messages (reflection, RLQS): neither checked nor timed.
    Streaming,
    /// A decision RPC: one message each way, served as [`Unary`] says (by [`unary`] or by
    /// tonic).
    Decision,
}

/// How the decision RPCs' unary calls are served (`--grpc-unary`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Unary {
    /// By hand ([`unary::serve`]): one small future, the message read from its prefix
    /// (BENCHMARKS.md, #59: the faster).
    #[default]
    Direct,
    /// By tonic's unary handling (`tonic::server::Grpc::unary`, what its generated servers
    /// call), with the service's own decoding and encoding.
    Tonic,
}

/// One RPC of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rpc {
    /// The gRPC service's full name, and the method's.
    pub service: &'static str,
    pub method: &'static str,
    /// `/<service>/<method>`.
    pub path: &'static str,
    /// Its `rpc` label on the RPC histogram and counter.
    pub label: &'static str,
    pub kind: Kind,
}

/// The label of a path that names no RPC: a caller's text never becomes a label.
pub const UNKNOWN: &str = "unknown";

/// Declares a service's name and its RPCs, each path built from the two names once.
macro_rules! rpcs {
    ($(service $service:ident = $name:literal {
        $($rpc:ident: $method:literal, $label:literal, $kind:ident;)*
    })*) => {
        $(
            #[doc = concat!("`", $name, "`.")]
            pub const $service: &str = $name;
            $(
                #[doc = concat!("`/", $name, "/", $method, "`.")]
                pub const $rpc: Rpc = Rpc {
                    service: $name,
                    method: $method,
                    path: concat!("/", $name, "/", $method),
                    label: $label,
                    kind: Kind::$kind,
                };
            )*
        )*
    };
}

rpcs! {
    service ENVOY_RLS = "envoy.service.ratelimit.v3.RateLimitService" {
        SHOULD_RATE_LIMIT: "ShouldRateLimit", "ShouldRateLimit", Decision;
    }
    service RATE_LIMITER = "cellrate.v1.RateLimiter" {
        CHECK: "Check", "Check", Decision;
        REFUND: "Refund", "Refund", Unary;
        SETTLE: "Settle", "Settle", Unary;
    }
    service ENVOY_RLQS = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService" {
        STREAM_RATE_LIMIT_QUOTAS: "StreamRateLimitQuotas", "StreamRateLimitQuotas", Streaming;
    }
    service ADMIN = "cellrate.v1.Admin" {
        RESET: "Reset", "Reset", Unary;
        INSPECT: "Inspect", "Inspect", Unary;
        TOP: "Top", "Top", Unary;
        SET_OVERRIDE: "SetOverride", "SetOverride", Unary;
        CLEAR_OVERRIDE: "ClearOverride", "ClearOverride", Unary;
        LIST_OVERRIDES: "ListOverrides", "ListOverrides", Unary;
    }
    service HEALTH = "grpc.health.v1.Health" {
        HEALTH_CHECK: "Check", "Health", Unary;
        HEALTH_WATCH: "Watch", "HealthWatch", Unary;
    }
    service REFLECTION_V1 = "grpc.reflection.v1.ServerReflection" {
        REFLECTION_INFO_V1: "ServerReflectionInfo", "ServerReflectionInfo", Streaming;
    }
    service REFLECTION_V1ALPHA = "grpc.reflection.v1alpha.ServerReflection" {
        REFLECTION_INFO_V1ALPHA: "ServerReflectionInfo", "ServerReflectionInfoV1alpha", Streaming;
    }
}

/// Every RPC of both listeners, the decisions first (looked up first).
pub const ROUTES: [Rpc; 15] = [
    SHOULD_RATE_LIMIT,
    CHECK,
    REFUND,
    SETTLE,
    STREAM_RATE_LIMIT_QUOTAS,
    RESET,
    INSPECT,
    TOP,
    SET_OVERRIDE,
    CLEAR_OVERRIDE,
    LIST_OVERRIDES,
    HEALTH_CHECK,
    HEALTH_WATCH,
    REFLECTION_INFO_V1,
    REFLECTION_INFO_V1ALPHA,
];

/// The RPC `path` names, if any.
#[inline]
pub fn route(path: &str) -> Option<&'static Rpc> {
    ROUTES.iter().find(|rpc| rpc.path == path)
}

/// The `rpc` label of `path`: its RPC's, or [`UNKNOWN`].
pub fn label(path: &str) -> &'static str {
    route(path).map_or(UNKNOWN, |rpc| rpc.label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_built_from_the_names_and_labels_are_distinct() {
        assert_eq!(
            SHOULD_RATE_LIMIT.path,
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        );
        assert_eq!(CHECK.path, "/cellrate.v1.RateLimiter/Check");
        let mut labels: Vec<&str> = ROUTES.iter().map(|r| r.label).collect();
        labels.push(UNKNOWN);
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), ROUTES.len() + 1, "one label per RPC");
    }

    #[test]
    fn only_the_tables_paths_become_labels() {
        assert_eq!(label("/cellrate.v1.RateLimiter/Check"), "Check");
        assert_eq!(label("/grpc.health.v1.Health/Check"), "Health");
        assert_eq!(label("/cellrate.v1.Admin/Top"), "Top");
        assert_eq!(label("/cellrate.v1.Admin/Check"), UNKNOWN);
        assert_eq!(label("/attacker/chosen-text"), UNKNOWN);
        assert_eq!(label(""), UNKNOWN);
    }
}
