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

use super::ratelimit_behaviour::{address, answers, behaviour, prometheus};
use super::ratelimit_listeners::{admin_out_of_the_way, connection_age, grpc_tls};
use super::ratelimit_redis::store;
use super::ratelimit_warned::NOT_APPLICABLE;
use super::ratelimit_xds::config_type;

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
    grpc_tls(&var, &mut out.flags, &mut out.warnings)?;
    prometheus(&var, http, &mut out.flags, &mut out.warnings)?;
    connection_age(&var, &mut out.flags)?;
    admin_out_of_the_way(&var, &mut out.flags, &mut out.warnings);
    answers(&var, &mut out.flags)?;
    store(&var, &mut out.flags, &mut out.warnings)?;
    config_type(&var, &mut out.flags, &mut out.warnings)?;
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cli::{Cli, Command, ServeArgs, StoreKind};
    use clap::Parser;
    use std::collections::HashMap;
    use std::path::Path;

    /// The translation of `vars`, whose flags must then parse as `cellrate serve`'s, as the
    /// `ratelimit` personality parses them; flags that do not are an error, as there.
    pub(crate) fn run(vars: &[(&str, &str)]) -> Result<Translated, String> {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let translated = translate(|name| env.get(name).cloned())?;
        parse(&translated.flags)?;
        Ok(translated)
    }

    /// `cellrate serve` with `flags`, through the real flag parser.
    pub(crate) fn parse(flags: &[String]) -> Result<ServeArgs, String> {
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
    pub(crate) fn serve(vars: &[(&str, &str)]) -> ServeArgs {
        parse(&run(vars).unwrap().flags).unwrap()
    }

    pub(crate) fn addr(text: &str) -> std::net::SocketAddr {
        text.parse().unwrap()
    }

    /// Variables: (name, value).
    pub(crate) type Vars<'v> = &'v [(&'v str, &'v str)];

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
            &[memory, ("LIMIT_REQUEST_HEADERS_ENABLED", "true")],
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
}
