//! `cellrate serve`'s Redis flags (standalone, Sentinel or Cluster), and the store settings
//! they describe.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context;

use crate::limits::config::LimitTable;
use crate::store::redis::{
    Coalescing, RedisSettings, RedisTls, SentinelSettings, MAX_TLS_FILE_BYTES, SENTINEL_TLS_REFUSED,
};

/// A Redis TLS file that cannot be read or holds no PEM certificate (or key): a fault of
/// the configuration (exit 78), where the other store settings are of the command line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsFileError(String);

#[derive(Debug, Clone, clap::Args)]
pub struct RedisArgs {
    /// Redis URL: redis://[user:password@]host:port[/db], or rediss:// for TLS.
    #[arg(long, env = "CELLRATE_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,

    /// Redis Cluster seed nodes, comma-separated URLs (instead of --redis-url).
    #[arg(
        long,
        env = "CELLRATE_REDIS_CLUSTER_NODES",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub redis_cluster_nodes: Vec<String>,

    /// Redis behind Sentinel: the sentinels, comma-separated HOST:PORT or URLs
    /// (redis://[user:password@]host:port, rediss://). With it, --redis-url is optional and
    /// only gives the master's login (user, password, db, rediss:// for TLS).
    #[arg(
        long,
        env = "CELLRATE_REDIS_SENTINEL",
        value_delimiter = ',',
        hide_env_values = true,
        requires = "redis_sentinel_master",
        conflicts_with = "redis_cluster_nodes"
    )]
    pub redis_sentinel: Vec<String>,

    /// The master's name in the sentinels' configuration (with --redis-sentinel).
    #[arg(
        long,
        env = "CELLRATE_REDIS_SENTINEL_MASTER",
        requires = "redis_sentinel"
    )]
    pub redis_sentinel_master: Option<String>,

    /// The sentinels' password, for sentinels given without one in their URL.
    #[arg(long, env = "CELLRATE_REDIS_SENTINEL_PASSWORD", hide_env_values = true)]
    pub redis_sentinel_password: Option<String>,

    /// TLS to the sentinels given as HOST:PORT.
    #[arg(long, env = "CELLRATE_REDIS_SENTINEL_TLS")]
    pub redis_sentinel_tls: bool,

    /// TLS to Redis (rediss://): a PEM file of the CA certificates to trust instead of the
    /// Mozilla roots (a private CA). Not with --redis-sentinel.
    #[arg(long, env = "CELLRATE_REDIS_TLS_CA")]
    pub redis_tls_ca: Option<std::path::PathBuf>,

    /// TLS to Redis (rediss://): a client certificate (PEM) for servers that ask for one
    /// (`tls-auth-clients yes`), with --redis-tls-client-key. Not with --redis-sentinel.
    #[arg(
        long,
        env = "CELLRATE_REDIS_TLS_CLIENT_CERT",
        requires = "redis_tls_client_key"
    )]
    pub redis_tls_client_cert: Option<std::path::PathBuf>,

    /// The key (PEM) of --redis-tls-client-cert.
    #[arg(
        long,
        env = "CELLRATE_REDIS_TLS_CLIENT_KEY",
        requires = "redis_tls_client_cert"
    )]
    pub redis_tls_client_key: Option<std::path::PathBuf>,

    /// Prefix of every Redis key.
    #[arg(long, env = "CELLRATE_REDIS_PREFIX", default_value = "cellrate:")]
    pub redis_prefix: String,

    /// Deadline of every Redis call, in milliseconds: keep it below the caller's own
    /// timeout (the Envoy examples' 100 ms), so that the failure policy answers first.
    #[arg(long, env = "CELLRATE_REDIS_TIMEOUT_MS", default_value_t = RedisSettings::default().timeout.as_millis() as u64)]
    pub redis_timeout_ms: u64,

    /// How often each replica looks for changes of the temporary overrides kept in Redis,
    /// in milliseconds (a change made on another replica applies here within this).
    #[arg(long, env = "CELLRATE_REDIS_OVERRIDE_SYNC_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub redis_override_sync_ms: u64,

    /// Whose clock decides: Redis TIME (shared by replicas) or this process's.
    #[arg(
        long,
        env = "CELLRATE_REDIS_CLOCK",
        value_enum,
        default_value = "redis"
    )]
    pub redis_clock: crate::store::redis::RedisClock,

    /// Whether batches are decided by cellrate's module in Redis (CELLRATE.BATCH) or by
    /// the script: auto uses the module when the server has it (asked at start).
    #[arg(
        long,
        env = "CELLRATE_REDIS_MODULE",
        value_enum,
        default_value = "auto"
    )]
    pub redis_module: crate::store::redis::RedisModule,

    /// What requests get while Redis fails.
    #[arg(
        long,
        env = "CELLRATE_REDIS_FAILURE_POLICY",
        value_enum,
        default_value = "unavailable"
    )]
    pub redis_failure_policy: crate::store::redis::FailurePolicy,

    /// With --redis-failure-policy local: divide each limit by this (e.g. the replica count).
    #[arg(long, env = "CELLRATE_REDIS_LOCAL_DIVISOR", default_value_t = 1)]
    pub redis_local_divisor: u64,

    /// Names whose keys are tagged by id so one id's limits share a cluster slot
    /// (comma-separated; * for all).
    #[arg(long, env = "CELLRATE_REDIS_TAG_BY_ID", value_delimiter = ',')]
    pub redis_tag_by_id: Vec<String>,

    /// Entries of the local deny cache (0: off): repeat requests for a bucket Redis just
    /// denied are denied here while the denial is provable, without a round trip.
    #[arg(long, env = "CELLRATE_REDIS_DENY_CACHE", default_value_t = 0)]
    pub redis_deny_cache: usize,

    /// Spend calls in flight at a time per Redis node (per slot in a cluster); requests
    /// that find them taken wait and are coalesced into the next call.
    #[arg(long, env = "CELLRATE_REDIS_CALLS_IN_FLIGHT", default_value_t = Coalescing::DEFAULT.calls_in_flight as u64, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub redis_calls_in_flight: u64,

    /// Items in one coalesced Redis call, at most (a larger single batch still goes alone).
    #[arg(long, env = "CELLRATE_REDIS_CALL_MAX_ITEMS", default_value_t = Coalescing::DEFAULT.call_items as u64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub redis_call_max_items: u64,

    /// Bytes of keys and arguments in one coalesced Redis call, at most.
    #[arg(long, env = "CELLRATE_REDIS_CALL_MAX_BYTES", default_value_t = Coalescing::DEFAULT.call_bytes as u64, value_parser = clap::value_parser!(u64).range(1024..=4 * 1024 * 1024))]
    pub redis_call_max_bytes: u64,

    /// Items waiting for a coalesced call per Redis node (per slot), at most; beyond, a
    /// request fails at once and the failure policy answers it.
    #[arg(long, env = "CELLRATE_REDIS_QUEUE_MAX_ITEMS", default_value_t = Coalescing::DEFAULT.queued_items as u64, value_parser = clap::value_parser!(u64).range(1..=262_144))]
    pub redis_queue_max_items: u64,

    /// Make /readyz fail while Redis does (by default readiness ignores Redis).
    #[arg(long, env = "CELLRATE_REDIS_REQUIRED_FOR_READY")]
    pub redis_required_for_ready: bool,

    /// A call answered READONLY (the Redis at --redis-url became a replica) drops the
    /// connection, so that the next call connects through the URL again (to the new
    /// primary, when a failover behind DNS or a proxy moved it); the call fails.
    #[arg(long, env = "CELLRATE_REDIS_RECONNECT_ON_READONLY")]
    pub redis_reconnect_on_readonly: bool,
}

impl RedisArgs {
    /// The certificates the --redis-tls-* files hold: read now, so that a missing or
    /// unreadable file stops the start with its name, and only for rediss:// URLs.
    fn tls(&self) -> anyhow::Result<RedisTls> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        // Read and parsed now: a file that holds no certificate (or key) would otherwise
        // fail every connection later, with the server already serving.
        let read = |flag: &str, path: &std::path::Path, key: bool| {
            let what = |why: String| TlsFileError(format!("{flag} {}: {why}", path.display()));
            let mut bytes = Vec::new();
            std::fs::File::open(path)
                .and_then(|file| {
                    std::io::Read::read_to_end(
                        &mut std::io::Read::take(file, MAX_TLS_FILE_BYTES + 1),
                        &mut bytes,
                    )
                })
                .map_err(|e| what(e.to_string()))?;
            if bytes.len() as u64 > MAX_TLS_FILE_BYTES {
                return Err(what(format!(
                    "larger than a PEM file needs ({MAX_TLS_FILE_BYTES} bytes at most)"
                )));
            }
            let parsed = if key {
                PrivateKeyDer::from_pem_slice(&bytes).map(|_| ())
            } else {
                CertificateDer::pem_slice_iter(&bytes)
                    .collect::<Result<Vec<_>, _>>()
                    .and_then(|certs| match certs.is_empty() {
                        true => Err(rustls_pki_types::pem::Error::NoItemsFound),
                        false => Ok(()),
                    })
            };
            parsed.map_err(|e| {
                what(format!(
                    "no PEM {} in it ({e})",
                    ["certificate", "key"][usize::from(key)]
                ))
            })?;
            Ok::<_, TlsFileError>(bytes)
        };
        let tls = RedisTls {
            ca: match &self.redis_tls_ca {
                Some(path) => Some(read("--redis-tls-ca", path, false)?),
                None => None,
            },
            client: match (&self.redis_tls_client_cert, &self.redis_tls_client_key) {
                (Some(cert), Some(key)) => Some((
                    read("--redis-tls-client-cert", cert, false)?,
                    read("--redis-tls-client-key", key, true)?,
                )),
                _ => None,
            },
        };
        if tls.is_set() {
            if !self.redis_sentinel.is_empty() {
                anyhow::bail!(SENTINEL_TLS_REFUSED);
            }
            let plain = self
                .redis_url
                .iter()
                .chain(&self.redis_cluster_nodes)
                .find(|url| !url.starts_with("rediss://"));
            if let Some(url) = plain {
                anyhow::bail!(
                    "--redis-tls-ca and --redis-tls-client-cert are for rediss:// (TLS); {} is not",
                    crate::text::printable(url.split('@').next_back().unwrap_or_default())
                );
            }
        }
        Ok(tls)
    }

    /// The Redis store's settings these flags describe (`limits` resolves the names of
    /// `--redis-tag-by-id`).
    pub fn settings(&self, limits: &LimitTable) -> anyhow::Result<RedisSettings> {
        if self.redis_url.is_none()
            && self.redis_cluster_nodes.is_empty()
            && self.redis_sentinel.is_empty()
        {
            anyhow::bail!(
                "--store redis needs --redis-url, --redis-sentinel or --redis-cluster-nodes"
            );
        }
        let urls = self.redis_url.iter().map(|u| ("--redis-url", u));
        let nodes = self
            .redis_cluster_nodes
            .iter()
            .map(|u| ("--redis-cluster-nodes", u));
        for (flag, url) in urls.chain(nodes) {
            if let Some(problem) = crate::store::redis::url_problem(url) {
                anyhow::bail!("{flag}: {problem}");
            }
        }
        let sentinel = self
            .redis_sentinel_master
            .as_ref()
            .map(|master| SentinelSettings {
                nodes: self.redis_sentinel.clone(),
                master: master.clone(),
                password: self.redis_sentinel_password.clone(),
                tls: self.redis_sentinel_tls,
            });
        let tag_by_id = if self.redis_tag_by_id.iter().any(|n| n == "*") {
            None
        } else {
            let mut numbers = HashSet::new();
            for name in &self.redis_tag_by_id {
                let found = limits.names().get(name).with_context(|| {
                    format!("--redis-tag-by-id: {}", limits.names().unknown(name))
                })?;
                numbers.insert(found.number);
            }
            Some(numbers)
        };
        let tls = self.tls()?;
        Ok(RedisSettings {
            tls,
            url: self.redis_url.clone(),
            cluster_nodes: self.redis_cluster_nodes.clone(),
            sentinel,
            prefix: self.redis_prefix.clone(),
            timeout: Duration::from_millis(self.redis_timeout_ms.max(1)),
            clock: self.redis_clock,
            failure: self.redis_failure_policy,
            local_divisor: self.redis_local_divisor.max(1),
            tag_by_id,
            deny_cache: self.redis_deny_cache,
            override_sync: Duration::from_millis(self.redis_override_sync_ms),
            // Small values: clap checked their ranges.
            coalescing: Coalescing {
                calls_in_flight: self.redis_calls_in_flight as usize,
                call_items: self.redis_call_max_items as usize,
                call_bytes: self.redis_call_max_bytes as usize,
                queued_items: self.redis_queue_max_items as usize,
            },
            reconnect_on_readonly: self.redis_reconnect_on_readonly,
            module: self.redis_module,
            ..RedisSettings::default()
        })
    }
}
