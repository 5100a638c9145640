//! The metrics in groups by what they watch (RPCs, the store, RLQS, the Redis-protocol
//! listener, the configuration), each registered with its help text and, where its label
//! set is known, every series created at zero.

use prometheus::{
    Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use super::{LATENCY_BUCKETS, RPCS, STORE_OPS};

/// Every RPC timed and counted by status code.
pub(super) struct RpcMetrics {
    pub(super) duration: HistogramVec,
    pub(super) codes: IntCounterVec,
    /// [`RPCS`]' OK counters, resolved once (the common case).
    pub(super) ok: Vec<IntCounter>,
    /// [`RPCS`]' series, resolved once: a label lookup costs a hash and a lock per call.
    pub(super) series: Vec<prometheus::Histogram>,
}

/// The store: operations, buckets, failures and the Redis store's own machinery.
pub struct StoreMetrics {
    pub(super) duration: HistogramVec,
    /// [`STORE_OPS`]' series, resolved once.
    pub(super) series: Vec<prometheus::Histogram>,
    pub(super) errors: IntCounterVec,
    pub live_buckets: IntGauge,
    /// The memory store's bound on live buckets (`--max-buckets`); 0 with Redis.
    pub max_buckets: IntGauge,
    pub swept_buckets: IntCounter,
    pub(super) fallbacks: IntCounterVec,
    pub(super) compensations: IntCounter,
    pub(super) breaker_rejections: IntCounter,
    /// Redis circuit breakers open now (one per slot, one in all for a standalone Redis).
    pub(super) breakers_open: IntGauge,
    /// Requests' batches per spend call Redis answered (coalescing).
    pub(super) redis_batches_per_call: prometheus::Histogram,
    /// Items waiting for a coalesced Redis call.
    pub(super) redis_queued_items: IntGauge,
    pub(super) deny_cache_hits: IntCounter,
    /// Leases of concurrency limits, by [`LEASE_EVENTS`].
    pub(super) leases: IntCounterVec,
    /// Spends denied for want of room for a new bucket, by [`BUCKET_BOUNDS`].
    pub(super) buckets_refused: IntCounterVec,
    /// The memory store's snapshot file.
    pub snapshot: SnapshotMetrics,
}

/// What happened to leases: the label values of `cellrate_leases_total`.
pub(super) const LEASE_EVENTS: [&str; 4] = ["acquired", "released", "expired", "refused"];

/// Which bound left no room for a new bucket: the label values of
/// `cellrate_buckets_refused_total`, in the order of `store::memory::Full`.
pub(super) const BUCKET_BOUNDS: [&str; 3] = ["table", "name", "caller_given"];

/// Why a snapshot file was not used at start: the label values of
/// `cellrate_snapshot_ignored_total`.
pub const SNAPSHOT_IGNORED_REASONS: [&str; 10] = [
    "missing",
    "unreadable",
    "not_a_file",
    "untrusted",
    "too_large",
    "foreign",
    "version",
    "truncated",
    "corrupt",
    "stale",
];

/// The memory store's snapshot file (`--snapshot-file`).
pub struct SnapshotMetrics {
    /// Writes by result (ok, failed).
    pub writes: IntCounterVec,
    /// How long the last write took.
    pub write_seconds: Gauge,
    /// When the last snapshot was written whole.
    pub written_at: Gauge,
    /// Buckets restored at start.
    pub restored: IntGauge,
    /// Buckets in the file not restored at start: their TAT lay too far ahead.
    pub refused: IntGauge,
    /// Files not used at start, by reason.
    pub ignored: IntCounterVec,
}

impl SnapshotMetrics {
    fn new(reg: &Reg) -> SnapshotMetrics {
        let gauge = |name: &str, help: &str| reg.add(Gauge::new(name, help).expect("valid gauge"));
        SnapshotMetrics {
            writes: reg.counters_from_zero(
                "cellrate_snapshot_writes_total",
                "Writes of the memory store's snapshot file (--snapshot-file), by result (ok, \
                 failed).",
                "result",
                &["ok", "failed"],
            ),
            write_seconds: gauge(
                "cellrate_snapshot_write_duration_seconds",
                "How long the last write of the snapshot file took.",
            ),
            written_at: gauge(
                "cellrate_snapshot_last_success_timestamp_seconds",
                "Unix time of the last snapshot file written whole (0: none yet).",
            ),
            restored: reg.gauge(
                "cellrate_snapshot_restored_buckets",
                "Buckets restored from the snapshot file at start.",
            ),
            refused: reg.gauge(
                "cellrate_snapshot_refused_buckets",
                "Buckets in the snapshot file not restored at start because their TAT lay \
                 further ahead than any limit can put one (a forged or damaged file).",
            ),
            ignored: reg.counters_from_zero(
                "cellrate_snapshot_ignored_total",
                "Snapshot files not used at start (the store started empty), by reason: \
                 missing, unreadable, not_a_file, untrusted, too_large, foreign, version, \
                 truncated, corrupt, stale.",
                "reason",
                &SNAPSHOT_IGNORED_REASONS,
            ),
        }
    }
}

/// Envoy's RLQS: streams, buckets, actions sent, refusals, reported requests.
pub struct RlqsMetrics {
    /// RLQS streams open, and buckets tracked over them.
    pub streams: IntGauge,
    pub buckets: IntGauge,
    /// Bytes the tracked buckets count against `--rlqs-max-bucket-bytes`.
    pub bucket_bytes: IntGauge,
    pub(super) actions: IntCounterVec,
    pub(super) refusals: IntCounterVec,
    pub(super) requests: IntCounterVec,
}

/// The Redis-protocol listener.
pub struct RespMetrics {
    /// Connections open on the Redis-protocol listener.
    pub connections: IntGauge,
    pub(super) commands: IntCounterVec,
    /// `CL.THROTTLE` decisions allowed and limited, resolved once (the hot path).
    pub(super) throttled: [IntCounter; 2],
    /// `cellrate_resp_commands_total{command="cl.throttle",result="ok"}`, resolved once.
    pub(super) throttle_ok: IntCounter,
    pub(super) closed: IntCounterVec,
}

/// The limits in force, their reloads, and temporary overrides.
pub struct ConfigMetrics {
    pub(super) info: IntGaugeVec,
    pub(super) loaded: Gauge,
    /// 1 unless the last reload attempt was rejected.
    pub(super) last_reload_ok: IntGauge,
    pub(super) reloads: IntCounterVec,
    pub(super) runtime_overrides: IntCounterVec,
    /// Copies of the temporary overrides shared through Redis that failed.
    pub override_sync_failures: IntCounter,
    /// `cellrate_xds_updates_total{result}`: applied, unchanged, rejected.
    pub xds_updates: IntCounterVec,
    /// `cellrate_xds_connected`: 1 while the xDS stream is open.
    pub xds_connected: IntGauge,
    /// `cellrate_tls_reloads_total{result}`: success, failure.
    pub(super) tls_reloads: IntCounterVec,
}

/// Registers metrics in one registry. Names are constants of this file; registering one
/// twice is a bug the tests catch (so a failure here is a panic at start, never later).
pub(super) struct Reg<'a>(pub(super) &'a Registry);

impl Reg<'_> {
    pub(super) fn add<C: prometheus::core::Collector + Clone + 'static>(&self, c: C) -> C {
        self.0
            .register(Box::new(c.clone()))
            .expect("metric names are unique");
        c
    }

    pub(super) fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(name, help).expect("valid counter"))
    }

    pub(super) fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(name, help).expect("valid gauge"))
    }

    pub(super) fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter"))
    }

    /// Counters by one label, with a series at zero for each of `values`: dashboards and
    /// alerts (`increase(...) > 0`, absent-series checks) need them before the first event.
    pub(super) fn counters_from_zero(
        &self,
        name: &str,
        help: &str,
        label: &str,
        values: &[&str],
    ) -> IntCounterVec {
        let counters = self.counters(name, help, &[label]);
        for value in values {
            counters.with_label_values(&[value]);
        }
        counters
    }

    /// A latency histogram (10 µs to 1 s) by `label`.
    pub(super) fn latencies(&self, name: &str, help: &str, label: &str) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
        self.add(HistogramVec::new(opts, &[label]).expect("valid histogram"))
    }
}

impl RpcMetrics {
    pub(super) fn new(reg: &Reg) -> RpcMetrics {
        let duration = reg.latencies(
            "cellrate_rpc_duration_seconds",
            "Time to answer an RPC, by RPC.",
            "rpc",
        );
        let codes = reg.counters(
            "cellrate_rpc_requests_total",
            "Answered RPCs, by RPC and gRPC status code.",
            &["rpc", "code"],
        );
        RpcMetrics {
            ok: RPCS
                .iter()
                .map(|rpc| codes.with_label_values(&[rpc, "OK"]))
                .collect(),
            series: RPCS
                .iter()
                .map(|rpc| duration.with_label_values(&[rpc]))
                .collect(),
            duration,
            codes,
        }
    }
}

impl StoreMetrics {
    pub(super) fn new(reg: &Reg) -> StoreMetrics {
        let duration = reg.latencies(
            "cellrate_store_operation_duration_seconds",
            "Time of a store operation (one per request), by operation.",
            "operation",
        );
        let errors = reg.counters_from_zero(
            "cellrate_store_errors_total",
            "Store operations that failed, by operation.",
            "operation",
            &STORE_OPS,
        );
        let fallbacks = reg.counters_from_zero(
            "cellrate_store_fallbacks_total",
            "Requests answered by the failure policy while the store failed, by policy.",
            "policy",
            &["allow", "deny", "local"],
        );
        let leases = reg.counters_from_zero(
            "cellrate_leases_total",
            "Leases of concurrency limits, by event: acquired (a lease taken), released (freed \
             by its release), expired (dropped unreleased after its hold: leaked), refused (an acquire denied \
             because the memory store's leases, or its name's share of them, were full).",
            "event",
            &LEASE_EVENTS,
        );
        let buckets_refused = reg.counters_from_zero(
            "cellrate_buckets_refused_total",
            "Spends the memory store denied because they needed a new bucket and a bound \
             was full, by bound: table (--max-buckets), name (a limit name's share, \
             --bucket-name-share), caller_given (--caller-limit-bucket-share).",
            "bound",
            &BUCKET_BOUNDS,
        );
        StoreMetrics {
            leases,
            buckets_refused,
            snapshot: SnapshotMetrics::new(reg),
            series: STORE_OPS
                .iter()
                .map(|op| duration.with_label_values(&[op]))
                .collect(),
            duration,
            errors,
            fallbacks,
            live_buckets: reg.gauge(
                "cellrate_live_buckets",
                "Buckets held by the memory store (including expired ones not yet swept).",
            ),
            max_buckets: reg.gauge(
                "cellrate_max_buckets",
                "The memory store's bound on live buckets (--max-buckets); 0 with the Redis \
                 store.",
            ),
            swept_buckets: reg.counter(
                "cellrate_swept_buckets_total",
                "Expired buckets dropped by the memory store's sweeper.",
            ),
            compensations: reg.counter(
                "cellrate_store_compensations_total",
                "Cross-slot batches whose spent slot groups were refunded because another \
                 group denied.",
            ),
            breaker_rejections: reg.counter(
                "cellrate_store_breaker_rejections_total",
                "Store calls failed fast by an open circuit breaker.",
            ),
            breakers_open: reg.gauge(
                "cellrate_store_breakers_open",
                "Redis circuit breakers open now, failing calls fast (one breaker per \
                 cluster slot, one for a standalone Redis; 0 with the memory store).",
            ),
            redis_batches_per_call: reg.add(
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
            redis_queued_items: reg.gauge(
                "cellrate_redis_queued_items",
                "Items waiting for a coalesced Redis spend call, over every lane (beyond \
                 the queue's bound a request fails at once and the failure policy \
                 answers it).",
            ),
            deny_cache_hits: reg.counter(
                "cellrate_store_deny_cache_hits_total",
                "Requests denied by the Redis store's local deny cache without a round trip.",
            ),
        }
    }
}

impl RlqsMetrics {
    pub(super) fn new(reg: &Reg) -> RlqsMetrics {
        let actions = reg.counters_from_zero(
            "cellrate_rlqs_actions_total",
            "RLQS actions sent to Envoy, by action (token_bucket, allow_all, deny_all, abandon, pushed).",
            "action",
            &["token_bucket", "allow_all", "deny_all", "abandon", "pushed"],
        );
        let refusals = reg.counters_from_zero(
            "cellrate_rlqs_refusals_total",
            "RLQS streams and buckets refused, by reason (too_many_streams, too_many_buckets, invalid, slow_reader), and failed exchanges of demand with other replicas (sync_failure).",
            "reason",
            &[
            "too_many_streams",
            "too_many_buckets",
            "invalid",
            "slow_reader",
        ],
        );
        RlqsMetrics {
            streams: reg.gauge("cellrate_rlqs_streams", "Envoy RLQS streams open."),
            buckets: reg.gauge(
                "cellrate_rlqs_buckets",
                "Envoy RLQS buckets tracked, over every stream.",
            ),
            bucket_bytes: reg.gauge(
                "cellrate_rlqs_bucket_bytes",
                "Bytes the tracked RLQS buckets' ids count against --rlqs-max-bucket-bytes \
                 (each id's text plus 128).",
            ),
            actions,
            refusals,
            requests: reg.counters(
                "cellrate_rlqs_reported_requests_total",
                "Requests Envoys reported over RLQS, by limit name and result (allowed, denied).",
                &["limit", "result"],
            ),
        }
    }
}

impl RespMetrics {
    pub(super) fn new(reg: &Reg) -> RespMetrics {
        let commands = reg.counters(
            "cellrate_resp_commands_total",
            "Commands answered on the Redis-protocol listener, by command (lower case; `other` \
             for unknown ones) and result (ok, error).",
            &["command", "result"],
        );
        let closed = reg.counters_from_zero(
            "cellrate_resp_closed_total",
            "Redis-protocol connections closed by cellrate, by reason (protocol_error, \
             timeout, auth_failures, auth_locked, auth_timeout, shutdown).",
            "reason",
            &[
                "protocol_error",
                "timeout",
                "auth_failures",
                "auth_locked",
                "auth_timeout",
                "shutdown",
            ],
        );
        RespMetrics {
            connections: reg.gauge(
                "cellrate_resp_connections",
                "Connections open on the Redis-protocol listener.",
            ),
            throttle_ok: commands.with_label_values(&["cl.throttle", "ok"]),
            commands,
            throttled: [
                reg.counter(
                    "cellrate_resp_throttle_allowed_total",
                    "CL.THROTTLE calls allowed.",
                ),
                reg.counter(
                    "cellrate_resp_throttle_limited_total",
                    "CL.THROTTLE calls limited.",
                ),
            ],
            closed,
        }
    }
}

impl ConfigMetrics {
    pub(super) fn new(reg: &Reg) -> ConfigMetrics {
        let reloads = reg.counters_from_zero(
            "cellrate_config_reloads_total",
            "Limits reloads, by result (success, failure, unchanged).",
            "result",
            &["success", "failure", "unchanged"],
        );
        let runtime_overrides = reg.counters_from_zero(
            "cellrate_runtime_override_changes_total",
            "Temporary overrides set and cleared through the admin API, and put back by a \
             replica after Redis lost them (restored), by action.",
            "action",
            &["set", "clear", "restored"],
        );
        let last_reload_ok = reg.gauge(
            "cellrate_config_last_reload_successful",
            "0 when the last attempt to reload the limits was rejected (the previous \
             limits stay in force), else 1.",
        );
        last_reload_ok.set(1);
        let xds_updates = reg.counters_from_zero(
            "cellrate_xds_updates_total",
            "RateLimitConfig updates received over xDS, by result: applied (ACKed, new limits \
             in force), unchanged (ACKed, same content), rejected (NACKed, the previous \
             limits stay in force).",
            "result",
            &["applied", "unchanged", "rejected"],
        );
        let xds_connected = reg.gauge(
            "cellrate_xds_connected",
            "1 while the xDS stream to the control plane is open (--xds-server), else 0.",
        );
        let tls_reloads = reg.counters_from_zero(
            "cellrate_tls_reloads_total",
            "Changes to the gRPC listeners' TLS files, by result: success (in force for new \
             connections), failure (rejected: the certificate in force stays).",
            "result",
            &["success", "failure"],
        );
        ConfigMetrics {
            tls_reloads,
            info: reg.add(
                IntGaugeVec::new(
                    Opts::new(
                        "cellrate_config_info",
                        "1 for the version (content hash) of the limits in force.",
                    ),
                    &["version"],
                )
                .expect("valid gauge"),
            ),
            loaded: reg.add(
                Gauge::new(
                    "cellrate_config_loaded_timestamp_seconds",
                    "Unix time at which the limits in force were loaded.",
                )
                .expect("valid gauge"),
            ),
            last_reload_ok,
            reloads,
            runtime_overrides,
            override_sync_failures: reg.counter(
                "cellrate_runtime_override_sync_failures_total",
                "Failed copies of the temporary overrides shared through Redis (the last copy stays in force).",
            ),
            xds_updates,
            xds_connected,
        }
    }
}
