//! The Redis store itself: its connection, state, and the batches of every operation.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Weak};
use tokio::time::Instant;

use super::breaker::Breaker;
use super::bucket_keys::{self, BucketKeys, Claims};
use super::cluster::{escape, SLOTS};
use super::coalesce::Lanes;
use super::connection::Connection;
use super::deny_cache::{DenyCache, DenyEntries};
use super::failure_log::FailureLog;
use super::invocation::{ModuleUse, BATCH_SCRIPT};
use super::items::{increment_nanos, wires};
use super::lease_keys::LeaseKeys;
use super::leases;
use super::once::{voided, Under};
use super::wire::{Op, Read, WireWindow};
use super::{FailurePolicy, RedisSettings};

use crate::{
    LeaseCounters, LeaseEvents, MemoryStore, Once, Outcome, Store, StoreError, StoreEvent,
    StoreFuture, StoreItem, StoreObserver,
};
use cellrate_core::clock::{Clock, Nanos};
use cellrate_core::gcra::{self, Decision, Mode};
use cellrate_limits::names::BucketKey;

/// The Redis store. See the module docs.
pub struct RedisStore {
    pub(super) connection: Connection,
    pub(super) script: redis::Script,
    /// Whether the script's calls go to cellrate's module (`--redis-module`).
    pub(super) module: Arc<ModuleUse>,
    pub(super) settings: RedisSettings,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) observer: Arc<dyn StoreObserver>,
    /// The failure lines of the log (rate-limited).
    pub(super) failure_log: FailureLog,
    pub(super) fallback: Option<MemoryStore>,
    pub(super) breakers: Box<[Breaker]>,
    pub(super) started: Instant,
    /// Whether Redis answers: some used slot's last call succeeded (for readiness, when
    /// required).
    pub(super) healthy: Arc<AtomicBool>,
    /// Breakers whose last call failed, and (cluster) breakers that saw a call.
    pub(super) failing_slots: AtomicUsize,
    pub(super) used_slot_count: AtomicUsize,
    /// Recent denials, by Redis key (see [`DenyCache`]).
    pub(super) deny_cache: Option<DenyCache>,
    /// Data errors already logged, so that a bad bucket logs once, not per request.
    pub(super) data_errors_logged: parking_lot::Mutex<std::collections::HashSet<String>>,
    /// Spend calls in flight and the batches waiting for the next (see [`super::coalesce`]).
    pub(super) lanes: Lanes,
    /// This store, for the tasks that send waiting batches.
    pub(super) me: Weak<RedisStore>,
    /// Leases taken, released and found expired (for the metrics).
    pub(super) lease_events: LeaseCounters,
    /// The lease keys this replica counts, per name (`--lease-name-share`).
    pub(super) lease_keys: LeaseKeys,
    /// The bucket keys this replica counts, per name (`--bucket-name-share`).
    pub(super) bucket_keys: BucketKeys,
}

impl RedisStore {
    /// A store for `settings`. Standalone connections are made lazily and re-made after
    /// failures; so are cluster connections. Fails only on unusable settings.
    pub fn new(
        settings: RedisSettings,
        clock: Arc<dyn Clock>,
        observer: Arc<dyn StoreObserver>,
    ) -> Result<Arc<RedisStore>, StoreError> {
        let connection = Connection::open(&settings, settings.timeout)?;
        let breakers = if settings.cluster_nodes.is_empty() {
            1
        } else {
            SLOTS
        };
        let deny_cache = settings.deny_cache;
        let fallback =
            (settings.failure == FailurePolicy::Local).then(|| MemoryStore::new(clock.clone()));
        let failure_log = FailureLog::new(&settings);
        let lease_keys = LeaseKeys::new(settings.max_lease_keys, settings.lease_name_share);
        let bucket_keys = BucketKeys::new(
            settings.max_bucket_keys,
            settings.caller_bucket_share,
            settings.bucket_name_share,
        );
        Ok(Arc::new_cyclic(|me| RedisStore {
            me: me.clone(),
            failure_log,
            lanes: Lanes::new(breakers),
            connection,
            script: redis::Script::new(BATCH_SCRIPT),
            module: Arc::new(ModuleUse::new(settings.module)),
            settings,
            clock,
            observer,
            fallback,
            breakers: (0..breakers).map(|_| Breaker::default()).collect(),
            started: Instant::now(),
            healthy: Arc::new(AtomicBool::new(true)),
            failing_slots: AtomicUsize::new(0),
            lease_events: LeaseCounters::default(),
            lease_keys,
            bucket_keys,
            used_slot_count: AtomicUsize::new(0),
            data_errors_logged: Default::default(),
            deny_cache: (deny_cache > 0).then(|| DenyCache {
                entries: parking_lot::Mutex::new(DenyEntries::default()),
                capacity: deny_cache,
            }),
        }))
    }

    /// Whether the last Redis call succeeded.
    pub fn healthy(&self) -> Arc<AtomicBool> {
        self.healthy.clone()
    }

    /// The Redis key of a bucket: prefix, then `<number>:<id>` or, tagged,
    /// `<number>:{<id>}` (a calendar key's `@<period>` after the number); the id escaped.
    pub fn redis_key(&self, key: &BucketKey) -> String {
        let (number, id) = key.parts();
        let head = key.head();
        let tagged = self
            .settings
            .tag_by_id
            .as_ref()
            .is_none_or(|names| names.contains(&number));
        let (id, prefix) = (escape(id), &self.settings.prefix);
        // Pushed into one allocation of the right size: `format!` cost ~1 000 instructions
        // a key (about a tenth of the client's work per decision through the Redis store).
        let mut out = String::with_capacity(prefix.len() + head.len() + id.len() + 3);
        out.push_str(prefix);
        out.push_str(head);
        out.push(':');
        if tagged {
            out.push('{');
            out.push_str(&id);
            out.push('}');
        } else {
            out.push_str(&id);
        }
        out
    }

    /// Real time since the store started, for the deny cache's estimate of Redis's own
    /// clock (`TIME`), which runs in real time whatever a test's fake clock says; timers
    /// of ours (the breaker) read the injected clock's monotonic time instead.
    pub(super) fn mono(&self) -> i64 {
        self.started.elapsed().as_nanos() as i64
    }

    /// Spends `items`, under a token (or only resolves it) when `under` says so: see
    /// `once.rs`.
    pub(super) async fn spend_redis(
        &self,
        items: &[StoreItem],
        under: Option<Under<'_>>,
    ) -> Result<Outcome, StoreError> {
        let keys: Vec<String> = items.iter().map(|i| self.redis_key(&i.key)).collect();
        let resolving = under.is_some_and(|u| u.resolve);
        if !resolving {
            if let Some(outcome) = keys.first().and_then(|key| self.cached_denial(items, key)) {
                return Ok(outcome);
            }
        }
        let sent = self.mono();
        let now = self.clock.now();
        // A key this replica does not count, while its name's share is full, is not
        // written (bucket_keys.rs).
        let mut buckets = Claims::new(&self.bucket_keys, items, &keys, now, resolving);
        let probed = bucket_keys::refused_batch(items, buckets.get());
        let asked = items;
        let items = probed.as_deref().unwrap_or(items);
        // Only a request with a lease item touches the lease keys' lock; a resolution
        // only reads what an earlier call did, so it claims no key.
        let leasing = !resolving && items.iter().any(leases::is_lease);
        let seq = if leasing { self.lease_keys.seq() } else { 0 };
        let claims = match leasing {
            true => leases::claim(&self.lease_keys, items, &keys, now),
            false => vec![None; items.len()],
        };
        let refused = leases::refusals(&claims);
        let groups = self.groups(&keys);
        let reads = self
            .call_groups(items, &keys, &groups, (now, &refused), under)
            .await;

        let (outcomes, failure, void) = leases::replay_groups(items, &groups, reads, &refused);
        let all_allowed = failure.is_none()
            && !void
            && outcomes
                .iter()
                .all(|o| o.as_ref().is_some_and(|(_, out)| out.allowed));
        if !all_allowed {
            self.compensate(items, &keys, &groups, &outcomes, under.map(|u| u.once))
                .await;
        }
        if !resolving {
            let reads = outcomes.iter().map(|o| o.as_ref().map(|(read, _)| read));
            leases::count(&self.lease_events, items, &groups, reads, all_allowed);
        }
        if leasing {
            let (lease_keys, claims) = (&self.lease_keys, &claims);
            leases::settle(
                lease_keys,
                items,
                &keys,
                &groups,
                &outcomes,
                claims,
                seq,
                all_allowed,
            );
        }
        let after = self.clock.now();
        buckets.settle(&groups, &outcomes, after);
        if let Some(e) = failure {
            return Err(e);
        }
        if let (Some(key), Some(Some((read, _))), false) =
            (keys.first(), outcomes.first(), resolving)
        {
            self.learn(items, key, sent, read, all_allowed);
        }
        let mut decisions = decide_groups(items, &groups, &outcomes, all_allowed, &refused)?;
        if leases::refuse(items, &groups, &outcomes, &refused, &mut decisions) {
            self.lease_events.refused();
        }
        let no_room = probed.is_some() && {
            self.bucket_keys.count_refusals(buckets.get());
            bucket_keys::refuse(asked, buckets.get(), now, &mut decisions)
        };
        Ok(Outcome {
            allowed: all_allowed && !no_room,
            decisions,
        })
    }

    /// Each slot group's call: `now` and the acquires refused their lease key.
    async fn call_groups(
        &self,
        items: &[StoreItem],
        keys: &[String],
        groups: &[(usize, Vec<usize>)],
        (now, refused): (Nanos, &[bool]),
        under: Option<Under<'_>>,
    ) -> Vec<Result<Option<Read>, StoreError>> {
        match groups {
            // One slot (every standalone call): awaited in place, not moved into a
            // `join_all` (the move was 6 % of the client's instructions per decision).
            [(slot, members)] => {
                let wires = wires(items, keys, members, now, refused);
                vec![self.group_call(*slot, wires, under).await]
            }
            _ => {
                let calls = groups.iter().map(|(slot, members)| {
                    let wires = wires(items, keys, members, now, refused);
                    self.group_call(*slot, wires, under)
                });
                futures_util::future::join_all(calls).await
            }
        }
    }

    /// Refunds what groups spent in a batch that was not allowed as a whole.
    async fn compensate(
        &self,
        items: &[StoreItem],
        keys: &[String],
        groups: &[(usize, Vec<usize>)],
        outcomes: &[Option<(Read, gcra::BatchOutcome)>],
        once: Option<&Once>,
    ) {
        let mut counted = false;
        for ((slot, members), outcome) in groups.iter().zip(outcomes) {
            let Some((read, out)) = outcome else { continue };
            // A bucket holds what its last item wrote (each item is decided from the state
            // before the batch, so a bucket named twice holds one item's spend): that
            // item is refunded, unless it is a charge, which stays whatever the batch
            // decides.
            let written: Vec<usize> = members
                .iter()
                .zip(&out.writes)
                .filter(|(_, w)| w.is_some())
                .map(|(&i, _)| i)
                .collect();
            let now = self.clock.now();
            let spent: Vec<(usize, String)> = written
                .iter()
                .enumerate()
                .filter(|&(n, &i)| !written[n + 1..].iter().any(|&j| keys[j] == keys[i]))
                .map(|(_, &i)| i)
                .filter(|&i| items[i].mode != Mode::Charge)
                .map(|i| (i, increment(&items[i], now)))
                .chain(leases::taken_back(items, members, read, out))
                .collect();
            if spent.is_empty() {
                continue;
            }
            if !counted {
                self.observer.event(StoreEvent::Compensation);
                counted = true;
            }
            let group_keys: Vec<String> = spent.iter().map(|(i, _)| keys[*i].clone()).collect();
            let args: Vec<String> = spent.into_iter().map(|(_, arg)| arg).collect();
            let given_back = match once {
                // Under the group's marker, so that it is given back once, however many
                // resolutions see it.
                Some(once) => self.undo(*slot, once, &group_keys, &args).await,
                None => self
                    .call(Op::Refund, *slot, &group_keys, &args)
                    .await
                    .map(|_| ()),
            };
            if let Err(e) = given_back {
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
            Some(e) => Err(StoreError::Partial {
                op: op.name(),
                applied: applied.join(", "),
                missing: failed.join(", "),
                source: Box::new(e),
            }),
        }
    }

    async fn refund_redis(&self, items: &[StoreItem]) -> Result<Vec<Decision>, StoreError> {
        let now = self.clock.now();
        let keys: Vec<String> = items.iter().map(|i| self.redis_key(&i.key)).collect();
        self.forget(&keys);
        let buckets: Vec<&BucketKey> = items.iter().map(|i| &i.key).collect();
        let done = self
            .per_group(Op::Refund, &keys, &buckets, |i| {
                Some(increment(&items[i], now))
            })
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
    pub(super) fn log_data_error_once(&self, message: &str) {
        let mut seen = self.data_errors_logged.lock();
        if seen.len() < 1024 && seen.insert(message.to_string()) {
            tracing::error!(
                error = message,
                "unreadable bucket in Redis; its requests fail until it is reset or expires"
            );
        }
    }
}

/// Each item's decision from its group's outcome: as decided when the whole batch was
/// allowed; else nothing stays spent but the charges (and releases), so each other bucket
/// is reported as it stands, and each charged one as its charge left it.
fn decide_groups(
    items: &[StoreItem],
    groups: &[(usize, Vec<usize>)],
    outcomes: &[Option<(Read, gcra::BatchOutcome)>],
    all_allowed: bool,
    refused: &[bool],
) -> Result<Vec<Decision>, StoreError> {
    let mut decisions = vec![UNDECIDED; items.len()];
    for ((_, members), outcome) in groups.iter().zip(outcomes) {
        let Some((read, out)) = outcome else {
            continue;
        };
        let group_decisions = match all_allowed {
            true => out.decisions.clone(),
            false => leases::replay(items, members, read, true, refused)?.decisions,
        };
        for (&i, d) in members.iter().zip(group_decisions) {
            decisions[i] = d;
        }
    }
    Ok(decisions)
}

/// Placeholder for decisions not yet filled (every slot is filled before use).
pub(super) const UNDECIDED: Decision = Decision {
    allowed: false,
    remaining: 0,
    retry_in: 0,
    reset_in: 0,
};

/// A refund's argument (see [`WireWindow::refund_arg`]).
pub(super) fn increment(item: &StoreItem, now: Nanos) -> String {
    let window = WireWindow::new(item.limit.window(), now);
    let increment = match window {
        WireWindow::Gcra => increment_nanos(item),
        _ => 0,
    };
    window.refund_arg(increment, item.cost)
}

/// A lease is released (`Mode::Release`), never refunded: the service refuses refunds of
/// concurrency limits, and so does this store, before any call.
fn no_lease_refunds(items: &[StoreItem]) -> Result<(), StoreError> {
    if items.iter().any(leases::is_lease) {
        return Err(StoreError::Config(
            "a concurrency limit's lease is released (MODE_RELEASE), not refunded".into(),
        ));
    }
    Ok(())
}

impl Store for RedisStore {
    fn spend<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Outcome> {
        Box::pin(async move {
            leases::check_ids(items)?;
            match self.spend_redis(items, None).await {
                Ok(outcome) => Ok(outcome),
                Err(e) => self.on_failure(items, e),
            }
        })
    }

    fn keeps_tokens(&self) -> bool {
        true
    }

    fn spend_once<'a>(
        &'a self,
        items: &'a [StoreItem],
        once: &'a Once,
    ) -> StoreFuture<'a, Outcome> {
        Box::pin(async move {
            leases::check_ids(items)?;
            let under = Under {
                once,
                resolve: false,
            };
            match self.spend_redis(items, Some(under)).await {
                Ok(outcome) => Ok(outcome),
                // Not known, or resolved as not made: resolution, not the failure
                // policy, says what it did (a policy's answer would misstate the record).
                Err(e) if e.may_have_applied() || voided(&e) => Err(e),
                Err(e) => self.on_failure(items, e),
            }
        })
    }

    fn resolve_once<'a>(
        &'a self,
        items: &'a [StoreItem],
        once: &'a Once,
    ) -> StoreFuture<'a, Outcome> {
        Box::pin(async move {
            leases::check_ids(items)?;
            let under = Under {
                once,
                resolve: true,
            };
            self.spend_redis(items, Some(under)).await
        })
    }

    fn refund<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Vec<Decision>> {
        Box::pin(async move {
            no_lease_refunds(items)?;
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
        // Redis expires keys at their TAT; only the local fallback needs sweeping, and the
        // lease keys this replica counts.
        self.lease_keys.sweep(self.clock.now());
        self.bucket_keys.sweep(self.clock.now());
        self.fallback.as_ref().map_or(0, MemoryStore::sweep)
    }

    fn bucket_refusals(&self) -> [u64; 3] {
        // This replica's count of the keys it writes, and the local fallback's table.
        let mut refusals = self.bucket_keys.refusals();
        let local = self.fallback.as_ref().map(MemoryStore::bucket_refusals);
        for (all, theirs) in refusals.iter_mut().zip(local.unwrap_or_default()) {
            *all += theirs;
        }
        refusals
    }

    fn lease_events(&self) -> LeaseEvents {
        let mut events = self.lease_events.get();
        if let Some(local) = &self.fallback {
            let theirs = local.lease_events();
            events.acquired += theirs.acquired;
            events.released += theirs.released;
            events.expired += theirs.expired;
            events.refused += theirs.refused;
        }
        events
    }

    fn limits_changed(&self) {
        if let Some(cache) = &self.deny_cache {
            cache.lock().clear();
        }
    }
}
