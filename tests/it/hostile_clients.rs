//! Hostile clients on the listeners: stream floods, clients that never read, silent and
//! slow connections, connection floods. Each test plays the attacker with raw HTTP/2
//! frames over a real socket and checks that the bound holds and that a well-behaved
//! client still gets its answers.

use std::sync::Arc;
use std::time::Duration;

use crate::common::h2_raw::{
    check_headers as stalled_check, connect as h2_connect, exchange, frame, grpc_frame, h2_client,
    header_block, read_frame, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PREFACE, RST_STREAM,
    SETTINGS,
};
use crate::common::{example_limits, http_get_async, item, poll_until, remaining, Served};
use cellrate::proto::v1 as pb;
use cellrate::server::listener::ConnectionLimits;
use cellrate::server::{ServerLimits, Settings};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;

/// A request without :path: the server resets the stream (a local error reset).
fn malformed_request(stream: u32) -> Vec<u8> {
    let block = header_block(&[(":method", "GET")]);
    frame(HEADERS, END_HEADERS | END_STREAM, stream, &block)
}

/// The server's SETTINGS_MAX_CONCURRENT_STREAMS, from its first SETTINGS frame.
fn max_concurrent_streams(payload: &[u8]) -> Option<u32> {
    payload.chunks_exact(6).find_map(|p| {
        (u16::from_be_bytes([p[0], p[1]]) == 0x3)
            .then(|| u32::from_be_bytes([p[2], p[3], p[4], p[5]]))
    })
}

async fn serve(server: ServerLimits) -> Served {
    Served::with_settings(
        example_limits(),
        Settings {
            server,
            ..Settings::default()
        },
    )
    .await
}

/// A well-behaved Check through tonic, with a deadline.
async fn well_behaved(s: &mut Served) -> Result<pb::CheckResponse, tonic::Status> {
    let mut request = tonic::Request::new(pb::CheckRequest {
        items: vec![item("ApiRequestsPerKey", "polite", Some(0))],
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(2));
    s.decisions.check(request).await.map(|r| r.into_inner())
}

#[tokio::test]
async fn a_stream_flood_is_capped_per_connection_and_times_out() {
    let mut s = serve(ServerLimits {
        request_timeout: Duration::from_millis(1_000),
        ..ServerLimits::default()
    })
    .await;
    let mut flood = h2_connect(s.decisions_addr).await;
    let (kind, _, _, payload) = read_frame(&mut flood).await.unwrap();
    assert_eq!(kind, SETTINGS);
    assert_eq!(
        max_concurrent_streams(&payload),
        Some(100),
        "advertised stream cap"
    );
    flood
        .write_all(&frame(SETTINGS, 0x1, 0, &[]))
        .await
        .unwrap();

    // 300 streams that never send a body: the server takes 100 and refuses the rest.
    let mut burst = Vec::new();
    for i in 0..300u32 {
        burst.extend(stalled_check(2 * i + 1));
    }
    flood.write_all(&burst).await.unwrap();

    // Meanwhile a well-behaved client on its own connection is answered.
    let answer = well_behaved(&mut s)
        .await
        .expect("answered during the flood");
    assert!(answer.overall.unwrap().allowed);

    // Every flood stream ends: about 200 refused at once, the 100 taken answered at the
    // request timeout (a few more taken if a slot frees before the burst is read).
    let (mut refused, mut answered) = (0, 0);
    let read_all = async {
        while refused + answered < 300 {
            match read_frame(&mut flood).await {
                Some((RST_STREAM, _, _, p)) if p == [0, 0, 0, 7] => refused += 1,
                Some((HEADERS, flags, _, _)) if flags & END_STREAM != 0 => answered += 1,
                Some(_) => {}
                None => break,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), read_all).await;
    assert_eq!(
        refused + answered,
        300,
        "every flood stream ended: {refused} refused (REFUSED_STREAM), {answered} answered"
    );
    assert!(
        refused >= 150 && answered >= 100,
        "the stream cap did not hold: {refused} refused, {answered} answered"
    );
    s.stop().await;
}

#[tokio::test]
async fn requests_beyond_the_in_flight_bound_are_refused_at_once() {
    let mut s = serve(ServerLimits {
        max_in_flight: 20,
        request_timeout: Duration::from_millis(800),
        ..ServerLimits::default()
    })
    .await;
    let mut hog = h2_connect(s.decisions_addr).await;
    let mut burst = Vec::new();
    for i in 0..20u32 {
        burst.extend(stalled_check(2 * i + 1));
    }
    hog.write_all(&burst).await.unwrap();
    // Once the 20 stalled requests are in, a 21st is refused with a clear status.
    let refused = poll_until(
        Duration::from_secs(2),
        async || well_behaved(&mut s).await,
        |r| r.is_err(),
    )
    .await
    .expect_err("refused while 20 requests are in flight");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("overloaded"), "{refused:?}");
    // The stalled requests end at the request timeout and free their places.
    let after = poll_until(
        Duration::from_secs(5),
        async || well_behaved(&mut s).await,
        |r| r.is_ok(),
    )
    .await;
    assert!(
        after.is_ok(),
        "answered once the stalled requests timed out: {after:?}"
    );
    drop(hog);
    s.stop().await;
}

/// Reads until EOF or error, for at most `within`; whether the peer closed by then.
async fn closed_within(stream: &mut (impl tokio::io::AsyncRead + Unpin), within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// On paused time: the listeners' deadlines and the clients' pace read the runtime's clock,
/// which moves on only when every task waits, so the 100 ms and 200 ms steps and the 300 ms
/// and 800 ms deadlines happen in their order without a real wait.
#[tokio::test(start_paused = true)]
async fn silent_slow_and_idle_connections_are_closed() {
    let quick = ConnectionLimits {
        handshake_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(800),
        ..ConnectionLimits::default()
    };
    let mut s = serve(ServerLimits {
        decisions: quick,
        admin: quick,
        metrics: quick,
        ..ServerLimits::default()
    })
    .await;
    for addr in [
        s.decisions_addr,
        s.admin_addr,
        s.metrics_addr,
        s.health_addr,
    ] {
        // Silent: nothing sent at all.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        assert!(
            closed_within(&mut silent, Duration::from_secs(3)).await,
            "{addr}: silent"
        );

        // Slow: the preface one byte every 100 ms (16 bytes would take 1.6 s).
        let mut slow = TcpStream::connect(addr).await.unwrap();
        let mut closed = false;
        for &byte in PREFACE.iter().take(16) {
            if slow.write_all(&[byte]).await.is_err() {
                closed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            closed || closed_within(&mut slow, Duration::from_millis(100)).await,
            "{addr}: a connection trickling its first bytes outlived the handshake timeout"
        );
    }
    // Idle: a complete HTTP/2 handshake, then nothing.
    let mut idle = h2_connect(s.decisions_addr).await;
    assert!(
        closed_within(&mut idle, Duration::from_secs(5)).await,
        "idle"
    );
    // A client that keeps talking is not cut off: requests 200 ms apart for 1.2 s (fixed
    // waits on purpose: the time between requests is what is tested).
    for _ in 0..6 {
        well_behaved(&mut s)
            .await
            .expect("an active client keeps its connection");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    s.stop().await;
}

/// A TLS connection to `addr` trusting `ca` (PEM), handshake done, nothing else sent.
async fn tls_connect(
    addr: std::net::SocketAddr,
    ca: &str,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let mut config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

#[tokio::test]
async fn slow_and_idle_tls_clients_are_closed() {
    // A TLS handshake must end within the handshake timeout, and a TLS connection that
    // never starts HTTP/2 is closed by the idle timeout, as a plaintext one is.
    let pki = crate::common::pki::Pki::new();
    let quick = ConnectionLimits {
        handshake_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_secs(2),
        ..ConnectionLimits::default()
    };
    let s = Served::with_settings(
        example_limits(),
        Settings {
            server: ServerLimits {
                decisions: quick,
                admin: quick,
                ..ServerLimits::default()
            },
            tls: Some(cellrate::server::admin::TlsPem {
                cert: pki.server_cert.clone().into_bytes(),
                key: pki.server_key.clone().into_bytes(),
                admin_client_ca: None,
                client_ca: None,
                client_san: None,
            }),
            ..Settings::default()
        },
    )
    .await;
    for addr in [s.decisions_addr, s.admin_addr] {
        // Silent: not even a ClientHello.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        assert!(
            closed_within(&mut silent, Duration::from_secs(3)).await,
            "{addr}: silent"
        );
        // A handshake record announcing 512 bytes, 40 of them sent: rustls waits for the
        // rest, which never comes; the handshake timeout, not the idle one, ends it.
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        let mut hello = vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc];
        hello.resize(45, 0);
        stalled.write_all(&hello).await.unwrap();
        assert!(
            closed_within(&mut stalled, Duration::from_millis(1_200)).await,
            "{addr}: a stalled TLS handshake"
        );
        // A complete TLS handshake, then not a byte of HTTP/2.
        let mut idle = tls_connect(addr, &pki.ca).await;
        assert!(
            closed_within(&mut idle, Duration::from_secs(4)).await,
            "{addr}: TLS without HTTP/2"
        );
    }
    // A TLS client that talks is answered.
    let channel = tonic::transport::Channel::from_shared(format!("https://{}", s.decisions_addr))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&pki.ca))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let r = pb::rate_limiter_client::RateLimiterClient::new(channel)
        .check(pb::CheckRequest {
            items: vec![item("ApiRequestsPerKey", "tls-polite", None)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(r.into_inner().overall.unwrap().allowed);
}

#[tokio::test]
async fn a_client_that_never_reads_is_cut_off() {
    let mut s = serve(ServerLimits::default()).await;
    let mut deaf = h2_connect(s.decisions_addr).await;
    // Malformed requests make the server reset each stream; this client never reads the
    // resets. After 1 024 local resets the server sends GOAWAY and closes.
    let mut cut_off = false;
    for batch in 0..50u32 {
        let mut frames = Vec::new();
        for i in 0..200u32 {
            frames.extend(malformed_request(2 * (batch * 200 + i) + 1));
        }
        let write = tokio::time::timeout(Duration::from_secs(5), deaf.write_all(&frames)).await;
        if !matches!(write, Ok(Ok(()))) {
            cut_off = true;
            break;
        }
    }
    if !cut_off {
        // Everything fit in the socket buffers: the connection must be closed anyway.
        let mut goaway = false;
        while let Ok(Some((kind, ..))) =
            tokio::time::timeout(Duration::from_secs(5), read_frame(&mut deaf)).await
        {
            goaway |= kind == GOAWAY;
        }
        cut_off = goaway;
    }
    assert!(
        cut_off,
        "10 000 malformed streams from a deaf client did not end its connection"
    );
    well_behaved(&mut s)
        .await
        .expect("others are still answered");
    s.stop().await;
}

#[tokio::test]
async fn the_connection_bound_holds_and_health_still_answers() {
    let mut s = serve(ServerLimits {
        decisions: ConnectionLimits {
            max_connections: 4,
            // Every connection here is from 127.0.0.1: the whole bound, not a share.
            max_per_address: 0,
            ..ConnectionLimits::default()
        },
        ..ServerLimits::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut c = h2_connect(s.decisions_addr).await;
        assert_eq!(
            read_frame(&mut c).await.map(|f| f.0),
            Some(SETTINGS),
            "accepted"
        );
        held.push(c);
    }
    // A fifth connection waits in the backlog: no SETTINGS comes.
    let mut fifth = h2_connect(s.decisions_addr).await;
    let waited = tokio::time::timeout(Duration::from_millis(300), read_frame(&mut fifth)).await;
    assert!(waited.is_err(), "a fifth connection was served: {waited:?}");
    // The metrics listener is not starved.
    assert_eq!(http_get_async(s.metrics_addr, "/healthz").await.0, 200);
    // One connection closes: the waiting one is served.
    drop(held.pop());
    let served = tokio::time::timeout(Duration::from_secs(3), read_frame(&mut fifth)).await;
    assert_eq!(
        served.ok().flatten().map(|f| f.0),
        Some(SETTINGS),
        "served once room was made"
    );
    drop(held);
    drop(fifth);
    well_behaved(&mut s).await.expect("answered");
    s.stop().await;
}

#[tokio::test]
async fn a_second_message_in_a_unary_call_is_refused() {
    let mut s = serve(ServerLimits::default()).await;
    let mut client = h2_client(s.decisions_addr).await;
    let check = pb::CheckRequest {
        items: vec![item("ApiRequestsPerKey", "twice", None)],
        ..Default::default()
    };
    // Two messages, split across data frames at an awkward place.
    let mut body = grpc_frame(&check);
    body.extend(grpc_frame(&check));
    let (status, message) =
        unary_call(&mut client, s.decisions_addr, &[&body[..7], &body[7..]]).await;
    assert_eq!(
        status.as_deref(),
        Some("3"),
        "INVALID_ARGUMENT; message {message:?}"
    );
    assert!(
        message.unwrap_or_default().contains("second"),
        "names the problem"
    );
    // Nothing was spent.
    assert_eq!(remaining(&mut s, "ApiRequestsPerKey", "twice").await, 10);
    // One message is fine.
    let one = grpc_frame(&check);
    let (status, _) = unary_call(&mut client, s.decisions_addr, &[&one[..]]).await;
    assert_eq!(status.as_deref(), Some("0"), "answered");
    s.stop().await;
}

#[tokio::test]
async fn decision_bodies_are_checked_from_their_framing_and_spend_nothing() {
    // ShouldRateLimit and the native Check read their one message themselves
    // (crates/service/src/grpc/unary.rs): each malformed body is refused with tonic's status for it,
    // and spends nothing.
    let mut s = serve(ServerLimits::default()).await;
    let mut client = h2_client(s.decisions_addr).await;
    let ask = RateLimitRequest {
        domain: "edge".to_string(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".to_string(),
                value: "framing".to_string(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let check = pb::CheckRequest {
        items: vec![item("ApiRequestsPerKey", "framing-native", None)],
        ..Default::default()
    };
    // (path, body, the bucket it spends, the status of a message over the size bound:
    // OUT_OF_RANGE, but for Envoy an answer, OVER_LIMIT: an error would let it through)
    let rpcs = [
        (
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            grpc_frame(&ask),
            "framing",
            "0",
        ),
        (
            "/cellrate.v1.RateLimiter/Check",
            grpc_frame(&check),
            "framing-native",
            "11",
        ),
    ];
    for (path, body, id, oversized) in rpcs {
        framing_is_checked(&mut s, &mut client, path, &body, id, oversized).await;
    }
    s.stop().await;
}

#[tokio::test]
async fn a_should_rate_limit_value_that_is_not_utf8_is_decided_as_its_stand_in() {
    // Envoy copies a header's bytes as they came; prost refuses a string that is not
    // UTF-8, and that error let the request through (Envoy's failure_mode_deny: false).
    let mut s = serve(ServerLimits::default()).await;
    let mut client = h2_client(s.decisions_addr).await;
    let marker = "\u{1}marker\u{1}";
    let raw: &[u8] = b"bad\xff\xfe\x01!!";
    assert_eq!(raw.len(), marker.len());
    let ask = RateLimitRequest {
        domain: "edge".to_string(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".to_string(),
                value: marker.to_string(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let mut body = grpc_frame(&ask);
    let at = (body.windows(marker.len()))
        .position(|w| w == marker.as_bytes())
        .unwrap();
    body[at..at + raw.len()].copy_from_slice(raw);
    let path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    for spent in 1..=3 {
        let (status, message) =
            call_with(&mut client, s.decisions_addr, path, &[], &[&body], true).await;
        assert_eq!(status.as_deref(), Some("0"), "{message:?}");
        let id = cellrate::service::envoy::stand_in(raw);
        assert_eq!(
            remaining(&mut s, "ApiRequestsPerKey", &id).await,
            10 - spent
        );
    }
    s.stop().await;
}

/// Sends `path` every malformed variant of `body` (a request that spends one on
/// ApiRequestsPerKey `id`; a message over the size bound answered with status
/// `oversized`), then `body` itself split across frames.
async fn framing_is_checked(
    s: &mut Served,
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    path: &str,
    body: &[u8],
    id: &str,
    oversized: &str,
) {
    let mut compressed = body.to_vec();
    compressed[0] = 1;
    let mut flagged = body.to_vec();
    flagged[0] = 7;
    let twice = [body, body].concat();
    let garbage = [0, 0, 0, 0, 3, 0xff, 0xff, 0xff];
    // (case, headers added, body chunks, grpc-status, what grpc-message says)
    type Case<'a> = (
        &'a str,
        &'a [(&'a str, &'a str)],
        Vec<&'a [u8]>,
        &'a str,
        &'a str,
    );
    let cases: [Case<'_>; 7] = [
        (
            "gzip",
            &[("grpc-encoding", "gzip")],
            vec![body],
            "12",
            "gzip",
        ),
        (
            "compressed flag",
            &[],
            vec![&compressed],
            "13",
            "compressed-flag",
        ),
        ("unknown flag", &[], vec![&flagged], "13", "flag: 7"),
        ("cut short", &[], vec![&body[..body.len() - 1]], "13", "EOF"),
        ("empty", &[], vec![&[]], "13", "Missing"),
        ("two messages", &[], vec![&twice], "3", "second"),
        ("not protobuf", &[], vec![&garbage], "13", "decode"),
    ];
    for (case, headers, chunks, code, says) in cases {
        let (status, message) =
            call_with(client, s.decisions_addr, path, headers, &chunks, true).await;
        let message = percent_decoded(&message.unwrap_or_default());
        assert_eq!(status.as_deref(), Some(code), "{path} {case}: {message:?}");
        assert!(message.contains(says), "{path} {case}: {message:?}");
    }
    // A prefix over the size bound is refused from the prefix, the rest never sent: the
    // server does not wait for it.
    let over = [0, 0xff, 0xff, 0xff, 0xff];
    let (status, message) = tokio::time::timeout(
        Duration::from_secs(10),
        call_with(client, s.decisions_addr, path, &[], &[&over], false),
    )
    .await
    .expect("answered without the body");
    assert_eq!(status.as_deref(), Some(oversized), "{path}: {message:?}");
    assert_eq!(remaining(s, "ApiRequestsPerKey", id).await, 10, "{path}");
    // The message split across three data frames at awkward places is answered, and spends.
    let split: [&[u8]; 3] = [&body[..2], &body[2..9], &body[9..]];
    let identity = [("grpc-encoding", "identity")];
    let (status, message) =
        call_with(client, s.decisions_addr, path, &identity, &split, true).await;
    assert_eq!(status.as_deref(), Some("0"), "{path}: {message:?}");
    assert_eq!(remaining(s, "ApiRequestsPerKey", id).await, 9, "{path}");
}

#[tokio::test]
async fn paths_next_to_the_decision_rpcs_are_unimplemented_and_spend_nothing() {
    // The decision RPCs skip tonic's router (src/shortcut.rs); paths that only look like
    // theirs must still fall to the router and be refused, as before.
    let mut s = serve(ServerLimits::default()).await;
    let mut client = h2_client(s.decisions_addr).await;
    let check = grpc_frame(&pb::CheckRequest {
        items: vec![item("ApiRequestsPerKey", "lookalike", None)],
        ..Default::default()
    });
    for path in [
        "/cellrate.v1.RateLimiter/",
        "/cellrate.v1.RateLimiter",
        "/cellrate.v1.RateLimiterX/Check",
        "/cellrate.v1.RateLimiter/Check/",
        "//cellrate.v1.RateLimiter/Check",
        "/cellrate.v1.RateLimite/Check",
        "/envoy.service.ratelimit.v3.RateLimitService/",
        "/envoy.service.ratelimit.v3.RateLimitService/Check",
    ] {
        let (status, message) = call_path(&mut client, s.decisions_addr, path, &[&check]).await;
        assert_eq!(status.as_deref(), Some("12"), "{path}: {message:?}");
    }
    assert_eq!(
        remaining(&mut s, "ApiRequestsPerKey", "lookalike").await,
        10,
        "nothing was spent"
    );
    // The real path is answered, and spends.
    let (status, _) = call_path(
        &mut client,
        s.decisions_addr,
        "/cellrate.v1.RateLimiter/Check",
        &[&check],
    )
    .await;
    assert_eq!(status.as_deref(), Some("0"));
    assert_eq!(remaining(&mut s, "ApiRequestsPerKey", "lookalike").await, 9);
    s.stop().await;
}

/// A grpc-message as written, %XX escapes decoded.
fn percent_decoded(message: &str) -> String {
    let mut out = Vec::new();
    let mut bytes = message.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex: String = bytes.by_ref().take(2).map(char::from).collect();
                out.push(u8::from_str_radix(&hex, 16).unwrap());
            }
            b => out.push(b),
        }
    }
    String::from_utf8(out).unwrap()
}

/// A Check sent as `chunks` of body on an h2 connection: its grpc-status and grpc-message,
/// from the headers (trailers-only) or the trailers.
async fn unary_call(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: std::net::SocketAddr,
    chunks: &[&[u8]],
) -> (Option<String>, Option<String>) {
    call_path(client, addr, "/cellrate.v1.RateLimiter/Check", chunks).await
}

/// A unary call to `path` as `chunks` of body: its grpc-status and grpc-message.
async fn call_path(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: std::net::SocketAddr,
    path: &str,
    chunks: &[&[u8]],
) -> (Option<String>, Option<String>) {
    call_with(client, addr, path, &[], chunks, true).await
}

/// A call to `path` with `headers` added, as `chunks` of body, the last one ending the
/// request when `end`: its grpc-status and grpc-message.
async fn call_with(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    chunks: &[&[u8]],
    end: bool,
) -> (Option<String>, Option<String>) {
    let seen = exchange(client, addr, path, headers, chunks, end, &[]).await;
    (seen.status, seen.message)
}

/// utime + stime of `pid`, in clock ticks (100 a second on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the command name, utime and stime are the 12th and 13th fields.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[tokio::test]
async fn a_small_descriptor_limit_shrinks_the_bounds_instead_of_spinning() {
    // 300 open files: the bounds shrink to fit, and 300 connections on the decision port
    // neither spin the accept loop nor starve the metrics listener.
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let server = crate::common::serve_with_nofile(&config, &[], 300);
    let addr: std::net::SocketAddr = server.listen.parse().unwrap();
    let metrics: std::net::SocketAddr = server.metrics.parse().unwrap();
    // 300 connections at once (those beyond the bound and the backlog time out).
    let attempts =
        (0..300).map(|_| tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)));
    let held: Vec<TcpStream> = futures_util::future::join_all(attempts)
        .await
        .into_iter()
        .filter_map(|c| c.ok().and_then(Result::ok))
        .collect();
    assert!(held.len() > 100, "{} connections", held.len());
    let pid = server.child.id();
    let before = cpu_ticks(pid);
    // A fixed wait on purpose: the absence of work over a span of time is what is tested.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spent = cpu_ticks(pid) - before;
    assert!(
        spent < 100,
        "{spent} ticks of CPU in 2 s while idle at the bound: spinning"
    );
    assert_eq!(
        http_get_async(metrics, "/healthz").await.0,
        200,
        "metrics starved"
    );
    drop(held);
}

/// Another loopback address than the attacker's (any 127.0.0.0/8 address works on Linux).
fn other_address() -> std::net::IpAddr {
    std::net::IpAddr::from([127, 0, 0, 2])
}

/// Opens keep-alive connections from 127.0.0.1, each asking `/healthz` once and then held,
/// until one is left waiting (the listener is full) or `attempts` have been made; returns
/// those answered. A connection closed by the server is not counted.
async fn hold_http1(addr: std::net::SocketAddr, attempts: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..attempts {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let request = b"GET /healthz HTTP/1.1\r\nhost: cellrate\r\n\r\n";
        if c.write_all(request).await.is_err() {
            continue;
        }
        let mut answer = [0u8; 512];
        match tokio::time::timeout(Duration::from_millis(500), c.read(&mut answer)).await {
            Ok(Ok(n)) if answer[..n].starts_with(b"HTTP/1.1 200") => held.push(c),
            Ok(_) => {}      // closed: over this address's share
            Err(_) => break, // waiting in the backlog: the listener is full
        }
    }
    held
}

/// One address opens as many keep-alive connections to the metrics listener as it can:
/// it gets a quarter of the listener (16 of 64), and a probe from another address is still
/// answered at once. (With the flag's 512 alone, it held all 64 and the probe timed out.)
#[tokio::test]
async fn one_address_cannot_fill_the_metrics_listener() {
    let s = serve(ServerLimits::default()).await;
    let held = hold_http1(s.metrics_addr, 2 * 64).await;
    let probe = async {
        let mut probe =
            crate::common::http1::Http1::connect_from(other_address(), s.metrics_addr).await;
        probe.get("/healthz", &[]).await.status
    };
    let answered = tokio::time::timeout(Duration::from_secs(3), probe).await;
    assert_eq!(
        answered.ok(),
        Some(200),
        "a probe from another address while 127.0.0.1 holds {} connections",
        held.len()
    );
    assert!(
        held.len() <= 16,
        "{} held: over a quarter of 64",
        held.len()
    );
    drop(held);
    s.stop().await;
}

/// The same on the admin listener (gRPC): one address holds a quarter of its 256
/// connections, and a gRPC health check from another address is answered at once.
#[tokio::test]
async fn one_address_cannot_fill_the_admin_listener() {
    let s = serve(ServerLimits::default()).await;
    let mut held = Vec::new();
    for _ in 0..2 * 256 {
        let mut c = h2_connect(s.admin_addr).await;
        match tokio::time::timeout(Duration::from_millis(500), read_frame(&mut c)).await {
            Ok(Some((SETTINGS, ..))) => held.push(c),
            Ok(_) => {}      // closed: over this address's share
            Err(_) => break, // waiting in the backlog: the listener is full
        }
    }
    let health = async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::new(other_address(), 0))
            .unwrap();
        let tcp = socket.connect(s.admin_addr).await.unwrap();
        let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        let empty = grpc_frame(&tonic_health::pb::HealthCheckRequest::default());
        let path = "/grpc.health.v1.Health/Check";
        call_path(&mut client, s.admin_addr, path, &[&empty[..]])
            .await
            .0
    };
    let answered = tokio::time::timeout(Duration::from_secs(3), health).await;
    assert_eq!(
        answered.ok().flatten().as_deref(),
        Some("0"),
        "a health check from another address while 127.0.0.1 holds {} connections",
        held.len()
    );
    assert!(
        held.len() <= 64,
        "{} held: over a quarter of 256",
        held.len()
    );
    drop(held);
    s.stop().await;
}
