//! `CONFIG_TYPE` of envoyproxy/ratelimit and, with `GRPC_XDS_SOTW`, its `CONFIG_GRPC_XDS_*`
//! and `XDS_CLIENT_*` variables, turned into `--xds-*` flags (see [`super::ratelimit_env`]).

use super::ratelimit_behaviour::{boolean, both_or_neither};

/// CONFIG_TYPE: FILE (the directory alone) or GRPC_XDS_SOTW (xDS beside it).
pub(super) fn config_type(
    var: &impl Fn(&str) -> Option<String>,
    flags: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    match var("CONFIG_TYPE").as_deref().unwrap_or("FILE") {
        "FILE" => {
            if var("FORCE_START_WITHOUT_INITIAL_CONFIG").is_some() {
                warnings.push(
                    "FORCE_START_WITHOUT_INITIAL_CONFIG is accepted and not used: only with \
                     CONFIG_TYPE=GRPC_XDS_SOTW"
                        .to_string(),
                );
            }
            Ok(())
        }
        "GRPC_XDS_SOTW" => xds(var, flags, warnings),
        other => Err(format!("CONFIG_TYPE={other:?}: one of FILE, GRPC_XDS_SOTW")),
    }
}

/// CONFIG_TYPE=GRPC_XDS_SOTW: the CONFIG_GRPC_XDS_* and XDS_CLIENT_* variables.
fn xds(
    var: &impl Fn(&str) -> Option<String>,
    flags: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let get = |name: &str, default: &str| var(name).unwrap_or_else(|| default.to_string());
    let mut push = |flag: &str, value: String| {
        flags.push(flag.to_string());
        flags.push(value);
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
            _ => warnings.push(format!(
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
        flags.push("--xds-tls".to_string());
        for (name, flag) in [
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "--xds-ca"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "--xds-client-cert"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "--xds-client-key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "--xds-server-name"),
        ] {
            if let Some(value) = var(name).filter(|v| !v.is_empty()) {
                flags.extend([flag.to_string(), value]);
            }
        }
    }
    backoff(var, flags)?;
    if let Some(size) = var("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES").filter(|s| !s.is_empty()) {
        match size.parse::<u64>() {
            Ok(n) if (1024..=64 << 20).contains(&n) => {
                flags.extend(["--xds-max-message-bytes".to_string(), size])
            }
            _ => {
                return Err(format!(
                    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES={size:?}: a number of bytes from 1024 \
                     to 67108864"
                ))
            }
        }
    }
    if flag("FORCE_START_WITHOUT_INITIAL_CONFIG")? {
        flags.push("--xds-force-start".to_string());
    }
    Ok(())
}

/// XDS_CLIENT_BACKOFF_INITIAL_INTERVAL and XDS_CLIENT_BACKOFF_MAX_INTERVAL.
fn backoff(var: &impl Fn(&str) -> Option<String>, flags: &mut Vec<String>) -> Result<(), String> {
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
            flags.extend([flag.to_string(), value]);
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

#[cfg(test)]
mod tests {
    use crate::cli::ratelimit_env::tests::{run, serve};
    use std::path::Path;

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
}
