//! `cellrate ratelimit` (and the binary run as `/bin/ratelimit`): envoyproxy/ratelimit's
//! environment variables turned into `cellrate serve` flags, so that a deployment of it
//! (Envoy Gateway's among them) can run cellrate by changing the image.
//!
//! Every variable envoyproxy/ratelimit reads is known here: those that apply become flags,
//! those that do not are accepted with one warning each, and a bad value stops startup
//! with an error that names the variable. Defaults are envoyproxy/ratelimit's: gRPC on
//! `0.0.0.0:8081`, HTTP (`/healthcheck`) on `0.0.0.0:8080`, the limits in
//! `/srv/runtime_data/current/config`, the Redis store.

/// Flags for `cellrate serve`, and warnings to log once logging is up.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Translated {
    pub flags: Vec<String>,
    pub warnings: Vec<String>,
    /// `LOG_LEVEL`, as a tracing filter.
    pub log_level: Option<String>,
    /// `LOG_FORMAT=json`.
    pub json_logs: bool,
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`: limits from xDS alone, no directory read (as upstream,
    /// which then reads no file from the runtime directory).
    pub xds_only: bool,
}

use super::ratelimit_behaviour::{address, behaviour, boolean, prometheus};
use super::ratelimit_warned::NOT_APPLICABLE;

/// Translates the environment `var` reads.
pub fn translate(var: impl Fn(&str) -> Option<String>) -> Result<Translated, String> {
    let get = |name: &str, default: &str| var(name).unwrap_or_else(|| default.to_string());
    let mut out = Translated::default();
    let mut push = |flag: &str, value: String| {
        out.flags.push(flag.to_string());
        out.flags.push(value);
    };
    limits_dir(&var, &mut push);
    // Listeners.
    push(
        "--listen",
        address(
            "GRPC_HOST:GRPC_PORT",
            &get("GRPC_HOST", "0.0.0.0"),
            &get("GRPC_PORT", "8081"),
        )?,
    );
    let http = address("HOST:PORT", &get("HOST", "0.0.0.0"), &get("PORT", "8080"))?;
    grpc_tls(&var, &mut out)?;
    prometheus(&var, http, &mut out.flags, &mut out.warnings)?;
    connection_age(&var, &mut out.flags)?;
    admin_out_of_the_way(&var, &mut out);
    answers(&var, &mut out.flags)?;
    store(&var, &mut out)?;
    config_type(&var, &mut out)?;
    out.xds_only = var("CONFIG_TYPE").as_deref() == Some("GRPC_XDS_SOTW");
    behaviour(&var, &mut out.flags)?;
    out.log_level = match var("LOG_LEVEL").map(|l| l.to_ascii_lowercase()) {
        None => None,
        Some(level) if ["trace", "debug", "info", "warn", "error"].contains(&level.as_str()) => {
            Some(level)
        }
        Some(level) if level == "warning" => Some("warn".to_string()),
        Some(other) => {
            return Err(format!(
                "LOG_LEVEL={other:?}: one of debug, info, warn, error"
            ))
        }
    };
    out.json_logs = match get("LOG_FORMAT", "text").as_str() {
        "text" => false,
        "json" => true,
        other => return Err(format!("LOG_FORMAT={other:?}: text or json")),
    };
    // gRPC on this Unix socket instead of GRPC_HOST:GRPC_PORT, as upstream.
    if let Some(path) = var("GRPC_UDS").filter(|p| !p.is_empty()) {
        out.flags.extend(["--grpc-uds".to_string(), path]);
    }
    for (name, why) in NOT_APPLICABLE {
        if var(name).is_some() {
            out.warnings
                .push(format!("{name} is accepted and not used: {why}"));
        }
    }
    Ok(out)
}

/// TLS on the gRPC listener: GRPC_SERVER_USE_TLS with its certificate and key, the client
/// CA (mTLS) and the name a client certificate must bear.
fn grpc_tls(var: &impl Fn(&str) -> Option<String>, out: &mut Translated) -> Result<(), String> {
    let use_tls = var("GRPC_SERVER_USE_TLS").unwrap_or_else(|| "false".to_string());
    if boolean("GRPC_SERVER_USE_TLS", &use_tls)? {
        for (name, flag) in [
            ("GRPC_SERVER_TLS_CERT", "--tls-cert"),
            ("GRPC_SERVER_TLS_KEY", "--tls-key"),
        ] {
            // Empty is missing: an empty flag value would be refused as a usage error.
            let path = var(name)
                .filter(|p| !p.is_empty())
                .ok_or_else(|| format!("{name}: needed with GRPC_SERVER_USE_TLS"))?;
            out.flags.extend([flag.to_string(), path]);
        }
        // mTLS: a client certificate from this CA is required, as there.
        if let Some(ca) = var("GRPC_CLIENT_TLS_CACERT").filter(|ca| !ca.is_empty()) {
            out.flags.extend(["--client-ca".to_string(), ca]);
        }
    }
    // The name a client certificate must bear, checked as there only where client
    // certificates are verified at all (TLS with a client CA).
    if let Some(san) = var("GRPC_CLIENT_TLS_SAN").filter(|san| !san.is_empty()) {
        if out.flags.iter().any(|f| f == "--client-ca") {
            crate::server::tls::client_name(&san)
                .map_err(|e| format!("GRPC_CLIENT_TLS_SAN: {e}"))?;
            out.flags.extend(["--client-san".to_string(), san]);
        } else {
            out.warnings.push(
                "GRPC_CLIENT_TLS_SAN has no effect without GRPC_SERVER_USE_TLS and \
                 GRPC_CLIENT_TLS_CACERT (no client certificate is asked for)"
                    .to_string(),
            );
        }
    }
    Ok(())
}

/// The limits: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, unless they come
/// over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`: then no file is read, as upstream reads none).
fn limits_dir(var: &impl Fn(&str) -> Option<String>, push: &mut impl FnMut(&str, String)) {
    if var("CONFIG_TYPE").as_deref() == Some("GRPC_XDS_SOTW") {
        return;
    }
    let get = |name: &str, default: &str| var(name).unwrap_or_else(|| default.to_string());
    let dir = std::path::Path::new(&get("RUNTIME_ROOT", "/srv/runtime_data/current"))
        .join(get("RUNTIME_SUBDIRECTORY", ""))
        .join(get("RUNTIME_APPDIRECTORY", "config"));
    push("--config", dir.display().to_string());
}

/// When a translated listener takes the port of cellrate's admin listener (`PORT=8082`)
/// and `CELLRATE_ADMIN_LISTEN` does not place it, the admin listener goes to a loopback
/// port the kernel chooses (the startup line's `admin=` says which), so that upstream's
/// ports are served as set. Compared by port alone: 0.0.0.0:8082 takes 127.0.0.1:8082.
fn admin_out_of_the_way(var: &impl Fn(&str) -> Option<String>, out: &mut Translated) {
    if var("CELLRATE_ADMIN_LISTEN").is_some() {
        return;
    }
    let Ok(admin) = super::args::DEFAULT_ADMIN_LISTEN.parse::<std::net::SocketAddr>() else {
        return;
    };
    let listeners = ["--listen", "--metrics-listen", "--health-listen"];
    let taken = out.flags.chunks(2).any(|pair| match pair {
        [flag, addr] if listeners.contains(&flag.as_str()) => addr
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.port() == admin.port()),
        _ => false,
    });
    if taken {
        out.flags.push("--admin-listen".to_string());
        out.flags.push(format!("{}:0", admin.ip()));
        out.warnings.push(format!(
            "port {} is upstream's here, so the admin listener is not on its default {admin}: \
             it is on a loopback port the kernel chooses (admin= in the startup line); set \
             CELLRATE_ADMIN_LISTEN to place it",
            admin.port()
        ));
    }
}

/// How ShouldRateLimit answers: as envoyproxy/ratelimit answers, unless a `CELLRATE_*`
/// variable opts into cellrate's richer answer (its flag is then left to that variable).
fn answers(var: &impl Fn(&str) -> Option<String>, flags: &mut Vec<String>) -> Result<(), String> {
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
    if flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")? {
        flags.push("--stop-increment-when-over-limit".to_string());
    }
    Ok(())
}

/// CONFIG_TYPE: FILE (the directory alone) or GRPC_XDS_SOTW (xDS beside it).
fn config_type(var: &impl Fn(&str) -> Option<String>, out: &mut Translated) -> Result<(), String> {
    match var("CONFIG_TYPE").as_deref().unwrap_or("FILE") {
        "FILE" => {
            if var("FORCE_START_WITHOUT_INITIAL_CONFIG").is_some() {
                out.warnings.push(
                    "FORCE_START_WITHOUT_INITIAL_CONFIG is accepted and not used: only with \
                     CONFIG_TYPE=GRPC_XDS_SOTW"
                        .to_string(),
                );
            }
            Ok(())
        }
        "GRPC_XDS_SOTW" => xds(var, out),
        other => Err(format!("CONFIG_TYPE={other:?}: one of FILE, GRPC_XDS_SOTW")),
    }
}

/// CONFIG_TYPE=GRPC_XDS_SOTW: the CONFIG_GRPC_XDS_* and XDS_CLIENT_* variables.
fn xds(var: &impl Fn(&str) -> Option<String>, out: &mut Translated) -> Result<(), String> {
    let get = |name: &str, default: &str| var(name).unwrap_or_else(|| default.to_string());
    let mut push = |flag: &str, value: String| {
        out.flags.push(flag.to_string());
        out.flags.push(value);
    };
    push(
        "--xds-server",
        get("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
    );
    push("--xds-node-id", get("CONFIG_GRPC_XDS_NODE_ID", "default"));
    // "key1=val1,key2=val2"; an entry without `=` is skipped there, and here with a word.
    for entry in get("CONFIG_GRPC_XDS_NODE_METADATA", "").split(',') {
        match entry.split_once('=') {
            Some((key, _)) if !key.is_empty() => push("--xds-node-metadata", entry.to_string()),
            _ if entry.is_empty() => {}
            _ => out.warnings.push(format!(
                "CONFIG_GRPC_XDS_NODE_METADATA: {entry:?} is not key=value and is skipped, \
                 as envoyproxy/ratelimit skips it"
            )),
        }
    }
    // "name1:value1,name2:value2".
    for entry in get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "").split(',') {
        match entry.split_once(':') {
            Some((name, _)) if !name.trim().is_empty() => {
                // Checked here as the flag checks it, so that a bad one names the variable.
                super::xds_args::parse_header(entry).map_err(|e| {
                    format!("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: {entry:?}: {e}")
                })?;
                push("--xds-header", entry.to_string())
            }
            _ if entry.is_empty() => {}
            _ => {
                return Err(format!(
                    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: {entry:?} is not name:value"
                ))
            }
        }
    }
    let flag = |name: &str| boolean(name, &get(name, "false"));
    if flag("CONFIG_GRPC_XDS_SERVER_USE_TLS")? {
        both_or_neither(
            var,
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        )?;
        out.flags.push("--xds-tls".to_string());
        for (name, flag) in [
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "--xds-ca"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "--xds-client-cert"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "--xds-client-key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "--xds-server-name"),
        ] {
            if let Some(value) = var(name).filter(|v| !v.is_empty()) {
                out.flags.extend([flag.to_string(), value]);
            }
        }
    }
    backoff(var, out)?;
    if let Some(size) = var("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES").filter(|s| !s.is_empty()) {
        match size.parse::<u64>() {
            Ok(n) if (1024..=64 << 20).contains(&n) => out
                .flags
                .extend(["--xds-max-message-bytes".to_string(), size]),
            _ => {
                return Err(format!(
                    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES={size:?}: a number of bytes from 1024 \
                     to 67108864"
                ))
            }
        }
    }
    if flag("FORCE_START_WITHOUT_INITIAL_CONFIG")? {
        out.flags.push("--xds-force-start".to_string());
    }
    Ok(())
}

/// XDS_CLIENT_BACKOFF_INITIAL_INTERVAL and XDS_CLIENT_BACKOFF_MAX_INTERVAL.
fn backoff(var: &impl Fn(&str) -> Option<String>, out: &mut Translated) -> Result<(), String> {
    let mut waits = Vec::new();
    for (name, flag) in [
        (
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            "--xds-backoff-initial",
        ),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "--xds-backoff-max"),
    ] {
        if let Some(value) = var(name) {
            // The flag's own check (10 ms to 1 h), so that a bad one names the variable.
            waits.push(
                super::xds_args::parse_wait(&value)
                    .map_err(|e| format!("{name}={value:?}: {e}"))?,
            );
            out.flags.extend([flag.to_string(), value]);
        }
    }
    if let [initial, max] = waits[..] {
        if initial > max {
            return Err("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL is longer than \
                        XDS_CLIENT_BACKOFF_MAX_INTERVAL"
                .to_string());
        }
    }
    Ok(())
}

/// BACKEND_TYPE and the REDIS_* variables (the MEMCACHE_* ones: `ratelimit_memcache.rs`).
fn store(var: &impl Fn(&str) -> Option<String>, out: &mut Translated) -> Result<(), String> {
    let backend = var("BACKEND_TYPE").unwrap_or_else(|| "redis".to_string());
    let (flags, warnings) = (&mut out.flags, &mut out.warnings);
    super::ratelimit_memcache::memcache(var, boolean, flags, warnings)?;
    match backend.as_str() {
        "redis" => {}
        // cellrate's own: its memory store (one replica); memcache: ratelimit_memcache.rs.
        "memory" | "memcache" => return Ok(()),
        other => {
            return Err(format!(
                "BACKEND_TYPE={other:?}: redis, memcache (or cellrate's memory)"
            ))
        }
    }
    if var("REDIS_SOCKET_TYPE").is_some_and(|t| t != "tcp") {
        return Err("REDIS_SOCKET_TYPE: only tcp is served".to_string());
    }
    let urls = var("REDIS_URL").ok_or("REDIS_URL: needed with BACKEND_TYPE=redis")?;
    let tls = boolean(
        "REDIS_TLS",
        &var("REDIS_TLS").unwrap_or_else(|| "false".into()),
    )?;
    let auth = var("REDIS_AUTH").filter(|a| !a.is_empty());
    if tls {
        redis_tls_files(var, &mut out.flags)?;
    }
    let scheme = if tls { "rediss" } else { "redis" };
    let url = |host: &str| match &auth {
        Some(auth) if auth.contains(':') => format!("{scheme}://{auth}@{host}"),
        Some(password) => format!("{scheme}://:{password}@{host}"),
        None => format!("{scheme}://{host}"),
    };
    // What --redis-url would refuse, said of the variables that made it.
    let checked = |host: &str| {
        let made = url(host);
        match crate::store::redis::url_problem(&made) {
            Some(_) => Err(format!(
                "REDIS_URL (with REDIS_AUTH): {:?} is no host:port",
                crate::text::printable(crate::text::cut_bytes(host, 64))
            )),
            None => Ok(made),
        }
    };
    redis_timeout(var, &mut out.flags)?;
    // Two deployments sharing one Redis keep their buckets apart by it.
    if let Some(prefix) = var("CACHE_KEY_PREFIX").filter(|p| !p.is_empty()) {
        out.flags.extend(["--redis-prefix".to_string(), prefix]);
    }
    out.flags
        .extend(["--store".to_string(), "redis".to_string()]);
    match var("REDIS_TYPE").as_deref().unwrap_or("single") {
        "single" | "SINGLE" => out
            .flags
            .extend(["--redis-url".to_string(), checked(&urls)?]),
        "cluster" | "CLUSTER" => {
            let nodes: Vec<String> = urls
                .split(',')
                .map(|h| checked(h.trim()))
                .collect::<Result<_, _>>()?;
            out.flags
                .extend(["--redis-cluster-nodes".to_string(), nodes.join(",")]);
        }
        "sentinel" | "SENTINEL" => {
            // `<master name>,<sentinel>,...`; REDIS_AUTH logs in to the master,
            // REDIS_SENTINEL_AUTH to the sentinels, REDIS_TLS is for both.
            let mut parts = urls.split(',').map(str::trim);
            let master = parts.next().unwrap_or_default();
            let sentinels: Vec<&str> = parts.collect();
            if master.is_empty() || sentinels.is_empty() || sentinels.contains(&"") {
                return Err("REDIS_URL: with REDIS_TYPE=sentinel, \
                    <master name>,<sentinel host:port>,... (as envoyproxy/ratelimit reads it)"
                    .to_string());
            }
            out.flags.extend([
                "--redis-sentinel".to_string(),
                sentinels.join(","),
                "--redis-sentinel-master".to_string(),
                master.to_string(),
            ]);
            if auth.is_some() || tls {
                // The master's login only: its address comes from the sentinels.
                out.flags
                    .extend(["--redis-url".to_string(), url("sentinel-master")]);
            }
            if let Some(password) = var("REDIS_SENTINEL_AUTH").filter(|a| !a.is_empty()) {
                out.flags
                    .extend(["--redis-sentinel-password".to_string(), password]);
            }
            if tls {
                out.flags.push("--redis-sentinel-tls".to_string());
            }
        }
        other => return Err(format!("REDIS_TYPE={other:?}: single, cluster or sentinel")),
    }
    Ok(())
}

/// GRPC_MAX_CONNECTION_AGE and GRPC_MAX_CONNECTION_AGE_GRACE, Go durations (upstream's
/// defaults 24h and 1h; 0 is Go's infinity: no age, or no hard close).
fn connection_age(
    var: &impl Fn(&str) -> Option<String>,
    flags: &mut Vec<String>,
) -> Result<(), String> {
    let read = |name: &str, default: &str| {
        let text = var(name).unwrap_or_else(|| default.to_string());
        let nanos = match text.as_str() {
            "0" => 0,
            _ => crate::limits::duration::parse_duration(&text)
                .map_err(|e| format!("{name}={text:?}: {e}"))?,
        };
        Ok::<_, String>((text, nanos))
    };
    let (age, age_nanos) = read("GRPC_MAX_CONNECTION_AGE", "24h")?;
    let (grace, grace_nanos) = read("GRPC_MAX_CONNECTION_AGE_GRACE", "1h")?;
    let (ms, year) = (crate::clock::MICROSECOND * 1_000, 365 * crate::clock::DAY);
    if age_nanos != 0 && !(100 * ms..=year).contains(&age_nanos) {
        return Err(format!(
            "GRPC_MAX_CONNECTION_AGE={age:?}: not 0 nor between 100ms and 365d"
        ));
    }
    if grace_nanos > year {
        return Err(format!(
            "GRPC_MAX_CONNECTION_AGE_GRACE={grace:?}: more than 365d"
        ));
    }
    if age_nanos == 0 {
        return Ok(());
    }
    flags.extend(["--grpc-max-connection-age".to_string(), age]);
    if grace_nanos > 0 {
        flags.extend(["--grpc-max-connection-age-grace".to_string(), grace]);
    }
    Ok(())
}

/// REDIS_TIMEOUT, a Go duration (upstream's default 10s), as every Redis call's deadline,
/// unless CELLRATE_REDIS_TIMEOUT_MS names cellrate's own: cellrate's default (10 ms then,
/// 50 ms now) gave spurious UNAVAILABLE answers under load where envoyproxy/ratelimit waits.
fn redis_timeout(
    var: &impl Fn(&str) -> Option<String>,
    flags: &mut Vec<String>,
) -> Result<(), String> {
    if var("CELLRATE_REDIS_TIMEOUT_MS").is_some() {
        return Ok(());
    }
    let text = var("REDIS_TIMEOUT").unwrap_or_else(|| "10s".to_string());
    let nanos = crate::limits::duration::parse_duration(&text)
        .map_err(|e| format!("REDIS_TIMEOUT={text:?}: {e}"))?;
    let ms = nanos / 1_000_000;
    if !(1..=3_600_000).contains(&ms) {
        return Err(format!("REDIS_TIMEOUT={text:?}: not between 1ms and 1h"));
    }
    flags.extend(["--redis-timeout-ms".to_string(), ms.to_string()]);
    Ok(())
}

/// REDIS_TLS_CACERT, REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY (read, as there, only
/// with REDIS_TLS; Envoy Gateway sets the client pair for mutual TLS to Redis).
fn redis_tls_files(
    var: &impl Fn(&str) -> Option<String>,
    flags: &mut Vec<String>,
) -> Result<(), String> {
    both_or_neither(var, "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY")?;
    for (name, flag) in [
        ("REDIS_TLS_CACERT", "--redis-tls-ca"),
        ("REDIS_TLS_CLIENT_CERT", "--redis-tls-client-cert"),
        ("REDIS_TLS_CLIENT_KEY", "--redis-tls-client-key"),
    ] {
        if let Some(path) = var(name).filter(|p| !p.is_empty()) {
            flags.extend([flag.to_string(), path]);
        }
    }
    let skip = var("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION").unwrap_or_else(|| "false".into());
    if boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", &skip)? {
        return Err(
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true: not served; cellrate always \
            checks that Redis's certificate names the host in REDIS_URL (give Redis a \
            certificate for that name)"
                .to_string(),
        );
    }
    Ok(())
}

/// A certificate and its key: both given (not empty), or neither.
fn both_or_neither(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command, ServeArgs, StoreKind};
    use crate::server::connection_age::MaxConnectionAge;
    use crate::service::envoy::{HeaderStyle, MetadataStyle, ResetStyle};
    use clap::Parser;
    use std::collections::HashMap;
    use std::path::Path;
    use std::time::Duration;

    /// The translation of `vars`, whose flags must then parse as `cellrate serve`'s, as the
    /// `ratelimit` personality parses them; flags that do not are an error, as there.
    fn run(vars: &[(&str, &str)]) -> Result<Translated, String> {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let translated = translate(|name| env.get(name).cloned())?;
        parse(&translated.flags)?;
        Ok(translated)
    }

    /// `cellrate serve` with `flags`, through the real flag parser.
    fn parse(flags: &[String]) -> Result<ServeArgs, String> {
        let argv = ["cellrate", "serve"]
            .into_iter()
            .map(String::from)
            .chain(flags.iter().cloned());
        match Cli::try_parse_from(argv) {
            Ok(Cli {
                command: Command::Serve(args),
                ..
            }) => Ok(*args),
            Ok(other) => Err(format!("not serve: {:?}", other.command)),
            Err(e) => Err(format!("the environment's flags: {e}")),
        }
    }

    /// What `cellrate ratelimit` serves with in the environment `vars`: the settings, not
    /// the flags' text, so that a flag renamed on one side fails here.
    fn serve(vars: &[(&str, &str)]) -> ServeArgs {
        parse(&run(vars).unwrap().flags).unwrap()
    }

    fn addr(text: &str) -> std::net::SocketAddr {
        text.parse().unwrap()
    }

    /// Variables: (name, value).
    type Vars<'v> = &'v [(&'v str, &'v str)];

    /// Every variable envoyproxy/ratelimit reads (`tests/data/ratelimit-variables.txt`,
    /// from its settings.go) changes what the translation gives, in at least one setting:
    /// it is honoured, refused, or warned about; none is ignored in silence. A variable
    /// upstream adds fails here until it is classified.
    #[test]
    fn every_upstream_variable_is_honoured_refused_or_warned_about() {
        let listed = include_str!("../../tests/data/ratelimit-variables.txt");
        let names: Vec<&str> = listed
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert!(names.len() > 100, "the list was read: {}", names.len());
        let memory = ("BACKEND_TYPE", "memory");
        let settings: &[Vars] = &[
            &[memory],
            &[("REDIS_URL", "r:1")],
            &[("REDIS_URL", "r:1"), ("REDIS_TLS", "true")],
            &[("REDIS_URL", "m,s:1"), ("REDIS_TYPE", "sentinel")],
            &[
                memory,
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_URL", "cp:18000"),
            ],
            &[
                memory,
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_URL", "cp:18000"),
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ],
            &[
                memory,
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", "/c.pem"),
                ("GRPC_SERVER_TLS_KEY", "/c.key"),
            ],
            &[memory, ("USE_PROMETHEUS", "true")],
            &[memory, ("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
            &[("BACKEND_TYPE", "memcache"), ("MEMCACHE_HOST_PORT", "m:1")],
        ];
        let mut silent = Vec::new();
        for name in names {
            let matters = settings.iter().any(|base| {
                let mut with = base.to_vec();
                with.push((name, "x-bogus-7"));
                run(base) != run(&with)
            });
            if !matters {
                silent.push(name);
            }
        }
        assert!(silent.is_empty(), "ignored in silence: {silent:?}");
    }

    /// Upstream's connection age (24h, then 1h of grace) by default, as set, or off with 0.
    #[test]
    fn connection_age_and_grace_are_upstreams() {
        let age = |vars: Vars| {
            let args = serve(&[&[("BACKEND_TYPE", "memory")], vars].concat());
            args.server_limits().max_connection_age
        };
        let hours = |h: u64| Duration::from_secs(h * 3_600);
        let set = |a, g| Some(MaxConnectionAge { age: a, grace: g });
        assert_eq!(age(&[]), set(hours(24), Some(hours(1))));
        let custom = [
            ("GRPC_MAX_CONNECTION_AGE", "90s"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "1m30s"),
        ];
        assert_eq!(
            age(&custom),
            set(Duration::from_secs(90), Some(Duration::from_secs(90)))
        );
        assert_eq!(
            age(&[("GRPC_MAX_CONNECTION_AGE_GRACE", "0")]),
            set(hours(24), None)
        );
        assert_eq!(age(&[("GRPC_MAX_CONNECTION_AGE", "0s")]), None);
        for (name, bad) in [
            ("GRPC_MAX_CONNECTION_AGE", "10ms"),
            ("GRPC_MAX_CONNECTION_AGE", "a while"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "-1s"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "400d"),
        ] {
            let e = run(&[("BACKEND_TYPE", "memory"), (name, bad)]).unwrap_err();
            assert!(e.starts_with(&format!("{name}={bad:?}")), "{e}");
        }
    }

    /// GRPC_UDS: the decision listener on that Unix socket; unset or empty: on TCP.
    #[test]
    fn grpc_uds_names_the_decision_listeners_socket() {
        let uds = |vars: Vars| serve(&[&[("BACKEND_TYPE", "memory")], vars].concat()).grpc_uds;
        let path = std::path::PathBuf::from("/run/ratelimit.sock");
        assert_eq!(uds(&[("GRPC_UDS", "/run/ratelimit.sock")]), Some(path));
        assert_eq!(uds(&[("GRPC_UDS", "")]), None);
        assert_eq!(uds(&[]), None);
    }

    #[test]
    fn values_the_flags_would_refuse_are_refused_naming_the_variable() {
        let xds = [("BACKEND_TYPE", "memory"), ("CONFIG_TYPE", "GRPC_XDS_SOTW")];
        let redis = [("REDIS_URL", "r:6379"), ("REDIS_TLS", "true")];
        let cases: &[(Vars, Vars, &str)] = &[
            (
                &[("BACKEND_TYPE", "memory")],
                &[
                    ("GRPC_SERVER_USE_TLS", "true"),
                    ("GRPC_SERVER_TLS_CERT", ""),
                    ("GRPC_SERVER_TLS_KEY", "k"),
                ],
                "GRPC_SERVER_TLS_CERT: needed with GRPC_SERVER_USE_TLS",
            ),
            (&redis, &[("REDIS_TLS_CLIENT_CERT", "c")], "REDIS_TLS_CLIENT_CERT is set without REDIS_TLS_CLIENT_KEY"),
            (
                &xds,
                &[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a:b,bad name:v")],
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: \"bad name:v\": \"bad name\": not a header name",
            ),
            (
                &xds,
                &[("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "0s")],
                "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=\"0s\": 0s: not between 10ms and 1h",
            ),
            (
                &xds,
                &[
                    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s"),
                    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s"),
                ],
                "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL is longer than XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            ),
            (
                &xds,
                &[
                    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "k"),
                ],
                "CONFIG_GRPC_XDS_CLIENT_TLS_KEY is set without CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            ),
        ];
        for (base, bad, expected) in cases {
            let vars: Vec<(&str, &str)> = base.iter().chain(bad.iter()).copied().collect();
            assert_eq!(run(&vars).map(|t| t.flags), Err(expected.to_string()));
        }
    }

    #[test]
    fn envoy_gateways_environment_translates() {
        let vars = [
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("REDIS_URL", "redis.svc:6379"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("USE_STATSD", "false"),
            ("LOG_LEVEL", "INFO"),
        ];
        let t = run(&vars).unwrap();
        let args = serve(&vars);
        assert_eq!(args.config, Path::new("/data/ratelimit/config"));
        assert_eq!(args.listen, addr("0.0.0.0:8081"));
        assert_eq!(args.metrics_listen, addr("0.0.0.0:19001"));
        assert_eq!(args.health_listen, Some(addr("0.0.0.0:8080")));
        assert_eq!(args.store, StoreKind::Redis);
        assert_eq!(
            args.redis.redis_url.as_deref(),
            Some("redis://redis.svc:6379")
        );
        // REDIS_TIMEOUT's default is upstream's 10 s, not cellrate's 10 ms.
        assert_eq!(args.redis.redis_timeout_ms, 10_000);
        assert_eq!(t.log_level.as_deref(), Some("info"));
        assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
        assert!(t.warnings[0].starts_with("USE_STATSD"));
        // Upstream's Prometheus sink names the statistics with its own mapping, unless
        // PROMETHEUS_MAPPER_YAML (Envoy Gateway's) names another.
        assert_eq!(args.ratelimit_stats_mapping.as_deref(), Some("ratelimit"));
        let mapper = ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml");
        let args = serve(&[vars.as_slice(), &[mapper]].concat());
        assert_eq!(args.ratelimit_stats_mapping.as_deref(), Some(mapper.1));
        let file_named_ratelimit = ("PROMETHEUS_MAPPER_YAML", "ratelimit");
        let args = serve(&[vars.as_slice(), &[file_named_ratelimit]].concat());
        assert_eq!(args.ratelimit_stats_mapping.as_deref(), Some("./ratelimit"));
        // PROMETHEUS_PATH moves the metrics, as there; a path no route could take is refused.
        let args = serve(&[vars.as_slice(), &[("PROMETHEUS_PATH", "/stats/prom")]].concat());
        assert_eq!(args.metrics_path, "/stats/prom");
        assert_eq!(serve(&vars).metrics_path, "/metrics");
        for bad in ["metrics", "/a b", "/{id}", "/healthcheck", "/:x"] {
            let error = run(&[vars.as_slice(), &[("PROMETHEUS_PATH", bad)]].concat());
            assert!(error.unwrap_err().starts_with("PROMETHEUS_PATH="), "{bad}");
        }
        // Without USE_PROMETHEUS upstream does not read it: one warning says so.
        let t = run(&[("BACKEND_TYPE", "memory"), mapper]).unwrap();
        assert!(parse(&t.flags).unwrap().ratelimit_stats_mapping.is_none());
        assert!(t
            .warnings
            .iter()
            .any(|w| w.starts_with("PROMETHEUS_MAPPER_YAML")));
    }

    #[test]
    fn bad_values_name_their_variable() {
        for (vars, says) in [
            (vec![("GRPC_PORT", "eighty")], "GRPC_PORT"),
            (vec![("PORT", "70000")], "PORT"),
            (vec![("USE_PROMETHEUS", "yes")], "USE_PROMETHEUS"),
            (vec![("BACKEND_TYPE", "memcached")], "BACKEND_TYPE"),
            (vec![("BACKEND_TYPE", "memcache")], "MEMCACHE_HOST_PORT"),
            (
                vec![
                    ("BACKEND_TYPE", "memcache"),
                    ("MEMCACHE_HOST_PORT", "m:1"),
                    ("MEMCACHE_SRV", "_memcache._tcp.example"),
                ],
                "MEMCACHE_SRV",
            ),
            (
                vec![
                    ("BACKEND_TYPE", "memcache"),
                    ("MEMCACHE_HOST_PORT", "m:1"),
                    ("MEMCACHE_TLS", "true"),
                ],
                "MEMCACHE_TLS",
            ),
            (
                vec![("BACKEND_TYPE", "memory"), ("NEAR_LIMIT_RATIO", "1.5")],
                "NEAR_LIMIT_RATIO",
            ),
            (
                vec![("BACKEND_TYPE", "memory"), ("NEAR_LIMIT_RATIO", "most")],
                "NEAR_LIMIT_RATIO",
            ),
            (
                vec![("BACKEND_TYPE", "memory"), ("EXTRA_TAGS", "env")],
                "EXTRA_TAGS",
            ),
            (
                vec![("BACKEND_TYPE", "memory"), ("EXTRA_TAGS", "a-b:x")],
                "EXTRA_TAGS",
            ),
            (vec![("BACKEND_TYPE", "redis")], "REDIS_URL"),
            (
                vec![("CONFIG_TYPE", "XDS"), ("BACKEND_TYPE", "memory")],
                "CONFIG_TYPE",
            ),
            (
                vec![
                    ("BACKEND_TYPE", "memory"),
                    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "on"),
                ],
                "CONFIG_GRPC_XDS_SERVER_USE_TLS",
            ),
            (
                vec![
                    ("BACKEND_TYPE", "memory"),
                    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60"),
                ],
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            ),
            (
                vec![
                    ("BACKEND_TYPE", "memory"),
                    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "huge"),
                ],
                "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
            ),
            (
                vec![
                    ("BACKEND_TYPE", "memory"),
                    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "token"),
                ],
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            ),
            (
                vec![("LOG_LEVEL", "loud"), ("BACKEND_TYPE", "memory")],
                "LOG_LEVEL",
            ),
            (
                vec![("REDIS_URL", "r:1"), ("REDIS_TYPE", "ring")],
                "REDIS_TYPE",
            ),
            (
                vec![("GRPC_HOST", "not-an-ip"), ("BACKEND_TYPE", "memory")],
                "GRPC_HOST",
            ),
        ] {
            let e = run(&vars).unwrap_err();
            assert!(e.contains(says), "{vars:?}: {e}");
        }
    }

    #[test]
    fn envoy_gateways_xds_environment_translates() {
        // Its deployment's variables, as internal/infrastructure/kubernetes/ratelimit sets them.
        let vars = [
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("BACKEND_TYPE", "memory"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,key1:val1"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-token:abc"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            // Envoy Gateway's name; envoyproxy/ratelimit reads GRPC_CLIENT_TLS_CACERT.
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ];
        let t = run(&vars).unwrap();
        let args = serve(&vars);
        assert_eq!(args.client_ca, None);
        assert_eq!(args.tls_cert.as_deref(), Some(Path::new("/certs/tls.crt")));
        assert_eq!(args.tls_key.as_deref(), Some(Path::new("/certs/tls.key")));
        // Over xDS the runtime directory is not read at all, as upstream reads none.
        assert!(t.xds_only);
        assert!(!t.flags.contains(&"--config".to_string()), "{:?}", t.flags);
        let xds = &args.xds;
        let pair = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        assert_eq!(xds.xds_server.as_deref(), Some("envoy-gateway:18001"));
        assert_eq!(xds.xds_node_id, "envoy-ratelimit");
        assert_eq!(xds.xds_node_metadata, pair("zone", "a"));
        assert_eq!(xds.xds_headers, pair("x-token", "abc"));
        assert!(xds.xds_tls);
        assert_eq!(xds.xds_ca.as_deref(), Some(Path::new("/certs/ca.crt")));
        let cert = xds.xds_client_cert.as_deref();
        assert_eq!(cert, Some(Path::new("/certs/tls.crt")));
        let key = xds.xds_client_key.as_deref();
        assert_eq!(key, Some(Path::new("/certs/tls.key")));
        assert_eq!(xds.xds_backoff_initial, std::time::Duration::from_secs(10));
        assert!(xds.xds_force_start);
        assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
        assert!(t.warnings[0].contains("\"key1:val1\" is not key=value"));
        // envoyproxy/ratelimit's own mTLS variable.
        let args = serve(&[
            ("BACKEND_TYPE", "memory"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "c"),
            ("GRPC_SERVER_TLS_KEY", "k"),
            ("GRPC_CLIENT_TLS_CACERT", "ca"),
        ]);
        assert_eq!(args.tls_cert.as_deref(), Some(Path::new("c")));
        assert_eq!(args.tls_key.as_deref(), Some(Path::new("k")));
        assert_eq!(args.client_ca.as_deref(), Some(Path::new("ca")));
        assert_eq!(args.client_san, None);
        // GRPC_CLIENT_TLS_SAN: checked where client certificates are asked for; an
        // unusable name stops the start; without a client CA, a warning.
        let mtls = [
            ("BACKEND_TYPE", "memory"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "c"),
            ("GRPC_SERVER_TLS_KEY", "k"),
            ("GRPC_CLIENT_TLS_CACERT", "ca"),
            ("GRPC_CLIENT_TLS_SAN", "client.example"),
        ];
        assert_eq!(serve(&mtls).client_san.as_deref(), Some("client.example"));
        let mut bad = mtls.to_vec();
        bad[5].1 = "not a name!";
        let refused = run(&bad).unwrap_err();
        assert!(refused.starts_with("GRPC_CLIENT_TLS_SAN:"), "{refused}");
        let t = run(&[("BACKEND_TYPE", "memory"), ("GRPC_CLIENT_TLS_SAN", "x")]).unwrap();
        assert!(!t.flags.contains(&"--client-san".to_string()));
        assert!(t
            .warnings
            .iter()
            .any(|w| w.starts_with("GRPC_CLIENT_TLS_SAN has no effect")));
        // FILE: no xDS flags, and the force-start variable is only noted.
        let t = run(&[
            ("BACKEND_TYPE", "memory"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ])
        .unwrap();
        assert!(!t.flags.join(" ").contains("--xds"));
        assert!(!t.xds_only && t.flags.contains(&"--config".to_string()));
        let args = serve(&[
            ("BACKEND_TYPE", "memory"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ]);
        assert_eq!(args.xds.xds_server, None);
        assert!(!args.xds.xds_force_start);
        assert!(t.warnings[0].starts_with("FORCE_START_WITHOUT_INITIAL_CONFIG"));
    }

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

    #[test]
    fn redis_auth_tls_and_cluster() {
        let args = serve(&[
            ("REDIS_URL", "a:1, b:2"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_AUTH", "user:secret"),
            ("REDIS_TLS", "true"),
        ]);
        assert_eq!(
            args.redis.redis_cluster_nodes,
            ["rediss://user:secret@a:1", "rediss://user:secret@b:2"]
        );
        let args = serve(&[("REDIS_URL", "a:1"), ("REDIS_AUTH", "pw")]);
        assert_eq!(args.redis.redis_url.as_deref(), Some("redis://:pw@a:1"));
        let sentinel = [
            ("REDIS_URL", "mymaster, s1:26379,s2:26379"),
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_AUTH", "pw"),
            ("REDIS_SENTINEL_AUTH", "spw"),
            ("REDIS_TLS", "true"),
        ];
        let t = run(&sentinel).unwrap();
        let timeout = |extra: &[(&str, &str)]| {
            let mut vars = vec![("REDIS_URL", "a:1")];
            vars.extend_from_slice(extra);
            run(&vars).map(|t| t.flags.join(" "))
        };
        let two_seconds = serve(&[("REDIS_URL", "a:1"), ("REDIS_TIMEOUT", "2s")]);
        assert_eq!(two_seconds.redis.redis_timeout_ms, 2_000);
        let own = timeout(&[("REDIS_TIMEOUT", "2s"), ("CELLRATE_REDIS_TIMEOUT_MS", "50")]);
        assert!(
            !own.unwrap().contains("--redis-timeout-ms"),
            "cellrate's own wins"
        );
        for bad in ["0s", "2h", "ten", "-1s"] {
            let e = timeout(&[("REDIS_TIMEOUT", bad)]).unwrap_err();
            assert!(e.starts_with("REDIS_TIMEOUT="), "{bad}: {e}");
        }
        assert!(t.flags.join(" ").ends_with(
            "--store redis --redis-sentinel s1:26379,s2:26379 --redis-sentinel-master mymaster \
             --redis-url rediss://:pw@sentinel-master --redis-sentinel-password spw \
             --redis-sentinel-tls"
        ));
        let redis = serve(&sentinel).redis;
        assert_eq!(redis.redis_sentinel, ["s1:26379", "s2:26379"]);
        assert_eq!(redis.redis_sentinel_master.as_deref(), Some("mymaster"));
        let url = redis.redis_url.as_deref();
        assert_eq!(url, Some("rediss://:pw@sentinel-master"));
        assert_eq!(redis.redis_sentinel_password.as_deref(), Some("spw"));
        assert!(redis.redis_sentinel_tls);
        for url in ["mymaster", "mymaster,", ",s1:1", "m,s1:1,,s2:2"] {
            let e = run(&[("REDIS_URL", url), ("REDIS_TYPE", "sentinel")]).unwrap_err();
            assert!(
                e.contains("<master name>,<sentinel host:port>"),
                "{url}: {e}"
            );
        }
        let args = serve(&[("BACKEND_TYPE", "memory"), ("USE_PROMETHEUS", "false")]);
        assert_eq!(args.store, StoreKind::Memory);
        assert_eq!(args.metrics_listen, addr("0.0.0.0:8080"));
        assert_eq!(args.health_listen, None);
    }

    #[test]
    fn redis_tls_files_follow_redis_tls() {
        // Envoy Gateway's mutual TLS to Redis.
        let gateway = [
            ("REDIS_URL", "redis.svc:6379"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
            ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
        ];
        let redis = serve(&gateway).redis;
        let cert = redis.redis_tls_client_cert.as_deref();
        assert_eq!(cert, Some(Path::new("/redis-certs/tls.crt")));
        let key = redis.redis_tls_client_key.as_deref();
        assert_eq!(key, Some(Path::new("/redis-certs/tls.key")));
        let url = redis.redis_url.as_deref();
        assert_eq!(url, Some("rediss://redis.svc:6379"));
        let mut with_ca = gateway.to_vec();
        with_ca.push(("REDIS_TLS_CACERT", "/ca.pem"));
        let ca = serve(&with_ca).redis.redis_tls_ca;
        assert_eq!(ca.as_deref(), Some(Path::new("/ca.pem")));
        // As there, the files mean nothing without REDIS_TLS.
        let mut plain = with_ca.clone();
        plain.retain(|(name, _)| *name != "REDIS_TLS");
        let flags = run(&plain).unwrap().flags.join(" ");
        assert!(!flags.contains("--redis-tls"), "{flags}");
        let redis = serve(&plain).redis;
        assert_eq!(redis.redis_tls_ca, None);
        assert_eq!(redis.redis_tls_client_cert, None);
        assert_eq!(redis.redis_url.as_deref(), Some("redis://redis.svc:6379"));
        // Skipping the name check is refused, not silently stricter.
        let mut skip = gateway.to_vec();
        skip.push(("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"));
        let e = run(&skip).unwrap_err();
        assert!(
            e.contains("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true"),
            "{e}"
        );
        skip.pop();
        skip.push(("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "maybe"));
        assert!(run(&skip).unwrap_err().contains("not a boolean"));
    }

    #[test]
    fn a_listener_on_the_admin_port_moves_the_admin_listener_to_a_kernel_port() {
        let admin = |vars: &[(&str, &str)]| {
            let t = run(&[&[("BACKEND_TYPE", "memory")], vars].concat()).unwrap();
            let moved = t
                .warnings
                .iter()
                .any(|w| w.contains("CELLRATE_ADMIN_LISTEN"));
            (
                serve(&[&[("BACKEND_TYPE", "memory")], vars].concat()).admin_listen,
                moved,
            )
        };
        let default = addr(crate::cli::args::DEFAULT_ADMIN_LISTEN);
        assert_eq!(admin(&[]), (default, false));
        assert_eq!(admin(&[("PORT", "8083")]), (default, false));
        for taken in [
            &[("PORT", "8082")][..],
            &[("HOST", "127.0.0.1"), ("PORT", "8082")],
            &[("GRPC_PORT", "8082")],
            &[("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", ":8082")],
        ] {
            assert_eq!(admin(taken), (addr("127.0.0.1:0"), true), "{taken:?}");
        }
        // The operator's own choice stands (clap reads it from the environment).
        let placed = run(&[
            ("BACKEND_TYPE", "memory"),
            ("PORT", "8082"),
            ("CELLRATE_ADMIN_LISTEN", "127.0.0.1:9999"),
        ])
        .unwrap();
        assert!(!placed.flags.contains(&"--admin-listen".to_string()));
    }
}
