//! The RPC histogram and counter label every RPC of both listeners with its own name, from
//! the route table (`crates/service/src/grpc/mod.rs`): none is counted as `other`, and a path that names
//! no RPC is `unknown`, never the caller's text.

use std::time::Duration;

use crate::common::h2_raw::h2_client;
use crate::common::{http_get_async, Served};
use cellrate::grpc::{ADMIN, ROUTES, UNKNOWN};

/// Sends `path` one empty message and waits for the answer's headers (when the histogram
/// counts it; a streaming answer goes on).
async fn call(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: std::net::SocketAddr,
    path: &str,
) {
    let request = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("answered")
        .unwrap();
}

#[tokio::test]
async fn every_rpc_is_counted_under_its_own_label_and_an_unknown_path_as_unknown() {
    let s = Served::start(None).await;
    let mut decisions = h2_client(s.decisions_addr).await;
    let mut admin = h2_client(s.admin_addr).await;
    for rpc in ROUTES {
        match rpc.service == ADMIN {
            true => call(&mut admin, s.admin_addr, rpc.path).await,
            false => call(&mut decisions, s.decisions_addr, rpc.path).await,
        }
    }
    call(&mut decisions, s.decisions_addr, "/attacker/chosen-text").await;
    call(&mut admin, s.admin_addr, "/cellrate.v1.Admin/NoSuchMethod").await;
    let (status, metrics) = http_get_async(s.metrics_addr, "/metrics").await;
    assert_eq!(status, 200);
    let counted: Vec<&str> = (metrics.lines())
        .filter(|line| line.starts_with("cellrate_rpc_requests_total{"))
        .collect();
    for label in ROUTES.iter().map(|rpc| rpc.label).chain([UNKNOWN]) {
        let series = format!("rpc=\"{label}\"}}");
        assert!(
            counted.iter().any(|line| line.contains(&series)),
            "no series for {label}:\n{}",
            counted.join("\n")
        );
    }
    assert!(
        !metrics.contains("rpc=\"other\"") && !metrics.contains("chosen-text"),
        "{}",
        counted.join("\n")
    );
    // One series per RPC at most per code: the labels are the table's and `unknown`.
    let labels: std::collections::BTreeSet<&str> = counted
        .iter()
        .filter_map(|line| line.split("rpc=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(labels.len(), ROUTES.len() + 1, "{labels:?}");
    s.stop().await;
}
