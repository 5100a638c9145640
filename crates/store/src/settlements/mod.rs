//! The memory store's table of Checks kept for settling ([`Settlements`]): in this
//! process, bounded in number of records and in how long each is kept. With the Redis
//! store, the table is in Redis (`store::redis::settlements`), shared by the replicas.
//! Every change of a record's state (pending, decided, settled) is made under the one
//! lock, so it is atomic; so is the claim of due holds (see [`Settlements`]). Each bucket
//! key's live holds are counted as they enter and leave `holds`, so one key's share of
//! the table is exact.

mod ledger;

use ledger::count;

use parking_lot::Mutex;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;

use crate::shared::{Claim, Kept, Opened, Settlements, DEFAULT_MAX_HOLDS_PER_KEY};
use crate::StoreFuture;
use cellrate_core::clock::{Clock, Nanos};

/// Checks kept for settling, in memory.
pub struct MemorySettlements {
    clock: Arc<dyn Clock>,
    window: Nanos,
    max: usize,
    max_per_key: usize,
    /// Keys the hashes of bucket keys (random per process, so that no caller can make two
    /// keys share a count).
    hasher: RandomState,
    ledger: Mutex<Ledger>,
}

/// Every record is in exactly one of `order` and `holds`: in `holds` while it is a live
/// hold (opened with a hold, not settled), else in `order`.
#[derive(Default)]
struct Ledger {
    records: HashMap<Box<str>, Record>,
    /// Records that may be dropped, by expiry (then age): the front expires first, and is
    /// the first pushed out.
    order: BTreeSet<(Nanos, u64, Box<str>)>,
    /// Live holds, by due (then age).
    holds: BTreeSet<(Nanos, u64, Box<str>)>,
    /// Live holds per bucket key they count against, by the key's 64-bit keyed hash (a
    /// key with none is not there).
    per_key: HashMap<u64, usize>,
    /// Anonymous live holds per queue, oldest first (`queues.rs`).
    queues: HashMap<Box<str>, VecDeque<Box<str>>>,
    /// Records opened so far: each record's number, its age.
    opened: u64,
}

struct Record {
    expires: Nanos,
    /// Its number in opening order.
    seq: u64,
    /// When its hold ends (a hold's record).
    due: Option<Nanos>,
    /// The bucket keys a hold counts against (their keyed hashes).
    keys: Box<[u64]>,
    /// The queue its live hold is in (`queues.rs`).
    queue: Option<Box<str>>,
    check: Vec<u8>,
    opened: Nanos,
    state: State,
}

enum State {
    /// Its Check is being decided.
    Pending,
    /// Decided (at that time, with those facts), not yet claimed.
    Decided { at: Nanos, facts: Vec<u8> },
    /// Claimed at `costs` (empty: claimed at its due, for its release).
    Settled {
        at: Nanos,
        facts: Vec<u8>,
        costs: Vec<u8>,
    },
}

impl Record {
    fn kept(&self, decided: Nanos, facts: &[u8], now: Nanos) -> Kept {
        Kept {
            check: self.check.clone(),
            facts: facts.to_vec(),
            opened: self.opened,
            decided,
            now,
        }
    }
}

impl MemorySettlements {
    /// Keeps each record for `window` (a hold, one window past its due), at most `max`
    /// of them, and at most [`DEFAULT_MAX_HOLDS_PER_KEY`] live holds per bucket key
    /// ([`MemorySettlements::with_max_holds_per_key`]).
    pub fn new(clock: Arc<dyn Clock>, window: Nanos, max: usize) -> MemorySettlements {
        MemorySettlements {
            clock,
            window,
            max: max.max(1),
            max_per_key: DEFAULT_MAX_HOLDS_PER_KEY,
            hasher: RandomState::new(),
            ledger: Mutex::new(Ledger::default()),
        }
    }

    /// At most `max` live holds counted against any one bucket key.
    pub fn with_max_holds_per_key(self, max: usize) -> MemorySettlements {
        MemorySettlements {
            max_per_key: max.max(1),
            ..self
        }
    }

    fn ledger(&self) -> parking_lot::MutexGuard<'_, Ledger> {
        self.ledger.lock()
    }

    /// Records kept now (expired ones included until the next change).
    pub fn len(&self) -> usize {
        self.ledger().records.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Settlements for MemorySettlements {
    fn open<'a>(
        &'a self,
        id: &'a str,
        check: &'a [u8],
        hold: Option<Nanos>,
        keys: &'a [String],
    ) -> StoreFuture<'a, Opened> {
        let now = self.clock.now();
        let mut ledger = self.ledger();
        ledger.purge(now);
        let refused = |full, crowded| {
            Box::pin(std::future::ready(Ok(Opened {
                written: false,
                evicted: 0,
                full,
                crowded,
            })))
        };
        if ledger.live(id, now).is_some() {
            return refused(false, None);
        }
        // An expired record of the same id (a hold's, waiting for its claim, is never
        // expired: kept one window past its due) goes.
        ledger.remove(id);
        let keys: Box<[u64]> = match hold {
            Some(_) => keys.iter().map(|k| self.hasher.hash_one(k)).collect(),
            None => Box::new([]),
        };
        if let Some(at) = ledger.crowded(&keys, self.max_per_key) {
            return refused(false, Some(at));
        }
        if ledger.holds.len() >= self.max {
            return refused(true, None);
        }
        let mut evicted = 0;
        while ledger.records.len() >= self.max && ledger.pop_front() {
            evicted += 1;
        }
        let due = hold.map(|hold| now.saturating_add(hold));
        let expires = due.unwrap_or(now).saturating_add(self.window);
        ledger.opened += 1;
        let seq = ledger.opened;
        if due.is_some() {
            count(&mut ledger.per_key, &keys, true);
        }
        ledger.records.insert(
            Box::from(id),
            Record {
                expires,
                seq,
                due,
                keys,
                queue: None,
                check: check.to_vec(),
                opened: now,
                state: State::Pending,
            },
        );
        match due {
            Some(due) => ledger.holds.insert((due, seq, Box::from(id))),
            None => ledger.order.insert((expires, seq, Box::from(id))),
        };
        Box::pin(std::future::ready(Ok(Opened {
            written: true,
            evicted,
            full: false,
            crowded: None,
        })))
    }

    fn decide<'a>(&'a self, id: &'a str, facts: &'a [u8]) -> StoreFuture<'a, bool> {
        let now = self.clock.now();
        let decided = match self.ledger().live(id, now) {
            Some(r) if matches!(r.state, State::Pending) => {
                r.state = State::Decided {
                    at: now,
                    facts: facts.to_vec(),
                };
                true
            }
            _ => false,
        };
        Box::pin(std::future::ready(Ok(decided)))
    }

    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.ledger().remove(id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn claim<'a>(&'a self, id: &'a str, costs: &'a [u8]) -> StoreFuture<'a, Claim> {
        let now = self.clock.now();
        let mut ledger = self.ledger();
        let claim = match ledger.live(id, now) {
            None => Claim::Unknown,
            Some(r) => match &r.state {
                State::Pending => Claim::Pending,
                State::Settled { costs, .. } if costs.is_empty() => Claim::Expired,
                State::Settled { at, facts, costs } => Claim::Settled {
                    kept: r.kept(*at, facts, now),
                    costs: costs.clone(),
                },
                State::Decided { .. } if r.due.is_some_and(|due| due <= now) => Claim::Expired,
                State::Decided { at, facts } => {
                    let kept = r.kept(*at, facts, now);
                    r.state = State::Settled {
                        at: *at,
                        facts: facts.clone(),
                        costs: costs.to_vec(),
                    };
                    ledger.unhold(id);
                    Claim::Claimed(kept)
                }
            },
        };
        Box::pin(std::future::ready(Ok(claim)))
    }

    fn reopen<'a>(&'a self, id: &'a str, facts: &'a [u8]) -> StoreFuture<'a, ()> {
        let now = self.clock.now();
        let mut ledger = self.ledger();
        if let Some(r) = ledger.live(id, now) {
            if let State::Settled { at, .. } = r.state {
                r.state = State::Decided {
                    at,
                    facts: facts.to_vec(),
                };
                ledger.rehold(id);
            }
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn window(&self) -> Nanos {
        self.window
    }

    fn due(&self, max: usize) -> StoreFuture<'_, Vec<(String, Kept)>> {
        let now = self.clock.now();
        let mut ledger = self.ledger();
        let Ledger {
            records,
            order,
            holds,
            per_key,
            ..
        } = &mut *ledger;
        let mut claimed = Vec::new();
        // Holds no longer live, out of their queues once the loop is done.
        let mut left: Vec<Box<str>> = Vec::new();
        while claimed.len() < max && holds.first().is_some_and(|(due, ..)| *due <= now) {
            let Some((_, _, id)) = holds.pop_first() else {
                break;
            };
            let Some(r) = records.get_mut(&id) else {
                continue;
            };
            order.insert((r.expires, r.seq, id.clone()));
            count(per_key, &r.keys, false);
            if r.queue.is_some() {
                left.push(id.clone());
            }
            if let State::Decided { at, facts } = &r.state {
                let kept = r.kept(*at, facts, now);
                r.state = State::Settled {
                    at: *at,
                    facts: facts.clone(),
                    costs: Vec::new(),
                };
                claimed.push((id.into_string(), kept));
            }
        }
        for id in left {
            ledger.dequeue(&id);
        }
        Box::pin(std::future::ready(Ok(claimed)))
    }

    fn enqueue<'a>(&'a self, queue: &'a str, id: &'a str) -> StoreFuture<'a, ()> {
        self.ledger().enqueue(queue, id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn claim_oldest<'a>(
        &'a self,
        queue: &'a str,
        costs: &'a [u8],
    ) -> StoreFuture<'a, Option<(String, Kept)>> {
        let now = self.clock.now();
        let claimed = self.ledger().claim_oldest(queue, costs, now);
        Box::pin(std::future::ready(Ok(claimed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::{FakeClock, SECOND};

    fn block<T>(f: StoreFuture<'_, T>) -> T {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(f).unwrap()
    }

    /// The claim of a record opened and decided at `at`, claimed at `now`.
    fn claimed(check: &[u8], facts: &[u8], at: Nanos, now: Nanos) -> Claim {
        Claim::Claimed(Kept {
            check: check.to_vec(),
            facts: facts.to_vec(),
            opened: at,
            decided: at,
            now,
        })
    }

    #[test]
    fn records_are_pending_then_decided_then_claimed_once_and_bounded() {
        let t = 1_000 * SECOND;
        let clock = FakeClock::new(t);
        let table = MemorySettlements::new(Arc::new(clock.clone()), 60 * SECOND, 3);
        assert!(block(table.open("a", b"A", None, &[])).written);
        assert!(
            !block(table.open("a", b"other", None, &[])).written,
            "an id is kept once"
        );
        assert_eq!(block(table.claim("nope", b"1")), Claim::Unknown);
        assert_eq!(block(table.claim("a", b"5")), Claim::Pending, "not decided");
        assert!(block(table.decide("a", b"F")));
        assert!(!block(table.decide("a", b"G")), "decided once");
        assert!(!block(table.decide("nope", b"G")));
        assert_eq!(block(table.claim("a", b"5")), claimed(b"A", b"F", t, t));
        let settled = Claim::Settled {
            kept: match claimed(b"A", b"F", t, t) {
                Claim::Claimed(kept) => kept,
                _ => unreachable!(),
            },
            costs: b"5".to_vec(),
        };
        assert_eq!(block(table.claim("a", b"6")), settled, "claimed once");
        block(table.reopen("a", b"F2"));
        assert_eq!(block(table.claim("a", b"6")), claimed(b"A", b"F2", t, t));

        // Full: the oldest is pushed out.
        block(table.open("b", b"B", None, &[]));
        block(table.open("c", b"C", None, &[]));
        block(table.decide("c", b"F"));
        let opened = block(table.open("d", b"D", None, &[]));
        assert_eq!((opened.written, opened.evicted), (true, 1));
        assert_eq!(block(table.claim("a", b"1")), Claim::Unknown);
        assert_eq!(table.len(), 3);

        // Forgotten, and expired at the window's end to the nanosecond.
        block(table.forget("b"));
        assert_eq!(block(table.claim("b", b"1")), Claim::Unknown);
        clock.advance(60 * SECOND - 1);
        let now = t + 60 * SECOND - 1;
        assert_eq!(block(table.claim("c", b"1")), claimed(b"C", b"F", t, now));
        clock.advance(1);
        assert_eq!(block(table.claim("d", b"1")), Claim::Unknown);
        // An expired id may be used again; the stale order pair does not drop it.
        assert!(block(table.open("c", b"C2", None, &[])).written);
        assert_eq!(table.len(), 1);
        assert!(block(table.decide("c", b"F")));
        assert_eq!(
            block(table.claim("c", b"1")),
            claimed(b"C2", b"F", now + 1, now + 1)
        );
    }

    #[test]
    fn a_flood_of_denied_checks_leaves_nothing_behind() {
        let clock = FakeClock::new(1_000 * SECOND);
        let table = MemorySettlements::new(Arc::new(clock), 60 * SECOND, 10);
        block(table.open("kept", b"K", None, &[]));
        block(table.decide("kept", b"F"));
        for i in 0..1_000 {
            let id = format!("denied-{i}");
            block(table.open(&id, b"D", None, &[]));
            block(table.forget(&id));
        }
        let order = table.ledger().order.len();
        assert_eq!(order, 1, "{order} order pairs for one record");
        assert_eq!(table.len(), 1);
        assert!(matches!(
            block(table.claim("kept", b"1")),
            Claim::Claimed(Kept { check, .. }) if check == b"K"
        ));
    }

    #[test]
    fn holds_are_due_once_never_pushed_out_and_a_full_table_of_them_refuses() {
        let t = 1_000 * SECOND;
        let clock = FakeClock::new(t);
        let table = MemorySettlements::new(Arc::new(clock.clone()), 60 * SECOND, 3);
        let hold = Some(10 * SECOND);
        for id in ["h1", "h2"] {
            assert!(block(table.open(id, b"H", hold, &[])).written);
            assert!(block(table.decide(id, b"F")));
        }
        // A plain record is pushed out for a new one; the holds never are.
        block(table.open("p1", b"P", None, &[]));
        let opened = block(table.open("p2", b"P", None, &[]));
        assert_eq!(
            (opened.written, opened.evicted, opened.full),
            (true, 1, false)
        );
        assert_eq!(block(table.claim("p1", b"1")), Claim::Unknown);
        let opened = block(table.open("h3", b"H", hold, &[]));
        assert_eq!((opened.written, opened.evicted), (true, 1), "p2 pushed out");
        let refused = block(table.open("h4", b"H", hold, &[]));
        assert_eq!((refused.written, refused.full), (false, true));
        assert_eq!(table.len(), 3);

        // h1 settled before its due: no longer a hold, so pushed out first.
        assert!(matches!(block(table.claim("h1", b"5")), Claim::Claimed(_)));
        assert!(block(table.due(10)).is_empty(), "nothing due yet");
        clock.advance(10 * SECOND - 1);
        assert!(
            block(table.due(10)).is_empty(),
            "due at the hold's end, not before"
        );
        clock.advance(1);
        // From its due, a claim finds it expired; the due call claims it once.
        assert_eq!(block(table.claim("h2", b"5")), Claim::Expired);
        let due = block(table.due(10));
        let ids: Vec<&str> = due.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["h2"], "h3 still pending: let go, not claimed");
        assert!(block(table.due(10)).is_empty(), "claimed once");
        assert_eq!(block(table.claim("h2", b"5")), Claim::Expired);
        // A failed release reopens it: due again.
        block(table.reopen("h2", b"F2"));
        assert_eq!(block(table.due(10)).len(), 1);
        // Kept one window past its due, then dropped.
        clock.advance(60 * SECOND - 1);
        assert_eq!(block(table.claim("h2", b"5")), Claim::Expired);
        clock.advance(1);
        assert_eq!(block(table.claim("h2", b"5")), Claim::Unknown);
        assert!(block(table.open("h4", b"H", hold, &[])).written);
    }

    /// Every site that opens or closes a hold counts it exactly once against its keys:
    /// open, forget, claim (settled), reopen, due (claimed or let go).
    #[test]
    fn each_key_has_a_share_of_live_holds_counted_exactly() {
        let t = 1_000 * SECOND;
        let clock = FakeClock::new(t);
        let table = MemorySettlements::new(Arc::new(clock.clone()), 60 * SECOND, 100)
            .with_max_holds_per_key(2);
        let hold = Some(10 * SECOND);
        let (a, b) = (vec!["1:a".to_string()], vec!["1:b".to_string()]);
        let both = vec!["1:a".to_string(), "1:b".to_string()];
        let per = |key: &str| {
            let key = table.hasher.hash_one(key.to_string());
            table.ledger().per_key.get(&key).copied().unwrap_or(0)
        };
        for id in ["a1", "a2"] {
            assert!(block(table.open(id, b"H", hold, &a)).written);
            assert!(block(table.decide(id, b"F")));
        }
        let crowded = block(table.open("a3", b"H", hold, &a));
        assert_eq!((crowded.written, crowded.crowded), (false, Some(0)));
        let crowded = block(table.open("ab", b"H", hold, &both));
        assert_eq!(crowded.crowded, Some(0), "the first full key is named");
        // Another key, and records that hold nothing, are not refused.
        assert!(block(table.open("b1", b"H", hold, &b)).written);
        assert!(block(table.open("p1", b"P", None, &a)).written);
        assert_eq!((per("1:a"), per("1:b")), (2, 1));

        // Settled: no longer counted; reopened: counted again.
        assert!(matches!(block(table.claim("a1", b"5")), Claim::Claimed(_)));
        assert_eq!(per("1:a"), 1);
        block(table.reopen("a1", b"F2"));
        assert_eq!(per("1:a"), 2);
        assert!(matches!(block(table.claim("a1", b"5")), Claim::Claimed(_)));
        // Dropped (a denied Check): no longer counted.
        assert!(block(table.open("ab", b"H", hold, &both)).written);
        assert_eq!((per("1:a"), per("1:b")), (2, 2));
        block(table.forget("ab"));
        assert_eq!((per("1:a"), per("1:b")), (1, 1));
        block(table.forget("ab"));
        assert_eq!((per("1:a"), per("1:b")), (1, 1), "forgotten once");

        // Due: a2 claimed, b1 (pending) let go; neither counted.
        clock.advance(10 * SECOND);
        assert_eq!(block(table.due(10)).len(), 1);
        assert!(table.ledger().per_key.is_empty());
        block(table.reopen("a2", b"F3"));
        assert_eq!(per("1:a"), 1, "a failed release holds again");
        assert_eq!(block(table.due(10)).len(), 1);
        assert!(table.ledger().per_key.is_empty());
        assert!(block(table.open("a4", b"H", hold, &a)).written);
    }
}
