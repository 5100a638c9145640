//! The memcache store: envoyproxy/ratelimit's fixed windows counted in memcached, as
//! envoyproxy/ratelimit counts them there (`BACKEND_TYPE=memcache`, `--store memcache`).
//!
//! Each descriptor's limit is one counter per window, under envoyproxy/ratelimit's key
//! (`<CACHE_KEY_PREFIX><domain>_<key>_<value>_..._<window start, Unix seconds>`; a value's
//! `%` and `_` written `%25` and `%5F` unless `--memcache-exact-upstream-keys`, so that
//! a value cannot name another descriptor's counter), created
//! by `add` with an expiry of the window's length plus a jitter below
//! `--memcache-expiration-jitter-max-seconds` (EXPIRATION_JITTER_MAX_SECONDS), and spread
//! over the servers as its client spreads keys. Every hit is counted with `incr` (`add`
//! when the counter is missing, `incr` again when another call added it first): the
//! decision is the counter's value after the increment, so the answer for a sequence of
//! requests is envoyproxy/ratelimit's, and concurrent requests cannot all take the last
//! hit (envoyproxy/ratelimit reads first and increments after answering). A hit count
//! above the limit is over it and not counted: `incr` adds modulo 2^64.
//!
//! What memcached cannot give, this store does not pretend to: no all-or-nothing across
//! keys (a GCRA limit, `--ratelimit-counting gcra`, a lease or any other limit is refused,
//! UNAVAILABLE with the reason), counts lost when memcached evicts a key or restarts.
//! A failed or late call is UNAVAILABLE (envoyproxy/ratelimit counts it as 0 and allows).
//!
//! The client (`client.rs`, `wire.rs`) is memcached's text protocol on tokio: every reply
//! bounded, a deadline per call, a bounded pool per server, reconnecting by itself.

mod client;
mod store;
mod wire;

use std::time::Duration;

pub use store::{legal_key, MemcacheStore};
pub use wire::{MAX_LINE, MAX_VALUE};

/// memcached's longest key.
pub const MAX_KEY_BYTES: usize = 250;

/// The store's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemcacheSettings {
    /// `host:port` of each server, in order (the order spreads the keys).
    pub servers: Vec<String>,
    /// Every call's deadline.
    pub timeout: Duration,
    /// Idle connections kept per server (MEMCACHE_MAX_IDLE_CONNS).
    pub max_idle: usize,
    /// Prepended to every key (CACHE_KEY_PREFIX).
    pub prefix: String,
    /// A counter's expiry is its window's length plus up to this many seconds less one.
    pub jitter_max_seconds: u64,
}

impl Default for MemcacheSettings {
    fn default() -> MemcacheSettings {
        MemcacheSettings {
            servers: Vec::new(),
            timeout: Duration::from_millis(50),
            max_idle: 2,
            prefix: String::new(),
            jitter_max_seconds: 0,
        }
    }
}

pub use client::MAX_OPEN;
