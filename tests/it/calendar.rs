//! Calendar windows (#35): a limit declared `window: calendar` allows `count` per UTC
//! window (1s, 1m, 1h, 1d, 1mo, 1y) and everything again when the next window starts. The
//! native API, Envoy's `ShouldRateLimit`, refunds, temporary overrides and reloads all know
//! the kind. Through real gRPC clients, on a fake clock that starts at 2023-11-14T22:13:20Z
//! (the hour ends 2 800 s later, the month on 2023-12-01).

use std::path::Path;
use std::time::Duration;

use crate::common::{check, descriptor, item, nanos, poll_until, remaining, Served};
use cellrate::clock::{Clock, SECOND};
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// Seconds from the fake clock's start to the end of its UTC hour.
const TO_HOUR_END: i64 = 2_800;

const NAMES: &str = "CallsPerTenant: {number: 100, format: string}\n";
const HOURLY: &str = "CallsPerTenant: {window: calendar, count: 3, period: 1h}\n";
const GCRA: &str = "CallsPerTenant: {burst: 3, count: 3, period: 1h}\n";
const DESCRIPTORS: &str =
    "api:\n  - match: [{key: tenant}]\n    limits: [CallsPerTenant]\n    id: \"{tenant}\"\n";

/// The calendar limits directory with `defaults`.
fn calendar_limits(defaults: &str) -> tempfile::TempDir {
    crate::common::directory(&[
        ("names.yaml", NAMES),
        ("defaults.yaml", defaults),
        ("descriptors.yaml", DESCRIPTORS),
    ])
}

async fn served(dir: &Path) -> Served {
    Served::with_limits(LimitTable::load_dir(dir).unwrap()).await
}

async fn spend(s: &mut Served, id: &str) -> pb::Decision {
    let r = check(s, vec![item("CallsPerTenant", id, None)])
        .await
        .expect("decided");
    r.items[0].clone()
}

fn secs(seconds: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos: 0 })
}

#[tokio::test]
async fn a_calendar_quota_counts_per_utc_hour_natively_and_through_envoy() {
    let dir = calendar_limits(HOURLY);
    let mut s = served(dir.path()).await;
    for left in [2, 1, 0] {
        let d = spend(&mut s, "acme").await;
        assert!(d.allowed);
        assert_eq!(d.remaining, left);
        // Everything is back when the hour ends, however much was spent.
        assert_eq!(nanos(&d.reset_after), TO_HOUR_END * SECOND);
        let limit = d.limit.unwrap();
        assert_eq!(
            (limit.calendar.as_deref(), limit.count, limit.burst),
            (Some("1h"), 3, 3)
        );
        assert_eq!(limit.key, "100@1h:acme");
    }
    let denied = spend(&mut s, "acme").await;
    assert!(!denied.allowed);
    assert_eq!(nanos(&denied.retry_after), TO_HOUR_END * SECOND);
    // Another tenant has its own window.
    assert_eq!(spend(&mut s, "other").await.remaining, 2);

    // Envoy sees the same bucket: over the limit, 3 per HOUR exactly, reset at the hour.
    let answer = s
        .envoy
        .should_rate_limit(RateLimitRequest {
            domain: "api".to_string(),
            descriptors: vec![descriptor(&[("tenant", "acme")])],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
    let status = &answer.statuses[0];
    let current = status.current_limit.as_ref().unwrap();
    assert_eq!(
        (current.requests_per_unit, current.unit),
        (3, Unit::Hour as i32)
    );
    assert_eq!(status.duration_until_reset.unwrap().seconds, TO_HOUR_END);

    // One nanosecond before the hour: still denied. At the hour: all three are back.
    s.clock.advance(TO_HOUR_END * SECOND - 1);
    assert!(!spend(&mut s, "acme").await.allowed);
    s.clock.advance(1);
    let d = spend(&mut s, "acme").await;
    assert_eq!((d.allowed, d.remaining), (true, 2));
    assert_eq!(nanos(&d.reset_after), 3_600 * SECOND);

    // A refund gives back to the current window.
    let refunded = s
        .decisions
        .refund(pb::RefundRequest {
            items: vec![item("CallsPerTenant", "acme", None)],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(refunded.items[0].allowed);
    assert_eq!(remaining(&mut s, "CallsPerTenant", "acme").await, 3);
    // An admin reset finds the calendar bucket too.
    spend(&mut s, "acme").await;
    let reset = s
        .admin
        .reset(pb::ResetRequest {
            items: vec![item("CallsPerTenant", "acme", None)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reset.deleted, 1);
    assert_eq!(remaining(&mut s, "CallsPerTenant", "acme").await, 3);
    s.stop().await;
}

/// A reload that changes a limit's kind starts a fresh bucket of the new kind (the stored
/// values mean different things); going back finds the old kind's bucket as it was.
#[tokio::test]
async fn a_reload_that_changes_the_kind_starts_a_fresh_bucket() {
    let dir = calendar_limits(GCRA);
    let settings = crate::common::watching(dir.path(), Duration::from_millis(50));
    let table = LimitTable::load_dir(dir.path()).unwrap();
    let mut s = Served::full(table, settings, None).await;
    for _ in 0..3 {
        assert!(spend(&mut s, "acme").await.allowed);
    }
    assert_eq!(remaining(&mut s, "CallsPerTenant", "acme").await, 0);
    let kind = async |s: &mut Served| {
        let r = s
            .admin
            .inspect(pb::InspectRequest {
                items: vec![item("CallsPerTenant", "acme", None)],
            })
            .await
            .unwrap()
            .into_inner();
        r.items[0]
            .limit
            .as_ref()
            .unwrap()
            .calendar
            .clone()
            .unwrap_or_default()
    };

    std::fs::write(dir.path().join("defaults.yaml"), HOURLY).unwrap();
    let now = poll_until(
        Duration::from_secs(5),
        async || kind(&mut s).await,
        |k| k == "1h",
    )
    .await;
    assert_eq!(now, "1h", "the calendar limit was not loaded");
    assert_eq!(remaining(&mut s, "CallsPerTenant", "acme").await, 3);
    assert!(spend(&mut s, "acme").await.allowed);
    assert_eq!(remaining(&mut s, "CallsPerTenant", "acme").await, 2);

    std::fs::write(dir.path().join("defaults.yaml"), GCRA).unwrap();
    let now = poll_until(
        Duration::from_secs(5),
        async || kind(&mut s).await,
        String::is_empty,
    )
    .await;
    assert_eq!(now, "", "the GCRA limit was not loaded back");
    assert_eq!(remaining(&mut s, "CallsPerTenant", "acme").await, 0);
    s.stop().await;
}

#[tokio::test]
async fn temporary_overrides_of_a_calendar_limit_say_so_and_keep_the_window() {
    let dir = calendar_limits(HOURLY);
    let mut s = served(dir.path()).await;
    assert!(spend(&mut s, "acme").await.allowed);
    let set = |calendar: &str, burst, count, period| pb::SetOverrideRequest {
        name: "CallsPerTenant".into(),
        id: "acme".into(),
        burst,
        count,
        period,
        calendar: calendar.into(),
        ttl: secs(600),
        ..Default::default()
    };
    // Raised to 10 an hour: the hour's one spend still counts.
    let entry = s
        .admin
        .set_override(set("1h", 0, 10, None))
        .await
        .expect("a calendar override of a calendar limit")
        .into_inner()
        .entry
        .unwrap();
    assert_eq!((entry.calendar.as_deref(), entry.count), (Some("1h"), 10));
    assert_eq!(remaining(&mut s, "CallsPerTenant", "acme").await, 9);
    let listed = s
        .admin
        .list_overrides(pb::ListOverridesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries[0].calendar.as_deref(), Some("1h"));

    // What cannot apply is refused, and the override in force stays.
    for (request, says) in [
        (set("", 5, 5, secs(3_600)), "counts in calendar windows"),
        (set("2w", 0, 5, None), "no calendar period"),
        (
            set(&format!("1mo@{}", "x".repeat(10_000)), 0, 5, None),
            "no IANA time zone",
        ),
        (set("1h", 7, 5, None), "burst 7"),
        (set("1h", 0, 5, secs(60)), "give exactly one of"),
        (set("1h", 0, 0, None), "count"),
        (set(&"1h".repeat(10_000), 0, 5, None), "no calendar period"),
    ] {
        let e = s.admin.set_override(request).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(says), "{says}: {}", e.message());
        assert!(
            e.message().len() < 300,
            "a bounded message: {}",
            e.message().len()
        );
    }
    assert_eq!(remaining(&mut s, "CallsPerTenant", "acme").await, 9);
    s.stop().await;
}

/// The native API's inline limits take a calendar window too. A hostile caller cannot
/// reach another bucket with one (the window is part of its key), nor get past the bounds.
#[tokio::test]
async fn inline_calendar_limits_are_bounded_and_kept_apart() {
    let mut s = Served::start(None).await;
    let inline = |burst, count, period, calendar: &str| pb::Item {
        inline: Some(pb::InlineLimit {
            key: "shared".into(),
            burst,
            count,
            period,
            calendar: calendar.into(),
        }),
        ..Default::default()
    };
    let d = check(&mut s, vec![inline(0, 2, None, "1mo")])
        .await
        .unwrap()
        .items[0]
        .clone();
    assert_eq!(d.remaining, 1);
    let limit = d.limit.unwrap();
    assert_eq!(limit.key, "0:i/2/1mo/shared");
    // 2023-12-01 is 16 days, 1 h 46 min 40 s away.
    assert_eq!(nanos(&d.reset_after), (16 * 86_400 + 6_400) * SECOND);
    // A GCRA limit with the same numbers (2 per 31 days) is another bucket.
    let gcra = inline(2, 2, secs(31 * 86_400), "");
    assert_eq!(
        check(&mut s, vec![gcra]).await.unwrap().items[0].remaining,
        1
    );
    // So is a daily window.
    assert_eq!(
        check(&mut s, vec![inline(0, 2, None, "1d")])
            .await
            .unwrap()
            .items[0]
            .remaining,
        1
    );

    for (item, says) in [
        (inline(0, 2, secs(1), "1mo"), "takes no period"),
        (
            inline(3, 2, None, "1mo"),
            "3 is not the calendar window's count 2",
        ),
        (inline(0, 2, None, "monthly"), "no calendar period"),
        (inline(0, 2, None, "1mo\u{1b}[2J"), "no calendar period"),
        (inline(0, 1 << 53, None, "1y"), "too large"),
        (inline(0, 0, None, "1y"), "count"),
    ] {
        let e = check(&mut s, vec![item]).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{says}: {e:?}");
        assert!(e.message().contains("items[0].inline"), "{}", e.message());
        assert!(e.message().contains(says), "{says}: {}", e.message());
        assert!(
            !e.message().contains('\u{1b}'),
            "no control characters echoed"
        );
    }
    // Nothing changed: one is left, so a check-only answer allows one more and says what
    // would then be left.
    let peek = pb::Item {
        mode: pb::Mode::CheckOnly as i32,
        ..inline(0, 2, None, "1mo")
    };
    let d = check(&mut s, vec![peek]).await.unwrap().items[0].clone();
    assert_eq!((d.allowed, d.remaining), (true, 0));
    let two = pb::Item {
        mode: pb::Mode::CheckOnly as i32,
        cost: Some(2),
        ..inline(0, 2, None, "1mo")
    };
    assert!(!check(&mut s, vec![two]).await.unwrap().items[0].allowed);
    s.stop().await;
}

/// #51: a calendar window in a time zone and from an anchor day, configured and inline.
/// Answers point at the local window's end (the fake clock's 2023-11-14T22:13:20Z is 17:13
/// in New York, whose billing month from the 15th ends 6 h 46 min 40 s later, at 05:00Z),
/// Envoy hears its unit, and bucket keys keep zones and anchors apart.
#[tokio::test]
async fn zoned_windows_answer_with_the_local_window_end() {
    const TO_NY_15TH: i64 = 24_400;
    let dir = calendar_limits(
        "CallsPerTenant: {window: calendar, count: 3, period: 1mo, timezone: America/New_York, \
         anchor: 15}\n",
    );
    let mut s = served(dir.path()).await;
    let d = spend(&mut s, "acme").await;
    assert_eq!((d.allowed, d.remaining), (true, 2));
    assert_eq!(nanos(&d.reset_after), TO_NY_15TH * SECOND);
    let limit = d.limit.unwrap();
    assert_eq!(limit.calendar.as_deref(), Some("1mo~15@America/New_York"));
    assert_eq!(limit.key, "100@1mo~15@America/New_York:acme");
    let answer = s
        .envoy
        .should_rate_limit(RateLimitRequest {
            domain: "api".to_string(),
            descriptors: vec![descriptor(&[("tenant", "acme")])],
            hits_addend: 2,
        })
        .await
        .unwrap()
        .into_inner();
    let status = &answer.statuses[0];
    let current = status.current_limit.as_ref().unwrap();
    assert_eq!(
        (current.requests_per_unit, current.unit),
        (3, Unit::Month as i32)
    );
    assert_eq!(status.duration_until_reset.unwrap().seconds, TO_NY_15TH);
    let denied = spend(&mut s, "acme").await;
    assert_eq!(nanos(&denied.retry_after), TO_NY_15TH * SECOND);
    // At New York's midnight on the 15th, all three are back until December 15th, 05:00Z.
    s.clock.advance(TO_NY_15TH * SECOND);
    let d = spend(&mut s, "acme").await;
    assert_eq!((d.allowed, d.remaining), (true, 2));
    assert_eq!(nanos(&d.reset_after), 30 * 86_400 * SECOND);

    // Inline: a month in Tokyo (Dec 1 00:00 JST is Nov 30 15:00Z) is not the UTC month.
    let inline = |calendar: &str| pb::Item {
        inline: Some(pb::InlineLimit {
            key: "shared".into(),
            count: 2,
            calendar: calendar.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let tokyo = check(&mut s, vec![inline("1mo@asia/tokyo")])
        .await
        .unwrap()
        .items[0]
        .clone();
    assert_eq!(tokyo.limit.unwrap().key, "0:i/2/1mo@Asia/Tokyo/shared");
    let now = s.clock.now() / SECOND;
    assert_eq!(nanos(&tokyo.reset_after), (1_701_356_400 - now) * SECOND);
    let utc = check(&mut s, vec![inline("1mo")]).await.unwrap().items[0].clone();
    assert_eq!(utc.remaining, 1, "another bucket");
    for (calendar, says) in [
        ("1mo@Europe/Nowhere", "no IANA time zone"),
        ("1h@Europe/Berlin", "a time zone or anchor applies to a day"),
        ("1mo~40", "anchor 40"),
    ] {
        let e = check(&mut s, vec![inline(calendar)]).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{calendar}: {e:?}");
        assert!(e.message().contains("items[0].inline"), "{}", e.message());
        assert!(e.message().contains(says), "{says}: {}", e.message());
    }
    s.stop().await;
}
