//! Envoy's Rate Limit Quota Service (RLQS,
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`) on the
//! decision listener: Envoy's `rate_limit_quota` filter streams usage reports per bucket
//! and enforces locally whatever it is assigned; cellrate divides each configured limit
//! among the buckets that report demand for it ([`super::quota_book`]) and answers every
//! report with the bucket's assignment (a token bucket, ALLOW_ALL or DENY_ALL, for
//! `--rlqs-assignment-ttl-seconds`), pushing changed shares to other streams at once.
//!
//! Bucket ids map to limits by the rules of `quota.yaml` (as descriptors do, with the keys
//! matched as a set); a bucket no rule maps is told ALLOW_ALL; one whose rule a reload
//! removed, or that saw no request for `--rlqs-idle-seconds`, is abandoned.
//!
//! Hostile streams: at most `--rlqs-max-streams` at once (more: RESOURCE_EXHAUSTED), each
//! ended after `--rlqs-idle-seconds` without a message, at most [`MAX_MESSAGE_BYTES`] a
//! message, [`MAX_STREAM_WORK_PER_SECOND`] units of work a second per stream and
//! [`MAX_WORK_PER_SECOND`] over all streams (beyond, reading waits: TCP pushes back),
//! bucket ids of at most [`MAX_BUCKET_ENTRIES`] entries of bounded size; at most
//! `--rlqs-max-buckets` buckets tracked in all and `--rlqs-max-buckets-per-stream` per
//! stream (beyond, a new bucket gets no assignment and Envoy applies its no-assignment
//! behaviour). A malformed message ends its stream with INVALID_ARGUMENT saying what and
//! where, before any of it is applied. A stream that does not read its answers (its queue of
//! [`QUEUE`] full, whether by its own answers or by pushes) is ended: a share that cannot be
//! delivered must not be assumed delivered.
//!
//! `stream.rs` serves one stream (reports read within their budget, answered, shares
//! pushed); `resolve.rs` checks a report's domain and bucket ids and maps them to limits.

mod resolve;
mod stream;

use stream::{push, serve_stream, Budget};

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::service::quota_book::{BookBounds, QuotaBook};
use crate::service::Decider;
use cellrate_core::clock::{Clock, Nanos};
use cellrate_observe::metrics::Metrics;
use cellrate_store::shared::SharedDemand;

/// Entries of one bucket id, at most.
pub const MAX_BUCKET_ENTRIES: usize = 16;
/// Bytes of a bucket id's key, and of its value, at most.
pub const MAX_BUCKET_KEY: usize = 128;
pub const MAX_BUCKET_VALUE: usize = 512;
/// Bytes of a domain, at most.
pub const MAX_DOMAIN: usize = 128;
/// Work one stream may cause per second (and at once): a bucket report is one unit, and
/// each other reporter of its limit that it makes cellrate look at is one more.
pub const MAX_STREAM_WORK_PER_SECOND: u64 = 10_000;
/// Work all streams together may cause per second (and at once).
pub const MAX_WORK_PER_SECOND: u64 = 200_000;
/// Largest report message (an Envoy reports all its buckets in one message, about 100 bytes
/// each): with the default `--rlqs-max-streams`, at most 256 MiB held by reports.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// The default of [`RlqsSettings::max_bucket_bytes`]: 100 000 buckets of ids about 200
/// bytes long (an Envoy's are a few entries of tens of bytes), while 100 000 ids of the
/// largest allowed size (16 entries of 640 bytes) would take 1 GiB.
pub const DEFAULT_MAX_BUCKET_BYTES: usize = 32 << 20;
/// Answers waiting to be sent on one stream; a stream that does not read them is ended.
pub const QUEUE: usize = 64;

/// How the RLQS service behaves and what it tracks at most.
#[derive(Debug, Clone, Copy)]
pub struct RlqsSettings {
    pub max_streams: usize,
    pub max_buckets: usize,
    pub max_buckets_per_stream: usize,
    /// Bytes of bucket ids held at most, over every stream (see [`BookBounds::max_bytes`]).
    pub max_bucket_bytes: usize,
    /// Lifetime of an assignment in Envoy (whole seconds: Envoy ignores fractions).
    pub assignment_ttl: Duration,
    /// A stream silent for this long is ended; a bucket without requests for this long is
    /// abandoned.
    pub idle: Duration,
    /// With a shared demand (Redis): how often it is exchanged.
    pub sync: Duration,
}

impl Default for RlqsSettings {
    fn default() -> RlqsSettings {
        RlqsSettings {
            max_streams: 256,
            max_buckets: 100_000,
            max_buckets_per_stream: 10_000,
            max_bucket_bytes: DEFAULT_MAX_BUCKET_BYTES,
            assignment_ttl: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            sync: Duration::from_secs(1),
        }
    }
}

pub(super) type Answers = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// What the streams share.
pub(super) struct Shared {
    decider: Arc<Decider>,
    metrics: Arc<Metrics>,
    settings: RlqsSettings,
    book: Mutex<QuotaBook>,
    /// Each open stream's queue of answers, for pushes from other streams' reports, and
    /// the token that ends it when a push finds the queue full.
    senders: Mutex<HashMap<u64, (Answers, CancellationToken)>>,
    /// Numbers the streams.
    streams: AtomicU64,
    permits: Arc<Semaphore>,
    stop: CancellationToken,
    /// The work of every stream together.
    work: Mutex<Budget>,
    /// Whose monotonic time the book's assignments live and linger in (a test moves a fake
    /// clock past an assignment's life instead of waiting for it), and where it stood at
    /// `epoch`, the instant the book's times count from.
    clock: Arc<dyn Clock>,
    epoch: (Instant, Nanos),
}

impl Shared {
    /// The book's time now: `epoch` plus what the clock's monotonic time has moved since.
    fn book_now(&self) -> Instant {
        let (at, from) = self.epoch;
        let moved = self.clock.monotonic().saturating_sub(from).max(0);
        at + Duration::from_nanos(moved as u64)
    }
}

/// The RLQS service.
pub struct RlqsService {
    shared: Arc<Shared>,
}

impl RlqsService {
    /// `stop` ends every stream (at shutdown, so that Envoys move to another replica);
    /// assignments live and linger on `clock`'s monotonic time.
    pub fn new(
        decider: Arc<Decider>,
        metrics: Arc<Metrics>,
        settings: RlqsSettings,
        stop: CancellationToken,
        clock: Arc<dyn Clock>,
    ) -> RlqsService {
        let bounds = BookBounds {
            max_buckets: settings.max_buckets,
            max_buckets_per_stream: settings.max_buckets_per_stream,
            max_bytes: settings.max_bucket_bytes,
            idle: settings.idle,
            linger: settings.assignment_ttl,
        };
        RlqsService {
            shared: Arc::new(Shared {
                decider,
                metrics,
                settings,
                book: Mutex::new(QuotaBook::new(bounds)),
                senders: Mutex::new(HashMap::new()),
                streams: AtomicU64::new(0),
                permits: Arc::new(Semaphore::new(settings.max_streams)),
                stop,
                work: Mutex::new(Budget::new(Instant::now(), MAX_WORK_PER_SECOND)),
                epoch: (Instant::now(), clock.monotonic()),
                clock,
            }),
        }
    }
}

impl RlqsService {
    /// Divides every limit among the reporters of every replica on `demand`: exchanges
    /// this replica's demand every `sync` until the server stops. While the exchange fails,
    /// the last view holds for three intervals; then each replica divides among its own.
    pub fn with_shared_demand(self, demand: Arc<dyn SharedDemand>) -> RlqsService {
        tokio::spawn(share_demand(self.shared.clone(), demand));
        self
    }
}

async fn share_demand(shared: Arc<Shared>, demand: Arc<dyn SharedDemand>) {
    let every = shared.settings.sync;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_ok, mut failing) = (Instant::now(), false);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shared.stop.cancelled() => return,
        }
        let mine = shared.book.lock().aggregates();
        let remote = match demand.exchange(&mine).await {
            Ok(theirs) => {
                if failing {
                    tracing::info!("rlqs: demand shared through redis again");
                    failing = false;
                }
                last_ok = Instant::now();
                Some(mine.into_iter().map(|(key, _)| key).zip(theirs).collect())
            }
            Err(e) => {
                shared.metrics.rlqs_refused("sync_failure");
                if !failing {
                    tracing::warn!(error = %e, "rlqs: cannot share demand through redis; the last view holds for three intervals, then each replica divides among its own");
                    failing = true;
                }
                if last_ok.elapsed() < 3 * every {
                    continue;
                }
                None
            }
        };
        let pushes = shared.book.lock().set_remote(remote).0;
        push(&shared, pushes);
    }
}

type AnswerStream = tokio_stream::wrappers::ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = AnswerStream;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<AnswerStream>, Status> {
        let permit = self
            .shared
            .permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                self.shared.metrics.rlqs_refused("too_many_streams");
                Status::resource_exhausted(format!(
                    "{} RLQS streams are open, the most allowed (--rlqs-max-streams)",
                    self.shared.settings.max_streams
                ))
            })?;
        let id = self.shared.streams.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(QUEUE);
        let undelivered = CancellationToken::new();
        self.shared
            .senders
            .lock()
            .insert(id, (tx.clone(), undelivered.clone()));
        self.shared.metrics.rlqs.streams.inc();
        tokio::spawn(serve_stream(
            self.shared.clone(),
            id,
            request.into_inner(),
            tx,
            undelivered,
            permit,
        ));
        Ok(Response::new(AnswerStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use super::resolve::{check_bucket, check_domain};
    use super::*;
    use crate::service::quota_book::Strategy;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;

    #[test]
    fn the_budget_refills_and_makes_floods_wait() {
        let t0 = Instant::now();
        let mut budget = Budget::new(t0, 10_000);
        assert_eq!(budget.spend(10_000, t0), None);
        let wait = budget.spend(5_000, t0).unwrap();
        assert_eq!(wait, Duration::from_millis(500));
        assert_eq!(budget.spend(0, t0 + Duration::from_secs(2)), None);
    }

    #[test]
    fn domains_and_bucket_ids_are_checked() {
        assert!(check_domain(None, "").is_err());
        assert_eq!(check_domain(None, "edge").unwrap(), "edge");
        assert_eq!(check_domain(Some("edge"), "").unwrap(), "edge");
        assert!(check_domain(Some("edge"), "other").is_err());
        assert!(check_domain(None, &"d".repeat(129)).is_err());
        let id = |pairs: &[(&str, &str)]| BucketId {
            bucket: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        assert_eq!(
            check_bucket(&id(&[("name", "api"), ("account", "7")])).unwrap(),
            [("account", "7"), ("name", "api")]
        );
        let long = "v".repeat(513);
        let many: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        for (bad, says) in [
            (id(&[]), "empty"),
            (id(&[("", "v")]), "key"),
            (id(&[("k", "")]), "value"),
            (id(&[("k", &long)]), "value"),
            (id(&[("k\u{0}", "v")]), "NUL"),
            (id(&many), "17 entries"),
        ] {
            let e = check_bucket(&bad).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[tokio::test]
    async fn a_push_that_finds_a_full_queue_ends_that_stream() {
        use cellrate_core::clock::SystemClock;
        use cellrate_limits::config::LimitTable;
        use cellrate_store::MemoryStore;
        let table = LimitTable::from_files(&[]).unwrap();
        let limits = Arc::new(arc_swap::ArcSwap::from_pointee(table));
        let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
        let decider = Arc::new(Decider::new(limits, store));
        let metrics = Metrics::new();
        let service = RlqsService::new(
            decider,
            metrics.clone(),
            RlqsSettings::default(),
            CancellationToken::new(),
            Arc::new(SystemClock),
        );
        let shared = &service.shared;
        // A stream whose queue holds one answer, already full.
        let (tx, _rx) = mpsc::channel(1);
        tx.try_send(Ok(RateLimitQuotaResponse::default())).unwrap();
        let undelivered = CancellationToken::new();
        shared.senders.lock().insert(7, (tx, undelivered.clone()));
        let share = Strategy::TokenBucket {
            max_tokens: 5,
            tokens_per_fill: 50,
            fill_seconds: 10,
        };
        push(shared, vec![(7, Arc::from("name\u{0}api\u{0}"), share)]);
        assert!(undelivered.is_cancelled(), "the stream is told to end");
        assert!(metrics
            .render()
            .contains("cellrate_rlqs_refusals_total{reason=\"slow_reader\"} 1"));
        // A stream with room gets the push, rebuilt into its bucket id.
        let (tx, mut rx) = mpsc::channel(1);
        let open = CancellationToken::new();
        shared.senders.lock().insert(8, (tx, open.clone()));
        push(shared, vec![(8, Arc::from("name\u{0}api\u{0}"), share)]);
        assert!(!open.is_cancelled());
        let pushed = rx.try_recv().unwrap().unwrap();
        let id = pushed.bucket_action[0].bucket_id.clone().unwrap();
        assert_eq!(id.bucket.get("name").map(String::as_str), Some("api"));
    }
}
