//! The settlement promise, "counted once, never more back than was spent", under random
//! failures injected between its steps: before or after any call to the store or to the
//! settlements table (an open breaker, a lost request, an answer past its deadline). On
//! the memory store and on a real Redis (store and table), through the native service.
//!
//! Each job is a Check of two buckets (an estimate each) under a request id, then up to
//! three Settles at the actual costs. Whatever failed, each bucket ends having given up
//! nothing (the Check was not made), the estimate (the adjustment was not made), or the
//! actual cost, and never anything else; a Settle answered as made leaves the actual
//! cost exactly.

use std::sync::Arc;

use arc_swap::ArcSwap;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::common::faulty::{faulted, Fault, FaultyStore};
#[cfg(feature = "redis")]
use crate::common::redis_server::RedisServer;
use crate::common::{item, T0};
use cellrate::clock::{FakeClock, SECOND};
use cellrate::limits::config::LimitTable;
use cellrate::observe::metrics::Metrics;
use cellrate::proto::v1 as pb;
use cellrate::proto::v1::rate_limiter_server::RateLimiter;
use cellrate::service::native::RateLimiterService;
use cellrate::service::{Decider, ItemSpec};
use cellrate::store::settlements::MemorySettlements;
use cellrate::store::shared::{Claim, Kept, Opened, Settlements};
use cellrate::store::{MemoryStore, Store, StoreFuture};

/// A settlements table whose calls fail as scheduled.
struct FaultySettlements {
    inner: Arc<dyn Settlements>,
    faults: crate::common::faulty::Schedule,
}

impl FaultySettlements {
    fn new(inner: Arc<dyn Settlements>) -> Arc<FaultySettlements> {
        Arc::new(FaultySettlements {
            inner,
            faults: Default::default(),
        })
    }
}

impl Settlements for FaultySettlements {
    fn open<'a>(
        &'a self,
        id: &'a str,
        check: &'a [u8],
        hold: Option<i64>,
        keys: &'a [String],
    ) -> StoreFuture<'a, Opened> {
        Box::pin(faulted(self.faults.next(), "open", move || {
            self.inner.open(id, check, hold, keys)
        }))
    }

    fn decide<'a>(&'a self, id: &'a str, facts: &'a [u8]) -> StoreFuture<'a, bool> {
        Box::pin(faulted(self.faults.next(), "decide", || {
            self.inner.decide(id, facts)
        }))
    }

    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(faulted(self.faults.next(), "forget", || {
            self.inner.forget(id)
        }))
    }

    fn claim<'a>(&'a self, id: &'a str, costs: &'a [u8]) -> StoreFuture<'a, Claim> {
        Box::pin(faulted(self.faults.next(), "claim", || {
            self.inner.claim(id, costs)
        }))
    }

    fn reopen<'a>(&'a self, id: &'a str, facts: &'a [u8]) -> StoreFuture<'a, ()> {
        Box::pin(faulted(self.faults.next(), "reopen", || {
            self.inner.reopen(id, facts)
        }))
    }

    fn window(&self) -> cellrate::clock::Nanos {
        self.inner.window()
    }

    fn due(&self, max: usize) -> StoreFuture<'_, Vec<(String, Kept)>> {
        Box::pin(faulted(self.faults.next(), "due", move || {
            self.inner.due(max)
        }))
    }

    fn enqueue<'a>(&'a self, queue: &'a str, id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(faulted(self.faults.next(), "queue", move || {
            self.inner.enqueue(queue, id)
        }))
    }

    fn claim_oldest<'a>(
        &'a self,
        queue: &'a str,
        costs: &'a [u8],
    ) -> StoreFuture<'a, Option<(String, Kept)>> {
        Box::pin(faulted(self.faults.next(), "oldest", move || {
            self.inner.claim_oldest(queue, costs)
        }))
    }
}

const BURST: i64 = 1_000;

fn limits() -> LimitTable {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("names.yaml"),
        "Tokens: {number: 100, format: string}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "Tokens: {burst: 1000, count: 1000, period: 30d}\n",
    )
    .unwrap();
    LimitTable::load_dir(dir.path()).unwrap()
}

/// The service over faulty parts, and a reader of the real store beneath.
struct Rig {
    service: RateLimiterService,
    store: Arc<FaultyStore>,
    table: Arc<FaultySettlements>,
    reader: Decider,
}

impl Rig {
    fn new(store: Arc<dyn Store>, table: Arc<dyn Settlements>) -> Rig {
        let limits = Arc::new(ArcSwap::from_pointee(limits()));
        let faulty = FaultyStore::new(store.clone(), false);
        let table = FaultySettlements::new(table);
        let decider = Arc::new(Decider::new(limits.clone(), faulty.clone()));
        Rig {
            service: RateLimiterService::new(decider, Metrics::new())
                .with_settlements(table.clone()),
            store: faulty,
            table,
            reader: Decider::new(limits, store),
        }
    }

    async fn used(&self, tenant: &str) -> i64 {
        let peek = self
            .reader
            .inspect(&[ItemSpec::named("Tokens", tenant)])
            .await
            .unwrap();
        BURST - peek.items[0].decision.remaining
    }
}

/// One job: estimates and actual costs of its two buckets, and how often it settles.
#[derive(Debug, Clone)]
struct Job {
    estimates: [u64; 2],
    actuals: [u64; 2],
    settles: usize,
}

fn jobs() -> impl Strategy<Value = Vec<Job>> {
    let cost = 1u64..=400;
    let job = (
        [cost.clone(), cost.clone()],
        [cost.clone(), cost],
        1usize..=3,
    )
        .prop_map(|(estimates, actuals, settles)| Job {
            estimates,
            actuals,
            settles,
        });
    prop::collection::vec(job, 1..=3)
}

fn faults() -> impl Strategy<Value = Vec<Fault>> {
    let fault = prop_oneof![
        4 => Just(Fault::Pass),
        1 => Just(Fault::Refused),
        1 => Just(Fault::Lost),
        1 => Just(Fault::Late),
    ];
    prop::collection::vec(fault, 0..16)
}

/// Runs `jobs` under the faults; checks the promise per bucket.
async fn promise_holds(
    rig: &Rig,
    case: usize,
    jobs: &[Job],
    store_faults: Vec<Fault>,
    table_faults: Vec<Fault>,
) -> Result<(), TestCaseError> {
    let faultless = store_faults.is_empty() && table_faults.is_empty();
    rig.store.faults.set(store_faults);
    rig.table.faults.set(table_faults);
    let mut made = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let id = format!("c{case}-job-{j}");
        let tenants = [format!("c{case}-{j}-x"), format!("c{case}-{j}-y")];
        let items = (0..2)
            .map(|k| item("Tokens", &tenants[k], Some(job.estimates[k])))
            .collect();
        let request = pb::CheckRequest {
            items,
            request_id: id.clone(),
            ..Default::default()
        };
        let _ = rig.service.check(tonic::Request::new(request)).await;
        let mut exact = false;
        for _ in 0..job.settles {
            let request = pb::SettleRequest {
                request_id: id.clone(),
                costs: job.actuals.to_vec(),
            };
            if let Ok(answer) = rig.service.settle(tonic::Request::new(request)).await {
                exact |= !answer.into_inner().already_settled;
            }
        }
        made.push(exact);
    }
    rig.store.faults.set([]);
    rig.table.faults.set([]);
    for (j, job) in jobs.iter().enumerate() {
        let mut used = [0; 2];
        for (k, used) in used.iter_mut().enumerate() {
            *used = rig.used(&format!("c{case}-{j}-{}", ["x", "y"][k])).await;
            let (e, a) = (job.estimates[k] as i64, job.actuals[k] as i64);
            prop_assert!(
                [0, e, a].contains(used),
                "job {j} bucket {k}: {used} used, estimate {e}, actual {a}"
            );
            if made[j] || faultless {
                prop_assert_eq!(*used, a, "job {} bucket {}: settled", j, k);
            }
        }
        prop_assert_eq!(
            used[0] == 0,
            used[1] == 0,
            "job {}: a Check is one batch",
            j
        );
    }
    Ok(())
}

/// Runs `cases` cases, each on the parts `rig` builds for it.
fn run(cases: u32, rig: impl Fn(usize) -> Rig) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicUsize::new(0);
    runner
        .run(&(jobs(), faults(), faults()), |(jobs, store, table)| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let rig = {
                let _inside = runtime.enter();
                rig(n)
            };
            runtime.block_on(promise_holds(&rig, n, &jobs, store, table))
        })
        .unwrap();
}

#[test]
fn the_promise_holds_under_faults_on_the_memory_store() {
    run(64, |_| {
        let clock = Arc::new(FakeClock::new(T0));
        Rig::new(
            Arc::new(MemoryStore::new(clock.clone())),
            Arc::new(MemorySettlements::new(clock, 3_600 * SECOND, 1_000)),
        )
    });
}

#[cfg(feature = "redis")]
#[test]
fn the_promise_holds_under_faults_on_redis() {
    use cellrate::store::redis::{RedisSettings, RedisSettlements, RedisStore};
    let redis = RedisServer::start();
    run(24, |case| {
        let settings = RedisSettings {
            url: Some(redis.url()),
            prefix: format!("case{case}:"),
            timeout: std::time::Duration::from_secs(2),
            ..RedisSettings::default()
        };
        let clock = Arc::new(FakeClock::new(T0));
        let store: Arc<dyn Store> =
            RedisStore::new(settings.clone(), clock, Metrics::new()).unwrap();
        let table = RedisSettlements::new(&settings, 3_600 * SECOND, 1_000).unwrap();
        Rig::new(store, Arc::new(table))
    });
}
