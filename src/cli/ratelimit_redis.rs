//! `BACKEND_TYPE` and the REDIS_* variables of envoyproxy/ratelimit, turned into
//! `--store redis` and its flags (the MEMCACHE_* ones: `ratelimit_memcache.rs`; see
//! [`super::ratelimit_env`]).

use super::ratelimit_behaviour::{boolean, both_or_neither};

/// REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR (envoyproxy/ratelimit's PR #1191, open when
/// read, at e5e39dd): a READONLY answer drops the connection. Taken for sentinel and
/// cluster too, where the master (the cluster's nodes) is followed anyway.
fn reconnect_on_readonly(
    var: &impl Fn(&str) -> Option<String>,
    flags: &mut Vec<String>,
) -> Result<(), String> {
    let readonly = var("REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR");
    if boolean(
        "REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR",
        readonly.as_deref().unwrap_or("false"),
    )? {
        flags.push("--redis-reconnect-on-readonly".to_string());
    }
    Ok(())
}

/// BACKEND_TYPE and the REDIS_* variables (the MEMCACHE_* ones: `ratelimit_memcache.rs`).
pub(super) fn store(
    var: &impl Fn(&str) -> Option<String>,
    flags: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let backend = var("BACKEND_TYPE").unwrap_or_else(|| "redis".to_string());
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
        redis_tls_files(var, flags)?;
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
    redis_timeout(var, flags)?;
    // Two deployments sharing one Redis keep their buckets apart by it.
    if let Some(prefix) = var("CACHE_KEY_PREFIX").filter(|p| !p.is_empty()) {
        flags.extend(["--redis-prefix".to_string(), prefix]);
    }
    flags.extend(["--store".to_string(), "redis".to_string()]);
    reconnect_on_readonly(var, flags)?;
    match var("REDIS_TYPE").as_deref().unwrap_or("single") {
        "single" | "SINGLE" => flags.extend(["--redis-url".to_string(), checked(&urls)?]),
        "cluster" | "CLUSTER" => {
            let nodes: Vec<String> = urls
                .split(',')
                .map(|h| checked(h.trim()))
                .collect::<Result<_, _>>()?;
            flags.extend(["--redis-cluster-nodes".to_string(), nodes.join(",")]);
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
            flags.extend([
                "--redis-sentinel".to_string(),
                sentinels.join(","),
                "--redis-sentinel-master".to_string(),
                master.to_string(),
            ]);
            if auth.is_some() || tls {
                // The master's login only: its address comes from the sentinels.
                flags.extend(["--redis-url".to_string(), url("sentinel-master")]);
            }
            if let Some(password) = var("REDIS_SENTINEL_AUTH").filter(|a| !a.is_empty()) {
                flags.extend(["--redis-sentinel-password".to_string(), password]);
            }
            if tls {
                flags.push("--redis-sentinel-tls".to_string());
            }
        }
        other => return Err(format!("REDIS_TYPE={other:?}: single, cluster or sentinel")),
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

#[cfg(test)]
mod tests {
    use crate::cli::ratelimit_env::tests::{addr, run, serve};
    use crate::cli::StoreKind;
    use std::path::Path;

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
}
