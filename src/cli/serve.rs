//! `cellrate serve`'s flags turned into the server's settings: the TLS files read, the
//! store described, the listeners' bounds, and the listeners bound.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::{ServeArgs, StoreKind};
use crate::limits::config::LimitTable;
use crate::observe::metrics::{statsd_mapping, StatsdMapping};
use crate::server::admin::TlsPem;
use crate::server::connection_age::MaxConnectionAge;
use crate::server::listener::ConnectionLimits;
use crate::server::reload::ReloadSettings;
use crate::server::tls::TlsFiles;
use crate::server::{Listeners, ServerLimits, Settings, StoreSettings};
use crate::service::rlqs::RlqsSettings;
use crate::service::CallerLimits;

impl ServeArgs {
    /// Refuses an empty token: a token of spaces would look set and protect nothing.
    pub fn check_tokens(&self) -> Result<(), &'static str> {
        if self
            .resp_token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err(
                "--resp-token (CELLRATE_RESP_TOKEN) is empty: set a real token, or unset \
                        it to serve the Redis protocol without authentication",
            );
        }
        if self
            .admin_token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err(
                "--admin-token (CELLRATE_ADMIN_TOKEN) is empty: set a real token, or \
                        unset it to serve admin RPCs without one",
            );
        }
        Ok(())
    }

    /// Reads the TLS files named by the flags, and checks that they make a configuration
    /// (the certificate and key parse and match, the CAs parse).
    pub fn tls(&self) -> anyhow::Result<Option<TlsPem>> {
        let Some(files) = self.tls_files() else {
            return Ok(None);
        };
        let pem = files.read().map_err(|e| anyhow::anyhow!("reading {e}"))?;
        crate::server::tls::LiveTls::new(&pem).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Some(pem))
    }

    /// The TLS files the flags name, re-checked every `--reload-interval-seconds`.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return None;
        };
        Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: self.client_ca.clone(),
            admin_client_ca: self.admin_client_ca.clone(),
            client_san: self.client_san.clone(),
            recheck: Duration::from_secs(self.reload_interval_seconds.max(1)),
        })
    }

    /// The statsd mapping `--ratelimit-stats-mapping` names, read and checked (a file of
    /// more than [`statsd_mapping::MAX_FILE_BYTES`] is refused unread).
    pub fn stats_mapping(&self) -> anyhow::Result<Option<Arc<StatsdMapping>>> {
        let Some(source) = self.ratelimit_stats_mapping.as_deref() else {
            return Ok(None);
        };
        let text = match source {
            "ratelimit" => statsd_mapping::RATELIMIT_DEFAULT.to_string(),
            path => {
                // A regular file only, opened without waiting (a FIFO would hang startup).
                let most = statsd_mapping::MAX_FILE_BYTES as u64;
                crate::server::tls::read_regular(std::path::Path::new(path), most)
                    .and_then(|bytes| {
                        String::from_utf8(bytes).map_err(|e| {
                            std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error())
                        })
                    })
                    .with_context(|| {
                        format!(
                            "statistics mapping {path} (--ratelimit-stats-mapping; \
                             PROMETHEUS_MAPPER_YAML as ratelimit): reading"
                        )
                    })?
            }
        };
        let mapping = StatsdMapping::parse(&text).map_err(|e| {
            anyhow::anyhow!(
                "statistics mapping {source} (--ratelimit-stats-mapping; \
                 PROMETHEUS_MAPPER_YAML as ratelimit): {e}"
            )
        })?;
        Ok(Some(Arc::new(mapping)))
    }

    /// The store the flags describe.
    pub fn store(&self, limits: &LimitTable) -> anyhow::Result<StoreSettings> {
        if self.store == StoreKind::Memory {
            return Ok(StoreSettings::Memory);
        }
        if self.store == StoreKind::Memcache {
            if self.envoy.ratelimit_counting
                != crate::service::envoy::RatelimitCounting::FixedWindow
            {
                anyhow::bail!(
                    "--store memcache counts envoyproxy/ratelimit's fixed windows only: \
                     --ratelimit-counting gcra needs the memory or Redis store"
                );
            }
            if self.snapshot_file.is_some() {
                anyhow::bail!("--snapshot-file is for the memory store");
            }
            return Ok(StoreSettings::Memcache(Box::new(self.memcache.settings()?)));
        }
        if self.snapshot_file.is_some() {
            anyhow::bail!(
                "--snapshot-file is for the memory store; with --store redis, Redis keeps the \
                 buckets (use its own persistence)"
            );
        }
        if !cfg!(feature = "redis") {
            return Err(crate::server::no_redis().into());
        }
        Ok(StoreSettings::Redis {
            settings: Box::new(self.redis.settings(limits)?),
            required_for_ready: self.redis.redis_required_for_ready,
        })
    }

    /// The server's settings, with `tls` and `store` as read by [`Self::tls`] and
    /// [`Self::store`].
    pub fn settings(&self, tls: Option<TlsPem>, store: StoreSettings) -> Settings {
        // memcached's keys are envoyproxy/ratelimit's text, not a digest.
        let upstream_keys = matches!(store, StoreSettings::Memcache(_));
        Settings {
            max_buckets: self.max_buckets,
            caller_bucket_share: usize::from(self.buckets.caller_limit_bucket_share),
            bucket_name_share: usize::from(self.buckets.bucket_name_share),
            max_leases: self.shares.max_leases,
            lease_name_share: usize::from(self.shares.lease_name_share),
            caller: CallerLimits {
                enabled: self.caller_limits,
                max_period: self.caller_limit_max_period,
                max_burst: self.caller_limit_max_burst,
            },
            max_runtime_overrides: self.max_runtime_overrides,
            max_override_ttl: self.max_override_ttl,
            settle_window: self.settle_window,
            settle_max_records: self.settle_max_records,
            settle_max_holds_per_key: self.shares.settle_max_holds_per_key,
            rlqs: RlqsSettings {
                max_streams: self.rlqs_max_streams,
                max_buckets: self.rlqs_max_buckets,
                max_buckets_per_stream: self.rlqs_max_buckets_per_stream,
                max_bucket_bytes: self.rlqs_max_bucket_bytes,
                assignment_ttl: Duration::from_secs(self.rlqs_assignment_ttl_seconds),
                idle: Duration::from_secs(self.rlqs_idle_seconds),
                sync: Duration::from_millis(self.rlqs_sync_ms),
            },
            grace: Duration::from_secs(self.grace_seconds),
            shutdown_delay: Duration::from_secs(self.shutdown_delay_seconds),
            reload: (!self.no_limits_dir).then(|| ReloadSettings {
                dir: self.config.clone(),
                watch: self.watch_config,
                debounce: Duration::from_millis(self.reload_debounce_ms),
                interval: Duration::from_secs(self.reload_interval_seconds.max(1)),
                sighup: true,
            }),
            admin_token: self.admin_token.clone(),
            resp: crate::resp::RespSettings {
                token: self.resp_token.clone(),
                lockout: crate::resp::lockout::LockoutSettings {
                    burst: self.resp_auth_failure_burst,
                    period: Duration::from_secs(self.resp_auth_failure_period_seconds),
                    max_addresses: self.resp_auth_max_addresses,
                },
                ..Default::default()
            },
            tls_files: tls.as_ref().and(self.tls_files()),
            tls,
            store,
            snapshot: self
                .snapshot_file
                .clone()
                .map(|path| crate::server::SnapshotSettings {
                    path,
                    interval: (self.snapshot_interval_seconds > 0)
                        .then(|| Duration::from_secs(self.snapshot_interval_seconds)),
                }),
            server: self.server_limits(),
            envoy: crate::service::envoy::EnvoyOptions {
                upstream_keys,
                exact_upstream_keys: upstream_keys && self.memcache.memcache_exact_upstream_keys,
                ..self.envoy.options()
            },
            metrics_path: self.metrics_path.clone(),
            ready_needs_limits: self.ready_needs_limits,
            metrics_labels: self.metrics_labels.clone(),
            ratelimit_stats: self.ratelimit_stats,
            grpc_unary: self.grpc_unary,
            ..Default::default()
        }
    }

    /// The listeners' bounds and timeouts the flags describe.
    pub fn server_limits(&self) -> ServerLimits {
        let connections = |max_connections| ConnectionLimits {
            max_connections,
            max_per_address: self.max_connections_per_address,
            handshake_timeout: Duration::from_secs(self.handshake_timeout_seconds.max(1)),
            idle_timeout: Duration::from_secs(self.idle_timeout_seconds.max(1)),
            ..Default::default()
        };
        ServerLimits {
            decisions: connections(self.max_connections),
            admin: connections(self.admin_max_connections),
            metrics: ConnectionLimits {
                idle_timeout: Duration::from_secs(self.idle_timeout_seconds.max(1))
                    .min(crate::server::METRICS_MAX_IDLE),
                ..connections(self.metrics_max_connections)
            },
            resp: connections(self.resp_max_connections),
            max_streams_per_connection: self.max_streams_per_connection.max(1),
            max_in_flight: self.max_in_flight.max(1),
            max_in_flight_per_address: self.shares.max_in_flight_per_address,
            body_timeout: Duration::from_millis(
                self.request_body_timeout_ms
                    .min(self.request_timeout_ms)
                    .max(1),
            ),
            request_timeout: Duration::from_millis(self.request_timeout_ms.max(1)),
            max_connection_age: self.grpc_max_connection_age.map(|age| MaxConnectionAge {
                age: nanos(age),
                grace: self.grpc_max_connection_age_grace.map(nanos),
            }),
        }
    }

    /// Binds the listeners the flags name (the metrics listener always; the Redis protocol's
    /// only when given).
    pub async fn bind(&self) -> anyhow::Result<Listeners> {
        let decisions = match &self.grpc_uds {
            Some(path) => crate::server::unix_socket::bind(path)
                .with_context(|| format!("binding --grpc-uds {}", path.display()))?,
            None => tokio::net::TcpListener::bind(self.listen)
                .await
                .with_context(|| format!("binding --listen {}", self.listen))?
                .into(),
        };
        let admin = match tokio::net::TcpListener::bind(self.admin_listen).await {
            Ok(admin) => admin,
            Err(e) if self.admin_listen_defaulted && e.kind() == ErrorKind::AddrInUse => {
                let elsewhere = SocketAddr::new(self.admin_listen.ip(), 0);
                let admin = tokio::net::TcpListener::bind(elsewhere)
                    .await
                    .with_context(|| format!("binding the admin listener on {elsewhere}"))?;
                tracing::warn!(
                    default = %self.admin_listen,
                    admin = %admin.local_addr().map_or(elsewhere, |a| a),
                    "the admin listener's default port is taken (another cellrate or \
                     ratelimit on this host?): it is on a port the kernel chose instead; set \
                     --admin-listen (CELLRATE_ADMIN_LISTEN) to place it"
                );
                admin
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("binding --admin-listen {}", self.admin_listen))
            }
        };
        let metrics = tokio::net::TcpListener::bind(self.metrics_listen)
            .await
            .with_context(|| format!("binding --metrics-listen {}", self.metrics_listen))?;
        let resp = match self.resp_listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding --resp-listen {addr}"))?,
            ),
            None => None,
        };
        let health = match self.health_listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding --health-listen {addr}"))?,
            ),
            None => None,
        };
        Ok(Listeners {
            decisions,
            admin,
            metrics: Some(metrics),
            health,
            resp,
        })
    }
}

/// A non-negative flag's nanoseconds as a `Duration` (negative ones are refused by the
/// flags' parsers; 0 here).
fn nanos(n: i64) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(0))
}

/// `--metrics-path`: a path no route of the HTTP listener has, in characters a route takes
/// literally.
pub(super) fn parse_metrics_path(text: &str) -> Result<String, String> {
    let literal = |c: char| c.is_ascii_alphanumeric() || "/_.~-".contains(c);
    if !text.starts_with('/') || text.len() > 256 || !text.chars().all(literal) {
        return Err(format!(
            "{:?}: a path, / then letters, digits and /_.~- (at most 256 bytes)",
            crate::text::first_chars(text, 80)
        ));
    }
    if ["/healthz", "/readyz", "/healthcheck"].contains(&text) {
        return Err(format!("{text}: a probe's path"));
    }
    Ok(text.to_string())
}
