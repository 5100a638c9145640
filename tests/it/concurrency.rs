//! Many threads on the memory store at once: the bound holds and no batch is half-applied.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::store_item;
use cellrate::clock::{FakeClock, Nanos, SECOND};
use cellrate::gcra::{Limit, Mode};
use cellrate::limits::names::BucketKey;
use cellrate::store::{MemoryStore, StoreItem};

const T0: Nanos = 1_700_000_000 * SECOND;
const THREADS: usize = 8;
const ROUNDS: usize = 2_000;

#[test]
fn overlapping_batches_are_atomic_and_bounded_on_a_still_clock() {
    let clock = FakeClock::new(T0);
    // Few shards, so that batches often meet in the same and in crossing shards.
    let store = Arc::new(MemoryStore::with_capacity(
        Arc::new(clock.clone()),
        4,
        1_000,
    ));
    let limit = Limit::new(500, 1, SECOND).unwrap();
    let keys: Vec<BucketKey> = (0..3)
        .map(|i| BucketKey::new(100, &format!("k{i}")))
        .collect();
    // spent[k]: tokens that allowed answers say were taken from bucket k.
    let spent: Arc<Vec<AtomicU64>> = Arc::new((0..3).map(|_| AtomicU64::new(0)).collect());
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (store, keys, spent) = (store.clone(), keys.clone(), spent.clone());
            scope.spawn(move || {
                for r in 0..ROUNDS {
                    // Singles, pairs in both orders, and all three.
                    let pick: Vec<usize> = match (t + r) % 5 {
                        0 => vec![t % 3],
                        1 => vec![0, 1],
                        2 => vec![1, 0],
                        3 => vec![2, 1, 0],
                        _ => vec![1, 2],
                    };
                    let items: Vec<StoreItem> = pick
                        .iter()
                        .map(|&k| store_item(&keys[k], limit, 1, Mode::CheckAndSpend))
                        .collect();
                    let out = store.spend_now(&items).unwrap();
                    assert_eq!(out.allowed, out.decisions.iter().all(|d| d.allowed));
                    if out.allowed {
                        for &k in &pick {
                            spent[k].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    for (k, key) in keys.iter().enumerate() {
        let tat = store.tat(key).unwrap();
        let taken = ((tat - T0) / limit.emission_interval()) as u64;
        let counted = spent[k].load(Ordering::Relaxed);
        assert_eq!(
            taken, counted,
            "bucket {k}: the TAT and the allowed answers disagree"
        );
        assert!(counted <= 500, "bucket {k} admitted {counted} > burst");
    }
    // Demand (16 000 requests) far exceeds the burst: every bucket was driven to empty
    // by some batch, and denials spent nothing.
    assert!(spent.iter().any(|s| s.load(Ordering::Relaxed) == 500));
}

#[test]
fn one_hot_bucket_with_time_moving_respects_burst_plus_elapsed() {
    let clock = FakeClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let limit = Limit::new(50, 1_000, SECOND).unwrap(); // ei 1ms
    let key = BucketKey::new(100, "hot");
    let admitted = Arc::new(AtomicU64::new(0));
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            let (store, key, admitted) = (store.clone(), key.clone(), admitted.clone());
            scope.spawn(move || {
                for _ in 0..ROUNDS {
                    if store
                        .spend_now(&[store_item(&key, limit, 1, Mode::CheckAndSpend)])
                        .unwrap()
                        .allowed
                    {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        // Time moves 100µs at a time while the workers run: 200ms in all.
        let clock = clock.clone();
        scope.spawn(move || {
            for _ in 0..2_000 {
                clock.advance(100_000);
                std::thread::yield_now();
            }
        });
    });
    let tat_ahead = tokens_from_t0_to_tat(&store, &key, limit);
    let admitted = admitted.load(Ordering::Relaxed);
    let bound = 50 + 200; // burst + elapsed / ei
    assert!(admitted <= bound, "admitted {admitted} > {bound}");
    assert!(admitted >= 50, "at least the burst passes: {admitted}");
    // The TAT never lies beyond now + burst offset (T0 + 200ms + 50ms).
    assert!(tat_ahead <= 250, "TAT is {tat_ahead} tokens past T0");
}

/// How far the bucket's TAT lies past T0, in emission intervals.
fn tokens_from_t0_to_tat(store: &MemoryStore, key: &BucketKey, limit: Limit) -> i64 {
    store
        .tat(key)
        .map_or(0, |tat| (tat - T0) / limit.emission_interval())
}
