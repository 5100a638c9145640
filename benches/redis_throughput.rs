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
//! `RATE` (decisions a second, all clients together) paces the clients instead of letting
//! each send as fast as it is answered: the latency of a decision at a given load rather
//! than at saturation, which is what a store deadline must cover
//! (`scripts/bench-redis-deadline.sh`). `TIMEOUT_MS` is the store's deadline (default
//! 1 000, far above any answer, so that the whole distribution is seen).
//!
//! `MODULE=require` decides through cellrate's module in the server (`CELLRATE.BATCH`)
//! instead of the script.
//!
//! Output: one line, `decisions_per_second=<n> p50_us=<n> p99_us=<n> allowed=<n>`, then
//! `p999_us=<n> max_us=<n> errors=<n>` and, for each candidate deadline D in ms,
//! `over_<D>ms=<n>`: decisions that took longer than D (each a spurious UNAVAILABLE, and
//! maybe a spent token, had the deadline been D).

// A benchmark measures real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its benchmarks.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellrate::clock::{CalendarPeriod, SystemClock, SECOND};
use cellrate::gcra::{Limit, Mode};
use cellrate::limits::names::BucketKey;
use cellrate::observe::metrics::Metrics;
use cellrate::store::redis::{RedisModule, RedisSettings, RedisStore};
use cellrate::store::{Store, StoreItem};

// The same allocator as cellrate's binary, so that the store's client costs here what it
// costs in `serve` (until 2026-12-06 this bench used the system allocator, whose malloc and
// free were 40 % of the client's instructions per decision).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: cellrate_alloc::MiMalloc = cellrate_alloc::MiMalloc;

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
    let env_u64 = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    // Each client's interval between decisions, when paced.
    let pace = match env_u64("RATE", 0) {
        0 => None,
        rate => Some(Duration::from_nanos(
            1_000_000_000 * clients as u64 / rate.max(1),
        )),
    };
    let timeout = Duration::from_millis(env_u64("TIMEOUT_MS", 1_000));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        // `MODULE=require`: decided by cellrate's module in the server (CELLRATE.BATCH);
        // otherwise by the script.
        let module = match std::env::var("MODULE").as_deref() {
            Ok("require") => RedisModule::Require,
            _ => RedisModule::Forbid,
        };
        let settings = RedisSettings {
            url: Some(url),
            timeout,
            module,
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
                    let mut errors = 0usize;
                    let mut ticks = pace.map(|every| {
                        let mut tick = tokio::time::interval(every);
                        // A late tick is not made up with a burst.
                        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        tick
                    });
                    for i in 0..requests / clients {
                        if let Some(tick) = ticks.as_mut() {
                            tick.tick().await;
                        }
                        let item = StoreItem {
                            key: BucketKey::windowed(
                                number,
                                &format!("bench-{}", (c * 7919 + i) % 10_000),
                                limit.window(),
                            ),
                            limit,
                            cost: 1,
                            mode,
                            lease: None,
                        };
                        let t = Instant::now();
                        match store.spend(std::slice::from_ref(&item)).await {
                            Ok(outcome) if outcome.allowed => {
                                allowed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            Ok(_) => {}
                            Err(_) => errors += 1,
                        }
                        latencies.push(t.elapsed());
                    }
                    (latencies, errors)
                })
            })
            .collect();
        let mut latencies = Vec::with_capacity(requests);
        let mut errors = 0;
        for task in tasks {
            let (mine, failed) = task.await.unwrap();
            latencies.extend(mine);
            errors += failed;
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
        let mut tail = format!(
            "p999_us={} max_us={} errors={errors}",
            pct(0.999),
            latencies.last().map_or(0, |l| l.as_micros())
        );
        for deadline_ms in [2u64, 5, 10, 20, 50, 100, 250] {
            let d = Duration::from_millis(deadline_ms);
            let over = latencies.len() - latencies.partition_point(|&l| l <= d);
            tail.push_str(&format!(" over_{deadline_ms}ms={over}"));
        }
        println!("{tail}");
    });
}
