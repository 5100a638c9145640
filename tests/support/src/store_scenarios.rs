//! One scenario suite, every store: the memory store, Redis standalone and a 3-master
//! Redis Cluster answer every GCRA and batch scenario identically (on a fake clock that
//! the Redis store passes to its script). Each tier runs the scenarios on the stores it has,
//! one test per scenario and store, `store_scenarios::<store>::<scenario>`, each on a fresh
//! store: the fast tier on the memory store (its `main.rs`), the full tier on Redis and
//! Valkey, standalone and clustered (`tests/full/store_scenarios.rs`); both take the list of
//! scenarios from [`every_store_scenario!`](crate::every_store_scenario).

use std::sync::Arc;

use cellrate::clock::{FakeClock, Nanos, SECOND};
use cellrate::gcra::{Decision, Limit, Mode};
use cellrate::limits::names::BucketKey;
use cellrate::observe::metrics::Metrics;
use cellrate::store::{MemoryStore, Store, StoreItem};

/// The fake clock's start.
pub const T0: Nanos = 1_700_000_000 * SECOND;
const MS: Nanos = 1_000_000;

/// A store under test, its clock and metrics.
pub struct Subject {
    pub store: Arc<dyn Store>,
    pub clock: FakeClock,
    /// Read by the Redis scenarios only.
    pub metrics: Arc<Metrics>,
    /// A Redis Cluster's key slot (`cellrate::store::redis::slot`), when the store is one.
    pub cluster_slot: Option<fn(&str) -> usize>,
}

/// The memory store on a fake clock at [`T0`].
pub fn memory() -> Subject {
    let clock = FakeClock::new(T0);
    Subject {
        store: Arc::new(MemoryStore::new(Arc::new(clock.clone()))),
        clock,
        metrics: Metrics::new(),
        cluster_slot: None,
    }
}

fn item(key: &str, limit: Limit, cost: u64, mode: Mode) -> StoreItem {
    crate::store_item(&BucketKey::new(100, key), limit, cost, mode)
}

use crate::spend_item as spend;

fn d(allowed: bool, remaining: i64, retry_in: Nanos, reset_in: Nanos) -> Decision {
    Decision {
        allowed,
        remaining,
        retry_in,
        reset_in,
    }
}

async fn one(s: &Subject, item: StoreItem) -> Decision {
    let out = s.store.spend(std::slice::from_ref(&item)).await.unwrap();
    out.decisions[0]
}

fn seed() -> Limit {
    Limit::new(20, 20, SECOND).unwrap()
}

pub async fn seed_000(s: &Subject) {
    for i in 1..=20 {
        let got = one(s, spend("seed", seed(), 1)).await;
        assert_eq!(
            got,
            d(true, 20 - i, if i == 20 { 50 * MS } else { 0 }, i * 50 * MS),
            "request {i}"
        );
    }
    assert_eq!(
        one(s, spend("seed", seed(), 1)).await,
        d(false, 0, 50 * MS, SECOND)
    );
    s.clock.advance(50 * MS - 1);
    assert_eq!(
        one(s, spend("seed", seed(), 1)).await,
        d(false, 0, 1, SECOND - 50 * MS + 1)
    );
    s.clock.advance(1);
    assert_eq!(
        one(s, spend("seed", seed(), 1)).await,
        d(true, 0, 50 * MS, SECOND)
    );
    s.clock.advance(14 * 86_400 * SECOND);
    assert_eq!(
        one(s, spend("seed", seed(), 1)).await,
        d(true, 19, 0, 50 * MS)
    );
}

pub async fn peek_and_oversize(s: &Subject) {
    assert_eq!(one(s, spend("peek", seed(), 0)).await, d(true, 20, 0, 0));
    one(s, spend("peek", seed(), 3)).await;
    assert_eq!(
        one(s, spend("peek", seed(), 0)).await,
        d(true, 17, 0, 150 * MS)
    );
    assert_eq!(
        one(s, spend("peek", seed(), 0)).await,
        d(true, 17, 0, 150 * MS),
        "a peek wrote"
    );
    assert_eq!(
        one(s, spend("peek", seed(), 21)).await,
        d(false, 17, 200 * MS, 150 * MS)
    );
}

pub async fn all_or_nothing(s: &Subject) {
    let tight = Limit::new(2, 2, SECOND).unwrap();
    // Ids chosen to fall in different cluster slots (checked below), so that the cluster
    // store has to compensate.
    let (a, b, c) = ("aon-a", "aon-b", "aon-c");
    one(s, spend(c, tight, 2)).await;
    let batch = [spend(a, seed(), 1), spend(b, seed(), 5), spend(c, tight, 1)];
    let out = s.store.spend(&batch).await.unwrap();
    assert!(!out.allowed);
    assert_eq!(
        out.decisions,
        vec![
            d(true, 20, 0, 0),
            d(true, 20, 0, 0),
            d(false, 0, 500 * MS, SECOND)
        ]
    );
    // Nothing stayed spent.
    assert_eq!(one(s, spend(a, seed(), 0)).await, d(true, 20, 0, 0));
    assert_eq!(one(s, spend(b, seed(), 0)).await, d(true, 20, 0, 0));
    s.clock.advance(500 * MS);
    let out = s.store.spend(&batch).await.unwrap();
    assert!(out.allowed);
    assert_eq!(
        out.decisions,
        vec![
            d(true, 19, 0, 50 * MS),
            d(true, 15, 0, 250 * MS),
            d(true, 0, 500 * MS, SECOND)
        ]
    );
    if let Some(slot) = s.cluster_slot {
        let slots: Vec<usize> = [a, b, c]
            .iter()
            .map(|id| slot(&format!("t:100:{id}")))
            .collect();
        assert!(
            slots[0] != slots[2] && slots[1] != slots[2],
            "ids share a slot: {slots:?}"
        );
        let text = s.metrics.render();
        assert!(
            text.contains("cellrate_store_compensations_total 1"),
            "no compensation counted"
        );
    }
}

pub async fn modes(s: &Subject) {
    // Check-only reports what the spend would leave, and writes nothing (twice the same).
    let check = item("m-check", seed(), 4, Mode::CheckOnly);
    for _ in 0..2 {
        let out = s.store.spend(std::slice::from_ref(&check)).await.unwrap();
        assert_eq!(
            (out.allowed, out.decisions[0]),
            (true, d(true, 16, 0, 200 * MS))
        );
    }
    let tight = Limit::new(1, 1, SECOND).unwrap();
    one(s, spend("m-spare", tight, 1)).await;
    let out = s
        .store
        .spend(&[
            spend("m-main", seed(), 1),
            item("m-spare", tight, 1, Mode::SpendOnly),
        ])
        .await
        .unwrap();
    assert!(out.allowed);
    assert_eq!(
        out.decisions,
        vec![d(true, 19, 0, 50 * MS), d(false, 0, SECOND, SECOND)]
    );
    // A denied batch does not write its spend-only item either.
    let out = s
        .store
        .spend(&[
            spend("m-spare", tight, 1),
            item("m-other", seed(), 1, Mode::SpendOnly),
        ])
        .await
        .unwrap();
    assert!(!out.allowed);
    assert_eq!(one(s, spend("m-other", seed(), 0)).await, d(true, 20, 0, 0));
}

/// Charges: recorded whatever the bucket holds, into debt at most one burst deep; a bucket
/// in debt denies until refill repays it; a charge counts even in a batch another item
/// denies (across cluster slots too: compensation leaves it).
pub async fn charges(s: &Subject) {
    let charge = |key, cost| item(key, seed(), cost, Mode::Charge);
    // 25 tokens from a bucket of 20 (one token per 50 ms): five in debt.
    assert_eq!(
        one(s, charge("c-debt", 25)).await,
        d(false, -5, 300 * MS, 1_250 * MS)
    );
    // In debt: a request that needs a token waits for the debt and the token.
    assert_eq!(
        one(s, spend("c-debt", seed(), 1)).await,
        d(false, -5, 300 * MS, 1_250 * MS)
    );
    // A huge charge: the debt stops at one burst (the TAT two burst offsets ahead), the
    // largest cost there is included (no overflow on the way, in Rust or in Lua).
    assert_eq!(
        one(s, charge("c-debt", 1_000_000)).await,
        d(false, -20, 1_050 * MS, 2 * SECOND)
    );
    assert_eq!(
        one(s, charge("c-debt", u64::MAX)).await,
        d(false, -20, 1_050 * MS, 2 * SECOND)
    );
    assert_eq!(
        one(s, charge("c-max", u64::MAX)).await,
        d(false, -20, 1_050 * MS, 2 * SECOND)
    );
    // Repaid by refill: the next token exists 1.05 s later, not a nanosecond sooner.
    s.clock.advance(1_050 * MS - 1);
    assert!(!one(s, spend("c-debt", seed(), 1)).await.allowed);
    s.clock.advance(1);
    assert_eq!(
        one(s, spend("c-debt", seed(), 1)).await,
        d(true, 0, 50 * MS, SECOND)
    );

    // A batch denied by another item: the charge is recorded, the spend is not.
    let tight = Limit::new(1, 1, SECOND).unwrap();
    let (a, b, c) = ("aon-a", "aon-b", "aon-c");
    one(s, spend(c, tight, 1)).await;
    let out = s
        .store
        .spend(&[spend(a, seed(), 1), charge(b, 5), spend(c, tight, 1)])
        .await
        .unwrap();
    assert!(!out.allowed);
    assert_eq!(
        out.decisions,
        vec![
            d(true, 20, 0, 0),
            d(true, 15, 0, 250 * MS),
            d(false, 0, SECOND, SECOND)
        ]
    );
    assert_eq!(one(s, spend(a, seed(), 0)).await, d(true, 20, 0, 0));
    assert_eq!(one(s, spend(b, seed(), 0)).await, d(true, 15, 0, 250 * MS));
}

/// Calendar windows: at most `count` per window, back when the next window starts (on the
/// store's clock); all-or-nothing with GCRA items; charges into debt; refunds to the window.
pub async fn calendar_windows(s: &Subject) {
    use cellrate::clock::CalendarPeriod;
    // T0 is 22:13:20: this minute's window ends 40 s later.
    let minute = Limit::calendar(3, CalendarPeriod::Minute).unwrap();
    let end = 40 * SECOND;
    for left in [2, 1, 0] {
        assert_eq!(
            one(s, spend("w-min", minute, 1)).await,
            d(true, left, if left > 0 { 0 } else { end }, end)
        );
    }
    assert_eq!(
        one(s, spend("w-min", minute, 1)).await,
        d(false, 0, end, end)
    );
    // All-or-nothing with a GCRA item: the full window denies both.
    let out = s
        .store
        .spend(&[spend("w-gcra", seed(), 1), spend("w-min", minute, 1)])
        .await
        .unwrap();
    assert!(!out.allowed);
    assert_eq!(one(s, spend("w-gcra", seed(), 0)).await, d(true, 20, 0, 0));
    // A charge goes into debt (at most one count), a refund gives back to the window.
    assert_eq!(
        one(s, item("w-charge", minute, 5, Mode::Charge)).await,
        d(false, -2, end, end)
    );
    let back = s
        .store
        .refund(&[spend("w-charge", minute, 1)])
        .await
        .unwrap();
    assert_eq!(back[0], d(true, -1, 0, end));
    // The next window: everything back, debt included.
    s.clock.advance(end - 1);
    assert!(!one(s, spend("w-min", minute, 1)).await.allowed);
    s.clock.advance(1);
    assert_eq!(one(s, spend("w-min", minute, 0)).await, d(true, 3, 0, 0));
    assert_eq!(one(s, spend("w-charge", minute, 0)).await, d(true, 3, 0, 0));
    // A month: the window ends on the 1st (now 22:14:00 on 2023-11-14; 2023-12-01T00:00Z
    // is 16 d 1 h 46 min on).
    let month = Limit::calendar(1_000, CalendarPeriod::Month).unwrap();
    let to_december = (16 * 86_400 + 6_360) * SECOND;
    assert_eq!(
        one(s, spend("w-month", month, 10)).await,
        d(true, 990, 0, to_december)
    );
    // envoyproxy/ratelimit's WEEK, MONTH and YEAR: 7, 30 and 365 days since the epoch
    // (now is 1 700 000 040 s).
    for (period, to_end) in [
        (CalendarPeriod::Week, 92_760),
        (CalendarPeriod::Days30, 351_960),
        (CalendarPeriod::Days365, 2_943_960),
    ] {
        let limit = Limit::calendar(2, period).unwrap();
        let key = format!("w-{period}");
        assert_eq!(
            one(s, spend(&key, limit, 2)).await,
            d(true, 0, to_end * SECOND, to_end * SECOND),
            "{period}"
        );
        assert_eq!(
            one(s, spend(&key, limit, 1)).await,
            d(false, 0, to_end * SECOND, to_end * SECOND),
            "{period}"
        );
    }
}

/// Windows in a time zone and from an anchor day (#51), decided on the store's clock: a
/// New York month and a Berlin week across the 2026 changes reset at local midnight of the
/// right day, to the second, on both sides of each change; a month anchored on the 31st
/// ends on the last day of February (2026 and the leap 2028) and of April.
pub async fn zoned_windows(s: &Subject) {
    use cellrate::clock::CalendarPeriod;
    let cal = |text: &str| Limit::calendar(2, CalendarPeriod::parse(text).unwrap()).unwrap();
    // Unix seconds of local midnights (the first of each month; Mondays; UTC's 31sts).
    let cases = [
        ("1mo@America/New_York", 1_772_341_200, 1_775_016_000), // 2026-03: EST to EDT
        ("1mo@America/New_York", 1_793_505_600, 1_796_101_200), // 2026-11: EDT to EST
        ("1w@Europe/Berlin", 1_774_220_400, 1_774_821_600),     // 167 hours
        ("1w@Europe/Berlin", 1_792_360_800, 1_792_969_200),     // 169 hours
        ("1d@Europe/Berlin", 1_774_738_800, 1_774_821_600),     // 23 hours
        ("1mo~31", 1_769_817_600, 1_772_236_800),               // Jan 31 to Feb 28
        ("1mo~31", 1_774_915_200, 1_777_507_200),               // Mar 31 to Apr 30
        ("1mo~31", 1_832_889_600, 1_835_395_200),               // 2028: to Feb 29
    ];
    for (n, (text, start, end)) in cases.into_iter().enumerate() {
        let limit = cal(text);
        let at = |seconds: i64| seconds * SECOND;
        let id = format!("z{n}");
        let zoned = StoreItem {
            key: BucketKey::windowed(100, &id, limit.window()),
            ..spend(&id, limit, 1)
        };
        // The last second of the window before: spent out until `start`, not a second more.
        s.clock.set(at(start - 1));
        one(s, zoned.clone()).await;
        one(s, zoned.clone()).await;
        assert_eq!(
            one(s, zoned.clone()).await,
            d(false, 0, SECOND, SECOND),
            "{text} {start}"
        );
        // Local midnight: a fresh window that lasts until `end`.
        s.clock.set(at(start));
        let len = at(end - start);
        assert_eq!(
            one(s, zoned.clone()).await,
            d(true, 1, 0, len),
            "{text} {start}"
        );
        s.clock.set(at(end - 1));
        assert_eq!(
            one(s, zoned.clone()).await,
            d(true, 0, SECOND, SECOND),
            "{text}"
        );
        assert_eq!(
            one(s, zoned.clone()).await,
            d(false, 0, SECOND, SECOND),
            "{text}"
        );
        let refunded = s.store.refund(std::slice::from_ref(&zoned)).await.unwrap();
        assert_eq!(
            refunded[0],
            d(true, 1, 0, SECOND),
            "{text}: a refund to its window"
        );
        s.clock.set(at(end));
        let next = one(s, zoned.clone()).await;
        assert!(
            next.allowed && next.remaining == 1,
            "{text} at {end}: {next:?}"
        );
    }
}

pub async fn refunds(s: &Subject) {
    one(s, spend("r", seed(), 5)).await;
    let refund = |key: &str, cost| vec![spend(key, seed(), cost)];
    assert_eq!(
        s.store.refund(&refund("r", 2)).await.unwrap(),
        vec![d(true, 17, 0, 150 * MS)]
    );
    assert_eq!(
        s.store.refund(&refund("r", 10)).await.unwrap(),
        vec![d(true, 20, 0, 0)]
    );
    assert_eq!(
        s.store.refund(&refund("r", 1)).await.unwrap(),
        vec![d(false, 20, 0, 0)]
    );
    assert_eq!(
        s.store.refund(&refund("never", 1)).await.unwrap(),
        vec![d(false, 20, 0, 0)]
    );
    assert_eq!(
        one(s, spend("never", seed(), 0)).await,
        d(true, 20, 0, 0),
        "a refund created a bucket"
    );
}

/// A store call that names one bucket twice refunds (and resets) it twice, each item from
/// what the one before left, as the memory store does: found by `store_differential`,
/// where Redis read every bucket once at the start and its last write won (a refund of 2
/// and 1 gave back 1). The service refuses a bucket twice per request; the stores agree
/// anyway.
pub async fn named_twice(s: &Subject) {
    one(s, spend("twice", seed(), 5)).await;
    let back = s
        .store
        .refund(&[spend("twice", seed(), 2), spend("twice", seed(), 1)])
        .await
        .unwrap();
    assert_eq!(
        back,
        vec![d(true, 17, 0, 150 * MS), d(true, 18, 0, 100 * MS)]
    );
    assert_eq!(
        one(s, spend("twice", seed(), 0)).await,
        d(true, 18, 0, 100 * MS),
        "a refund was lost"
    );
    let keys = [BucketKey::new(100, "twice"), BucketKey::new(100, "twice")];
    assert_eq!(
        s.store.reset(&keys).await.unwrap(),
        1,
        "a bucket counted twice"
    );

    // A spend naming a bucket twice, denied by an item in another cluster slot: nothing
    // stays spent (a cluster's compensation refunds the one value the spend wrote, once).
    let tight = Limit::new(1, 1, SECOND).unwrap();
    let (a, c) = ("aon-a", "aon-c");
    one(s, spend(c, tight, 1)).await;
    one(s, spend(a, seed(), 5)).await;
    let batch = [spend(a, seed(), 1), spend(a, seed(), 2), spend(c, tight, 1)];
    assert!(!s.store.spend(&batch).await.unwrap().allowed);
    assert_eq!(
        one(s, spend(a, seed(), 0)).await,
        d(true, 15, 0, 250 * MS),
        "a compensation refunded more than was spent"
    );
}

/// A calendar bucket refunded to none used is full: no bucket (it was kept as its window's
/// end plus 0, which a reset counted as not full), and a denied cross-slot batch leaves no
/// bucket of a window behind (found by `store_differential` on a Redis Cluster: after the
/// compensation a reset counted 1 where the memory store counted 0).
pub async fn calendar_refund_to_none(s: &Subject) {
    use cellrate::clock::CalendarPeriod;
    let minute = Limit::calendar(2, CalendarPeriod::Minute).unwrap();
    let windowed = |id: &str| StoreItem {
        key: BucketKey::windowed(100, id, minute.window()),
        ..spend(id, minute, 1)
    };
    one(s, windowed("aon-a")).await;
    let back = s.store.refund(&[windowed("aon-a")]).await.unwrap();
    assert_eq!(back, vec![d(true, 2, 0, 0)]);
    let reset = s.store.reset(&[windowed("aon-a").key]).await.unwrap();
    assert_eq!(reset, 0, "a full bucket counted");

    let tight = Limit::new(1, 1, SECOND).unwrap();
    one(s, spend("aon-c", tight, 1)).await;
    let batch = [windowed("aon-b"), spend("aon-c", tight, 1)];
    assert!(!s.store.spend(&batch).await.unwrap().allowed);
    let reset = s.store.reset(&[windowed("aon-b").key]).await.unwrap();
    assert_eq!(reset, 0, "a denied batch left a bucket");
}

pub async fn resets(s: &Subject) {
    one(s, spend("x1", seed(), 20)).await;
    let keys = [BucketKey::new(100, "x1"), BucketKey::new(100, "x2")];
    assert_eq!(s.store.reset(&keys).await.unwrap(), 1);
    assert_eq!(one(s, spend("x1", seed(), 0)).await, d(true, 20, 0, 0));
    assert_eq!(s.store.reset(&keys).await.unwrap(), 0);
}

pub async fn lowered_limit(s: &Subject) {
    let generous = Limit::new(100, 100, SECOND).unwrap();
    one(s, spend("low", generous, 100)).await;
    let strict = Limit::new(2, 4, SECOND).unwrap();
    assert_eq!(
        one(s, spend("low", strict, 1)).await,
        d(false, -2, 750 * MS, SECOND)
    );
}

pub async fn past_tat_is_full(s: &Subject) {
    one(s, spend("past", seed(), 20)).await;
    s.clock.advance(2 * SECOND);
    assert_eq!(
        one(s, spend("past", seed(), 1)).await,
        d(true, 19, 0, 50 * MS)
    );
}

/// Calls the macro `$run` with the name of every scenario above: a tier's `$run` makes one
/// test per scenario on each of its stores.
#[macro_export]
macro_rules! every_store_scenario {
    ($run:ident) => {
        $run!(
            seed_000,
            peek_and_oversize,
            all_or_nothing,
            modes,
            charges,
            calendar_windows,
            zoned_windows,
            refunds,
            named_twice,
            calendar_refund_to_none,
            resets,
            lowered_limit,
            past_tat_is_full,
        );
    };
}
