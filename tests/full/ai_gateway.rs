//! Envoy AI Gateway's own e2e rate-limit tests (envoyproxy/ai-gateway `tests/e2e/`, commit
//! c217da8), re-expressed through a real Envoy 1.40: `Test_DynamicMetadataRateLimit` (every
//! case), `Test_Examples_TokenRateLimit` (every status code) and
//! `Test_Examples_BackendQuotaRateLimit` (the QuotaPolicy path). cellrate runs as
//! `ratelimit`, with upstream's variables as their deployments set them, on Redis, fed its
//! limits over xDS (state of the world) by a control plane of the test's own serving what
//! Envoy Gateway's and AI Gateway's translators write; Envoy carries their route entries
//! and filters, Lua filters standing in for the ext_authz server and AI Gateway's ext_proc
//! (`common::ai_gateway`). docs/ai-gateway-suite.md lists each case and its status.
//!
//! Each request waits, before the next, until Envoy has both of its calls to the ratelimit
//! answered (the check at request time and the charge at stream done, which Envoy makes
//! after the client has its response): their tests race that charge against the next
//! request; here the order is theirs every time.

use std::time::Duration;

use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use serde_yaml_ng::Value;

use crate::common::ads::Ads;
use crate::common::ai_gateway::{
    chat_request, completion, ext_authz_filter, grpc_cluster, Envoy as Config, Gateway, Quota,
    Rule, Tiers, QUOTA_NODE, RESPONSE_BODY,
};
use crate::common::envoy::{validate, Envoy};
use crate::common::http1::{Http1, Reply};
use crate::common::poll_until;
use crate::common::ratelimit_answers::{runtime, start_serving_with, unix_seconds, Serving};
use crate::common::redis_server::RedisServer;

/// A gateway as their e2e deploys it: Envoy, one `ratelimit` and its control plane, Redis.
struct Deployed {
    envoy: Envoy,
    cluster: &'static str,
    ratelimit: Serving,
    redis: RedisServer,
    _ads: Ads,
    _root: tempfile::TempDir,
}

/// Serves `config` over xDS to a `ratelimit` started as node `node` with `args` and `vars`
/// (besides the control plane's address and Redis), then starts Envoy on `envoy` with the ratelimit's cluster
/// `cluster`.
async fn deploy(
    config: RateLimitConfig,
    node: &str,
    args: &[&str],
    vars: &[(&str, &str)],
    cluster: &'static str,
    envoy: impl FnOnce(Value) -> Config<'static>,
) -> Deployed {
    clear_of_an_hour_end();
    let redis = RedisServer::start();
    let ads = Ads::start().await;
    ads.set_configs("1", &[config]);
    let root = runtime(&[]);
    let (server, url) = (ads.addr.to_string(), format!("127.0.0.1:{}", redis.port));
    let mut all = vec![
        ("BACKEND_TYPE", "redis"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", url.as_str()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_NODE_ID", node),
        ("CONFIG_GRPC_XDS_SERVER_URL", server.as_str()),
    ];
    all.extend_from_slice(vars);
    let ratelimit = start_serving_with(root.path(), args, &all);
    let dir = tempfile::tempdir().unwrap();
    let config = envoy(grpc_cluster(cluster, &ratelimit.listen)).config(dir.path());
    if let Err(e) = validate(&config) {
        panic!("Envoy 1.40 refuses the gateway's configuration: {e}");
    }
    let envoy = Envoy::start(config, dir).await;
    Deployed {
        envoy,
        cluster,
        ratelimit,
        redis,
        _ads: ads,
        _root: root,
    }
}

/// Waits, when fewer than 10 seconds are left in the current hour, for the next one: the
/// budgets are hourly windows, and a test (about a second) must not straddle their end.
fn clear_of_an_hour_end() {
    let left = 3_600 - unix_seconds() % 3_600;
    if left < 10 {
        std::thread::sleep(Duration::from_millis(left as u64 * 1_000 + 200));
    }
}

impl Deployed {
    /// Calls to the ratelimit Envoy has had answered (each ShouldRateLimit).
    async fn answered(&self) -> u64 {
        let name = format!("cluster.{}.upstream_rq_completed", self.cluster);
        self.envoy.counter(&name).await
    }

    /// One request as their `makeRequest` sends it: `PUT /v1/chat/completions` to
    /// `Host: openai.com` with `headers`, the backend to answer `body`. Returns the answer
    /// once its calls are answered: the check, and for an admitted request the charge.
    async fn request(
        &self,
        client: &mut Http1,
        model: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        let before = self.answered().await;
        let mut all = vec![("host", "openai.com"), (RESPONSE_BODY, body)];
        all.extend_from_slice(headers);
        let reply = client
            .send("PUT", "/v1/chat/completions", &all, &chat_request(model))
            .await;
        let calls = if reply.status == 200 { 2 } else { 1 };
        let answered = poll_until(
            Duration::from_secs(10),
            async || self.answered().await,
            |&n| n >= before + calls,
        )
        .await;
        assert!(
            answered >= before + calls,
            "{calls} calls to the ratelimit expected after {reply:?}; {} seen",
            answered - before
        );
        reply
    }

    /// Upstream's `total_hits` statistic of `key`, from the ratelimit's metrics.
    async fn total_hits(&self, key: &str) -> u64 {
        let addr = self.ratelimit.metrics.parse().expect("a metrics listener");
        let (code, text) = crate::common::http_get_async(addr, "/metrics").await;
        assert_eq!(code, 200);
        let series = format!("cellrate_ratelimit_hits_total{{key=\"{key}\",stat=\"total_hits\"}} ");
        let line = text.lines().find_map(|l| l.strip_prefix(series.as_str()));
        line.unwrap_or_else(|| panic!("no {series}in {text}"))
            .parse()
            .unwrap()
    }

    /// Envoy's rate-limit filter never failed open: no error, nothing let through on one.
    async fn assert_no_errors(&self) {
        let counters = self.envoy.counters("ratelimit").await;
        let failed: Vec<_> = counters
            .iter()
            .filter(|(name, &n)| {
                (name.ends_with(".error") || name.contains("failure_mode")) && n > 0
            })
            .collect();
        assert!(failed.is_empty(), "the ratelimit failed: {failed:?}");
    }
}

const DYNAMIC_MODEL: &str = "dynamic-ratelimit-model";

/// `tests/e2e/testdata/dynamic_metadata_ratelimit.yaml`'s BackendTrafficPolicy: input,
/// output and total budgets per `x-tenant-id`, 100, 100 and 4 an hour unless ext_authz
/// says otherwise.
fn dynamic_gateway() -> Gateway {
    let rule = |requests, limit_key, cost_key| Rule {
        requests,
        limit_key: Some(limit_key),
        cost_key,
    };
    Gateway {
        name: "envoy-ai-gateway-dynamic-ratelimit",
        route: "envoy-ai-gateway-dynamic-ratelimit",
        model: DYNAMIC_MODEL,
        rules: vec![
            rule(100, "input_limit", "llm_input_token"),
            rule(100, "output_limit", "llm_output_token"),
            rule(4, "total_limit", "llm_total_token"),
        ],
    }
}

/// The ext-auth server's `EXT_AUTH_DYNAMIC_METADATA_BY_HEADER`, in its order.
const TIERS: Tiers<'static> = &[
    ("premium", &[("total_limit", 6)]),
    ("basic", &[("total_limit", 2)]),
    ("suspended", &[("total_limit", 0)]),
    (
        "tri-input",
        &[
            ("input_limit", 6),
            ("output_limit", 100),
            ("total_limit", 100),
        ],
    ),
    (
        "tri-output",
        &[
            ("input_limit", 100),
            ("output_limit", 3),
            ("total_limit", 100),
        ],
    ),
    (
        "tri-total",
        &[
            ("input_limit", 100),
            ("output_limit", 100),
            ("total_limit", 12),
        ],
    ),
];

/// Starts a gateway of `gateway`'s BackendTrafficPolicy, with the ext_authz stand-in when
/// `tiers` is given, its ratelimit Envoy Gateway's (`envoy-ratelimit`).
async fn deploy_gateway(gateway: &Gateway, tiers: Option<Tiers<'_>>) -> Deployed {
    let per_route = gateway.route_rate_limits();
    let filter = gateway.rate_limit_filter();
    let listener = gateway.listener();
    let model = gateway.model;
    let ext_authz = tiers.map(ext_authz_filter);
    deploy(
        gateway.service_config(),
        "envoy-ratelimit",
        &[],
        &[],
        "ratelimit_cluster",
        |cluster| Config {
            listener,
            model,
            backend: "testupstream",
            ext_authz,
            rate_limit_filters: vec![filter],
            per_route,
            clusters: vec![cluster],
        },
    )
    .await
}

/// Usage of a call: prompt, completion and total tokens.
type Usage = (u64, u64, u64);
/// `evenUsage` and `lopsidedUsage` of the test.
const EVEN: Usage = (1, 1, 2);
const LOPSIDED: Usage = (3, 1, 4);

/// The statuses of `n` calls of tenant `id` on `tier` with `usage`.
async fn statuses(d: &Deployed, id: &str, tier: &str, usage: Usage, n: usize) -> Vec<u16> {
    let mut client = d.envoy.client().await;
    let body = completion(usage.0, usage.1, usage.2, None);
    let mut seen = Vec::new();
    for _ in 0..n {
        let headers = [("x-tenant-id", id), ("x-tenant-tier", tier)];
        seen.push(
            d.request(&mut client, DYNAMIC_MODEL, &headers, &body)
                .await
                .status,
        );
    }
    seen
}

/// `n` times 200, then one 429.
fn admitted_then_denied(n: usize) -> Vec<u16> {
    let mut expected = vec![200; n];
    expected.push(429);
    expected
}

/// `Test_DynamicMetadataRateLimit`: per-tenant budgets from ext_authz's metadata
/// (`limit.fromMetadata`), charged the response's tokens at stream done, a request-time
/// cost of 0, so a budget N against a cost C allows N/C + 1 calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_dynamic_metadata_rate_limit() {
    let d = deploy_gateway(&dynamic_gateway(), Some(TIERS)).await;
    // The readiness gate's condition: a fresh "basic" tenant is allowed 2 of at most 4.
    let gate = statuses(&d, "probe-101", "basic", EVEN, 3).await;
    assert_eq!(gate, [200, 200, 429], "the readiness gate: basic allowed 2");

    let cases: &[(&str, &str, &str, Usage, usize)] = &[
        (
            "premium tier gets its 6 token budget from metadata",
            "0",
            "premium",
            EVEN,
            4,
        ),
        (
            "basic tier gets its smaller 2 token budget from metadata",
            "1",
            "basic",
            EVEN,
            2,
        ),
        (
            "unknown tier falls back to the static budget",
            "2",
            "unknown",
            EVEN,
            3,
        ),
        (
            "a 0 budget denies from the second call",
            "3",
            "suspended",
            EVEN,
            1,
        ),
        (
            "separate input, output and total budgets/tri-input",
            "10",
            "tri-input",
            LOPSIDED,
            3,
        ),
        (
            "separate input, output and total budgets/tri-output",
            "11",
            "tri-output",
            LOPSIDED,
            4,
        ),
        (
            "separate input, output and total budgets/tri-total",
            "12",
            "tri-total",
            LOPSIDED,
            4,
        ),
    ];
    for &(name, id, tier, usage, allowed) in cases {
        let expected = admitted_then_denied(allowed);
        let seen = statuses(&d, id, tier, usage, expected.len()).await;
        assert_eq!(seen, expected, "{name}");
    }
    d.assert_no_errors().await;
}

/// Not one of their cases: a tenant whose tier changes within the hour keeps what its
/// window counted, as upstream's counter (keyed by descriptor and window, never by the
/// limit) does. Charged 10 tokens on basic's 2, then sent as premium (6): 10 > 6, a 429,
/// where a window of its own per budget (or one that kept at most twice 2) admitted it.
/// Charged 2 twice on basic (4, then over), premium admits two more (at 4 and 6, as
/// their premium case admits at 0, 2, 4 and 6), then denies, where a fresh window
/// admitted four.
/// Suspended (0) and charged 2, basic (2) then admits one and denies the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_dynamic_metadata_a_tier_changed_within_the_hour() {
    let d = deploy_gateway(&dynamic_gateway(), Some(TIERS)).await;
    let heavy: Usage = (5, 5, 10);
    let cases: &[(&str, &str, Usage, &[u16])] = &[
        ("20", "basic", heavy, &[200, 429]),
        ("20", "premium", EVEN, &[429]),
        ("21", "basic", EVEN, &[200, 200, 429]),
        ("21", "premium", EVEN, &[200, 200, 429]),
        ("22", "suspended", EVEN, &[200, 429]),
        ("22", "basic", EVEN, &[200, 429]),
    ];
    for &(id, tier, usage, expected) in cases {
        let seen = statuses(&d, id, tier, usage, expected.len()).await;
        assert_eq!(seen, expected, "tenant {id} as {tier}");
    }
    d.assert_no_errors().await;
}

const TOKEN_MODEL: &str = "rate-limit-funky-model";

/// `examples/token_ratelimit/token_ratelimit.yaml`'s BackendTrafficPolicy: per
/// `x-tenant-id`, 10 input, 100 output, 1 000 total, 100 cached input and 1 000 CEL tokens
/// an hour, static.
fn token_gateway() -> Gateway {
    let rule = |requests, cost_key| Rule {
        requests,
        limit_key: None,
        cost_key,
    };
    Gateway {
        name: "envoy-ai-gateway-token-ratelimit",
        route: "envoy-ai-gateway-token-ratelimit",
        model: TOKEN_MODEL,
        rules: vec![
            rule(10, "llm_input_token"),
            rule(100, "llm_output_token"),
            rule(1000, "llm_total_token"),
            rule(100, "llm_cached_input_token"),
            rule(1000, "llm_cel_calculated_token"),
        ],
    }
}

/// `Test_Examples_TokenRateLimit`: every `makeRequest`, its user, usage (input, output,
/// total, cached input) and expected status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_examples_token_rate_limit() {
    let d = deploy_gateway(&token_gateway(), None).await;
    type Call = (u64, u64, u64, Option<u64>, u16);
    let blocks: &[(&str, &[Call])] = &[
        (
            "input limit",
            &[(10000, 0, 0, None, 200), (0, 0, 0, None, 429)],
        ),
        (
            "output limit",
            &[
                (0, 20, 0, None, 200),
                (0, 10000, 0, None, 200),
                (0, 0, 0, None, 429),
            ],
        ),
        (
            "total limit",
            &[
                (0, 0, 20, None, 200),
                (0, 0, 200, None, 200),
                (0, 0, 1000000, None, 200),
                (0, 0, 0, None, 429),
            ],
        ),
        (
            "cached input limit",
            &[
                (0, 0, 0, Some(20), 200),
                (0, 0, 0, Some(10000), 200),
                (0, 0, 0, None, 429),
            ],
        ),
        ("CEL limit", &[(3, 0, 0, None, 200), (0, 0, 0, None, 429)]),
    ];
    let mut client = d.envoy.client().await;
    for (offset, (block, calls)) in blocks.iter().enumerate() {
        let user = (1_000 + offset).to_string();
        for (i, &(input, output, total, cached, status)) in calls.iter().enumerate() {
            let body = completion(input, output, total, cached);
            let headers = [("x-tenant-id", user.as_str())];
            let reply = d.request(&mut client, TOKEN_MODEL, &headers, &body).await;
            let call = format!(
                "{block}, call {}: usage {input}/{output}/{total}/{cached:?}",
                i + 1
            );
            assert_eq!(reply.status, status, "{call}: {reply:?}");
            if status == 200 {
                // Their sanity check: the client reads the usage the backend reported.
                assert_eq!(reply.body, body, "{call}");
            }
        }
    }
    d.assert_no_errors().await;
}

/// `Test_Examples_BackendQuotaRateLimit`: AI Gateway's QuotaPolicy (10 total tokens an
/// hour for `quota-test-model` on the backend), enforced by a second `ratelimit` fed over
/// xDS as node `envoy-ai-gateway-ratelimit`, deployed as their manifest deploys it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_examples_backend_quota_rate_limit() {
    const MODEL: &str = "quota-test-model";
    let quota = Quota {
        backend: "envoy-ai-gateway-quota-ratelimit-testupstream",
        model: MODEL,
        limit: 10,
    };
    let per_route = quota.route_rate_limits();
    let filter = quota.rate_limit_filter();
    // testdata/backend_quota_ratelimit.yaml's Deployment: its args and env (the Redis,
    // runtime, ports and control plane are the test's own).
    let args = ["--quotaRateLimitServiceAddr=envoy-ai-gateway-ratelimit.envoy-gateway-system"];
    let vars = [("LOG_LEVEL", "debug"), ("USE_STATSD", "false")];
    let d = deploy(
        quota.service_config(),
        QUOTA_NODE,
        &args,
        &vars,
        "ai_gateway_ratelimit_cluster",
        |cluster| Config {
            listener: "default/envoy-ai-gateway-quota-ratelimit/http".to_string(),
            model: MODEL,
            backend: quota.backend,
            ext_authz: None,
            rate_limit_filters: vec![filter],
            per_route,
            clusters: vec![cluster],
        },
    )
    .await;
    // Their flushQuotaKeys: nothing counted yet.
    assert_eq!(d.redis.cli(&["--scan"]).unwrap().trim(), "");
    let mut client = d.envoy.client().await;
    // "per-model quota": a call of 20 tokens, then one of 5; requireQuotaUsage 21, 22.
    for (total, status, counted) in [(20, 200, 21), (5, 429, 22)] {
        let body = completion(1, 1, total, None);
        let reply = d.request(&mut client, MODEL, &[], &body).await;
        assert_eq!(reply.status, status, "a call of {total} tokens: {reply:?}");
        // The hits the window counted: one at request time, the usage at stream done
        // (upstream's total_hits, which counts what its INCRBY adds).
        let key = format!(
            "ai-gateway-quota.backend_name_default/{}.model_name_override_{MODEL}",
            quota.backend
        );
        assert_eq!(
            d.total_hits(&key).await,
            counted,
            "hits counted after {total}"
        );
        // The window as Redis holds it: every hit, as upstream's counter (21, 22).
        assert_eq!(window_used(&d.redis), counted, "stored after {total}");
    }
    d.assert_no_errors().await;
}

/// What the one hourly window in `redis` has counted: its bucket holds `W + used` in
/// nanoseconds, `W` the window's end (a whole hour), `used` below an hour's nanoseconds.
fn window_used(redis: &RedisServer) -> u64 {
    let keys = redis.cli(&["--scan"]).unwrap();
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 1, "one window: {keys:?}");
    assert!(keys[0].starts_with("cellrate:99@1h:"), "{keys:?}");
    let stored: u64 = redis
        .cli(&["GET", keys[0]])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    stored % 3_600_000_000_000
}
