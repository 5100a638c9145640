//! Settlements (#35): a native `Check` with a `request_id` spends an estimate; `Settle`
//! adjusts it once to the actual costs (the difference charged into debt if need be, or
//! refunded, never fuller than full). A retry counts once, on the same replica or, with
//! the Redis store, on another. Through real gRPC clients.

use std::path::Path;

use crate::common::settle::{code, estimate, limits, settle};
use crate::common::{http_get_async, item, remaining, sample, Served};
use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use tonic::Code;

async fn served(dir: &Path, settings: Settings) -> Served {
    Served::with_settings(LimitTable::load_dir(dir).unwrap(), settings).await
}

#[tokio::test]
async fn a_settlement_charges_or_refunds_the_difference_once() {
    let dir = limits();
    let mut s = served(dir.path(), Settings::default()).await;
    let mut c = s.decisions.clone();
    let left = async |s: &mut Served| remaining(s, "TokensPerTenant", "acme").await;

    // Estimate 2 000, use 3 500: 1 500 more are charged.
    assert!(
        estimate(&mut c, "req-1", "acme", 2_000)
            .await
            .unwrap()
            .overall
            .unwrap()
            .allowed
    );
    assert_eq!(left(&mut s).await, 8_000);
    let settled = settle(&mut c, "req-1", &[3_500]).await.unwrap();
    assert!(!settled.already_settled);
    assert_eq!(settled.items[0].remaining, 6_500);
    assert_eq!(left(&mut s).await, 6_500);
    // The retry counts once; other costs for it are refused; its id cannot check again.
    let again = settle(&mut c, "req-1", &[3_500]).await.unwrap();
    assert!(again.already_settled);
    assert_eq!(again.items[0].remaining, 6_500);
    let (status, message) = code(settle(&mut c, "req-1", &[100]).await);
    assert_eq!(status, Code::FailedPrecondition, "{message}");
    let (status, message) = code(estimate(&mut c, "req-1", "acme", 1).await);
    assert_eq!(status, Code::AlreadyExists, "{message}");
    assert_eq!(
        left(&mut s).await,
        6_500,
        "nothing spent by the refused calls"
    );

    // Estimate 2 000, use 800: 1 200 come back.
    estimate(&mut c, "req-2", "acme", 2_000).await.unwrap();
    assert_eq!(
        settle(&mut c, "req-2", &[800]).await.unwrap().items[0].remaining,
        5_700
    );

    // A wrong number of costs changes nothing, and the right one still settles after it.
    estimate(&mut c, "req-3", "acme", 700).await.unwrap();
    let (status, message) = code(settle(&mut c, "req-3", &[1, 2]).await);
    assert_eq!(status, Code::InvalidArgument, "{message}");
    assert!(message.contains("the Check had 1 items"), "{message}");
    assert_eq!(left(&mut s).await, 5_000);
    // Used 20 000: far beyond what is left, into debt (at most one burst).
    let debt = settle(&mut c, "req-3", &[20_000]).await.unwrap();
    assert_eq!(debt.items[0].remaining, -10_000);
    assert!(!debt.items[0].allowed);

    // A denied Check keeps nothing; an id never used is unknown.
    let denied = estimate(&mut c, "req-4", "acme", 1).await.unwrap();
    assert!(!denied.overall.unwrap().allowed);
    for id in ["req-4", "never-used"] {
        let (status, message) = code(settle(&mut c, id, &[0]).await);
        assert_eq!(status, Code::NotFound, "{id}: {message}");
        assert!(message.contains("unknown"), "{message}");
    }

    // A refund never fills past full: estimate 9 000 of a full bucket, use 0.
    estimate(&mut c, "req-5", "other", 9_000).await.unwrap();
    let back = settle(&mut c, "req-5", &[0]).await.unwrap();
    assert_eq!(back.items[0].remaining, 10_000);

    // A kept Check lasts --settle-window (1 h by default), to the nanosecond.
    estimate(&mut c, "req-6", "other", 10).await.unwrap();
    s.clock.advance(3_600 * SECOND);
    let (status, _) = code(settle(&mut c, "req-6", &[5]).await);
    assert_eq!(status, Code::NotFound);

    let (_, metrics) = http_get_async(s.metrics_addr, "/metrics").await;
    let count = |result: &str| {
        sample(
            &metrics,
            &format!("cellrate_settlements_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!(count("settled"), Some(4.0));
    assert_eq!(count("retried"), Some(1.0));
    assert_eq!(count("conflict"), Some(1.0));
    assert_eq!(count("unknown"), Some(3.0));
    s.stop().await;
}

/// A hostile caller: request ids and kept Checks are bounded, a flood of ids pushes out
/// only the oldest records (the table stays at its size), and no settlement gets more
/// back than was spent.
#[tokio::test]
async fn hostile_settlements_are_bounded() {
    let dir = limits();
    let settings = Settings {
        settle_max_records: 5,
        ..Settings::default()
    };
    let mut s = served(dir.path(), settings).await;
    let mut c = s.decisions.clone();
    let long = "x".repeat(129);
    for id in [
        long.as_str(),
        "with space",
        "tab\there",
        "\u{1b}]52;c;aGk=\u{7}",
        "é",
    ] {
        let (status, message) = code(estimate(&mut c, id, "acme", 1).await);
        assert_eq!(status, Code::InvalidArgument, "{id:?}: {message}");
        assert!(message.contains("request_id"), "{message}");
        let (status, _) = code(settle(&mut c, id, &[1]).await);
        assert_eq!(status, Code::InvalidArgument, "{id:?}");
    }
    // A kept Check is at most 1 KiB: a large one is refused before anything is spent.
    let big: Vec<pb::Item> = (0..40)
        .map(|i| {
            item(
                "TokensPerTenant",
                &format!("tenant-with-a-long-id-{i:04}"),
                Some(1),
            )
        })
        .collect();
    let answer = c
        .check(pb::CheckRequest {
            items: big,
            request_id: "big".into(),
            ..Default::default()
        })
        .await;
    let (status, message) = code(answer);
    assert_eq!(status, Code::InvalidArgument, "{message}");
    assert!(message.contains("1024"), "{message}");
    assert_eq!(
        remaining(&mut s, "TokensPerTenant", "tenant-with-a-long-id-0000").await,
        10_000
    );
    // Costs: 1 to 64 of them.
    let (status, _) = code(settle(&mut c, "any", &[]).await);
    assert_eq!(status, Code::InvalidArgument);
    let (status, _) = code(settle(&mut c, "any", &[1; 65]).await);
    assert_eq!(status, Code::InvalidArgument);

    // A flood of ids: the table keeps the newest 5; the older ones are unknown, and their
    // estimates stand.
    for i in 0..12 {
        estimate(&mut c, &format!("flood-{i}"), "acme", 1)
            .await
            .unwrap();
    }
    for i in 0..7 {
        let (status, _) = code(settle(&mut c, &format!("flood-{i}"), &[0]).await);
        assert_eq!(status, Code::NotFound, "flood-{i} was pushed out");
    }
    for i in 7..12 {
        settle(&mut c, &format!("flood-{i}"), &[0]).await.unwrap();
    }
    // 12 spent, 5 given back.
    assert_eq!(
        remaining(&mut s, "TokensPerTenant", "acme").await,
        10_000 - 7
    );
    let (_, metrics) = http_get_async(s.metrics_addr, "/metrics").await;
    assert_eq!(
        sample(
            &metrics,
            "cellrate_settlements_total{result=\"pushed_out\"}"
        ),
        Some(7.0)
    );
    s.stop().await;
}

/// The bytes 3ebe882 kept a Check as (`Settler::open` there): a `CheckRequest` holding
/// only its items, protobuf-encoded.
fn kept_by_3ebe882(items: Vec<pb::Item>) -> Vec<u8> {
    use prost::Message;
    pb::CheckRequest {
        items,
        ..Default::default()
    }
    .encode_to_vec()
}

/// One item's facts as 3ebe882 (and this release) write them: the tokens spent, then
/// the period's code with the hold's flags (0xC0: a hold released when unsettled).
fn facts(tokens: u64, code: u8) -> Vec<u8> {
    let mut facts = tokens.to_le_bytes().to_vec();
    facts.push(code);
    facts
}

/// After an upgrade, the Checks the previous release (3ebe882) kept are read, not
/// reported unknown: one is settled (the difference refunded once, a retry counting
/// nothing), and a hold past its end is released by the sweeper. On the memory store,
/// the table filled as 3ebe882 filled it.
#[tokio::test]
async fn a_check_kept_by_the_previous_release_is_settled_and_its_hold_released() {
    use std::sync::Arc;

    use cellrate::clock::FakeClock;
    use cellrate::observe::metrics::Metrics;
    use cellrate::proto::v1::rate_limiter_server::RateLimiter;
    use cellrate::service::native::RateLimiterService;
    use cellrate::service::settle::Settler;
    use cellrate::service::{Decider, ItemSpec};
    use cellrate::store::settlements::MemorySettlements;
    use cellrate::store::shared::Settlements;
    use cellrate::store::MemoryStore;

    let dir = crate::common::reservations::limits();
    let limits = LimitTable::load_dir(dir.path()).unwrap();
    let clock = Arc::new(FakeClock::new(crate::common::T0));
    let decider = Arc::new(Decider::new(
        Arc::new(arc_swap::ArcSwap::from_pointee(limits)),
        Arc::new(MemoryStore::new(clock.clone())),
    ));
    let table = Arc::new(MemorySettlements::new(clock.clone(), 3_600 * SECOND, 100));
    let service =
        RateLimiterService::new(decider.clone(), Metrics::new()).with_settlements(table.clone());
    let left = async |name: &str| {
        let peek = decider.inspect(&[ItemSpec::named(name, "acme")]).await;
        peek.unwrap().items[0].decision.remaining
    };
    // The previous release's Checks: their estimates spent, and kept as it kept them.
    let spent = pb::CheckRequest {
        items: vec![
            item("Plain", "acme", Some(2_000)),
            item("Released", "acme", Some(2_500)),
        ],
        ..Default::default()
    };
    service.check(tonic::Request::new(spent)).await.unwrap();
    let plain = kept_by_3ebe882(vec![item("Plain", "acme", Some(2_000))]);
    assert!(table.open("old", &plain, None, &[]).await.unwrap().written);
    assert!(table.decide("old", &facts(2_000, 0)).await.unwrap());
    let held = kept_by_3ebe882(vec![item("Released", "acme", Some(2_500))]);
    let opened = table.open("old-hold", &held, Some(600 * SECOND), &[]).await;
    assert!(opened.unwrap().written);
    assert!(table.decide("old-hold", &facts(2_500, 0xC0)).await.unwrap());
    assert_eq!(
        (left("Plain").await, left("Released").await),
        (8_000, 7_500)
    );

    let settle = |costs: Vec<u64>| pb::SettleRequest {
        request_id: "old".into(),
        costs,
    };
    let settled = service.settle(tonic::Request::new(settle(vec![500]))).await;
    let settled = settled.expect("read and settled").into_inner();
    assert!(!settled.already_settled);
    assert_eq!(settled.items[0].remaining, 9_500, "1 500 refunded");
    let again = service.settle(tonic::Request::new(settle(vec![500]))).await;
    let again = again.unwrap().into_inner();
    assert!(again.already_settled);
    assert_eq!(again.items[0].remaining, 9_500, "once");
    assert_eq!(left("Plain").await, 9_500);

    // The hold past its end: released by the sweeper's call, once.
    clock.advance(601 * SECOND);
    let settler = Settler::new(table.clone(), Metrics::new());
    let released = settler.release_due(&decider).await.unwrap();
    assert_eq!((released.released, released.given_up), (1, 0));
    assert_eq!(left("Released").await, 10_000, "the estimate given back");
    let again = settler.release_due(&decider).await.unwrap();
    assert_eq!(again.released, 0);
    assert_eq!(left("Released").await, 10_000);
}
