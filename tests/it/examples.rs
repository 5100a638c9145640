//! The example Envoy and Istio configs send descriptors that cellrate's example config
//! maps to the intended limits: their `rate_limits` actions are turned into descriptors
//! (as Envoy would build them) and sent to a served cellrate.

use crate::common::Served;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde_yaml_ng::Value;

/// Header values a client would send, by header name.
fn header_value(name: &str) -> &'static str {
    match name {
        "x-api-key" => "key-example",
        "x-account-id" => "12345678",
        "x-tenant" => "acme",
        "x-request-id" => "6f1c0b2e-52a4-4d8e-9c1a-0f4b7d3e2a91",
        other => panic!("no sample value for header {other}"),
    }
}

/// The descriptor Envoy builds from one `rate_limits` entry's actions.
fn descriptor_of_actions(actions: &Value) -> RateLimitDescriptor {
    let entries = actions
        .as_sequence()
        .expect("actions is a list")
        .iter()
        .map(|action| {
            if let Some(g) = action.get("generic_key") {
                let key = g
                    .get("descriptor_key")
                    .and_then(Value::as_str)
                    .unwrap_or("generic_key");
                (
                    key.to_string(),
                    g["descriptor_value"].as_str().unwrap().to_string(),
                )
            } else if action.get("remote_address").is_some() {
                ("remote_address".to_string(), "192.0.2.10".to_string())
            } else if let Some(h) = action.get("request_headers") {
                let name = h["header_name"].as_str().unwrap();
                (
                    h["descriptor_key"].as_str().unwrap().to_string(),
                    header_value(name).to_string(),
                )
            } else {
                panic!("action not covered by this test: {action:?}")
            }
        })
        .map(|(key, value)| Entry { key, value })
        .collect();
    RateLimitDescriptor {
        entries,
        ..Default::default()
    }
}

/// Every `rate_limits` list anywhere under `value`.
fn rate_limits(value: &Value, found: &mut Vec<Value>) {
    match value {
        Value::Mapping(map) => {
            for (k, v) in map {
                if k.as_str() == Some("rate_limits") {
                    found.extend(v.as_sequence().unwrap().iter().cloned());
                } else {
                    rate_limits(v, found);
                }
            }
        }
        Value::Sequence(list) => list.iter().for_each(|v| rate_limits(v, found)),
        _ => {}
    }
}

/// Every `domain:` of a ratelimit filter under `value`.
fn domains(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Mapping(map) => {
            if map
                .get("@type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with("http.ratelimit.v3.RateLimit"))
            {
                found.push(map["domain"].as_str().unwrap().to_string());
            }
            map.values().for_each(|v| domains(v, found));
        }
        Value::Sequence(list) => list.iter().for_each(|v| domains(v, found)),
        _ => {}
    }
}

async fn check_file(path: &str, expected: &[&str]) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut limits = Vec::new();
    let mut domain_names = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value = serde::Deserialize::deserialize(document).unwrap();
        rate_limits(&value, &mut limits);
        domains(&value, &mut domain_names);
    }
    assert_eq!(
        domain_names,
        vec!["edge"],
        "{path}: one ratelimit filter, domain edge"
    );
    let mut s = Served::start(None).await;
    let mut names = Vec::new();
    for entry in &limits {
        let request = RateLimitRequest {
            domain: domain_names[0].clone(),
            descriptors: vec![descriptor_of_actions(&entry["actions"])],
            hits_addend: 0,
        };
        let r = s
            .envoy
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
        let limit = r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap_or_else(|| panic!("{path}: {entry:?} maps to no limit"));
        names.push(limit.name.clone());
    }
    names.sort();
    assert_eq!(names, expected, "{path}");
    s.stop().await;
}

#[tokio::test]
async fn envoy_example_descriptors_map_to_configured_limits() {
    check_file(
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/envoy/envoy.yaml"),
        &[
            "ApiRequestsPerKey",
            "NewOrdersPerAccount",
            "NewRegistrationsPerIPAddress",
        ],
    )
    .await;
}

#[tokio::test]
async fn istio_example_descriptors_map_to_configured_limits() {
    check_file(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/istio/ratelimit-envoyfilter.yaml"
        ),
        &[
            "ApiRequestsPerKey",
            "NewOrdersPerAccount",
            "NewRegistrationsPerIPAddress",
        ],
    )
    .await;
}

/// `examples/<dir>/`: the `rate_limits` entries of its `envoy.yaml` (whose filter's one
/// domain must be `domain`), and its limits served.
async fn served_example(dir: &str, domain: &str) -> (Vec<Value>, Served) {
    use cellrate::limits::config::LimitTable;
    let root = format!("{}/examples/{dir}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(format!("{root}/envoy.yaml")).unwrap();
    let config: Value = serde_yaml_ng::from_str(&text).unwrap();
    let (mut limits, mut domain_names) = (Vec::new(), Vec::new());
    rate_limits(&config, &mut limits);
    domains(&config, &mut domain_names);
    assert_eq!(domain_names, [domain]);
    let table = LimitTable::load_dir(std::path::Path::new(&format!("{root}/limits"))).unwrap();
    (limits, Served::with_limits(table).await)
}

/// Sends `d`, made from the example's `rate_limits` entry `entry`, as Envoy would and
/// asserts OK; a stream-done entry must give its hits with `is_negative_hits`.
async fn answers_ok(s: &mut Served, domain: &str, entry: &Value, d: RateLimitDescriptor) {
    let stream_done = entry["apply_on_stream_done"].as_bool().unwrap_or(false);
    assert_eq!(d.is_negative_hits, stream_done, "{entry:?}");
    let r = s
        .envoy
        .should_rate_limit(RateLimitRequest {
            domain: domain.to_string(),
            descriptors: vec![d],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32, "{entry:?}");
}

/// `examples/concurrency/`: the request-path entry acquires a lease of the tenant's slots
/// under the request id, the `apply_on_stream_done` entry (its `hits_addend` with
/// `is_negative_hits`) releases it.
#[tokio::test]
async fn concurrency_example_acquires_and_releases_one_lease() {
    let (limits, mut s) = served_example("concurrency", "inflight").await;
    let mut remaining = Vec::new();
    for entry in &limits {
        let mut d = descriptor_of_actions(&entry["actions"]);
        if let Some(hits) = entry.get("hits_addend") {
            d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value {
                value: hits["number"].as_u64().unwrap(),
            });
            d.is_negative_hits = hits["is_negative_hits"].as_bool().unwrap_or(false);
        }
        answers_ok(&mut s, "inflight", entry, d).await;
        remaining.push(crate::common::remaining(&mut s, "InFlightPerTenant", "acme").await);
    }
    assert_eq!(remaining, [7, 8], "one slot taken, then given back");
    s.stop().await;
}

/// `examples/reservations/`: the request-path entry holds the estimate (its format reads
/// `x-max-tokens`) of the tenant's tokens under the request id; the
/// `apply_on_stream_done` entry (its format reads the model's `x-usage-tokens`, with
/// `is_negative_hits`) settles the hold to the actual cost.
#[tokio::test]
async fn reservations_example_holds_and_settles_one_request() {
    let (limits, mut s) = served_example("reservations", "tokens").await;
    let mut remaining = Vec::new();
    for entry in &limits {
        let mut d = descriptor_of_actions(&entry["actions"]);
        let hits = &entry["hits_addend"];
        // What Envoy reads for these formats: the request's cap, the model's usage.
        let value = match hits["format"].as_str().unwrap() {
            "%REQ(x-max-tokens)%" => 2_000,
            "%RESP(x-usage-tokens)%" => 700,
            other => panic!("a format this test does not know: {other}"),
        };
        d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value });
        d.is_negative_hits = hits["is_negative_hits"].as_bool().unwrap_or(false);
        answers_ok(&mut s, "tokens", entry, d).await;
        remaining.push(crate::common::remaining(&mut s, "TokensPerTenant", "acme").await);
    }
    assert_eq!(
        remaining,
        [1_000_000 - 2_000, 1_000_000 - 700],
        "the estimate held, then settled to the actual cost"
    );
    s.stop().await;
}

/// The token examples' budgets say they count tokens (`measures: tokens`): an
/// OpenAI-style answer shows them in `x-ratelimit-*-tokens`, not as a limit of 1 000 000
/// requests; the request rates stay requests.
#[test]
fn the_token_examples_budgets_measure_tokens() {
    use cellrate::limits::config::{LimitTable, Measures};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (dir, budget, rate) in [
        (
            "examples/budgets/limits",
            "TokensPerTenant",
            Some("RequestsPerTenant"),
        ),
        ("examples/reservations/limits", "TokensPerTenant", None),
    ] {
        let table = LimitTable::load_dir(&root.join(dir)).unwrap();
        let measures = |name: &str| {
            let name = table.names().get(name).unwrap();
            let policy = table.policy(name, "acme").unwrap();
            policy.behaviour().headers.measures
        };
        assert_eq!(measures(budget), Measures::Tokens, "{dir}");
        if let Some(rate) = rate {
            assert_eq!(measures(rate), Measures::Requests, "{dir}");
        }
    }
}
