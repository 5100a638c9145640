//! gRPC as cellrate serves it: every RPC, written once, and the unary calls served by hand.
//!
//! [`ROUTES`] names each RPC of both listeners: its path, the label the RPC histogram
//! counts it under, and how it is served ([`Kind`]). The RPC histogram
//! (`server/rpc_metrics.rs`), the in-flight bound's one-message check
//! (`server/in_flight.rs`) and the two gRPC stacks (`server/grpc.rs`, and the servers'
//! [`unary::Decision`] impls) read it; no path is written anywhere else.
//! A test below holds the table against the services' descriptors, so that a method cannot
//! be served without its row.
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

/// The bytes before each gRPC message: its compression flag, then its length.
pub const PREFIX: usize = 5;

/// The length a message's prefix declares (four bytes after the flag, big-endian): read
/// here for the hand-written unary path and the in-flight bound's one-message check alike.
#[inline]
pub fn declared_length(prefix: &[u8; PREFIX]) -> u32 {
    u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]])
}

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

    /// Every method of every service the listeners mount is a row, and every row such a
    /// method; a row streams exactly when its client streams.
    #[test]
    fn the_table_is_every_method_the_listeners_serve() {
        use prost::Message;
        let sets = [
            crate::proto::FILE_DESCRIPTOR_SET,
            crate::proto::ENVOY_RLS_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ];
        let services = [
            ENVOY_RLS,
            RATE_LIMITER,
            ENVOY_RLQS,
            ADMIN,
            HEALTH,
            REFLECTION_V1,
            REFLECTION_V1ALPHA,
        ];
        let mut described = Vec::new();
        for set in sets {
            let set = prost_types::FileDescriptorSet::decode(set).unwrap();
            for file in &set.file {
                for service in &file.service {
                    let name = format!("{}.{}", file.package(), service.name());
                    for method in (services.contains(&name.as_str()).then_some(&service.method))
                        .into_iter()
                        .flatten()
                    {
                        let streams = method.client_streaming();
                        described.push((name.clone(), method.name().to_string(), streams));
                    }
                }
            }
        }
        described.sort();
        described.dedup();
        let mut rows: Vec<(String, String, bool)> = (ROUTES.iter())
            .map(|r| (r.service.into(), r.method.into(), r.kind == Kind::Streaming))
            .collect();
        rows.sort();
        assert_eq!(rows, described);
    }

    #[test]
    fn the_generated_servers_are_named_as_the_table() {
        use crate::proto::v1::{admin_server, rate_limiter_server};
        use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server as rlqs;
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server as rls;
        use tonic::server::NamedService;
        assert_eq!(
            <rate_limiter_server::RateLimiterServer<crate::service::native::RateLimiterService> as NamedService>::NAME,
            RATE_LIMITER
        );
        assert_eq!(
            <admin_server::AdminServer<crate::service::native::AdminService> as NamedService>::NAME,
            ADMIN
        );
        assert_eq!(rls::SERVICE_NAME, ENVOY_RLS);
        assert_eq!(rlqs::SERVICE_NAME, ENVOY_RLQS);
        assert_eq!(
            <tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService> as NamedService>::NAME,
            HEALTH
        );
    }
}
