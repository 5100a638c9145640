//! A bound on the requests one gRPC server handles at once, on how long a request may
//! wait to be handled, and on the messages of a unary call (one): the tower layers the
//! gRPC servers put before their services.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::clock::{Clock, Nanos};

/// A bound on the requests one gRPC server handles at once, over all its connections.
///
/// Streams per connection are bounded by HTTP/2 (`max_concurrent_streams`), but a request
/// waiting for its body holds memory until the request timeout, and connections are many:
/// this bound keeps the total finite. A request over it is answered at once with
/// UNAVAILABLE ("overloaded"), without reading its body. Admitted requests' bodies are
/// checked by [`OneMessage`].
///
/// Past saturation requests queue for the CPU: an admitted request that waited longer than
/// `max_wait` before it was first handled (or past the deadline its caller sent in
/// `grpc-timeout`) is answered at once, UNAVAILABLE (or DEADLINE_EXCEEDED), without being
/// decided: its caller has given up or soon will, so deciding it would spend tokens nobody
/// learns of, and answering it cheaply lets the fresher requests behind it through.
#[derive(Clone)]
pub struct InFlightLayer {
    permits: Arc<Semaphore>,
    max_wait: Nanos,
    clock: Arc<dyn Clock>,
}

impl InFlightLayer {
    pub fn new(max_in_flight: usize, max_wait: Nanos, clock: Arc<dyn Clock>) -> InFlightLayer {
        InFlightLayer {
            permits: Arc::new(Semaphore::new(max_in_flight.max(1))),
            max_wait,
            clock,
        }
    }
}

impl<S> tower_layer::Layer<S> for InFlightLayer {
    type Service = InFlight<S>;

    fn layer(&self, inner: S) -> InFlight<S> {
        InFlight {
            inner,
            permits: self.permits.clone(),
            max_wait: self.max_wait,
            clock: self.clock.clone(),
        }
    }
}

/// The service of [`InFlightLayer`].
#[derive(Clone)]
pub struct InFlight<S> {
    inner: S,
    permits: Arc<Semaphore>,
    max_wait: Nanos,
    clock: Arc<dyn Clock>,
}

type GrpcResponse = http::Response<tonic::body::Body>;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B> tower_service::Service<http::Request<B>> for InFlight<S>
where
    S: tower_service::Service<http::Request<OneMessage<B>>, Response = GrpcResponse>,
{
    type Response = GrpcResponse;
    type Error = S::Error;
    type Future = InFlightFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let (wait, caller_gone) = match caller_deadline(&request) {
                    Some(deadline) if deadline < self.max_wait => (deadline, true),
                    _ => (self.max_wait, false),
                };
                InFlightFuture::Admitted {
                    inner: self.inner.call(OneMessage::wrap(request)),
                    _permit: permit,
                    queue: Some(Queued {
                        until: self.clock.monotonic().saturating_add(wait),
                        caller_gone,
                        clock: self.clock.clone(),
                    }),
                }
            }
            Err(_) => InFlightFuture::Refused {
                response: Some(
                    tonic::Status::unavailable(
                        "overloaded: too many requests in flight; retry with backoff",
                    )
                    .into_http(),
                ),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`InFlight`]: the inner call holding its permit, or a refusal.
    #[project = InFlightProj]
    pub enum InFlightFuture<F> {
        Admitted {
            #[pin] inner: F,
            _permit: OwnedSemaphorePermit,
            // Until first polled: how long it may wait for that.
            queue: Option<Queued>,
        },
        Refused { response: Option<GrpcResponse> },
    }
}

/// When a request that has not yet been handled stops being worth handling.
pub struct Queued {
    until: Nanos,
    // Whether `until` is the caller's own deadline.
    caller_gone: bool,
    clock: Arc<dyn Clock>,
}

impl Queued {
    /// The answer for a request first handled now, if it waited too long.
    fn expired(self) -> Option<GrpcResponse> {
        if self.clock.monotonic() <= self.until {
            return None;
        }
        let status = if self.caller_gone {
            tonic::Status::deadline_exceeded(
                "the caller's deadline (grpc-timeout) passed before the request was handled",
            )
        } else {
            tonic::Status::unavailable(
                "overloaded: the request waited longer than --max-queue-ms to be handled; \
                 retry with backoff",
            )
        };
        Some(status.into_http())
    }
}

/// The deadline a caller sent in `grpc-timeout` (an integer of at most 8 digits and a unit:
/// H, M, S, m, u, n), in nanoseconds; `None` when absent or malformed (gRPC's own parser
/// refuses malformed ones later).
fn caller_deadline<B>(request: &http::Request<B>) -> Option<Nanos> {
    let text = request.headers().get("grpc-timeout")?.as_bytes();
    let (&unit, digits) = text.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value: Nanos = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let per: Nanos = match unit {
        b'H' => 3_600_000_000_000,
        b'M' => 60_000_000_000,
        b'S' => 1_000_000_000,
        b'm' => 1_000_000,
        b'u' => 1_000,
        b'n' => 1,
        _ => return None,
    };
    value.checked_mul(per)
}

impl<F, E> Future for InFlightFuture<F>
where
    F: Future<Output = Result<GrpcResponse, E>>,
{
    type Output = Result<GrpcResponse, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            InFlightProj::Admitted { inner, queue, .. } => {
                if let Some(response) = queue.take().and_then(Queued::expired) {
                    return Poll::Ready(Ok(response));
                }
                inner.poll(cx)
            }
            InFlightProj::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending,
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// A request body that fails with INVALID_ARGUMENT when a unary call carries a second
    /// gRPC message (tonic would silently drop it). It follows the gRPC framing (a flag
    /// byte, a 4-byte length, the message) across data frames without buffering.
    /// Streaming calls (server reflection, RLQS) pass through unchecked.
    pub struct OneMessage<B> {
        #[pin]
        inner: B,
        unary: bool,
        // Bytes of the current frame header seen (0 = at a frame boundary).
        header_seen: usize,
        header: [u8; 5],
        payload_left: u64,
        messages: u32,
    }
}

impl<B> OneMessage<B> {
    fn wrap(request: http::Request<B>) -> http::Request<OneMessage<B>> {
        // Every cellrate and Envoy RPC is unary in its request; reflection and RLQS stream.
        let path = request.uri().path();
        let unary = !path.starts_with("/grpc.reflection.")
            && !path.starts_with("/envoy.service.rate_limit_quota.");
        request.map(|inner| OneMessage {
            inner,
            unary,
            header_seen: 0,
            header: [0; 5],
            payload_left: 0,
            messages: 0,
        })
    }
}

impl<B> OneMessage<B> {
    /// Follows the framing through `data`; false when a second message begins.
    fn follow(
        header_seen: &mut usize,
        header: &mut [u8; 5],
        payload_left: &mut u64,
        messages: &mut u32,
        mut data: &[u8],
    ) -> bool {
        while !data.is_empty() {
            if *payload_left > 0 {
                let n = (*payload_left).min(data.len() as u64) as usize;
                *payload_left -= n as u64;
                data = &data[n..];
                continue;
            }
            if *header_seen == 0 {
                *messages += 1;
                if *messages > 1 {
                    return false;
                }
            }
            let n = (5 - *header_seen).min(data.len());
            header[*header_seen..*header_seen + n].copy_from_slice(&data[..n]);
            *header_seen += n;
            data = &data[n..];
            if *header_seen == 5 {
                *payload_left = u64::from(u32::from_be_bytes([
                    header[1], header[2], header[3], header[4],
                ]));
                *header_seen = 0;
            }
        }
        true
    }
}

impl<B> http_body::Body for OneMessage<B>
where
    B: http_body::Body<Data = bytes::Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = self.project();
        let frame = match ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            None => return Poll::Ready(None),
        };
        if *this.unary {
            if let Some(data) = frame.data_ref() {
                if !OneMessage::<B>::follow(
                    this.header_seen,
                    this.header,
                    this.payload_left,
                    this.messages,
                    data,
                ) {
                    return Poll::Ready(Some(Err(Box::new(tonic::Status::invalid_argument(
                        "request: a unary call carries exactly one message; a second one followed",
                    )))));
                }
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{FakeClock, SECOND};
    use tower_layer::Layer;
    use tower_service::Service;

    /// A service that answers OK and counts the requests it handled: as tonic's, its
    /// future does the work when polled, not when made.
    #[derive(Clone, Default)]
    struct Answers(Arc<std::sync::atomic::AtomicUsize>);

    type Answer = Result<GrpcResponse, std::convert::Infallible>;

    impl<B> Service<http::Request<B>> for Answers {
        type Response = GrpcResponse;
        type Error = std::convert::Infallible;
        type Future = Pin<Box<dyn Future<Output = Answer> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<B>) -> Self::Future {
            let handled = self.0.clone();
            Box::pin(async move {
                handled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(http::Response::new(tonic::body::Body::empty()))
            })
        }
    }

    fn status(response: &GrpcResponse) -> Option<tonic::Code> {
        tonic::Status::from_header_map(response.headers()).map(|s| s.code())
    }

    fn request(timeout: Option<&str>) -> http::Request<()> {
        let mut builder = http::Request::post("/cellrate.v1.RateLimiter/Check");
        if let Some(timeout) = timeout {
            builder = builder.header("grpc-timeout", timeout);
        }
        builder.body(()).unwrap()
    }

    /// Calls `request` (as the connection task does on its arrival), lets `waited` pass,
    /// then polls it (as the task that handles it does when it gets the CPU).
    fn after(waited: Nanos, request: http::Request<()>) -> (GrpcResponse, usize) {
        let clock = FakeClock::new(0);
        let inner = Answers::default();
        let mut service =
            InFlightLayer::new(8, SECOND / 4, Arc::new(clock.clone())).layer(inner.clone());
        let future = service.call(request);
        clock.advance(waited);
        let response = futures_executor(future);
        (response, inner.0.load(std::sync::atomic::Ordering::SeqCst))
    }

    fn futures_executor<F: Future<Output = Answer>>(future: F) -> GrpcResponse {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
            .unwrap()
    }

    #[test]
    fn a_request_handled_within_its_wait_is_decided() {
        let (response, handled) = after(SECOND / 5, request(None));
        assert_eq!(status(&response), None, "answered by the service");
        assert_eq!(handled, 1);
    }

    #[test]
    fn a_request_that_waited_too_long_is_answered_unavailable_undecided() {
        let (response, handled) = after(SECOND / 4 + 1, request(None));
        assert_eq!(status(&response), Some(tonic::Code::Unavailable));
        assert_eq!(handled, 0, "decided although shed");
    }

    #[test]
    fn a_request_past_its_callers_deadline_is_answered_deadline_exceeded() {
        // Envoy's 100 ms: shorter than the server's own 250 ms.
        let (response, handled) = after(SECOND / 10 + 1, request(Some("100m")));
        assert_eq!(status(&response), Some(tonic::Code::DeadlineExceeded));
        assert_eq!(handled, 0, "decided although its caller is gone");
        let (response, _) = after(SECOND / 10 - 1_000_000, request(Some("100m")));
        assert_eq!(status(&response), None);
        // A longer caller deadline does not extend the server's bound.
        let (response, _) = after(SECOND / 4 + 1, request(Some("5S")));
        assert_eq!(status(&response), Some(tonic::Code::Unavailable));
    }

    #[test]
    fn grpc_timeouts_are_read_as_grpc_writes_them() {
        let read = |text: &str| caller_deadline(&request(Some(text)));
        assert_eq!(read("100m"), Some(100_000_000));
        assert_eq!(read("2S"), Some(2 * SECOND));
        assert_eq!(read("1H"), Some(3_600 * SECOND));
        assert_eq!(read("99999999n"), Some(99_999_999));
        for bad in ["", "m", "123456789m", "10x", "-1m", "1.5S", "١m"] {
            assert_eq!(read(bad), None, "{bad:?}");
        }
    }
}
