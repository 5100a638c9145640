//! Capacity figures (no criterion: one measurement each, printed):
//! - memory per live bucket in the memory store, at 1 M and 10 M buckets (RSS growth per
//!   bucket, and the same less the key's own bytes);
//! - the time to load and swap in a limits directory with 100 000 overrides.
//!
//! Each memory figure comes from a fresh child process, so that memory freed by one run
//! cannot hide the next one's growth. Run: `cargo bench --bench capacity`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use cellrate::clock::{FakeClock, SECOND};
use cellrate::gcra::{Limit, Mode};
use cellrate::limits::config::LimitTable;
use cellrate::limits::names::BucketKey;
use cellrate::store::{MemoryStore, StoreItem};

/// Resident set size of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn memory_per_bucket(n: usize) {
    let clock = FakeClock::new(1_700_000_000 * SECOND);
    // Room for every key whatever shard it hashes to (the bound is per shard), none of it
    // set aside for caller-given limits.
    let store = MemoryStore::with_caller_share(Arc::new(clock), 128, n + n / 5, 0);
    let limit = Limit::new(10, 10, 3_600 * SECOND).unwrap();
    let key_len = BucketKey::new(100, &format!("user-{:08}", 0))
        .as_str()
        .len();
    let before = rss();
    for i in 0..n {
        let item = StoreItem {
            key: BucketKey::new(100, &format!("user-{i:08}")),
            limit,
            cost: 1,
            mode: Mode::CheckAndSpend,
        };
        store.spend_now(std::slice::from_ref(&item)).unwrap();
    }
    let grown = rss().saturating_sub(before) as f64;
    assert_eq!(store.live_buckets(), n);
    println!(
        "memory_store live_buckets={n} rss_growth_mib={:.0} bytes_per_bucket={:.1} key_bytes={key_len} beyond_key_bytes={:.1}",
        grown / (1 << 20) as f64,
        grown / n as f64,
        grown / n as f64 - key_len as f64
    );
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(n) = args
        .iter()
        .position(|a| a == "memory")
        .and_then(|i| args.get(i + 1))
    {
        memory_per_bucket(n.parse().unwrap());
        return;
    }
    overrides_load_and_swap(100_000);
    for n in ["1000000", "10000000"] {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["memory", n])
            .status()
            .unwrap();
        assert!(status.success());
    }
}
