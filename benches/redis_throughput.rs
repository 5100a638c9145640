//! Decisions per second through the Redis store, against a Redis given by `REDIS_URL`.
//! `scripts/bench-redis.sh` starts a redis-server and runs this beside `redis-benchmark`
//! (a trivial EVALSHA on the same server), alternating, and prints the ratios.
//!
//! `KIND` picks the limit: `gcra` (default), `calendar` (a count per UTC hour) or `charge`
//! (GCRA, charged: the debt path's mode).
//!
//! Output: one line, `decisions_per_second=<n> p50_us=<n> p99_us=<n>`.

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
        // Large limits: every decision is allowed and writes (the script's full path).
        let (limit, mode) = match std::env::var("KIND").as_deref() {
            Ok("calendar") => (
                Limit::calendar(1 << 40, CalendarPeriod::Hour).unwrap(),
                Mode::CheckAndSpend,
            ),
            Ok("charge") => (
                Limit::new(1_000_000_000, 1_000_000_000, SECOND).unwrap(),
                Mode::Charge,
            ),
            _ => (
                Limit::new(1_000_000_000, 1_000_000_000, SECOND).unwrap(),
                Mode::CheckAndSpend,
            ),
        };
        let start = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(requests / clients);
                    for i in 0..requests / clients {
                        let item = StoreItem {
                            key: BucketKey::new(100, &format!("bench-{}", (c * 7919 + i) % 10_000)),
                            limit,
                            cost: 1,
                            mode,
                        };
                        let t = Instant::now();
                        store
                            .spend(std::slice::from_ref(&item))
                            .await
                            .expect("redis answers");
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
            "decisions_per_second={:.0} p50_us={} p99_us={}",
            latencies.len() as f64 / elapsed.as_secs_f64(),
            pct(0.50),
            pct(0.99)
        );
    });
}
