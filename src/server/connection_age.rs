//! The longest a gRPC connection lives (`--grpc-max-connection-age`, envoyproxy/ratelimit's
//! `GRPC_MAX_CONNECTION_AGE` and `_GRACE`): each accepted connection draws its own age,
//! the flag's ±10 % (as Go's gRPC server draws it, so that the connections a scale-out
//! left on the old replicas do not all reconnect at once). At that age the server sends a
//! graceful GOAWAY: calls in flight finish, new calls go over a new connection (to
//! whichever replica the client's balancer picks). After the grace, a connection still
//! open is closed hard, whatever its peer does with the GOAWAY.
//!
//! tonic's own `max_connection_age` has no jitter and, with a grace, closes without a
//! GOAWAY; so each connection is served here by its own tonic server, whose shutdown
//! signal (the connection's age, or the listener's stop) is hyper's graceful shutdown of
//! that one connection. The hard close is the connection's own deadline
//! ([`GuardedStream::cut_off_at`]): its reads and writes fail, and hyper drops it.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::body::Body;
use tonic::service::Routes;
use tonic::transport::server::Router;
use tower_layer::Layer;
use tower_service::Service;

use super::tls::{Conn, Incoming};

/// A connection's age and the grace after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxConnectionAge {
    /// GOAWAY this long (±10 %) after the connection was accepted.
    pub age: Duration,
    /// Then closed hard this long after the GOAWAY; `None`: never (Go's default).
    pub grace: Option<Duration>,
}

/// Each connection's age: the configured age times a factor drawn uniformly from
/// [0.9, 1.1), from the operating system's randomness (through std's `RandomState`).
pub struct AgeDraw {
    age: Duration,
    random: RandomState,
    drawn: u64,
}

impl AgeDraw {
    pub fn new(age: Duration) -> AgeDraw {
        AgeDraw {
            age,
            random: RandomState::new(),
            drawn: 0,
        }
    }

    /// The next connection's age.
    pub fn next_age(&mut self) -> Duration {
        self.drawn = self.drawn.wrapping_add(1);
        jittered(self.age, self.random.hash_one(self.drawn))
    }
}

/// `age` times 0.9 plus a fifth of `age` scaled by `draw / 2^64`: from 0.9·age to just
/// under 1.1·age, in integer nanoseconds.
fn jittered(age: Duration, draw: u64) -> Duration {
    let nanos = age.as_nanos();
    let offset = ((nanos / 5) * u128::from(draw)) >> 64;
    let total = nanos - nanos / 10 + offset;
    Duration::from_nanos(u64::try_from(total).unwrap_or(u64::MAX))
}

/// Serves `router` on `listener`, each connection by its own server until its age (then
/// GOAWAY, and the hard close after the grace) or until `stop` (then GOAWAY and drain, as
/// tonic's own shutdown does); returns once every connection is closed after `stop`.
pub(super) async fn serve<L, ResBody>(
    router: Router<L>,
    mut incoming: Incoming,
    max_age: MaxConnectionAge,
    stop: CancellationToken,
) -> Result<(), tonic::transport::Error>
where
    Router<L>: Clone + Send + 'static,
    L: Layer<Routes> + Send + 'static,
    L::Service:
        Service<http::Request<Body>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Future: Send,
    <L::Service as Service<http::Request<Body>>>::Error: Into<tonic::codegen::StdError> + Send,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    let mut ages = AgeDraw::new(max_age.age);
    let connections = TaskTracker::new();
    loop {
        let mut stream = tokio::select! {
            Some(Ok(stream)) = incoming.next() => stream,
            _ = stop.cancelled() => break,
        };
        let age = ages.next_age();
        let accepted = tokio::time::Instant::now();
        if let Some(grace) = max_age.grace {
            stream.guarded_mut().cut_off_at(accepted + age + grace);
        }
        connections.spawn(one_connection(
            router.clone(),
            stream,
            accepted + age,
            stop.clone(),
        ));
    }
    // Closes the listening socket: new clients are refused, not left in the backlog.
    drop(incoming);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// One connection served until `goaway` (or `stop`), then drained.
async fn one_connection<L, ResBody>(
    router: Router<L>,
    stream: Conn,
    goaway: tokio::time::Instant,
    stop: CancellationToken,
) where
    L: Layer<Routes>,
    L::Service:
        Service<http::Request<Body>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Future: Send,
    <L::Service as Service<http::Request<Body>>>::Error: Into<tonic::codegen::StdError> + Send,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    // The one connection, then nothing: an incoming stream that ended would shut the
    // server down at once.
    let incoming = futures_util::stream::once(std::future::ready(Ok::<_, std::io::Error>(stream)))
        .chain(futures_util::stream::pending());
    let signal = async move {
        tokio::select! {
            _ = tokio::time::sleep_until(goaway) => {}
            _ = stop.cancelled() => {}
        }
    };
    if let Err(e) = router.serve_with_incoming_shutdown(incoming, signal).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draw_spans_ninety_to_a_hundred_and_ten_percent() {
        let age = Duration::from_secs(100);
        assert_eq!(jittered(age, 0), Duration::from_secs(90));
        assert_eq!(jittered(age, u64::MAX / 2 + 1), Duration::from_secs(100));
        let top = jittered(age, u64::MAX);
        assert!(top < Duration::from_secs(110) && top > Duration::from_millis(109_999));
        assert_eq!(
            jittered(Duration::from_secs(86_400 * 365), 0).as_secs(),
            28_382_400
        );
    }

    /// 1000 connections' ages: all within ±10 %, spread over the whole range (each tenth
    /// of it holds some), hardly two alike.
    #[test]
    fn the_ages_of_a_thousand_connections_are_spread() {
        let age = Duration::from_secs(3_600);
        let mut draw = AgeDraw::new(age);
        let ages: Vec<Duration> = (0..1000).map(|_| draw.next_age()).collect();
        let (low, high) = (age * 9 / 10, age * 11 / 10);
        assert!(ages.iter().all(|a| (low..high).contains(a)), "{ages:?}");
        let mut tenths = [0usize; 10];
        for a in &ages {
            let tenth = (a.as_nanos() - low.as_nanos()) * 10 / (high - low).as_nanos();
            tenths[tenth as usize] += 1;
        }
        assert!(
            tenths.iter().all(|&n| (50..=150).contains(&n)),
            "{tenths:?}"
        );
        let mut distinct = ages.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 990, "{} distinct ages", distinct.len());
    }
}
