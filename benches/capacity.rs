//! Capacity figures (no criterion: one measurement each, printed):
//! - the memory store at 10^3, 10^6, 10^7 and 10^8 live buckets: memory per live bucket (RSS
//!   growth per bucket, everything included), check latency on random live keys, and the
//!   sweeper's pause per shard; the time to write its snapshot file and to restore it;
//! - the time to load and swap in a limits directory with 100 000 overrides;
//! - the memory store full of leases (keys of one lease each, ids of 16 and 256 bytes):
//!   memory per lease;
//! - the Redis store's counts of lease keys (`LeaseKeys`) and of bucket keys
//!   (`BucketKeys`) full: memory per key a replica counts.
//!
//! Each memory figure comes from a fresh child process, so that memory freed by one run
//! cannot hide the next one's growth. Run: `cargo bench --bench capacity`.

// A benchmark measures real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its benchmarks.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use cellrate::clock::{FakeClock, SECOND};
use cellrate::gcra::{Limit, Mode};
use cellrate::limits::config::LimitTable;
use cellrate::limits::names::BucketKey;
use cellrate::store::{MemoryStore, StoreItem};

// The same allocator as cellrate's binary, so that memory per bucket is what `serve` uses.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: cellrate_alloc::MiMalloc = cellrate_alloc::MiMalloc;

/// Resident set size of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn memory_per_bucket(n: usize, id_len: usize) {
    let clock = FakeClock::new(1_700_000_000 * SECOND);
    // Room for every key, none of it set aside for caller-given limits; the shard count
    // `serve --max-buckets n` chooses.
    let max = (n + n / 5).max(1_000_000);
    let shards = MemoryStore::shards_for(n);
    // All under one name: no name share, so that one name may fill the table.
    let store = MemoryStore::with_caller_share(Arc::new(clock.clone()), shards, max, 0)
        .with_bucket_name_share(100);
    // Burst and count so large that no probe below is ever denied: every spend writes.
    let limit = Limit::new(1 << 40, 1 << 40, 3_600 * SECOND).unwrap();
    let item = |i: usize| StoreItem {
        key: BucketKey::new(100, &format!("user-{i:0>width$}", width = id_len - 5)),
        limit,
        cost: 1,
        mode: Mode::CheckAndSpend,
        lease: None,
    };
    let key_len = item(0).key.as_str().len();
    let before = rss();
    let fill = Instant::now();
    for i in 0..n {
        store.spend_now(std::slice::from_ref(&item(i))).unwrap();
    }
    let fill = fill.elapsed();
    let peak = rss().saturating_sub(before) as f64;
    assert_eq!(store.live_buckets(), n);
    // mimalloc gives the tables that growth left behind back to the kernel a second after
    // they are freed, on later allocations: let it, as a running server's requests would.
    std::thread::sleep(Duration::from_millis(1_500));
    for i in 0..200_000 {
        std::hint::black_box(Vec::<u8>::with_capacity(64 + i % 4096));
    }
    let settled = rss().saturating_sub(before) as f64;
    println!(
        "memory_store live_buckets={n} shards={} rss_growth_mib={:.0} bytes_per_bucket={:.1} right_after_filling={:.1} key_bytes={key_len} fill_s={:.1}",
        store.shard_count(),
        settled / (1 << 20) as f64,
        settled / n as f64,
        peak / n as f64,
        fill.as_secs_f64()
    );

    // Check latency: spends on 100 000 live keys picked at random (so that at 10^8 most
    // miss every cache), built beforehand so that only the store's work is timed.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let probes: Vec<StoreItem> = (0..100_000)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            item((seed % n as u64) as usize)
        })
        .collect();
    let spend = |probe: &StoreItem| {
        assert!(
            store
                .spend_now(std::slice::from_ref(probe))
                .unwrap()
                .allowed
        );
    };
    probes.iter().for_each(spend); // warm-up
    let rounds = 20;
    let start = Instant::now();
    for _ in 0..rounds {
        probes.iter().for_each(spend);
    }
    let mean = start.elapsed().as_nanos() as f64 / (rounds * probes.len()) as f64;
    // Percentiles from a pass with a timer around each check.
    let mut each: Vec<Duration> = probes
        .iter()
        .map(|probe| {
            let one = Instant::now();
            spend(probe);
            one.elapsed()
        })
        .collect();
    each.sort();
    println!(
        "memory_store live_buckets={n} check_ns mean={mean:.0} p50={} p99={} (one timer per check: ~20 ns of it)",
        each[each.len() / 2].as_nanos(),
        each[each.len() * 99 / 100].as_nanos()
    );

    // The snapshot file (`--snapshot-file`): written from this store, restored into a new
    // one (a restart), on the machine's disk (fsynced).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("buckets.snapshot");
    let written = store.write_snapshot(&path).unwrap();
    let restore = Instant::now();
    let mut restored = MemoryStore::with_caller_share(Arc::new(clock.clone()), shards, max, 0)
        .with_bucket_name_share(100);
    let got = restored.restore_snapshot(&path).unwrap();
    let restore = restore.elapsed();
    assert_eq!(got.buckets, n);
    drop(restored);
    println!(
        "memory_store live_buckets={n} snapshot_mib={:.0} write_s={:.2} restore_s={:.2}",
        written.bytes as f64 / (1 << 20) as f64,
        written.seconds,
        restore.as_secs_f64()
    );

    // The sweeper's pause: how long each shard's lock is held by a sweep, first with every
    // bucket live (it visits each and drops none), then with every bucket expired.
    for (what, advance) in [("none_expired", 0), ("all_expired", 7_200 * SECOND)] {
        clock.advance(advance);
        let mut pauses: Vec<Duration> = (0..store.shard_count())
            .map(|s| {
                let start = Instant::now();
                store.sweep_shard(s);
                start.elapsed()
            })
            .collect();
        pauses.sort();
        println!(
            "memory_store live_buckets={n} sweep_{what} pause_us_per_shard median={:.0} max={:.0}",
            pauses[pauses.len() / 2].as_secs_f64() * 1e6,
            pauses[pauses.len() - 1].as_secs_f64() * 1e6
        );
    }
    assert_eq!(store.live_buckets(), 0);
}

fn overrides_load_and_swap(ids: usize) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("names.yaml"),
        "ApiRequestsPerKey: {number: 100, format: string}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "ApiRequestsPerKey: {burst: 10, count: 10, period: 1s}\n",
    )
    .unwrap();
    let mut overrides = String::from(
        "- ApiRequestsPerKey:\n    burst: 100\n    count: 100\n    period: 1s\n    ids:\n",
    );
    for i in 0..ids {
        overrides.push_str(&format!(
            "      - {{id: key-{i:08}, comment: customer {i}}}\n"
        ));
    }
    std::fs::write(dir.path().join("overrides.yaml"), overrides).unwrap();
    let limits = Arc::new(ArcSwap::from_pointee(LimitTable::empty()));
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let start = Instant::now();
            let table = LimitTable::load_dir(dir.path()).unwrap();
            limits.store(Arc::new(table));
            start.elapsed()
        })
        .collect();
    times.sort();
    assert_eq!(limits.load().override_count(), ids);
    println!(
        "overrides={ids} load_and_swap_ms median={:.0} min={:.0} max={:.0}",
        times[2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[4].as_secs_f64() * 1e3
    );
}

/// Memory per lease of a concurrency limit in the memory store when it is full of keys of
/// one lease each (what a flood of fresh ids makes), with key ids of `id_len` bytes: RSS
/// growth over `n` leases, everything included (the key map, each key's list and text).
fn memory_per_lease(n: usize, id_len: usize) {
    let clock = FakeClock::new(1_700_000_000 * SECOND);
    let store = MemoryStore::with_capacity(
        Arc::new(clock),
        MemoryStore::shards_for(cellrate::store::memory::DEFAULT_MAX_BUCKETS),
        cellrate::store::memory::DEFAULT_MAX_BUCKETS,
    )
    .with_lease_bounds(n, 100);
    let limit = Limit::concurrency(8, 30 * SECOND).unwrap();
    let lease: Arc<str> = Arc::from("0f8fad5b-d9cb-469f-a165-70867728950e");
    let item = |i: usize| {
        let id = format!("{i:0>id_len$}");
        StoreItem {
            key: BucketKey::windowed(100, &id, limit.window()),
            limit,
            cost: 1,
            mode: Mode::Acquire,
            lease: Some(lease.clone()),
        }
    };
    let before = rss();
    for i in 0..n {
        assert!(
            store
                .spend_now(std::slice::from_ref(&item(i)))
                .unwrap()
                .allowed
        );
    }
    std::thread::sleep(Duration::from_millis(1_500));
    for i in 0..200_000 {
        std::hint::black_box(Vec::<u8>::with_capacity(64 + i % 4096));
    }
    let grown = rss().saturating_sub(before) as f64;
    assert_eq!(store.live_leases(), n);
    println!(
        "memory_store leases={n} id_bytes={id_len} key_bytes={} rss_growth_mib={:.0} bytes_per_lease={:.1}",
        item(0).key.as_str().len(),
        grown / (1 << 20) as f64,
        grown / n as f64
    );
}

/// RSS growth over `fill`, after a pause and a churn of small allocations (so that the
/// allocator's caches settle), in bytes.
#[cfg(feature = "redis")]
fn rss_growth(fill: impl FnOnce()) -> f64 {
    let before = rss();
    fill();
    std::thread::sleep(Duration::from_millis(1_500));
    for i in 0..200_000 {
        std::hint::black_box(Vec::<u8>::with_capacity(64 + i % 4096));
    }
    rss().saturating_sub(before) as f64
}

/// Memory per lease key that a Redis store's replica counts ([`LeaseKeys`], one name
/// holding them all, as one caller's flood of fresh tenant ids makes): RSS growth over `n`
/// keys claimed and settled as taken, each until its own expiry.
#[cfg(feature = "redis")]
fn memory_per_lease_key(n: usize) {
    use cellrate::store::redis::{LeaseKeys, Settled};
    let keys = LeaseKeys::new(n, 100);
    let t0 = 1_700_000_000 * SECOND;
    let grown = rss_growth(|| {
        for i in 0..n {
            let key = format!("cellrate:110@lease:tenant-{i:0>12}");
            let until = t0 + 30 * SECOND + i as i64;
            let claim = keys.claim(110, &key, t0, until);
            keys.settle(110, &key, claim, Settled::Taken(until));
        }
    });
    assert_eq!(keys.len(), n);
    println!(
        "redis_store lease_keys={n} rss_growth_mib={:.1} bytes_per_key={:.1}",
        grown / (1 << 20) as f64,
        grown / n as f64
    );
}

/// Memory per bucket key that a Redis store's replica counts ([`BucketKeys`], one name
/// holding them all, as a flood of fresh `api_key` values on a daily limit makes): RSS
/// growth over `n` keys claimed and settled as written, each until its own TAT.
#[cfg(feature = "redis")]
fn memory_per_bucket_key(n: usize) {
    use cellrate::store::redis::{BucketKeys, Written};
    let keys = BucketKeys::new(n, 0, 100);
    let t0 = 1_700_000_000 * SECOND;
    let limit = Limit::new(1_000, 1_000, 86_400 * SECOND).unwrap();
    let grown = rss_growth(|| {
        for i in 0..n {
            let id = format!("key-{i:0>12}");
            let item = StoreItem {
                key: BucketKey::new(101, &id),
                limit,
                cost: 1,
                mode: Mode::CheckAndSpend,
                lease: None,
            };
            let claim = keys.claim(&item, &format!("cellrate:101:{id}"), t0);
            keys.settle(claim, Written::Until(t0 + 86 * SECOND + i as i64));
        }
    });
    assert_eq!(keys.len(), n);
    // A sweep that finds nothing ended reads every key (what a refused claim's sweep for
    // room costs, at most once a second).
    let started = Instant::now();
    assert_eq!(keys.sweep(t0), 0);
    let sweep = started.elapsed();
    println!(
        "redis_store bucket_keys={n} rss_growth_mib={:.1} bytes_per_key={:.1} sweep_ms={:.1}",
        grown / (1 << 20) as f64,
        grown / n as f64,
        sweep.as_secs_f64() * 1e3
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    #[cfg(feature = "redis")]
    if let Some(at) = args.iter().position(|a| a == "lease-keys") {
        memory_per_lease_key(args[at + 1].parse().unwrap());
        return;
    }
    #[cfg(feature = "redis")]
    if let Some(at) = args.iter().position(|a| a == "bucket-keys") {
        memory_per_bucket_key(args[at + 1].parse().unwrap());
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "leases") {
        let n = args[at + 1].parse().unwrap();
        memory_per_lease(n, args[at + 2].parse().unwrap());
        return;
    }
    if let Some(n) = args
        .iter()
        .position(|a| a == "memory")
        .and_then(|i| args.get(i + 1))
    {
        let id_len = args.iter().position(|a| a == "memory").unwrap() + 2;
        memory_per_bucket(n.parse().unwrap(), args[id_len].parse().unwrap());
        return;
    }
    overrides_load_and_swap(100_000);
    // CAPACITY_BUCKETS="1000,1000000" runs other sizes (10^8 needs about 3 GiB and a minute
    // or two to fill).
    let sizes = std::env::var("CAPACITY_BUCKETS")
        .unwrap_or_else(|_| "1000,1000000,10000000,100000000".into());
    // CAPACITY_BUCKET_IDS="14,256": the ids' lengths (a bucket keeps a hash of its key,
    // whatever the id's length: the figures should agree).
    let ids = std::env::var("CAPACITY_BUCKET_IDS").unwrap_or_else(|_| "14".into());
    for id_len in ids.split(',') {
        for n in sizes.split(',') {
            let status = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["memory", n, id_len])
                .status()
                .unwrap();
            assert!(status.success());
        }
    }
    // CAPACITY_LEASES="1000000" (the default table) with ids of 16 and 256 bytes.
    let leases = std::env::var("CAPACITY_LEASES").unwrap_or_else(|_| "1000000".into());
    for id_len in ["16", "256"] {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["leases", &leases, id_len])
            .status()
            .unwrap();
        assert!(status.success());
    }
    // CAPACITY_LEASE_KEYS="250000,1000000": a Redis replica's count of lease keys, at one
    // name's default share and at the default --max-leases; CAPACITY_BUCKET_KEYS=
    // "2250000,10000000": its count of bucket keys, at one name's default share and at
    // the default --max-buckets.
    #[cfg(feature = "redis")]
    for (what, sizes, default) in [
        ("lease-keys", "CAPACITY_LEASE_KEYS", "250000,1000000"),
        ("bucket-keys", "CAPACITY_BUCKET_KEYS", "2250000,10000000"),
    ] {
        for n in std::env::var(sizes)
            .unwrap_or_else(|_| default.into())
            .split(',')
        {
            let status = std::process::Command::new(std::env::current_exe().unwrap())
                .args([what, n])
                .status()
                .unwrap();
            assert!(status.success());
        }
    }
}
