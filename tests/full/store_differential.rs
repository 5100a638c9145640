//! One truth for both stores, generated: random timelines run on a fresh memory store and
//! on the Redis store (on redis-server, on Valkey, and on a Redis Cluster, where batches
//! span slots and a denied one is compensated) with the same fake clock,
//! which the Redis store gives its script (`RedisClock::Local`), and every answer must be
//! identical: each spend's `allowed` and all its decisions, each refund's decisions, each
//! reset's count. A failure prints the timeline shrunk to a minimal one.
//!
//! A timeline has a few keys and four limits (GCRA of different bursts and emission
//! intervals that are not whole seconds, so that the script's sums carry across seconds;
//! calendar windows: UTC minutes to years, envoyproxy/ratelimit's fixed 7, 30 and 365 days,
//! a New York month, a Berlin week, a month from the 31st; cellrate's own, whose debt stops
//! at one count, or envoyproxy/ratelimit's, which count every hit), and up to 12 steps: batches of
//! one to three items (all-or-nothing) in every mode (spend, check-only, spend-only, probe,
//! charge into debt), costs 0, small, above the burst, huge and `u64::MAX`; refunds;
//! resets; and clock moves: waits, jumps of days across month and year ends, to a calendar
//! window's end (or a nanosecond before it), to the last answer's `retry_in` (or a
//! nanosecond either side). An id may be used with several limits, GCRA and calendar,
//! keyed as the service keys them (a calendar window's bucket has its period in the key):
//! what a reload or an override that changes a limit does to its buckets.
//!
//! A limit may be a concurrency limit (1 or 2 leases, a hold of 3 to 30 GUARDs): its items
//! acquire, release or peek a lease with an id from a pool of three, on one key, in batches with rate
//! items (a denied batch acquires nothing); resets free its leases. A lease key is named at
//! most once per batch and never refunded, as the service sends them.
//!
//! Left out, because the stores do not share them: the clock going back (Redis expires a
//! key on its own clock, so after a step back the two may hold different buckets by
//! design), and the local fallback (it decides on a share of each limit, not the limit).
//! Settle and overrides live above the store (`service/`): they reach it as the charges,
//! refunds and changed limits generated here.
//!
//! **Real time.** Redis lets a key expire when its time to live (the fake clock's distance
//! to the TAT, rounded up to a millisecond) has passed in *real* time. Emission intervals
//! are therefore at least [`GUARD`], and when a step writes a value less than [`GUARD`]
//! ahead of the fake clock (a refund, a calendar window about to end, a cluster's
//! compensation), the clock is moved to that value before the next step, while the key is
//! certainly still there: both stores then read a past value as full.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cellrate::clock::{CalendarPeriod, Clock, FakeClock, Nanos, DAY, SECOND};
use cellrate::gcra::{Decision, Limit, Mode, Window};
use cellrate::limits::names::BucketKey;
use cellrate::observe::metrics::Metrics;
use cellrate::store::redis::{RedisClock, RedisModule, RedisSettings, RedisStore};
use cellrate::store::{MemoryStore, Store, StoreItem};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};

use crate::common::redis_module::{cluster_with_module, redis_with_module, valkey_with_module};
use crate::common::redis_server::{RedisCluster, RedisServer};

/// 2023-11-14T22:13:20.987654321Z.
const T0: Nanos = 1_700_000_000 * SECOND + 987_654_321;
/// The least distance from now of a value Redis keeps until the case ends (see the module
/// docs): far more than a case takes in real time.
const GUARD: Nanos = 10 * SECOND;
const KEYS: usize = 3;
const LIMITS: usize = 4;
/// Timelines per backend.
const CASES: u32 = 2_000;

/// A limit of a timeline.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Gcra {
        burst: u64,
        count: u64,
        ei: Nanos,
    },
    Calendar {
        count: u64,
        period: CalendarPeriod,
        every_hit: bool,
    },
    Lease {
        count: u64,
        hold: Nanos,
    },
}

impl Shape {
    fn limit(self) -> Limit {
        match self {
            Shape::Gcra { burst, count, ei } => Limit::new(burst, count, ei * count as i64),
            Shape::Calendar {
                count,
                period,
                every_hit: false,
            } => Limit::calendar(count, period),
            Shape::Calendar { count, period, .. } => Limit::fixed_window(count, period),
            Shape::Lease { count, hold } => Limit::concurrency(count, hold),
        }
        .unwrap()
    }
}

/// One item of a batch: a key, the limit it is decided by, its cost and mode; on a
/// concurrency limit, its lease mode and id instead (cost 1).
#[derive(Clone, Copy, Debug)]
struct Item {
    key: usize,
    limit: usize,
    cost: u64,
    mode: Mode,
    lease: (Mode, u8),
}

#[derive(Clone, Debug)]
enum Step {
    Spend(Vec<Item>),
    Refund(Vec<Item>),
    /// Buckets by id and limit.
    Reset(Vec<(usize, usize)>),
    /// Forward by nanoseconds.
    Wait(Nanos),
    /// To the end of the window of a calendar limit (nothing for GCRA), less nanoseconds.
    ToWindowEnd {
        limit: usize,
        less: Nanos,
    },
    /// Forward by the last decision's `retry_in`, plus nanoseconds (when still forward).
    ByRetry(Nanos),
}

#[derive(Clone, Debug)]
struct Timeline {
    limits: Vec<Shape>,
    steps: Vec<Step>,
}

fn shape() -> impl Strategy<Value = Shape> {
    let periods: Vec<CalendarPeriod> = [
        "1m",
        "1h",
        "1d",
        "1mo",
        "1y",
        "1w@Europe/Berlin",
        "1mo@America/New_York",
        "1mo~31",
    ]
    .iter()
    .map(|text| CalendarPeriod::parse(text).unwrap())
    .chain([
        CalendarPeriod::Week,
        CalendarPeriod::Days30,
        CalendarPeriod::Days365,
    ])
    .collect();
    let gcra = (1u64..=5, 1u64..=5, GUARD..=6 * GUARD).prop_map(|(burst, count, ei)| Shape::Gcra {
        burst,
        count,
        ei,
    });
    let calendar = (1u64..=5, prop::sample::select(periods), any::<bool>()).prop_map(
        |(count, period, every_hit)| Shape::Calendar {
            count,
            period,
            every_hit,
        },
    );
    let lease =
        (1u64..=2, 3 * GUARD..=30 * GUARD).prop_map(|(count, hold)| Shape::Lease { count, hold });
    prop_oneof![3 => gcra, 2 => calendar, 2 => lease]
}

fn any_item() -> impl Strategy<Value = Item> {
    let cost = prop_oneof![
        2 => Just(0u64),
        6 => 1u64..=3,
        2 => 4u64..=11,
        1 => Just(1_000_000),
        1 => Just(u64::MAX),
    ];
    let mode = prop_oneof![
        5 => Just(Mode::CheckAndSpend),
        2 => Just(Mode::CheckOnly),
        2 => Just(Mode::SpendOnly),
        1 => Just(Mode::Probe),
        2 => Just(Mode::Charge),
    ];
    let lease = prop_oneof![
        4 => Just(Mode::Acquire),
        4 => Just(Mode::Release),
        1 => Just(Mode::Probe),
    ];
    (0..KEYS, 0..LIMITS, cost, mode, (lease, 0..3u8)).prop_map(|(key, limit, cost, mode, lease)| {
        Item {
            key,
            limit,
            cost,
            mode,
            lease,
        }
    })
}

fn step() -> impl Strategy<Value = Step> {
    let wait = prop_oneof![
        3 => 1..=3 * GUARD,
        1 => (1i64..=400).prop_map(|days| days * DAY),
    ];
    prop_oneof![
        6 => prop::collection::vec(any_item(), 1..=3).prop_map(Step::Spend),
        2 => prop::collection::vec(any_item(), 1..=2).prop_map(Step::Refund),
        1 => prop::collection::vec((0..KEYS, 0..LIMITS), 1..=2).prop_map(Step::Reset),
        3 => wait.prop_map(Step::Wait),
        1 => (0..LIMITS, 0i64..=1).prop_map(|(limit, less)| Step::ToWindowEnd { limit, less }),
        2 => (-1i64..=1).prop_map(Step::ByRetry),
    ]
}

fn timelines() -> impl Strategy<Value = Timeline> {
    (
        prop::collection::vec(shape(), LIMITS),
        prop::collection::vec(step(), 1..=12),
    )
        .prop_map(|(limits, steps)| Timeline { limits, steps })
}

/// Numbers each run's keys, so that every case (and every shrinking attempt) has fresh
/// buckets in Redis.
static RUNS: AtomicU64 = AtomicU64::new(0);

/// The two stores on one fake clock, and what the timelines did (that they exercised
/// what they are meant to).
struct Subjects {
    clock: FakeClock,
    /// The Redis stores, taking the steps in turn: the script's alone, or the script's
    /// and the module's (every step then switches between them, in both directions).
    stores: Vec<Arc<RedisStore>>,
    /// Each bucket at most once per spend batch (the service's rule): a cluster's
    /// compensation assumes it (below).
    distinct: bool,
    seen: std::cell::RefCell<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    steps: u64,
    allowed_batches: u64,
    denied_batches: u64,
    /// Charges that did not fit (into debt).
    debts: u64,
    /// Answers of a window that holds more than twice its count (every hit counted).
    deep: u64,
    /// Refund items that changed a bucket.
    refunded: u64,
    /// Moves past a value written less than GUARD ahead.
    skips: u64,
    /// Acquires allowed and denied, releases that freed a lease.
    acquired: u64,
    full: u64,
    released: u64,
}

impl Subjects {
    /// Runs `timeline`; the first step the stores answer differently, described.
    async fn run(&self, timeline: &Timeline) -> Result<(), String> {
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        self.clock.set(T0);
        let memory = MemoryStore::new(Arc::new(self.clock.clone()));
        let limits: Vec<Limit> = timeline.limits.iter().map(|s| s.limit()).collect();
        let ids: Vec<String> = (0..KEYS).map(|k| format!("r{run}k{k}")).collect();
        // Every bucket a step can name: each id's GCRA bucket and its calendar ones.
        let keys: Vec<BucketKey> = ids
            .iter()
            .flat_map(|id| {
                let mut windows: Vec<Window> = limits.iter().map(|l| l.window()).collect();
                windows.dedup();
                windows.into_iter().map(|w| BucketKey::windowed(100, id, w))
            })
            .collect();
        let items = |items: &[Item]| -> Vec<StoreItem> {
            let item = |i: &Item| {
                let limit = limits[i.limit];
                // Leases on one key, so that releases find what acquires took.
                let id = match limit.window() {
                    Window::Concurrency => &ids[0],
                    _ => &ids[i.key],
                };
                let key = BucketKey::windowed(100, id, limit.window());
                match limit.window() {
                    Window::Concurrency => StoreItem {
                        key,
                        limit,
                        cost: 1,
                        mode: i.lease.0,
                        lease: i
                            .lease
                            .0
                            .is_lease()
                            .then(|| Arc::from(format!("L{}", i.lease.1))),
                    },
                    _ => StoreItem {
                        key,
                        limit,
                        cost: i.cost,
                        mode: i.mode,
                        lease: None,
                    },
                }
            };
            items.iter().map(item).collect()
        };
        let is_lease = |i: &StoreItem| i.limit.window() == Window::Concurrency;
        let lease_keys: Vec<StoreItem> = ids
            .iter()
            .filter_map(|id| {
                let limit = *limits.iter().find(|l| l.window() == Window::Concurrency)?;
                Some(StoreItem {
                    key: BucketKey::windowed(100, id, limit.window()),
                    limit,
                    cost: 1,
                    mode: Mode::Probe,
                    lease: None,
                })
            })
            .collect();
        let mut stored = self.stored(&memory, &keys).await;
        let mut retry_in = 0;
        for (n, step) in timeline.steps.iter().enumerate() {
            let now = self.clock.now();
            let redis = &self.stores[n % self.stores.len()];
            // The buckets this step named (on a cluster, a compensation rewrites them).
            let mut touched: Vec<BucketKey> = Vec::new();
            let differ = |memory: String, redis: String| {
                Err(format!(
                    "step {n} ({step:?}) at T0 + {} ns:\n  memory: {memory}\n  redis:  {redis}",
                    now - T0
                ))
            };
            match step {
                Step::Spend(batch) => {
                    let mut batch = items(batch);
                    let distinct = self.distinct;
                    batch.retain(|i| {
                        let new = !touched.contains(&i.key);
                        touched.push(i.key.clone());
                        new || !(distinct || is_lease(i))
                    });
                    touched = batch.iter().map(|i| i.key.clone()).collect();
                    let (m, r) = (memory.spend(&batch).await, redis.spend(&batch).await);
                    match (&m, &r) {
                        (Ok(m), Ok(r)) if m == r => {
                            retry_in = m.decisions[0].retry_in;
                            let mut seen = self.seen.borrow_mut();
                            if m.allowed {
                                seen.allowed_batches += 1;
                            } else {
                                seen.denied_batches += 1;
                            }
                            seen.debts +=
                                m.decisions.iter().filter(|d| d.remaining < 0).count() as u64;
                            seen.deep += (batch.iter().zip(&m.decisions))
                                .filter(|(i, d)| d.remaining < -(i.limit.count() as i64))
                                .count() as u64;
                            for (item, d) in batch.iter().zip(&m.decisions) {
                                match (item.mode, d.allowed) {
                                    (Mode::Acquire, true) if m.allowed => seen.acquired += 1,
                                    (Mode::Acquire, false) => seen.full += 1,
                                    (Mode::Release, true) => seen.released += 1,
                                    _ => {}
                                }
                            }
                        }
                        _ => return differ(format!("{m:?}"), format!("{r:?}")),
                    }
                }
                Step::Refund(batch) => {
                    // A lease is never refunded: such an item refunds a rate limit instead.
                    let rate = limits
                        .iter()
                        .position(|l| l.window() != Window::Concurrency);
                    let batch: Vec<Item> = batch
                        .iter()
                        .filter_map(|i| match limits[i.limit].window() {
                            Window::Concurrency => Some(Item { limit: rate?, ..*i }),
                            _ => Some(*i),
                        })
                        .collect();
                    let batch = items(&batch);
                    touched = batch.iter().map(|i| i.key.clone()).collect();
                    let (m, r) = (memory.refund(&batch).await, redis.refund(&batch).await);
                    match (&m, &r) {
                        (Ok(m), Ok(r)) if m == r => {
                            self.seen.borrow_mut().refunded +=
                                m.iter().filter(|d| d.allowed).count() as u64
                        }
                        _ => return differ(format!("{m:?}"), format!("{r:?}")),
                    }
                }
                Step::Reset(which) => {
                    let which: Vec<BucketKey> = which
                        .iter()
                        .map(|&(k, l)| BucketKey::windowed(100, &ids[k], limits[l].window()))
                        .collect();
                    let (m, r) = (memory.reset(&which).await, redis.reset(&which).await);
                    if !matches!((&m, &r), (Ok(m), Ok(r)) if m == r) {
                        return differ(format!("{m:?}"), format!("{r:?}"));
                    }
                }
                Step::Wait(by) => self.clock.set(now + by),
                Step::ToWindowEnd { limit, less } => {
                    if let Window::Calendar(period) = limits[*limit].window() {
                        self.clock.set((period.window_end(now) - less).max(now));
                    }
                }
                // A retry_in beyond the year 2262 (a charge of u64::MAX) is not waited.
                Step::ByRetry(plus) => {
                    let by = retry_in.saturating_add(*plus).clamp(0, 1_000 * DAY);
                    self.clock.set(now + by)
                }
            }
            // A value written less than GUARD ahead: past it before Redis may expire it.
            let at = self.clock.now();
            let after = self.stored(&memory, &keys).await;
            let near = after
                .iter()
                .zip(&stored)
                .zip(&keys)
                .filter(|((a, b), key)| a != b || touched.contains(key))
                .filter_map(|((a, _), _)| *a)
                .filter(|&value| value - at < GUARD)
                .max();
            // Redis lets a lease key go with its latest lease, in real time: past it too.
            let mut near = near;
            for peek in &lease_keys {
                let d = memory.spend(std::slice::from_ref(peek)).await.unwrap();
                let reset_in = d.decisions[0].reset_in;
                if reset_in > 0 && reset_in < GUARD {
                    near = near.max(Some(at + reset_in));
                }
            }
            if let Some(value) = near {
                self.clock.set(value);
                self.seen.borrow_mut().skips += 1;
            }
            self.seen.borrow_mut().steps += 1;
            stored = self.stored(&memory, &keys).await;
        }
        Ok(())
    }

    /// Each key's stored value, when ahead of now, as the memory store holds it (a peek
    /// reports the distance to it as `reset_in`; a value not ahead is full, read as none).
    async fn stored(&self, memory: &MemoryStore, keys: &[BucketKey]) -> Vec<Option<Nanos>> {
        let peek = Limit::new(1, 1, SECOND).unwrap();
        let now = self.clock.now();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let item = StoreItem {
                key: key.clone(),
                limit: peek,
                cost: 0,
                mode: Mode::CheckOnly,
                lease: None,
            };
            let d: Decision = memory.spend(&[item]).await.unwrap().decisions[0];
            out.push((d.reset_in > 0).then_some(now + d.reset_in));
        }
        out
    }
}

/// Runs [`CASES`] generated timelines against `server`; panics with the minimal timeline
/// on which the stores differ. `module`: the server has cellrate's module, and the steps
/// alternate between a store that decides with the script and one that decides with the
/// module (`--redis-module require`).
fn differential(name: &str, url: Option<String>, cluster_nodes: Vec<String>, module: bool) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = FakeClock::new(T0);
    let distinct = !cluster_nodes.is_empty();
    let settings = RedisSettings {
        url,
        cluster_nodes,
        prefix: "d:".to_string(),
        // Generous: debug builds on a shared 2-core machine.
        timeout: std::time::Duration::from_secs(5),
        clock: RedisClock::Local,
        module: RedisModule::Forbid,
        ..RedisSettings::default()
    };
    let mut modules = vec![RedisModule::Forbid];
    if module {
        modules.push(RedisModule::Require);
    }
    let stores = modules
        .into_iter()
        .map(|module| {
            let settings = RedisSettings {
                module,
                ..settings.clone()
            };
            let clock = Arc::new(clock.clone());
            runtime
                .block_on(async { RedisStore::new(settings, clock, Metrics::new()) })
                .unwrap()
        })
        .collect();
    let subjects = Subjects {
        clock,
        stores,
        distinct,
        seen: Default::default(),
    };
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        max_shrink_iters: 4_096,
        ..Config::default()
    });
    let started = Instant::now();
    let result = runner.run(&timelines(), |timeline| {
        runtime
            .block_on(subjects.run(&timeline))
            .map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {
            let seen = subjects.seen.borrow();
            eprintln!(
                "{name}: {CASES} timelines, identical answers, in {:?}: {seen:?}",
                started.elapsed()
            );
            // Timelines that decide both ways, into debt and back.
            let least = [seen.allowed_batches, seen.denied_batches, seen.debts];
            assert!(least.iter().all(|&n| n >= 100), "{seen:?}");
            assert!(seen.refunded >= 100, "{seen:?}");
            // envoyproxy/ratelimit's windows holding more than cellrate's own could.
            assert!(seen.deep >= 50, "{seen:?}");
            // Leases acquired, refused on a full key and released (about 600, 60 and 60 a
            // run: time moves fast in these timelines, and most releases find their lease
            // expired, which is tested too).
            let leases = [seen.acquired / 10, seen.full, seen.released];
            assert!(leases.iter().all(|&n| n >= 25), "{seen:?}");
        }
        Err(TestError::Fail(why, timeline)) => {
            panic!("{name}: the stores differ: {why}\nminimal timeline: {timeline:#?}")
        }
        Err(e) => panic!("{name}: {e}"),
    }
}

#[test]
fn memory_and_redis_answer_alike() {
    let server = RedisServer::start();
    differential("redis-server", Some(server.url()), vec![], false);
}

#[test]
fn memory_and_valkey_answer_alike() {
    let server = RedisServer::start_valkey();
    differential("valkey", Some(server.url()), vec![], false);
}

/// On a cluster a batch's keys fall in several slots: a group that denies makes the
/// others refund what they spent (a compensation), and the answers must not show it.
/// Batches name each bucket once, as the service sends them: a compensation refunds what
/// a group's spend left, and cannot restore a charge that a later item of the same bucket
/// overwrote (charge then spend of one bucket in a batch another slot denies).
#[test]
fn memory_and_a_redis_cluster_answer_alike() {
    let cluster = RedisCluster::start();
    differential("redis cluster", None, cluster.urls(), false);
}

/// cellrate's module (`CELLRATE.BATCH`) decides as the memory store and the script do,
/// and a bucket, a lease key and a window move between the two at every step: each step
/// goes to the other of a script's store and a module's on the same server.
#[test]
fn memory_the_script_and_the_module_answer_alike_in_redis() {
    let server = redis_with_module();
    differential(
        "redis-server, script and module",
        Some(server.url()),
        vec![],
        true,
    );
}

#[test]
fn memory_the_script_and_the_module_answer_alike_in_valkey() {
    let server = valkey_with_module();
    differential(
        "valkey, script and module",
        Some(server.url()),
        vec![],
        true,
    );
}

/// The module on every master of a cluster: each slot group's call routed to its master.
#[test]
fn memory_the_script_and_the_module_answer_alike_on_a_redis_cluster() {
    let cluster = cluster_with_module();
    differential(
        "redis cluster, script and module",
        None,
        cluster.urls(),
        true,
    );
}
