//! The Redis store's share of lease keys (docs/redis-store.md, "Leases"; docs/concurrency.md,
//! "Bounds and memory"): per limit name number, the lease keys this replica has taken a
//! lease in and that may still hold it, each until that lease's expiry. A key is counted
//! by the acquire that claims it, before its script call; an acquire that would need a
//! key not yet counted while its name holds its share (`--lease-name-share` of
//! `--max-leases`), or while the replica counts `--max-leases` keys in all, is refused
//! (it may only find its id already held: a retry), which the store answers as the memory
//! store answers a full share. Acquires into counted keys and releases always proceed.
//!
//! Every live lease key in Redis holds a lease some replica took, and that replica counts
//! the key until that lease expires (or it saw the key emptied): Redis holds at most
//! replicas x share lease keys per name, each at most `count` leases, whatever one caller
//! sends. An exact count in Redis is not possible on a cluster without moving a name's
//! keys into one slot (a change of key layout); this bound needs none.
//!
//! A key is kept as a 64-bit SipHash of its Redis key under keys drawn at random per
//! process (callers cannot aim two keys at one entry), beside its expiry: its memory is
//! measured in docs/operations.md's budget table.

use parking_lot::{Mutex, MutexGuard};
use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;

use cellrate_core::clock::Nanos;

/// The lease keys one replica counts. See the module docs.
pub struct LeaseKeys {
    /// Keys counted at most in all, and per name number.
    bound: usize,
    share: usize,
    prints: RandomState,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    names: HashMap<u32, Name>,
    total: usize,
    /// The last sequence number given to a claim or a settled acquire.
    seq: u64,
}

/// One name's counted keys, by print and by expiry.
#[derive(Default)]
struct Name {
    keys: HashMap<u64, Entry>,
    by_expiry: BTreeSet<(Nanos, u64)>,
}

struct Entry {
    expires: Nanos,
    /// The sequence number of the key's last claim or settled acquire.
    activity: u64,
    /// Acquires claimed and not yet settled.
    in_flight: u32,
}

/// What an acquire's claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The key is counted (`new`: by this claim), under sequence number `seq`.
    Counted { seq: u64, new: bool },
    /// The key is not counted and its name's share (or the bound in all) is full: the
    /// acquire may take no new lease.
    Refused,
}

/// What an acquire's script call did with its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// It took a lease there, which expires at the given time.
    Taken(Nanos),
    /// It took none (denied, or its id held one already).
    NotTaken,
    /// Unknown: the call failed, or its lease may have been taken back by a compensation
    /// that could fail.
    Unknown,
}

impl Name {
    /// Drops the entries expired at `now`; returns how many.
    fn drop_expired(&mut self, now: Nanos) -> usize {
        let mut dropped = 0;
        while let Some(&(expires, print)) = self.by_expiry.first() {
            if expires > now {
                break;
            }
            self.by_expiry.pop_first();
            self.keys.remove(&print);
            dropped += 1;
        }
        dropped
    }

    fn remove(&mut self, print: u64) -> usize {
        match self.keys.remove(&print) {
            Some(entry) => {
                self.by_expiry.remove(&(entry.expires, print));
                1
            }
            None => 0,
        }
    }

    fn extend(&mut self, print: u64, until: Nanos) {
        if let Some(entry) = self.keys.get_mut(&print) {
            if until > entry.expires {
                self.by_expiry.remove(&(entry.expires, print));
                self.by_expiry.insert((until, print));
                entry.expires = until;
            }
        }
    }
}

impl LeaseKeys {
    /// At most `max_keys` keys counted in all, and `percent` (1 to 100) of that per name
    /// number, at least 1.
    pub fn new(max_keys: usize, percent: usize) -> LeaseKeys {
        let share = (max_keys as u128 * percent.clamp(1, 100) as u128 / 100) as usize;
        LeaseKeys {
            bound: max_keys.max(1),
            share: share.max(1),
            prints: RandomState::new(),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    fn print(&self, key: &str) -> u64 {
        self.prints.hash_one(key)
    }

    /// Claims Redis key `key` of name `number` for an acquire at `now` whose lease would
    /// expire at `until`: counted (kept at least until `until`), or refused.
    pub fn claim(&self, number: u32, key: &str, now: Nanos, until: Nanos) -> Claim {
        let print = self.print(key);
        let mut guard = self.lock();
        let state = &mut *guard;
        state.seq += 1;
        let seq = state.seq;
        let name = state.names.entry(number).or_default();
        state.total -= name.drop_expired(now);
        if let Some(entry) = name.keys.get_mut(&print) {
            entry.activity = seq;
            entry.in_flight += 1;
            name.extend(print, until);
            return Claim::Counted { seq, new: false };
        }
        if state.total >= self.bound {
            // Other names' expired keys go first.
            for other in state.names.values_mut() {
                state.total -= other.drop_expired(now);
            }
        }
        let name = state.names.entry(number).or_default();
        if name.keys.len() >= self.share || state.total >= self.bound {
            return Claim::Refused;
        }
        let entry = Entry {
            expires: until,
            activity: seq,
            in_flight: 1,
        };
        name.keys.insert(print, entry);
        name.by_expiry.insert((until, print));
        state.total += 1;
        Claim::Counted { seq, new: true }
    }

    /// Settles a claim after its acquire's call: a key it took a lease in is kept until
    /// that lease expires; a key it claimed new and took nothing in is dropped, unless
    /// another acquire claimed or settled it since.
    pub fn settle(&self, number: u32, key: &str, claim: Claim, settled: Settled) {
        let Claim::Counted { seq, new } = claim else {
            return;
        };
        let print = self.print(key);
        let mut guard = self.lock();
        let state = &mut *guard;
        state.seq += 1;
        let next = state.seq;
        let Some(name) = state.names.get_mut(&number) else {
            return;
        };
        let Some(entry) = name.keys.get_mut(&print) else {
            return;
        };
        entry.in_flight = entry.in_flight.saturating_sub(1);
        match settled {
            Settled::Taken(expires) => {
                entry.activity = next;
                name.extend(print, expires);
            }
            Settled::Unknown => entry.activity = next,
            Settled::NotTaken => {
                if new && entry.activity == seq && entry.in_flight == 0 {
                    state.total -= name.remove(print);
                }
            }
        }
    }

    /// The sequence number now: a release takes it before its call, for
    /// [`LeaseKeys::emptied`].
    pub fn seq(&self) -> u64 {
        self.lock().seq
    }

    /// A release's call (begun at sequence number `seq`) left `key` without a lease: it is
    /// no longer counted, unless an acquire claimed or settled it since `seq` or is still
    /// in flight (its lease may have been taken after the release's).
    pub fn emptied(&self, number: u32, key: &str, seq: u64) {
        let print = self.print(key);
        let mut guard = self.lock();
        let state = &mut *guard;
        let Some(name) = state.names.get_mut(&number) else {
            return;
        };
        if name
            .keys
            .get(&print)
            .is_some_and(|e| e.activity <= seq && e.in_flight == 0)
        {
            state.total -= name.remove(print);
        }
    }

    /// Drops every name's expired keys (the sweeper, every 10 s); returns how many.
    pub fn sweep(&self, now: Nanos) -> usize {
        let mut guard = self.lock();
        let state = &mut *guard;
        let mut dropped = 0;
        state.names.retain(|_, name| {
            dropped += name.drop_expired(now);
            !name.keys.is_empty()
        });
        state.total -= dropped;
        dropped
    }

    /// Keys counted for name `number` (expired ones until dropped).
    pub fn held(&self, number: u32) -> usize {
        self.lock().names.get(&number).map_or(0, |n| n.keys.len())
    }

    /// Keys counted in all (expired ones until dropped).
    pub fn len(&self) -> usize {
        self.lock().total
    }

    /// Whether no key is counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The share of one name.
    pub fn share(&self) -> usize {
        self.share
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Nanos = 30_000_000_000;

    fn counted(claim: Claim) -> bool {
        matches!(claim, Claim::Counted { .. })
    }

    /// A name's share of keys, then refusals; a counted key always proceeds; other names
    /// keep theirs; an expired key leaves the count; the bound in all holds across names.
    #[test]
    fn shares_bound_keys_per_name_and_in_all() {
        let keys = LeaseKeys::new(8, 50);
        for i in 0..4 {
            let claim = keys.claim(100, &format!("k{i}"), 0, HOLD);
            assert!(matches!(claim, Claim::Counted { new: true, .. }));
            keys.settle(100, &format!("k{i}"), claim, Settled::Taken(HOLD));
        }
        assert_eq!(keys.claim(100, "k9", 1, 1 + HOLD), Claim::Refused);
        let again = keys.claim(100, "k0", 1, 1 + HOLD);
        assert!(matches!(again, Claim::Counted { new: false, .. }));
        keys.settle(100, "k0", again, Settled::Taken(1 + HOLD));
        for i in 0..4 {
            assert!(counted(keys.claim(101, &format!("k{i}"), 1, 1 + HOLD)));
        }
        assert_eq!(
            keys.claim(102, "k0", 1, 1 + HOLD),
            Claim::Refused,
            "8 in all"
        );
        assert_eq!((keys.held(100), keys.len()), (4, 8));
        // k1..k3 expire at HOLD; k0 was extended by its second lease.
        assert!(counted(keys.claim(102, "k0", HOLD, 2 * HOLD)));
        assert_eq!((keys.held(100), keys.len()), (1, 6));
        assert_eq!(keys.sweep(2 * HOLD), 6);
        assert!(keys.is_empty());
    }

    /// A key claimed new and not taken leaves the count, unless another acquire claimed
    /// it meanwhile; a release that emptied a key frees it, unless an acquire was in
    /// flight or settled since the release began; an unknown outcome keeps the key.
    #[test]
    fn keys_leave_the_count_only_when_no_acquire_may_hold_them() {
        let keys = LeaseKeys::new(100, 100);
        let first = keys.claim(7, "k", 0, HOLD);
        let second = keys.claim(7, "k", 0, HOLD);
        keys.settle(7, "k", first, Settled::NotTaken);
        assert_eq!(keys.held(7), 1, "the second acquire may take it");
        keys.settle(7, "k", second, Settled::Taken(HOLD));
        let seq = keys.seq();
        let racing = keys.claim(7, "k", 1, HOLD + 1);
        keys.emptied(7, "k", seq);
        assert_eq!(keys.held(7), 1, "an acquire in flight");
        keys.settle(7, "k", racing, Settled::Taken(HOLD + 1));
        keys.emptied(7, "k", seq);
        assert_eq!(keys.held(7), 1, "settled after the release began");
        keys.emptied(7, "k", keys.seq());
        assert_eq!(keys.held(7), 0);
        let lost = keys.claim(7, "j", 2, HOLD + 2);
        keys.settle(7, "j", lost, Settled::Unknown);
        assert_eq!(keys.held(7), 1, "a failed call may have taken it");
        let denied = keys.claim(7, "i", 2, HOLD + 2);
        keys.settle(7, "i", denied, Settled::NotTaken);
        assert_eq!(keys.held(7), 1);
    }
}
