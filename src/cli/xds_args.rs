//! `cellrate serve`'s xDS flags: limits from a control plane (envoyproxy/ratelimit's
//! `CONFIG_TYPE=GRPC_XDS_SOTW`, what Envoy Gateway deploys), and what they mean for the
//! server.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::server::xds::{XdsSettings, XdsTls};

#[derive(Debug, Clone, clap::Args)]
pub struct XdsArgs {
    /// Subscribe to envoyproxy/ratelimit's RateLimitConfig resources over ADS (state of
    /// the world) from this control plane, host:port or URL; they apply beside the limits
    /// directory's files (which may then be missing).
    #[arg(long, env = "CELLRATE_XDS_SERVER")]
    pub xds_server: Option<String>,

    /// The node id the control plane serves (Envoy Gateway: envoy-ratelimit).
    #[arg(long, env = "CELLRATE_XDS_NODE_ID", default_value = "default")]
    pub xds_node_id: String,

    /// Node metadata KEY=VALUE sent to the control plane (repeatable).
    #[arg(long = "xds-node-metadata", value_name = "KEY=VALUE", value_parser = parse_pair::<'='>)]
    pub xds_node_metadata: Vec<(String, String)>,

    /// A header NAME:VALUE on the xDS stream, e.g. a token (repeatable).
    #[arg(long = "xds-header", value_name = "NAME:VALUE", value_parser = parse_header)]
    pub xds_headers: Vec<(String, String)>,

    /// TLS to the control plane (with --xds-ca, else the Mozilla roots).
    #[arg(long, env = "CELLRATE_XDS_TLS")]
    pub xds_tls: bool,

    /// CA certificate(s) (PEM) the control plane's certificate must chain to.
    #[arg(long, env = "CELLRATE_XDS_CA", requires = "xds_tls")]
    pub xds_ca: Option<PathBuf>,

    /// Client certificate (PEM) for mTLS to the control plane; needs --xds-client-key.
    #[arg(long, env = "CELLRATE_XDS_CLIENT_CERT", requires_all = ["xds_client_key", "xds_tls"])]
    pub xds_client_cert: Option<PathBuf>,

    /// Client private key (PEM); needs --xds-client-cert.
    #[arg(long, env = "CELLRATE_XDS_CLIENT_KEY", requires = "xds_client_cert")]
    pub xds_client_key: Option<PathBuf>,

    /// The name the control plane's certificate must carry, if not the server's host.
    #[arg(long, env = "CELLRATE_XDS_SERVER_NAME", requires = "xds_tls")]
    pub xds_server_name: Option<String>,

    /// Largest xDS message accepted, in bytes (1 KiB to 64 MiB); a larger one ends the
    /// stream, which is opened again.
    #[arg(long, env = "CELLRATE_XDS_MAX_MESSAGE_BYTES", default_value_t = crate::server::xds::DEFAULT_MAX_MESSAGE_BYTES as u64, value_parser = clap::value_parser!(u64).range(1024..=64 * 1024 * 1024))]
    pub xds_max_message_bytes: u64,

    /// First wait before opening a failed xDS stream again; each failure doubles it.
    #[arg(long, env = "CELLRATE_XDS_BACKOFF_INITIAL", default_value = "1s", value_parser = parse_wait)]
    pub xds_backoff_initial: Duration,

    /// Longest wait before opening a failed xDS stream again.
    #[arg(long, env = "CELLRATE_XDS_BACKOFF_MAX", default_value = "60s", value_parser = parse_wait)]
    pub xds_backoff_max: Duration,

    /// Serve before the first xDS update arrives (else the gRPC listeners wait for it).
    #[arg(long, env = "CELLRATE_XDS_FORCE_START")]
    pub xds_force_start: bool,
}

/// `KEY<sep>VALUE`, the key not empty.
fn parse_pair<const SEP: char>(text: &str) -> Result<(String, String), String> {
    match text.split_once(SEP) {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?}: not KEY{SEP}VALUE")),
    }
}

/// `NAME:VALUE`, both valid in a gRPC header.
pub(super) fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = parse_pair::<':'>(text)?;
    let name = name.trim().to_ascii_lowercase();
    let value = value.trim().to_string();
    tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?}: not a header name"))?;
    if name.ends_with("-bin") {
        return Err(format!("{name:?}: binary headers are not sent"));
    }
    value
        .parse::<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>()
        .map_err(|_| format!("the value of {name:?} is not a header value"))?;
    Ok((name, value))
}

/// A wait: 10ms to 1h.
pub(super) fn parse_wait(text: &str) -> Result<Duration, String> {
    let nanos = crate::limits::duration::parse_duration(text)?;
    let wait = Duration::from_nanos(nanos as u64);
    match (Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&wait) {
        true => Ok(wait),
        false => Err(format!("{text}: not between 10ms and 1h")),
    }
}

fn read(path: &PathBuf, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("{what} {}", path.display()))
}

impl XdsArgs {
    /// The `--xds-header`s (checked when parsed) as the stream's metadata.
    fn headers(&self) -> anyhow::Result<tonic::metadata::MetadataMap> {
        let mut headers = tonic::metadata::MetadataMap::new();
        for (name, value) in &self.xds_headers {
            let key = tonic::metadata::MetadataKey::from_bytes(name.as_bytes())
                .with_context(|| format!("--xds-header {name:?}"))?;
            let value = value
                .parse()
                .with_context(|| format!("--xds-header {name:?}: its value"))?;
            headers.insert(key, value);
        }
        Ok(headers)
    }

    /// The client's settings, its PEM files read; `None` without --xds-server.
    pub fn settings(&self) -> anyhow::Result<Option<XdsSettings>> {
        let Some(server) = &self.xds_server else {
            return Ok(None);
        };
        if self.xds_backoff_initial > self.xds_backoff_max {
            anyhow::bail!("--xds-backoff-initial is longer than --xds-backoff-max");
        }
        let tls = match self.xds_tls {
            false => None,
            true => Some(XdsTls {
                ca: self
                    .xds_ca
                    .as_ref()
                    .map(|p| read(p, "--xds-ca"))
                    .transpose()?,
                identity: match (&self.xds_client_cert, &self.xds_client_key) {
                    (Some(cert), Some(key)) => Some((
                        read(cert, "--xds-client-cert")?,
                        read(key, "--xds-client-key")?,
                    )),
                    _ => None,
                },
                server_name: self.xds_server_name.clone(),
            }),
        };
        let settings = XdsSettings {
            node_id: self.xds_node_id.clone(),
            node_metadata: self.xds_node_metadata.clone(),
            headers: self.headers()?,
            tls,
            max_message_bytes: self.xds_max_message_bytes as usize,
            backoff_initial: self.xds_backoff_initial,
            backoff_max: self.xds_backoff_max,
            force_start: self.xds_force_start,
            ..XdsSettings::new(server.clone())
        };
        // Refused now rather than at every attempt.
        settings.check().map_err(anyhow::Error::msg)?;
        Ok(Some(settings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_headers_and_waits_are_checked() {
        assert_eq!(parse_pair::<'='>("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_pair::<'='>("=x").is_err());
        assert!(parse_pair::<'='>("novalue").is_err());
        assert_eq!(
            parse_header("Authorization: Bearer x"),
            Ok(("authorization".into(), "Bearer x".into()))
        );
        assert!(parse_header("bad name: x").is_err());
        assert!(parse_header("x-data-bin: AAAA").is_err());
        assert!(parse_header("x: line\nbreak").is_err());
        assert_eq!(parse_wait("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_wait("1ms").is_err());
        assert!(parse_wait("2h").is_err());
    }

    #[test]
    fn the_flags_make_the_clients_settings() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            xds: XdsArgs,
        }
        let flags = <Flags as clap::Parser>::try_parse_from([
            "serve",
            "--xds-server",
            "envoy-gateway:18001",
            "--xds-header",
            "Authorization: Bearer t0k",
            "--xds-node-metadata",
            "zone=a",
        ])
        .unwrap();
        let settings = flags.xds.settings().unwrap().unwrap();
        assert_eq!(settings.headers.get("authorization").unwrap(), "Bearer t0k");
        assert_eq!(
            settings.node_metadata,
            [("zone".to_string(), "a".to_string())]
        );
        assert_eq!(settings.max_message_bytes, 4 * 1024 * 1024);
        let none = <Flags as clap::Parser>::try_parse_from(["serve"]).unwrap();
        assert!(none.xds.settings().unwrap().is_none());
    }
}
