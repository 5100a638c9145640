//! Settlements played by an attacker (#46): a `Settle` must give back at most what its
//! Check wrote, in the window it wrote it, once, and never before the Check is decided.
//! Each test fails on the code before the fix (the figures are in the commit that added
//! it). Through real gRPC clients; the race on real `cellrate serve --store redis`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::faulty::{Fault, FaultyStore};
use crate::common::redis_server::RedisServer;
use crate::common::{item, remaining, serve_with, Served, T0};
use crate::settle::settle;
use cellrate::clock::{CalendarPeriod, FakeClock, SECOND};
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use cellrate::store::MemoryStore;
use tonic::Code;

/// TokensPerTenant: 10 000 a month (no refill to speak of during a test); FivePerHour;
/// HourlyWindow: 100 per calendar hour.
fn limits() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("names.yaml"),
        "TokensPerTenant: {number: 100, format: string}\n\
         FivePerHour: {number: 101, format: string}\n\
         HourlyWindow: {number: 102, format: string}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "TokensPerTenant: {burst: 10000, count: 10000, period: 30d}\n\
         FivePerHour: {burst: 5, count: 5, period: 1h}\n\
         HourlyWindow: {window: calendar, count: 100, period: 1h}\n",
    )
    .unwrap();
    dir
}

fn table(dir: &Path) -> LimitTable {
    LimitTable::load_dir(dir).unwrap()
}

type Client = pb::rate_limiter_client::RateLimiterClient<tonic::transport::Channel>;

/// A Check of one item; with a request id when `id` is not empty.
async fn check(client: &mut Client, id: &str, item: pb::Item) -> Result<bool, tonic::Status> {
    let answer = client
        .check(pb::CheckRequest {
            items: vec![item],
            request_id: id.to_string(),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(answer.overall.unwrap().allowed)
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

async fn connect(addr: &str) -> Client {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    pb::rate_limiter_client::RateLimiterClient::new(channel)
}

/// #46 item 13: a Settle racing its own Check on the Redis store used to claim the record
/// before the Check was decided, refunding into an empty bucket what the Check then spent
/// (before: 199 of 200 Checks allowed on an empty bucket).
#[tokio::test]
async fn a_settle_racing_its_check_claims_nothing() {
    let redis = RedisServer::start();
    let dir = limits();
    let url = redis.url();
    let flags = [
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "2000",
    ];
    let server = serve_with(dir.path(), &flags);
    let (mut c, settler) = (connect(&server.listen).await, connect(&server.listen).await);
    let all = item("TokensPerTenant", "race", Some(10_000));
    assert!(check(&mut c, "", all).await.unwrap(), "the bucket emptied");
    let races = (0..200).map(|i| {
        let (mut c, mut settler) = (c.clone(), settler.clone());
        tokio::spawn(async move {
            let id = format!("race-{i}");
            let one = item("TokensPerTenant", "race", Some(1));
            let (checked, settled) =
                tokio::join!(check(&mut c, &id, one), settle(&mut settler, &id, &[0]));
            (checked.expect("checked"), settled.map_err(|e| e.code()))
        })
    });
    let (mut allowed, mut settled) = (0, 0);
    for race in races.collect::<Vec<_>>() {
        let (checked, answer) = race.await.unwrap();
        allowed += u32::from(checked);
        match answer {
            Ok(_) => settled += 1,
            Err(code) => assert!(
                matches!(code, Code::Unavailable | Code::NotFound),
                "{code:?}"
            ),
        }
    }
    assert_eq!((allowed, settled), (0, 0), "Checks allowed, Settles made");
}
