//! The Redis store's share of bucket keys (docs/redis-store.md, "A share of bucket keys"):
//! the memory store's bounds (`--max-buckets`, its caller-given share, and each configured
//! limit name's `--bucket-name-share` of the rest; `memory/shares.rs`) applied to the Redis
//! keys this replica writes. A client that sends ever-new ids on one per-key limit (a
//! header the limit takes as its id) would otherwise make a Redis key each until
//! `maxmemory`, when every tenant's writes fail and `--redis-failure-policy` answers for
//! everyone (UNAVAILABLE by default, which Envoy's default lets through).
//!
//! A key is counted by the spend that claims it, before its script call, and stays
//! counted at least until the expiry this replica's writes gave it (the script sets `PX` to
//! the time until the stored TAT, so the count ends no earlier than the key), or, when a
//! call's outcome is not known (or its request was dropped while the call may still
//! write: [`Claims`]), until the latest expiry its limit allows. A spend that
//! would write a key not counted while its name (or space) is full is **denied**, as the
//! memory store denies a spend that needs a new bucket: nothing of its batch is written,
//! the item answers [`cellrate_core::gcra::no_room`], and a spend-only item refused room is
//! answered as its bucket stands. Only items that may write claim a key: peeks, check-only
//! items and resolutions read, and leases have their own count (`lease_keys.rs`).
//!
//! Every write is made by a replica that counts its key until the expiry it wrote, so every
//! live bucket key in Redis is counted by some replica: **Redis holds at most replicas x
//! share keys per name**, whatever one caller sends, and no key layout changes. The count
//! errs on the high side: a key another replica wrote (or that Redis dropped early, refunded
//! to full) is new here, so a replica whose name is full denies that key's spends too until
//! its count frees room (the memory store would find it: docs/redis-store.md).
//!
//! A key is kept as a 64-bit SipHash of its Redis key under keys drawn at random per
//! process (callers cannot aim two keys at one entry), beside its expiry in whole seconds
//! and its name, 16 bytes in one of 256 shards' maps; the store's sweeper drops the ended
//! ones, and a claim that finds no room first sweeps them all (at most once a second).
//! Its memory is measured in docs/operations.md's budget table.

use parking_lot::Mutex;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::atomic::{AtomicI64, Ordering};

use super::wire::Read;
use crate::memory::shares::{tag_of, Full, Room};
use crate::memory::{PrintHasher, Space};
use crate::table::Tag;
use crate::StoreItem;
use cellrate_core::clock::{Nanos, SECOND};
use cellrate_core::gcra::{self, BatchOutcome, Mode, Window};

/// Shards of the count: a spend locks one per key it writes, twice; a sweep holds each in
/// turn (about 40 000 keys a shard at the default `--max-buckets`).
const SHARDS: usize = 256;

/// The least time between two sweeps by claims that found no room (a sweep reads every
/// key: 5 ms for a name's default share, 30 ms for 10^7 keys, `cargo bench --bench
/// capacity`).
const SWEEP_GAP: Nanos = SECOND;

const MILLISECOND: Nanos = 1_000_000;

/// The bit of [`Entry::state`] that says the key is a caller-given limit's.
const CALLER_GIVEN: u16 = 1 << 15;

/// The bucket keys one replica counts. See the module docs.
pub struct BucketKeys {
    shards: Box<[Mutex<Shard>]>,
    prints: RandomState,
    room: Room,
    /// When a claim that found no room last swept the shards.
    swept: AtomicI64,
}

/// One shard's counted keys, by print.
#[derive(Default)]
struct Shard {
    keys: HashMap<u64, Entry, BuildHasherDefault<PrintHasher>>,
}

/// A counted key in 8 bytes (16 with its print): its expiry in whole Unix seconds
/// (rounded up), its name's tag, and its claims in flight (the key is kept while any is)
/// with its space in the top bit.
#[derive(Clone, Copy)]
struct Entry {
    expires: u32,
    tag: Tag,
    state: u16,
}

impl Entry {
    fn space(self) -> Space {
        match self.state & CALLER_GIVEN {
            0 => Space::Configured,
            _ => Space::CallerGiven,
        }
    }

    fn in_flight(self) -> u16 {
        self.state & !CALLER_GIVEN
    }

    fn claimed(&mut self) {
        if self.in_flight() < !CALLER_GIVEN {
            self.state += 1;
        }
    }

    fn settled(&mut self) {
        if self.in_flight() > 0 {
            self.state -= 1;
        }
    }
}

/// `at` in whole Unix seconds, rounded up (0 before 1970, the largest `u32` after 2106).
fn seconds(at: Nanos) -> u32 {
    let at = at.max(0);
    let whole = at / SECOND + i64::from(at % SECOND != 0);
    u32::try_from(whole).unwrap_or(u32::MAX)
}

/// An item's claim on its Redis key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketClaim {
    /// The item writes nothing (or its call only resolves an earlier one).
    None,
    /// The key is counted, under this print, in this shard.
    Counted { shard: usize, print: u64 },
    /// The key is not counted and the bound named is full: the item may not write.
    Refused(Full),
}

/// What an item's call did with its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// It wrote the key, which expires at the given time (this replica's clock).
    Until(Nanos),
    /// It wrote nothing.
    Nothing,
    /// Unknown (the call failed): the key may live until the given time.
    Perhaps(Nanos),
}

impl Shard {
    /// Drops the entries whose count has ended at `now` and gives back their room; returns
    /// how many. The counts of the few tags a shard drops are summed first.
    fn drop_expired(&mut self, now: Nanos, room: &Room) -> usize {
        let now = seconds(now);
        let mut runs: Vec<(Space, Tag, usize)> = Vec::new();
        let before = self.keys.len();
        self.keys.retain(|_, entry| {
            let keep = entry.in_flight() > 0 || entry.expires > now;
            if !keep {
                let (space, tag) = (entry.space(), entry.tag);
                match runs.iter().position(|&(s, t, _)| (s, t) == (space, tag)) {
                    Some(at) => runs[at].2 += 1,
                    None if runs.len() < 16 => runs.push((space, tag, 1)),
                    None => room.dropped(space, tag, 1),
                }
            }
            keep
        });
        for (space, tag, n) in runs {
            room.dropped(space, tag, n);
        }
        before - self.keys.len()
    }
}

impl BucketKeys {
    /// At most `max_keys` keys counted, `caller_percent` of them for caller-given limits,
    /// and each configured name at most `name_percent` of the rest.
    pub fn new(max_keys: usize, caller_percent: usize, name_percent: usize) -> BucketKeys {
        BucketKeys {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            prints: RandomState::new(),
            room: Room::new(max_keys, caller_percent).with_name_share(name_percent),
            swept: AtomicI64::new(0),
        }
    }

    /// Claims the Redis key `key` of `item` at `now`: counted, refused, or none when the
    /// item cannot write.
    pub fn claim(&self, item: &StoreItem, key: &str, now: Nanos) -> BucketClaim {
        let writes = matches!(
            item.mode,
            Mode::CheckAndSpend | Mode::SpendOnly | Mode::Charge
        );
        if !writes || item.cost == 0 || item.limit.window() == Window::Concurrency {
            return BucketClaim::None;
        }
        let print = self.prints.hash_one(key);
        let shard = (print % SHARDS as u64) as usize;
        let counted = BucketClaim::Counted { shard, print };
        if let Some(entry) = self.shards[shard].lock().keys.get_mut(&print) {
            entry.claimed();
            return counted;
        }
        let (space, tag) = (Space::of(&item.key), tag_of(&item.key));
        let mut room = self.room.reserve(space, tag, 1);
        if room.is_err() && self.sweep_for_room(now) {
            room = self.room.reserve(space, tag, 1);
        }
        if let Err(full) = room {
            return BucketClaim::Refused(full);
        }
        let mut guard = self.shards[shard].lock();
        if let Some(entry) = guard.keys.get_mut(&print) {
            // Claimed meanwhile by another spend: counted once.
            entry.claimed();
            drop(guard);
            self.room.dropped(space, tag, 1);
            return counted;
        }
        let state = match space {
            Space::Configured => 1,
            Space::CallerGiven => CALLER_GIVEN | 1,
        };
        let entry = Entry {
            expires: seconds(now),
            tag,
            state,
        };
        guard.keys.insert(print, entry);
        counted
    }

    /// Settles a counted claim after its call.
    pub fn settle(&self, claim: BucketClaim, written: Written) {
        let BucketClaim::Counted { shard, print } = claim else {
            return;
        };
        if let Some(entry) = self.shards[shard].lock().keys.get_mut(&print) {
            entry.settled();
            if let Written::Until(at) | Written::Perhaps(at) = written {
                entry.expires = entry.expires.max(seconds(at));
            }
        }
    }

    /// Drops every shard's ended keys for a claim that found no room, unless a claim did
    /// so less than [`SWEEP_GAP`] ago (a flood on a full name would otherwise sweep on every
    /// request); whether it dropped any.
    fn sweep_for_room(&self, now: Nanos) -> bool {
        let last = self.swept.load(Ordering::Acquire);
        if last != 0 && now.saturating_sub(last) < SWEEP_GAP {
            return false;
        }
        let won = self
            .swept
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire);
        won.is_ok() && self.sweep(now) > 0
    }

    /// Drops the keys whose count has ended at `now`; returns how many.
    pub fn sweep(&self, now: Nanos) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().drop_expired(now, &self.room))
            .sum()
    }

    /// Keys counted in all (ended ones until dropped).
    pub fn len(&self) -> usize {
        self.room.held()
    }

    /// Whether no key is counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys counted for configured name `number` (0 for numbers with no name share).
    pub fn held(&self, number: u32) -> usize {
        self.room.names.held(number)
    }

    /// Spends refused for want of room so far, by [`Full`].
    pub fn refusals(&self) -> [u64; 3] {
        self.room.names.refusals()
    }

    /// Counts a batch's refusals, once per bound that refused it.
    pub(super) fn count_refusals(&self, claims: &[BucketClaim]) {
        let mut counted = [false; 3];
        for claim in claims {
            if let BucketClaim::Refused(full) = claim {
                if !std::mem::replace(&mut counted[*full as usize], true) {
                    self.room.names.refused(*full);
                }
            }
        }
    }
}

/// The latest a write of `item` at `now` can leave its key: a TAT at most its burst offset
/// past now plus what a charge may owe (a calendar window's end at most its period away).
pub(super) fn latest_expiry(item: &StoreItem, now: Nanos) -> Nanos {
    let limit = &item.limit;
    let owed = limit
        .emission_interval()
        .saturating_mul(i64::try_from(item.cost).unwrap_or(i64::MAX));
    now.saturating_add(limit.period().max(limit.burst_offset()))
        .saturating_add(owed)
        .saturating_add(SECOND)
}

/// The batch to send when a claim was refused, or `None` to send `items` as they are.
/// A refused counting item denies the batch: every item but the charges of counted keys is
/// sent as a probe (read, never written), as the memory store decides a batch denied for
/// want of room. A refused spend-only item alone is a peek (a probe of cost 0).
pub(super) fn refused_batch(items: &[StoreItem], claims: &[BucketClaim]) -> Option<Vec<StoreItem>> {
    let refused = |k: usize| matches!(claims[k], BucketClaim::Refused(_));
    if !(0..items.len()).any(refused) {
        return None;
    }
    let denied = (0..items.len()).any(|k| refused(k) && items[k].mode.counts());
    let probe = |item: &StoreItem, cost| StoreItem {
        mode: Mode::Probe,
        cost,
        ..item.clone()
    };
    let sent = items
        .iter()
        .enumerate()
        .map(|(k, item)| match item.mode {
            _ if refused(k) && !denied => probe(item, 0),
            _ if refused(k) => probe(item, item.cost),
            Mode::Charge | Mode::Release => item.clone(),
            Mode::CheckAndSpend | Mode::CheckOnly | Mode::SpendOnly | Mode::Acquire if denied => {
                probe(item, item.cost)
            }
            _ => item.clone(),
        })
        .collect();
    Some(sent)
}

/// A request's claims, one per item, settled once: by [`Claims::settle`] after its calls,
/// or, when the request is dropped before (its caller gone, its future cancelled while a
/// call it sent may still write), as unknown, each key counted until the latest its limit
/// allows. A claim is never left in flight, which would keep its key counted for good.
pub(super) struct Claims<'a> {
    keys: &'a BucketKeys,
    /// The items claimed for, and when: the latest expiry a write of each can give its key
    /// is [`latest_expiry`] of them.
    items: &'a [StoreItem],
    now: Nanos,
    claims: Vec<BucketClaim>,
    settled: bool,
}

impl<'a> Claims<'a> {
    /// The claims of `items` (their Redis keys `redis_keys`) at `now`; none when
    /// `resolving` (a resolution only reads what an earlier call did).
    pub(super) fn new(
        keys: &'a BucketKeys,
        items: &'a [StoreItem],
        redis_keys: &[String],
        now: Nanos,
        resolving: bool,
    ) -> Claims<'a> {
        let claims: Vec<BucketClaim> = match resolving {
            true => vec![BucketClaim::None; items.len()],
            false => (items.iter().zip(redis_keys))
                .map(|(item, key)| keys.claim(item, key, now))
                .collect(),
        };
        Claims {
            keys,
            items,
            now,
            claims,
            settled: false,
        }
    }

    pub(super) fn get(&self) -> &[BucketClaim] {
        &self.claims
    }

    /// What each claimed item's call did with its key: per slot group, its members' writes
    /// (the script's TATs, in its clock, moved to this replica's `after`), or unknown.
    pub(super) fn settle(
        &mut self,
        groups: &[(usize, Vec<usize>)],
        outcomes: &[Option<(Read, BatchOutcome)>],
        after: Nanos,
    ) {
        self.settled = true;
        for ((_, members), outcome) in groups.iter().zip(outcomes) {
            for (j, &i) in members.iter().enumerate() {
                if self.claims[i] == BucketClaim::None {
                    continue;
                }
                let written = match outcome {
                    Some((read, out)) => match out.writes.get(j).copied().flatten() {
                        Some(tat) => Written::Until(
                            after
                                .saturating_add(tat.saturating_sub(read.now))
                                .saturating_add(MILLISECOND),
                        ),
                        None => Written::Nothing,
                    },
                    None => Written::Perhaps(latest_expiry(&self.items[i], self.now)),
                };
                self.keys.settle(self.claims[i], written);
            }
        }
    }
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        if !self.settled {
            for (claim, item) in self.claims.iter().zip(self.items) {
                let latest = latest_expiry(item, self.now);
                self.keys.settle(*claim, Written::Perhaps(latest));
            }
        }
    }
}

/// The decisions of a batch sent as [`refused_batch`] made it: each refused item answers
/// [`gcra::no_room`] when the batch was denied for it; whether it was.
pub(super) fn refuse(
    items: &[StoreItem],
    claims: &[BucketClaim],
    now: Nanos,
    decisions: &mut [gcra::Decision],
) -> bool {
    let refused = |k: usize| matches!(claims[k], BucketClaim::Refused(_));
    let denied = (0..items.len()).any(|k| refused(k) && items[k].mode.counts());
    if denied {
        for (k, decision) in decisions.iter_mut().enumerate() {
            if refused(k) {
                *decision = gcra::no_room(&items[k].limit, now);
            }
        }
    }
    denied
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::shares::tests::{daily, T0};

    /// Claims `item`'s key (named by its id) at `now`.
    fn claim(keys: &BucketKeys, item: &StoreItem, now: Nanos) -> BucketClaim {
        keys.claim(item, &format!("{:?}", item.key), now)
    }

    /// 1 000 keys, none for caller-given limits: a name's share is 250. A flood of fresh
    /// ids on one name is refused past its share; another name still claims; a key
    /// counted already is claimed again whatever the share; only writing items claim.
    #[test]
    fn a_name_claims_its_share_of_new_keys_and_no_more() {
        let keys = BucketKeys::new(1_000, 0, 25);
        let mut counted = 0;
        for n in 0..1_000 {
            let item = daily(100, &format!("k{n}"), Mode::CheckAndSpend);
            match claim(&keys, &item, T0) {
                c @ BucketClaim::Counted { .. } => {
                    counted += 1;
                    keys.settle(c, Written::Until(T0 + 60 * SECOND));
                }
                BucketClaim::Refused(full) => assert_eq!(full, Full::Name),
                BucketClaim::None => panic!("a spend claims"),
            }
        }
        assert_eq!((counted, keys.held(100), keys.len()), (250, 250, 250));
        for n in 0..250 {
            let other = daily(101, &format!("o{n}"), Mode::CheckAndSpend);
            assert!(matches!(
                claim(&keys, &other, T0),
                BucketClaim::Counted { .. }
            ));
        }
        let again = daily(100, "k7", Mode::CheckAndSpend);
        assert!(matches!(
            claim(&keys, &again, T0),
            BucketClaim::Counted { .. }
        ));
        for mode in [Mode::CheckOnly, Mode::Probe, Mode::Release] {
            assert_eq!(
                claim(&keys, &daily(100, "new", mode), T0),
                BucketClaim::None
            );
        }
        let free = StoreItem {
            cost: 0,
            ..daily(100, "new", Mode::CheckAndSpend)
        };
        assert_eq!(claim(&keys, &free, T0), BucketClaim::None);
        for mode in [Mode::CheckAndSpend, Mode::SpendOnly, Mode::Charge] {
            let refused = claim(&keys, &daily(100, "new", mode), T0);
            assert_eq!(refused, BucketClaim::Refused(Full::Name));
        }
    }

    /// A key stays counted until the expiry its writes gave it (the latest), while a claim
    /// is in flight, and until the bound of a call whose outcome is not known; a claim
    /// that wrote nothing leaves at the next sweep. Each dropped key frees its room.
    #[test]
    fn a_key_leaves_the_count_only_when_no_write_may_keep_it() {
        let keys = BucketKeys::new(100, 0, 100);
        let item = |id: &str| daily(100, id, Mode::CheckAndSpend);
        let written = claim(&keys, &item("w"), T0);
        keys.settle(written, Written::Until(T0 + 10 * SECOND));
        let later = claim(&keys, &item("w"), T0 + SECOND);
        keys.settle(later, Written::Until(T0 + 20 * SECOND));
        let nothing = claim(&keys, &item("n"), T0);
        keys.settle(nothing, Written::Nothing);
        let unknown = claim(&keys, &item("u"), T0);
        keys.settle(unknown, Written::Perhaps(T0 + 30 * SECOND));
        let in_flight = claim(&keys, &item("f"), T0);
        assert_eq!(keys.len(), 4);
        assert_eq!(keys.sweep(T0 + SECOND), 1, "the key nothing wrote");
        assert_eq!(keys.sweep(T0 + 15 * SECOND), 0, "w's latest write holds it");
        assert_eq!(keys.sweep(T0 + 20 * SECOND), 1);
        assert_eq!(keys.sweep(T0 + 30 * SECOND), 1, "u's bound");
        assert_eq!(keys.len(), 1, "f is in flight");
        assert_eq!(keys.sweep(T0 + 3_600 * SECOND), 0);
        keys.settle(in_flight, Written::Nothing);
        assert_eq!(keys.sweep(T0 + 3_602 * SECOND), 1);
        assert!(keys.is_empty());
    }

    /// A full share is swept for room before a claim is refused: a key whose count ended
    /// makes room for a new one.
    #[test]
    fn a_refused_claim_first_drops_the_ended_keys() {
        let keys = BucketKeys::new(4, 0, 50);
        for id in ["a", "b"] {
            let c = claim(&keys, &daily(100, id, Mode::CheckAndSpend), T0);
            keys.settle(c, Written::Until(T0 + SECOND));
        }
        let c = daily(100, "c", Mode::CheckAndSpend);
        assert_eq!(claim(&keys, &c, T0), BucketClaim::Refused(Full::Name));
        assert!(matches!(
            claim(&keys, &c, T0 + SECOND),
            BucketClaim::Counted { .. }
        ));
    }

    /// The batch sent after a refusal: a refused counting item denies it, so nothing but
    /// the charges of counted keys (and releases) may write; a refused spend-only item
    /// alone is a peek and leaves the others as they were.
    #[test]
    fn a_refusal_sends_a_batch_that_writes_nothing_of_the_spend() {
        let counted = BucketClaim::Counted { shard: 0, print: 1 };
        let refused = BucketClaim::Refused(Full::Name);
        let items = [
            daily(100, "new", Mode::CheckAndSpend),
            daily(101, "old", Mode::CheckAndSpend),
            daily(102, "owed", Mode::Charge),
            daily(103, "best", Mode::SpendOnly),
        ];
        assert!(refused_batch(&items, &[counted; 4]).is_none());
        let sent = refused_batch(&items, &[refused, counted, counted, counted]).unwrap();
        let modes: Vec<Mode> = sent.iter().map(|i| i.mode).collect();
        assert_eq!(modes, [Mode::Probe, Mode::Probe, Mode::Charge, Mode::Probe]);
        assert!(sent.iter().all(|i| i.cost == 1));
        let sent = refused_batch(&items, &[counted, counted, counted, refused]).unwrap();
        let modes: Vec<(Mode, u64)> = sent.iter().map(|i| (i.mode, i.cost)).collect();
        assert_eq!(
            modes,
            [
                (Mode::CheckAndSpend, 1),
                (Mode::CheckAndSpend, 1),
                (Mode::Charge, 1),
                (Mode::Probe, 0)
            ]
        );
        let mut decisions = vec![super::super::store::UNDECIDED; 4];
        let claims = [refused, counted, counted, counted];
        assert!(refuse(&items, &claims, T0, &mut decisions));
        assert_eq!(decisions[0], gcra::no_room(&items[0].limit, T0));
    }

    /// A request dropped before its calls settle (its caller gone while a call it sent may
    /// still write) leaves no claim in flight: its keys are counted until the latest their
    /// limits allow, then dropped. (A claim left in flight would keep its key counted for
    /// good, and a name's share would fill with them.)
    #[test]
    fn a_dropped_request_leaves_its_keys_counted_until_their_latest_expiry() {
        let keys = BucketKeys::new(100, 0, 100);
        let items = [daily(100, "a", Mode::CheckAndSpend)];
        let latest = latest_expiry(&items[0], T0);
        assert!(latest >= T0 + 86_400 * SECOND, "a day's limit");
        let claims = Claims::new(&keys, &items, &["a".to_string()], T0, false);
        assert!(matches!(claims.get()[0], BucketClaim::Counted { .. }));
        drop(claims);
        assert_eq!(keys.sweep(latest - SECOND), 0, "it may still be written");
        assert_eq!(keys.sweep(latest + SECOND), 1);
        assert!(keys.is_empty());
    }
}
