//! Issue #58, defect 4: one client address held `--max-in-flight` with HTTP/2 connections of
//! stalled streams (bodies that stop after 3 bytes), and every other caller got
//! UNAVAILABLE "overloaded" (through Envoy's default, a pass). Now one address holds at
//! most its share of the slots (a quarter by default), and a body that stalls gives its
//! slot back at the body timeout. The attacker and the probes speak HTTP/2 with h2's
//! client, each from its own loopback address (127.0.0.1, 127.0.0.2).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use cellrate::proto::v1 as pb;
use cellrate::server::{ServerLimits, Settings};
use prost::Message;

use crate::common::{item, poll_until, Served};

async fn serve(server: ServerLimits) -> Served {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let limits = cellrate::limits::config::LimitTable::load_dir(&dir).unwrap();
    let settings = Settings {
        server,
        ..Settings::default()
    };
    Served::with_settings(limits, settings).await
}

/// An HTTP/2 connection to `server` from the loopback address `local`.
async fn connect(local: &str, server: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(server).await.unwrap();
    let (send, connection) = h2::client::handshake(stream).await.unwrap();
    tokio::spawn(connection);
    send.ready().await.unwrap()
}

fn grpc_request(path: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://cellrate{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// A Check framed as gRPC: a flag byte, the length, the message.
fn check_body() -> Bytes {
    let message = pb::CheckRequest {
        items: vec![item("ApiRequestsPerKey", "polite", Some(0))],
        ..Default::default()
    }
    .encode_to_vec();
    let mut body = vec![0u8];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(&message);
    Bytes::from(body)
}

/// A request on `path` whose body stops after its first 3 bytes: the stream kept open.
async fn stalled(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut ready = send.clone().ready().await.unwrap();
    let (response, mut body) = ready.send_request(grpc_request(path), false).unwrap();
    body.send_data(check_body().slice(..3), false).unwrap();
    (response, body)
}

/// The gRPC status and message of a response: from its headers (a trailers-only answer)
/// or its trailers.
async fn status(response: h2::client::ResponseFuture) -> (i32, String) {
    let response = response.await.unwrap();
    let read = |headers: &http::HeaderMap| {
        let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
        // Percent-encoded on the wire (the gRPC spec); spaces are all these need.
        let message = headers
            .get("grpc-message")
            .map(|m| m.to_str().unwrap_or("").replace("%20", " "))
            .unwrap_or_default();
        Some((code, message))
    };
    if let Some(found) = read(response.headers()) {
        return found;
    }
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        data.unwrap();
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    read(&trailers).expect("a grpc-status")
}

/// A whole Check from `local`: its gRPC status and message.
async fn probe(local: &str, server: SocketAddr) -> (i32, String) {
    let mut send = connect(local, server).await;
    let (response, mut body) = send
        .send_request(grpc_request("/cellrate.v1.RateLimiter/Check"), false)
        .unwrap();
    body.send_data(check_body(), true).unwrap();
    status(response).await
}

const OK: i32 = 0;
const DEADLINE_EXCEEDED: i32 = 4;
const UNAVAILABLE: i32 = 14;

/// 127.0.0.1 opens 3 connections of 20 stalled Checks each (60 against 40 slots); its own
/// next request is refused, but a request from 127.0.0.2 is answered. Before: the
/// attacker held all 40 and 127.0.0.2 got UNAVAILABLE "overloaded" too.
#[tokio::test]
async fn one_address_with_stalled_streams_leaves_slots_for_the_others() {
    let s = serve(ServerLimits {
        max_in_flight: 40,
        max_in_flight_per_address: None,
        request_timeout: Duration::from_secs(30),
        body_timeout: Duration::from_secs(30),
        ..ServerLimits::default()
    })
    .await;
    let server = s.decisions_addr;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut send = connect("127.0.0.1", server).await;
        for _ in 0..20 {
            held.push(stalled(&mut send, "/cellrate.v1.RateLimiter/Check").await);
        }
    }
    // Once the attacker's streams are in, its own next request is refused.
    let refused = poll_until(
        Duration::from_secs(5),
        async || probe("127.0.0.1", server).await,
        |(code, _)| *code == UNAVAILABLE,
    )
    .await;
    assert_eq!(
        refused.0, UNAVAILABLE,
        "refused while its streams stall: {refused:?}"
    );
    assert!(refused.1.contains("overloaded"), "{refused:?}");
    assert!(
        refused.1.contains("client address"),
        "its share: {refused:?}"
    );
    // Another address still finds slots.
    let (code, message) = probe("127.0.0.2", server).await;
    assert_eq!(code, OK, "127.0.0.2 answered: {message}");
    // Of the attacker's 60, all but its share (a quarter of 40) were refused at once.
    let mut refusals = 0;
    for (response, _body) in held.iter_mut() {
        let answered = futures_util::FutureExt::now_or_never(&mut *response);
        if let Some(Ok(answer)) = answered {
            let code = answer
                .headers()
                .get("grpc-status")
                .map(|c| c.to_str().unwrap().to_string());
            assert_eq!(code.as_deref(), Some("14"), "a refusal");
            refusals += 1;
        }
    }
    assert_eq!(refusals, 50, "10 of 60 held");
    drop(held);
    s.stop().await;
}

/// A body that stops mid-message ends with DEADLINE_EXCEEDED at the body timeout (200 ms),
/// not the request timeout (30 s), on both hand-served decision RPCs and a tonic-served
/// one, so a stalled stream gives its slot back soon.
#[tokio::test]
async fn a_stalled_body_ends_at_the_body_timeout() {
    let s = serve(ServerLimits {
        request_timeout: Duration::from_secs(30),
        body_timeout: Duration::from_millis(200),
        ..ServerLimits::default()
    })
    .await;
    let mut send = connect("127.0.0.1", s.decisions_addr).await;
    for path in [
        "/cellrate.v1.RateLimiter/Check",
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        "/cellrate.v1.RateLimiter/Refund",
    ] {
        let (response, _body) = stalled(&mut send, path).await;
        let (code, message) = tokio::time::timeout(Duration::from_secs(20), status(response))
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer before the request timeout"));
        assert_eq!(code, DEADLINE_EXCEEDED, "{path}: {message}");
        assert!(message.contains("body did not arrive"), "{path}: {message}");
    }
    s.stop().await;
}
