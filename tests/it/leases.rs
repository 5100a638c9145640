//! Concurrency limits (docs/concurrency.md): leases acquired and released by id through the
//! native API, over a real gRPC client and loopback socket, on the served fake clock.

use std::sync::Arc;

use crate::common::{check, item, nanos, remaining, Served};
use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use cellrate::store::MemoryStore;

const HOLD: i64 = 30 * SECOND;

/// InFlight: 3 leases a tenant, held at most 30 s; Requests: a rate of 2 a second.
fn lease_limits() -> LimitTable {
    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, text: &str| std::fs::write(dir.path().join(file), text).unwrap();
    write(
        "names.yaml",
        "InFlight: {number: 100, format: string}\nRequests: {number: 101, format: string}\n",
    );
    write(
        "defaults.yaml",
        "InFlight: {window: concurrency, count: 3, period: 30s}\n\
         Requests: {burst: 2, count: 2, period: 1s}\n",
    );
    LimitTable::load_dir(dir.path()).expect("the limits load")
}

fn lease(tenant: &str, mode: pb::Mode, id: &str) -> pb::Item {
    pb::Item {
        mode: mode as i32,
        lease_id: id.to_string(),
        ..item("InFlight", tenant, None)
    }
}

fn acquire(tenant: &str, id: &str) -> pb::Item {
    lease(tenant, pb::Mode::Acquire, id)
}

fn release(tenant: &str, id: &str) -> pb::Item {
    lease(tenant, pb::Mode::Release, id)
}

/// One item's decision: (allowed, remaining).
async fn one(s: &mut Served, item: pb::Item) -> (bool, i64) {
    let d = check(s, vec![item]).await.expect("Check succeeds").items[0].clone();
    (d.allowed, d.remaining)
}

/// N acquires allowed, the next denied with the time until the oldest lease expires; a
/// repeated acquire takes no second slot; a release frees exactly one, a repeated or
/// unknown release nothing; a lease never released is back after the hold.
#[tokio::test]
async fn leases_are_taken_freed_and_expire_by_themselves() {
    let mut s = Served::with_limits(lease_limits()).await;
    for (i, id) in ["r1", "r2", "r3"].into_iter().enumerate() {
        assert_eq!(one(&mut s, acquire("acme", id)).await, (true, 2 - i as i64));
        s.clock.advance(SECOND);
    }
    let full = check(&mut s, vec![acquire("acme", "r4")]).await.unwrap();
    assert!(!full.overall.unwrap().allowed);
    assert_eq!(nanos(&full.items[0].retry_after), HOLD - 3 * SECOND);
    assert_eq!(
        one(&mut s, acquire("acme", "r2")).await,
        (true, 0),
        "a retry"
    );
    assert_eq!(
        one(&mut s, acquire("other", "r4")).await,
        (true, 2),
        "per key"
    );
    assert_eq!(
        remaining(&mut s, "InFlight", "acme").await,
        0,
        "Inspect: none free"
    );
    assert_eq!(one(&mut s, release("acme", "r2")).await, (true, 1));
    assert_eq!(
        remaining(&mut s, "InFlight", "acme").await,
        1,
        "Inspect: one free"
    );
    assert_eq!(one(&mut s, release("acme", "r2")).await, (false, 1));
    assert_eq!(one(&mut s, release("acme", "nobody")).await, (false, 1));
    assert_eq!(one(&mut s, acquire("acme", "r4")).await, (true, 0));
    // r1 (taken at 0) and r3 (at 2 s) were never released: a crash. r4 came at 3 s.
    s.clock.advance(HOLD - 3 * SECOND);
    assert_eq!(
        one(&mut s, acquire("acme", "r5")).await,
        (true, 0),
        "r1 expired"
    );
    s.clock.advance(2 * SECOND);
    assert_eq!(
        one(&mut s, acquire("acme", "r6")).await,
        (true, 0),
        "r3 expired"
    );
    // An operator's Reset frees every lease of the key.
    let reset = s
        .admin
        .reset(pb::ResetRequest {
            items: vec![item("InFlight", "acme", None)],
        })
        .await
        .unwrap();
    assert_eq!(reset.into_inner().deleted, 1);
    assert_eq!(one(&mut s, acquire("acme", "r7")).await, (true, 2));
}

/// All-or-nothing with a rate in the same request: a denied request takes no lease, and a
/// full key spends no rate.
#[tokio::test]
async fn a_denied_request_takes_no_lease() {
    let mut s = Served::with_limits(lease_limits()).await;
    let rate = |cost| item("Requests", "acme", Some(cost));
    let out = check(&mut s, vec![acquire("acme", "a"), rate(2)])
        .await
        .unwrap();
    assert!(out.overall.unwrap().allowed);
    assert_eq!(out.items[0].remaining, 2);
    let out = check(&mut s, vec![acquire("acme", "b"), rate(1)])
        .await
        .unwrap();
    assert!(!out.overall.unwrap().allowed, "the rate is spent");
    assert_eq!(
        one(&mut s, release("acme", "b")).await,
        (false, 2),
        "b took no lease"
    );
    for id in ["c", "d"] {
        assert!(one(&mut s, acquire("acme", id)).await.0);
    }
    s.clock.advance(SECOND);
    let out = check(&mut s, vec![acquire("acme", "e"), rate(2)])
        .await
        .unwrap();
    assert!(!out.overall.unwrap().allowed, "the key is full");
    assert_eq!(
        one(&mut s, rate(2)).await,
        (true, 0),
        "the rate was not spent"
    );
}

/// The attacker: releases for ids that hold no lease (what Envoy sends at stream end for a
/// request its own filter denied) free nothing, and a flood of acquires with fresh ids on
/// one key never holds more than N nor frees another tenant's lease; over many keys it
/// stops at its name's share of the store's bound on leases (denied), still without
/// pushing any out.
#[tokio::test]
async fn fresh_ids_and_stray_releases_cannot_exceed_the_count() {
    let store = MemoryStore::with_capacity(
        Arc::new(cellrate::clock::FakeClock::new(1_700_000_000 * SECOND)),
        16,
        10_000,
    )
    .with_lease_bound(40);
    let store = Arc::new(store);
    let mut s = Served::full(lease_limits(), Settings::default(), Some(store.clone())).await;
    assert!(one(&mut s, acquire("victim", "v")).await.0);
    let mut admitted = 0;
    for i in 0..200 {
        let id = format!("x{i}");
        if one(&mut s, acquire("attacker", &id)).await.0 {
            admitted += 1;
        }
        // Every denied request's stream end still sends a release of its own id.
        one(&mut s, release("attacker", &format!("denied-{i}"))).await;
        one(&mut s, release("victim", &id)).await;
    }
    assert_eq!(admitted, 3, "at most N in flight");
    // The stray releases are no denials: not in the metrics' denials nor in `top`.
    let metrics = crate::common::http_get_async(s.metrics_addr, "/metrics")
        .await
        .1;
    let series = |result: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("cellrate_decisions_total{api=\"native\",limit=\"InFlight\"")
                    && l.contains(result)
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(|n| n.to_string())
    };
    assert_eq!(series("result=\"not_held\"").as_deref(), Some("400"));
    assert_eq!(series("result=\"denied\"").as_deref(), Some("197"));
    assert_eq!(one(&mut s, acquire("victim", "v2")).await, (true, 1));
    // Over many keys, the name's share of the store's bound (a quarter of 40: 10 leases,
    // 5 of them held already) is reached; beyond it an acquire is denied, never an error
    // (before #58: UNAVAILABLE "lease capacity reached", which Envoy lets through).
    let mut denied = 0;
    for i in 0..100 {
        let out = check(&mut s, vec![acquire(&format!("t{i}"), "x")])
            .await
            .unwrap_or_else(|e| panic!("acquire t{i}: a full share denies, never fails: {e}"));
        if !out.overall.unwrap().allowed {
            denied += 1;
        }
    }
    assert_eq!((store.live_leases(), denied), (10, 100 - 5));
    assert_eq!(
        one(&mut s, release("victim", "v")).await,
        (true, 2),
        "not pushed out"
    );
}

/// Bad input is INVALID_ARGUMENT naming the item and field, and changes nothing.
#[tokio::test]
async fn bad_lease_items_are_refused_and_change_nothing() {
    let mut s = Served::with_limits(lease_limits()).await;
    let long = "x".repeat(129);
    let cases: Vec<(pb::Item, &str)> = vec![
        (
            lease("acme", pb::Mode::Acquire, ""),
            "items[0].lease_id: missing",
        ),
        (
            acquire("acme", &long),
            "items[0].lease_id: 129 bytes, at most 128",
        ),
        (acquire("acme", "a b"), "items[0].lease_id: not printable"),
        (
            acquire("acme", "caf\u{e9}"),
            "items[0].lease_id: not printable",
        ),
        (
            pb::Item {
                cost: Some(2),
                ..acquire("acme", "a")
            },
            "items[0].cost: 2: a lease is one slot",
        ),
        (
            pb::Item {
                mode: pb::Mode::Acquire as i32,
                lease_id: "a".into(),
                ..item("Requests", "acme", None)
            },
            "items[0].mode: Requests is not a concurrency limit",
        ),
        (
            item("InFlight", "acme", None),
            "items[0].mode: InFlight is a concurrency limit",
        ),
        (
            pb::Item {
                lease_id: "a".into(),
                ..item("Requests", "acme", None)
            },
            "items[0].lease_id: only MODE_ACQUIRE and MODE_RELEASE",
        ),
    ];
    for (bad, says) in cases {
        let e = check(&mut s, vec![bad.clone()]).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}: {e}");
        assert!(e.message().starts_with(says), "{bad:?}: {}", e.message());
    }
    let e = s
        .decisions
        .refund(pb::RefundRequest {
            items: vec![item("InFlight", "acme", None)],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("release its lease"), "{}", e.message());
    assert_eq!(
        one(&mut s, acquire("acme", "first")).await,
        (true, 2),
        "nothing taken"
    );
}

/// `cellrate_leases_total` counts leases taken (a retry is not a new one), released (a
/// stray release frees nothing and is not counted) and expired unreleased (leaked), the
/// last as the sweeper drops them.
#[tokio::test]
async fn lease_events_are_counted() {
    let settings = Settings {
        sweep_interval: std::time::Duration::from_millis(20),
        ..Settings::default()
    };
    let mut s = Served::full(lease_limits(), settings, None).await;
    for id in ["r1", "r2", "r1"] {
        assert!(one(&mut s, acquire("acme", id)).await.0);
    }
    assert!(one(&mut s, release("acme", "r2")).await.0);
    assert!(!one(&mut s, release("acme", "r2")).await.0);
    s.clock.advance(HOLD);
    let series = |text: &str, event: &str| {
        crate::common::sample(text, &format!("cellrate_leases_total{{event=\"{event}\"}}"))
    };
    let addr = s.metrics_addr;
    let text = crate::common::poll_until(
        std::time::Duration::from_secs(5),
        async || crate::common::http_get_async(addr, "/metrics").await.1,
        |text| series(text, "expired") == Some(1.0),
    )
    .await;
    assert_eq!(series(&text, "acquired"), Some(2.0), "{text}");
    assert_eq!(series(&text, "released"), Some(1.0));
    assert_eq!(series(&text, "expired"), Some(1.0), "r1 leaked");
}

/// `Top` with `in_flight`: (name, leases, [(id, leases, count)]) as answered.
type InFlight = Vec<(String, u64, Vec<(String, u64, u64)>)>;

async fn top_in_flight(s: &mut Served, limit: u32, name: &str) -> Result<InFlight, tonic::Status> {
    let request = pb::TopRequest {
        limit,
        name: name.to_string(),
        in_flight: true,
        ..Default::default()
    };
    let answer = s.admin.top(request).await?.into_inner();
    assert!(answer.names.is_empty(), "no denials with in_flight");
    Ok(answer
        .in_flight
        .into_iter()
        .map(|n| {
            let ids = n.ids.into_iter().map(|i| (i.id, i.leases, i.count));
            (n.name, n.leases, ids.collect())
        })
        .collect())
}

/// Admin `Top` in flight lists, per concurrency limit, the ids holding the most leases now
/// (with the limit's count), the most first; at most `limit` ids; released and expired
/// leases drop out; bad requests are INVALID_ARGUMENT naming the field.
#[tokio::test]
async fn top_in_flight_lists_the_ids_holding_the_most_leases() {
    let mut s = Served::with_limits(lease_limits()).await;
    for (tenant, n) in [("beta", 2), ("acme", 3), ("gamma", 1)] {
        for i in 0..n {
            assert!(
                one(&mut s, acquire(tenant, &format!("{tenant}-{i}")))
                    .await
                    .0
            );
        }
    }
    // Rates and denied acquires are no leases.
    assert!(one(&mut s, item("Requests", "acme", None)).await.0);
    assert!(!one(&mut s, acquire("acme", "over")).await.0);
    let ids = |list: &[(&str, u64)]| -> Vec<(String, u64, u64)> {
        list.iter().map(|&(id, n)| (id.to_string(), n, 3)).collect()
    };
    let all = ids(&[("acme", 3), ("beta", 2), ("gamma", 1)]);
    let listed = top_in_flight(&mut s, 0, "").await.unwrap();
    assert_eq!(listed, [("InFlight".to_string(), 6, all.clone())]);
    assert_eq!(
        top_in_flight(&mut s, 2, "InFlight").await.unwrap(),
        [("InFlight".to_string(), 6, all[..2].to_vec())],
        "at most 2 ids; the name's total counts every id"
    );
    assert_eq!(top_in_flight(&mut s, 3, "Requests").await.unwrap(), []);

    // acme releases two, beta takes its third a second later; the leases taken first
    // (acme's last, beta's first two, gamma's) then expire unreleased.
    assert!(one(&mut s, release("acme", "acme-0")).await.0);
    assert!(one(&mut s, release("acme", "acme-1")).await.0);
    s.clock.advance(SECOND);
    assert!(one(&mut s, acquire("beta", "beta-2")).await.0);
    let listed = top_in_flight(&mut s, 0, "").await.unwrap();
    let now = ids(&[("beta", 3), ("acme", 1), ("gamma", 1)]);
    assert_eq!(listed, [("InFlight".to_string(), 5, now)]);
    s.clock.advance(HOLD - SECOND);
    let listed = top_in_flight(&mut s, 0, "").await.unwrap();
    assert_eq!(listed, [("InFlight".to_string(), 1, ids(&[("beta", 1)]))]);
    s.clock.advance(SECOND);
    assert_eq!(top_in_flight(&mut s, 0, "").await.unwrap(), []);

    // Bad requests.
    for (limit, name, minutes, says) in [
        (33, "", 0, "limit: 33 is not 1 to 32"),
        (0, "InFlihgt", 0, "name: "),
        (0, "", 5, "minutes: 5 is not used with in_flight"),
    ] {
        let request = pb::TopRequest {
            limit,
            name: name.to_string(),
            minutes,
            in_flight: true,
        };
        let e = s.admin.top(request).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(says), "{}", e.message());
    }
}

/// `Top` in flight is an admin RPC like `Top`: not on the decision listener, and with
/// `--admin-token` only with the token.
#[tokio::test]
async fn top_in_flight_is_for_admins_only() {
    let settings = Settings {
        admin_token: Some("s3cret-token".into()),
        ..Settings::default()
    };
    let mut s = Served::full(lease_limits(), settings, None).await;
    assert!(one(&mut s, acquire("acme", "a")).await.0);
    let request = |token: Option<&str>| {
        let mut r = tonic::Request::new(pb::TopRequest {
            in_flight: true,
            ..Default::default()
        });
        if let Some(t) = token {
            r.metadata_mut().insert("authorization", t.parse().unwrap());
        }
        r
    };
    for token in [None, Some("Bearer wrong")] {
        let e = s.admin.top(request(token)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
    }
    let answer = s.admin.top(request(Some("Bearer s3cret-token"))).await;
    assert_eq!(answer.unwrap().into_inner().in_flight[0].leases, 1);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.decisions_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut wrong = pb::admin_client::AdminClient::new(channel);
    let e = wrong.top(request(Some("Bearer s3cret-token"))).await;
    assert_eq!(e.unwrap_err().code(), tonic::Code::Unimplemented);
}
