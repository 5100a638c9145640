//! Envoy's default, `failure_mode_deny: false`, lets a request through when the rate-limit
//! service answers an error, with every descriptor of the request skipped. So nothing a
//! client controls may make cellrate answer an error: here a real Envoy 1.40 at that
//! default sends a generated set of hostile headers (values over 1 024 bytes, bytes that
//! are not UTF-8, empty values, lease ids out of shape, hits that would wrap or are no
//! number, a header copied into two descriptors past the message bound) beside a
//! per-address limit the client cannot touch, and no request over that limit passes.

use cellrate::limits::config::LimitTable;
use serde_yaml_ng::Value;

use crate::common::envoy::{rate_limit_filter, yaml, Envoy};
use crate::common::http1::Http1;
use crate::common::{remaining, Served};

/// A request's headers: names and values of any bytes.
type Headers = Vec<(&'static str, Vec<u8>)>;

/// The per-address limit: 5 an hour (the served clock is frozen: exact counts).
const PER_ADDRESS: i64 = 5;

fn fail_open_limits() -> LimitTable {
    let files = [
        (
            "names.yaml",
            "PerAddress: {number: 101, format: ipAddress}\n\
             PerKey: {number: 102, format: string}\n\
             PerAccount: {number: 103, format: regId}\n\
             InFlight: {number: 104, format: string}\n",
        ),
        (
            "defaults.yaml",
            "PerAddress: {burst: 5, count: 5, period: 1h}\n\
             PerKey: {burst: 1000, count: 1000, period: 1h}\n\
             PerAccount: {burst: 1000, count: 1000, period: 1h}\n\
             InFlight: {window: concurrency, count: 1000, period: 30s}\n",
        ),
        (
            "descriptors.yaml",
            "hostile:\n\
             \x20 - match: [{key: generic_key, value: signup}, {key: remote_address}]\n\
             \x20   limits: [PerAddress]\n\
             \x20   id: \"{remote_address}\"\n\
             \x20 - match: [{key: key}]\n\
             \x20   limits: [PerKey]\n\
             \x20   id: \"{key}\"\n\
             \x20 - match: [{key: account}]\n\
             \x20   limits: [PerAccount]\n\
             \x20   id: \"{account}\"\n\
             \x20 - match: [{key: tenant}, {key: lease}]\n\
             \x20   limits: [InFlight]\n\
             \x20   id: \"{tenant}\"\n\
             \x20   lease: lease\n",
        ),
    ];
    let files: Vec<(String, String)> = files
        .into_iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect();
    LimitTable::from_files(&files).expect("the limits load")
}

/// The example's Envoy at its fail-open default, in domain `hostile`, with one route
/// whose descriptors take the client's headers (in the filter's per-route configuration,
/// where Envoy honours `hits_addend`).
fn fail_open(config: &mut Value) {
    let filter = rate_limit_filter(config);
    filter.insert("failure_mode_deny".into(), Value::Bool(false));
    filter.insert("domain".into(), "hostile".into());
    // A header copied into two descriptors: a large one makes a message over the bound.
    let twice = route(
        "/twice",
        "
      - actions: [{request_headers: {header_name: x-big, descriptor_key: key}}]
      - actions: [{request_headers: {header_name: x-big, descriptor_key: key}}, {generic_key: {descriptor_value: again}}]",
    );
    let every = route(
        "/",
        r#"
      - actions: [{request_headers: {header_name: x-key, descriptor_key: key}}]
      - actions: [{request_headers: {header_name: x-costly, descriptor_key: key}}]
        hits_addend: { format: "%REQ(x-hits)%" }
      - actions: [{request_headers: {header_name: x-account, descriptor_key: account}}]
      - actions:
          - request_headers: {header_name: x-tenant, descriptor_key: tenant}
          - request_headers: {header_name: x-lease, descriptor_key: lease}"#,
    );
    let listeners = config["static_resources"]["listeners"]
        .as_sequence_mut()
        .unwrap();
    let manager = &mut listeners[0]["filter_chains"][0]["filters"][0]["typed_config"];
    manager["route_config"]["virtual_hosts"][0]["routes"] = Value::Sequence(vec![twice, every]);
}

/// A route to the backend at `prefix` whose descriptors are the per-address one and
/// `rate_limits` (YAML list items), in the filter's per-route configuration.
fn route(prefix: &str, rate_limits: &str) -> Value {
    yaml(&format!(
        r#"
match: {{ prefix: "{prefix}" }}
route: {{ cluster: backend }}
typed_per_filter_config:
  envoy.filters.http.ratelimit:
    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
    rate_limits:
      - actions: [{{generic_key: {{descriptor_value: signup}}}}, {{remote_address: {{}}}}]{rate_limits}
"#
    ))
}

/// Values a client may put in a header: over the value bound, not UTF-8, empty, spaced,
/// control bytes, a stand-in's own shape, numbers that wrap or are none.
fn hostile_values() -> Vec<Vec<u8>> {
    let mut values: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"a".repeat(1025),
        b"b".repeat(4_000),
        b"c".repeat(30_000),
        b"\xff".to_vec(),
        b"al\xffice".to_vec(),
        b"caf\xc3".to_vec(),
        (0x80u8..=0xfe).collect(),
        b"spaced value".to_vec(),
        b"tab\tinside".to_vec(),
        format!("sha256:{}", "0".repeat(64)).into_bytes(),
        b"x".repeat(129),
    ];
    for number in [
        "0",
        "1",
        "-1",
        "abc",
        "1e9",
        "4294967296",
        "18446744073709551608",
        "18446744073709551615",
        "99999999999999999999999",
    ] {
        values.push(number.as_bytes().to_vec());
    }
    values
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_header_a_client_sends_gets_it_past_a_limit_it_cannot_touch() {
    let mut s = Served::with_limits(fail_open_limits()).await;
    let envoy = Envoy::example(s.decisions_addr, fail_open).await;
    let mut client = envoy.client().await;
    let values = hostile_values();
    let mut requests: Vec<Headers> = Vec::new();
    for value in &values {
        for header in ["x-key", "x-account", "x-lease", "x-hits"] {
            let mut headers = vec![(header, value.clone())];
            match header {
                "x-lease" => headers.push(("x-tenant", b"acme".to_vec())),
                "x-hits" => headers.push(("x-costly", b"k".to_vec())),
                _ => {}
            }
            requests.push(headers);
        }
        // Every header at once.
        requests.push(vec![
            ("x-key", value.clone()),
            ("x-account", value.clone()),
            ("x-tenant", value.clone()),
            ("x-lease", value.clone()),
            ("x-costly", value.clone()),
            ("x-hits", value.clone()),
        ]);
    }
    // Then plain requests, so that the limit is certainly reached.
    requests.extend((0..10).map(|_| Vec::new()));
    // A header of 40 000 bytes in two descriptors: about 80 KiB, over the 64 KiB bound.
    let big = b"d".repeat(40_000);
    let twice = (0..3).map(|_| vec![("x-big", big.clone())]);
    let requests: Vec<(&str, Headers)> = (twice.map(|h| ("/twice", h)))
        .chain(requests.into_iter().map(|h| ("/", h)))
        .collect();
    let mut admitted = 0;
    let mut statuses = std::collections::BTreeMap::new();
    for (path, headers) in &requests {
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, &v[..])).collect();
        let reply = client.get_bytes(path, &headers).await;
        *statuses.entry(reply.status).or_insert(0) += 1;
        if reply.status == 200 {
            admitted += 1;
        }
        if reply.status == 400 || reply.status == 431 {
            // Envoy refused the header itself: the client reconnects.
            client = envoy.client().await;
        }
    }
    println!("{} requests: {statuses:?}", requests.len());
    let counters = envoy.counters("ratelimit").await;
    // The counters are where the next two assertions look (their absence there means
    // something only if the denials are counted beside them).
    assert!(
        counters
            .get("cluster.backend.ratelimit.over_limit")
            .is_some_and(|&n| n > 0),
        "Envoy counts the denials under cluster.backend.ratelimit ({counters:?})"
    );
    assert_eq!(
        counters.get("cluster.backend.ratelimit.failure_mode_allowed"),
        None,
        "no request let through on an error ({counters:?})"
    );
    assert_eq!(
        counters.get("cluster.backend.ratelimit.error"),
        None,
        "cellrate answered no error ({counters:?})"
    );
    assert_eq!(
        admitted, PER_ADDRESS,
        "exactly the per-address limit admitted, whatever the headers ({statuses:?})"
    );
    assert_eq!(remaining(&mut s, "PerAddress", "127.0.0.1").await, 0);
    s.stop().await;
}

/// The same Envoy: a sanity check that the route asks cellrate at all (a plain request is
/// counted on the address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hostile_route_counts_plain_requests_on_the_address() {
    let mut s = Served::with_limits(fail_open_limits()).await;
    let envoy = Envoy::example(s.decisions_addr, fail_open).await;
    let mut client = Http1::connect(envoy.ingress).await;
    for _ in 0..2 {
        assert_eq!(client.get("/", &[]).await.status, 200);
    }
    assert_eq!(
        remaining(&mut s, "PerAddress", "127.0.0.1").await,
        PER_ADDRESS - 2
    );
    s.stop().await;
}
