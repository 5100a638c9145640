//! Helpers of `ratelimit_format`'s tests that both tiers use
//! (`tests/it/ratelimit_format.rs`, `tests/full/ratelimit_example.rs`).

use crate::Served;
use cellrate::limits::config::LimitTable;
use cellrate::server::Settings;
use cellrate::service::envoy::{EnvoyOptions, RatelimitCounting};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use std::path::Path;

pub const OK: i32 = Code::Ok as i32;

pub const OVER: i32 = Code::OverLimit as i32;

pub async fn served(dir: &Path, counting: RatelimitCounting) -> Served {
    let settings = Settings {
        envoy: EnvoyOptions {
            ratelimit_counting: counting,
            ..EnvoyOptions::default()
        },
        ..Settings::default()
    };
    let limits = LimitTable::load_dir(dir).expect("the directory loads");
    Served::with_settings(limits, settings).await
}

/// The status codes of `times` GETs of `path` with `headers`, through Envoy.
pub async fn statuses(
    client: &mut crate::http1::Http1,
    headers: &[(&str, &str)],
    path: &str,
    times: usize,
) -> Vec<u16> {
    let mut seen = Vec::new();
    for _ in 0..times {
        seen.push(client.get(path, headers).await.status);
    }
    seen
}
