//! A share per tenant of the table of kept `Check`s (issue #58, defect 2): a `Check` whose
//! items hold no token (cost 0, `MODE_CHECK_ONLY`) is no hold, and each bucket key has at
//! most `--settle-max-holds-per-key` live holds, so that one tenant cannot fill the table
//! and have every other tenant's reserving `Check` refused. The memory store over real
//! gRPC, on the fake clock; Redis and Redis Cluster: `tests/full/reservations_redis.rs`; through
//! Envoy's RLS: `tests/it/envoy_reservations.rs`.

use std::path::Path;
use std::time::Duration;

use crate::common::reservations::{eventually, hold, holds, limits};
use crate::common::settle::{code, settle};
use crate::common::{http_get_async, item, remaining, sample, Served};
use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use tonic::Code;

async fn served(dir: &Path, settings: Settings) -> Served {
    let settings = Settings {
        sweep_interval: Duration::from_millis(20),
        ..settings
    };
    Served::with_settings(LimitTable::load_dir(dir).unwrap(), settings).await
}

async fn metric(s: &Served, series: &str) -> f64 {
    sample(&http_get_async(s.metrics_addr, "/metrics").await.1, series).unwrap_or(0.0)
}

/// A `Check` under `request_id` of `items`: whether it was allowed.
async fn check(
    s: &mut Served,
    request_id: &str,
    items: Vec<pb::Item>,
) -> Result<bool, tonic::Status> {
    let answer = (s.decisions)
        .check(pb::CheckRequest {
            items,
            request_id: request_id.to_string(),
            ..Default::default()
        })
        .await?;
    Ok(answer.into_inner().overall.unwrap().allowed)
}

/// The attacker's free holds (cost 0, and check-only) spend nothing and hold nothing: they
/// are kept as a `Check` on a limit with no reservation is (pushed out of a full table),
/// never as live holds, so the victim's hold is still taken; a free one still kept settles
/// as documented (a cost above 0 is charged in full). On 3ebe882 the sixth free hold was
/// RESOURCE_EXHAUSTED ("full of holds"), and so was the victim's.
#[tokio::test]
async fn free_holds_are_no_holds_and_cannot_fill_the_table() {
    let dir = limits();
    let settings = Settings {
        settle_max_records: 5,
        ..Settings::default()
    };
    let mut s = served(dir.path(), settings).await;
    let mut answers = Vec::new();
    for i in 0..20 {
        let mut free = item("Released", "attacker", Some(0));
        if i % 2 == 1 {
            free.cost = Some(1);
            free.mode = pb::Mode::CheckOnly as i32;
        }
        answers.push(check(&mut s, &format!("free-{i}"), vec![free]).await);
    }
    let victim = hold(&mut s, "victim", "Released", "victim", 2_000).await;
    let victim = victim.unwrap_or_else(|e| panic!("the victim's hold refused: {e:?}"));
    assert!(victim);
    for (i, answer) in answers.into_iter().enumerate() {
        assert!(
            answer.unwrap_or_else(|e| panic!("free-{i}: {e:?}")),
            "free-{i}"
        );
    }
    assert_eq!(remaining(&mut s, "Released", "attacker").await, 10_000);
    assert_eq!(
        metric(&s, "cellrate_settlements_total{result=\"full\"}").await,
        0.0
    );

    // The newest free one is still kept: a Settle charges what it cost; the oldest ones
    // were pushed out (their Settle is NOT_FOUND).
    let mut c = s.decisions.clone();
    let settled = settle(&mut c, "free-18", &[7]).await.unwrap();
    assert_eq!(settled.items[0].remaining, 9_993);
    assert_eq!(code(settle(&mut c, "free-0", &[7]).await).0, Code::NotFound);
    let settled = settle(&mut c, "victim", &[500]).await.unwrap();
    assert_eq!(settled.items[0].remaining, 9_500);
    s.stop().await;
}

/// The attacker holds a token at a time under fresh request ids on its one key: it gets
/// its share (the default 1 000), then RESOURCE_EXHAUSTED naming its item and the flag,
/// spending nothing; the table (1 100 records) still takes the victim's hold. On 3ebe882
/// all 1 100 of the attacker's holds were taken and the victim's was RESOURCE_EXHAUSTED.
#[tokio::test]
async fn one_tenant_gets_its_share_of_holds_and_no_more() {
    let dir = limits();
    let settings = Settings {
        settle_max_records: 1_100,
        ..Settings::default()
    };
    let mut s = served(dir.path(), settings).await;
    let (mut taken, mut crowded) = (0, 0);
    for i in 0..1_100 {
        match hold(&mut s, &format!("flood-{i}"), "Released", "attacker", 1).await {
            Ok(allowed) => {
                assert!(allowed);
                taken += 1;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
                let message = e.message();
                for part in ["items[0] (Released attacker)", "--settle-max-holds-per-key"] {
                    assert!(message.contains(part), "{part}: {message}");
                }
                crowded += 1;
            }
        }
    }
    let victim = hold(&mut s, "victim", "Released", "victim", 2_000).await;
    let victim = victim.unwrap_or_else(|e| panic!("the victim's hold refused: {e:?}"));
    assert!(victim);
    assert_eq!((taken, crowded), (1_000, 100));
    assert_eq!(remaining(&mut s, "Released", "attacker").await, 9_000);
    let series = "cellrate_settlements_total{result=\"crowded\"}";
    assert_eq!(metric(&s, series).await, 100.0);

    // A settled hold leaves the share: one more is taken, then the share is full again.
    let mut c = s.decisions.clone();
    settle(&mut c, "flood-0", &[1]).await.unwrap();
    assert!(hold(&mut s, "more-1", "Released", "attacker", 1)
        .await
        .unwrap());
    let e = hold(&mut s, "more-2", "Released", "attacker", 1).await;
    assert_eq!(code(e).0, Code::ResourceExhausted);
    s.stop().await;
}

/// The share counts exactly as holds open and close: a settled hold and a denied `Check`
/// leave it at once, a hold released (or kept) at its end leaves it, a `Check` of two held
/// keys counts against both and is refused when either is full; a free `Check` is never
/// refused for a full share.
#[tokio::test]
async fn a_keys_share_is_freed_when_its_holds_settle_fail_or_end() {
    let dir = limits();
    let settings = Settings {
        settle_max_holds_per_key: 2,
        ..Settings::default()
    };
    let mut s = served(dir.path(), settings).await;
    let both = |cost| {
        vec![
            item("Released", "t", Some(cost)),
            item("Kept", "t", Some(cost)),
        ]
    };
    let refused = |answer| {
        let (c, message) = code(answer);
        assert_eq!(c, Code::ResourceExhausted, "{message}");
        message
    };
    assert!(check(&mut s, "both-1", both(10)).await.unwrap());
    assert!(hold(&mut s, "r-2", "Released", "t", 2_500).await.unwrap());
    refused(hold(&mut s, "r-3", "Released", "t", 1).await);
    assert!(hold(&mut s, "free", "Released", "t", 0).await.unwrap());
    // The Kept key has one hold: one more fits there, alone, then neither takes both.
    assert!(hold(&mut s, "k-2", "Kept", "t", 10).await.unwrap());
    let message = refused(check(&mut s, "both-2", both(10)).await);
    assert!(message.contains("items[0] (Released t)"), "{message}");

    // Settled: it leaves the share. Denied (the budget spent plainly below the
    // estimate): it is dropped, and leaves it too.
    let mut c = s.decisions.clone();
    settle(&mut c, "r-2", &[2_500]).await.unwrap();
    assert!(hold(&mut s, "", "Released", "t", 2_500).await.unwrap());
    assert!(hold(&mut s, "", "Released", "t", 2_500).await.unwrap());
    assert!(!hold(&mut s, "denied", "Released", "t", 2_500)
        .await
        .unwrap());
    assert!(hold(&mut s, "r-4", "Released", "t", 1).await.unwrap());
    refused(hold(&mut s, "r-5", "Released", "t", 1).await);

    // At the hold's end each is released or kept: the shares are empty again.
    s.clock.advance(600 * SECOND);
    eventually("the due holds swept", async || {
        let page = http_get_async(s.metrics_addr, "/metrics").await.1;
        (holds(&page, "released") + holds(&page, "kept") >= 3.0).then_some(())
    })
    .await;
    assert!(check(&mut s, "both-3", both(10)).await.unwrap());
    assert!(check(&mut s, "both-4", both(10)).await.unwrap());
    refused(hold(&mut s, "k-5", "Kept", "t", 1).await);
    s.stop().await;
}
