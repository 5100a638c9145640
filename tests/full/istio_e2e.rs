//! Istio without a cluster: the `EnvoyFilter` patches of `examples/istio/` applied to an
//! ingress-gateway bootstrap the way Istio places them (a filter inserted before the router,
//! `rate_limits` merged into the virtual hosts and into the route named `signup`), checked by
//! `envoy --mode validate`, then run by a real Envoy against a served cellrate, so that the
//! descriptors the patches produce are shown to map to the example limits in `config/`.

use serde_yaml_ng::{Mapping, Value};

use crate::common::envoy::{self, yaml, Envoy};
use crate::common::http1::Http1;
use crate::common::{remaining, Served};
use crate::envoy_e2e::{expect_admitted, loopback, route};

const HCM: &str = "envoy.filters.network.http_connection_manager";

/// What Istio generates for an ingress gateway with a VirtualService of two http routes,
/// `signup` (prefix /signup) and a default one, reduced to what the patches touch. Like
/// Istio's gateways, the connection manager takes the client's address from the connection
/// (`use_remote_address`). The rate-limit service's cluster has the name Istio gives the
/// `cellrate` Service's `grpc-decisions` port and speaks HTTP/2 as Istio would for it.
fn gateway(rls: std::net::SocketAddr, dir: &std::path::Path) -> Value {
    let socket = dir.join("backend.sock");
    let mut config = yaml(
        r#"
static_resources:
  listeners:
    - name: 0.0.0.0_8080
      address: { socket_address: { address: 127.0.0.1, port_value: 0 } }
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: outbound_0.0.0.0_8080
                use_remote_address: true
                route_config:
                  name: http.8080
                  virtual_hosts:
                    - name: "*:80"
                      domains: ["*"]
                      routes:
                        - name: signup
                          match: { prefix: /signup }
                          route: { cluster: backend }
                        - name: default
                          match: { prefix: / }
                          route: { cluster: backend }
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: outbound|8081||cellrate.cellrate.svc.cluster.local
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: { http2_protocol_options: {} }
      load_assignment:
        cluster_name: outbound|8081||cellrate.cellrate.svc.cluster.local
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address: { socket_address: {} }
"#,
    );
    let resources = &mut config["static_resources"];
    let address = &mut resources["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"]
        [0]["endpoint"]["address"]["socket_address"];
    address["address"] = Value::from(rls.ip().to_string());
    address["port_value"] = Value::from(rls.port());
    let clusters = resources["clusters"].as_sequence_mut().unwrap();
    clusters.push(envoy::backend_cluster("backend", &socket));
    let listeners = resources["listeners"].as_sequence_mut().unwrap();
    listeners.push(envoy::backend_listener(&socket));
    config["admin"] = envoy::admin();
    config
}

/// Istio's MERGE: messages merge field by field, lists are appended to, scalars replaced.
fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Mapping(into), Value::Mapping(from)) => {
            for (key, value) in from {
                match into.get_mut(key) {
                    Some(existing) => merge(existing, value),
                    None => {
                        into.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Sequence(into), Value::Sequence(from)) => into.extend(from.iter().cloned()),
        (into, from) => *into = from.clone(),
    }
}

/// The connection managers' typed configs of every listener.
fn connection_managers(config: &mut Value) -> Vec<&mut Mapping> {
    let mut found = Vec::new();
    for listener in config["static_resources"]["listeners"]
        .as_sequence_mut()
        .unwrap()
    {
        for chain in listener["filter_chains"].as_sequence_mut().unwrap() {
            for filter in chain["filters"].as_sequence_mut().unwrap() {
                if filter["name"].as_str() == Some(HCM) {
                    found.push(filter["typed_config"].as_mapping_mut().unwrap());
                }
            }
        }
    }
    found
}

/// Applies the patches of the EnvoyFilter documents as Istio would for the gateway; a patch
/// kind this function does not know, or one that applies nowhere, fails the test.
fn apply_envoy_filters(config: &mut Value, documents: &[Value]) {
    for document in documents {
        assert_eq!(document["kind"].as_str(), Some("EnvoyFilter"));
        assert_eq!(
            document["spec"]["workloadSelector"]["labels"]["istio"].as_str(),
            Some("ingressgateway")
        );
        for patch in document["spec"]["configPatches"].as_sequence().unwrap() {
            let matching = &patch["match"];
            assert_eq!(matching["context"].as_str(), Some("GATEWAY"));
            let value = &patch["patch"]["value"];
            let kind = (
                patch["applyTo"].as_str().unwrap(),
                patch["patch"]["operation"].as_str().unwrap(),
            );
            let mut applied = 0;
            match kind {
                ("HTTP_FILTER", "INSERT_BEFORE") => {
                    let filter = &matching["listener"]["filterChain"]["filter"];
                    assert_eq!(filter["name"].as_str(), Some(HCM));
                    let before = filter["subFilter"]["name"].as_str().unwrap();
                    for manager in connection_managers(config) {
                        let filters = manager
                            .get_mut("http_filters")
                            .and_then(Value::as_sequence_mut)
                            .unwrap();
                        if let Some(at) = filters.iter().position(|f| f["name"] == before) {
                            filters.insert(at, value.clone());
                            applied += 1;
                        }
                    }
                }
                ("VIRTUAL_HOST", "MERGE") | ("HTTP_ROUTE", "MERGE") => {
                    let route_name = matching["routeConfiguration"]["vhost"]["route"]["name"]
                        .as_str()
                        .map(str::to_string);
                    assert_eq!(kind.0 == "HTTP_ROUTE", route_name.is_some(), "{patch:?}");
                    for manager in connection_managers(config) {
                        let hosts = manager
                            .get_mut("route_config")
                            .and_then(|r| r.get_mut("virtual_hosts"))
                            .and_then(Value::as_sequence_mut)
                            .unwrap();
                        for host in hosts {
                            match &route_name {
                                None => {
                                    merge(host, value);
                                    applied += 1;
                                }
                                Some(name) => {
                                    let routes = host["routes"].as_sequence_mut().unwrap();
                                    for r in routes.iter_mut().filter(|r| r["name"] == **name) {
                                        merge(r, value);
                                        applied += 1;
                                    }
                                }
                            }
                        }
                    }
                }
                other => panic!("this test does not know how Istio applies {other:?}"),
            }
            assert!(applied > 0, "the patch applies nowhere: {patch:?}");
        }
    }
}

fn envoy_filters() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/istio/ratelimit-envoyfilter.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| serde::Deserialize::deserialize(document).unwrap())
        .collect()
}

/// The gateway for `rls` in `dir` with the example's patches applied.
fn patched_gateway(rls: std::net::SocketAddr, dir: &std::path::Path, filters: &[Value]) -> Value {
    let mut config = gateway(rls, dir);
    apply_envoy_filters(&mut config, filters);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_envoyfilters_validate_and_limit_through_a_gateway() {
    let mut s = Served::start(None).await;
    let dir = tempfile::tempdir().unwrap();
    let config = patched_gateway(s.decisions_addr, dir.path(), &envoy_filters());
    if let Err(complaint) = envoy::validate(&config) {
        panic!(
            "envoy --mode validate refuses the patched gateway:\n{complaint}\n{}",
            serde_yaml_ng::to_string(&config).unwrap()
        );
    }

    let envoy = Envoy::start(config, dir).await;
    let mut client = Http1::connect_from(loopback(5), envoy.ingress).await;
    // The route named signup: 20 per second per client address.
    expect_admitted(&mut client, route("/signup", &[]), 25, 20).await;
    assert_eq!(
        remaining(&mut s, "NewRegistrationsPerIPAddress", "127.0.0.5").await,
        0
    );
    // The virtual host's actions, on any other route.
    let api = route("/items", &[("x-api-key", "key-istio")]);
    expect_admitted(&mut client, api, 15, 10).await;
    assert_eq!(
        remaining(&mut s, "ApiRequestsPerKeyDaily", "key-istio").await,
        9990
    );
    let orders = route("/orders", &[("x-account-id", "6006")]);
    expect_admitted(&mut client, orders, 305, 300).await;
    // A route with rate_limits of its own does not use the virtual host's (Envoy's
    // default): an API key on /signup is not limited there.
    let mut other = Http1::connect_from(loopback(6), envoy.ingress).await;
    let signup_with_key = route("/signup", &[("x-api-key", "key-signup")]);
    expect_admitted(&mut other, signup_with_key, 15, 15).await;
    assert_eq!(
        remaining(&mut s, "ApiRequestsPerKey", "key-signup").await,
        10
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_cluster_names_need_the_authority_line() {
    // Envoy sends the cluster name as :authority unless `authority` is set; Istio's names
    // contain "|", which HTTP/2 (h2, under cellrate) refuses: every call is then an error,
    // so the example sets `authority`. This test keeps the README's warning true.
    let s = Served::start(None).await;
    let mut filters = envoy_filters();
    let grpc = &mut filters[0]["spec"]["configPatches"][0]["patch"]["value"]["typed_config"]
        ["rate_limit_service"]["grpc_service"]["envoy_grpc"];
    assert!(
        grpc.as_mapping_mut().unwrap().remove("authority").is_some(),
        "the example sets envoy_grpc.authority"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = patched_gateway(s.decisions_addr, dir.path(), &filters);
    let envoy = Envoy::start(config, dir).await;
    let mut client = envoy.client().await;
    let counts = crate::envoy_e2e::send(&mut client, route("/signup", &[]), 3).await;
    assert_eq!(
        counts,
        std::collections::BTreeMap::from([(503, 3)]),
        "GET /signup without envoy_grpc.authority"
    );
    assert_eq!(
        envoy.counter("cluster.backend.ratelimit.error").await,
        3,
        "Envoy's cluster.backend.ratelimit.error"
    );
    s.stop().await;
}
