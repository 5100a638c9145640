//! Prometheus metrics, and the HTTP listener that serves them with `/healthz` and `/readyz`.
//!
//! No label ever carries an id, a bucket key or a descriptor value (unbounded cardinality):
//! labels are API names, RPC names, limit names from the configuration, results and store
//! operations, all bounded by the code or the config.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::clock::Nanos;
use crate::gcra::Decision;
use crate::limits::config::LoadError;
use crate::limits::names::BucketKey;
use crate::service::{ItemResult, Rule};
use crate::store::{Outcome, Store, StoreError, StoreFuture, StoreItem};

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
    decisions: IntCounterVec,
    rpc_duration: HistogramVec,
    /// [`RPCS`]' series, resolved once: a label lookup costs a hash and a lock per call.
    rpc_series: Vec<prometheus::Histogram>,
    store_duration: HistogramVec,
    /// [`STORE_OPS`]' series, resolved once.
    store_series: Vec<prometheus::Histogram>,
    store_errors: IntCounterVec,
    pub live_buckets: IntGauge,
    pub swept_buckets: IntCounter,
    reloads: IntCounterVec,
    store_fallbacks: IntCounterVec,
    store_compensations: IntCounter,
    store_breaker_rejections: IntCounter,
    deny_cache_hits: IntCounter,
    config_info: IntGaugeVec,
    config_loaded: Gauge,
    /// The last reload error, for `/healthz`; `None` after a good load.
    last_reload_error: Mutex<Option<String>>,
    /// The config version in force, for `/healthz`.
    config_version: Mutex<String>,
    /// Cleared when shutdown begins: `/readyz` then answers 503.
    ready: AtomicBool,
    /// When set, `/readyz` also needs the store to be answering.
    store_health: Mutex<Option<Arc<AtomicBool>>>,
}

/// The `result` label of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcomes {
    Allowed,
    Denied,
    ShadowDenied,
    Unlimited,
    NotConfigured,
    Unmatched,
    Invalid,
}

impl Outcomes {
    fn label(self) -> &'static str {
        match self {
            Outcomes::Allowed => "allowed",
            Outcomes::Denied => "denied",
            Outcomes::ShadowDenied => "shadow_denied",
            Outcomes::Unlimited => "unlimited",
            Outcomes::NotConfigured => "not_configured",
            Outcomes::Unmatched => "unmatched",
            Outcomes::Invalid => "invalid",
        }
    }

    /// The result of one decided item.
    pub fn of(item: &ItemResult) -> Outcomes {
        match item.rule {
            Rule::Unlimited => Outcomes::Unlimited,
            Rule::NotConfigured => Outcomes::NotConfigured,
            Rule::Denied => Outcomes::Denied,
            Rule::InvalidId { .. } => Outcomes::Invalid,
            Rule::Limited(_) if item.decision.allowed => Outcomes::Allowed,
            Rule::Limited(_) if item.shadow => Outcomes::ShadowDenied,
            Rule::Limited(_) => Outcomes::Denied,
        }
    }
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
        let store_duration = histogram(
            "cellrate_store_operation_duration_seconds",
            "Time of a store operation (one per request), by operation.",
            "operation",
        );
        Arc::new(Metrics {
            rpc_series: RPCS
                .iter()
                .map(|rpc| rpc_duration.with_label_values(&[rpc]))
                .collect(),
            store_series: STORE_OPS
                .iter()
                .map(|op| store_duration.with_label_values(&[op]))
                .collect(),
            rpc_duration,
            store_duration,
            decisions: counter_vec(
                "cellrate_decisions_total",
                "Decisions per limit: api (native, envoy), limit name, result (allowed, denied, \
                 shadow_denied, unlimited, not_configured, unmatched).",
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
            registry,
            last_reload_error: Mutex::new(None),
            config_version: Mutex::new(String::new()),
            ready: AtomicBool::new(true),
            store_health: Mutex::new(None),
        })
    }

    /// Counts one decided item.
    pub fn decision(&self, api: &str, limit: &str, outcome: Outcomes) {
        self.decisions
            .with_label_values(&[api, limit, outcome.label()])
            .inc();
    }

    /// Counts a batch's items.
    pub fn decisions(&self, api: &str, items: &[ItemResult]) {
        for item in items {
            self.decision(api, &item.name, Outcomes::of(item));
        }
    }

    /// Times an RPC from `start`.
    pub fn rpc(&self, rpc: &str, start: Instant) {
        let seconds = start.elapsed().as_secs_f64();
        match RPCS.iter().position(|r| *r == rpc) {
            Some(i) => self.rpc_series[i].observe(seconds),
            None => self.rpc_duration.with_label_values(&[rpc]).observe(seconds),
        }
    }

    /// Records a loaded configuration (at startup or by reload).
    pub fn config_loaded(&self, version: &str, at: Nanos) {
        self.config_info.reset();
        self.config_info.with_label_values(&[version]).set(1);
        self.config_loaded.set(at as f64 / 1e9);
        *lock(&self.config_version) = version.to_string();
        *lock(&self.last_reload_error) = None;
    }

    /// Counts a reload attempt. A failure's first error (cut to 1 KiB) and count are kept
    /// for `/healthz`; any success, or a reload finding the limits in force unchanged (the
    /// operator reverted), clears them.
    pub fn reload(&self, result: Result<bool, &LoadError>) {
        let label = match result {
            Ok(true) => "success",
            Ok(false) => {
                *lock(&self.last_reload_error) = None;
                "unchanged"
            }
            Err(errors) => {
                let first = errors
                    .0
                    .first()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                let mut summary: String = first.chars().take(1024).collect();
                if errors.0.len() > 1 {
                    summary.push_str(&format!(" (and {} more)", errors.0.len() - 1));
                }
                *lock(&self.last_reload_error) = Some(summary);
                "failure"
            }
        };
        self.reloads.with_label_values(&[label]).inc();
    }

    /// Counts a request answered by the store's failure policy.
    pub fn store_fallback(&self, policy: &str) {
        self.store_fallbacks.with_label_values(&[policy]).inc();
    }

    /// Counts a cross-slot batch that had to be refunded.
    pub fn store_compensation(&self) {
        self.store_compensations.inc();
    }

    /// Counts a request the local deny cache answered.
    pub fn deny_cache_hit(&self) {
        self.deny_cache_hits.inc();
    }

    /// Counts a call failed fast by an open breaker.
    pub fn store_breaker_rejection(&self) {
        self.store_breaker_rejections.inc();
    }

    /// Makes readiness depend on `healthy` (the store's last call succeeded).
    pub fn require_store_health(&self, healthy: Arc<AtomicBool>) {
        *lock(&self.store_health) = Some(healthy);
    }

    /// Whether `/readyz` answers 200.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
            && lock(&self.store_health)
                .as_ref()
                .is_none_or(|h| h.load(Ordering::Relaxed))
    }

    /// Marks the service as shutting down (`/readyz` answers 503).
    pub fn set_not_ready(&self) {
        self.ready.store(false, Ordering::SeqCst);
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// `/healthz`'s body: the config in force and the last reload error, if any.
    pub fn health(&self) -> String {
        serde_json::json!({
            "status": "ok",
            "config_version": *lock(&self.config_version),
            "last_reload_error": *lock(&self.last_reload_error),
        })
        .to_string()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A store that times every operation and counts its errors.
pub struct MeasuredStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl MeasuredStore {
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> MeasuredStore {
        MeasuredStore { inner, metrics }
    }

    fn observe<T>(&self, op: &str, start: Instant, result: &Result<T, StoreError>) {
        let seconds = start.elapsed().as_secs_f64();
        match STORE_OPS.iter().position(|o| *o == op) {
            Some(i) => self.metrics.store_series[i].observe(seconds),
            None => self
                .metrics
                .store_duration
                .with_label_values(&[op])
                .observe(seconds),
        }
        if result.is_err() {
            self.metrics.store_errors.with_label_values(&[op]).inc();
        }
    }
}

impl Store for MeasuredStore {
    fn spend<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Outcome> {
        Box::pin(async move {
            let start = Instant::now();
            let result = self.inner.spend(items).await;
            self.observe("spend", start, &result);
            result
        })
    }

    fn try_spend_now(&self, items: &[StoreItem]) -> Option<Result<Outcome, StoreError>> {
        let start = Instant::now();
        let result = self.inner.try_spend_now(items)?;
        self.observe("spend", start, &result);
        Some(result)
    }

    fn refund<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Vec<Decision>> {
        Box::pin(async move {
            let start = Instant::now();
            let result = self.inner.refund(items).await;
            self.observe("refund", start, &result);
            result
        })
    }

    fn reset<'a>(&'a self, keys: &'a [BucketKey]) -> StoreFuture<'a, u32> {
        Box::pin(async move {
            let start = Instant::now();
            let result = self.inner.reset(keys).await;
            self.observe("reset", start, &result);
            result
        })
    }

    fn sweep(&self) -> usize {
        self.inner.sweep()
    }

    fn live_buckets(&self) -> Option<usize> {
        self.inner.live_buckets()
    }

    fn limits_changed(&self) {
        self.inner.limits_changed()
    }
}

/// The metrics listener's routes: `/metrics`, `/healthz` (alive, config status) and
/// `/readyz` (503 once shutdown begins).
pub fn http_routes(metrics: Arc<Metrics>) -> axum::Router {
    use axum::http::{header, StatusCode};
    use axum::routing::get;
    let for_metrics = metrics.clone();
    let for_health = metrics.clone();
    axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let body = for_metrics.render();
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body) }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let body = for_health.health();
                async move { ([(header::CONTENT_TYPE, "application/json")], body) }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let ready = metrics.ready();
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
                    }
                }
            }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_has_the_main_series() {
        let m = Metrics::new();
        m.decision("native", "NewOrdersPerAccount", Outcomes::Denied);
        m.config_loaded("abc", 1_700_000_000_000_000_000);
        let bad = |reason: &str, n: usize| {
            LoadError(vec![
                crate::limits::config::ConfigError {
                    file: "defaults.yaml".into(),
                    entry: None,
                    reason: reason.into(),
                };
                n
            ])
        };
        m.reload(Err(&bad("bad", 1)));
        let text = m.render();
        assert!(text.contains(
            "cellrate_decisions_total{api=\"native\",limit=\"NewOrdersPerAccount\",result=\"denied\"} 1"
        ));
        assert!(text.contains("cellrate_config_info{version=\"abc\"} 1"));
        assert!(text.contains("cellrate_config_reloads_total{result=\"failure\"} 1"));
        assert!(text.contains("cellrate_config_loaded_timestamp_seconds 1700000000"));
        assert!(m
            .health()
            .contains("\"last_reload_error\":\"defaults.yaml: bad\""));
        // Many long errors: /healthz keeps the first, cut, and a count.
        m.reload(Err(&bad(&"x".repeat(5_000), 1_000)));
        let health = m.health();
        assert!(health.len() < 1_200, "{} bytes", health.len());
        assert!(health.contains("(and 999 more)"), "{health}");
        // A reload that finds the limits in force (the operator reverted) clears it.
        m.reload(Ok(false));
        assert!(m.health().contains("\"last_reload_error\":null"));
        m.reload(Err(&bad("bad", 1)));
        m.config_loaded("def", 0);
        assert!(!m.render().contains("version=\"abc\""));
        assert!(m.health().contains("\"last_reload_error\":null"));
    }
}
