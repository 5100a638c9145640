//! `cellrate ratelimit`'s translation of envoyproxy/ratelimit's behaviour and statistics
//! variables (`SHADOW_MODE`, `QUOTA_MODE`, `NEAR_LIMIT_RATIO`, `EXTRA_TAGS`,
//! `MERGE_DOMAIN_CONFIG`, `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, `USE_PROMETHEUS` and
//! its `PROMETHEUS_*`) into `cellrate serve` flags; the rest is [`super::ratelimit_env`].

/// envoyproxy/ratelimit's booleans (Go's `strconv.ParseBool`).
pub(super) fn boolean(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        other => Err(format!("{name}={other:?}: not a boolean (true or false)")),
    }
}

/// `host:port`, an empty host meaning every interface (`:19001`).
pub(super) fn address(name: &str, host: &str, port: &str) -> Result<String, String> {
    let variable = name.rsplit(':').next().unwrap_or(name);
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{variable}={port:?}: not a port number"))?;
    let host = match host {
        "" => "0.0.0.0",
        host => host,
    };
    let text = match host.contains(':') && !host.starts_with('[') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    };
    text.parse::<std::net::SocketAddr>()
        .map(|a| a.to_string())
        .map_err(|_| format!("{name}: {text:?} is not an IP address and port"))
}

/// What the service does: `SHADOW_MODE`, `QUOTA_MODE`, `NEAR_LIMIT_RATIO`, `EXTRA_TAGS`,
/// `MERGE_DOMAIN_CONFIG`, `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`.
pub(super) fn behaviour(
    var: &impl Fn(&str) -> Option<String>,
    flags: &mut Vec<String>,
) -> Result<(), String> {
    let flag = |name: &str| boolean(name, &var(name).unwrap_or("false".into()));
    let mut push = |parts: &[&str]| flags.extend(parts.iter().map(|p| p.to_string()));
    if flag("SHADOW_MODE")? {
        push(&["--shadow"]);
    }
    // Upstream's global quota mode: every descriptor as if its limit had quota_mode.
    if flag("QUOTA_MODE")? {
        push(&["--quota-mode"]);
    }
    // Files of one domain merged, as upstream merges them, rather than refused.
    if flag("MERGE_DOMAIN_CONFIG")? {
        push(&["--merge-domains", "true"]);
    }
    // Upstream's health check then fails until a load holds a domain, and again whenever
    // a reload holds none.
    if flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")? {
        push(&["--ready-needs-limits", "true"]);
    }
    if let Some(ratio) = var("NEAR_LIMIT_RATIO") {
        super::envoy_args::parse_ratio(&ratio)
            .map_err(|e| format!("NEAR_LIMIT_RATIO={ratio:?}: {e}"))?;
        push(&["--near-limit-ratio", &ratio]);
    }
    // Upstream's null sink: none of its statistics is kept.
    if flag("DISABLE_STATS")? {
        push(&["--ratelimit-stats", "false"]);
    }
    // Tags on every statistic, as upstream's scopes carry them: labels on every series.
    if let Some(tags) = var("EXTRA_TAGS").filter(|t| !t.is_empty()) {
        crate::observe::metrics::ExtraLabels::parse(&tags)
            .map_err(|e| format!("EXTRA_TAGS={tags:?}: {e}"))?;
        push(&["--metrics-labels", &tags]);
    }
    Ok(())
}

/// `USE_PROMETHEUS`: the metrics on `PROMETHEUS_ADDR` at `PROMETHEUS_PATH` (`PORT` kept
/// for the probes, at `http`), and the statistics named through a statsd mapping, as
/// upstream's sink names them: `PROMETHEUS_MAPPER_YAML`'s file, else its own.
pub(super) fn prometheus(
    var: &impl Fn(&str) -> Option<String>,
    http: String,
    flags: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let mut push = |flag: &str, value: String| {
        flags.push(flag.to_string());
        flags.push(value);
    };
    let on = var("USE_PROMETHEUS").unwrap_or("false".into());
    if !boolean("USE_PROMETHEUS", &on)? {
        push("--metrics-listen", http);
        for name in ["PROMETHEUS_MAPPER_YAML", "PROMETHEUS_PATH"] {
            if var(name).is_some() {
                warnings.push(format!(
                    "{name} is accepted and not used: as upstream, it applies only with \
                     USE_PROMETHEUS=true"
                ));
            }
        }
        return Ok(());
    }
    let prometheus = var("PROMETHEUS_ADDR").unwrap_or(":9090".into());
    let (host, port) = prometheus
        .rsplit_once(':')
        .ok_or_else(|| format!("PROMETHEUS_ADDR={prometheus:?}: not host:port"))?;
    push("--metrics-listen", address("PROMETHEUS_ADDR", host, port)?);
    push("--health-listen", http);
    let mapping = match var("PROMETHEUS_MAPPER_YAML").filter(|p| !p.is_empty()) {
        // A file named like the built-in mapping is still a file.
        Some(path) if path == "ratelimit" => "./ratelimit".to_string(),
        Some(path) => path,
        None => "ratelimit".to_string(),
    };
    push("--ratelimit-stats-mapping", mapping);
    // Upstream serves its metrics at PROMETHEUS_PATH ("/metrics" when empty).
    if let Some(path) = var("PROMETHEUS_PATH").filter(|p| !p.is_empty()) {
        let path = super::serve::parse_metrics_path(&path)
            .map_err(|e| format!("PROMETHEUS_PATH={path:?}: {e}"))?;
        push("--metrics-path", path);
    }
    Ok(())
}
