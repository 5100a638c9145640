//! Helpers of `settle_attacks`'s tests that both tiers use (`tests/it/settle_attacks.rs`,
//! `tests/full/settle_attacks_redis.rs`).

use crate::settle::Client;
use cellrate::proto::v1 as pb;

/// A Check of one item; with a request id when `id` is not empty.
pub async fn check(client: &mut Client, id: &str, item: pb::Item) -> Result<bool, tonic::Status> {
    let answer = client
        .check(pb::CheckRequest {
            items: vec![item],
            request_id: id.to_string(),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(answer.overall.unwrap().allowed)
}

/// TokensPerTenant: 10 000 a month (no refill to speak of during a test); FivePerHour;
/// HourlyWindow: 100 per calendar hour.
pub fn limits() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("names.yaml"),
        "TokensPerTenant: {number: 100, format: string}\n\
         FivePerHour: {number: 101, format: string}\n\
         HourlyWindow: {number: 102, format: string}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "TokensPerTenant: {burst: 10000, count: 10000, period: 30d}\n\
         FivePerHour: {burst: 5, count: 5, period: 1h}\n\
         HourlyWindow: {window: calendar, count: 100, period: 1h}\n",
    )
    .unwrap();
    dir
}
