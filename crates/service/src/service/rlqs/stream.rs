//! One RLQS stream: its reports read within the per-stream and global work budgets,
//! each answered with the buckets' assignments, and changed shares pushed to the streams
//! that hold them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, Streaming};

use super::{Answers, Shared, MAX_STREAM_WORK_PER_SECOND};
use crate::service::quota_book::{Action, Strategy};

use super::resolve::{bucket_action, check_bucket, check_domain, resolve};

/// Reads `incoming` until it ends, is idle too long, errs or the server stops; answers each
/// report; then forgets the stream.
pub(super) async fn serve_stream(
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
        let all = shared.work.lock().spend(work, now);
        if let Some(wait) = own.max(all) {
            tokio::time::sleep(wait).await;
        }
    }
    shared.senders.lock().remove(&id);
    let (pushes, work, tracked) = {
        let mut book = shared.book.lock();
        let (pushes, work) = book.end_stream(id, shared.book_now());
        (pushes, work, (book.tracked(), book.bytes()))
    };
    let _ = shared.work.lock().spend(work as u64, Instant::now());
    push(&shared, pushes);
    shared.metrics.rlqs.buckets.set(tracked.0 as i64);
    shared.metrics.rlqs.bucket_bytes.set(tracked.1 as i64);
    shared.metrics.rlqs.streams.dec();
}

/// Work that may still be done now: `rate` a second, refilled continuously, at most `rate`
/// held.
pub(super) struct Budget {
    tokens: f64,
    rate: f64,
    at: Instant,
}

impl Budget {
    pub(super) fn new(now: Instant, rate: u64) -> Budget {
        Budget {
            tokens: rate as f64,
            rate: rate as f64,
            at: now,
        }
    }

    /// Spends `n`; how long to wait before more, if the budget is in debt.
    pub(super) fn spend(&mut self, n: u64, now: Instant) -> Option<Duration> {
        let rate = self.rate;
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.at = now;
        self.tokens -= n as f64;
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / rate))
    }
}

/// One bucket of a report, checked and named.
pub(super) struct Usage<'r> {
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
pub(super) fn answer(
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
    let now = shared.book_now();
    let mut actions = Vec::with_capacity(usages.len());
    let mut pushes = Vec::new();
    let mut work = usages.len() as u64;
    {
        let mut book = shared.book.lock();
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
        shared.metrics.rlqs.buckets.set(book.tracked() as i64);
        shared.metrics.rlqs.bucket_bytes.set(book.bytes() as i64);
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
pub(super) fn push(shared: &Shared, pushes: Vec<(u64, Arc<str>, Strategy)>) {
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
    let senders = shared.senders.lock();
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

pub(super) fn action_label(action: Action) -> &'static str {
    match action {
        Action::Assign(Strategy::AllowAll) => "allow_all",
        Action::Assign(Strategy::DenyAll) => "deny_all",
        Action::Assign(Strategy::TokenBucket { .. }) => "token_bucket",
        Action::Abandon => "abandon",
        Action::Refused => "refused",
    }
}
