//! `cellrate ratelimit`'s listener variables: TLS on the gRPC listener (`GRPC_SERVER_USE_TLS`,
//! its certificate and key, `GRPC_CLIENT_TLS_CACERT` and `GRPC_CLIENT_TLS_SAN`), the
//! connection age (`GRPC_MAX_CONNECTION_AGE[_GRACE]`), and cellrate's admin listener moved
//! out of the way of a translated one; the rest is [`super::ratelimit_env`].

use super::ratelimit_behaviour::boolean;

/// TLS on the gRPC listener: GRPC_SERVER_USE_TLS with its certificate and key, the client
/// CA (mTLS) and the name a client certificate must bear.
pub(super) fn grpc_tls(
    var: &impl Fn(&str) -> Option<String>,
    flags: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
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
            flags.extend([flag.to_string(), path]);
        }
        // mTLS: a client certificate from this CA is required, as there.
        if let Some(ca) = var("GRPC_CLIENT_TLS_CACERT").filter(|ca| !ca.is_empty()) {
            flags.extend(["--client-ca".to_string(), ca]);
        }
    }
    // The name a client certificate must bear, checked as there only where client
    // certificates are verified at all (TLS with a client CA).
    if let Some(san) = var("GRPC_CLIENT_TLS_SAN").filter(|san| !san.is_empty()) {
        if flags.iter().any(|f| f == "--client-ca") {
            crate::server::tls::client_name(&san)
                .map_err(|e| format!("GRPC_CLIENT_TLS_SAN: {e}"))?;
            flags.extend(["--client-san".to_string(), san]);
        } else {
            warnings.push(
                "GRPC_CLIENT_TLS_SAN has no effect without GRPC_SERVER_USE_TLS and \
                 GRPC_CLIENT_TLS_CACERT (no client certificate is asked for)"
                    .to_string(),
            );
        }
    }
    Ok(())
}

/// When a translated listener takes the port of cellrate's admin listener (`PORT=8082`)
/// and `CELLRATE_ADMIN_LISTEN` does not place it, the admin listener goes to a loopback
/// port the kernel chooses (the startup line's `admin=` says which), so that upstream's
/// ports are served as set. Compared by port alone: 0.0.0.0:8082 takes 127.0.0.1:8082.
pub(super) fn admin_out_of_the_way(
    var: &impl Fn(&str) -> Option<String>,
    flags: &mut Vec<String>,
    warnings: &mut Vec<String>,
) {
    if var("CELLRATE_ADMIN_LISTEN").is_some() {
        return;
    }
    let Ok(admin) = super::args::DEFAULT_ADMIN_LISTEN.parse::<std::net::SocketAddr>() else {
        return;
    };
    let listeners = ["--listen", "--metrics-listen", "--health-listen"];
    let taken = flags.chunks(2).any(|pair| match pair {
        [flag, addr] if listeners.contains(&flag.as_str()) => addr
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.port() == admin.port()),
        _ => false,
    });
    if taken {
        flags.push("--admin-listen".to_string());
        flags.push(format!("{}:0", admin.ip()));
        warnings.push(format!(
            "port {} is upstream's here, so the admin listener is not on its default {admin}: \
             it is on a loopback port the kernel chooses (admin= in the startup line); set \
             CELLRATE_ADMIN_LISTEN to place it",
            admin.port()
        ));
    }
}

/// GRPC_MAX_CONNECTION_AGE and GRPC_MAX_CONNECTION_AGE_GRACE, Go durations (upstream's
/// defaults 24h and 1h; 0 is Go's infinity: no age, or no hard close).
pub(super) fn connection_age(
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

#[cfg(test)]
mod tests {
    use crate::cli::ratelimit_env::tests::{addr, run, serve, Vars};
    use crate::server::connection_age::MaxConnectionAge;
    use std::path::Path;
    use std::time::Duration;

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

    /// TLS on the gRPC listener by envoyproxy/ratelimit's own variables: the client CA
    /// (mTLS), and the name a client certificate must bear where one is asked for.
    #[test]
    fn grpc_server_tls_its_client_ca_and_the_clients_name() {
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
