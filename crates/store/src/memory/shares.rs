//! Bounded counts, and the shares of the memory store's bucket table: at most
//! `--max-buckets` buckets in all (a share of them for caller-given limits) and, per
//! configured limit name, at most `--bucket-name-share` percent of the configured limits'
//! part, each counted exactly (expired buckets until they are dropped). One name whose ids
//! a client chooses (a header a per-key limit takes as its id) cannot take the table from
//! the others: its new ids are denied once its share is full, while every other name
//! still adds buckets (docs/operations.md, "Sizing").
//!
//! A bucket's name is kept beside its slot as a 2-byte [`Tag`] (the table's, see
//! `store/table.rs`), so that dropping a bucket gives its share back without knowing its
//! key; the counts are a fixed array by tag, so a new bucket costs one more atomic and
//! no lock. Names numbered 65 535 and above share one tag (and one share); the number of
//! caller-given limits (0, bounded by their own share) has no name share. The buckets of
//! envoyproxy/ratelimit-format rules, all number 99 in their text, carry their rule's tag
//! in the key ([`BucketKey::share`], 32 768 and up, by the rule's label), so that each
//! rule has a share of its own as a name does; a key of number 99 without one (a
//! settlement record's, a format-1 snapshot's) has none.

use parking_lot::MutexGuard;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{Fingerprint, MemoryStore, Space, Tables};
use crate::table::{Tag, TatTable};
use cellrate_core::clock::Nanos;
use cellrate_core::gcra::{self, BatchItem};
use cellrate_limits::names::{BucketKey, INLINE_NUMBER, RATELIMIT_NUMBER};

/// The default share of the configured limits' buckets one name may hold, in percent
/// (`--bucket-name-share`).
pub const DEFAULT_BUCKET_NAME_SHARE_PERCENT: usize = 25;

/// The least time between two sweeps of a shard by spends that found no room (the
/// sweeper's own rounds are apart from it).
const SWEEP_GAP: Nanos = cellrate_core::clock::SECOND;

/// Counts one more `n` in `count` if it stays within `bound`.
pub(super) fn take(count: &AtomicUsize, n: usize, bound: usize) -> bool {
    count
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            held.checked_add(n).filter(|&after| after <= bound)
        })
        .is_ok()
}

/// Counts `n` more in `share` (within `share_bound`) and in `all` (within `all_bound`),
/// or in neither; `Err(true)` when the share is what is full, `Err(false)` when `all` is.
pub(super) fn take_both(
    (share, share_bound): (&AtomicUsize, usize),
    (all, all_bound): (&AtomicUsize, usize),
    n: usize,
) -> Result<(), bool> {
    if !take(share, n, share_bound) {
        return Err(true);
    }
    if !take(all, n, all_bound) {
        share.fetch_sub(n, Ordering::AcqRel);
        return Err(false);
    }
    Ok(())
}

/// The tag of `key`'s bucket: the share it names (an envoyproxy/ratelimit-format rule's),
/// else its name number, 65 535 for higher numbers.
pub(crate) fn tag_of(key: &BucketKey) -> Tag {
    key.share()
        .unwrap_or_else(|| Tag::try_from(key.parts().0).unwrap_or(Tag::MAX))
}

/// Which bound left no room for a new bucket: the label values of
/// `cellrate_buckets_refused_total`, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The configured limits' part of `--max-buckets`.
    Table = 0,
    /// The limit name's share of it (`--bucket-name-share`).
    Name = 1,
    /// Caller-given limits' share (`--caller-limit-bucket-share`).
    CallerGiven = 2,
}

/// Buckets held per tag, the bound on each, and the spends refused for want of room.
pub(crate) struct NameShares {
    configured: usize,
    bound: usize,
    held: Box<[AtomicUsize]>,
    refused: [AtomicU64; 3],
}

impl NameShares {
    /// `percent` (1 to 100) of `configured` per name, at least 1.
    pub(super) fn new(configured: usize, percent: usize) -> NameShares {
        let bound = (configured as u128 * percent.clamp(1, 100) as u128 / 100) as usize;
        NameShares {
            configured,
            bound: bound.max(1),
            held: (0..=Tag::MAX as usize)
                .map(|_| AtomicUsize::new(0))
                .collect(),
            refused: Default::default(),
        }
    }

    /// Whether buckets of `tag` count against a name share: not when the share is the
    /// whole table (100 %: no share, one atomic less).
    fn applies(&self, tag: Tag) -> bool {
        self.bound < self.configured
            && u32::from(tag) != INLINE_NUMBER
            && u32::from(tag) != RATELIMIT_NUMBER
    }

    /// Counts `n` new buckets of `tag` in its share and in `all` (within `all_bound`), or
    /// none.
    pub(super) fn take(
        &self,
        tag: Tag,
        (all, all_bound): (&AtomicUsize, usize),
        n: usize,
    ) -> Result<(), Full> {
        if !self.applies(tag) {
            return match take(all, n, all_bound) {
                true => Ok(()),
                false => Err(Full::Table),
            };
        }
        let share = (&self.held[tag as usize], self.bound);
        take_both(share, (all, all_bound), n).map_err(|name| match name {
            true => Full::Name,
            false => Full::Table,
        })
    }

    /// Counts `n` buckets of `tag` dropped from its share.
    pub(super) fn dropped(&self, tag: Tag, n: usize) {
        if n > 0 && self.applies(tag) {
            self.held[tag as usize].fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Buckets name `number` holds now (expired ones until dropped).
    pub(crate) fn held(&self, number: u32) -> usize {
        let tag = Tag::try_from(number).unwrap_or(Tag::MAX);
        self.held[tag as usize].load(Ordering::Acquire)
    }

    /// Counts a spend refused because `full` left no room.
    pub(crate) fn refused(&self, full: Full) {
        self.refused[full as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Spends refused so far, by [`Full`].
    pub(crate) fn refusals(&self) -> [u64; 3] {
        self.refused
            .each_ref()
            .map(|count| count.load(Ordering::Relaxed))
    }
}

/// The room of a table of buckets: its bound by [`Space`], the buckets it counts by space
/// (expired ones until dropped), and each configured name's share. The memory store's,
/// and the Redis store's count of the keys a replica writes (`redis/bucket_keys.rs`).
pub(crate) struct Room {
    pub(super) bound: [usize; 2],
    held: [AtomicUsize; 2],
    pub(crate) names: NameShares,
}

impl Room {
    /// Room for `max_buckets`, `caller_percent` of them for caller-given limits, each
    /// configured name at most [`DEFAULT_BUCKET_NAME_SHARE_PERCENT`] of the rest.
    pub(crate) fn new(max_buckets: usize, caller_percent: usize) -> Room {
        let caller = (max_buckets as u128 * caller_percent.min(100) as u128 / 100) as usize;
        let configured = max_buckets - caller;
        Room {
            bound: [configured, caller],
            held: [AtomicUsize::new(0), AtomicUsize::new(0)],
            names: NameShares::new(configured, DEFAULT_BUCKET_NAME_SHARE_PERCENT),
        }
    }

    /// This room with at most `percent` (1 to 100; 100: no share) of the configured part
    /// per limit name.
    pub(crate) fn with_name_share(mut self, percent: usize) -> Room {
        self.names = NameShares::new(self.bound[Space::Configured as usize], percent);
        self
    }

    /// Counts `n` new buckets of `space` under `tag` if the bounds allow them all, or none.
    pub(crate) fn reserve(&self, space: Space, tag: Tag, n: usize) -> Result<(), Full> {
        let all = (&self.held[space as usize], self.bound[space as usize]);
        match space {
            Space::Configured => self.names.take(tag, all, n),
            Space::CallerGiven if take(all.0, n, all.1) => Ok(()),
            Space::CallerGiven => Err(Full::CallerGiven),
        }
    }

    /// Counts `n` buckets of `space` under `tag` dropped.
    pub(crate) fn dropped(&self, space: Space, tag: Tag, n: usize) {
        if n > 0 {
            self.held[space as usize].fetch_sub(n, Ordering::AcqRel);
            if space == Space::Configured {
                self.names.dropped(tag, n);
            }
        }
    }

    /// Buckets counted in all, expired ones until dropped.
    pub(crate) fn held(&self) -> usize {
        self.held
            .iter()
            .map(|held| held.load(Ordering::Acquire))
            .sum()
    }
}

impl MemoryStore {
    /// Counts `n` new buckets of `space` under `tag` if the bounds allow them all, or none.
    pub(super) fn reserve(&self, space: Space, tag: Tag, n: usize) -> Result<(), Full> {
        self.room.reserve(space, tag, n)
    }

    /// Counts `n` buckets of `space` under `tag` dropped.
    pub(super) fn dropped(&self, space: Space, tag: Tag, n: usize) {
        self.room.dropped(space, tag, n)
    }

    /// Drops the expired buckets of `table` (of `space`) and gives back their room;
    /// returns how many. The counts of the few tags a table holds are summed first.
    pub(super) fn sweep_table(&self, table: &mut TatTable, space: Space, now: Nanos) -> usize {
        let mut runs: Vec<(Tag, usize)> = Vec::new();
        let dropped = table.sweep(now, |tag| match runs.iter().position(|&(t, _)| t == tag) {
            Some(at) => runs[at].1 += 1,
            None if runs.len() < 16 => runs.push((tag, 1)),
            None => self.dropped(space, tag, 1),
        });
        for (tag, n) in runs {
            self.dropped(space, tag, n);
        }
        dropped
    }

    /// Drops the expired buckets of a shard's tables for a spend that found no room, unless
    /// a spend did so less than [`SWEEP_GAP`] ago (a flood of new ids on a full name
    /// would otherwise sweep a shard, some 20 000 buckets, on every request); whether it
    /// swept.
    pub(super) fn sweep_for_room(&self, tables: &mut Tables, now: Nanos) -> bool {
        if tables.3 != 0 && now.saturating_sub(tables.3) < SWEEP_GAP {
            return false;
        }
        tables.3 = now;
        for space in [Space::Configured, Space::CallerGiven] {
            self.sweep_table(tables.table(space), space, now);
        }
        true
    }

    /// Counts the buckets a decided batch (`out`) would add against the bounds, sweeping
    /// the shards it holds once if one does not fit. An item refused room is not written;
    /// if it counts, the batch is denied (decided again as denied, nothing new written)
    /// and it is answered [`gcra::no_room`]; a best-effort item (spend-only) refused room
    /// is answered as its bucket stands. Returns per item the tag its new bucket was
    /// counted under. A bucket whose TAT has passed but is still there needs no room, as on
    /// the one-item path, unless this call's sweep drops it: then it is counted as new too
    /// (and given back if it was still there).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn make_room<'k>(
        &self,
        guards: &mut [MutexGuard<'_, Tables>],
        key: impl Fn(usize) -> &'k BucketKey,
        prints: &[(Fingerprint, Space)],
        batch: &[BatchItem<'_>],
        tats: &[Option<Nanos>],
        out: &mut gcra::BatchOutcome,
        now: Nanos,
    ) -> Vec<Option<Tag>> {
        let may_add = |k: usize, writes: &[Option<Nanos>]| {
            writes[k].is_some() && tats[k].is_none_or(|tat| tat <= now)
        };
        let absent = |k: usize| out.writes[k].is_some() && tats[k].is_none();
        let mut rooms: Vec<Option<Result<Tag, Full>>> = vec![None; batch.len()];
        let (mut swept, mut any) = (false, false);
        for (k, &(_, space)) in prints.iter().enumerate() {
            if !(absent(k) || any && may_add(k, &out.writes)) {
                continue;
            }
            let tag = tag_of(key(k));
            let mut room = self.reserve(space, tag, 1);
            if room.is_err() && !swept {
                swept = true;
                for guard in guards.iter_mut() {
                    any |= self.sweep_for_room(guard, now);
                }
                if any {
                    room = self.reserve(space, tag, 1);
                }
            }
            rooms[k] = Some(room.map(|()| tag));
        }
        // The sweep may have dropped the passed buckets of items before it: each now
        // needs room as a new one.
        for (k, &(_, space)) in prints.iter().enumerate() {
            if any && rooms[k].is_none() && may_add(k, &out.writes) {
                let tag = tag_of(key(k));
                rooms[k] = Some(self.reserve(space, tag, 1).map(|()| tag));
            }
        }
        let (mut denied, mut counted) = (false, [false; 3]);
        for (k, room) in rooms.iter().enumerate() {
            if let Some(Err(full)) = room {
                if !std::mem::replace(&mut counted[*full as usize], true) {
                    self.room.names.refused(*full);
                }
                denied |= batch[k].mode.counts();
            }
        }
        if denied {
            for (k, room) in rooms.iter().enumerate() {
                if let Some(Ok(tag)) = room {
                    self.dropped(prints[k].1, *tag, 1);
                }
            }
            *out = gcra::spend_batch_with(now, batch, tats, false);
            for (k, room) in rooms.iter().enumerate() {
                if may_add(k, &out.writes) {
                    out.writes[k] = None;
                }
                if let Some(Err(_)) = room {
                    out.decisions[k] = gcra::no_room(batch[k].limit, now);
                }
            }
            return vec![None; batch.len()];
        }
        rooms
            .into_iter()
            .enumerate()
            .map(|(k, room)| match room {
                Some(Ok(tag)) => Some(tag),
                Some(Err(_)) => {
                    out.writes[k] = None;
                    out.decisions[k] = gcra::spend(batch[k].limit, now, tats[k], 0).0;
                    None
                }
                None => None,
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::StoreItem;
    use cellrate_core::clock::{FakeClock, SECOND};
    use cellrate_core::gcra::{Limit, Mode};

    pub(crate) const T0: Nanos = 1_700_000_000 * SECOND;

    /// A spend of 1 on name `number`'s id `id`, a limit of 5 a day (buckets live a day);
    /// the Redis store's count of bucket keys (`redis/bucket_keys.rs`) tests with it too.
    pub(crate) fn daily(number: u32, id: &str, mode: Mode) -> StoreItem {
        StoreItem {
            key: BucketKey::new(number, id),
            limit: Limit::new(5, 5, 86_400 * SECOND).unwrap(),
            cost: 1,
            mode,
            lease: None,
        }
    }

    /// The attack: one name flooded with fresh ids (an `api_key` header on a per-key daily
    /// limit). Its share (25 % of 1 000) fills, and then its new ids are denied, not
    /// errors, while another name's new ids are still decided and allowed. Existing
    /// buckets of the flooded name still spend, peek and refund. On 3ebe882 (no name
    /// share) the flood took all 1 000 buckets and the other name's new id was an error
    /// (`bucket capacity reached`), which Envoy lets through.
    #[test]
    fn a_flooded_name_denies_only_its_own_new_ids() {
        let clock = FakeClock::new(T0);
        let store = MemoryStore::with_caller_share(Arc::new(clock.clone()), 8, 1_000, 0);
        let spend = |items: &[StoreItem]| store.spend_now(items).expect("never an error");
        let mut allowed = 0;
        for n in 0..1_000 {
            allowed +=
                usize::from(spend(&[daily(100, &format!("k{n}"), Mode::CheckAndSpend)]).allowed);
        }
        assert_eq!((allowed, store.name_buckets(100)), (250, 250));
        assert_eq!(store.bucket_refusals(), [0, 750, 0]);
        let denied = spend(&[daily(100, "fresh", Mode::CheckAndSpend)]);
        let limit = daily(100, "", Mode::CheckAndSpend).limit;
        assert_eq!(denied.decisions, vec![gcra::no_room(&limit, T0)]);
        assert_eq!(denied.decisions[0].remaining, 0);
        // Another name: every new id of it decided, up to its own share.
        for n in 0..250 {
            assert!(spend(&[daily(101, &format!("ip{n}"), Mode::CheckAndSpend)]).allowed);
        }
        assert_eq!(store.name_buckets(101), 250);
        // The flooded name's existing buckets work: a spend, a peek, a refund.
        assert!(spend(&[daily(100, "k0", Mode::CheckAndSpend)]).allowed);
        assert!(spend(&[daily(100, "k0", Mode::CheckOnly)]).allowed);
        let refunded = store.refund_now(&[daily(100, "k0", Mode::CheckAndSpend)]);
        assert!(refunded[0].allowed);
        assert_eq!(store.live_buckets(), 500);
        // Once the flood's buckets have refilled and are swept, its share is free again.
        clock.advance(86_400 * SECOND);
        store.sweep();
        assert_eq!((store.name_buckets(100), store.name_buckets(101)), (0, 0));
        assert!(spend(&[daily(100, "fresh", Mode::CheckAndSpend)]).allowed);
    }

    /// A batch that needs a new bucket of a full name is denied whole and writes nothing,
    /// the full name's item answered `no_room`, the other items as they stand; a
    /// best-effort (spend-only) item refused room leaves the batch allowed, unwritten.
    #[test]
    fn a_batch_with_no_room_is_denied_whole_and_writes_nothing() {
        let clock = FakeClock::new(T0);
        let store = MemoryStore::with_caller_share(Arc::new(clock.clone()), 1, 100, 0)
            .with_bucket_name_share(10);
        for n in 0..10 {
            let item = daily(100, &format!("k{n}"), Mode::CheckAndSpend);
            assert!(store.spend_now(&[item]).unwrap().allowed);
        }
        assert!(
            store
                .spend_now(&[daily(101, "a", Mode::CheckAndSpend)])
                .unwrap()
                .allowed
        );
        let batch = [
            daily(101, "a", Mode::CheckAndSpend),
            daily(101, "b", Mode::CheckAndSpend),
            daily(100, "new", Mode::CheckAndSpend),
        ];
        let out = store.spend_now(&batch).unwrap();
        assert!(!out.allowed);
        assert_eq!(out.decisions[2], gcra::no_room(&batch[2].limit, T0));
        assert!(out.decisions[0].allowed && out.decisions[0].remaining == 4);
        assert!(out.decisions[1].allowed && out.decisions[1].remaining == 5);
        assert_eq!(store.tat(&batch[0].key), Some(T0 + 86_400 * SECOND / 5));
        assert_eq!(
            (store.tat(&batch[1].key), store.name_buckets(101)),
            (None, 1)
        );
        assert_eq!(store.live_buckets(), 11);
        // Spend-only: best effort, not written, the batch still allowed.
        let best_effort = [
            daily(101, "a", Mode::CheckAndSpend),
            daily(100, "new", Mode::SpendOnly),
        ];
        let out = store.spend_now(&best_effort).unwrap();
        assert!(out.allowed && out.decisions[1].allowed);
        assert_eq!(store.tat(&best_effort[1].key), None);
        assert_eq!(store.bucket_refusals(), [0, 2, 0]);
        // The same through the one-item path.
        let alone = store
            .spend_now(&[daily(100, "new", Mode::SpendOnly)])
            .unwrap();
        assert!(alone.allowed && store.tat(&best_effort[1].key).is_none());
    }

    /// A flood on a full name sweeps its shard for room at most once a second (each sweep
    /// visits the whole shard under its lock): buckets that expired meanwhile make room
    /// only at the next allowed sweep, or the sweeper's.
    #[test]
    fn spends_that_find_no_room_sweep_a_shard_at_most_once_a_second() {
        let clock = FakeClock::new(T0);
        let store = MemoryStore::with_caller_share(Arc::new(clock.clone()), 1, 100, 0)
            .with_bucket_name_share(10);
        // Buckets that refill in half a second.
        let brief = |id: &str| StoreItem {
            limit: Limit::new(1, 2, SECOND).unwrap(),
            ..daily(100, id, Mode::CheckAndSpend)
        };
        for n in 0..10 {
            assert!(store.spend_now(&[brief(&n.to_string())]).unwrap().allowed);
        }
        let new = |n: u32| {
            store
                .spend_now(&[brief(&format!("new-{n}"))])
                .unwrap()
                .allowed
        };
        clock.advance(SECOND * 4 / 10);
        assert!(!new(0), "nothing has refilled: swept, no room");
        clock.advance(SECOND * 2 / 10);
        assert!(!new(1), "refilled, but swept 0.2 s ago: not swept again");
        assert_eq!(store.name_buckets(100), 10);
        clock.advance(SECOND * 8 / 10);
        assert!(new(2), "a second since the last sweep: swept, room");
        assert_eq!(store.name_buckets(100), 1);
    }

    /// The table's own bound still holds beside the shares: four names at 25 % fill it,
    /// and then a fifth name's new ids are denied (`table`), not errors.
    #[test]
    fn a_full_table_denies_every_new_bucket() {
        let clock = FakeClock::new(T0);
        let store = MemoryStore::with_caller_share(Arc::new(clock), 4, 40, 0);
        for number in 100..104 {
            for n in 0..10 {
                let item = daily(number, &format!("{n}"), Mode::CheckAndSpend);
                assert!(store.spend_now(&[item]).unwrap().allowed);
            }
        }
        let out = store
            .spend_now(&[daily(104, "x", Mode::CheckAndSpend)])
            .unwrap();
        assert!(!out.allowed && out.decisions[0].remaining == 0);
        assert_eq!(store.bucket_refusals(), [1, 0, 0]);
        // The numbers without a name share (99: envoyproxy/ratelimit-format limits) are
        // bounded by the table alone.
        assert!(
            !store
                .spend_now(&[daily(99, "x", Mode::CheckAndSpend)])
                .unwrap()
                .allowed
        );
        assert_eq!(store.name_buckets(99), 0);
    }

    /// A bucket whose TAT has passed but that no sweep has dropped yet is there: a batch
    /// spends it without room, as the one-item path does, while the name's share is full
    /// and a sweep for room was made less than a second ago. (Before, the batch counted it
    /// as new and was denied where the one-item path allowed it.)
    #[test]
    fn a_passed_bucket_still_held_needs_no_room_on_either_path() {
        let clock = FakeClock::new(T0);
        let store = MemoryStore::with_caller_share(Arc::new(clock.clone()), 1, 8, 0);
        let quick = |id: &str| StoreItem {
            limit: Limit::new(1, 1, 100_000_000).unwrap(),
            ..daily(100, id, Mode::CheckAndSpend)
        };
        for id in ["a", "b"] {
            assert!(store.spend_now(&[quick(id)]).unwrap().allowed);
        }
        clock.advance(50_000_000);
        let refused = store.spend_now(&[quick("c")]).unwrap();
        assert!(
            !refused.allowed,
            "the share of 2 is full (and a sweep was made)"
        );
        clock.advance(100_000_000);
        let out = store.spend_now(&[quick("a"), quick("b")]).unwrap();
        assert!(out.allowed, "both buckets are there: {out:?}");
        assert_eq!(store.name_buckets(100), 2);
        clock.advance(150_000_000);
        assert!(store.spend_now(&[quick("a")]).unwrap().allowed, "one item");
        assert_eq!((store.name_buckets(100), store.live_buckets()), (2, 2));
    }
}
