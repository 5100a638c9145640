//! Envoy's Rate Limit Quota Service over a real socket, with the generated Envoy client:
//! assignments, the division of one limit among streams (and the push of lower shares),
//! blanket rules, reloads, and the bounds that hostile streams meet.

use std::time::Duration;

use cellrate::clock::SECOND;
use cellrate::server::Settings;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Act;
use tonic::Code;

use crate::common::rlqs::{bucket, config, report, served, token_bucket, Stream};
use crate::common::{http_get_async, poll_until, sample, watching};

#[tokio::test]
async fn streams_share_a_limit_and_lower_shares_are_pushed() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 100);
    // Assignments live a minute here: an ended stream's share is freed a minute after its
    // end (on the server's clock, which the test moves).
    let settings = Settings {
        rlqs: cellrate::service::rlqs::RlqsSettings {
            assignment_ttl: Duration::from_secs(60),
            ..Default::default()
        },
        ..Settings::default()
    };
    let s = served(dir.path(), settings).await;
    let account = || bucket(&[("name", "api"), ("account", "7")]);

    let mut a = Stream::open(&s).await.unwrap();
    a.send(report("edge", account(), 1, 0)).await;
    assert_eq!(
        token_bucket(&a.strategy().await),
        (100.0, 100),
        "alone: all"
    );

    let mut b = Stream::open(&s).await.unwrap();
    b.send(report("edge", account(), 1, 0)).await;
    let (rb, burst_b) = token_bucket(&b.strategy().await);
    // A is told at once that its share is lower: the two never hold more than the limit.
    let (ra, burst_a) = token_bucket(&a.strategy().await);
    assert!(ra + rb <= 100.0 && burst_a + burst_b <= 100, "{ra} + {rb}");
    assert!(ra >= 45.0 && rb >= 45.0, "{ra} {rb}");

    // Keys in any order are one bucket; another account is a bucket of its own.
    a.send(report(
        "edge",
        bucket(&[("account", "8"), ("name", "api")]),
        1,
        0,
    ))
    .await;
    assert_eq!(token_bucket(&a.strategy().await).0, 100.0);

    // A bucket no rule maps: ALLOW_ALL. A denied id (temporary override): DENY_ALL.
    a.send(report("edge", bucket(&[("path", "/")]), 1, 0)).await;
    assert_eq!(
        a.strategy().await,
        Strategy::BlanketRule(BlanketRule::AllowAll as i32)
    );
    let mut admin = s.admin.clone();
    admin
        .set_override(cellrate::proto::v1::SetOverrideRequest {
            name: "NewOrdersPerAccount".into(),
            id: "9".into(),
            deny: true,
            ttl: Some(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    a.send(report(
        "edge",
        bucket(&[("name", "api"), ("account", "9")]),
        1,
        0,
    ))
    .await;
    assert_eq!(
        a.strategy().await,
        Strategy::BlanketRule(BlanketRule::DenyAll as i32)
    );

    // What Envoys report is counted per limit name; streams and buckets are gauges.
    let metrics = http_get_async(s.metrics_addr, "/metrics").await.1;
    let series = |name: &str| sample(&metrics, name);
    assert_eq!(series("cellrate_rlqs_streams"), Some(2.0));
    assert_eq!(series("cellrate_rlqs_buckets"), Some(5.0));
    assert_eq!(
        series(
            "cellrate_rlqs_reported_requests_total{limit=\"NewOrdersPerAccount\",result=\"allowed\"}"
        ),
        Some(4.0)
    );
    assert_eq!(
        series("cellrate_rlqs_actions_total{action=\"pushed\"}"),
        Some(1.0)
    );

    // B goes away: its share comes back to A once B's assignment has lived (a minute),
    // at A's next report, not before.
    drop(b);
    a.send(report("edge", account(), 10, 0)).await;
    assert!(
        token_bucket(&a.strategy().await).0 <= 55.0,
        "B's share is still taken"
    );
    // Once the server has seen B's stream end, its assignment's minute passes on the
    // server's clock (skipped, not waited for).
    let streams = async || {
        let text = http_get_async(s.metrics_addr, "/metrics").await.1;
        sample(&text, "cellrate_rlqs_streams")
    };
    let one = poll_until(Duration::from_secs(5), streams, |n| *n == Some(1.0)).await;
    assert_eq!(one, Some(1.0), "B's stream never ended");
    a.send(report("edge", account(), 10, 0)).await;
    assert!(
        token_bucket(&a.strategy().await).0 <= 55.0,
        "B's share is taken until its assignment has lived"
    );
    s.clock.advance(60 * SECOND);
    a.send(report("edge", account(), 10, 0)).await;
    assert_eq!(token_bucket(&a.strategy().await).0, 100.0);
}

#[tokio::test]
async fn a_reload_that_lowers_the_limit_applies_at_the_next_report() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 100);
    let s = served(dir.path(), watching(dir.path(), Duration::from_millis(50))).await;
    let account = || bucket(&[("name", "api"), ("account", "7")]);
    let mut a = Stream::open(&s).await.unwrap();
    a.send(report("edge", account(), 1, 0)).await;
    assert_eq!(token_bucket(&a.strategy().await).0, 100.0);
    config(dir.path(), 10);
    let mut lowered = 0.0;
    for _ in 0..100 {
        a.send(report("edge", account(), 1, 0)).await;
        lowered = token_bucket(&a.strategy().await).0;
        if lowered <= 10.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lowered, 10.0);
    // A reload that removes the rule abandons the bucket.
    std::fs::remove_file(dir.path().join("quota.yaml")).unwrap();
    let mut abandoned = false;
    for _ in 0..100 {
        a.send(report("edge", account(), 1, 0)).await;
        let answer = a.next().await.unwrap().unwrap();
        if matches!(
            answer.bucket_action[0].bucket_action,
            Some(Act::AbandonAction(_))
        ) {
            abandoned = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(abandoned);
}

#[tokio::test]
async fn hostile_streams_meet_their_bounds() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 100);
    let settings = Settings {
        rlqs: cellrate::service::rlqs::RlqsSettings {
            max_streams: 2,
            max_buckets_per_stream: 2,
            idle: Duration::from_secs(1),
            ..Default::default()
        },
        ..Settings::default()
    };
    let s = served(dir.path(), settings).await;

    // No domain in the first report: INVALID_ARGUMENT, the stream ends.
    let mut a = Stream::open(&s).await.unwrap();
    a.send(report("", bucket(&[("name", "api")]), 1, 0)).await;
    let e = a.next().await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("domain: missing"), "{}", e.message());

    // A malformed bucket id: INVALID_ARGUMENT naming where, nothing of the message applied.
    let mut b = Stream::open(&s).await.unwrap();
    let many: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut bad = report("edge", bucket(&[("name", "api"), ("account", "7")]), 1, 0);
    bad.bucket_quota_usages
        .push(report("edge", bucket(&many), 1, 0).bucket_quota_usages[0].clone());
    b.send(bad).await;
    let e = b.next().await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message()
            .contains("bucket_quota_usages[1].bucket_id.bucket: 17 entries, at most 16"),
        "{}",
        e.message()
    );

    // At most 2 streams at once (the ended ones gave their places back).
    let streams = poll_until(
        Duration::from_secs(5),
        async || {
            sample(
                &http_get_async(s.metrics_addr, "/metrics").await.1,
                "cellrate_rlqs_streams",
            )
        },
        |n| *n == Some(0.0),
    )
    .await;
    assert_eq!(streams, Some(0.0));
    let mut c = Stream::open(&s).await.unwrap();
    let mut d = Stream::open(&s).await.unwrap();
    c.send(report(
        "edge",
        bucket(&[("name", "api"), ("account", "1")]),
        1,
        0,
    ))
    .await;
    c.strategy().await;
    d.send(report(
        "edge",
        bucket(&[("name", "api"), ("account", "2")]),
        1,
        0,
    ))
    .await;
    d.strategy().await;
    let third = match Stream::open(&s).await {
        Ok(mut stream) => stream.next().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert_eq!(third.unwrap_err().code(), Code::ResourceExhausted);

    // At most 2 buckets per stream: a third gets no assignment (Envoy's no-assignment
    // behaviour applies); the stream goes on.
    c.send(report(
        "edge",
        bucket(&[("name", "api"), ("account", "3")]),
        1,
        0,
    ))
    .await;
    c.strategy().await;
    c.send(report(
        "edge",
        bucket(&[("name", "api"), ("account", "4")]),
        1,
        0,
    ))
    .await;
    c.send(report(
        "edge",
        bucket(&[("name", "api"), ("account", "1")]),
        1,
        0,
    ))
    .await;
    let answer = c.next().await.unwrap().unwrap();
    assert_eq!(answer.bucket_action.len(), 1);
    assert_eq!(
        answer.bucket_action[0].bucket_id,
        Some(bucket(&[("name", "api"), ("account", "1")]))
    );

    // A silent stream is ended after the idle time (1 s here).
    let e = d.next().await.unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    let metrics = http_get_async(s.metrics_addr, "/metrics").await.1;
    assert_eq!(
        sample(&metrics, "cellrate_rlqs_refusals_total{reason=\"invalid\"}"),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &metrics,
            "cellrate_rlqs_refusals_total{reason=\"too_many_streams\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &metrics,
            "cellrate_rlqs_refusals_total{reason=\"too_many_buckets\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn an_envoy_with_thousands_of_buckets_reports_them_in_one_message() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 100);
    let s = served(dir.path(), Settings::default()).await;
    // 3 000 accounts in one message (about 150 KB): all answered, in order.
    let mut a = Stream::open(&s).await.unwrap();
    let mut many = report("edge", bucket(&[("name", "api"), ("account", "1")]), 1, 0);
    for i in 2..=3_000 {
        let id = bucket(&[("name", "api"), ("account", &i.to_string())]);
        many.bucket_quota_usages
            .push(report("edge", id, 1, 0).bucket_quota_usages[0].clone());
    }
    a.send(many.clone()).await;
    let answer = a.next().await.unwrap().unwrap();
    assert_eq!(answer.bucket_action.len(), 3_000);
    assert_eq!(
        answer.bucket_action[2_999].bucket_id,
        Some(bucket(&[("name", "api"), ("account", "3000")]))
    );
    // Over 1 MiB: refused, the stream ends, nothing of it applied.
    let mut b = Stream::open(&s).await.unwrap();
    let huge_value = "9".repeat(500);
    let mut huge = report("edge", bucket(&[("name", "api"), ("account", "1")]), 1, 0);
    for i in 0..2_500 {
        let id = bucket(&[("name", "api"), ("k", &format!("{i}{huge_value}"))]);
        huge.bucket_quota_usages
            .push(report("edge", id, 1, 0).bucket_quota_usages[0].clone());
    }
    b.send(huge).await;
    let e = b.next().await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    let metrics = http_get_async(s.metrics_addr, "/metrics").await.1;
    assert_eq!(sample(&metrics, "cellrate_rlqs_buckets"), Some(3_000.0));
}

/// The ids of RLQS buckets count against a byte budget (`--rlqs-max-bucket-bytes`): an
/// unauthenticated client that reports buckets with the largest ids allowed (16 entries of
/// 640 bytes) is refused new buckets once the budget is spent, the bytes held never pass
/// it, and they come back when its stream ends (after the assignments' lifetime).
#[tokio::test]
async fn bucket_ids_count_against_a_byte_budget() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 100);
    let budget = 1 << 20;
    let settings = Settings {
        rlqs: cellrate::service::rlqs::RlqsSettings {
            max_bucket_bytes: budget,
            assignment_ttl: Duration::from_secs(1),
            ..Default::default()
        },
        ..Settings::default()
    };
    let s = served(dir.path(), settings).await;
    let mut attacker = Stream::open(&s).await.unwrap();
    let value = "x".repeat(500);
    let keys: Vec<String> = (0..15).map(|k| format!("{k:0>120}")).collect();
    let mut answered = 0;
    let mut refused = 0;
    // 400 buckets of about 9.5 KiB each (3.7 MiB of ids) in messages of 50.
    for batch in 0..8 {
        let mut message = report("edge", bucket(&[("name", "api"), ("account", "0")]), 1, 0);
        message.bucket_quota_usages.clear();
        for i in 0..50 {
            let n = format!("{batch}-{i}");
            let mut pairs: Vec<(&str, &str)> =
                keys.iter().map(|k| (k.as_str(), value.as_str())).collect();
            pairs.push(("n", &n));
            message
                .bucket_quota_usages
                .push(report("edge", bucket(&pairs), 1, 0).bucket_quota_usages[0].clone());
        }
        attacker.send(message).await;
        // A message whose buckets are all refused gets no answer.
        let wait = Duration::from_millis(500);
        if let Ok(answer) = tokio::time::timeout(wait, attacker.answers.message()).await {
            answered += answer.unwrap().map_or(0, |a| a.bucket_action.len());
        }
        refused = 400 - answered;
    }
    let metrics = http_get_async(s.metrics_addr, "/metrics").await.1;
    let held = sample(&metrics, "cellrate_rlqs_bucket_bytes").unwrap();
    assert!(
        held <= budget as f64,
        "{held} bytes held over a budget of {budget}"
    );
    assert!(
        held > budget as f64 * 0.9,
        "the budget was not used: {held}"
    );
    let tracked = sample(&metrics, "cellrate_rlqs_buckets").unwrap();
    assert!(
        (100.0..=110.0).contains(&tracked),
        "{tracked} buckets tracked"
    );
    assert!(refused > 250, "refused {refused} of 400");
    assert_eq!(
        sample(
            &metrics,
            "cellrate_rlqs_refusals_total{reason=\"too_many_buckets\"}"
        ),
        Some(refused as f64)
    );
    // Once the attacker's stream ends and its buckets' assignments lapse, the bytes come
    // back, and an Envoy's bucket is tracked again.
    drop(attacker);
    let freed = poll_until(
        Duration::from_secs(10),
        async || {
            let metrics = http_get_async(s.metrics_addr, "/metrics").await.1;
            sample(&metrics, "cellrate_rlqs_bucket_bytes")
        },
        |b| *b == Some(0.0),
    )
    .await;
    assert_eq!(freed, Some(0.0), "the bytes were not given back");
    let mut envoy = Stream::open(&s).await.unwrap();
    envoy
        .send(report(
            "edge",
            bucket(&[("name", "api"), ("account", "1")]),
            1,
            0,
        ))
        .await;
    let answer = envoy.next().await.unwrap().unwrap();
    assert_eq!(answer.bucket_action.len(), 1);
}
