//! `cellrate serve`'s memcache flags (`--store memcache`), and the store settings they
//! describe.

use std::time::Duration;

use crate::store::memcache::MemcacheSettings;

#[derive(Debug, Clone, clap::Args)]
pub struct MemcacheArgs {
    /// With --store memcache: the memcached servers, comma-separated HOST:PORT, in order
    /// (keys are spread over them as envoyproxy/ratelimit spreads them, by the order given).
    #[arg(long, env = "CELLRATE_MEMCACHE", value_delimiter = ',')]
    pub memcache: Vec<String>,

    /// Deadline of every memcached call, in milliseconds.
    #[arg(long, env = "CELLRATE_MEMCACHE_TIMEOUT_MS", default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub memcache_timeout_ms: u64,

    /// Idle connections kept per memcached server (at most 128 are open at once).
    #[arg(long, env = "CELLRATE_MEMCACHE_MAX_IDLE_CONNS", default_value_t = 2, value_parser = clap::value_parser!(u64).range(0..=128))]
    pub memcache_max_idle_conns: u64,

    /// Prepended to every memcached key (two deployments sharing memcached keep their
    /// counters apart by it).
    #[arg(long, env = "CELLRATE_MEMCACHE_PREFIX", default_value = "")]
    pub memcache_prefix: String,

    /// A counter expires its window's length after it is created, plus a random number of
    /// seconds below this (0: none), as envoyproxy/ratelimit's EXPIRATION_JITTER_MAX_SECONDS.
    #[arg(long, env = "CELLRATE_MEMCACHE_EXPIRATION_JITTER_MAX_SECONDS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub memcache_expiration_jitter_max_seconds: u64,

    /// Write each descriptor value into its memcached key exactly as envoyproxy/ratelimit
    /// does, for a migration that shares memcached with its replicas; a value holding
    /// `_<key>_` then counts on another descriptor's counter, as there. Off: `%` and `_` in
    /// a value are written `%25` and `%5F`.
    #[arg(long, env = "CELLRATE_MEMCACHE_EXACT_UPSTREAM_KEYS", default_value_t = false, action = clap::ArgAction::Set)]
    pub memcache_exact_upstream_keys: bool,
}

impl MemcacheArgs {
    /// The settings, or why they cannot work.
    pub fn settings(&self) -> anyhow::Result<MemcacheSettings> {
        if self.memcache.is_empty() {
            anyhow::bail!("--store memcache needs --memcache HOST:PORT[,HOST:PORT...]");
        }
        for server in &self.memcache {
            let (host, port) = server.rsplit_once(':').unwrap_or((server, ""));
            if host.is_empty() || port.parse::<u16>().is_err() {
                anyhow::bail!(
                    "--memcache: {:?} is no HOST:PORT",
                    crate::text::printable(crate::text::cut_bytes(server, 64))
                );
            }
        }
        if !crate::store::memcache::legal_key(&self.memcache_prefix)
            && !self.memcache_prefix.is_empty()
        {
            anyhow::bail!("--memcache-prefix: at most 250 bytes, no space or control character");
        }
        Ok(MemcacheSettings {
            servers: self.memcache.iter().map(|s| s.trim().to_string()).collect(),
            timeout: Duration::from_millis(self.memcache_timeout_ms),
            max_idle: self.memcache_max_idle_conns as usize,
            prefix: self.memcache_prefix.clone(),
            jitter_max_seconds: self.memcache_expiration_jitter_max_seconds,
        })
    }
}
