//! `BACKEND_TYPE=memcache` and the MEMCACHE_* variables of envoyproxy/ratelimit, turned
//! into `--store memcache` and its flags (see [`super::ratelimit_env`]).

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
/// `boolean` reads a boolean as upstream does; `flags` and `warnings` are the translation's.
pub(super) fn memcache(
    var: &impl Fn(&str) -> Option<String>,
    boolean: impl Fn(&str, &str) -> Result<bool, String>,
    flags: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    if var("BACKEND_TYPE").as_deref() != Some("memcache") {
        unused(var, warnings);
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
    if boolean("MEMCACHE_TLS", &tls)? {
        return Err(
            "MEMCACHE_TLS=true: TLS to memcached is not supported (use a private network)"
                .to_string(),
        );
    }
    for name in &MEMCACHE_VARIABLES[4..] {
        if var(name).is_some() {
            warnings.push(format!(
                "{name} is accepted and not used: MEMCACHE_TLS is false"
            ));
        }
    }
    if var("MEMCACHE_SRV_REFRESH").is_some() {
        warnings.push(
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
    let mut given = vec![
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
        given.push(("--memcache-prefix", prefix));
    }
    for (flag, value) in given {
        flags.extend([flag.to_string(), value]);
    }
    Ok(())
}

/// One warning for each memcache variable set while the backend is not memcache (and for
/// EXPIRATION_JITTER_MAX_SECONDS, which only memcached's expiry uses here).
fn unused(var: &impl Fn(&str) -> Option<String>, warnings: &mut Vec<String>) {
    for name in MEMCACHE_VARIABLES {
        if var(name).is_some() {
            warnings.push(format!(
                "{name} is accepted and not used: BACKEND_TYPE is not memcache"
            ));
        }
    }
    if var("EXPIRATION_JITTER_MAX_SECONDS").is_some() {
        warnings.push(
            "EXPIRATION_JITTER_MAX_SECONDS is accepted and not used: cellrate's Redis and \
                 memory keys expire exactly when their bucket is full (it applies to \
                 BACKEND_TYPE=memcache)"
                .to_string(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(vars: &[(&str, &str)]) -> Result<(Vec<String>, Vec<String>), String> {
        let var = |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        };
        let boolean = |name: &str, v: &str| match v {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(format!("{name}: not a boolean")),
        };
        let (mut flags, mut warnings) = (Vec::new(), Vec::new());
        memcache(&var, boolean, &mut flags, &mut warnings).map(|()| (flags, warnings))
    }

    #[test]
    fn memcache_variables_become_the_stores_flags() {
        let (flags, warnings) = run(&[
            ("BACKEND_TYPE", "memcache"),
            ("MEMCACHE_HOST_PORT", "m1:11211, m2:11211"),
            ("MEMCACHE_MAX_IDLE_CONNS", "1000"),
            ("CACHE_KEY_PREFIX", "prefix:"),
            ("MEMCACHE_TLS_CACERT", "/ca.pem"),
        ])
        .unwrap();
        let want = "--store memcache --memcache m1:11211,m2:11211 --memcache-max-idle-conns 128 \
                    --memcache-timeout-ms 500 --memcache-expiration-jitter-max-seconds 300 \
                    --memcache-prefix prefix:";
        assert_eq!(flags.join(" "), want);
        assert_eq!(
            warnings,
            ["MEMCACHE_TLS_CACERT is accepted and not used: MEMCACHE_TLS is false"]
        );
        // MEMCACHE_MAX_IDLE_CONNS unset is upstream's default, 2 (its
        // TestConfigMemcacheWithMaxIdleConns asserts it of its settings).
        let (flags, _) =
            run(&[("BACKEND_TYPE", "memcache"), ("MEMCACHE_HOST_PORT", "m:1")]).unwrap();
        let idle = flags.iter().position(|f| f == "--memcache-max-idle-conns");
        assert_eq!(idle.map(|at| flags[at + 1].as_str()), Some("2"));
        let (_, warnings) =
            run(&[("BACKEND_TYPE", "redis"), ("MEMCACHE_HOST_PORT", "m:1")]).unwrap();
        assert_eq!(
            warnings,
            ["MEMCACHE_HOST_PORT is accepted and not used: BACKEND_TYPE is not memcache"]
        );
        for (vars, named) in [
            (&[][..], "MEMCACHE_HOST_PORT"),
            (&[("MEMCACHE_HOST_PORT", "m")][..], "MEMCACHE_HOST_PORT"),
            (
                &[("MEMCACHE_HOST_PORT", "m:1"), ("MEMCACHE_SRV", "_m._tcp")][..],
                "MEMCACHE_SRV",
            ),
            (
                &[("MEMCACHE_HOST_PORT", "m:1"), ("MEMCACHE_TLS", "true")][..],
                "MEMCACHE_TLS",
            ),
            (
                &[("MEMCACHE_HOST_PORT", "m:1"), ("CACHE_KEY_PREFIX", "a b")][..],
                "CACHE_KEY_PREFIX",
            ),
            (
                &[
                    ("MEMCACHE_HOST_PORT", "m:1"),
                    ("EXPIRATION_JITTER_MAX_SECONDS", "-1"),
                ][..],
                "EXPIRATION_JITTER_MAX_SECONDS",
            ),
        ] {
            let vars = [&[("BACKEND_TYPE", "memcache")], vars].concat();
            let e = run(&vars).unwrap_err();
            assert!(e.starts_with(named), "{vars:?}: {e}");
        }
    }
}
