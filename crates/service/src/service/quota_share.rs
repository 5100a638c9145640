//! An RLQS reporter's share of a key: the division of its limit by demand with a floor
//! ([`FLOOR`]), the shares rounded down to steps of 1.05, and the hysteresis ([`HYSTERESIS`])
//! that keeps an assignment while it changes little (see [`super::quota_book`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::quota_strategy::Strategy;
use cellrate_store::shared::Aggregate;

/// Share of a key that every reporter of it gets whatever its demand.
pub const FLOOR: f64 = 0.1;
/// How far below the new share a previous share may be and still be kept.
pub const HYSTERESIS: f64 = 0.1;

/// A reporter of a key: its stream and its bucket.
pub(super) type Member = (u64, Arc<str>);

/// The reporters of one key, summed up.
pub(super) fn aggregate_of(reporters: &HashMap<Member, Option<f64>>) -> Aggregate {
    let mut aggregate = Aggregate {
        reporters: reporters.len() as u64,
        ..Aggregate::default()
    };
    for d in reporters.values().flatten() {
        aggregate.known += 1;
        aggregate.sum += d;
    }
    aggregate
}

/// One key's reporters summed up once, so that each reporter's fraction costs O(1).
pub(super) struct View {
    n: f64,
    /// The mean of the known demands, if any is known.
    mean: Option<f64>,
    /// Every demand, the unknown ones counted as the mean.
    total: f64,
}

pub(super) type Views = HashMap<Arc<str>, View>;

impl View {
    /// The view of a key: this replica's `reporters`, and the other replicas' if known.
    pub(super) fn of(reporters: &HashMap<Member, Option<f64>>, remote: Option<&Aggregate>) -> View {
        let local = aggregate_of(reporters);
        let other = remote.copied().unwrap_or_default();
        let n = local.reporters + other.reporters;
        let known = local.known + other.known;
        let sum = local.sum + other.sum;
        let mean = (known > 0).then(|| sum / known as f64);
        let total = mean.map_or(0.0, |m| sum + m * n.saturating_sub(known) as f64);
        View {
            n: n.max(1) as f64,
            mean,
            total,
        }
    }

    /// The fraction of a reporter whose demand is `own`: `FLOOR / n` plus its part of the
    /// rest by demand. A reporter whose demand is not known yet (one report so far) counts
    /// as the mean of the known ones: a newcomer is neither starved nor handed the
    /// incumbents' shares. While no demand is known, or none is reported, all are equal.
    pub(super) fn fraction(&self, own: Option<f64>) -> f64 {
        let Some(mean) = self.mean else {
            return 1.0 / self.n;
        };
        if self.total > 0.0 {
            FLOOR / self.n + (1.0 - FLOOR) * own.unwrap_or(mean) / self.total
        } else {
            1.0 / self.n
        }
    }
}

/// `fraction` rounded down to a power of 1.05 (at most 5 % lower): demand that wavers
/// within a step gives the same share, so the same assignment repeats.
pub(super) fn quantized(fraction: f64) -> f64 {
    // Sums of floating-point parts may miss a step by a rounding error: 1e-9 is forgiven.
    if fraction >= 1.0 - 1e-9 {
        return 1.0;
    }
    if fraction <= 0.0 {
        return 0.0;
    }
    let step = 1.05f64;
    let down = step.powi((fraction.ln() / step.ln() + 1e-9).floor() as i32);
    down.min(fraction)
}

/// Whether a bucket keeps its `previous` strategy instead of `new`.
pub(super) fn keeps(previous: Strategy, new: Strategy) -> bool {
    match (previous, new) {
        (
            Strategy::TokenBucket {
                max_tokens: old_burst,
                ..
            },
            Strategy::TokenBucket {
                max_tokens: new_burst,
                ..
            },
        ) => {
            let (old, new_rate) = (previous.rate(), new.rate());
            old <= new_rate && old >= (1.0 - HYSTERESIS) * new_rate && old_burst <= new_burst
        }
        (old, new) => old == new,
    }
}

#[cfg(test)]
mod tests {
    use crate::service::quota_book::tests::{limited, per_second_limit, rate, BOUNDS};
    use crate::service::quota_book::{QuotaBook, Reported};
    use cellrate_store::shared::Aggregate;
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn reporters_of_one_key_divide_it_by_demand_with_a_floor() {
        let mut book = QuotaBook::new(BOUNDS);
        let t0 = Instant::now();
        let limit = per_second_limit(100);
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        // Alone, a stream gets the whole limit.
        assert_eq!(
            rate(book.report(1, &a, limited("3:1", limit), 1, t0)),
            100.0
        );
        // A second reporter: the first one's share drops at once (pushed), to half.
        let joined = book.report(2, &b, limited("3:1", limit), 1, t0);
        assert_eq!(joined.pushes.len(), 1);
        assert_eq!((joined.pushes[0].0, &*joined.pushes[0].1), (1, "a"));
        let pushed = joined.pushes[0].2.rate();
        assert!(pushed + rate(joined) <= 100.0);
        // Steady demand of 75/s and 25/s: 0.05 + 0.9 * 0.75 and 0.05 + 0.9 * 0.25 of the
        // limit, less at most 5 % (the steps of 1.05), never more than the limit in all.
        let mut now = t0;
        let (mut ra, mut rb) = (0.0, 0.0);
        let mut given = HashMap::new();
        for _ in 0..20 {
            now += Duration::from_secs(1);
            for (stream, bucket, demand) in [(1, &a, 75), (2, &b, 25)] {
                let reported = book.report(stream, bucket, limited("3:1", limit), demand, now);
                for (s, _, strategy) in &reported.pushes {
                    given.insert(*s, strategy.rate());
                }
                let r = rate(reported);
                given.insert(stream, r);
                if stream == 1 {
                    ra = r
                } else {
                    rb = r
                }
                assert!(given.values().sum::<f64>() <= 100.0, "{given:?}");
            }
        }
        assert!(
            (66.0..=72.5).contains(&ra) && (26.0..=27.5).contains(&rb),
            "{ra} {rb}"
        );
        // Demands are capped at the limit's rate: a reporter claiming far more weighs as
        // one claiming the whole limit.
        for _ in 0..5 {
            now += Duration::from_secs(1);
            book.report(1, &a, limited("3:1", limit), 1_000_000, now);
            rb = rate(book.report(2, &b, limited("3:1", limit), 100, now));
        }
        assert!(rb >= 45.0, "{rb}");
        // The stream that ends gives its share back at once (no linger here): pushed.
        let (pushes, evaluated) = book.end_stream(2, now);
        assert_eq!(evaluated, 1);
        assert_eq!(
            (pushes[0].0, &*pushes[0].1, pushes[0].2.rate()),
            (1, "a", 100.0)
        );
        assert_eq!(book.reporters("3:1"), 1);
        assert_eq!(
            rate(book.report(1, &a, limited("3:1", limit), 75, now)),
            100.0
        );
        assert_eq!(book.tracked(), 1);
    }

    #[test]
    fn small_changes_keep_the_bucket_and_lower_shares_apply_at_once() {
        let mut book = QuotaBook::new(BOUNDS);
        let limit = per_second_limit(1_000);
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let mut now = Instant::now();
        book.report(1, &a, limited("k", limit), 1, now);
        book.report(2, &b, limited("k", limit), 1, now);
        let mut sent: Vec<Reported> = Vec::new();
        for demand in [500, 500, 510, 490, 505] {
            now += Duration::from_secs(1);
            sent.push(book.report(1, &a, limited("k", limit), demand, now));
            sent.last_mut().unwrap().pushes.clear();
            book.report(2, &b, limited("k", limit), 500, now);
        }
        // Once settled, the same assignment repeats (Envoy keeps its bucket).
        assert_eq!(sent[2].action, sent[3].action);
        assert_eq!(sent[3].action, sent[4].action);
        // A third reporter: the others' shares drop at their next report, not later.
        let c: Arc<str> = Arc::from("c");
        book.report(3, &c, limited("k", limit), 1, now);
        now += Duration::from_secs(1);
        let mut given: HashMap<u64, f64> = HashMap::new();
        for (stream, bucket) in [(1, &a), (2, &b), (3, &c)] {
            let reported = book.report(stream, bucket, limited("k", limit), 500, now);
            for (s, _, strategy) in &reported.pushes {
                given.insert(*s, strategy.rate());
            }
            given.insert(stream, rate(reported));
            assert!(given.values().sum::<f64>() <= 1_000.0, "{given:?}");
        }
        let ra = given[&1];
        assert!(ra < rate(sent[4].clone()));
    }
    #[test]
    fn a_newcomer_counts_as_the_mean_of_known_demands() {
        let mut book = QuotaBook::new(BOUNDS);
        let limit = per_second_limit(100);
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let t0 = Instant::now();
        book.report(1, &a, limited("k", limit), 1, t0);
        let t1 = t0 + Duration::from_secs(5);
        // A's demand is known: 40 a second.
        assert_eq!(
            rate(book.report(1, &a, limited("k", limit), 200, t1)),
            100.0
        );
        // B's is not: it counts as 40 too, so the two split evenly (less the 1.05 steps).
        let joined = book.report(2, &b, limited("k", limit), 1, t1);
        let (rb, ra) = (rate(joined.clone()), joined.pushes[0].2.rate());
        assert!(
            (45.0..=50.0).contains(&rb) && (45.0..=50.0).contains(&ra),
            "{ra} {rb}"
        );
    }

    #[test]
    fn other_replicas_reporters_count_until_they_are_gone() {
        let mut book = QuotaBook::new(BOUNDS);
        let limit = per_second_limit(100);
        let a: Arc<str> = Arc::from("a");
        let t0 = Instant::now();
        assert_eq!(rate(book.report(1, &a, limited("k", limit), 1, t0)), 100.0);
        assert_eq!(
            book.aggregates(),
            [(
                Arc::from("k"),
                Aggregate {
                    reporters: 1,
                    known: 0,
                    sum: 0.0
                }
            )]
        );
        // Another replica has one reporter of k: A's share halves (pushed).
        let other = Aggregate {
            reporters: 1,
            known: 0,
            sum: 0.0,
        };
        let (pushes, evaluated) = book.set_remote(Some(vec![(Arc::from("k"), other)]));
        assert_eq!(evaluated, 1);
        assert!((45.0..=50.0).contains(&pushes[0].2.rate()), "{pushes:?}");
        // The same view again: nothing to push.
        assert!(book
            .set_remote(Some(vec![(Arc::from("k"), other)]))
            .0
            .is_empty());
        // The view is lost (Redis gone): A alone again.
        let (pushes, _) = book.set_remote(None);
        assert_eq!(pushes[0].2.rate(), 100.0);
    }
}
