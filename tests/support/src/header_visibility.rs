//! The limits and server of the header-visibility tests, in both tiers.

use cellrate::limits::config::LimitTable;
use cellrate::server::Settings;
use cellrate::service::envoy::{EnvoyOptions, HeaderStyle};

use crate::Served;

/// An abuse guard (3 a minute, hidden; key `banned` on its deny list), the API's request
/// limits (10 a second, 10 000 a day) and its token budget (1 000 a minute, `measures:
/// tokens`).
pub fn limits() -> LimitTable {
    let files = [
        (
            "names.yaml",
            "
ApiRequestsPerKey: {number: 100, format: string}
ApiRequestsPerKeyDaily: {number: 101, format: string}
AbuseGuardPerKey: {number: 102, format: string}
TokensPerKey: {number: 103, format: string}
",
        ),
        (
            "defaults.yaml",
            "
AbuseGuardPerKey: {burst: 3, count: 3, period: 1m, headers: hidden}
ApiRequestsPerKey: {burst: 10, count: 10, period: 1s}
ApiRequestsPerKeyDaily: {burst: 10000, count: 10000, period: 1d, headers: visible}
TokensPerKey: {burst: 1000, count: 1000, period: 1m, measures: tokens}
",
        ),
        (
            "overrides.yaml",
            "- AbuseGuardPerKey: {deny: true, ids: [banned]}",
        ),
    ];
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    LimitTable::from_files(&files).unwrap()
}

pub async fn served(headers: HeaderStyle) -> Served {
    let settings = Settings {
        envoy: EnvoyOptions {
            headers,
            ..EnvoyOptions::default()
        },
        ..Settings::default()
    };
    Served::with_settings(limits(), settings).await
}
