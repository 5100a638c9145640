//! Reservations (#50): a native `Check` with a `request_id` on a limit with a
//! `reservation:` block holds its estimate until its `Settle`, at most the block's `hold`;
//! a hold never settled is then released (given back to the token) or kept, by the
//! limit's policy, once; a `Settle` after that is refused and changes nothing; one
//! estimate may take at most `max_share` of the burst; a flood of fresh ids cannot push
//! out another tenant's hold. The memory store over real gRPC, on the fake clock (the
//! sweeper runs every 20 ms of real time; the holds end on the fake clock).

use std::path::Path;
use std::time::Duration;

use crate::common::reservations::{eventually, hold, holds, limits};
use crate::common::settle::{code, settle};
use crate::common::{http_get_async, item, remaining, Served};
use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use tonic::Code;

const HOLD: i64 = 600 * SECOND;

async fn served(dir: &Path, max_records: usize) -> Served {
    let settings = Settings {
        sweep_interval: Duration::from_millis(20),
        settle_max_records: max_records,
        ..Settings::default()
    };
    Served::with_settings(LimitTable::load_dir(dir).unwrap(), settings).await
}

async fn metrics(s: &Served) -> String {
    http_get_async(s.metrics_addr, "/metrics").await.1
}

/// Waits for the sweeper to have released (or kept) `n` holds in all.
async fn swept(s: &Served, n: f64) {
    eventually("the due holds swept", async || {
        let page = metrics(s).await;
        (holds(&page, "released") + holds(&page, "kept") >= n).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_hold_settles_exactly_before_its_end_and_is_released_once_after_it() {
    let dir = limits();
    let mut s = served(dir.path(), 100).await;
    let mut c = s.decisions.clone();

    // Settled before the hold ends (to the nanosecond): exact, and never released after.
    assert!(hold(&mut s, "r-1", "Released", "acme", 2_000)
        .await
        .unwrap());
    s.clock.advance(HOLD - 1);
    let settled = settle(&mut c, "r-1", &[1_500]).await.unwrap();
    assert_eq!(settled.items[0].remaining, 8_500);

    // Not settled: at the hold's end it is given back, to the token.
    assert!(hold(&mut s, "r-2", "Released", "acme", 2_000)
        .await
        .unwrap());
    assert_eq!(remaining(&mut s, "Released", "acme").await, 6_500);
    s.clock.advance(HOLD);
    swept(&s, 1.0).await;
    assert_eq!(remaining(&mut s, "Released", "acme").await, 8_500);

    // A Settle after the release is refused and gives nothing back; nor does a replay of
    // the settled one; more sweeps release nothing more.
    let late = settle(&mut c, "r-2", &[0]).await;
    let left = remaining(&mut s, "Released", "acme").await;
    assert_eq!(
        left, 8_500,
        "given back once, whatever the late Settle ({late:?}) said"
    );
    let (status, message) = code(late);
    assert_eq!(status, Code::FailedPrecondition, "{message}");
    assert!(message.contains("expired"), "{message}");
    let again = settle(&mut c, "r-1", &[1_500]).await.unwrap();
    assert!(again.already_settled);
    s.clock.advance(HOLD);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(remaining(&mut s, "Released", "acme").await, 8_500);

    let page = metrics(&s).await;
    assert_eq!(holds(&page, "settled"), 1.0);
    assert_eq!(holds(&page, "released"), 1.0);
    assert_eq!(holds(&page, "kept"), 0.0);
    let expired = crate::common::sample(&page, "cellrate_settlements_total{result=\"expired\"}");
    assert_eq!(expired, Some(1.0));
    s.stop().await;
}

#[tokio::test]
async fn an_unsettled_hold_of_a_keep_limit_stands_and_a_plain_limit_keeps_todays_window() {
    let dir = limits();
    let mut s = served(dir.path(), 100).await;
    let mut c = s.decisions.clone();
    assert!(hold(&mut s, "k-1", "Kept", "acme", 2_000).await.unwrap());
    assert!(hold(&mut s, "p-1", "Plain", "acme", 2_000).await.unwrap());
    s.clock.advance(HOLD);
    swept(&s, 1.0).await;
    assert_eq!(holds(&metrics(&s).await, "kept"), 1.0);
    assert_eq!(remaining(&mut s, "Kept", "acme").await, 8_000, "it stands");
    let (status, message) = code(settle(&mut c, "k-1", &[0]).await);
    assert_eq!(status, Code::FailedPrecondition, "{message}");
    assert_eq!(remaining(&mut s, "Kept", "acme").await, 8_000);
    // No block: settled within --settle-window (1 h), as before reservations.
    let settled = settle(&mut c, "p-1", &[500]).await.unwrap();
    assert_eq!(settled.items[0].remaining, 9_500);
    s.stop().await;
}

/// A record whose items have different policies is due at the earliest hold, and then
/// each item follows its own policy.
#[tokio::test]
async fn a_mixed_record_releases_per_item() {
    let dir = limits();
    let mut s = served(dir.path(), 100).await;
    let answer = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![
                item("Released", "acme", Some(1_000)),
                item("Kept", "acme", Some(1_000)),
                item("Plain", "acme", Some(1_000)),
            ],
            request_id: "mixed".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(answer.into_inner().overall.unwrap().allowed);
    s.clock.advance(HOLD);
    swept(&s, 1.0).await;
    assert_eq!(remaining(&mut s, "Released", "acme").await, 10_000);
    assert_eq!(remaining(&mut s, "Kept", "acme").await, 9_000);
    assert_eq!(remaining(&mut s, "Plain", "acme").await, 9_000);
    s.stop().await;
}

/// The attacker asks for one hold of the whole shared budget: refused, nothing spent,
/// and everyone else still gets theirs.
#[tokio::test]
async fn an_estimate_over_max_share_is_refused_and_spends_nothing() {
    let dir = limits();
    let mut s = served(dir.path(), 100).await;
    let huge = hold(&mut s, "huge", "Released", "shared", 10_000).await;
    let after_huge = remaining(&mut s, "Released", "shared").await;
    let fair = hold(&mut s, "fair", "Released", "shared", 2_500).await;
    let victim = hold(&mut s, "victim", "Released", "shared", 2_000).await;
    assert!(
        matches!((&fair, &victim), (Ok(true), Ok(true))),
        "the attacker's hold ({huge:?}) left {after_huge}: fair {fair:?}, victim {victim:?}"
    );
    assert_eq!(after_huge, 10_000, "nothing spent by the refused hold");
    let (status, message) = code(huge);
    assert_eq!(status, Code::InvalidArgument, "{message}");
    for part in ["items[0]", "Released", "10000", "2500", "max_share 0.25"] {
        assert!(message.contains(part), "{part}: {message}");
    }
    s.stop().await;
}

/// The attacker floods Checks with fresh request ids (each allowed, on its own key): once
/// the table is full of live holds, its new ones are refused, and the victim's hold is
/// still there to settle, exactly.
#[tokio::test]
async fn a_flood_of_fresh_ids_cannot_push_out_another_tenants_hold() {
    let dir = limits();
    let mut s = served(dir.path(), 5).await;
    let mut c = s.decisions.clone();
    assert!(hold(&mut s, "victim", "Released", "victim", 2_000)
        .await
        .unwrap());
    let mut refused = 0;
    for i in 0..20 {
        match hold(&mut s, &format!("flood-{i}"), "Released", "attacker", 1).await {
            Ok(allowed) => assert!(allowed),
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
                assert!(e.message().contains("full of holds"), "{}", e.message());
                refused += 1;
            }
        }
    }
    let settled = settle(&mut c, "victim", &[500]).await;
    let left = remaining(&mut s, "Released", "victim").await;
    let settled = settled
        .unwrap_or_else(|e| panic!("the victim's hold is gone ({e:?}): its balance stays {left}"));
    assert_eq!(settled.items[0].remaining, 9_500);
    assert_eq!(left, 9_500);
    assert_eq!(refused, 16, "4 kept beside the victim's");
    assert_eq!(remaining(&mut s, "Released", "attacker").await, 9_996);
    let full = crate::common::sample(
        &metrics(&s).await,
        "cellrate_settlements_total{result=\"full\"}",
    );
    assert_eq!(full, Some(16.0));
    s.stop().await;
}

/// Config errors name the file, the limit and the field; the previous config stays.
#[test]
fn a_bad_reservation_block_is_a_config_error_naming_the_field() {
    let names = "Budget: {number: 100, format: string}\n";
    for (block, field) in [
        ("{hold: 0s}", "reservation.hold"),
        ("{hold: 8d}", "reservation.hold"),
        ("{hold: soon}", "reservation.hold"),
        ("{hold: 1m, max_share: 0}", "reservation.max_share"),
        ("{hold: 1m, max_share: 1.5}", "reservation.max_share"),
        ("{hold: 1m, unsettled: drop}", "unsettled"),
        ("{hold: 1m, share: 0.5}", "share"),
    ] {
        let defaults =
            format!("Budget: {{burst: 10, count: 10, period: 1m, reservation: {block}}}\n");
        let files = [
            ("names.yaml".to_string(), names.to_string()),
            ("defaults.yaml".to_string(), defaults),
        ];
        let error = LimitTable::from_files(&files).unwrap_err().to_string();
        for part in ["defaults.yaml", "Budget", field] {
            assert!(error.contains(part), "{block}: {part}: {error}");
        }
    }
    // Not on a concurrency limit, nor on an override.
    let files = [
        ("names.yaml".to_string(), names.to_string()),
        (
            "defaults.yaml".to_string(),
            "Budget: {count: 10, period: 1m, window: concurrency, reservation: {hold: 1m}}\n"
                .to_string(),
        ),
    ];
    let error = LimitTable::from_files(&files).unwrap_err().to_string();
    assert!(error.contains("concurrency"), "{error}");
    let files = [
        ("names.yaml".to_string(), names.to_string()),
        (
            "defaults.yaml".to_string(),
            "Budget: {burst: 10, count: 10, period: 1m}\n".to_string(),
        ),
        (
            "overrides.yaml".to_string(),
            "- Budget: {burst: 20, count: 20, period: 1m, ids: [a], reservation: {hold: 1m}}\n"
                .to_string(),
        ),
    ];
    let error = LimitTable::from_files(&files).unwrap_err().to_string();
    assert!(
        error.contains("overrides.yaml") && error.contains("reservation is the limit's own"),
        "{error}"
    );
}

/// A calendar budget: a hold released in the window it was spent in comes back; one whose
/// window has ended gives nothing to the next (as a `Settle` at cost 0 would).
#[tokio::test]
async fn a_released_hold_goes_back_only_to_the_calendar_window_it_was_spent_in() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("names.yaml"),
        "Daily: {number: 100, format: string}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "Daily: {window: calendar, count: 10000, period: 1d, reservation: {hold: 1h}}\n",
    )
    .unwrap();
    let mut s = served(dir.path(), 100).await;
    // The fake clock starts at 22:13:20 UTC: the day ends 6 400 s later.
    assert!(hold(&mut s, "in-day", "Daily", "acme", 2_000)
        .await
        .unwrap());
    s.clock.advance(3_600 * SECOND);
    swept(&s, 1.0).await;
    assert_eq!(remaining(&mut s, "Daily", "acme").await, 10_000);

    assert!(hold(&mut s, "across", "Daily", "acme", 2_000)
        .await
        .unwrap());
    s.clock.advance(2_900 * SECOND);
    // The next day: full again; 1 000 spent in it before the hold ends.
    assert_eq!(remaining(&mut s, "Daily", "acme").await, 10_000);
    let spent = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![item("Daily", "acme", Some(1_000))],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(spent.into_inner().overall.unwrap().allowed);
    s.clock.advance(700 * SECOND);
    swept(&s, 2.0).await;
    assert_eq!(remaining(&mut s, "Daily", "acme").await, 9_000);
    s.stop().await;
}
