//! The sweeper of held reservations (#58 item 6) on the memory store: holds whose limit a
//! reload removed can never be released; they must not be retried over and over in
//! every sweep, flood the log, or keep other tenants' holds from being given back. The
//! memory store over real gRPC, on the fake clock (the sweeper runs every 20 ms of real
//! time; the holds end on the fake clock). Redis: `tests/full/release_sweep_redis.rs`.

use std::time::Duration;

use crate::common::release_sweep::{limits, remove_gone, Captured};
use crate::common::reservations::{eventually, hold, holds};
use crate::common::{http_get_async, remaining, watching, Served};
use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;

const HOLD: i64 = 600 * SECOND;

/// More than one table call's worth (256) of holds on the limit a reload removes.
const ORPHANS: usize = 300;

async fn metrics(s: &Served) -> String {
    http_get_async(s.metrics_addr, "/metrics").await.1
}

/// Whether the reload that removed `Gone` is in force (an `Inspect` of it is refused).
async fn gone(s: &mut Served) -> Option<()> {
    let inspect = pb::InspectRequest {
        items: vec![crate::common::item("Gone", "attacker", None)],
    };
    s.admin.inspect(inspect).await.is_err().then_some(())
}

/// Before: each of the 300 orphaned holds failed, was reopened with its due already past
/// and claimed again, 64 table calls of 256 in every sweep: the victim's hold, due a
/// second later, was never released (its balance stayed 8 000) and every sweep logged
/// 16 384 WARN lines. Now each orphan is given up once (counted, one line), and the
/// victim's hold is released at the first sweep after its end.
#[tokio::test]
async fn holds_of_a_removed_limit_are_given_up_once_and_starve_no_other_hold() {
    let log = Captured::warnings();
    let dir = limits();
    let settings = Settings {
        sweep_interval: Duration::from_millis(20),
        ..watching(dir.path(), Duration::from_millis(50))
    };
    let mut s = Served::with_settings(LimitTable::load_dir(dir.path()).unwrap(), settings).await;
    for i in 0..ORPHANS {
        let id = format!("orphan-{i}");
        assert!(hold(&mut s, &id, "Gone", "attacker", 1).await.unwrap());
    }
    s.clock.advance(SECOND);
    assert!(hold(&mut s, "victim", "Released", "victim", 2_000)
        .await
        .unwrap());
    remove_gone(dir.path());
    eventually("the reload without Gone", async || gone(&mut s).await).await;

    s.clock.advance(HOLD);
    let mut left = 0;
    for _ in 0..100 {
        left = remaining(&mut s, "Released", "victim").await;
        if left == 10_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines = log.lines_with("hold");
    assert_eq!(
        left,
        10_000,
        "the victim's hold not released after 100 polls; {} WARN lines about holds, the \
         first: {:?}",
        lines.len(),
        lines.first()
    );
    let given_up = eventually("the orphans given up", async || {
        let n = holds(&metrics(&s).await, "given_up");
        (n >= ORPHANS as f64).then_some(n)
    })
    .await;
    // About ten more sweeps: nothing is claimed again, nothing more is logged.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let page = metrics(&s).await;
    assert_eq!(given_up, ORPHANS as f64);
    assert_eq!(
        holds(&page, "given_up"),
        ORPHANS as f64,
        "given up once each"
    );
    assert_eq!(holds(&page, "released"), 1.0);
    let lines = log.lines_with("hold");
    assert!(
        lines.len() <= 2,
        "{} WARN lines about holds, the first: {:?}",
        lines.len(),
        lines.first()
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("given up") && l.contains("300")),
        "{lines:?}"
    );
    s.stop().await;
}
