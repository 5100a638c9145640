//! Prometheus metrics: every series cellrate exports, and nothing else (the routes that
//! serve them are in [`crate::observe::health`], the store's timing decorator in
//! [`crate::store::measured`], the classification of a decision in [`crate::service`]).
//!
//! No label ever carries an id, a bucket key or a descriptor value (unbounded cardinality):
//! labels are API names, RPC names, limit names from the configuration, results and store
//! operations, all bounded by the code or the config.

use std::sync::Arc;

use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::clock::Nanos;

/// Latency buckets for RPCs and store calls: 10µs to 1s.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The RPCs that are timed.
const RPCS: [&str; 5] = ["Check", "Refund", "Reset", "Inspect", "ShouldRateLimit"];

/// The store operations that are timed.
const STORE_OPS: [&str; 3] = ["spend", "refund", "reset"];

/// Every metric cellrate exports.
pub struct Metrics {
    registry: Registry,
    /// Who is being denied (admin `Top`); set once the server has its clock.
    denials: std::sync::OnceLock<Arc<crate::observe::top::DenialTracker>>,
    decisions: IntCounterVec,
    rpc_duration: HistogramVec,
    rpc_codes: IntCounterVec,
    /// [`RPCS`]' OK counters, resolved once (the common case).
    rpc_ok: Vec<IntCounter>,
    /// [`RPCS`]' series, resolved once: a label lookup costs a hash and a lock per call.
    rpc_series: Vec<prometheus::Histogram>,
    store_duration: HistogramVec,
    /// [`STORE_OPS`]' series, resolved once.
    store_series: Vec<prometheus::Histogram>,
    store_errors: IntCounterVec,
    pub live_buckets: IntGauge,
    /// The memory store's bound on live buckets (`--max-buckets`); 0 with Redis.
    pub max_buckets: IntGauge,
    pub swept_buckets: IntCounter,
    reloads: IntCounterVec,
    runtime_overrides: IntCounterVec,
    /// RLQS streams open, and buckets tracked over them.
    pub rlqs_streams: IntGauge,
    pub rlqs_buckets: IntGauge,
    rlqs_actions: IntCounterVec,
    rlqs_refusals: IntCounterVec,
    rlqs_requests: IntCounterVec,
    /// Copies of the temporary overrides shared through Redis that failed.
    pub override_sync_failures: IntCounter,
    /// Connections open on the Redis-protocol listener.
    pub resp_connections: IntGauge,
    resp_commands: IntCounterVec,
    /// `CL.THROTTLE` decisions allowed and limited, resolved once (the hot path).
    resp_throttled: [IntCounter; 2],
    /// `cellrate_resp_commands_total{command="cl.throttle",result="ok"}`, resolved once.
    resp_throttle_ok: IntCounter,
    resp_closed: IntCounterVec,
    store_fallbacks: IntCounterVec,
    store_compensations: IntCounter,
    store_breaker_rejections: IntCounter,
    /// Redis circuit breakers open now (one per slot, one in all for a standalone Redis).
    store_breakers_open: IntGauge,
    /// Requests' batches per spend call Redis answered (coalescing).
    redis_batches_per_call: prometheus::Histogram,
    /// Items waiting for a coalesced Redis call.
    redis_queued_items: IntGauge,
    deny_cache_hits: IntCounter,
    config_info: IntGaugeVec,
    config_loaded: Gauge,
    /// 1 unless the last reload attempt was rejected.
    config_last_reload_ok: IntGauge,
}

fn registered<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    // Names are constants of this file; registering them twice is a bug caught by tests.
    registry
        .register(Box::new(c.clone()))
        .expect("metric names are unique");
    c
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Arc<Metrics> {
        let registry = Registry::new();
        let r = &registry;
        let histogram = |name: &str, help: &str, label: &str| {
            registered(
                r,
                HistogramVec::new(
                    HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
                    &[label],
                )
                .expect("valid histogram"),
            )
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            registered(
                r,
                IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter"),
            )
        };
        let rpc_duration = histogram(
            "cellrate_rpc_duration_seconds",
            "Time to answer an RPC, by RPC.",
            "rpc",
        );
        let rpc_codes = counter_vec(
            "cellrate_rpc_requests_total",
            "Answered RPCs, by RPC and gRPC status code.",
            &["rpc", "code"],
        );
        let store_duration = histogram(
            "cellrate_store_operation_duration_seconds",
            "Time of a store operation (one per request), by operation.",
            "operation",
        );
        let resp_commands = counter_vec(
            "cellrate_resp_commands_total",
            "Commands answered on the Redis-protocol listener, by command (lower case; `other` \
             for unknown ones) and result (ok, error).",
            &["command", "result"],
        );
        let metrics = Arc::new(Metrics {
            rpc_series: RPCS
                .iter()
                .map(|rpc| rpc_duration.with_label_values(&[rpc]))
                .collect(),
            store_series: STORE_OPS
                .iter()
                .map(|op| store_duration.with_label_values(&[op]))
                .collect(),
            rpc_ok: RPCS
                .iter()
                .map(|rpc| rpc_codes.with_label_values(&[rpc, "OK"]))
                .collect(),
            rpc_codes,
            rpc_duration,
            store_duration,
            decisions: counter_vec(
                "cellrate_decisions_total",
                "Decisions per limit: api (native, envoy), limit name, result (allowed, denied, \
                 shadow_denied, unlimited, not_configured, invalid, unmatched).",
                &["api", "limit", "result"],
            ),
            store_errors: counter_vec(
                "cellrate_store_errors_total",
                "Store operations that failed, by operation.",
                &["operation"],
            ),
            live_buckets: registered(
                r,
                IntGauge::new(
                    "cellrate_live_buckets",
                    "Buckets held by the memory store (including expired ones not yet swept).",
                )
                .expect("valid gauge"),
            ),
            max_buckets: registered(
                r,
                IntGauge::new(
                    "cellrate_max_buckets",
                    "The memory store's bound on live buckets (--max-buckets); 0 with the Redis \
                     store.",
                )
                .expect("valid gauge"),
            ),
            swept_buckets: registered(
                r,
                IntCounter::new(
                    "cellrate_swept_buckets_total",
                    "Expired buckets dropped by the memory store's sweeper.",
                )
                .expect("valid counter"),
            ),
            store_fallbacks: counter_vec(
                "cellrate_store_fallbacks_total",
                "Requests answered by the failure policy while the store failed, by policy.",
                &["policy"],
            ),
            store_compensations: registered(
                r,
                IntCounter::new(
                    "cellrate_store_compensations_total",
                    "Cross-slot batches whose spent slot groups were refunded because another \
                     group denied.",
                )
                .expect("valid counter"),
            ),
            store_breaker_rejections: registered(
                r,
                IntCounter::new(
                    "cellrate_store_breaker_rejections_total",
                    "Store calls failed fast by an open circuit breaker.",
                )
                .expect("valid counter"),
            ),
            store_breakers_open: registered(
                r,
                IntGauge::new(
                    "cellrate_store_breakers_open",
                    "Redis circuit breakers open now, failing calls fast (one breaker per \
                     cluster slot, one for a standalone Redis; 0 with the memory store).",
                )
                .expect("valid gauge"),
            ),
            redis_batches_per_call: registered(
                r,
                prometheus::Histogram::with_opts(
                    HistogramOpts::new(
                        "cellrate_redis_batches_per_call",
                        "Requests' batches per spend call Redis answered: 1 when a request \
                         found its lane free, more when batches waited and were coalesced \
                         (bounded by the call's items and bytes).",
                    )
                    .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
                )
                .expect("valid histogram"),
            ),
            redis_queued_items: registered(
                r,
                IntGauge::new(
                    "cellrate_redis_queued_items",
                    "Items waiting for a coalesced Redis spend call, over every lane (beyond \
                     the queue's bound a request fails at once and the failure policy \
                     answers it).",
                )
                .expect("valid gauge"),
            ),
            deny_cache_hits: registered(
                r,
                IntCounter::new(
                    "cellrate_store_deny_cache_hits_total",
                    "Requests denied by the Redis store's local deny cache without a round trip.",
                )
                .expect("valid counter"),
            ),
            reloads: counter_vec(
                "cellrate_config_reloads_total",
                "Limits reloads, by result (success, failure, unchanged).",
                &["result"],
            ),
            runtime_overrides: counter_vec(
                "cellrate_runtime_override_changes_total",
                "Temporary overrides set and cleared through the admin API, by action.",
                &["action"],
            ),
            rlqs_streams: registered(
                r,
                IntGauge::new("cellrate_rlqs_streams", "Envoy RLQS streams open.")
                    .expect("valid gauge"),
            ),
            rlqs_buckets: registered(
                r,
                IntGauge::new(
                    "cellrate_rlqs_buckets",
                    "Envoy RLQS buckets tracked, over every stream.",
                )
                .expect("valid gauge"),
            ),
            rlqs_actions: counter_vec(
                "cellrate_rlqs_actions_total",
                "RLQS actions sent to Envoy, by action (token_bucket, allow_all, deny_all, abandon, pushed).",
                &["action"],
            ),
            rlqs_refusals: counter_vec(
                "cellrate_rlqs_refusals_total",
                "RLQS streams and buckets refused, by reason (too_many_streams, too_many_buckets, invalid, slow_reader), and failed exchanges of demand with other replicas (sync_failure).",
                &["reason"],
            ),
            rlqs_requests: counter_vec(
                "cellrate_rlqs_reported_requests_total",
                "Requests Envoys reported over RLQS, by limit name and result (allowed, denied).",
                &["limit", "result"],
            ),
            override_sync_failures: registered(
                r,
                IntCounter::new(
                    "cellrate_runtime_override_sync_failures_total",
                    "Failed copies of the temporary overrides shared through Redis (the last copy stays in force).",
                )
                .expect("valid counter"),
            ),
            resp_connections: registered(
                r,
                IntGauge::new(
                    "cellrate_resp_connections",
                    "Connections open on the Redis-protocol listener.",
                )
                .expect("valid gauge"),
            ),
            resp_throttle_ok: resp_commands.with_label_values(&["cl.throttle", "ok"]),
            resp_commands,
            resp_closed: counter_vec(
                "cellrate_resp_closed_total",
                "Redis-protocol connections closed by cellrate, by reason (protocol_error, \
                 timeout, auth_failures, auth_locked, shutdown).",
                &["reason"],
            ),
            resp_throttled: [
                registered(
                    r,
                    IntCounter::new(
                        "cellrate_resp_throttle_allowed_total",
                        "CL.THROTTLE calls allowed.",
                    )
                    .expect("valid counter"),
                ),
                registered(
                    r,
                    IntCounter::new(
                        "cellrate_resp_throttle_limited_total",
                        "CL.THROTTLE calls limited.",
                    )
                    .expect("valid counter"),
                ),
            ],
            config_info: registered(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "cellrate_config_info",
                        "1 for the version (content hash) of the limits in force.",
                    ),
                    &["version"],
                )
                .expect("valid gauge"),
            ),
            config_loaded: registered(
                r,
                Gauge::new(
                    "cellrate_config_loaded_timestamp_seconds",
                    "Unix time at which the limits in force were loaded.",
                )
                .expect("valid gauge"),
            ),
            config_last_reload_ok: registered(
                r,
                IntGauge::new(
                    "cellrate_config_last_reload_successful",
                    "0 when the last attempt to reload the limits was rejected (the previous \
                     limits stay in force), else 1.",
                )
                .expect("valid gauge"),
            ),
            registry,
            denials: std::sync::OnceLock::new(),
        });
        metrics.config_last_reload_ok.set(1);
        // Every series of a known label set exists from the start, at zero: dashboards and
        // alerts (`increase(...) > 0`, absent-series checks) need them before the first event.
        for op in STORE_OPS {
            metrics.store_errors.with_label_values(&[op]);
        }
        for policy in ["allow", "deny", "local"] {
            metrics.store_fallbacks.with_label_values(&[policy]);
        }
        for result in ["success", "failure", "unchanged"] {
            metrics.reloads.with_label_values(&[result]);
        }
        for action in ["set", "clear"] {
            metrics.runtime_overrides.with_label_values(&[action]);
        }
        for reason in [
            "protocol_error",
            "timeout",
            "auth_failures",
            "auth_locked",
            "shutdown",
        ] {
            metrics.resp_closed.with_label_values(&[reason]);
        }
        for action in ["token_bucket", "allow_all", "deny_all", "abandon", "pushed"] {
            metrics.rlqs_actions.with_label_values(&[action]);
        }
        for reason in [
            "too_many_streams",
            "too_many_buckets",
            "invalid",
            "slow_reader",
        ] {
            metrics.rlqs_refusals.with_label_values(&[reason]);
        }
        metrics
    }

    /// Counts one Redis-protocol command (`command`: a known name in lower case, or `other`).
    pub fn resp_command(&self, command: &str, ok: bool) {
        self.resp_commands
            .with_label_values(&[command, if ok { "ok" } else { "error" }])
            .inc();
    }

    /// Counts one `CL.THROTTLE` decision.
    pub fn resp_throttled(&self, allowed: bool) {
        self.resp_throttle_ok.inc();
        self.resp_throttled[usize::from(!allowed)].inc();
    }

    /// Counts one Redis-protocol connection closed by cellrate.
    pub fn resp_closed(&self, reason: &str) {
        self.resp_closed.with_label_values(&[reason]).inc();
    }

    /// Counts one RLQS action sent.
    pub fn rlqs_action(&self, action: &str) {
        self.rlqs_actions.with_label_values(&[action]).inc();
    }

    /// Counts one RLQS stream or bucket refused.
    pub fn rlqs_refused(&self, reason: &str) {
        self.rlqs_refusals.with_label_values(&[reason]).inc();
    }

    /// Counts requests an Envoy reported for `limit`.
    pub fn rlqs_reported(&self, limit: &str, allowed: u64, denied: u64) {
        if allowed > 0 {
            self.rlqs_requests
                .with_label_values(&[limit, "allowed"])
                .inc_by(allowed);
        }
        if denied > 0 {
            self.rlqs_requests
                .with_label_values(&[limit, "denied"])
                .inc_by(denied);
        }
    }

    /// Counts one decided item: `result` is a label of [`crate::service::outcome`].
    /// Creates the `allowed` and `denied` series of `limits`, at zero, for both APIs and RLQS (the
    /// names configured at start; names added later appear with their first decision).
    pub fn known_limits<'a>(&self, limits: impl IntoIterator<Item = &'a str>) {
        for limit in limits {
            for api in ["native", "envoy"] {
                for result in ["allowed", "denied"] {
                    self.decisions.with_label_values(&[api, limit, result]);
                }
            }
            for result in ["allowed", "denied"] {
                self.rlqs_requests.with_label_values(&[limit, result]);
            }
        }
    }

    /// Tracks denied ids in `tracker` from now on (once; later calls are ignored).
    pub fn track_denials(&self, tracker: Arc<crate::observe::top::DenialTracker>) {
        let _ = self.denials.set(tracker);
    }

    /// The denial tracker, if one is set.
    pub fn denials(&self) -> Option<&Arc<crate::observe::top::DenialTracker>> {
        self.denials.get()
    }

    /// Counts a denial of `id` under `limit` for admin `Top` (never a metric label).
    pub fn denied_id(&self, limit: &Arc<str>, id: &str) {
        if let Some(tracker) = self.denials.get() {
            tracker.denied(limit, id);
        }
    }

    pub fn decision(&self, api: &str, limit: &str, result: &str) {
        self.decisions
            .with_label_values(&[api, limit, result])
            .inc();
    }

    /// Records an answered RPC: its duration, and its gRPC status code.
    pub fn rpc(&self, rpc: &str, code: tonic::Code, seconds: f64) {
        match RPCS.iter().position(|r| *r == rpc) {
            Some(i) => self.rpc_series[i].observe(seconds),
            None => self.rpc_duration.with_label_values(&[rpc]).observe(seconds),
        }
        match RPCS.iter().position(|r| *r == rpc) {
            Some(i) if code == tonic::Code::Ok => self.rpc_ok[i].inc(),
            _ => self
                .rpc_codes
                .with_label_values(&[rpc, code_label(code)])
                .inc(),
        }
    }

    /// Records a loaded configuration (at startup or by reload).
    pub fn config_loaded(&self, version: &str, at: Nanos) {
        self.config_info.reset();
        self.config_info.with_label_values(&[version]).set(1);
        self.config_loaded.set(at as f64 / 1e9);
    }

    /// Counts a reload attempt: `success` (new limits), `unchanged` or `failure`.
    pub fn reload(&self, result: &str) {
        self.reloads.with_label_values(&[result]).inc();
        self.config_last_reload_ok
            .set(i64::from(result != "failure"));
    }

    /// Counts a temporary override set or cleared (`action`: `set`, `clear`).
    pub fn runtime_override(&self, action: &str) {
        self.runtime_overrides.with_label_values(&[action]).inc();
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// What the store reports (through `crate::store::StoreObserver`, which
/// `crate::store::measured` implements for [`Metrics`] with these).
impl Metrics {
    /// One store operation: its time and whether it succeeded.
    pub fn store_operation(&self, op: &'static str, seconds: f64, ok: bool) {
        match STORE_OPS.iter().position(|o| *o == op) {
            Some(i) => self.store_series[i].observe(seconds),
            None => self
                .store_duration
                .with_label_values(&[op])
                .observe(seconds),
        }
        if !ok {
            self.store_errors.with_label_values(&[op]).inc();
        }
    }

    /// A request answered by the failure policy `policy` while the store failed.
    pub fn store_fallback(&self, policy: &str) {
        self.store_fallbacks.with_label_values(&[policy]).inc();
    }

    pub fn store_compensation(&self) {
        self.store_compensations.inc();
    }

    pub fn deny_cache_hit(&self) {
        self.deny_cache_hits.inc();
    }

    pub fn breaker_rejection(&self) {
        self.store_breaker_rejections.inc();
    }

    /// A breaker opened (`true`) or closed (`false`).
    pub fn breaker_turned(&self, open: bool) {
        if open {
            self.store_breakers_open.inc();
        } else {
            self.store_breakers_open.dec();
        }
    }

    /// A Redis spend call that answered `batches` requests' batches.
    pub fn redis_spend_call(&self, batches: usize) {
        self.redis_batches_per_call.observe(batches as f64);
    }

    /// Items that began (positive) or stopped (negative) waiting for a Redis call.
    pub fn redis_queued(&self, items: i64) {
        self.redis_queued_items.add(items);
    }
}

/// The `code` label of a gRPC status: its name, as grpc-go and Envoy spell it.
fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_has_the_main_series() {
        let m = Metrics::new();
        m.decision("native", "NewOrdersPerAccount", "denied");
        m.config_loaded("abc", 1_700_000_000_000_000_000);
        m.reload("failure");
        m.rpc("Check", tonic::Code::InvalidArgument, 0.001);
        m.store_operation("spend", 0.001, false);
        m.breaker_rejection();
        m.breaker_turned(true);
        m.breaker_turned(true);
        m.breaker_turned(false);
        let text = m.render();
        assert!(text.contains("cellrate_store_breakers_open 1\n"));
        assert!(text.contains("cellrate_config_last_reload_successful 0\n"));
        m.reload("unchanged");
        assert!(m
            .render()
            .contains("cellrate_config_last_reload_successful 1\n"));
        assert!(text.contains(
            "cellrate_decisions_total{api=\"native\",limit=\"NewOrdersPerAccount\",result=\"denied\"} 1"
        ));
        assert!(text.contains("cellrate_config_info{version=\"abc\"} 1"));
        assert!(text.contains("cellrate_config_reloads_total{result=\"failure\"} 1"));
        assert!(text.contains("cellrate_config_loaded_timestamp_seconds 1700000000"));
        assert!(
            text.contains("cellrate_rpc_requests_total{code=\"INVALID_ARGUMENT\",rpc=\"Check\"} 1")
        );
        assert!(text.contains("cellrate_store_errors_total{operation=\"spend\"} 1"));
        assert!(text.contains("cellrate_store_breaker_rejections_total 1"));
        m.config_loaded("def", 0);
        assert!(!m.render().contains("version=\"abc\""));
    }
}
