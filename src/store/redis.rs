//! The Redis store: TATs shared by many replicas, standalone or Redis Cluster.
//!
//! Every batch is one server-side script (`redis_batch.lua`, sent with EVALSHA and loaded
//! again on NOSCRIPT): it reads the batch's TATs, decides all-or-nothing which to write,
//! writes them with an expiry at the TAT, and returns `now` and the TATs it read. The
//! reported decisions are then computed here by [`crate::gcra`], the same code the memory
//! store runs, so the two stores answer identically for the same `now` and state.
//!
//! Time comes from Redis `TIME` (replicas' clocks drift; the store's clock is the one they
//! share), at microsecond resolution, or from cellrate's clock with [`RedisClock::Local`].
//!
//! **Redis Cluster.** Keys are grouped by hash slot and the groups run in parallel, each
//! atomically. When a cross-slot batch has a group that denies while others spent, the
//! spent groups are refunded (a compensation, counted in
//! `cellrate_store_compensations_total`); between the spend and the refund another request
//! may see those tokens gone, so a cross-slot batch is all-or-nothing in its result but
//! not isolated. Tag a name's keys by id (`--redis-tag-by-id`) so that one id's limits share
//! a slot and its batches stay single-slot. Ids are escaped (`{` `}` `%`) so that callers
//! cannot pick slots.
//!
//! **Failures.** Every call has a deadline (default 10 ms, below Envoy's 20 ms). A circuit
//! breaker per slot (one for standalone) fails fast after repeated errors and lets exactly
//! one trial through after a cool-down (half-open). On failure the [`FailurePolicy`] decides: UNAVAILABLE (the
//! default; Envoy's `failure_mode_deny` then decides), allow, deny, or decide locally in
//! memory with a share of each limit. Connections re-establish by themselves.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use tokio::sync::Mutex as AsyncMutex;

use crate::clock::{Clock, Nanos};
use crate::gcra::{self, BatchItem, Decision, Limit, Mode};
use crate::limits::names::BucketKey;
use crate::store::{
    MemoryStore, Outcome, Store, StoreError, StoreEvent, StoreFuture, StoreItem, StoreObserver,
};

/// Whose clock decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RedisClock {
    /// Redis `TIME` inside the script: one clock for every replica.
    #[default]
    Redis,
    /// cellrate's own clock, passed to the script.
    Local,
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
}

impl Default for RedisSettings {
    fn default() -> RedisSettings {
        RedisSettings {
            url: None,
            cluster_nodes: Vec::new(),
            prefix: "cellrate:".to_string(),
            timeout: Duration::from_millis(10),
            clock: RedisClock::Redis,
            failure: FailurePolicy::Unavailable,
            local_divisor: 1,
            tag_by_id: Some(HashSet::new()),
            deny_cache: 0,
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(1),
        }
    }
}

/// The script, compiled into the binary.
const SCRIPT: &str = include_str!("redis_batch.lua");

/// Number of Redis Cluster hash slots.
const SLOTS: usize = 16_384;

enum Connection {
    Single(ConnectionManager),
    /// Connected on first use (retried on the next call while that fails; one attempt at
    /// a time); the cluster connection then reconnects to nodes by itself.
    Cluster {
        client: Box<redis::cluster::ClusterClient>,
        connection: AsyncMutex<Option<ClusterConnection>>,
    },
}

/// A circuit breaker: counts consecutive failures; after `breaker_threshold` it opens
/// (calls fail fast) until a monotonic deadline, then is half-open: exactly one call goes
/// through as a trial, the others still fail fast; the trial's success closes it, its
/// failure opens it for another cool-down.
#[derive(Default)]
struct Breaker {
    failures: AtomicU32,
    /// 0: closed; else the monotonic time (ns since start, at least 1) it opened until.
    open_until: AtomicI64,
    /// Half-open: a trial call is in flight.
    trial: AtomicBool,
    /// Whether the last call through this breaker failed (for readiness).
    failing: AtomicBool,
    /// Whether any call went through this breaker (cluster slots).
    used: AtomicBool,
}

/// The Redis store. See the module docs.
pub struct RedisStore {
    connection: Connection,
    script: redis::Script,
    settings: RedisSettings,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn StoreObserver>,
    fallback: Option<MemoryStore>,
    breakers: Box<[Breaker]>,
    started: Instant,
    /// Whether Redis answers: some used slot's last call succeeded (for readiness, when
    /// required).
    healthy: Arc<AtomicBool>,
    /// Breakers whose last call failed, and (cluster) breakers that saw a call.
    failing_slots: AtomicUsize,
    used_slot_count: AtomicUsize,
    /// Recent denials, by Redis key (see [`DenyCache`]).
    deny_cache: Option<DenyCache>,
    /// Data errors already logged, so that a bad bucket logs once, not per request.
    data_errors_logged: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// The local deny cache: a denied bucket's TAT is a lower bound (TATs only grow, but for
/// refunds and resets), so later requests for that bucket can be denied here, without a
/// round trip, while that bound still proves the denial.
///
/// Time is anchored on the monotonic clock at *send* time of the request that learned the
/// TAT: Redis read `now` after that, so the local estimate of Redis's time runs ahead of
/// it, and an estimate-based denial is never one Redis would have allowed (unless another
/// replica refunded or reset the bucket; refunds and resets through this replica, and
/// reloads, clear the entries). Single-item batches only; bounded in size. The numbers it
/// reports are computed at the estimated time, so they may differ from Redis's by the
/// round-trip time.
struct DenyCache {
    entries: std::sync::Mutex<DenyEntries>,
    capacity: usize,
}

/// The cache's map, and its keys in insertion order for O(1) eviction of the oldest (a
/// full cache under attack must not scan itself on every new denial). Keys removed from
/// the map stay in `order` until they reach its front, or until `order` grows past twice
/// the capacity and is compacted.
#[derive(Default)]
struct DenyEntries {
    map: std::collections::HashMap<String, DenyEntry>,
    order: std::collections::VecDeque<String>,
}

impl DenyEntries {
    fn insert(&mut self, key: &str, entry: DenyEntry, capacity: usize) {
        if let Some(existing) = self.map.get_mut(key) {
            *existing = entry;
            return;
        }
        while self.map.len() >= capacity {
            match self.order.pop_front() {
                Some(oldest) => {
                    self.map.remove(&oldest);
                }
                None => break,
            }
        }
        self.map.insert(key.to_string(), entry);
        self.order.push_back(key.to_string());
        if self.order.len() > 2 * capacity {
            let map = &self.map;
            self.order.retain(|k| map.contains_key(k));
        }
    }

    fn get(&self, key: &str) -> Option<DenyEntry> {
        self.map.get(key).copied()
    }

    fn remove(&mut self, key: &str) {
        self.map.remove(key);
    }

    fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }
}

#[derive(Clone, Copy)]
struct DenyEntry {
    tat: Nanos,
    /// Redis's `now` when the TAT was read.
    now: Nanos,
    /// The monotonic time (ns since the store started) when that request was sent.
    sent: i64,
}

impl DenyCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, DenyEntries> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The operation a script call performs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Spend,
    Refund,
    Reset,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Spend => "spend",
            Op::Refund => "refund",
            Op::Reset => "reset",
        }
    }
}

/// What one script call read: `now` and each key's TAT.
struct Read {
    now: Nanos,
    tats: Vec<Option<Nanos>>,
}

fn store_error(context: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::transient(format!("redis {context}: {e}"))
}

/// Escapes `%`, `{` and `}` so that an id can neither pick a cluster slot nor collide
/// with another id's escape.
fn escape(id: &str) -> std::borrow::Cow<'_, str> {
    if !id.contains(['%', '{', '}']) {
        return id.into();
    }
    id.replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
        .into()
}

/// CRC16/XMODEM, the checksum of Redis Cluster key slots.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of a key: of its `{tag}` when it has a non-empty one, else of the key.
pub fn slot(key: &str) -> usize {
    let bytes = key.as_bytes();
    let hashed = match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    usize::from(crc16(hashed)) % SLOTS
}

impl RedisStore {
    /// A store for `settings`. Standalone connections are made lazily and re-made after
    /// failures; so are cluster connections. Fails only on unusable settings.
    pub fn new(
        settings: RedisSettings,
        clock: Arc<dyn Clock>,
        observer: Arc<dyn StoreObserver>,
    ) -> Result<RedisStore, StoreError> {
        let connection = if settings.cluster_nodes.is_empty() {
            let url = settings
                .url
                .as_deref()
                .ok_or_else(|| StoreError::transient("redis: no --redis-url or cluster nodes"))?;
            let client = redis::Client::open(url).map_err(|e| store_error("url", e))?;
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(settings.timeout.max(Duration::from_millis(100))))
                .set_response_timeout(Some(settings.timeout))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(500));
            let manager = ConnectionManager::new_lazy_with_config(client, config)
                .map_err(|e| store_error("connection", e))?;
            Connection::Single(manager)
        } else {
            let client = redis::cluster::ClusterClientBuilder::new(settings.cluster_nodes.clone())
                .connection_timeout(settings.timeout.max(Duration::from_millis(100)))
                .response_timeout(settings.timeout)
                .retries(1)
                .build()
                .map_err(|e| store_error("cluster nodes", e))?;
            Connection::Cluster {
                client: Box::new(client),
                connection: AsyncMutex::new(None),
            }
        };
        let breakers = if settings.cluster_nodes.is_empty() {
            1
        } else {
            SLOTS
        };
        let deny_cache = settings.deny_cache;
        let fallback =
            (settings.failure == FailurePolicy::Local).then(|| MemoryStore::new(clock.clone()));
        Ok(RedisStore {
            connection,
            script: redis::Script::new(SCRIPT),
            settings,
            clock,
            observer,
            fallback,
            breakers: (0..breakers).map(|_| Breaker::default()).collect(),
            started: Instant::now(),
            healthy: Arc::new(AtomicBool::new(true)),
            failing_slots: AtomicUsize::new(0),
            used_slot_count: AtomicUsize::new(0),
            data_errors_logged: Default::default(),
            deny_cache: (deny_cache > 0).then(|| DenyCache {
                entries: std::sync::Mutex::new(DenyEntries::default()),
                capacity: deny_cache,
            }),
        })
    }

    /// Whether the last Redis call succeeded.
    pub fn healthy(&self) -> Arc<AtomicBool> {
        self.healthy.clone()
    }

    /// The Redis key of a bucket: prefix, then `<number>:<id>` or, tagged,
    /// `<number>:{<id>}`; the id escaped.
    pub fn redis_key(&self, key: &BucketKey) -> String {
        let (number, id) = key.parts();
        let tagged = self
            .settings
            .tag_by_id
            .as_ref()
            .is_none_or(|names| names.contains(&number));
        let id = escape(id);
        if tagged {
            format!("{}{number}:{{{id}}}", self.settings.prefix)
        } else {
            format!("{}{number}:{id}", self.settings.prefix)
        }
    }

    fn mono(&self) -> i64 {
        self.started.elapsed().as_nanos() as i64
    }

    fn breaker(&self, slot: usize) -> &Breaker {
        &self.breakers[slot % self.breakers.len()]
    }

    /// Whether a call to `slot` may go ahead: the breaker is closed, or this call is the
    /// half-open breaker's one trial.
    fn admit(&self, slot: usize) -> bool {
        let breaker = self.breaker(slot);
        let open_until = breaker.open_until.load(Ordering::Relaxed);
        open_until == 0
            || (self.mono() >= open_until
                && breaker
                    .trial
                    .compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok())
    }

    fn note(&self, slot: usize, ok: bool) {
        let breaker = self.breaker(slot);
        let was_failing = breaker.failing.swap(!ok, Ordering::Relaxed);
        if was_failing == ok {
            if ok {
                self.failing_slots.fetch_sub(1, Ordering::Relaxed);
            } else {
                self.failing_slots.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Ready while some slot answers: in a cluster, one dead primary must not make
        // every replica unready (its slots fail; the others serve), nor may readiness
        // follow whichever slot answered last.
        let failing = self.failing_slots.load(Ordering::Relaxed);
        self.healthy.store(
            failing == 0 || failing < self.used_slots(),
            Ordering::Relaxed,
        );
        if ok {
            breaker.failures.store(0, Ordering::Relaxed);
            breaker.open_until.store(0, Ordering::Relaxed);
            breaker.trial.store(false, Ordering::Relaxed);
            return;
        }
        let failures = breaker.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let half_open = breaker.open_until.load(Ordering::Relaxed) != 0;
        if half_open || failures >= self.settings.breaker_threshold {
            let until = self.mono() + self.settings.breaker_cooldown.as_nanos() as i64;
            breaker.open_until.store(until.max(1), Ordering::Relaxed);
            breaker.trial.store(false, Ordering::Relaxed);
        }
    }

    /// Breakers that have seen a call.
    fn used_slots(&self) -> usize {
        if self.breakers.len() == 1 {
            return 1;
        }
        self.used_slot_count.load(Ordering::Relaxed)
    }

    /// One script call over `keys` (all in one slot), with the deadline and breaker.
    async fn call(
        &self,
        op: Op,
        slot: usize,
        keys: &[String],
        args: &[String],
    ) -> Result<Read, StoreError> {
        if !self.admit(slot) {
            self.observer.event(StoreEvent::BreakerRejection);
            return Err(StoreError::transient(
                "redis: circuit open after repeated failures",
            ));
        }
        if self.breakers.len() > 1 && !self.breaker(slot).used.swap(true, Ordering::Relaxed) {
            self.used_slot_count.fetch_add(1, Ordering::Relaxed);
        }
        let now_arg = match self.settings.clock {
            RedisClock::Redis => String::new(),
            RedisClock::Local => self.clock.now().to_string(),
        };
        let mut invocation = self.script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        invocation.arg(op.name()).arg(now_arg);
        for arg in args {
            invocation.arg(arg);
        }
        let result = tokio::time::timeout(self.settings.timeout, async {
            match &self.connection {
                Connection::Single(manager) => {
                    let mut manager = manager.clone();
                    invocation
                        .invoke_async::<Vec<String>>(&mut manager)
                        .await
                        .map_err(|e| store_error(op.name(), e))
                }
                Connection::Cluster { client, connection } => {
                    let mut conn = {
                        let mut guard = connection.lock().await;
                        match guard.as_ref() {
                            Some(conn) => conn.clone(),
                            None => {
                                let conn = client
                                    .get_async_connection()
                                    .await
                                    .map_err(|e| store_error("cluster connection", e))?;
                                *guard = Some(conn.clone());
                                conn
                            }
                        }
                    };
                    invocation
                        .invoke_async::<Vec<String>>(&mut conn)
                        .await
                        .map_err(|e| store_error(op.name(), e))
                }
            }
        })
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::transient(format!(
                "redis {}: no answer within {:?}",
                op.name(),
                self.settings.timeout
            )))
        });
        // A reset deletes whatever a key held, readable or not.
        let read = result.and_then(|values| parse_read(&values, keys, op == Op::Reset));
        match &read {
            // A bucket's own bad value is that bucket's problem, not Redis's: it must not
            // open the breaker for every other caller.
            Err(e) if e.is_data_error() => {
                self.note(slot, true);
                self.log_data_error_once(&e.message);
            }
            read => self.note(slot, read.is_ok()),
        }
        read
    }

    /// Groups item indices by slot (one group for standalone), in slot order.
    fn groups(&self, keys: &[String]) -> Vec<(usize, Vec<usize>)> {
        if matches!(self.connection, Connection::Single(_)) {
            return vec![(0, (0..keys.len()).collect())];
        }
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, key) in keys.iter().enumerate() {
            groups.entry(slot(key)).or_default().push(i);
        }
        groups.into_iter().collect()
    }

    /// A denial proven by the deny cache, for a single counting item.
    fn cached_denial(&self, items: &[StoreItem], key: &str) -> Option<Outcome> {
        let cache = self.deny_cache.as_ref()?;
        let [item] = items else { return None };
        if !item.mode.counts() {
            return None;
        }
        let mut entries = cache.lock();
        let entry = entries.get(key)?;
        let estimated_now = match self.settings.clock {
            RedisClock::Local => self.clock.now(),
            RedisClock::Redis => entry.now.saturating_add(self.mono() - entry.sent),
        };
        let (decision, _) = gcra::spend(&item.limit, estimated_now, Some(entry.tat), item.cost);
        if decision.allowed {
            entries.remove(key);
            return None;
        }
        self.observer.event(StoreEvent::DenyCacheHit);
        Some(Outcome {
            allowed: false,
            decisions: vec![decision],
        })
    }

    /// Remembers (or forgets) a single item's outcome in the deny cache.
    fn learn(&self, items: &[StoreItem], key: &str, sent: i64, read: &Read, allowed: bool) {
        let Some(cache) = &self.deny_cache else {
            return;
        };
        let [item] = items else { return };
        let mut entries = cache.lock();
        match read.tats.first().copied().flatten() {
            Some(tat) if !allowed && item.mode.counts() => {
                // Full: the oldest entry goes (it is the likeliest to prove nothing now).
                let entry = DenyEntry {
                    tat,
                    now: read.now,
                    sent,
                };
                entries.insert(key, entry, cache.capacity);
            }
            _ => {
                entries.remove(key);
            }
        }
    }

    /// Forgets cached denials of `keys` (a refund or reset through this replica).
    fn forget(&self, keys: &[String]) {
        if let Some(cache) = &self.deny_cache {
            let mut entries = cache.lock();
            for key in keys {
                entries.remove(key);
            }
        }
    }

    async fn spend_redis(&self, items: &[StoreItem]) -> Result<Outcome, StoreError> {
        let keys: Vec<String> = items.iter().map(|i| self.redis_key(&i.key)).collect();
        if let Some(outcome) = keys.first().and_then(|key| self.cached_denial(items, key)) {
            return Ok(outcome);
        }
        let sent = self.mono();
        let groups = self.groups(&keys);
        let calls = groups.iter().map(|(slot, members)| {
            let group_keys: Vec<String> = members.iter().map(|&i| keys[i].clone()).collect();
            let args: Vec<String> = members
                .iter()
                .flat_map(|&i| {
                    let item = &items[i];
                    let ei = item.limit.emission_interval();
                    let inc = ei.saturating_mul(i64::try_from(item.cost).unwrap_or(i64::MAX));
                    let mode = match item.mode {
                        Mode::CheckAndSpend => "0",
                        Mode::CheckOnly | Mode::Probe => "1",
                        Mode::SpendOnly => "2",
                    };
                    [
                        inc.to_string(),
                        item.limit.burst_offset().to_string(),
                        mode.to_string(),
                    ]
                })
                .collect();
            async move { self.call(Op::Spend, *slot, &group_keys, &args).await }
        });
        let reads = futures_util::future::join_all(calls).await;

        // Replay each group's decision exactly as the script made it.
        let mut outcomes = Vec::with_capacity(groups.len());
        let mut failure = None;
        for ((_, members), read) in groups.iter().zip(reads) {
            match read {
                Ok(read) => {
                    let batch: Vec<BatchItem<'_>> = members
                        .iter()
                        .map(|&i| batch_item(&items[i], items[i].mode))
                        .collect();
                    let out = gcra::spend_batch(read.now, &batch, &read.tats);
                    outcomes.push(Some((read, out)));
                }
                Err(e) => {
                    failure = Some(e);
                    outcomes.push(None);
                }
            }
        }
        let all_allowed = failure.is_none()
            && outcomes
                .iter()
                .all(|o| o.as_ref().is_some_and(|(_, out)| out.allowed));
        if !all_allowed {
            self.compensate(items, &keys, &groups, &outcomes).await;
        }
        if let Some(e) = failure {
            return Err(e);
        }

        if let (Some(key), Some(Some((read, _)))) = (keys.first(), outcomes.first()) {
            self.learn(items, key, sent, read, all_allowed);
        }
        let mut decisions = vec![UNDECIDED; items.len()];
        for ((_, members), outcome) in groups.iter().zip(&outcomes) {
            let Some((read, out)) = outcome else {
                continue;
            };
            let group_decisions = if all_allowed {
                out.decisions.clone()
            } else {
                // Nothing stays spent: report each bucket as it stands.
                let batch: Vec<BatchItem<'_>> = members
                    .iter()
                    .map(|&i| batch_item(&items[i], Mode::Probe))
                    .collect();
                gcra::spend_batch(read.now, &batch, &read.tats).decisions
            };
            for (&i, d) in members.iter().zip(group_decisions) {
                decisions[i] = d;
            }
        }
        Ok(Outcome {
            allowed: all_allowed,
            decisions,
        })
    }

    /// Refunds what groups spent in a batch that was not allowed as a whole.
    async fn compensate(
        &self,
        items: &[StoreItem],
        keys: &[String],
        groups: &[(usize, Vec<usize>)],
        outcomes: &[Option<(Read, gcra::BatchOutcome)>],
    ) {
        let mut counted = false;
        for ((slot, members), outcome) in groups.iter().zip(outcomes) {
            let Some((_, out)) = outcome else { continue };
            let spent: Vec<usize> = members
                .iter()
                .zip(&out.writes)
                .filter(|(_, w)| w.is_some())
                .map(|(&i, _)| i)
                .collect();
            if spent.is_empty() {
                continue;
            }
            if !counted {
                self.observer.event(StoreEvent::Compensation);
                counted = true;
            }
            let group_keys: Vec<String> = spent.iter().map(|&i| keys[i].clone()).collect();
            let args: Vec<String> = spent.iter().map(|&i| increment(&items[i])).collect();
            if let Err(e) = self.call(Op::Refund, *slot, &group_keys, &args).await {
                tracing::warn!(error = %e, "could not refund a partly spent cross-slot batch");
            }
        }
    }

    /// Runs `op` on every slot group of `keys` in parallel. Each group is atomic; when
    /// some fail, the error says which buckets were applied and which were not.
    async fn per_group(
        &self,
        op: Op,
        keys: &[String],
        buckets: &[&BucketKey],
        args: impl Fn(usize) -> Option<String>,
    ) -> Result<Vec<(Vec<usize>, Read)>, StoreError> {
        let groups = self.groups(keys);
        let calls = groups.iter().map(|(slot, members)| {
            let group_keys: Vec<String> = members.iter().map(|&i| keys[i].clone()).collect();
            let group_args: Vec<String> = members.iter().filter_map(|&i| args(i)).collect();
            async move { self.call(op, *slot, &group_keys, &group_args).await }
        });
        let reads = futures_util::future::join_all(calls).await;
        let mut done = Vec::with_capacity(groups.len());
        let (mut applied, mut failed, mut error) = (Vec::new(), Vec::new(), None);
        for ((_, members), read) in groups.into_iter().zip(reads) {
            let names = members.iter().map(|&i| buckets[i].to_string());
            match read {
                Ok(read) => {
                    applied.extend(names);
                    done.push((members, read));
                }
                Err(e) => {
                    failed.extend(names);
                    error.get_or_insert(e);
                }
            }
        }
        match error {
            None => Ok(done),
            Some(e) if applied.is_empty() => Err(e),
            Some(e) => Err(StoreError {
                message: format!(
                    "{}: {} applied to {}; not to {}",
                    e.message,
                    op.name(),
                    applied.join(", "),
                    failed.join(", ")
                ),
                ..e
            }),
        }
    }

    async fn refund_redis(&self, items: &[StoreItem]) -> Result<Vec<Decision>, StoreError> {
        let keys: Vec<String> = items.iter().map(|i| self.redis_key(&i.key)).collect();
        self.forget(&keys);
        let buckets: Vec<&BucketKey> = items.iter().map(|i| &i.key).collect();
        let done = self
            .per_group(Op::Refund, &keys, &buckets, |i| Some(increment(&items[i])))
            .await?;
        let mut decisions = vec![UNDECIDED; items.len()];
        for (members, read) in done {
            for (&i, tat) in members.iter().zip(&read.tats) {
                decisions[i] = gcra::refund(&items[i].limit, read.now, *tat, items[i].cost).0;
            }
        }
        Ok(decisions)
    }

    async fn reset_redis(&self, keys: &[BucketKey]) -> Result<u32, StoreError> {
        let redis_keys: Vec<String> = keys.iter().map(|k| self.redis_key(k)).collect();
        self.forget(&redis_keys);
        let buckets: Vec<&BucketKey> = keys.iter().collect();
        let done = self
            .per_group(Op::Reset, &redis_keys, &buckets, |_| None)
            .await?;
        let live: usize = done
            .iter()
            .map(|(_, read)| {
                read.tats
                    .iter()
                    .filter(|t| t.is_some_and(|t| t > read.now))
                    .count()
            })
            .sum();
        Ok(live as u32)
    }

    /// Logs a data error the first time its message is seen (a bounded set of them).
    fn log_data_error_once(&self, message: &str) {
        let mut seen = self
            .data_errors_logged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.len() < 1024 && seen.insert(message.to_string()) {
            tracing::error!(
                error = message,
                "unreadable bucket in Redis; its requests fail until it is reset or expires"
            );
        }
    }

    /// The answer when Redis failed, by policy.
    fn on_failure(&self, items: &[StoreItem], error: StoreError) -> Result<Outcome, StoreError> {
        if error.is_data_error() {
            // Redis is fine; this bucket is not: no policy would decide it better.
            return Err(error);
        }
        let policy = self.settings.failure;
        if policy != FailurePolicy::Unavailable {
            self.observer.event(StoreEvent::Fallback(match policy {
                FailurePolicy::Allow => "allow",
                FailurePolicy::Deny => "deny",
                _ => "local",
            }));
        }
        tracing::debug!(error = %error, ?policy, "redis failed; applying the failure policy");
        let fixed = |allowed: bool| Outcome {
            allowed,
            decisions: items
                .iter()
                .map(|i| Decision {
                    allowed,
                    remaining: if allowed { i.limit.burst() as i64 } else { 0 },
                    retry_in: 0,
                    reset_in: 0,
                })
                .collect(),
        };
        match (policy, &self.fallback) {
            (FailurePolicy::Allow, _) => Ok(fixed(true)),
            (FailurePolicy::Deny, _) => Ok(fixed(false)),
            (FailurePolicy::Local, Some(local)) => local.spend_now(&self.local_share(items)),
            _ => Err(error),
        }
    }

    /// The items with each limit divided by the local divisor.
    fn local_share(&self, items: &[StoreItem]) -> Vec<StoreItem> {
        let divisor = self.settings.local_divisor.max(1);
        items
            .iter()
            .map(|item| {
                let l = item.limit;
                let share = Limit::new(
                    l.burst().div_ceil(divisor),
                    l.count().div_ceil(divisor),
                    l.period(),
                )
                .unwrap_or(l);
                StoreItem {
                    limit: share,
                    cost: item.cost.min(share.burst()),
                    ..item.clone()
                }
            })
            .collect()
    }
}

/// Placeholder for decisions not yet filled (every slot is filled before use).
const UNDECIDED: Decision = Decision {
    allowed: false,
    remaining: 0,
    retry_in: 0,
    reset_in: 0,
};

fn batch_item(item: &StoreItem, mode: Mode) -> BatchItem<'_> {
    BatchItem {
        limit: &item.limit,
        cost: item.cost,
        mode,
    }
}

fn increment(item: &StoreItem) -> String {
    item.limit
        .emission_interval()
        .saturating_mul(i64::try_from(item.cost).unwrap_or(i64::MAX))
        .to_string()
}

/// Parses the script's `{now, tat...}` for `keys`. A reply of the wrong shape is Redis
/// misbehaving; a stored value that is no TAT is a data error of that bucket.
/// `lenient`: an unreadable value counts as a bucket that was not full.
fn parse_read(values: &[String], keys: &[String], lenient: bool) -> Result<Read, StoreError> {
    let bad = || StoreError::transient("redis: malformed script reply");
    if values.len() != keys.len() + 1 {
        return Err(bad());
    }
    let now = values[0].parse::<Nanos>().map_err(|_| bad())?;
    let tats = values[1..]
        .iter()
        .zip(keys)
        .map(|(v, key)| {
            if v.is_empty() {
                Ok(None)
            } else if lenient {
                Ok(Some(v.parse::<Nanos>().unwrap_or(Nanos::MAX)))
            } else {
                v.parse::<Nanos>().map(Some).map_err(|_| {
                    StoreError::data(format!(
                        "redis: bucket {key} holds {:?}, which is no TAT; reset it",
                        v.chars().take(40).collect::<String>()
                    ))
                })
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Read { now, tats })
}

impl Store for RedisStore {
    fn spend<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Outcome> {
        Box::pin(async move {
            match self.spend_redis(items).await {
                Ok(outcome) => Ok(outcome),
                Err(e) => self.on_failure(items, e),
            }
        })
    }

    fn refund<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Vec<Decision>> {
        Box::pin(async move {
            match (self.refund_redis(items).await, &self.fallback) {
                (Ok(d), _) => Ok(d),
                (Err(_), Some(local)) => Ok(local.refund_now(&self.local_share(items))),
                (Err(e), None) => Err(e),
            }
        })
    }

    fn reset<'a>(&'a self, keys: &'a [BucketKey]) -> StoreFuture<'a, u32> {
        Box::pin(async move { self.reset_redis(keys).await })
    }

    fn sweep(&self) -> usize {
        // Redis expires keys at their TAT; only the local fallback needs sweeping.
        self.fallback.as_ref().map_or(0, MemoryStore::sweep)
    }

    fn limits_changed(&self) {
        if let Some(cache) = &self.deny_cache {
            cache.lock().clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deny_cache_evicts_its_oldest_entry_when_full() {
        let entry = |tat| DenyEntry {
            tat,
            now: 0,
            sent: 0,
        };
        let mut cache = DenyEntries::default();
        for i in 0..1_000 {
            cache.insert(&format!("k{i}"), entry(i), 100);
            assert!(cache.map.len() <= 100);
            assert!(cache.order.len() <= 200);
        }
        assert_eq!(cache.get("k999").map(|e| e.tat), Some(999));
        assert!(cache.get("k899").is_none(), "the oldest went first");
        assert_eq!(cache.get("k900").map(|e| e.tat), Some(900));
        // Removed keys leave the queue in time; updates keep their place.
        for i in 900..1_000 {
            cache.remove(&format!("k{i}"));
        }
        cache.insert("fresh", entry(1), 100);
        cache.insert("fresh", entry(2), 100);
        assert_eq!(cache.get("fresh").map(|e| e.tat), Some(2));
        assert_eq!(cache.map.len(), 1);
    }

    #[test]
    fn slots_follow_the_cluster_spec() {
        // Examples from the Redis Cluster specification and redis-cli.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12_182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}")); // empty tag: the whole key
        assert_ne!(slot("foo{}{bar}"), slot("bar"));
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
    }

    #[test]
    fn ids_cannot_pick_slots() {
        assert_eq!(escape("plain"), "plain");
        assert_eq!(escape("a{b}c%"), "a%7Bb%7Dc%25");
        assert_ne!(escape("%7B"), escape("{"));
    }

    #[test]
    fn script_replies_are_checked() {
        let keys = ["a".to_string(), "b".to_string()];
        let ok = parse_read(&["5".into(), "".into(), "7".into()], &keys, false).unwrap();
        assert_eq!((ok.now, ok.tats), (5, vec![None, Some(7)]));
        assert!(parse_read(&["5".into()], &keys, false).is_err());
        assert!(parse_read(&["x".into(), "".into()], &keys[..1], false).is_err());
        let reply = ["5".to_string(), "99999999999999999999".to_string()];
        let poisoned = parse_read(&reply, &keys[..1], false);
        assert!(poisoned.is_err_and(|e| e.is_data_error()));
        let reset = parse_read(&reply, &keys[..1], true).unwrap();
        assert_eq!(reset.tats, vec![Some(Nanos::MAX)]);
    }
}
