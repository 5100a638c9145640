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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, Strategy as PbStrategy,
};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Act, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf as pbw;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status, Streaming};

use super::quota_book::{Action, BookBounds, QuotaBook, Resolution, Strategy};
use super::Decider;
use crate::limits::config::Policy;
use crate::limits::descriptors::{InvalidIds, Mapping};
use crate::limits::names::BucketKey;
use crate::observe::metrics::Metrics;
use crate::store::shared::SharedDemand;

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
/// Answers waiting to be sent on one stream; a stream that does not read them is ended.
pub const QUEUE: usize = 64;

/// How the RLQS service behaves and what it tracks at most.
#[derive(Debug, Clone, Copy)]
pub struct RlqsSettings {
    pub max_streams: usize,
    pub max_buckets: usize,
    pub max_buckets_per_stream: usize,
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
            assignment_ttl: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            sync: Duration::from_secs(1),
        }
    }
}

type Answers = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// What the streams share.
struct Shared {
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
}

/// The RLQS service.
pub struct RlqsService {
    shared: Arc<Shared>,
}

impl RlqsService {
    /// `stop` ends every stream (at shutdown, so that Envoys move to another replica).
    pub fn new(
        decider: Arc<Decider>,
        metrics: Arc<Metrics>,
        settings: RlqsSettings,
        stop: CancellationToken,
    ) -> RlqsService {
        let bounds = BookBounds {
            max_buckets: settings.max_buckets,
            max_buckets_per_stream: settings.max_buckets_per_stream,
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
        let mine = shared
            .book
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .aggregates();
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
        let pushes = shared
            .book
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_remote(remote)
            .0;
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
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, (tx.clone(), undelivered.clone()));
        self.shared.metrics.rlqs_streams.inc();
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

/// Reads `incoming` until it ends, is idle too long, errs or the server stops; answers each
/// report; then forgets the stream.
async fn serve_stream(
    shared: Arc<Shared>,
    id: u64,
    mut incoming: Streaming<RateLimitQuotaUsageReports>,
    tx: Answers,
    undelivered: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let mut domain: Option<String> = None;
    let mut budget = Budget::new(Instant::now(), MAX_STREAM_WORK_PER_SECOND);
    loop {
        let next = tokio::select! {
            next = tokio::time::timeout(shared.settings.idle, incoming.message()) => next,
            _ = shared.stop.cancelled() => {
                let _ = tx.try_send(Err(Status::unavailable("cellrate is shutting down")));
                break;
            }
            // A push found the queue full (counted there): nothing more can be sent.
            _ = undelivered.cancelled() => break,
        };
        let reports = match next {
            Err(_) => {
                let _ = tx.try_send(Err(Status::deadline_exceeded(format!(
                    "no report for {} s (--rlqs-idle-seconds)",
                    shared.settings.idle.as_secs()
                ))));
                break;
            }
            Ok(Ok(Some(reports))) => reports,
            Ok(Ok(None)) => break,
            // A message that cannot be read (too large, not protobuf) is the client's error,
            // sent back to it; a vanished client reads nothing, which is harmless.
            Ok(Err(status)) => {
                if matches!(
                    status.code(),
                    Code::OutOfRange | Code::InvalidArgument | Code::Internal
                ) {
                    shared.metrics.rlqs_refused("invalid");
                }
                let _ = tx.try_send(Err(status));
                break;
            }
        };
        let work = match answer(&shared, id, &mut domain, &reports) {
            Ok((None, work)) => work,
            Ok((Some(response), work)) => {
                // A client that reads nothing fills the queue: it is ended, not waited for.
                if tx.try_send(Ok(response)).is_err() {
                    shared.metrics.rlqs_refused("slow_reader");
                    break;
                }
                work
            }
            Err(status) => {
                shared.metrics.rlqs_refused("invalid");
                let _ = tx.try_send(Err(status));
                break;
            }
        };
        // The work done is paid for before the next message is read.
        let now = Instant::now();
        let own = budget.spend(work, now);
        let all = shared
            .work
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .spend(work, now);
        if let Some(wait) = own.max(all) {
            tokio::time::sleep(wait).await;
        }
    }
    shared
        .senders
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&id);
    let (pushes, work, tracked) = {
        let mut book = shared.book.lock().unwrap_or_else(PoisonError::into_inner);
        let (pushes, work) = book.end_stream(id, Instant::now());
        (pushes, work, book.tracked())
    };
    let _ = shared
        .work
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .spend(work as u64, Instant::now());
    push(&shared, pushes);
    shared.metrics.rlqs_buckets.set(tracked as i64);
    shared.metrics.rlqs_streams.dec();
}

/// Work that may still be done now: `rate` a second, refilled continuously, at most `rate`
/// held.
struct Budget {
    tokens: f64,
    rate: f64,
    at: Instant,
}

impl Budget {
    fn new(now: Instant, rate: u64) -> Budget {
        Budget {
            tokens: rate as f64,
            rate: rate as f64,
            at: now,
        }
    }

    /// Spends `n`; how long to wait before more, if the budget is in debt.
    fn spend(&mut self, n: u64, now: Instant) -> Option<Duration> {
        let rate = self.rate;
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.at = now;
        self.tokens -= n as f64;
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / rate))
    }
}

/// One bucket of a report, checked and named.
struct Usage<'r> {
    id: &'r BucketId,
    /// Entries sorted by key.
    entries: Vec<(&'r str, &'r str)>,
    /// The entries as one text: the bucket's identity within its stream.
    text: Arc<str>,
    allowed: u64,
    denied: u64,
}

/// The answer to one report message (`None`: nothing to say), after checking all of it,
/// and the work it cost.
fn answer(
    shared: &Shared,
    stream: u64,
    domain: &mut Option<String>,
    reports: &RateLimitQuotaUsageReports,
) -> Result<(Option<RateLimitQuotaResponse>, u64), Status> {
    let current = check_domain(domain.as_deref(), &reports.domain)?;
    let usages = reports
        .bucket_quota_usages
        .iter()
        .enumerate()
        .map(|(i, usage)| {
            let at = |what: String| {
                Status::invalid_argument(format!("bucket_quota_usages[{i}].bucket_id{what}"))
            };
            let id = usage
                .bucket_id
                .as_ref()
                .ok_or_else(|| at(": missing".to_string()))?;
            let entries = check_bucket(id).map_err(at)?;
            let text: Arc<str> = Arc::from(
                entries
                    .iter()
                    .flat_map(|(k, v)| [*k, "\u{0}", *v, "\u{0}"])
                    .collect::<String>(),
            );
            Ok(Usage {
                id,
                entries,
                text,
                allowed: usage.num_requests_allowed,
                denied: usage.num_requests_denied,
            })
        })
        .collect::<Result<Vec<_>, Status>>()?;
    if domain.is_none() {
        *domain = Some(current.to_string());
    }
    let domain = domain.as_deref().unwrap_or_default();

    let table = shared.decider.limits();
    let now = Instant::now();
    let mut actions = Vec::with_capacity(usages.len());
    let mut pushes = Vec::new();
    let mut work = usages.len() as u64;
    {
        let mut book = shared.book.lock().unwrap_or_else(PoisonError::into_inner);
        for usage in &usages {
            let (resolution, names) = resolve(&shared.decider, &table, domain, &usage.entries);
            for name in names {
                shared
                    .metrics
                    .rlqs_reported(name, usage.allowed, usage.denied);
            }
            let requests = usage.allowed.saturating_add(usage.denied);
            let reported = book.report(stream, &usage.text, resolution, requests, now);
            if let Some(action) = bucket_action(usage.id, reported.action, &shared.settings) {
                shared.metrics.rlqs_action(action_label(reported.action));
                actions.push(action);
            } else {
                shared.metrics.rlqs_refused("too_many_buckets");
            }
            pushes.extend(reported.pushes);
            work += reported.evaluated as u64;
        }
        shared.metrics.rlqs_buckets.set(book.tracked() as i64);
    }
    push(shared, pushes);
    let response = (!actions.is_empty()).then_some(RateLimitQuotaResponse {
        bucket_action: actions,
    });
    Ok((response, work))
}

/// Sends changed shares to other streams' buckets; a stream whose queue is full is ended
/// (it would go on enforcing a share it no longer has). The bucket id is rebuilt from its
/// text (entries joined by NUL: keys and values hold none, checked on the way in).
fn push(shared: &Shared, pushes: Vec<(u64, Arc<str>, Strategy)>) {
    if pushes.is_empty() {
        return;
    }
    let mut by_stream: HashMap<u64, Vec<BucketAction>> = HashMap::new();
    for (stream, text, strategy) in pushes {
        let parts: Vec<&str> = text.split('\u{0}').collect();
        let bucket = parts
            .chunks_exact(2)
            .map(|kv| (kv[0].to_string(), kv[1].to_string()))
            .collect();
        let id = BucketId { bucket };
        if let Some(action) = bucket_action(&id, Action::Assign(strategy), &shared.settings) {
            shared.metrics.rlqs_action("pushed");
            by_stream.entry(stream).or_default().push(action);
        }
    }
    let senders = shared
        .senders
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    for (stream, actions) in by_stream {
        if let Some((tx, undelivered)) = senders.get(&stream) {
            let answer = Ok(RateLimitQuotaResponse {
                bucket_action: actions,
            });
            if tx.try_send(answer).is_err() && !undelivered.is_cancelled() {
                shared.metrics.rlqs_refused("slow_reader");
                undelivered.cancel();
            }
        }
    }
}

fn action_label(action: Action) -> &'static str {
    match action {
        Action::Assign(Strategy::AllowAll) => "allow_all",
        Action::Assign(Strategy::DenyAll) => "deny_all",
        Action::Assign(Strategy::TokenBucket { .. }) => "token_bucket",
        Action::Abandon => "abandon",
        Action::Refused => "refused",
    }
}

/// The domain of this message: the first message names it; later ones repeat it or leave
/// it empty.
fn check_domain<'a>(known: Option<&'a str>, given: &'a str) -> Result<&'a str, Status> {
    if given.len() > MAX_DOMAIN {
        return Err(Status::invalid_argument(format!(
            "domain: longer than {MAX_DOMAIN} bytes"
        )));
    }
    match known {
        None if given.is_empty() => Err(Status::invalid_argument(
            "domain: missing from the stream's first report",
        )),
        None => Ok(given),
        Some(known) if given.is_empty() || given == known => Ok(known),
        Some(known) => Err(Status::invalid_argument(format!(
            "domain: {given:?} differs from the stream's {known:?} (open a new stream)"
        ))),
    }
}

/// A bucket id's entries sorted by key, or what is wrong with it (after `bucket_id`).
fn check_bucket(id: &BucketId) -> Result<Vec<(&str, &str)>, String> {
    if id.bucket.is_empty() {
        return Err(".bucket: empty".to_string());
    }
    if id.bucket.len() > MAX_BUCKET_ENTRIES {
        return Err(format!(
            ".bucket: {} entries, at most {MAX_BUCKET_ENTRIES}",
            id.bucket.len()
        ));
    }
    let mut entries = Vec::with_capacity(id.bucket.len());
    for (key, value) in &id.bucket {
        let shown: String = key.chars().take(40).collect();
        if key.is_empty() || key.len() > MAX_BUCKET_KEY || key.contains('\u{0}') {
            return Err(format!(
                ".bucket: key {shown:?} is not 1 to {MAX_BUCKET_KEY} bytes without NUL"
            ));
        }
        if value.is_empty() || value.len() > MAX_BUCKET_VALUE || value.contains('\u{0}') {
            return Err(format!(
                ".bucket[{shown:?}]: value is not 1 to {MAX_BUCKET_VALUE} bytes without NUL"
            ));
        }
        entries.push((key.as_str(), value.as_str()));
    }
    entries.sort_unstable();
    Ok(entries)
}

/// Where a bucket leads under `table`, and the names it counts for (metrics).
fn resolve<'t>(
    decider: &Decider,
    table: &'t crate::limits::config::LimitTable,
    domain: &str,
    entries: &[(&str, &str)],
) -> (Resolution, &'t [Arc<str>]) {
    let Mapping::Limits { names, id } = table.quota().map(table.names(), domain, entries) else {
        return (Resolution::Unmatched, &[]);
    };
    let mut keys = Vec::with_capacity(names.len());
    for text in names {
        let Some(name) = table.names().get(text) else {
            continue;
        };
        let Ok(canonical) = name.format.canonicalize_cow(&id) else {
            match table.quota().invalid_ids(domain) {
                InvalidIds::Ignore => continue,
                // A bucket cannot be refused alone: reject denies, as deny does.
                InvalidIds::Deny | InvalidIds::Reject => {
                    return (Resolution::Deny, names);
                }
            }
        };
        match decider.policy(table, name, &canonical) {
            Some(Policy::Denied) => return (Resolution::Deny, names),
            Some(Policy::Limited {
                limit,
                shadow: false,
            }) => {
                let key = BucketKey::new(name.number, &canonical);
                keys.push((Arc::from(key.as_str()), limit));
            }
            // Shadow mode decides without enforcing; nothing configured does not limit.
            Some(Policy::Limited { shadow: true, .. } | Policy::Unlimited) | None => {}
        }
    }
    let resolution = if keys.is_empty() {
        Resolution::Allow
    } else {
        Resolution::Limits(keys)
    };
    (resolution, names)
}

/// The message for `action` on `id` (`None` for a refused bucket).
fn bucket_action(id: &BucketId, action: Action, settings: &RlqsSettings) -> Option<BucketAction> {
    let act = match action {
        Action::Refused => return None,
        Action::Abandon => Act::AbandonAction(AbandonAction {}),
        Action::Assign(strategy) => {
            let strategy = match strategy {
                Strategy::AllowAll => PbStrategy::BlanketRule(BlanketRule::AllowAll as i32),
                Strategy::DenyAll => PbStrategy::BlanketRule(BlanketRule::DenyAll as i32),
                Strategy::TokenBucket {
                    max_tokens,
                    tokens_per_fill,
                    fill_seconds,
                } => PbStrategy::TokenBucket(TokenBucket {
                    max_tokens,
                    tokens_per_fill: Some(pbw::UInt32Value {
                        value: tokens_per_fill,
                    }),
                    fill_interval: Some(pbw::Duration {
                        seconds: i64::from(fill_seconds),
                        nanos: 0,
                    }),
                }),
            };
            Act::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(pbw::Duration {
                    seconds: settings.assignment_ttl.as_secs() as i64,
                    nanos: 0,
                }),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            })
        }
    };
    Some(BucketAction {
        bucket_id: Some(id.clone()),
        bucket_action: Some(act),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        use crate::clock::SystemClock;
        use crate::limits::config::LimitTable;
        use crate::store::MemoryStore;
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
        );
        let shared = &service.shared;
        // A stream whose queue holds one answer, already full.
        let (tx, _rx) = mpsc::channel(1);
        tx.try_send(Ok(RateLimitQuotaResponse::default())).unwrap();
        let undelivered = CancellationToken::new();
        shared
            .senders
            .lock()
            .unwrap()
            .insert(7, (tx, undelivered.clone()));
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
        shared.senders.lock().unwrap().insert(8, (tx, open.clone()));
        push(shared, vec![(8, Arc::from("name\u{0}api\u{0}"), share)]);
        assert!(!open.is_cancelled());
        let pushed = rx.try_recv().unwrap().unwrap();
        let id = pushed.bucket_action[0].bucket_id.clone().unwrap();
        assert_eq!(id.bucket.get("name").map(String::as_str), Some("api"));
    }
}
