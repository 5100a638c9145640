//! Run as `ratelimit` with Envoy Gateway's environment (`USE_PROMETHEUS`, its statsd
//! mapping in `PROMETHEUS_MAPPER_YAML`), cellrate is scraped by a real Prometheus and the
//! queries of Envoy Gateway's Grafana dashboard for the global rate limit return the
//! series and values envoyproxy/ratelimit would give them.

use std::path::Path;

use crate::common::ratelimit_answers::{client, request, runtime, start};
use crate::observability::Prometheus;

/// Limits as Envoy Gateway writes them for an HTTPRoute rule (its translator's output):
/// the route's descriptor, then the rule's, in the domain of the listener.
const EG_LIMITS: &str = "
domain: default/eg/http
descriptors:
  - key: httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example
    value: httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        rate_limit: {unit: day, requests_per_unit: 3}
      - key: rule-1-match-0
        value: rule-1-match-0
        shadow_mode: true
        rate_limit: {unit: day, requests_per_unit: 1}
";

const ROUTE: &str = "httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example";

/// The panels' queries of Envoy Gateway's dashboard (charts/gateway-addons-helm/
/// dashboards/global-ratelimit.json at d32f2829), `$DefaultDomain` given its value there.
const DASHBOARD: [&str; 3] = [
    "ratelimit_service_rate_limit_total_hits{domain=\"default/eg/http\", key1=\"httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example_httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example\", key2=\"rule-0-match-0_rule-0-match-0\"}",
    "ratelimit_service_rate_limit_near_limit{domain=\"default/eg/http\", key1=\"httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example_httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example\", key2=\"rule-0-match-0_rule-0-match-0\"}",
    "ratelimit_service_rate_limit_over_limit{domain=\"default/eg/http\", key1=\"httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example_httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example\", key2=\"rule-0-match-0_rule-0-match-0\"}",
];

fn free_port() -> u16 {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_dashboard_queries_return_its_series_through_a_real_prometheus() {
    let root = runtime(&[("eg.yaml", EG_LIMITS)]);
    let mapper =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/envoy-gateway-statsd-mapping.yaml");
    let metrics = format!("127.0.0.1:{}", free_port());
    let (_child, listen) = start(
        root.path(),
        &[
            ("BACKEND_TYPE", "memory"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", metrics.as_str()),
            ("PROMETHEUS_MAPPER_YAML", mapper.to_str().unwrap()),
        ],
    );
    let mut c = client(&listen).await;
    let rule = |n: &'static str| [(ROUTE, ROUTE), (n, n)];
    for _ in 0..5 {
        let asked = request("default/eg/http", &[&rule("rule-0-match-0")]);
        c.should_rate_limit(asked).await.unwrap();
    }
    for _ in 0..3 {
        let asked = request("default/eg/http", &[&rule("rule-1-match-0")]);
        c.should_rate_limit(asked).await.unwrap();
    }
    let prometheus = tokio::task::block_in_place(|| Prometheus::start(&metrics));
    // Each panel's query: one series, with envoyproxy/ratelimit's counts (3 a day: 5 hits,
    // the third near the limit, two over).
    for (query, want) in DASHBOARD.iter().zip([5.0, 1.0, 2.0]) {
        let got = tokio::task::block_in_place(|| prometheus.value_when(query, |v| v == want));
        assert_eq!(got, Some(want), "{query}");
        let series = tokio::task::block_in_place(|| prometheus.query(query));
        assert_eq!(series.len(), 1, "{query}: {series:?}");
    }
    // The other two statistics the mapping names, and a shadow-mode rule's.
    let key1 = format!("{ROUTE}_{ROUTE}");
    for (stat, key2, want) in [
        ("within_limit", "rule-0-match-0_rule-0-match-0", 3.0),
        ("shadow_mode", "rule-1-match-0_rule-1-match-0", 2.0),
        ("total_hits", "rule-1-match-0_rule-1-match-0", 3.0),
    ] {
        let query = format!(
            "ratelimit_service_rate_limit_{stat}{{domain=\"default/eg/http\", key1={key1:?}, key2={key2:?}}}"
        );
        let got = tokio::task::block_in_place(|| prometheus.value_when(&query, |v| v == want));
        assert_eq!(got, Some(want), "{query}");
    }
    // cellrate's own series are still there, under the same key.
    let own = format!(
        "cellrate_ratelimit_hits_total{{key=\"default/eg/http.{key1}.rule-0-match-0_rule-0-match-0\",stat=\"over_limit\"}}"
    );
    let got = tokio::task::block_in_place(|| prometheus.value_when(&own, |v| v == 2.0));
    assert_eq!(got, Some(2.0), "{own}");
}
