//! `--grpc-max-connection-age` and its grace (envoyproxy/ratelimit's
//! `GRPC_MAX_CONNECTION_AGE`, `_GRACE`): a connection gets a graceful GOAWAY at about its
//! age, its call in flight still completes, the client's next call goes over a new
//! connection; a client that ignores the GOAWAY is cut off after the grace. Real clients
//! (tonic, and HTTP/2 by hand) over real loopback sockets.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::h2_raw::{self, ACK, DATA, GOAWAY, PING};
use crate::common::{example_limits, item, Served};
use cellrate::proto::v1 as pb;
use cellrate::server::connection_age::MaxConnectionAge;
use cellrate::server::{ServerLimits, Settings};
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A server whose connections live `age` (±10 %), then `grace`; requests may take a
/// minute, so that only the age and the grace end a held call.
async fn serve(age: Duration, grace: Option<Duration>, max_connections: usize) -> Served {
    let mut server = ServerLimits {
        request_timeout: Duration::from_secs(60),
        max_connection_age: Some(MaxConnectionAge { age, grace }),
        ..ServerLimits::default()
    };
    server.decisions.max_connections = max_connections;
    let settings = Settings {
        server,
        ..Settings::default()
    };
    Served::with_settings(example_limits(), settings).await
}

fn one_item() -> Vec<pb::Item> {
    vec![item("ApiRequestsPerKey", "aged", Some(1))]
}

#[tokio::test]
async fn goaway_comes_at_about_the_age_and_the_call_in_flight_completes() {
    let age = Duration::from_millis(500);
    let s = serve(age, Some(Duration::from_secs(10)), 4096).await;
    let mut conn = TcpStream::connect(s.decisions_addr).await.unwrap();
    let opened = Instant::now();
    h2_raw::start(&mut conn).await;
    // A call whose body is held back: in flight when the age comes.
    conn.write_all(&h2_raw::check_headers(1)).await.unwrap();
    let mut goaway_after = None;
    let mut answer = None;
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some((kind, flags, stream, payload)) = h2_raw::read_frame(&mut conn).await {
            match kind {
                PING if flags & ACK == 0 => {
                    let pong = h2_raw::frame(PING, ACK, 0, &payload);
                    conn.write_all(&pong).await.unwrap();
                }
                GOAWAY if goaway_after.is_none() => {
                    goaway_after = Some(opened.elapsed());
                    conn.write_all(&h2_raw::check_body(1, one_item()))
                        .await
                        .unwrap();
                }
                DATA if stream == 1 && payload.len() > 5 => {
                    answer = Some(pb::CheckResponse::decode(&payload[5..]).unwrap());
                }
                _ => {}
            }
        }
        opened.elapsed()
    })
    .await
    .expect("the connection closes once its call is answered");
    let goaway_after = goaway_after.expect("a GOAWAY came");
    assert!(
        goaway_after >= age * 9 / 10 && goaway_after < age * 3,
        "GOAWAY after {goaway_after:?}, for an age of {age:?}"
    );
    let answer = answer.expect("the call in flight at the GOAWAY was answered");
    assert_eq!(answer.items.len(), 1, "{answer:?}");
    assert!(answer.items[0].allowed, "{answer:?}");
    // Closed by the server once the call was done, long before the 10 s grace.
    assert!(closed < Duration::from_secs(5), "closed after {closed:?}");
    s.stop().await;
}

#[tokio::test]
async fn after_the_age_a_clients_next_call_goes_over_a_new_connection() {
    let age = Duration::from_millis(300);
    let s = serve(age, Some(Duration::from_secs(10)), 4096).await;
    let connects = Arc::new(AtomicUsize::new(0));
    let connector = Counted {
        addr: s.decisions_addr,
        connects: connects.clone(),
    };
    let channel = tonic::transport::Endpoint::from_static("http://cellrate")
        .connect_with_connector_lazy(connector);
    let mut client = pb::rate_limiter_client::RateLimiterClient::new(channel);
    let started = Instant::now();
    let mut calls = 0;
    // Calls every 20 ms until the client has had to connect again (at most 5 s).
    while connects.load(Ordering::SeqCst) < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no second connection"
        );
        let request = pb::CheckRequest {
            items: one_item(),
            ..Default::default()
        };
        let answer = client.check(request).await.expect("every call is answered");
        assert!(answer.into_inner().items[0].allowed);
        calls += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reconnected = started.elapsed();
    assert!(
        reconnected >= age * 9 / 10,
        "reconnected after {reconnected:?}, before the age {age:?}"
    );
    assert!(calls >= 5, "{calls} calls over the first connection");
    // And the calls over the new connection are answered.
    let request = pb::CheckRequest {
        items: one_item(),
        ..Default::default()
    };
    client
        .check(request)
        .await
        .expect("answered over the new connection");
    assert_eq!(connects.load(Ordering::SeqCst), 2);
    s.stop().await;
}

/// The attacker ignores the GOAWAY: it answers no PING and holds a call open (its body
/// never comes, and requests may take a minute). After the age and the grace the server
/// closes the connection, and its place under the connection bound (here 1) is free.
#[tokio::test]
async fn a_client_that_ignores_goaway_is_cut_off_after_the_grace() {
    let (age, grace) = (Duration::from_millis(300), Duration::from_millis(300));
    let s = serve(age, Some(grace), 1).await;
    let mut conn = TcpStream::connect(s.decisions_addr).await.unwrap();
    let opened = Instant::now();
    h2_raw::start(&mut conn).await;
    conn.write_all(&h2_raw::check_headers(1)).await.unwrap();
    let goaway = h2_raw::read_until(&mut conn, GOAWAY, Duration::from_secs(5)).await;
    assert!(goaway.is_some(), "a GOAWAY before the close");
    // Nothing but EOF from now on (the frames after the GOAWAY are skipped).
    let eof = h2_raw::read_until(&mut conn, 0xff, Duration::from_secs(5)).await;
    assert!(eof.is_none());
    let closed = opened.elapsed();
    let earliest = age * 9 / 10 + grace;
    assert!(
        closed >= earliest && closed < earliest + Duration::from_secs(2),
        "closed after {closed:?}; age {age:?}, grace {grace:?}"
    );
    // The bound's one place is free again: a new client is answered.
    let mut client =
        pb::rate_limiter_client::RateLimiterClient::connect(format!("http://{}", s.decisions_addr))
            .await
            .unwrap();
    let request = pb::CheckRequest {
        items: one_item(),
        ..Default::default()
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), client.check(request))
        .await
        .expect("answered within 5 s")
        .unwrap();
    assert!(answer.into_inner().items[0].allowed);
    s.stop().await;
}

/// A tonic connector that counts the connections it opens.
#[derive(Clone)]
struct Counted {
    addr: std::net::SocketAddr,
    connects: Arc<AtomicUsize>,
}

impl tower_service::Service<http::Uri> for Counted {
    type Response = hyper_util::rt::TokioIo<TcpStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        self.connects.fetch_add(1, Ordering::SeqCst);
        let addr = self.addr;
        Box::pin(async move {
            let stream = TcpStream::connect(addr).await?;
            Ok(hyper_util::rt::TokioIo::new(stream))
        })
    }
}
