//! The memory store's table of Checks kept for settling ([`Settlements`]): in this
//! process, bounded in number of records and in how long each is kept. With the Redis
//! store, the table is in Redis (`store::redis::settlements`), shared by the replicas.
//! Every change of a record's state (pending, decided, settled) is made under the one
//! lock, so it is atomic.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use crate::clock::{Clock, Nanos};
use crate::store::shared::{Claim, Kept, Opened, Settlements};
use crate::store::StoreFuture;

/// Checks kept for settling, in memory.
pub struct MemorySettlements {
    clock: Arc<dyn Clock>,
    window: Nanos,
    max: usize,
    ledger: Mutex<Ledger>,
}

#[derive(Default)]
struct Ledger {
    records: HashMap<Box<str>, Record>,
    /// Ids in the order they were opened, with their expiry: every record has the same
    /// window, so the front expires first and is the oldest. An id forgotten (or expired
    /// and opened again) leaves a stale pair here, recognised by its expiry.
    order: VecDeque<(Nanos, Box<str>)>,
}

struct Record {
    expires: Nanos,
    check: Vec<u8>,
    opened: Nanos,
    state: State,
}

enum State {
    /// Its Check is being decided.
    Pending,
    /// Decided (at that time, with those facts), not yet claimed.
    Decided { at: Nanos, facts: Vec<u8> },
    /// Claimed at `costs`.
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

impl Ledger {
    /// Drops the front pair, and its record if the pair is that record's.
    fn pop_front(&mut self) -> bool {
        let Some((expires, id)) = self.order.pop_front() else {
            return false;
        };
        if self.records.get(&id).is_some_and(|r| r.expires == expires) {
            self.records.remove(&id);
            return true;
        }
        false
    }

    /// Drops what has expired at `now`.
    fn purge(&mut self, now: Nanos) {
        while self
            .order
            .front()
            .is_some_and(|(expires, _)| *expires <= now)
        {
            self.pop_front();
        }
    }

    /// The record of `id` in force at `now`.
    fn live(&mut self, id: &str, now: Nanos) -> Option<&mut Record> {
        self.records.get_mut(id).filter(|r| r.expires > now)
    }
}

impl MemorySettlements {
    /// Keeps each record for `window`, at most `max` of them.
    pub fn new(clock: Arc<dyn Clock>, window: Nanos, max: usize) -> MemorySettlements {
        MemorySettlements {
            clock,
            window,
            max: max.max(1),
            ledger: Mutex::new(Ledger::default()),
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
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
    fn open<'a>(&'a self, id: &'a str, check: &'a [u8]) -> StoreFuture<'a, Opened> {
        let now = self.clock.now();
        let mut ledger = self.ledger();
        ledger.purge(now);
        if ledger.live(id, now).is_some() {
            return Box::pin(std::future::ready(Ok(Opened {
                written: false,
                evicted: 0,
            })));
        }
        let mut evicted = 0;
        while ledger.records.len() >= self.max && !ledger.order.is_empty() {
            evicted += u64::from(ledger.pop_front());
        }
        let expires = now.saturating_add(self.window);
        ledger.records.insert(
            Box::from(id),
            Record {
                expires,
                check: check.to_vec(),
                opened: now,
                state: State::Pending,
            },
        );
        ledger.order.push_back((expires, Box::from(id)));
        // Forgotten ids (denied Checks) leave stale pairs: a flood of them must not grow
        // the order past twice the table.
        if ledger.order.len() > 2 * self.max {
            let Ledger { records, order } = &mut *ledger;
            order.retain(|(expires, id)| records.get(id).is_some_and(|r| r.expires == *expires));
        }
        Box::pin(std::future::ready(Ok(Opened {
            written: true,
            evicted,
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
        self.ledger().records.remove(id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn claim<'a>(&'a self, id: &'a str, costs: &'a [u8]) -> StoreFuture<'a, Claim> {
        let now = self.clock.now();
        let mut ledger = self.ledger();
        let claim = match ledger.live(id, now) {
            None => Claim::Unknown,
            Some(r) => match &r.state {
                State::Pending => Claim::Pending,
                State::Settled { at, facts, costs } => Claim::Settled {
                    kept: r.kept(*at, facts, now),
                    costs: costs.clone(),
                },
                State::Decided { at, facts } => {
                    let kept = r.kept(*at, facts, now);
                    r.state = State::Settled {
                        at: *at,
                        facts: facts.clone(),
                        costs: costs.to_vec(),
                    };
                    Claim::Claimed(kept)
                }
            },
        };
        Box::pin(std::future::ready(Ok(claim)))
    }

    fn reopen<'a>(&'a self, id: &'a str, facts: &'a [u8]) -> StoreFuture<'a, ()> {
        let now = self.clock.now();
        if let Some(r) = self.ledger().live(id, now) {
            if let State::Settled { at, .. } = r.state {
                r.state = State::Decided {
                    at,
                    facts: facts.to_vec(),
                };
            }
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{FakeClock, SECOND};

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
        assert!(block(table.open("a", b"A")).written);
        assert!(
            !block(table.open("a", b"other")).written,
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
        block(table.open("b", b"B"));
        block(table.open("c", b"C"));
        block(table.decide("c", b"F"));
        let opened = block(table.open("d", b"D"));
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
        assert!(block(table.open("c", b"C2")).written);
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
        block(table.open("kept", b"K"));
        block(table.decide("kept", b"F"));
        for i in 0..1_000 {
            let id = format!("denied-{i}");
            block(table.open(&id, b"D"));
            block(table.forget(&id));
        }
        let order = table.ledger().order.len();
        assert!(order <= 21, "{order} order pairs for one record");
        assert_eq!(table.len(), 1);
        assert!(matches!(
            block(table.claim("kept", b"1")),
            Claim::Claimed(Kept { check, .. }) if check == b"K"
        ));
    }
}
