//! The arithmetic of Envoy's Rate Limit Quota Service (RLQS): who reports demand for which
//! limit, and what share of the limit each reporter gets. Pure (no I/O, time given), so
//! that the division is tested on its own; [`super::rlqs`] serves it over gRPC.
//!
//! **Units.** A reporter is one bucket of one stream (an Envoy's filter reports each of its
//! buckets). A bucket maps to one or more limit keys (`"<number>:<id>"`); several buckets,
//! of one stream or of many, may map to one key, and then share its limit.
//!
//! **Division.** Each reporter's demand is its offered load (allowed + denied per second,
//! smoothed over two reports), capped at the limit's rate; until its second report it
//! counts as the mean of the known demands (all equal while none is known). A reporter of
//! a key shared by `n` gets the fraction `FLOOR / n + (1 - FLOOR) * demand / total demand`
//! of the limit's rate and burst (`1 / n` while nobody reports demand); with several keys,
//! the most restrictive share applies. The fractions of one key add up to 1. Other
//! replicas' reporters (shared through Redis) count in `n` and the demands.
//!
//! **Pushes.** After each report, every other reporter of the same keys whose share moved
//! is sent its new share at once, so that all shares in force come from one view of the
//! demand: they never add up to more than the limit, and a share one reporter gives up is
//! used by the others without waiting for their next report.
//!
//! **Hysteresis.** Envoy keeps a token bucket (and the tokens in it) only while the
//! assignment repeats exactly; a changed assignment starts a new, full bucket. So shares are
//! rounded down to powers of 1.05, and a reporter keeps its previous share while that is at
//! most the new one and no more than [`HYSTERESIS`] below it: changes that would only
//! refill buckets are not sent.
//!
//! The book here tracks reporters and pushes; the share arithmetic is `quota_share.rs`, the
//! strategy a share becomes `quota_strategy.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use cellrate_core::gcra::Limit;
use cellrate_store::shared::Aggregate;

use super::quota_share::{aggregate_of, keeps, quantized, Member, View, Views};
pub use super::quota_share::{FLOOR, HYSTERESIS};
use super::quota_strategy::per_second;
pub use super::quota_strategy::Strategy;

/// Where a bucket leads, as the limits in force say.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// No rule (and no convention) maps it.
    Unmatched,
    /// Allowed without limit (allow list, no configured limit, shadow mode).
    Allow,
    /// Denied for good (deny list, an invalid id in a domain that denies them).
    Deny,
    /// Limited: each key with its limit.
    Limits(Vec<(Arc<str>, Limit)>),
}

/// What to tell a bucket after its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Assign(Strategy),
    /// Forget the bucket: idle too long, or its rule is gone.
    Abandon,
    /// Nothing: a bound is reached (Envoy applies its no-assignment behaviour).
    Refused,
}

/// What a report leads to: the answer for the reporting bucket, and the changed shares to
/// push to other streams' buckets (stream, bucket, strategy).
#[derive(Debug, Clone, PartialEq)]
pub struct Reported {
    pub action: Action,
    pub pushes: Vec<(u64, Arc<str>, Strategy)>,
    /// Other reporters looked at: the work this report cost beyond itself.
    pub evaluated: usize,
}

impl From<Action> for Reported {
    fn from(action: Action) -> Reported {
        Reported {
            action,
            pushes: Vec::new(),
            evaluated: 0,
        }
    }
}

/// Bounds on what the book tracks.
#[derive(Debug, Clone, Copy)]
pub struct BookBounds {
    pub max_buckets: usize,
    pub max_buckets_per_stream: usize,
    /// Bytes of bucket ids held at most (each counted as its text plus
    /// [`BUCKET_OVERHEAD`]), over every stream, until the bucket is forgotten.
    pub max_bytes: usize,
    /// A bucket that reported no request for this long is abandoned.
    pub idle: Duration,
    /// How long the buckets of an ended stream keep their shares: the assignments' time to
    /// live, for which their Envoy may go on enforcing them (a broken connection).
    pub linger: Duration,
}

/// One bucket of one stream.
#[derive(Debug)]
struct Tracked {
    keys: Vec<(Arc<str>, Limit)>,
    /// Requests per second, smoothed; `None` before the second report.
    demand: Option<f64>,
    last_report: Instant,
    last_active: Instant,
    sent: Option<Strategy>,
    /// Whether a rule mapped it when it was last resolved.
    matched: bool,
}

/// Every stream's buckets and every key's reporters.
#[derive(Debug)]
pub struct QuotaBook {
    bounds: BookBounds,
    streams: HashMap<u64, HashMap<Arc<str>, Tracked>>,
    /// key -> reporter -> its demand (capped at the key's rate).
    keys: HashMap<Arc<str>, HashMap<Member, Option<f64>>>,
    tracked: usize,
    /// Bytes of the buckets held (tracked, and lingering after their stream ended).
    bytes: usize,
    /// key -> the other replicas' reporters of it (shared through Redis).
    remote: HashMap<Arc<str>, Aggregate>,
    /// Reporters of ended streams that keep their shares until a deadline, in its order.
    lingering: std::collections::VecDeque<(Instant, Member, Vec<Arc<str>>)>,
}

impl QuotaBook {
    pub fn new(bounds: BookBounds) -> QuotaBook {
        QuotaBook {
            bounds,
            streams: HashMap::new(),
            keys: HashMap::new(),
            tracked: 0,
            bytes: 0,
            remote: HashMap::new(),
            lingering: std::collections::VecDeque::new(),
        }
    }

    /// Buckets tracked, over every stream.
    pub fn tracked(&self) -> usize {
        self.tracked
    }

    /// Bytes the buckets held count against [`BookBounds::max_bytes`].
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Reporters of `key` (for tests and introspection).
    pub fn reporters(&self, key: &str) -> usize {
        self.keys.get(key).map_or(0, HashMap::len)
    }

    /// A report of `requests` (allowed + denied) for `bucket` of `stream`, which
    /// `resolution` maps, at `now`: what to tell the bucket.
    pub fn report(
        &mut self,
        stream: u64,
        bucket: &Arc<str>,
        resolution: Resolution,
        requests: u64,
        now: Instant,
    ) -> Reported {
        let (lingered, lingered_work) = self.expire(now);
        let mut reported = self.report_now(stream, bucket, resolution, requests, now);
        reported.pushes.extend(lingered);
        reported.evaluated += lingered_work;
        reported
    }

    fn report_now(
        &mut self,
        stream: u64,
        bucket: &Arc<str>,
        resolution: Resolution,
        requests: u64,
        now: Instant,
    ) -> Reported {
        let buckets = self.streams.entry(stream).or_default();
        if !buckets.contains_key(bucket) {
            if self.tracked >= self.bounds.max_buckets
                || buckets.len() >= self.bounds.max_buckets_per_stream
                || self.bytes + weight(bucket) > self.bounds.max_bytes
            {
                return Action::Refused.into();
            }
            self.bytes += weight(bucket);
            buckets.insert(
                bucket.clone(),
                Tracked {
                    keys: Vec::new(),
                    demand: None,
                    last_report: now,
                    last_active: now,
                    sent: None,
                    matched: resolution != Resolution::Unmatched,
                },
            );
            self.tracked += 1;
        }
        let tracked = buckets.get_mut(bucket).expect("inserted above");
        // Demand: this report's requests over the time since the last one.
        let elapsed = now.saturating_duration_since(tracked.last_report);
        if requests > 0 {
            tracked.last_active = now;
        }
        let seconds = elapsed.as_secs_f64();
        if seconds > 0.0 {
            let instant = requests as f64 / seconds;
            tracked.demand = Some(tracked.demand.map_or(instant, |d| (d + instant) / 2.0));
            tracked.last_report = now;
        }
        let idle = now.saturating_duration_since(tracked.last_active) >= self.bounds.idle;
        let rule_gone = tracked.matched && resolution == Resolution::Unmatched;
        if idle || rule_gone {
            self.forget(stream, bucket);
            return Action::Abandon.into();
        }
        tracked.matched = resolution != Resolution::Unmatched;
        let (keys, blanket) = match resolution {
            Resolution::Limits(keys) if !keys.is_empty() => (keys, None),
            Resolution::Deny => (Vec::new(), Some(Strategy::DenyAll)),
            _ => (Vec::new(), Some(Strategy::AllowAll)),
        };
        // Keys it no longer maps to (a reload) lose it as a reporter.
        let member: Member = (stream, bucket.clone());
        let old = std::mem::replace(&mut tracked.keys, keys.clone());
        let demand = tracked.demand;
        for (key, _) in &old {
            if !keys.iter().any(|(k, _)| k == key) {
                remove_member(&mut self.keys, key, &member);
            }
        }
        for (key, limit) in &keys {
            let reporters = self.keys.entry(key.clone()).or_default();
            reporters.insert(member.clone(), demand.map(|d| d.min(per_second(limit))));
        }
        let mut views = Views::new();
        let strategy = blanket.unwrap_or_else(|| self.division(&keys, &member, &mut views));
        let tracked = self
            .streams
            .get_mut(&stream)
            .and_then(|b| b.get_mut(bucket))
            .expect("tracked above");
        let strategy = match (tracked.sent, strategy) {
            (Some(previous), new) if keeps(previous, new) => previous,
            (_, new) => new,
        };
        tracked.sent = Some(strategy);
        let touched: Vec<Arc<str>> = keys.iter().map(|(key, _)| key.clone()).collect();
        let (pushes, evaluated) = self.repush(&touched, Some(&member), &mut views);
        Reported {
            action: Action::Assign(strategy),
            pushes,
            evaluated,
        }
    }

    /// The other reporters of `keys` whose share changed are told at once (all shares then
    /// come from one view of the demand), so that the shares handed out never add up to
    /// more than a limit, and a share freed by one is used by the others at once. Returns
    /// the pushes and how many reporters were looked at (the work done).
    fn repush(
        &mut self,
        keys: &[Arc<str>],
        except: Option<&Member>,
        views: &mut Views,
    ) -> (Vec<(u64, Arc<str>, Strategy)>, usize) {
        let mut pushes = Vec::new();
        let mut others: Vec<Member> = keys
            .iter()
            .filter_map(|key| self.keys.get(key))
            .flat_map(|reporters| reporters.keys())
            .filter(|m| Some(*m) != except)
            .cloned()
            .collect();
        others.sort();
        others.dedup();
        let evaluated = others.len();
        for other in others {
            let Some(theirs) = self.streams.get(&other.0).and_then(|b| b.get(&other.1)) else {
                continue;
            };
            let new = self.division(&theirs.keys, &other, views);
            if theirs.sent.is_some_and(|sent| !keeps(sent, new)) {
                if let Some(t) = self
                    .streams
                    .get_mut(&other.0)
                    .and_then(|b| b.get_mut(&other.1))
                {
                    t.sent = Some(new);
                }
                pushes.push((other.0, other.1, new));
            }
        }
        (pushes, evaluated)
    }

    /// The share of `member` in each of `keys`, the most restrictive.
    fn division(&self, keys: &[(Arc<str>, Limit)], member: &Member, views: &mut Views) -> Strategy {
        let mut strategy = Strategy::AllowAll;
        for (key, limit) in keys {
            let fraction = match self.keys.get(key) {
                None => 1.0,
                Some(reporters) => {
                    let view = views
                        .entry(key.clone())
                        .or_insert_with(|| View::of(reporters, self.remote.get(key)));
                    view.fraction(reporters.get(member).copied().flatten())
                }
            };
            strategy = strategy.stricter(Strategy::share(limit, quantized(fraction)));
        }
        strategy
    }

    /// This replica's reporters of every key it knows, summed up (to share with others).
    pub fn aggregates(&self) -> Vec<(Arc<str>, Aggregate)> {
        self.keys
            .iter()
            .map(|(key, reporters)| (key.clone(), aggregate_of(reporters)))
            .collect()
    }

    /// The other replicas' reporters of `keys` (`None`: not known, e.g. Redis is gone: each
    /// replica then divides among its own). The reporters whose share moved are returned,
    /// with the work done.
    pub fn set_remote(
        &mut self,
        remote: Option<Vec<(Arc<str>, Aggregate)>>,
    ) -> (Vec<(u64, Arc<str>, Strategy)>, usize) {
        let mut changed = Vec::new();
        match remote {
            None => {
                changed.extend(self.remote.drain().map(|(key, _)| key));
            }
            Some(remote) => {
                let mut fresh: HashMap<Arc<str>, Aggregate> = HashMap::with_capacity(remote.len());
                for (key, aggregate) in remote {
                    if aggregate.reporters == 0 {
                        continue;
                    }
                    if self.remote.get(&key) != Some(&aggregate) {
                        changed.push(key.clone());
                    }
                    fresh.insert(key, aggregate);
                }
                changed.extend(
                    self.remote
                        .keys()
                        .filter(|key| !fresh.contains_key(*key))
                        .cloned(),
                );
                self.remote = fresh;
            }
        }
        changed.retain(|key| self.keys.contains_key(key));
        self.repush(&changed, None, &mut Views::new())
    }

    /// A stream ended: its buckets leave every key they reported to, and the other
    /// reporters of those keys are sent their larger shares (returned, with the work done).
    pub fn end_stream(
        &mut self,
        stream: u64,
        now: Instant,
    ) -> (Vec<(u64, Arc<str>, Strategy)>, usize) {
        let Some(buckets) = self.streams.remove(&stream) else {
            return (Vec::new(), 0);
        };
        self.tracked -= buckets.len();
        for (bucket, tracked) in buckets {
            if tracked.keys.is_empty() {
                self.bytes -= weight(&bucket);
            } else {
                let keys = tracked.keys.into_iter().map(|(key, _)| key).collect();
                self.lingering
                    .push_back((now + self.bounds.linger, (stream, bucket), keys));
            }
        }
        self.expire(now)
    }

    /// The lingering reporters whose time is over leave their keys; the others' larger
    /// shares are returned (pushes, work).
    pub fn expire(&mut self, now: Instant) -> (Vec<(u64, Arc<str>, Strategy)>, usize) {
        let mut touched = Vec::new();
        while self.lingering.front().is_some_and(|(at, _, _)| *at <= now) {
            let Some((_, member, keys)) = self.lingering.pop_front() else {
                break;
            };
            self.bytes -= weight(&member.1);
            for key in keys {
                remove_member(&mut self.keys, &key, &member);
                touched.push(key);
            }
        }
        if touched.is_empty() {
            return (Vec::new(), 0);
        }
        touched.sort();
        touched.dedup();
        self.repush(&touched, None, &mut Views::new())
    }

    fn forget(&mut self, stream: u64, bucket: &Arc<str>) {
        let Some(buckets) = self.streams.get_mut(&stream) else {
            return;
        };
        if let Some(tracked) = buckets.remove(bucket) {
            self.tracked -= 1;
            self.bytes -= weight(bucket);
            let member: Member = (stream, bucket.clone());
            for (key, _) in &tracked.keys {
                remove_member(&mut self.keys, key, &member);
            }
        }
    }
}

/// What a bucket counts against [`BookBounds::max_bytes`]: its id's text and the
/// bookkeeping around it.
pub const BUCKET_OVERHEAD: usize = 128;

fn weight(bucket: &str) -> usize {
    bucket.len() + BUCKET_OVERHEAD
}

fn remove_member(
    keys: &mut HashMap<Arc<str>, HashMap<Member, Option<f64>>>,
    key: &Arc<str>,
    member: &Member,
) {
    if let Some(reporters) = keys.get_mut(key) {
        reporters.remove(member);
        if reporters.is_empty() {
            keys.remove(key);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use cellrate_core::clock::SECOND;

    pub(crate) const BOUNDS: BookBounds = BookBounds {
        max_buckets: 4,
        max_buckets_per_stream: 3,
        max_bytes: usize::MAX,
        idle: Duration::from_secs(60),
        linger: Duration::ZERO,
    };

    pub(crate) fn per_second_limit(n: u64) -> Limit {
        // n per second, burst n.
        Limit::new(n, n, SECOND).unwrap()
    }

    pub(crate) fn limited(key: &str, limit: Limit) -> Resolution {
        Resolution::Limits(vec![(Arc::from(key), limit)])
    }

    pub(crate) fn rate(reported: Reported) -> f64 {
        match reported.action {
            Action::Assign(s) => s.rate(),
            other => panic!("not an assignment: {other:?}"),
        }
    }

    pub(crate) fn action(reported: Reported) -> Action {
        reported.action
    }

    #[test]
    fn blanket_rules_idle_buckets_removed_rules_and_bounds() {
        let mut book = QuotaBook::new(BOUNDS);
        let t0 = Instant::now();
        let (a, b, c, d): (Arc<str>, Arc<str>, Arc<str>, Arc<str>) = (
            Arc::from("a"),
            Arc::from("b"),
            Arc::from("c"),
            Arc::from("d"),
        );
        assert_eq!(
            action(book.report(1, &a, Resolution::Deny, 1, t0)),
            Action::Assign(Strategy::DenyAll)
        );
        assert_eq!(
            action(book.report(1, &b, Resolution::Allow, 1, t0)),
            Action::Assign(Strategy::AllowAll)
        );
        assert_eq!(
            action(book.report(1, &c, Resolution::Unmatched, 1, t0)),
            Action::Assign(Strategy::AllowAll)
        );
        // At most 3 buckets per stream, 4 in all.
        assert_eq!(
            action(book.report(1, &d, Resolution::Allow, 1, t0)),
            Action::Refused
        );
        assert_eq!(
            action(book.report(2, &d, Resolution::Allow, 1, t0)),
            Action::Assign(Strategy::AllowAll)
        );
        assert_eq!(
            action(book.report(3, &a, Resolution::Allow, 1, t0)),
            Action::Refused
        );
        // A bucket that saw no request for the idle time is abandoned; then its place is free.
        let later = t0 + Duration::from_secs(61);
        assert_eq!(
            action(book.report(1, &a, Resolution::Deny, 0, later)),
            Action::Abandon
        );
        assert_eq!(book.tracked(), 3);
        // A limited bucket whose rule a reload removed is abandoned.
        let limit = per_second_limit(10);
        book.report(3, &a, limited("k", limit), 1, later);
        assert_eq!(book.reporters("k"), 1);
        assert_eq!(
            action(book.report(3, &a, Resolution::Unmatched, 1, later)),
            Action::Abandon
        );
        assert_eq!(book.reporters("k"), 0, "it left the key");
        // A reload that maps it elsewhere moves it.
        book.report(3, &a, limited("k", limit), 1, later);
        book.report(3, &a, limited("k2", limit), 1, later);
        assert_eq!((book.reporters("k"), book.reporters("k2")), (0, 1));
    }

    #[test]
    fn an_ended_streams_share_is_kept_while_its_envoy_may_still_use_it() {
        let mut book = QuotaBook::new(BookBounds {
            linger: Duration::from_secs(10),
            ..BOUNDS
        });
        let limit = per_second_limit(100);
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let t0 = Instant::now();
        book.report(1, &a, limited("k", limit), 1, t0);
        book.report(2, &b, limited("k", limit), 1, t0);
        // B's stream ends (a broken connection): its Envoy may enforce its last share for
        // the assignment's time to live, so that share stays taken until then.
        let (pushes, _) = book.end_stream(2, t0);
        assert!(pushes.is_empty());
        assert_eq!(book.reporters("k"), 2);
        let r = rate(book.report(1, &a, limited("k", limit), 1, t0 + Duration::from_secs(9)));
        assert!(r <= 50.0, "{r}");
        // Then it is A's again.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(
            rate(book.report(1, &a, limited("k", limit), 1, later)),
            100.0
        );
        assert_eq!(book.reporters("k"), 1);
    }
}
