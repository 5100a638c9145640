//! Per-limit header visibility and OpenAI's header style (#51) through a real Envoy 1.40
//! in front of a backend: a hidden limit's 429 says nothing of it, visible limits show as
//! OpenAI's `x-ratelimit-*` fields (the fast tier shows the answers themselves).

use cellrate::service::envoy::HeaderStyle;
use serde_yaml_ng::Value;

use crate::common::envoy::{rate_limit_filter, yaml, Envoy};
use crate::common::header_visibility::served;
use crate::common::http1::Reply;

/// Route `/login` asks for the hidden guard alone, `/v1/` for the visible limits (50
/// tokens a request: Envoy honours `hits_addend` only in the filter's per-route config),
/// both by the client's `x-api-key`; Envoy's own draft-03 headers are on too, so that a
/// status that named the guard would show.
fn openai_routes(config: &mut Value) {
    let routes = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
        .as_sequence_mut()
        .unwrap();
    let by_key = |limit: &str| {
        format!(
            "{{actions: [{{request_headers: {{header_name: x-api-key, descriptor_key: {limit}}}}}]"
        )
    };
    let login = format!(
        "{{match: {{prefix: /login}}, route: {{cluster: backend, rate_limits: [{}}}]}}}}",
        by_key("AbuseGuardPerKey")
    );
    let api = format!(
        r#"{{match: {{prefix: /v1/}}, route: {{cluster: backend}}, typed_per_filter_config:
            {{envoy.filters.http.ratelimit: {{"@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute,
            rate_limits: [{}}}, {}}}, {}, hits_addend: {{number: 50}}}}]}}}}}}"#,
        by_key("ApiRequestsPerKey"),
        by_key("ApiRequestsPerKeyDaily"),
        by_key("TokensPerKey"),
    );
    routes.insert(0, yaml(&login));
    routes.insert(0, yaml(&api));
    rate_limit_filter(config).insert(
        Value::from("enable_x_ratelimit_headers"),
        Value::from("DRAFT_VERSION_03"),
    );
}

/// Every header of `reply` whose name or value speaks of rate limits.
fn rate_limit_fields(reply: &Reply) -> Vec<&(String, String)> {
    reply
        .headers
        .iter()
        .filter(|(k, v)| {
            k.contains("ratelimit") && k != "x-envoy-ratelimited"
                || k.starts_with("retry-after")
                || v.contains("AbuseGuard")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_shows_a_hidden_denial_bare_and_visible_limits_as_openai_does() {
    let s = served(HeaderStyle::Openai).await;
    let envoy = Envoy::example(s.decisions_addr, openai_routes).await;
    let mut client = envoy.client().await;
    let login = ("x-api-key", "attacker");
    for n in 0..3 {
        let reply = client.get("/login", &[login]).await;
        assert_eq!(reply.status, 200, "login {n}: {reply:?}");
        assert_eq!(rate_limit_fields(&reply), Vec::<&(String, String)>::new());
    }
    let denied = client.get("/login", &[login]).await;
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(
        rate_limit_fields(&denied),
        Vec::<&(String, String)>::new(),
        "the hidden guard's 429 says nothing of it: {denied:?}"
    );

    // The API: OpenAI's six fields, parsed as a client parses them.
    let api = ("x-api-key", "customer");
    let reply = client.get("/v1/chat", &[api]).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let number = |r: &Reply, name: &str| -> u64 {
        r.header(name)
            .unwrap_or_else(|| panic!("{name} missing: {r:?}"))
            .parse()
            .unwrap()
    };
    assert_eq!(number(&reply, "x-ratelimit-limit-requests"), 10);
    assert_eq!(number(&reply, "x-ratelimit-remaining-requests"), 9);
    assert_eq!(reply.header("x-ratelimit-reset-requests"), Some("100ms"));
    assert_eq!(number(&reply, "x-ratelimit-limit-tokens"), 1000);
    assert_eq!(number(&reply, "x-ratelimit-remaining-tokens"), 950);
    assert_eq!(reply.header("x-ratelimit-reset-tokens"), Some("3s"));
    for n in 0..9 {
        let r = client.get("/v1/chat", &[api]).await;
        assert_eq!(r.status, 200, "request {n}: {r:?}");
    }
    let denied = client.get("/v1/chat", &[api]).await;
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(number(&denied, "x-ratelimit-remaining-requests"), 0);
    assert_eq!(number(&denied, "x-ratelimit-remaining-tokens"), 500);
    assert_eq!(denied.header("x-ratelimit-reset-tokens"), Some("30s"));
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(denied.header("retry-after-ms"), Some("100"));
    drop(envoy);
    s.stop().await;
}
