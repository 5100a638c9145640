//! Settlements played by an attacker (#46): a `Settle` must give back at most what its
//! Check wrote, in the window it wrote it, once, and never before the Check is decided.
//! Each test fails on the code before the fix (the figures are in the commit that added
//! it). Through real gRPC clients; the race on real `cellrate serve --store redis`.

use std::path::Path;
use std::sync::Arc;

use crate::common::faulty::{Fault, FaultyStore};
use crate::common::settle::settle;
use crate::common::settle_attacks::{check, limits};
use crate::common::{item, remaining, Served, T0};
use cellrate::clock::{CalendarPeriod, FakeClock, SECOND};
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use cellrate::store::MemoryStore;
use tonic::Code;

fn table(dir: &Path) -> LimitTable {
    LimitTable::load_dir(dir).unwrap()
}

/// #46 item 4: a spend-only item that did not fit was not written; settling it at 0 used
/// to refund its cost anyway (before: 100 tokens through 5 an hour in 20 cycles).
#[tokio::test]
async fn an_unwritten_spend_only_item_gets_nothing_back() {
    let dir = limits();
    let mut s = Served::with_limits(table(dir.path())).await;
    let mut c = s.decisions.clone();
    assert!(check(&mut c, "", item("FivePerHour", "acme", Some(5)))
        .await
        .unwrap());
    let mut more = 0;
    for i in 0..20 {
        let best_effort = pb::Item {
            mode: pb::Mode::SpendOnly as i32,
            ..item("FivePerHour", "acme", Some(5))
        };
        let id = format!("spend-only-{i}");
        assert!(check(&mut c, &id, best_effort).await.unwrap());
        settle(&mut c, &id, &[0]).await.unwrap();
        if check(&mut c, "", item("FivePerHour", "acme", Some(5)))
            .await
            .unwrap()
        {
            more += 5;
        }
    }
    assert_eq!(more, 0, "tokens beyond the hour's 5");
    assert_eq!(remaining(&mut s, "FivePerHour", "acme").await, 0);
    s.stop().await;
}

/// #46 item 4: a Check made while its id was `unlimited` (a temporary override) spent
/// nothing; settling it at 0 after the override was cleared used to refund its cost.
#[tokio::test]
async fn a_check_made_while_unlimited_gets_nothing_back() {
    let dir = limits();
    let mut s = Served::with_limits(table(dir.path())).await;
    let mut c = s.decisions.clone();
    let mut more = 0;
    for i in 0..20 {
        s.admin
            .set_override(pb::SetOverrideRequest {
                name: "FivePerHour".into(),
                id: "vip".into(),
                unlimited: true,
                ttl: Some(prost_types::Duration {
                    seconds: 60,
                    nanos: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap();
        let id = format!("unlimited-{i}");
        assert!(check(&mut c, &id, item("FivePerHour", "vip", Some(5)))
            .await
            .unwrap());
        s.admin
            .clear_override(pb::ClearOverrideRequest {
                name: "FivePerHour".into(),
                id: "vip".into(),
            })
            .await
            .unwrap();
        // The first cycle's spend empties the bucket: the hour's 5.
        let spent = check(&mut c, "", item("FivePerHour", "vip", Some(5)))
            .await
            .unwrap();
        settle(&mut c, &id, &[0]).await.unwrap();
        more += 5 * u32::from(spent && i > 0);
        if check(&mut c, "", item("FivePerHour", "vip", Some(5)))
            .await
            .unwrap()
        {
            more += 5;
        }
    }
    assert_eq!(more, 0, "tokens beyond the hour's 5");
    s.stop().await;
}

/// #46 item 5: an adjustment made whose answer missed the store's deadline used to reopen
/// the record, so that every retry charged (or refunded) again (before: 400 charged for
/// 100 over four attempts; a late refund likewise).
#[tokio::test]
async fn a_retry_after_a_late_store_answer_adjusts_once() {
    let dir = limits();
    let memory = Arc::new(MemoryStore::new(Arc::new(FakeClock::new(T0))));
    let store = FaultyStore::new(memory, true);
    let mut s = Served::full(table(dir.path()), Settings::default(), Some(store.clone())).await;
    let mut c = s.decisions.clone();
    let charge = item("TokensPerTenant", "charged", Some(100));
    assert!(check(&mut c, "job-1", charge).await.unwrap());
    // Half used already, so that refunds never reach full.
    assert!(
        check(&mut c, "", item("TokensPerTenant", "refunded", Some(5_000)))
            .await
            .unwrap()
    );
    let refund = item("TokensPerTenant", "refunded", Some(300));
    assert!(check(&mut c, "job-2", refund).await.unwrap());

    let mut failures = Vec::new();
    for (id, actual) in [("job-1", 200), ("job-2", 100)] {
        store.faults.set([Fault::Late; 4]);
        let mut failed = 0;
        for _ in 0..4 {
            match settle(&mut c, id, &[actual]).await {
                Err(e) => {
                    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
                    failed += 1;
                }
                Ok(answer) => assert!(answer.already_settled, "{id}"),
            }
        }
        failures.push(failed);
    }
    let charged = 10_000 - 100 - remaining(&mut s, "TokensPerTenant", "charged").await;
    assert_eq!(charged, 100, "charged beyond the estimate");
    let refunded = remaining(&mut s, "TokensPerTenant", "refunded").await - (5_000 - 300);
    assert_eq!(refunded, 200, "refunded");
    assert_eq!(
        failures,
        [1, 1],
        "only the first attempt found it unsettled"
    );
    s.stop().await;
}

/// #46 item 9: an estimate spent at the end of one calendar hour, settled at 0 in the
/// next, used to credit the new hour (before: 200 spent in one hour of 100).
#[tokio::test]
async fn a_refund_is_not_credited_to_the_next_calendar_window() {
    let dir = limits();
    let s = Served::with_limits(table(dir.path())).await;
    let mut c = s.decisions.clone();
    let end = CalendarPeriod::Hour.window_end(T0);
    s.clock.set(end - 10 * SECOND);
    let estimate = item("HourlyWindow", "acme", Some(100));
    assert!(check(&mut c, "late-1", estimate).await.unwrap());
    s.clock.set(end + 10 * SECOND);
    let mut spent = 0;
    for _ in 0..2 {
        if check(&mut c, "", item("HourlyWindow", "acme", Some(100)))
            .await
            .unwrap()
        {
            spent += 100;
        }
        settle(&mut c, "late-1", &[0]).await.unwrap();
    }
    assert_eq!(spent, 100, "spent in the new hour");
    // In its own window, a refund still comes back (and only while 1 s of it is left).
    let next = CalendarPeriod::Hour.window_end(CalendarPeriod::Hour.window_end(end));
    s.clock.set(next - 10 * SECOND);
    for (id, cost) in [("early", 60), ("last-second", 30)] {
        assert!(check(&mut c, id, item("HourlyWindow", "acme", Some(cost)))
            .await
            .unwrap());
    }
    settle(&mut c, "early", &[10]).await.unwrap();
    s.clock.set(next - SECOND / 2);
    let answer = settle(&mut c, "last-second", &[0]).await.unwrap();
    assert_eq!(answer.items[0].remaining, 100 - 10 - 30);
    s.stop().await;
}

/// #51: a zoned window is kept in a settlement by its text. An estimate spent at the end of
/// a New York day, settled at 0 in the next, is not credited to the new day (with a zoned
/// period recorded as no window: 200 spent in one day of 100).
#[tokio::test]
async fn a_refund_is_not_credited_to_the_next_zoned_day() {
    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, text: &str| std::fs::write(dir.path().join(file), text).unwrap();
    write("names.yaml", "NewYorkDay: {number: 103, format: string}\n");
    write(
        "defaults.yaml",
        "NewYorkDay: {window: calendar, count: 100, period: 1d, timezone: America/New_York}\n",
    );
    let s = Served::with_limits(table(dir.path())).await;
    let mut c = s.decisions.clone();
    let day = CalendarPeriod::parse("1d@America/New_York").unwrap();
    let end = day.window_end(T0);
    assert_ne!(
        end % (86_400 * SECOND),
        0,
        "a New York day does not end at UTC midnight"
    );
    s.clock.set(end - 10 * SECOND);
    assert!(
        check(&mut c, "late-ny", item("NewYorkDay", "acme", Some(100)))
            .await
            .unwrap()
    );
    s.clock.set(end + 10 * SECOND);
    let mut spent = 0;
    for _ in 0..2 {
        if check(&mut c, "", item("NewYorkDay", "acme", Some(100)))
            .await
            .unwrap()
        {
            spent += 100;
        }
        settle(&mut c, "late-ny", &[0]).await.unwrap();
    }
    assert_eq!(spent, 100, "spent in the new New York day");
    // In its own window, a refund still comes back.
    assert!(
        check(&mut c, "same-day", item("NewYorkDay", "bee", Some(60)))
            .await
            .unwrap()
    );
    let answer = settle(&mut c, "same-day", &[10]).await.unwrap();
    assert_eq!(answer.items[0].remaining, 90);
    s.stop().await;
}
