//! How to reach Redis and behave around it: compiled whether or not the `redis` feature
//! is, so that the flags always parse and a memory-only build can say what is missing.

use std::collections::HashSet;
use std::time::Duration;

/// Whose clock decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RedisClock {
    /// Redis `TIME` inside the script: one clock for every replica.
    #[default]
    Redis,
    /// cellrate's own clock, passed to the script.
    Local,
}

/// Whether the store decides through cellrate's module in Redis (`--redis-module`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RedisModule {
    /// The module when the server has it (asked at start), else the script.
    #[default]
    Auto,
    /// Only the module: a server without it answers every call with an error (logged at
    /// start), and `--redis-failure-policy` decides.
    Require,
    /// Only the script, even where the module is loaded.
    Forbid,
}

/// What a request gets when Redis cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FailurePolicy {
    /// gRPC UNAVAILABLE (Envoy's `failure_mode_deny` decides).
    #[default]
    Unavailable,
    /// Allow (fail open).
    Allow,
    /// Deny (fail closed).
    Deny,
    /// Decide in this replica's memory with `1/divisor` of each limit.
    Local,
}

/// How to reach Redis and behave around it.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port[/db]` or `rediss://...` (TLS).
    pub url: Option<String>,
    /// Redis Cluster seed nodes (URLs); used instead of `url` when not empty.
    pub cluster_nodes: Vec<String>,
    /// Redis behind Sentinel: the sentinels name the master (`url`, if given, is then only
    /// the master's login: user, password, db, TLS).
    pub sentinel: Option<SentinelSettings>,
    /// Prefix of every key.
    pub prefix: String,
    /// Deadline of every Redis call.
    pub timeout: Duration,
    pub clock: RedisClock,
    pub failure: FailurePolicy,
    /// With [`FailurePolicy::Local`]: each limit's burst and count are divided by this
    /// (rounded up), e.g. the number of replicas.
    pub local_divisor: u64,
    /// Name numbers whose keys are tagged by id (`{id}`), so that one id's limits share a
    /// cluster slot; `None` tags every name.
    pub tag_by_id: Option<HashSet<u32>>,
    /// Entries of the local deny cache; 0 turns it off.
    pub deny_cache: usize,
    /// Consecutive failures that open a breaker.
    pub breaker_threshold: u32,
    /// How long an open breaker fails fast.
    pub breaker_cooldown: Duration,
    /// How often a replica looks for changes of the temporary overrides in Redis.
    pub override_sync: Duration,
    /// Bounds of the spend calls that coalesce concurrent batches.
    pub coalescing: Coalescing,
    /// Certificates for `rediss://` beyond the defaults (a private CA, a client
    /// certificate).
    pub tls: RedisTls,
    /// Lease keys this replica counts at most (`--max-leases`), and the percent of them one
    /// limit name's keys may take (`--lease-name-share`): an acquire that needs a key beyond
    /// is denied (docs/redis-store.md, "Leases").
    pub max_lease_keys: usize,
    pub lease_name_share: usize,
    /// Bucket keys this replica counts at most (`--max-buckets`), the percent of them for
    /// caller-given limits (`--caller-limit-bucket-share`), and the percent of the rest
    /// one configured limit name's keys may take (`--bucket-name-share`): a spend that
    /// would write a key beyond is denied (docs/redis-store.md, "A share of bucket keys").
    pub max_bucket_keys: usize,
    pub caller_bucket_share: usize,
    pub bucket_name_share: usize,
    /// A call answered `READONLY` (the Redis at the URL became a replica) drops its
    /// connection, so that the next call connects again through the URL, which a failover
    /// behind DNS, a Service or a proxy points at the new primary; the call itself fails
    /// (envoyproxy/ratelimit's REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR). For one Redis at
    /// a URL, with or without TLS; the sentinels' master is followed by itself, a
    /// cluster's nodes by the cluster client.
    pub reconnect_on_readonly: bool,
    /// Whether batches are decided by cellrate's module in Redis (`CELLRATE.BATCH`) or by
    /// the script (docs/redis-store.md, "The module").
    pub module: RedisModule,
}

/// Why custom certificates are refused with Sentinel: redis-rs's Sentinel checks a
/// master's role over a connection of its own, which takes no CA and no client certificate
/// from here.
pub const SENTINEL_TLS_REFUSED: &str = "--redis-tls-ca and --redis-tls-client-cert are not \
    served with --redis-sentinel: give the master and the sentinels certificates from a public CA";

/// The largest --redis-tls-* file read (a CA bundle of every Mozilla root is ~200 KiB).
pub const MAX_TLS_FILE_BYTES: u64 = 4 << 20;

/// PEM certificates for TLS to Redis, read from their files at start.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// CA certificates to trust instead of the Mozilla roots (a private CA).
    pub ca: Option<Vec<u8>>,
    /// A client certificate and its key, for servers that ask for one
    /// (`tls-auth-clients yes`).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl RedisTls {
    /// Whether anything differs from the defaults.
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }
}

impl std::fmt::Debug for RedisTls {
    /// Says what is set, never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl Default for RedisSettings {
    fn default() -> RedisSettings {
        RedisSettings {
            url: None,
            cluster_nodes: Vec::new(),
            sentinel: None,
            prefix: "cellrate:".to_string(),
            // Chosen from measurement (BENCHMARKS.md, "The Redis deadline"): 10 ms cut 1 call
            // in 26 on a node with every core busy, 50 ms 1 in 228, and it stays below the
            // 100 ms RLS timeout the Envoy examples set.
            timeout: Duration::from_millis(50),
            clock: RedisClock::Redis,
            failure: FailurePolicy::Unavailable,
            local_divisor: 1,
            tag_by_id: Some(HashSet::new()),
            deny_cache: 0,
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(1),
            override_sync: Duration::from_secs(1),
            coalescing: Coalescing::default(),
            tls: RedisTls::default(),
            max_lease_keys: crate::memory::DEFAULT_MAX_LEASES,
            lease_name_share: crate::memory::DEFAULT_LEASE_NAME_SHARE_PERCENT,
            max_bucket_keys: crate::memory::DEFAULT_MAX_BUCKETS,
            caller_bucket_share: crate::memory::DEFAULT_CALLER_SHARE_PERCENT,
            bucket_name_share: crate::memory::DEFAULT_BUCKET_NAME_SHARE_PERCENT,
            reconnect_on_readonly: false,
            module: RedisModule::Auto,
        }
    }
}

/// Where the sentinels are and which master to ask them for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelSettings {
    /// `HOST:PORT`, or URLs (`redis://[user:password@]host:port`, `rediss://`).
    pub nodes: Vec<String>,
    /// The master's name in the sentinels' configuration.
    pub master: String,
    /// The sentinels' password, for nodes whose URL carries none.
    pub password: Option<String>,
    /// TLS to the sentinels given as `HOST:PORT`.
    pub tls: bool,
}

/// Bounds of coalescing, per lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coalescing {
    /// Spend calls in flight at a time; requests that find them all taken wait for the
    /// next call.
    pub calls_in_flight: usize,
    /// Items in one coalesced call (a single batch larger than this still goes alone).
    pub call_items: usize,
    /// Bytes of keys and arguments in one coalesced call (likewise).
    pub call_bytes: usize,
    /// Items waiting for a call; a batch beyond this fails at once (the failure policy
    /// answers it).
    pub queued_items: usize,
}

impl Coalescing {
    /// The defaults (also those of the `serve` flags).
    pub const DEFAULT: Coalescing = Coalescing {
        calls_in_flight: 2,
        // A few hundred decisions keep one script run around a millisecond of Redis
        // time, so that the calls of other clients are not held up behind it.
        call_items: 256,
        call_bytes: 64 * 1024,
        queued_items: 16_384,
    };
}

impl Default for Coalescing {
    fn default() -> Coalescing {
        Coalescing::DEFAULT
    }
}

/// Why `url` (a `--redis-url` or `--redis-cluster-nodes` entry) is not a Redis URL, if it
/// is not: checked when the flags are read, so that a bad URL exits before any port is
/// bound. The URL is not echoed (it may hold a password).
pub fn url_problem(url: &str) -> Option<String> {
    #[cfg(feature = "redis")]
    {
        use redis::IntoConnectionInfo;
        url.into_connection_info().err().map(|e| {
            format!(
                "not a Redis URL ({:?}): redis://[[user]:password@]host[:port][/db], \
                 rediss:// for TLS, or unix:///path",
                e.kind()
            )
        })
    }
    #[cfg(not(feature = "redis"))]
    {
        let _ = url;
        None
    }
}
