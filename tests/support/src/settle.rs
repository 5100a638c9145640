//! Helpers of `settle`'s tests that both tiers use (`tests/it/settle.rs`,
//! `tests/full/settle_redis.rs`).

use crate::item;
use cellrate::proto::v1 as pb;
use std::time::Duration;
use tonic::Code;

pub fn code<T: std::fmt::Debug>(answer: Result<T, tonic::Status>) -> (Code, String) {
    let e = answer.expect_err("refused");
    (e.code(), e.message().to_string())
}

/// A client of a served process's decision listener.
pub async fn connect(addr: &str) -> Client {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    pb::rate_limiter_client::RateLimiterClient::new(channel)
}

/// Spends `cost` tokens of `tenant` under `request_id`.
pub async fn estimate(
    client: &mut Client,
    request_id: &str,
    tenant: &str,
    cost: u64,
) -> Result<pb::CheckResponse, tonic::Status> {
    Ok(client
        .check(pb::CheckRequest {
            items: vec![item("TokensPerTenant", tenant, Some(cost))],
            request_id: request_id.to_string(),
            ..Default::default()
        })
        .await?
        .into_inner())
}

/// 10 000 tokens a day per tenant, a plain limit (no overdraw: a settlement charges anyway).
pub fn limits() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("names.yaml"),
        "TokensPerTenant: {number: 100, format: string}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "TokensPerTenant: {burst: 10000, count: 10000, period: 1d}\n",
    )
    .unwrap();
    dir
}

pub async fn settle(
    client: &mut Client,
    request_id: &str,
    costs: &[u64],
) -> Result<pb::SettleResponse, tonic::Status> {
    Ok(client
        .settle(pb::SettleRequest {
            request_id: request_id.to_string(),
            costs: costs.to_vec(),
        })
        .await?
        .into_inner())
}

pub type Client = pb::rate_limiter_client::RateLimiterClient<tonic::transport::Channel>;
