//! Decision costs without the network: the pure GCRA step, the lookups every request makes
//! in the configuration's maps (a name, then its policy for an id, in a table of 100 000
//! overrides), and the memory store's single-item check, on 1 key and on 1 M keys, with 1
//! and 2 threads; and what counting a denied decision costs without and with the tracking
//! behind admin `Top`; and a lease of a concurrency limit acquired and released beside
//! spends on the memory store (`memory_store/lease`). Beside the memory store, governor's keyed limiter (DashMap of atomic
//! TATs, a compare-and-swap per decision) on the same keys and threads.
//! Run: `cargo bench --bench decisions`. Figures are recorded in BENCHMARKS.md.

// A benchmark measures real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its benchmarks.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellrate::clock::{FakeClock, Nanos, SECOND};
use cellrate::gcra::{spend, Limit, Mode, Window};
use cellrate::limits::config::LimitTable;
use cellrate::limits::names::BucketKey;
use cellrate::store::{MemoryStore, StoreItem};
use criterion::{criterion_group, criterion_main, Criterion};

// The same allocator as cellrate's binary, so that an allocation on a measured path costs
// what it costs in `serve` (until 2026-11-27 these figures used the system allocator).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: cellrate_alloc::MiMalloc = cellrate_alloc::MiMalloc;

const T0: Nanos = 1_700_000_000 * SECOND;

fn gcra(c: &mut Criterion) {
    let limit = Limit::new(20, 20, SECOND).unwrap();
    c.bench_function("gcra/spend", |b| {
        let mut now = T0;
        b.iter(|| {
            now += 1;
            black_box(spend(black_box(&limit), now, Some(now + 500_000_000), 1))
        })
    });
}

/// Items for `keys` distinct buckets under a limit no request exhausts (so every
/// decision writes, the store's most expensive path).
fn items(keys: usize) -> Vec<StoreItem> {
    let limit = Limit::new(1_000_000_000, 1_000_000_000, SECOND).unwrap();
    (0..keys)
        .map(|i| StoreItem {
            key: BucketKey::new(100, &format!("user-{i}")),
            limit,
            cost: 1,
            mode: Mode::CheckAndSpend,
            lease: None,
        })
        .collect()
}

/// Runs `iters` single-item checks split over `threads` threads; returns the wall time.
fn run(
    store: &Arc<MemoryStore>,
    items: &Arc<Vec<StoreItem>>,
    iters: u64,
    threads: u64,
) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (store, items) = (store.clone(), items.clone());
            scope.spawn(move || {
                let n = items.len() as u64;
                for i in 0..iters / threads {
                    // Threads walk the keys from different offsets.
                    let item = &items[((i * 7919 + t * 104_729) % n) as usize];
                    black_box(store.spend_now(std::slice::from_ref(item)).unwrap());
                }
            });
        }
    });
    start.elapsed()
}

fn config_lookups(c: &mut Criterion) {
    let mut overrides = String::new();
    for i in 0..100_000 {
        overrides.push_str(&format!(
            "- ApiRequestsPerKey: {{burst: 5, count: 5, period: 1s, ids: [key-{i}]}}\n"
        ));
    }
    let files = vec![
        (
            "names.yaml".to_string(),
            "ApiRequestsPerKey: {number: 100, format: string}\n".to_string(),
        ),
        (
            "defaults.yaml".to_string(),
            "ApiRequestsPerKey: {burst: 10, count: 10, period: 1s}\n".to_string(),
        ),
        ("overrides.yaml".to_string(), overrides),
    ];
    let table = LimitTable::from_files(&files).unwrap();
    let ids: Vec<String> = (0..1_000).map(|i| format!("key-{}", i * 97)).collect();
    c.bench_function("config/name_and_policy", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % ids.len();
            let name = table.names().get(black_box("ApiRequestsPerKey")).unwrap();
            black_box(table.policy(name, black_box(&ids[i])))
        })
    });
}

fn memory_store(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_store/check");
    for keys in [1usize, 1_000_000] {
        let clock = FakeClock::new(T0);
        let store = Arc::new(MemoryStore::new(Arc::new(clock)));
        let items = Arc::new(items(keys));
        // Fill every bucket first, so that the run measures lookups of live buckets.
        for item in items.iter() {
            store.spend_now(std::slice::from_ref(item)).unwrap();
        }
        for threads in [1u64, 2] {
            let label = format!(
                "{}_keys/{threads}_threads",
                if keys == 1 {
                    "1".into()
                } else {
                    "1M".to_string()
                }
            );
            group.bench_function(label, |b| {
                b.iter_custom(|iters| run(&store, &items, iters, threads))
            });
        }
    }
    group.finish();
}

/// governor's keyed limiter on the same keys, limit and threads as `memory_store`: a quota
/// of 10^9 a second with a burst of 10^9 (one cell per nanosecond, like `items`), on a fake
/// clock that stands still as ours does, so that neither side reads a real clock.
fn governor_keyed(c: &mut Criterion) {
    use governor::clock::FakeRelativeClock;
    use governor::{Quota, RateLimiter};
    use std::num::NonZeroU32;

    let rate = NonZeroU32::new(1_000_000_000).unwrap();
    let mut group = c.benchmark_group("governor_keyed/check");
    for keys in [1usize, 1_000_000] {
        let limiter = Arc::new(RateLimiter::dashmap_with_clock(
            Quota::per_second(rate).allow_burst(rate),
            FakeRelativeClock::default(),
        ));
        let ids: Arc<Vec<String>> = Arc::new((0..keys).map(|i| format!("100:user-{i}")).collect());
        for id in ids.iter() {
            limiter.check_key(id).unwrap();
        }
        for threads in [1u64, 2] {
            let label = format!(
                "{}_keys/{threads}_threads",
                if keys == 1 { "1" } else { "1M" }
            );
            group.bench_function(label, |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    std::thread::scope(|scope| {
                        for t in 0..threads {
                            let (limiter, ids) = (limiter.clone(), ids.clone());
                            scope.spawn(move || {
                                let n = ids.len() as u64;
                                for i in 0..iters / threads {
                                    let id = &ids[((i * 7919 + t * 104_729) % n) as usize];
                                    black_box(limiter.check_key(id).is_ok());
                                }
                            });
                        }
                    });
                    start.elapsed()
                })
            });
        }
    }
    group.finish();
}

/// A denied item of `ApiRequestsPerKey` for `id`, as the decider reports it.
fn denied_item(limit: Limit, id: &str) -> cellrate::service::ItemResult {
    cellrate::service::ItemResult {
        decision: cellrate::gcra::Decision {
            allowed: false,
            remaining: 0,
            retry_in: 100_000_000,
            reset_in: SECOND,
        },
        rule: cellrate::service::Rule::Limited(limit),
        name: Arc::from("ApiRequestsPerKey"),
        key: BucketKey::new(100, id),
        shadow: false,
        oversize: false,
        mode: Mode::CheckAndSpend,
        headers: cellrate::limits::config::Headers::default(),
    }
}

/// `count_decisions` for one denied item: the Prometheus counter alone, then with the
/// denial tracker (one id denied again and again: an attacker; then ever-new ids: the
/// summary full, each denial scanning it and replacing its least counted entry).
fn denial_counting(c: &mut Criterion) {
    let limit = Limit::new(10, 10, SECOND).unwrap();
    let hot = [denied_item(limit, "key-attacker")];
    let fresh: Vec<[cellrate::service::ItemResult; 1]> = (0..100_000)
        .map(|i| [denied_item(limit, &format!("key-{i:06}"))])
        .collect();
    let plain = cellrate::observe::metrics::Metrics::new();
    let tracked = cellrate::observe::metrics::Metrics::new();
    tracked.track_denials(Arc::new(cellrate::observe::top::DenialTracker::new(
        Arc::new(FakeClock::new(T0)),
    )));
    let mut group = c.benchmark_group("denied/count");
    group.bench_function("without_top", |b| {
        b.iter(|| cellrate::service::count_decisions(&plain, "native", black_box(&hot), |_| None))
    });
    group.bench_function("with_top/one_id", |b| {
        b.iter(|| cellrate::service::count_decisions(&tracked, "native", black_box(&hot), |_| None))
    });
    group.bench_function("with_top/new_ids", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % fresh.len();
            cellrate::service::count_decisions(&tracked, "native", black_box(&fresh[i]), |_| None)
        })
    });
    group.finish();
}

/// A lease acquired and released on one key (two store calls, the lease path under the
/// shard lock) against two spends of a rate on one key: the goal is at most 1.1x.
fn leases(c: &mut Criterion) {
    let store = MemoryStore::new(Arc::new(FakeClock::new(T0)));
    let rate = items(1).remove(0);
    let limit = Limit::concurrency(8, 30 * SECOND).unwrap();
    let acquire = StoreItem {
        key: BucketKey::windowed(100, "tenant-1", Window::Concurrency),
        limit,
        cost: 1,
        mode: Mode::Acquire,
        lease: Some(Arc::from("0c6f2a8e-5d1b-4a3e-9f11-7a2b3c4d5e6f")),
    };
    let release = StoreItem {
        mode: Mode::Release,
        ..acquire.clone()
    };
    let mut group = c.benchmark_group("memory_store/lease");
    group.bench_function("two_spends", |b| {
        b.iter(|| {
            black_box(store.spend_now(std::slice::from_ref(&rate)).unwrap());
            black_box(store.spend_now(std::slice::from_ref(&rate)).unwrap())
        })
    });
    let cycle = |b: &mut criterion::Bencher, acquire: &StoreItem, release: &StoreItem| {
        b.iter(|| {
            let taken = store.spend_now(std::slice::from_ref(acquire)).unwrap();
            assert!(taken.allowed);
            black_box(taken);
            black_box(store.spend_now(std::slice::from_ref(release)).unwrap())
        })
    };
    group.bench_function("acquire_and_release", |b| cycle(b, &acquire, &release));
    // A key with other requests in flight (4 leases held: the fake clock never lets them
    // expire): its list of leases stays, rather than being made and dropped each time.
    let busy = |mode, id: &str| StoreItem {
        key: BucketKey::windowed(100, "tenant-2", Window::Concurrency),
        mode,
        lease: Some(Arc::from(id)),
        ..acquire.clone()
    };
    for held in 0..4 {
        let item = busy(Mode::Acquire, &format!("held-{held}"));
        assert!(store.spend_now(&[item]).unwrap().allowed);
    }
    let (acquire, release) = (
        busy(Mode::Acquire, "0c6f2a8e-5d1b-4a3e-9f11-7a2b3c4d5e6f"),
        busy(Mode::Release, "0c6f2a8e-5d1b-4a3e-9f11-7a2b3c4d5e6f"),
    );
    group.bench_function("acquire_and_release_busy_key", |b| {
        cycle(b, &acquire, &release)
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3));
    targets = gcra, config_lookups, memory_store, governor_keyed, denial_counting, leases
}
criterion_main!(benches);
