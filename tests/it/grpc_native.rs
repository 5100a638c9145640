//! The native API through a real tonic client over a loopback socket, on a fake clock.

use crate::common::{item, nanos, Served, MS, T0};
use cellrate::proto::v1 as pb;
use tonic::Code;

const IP: &str = "NewRegistrationsPerIPAddress";

async fn check(s: &mut Served, items: Vec<pb::Item>) -> pb::CheckResponse {
    s.decisions
        .check(pb::CheckRequest {
            items,
            ..Default::default()
        })
        .await
        .expect("check succeeds")
        .into_inner()
}

async fn inspect(s: &mut Served, items: Vec<pb::Item>) -> Vec<pb::Decision> {
    s.admin
        .inspect(pb::InspectRequest { items })
        .await
        .expect("inspect succeeds")
        .into_inner()
        .items
}

async fn check_error(s: &mut Served, items: Vec<pb::Item>) -> tonic::Status {
    s.decisions
        .check(pb::CheckRequest {
            items,
            ..Default::default()
        })
        .await
        .expect_err("check must fail")
}

#[tokio::test]
async fn seed_000_walkthrough_through_check() {
    let mut s = Served::start(None).await;
    let ip = || vec![item(IP, "172.23.45.22", None)];
    for i in 1..=20 {
        let r = check(&mut s, ip()).await;
        let overall = r.overall.unwrap();
        assert!(overall.allowed, "request {i}");
        assert_eq!(overall.remaining, 20 - i);
        let limit = overall.limit.unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.burst, limit.count),
            (IP, 20, 20)
        );
        assert_eq!(nanos(&limit.period), 1_000 * MS);
        assert_eq!(limit.key, "1:172.23.45.22");
    }
    // TAT = t0 + 1s: the bucket is full again in one second.
    let peek = &inspect(&mut s, ip()).await[0];
    assert_eq!((peek.remaining, nanos(&peek.reset_after)), (0, 1_000 * MS));

    let denied = check(&mut s, ip()).await.overall.unwrap();
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 0);
    assert_eq!(nanos(&denied.retry_after), 50 * MS);
    assert_eq!(nanos(&denied.reset_after), 1_000 * MS);

    s.clock.advance(50 * MS - 1);
    assert!(!check(&mut s, ip()).await.overall.unwrap().allowed);
    s.clock.advance(1);
    let again = check(&mut s, ip()).await.overall.unwrap();
    assert!(again.allowed);
    assert_eq!((again.remaining, nanos(&again.retry_after)), (0, 50 * MS));

    // Weeks later the TAT is in the past: a full bucket.
    s.clock.set(T0 + 14 * 86_400 * 1_000 * MS);
    assert_eq!(inspect(&mut s, ip()).await[0].remaining, 20);
    s.stop().await;
}

#[tokio::test]
async fn overrides_apply_per_id() {
    let mut s = Served::start(None).await;
    // 12345678 is overridden to 300 per 180m at 600/180m (ei 18s), the default is 36s.
    let over = check(&mut s, vec![item("NewOrdersPerAccount", "012345678", None)]).await;
    let d = over.overall.unwrap();
    assert_eq!(d.limit.as_ref().unwrap().count, 600);
    assert_eq!(nanos(&d.reset_after), 18_000 * MS);
    assert_eq!(d.limit.unwrap().key, "3:12345678");
    let default = check(&mut s, vec![item("NewOrdersPerAccount", "1", None)]).await;
    assert_eq!(nanos(&default.overall.unwrap().reset_after), 36_000 * MS);
}

#[tokio::test]
async fn batches_are_all_or_nothing_and_report_the_strictest() {
    let mut s = Served::start(None).await;
    // Exhaust one key's per-second limit (10/s).
    let exhausted = item("ApiRequestsPerKey", "key-a", Some(10));
    assert!(
        check(&mut s, vec![exhausted])
            .await
            .overall
            .unwrap()
            .allowed
    );

    let batch = vec![
        item("ApiRequestsPerKeyDaily", "key-a", None),
        item("ApiRequestsPerKey", "key-a", None),
    ];
    let r = check(&mut s, batch.clone()).await;
    let overall = r.overall.unwrap();
    assert!(!overall.allowed);
    assert_eq!(overall.limit.unwrap().name, "ApiRequestsPerKey");
    assert_eq!(nanos(&overall.retry_after), 100 * MS);
    // The daily item had the tokens: allowed, but nothing was spent.
    assert!(r.items[0].allowed);
    assert_eq!(r.items[0].remaining, 10_000);
    let daily = inspect(&mut s, vec![item("ApiRequestsPerKeyDaily", "key-a", None)]).await;
    assert_eq!(daily[0].remaining, 10_000);

    // A second later both have tokens: both are spent.
    s.clock.advance(1_000 * MS);
    let r = check(&mut s, batch).await;
    assert!(r.overall.unwrap().allowed);
    assert_eq!((r.items[0].remaining, r.items[1].remaining), (9_999, 9));
}

#[tokio::test]
async fn modes_check_only_and_spend_only() {
    let mut s = Served::start(None).await;
    let mut check_only = item("ApiRequestsPerKey", "key-m", Some(4));
    check_only.mode = pb::Mode::CheckOnly as i32;
    let r = check(&mut s, vec![check_only]).await;
    assert!(r.overall.unwrap().allowed);
    let peek = inspect(&mut s, vec![item("ApiRequestsPerKey", "key-m", None)]).await;
    assert_eq!(peek[0].remaining, 10, "check_only spent nothing");

    // spend_only on an empty bucket does not deny the batch.
    assert!(
        check(&mut s, vec![item("ApiRequestsPerKey", "key-m", Some(10))])
            .await
            .overall
            .unwrap()
            .allowed
    );
    let mut spend_only = item("ApiRequestsPerKey", "key-m", None);
    spend_only.mode = pb::Mode::SpendOnly as i32;
    let r = check(
        &mut s,
        vec![item("ApiRequestsPerKeyDaily", "key-m", None), spend_only],
    )
    .await;
    assert!(r.overall.unwrap().allowed);
    assert!(!r.items[1].allowed);
    assert_eq!(r.items[0].remaining, 9_999);
}

#[tokio::test]
async fn cost_zero_peeks_and_inline_limits_work() {
    let mut s = Served::start(None).await;
    let inline = |cost| pb::Item {
        inline: Some(pb::InlineLimit {
            key: "user42".to_string(),
            burst: 5,
            count: 1,
            period: Some(prost_types::Duration {
                seconds: 2,
                nanos: 0,
            }),
            ..Default::default()
        }),
        cost,
        ..Default::default()
    };
    let r = check(&mut s, vec![inline(Some(5))]).await.overall.unwrap();
    assert!(r.allowed);
    assert_eq!(r.remaining, 0);
    assert_eq!(r.limit.as_ref().unwrap().key, "0:i/5/1/2000000000/user42");
    assert_eq!(r.limit.unwrap().name, "inline");
    let r = check(&mut s, vec![inline(Some(0))]).await.overall.unwrap();
    assert!(r.allowed, "a peek of an empty bucket is allowed");
    assert_eq!((r.remaining, nanos(&r.reset_after)), (0, 10_000 * MS));
    let r = check(&mut s, vec![inline(None)]).await.overall.unwrap();
    assert!(!r.allowed);
    assert_eq!(nanos(&r.retry_after), 2_000 * MS);
}

#[tokio::test]
async fn allow_deny_and_unconfigured_policies() {
    let mut s = Served::start(None).await;
    let r = check(
        &mut s,
        vec![item(
            "ApiRequestsPerKey",
            "key-internal-batch",
            Some(1_000_000),
        )],
    )
    .await;
    let overall = r.overall.unwrap();
    assert!(overall.allowed);
    assert_eq!(overall.policy, pb::Policy::Unlimited as i32);

    let r = check(
        &mut s,
        vec![
            item("ApiRequestsPerKeyDaily", "key-revoked-0001", None),
            item("ApiRequestsPerKey", "key-revoked-0001", None),
        ],
    )
    .await;
    let overall = r.overall.unwrap();
    assert!(!overall.allowed);
    assert_eq!(overall.policy, pb::Policy::Denied as i32);
    // The deny list denied the batch, so the daily limit spent nothing.
    let daily = inspect(
        &mut s,
        vec![item("ApiRequestsPerKeyDaily", "key-revoked-0001", None)],
    )
    .await;
    assert_eq!(daily[0].remaining, 10_000);

    let r = check(
        &mut s,
        vec![item("CertificatesPerDomain", "www.example.com", None)],
    )
    .await;
    let overall = r.overall.unwrap();
    assert!(overall.allowed);
    assert_eq!(overall.policy, pb::Policy::NotConfigured as i32);
    assert_eq!(r.items[0].limit.as_ref().unwrap().key, "5:example.com");
}

#[tokio::test]
async fn refund_gives_tokens_back_never_past_full() {
    let mut s = Served::start(None).await;
    let key = |cost| item("ApiRequestsPerKey", "key-r", cost);
    check(&mut s, vec![key(Some(6))]).await;
    let refund = |items| pb::RefundRequest { items };
    let r = s
        .decisions
        .refund(refund(vec![key(Some(2))]))
        .await
        .unwrap()
        .into_inner();
    assert!(r.items[0].allowed);
    assert_eq!(r.items[0].remaining, 6);
    let overall = r.overall.unwrap();
    assert!(overall.allowed);
    assert_eq!(
        (overall.remaining, overall.policy),
        (6, pb::Policy::Limited as i32)
    );
    let r = s
        .decisions
        .refund(refund(vec![key(Some(10))]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.items[0].remaining, 10);
    let r = s
        .decisions
        .refund(refund(vec![key(Some(1))]))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.items[0].allowed, "a full bucket cannot be refunded");
    assert!(!r.overall.unwrap().allowed);
    let mut with_mode = key(None);
    with_mode.mode = pb::Mode::CheckOnly as i32;
    let e = s
        .decisions
        .refund(refund(vec![with_mode]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("items[0].mode"), "{}", e.message());
}

#[tokio::test]
async fn reset_empties_buckets() {
    let mut s = Served::start(None).await;
    check(&mut s, vec![item(IP, "10.9.9.9", Some(20))]).await;
    assert!(
        !check(&mut s, vec![item(IP, "10.9.9.9", None)])
            .await
            .overall
            .unwrap()
            .allowed
    );
    let r = s
        .admin
        .reset(pb::ResetRequest {
            items: vec![item(IP, "10.9.9.9", None), item(IP, "10.9.9.8", None)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.deleted, 1);
    assert_eq!(
        check(&mut s, vec![item(IP, "10.9.9.9", None)])
            .await
            .overall
            .unwrap()
            .remaining,
        19
    );
}

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_item_and_spends_nothing() {
    let mut s = Served::start(None).await;
    let good = || item("ApiRequestsPerKey", "key-bad", None);
    let cases: Vec<(Vec<pb::Item>, &str)> = vec![
        (vec![], "items: empty batch"),
        ((0..65).map(|i| item("ApiRequestsPerKey", &format!("k{i}"), None)).collect(), "at most 64"),
        (vec![good(), item("NoSuchLimit", "x", None)], "items[1].name: unknown limit name \"NoSuchLimit\""),
        (
            vec![item("NewOrderPerAccount", "1", None)],
            "items[0].name: unknown limit name \"NewOrderPerAccount\" (did you mean \"NewOrdersPerAccount\"?)",
        ),
        (vec![good(), item(IP, "300.1.1.1", None)], "items[1].id: id \"300.1.1.1\": not an IPv4"),
        (vec![good(), item("ApiRequestsPerKey", "key-bad", Some(11))], "items[1]: cost 11 exceeds the burst 10"),
        (vec![good(), item("ApiRequestsPerKey", "key-bad", None)], "items[1]: bucket 100:key-bad is already items[0]"),
        (vec![good(), item("", "", None)], "items[1].name: empty"),
        (vec![good(), item(IP, "::ffff:10.0.0.1", None), item(IP, "10.0.0.1", None)], "items[2]: bucket 1:10.0.0.1 is already items[1]"),
        (
            vec![good(), pb::Item { mode: 7, ..item("ApiRequestsPerKey", "x", None) }],
            "items[1].mode: unknown mode 7",
        ),
        (
            vec![
                good(),
                pb::Item {
                    inline: Some(pb::InlineLimit { key: "k".into(), burst: 1, count: 2_000_000_000, period: Some(prost_types::Duration { seconds: 1, nanos: 0 }), ..Default::default() }),
                    ..Default::default()
                },
            ],
            "items[1].inline: count 2000000000 per period 1000000000ns gives an emission interval of 0ns",
        ),
        (
            vec![good(), pb::Item { inline: Some(pb::InlineLimit { key: "k".into(), burst: 1, count: 1, period: None, ..Default::default() }), ..Default::default() }],
            "items[1].inline.period: missing",
        ),
        (
            vec![
                good(),
                pb::Item {
                    name: "ApiRequestsPerKey".into(),
                    inline: Some(pb::InlineLimit { key: "k".into(), burst: 1, count: 1, period: Some(prost_types::Duration { seconds: 1, nanos: 0 }), ..Default::default() }),
                    ..Default::default()
                },
            ],
            "items[1]: give either name and id, or inline, not both",
        ),
    ];
    for (items, expected) in cases {
        let e = check_error(&mut s, items).await;
        assert_eq!(e.code(), Code::InvalidArgument, "{expected}");
        assert!(
            e.message().contains(expected),
            "got {:?}, expected {expected:?}",
            e.message()
        );
    }
    let peek = inspect(&mut s, vec![good()]).await;
    assert_eq!(peek[0].remaining, 10, "no rejected request spent anything");
    let e = s
        .admin
        .inspect(pb::InspectRequest {
            items: vec![item("ApiRequestsPerKey", "x", Some(1))],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn admin_rpcs_are_not_served_on_the_decision_listener() {
    let s = Served::start(None).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.decisions_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut wrong = pb::admin_client::AdminClient::new(channel);
    let e = wrong
        .reset(pb::ResetRequest {
            items: vec![item(IP, "10.0.0.1", None)],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.admin_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut wrong = pb::rate_limiter_client::RateLimiterClient::new(channel);
    let e = wrong
        .check(pb::CheckRequest {
            items: vec![item(IP, "10.0.0.1", None)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
}

#[tokio::test]
async fn inspect_says_where_each_limit_comes_from() {
    use pb::limit_source::Kind;
    let mut s = Served::start(None).await;
    let inline = pb::Item {
        inline: Some(pb::InlineLimit {
            key: "k".into(),
            burst: 5,
            count: 5,
            period: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let answers = inspect(
        &mut s,
        vec![
            item("NewOrdersPerAccount", "5", None),
            item("NewOrdersPerAccount", "12345678", None),
            item("NewOrdersPerAccount", "87654321", None),
            item("ApiRequestsPerKey", "key-internal-batch", None),
            item("CertificatesPerDomain", "example.com", None),
            inline,
        ],
    )
    .await;
    let sources: Vec<(Kind, String, u32, String)> = answers
        .iter()
        .map(|a| {
            let s = a.source.clone().expect("Inspect sets the source");
            (s.kind(), s.file, s.entry, s.comment)
        })
        .collect();
    let override_ = |entry: u32, comment: &str| {
        (
            Kind::Override,
            "overrides.yaml".to_string(),
            entry,
            comment.to_string(),
        )
    };
    assert_eq!(
        sources,
        [
            (Kind::Default, String::new(), 0, String::new()),
            override_(2, ""),
            override_(2, "doubled for a hosting provider"),
            override_(3, "our own batch jobs"),
            (Kind::NotConfigured, String::new(), 0, String::new()),
            (Kind::CallerGiven, String::new(), 0, String::new()),
        ]
    );
    // Check leaves it out.
    let checked = check(&mut s, vec![item("NewOrdersPerAccount", "5", None)]).await;
    assert!(checked.items[0].source.is_none());
}

#[tokio::test]
async fn top_counts_denials_of_both_apis_over_sliding_minutes() {
    let mut s = Served::start(None).await;
    let top = |minutes: u32| pb::TopRequest {
        minutes,
        ..Default::default()
    };
    // Native: 10 per second on key-t; 12 checks, 2 denials. Envoy: 3 more denials.
    for _ in 0..12 {
        check(&mut s, vec![item("ApiRequestsPerKey", "key-t", None)]).await;
    }
    let envoy_request = crate::common::envoy_request("edge", &[&[("api_key", "key-t")]]);
    for _ in 0..3 {
        s.envoy
            .should_rate_limit(envoy_request.clone())
            .await
            .unwrap();
    }
    let answer = s.admin.top(top(1)).await.unwrap().into_inner();
    assert_eq!(answer.minutes, 1);
    assert_eq!(answer.names.len(), 1, "{answer:?}");
    let name = &answer.names[0];
    assert_eq!((name.name.as_str(), name.denials), ("ApiRequestsPerKey", 5));
    assert_eq!(
        name.ids,
        [pb::TopId {
            id: "key-t".into(),
            denials: 5,
            error: 0
        }]
    );
    // Two minutes on: out of the 1-minute window, inside the 5-minute one.
    s.clock.advance(120 * 1_000 * MS);
    assert!(s
        .admin
        .top(top(1))
        .await
        .unwrap()
        .into_inner()
        .names
        .is_empty());
    assert_eq!(
        s.admin.top(top(5)).await.unwrap().into_inner().names[0].denials,
        5
    );
    // Bad windows and limits are INVALID_ARGUMENT.
    let status = s.admin.top(top(16)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = s
        .admin
        .top(pb::TopRequest {
            limit: 33,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.message(), "limit: 33 is not 1 to 32");
    let status = s
        .admin
        .top(pb::TopRequest {
            name: "N".repeat(129),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.message(), "name: longer than 128 bytes");
}
