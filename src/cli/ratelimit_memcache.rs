//! `BACKEND_TYPE=memcache` and the MEMCACHE_* variables of envoyproxy/ratelimit, turned
//! into `--store memcache` and its flags (see [`super::ratelimit_env`]).

use super::ratelimit_env::Translated;

/// The memcache variables, and what each means when the backend is not memcache.
const MEMCACHE_VARIABLES: &[&str] = &[
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
];

/// gomemcache's own deadline (its DefaultTimeout): envoyproxy/ratelimit sets no other.
const UPSTREAM_TIMEOUT_MS: &str = "500";

/// EXPIRATION_JITTER_MAX_SECONDS's default there.
const UPSTREAM_JITTER_SECONDS: &str = "300";

/// With `BACKEND_TYPE=memcache`, the store's flags; otherwise one warning for each memcache
/// variable set (and for EXPIRATION_JITTER_MAX_SECONDS, which only memcached's expiry uses
/// here).
pub(super) fn memcache(
    var: &impl Fn(&str) -> Option<String>,
    out: &mut Translated,
) -> Result<(), String> {
    if var("BACKEND_TYPE").as_deref() != Some("memcache") {
        for name in MEMCACHE_VARIABLES {
            if var(name).is_some() {
                out.warnings.push(format!(
                    "{name} is accepted and not used: BACKEND_TYPE is not memcache"
                ));
            }
        }
        if var("EXPIRATION_JITTER_MAX_SECONDS").is_some() {
            out.warnings.push(
                "EXPIRATION_JITTER_MAX_SECONDS is accepted and not used: cellrate's Redis and \
                 memory keys expire exactly when their bucket is full (it applies to \
                 BACKEND_TYPE=memcache)"
                    .to_string(),
            );
        }
        return Ok(());
    }
    if var("MEMCACHE_SRV").is_some_and(|s| !s.is_empty()) {
        return Err(
            "MEMCACHE_SRV: DNS SRV discovery of memcached is not supported (list the \
                    servers in MEMCACHE_HOST_PORT)"
                .to_string(),
        );
    }
    let tls = var("MEMCACHE_TLS").unwrap_or_else(|| "false".into());
    if super::ratelimit_env::boolean("MEMCACHE_TLS", &tls)? {
        return Err(
            "MEMCACHE_TLS=true: TLS to memcached is not supported (use a private network)"
                .to_string(),
        );
    }
    for name in &MEMCACHE_VARIABLES[4..] {
        if var(name).is_some() {
            out.warnings.push(format!(
                "{name} is accepted and not used: MEMCACHE_TLS is false"
            ));
        }
    }
    if var("MEMCACHE_SRV_REFRESH").is_some() {
        out.warnings.push(
            "MEMCACHE_SRV_REFRESH is accepted and not used: the servers are MEMCACHE_HOST_PORT's"
                .to_string(),
        );
    }
    let hosts = var("MEMCACHE_HOST_PORT").unwrap_or_default();
    // As envconfig splits a list: on commas.
    let servers: Vec<&str> = hosts.split(',').map(str::trim).collect();
    for server in &servers {
        let port = server.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
        if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
            return Err(format!(
                "MEMCACHE_HOST_PORT: {:?} is no host:port (needed with BACKEND_TYPE=memcache)",
                crate::text::printable(crate::text::cut_bytes(server, 64))
            ));
        }
    }
    let idle = var("MEMCACHE_MAX_IDLE_CONNS").unwrap_or_else(|| "2".into());
    let idle: u64 = idle
        .trim()
        .parse()
        .map_err(|_| format!("MEMCACHE_MAX_IDLE_CONNS={idle:?}: not a number"))?;
    let jitter =
        var("EXPIRATION_JITTER_MAX_SECONDS").unwrap_or_else(|| UPSTREAM_JITTER_SECONDS.into());
    let jitter: u64 = jitter
        .trim()
        .parse()
        .ok()
        .filter(|&j| j <= 86_400)
        .ok_or_else(|| format!("EXPIRATION_JITTER_MAX_SECONDS={jitter:?}: 0 to 86400 seconds"))?;
    let mut flags = vec![
        ("--store", "memcache".to_string()),
        ("--memcache", servers.join(",")),
        ("--memcache-max-idle-conns", idle.min(128).to_string()),
        ("--memcache-timeout-ms", UPSTREAM_TIMEOUT_MS.to_string()),
        (
            "--memcache-expiration-jitter-max-seconds",
            jitter.to_string(),
        ),
    ];
    if let Some(prefix) = var("CACHE_KEY_PREFIX").filter(|p| !p.is_empty()) {
        if !crate::store::memcache::legal_key(&prefix) {
            return Err(
                "CACHE_KEY_PREFIX: at most 250 bytes, no space or control character (a \
                 memcached key)"
                    .to_string(),
            );
        }
        flags.push(("--memcache-prefix", prefix));
    }
    for (flag, value) in flags {
        out.flags.extend([flag.to_string(), value]);
    }
    Ok(())
}
