//! The check-0, charge-later pattern measured through a real Envoy 1.40 (BENCHMARKS.md,
//! "Token budgets through Envoy Gateway's pattern"): Envoy Gateway's translation of a
//! token limit (a route's request-path entry with `hits_addend {number: 0}`, and the same
//! entry `apply_on_stream_done` with `hits_addend` the usage the backend reported), 64
//! streams of one tenant started at once against a 10 000-token hourly budget, each
//! using 1 000 tokens, then random costs up to 1 000. The backend answers after 300 ms
//! (Envoy's fault filter), so all 64 are in flight before any ends; it reports the cost
//! the client asked for (`x-cost`) in `x-usage-tokens`.
//!
//! Tokens admitted over the budget: the sum of the costs of the admitted streams, less
//! 10 000. Under envoyproxy/ratelimit's rule (what cellrate answers without
//! `--zero-check-holds`), every check of 0 passes while the window is not over; with holds
//! of a fixed estimate at the cap, none may be over; with a learned estimate, the first
//! streams of a bucket are held at a sixteenth of the budget, which bounds what they can
//! take over (BENCHMARKS.md).

use std::time::Duration;

use serde_yaml_ng::Value;

use crate::common::ai_gateway::grpc_cluster;
use crate::common::envoy::{admin, backend_cluster, validate, yaml, Envoy};
use crate::common::held::{held, limits, BUDGET, DOMAIN};
use crate::common::http1::Http1;
use crate::common::{harness_settings, poll_until, Served};
use cellrate::server::Settings;
use cellrate::service::envoy::Estimate;

const STREAMS: usize = 64;

/// Envoy Gateway's token limit on one route, where its translator writes it (the filter's
/// `RateLimitPerRoute`): tenant by `x-tenant`, checked at 0 hits, charged the backend's
/// `x-usage-tokens` at stream end.
fn config(rls: &str, dir: &std::path::Path) -> Value {
    let mut listener = yaml(
        r#"
name: ingress
address: {socket_address: {address: 127.0.0.1, port_value: 0}}
filter_chains:
  - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
              - name: gateway
                domains: ["*"]
                routes:
                  - match: {prefix: "/"}
                    route: {cluster: backend, timeout: 10s}
                    typed_per_filter_config:
                      envoy.filters.http.ratelimit:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                        domain: ai
                        rate_limits:
                          - actions: [{request_headers: {header_name: x-tenant, descriptor_key: tenant}}]
                            hits_addend: {number: 0}
                          - actions: [{request_headers: {header_name: x-tenant, descriptor_key: tenant}}]
                            apply_on_stream_done: true
                            hits_addend: {format: "%RESP(x-usage-tokens)%"}
          http_filters:
            - name: envoy.filters.http.ratelimit
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                domain: ai
                timeout: 1s
                rate_limit_service:
                  transport_api_version: V3
                  grpc_service: {envoy_grpc: {cluster_name: cellrate}}
            - name: envoy.filters.http.router
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#,
    );
    listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0]["typed_config"]
        ["domain"] = Value::from(DOMAIN);
    let mut backend = yaml(
        r#"
name: backend
filter_chains:
  - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: backend
          route_config:
            virtual_hosts:
              - name: backend
                domains: ["*"]
                routes:
                  - match: {prefix: "/"}
                    direct_response: {status: 500}
          http_filters:
            - name: envoy.filters.http.fault
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault
                delay:
                  fixed_delay: 0.3s
                  percentage: {numerator: 100, denominator: HUNDRED}
            - name: envoy.filters.http.lua
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
                default_source_code:
                  inline_string: |
                    function envoy_on_request(h)
                      local cost = h:headers():get("x-cost") or "0"
                      h:respond({[":status"] = "200", ["x-usage-tokens"] = cost}, "ok")
                    end
            - name: envoy.filters.http.router
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#,
    );
    let socket = dir.join("backend.sock");
    let mut pipe = yaml("{pipe: {}}");
    pipe["pipe"]["path"] = Value::from(socket.to_str().unwrap());
    backend["address"] = pipe;
    let mut config = yaml("{static_resources: {listeners: [], clusters: []}}");
    config["static_resources"]["listeners"] = Value::Sequence(vec![listener, backend]);
    config["static_resources"]["clusters"] = Value::Sequence(vec![
        grpc_cluster("cellrate", rls),
        backend_cluster("backend", &socket),
    ]);
    config["admin"] = admin();
    config
}

/// One request of `tenant` costing `cost` tokens: whether it was admitted.
async fn request(envoy: std::net::SocketAddr, tenant: String, cost: u64) -> bool {
    let mut client = Http1::connect(envoy).await;
    let cost = cost.to_string();
    let reply = client
        .get(
            "/",
            &[("x-tenant", tenant.as_str()), ("x-cost", cost.as_str())],
        )
        .await;
    assert!(
        [200, 429].contains(&reply.status),
        "{} {}",
        reply.status,
        reply.body
    );
    reply.status == 200
}

/// Costs up to 1 000 (a fixed sequence: the same in every run).
fn random_costs(n: usize) -> Vec<u64> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + x % 1_000
        })
        .collect()
}

/// `costs` started at once by one tenant through Envoy: the tokens admitted (the sum of
/// the admitted streams' costs), once every stream end reached the ratelimit.
async fn wave(s: &Envoy, tenant: &str, costs: &[u64]) -> (usize, u64) {
    let before = s.counter("cluster.cellrate.upstream_rq_completed").await;
    let tasks: Vec<_> = (costs.iter())
        .map(|&cost| tokio::spawn(request(s.ingress, tenant.to_string(), cost)))
        .collect();
    let mut admitted = (0, 0);
    for (task, &cost) in tasks.into_iter().zip(costs) {
        if task.await.unwrap() {
            admitted.0 += 1;
            admitted.1 += cost;
        }
    }
    // Every check answered, and every admitted stream's end.
    let expected = before + (costs.len() + admitted.0) as u64;
    let seen = poll_until(
        Duration::from_secs(10),
        async || s.counter("cluster.cellrate.upstream_rq_completed").await,
        |&n| n >= expected,
    )
    .await;
    assert!(seen >= expected, "{seen} calls, {expected} expected");
    admitted
}

/// Runs the waves through Envoy in front of a server with `settings`: per wave, the
/// streams admitted and the tokens over the budget.
async fn measured(settings: Settings) -> Vec<(usize, i64)> {
    let s = Served::with_settings(limits(), settings).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(&s.decisions_addr.to_string(), dir.path());
    validate(&config).expect("Envoy accepts the configuration");
    let envoy = Envoy::start(config, dir).await;
    let mut out = Vec::new();
    let waves = [vec![1_000; STREAMS], random_costs(STREAMS)];
    for (i, costs) in waves.iter().enumerate() {
        let (n, tokens) = wave(&envoy, &format!("tenant-{i}"), costs).await;
        out.push((n, tokens as i64 - i64::from(BUDGET)));
    }
    let failed = envoy.counter("cluster.cellrate.ratelimit.error").await;
    assert_eq!(
        failed, 0,
        "no call to the ratelimit failed (Envoy fails open)"
    );
    drop(envoy);
    s.stop().await;
    out
}

#[tokio::test]
async fn holds_keep_envoy_gateways_token_limit_within_its_budget() {
    let upstream_rule = measured(harness_settings()).await;
    let hold = Duration::from_secs(600);
    let fixed = measured(held(harness_settings(), Estimate::Fixed(1_000), hold)).await;
    let learned = measured(held(harness_settings(), Estimate::Learned, hold)).await;
    for (rule, waves) in [
        ("upstream's rule", &upstream_rule),
        ("holds, e = 1 000", &fixed),
        ("holds, learned e", &learned),
    ] {
        for ((admitted, over), wave) in waves.iter().zip(["1 000 each", "random <= 1 000"]) {
            eprintln!("{rule:18} {wave:16} admitted {admitted:2} of {STREAMS}, over by {over}");
        }
    }
    assert_eq!(upstream_rule[0], (STREAMS, 54_000), "every stream admitted");
    for &(admitted, over) in &fixed {
        assert!(
            over <= 0,
            "a fixed estimate at the cap: never over ({admitted}, {over})"
        );
    }
    assert_eq!(fixed[0], (10, 0), "exactly the budget");
    // Learned: held at a sixteenth (625) before any charge, so at most 16 streams, each
    // at most 1 000 - 625 over.
    for &(admitted, over) in &learned {
        assert!(admitted <= 16 && over <= 16 * 375, "({admitted}, {over})");
    }
}
