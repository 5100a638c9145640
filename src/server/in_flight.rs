//! A bound on the requests one gRPC server handles at once, and on the messages of a
//! unary call (one): the tower layers the gRPC servers put before their services.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use super::listener::ConnectionInfo;
use super::per_address::InFlightCount;
use crate::grpc::{declared_length, Kind, Unary, PREFIX};

/// A bound on the requests one gRPC server handles at once, over all its connections.
///
/// Streams per connection are bounded by HTTP/2 (`max_concurrent_streams`), but a request
/// waiting for its body holds memory until the request timeout, and connections are many:
/// this bound keeps the total finite. A request over it is answered at once with
/// UNAVAILABLE ("overloaded"), without reading its body. One client address (an IPv6
/// address by its /64, as connections are counted) holds at most its share of the bound
/// (`--max-in-flight-per-address`, a quarter by default): beyond it that address's new
/// requests are refused the same way while other addresses still find slots, so stalled
/// streams on many connections from one address cannot take every slot. Admitted
/// requests' bodies are checked by [`OneMessage`], and must arrive within the body timeout.
#[derive(Clone)]
pub struct InFlightLayer {
    slots: Arc<Slots>,
    /// The longest a unary request's body may take to arrive, from the first time its
    /// server waits for it (`None`: only the request timeout).
    body_timeout: Option<Duration>,
    /// While this holds true (the first xDS update not yet in force), every request but
    /// gRPC health's is answered UNAVAILABLE at once: connections are answered, never left
    /// hanging, and probes learn NOT_SERVING.
    waiting: Option<Arc<AtomicBool>>,
    /// How the decision RPCs are served: by tonic, their bodies are checked here too.
    unary: Unary,
}

impl InFlightLayer {
    pub fn new(max_in_flight: usize) -> InFlightLayer {
        InFlightLayer {
            slots: Arc::new(Slots {
                taken: AtomicUsize::new(0),
                max: max_in_flight.max(1),
                per_address: 0,
            }),
            body_timeout: None,
            waiting: None,
            unary: Unary::Direct,
        }
    }

    /// The decision RPCs served as `unary` says (by tonic: their bodies checked here).
    pub fn with_unary(mut self, unary: Unary) -> InFlightLayer {
        self.unary = unary;
        self
    }

    /// At most `n` requests in flight from one client address (0: no such share).
    pub fn with_per_address(mut self, n: usize) -> InFlightLayer {
        self.slots = Arc::new(Slots {
            taken: AtomicUsize::new(0),
            max: self.slots.max,
            per_address: n,
        });
        self
    }

    /// A unary request whose body has not arrived within `timeout` of the first wait for
    /// it ends with DEADLINE_EXCEEDED, giving its slot back.
    pub fn with_body_timeout(mut self, timeout: Duration) -> InFlightLayer {
        self.body_timeout = Some(timeout);
        self
    }

    /// Refuses every request but gRPC health's (UNAVAILABLE) while `waiting` holds true.
    pub fn with_gate(mut self, waiting: Option<Arc<AtomicBool>>) -> InFlightLayer {
        self.waiting = waiting;
        self
    }
}

impl<S> tower_layer::Layer<S> for InFlightLayer {
    type Service = InFlight<S>;

    fn layer(&self, inner: S) -> InFlight<S> {
        InFlight {
            inner,
            slots: self.slots.clone(),
            body_timeout: self.body_timeout,
            waiting: self.waiting.clone(),
            unary: self.unary,
        }
    }
}

/// The service of [`InFlightLayer`].
#[derive(Clone)]
pub struct InFlight<S> {
    inner: S,
    slots: Arc<Slots>,
    body_timeout: Option<Duration>,
    waiting: Option<Arc<AtomicBool>>,
    unary: Unary,
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
        if self
            .waiting
            .as_ref()
            .is_some_and(|w| w.load(Ordering::Acquire))
            // gRPC health's methods are answered while the first xDS update is awaited
            // (still under the in-flight bound).
            && !(request.uri().path().strip_prefix('/'))
                .and_then(|p| p.strip_prefix(crate::grpc::HEALTH))
                .is_some_and(|p| p.starts_with('/'))
        {
            let status = tonic::Status::unavailable(
                "waiting for the first xDS update: no limits in force yet; retry with backoff",
            );
            return InFlightFuture::Refused {
                response: Some(status.into_http()),
            };
        }
        let address = match self.slots.per_address {
            0 => None,
            _ => request
                .extensions()
                .get::<ConnectionInfo>()
                .and_then(|c| c.address_in_flight.clone()),
        };
        match Slots::take(&self.slots, address) {
            Ok(slot) => InFlightFuture::Admitted {
                inner: self
                    .inner
                    .call(OneMessage::wrap(request, self.body_timeout, self.unary)),
                _slot: slot,
            },
            Err(refusal) => InFlightFuture::Refused {
                response: Some(tonic::Status::unavailable(refusal).into_http()),
            },
        }
    }
}

/// The count of requests in flight, and its bound, in all and per client address (the
/// address's count comes with its connection: no lookup per request). Requests over it are
/// refused, never queued, so a counter is all it takes (a semaphore's release takes its
/// waiters' lock on every request: about 200 instructions of a request's 50 000).
pub struct Slots {
    taken: AtomicUsize,
    max: usize,
    /// The most one address may hold (0: no share).
    per_address: usize,
}

/// Why a request was refused a slot.
const OVERLOADED: &str = "overloaded: too many requests in flight; retry with backoff";
const ADDRESS_OVERLOADED: &str =
    "overloaded: too many requests in flight from this client address; retry with backoff";

impl Slots {
    /// A slot, if one is free and `address` (the count of its client address's requests,
    /// if known) is under its share: held until the [`Slot`] is dropped.
    fn take(slots: &Arc<Slots>, address: Option<InFlightCount>) -> Result<Slot, &'static str> {
        // Raised only while under the bound (never over it and back, which would refuse a
        // caller while a flood of refusals is under way, with a slot free). Relaxed is
        // enough: the counts order nothing else.
        let under = |max: usize| move |taken: usize| (taken < max).then_some(taken + 1);
        if let Some(count) = &address {
            (count.fetch_update(
                Ordering::Relaxed,
                Ordering::Relaxed,
                under(slots.per_address),
            ))
            .map_err(|_| ADDRESS_OVERLOADED)?;
        }
        // Made now, so that a refusal below gives the address's place back.
        let mut slot = Slot {
            slots: slots.clone(),
            address,
            counted: false,
        };
        (slots.taken)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, under(slots.max))
            .map_err(|_| OVERLOADED)?;
        slot.counted = true;
        Ok(slot)
    }
}

/// One request's place under [`Slots`]' bounds, given back when dropped.
pub struct Slot {
    slots: Arc<Slots>,
    address: Option<InFlightCount>,
    /// Whether it holds a place in the whole count (else only its address's).
    counted: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.counted {
            self.slots.taken.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(count) = &self.address {
            count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`InFlight`]: the inner call holding its slot, or a refusal.
    #[project = InFlightProj]
    pub enum InFlightFuture<F> {
        Admitted { #[pin] inner: F, _slot: Slot },
        Refused { response: Option<GrpcResponse> },
    }
}

impl<F, E> Future for InFlightFuture<F>
where
    F: Future<Output = Result<GrpcResponse, E>>,
{
    type Output = Result<GrpcResponse, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            InFlightProj::Admitted { inner, .. } => inner.poll(cx),
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
    /// Streaming calls (server reflection, RLQS) pass through unchecked, and so do
    /// ShouldRateLimit and the native Check when served by hand, whose server reads their
    /// one message itself and refuses a second the same way (`grpc::unary`).
    pub struct OneMessage<B> {
        #[pin]
        inner: B,
        unary: bool,
        // Bytes of the current frame header seen (0 = at a frame boundary).
        header_seen: usize,
        header: [u8; PREFIX],
        payload_left: u64,
        messages: u32,
        // The body timeout (`None`: a streaming call, or none set), and its deadline, armed
        // the first time the body is waited for (a body that came with its headers arms
        // no timer).
        body_timeout: Option<Duration>,
        deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    }
}

impl<B> OneMessage<B> {
    /// `request`'s body, checked as its route says (`decisions`: how the decision RPCs
    /// are served), within `body_timeout` unless it streams.
    pub(crate) fn wrap(
        request: http::Request<B>,
        body_timeout: Option<Duration>,
        decisions: Unary,
    ) -> http::Request<OneMessage<B>> {
        // The route table says which calls stream; a path that names no RPC (answered
        // UNIMPLEMENTED) is checked as a unary call.
        let kind = crate::grpc::route(request.uri().path()).map(|rpc| rpc.kind);
        let streaming = kind == Some(Kind::Streaming);
        let unary = match kind {
            Some(Kind::Streaming) => false,
            // Served by hand, a decision RPC reads its one message itself.
            Some(Kind::Decision) => decisions == Unary::Tonic,
            Some(Kind::Unary) | None => true,
        };
        request.map(|inner| OneMessage {
            inner,
            unary,
            header_seen: 0,
            header: [0; PREFIX],
            payload_left: 0,
            messages: 0,
            body_timeout: body_timeout.filter(|_| !streaming),
            deadline: None,
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
            let n = (PREFIX - *header_seen).min(data.len());
            header[*header_seen..*header_seen + n].copy_from_slice(&data[..n]);
            *header_seen += n;
            data = &data[n..];
            if *header_seen == PREFIX {
                *payload_left = u64::from(declared_length(header));
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
        let polled = this.inner.poll_frame(cx);
        if let (Poll::Pending, Some(timeout)) = (&polled, *this.body_timeout) {
            let deadline = this
                .deadline
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(Box::new(tonic::Status::deadline_exceeded(
                    format!(
                        "the request body did not arrive within {} ms of the first wait for it",
                        timeout.as_millis()
                    ),
                )))));
            }
        }
        let frame = match ready!(polled) {
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
                        crate::grpc::unary::SECOND_MESSAGE,
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

    #[test]
    fn slots_are_bounded_and_given_back_when_dropped() {
        let slots = InFlightLayer::new(2).slots;
        let (a, b) = (Slots::take(&slots, None), Slots::take(&slots, None));
        assert!(a.is_ok() && b.is_ok());
        assert!(
            Slots::take(&slots, None).is_err(),
            "a third over a bound of 2"
        );
        assert_eq!(
            slots.taken.load(Ordering::Relaxed),
            2,
            "a refusal holds nothing"
        );
        drop(a);
        let c = Slots::take(&slots, None);
        assert!(c.is_ok(), "the dropped slot is free again");
        drop((b, c));
        assert_eq!(slots.taken.load(Ordering::Relaxed), 0);
    }

    /// One address holds at most its share; another still takes slots up to the bound; a
    /// refusal by the whole bound gives the address's place back.
    #[test]
    fn an_address_holds_at_most_its_share() {
        let slots = InFlightLayer::new(4).with_per_address(2).slots;
        let (a, b) = (InFlightCount::default(), InFlightCount::default());
        let held: Vec<Slot> = (0..2)
            .map(|_| Slots::take(&slots, Some(a.clone())).unwrap())
            .collect();
        assert_eq!(
            Slots::take(&slots, Some(a.clone())).err(),
            Some(ADDRESS_OVERLOADED)
        );
        let others: Vec<Slot> = (0..2)
            .map(|_| Slots::take(&slots, Some(b.clone())).unwrap())
            .collect();
        let c = InFlightCount::default();
        assert_eq!(Slots::take(&slots, Some(c.clone())).err(), Some(OVERLOADED));
        assert_eq!(c.load(Ordering::Relaxed), 0, "given back");
        drop((held, others));
        assert_eq!(a.load(Ordering::Relaxed) + b.load(Ordering::Relaxed), 0);
        assert_eq!(slots.taken.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn many_threads_never_hold_more_than_the_bound() {
        let slots = InFlightLayer::new(3).slots;
        // Holders counted apart from the bound's own count (which a refused taker
        // raises for an instant).
        let (holding, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (slots, holding, most) = (slots.clone(), holding.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        // The count itself never goes over the bound, not even for an
                        // instant (a refused taker leaves it as it was).
                        assert!(slots.taken.load(Ordering::Relaxed) <= 3, "count over");
                        if let Ok(slot) = Slots::take(&slots, None) {
                            let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            holding.fetch_sub(1, Ordering::SeqCst);
                            drop(slot);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 3, "at most 3 held at once");
        assert_eq!(slots.taken.load(Ordering::Relaxed), 0);
    }
}
