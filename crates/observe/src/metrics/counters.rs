//! `cellrate_decisions_total`, counted without looking its series up every time.
//!
//! prometheus finds a labelled series by hashing its label values and reading its map under
//! a lock that every thread shares (about 700 instructions a decision, and a cache line the
//! cores pass back and forth). Each thread keeps the series it counted last (a few of them,
//! found by the limit's `Arc` name, compared by address first, then by text): a decision
//! like the ones before it costs one atomic add.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec};

/// Series a thread keeps (one per limit name, front end and result it counts in turn).
const KEPT: usize = 4;

/// Serial numbers of [`DecisionCounters`] (a thread's entries name the one they belong to).
static SERIAL: AtomicU64 = AtomicU64::new(0);

struct Kept {
    serial: u64,
    api: &'static str,
    name: Arc<str>,
    result: &'static str,
    counter: IntCounter,
}

#[derive(Default)]
struct Local {
    kept: [Option<Kept>; KEPT],
    /// The place the next new series takes (in turn).
    next: usize,
}

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::default();
}

/// `cellrate_decisions_total{api, limit, result}`.
pub(super) struct DecisionCounters {
    vec: IntCounterVec,
    serial: u64,
}

impl DecisionCounters {
    pub(super) fn new(vec: IntCounterVec) -> DecisionCounters {
        DecisionCounters {
            vec,
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The series of `labels`, looked up.
    pub(super) fn series(&self, labels: &[&str; 3]) -> IntCounter {
        self.vec.with_label_values(labels)
    }

    /// Counts one decision of `name`.
    pub(super) fn inc(&self, api: &'static str, name: &Arc<str>, result: &'static str) {
        LOCAL.with(|local| {
            let mut local = local.borrow_mut();
            let same = |k: &&Kept| {
                k.serial == self.serial
                    && (Arc::ptr_eq(&k.name, name) || *k.name == **name)
                    && k.api == api
                    && k.result == result
            };
            if let Some(kept) = local.kept.iter().flatten().find(same) {
                kept.counter.inc();
                return;
            }
            let counter = self.series(&[api, name, result]);
            counter.inc();
            let at = local.next;
            local.next = (at + 1) % KEPT;
            local.kept[at] = Some(Kept {
                serial: self.serial,
                api,
                name: name.clone(),
                result,
                counter,
            });
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Opts;

    fn counters() -> DecisionCounters {
        let opts = Opts::new("d", "decisions");
        DecisionCounters::new(IntCounterVec::new(opts, &["api", "limit", "result"]).unwrap())
    }

    #[test]
    fn each_decision_is_counted_in_its_own_series() {
        let (one, two) = (counters(), counters());
        let a: Arc<str> = Arc::from("A");
        // The same text in another Arc (a reloaded config's name): the same series.
        let a_again: Arc<str> = Arc::from("A");
        let names: Vec<Arc<str>> = (0..KEPT + 2).map(|i| Arc::from(format!("N{i}"))).collect();
        for _ in 0..3 {
            one.inc("envoy", &a, "allowed");
            one.inc("envoy", &a, "denied");
            one.inc("native", &a, "allowed");
            one.inc("envoy", &a_again, "allowed");
            two.inc("envoy", &a, "allowed");
            // More series than a thread keeps, in turn.
            names.iter().for_each(|n| one.inc("envoy", n, "denied"));
        }
        assert_eq!(one.series(&["envoy", "A", "allowed"]).get(), 6);
        assert_eq!(one.series(&["envoy", "A", "denied"]).get(), 3);
        assert_eq!(one.series(&["native", "A", "allowed"]).get(), 3);
        assert_eq!(two.series(&["envoy", "A", "allowed"]).get(), 3);
        for n in &names {
            assert_eq!(one.series(&["envoy", n, "denied"]).get(), 3);
        }
        // On another thread too.
        std::thread::scope(|s| {
            s.spawn(|| one.inc("envoy", &a, "denied"));
        });
        assert_eq!(one.series(&["envoy", "A", "denied"]).get(), 4);
    }
}
