//! Budgets (#35): charges that always count. A limit declared `overdraw: true` records every
//! spend, into debt when it is larger than what is left (Envoy's `apply_on_stream_done`
//! charges, a response's token count); a bucket in debt denies until refill repays it; the
//! debt stops at one burst. The native API charges per item with `MODE_CHARGE`. Through a
//! real gRPC client, on a fake clock.

use crate::common::budgets::served;
use crate::common::{check, descriptor, item, remaining, Served, MS};
use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Tokens per tenant: 10 000 a day with charges that count (`overdraw`), and requests per
/// tenant: 5 a second, without.
fn budgets() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, text: &str| std::fs::write(dir.path().join(file), text).unwrap();
    write(
        "names.yaml",
        "TokensPerTenant: {number: 100, format: string}\n\
         RequestsPerTenant: {number: 101, format: string}\n",
    );
    write(
        "defaults.yaml",
        "TokensPerTenant: {burst: 10000, count: 10000, period: 1d, overdraw: true}\n\
         RequestsPerTenant: {burst: 5, count: 5, period: 1s}\n",
    );
    write(
        "descriptors.yaml",
        "ai:\n  - match: [{key: tenant}]\n    limits: [TokensPerTenant]\n    id: \"{tenant}\"\n",
    );
    dir
}

/// `ShouldRateLimit` for `tenant`, with `hits` as the descriptor's own `hits_addend`
/// (Envoy sets it from a substitution format; 0 asks without spending).
async fn tenant(s: &mut Served, tenant: &str, hits: u64) -> RateLimitResponse {
    let mut d = descriptor(&[("tenant", tenant)]);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
    s.envoy
        .should_rate_limit(RateLimitRequest {
            domain: "ai".to_string(),
            descriptors: vec![d],
            hits_addend: 0,
        })
        .await
        .expect("ShouldRateLimit succeeds")
        .into_inner()
}

fn retry_after(r: &RateLimitResponse) -> Option<&str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == "Retry-After")
        .map(|h| h.value.as_str())
}

#[tokio::test]
async fn a_charge_after_the_response_counts_even_beyond_the_budget() {
    let dir = budgets();
    let mut s = served(dir.path()).await;
    // The request path asks without spending: allowed.
    assert_eq!(tenant(&mut s, "t1", 0).await.overall_code, OK);
    // The response used 50 000 tokens: charged at stream done, over the budget. The answer
    // (which Envoy ignores there) says so, and the charge is recorded: the debt stops at
    // one burst, 10 000 tokens (the rest is forgiven).
    let charged = tenant(&mut s, "t1", 50_000).await;
    assert_eq!(charged.overall_code, OVER);
    assert_eq!(remaining(&mut s, "TokensPerTenant", "t1").await, -10_000);
    // The next request is denied, and told to come back when the debt is repaid (a day)
    // and one token has come back (8.64 s).
    let next = tenant(&mut s, "t1", 0).await;
    assert_eq!(next.overall_code, OVER);
    assert_eq!(next.statuses[0].limit_remaining, 0);
    assert_eq!(retry_after(&next), Some("86400"));
    let one = tenant(&mut s, "t1", 1).await;
    assert_eq!((one.overall_code, retry_after(&one)), (OVER, Some("86409")));
    // Another tenant is untouched.
    assert_eq!(tenant(&mut s, "t2", 1).await.overall_code, OK);
    // Repaid by refill, to the nanosecond: half a day repays half the debt...
    s.clock.advance(43_200 * SECOND);
    assert_eq!(remaining(&mut s, "TokensPerTenant", "t1").await, -5_000);
    assert_eq!(tenant(&mut s, "t1", 0).await.overall_code, OVER);
    // ...a whole day all of it: a request that asks without spending passes again.
    s.clock.advance(43_200 * SECOND);
    assert_eq!(tenant(&mut s, "t1", 0).await.overall_code, OK);
    assert_eq!(remaining(&mut s, "TokensPerTenant", "t1").await, 0);
    // On a limit that charges, every hit counts, a denied one too (as envoyproxy/ratelimit
    // counts them): one token short, denied, and one more token owed.
    assert_eq!(tenant(&mut s, "t1", 1).await.overall_code, OVER);
    assert_eq!(remaining(&mut s, "TokensPerTenant", "t1").await, -1);
    // That token and the next come back 8.64 s apart, to the nanosecond.
    s.clock.advance(2 * 8_640 * MS - 1);
    assert_eq!(remaining(&mut s, "TokensPerTenant", "t1").await, 0);
    s.clock.advance(1);
    assert_eq!(remaining(&mut s, "TokensPerTenant", "t1").await, 1);
    assert_eq!(tenant(&mut s, "t1", 1).await.overall_code, OK);
    s.stop().await;
}

#[tokio::test]
async fn a_charge_counts_in_a_batch_that_another_limit_denies() {
    let dir = budgets();
    let mut s = served(dir.path()).await;
    let batch = |tokens| {
        vec![
            item("RequestsPerTenant", "t1", None),
            item("TokensPerTenant", "t1", Some(tokens)),
        ]
    };
    for _ in 0..5 {
        let r = check(&mut s, batch(100)).await.expect("decided");
        assert!(r.overall.unwrap().allowed);
    }
    // The request limit denies the sixth: its request is not spent, its charge is.
    let r = check(&mut s, batch(100)).await.expect("decided");
    assert!(!r.overall.unwrap().allowed);
    assert_eq!(r.items[1].remaining, 9_400);
    assert_eq!(remaining(&mut s, "TokensPerTenant", "t1").await, 9_400);
    assert_eq!(remaining(&mut s, "RequestsPerTenant", "t1").await, 0);
    s.stop().await;
}

#[tokio::test]
async fn the_native_charge_mode_goes_into_debt_on_any_limit() {
    let mut s = Served::start(None).await;
    let charge = |cost| pb::Item {
        mode: pb::Mode::Charge as i32,
        ..item("NewOrdersPerAccount", "42", Some(cost))
    };
    // 500 tokens from a bucket of 300: a charge may exceed the burst (a spend may not).
    let r = check(&mut s, vec![charge(500)])
        .await
        .expect("a charge above the burst is accepted");
    let d = r.overall.unwrap();
    assert!(!d.allowed, "it did not fit");
    assert_eq!(d.remaining, -200);
    // A check-and-spend of the same cost is still refused as malformed.
    let e = check(&mut s, vec![item("NewOrdersPerAccount", "43", Some(500))])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // In debt: a plain check is denied, and waits for 201 tokens (36 s each).
    let r = check(&mut s, vec![item("NewOrdersPerAccount", "42", None)])
        .await
        .expect("decided");
    let d = r.overall.unwrap();
    assert!(!d.allowed);
    assert_eq!(crate::common::nanos(&d.retry_after), 201 * 36 * SECOND);
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "42").await, -200);
    s.stop().await;
}

#[tokio::test]
async fn overdraw_where_it_cannot_apply_is_refused_and_changes_nothing() {
    let dir = budgets();
    for (file, text, says) in [
        (
            "overrides.yaml",
            "- TokensPerTenant: {unlimited: true, overdraw: true, ids: [t9]}\n",
            "overdraw",
        ),
        (
            "defaults.yaml",
            "TokensPerTenant: {burst: 10, count: 10, period: 1s, overdraw: yes please}\n",
            "overdraw",
        ),
    ] {
        let mut files: Vec<(String, String)> = ["names.yaml", "defaults.yaml", "descriptors.yaml"]
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(dir.path().join(f)).unwrap();
                (f.to_string(), text)
            })
            .collect();
        files.retain(|(f, _)| f != file);
        files.push((file.to_string(), text.to_string()));
        let e = LimitTable::from_files(&files).unwrap_err();
        assert!(e.to_string().contains(says), "{file}: {e}");
    }
}

/// A hostile caller with `MODE_CHARGE`: the largest cost there is, on a configured limit and
/// on a caller-given one, puts each bucket at most one burst into debt (two full refills at
/// most), harms no other bucket, and leaves the server answering.
#[tokio::test]
async fn a_hostile_charge_is_bounded() {
    let mut s = Served::start(None).await;
    let charge = |item: pb::Item| pb::Item {
        mode: pb::Mode::Charge as i32,
        cost: Some(u64::MAX),
        ..item
    };
    let inline = pb::Item {
        inline: Some(pb::InlineLimit {
            key: "victim".to_string(),
            burst: 10,
            count: 10,
            period: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    for (target, debt) in [
        (item("NewOrdersPerAccount", "7", None), -300),
        (inline, -10),
    ] {
        let r = check(&mut s, vec![charge(target)])
            .await
            .expect("a charge of any size is decided");
        let d = r.overall.unwrap();
        assert_eq!(
            (d.allowed, d.remaining),
            (false, debt),
            "one burst of debt: {d:?}"
        );
    }
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "7").await, -300);
    // Another account is untouched.
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "8").await, 300);
    // Two full refills (2 x 180 min) later the bucket is full again, to the nanosecond.
    s.clock.advance(2 * 10_800 * SECOND - 1);
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "7").await, 299);
    s.clock.advance(1);
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "7").await, 300);
    s.stop().await;
}

#[tokio::test]
async fn a_temporary_override_keeps_an_overdraw_limit_charging() {
    let dir = budgets();
    let mut s = served(dir.path()).await;
    let secs = |seconds| Some(prost_types::Duration { seconds, nanos: 0 });
    // An operator lowers t3's budget to 100 tokens a day for an hour.
    s.admin
        .set_override(pb::SetOverrideRequest {
            name: "TokensPerTenant".into(),
            id: "t3".into(),
            burst: 100,
            count: 100,
            period: secs(86_400),
            ttl: secs(3_600),
            ..Default::default()
        })
        .await
        .expect("the override is set");
    // A response of 150 tokens is still charged, into debt under the override's numbers.
    let charged = tenant(&mut s, "t3", 150).await;
    assert_eq!(charged.overall_code, OVER);
    assert_eq!(remaining(&mut s, "TokensPerTenant", "t3").await, -50);
    s.stop().await;
}
