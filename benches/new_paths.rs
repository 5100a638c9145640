//! The paths added by the budgets and drop-in issues against the GCRA path they extend
//! (#37 goal 5), without the network:
//!
//! - the memory store's single-item decision with a GCRA limit, a calendar window
//!   (counted per UTC hour), and a charge (always spent, into debt) on 10 000 live keys;
//!   a calendar month in UTC against one in `America/New_York` from the 15th (#51: within
//!   1.05x), and the window's end alone (`calendar/window_end`);
//! - matching a descriptor in envoyproxy/ratelimit's format: a domain of 10 and of 10 000
//!   entries, keyed (`key_value`) and wildcard (`prefix*`), the request matching the last
//!   entry written (the most a scan in file order would look at) and matching none.
//!
//! Run: `cargo bench --bench new_paths`. Figures are recorded in BENCHMARKS.md.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use cellrate::clock::{CalendarPeriod, FakeClock, Nanos, SECOND};
use cellrate::gcra::{Limit, Mode};
use cellrate::limits::config::LimitTable;
use cellrate::limits::names::BucketKey;
use cellrate::store::{MemoryStore, StoreItem};
use criterion::{criterion_group, criterion_main, Criterion};

const T0: Nanos = 1_700_000_000 * SECOND;
const KEYS: usize = 10_000;

fn store_paths(c: &mut Criterion) {
    let mut group = c.benchmark_group("store/one_item");
    let gcra = Limit::new(1 << 40, 1_000_000_000, SECOND).unwrap();
    let calendar = Limit::calendar(1 << 40, CalendarPeriod::Hour).unwrap();
    let month = Limit::calendar(1 << 40, CalendarPeriod::Month).unwrap();
    let zoned = CalendarPeriod::parse("1mo~15@America/New_York").unwrap();
    let zoned = Limit::calendar(1 << 40, zoned).unwrap();
    for (label, limit, mode) in [
        ("gcra", gcra, Mode::CheckAndSpend),
        ("calendar_hour", calendar, Mode::CheckAndSpend),
        ("calendar_month_utc", month, Mode::CheckAndSpend),
        ("calendar_month_zoned", zoned, Mode::CheckAndSpend),
        ("charge", gcra, Mode::Charge),
    ] {
        let store = MemoryStore::new(Arc::new(FakeClock::new(T0)));
        let items: Vec<StoreItem> = (0..KEYS)
            .map(|i| StoreItem {
                key: BucketKey::new(100, &format!("user-{i}")),
                limit,
                cost: 1,
                mode,
                lease: None,
            })
            .collect();
        for item in &items {
            store.spend_now(std::slice::from_ref(item)).unwrap();
        }
        group.bench_function(label, |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 7919) % KEYS;
                black_box(store.spend_now(std::slice::from_ref(&items[i])).unwrap())
            })
        });
    }
    group.finish();
}

/// Where a calendar window ends, the arithmetic a calendar decision adds: a UTC month's
/// (days to a civil date and back) against a zoned one's (the window kept in one atomic
/// word, the zone database read only when a window ends).
fn window_end(c: &mut Criterion) {
    let mut group = c.benchmark_group("calendar/window_end");
    let zoned = CalendarPeriod::parse("1mo~15@America/New_York").unwrap();
    for (label, period) in [("month_utc", CalendarPeriod::Month), ("month_zoned", zoned)] {
        group.bench_function(label, |b| {
            let mut now = T0;
            b.iter(|| {
                now += 1_000;
                black_box(black_box(period).window_end(now))
            })
        });
    }
    group.finish();
}

/// A domain of `n` entries under `route`, each `user` = `<prefix><i><suffix>`.
fn domain(n: usize, prefix: &str, suffix: &str) -> LimitTable {
    let mut text =
        String::from("domain: d\ndescriptors:\n  - key: route\n    value: r\n    descriptors:\n");
    for i in 0..n {
        text.push_str(&format!(
            "      - key: user\n        value: \"{prefix}{i}{suffix}\"\n        rate_limit: {{unit: second, requests_per_unit: {}}}\n",
            i + 1
        ));
    }
    LimitTable::from_files(&[("d.yaml".to_string(), text)]).unwrap()
}

fn matching(c: &mut Criterion) {
    let mut group = c.benchmark_group("ratelimit_format/find");
    for n in [10usize, 10_000] {
        for (kind, suffix, value) in [
            ("keyed", "", format!("team-{}", n - 1)),
            ("wildcard", "-*", format!("team-{}-alice", n - 1)),
        ] {
            let table = domain(n, "team-", suffix);
            let domains = table.ratelimit();
            let hit = [("route", "r"), ("user", value.as_str())];
            assert!(domains.find("d", &hit).is_some(), "{kind} {n} matches");
            group.bench_function(format!("{kind}/{n}_entries/match"), |b| {
                b.iter(|| black_box(domains.find(black_box("d"), black_box(&hit))))
            });
            let miss = [("route", "r"), ("user", "nobody")];
            assert!(domains.find("d", &miss).is_none());
            group.bench_function(format!("{kind}/{n}_entries/none"), |b| {
                b.iter(|| black_box(domains.find(black_box("d"), black_box(&miss))))
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(2));
    targets = store_paths, window_end, matching
}
criterion_main!(benches);
