//! Prometheus metrics: every series cellrate exports, and nothing else (the route that
//! serves them is `cellrate::server::http`'s, the store's timing decorator in
//! `cellrate::store::measured`, the classification of a decision in `cellrate::service`).
//!
//! No label ever carries an id, a bucket key or a descriptor value unbounded: labels are
//! API names, RPC names, limit names from the configuration, results and store
//! operations, all bounded by the code or the config; the one exception,
//! envoyproxy/ratelimit's statistics keys (which `detailed_metric` fills from requests,
//! in `cellrate_ratelimit_hits_total` and the series a statsd mapping names), is bounded
//! by `ratelimit_keys`' key space. The operator's `--metrics-labels` go on every series.

use std::sync::Arc;

use prometheus::{Encoder, IntCounterVec, Registry, TextEncoder};

use cellrate_core::clock::Nanos;
pub use extra_labels::ExtraLabels;
pub use groups::{
    ConfigMetrics, RespMetrics, RlqsMetrics, SnapshotMetrics, StoreMetrics,
    SNAPSHOT_IGNORED_REASONS,
};
use groups::{Reg, RpcMetrics};
pub use statsd_mapping::StatsdMapping;

mod counters;
mod extra_labels;
mod groups;
mod ratelimit_keys;
mod ratelimit_stats;
pub mod statsd_mapping;
mod statsd_mapping_file;

/// Latency buckets for RPCs and store calls: 10µs to 1s.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The RPCs that are timed.
const RPCS: [&str; 5] = ["Check", "Refund", "Reset", "Inspect", "ShouldRateLimit"];

/// The store operations that are timed.
const STORE_OPS: [&str; 3] = ["spend", "refund", "reset"];

pub use ratelimit_keys::{MAX_KEYS as MAX_RATELIMIT_KEYS, MAX_KEYS_BYTES, MAX_KEY_BYTES};
use ratelimit_stats::RatelimitStats;
pub use ratelimit_stats::{RatelimitKey, RATELIMIT_STATS};

/// Every metric cellrate exports, in groups by what they watch.
pub struct Metrics {
    registry: Registry,
    /// Added to every series when rendered (`EXTRA_TAGS`).
    extra: ExtraLabels,
    /// Who is being denied (admin `Top`); set once the server has its clock.
    denials: std::sync::OnceLock<Arc<crate::top::DenialTracker>>,
    decisions: counters::DecisionCounters,
    /// `cellrate_settlements_total{result}`: settled, retried, pending, unknown, conflict,
    /// expired, pushed_out, full, crowded.
    pub settlements: IntCounterVec,
    /// `cellrate_holds_total{event}`: reservations settled, released, kept.
    pub holds: IntCounterVec,
    pub anonymous_holds: IntCounterVec,
    /// envoyproxy/ratelimit's per-descriptor statistics, by key and stat.
    ratelimit: RatelimitStats,
    rpc: RpcMetrics,
    pub store: StoreMetrics,
    pub rlqs: RlqsMetrics,
    pub resp: RespMetrics,
    pub config: ConfigMetrics,
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Arc<Metrics> {
        Metrics::configured(None, ExtraLabels::default(), true)
    }

    /// A fresh registry with every metric at zero, envoyproxy/ratelimit's statistics also
    /// counted under the names and labels `mapping` gives them, and `extra` labels on
    /// every series; without `ratelimit_stats` (DISABLE_STATS), envoyproxy/ratelimit's
    /// statistics are not kept at all.
    pub fn configured(
        mapping: Option<Arc<StatsdMapping>>,
        extra: ExtraLabels,
        ratelimit_stats: bool,
    ) -> Arc<Metrics> {
        let registry = Registry::new();
        // The process's own series (CPU seconds, resident and virtual memory, open and
        // most descriptors, threads, start time), as every Prometheus exporter serves them.
        #[cfg(target_os = "linux")]
        if let Err(e) = registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        )) {
            tracing::warn!(error = %e, "the process_* series are not served");
        }
        let reg = Reg(&registry);
        let decisions = reg.counters(
            "cellrate_decisions_total",
            "Decisions per limit: api (native, envoy), limit name, result (allowed, denied, \
             shadow_denied, unlimited, not_configured, invalid, unmatched; a lease's release: \
             released, not_held).",
            &["api", "limit", "result"],
        );
        let settlements = reg.counters_from_zero(
            "cellrate_settlements_total",
            "Settle calls and kept Checks, by result: settled, retried (already settled at \
             the same costs), pending (its Check still being decided: nothing settled), \
             unknown (no such request id), conflict (settled at other \
             costs), expired (its hold had ended: nothing settled), pushed_out (a kept \
             Check dropped to make room), full (a Check refused: the table full of holds), \
             crowded (a Check refused: its bucket key has its most holds).",
            "result",
            &[
                "settled",
                "retried",
                "pending",
                "unknown",
                "conflict",
                "expired",
                "pushed_out",
                "full",
                "crowded",
            ],
        );
        let holds = reg.counters_from_zero(
            "cellrate_holds_total",
            "Reservations (Checks with a request_id on limits with a reservation policy), \
             by how they ended: settled (by Settle before their hold ended), released (not \
             settled: their estimate given back at the hold's end), kept (not settled: \
             their estimate stands).",
            "event",
            &["settled", "released", "kept"],
        );
        let anonymous_holds = reg.counters_from_zero(
            "cellrate_anonymous_holds_total",
            "Holds taken without a request id (--zero-check-holds: a check of 0 hits holds \
             an estimate, a charge settles its bucket's oldest hold), by event: taken, \
             settled (by a charge), unmatched (a charge that found no hold: charged in \
             full), refused (a check denied: its bucket has its most holds, or the table \
             is full of holds).",
            "event",
            &["taken", "settled", "unmatched", "refused"],
        );
        let ratelimit = RatelimitStats::new(&reg, mapping, ratelimit_stats);
        let (rpc, store) = (RpcMetrics::new(&reg), StoreMetrics::new(&reg));
        let (rlqs, resp) = (RlqsMetrics::new(&reg), RespMetrics::new(&reg));
        let config = ConfigMetrics::new(&reg);
        Arc::new(Metrics {
            registry,
            extra,
            denials: std::sync::OnceLock::new(),
            decisions: counters::DecisionCounters::new(decisions),
            settlements,
            holds,
            anonymous_holds,
            ratelimit,
            rpc,
            store,
            rlqs,
            resp,
            config,
        })
    }

    /// Counts one Redis-protocol command (`command`: a known name in lower case, or `other`).
    pub fn resp_command(&self, command: &str, ok: bool) {
        self.resp
            .commands
            .with_label_values(&[command, if ok { "ok" } else { "error" }])
            .inc();
    }

    /// Counts one `CL.THROTTLE` decision.
    pub fn resp_throttled(&self, allowed: bool) {
        self.resp.throttle_ok.inc();
        self.resp.throttled[usize::from(!allowed)].inc();
    }

    /// Counts one Redis-protocol connection closed by cellrate.
    pub fn resp_closed(&self, reason: &str) {
        self.resp.closed.with_label_values(&[reason]).inc();
    }

    /// Counts one RLQS action sent.
    pub fn rlqs_action(&self, action: &str) {
        self.rlqs.actions.with_label_values(&[action]).inc();
    }

    /// Counts one RLQS stream or bucket refused.
    pub fn rlqs_refused(&self, reason: &str) {
        self.rlqs.refusals.with_label_values(&[reason]).inc();
    }

    /// Counts requests an Envoy reported for `limit`.
    pub fn rlqs_reported(&self, limit: &str, allowed: u64, denied: u64) {
        if allowed > 0 {
            self.rlqs
                .requests
                .with_label_values(&[limit, "allowed"])
                .inc_by(allowed);
        }
        if denied > 0 {
            self.rlqs
                .requests
                .with_label_values(&[limit, "denied"])
                .inc_by(denied);
        }
    }

    /// Counts one decided item: `result` is a label of `cellrate::service::outcome`.
    /// Creates the `allowed` and `denied` series of `limits`, at zero, for both APIs and RLQS (the
    /// names configured at start; names added later appear with their first decision).
    pub fn known_limits<'a>(&self, limits: impl IntoIterator<Item = &'a str>) {
        for limit in limits {
            for api in ["native", "envoy"] {
                for result in ["allowed", "denied"] {
                    self.decisions.series(&[api, limit, result]);
                }
            }
            for result in ["allowed", "denied"] {
                self.rlqs.requests.with_label_values(&[limit, result]);
            }
        }
    }

    /// Tracks denied ids in `tracker` from now on (once; later calls are ignored).
    pub fn track_denials(&self, tracker: Arc<crate::top::DenialTracker>) {
        let _ = self.denials.set(tracker);
    }

    /// The denial tracker, if one is set.
    pub fn denials(&self) -> Option<&Arc<crate::top::DenialTracker>> {
        self.denials.get()
    }

    /// Counts a denial of `id` under `limit` for admin `Top` (never a metric label).
    pub fn denied_id(&self, limit: &Arc<str>, id: &str) {
        if let Some(tracker) = self.denials.get() {
            tracker.denied(limit, id);
        }
    }

    pub fn decision(&self, api: &str, limit: &str, result: &str) {
        self.decisions.series(&[api, limit, result]).inc();
    }

    /// [`Self::decision`] of a limit named by its `Arc` (a thread's recent series kept).
    pub fn decided(&self, api: &'static str, limit: &Arc<str>, result: &'static str) {
        self.decisions.inc(api, limit, result);
    }

    /// Records an answered RPC: its duration, and its gRPC status code.
    pub fn rpc(&self, rpc: &str, code: tonic::Code, seconds: f64) {
        match RPCS.iter().position(|r| *r == rpc) {
            Some(i) => self.rpc.series[i].observe(seconds),
            None => self.rpc.duration.with_label_values(&[rpc]).observe(seconds),
        }
        match RPCS.iter().position(|r| *r == rpc) {
            Some(i) if code == tonic::Code::Ok => self.rpc.ok[i].inc(),
            _ => self
                .rpc
                .codes
                .with_label_values(&[rpc, code_label(code)])
                .inc(),
        }
    }

    /// Records a loaded configuration (at startup or by reload).
    pub fn config_loaded(&self, version: &str, at: Nanos) {
        self.config.info.reset();
        self.config.info.with_label_values(&[version]).set(1);
        self.config.loaded.set(at as f64 / 1e9);
    }

    /// Counts a reload attempt: `success` (new limits), `unchanged` or `failure`.
    pub fn reload(&self, result: &str) {
        self.config.reloads.with_label_values(&[result]).inc();
        self.config
            .last_reload_ok
            .set(i64::from(result != "failure"));
    }

    /// Counts a change to the TLS files: `success` (swapped in) or `failure` (rejected).
    pub fn tls_reload(&self, result: &str) {
        self.config.tls_reloads.with_label_values(&[result]).inc();
    }

    /// Counts a temporary override set or cleared (`action`: `set`, `clear`).
    pub fn runtime_override(&self, action: &str) {
        self.runtime_overrides(action, 1);
    }

    /// Counts `n` temporary overrides changed by `action` (`set`, `clear`, `restored`).
    pub fn runtime_overrides(&self, action: &str, n: u64) {
        self.config
            .runtime_overrides
            .with_label_values(&[action])
            .inc_by(n);
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let mut families = self.registry.gather();
        self.extra.add_to(&mut families);
        let _ = TextEncoder::new().encode(&families, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// What the store reports (through `cellrate::store::StoreObserver`, which
/// `cellrate::store::measured` implements for [`Metrics`] with these).
impl Metrics {
    /// One store operation: its time and whether it succeeded.
    pub fn store_operation(&self, op: &'static str, seconds: f64, ok: bool) {
        match STORE_OPS.iter().position(|o| *o == op) {
            Some(i) => self.store.series[i].observe(seconds),
            None => self
                .store
                .duration
                .with_label_values(&[op])
                .observe(seconds),
        }
        if !ok {
            self.store.errors.with_label_values(&[op]).inc();
        }
    }

    /// A request answered by the failure policy `policy` while the store failed.
    pub fn store_fallback(&self, policy: &str) {
        self.store.fallbacks.with_label_values(&[policy]).inc();
    }

    /// Leases acquired, released, expired and refused since the last call (the sweeper's).
    pub fn leases_counted(&self, counts: [u64; 4]) {
        for (event, n) in groups::LEASE_EVENTS.iter().zip(counts) {
            if n > 0 {
                self.store.leases.with_label_values(&[event]).inc_by(n);
            }
        }
    }

    /// Spends denied for want of room, by bound ([`groups::BUCKET_BOUNDS`]), since the
    /// last call.
    pub fn buckets_refused(&self, counts: [u64; 3]) {
        for (bound, n) in groups::BUCKET_BOUNDS.iter().zip(counts) {
            if n > 0 {
                self.store
                    .buckets_refused
                    .with_label_values(&[bound])
                    .inc_by(n);
            }
        }
    }

    pub fn store_compensation(&self) {
        self.store.compensations.inc();
    }

    pub fn deny_cache_hit(&self) {
        self.store.deny_cache_hits.inc();
    }

    pub fn breaker_rejection(&self) {
        self.store.breaker_rejections.inc();
    }

    /// A breaker opened (`true`) or closed (`false`).
    pub fn breaker_turned(&self, open: bool) {
        if open {
            self.store.breakers_open.inc();
        } else {
            self.store.breakers_open.dec();
        }
    }

    /// A Redis spend call that answered `batches` requests' batches.
    pub fn redis_spend_call(&self, batches: usize) {
        self.store.redis_batches_per_call.observe(batches as f64);
    }

    /// Items that began (positive) or stopped (negative) waiting for a Redis call.
    pub fn redis_queued(&self, items: i64) {
        self.store.redis_queued_items.add(items);
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

    /// The process's own series, read from /proc as every exporter serves them.
    #[cfg(target_os = "linux")]
    #[test]
    fn render_has_the_process_series() {
        let text = Metrics::new().render();
        let value = |name: &str| {
            let line = text.lines().find(|l| l.starts_with(&format!("{name} ")));
            let line = line.unwrap_or_else(|| panic!("no {name} in {text}"));
            line[name.len() + 1..].parse::<f64>().unwrap()
        };
        assert!(value("process_resident_memory_bytes") > 1_000_000.0);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_start_time_seconds") > 1_700_000_000.0);
        // Whole clock ticks: a test's process may not have used one yet.
        assert!(value("process_cpu_seconds_total") >= 0.0);
        for name in [
            "process_max_fds",
            "process_virtual_memory_bytes",
            "process_threads",
        ] {
            assert!(value(name) > 0.0, "{name}");
        }
    }

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
