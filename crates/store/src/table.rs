//! The memory store's table: TATs by 64-bit fingerprint, open addressing with linear
//! probing, 16 bytes a slot (the fingerprint and the TAT side by side, four to a cache
//! line), and no allocation per bucket. Beside the slots, in an array of their own that
//! lookups never touch, each bucket's 2-byte [`Tag`] (its limit name's, for the name's
//! share of the store): 18 bytes a slot in all.
//!
//! Why not `hashbrown`: its control bytes live apart from the entries, so a lookup in a table
//! far larger than the caches misses twice (control group, then entry) where this one misses
//! once; and it doubles when it grows, so a table just past a doubling is 7/16 full, which at
//! 17 bytes a slot is 39 bytes a bucket. Here a table is rebuilt to 55 % full whenever live
//! and removed slots reach 80 %: between 22.5 and 33 bytes a bucket whatever the count
//! (capacity any integer, the home slot found by multiply-shift on the fingerprint's high
//! bits).
//!
//! Removal leaves a tombstone (lookups probe past it, inserts reuse it); rebuilds drop them.
//! A sweep drops expired TATs and then rebuilds when tombstones pass an eighth of the slots
//! or the table has emptied to a quarter, so churn neither grows a table nor slows its
//! lookups, and an emptied table gives its memory back.

use cellrate_core::clock::Nanos;

/// A slot: a bucket's fingerprint and TAT, or a free slot's marker in `print`.
#[derive(Clone, Copy)]
struct Slot {
    print: u64,
    tat: Nanos,
}

const EMPTY: u64 = 0;
const TOMBSTONE: u64 = 1;

impl Slot {
    const EMPTY: Slot = Slot {
        print: EMPTY,
        tat: 0,
    };
    const TOMBSTONE: Slot = Slot {
        print: TOMBSTONE,
        tat: 0,
    };

    fn is_bucket(&self) -> bool {
        self.print >= MIN_PRINT
    }
}

/// The least fingerprint of a bucket: 0 and 1 mark free slots.
pub(super) const MIN_PRINT: u64 = 2;

/// What a bucket is counted under besides the table (its limit name's share, see
/// `memory/bucket_shares.rs`): kept per slot, read only when a bucket is dropped.
pub(super) type Tag = u16;

/// Live and removed slots at most this share of the table (in 1/1000): linear probing's
/// probes stay short (about 3 slots to find a key, 13 to find a free slot, at 80 %).
const MAX_LOAD: usize = 800;
/// A rebuild sizes the table for this share (in 1/1000).
const REBUILT_LOAD: usize = 550;
const MIN_SLOTS: usize = 16;

/// TATs by fingerprint. See the module docs.
#[derive(Default)]
pub(super) struct TatTable {
    slots: Vec<Slot>,
    /// Each slot's [`Tag`] (meaningful for buckets only).
    tags: Vec<Tag>,
    live: usize,
    dead: usize,
}

/// Where a lookup ended.
enum Probe {
    Found(usize),
    /// Not there; the slot an insert would take (the first tombstone on the way, or the
    /// empty slot that ended the probe). `None` when the table has no slots.
    Absent(Option<usize>),
}

impl TatTable {
    /// A table sized for `n` buckets (55 % of its slots; it rebuilds at 80 %).
    pub(super) fn with_capacity(n: usize) -> TatTable {
        let mut table = TatTable::default();
        if n > 0 {
            table.slots = vec![Slot::EMPTY; slots_for(n)];
            table.tags = vec![0; table.slots.len()];
        }
        table
    }

    /// Buckets held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Slots allocated, 16 bytes each.
    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    fn home(&self, print: u64) -> usize {
        ((print as u128 * self.slots.len() as u128) >> 64) as usize
    }

    fn probe(&self, print: u64) -> Probe {
        debug_assert!(print >= MIN_PRINT);
        let n = self.slots.len();
        if n == 0 {
            return Probe::Absent(None);
        }
        let mut i = self.home(print);
        let mut reuse = None;
        // The table always keeps a fifth of its slots empty, so a probe ends well before
        // `n` steps; the bound is for form.
        for _ in 0..n {
            match self.slots[i].print {
                p if p == print => return Probe::Found(i),
                EMPTY => return Probe::Absent(Some(reuse.unwrap_or(i))),
                TOMBSTONE if reuse.is_none() => reuse = Some(i),
                _ => {}
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
        Probe::Absent(reuse)
    }

    /// The TAT of `print`.
    pub(super) fn get(&self, print: u64) -> Option<Nanos> {
        match self.probe(print) {
            Probe::Found(i) => Some(self.slots[i].tat),
            Probe::Absent(_) => None,
        }
    }

    /// The TAT of `print`, to change in place.
    pub(super) fn get_mut(&mut self, print: u64) -> Option<&mut Nanos> {
        match self.probe(print) {
            Probe::Found(i) => Some(&mut self.slots[i].tat),
            Probe::Absent(_) => None,
        }
    }

    /// Sets the TAT of `print`, adding the bucket under `tag` if it is not held (a held
    /// bucket keeps its tag); true if it was added.
    pub(super) fn insert(&mut self, print: u64, tat: Nanos, tag: Tag) -> bool {
        let at = match self.probe(print) {
            Probe::Found(i) => {
                self.slots[i].tat = tat;
                return false;
            }
            Probe::Absent(Some(i)) if self.slots[i].print == TOMBSTONE => {
                self.dead -= 1;
                i
            }
            Probe::Absent(Some(i)) if self.has_room_for_one() => i,
            Probe::Absent(_) => {
                self.rebuild(self.live + 1);
                self.free_slot(print)
            }
        };
        self.slots[at] = Slot { print, tat };
        self.tags[at] = tag;
        self.live += 1;
        true
    }

    fn has_room_for_one(&self) -> bool {
        (self.live + self.dead + 1) * 1000 <= MAX_LOAD * self.slots.len()
    }

    /// The first free slot from `print`'s home. The table must have one, which every
    /// caller ensures (a table is never more than 80 % taken, and a rebuilt table has more
    /// slots than buckets).
    fn free_slot(&self, print: u64) -> usize {
        let n = self.slots.len();
        let home = self.home(print);
        (home..n)
            .chain(0..home)
            .find(|&i| !self.slots[i].is_bucket())
            .unwrap_or_else(|| {
                debug_assert!(false, "a full table");
                home
            })
    }

    /// Every bucket held: fingerprint, TAT and tag.
    pub(super) fn entries(&self) -> impl Iterator<Item = (u64, Nanos, Tag)> + '_ {
        self.slots
            .iter()
            .zip(&self.tags)
            .filter(|(slot, _)| slot.is_bucket())
            .map(|(slot, &tag)| (slot.print, slot.tat, tag))
    }

    /// Removes `print`; returns its TAT and tag if it was held.
    pub(super) fn remove(&mut self, print: u64) -> Option<(Nanos, Tag)> {
        match self.probe(print) {
            Probe::Found(i) => {
                let tat = self.slots[i].tat;
                self.slots[i] = Slot::TOMBSTONE;
                self.live -= 1;
                self.dead += 1;
                Some((tat, self.tags[i]))
            }
            Probe::Absent(_) => None,
        }
    }

    /// Drops every bucket whose TAT is at or before `now` (a full bucket), telling
    /// `dropped_tag` each one's tag; returns how many. Rebuilds when tombstones take more
    /// than an eighth of the slots or the table is under a quarter full.
    pub(super) fn sweep(&mut self, now: Nanos, mut dropped_tag: impl FnMut(Tag)) -> usize {
        let mut dropped = 0;
        for (slot, &tag) in self.slots.iter_mut().zip(&self.tags) {
            if slot.is_bucket() && slot.tat <= now {
                *slot = Slot::TOMBSTONE;
                dropped_tag(tag);
                dropped += 1;
            }
        }
        self.live -= dropped;
        self.dead += dropped;
        let n = self.slots.len();
        if self.dead * 8 > n || (self.live * 4 < n && n > slots_for(MIN_SLOTS)) {
            self.rebuild(self.live);
        }
        dropped
    }

    /// Moves the live buckets to a table sized for `room` of them (no table when 0).
    fn rebuild(&mut self, room: usize) {
        let old = std::mem::take(&mut self.slots);
        let tags = std::mem::take(&mut self.tags);
        let live = self.live;
        *self = TatTable::with_capacity(room.max(live));
        for (slot, tag) in old.into_iter().zip(tags).filter(|(s, _)| s.is_bucket()) {
            let i = self.free_slot(slot.print);
            self.slots[i] = slot;
            self.tags[i] = tag;
        }
        self.live = live;
    }
}

/// The slots for `n` buckets at the rebuilt load.
fn slots_for(n: usize) -> usize {
    (n.saturating_mul(1000) / REBUILT_LOAD + 1).max(MIN_SLOTS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A small xorshift: reproducible operations without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Checks the table against the model: every held print, its TAT and tag, the count,
    /// and that live and removed slots stay within the load bound.
    fn agrees(table: &TatTable, model: &HashMap<u64, (Nanos, Tag)>, absent: &[u64]) {
        assert_eq!(table.len(), model.len());
        for (&print, &(tat, _)) in model {
            assert_eq!(table.get(print), Some(tat), "print {print:#x}");
        }
        let tags: HashMap<u64, (Nanos, Tag)> = table
            .entries()
            .map(|(p, tat, tag)| (p, (tat, tag)))
            .collect();
        assert_eq!(&tags, model);
        for &print in absent.iter().filter(|p| !model.contains_key(p)) {
            assert_eq!(table.get(print), None, "print {print:#x}");
        }
        if table.slots() > 0 {
            assert!((table.live + table.dead) * 1000 <= MAX_LOAD * table.slots());
        }
    }

    /// Random inserts, updates, removals and sweeps, against a `HashMap`. `spread` picks
    /// the prints: spread over all 64 bits, or crowded onto a few home slots (high bits
    /// alike, the last slot's wrap-around included) so that probes run long and cross
    /// tombstones.
    fn against_the_model(seed: u64, print_of: impl Fn(u64) -> u64) {
        let mut rng = Rng(seed);
        let mut table = TatTable::default();
        let mut model = HashMap::new();
        let mut now: Nanos = 0;
        let universe: Vec<u64> = (0..3_000).map(&print_of).collect();
        for step in 0..40_000 {
            let print = universe[(rng.next() % universe.len() as u64) as usize];
            match rng.next() % 10 {
                0..=5 => {
                    let tat = now + (rng.next() % 1_000) as Nanos;
                    // A held bucket keeps the tag it was added under.
                    let tag = (rng.next() % 5) as Tag;
                    assert_eq!(table.insert(print, tat, tag), !model.contains_key(&print));
                    model.entry(print).or_insert((tat, tag)).0 = tat;
                }
                6 => {
                    if let Some(tat) = table.get_mut(print) {
                        *tat += 1;
                        model.get_mut(&print).unwrap().0 += 1;
                    } else {
                        assert!(!model.contains_key(&print));
                    }
                }
                7 | 8 => assert_eq!(table.remove(print), model.remove(&print)),
                _ => {
                    now += (rng.next() % 400) as Nanos;
                    let mut gone = [0usize; 5];
                    model.retain(|_, (tat, tag)| {
                        gone[*tag as usize] += usize::from(*tat <= now);
                        *tat > now
                    });
                    let mut told = [0usize; 5];
                    let dropped = table.sweep(now, |tag| told[tag as usize] += 1);
                    assert_eq!((dropped, told), (gone.iter().sum(), gone));
                }
            }
            if step % 1_000 == 0 {
                agrees(&table, &model, &universe);
            }
        }
        agrees(&table, &model, &universe);
        // Everything expired: the table lets its memory go.
        table.sweep(Nanos::MAX, |_| {});
        assert_eq!((table.len(), table.slots()), (0, 0));
    }

    #[test]
    fn agrees_with_a_map_on_spread_prints() {
        against_the_model(0x9e37_79b9_7f4a_7c15, |i| {
            (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15).max(MIN_PRINT)
        });
    }

    #[test]
    fn agrees_with_a_map_on_crowded_prints() {
        // Four home slots' worth of high bits, the last one at the end of the table.
        against_the_model(0x2545_f491_4f6c_dd1d, |i| {
            let high = [0, 1 << 62, 3 << 62, u64::MAX][(i % 4) as usize] & !0xffff;
            (high | (i + 2)).max(MIN_PRINT)
        });
    }

    #[test]
    fn memory_per_bucket_stays_within_its_bounds() {
        // Growing one by one: never under 55 % taken once past the least table, never over
        // 80 %: 20-29 bytes a bucket.
        let mut table = TatTable::default();
        for n in 1..=200_000u64 {
            table.insert(n.wrapping_mul(0x9e37_79b9_7f4a_7c15).max(MIN_PRINT), 1, 0);
            let (live, slots) = (table.len(), table.slots());
            assert!(live * 1000 <= MAX_LOAD * slots, "{live} in {slots}");
            assert!(slots <= MIN_SLOTS || live * 1000 >= REBUILT_LOAD * slots - 1000);
        }
    }
}
