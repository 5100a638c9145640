//! Helpers of the reservations tests that both tiers use (`tests/it/reservations.rs`,
//! `tests/full/reservations_redis.rs`).

use std::time::Duration;

/// Budgets of 10 000 tokens that do not refill within a test (1 token per 8 hours), so
/// that a balance is exact to the token:
/// - `Released`: holds 10 min, an unsettled estimate is given back; one hold at most a
///   quarter of the burst;
/// - `Kept`: holds 10 min, an unsettled estimate stands;
/// - `Plain`: no reservation block (today's behaviour: kept --settle-window, stands).
pub fn limits() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("names.yaml"),
        "Released: {number: 100, format: string}\n\
         Kept: {number: 101, format: string}\n\
         Plain: {number: 102, format: string}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "Released: {burst: 10000, count: 1, period: 8h, \
           reservation: {hold: 10m, unsettled: release, max_share: 0.25}}\n\
         Kept: {burst: 10000, count: 1, period: 8h, \
           reservation: {hold: 10m, unsettled: keep}}\n\
         Plain: {burst: 10000, count: 1, period: 8h}\n",
    )
    .unwrap();
    dir
}

/// `cellrate_holds_total{event}` in a `/metrics` page (0 when absent).
pub fn holds(metrics: &str, event: &str) -> f64 {
    crate::sample(
        metrics,
        &format!("cellrate_holds_total{{event=\"{event}\"}}"),
    )
    .unwrap_or(0.0)
}

/// Polls `probe` every 10 ms, at most 5 s, until it returns `Some`.
pub async fn eventually<T, F: AsyncFnMut() -> Option<T>>(what: &str, mut probe: F) -> T {
    for _ in 0..500 {
        if let Some(found) = probe().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 5 s");
}

/// A native `Check` of `cost` of `name`'s bucket of `tenant` under `request_id`: whether
/// it was allowed (an error as it came).
pub async fn hold(
    s: &mut super::Served,
    request_id: &str,
    name: &str,
    tenant: &str,
    cost: u64,
) -> Result<bool, tonic::Status> {
    let answer = s
        .decisions
        .check(cellrate::proto::v1::CheckRequest {
            items: vec![super::item(name, tenant, Some(cost))],
            request_id: request_id.to_string(),
            ..Default::default()
        })
        .await?;
    Ok(answer.into_inner().overall.unwrap().allowed)
}
