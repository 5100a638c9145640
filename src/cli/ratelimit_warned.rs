//! envoyproxy/ratelimit's variables that `cellrate ratelimit` accepts and that change
//! nothing here, each with why: set, each is one warning in the log (see
//! [`super::ratelimit_env`], whose test holds every upstream variable to an answer).

/// Variables that are accepted and change nothing here, with why.
pub(super) const NOT_APPLICABLE: &[(&str, &str)] = &[
    (
        "USE_STATSD",
        "cellrate exports Prometheus metrics, not statsd",
    ),
    (
        "STATSD_HOST",
        "cellrate exports Prometheus metrics, not statsd",
    ),
    (
        "STATSD_PORT",
        "cellrate exports Prometheus metrics, not statsd",
    ),
    (
        "USE_DOG_STATSD",
        "cellrate exports Prometheus metrics, not statsd",
    ),
    ("DEBUG_HOST", "cellrate has no debug listener"),
    ("DEBUG_PORT", "cellrate has no debug listener"),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "cellrate keeps no local over-limit cache of windows (its Redis deny cache, --redis-deny-cache, serves GCRA buckets only)",
    ),
    (
        "REDIS_POOL_SIZE",
        "cellrate multiplexes one connection per node",
    ),
    (
        "REDIS_PIPELINE_WINDOW",
        "cellrate coalesces calls by itself",
    ),
    ("REDIS_PIPELINE_LIMIT", "cellrate coalesces calls by itself"),
    ("REDIS_PERSECOND", "one Redis serves every limit"),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "cellrate's readiness follows Redis by itself",
    ),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "cellrate coalesces calls by itself",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "cellrate multiplexes one connection per node",
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "cellrate serves at once and reconnects by itself",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "cellrate serves at once and reconnects by itself",
    ),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "cellrate serves at once and reconnects by itself",
    ),
    ("REDIS_PERSECOND_URL", "one Redis serves every limit"),
    ("REDIS_PERSECOND_TYPE", "one Redis serves every limit"),
    ("REDIS_PERSECOND_AUTH", "one Redis serves every limit"),
    (
        "REDIS_PERSECOND_SENTINEL_AUTH",
        "one Redis serves every limit",
    ),
    (
        "REDIS_PERSECOND_SOCKET_TYPE",
        "one Redis serves every limit",
    ),
    ("REDIS_PERSECOND_TLS", "one Redis serves every limit"),
    ("REDIS_PERSECOND_TIMEOUT", "one Redis serves every limit"),
    ("REDIS_PERSECOND_POOL_SIZE", "one Redis serves every limit"),
    (
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        "one Redis serves every limit",
    ),
    (
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        "one Redis serves every limit",
    ),
    (
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        "one Redis serves every limit",
    ),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        "one Redis serves every limit",
    ),
    (
        "STATS_FLUSH_INTERVAL",
        "Prometheus scrapes; nothing is flushed",
    ),
    (
        "USE_DOG_STATSD_MOGRIFIERS",
        "cellrate exports Prometheus metrics, not statsd",
    ),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "latencies are histograms in seconds",
    ),
    (
        "RUNTIME_IGNOREDOTFILES",
        "files whose names start with a dot are always ignored",
    ),
    ("TRACING_EXPORTER_PROTOCOL", "no OpenTelemetry export"),
    ("TRACING_SERVICE_NAME", "no OpenTelemetry export"),
    ("TRACING_SERVICE_NAMESPACE", "no OpenTelemetry export"),
    ("TRACING_SERVICE_INSTANCE_ID", "no OpenTelemetry export"),
    ("TRACING_SAMPLING_RATE", "no OpenTelemetry export"),
    (
        "RUNTIME_WATCH_ROOT",
        "the directory is watched, and re-read every --reload-interval-seconds",
    ),
    ("TRACING_ENABLED", "no OpenTelemetry export"),
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "connecting is retried with XDS_CLIENT_BACKOFF_*",
    ),
    (
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "each wait doubles the last, drawn from its upper half",
    ),
    (
        "XDS_CLIENT_BACKOFF_JITTER",
        "each wait doubles the last, drawn from its upper half",
    ),
];
