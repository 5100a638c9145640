//! Answers exactly as the contract says: check-only reports the spend it would make,
//! a refund's overall decision describes the emptiest bucket, and a store that answers for
//! fewer items than asked is an error, never an allow.

use std::sync::Arc;

use crate::common::{item, nanos, Served, MS, T0};
use cellrate::clock::FakeClock;
use cellrate::gcra::Decision;
use cellrate::limits::names::BucketKey;
use cellrate::proto::v1 as pb;
use cellrate::store::{MemoryStore, Outcome, Store, StoreFuture, StoreItem};
use tonic::Code;

fn inline(key: &str, limit: u64, cost: Option<u64>, mode: pb::Mode) -> pb::Item {
    pb::Item {
        inline: Some(pb::InlineLimit {
            key: key.to_string(),
            burst: limit,
            count: limit,
            period: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        }),
        cost,
        mode: mode as i32,
        ..Default::default()
    }
}

async fn check(s: &mut Served, items: Vec<pb::Item>) -> pb::CheckResponse {
    s.decisions
        .check(pb::CheckRequest {
            items,
            ..Default::default()
        })
        .await
        .expect("Check succeeds")
        .into_inner()
}

#[tokio::test]
async fn check_only_reports_the_spend_it_would_make_and_writes_nothing() {
    let mut s = Served::start(None).await;
    // A fresh 20/20/1s bucket, check-only cost 1: allowed, 19 left, full again in 50 ms.
    let mut probe = item("NewRegistrationsPerIPAddress", "192.0.2.1", Some(1));
    probe.mode = pb::Mode::CheckOnly as i32;
    let r = check(&mut s, vec![probe.clone()]).await;
    let d = r.items[0].clone();
    assert!(d.allowed);
    assert_eq!((d.remaining, nanos(&d.reset_after)), (19, 50 * MS));
    // Nothing was written: the same answer again, and Inspect sees a full bucket.
    let again = check(&mut s, vec![probe]).await.items[0].clone();
    assert_eq!(again.remaining, 19);
    let inspected = s
        .admin
        .inspect(pb::InspectRequest {
            items: vec![item("NewRegistrationsPerIPAddress", "192.0.2.1", None)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(inspected.items[0].remaining, 20);

    // In a batch it counts toward the overall decision with those numbers.
    let r = check(
        &mut s,
        vec![
            inline("a", 40, Some(1), pb::Mode::CheckAndSpend),
            inline("b", 20, Some(1), pb::Mode::CheckOnly),
        ],
    )
    .await;
    let overall = r.overall.unwrap();
    assert!(overall.allowed);
    assert_eq!(
        (overall.remaining, nanos(&overall.reset_after)),
        (19, 50 * MS)
    );
    assert_eq!(r.items[0].remaining, 39, "the spend was made");
    s.stop().await;
}

#[tokio::test]
async fn a_refunds_overall_decision_describes_the_emptiest_bucket() {
    let mut s = Served::start(None).await;
    let spent = check(
        &mut s,
        vec![inline("a", 10, Some(8), pb::Mode::CheckAndSpend)],
    )
    .await;
    assert_eq!(spent.overall.unwrap().remaining, 2);
    let r = s
        .decisions
        .refund(pb::RefundRequest {
            items: vec![
                inline("a", 10, Some(1), pb::Mode::CheckAndSpend),
                inline("b", 10, Some(1), pb::Mode::CheckAndSpend),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.items[0].remaining, r.items[1].remaining), (3, 10));
    let overall = r.overall.unwrap();
    assert!(overall.allowed, "a bucket changed");
    assert_eq!(
        overall.remaining, 3,
        "the emptiest bucket, not the untouched full one"
    );
    assert_eq!(nanos(&overall.reset_after), 700 * MS);
    s.stop().await;
}

/// A memory store that drops the last decision of every batch.
struct ShortStore(MemoryStore);

impl Store for ShortStore {
    fn spend<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Outcome> {
        Box::pin(async move {
            let mut outcome = self.0.spend_now(items)?;
            outcome.decisions.pop();
            Ok(outcome)
        })
    }

    fn refund<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Vec<Decision>> {
        Box::pin(async move {
            let mut decisions = self.0.refund_now(items);
            decisions.pop();
            Ok(decisions)
        })
    }

    fn reset<'a>(&'a self, keys: &'a [BucketKey]) -> StoreFuture<'a, u32> {
        Box::pin(async move { Ok(self.0.reset_now(keys)) })
    }
}

#[tokio::test]
async fn a_store_answering_for_fewer_items_is_an_error_not_an_allow() {
    let limits = cellrate::limits::config::LimitTable::load_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config"),
    )
    .unwrap();
    let store = Arc::new(ShortStore(MemoryStore::new(Arc::new(FakeClock::new(T0)))));
    let mut s = Served::full(limits, Default::default(), Some(store)).await;
    let e = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![item("NewOrdersPerAccount", "1", None)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("0 decisions for 1 items"), "{e:?}");
    let e = s
        .decisions
        .refund(pb::RefundRequest {
            items: vec![item("NewOrdersPerAccount", "1", None)],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    s.stop().await;
}

mod invalid_ids {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as Envoy;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    const OK: i32 = Envoy::Ok as i32;
    const OVER: i32 = Envoy::OverLimit as i32;

    /// The example config plus two domains choosing the other policies.
    async fn serve() -> (Served, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        for file in std::fs::read_dir(&config).unwrap() {
            let file = file.unwrap();
            std::fs::copy(file.path(), dir.path().join(file.file_name())).unwrap();
        }
        let mut descriptors = std::fs::read_to_string(dir.path().join("descriptors.yaml")).unwrap();
        descriptors.push_str(
            "lenient:\n  invalid_id: ignore\nstrict:\n  invalid_id: reject\n  rules: []\n",
        );
        std::fs::write(dir.path().join("descriptors.yaml"), descriptors).unwrap();
        (Served::start(Some(dir.path())).await, dir)
    }

    fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: domain.into(),
            descriptors,
            hits_addend: 0,
        }
    }

    async fn orders_left(s: &mut Served, id: &str) -> i64 {
        crate::common::remaining(s, "NewOrdersPerAccount", id).await
    }

    #[tokio::test]
    async fn deny_by_default_ignore_and_reject_by_domain() {
        let (mut s, _dir) = serve().await;
        let valid = || crate::common::descriptor(&[("NewOrdersPerAccount", "7")]);
        let garbage = || crate::common::descriptor(&[("NewOrdersPerAccount", "abc")]);

        // deny (default): the bad descriptor is OVER_LIMIT without Retry-After, the batch
        // is denied as a whole (nothing spent on the good one): no bypass by bad headers.
        let r = s
            .envoy
            .should_rate_limit(request("edge", vec![valid(), garbage()]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, OVER);
        assert_eq!((r.statuses[0].code, r.statuses[1].code), (OK, OVER));
        assert!(!r
            .response_headers_to_add
            .iter()
            .any(|h| h.key == "Retry-After"));
        assert_eq!(orders_left(&mut s, "7").await, 300);

        // ignore: the bad descriptor is unmatched; the rest is decided and spent.
        let r = s
            .envoy
            .should_rate_limit(request("lenient", vec![valid(), garbage()]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, OK);
        assert_eq!((r.statuses[0].code, r.statuses[1].code), (OK, OK));
        assert_eq!(orders_left(&mut s, "7").await, 299);

        // reject: INVALID_ARGUMENT naming Envoy's field.
        let e = s
            .envoy
            .should_rate_limit(request("strict", vec![valid(), garbage()]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("descriptors[1].entries: "), "{e:?}");
        assert_eq!(orders_left(&mut s, "7").await, 299);

        // Counted as invalid; the rejected request's unmatched descriptor is not counted.
        let unmatched = || crate::common::descriptor(&[("path", "/")]);
        let e = s
            .envoy
            .should_rate_limit(request("strict", vec![unmatched(), garbage()]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let metrics = crate::common::http_get_async(s.metrics_addr, "/metrics")
            .await
            .1;
        let invalid = "cellrate_decisions_total{api=\"envoy\",limit=\"NewOrdersPerAccount\",result=\"invalid\"}";
        assert_eq!(
            crate::common::sample(&metrics, invalid),
            Some(2.0),
            "deny and ignore"
        );
        let unmatched_series =
            "cellrate_decisions_total{api=\"envoy\",limit=\"\",result=\"unmatched\"}";
        assert_eq!(
            crate::common::sample(&metrics, unmatched_series),
            None,
            "{metrics}"
        );
        s.stop().await;
    }
}
