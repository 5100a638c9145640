//! `cellrate ratelimit`'s translation of envoyproxy/ratelimit's behaviour and statistics
//! variables (`SHADOW_MODE`, `QUOTA_MODE`, `NEAR_LIMIT_RATIO`, `EXTRA_TAGS`,
//! `MERGE_DOMAIN_CONFIG`, `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, `USE_PROMETHEUS` and
//! its `PROMETHEUS_*`), and of how ShouldRateLimit answers (`RESPONSE_DYNAMIC_METADATA`,
//! `LIMIT_RESPONSE_HEADERS_ENABLED` and its header names,
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`), into `cellrate serve` flags; the booleans and
//! addresses every part reads; the rest is [`super::ratelimit_env`].

/// envoyproxy/ratelimit's booleans (Go's `strconv.ParseBool`).
pub(super) fn boolean(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        other => Err(format!("{name}={other:?}: not a boolean (true or false)")),
    }
}

/// A certificate and its key: both given (not empty), or neither.
pub(super) fn both_or_neither(
    var: &impl Fn(&str) -> Option<String>,
    cert: &str,
    key: &str,
) -> Result<(), String> {
    let given = |name: &str| var(name).is_some_and(|v| !v.is_empty());
    match (given(cert), given(key)) {
        (true, false) => Err(format!("{cert} is set without {key}")),
        (false, true) => Err(format!("{key} is set without {cert}")),
        _ => Ok(()),
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

/// How ShouldRateLimit answers: as envoyproxy/ratelimit answers, unless a `CELLRATE_*`
/// variable opts into cellrate's richer answer (its flag is then left to that variable).
pub(super) fn answers(
    var: &impl Fn(&str) -> Option<String>,
    flags: &mut Vec<String>,
) -> Result<(), String> {
    let flag = |name: &str| boolean(name, &var(name).unwrap_or_else(|| "false".into()));
    let mut unless = |cellrate: &str, flag: &str, value: String| {
        if var(cellrate).is_none() {
            flags.extend([flag.to_string(), value]);
        }
    };
    // Names: the YAML's `name` or empty. Resets: whole seconds. No Retry-After.
    unless(
        "CELLRATE_ENVOY_LIMIT_NAMES",
        "--envoy-limit-names",
        "false".into(),
    );
    unless(
        "CELLRATE_ENVOY_RESETS",
        "--envoy-resets",
        "whole-seconds".into(),
    );
    unless("CELLRATE_RETRY_AFTER", "--retry-after", "false".into());
    let metadata = match flag("RESPONSE_DYNAMIC_METADATA")? {
        true => "ratelimit",
        false => "off",
    };
    unless(
        "CELLRATE_ENVOY_METADATA",
        "--envoy-metadata",
        metadata.into(),
    );
    if flag("LIMIT_RESPONSE_HEADERS_ENABLED")? {
        let mut names = Vec::new();
        for (name, default) in [
            ("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
            ("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
            ("LIMIT_RESET_HEADER", "RateLimit-Reset"),
        ] {
            let value = var(name).unwrap_or_else(|| default.to_string());
            crate::service::envoy::check_header_name(&value).map_err(|e| format!("{name}: {e}"))?;
            names.push(value);
        }
        unless(
            "CELLRATE_RATE_LIMIT_HEADERS",
            "--rate-limit-headers",
            "ratelimit".into(),
        );
        unless(
            "CELLRATE_RATELIMIT_HEADER_NAMES",
            "--ratelimit-header-names",
            names.join(","),
        );
    }
    // envoyproxy/ratelimit's PR #1168 (open when read, at 619b2d3): the same three for
    // the upstream request.
    if flag("LIMIT_REQUEST_HEADERS_ENABLED")? {
        let mut names = Vec::new();
        for (name, default) in [
            ("LIMIT_REQUEST_LIMIT_HEADER", "RateLimit-Limit"),
            ("LIMIT_REQUEST_REMAINING_HEADER", "RateLimit-Remaining"),
            ("LIMIT_REQUEST_RESET_HEADER", "RateLimit-Reset"),
        ] {
            let value = var(name).unwrap_or_else(|| default.to_string());
            crate::service::envoy::check_header_name(&value).map_err(|e| format!("{name}: {e}"))?;
            names.push(value);
        }
        unless(
            "CELLRATE_RATELIMIT_REQUEST_HEADERS",
            "--ratelimit-request-headers",
            names.join(","),
        );
    }
    if flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")? {
        flags.push("--stop-increment-when-over-limit".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::cli::ratelimit_env::tests::{run, serve};
    use crate::service::envoy::{HeaderStyle, MetadataStyle, ResetStyle};

    #[test]
    fn answers_are_envoyproxy_ratelimits_unless_cellrates_are_asked_for() {
        let memory = ("BACKEND_TYPE", "memory");
        let flags = |vars: &[(&str, &str)]| run(vars).unwrap().flags.join(" ");
        let plain = serve(&[memory]).envoy.options();
        assert!(!plain.limit_names);
        assert_eq!(plain.resets, ResetStyle::WholeSeconds);
        assert!(!plain.retry_after);
        assert_eq!(plain.metadata, MetadataStyle::Off);
        assert_eq!(plain.headers, HeaderStyle::Off);
        assert!(!plain.stop_increment_when_over_limit);
        let upstream = serve(&[
            memory,
            ("RESPONSE_DYNAMIC_METADATA", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ])
        .envoy
        .options();
        assert_eq!(upstream.metadata, MetadataStyle::Ratelimit);
        assert_eq!(upstream.headers, HeaderStyle::Ratelimit);
        let names = &upstream.header_names;
        assert_eq!(
            [&names.limit, &names.remaining, &names.reset],
            ["RateLimit-Limit", "X-Left", "RateLimit-Reset"]
        );
        assert!(upstream.stop_increment_when_over_limit);
        // cellrate's answers, opted into: the flags are left to the CELLRATE_ variables.
        let opted = flags(&[
            memory,
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("CELLRATE_RATE_LIMIT_HEADERS", "ietf"),
            ("CELLRATE_ENVOY_LIMIT_NAMES", "true"),
            ("CELLRATE_ENVOY_RESETS", "exact"),
            ("CELLRATE_RETRY_AFTER", "true"),
            ("CELLRATE_ENVOY_METADATA", "cellrate"),
        ]);
        for absent in [
            "--rate-limit-headers",
            "--envoy-limit-names",
            "--envoy-resets",
            "--retry-after",
            "--envoy-metadata",
        ] {
            assert!(!opted.contains(absent), "{absent}: {opted}");
        }
        let bad = run(&[
            memory,
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_RESET_HEADER", "Reset: now"),
        ]);
        assert!(
            bad.as_ref()
                .is_err_and(|e| e.starts_with("LIMIT_RESET_HEADER: \"Reset: now\" is not")),
            "{bad:?}"
        );
        let bad = run(&[memory, ("RESPONSE_DYNAMIC_METADATA", "yes")]);
        assert_eq!(
            bad.map(|t| t.flags),
            Err("RESPONSE_DYNAMIC_METADATA=\"yes\": not a boolean (true or false)".to_string())
        );
    }
}
