//! Helpers of `rlqs`'s tests that both tiers use (`tests/it/rlqs.rs`,
//! `tests/full/rlqs_redis.rs`).

use std::path::Path;
use std::time::Duration;
use cellrate::server::Settings;
use cellrate::limits::config::LimitTable;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Act;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tonic::Streaming;
use crate::Served;

/// One RLQS stream, as an Envoy opens it.
pub struct Stream {
    pub send: mpsc::Sender<RateLimitQuotaUsageReports>,
    pub answers: Streaming<RateLimitQuotaResponse>,
}

pub fn bucket(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// 100 per second, burst 100, for accounts of the `api` bucket of domain `edge`.
pub fn config(dir: &Path, per_second: u32) {
    std::fs::write(
        dir.join("defaults.yaml"),
        format!("NewOrdersPerAccount: {{burst: {per_second}, count: {per_second}, period: 1s}}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("quota.yaml"),
        "edge:\n  - match: [{key: name, value: api}, {key: account}]\n    limits: [NewOrdersPerAccount]\n",
    )
    .unwrap();
}

pub fn report(domain: &str, id: BucketId, allowed: u64, denied: u64) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_string(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(id),
            time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: 1,
                nanos: 0,
            }),
            num_requests_allowed: allowed,
            num_requests_denied: denied,
        }],
    }
}

pub async fn served(dir: &Path, settings: Settings) -> Served {
    let limits = LimitTable::load_dir(dir).unwrap();
    Served::with_settings(limits, settings).await
}

/// Tokens per second and burst of a token-bucket strategy.
pub fn token_bucket(strategy: &Strategy) -> (f64, u32) {
    match strategy {
        Strategy::TokenBucket(tb) => {
            let per_fill = f64::from(tb.tokens_per_fill.unwrap().value);
            let seconds = tb.fill_interval.unwrap().seconds as f64;
            (per_fill / seconds, tb.max_tokens)
        }
        other => panic!("not a token bucket: {other:?}"),
    }
}

impl Stream {
    pub async fn open(s: &Served) -> Result<Stream, tonic::Status> {
        let mut client =
            RateLimitQuotaServiceClient::connect(format!("http://{}", s.decisions_addr))
                .await
                .unwrap();
        let (send, rx) = mpsc::channel(16);
        let answers = client
            .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Stream { send, answers })
    }

    pub async fn send(&self, reports: RateLimitQuotaUsageReports) {
        self.send.send(reports).await.unwrap();
    }

    /// The next answer within 5 s.
    pub async fn next(&mut self) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
        tokio::time::timeout(Duration::from_secs(5), self.answers.message())
            .await
            .expect("an answer within 5 s")
    }

    /// The strategy of the next answer's only action.
    pub async fn strategy(&mut self) -> Strategy {
        let answer = self.next().await.unwrap().expect("an answer");
        assert_eq!(answer.bucket_action.len(), 1, "{answer:?}");
        match answer.bucket_action[0].bucket_action {
            Some(Act::QuotaAssignmentAction(a)) => {
                assert!(a.assignment_time_to_live.unwrap().seconds >= 1);
                a.rate_limit_strategy.unwrap().strategy.unwrap()
            }
            other => panic!("not an assignment: {other:?}"),
        }
    }
}
