//! Decisions per second through the Redis store, against a Redis given by `REDIS_URL`.
//! `scripts/bench-redis.sh` starts a redis-server and runs this beside `redis-benchmark`
//! (a trivial EVALSHA on the same server), alternating, and prints the ratios.
//!
//! `KIND` picks the limit, each on keys of its own (no kind reads another's buckets):
//! - unset: GCRA at 10^9 a second, so a bucket's TAT is reached within a millisecond and
//!   every decision finds its bucket expired and writes a fresh one (the figure every
//!   earlier run of `scripts/bench-redis.sh` against the trivial EVALSHA used);
//! - `gcra`: GCRA at one a second with a burst of 10^6, so every decision reads a live
//!   TAT and writes it a second further (always allowed), as a calendar bucket is read;
//! - `charge`: the same limit charged (the debt path's mode);
//! - `calendar`: a count per UTC hour, its bucket live for the hour.
//!
//! Output: one line, `decisions_per_second=<n> p50_us=<n> p99_us=<n> allowed=<n>`.

// A benchmark measures real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its benchmarks.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellrate::clock::{CalendarPeriod, SystemClock, SECOND};
use cellrate::gcra::{Limit, Mode};
use cellrate::limits::names::BucketKey;
use cellrate::observe::metrics::Metrics;
use cellrate::store::redis::{RedisSettings, RedisStore};
use cellrate::store::{Store, StoreItem};

fn main() {
    let Ok(url) = std::env::var("REDIS_URL") else {
        eprintln!("redis_throughput: set REDIS_URL (scripts/bench-redis.sh does)");
        return;
    };
    let requests: usize = std::env::var("REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let clients: usize = std::env::var("CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let settings = RedisSettings {
            url: Some(url),
            timeout: Duration::from_secs(1),
            ..RedisSettings::default()
        };
        let store = RedisStore::new(settings, Arc::new(SystemClock), Metrics::new()).unwrap();
        // Limits no run exhausts: every decision is allowed and writes (the script's full
        // path). The name number keeps each kind's buckets apart.
        let (limit, mode, number) = match std::env::var("KIND").as_deref() {
            Ok("calendar") => (
                Limit::calendar(1 << 40, CalendarPeriod::Hour).unwrap(),
                Mode::CheckAndSpend,
                103,
            ),
            Ok("charge") => (Limit::new(1_000_000, 1, SECOND).unwrap(), Mode::Charge, 102),
            Ok("gcra") => (
                Limit::new(1_000_000, 1, SECOND).unwrap(),
                Mode::CheckAndSpend,
                101,
            ),
            _ => (
                Limit::new(1_000_000_000, 1_000_000_000, SECOND).unwrap(),
                Mode::CheckAndSpend,
                100,
            ),
        };
        let allowed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let start = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let (store, allowed) = (store.clone(), allowed.clone());
                tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(requests / clients);
                    for i in 0..requests / clients {
                        let item = StoreItem {
                            key: BucketKey::windowed(
                                number,
                                &format!("bench-{}", (c * 7919 + i) % 10_000),
                                limit.window(),
                            ),
                            limit,
                            cost: 1,
                            mode,
                        };
                        let t = Instant::now();
                        let outcome = store
                            .spend(std::slice::from_ref(&item))
                            .await
                            .expect("redis answers");
                        if outcome.allowed {
                            allowed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        latencies.push(t.elapsed());
                    }
                    latencies
                })
            })
            .collect();
        let mut latencies = Vec::with_capacity(requests);
        for task in tasks {
            latencies.extend(task.await.unwrap());
        }
        let elapsed = start.elapsed();
        latencies.sort();
        let pct = |p: f64| {
            latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)].as_micros()
        };
        println!(
            "decisions_per_second={:.0} p50_us={} p99_us={} allowed={}",
            latencies.len() as f64 / elapsed.as_secs_f64(),
            pct(0.50),
            pct(0.99),
            allowed.load(std::sync::atomic::Ordering::Relaxed)
        );
    });
}
