//! Budgets through a real Envoy: the examples' Envoy charges what a response used at stream
//! end (the budgets themselves, without Envoy, are the fast tier's `tests/it/budgets.rs`).
use std::path::Path;

use crate::common::budgets::served;
use crate::common::remaining;
use cellrate::clock::SECOND;

/// The example of `examples/budgets/`: the real Envoy checks a tenant's budget before each
/// request and charges the tokens the response used at stream done (`apply_on_stream_done`,
/// `hits_addend` from the upstream's `x-tokens-used` header). The backend here answers with
/// the token count the client asks for in `x-test-tokens`.
#[tokio::test]
async fn a_real_envoy_charges_the_tokens_a_response_used() {
    let limits = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/budgets/limits");
    // In debt by 10 000 of 100 000 a day: refill repays it in 8 640 s.
    charged_through_envoy(&limits, 8_640).await;
}

/// The same with the budget as a calendar day (`docs/budgets.md`'s calendar pattern): the
/// debt ends with the UTC day, 6 400 s after the fake clock's start (22:13:20).
#[tokio::test]
async fn a_real_envoy_charges_a_calendar_budget_until_the_day_ends() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/budgets/limits");
    let dir = tempfile::tempdir().unwrap();
    for file in ["names.yaml", "descriptors.yaml"] {
        std::fs::copy(example.join(file), dir.path().join(file)).unwrap();
    }
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "TokensPerTenant: {window: calendar, count: 100000, period: 1d, overdraw: true}\n\
         RequestsPerTenant: {burst: 5, count: 5, period: 1s}\n",
    )
    .unwrap();
    charged_through_envoy(dir.path(), 6_400).await;
}

/// Runs `examples/budgets/envoy.yaml` against `limits` (100 000 tokens per tenant, overdraw):
/// two responses put the tenant 10 000 tokens into debt, the next request is 429 with
/// `Retry-After: recovers_in`, and after that many seconds the tenant passes again.
async fn charged_through_envoy(limits: &Path, recovers_in: i64) {
    use crate::common::envoy::{yaml, Envoy};
    use crate::common::poll_until;
    use std::time::Duration;
    let mut s = served(limits).await;
    let envoy = Envoy::example_of("examples/budgets/envoy.yaml", s.decisions_addr, |config| {
        let listeners = config["static_resources"]["listeners"]
            .as_sequence_mut()
            .unwrap();
        let backend = listeners
            .iter_mut()
            .find(|l| l["name"].as_str() == Some("backend"))
            .expect("the test backend");
        let route = &mut backend["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
            ["virtual_hosts"][0]["routes"][0];
        route["response_headers_to_add"] =
            yaml(r#"[{header: {key: x-tokens-used, value: "%REQ(x-test-tokens)%"}}]"#);
    })
    .await;
    let mut client = envoy.client().await;
    let ask = |tokens: &'static str| [("x-tenant", "acme"), ("x-test-tokens", tokens)];

    // 40 000 tokens, then 70 000: the second response uses more than the 60 000 left.
    let first = client.get("/v1/chat", &ask("40000")).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("x-tokens-used"), Some("40000"));
    // The charge is made at stream done, after the client has its answer.
    let charged = poll_until(
        Duration::from_secs(5),
        async || remaining(&mut s, "TokensPerTenant", "acme").await,
        |&left| left == 60_000,
    )
    .await;
    assert_eq!(charged, 60_000, "the first response's tokens were charged");
    assert_eq!(client.get("/v1/chat", &ask("70000")).await.status, 200);
    let debt = poll_until(
        Duration::from_secs(5),
        async || remaining(&mut s, "TokensPerTenant", "acme").await,
        |&left| left < 0,
    )
    .await;
    assert_eq!(debt, -10_000, "charged beyond the budget: in debt");

    // The next request is denied with 429, told when the debt is repaid, and its own
    // zero-token charge at stream done changes nothing.
    let denied = client.get("/v1/chat", &ask("0")).await;
    assert_eq!(denied.status, 429, "{denied:?}");
    let recovers = recovers_in.to_string();
    assert_eq!(denied.header("retry-after"), Some(recovers.as_str()));
    assert_eq!(remaining(&mut s, "TokensPerTenant", "acme").await, -10_000);
    // Another tenant is not affected.
    let other = client
        .get("/v1/chat", &[("x-tenant", "other"), ("x-test-tokens", "5")])
        .await;
    assert_eq!(other.status, 200);

    // The budget recovers (by refill, or when the window ends), not a nanosecond early.
    s.clock.advance(recovers_in * SECOND - 1);
    let early = client.get("/v1/chat", &ask("0")).await;
    assert_eq!(early.status, 429, "{early:?}");
    s.clock.advance(1);
    let back = client.get("/v1/chat", &ask("1")).await;
    assert_eq!(back.status, 200, "{back:?}");
    drop(envoy);
    s.stop().await;
}
