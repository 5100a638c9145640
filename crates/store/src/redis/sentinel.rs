//! Redis behind Sentinel: the sentinels name the master, and a failover is followed.
//!
//! The master's address is asked of the sentinels (each master they report is checked with
//! `ROLE` before it is used, so a replica is never written to), and kept until a call fails
//! in a way a failover explains: the connection drops or is refused, or the node answers
//! `READONLY` (an old master that came back as a replica), or three calls in a row find no
//! answer within their deadline (a master that vanished without closing its connections).
//! The next call then asks the sentinels again. One lookup runs at a time, in a task of its own, so
//! that the short deadline of the calls waiting for it cannot cut it off; calls made
//! meanwhile fail within their deadline and the failure policy answers them, as during any
//! Redis outage.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{IntoConnectionInfo, TlsMode};
use tokio::sync::watch;
use tokio::time::Instant;

use super::settings::SentinelSettings;
use crate::StoreError;

/// How long one lookup may take in all (the sentinels, then `ROLE` on the master).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);
/// The least time between two lookups: the sentinels serve every client of the master.
const LOOKUP_INTERVAL: Duration = Duration::from_millis(100);
/// Calls in a row without an answer (timed out or cut off by their deadline) after which
/// the master is looked up again.
const SILENT_CALLS: u32 = 3;

/// The connection to the master the sentinels name.
pub(super) struct SentinelLink {
    sentinel: tokio::sync::Mutex<Sentinel>,
    settings: SentinelSettings,
    node: SentinelNodeConnectionInfo,
    config: ConnectionManagerConfig,
    /// The master in use (its generation and address), or none until a lookup finds one.
    current: watch::Sender<Option<Master>>,
    looking: AtomicBool,
    last_lookup: Mutex<Option<Instant>>,
    /// Calls in a row that got no answer from the master in use.
    silent: AtomicU32,
    /// Numbers the masters found, so that a call forgets only the one it used.
    generations: AtomicU64,
}

#[derive(Clone)]
struct Master {
    generation: u64,
    address: String,
    manager: ConnectionManager,
}

impl SentinelLink {
    /// A link for `settings`; `master_url` (optional) says how to log in to the master
    /// (user, password, db, TLS); its host is not used. Fails only on unusable settings.
    pub(super) fn new(
        settings: &SentinelSettings,
        master_url: Option<&str>,
        config: ConnectionManagerConfig,
    ) -> Result<SentinelLink, StoreError> {
        let bad = |what: &str, e: redis::RedisError| {
            StoreError::Config(format!("redis sentinel: {what}: {e}"))
        };
        let mut nodes = Vec::with_capacity(settings.nodes.len());
        for node in &settings.nodes {
            let url = if node.contains("://") {
                node.clone()
            } else {
                let scheme = if settings.tls { "rediss" } else { "redis" };
                format!("{scheme}://{node}")
            };
            let mut info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| bad("--redis-sentinel", e))?;
            if let Some(password) = &settings.password {
                if info.redis_settings().password().is_none() {
                    let redis = info.redis_settings().clone().set_password(password);
                    info = info.set_redis_settings(redis);
                }
            }
            nodes.push(info);
        }
        let sentinel = Sentinel::build(nodes).map_err(|e| bad("--redis-sentinel", e))?;
        let mut node = SentinelNodeConnectionInfo::default();
        if let Some(url) = master_url {
            let info = url
                .into_connection_info()
                .map_err(|e| bad("--redis-url (the master's login)", e))?;
            if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
                node = node.set_tls_mode(TlsMode::Secure);
            }
            node = node.set_redis_connection_info(info.redis_settings().clone());
        }
        Ok(SentinelLink {
            sentinel: tokio::sync::Mutex::new(sentinel),
            settings: settings.clone(),
            node,
            config,
            current: watch::Sender::new(None),
            looking: AtomicBool::new(false),
            last_lookup: Mutex::new(None),
            silent: AtomicU32::new(0),
            generations: AtomicU64::new(0),
        })
    }

    /// Runs `invocation` on the master once; `context` names it in errors.
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        self: &Arc<Self>,
        invocation: &super::invocation::Invocation<'_>,
        context: &'static str,
    ) -> Result<T, StoreError> {
        let master = self.master().await;
        let mut manager = master.manager.clone();
        // Counts the call as silent unless it ends with an answer: a call its deadline
        // cuts off never returns here.
        let mut silent = Silent {
            link: self,
            generation: master.generation,
            armed: true,
        };
        let result = invocation.invoke_async::<T>(&mut manager).await;
        match &result {
            Ok(_) => {
                silent.armed = false;
                self.silent.store(0, Ordering::Relaxed);
            }
            Err(e) if e.is_timeout() => {}
            Err(e) => {
                silent.armed = false;
                if failover_explains(e) {
                    self.forget(master.generation);
                }
            }
        }
        drop(silent);
        result.map_err(|e| super::errors::store_error(context, e))
    }

    /// The master in use, after a lookup if there is none (waits until one succeeds: the
    /// caller's deadline bounds the wait).
    async fn master(self: &Arc<Self>) -> Master {
        let mut seen = self.current.subscribe();
        loop {
            if let Some(master) = seen.borrow_and_update().clone() {
                return master;
            }
            self.look_up();
            // A failed lookup changes nothing: the next call starts another (at most one
            // per LOOKUP_INTERVAL), and this one waits until its deadline.
            if seen.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Forgets the master of `generation` (not a newer one another call found).
    fn forget(&self, generation: u64) {
        self.current.send_if_modified(|current| {
            if current.as_ref().is_some_and(|m| m.generation == generation) {
                *current = None;
                true
            } else {
                false
            }
        });
    }

    /// Starts a lookup in a task of its own, unless one runs or one ran just now.
    fn look_up(self: &Arc<Self>) {
        {
            let mut last = self.last_lookup.lock();
            if last.is_some_and(|at| at.elapsed() < LOOKUP_INTERVAL) {
                return;
            }
            if self.looking.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(Instant::now());
        }
        let link = Arc::clone(self);
        tokio::spawn(async move {
            let found = tokio::time::timeout(LOOKUP_TIMEOUT, link.find()).await;
            match found {
                Ok(Ok(master)) => {
                    let changed = link
                        .current
                        .borrow()
                        .as_ref()
                        .is_none_or(|m| m.address != master.address);
                    if changed {
                        tracing::warn!(
                            master = %link.settings.master,
                            address = %master.address,
                            "redis sentinel: writing to this master"
                        );
                    }
                    link.current.send_replace(Some(master));
                }
                Ok(Err(e)) => tracing::warn!(
                    master = %link.settings.master,
                    error = %cellrate_core::text::error_chain(&e),
                    "redis sentinel: no master found"
                ),
                Err(_) => tracing::warn!(
                    master = %link.settings.master,
                    "redis sentinel: no master found within {LOOKUP_TIMEOUT:?}"
                ),
            }
            link.looking.store(false, Ordering::Release);
        });
    }

    /// Asks the sentinels for the master, checks its role, and connects to it.
    async fn find(&self) -> Result<Master, redis::RedisError> {
        let client = {
            let mut sentinel = self.sentinel.lock().await;
            sentinel
                .async_master_for(&self.settings.master, Some(&self.node))
                .await?
        };
        let address = match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(host, port)
            | redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
            other => other.to_string(),
        };
        let manager = ConnectionManager::new_with_config(client, self.config.clone()).await?;
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(Master {
            generation,
            address,
            manager,
        })
    }
}

/// A call in flight on the master of `generation`; dropped while armed, it was silent.
struct Silent<'a> {
    link: &'a SentinelLink,
    generation: u64,
    armed: bool,
}

impl Drop for Silent<'_> {
    fn drop(&mut self) {
        if self.armed && self.link.silent.fetch_add(1, Ordering::Relaxed) + 1 >= SILENT_CALLS {
            self.link.silent.store(0, Ordering::Relaxed);
            self.link.forget(self.generation);
        }
    }
}

/// Whether an error of a call is what a failover looks like from here: the master is gone
/// or slow, or what answered is now a replica.
fn failover_explains(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(e.code(), Some("MASTERDOWN" | "LOADING"))
        || super::errors::read_only(e)
}
