//! Who is being limited: per limit name, the ids most often denied over the last minutes,
//! from bounded memory.
//!
//! Each name has a ring of [`SLOTS`] one-minute slots; each slot keeps a Space-Saving
//! summary of at most [`TOP_K`] ids (Metwally et al.): an id already held is counted up; a
//! new id takes a free place, or replaces the least counted one and inherits its count as
//! its error bound. Counts are exact while a minute sees at most `TOP_K` distinct denied ids
//! of a name; beyond, each count may be over by at most its `error`, and every id denied more
//! often than a slot's total / `TOP_K` is held. Ids are cut to [`MAX_ID_BYTES`]; at most
//! [`MAX_NAMES`] names are tracked. Memory: at most `MAX_NAMES x SLOTS x TOP_K` entries of
//! at most 128 bytes of id plus 24 of counts (about 180 KiB per name, 70 KiB for ids of
//! 16 bytes). No id ever becomes a metric label.
//!
//! Counting a denial touches nothing another core writes: each thread adds its denials to
//! a pending list of its own (at most [`PENDING`] ids, behind a lock only it and a reader
//! take), which goes into the rings, each id with its count (Space-Saving by weight, so the
//! bounds above hold), when it is full, when the minute turns, and whenever `top` is asked:
//! answers are as exact as if every denial had gone to the rings at once.

use parking_lot::{Mutex, RwLock};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cellrate_core::clock::{Clock, Nanos, SECOND};

/// Entries per name and minute.
pub const TOP_K: usize = 32;
/// Minutes kept: the longest window.
pub const SLOTS: usize = 15;
/// Names tracked at most (denials of further names are not tracked).
pub const MAX_NAMES: usize = 1024;
/// Longest id kept (longer ids are cut on a character boundary).
pub const MAX_ID_BYTES: usize = 128;
/// Distinct (name, id) pairs a thread holds before they go into the rings.
pub const PENDING: usize = 64;
/// Threads with a pending list at most; denials on further threads go to the rings at once.
pub const MAX_THREADS: usize = 256;

const MINUTE: Nanos = 60 * SECOND;

/// One id of a summary.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    id: Box<str>,
    count: u64,
    error: u64,
}

#[derive(Debug, Default)]
struct Slot {
    /// Minutes since the epoch of the clock this slot counts (0: never used).
    minute: u64,
    entries: Vec<Entry>,
    /// Every denial counted in this slot, held or not.
    total: u64,
}

impl Slot {
    /// `count` denials of `id`.
    fn add(&mut self, id: &str, count: u64) {
        self.total += count;
        if let Some(entry) = self.entries.iter_mut().find(|e| &*e.id == id) {
            entry.count += count;
            return;
        }
        if self.entries.len() < TOP_K {
            self.entries.push(Entry {
                id: id.into(),
                count,
                error: 0,
            });
            return;
        }
        // Replace the least counted: the newcomer may have been denied that often unseen.
        if let Some(least) = self.entries.iter_mut().min_by_key(|e| e.count) {
            least.error = least.count;
            least.count += count;
            least.id = id.into();
        }
    }
}

/// One thread's denials not yet in the rings, all of one minute.
#[derive(Debug, Default)]
struct Pending {
    minute: u64,
    /// (name, id, denials), at most [`PENDING`].
    counts: Vec<(Arc<str>, Box<str>, u64)>,
}

/// Each thread's pending list per tracker it counted for, by the tracker's serial number.
type Local = Vec<(u64, Arc<Mutex<Pending>>)>;

thread_local! {
    static LOCAL: RefCell<Local> = const { RefCell::new(Vec::new()) };
}

/// Trackers' serial numbers (a thread's lists are found by it, never by an address a later
/// tracker could reuse).
static SERIAL: AtomicU64 = AtomicU64::new(0);

fn lock<T>(mutex: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    mutex.lock()
}

/// The ring of one name.
#[derive(Debug, Default)]
struct Ring {
    slots: [Slot; SLOTS],
}

/// An id among the most denied of a name over a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopId {
    pub id: String,
    /// Denials counted (exact when `error` is 0; else at most `error` too many).
    pub denials: u64,
    pub error: u64,
}

/// The most denied ids of one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopName {
    pub name: String,
    /// Every denial of the name in the window, held or not.
    pub denials: u64,
    pub ids: Vec<TopId>,
}

/// Rings by limit name: limit names, at most [`MAX_NAMES`] of them, so foldhash's
/// fixed-seed hasher serves (a keyed SipHash cost about 200 instructions a denial here),
/// and even names chosen to collide could cost no more than a scan of that many.
type Rings = HashMap<Arc<str>, Mutex<Ring>, foldhash::fast::FixedState>;

/// Denials by name and id, per minute.
pub struct DenialTracker {
    clock: Arc<dyn Clock>,
    names: RwLock<Rings>,
    serial: u64,
    /// The threads' pending lists (a list only this holds is a finished thread's).
    threads: Mutex<Vec<Arc<Mutex<Pending>>>>,
}

impl DenialTracker {
    pub fn new(clock: Arc<dyn Clock>) -> DenialTracker {
        DenialTracker {
            clock,
            names: RwLock::new(Rings::default()),
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            threads: Mutex::new(Vec::new()),
        }
    }

    fn minute(&self) -> u64 {
        u64::try_from(self.clock.now() / MINUTE).unwrap_or(0)
    }

    /// Counts one denial of `id` under `name`.
    pub fn denied(&self, name: &Arc<str>, id: &str) {
        let id = cut(id);
        let minute = self.minute();
        let Some(pending) = self.local() else {
            return self.record(name, id, minute, 1);
        };
        let mut pending = lock(&pending);
        if pending.minute != minute {
            self.flush(&mut pending);
            pending.minute = minute;
        }
        let same = |(n, i, _): &&mut (Arc<str>, Box<str>, u64)| {
            (Arc::ptr_eq(n, name) || **n == **name) && &**i == id
        };
        if let Some(entry) = pending.counts.iter_mut().find(same) {
            entry.2 += 1;
            return;
        }
        if pending.counts.len() >= PENDING {
            self.flush(&mut pending);
        }
        pending.counts.push((name.clone(), id.into(), 1));
    }

    /// This thread's pending list for this tracker, made and registered on its first
    /// denial; none once [`MAX_THREADS`] live threads have one.
    fn local(&self) -> Option<Arc<Mutex<Pending>>> {
        LOCAL.with(|local| {
            let mut local = local.borrow_mut();
            if let Some((_, pending)) = local.iter().find(|(s, _)| *s == self.serial) {
                return Some(pending.clone());
            }
            // Lists of trackers gone (only this thread holds them) are let go.
            local.retain(|(_, pending)| Arc::strong_count(pending) > 1);
            let mut threads = lock(&self.threads);
            if threads.len() >= MAX_THREADS {
                // Finished threads' lists: their denials into the rings, the places freed.
                for finished in threads.iter().filter(|p| Arc::strong_count(p) == 1) {
                    self.flush(&mut lock(finished));
                }
                threads.retain(|p| Arc::strong_count(p) > 1);
                if threads.len() >= MAX_THREADS {
                    return None;
                }
            }
            let pending = Arc::new(Mutex::new(Pending::default()));
            threads.push(pending.clone());
            local.push((self.serial, pending.clone()));
            Some(pending)
        })
    }

    /// `pending`'s denials into the rings, leaving it empty.
    fn flush(&self, pending: &mut Pending) {
        for (name, id, count) in pending.counts.drain(..) {
            self.record(&name, &id, pending.minute, count);
        }
    }

    /// `count` denials of `id` under `name` in `minute`, into the rings.
    fn record(&self, name: &Arc<str>, id: &str, minute: u64, count: u64) {
        let record = |ring: &Mutex<Ring>| {
            let mut ring = lock(ring);
            let slot = &mut ring.slots[(minute % SLOTS as u64) as usize];
            if slot.minute > minute {
                return; // a minute the ring has already forgotten
            }
            if slot.minute != minute {
                slot.minute = minute;
                slot.entries.clear();
                slot.total = 0;
            }
            slot.add(id, count);
        };
        {
            let names = self.names.read();
            if let Some(ring) = names.get(name) {
                record(ring);
                return;
            }
        }
        let mut names = self.names.write();
        if names.len() >= MAX_NAMES && !names.contains_key(name) {
            return;
        }
        record(names.entry(name.clone()).or_default());
    }

    /// The `n` most denied ids of every name (or of `only`) over the last `minutes`
    /// minutes (1 to [`SLOTS`]: the current minute and those before it), names with the
    /// most denials first.
    pub fn top(&self, minutes: usize, n: usize, only: Option<&str>) -> Vec<TopName> {
        let minutes = minutes.clamp(1, SLOTS) as u64;
        // Every thread's pending denials first.
        for pending in lock(&self.threads).iter() {
            self.flush(&mut lock(pending));
        }
        let now = self.minute();
        let names = self.names.read();
        let mut out = Vec::new();
        for (name, ring) in names.iter() {
            if only.is_some_and(|only| only != &**name) {
                continue;
            }
            let ring = lock(ring);
            let mut ids: HashMap<&str, (u64, u64)> = HashMap::new();
            let mut denials = 0;
            for slot in &ring.slots {
                if slot.minute == 0 || slot.minute > now || now - slot.minute >= minutes {
                    continue;
                }
                denials += slot.total;
                for entry in &slot.entries {
                    let sum = ids.entry(&entry.id).or_default();
                    sum.0 += entry.count;
                    sum.1 += entry.error;
                }
            }
            if denials == 0 {
                continue;
            }
            let mut ids: Vec<TopId> = ids
                .into_iter()
                .map(|(id, (denials, error))| TopId {
                    id: id.to_string(),
                    denials,
                    error,
                })
                .collect();
            ids.sort_by(|a, b| b.denials.cmp(&a.denials).then_with(|| a.id.cmp(&b.id)));
            ids.truncate(n);
            out.push(TopName {
                name: name.to_string(),
                denials,
                ids,
            });
        }
        out.sort_by(|a, b| b.denials.cmp(&a.denials).then_with(|| a.name.cmp(&b.name)));
        out
    }
}

fn cut(id: &str) -> &str {
    cellrate_core::text::cut_bytes(id, MAX_ID_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::FakeClock;

    fn tracker() -> (FakeClock, DenialTracker) {
        let clock = FakeClock::new(1_700_000_000 * SECOND);
        (clock.clone(), DenialTracker::new(Arc::new(clock)))
    }

    #[test]
    fn counts_are_exact_within_k_and_windows_slide() {
        let (clock, t) = tracker();
        let orders: Arc<str> = Arc::from("NewOrdersPerAccount");
        let api: Arc<str> = Arc::from("ApiRequestsPerKey");
        for _ in 0..5 {
            t.denied(&orders, "1");
        }
        for _ in 0..3 {
            t.denied(&orders, "2");
        }
        t.denied(&api, "k");
        let top = t.top(1, 10, None);
        assert_eq!(top.len(), 2);
        assert_eq!(
            (top[0].name.as_str(), top[0].denials),
            ("NewOrdersPerAccount", 8)
        );
        assert_eq!(
            top[0].ids,
            [
                TopId {
                    id: "1".into(),
                    denials: 5,
                    error: 0
                },
                TopId {
                    id: "2".into(),
                    denials: 3,
                    error: 0
                },
            ]
        );
        // Two minutes later: gone from the 1-minute window, still in the 5-minute one.
        clock.advance(2 * MINUTE);
        t.denied(&orders, "2");
        let one = t.top(1, 10, Some("NewOrdersPerAccount"));
        assert_eq!(
            one[0].ids,
            [TopId {
                id: "2".into(),
                denials: 1,
                error: 0
            }]
        );
        let five = t.top(5, 1, Some("NewOrdersPerAccount"));
        assert_eq!(five[0].denials, 9);
        assert_eq!(
            five[0].ids,
            [TopId {
                id: "1".into(),
                denials: 5,
                error: 0
            }]
        );
        // Sixteen minutes on, the ring has forgotten everything.
        clock.advance(16 * MINUTE);
        assert!(t.top(15, 10, None).is_empty());
    }

    #[test]
    fn memory_stays_bounded_and_heavy_hitters_stay_held() {
        let (_, t) = tracker();
        let name: Arc<str> = Arc::from("ApiRequestsPerKey");
        // One heavy id among 10 000 distinct ones, each seen once.
        for i in 0..10_000 {
            t.denied(&name, &format!("key-{i}"));
            if i % 10 == 0 {
                t.denied(&name, "attacker");
            }
        }
        let top = t.top(15, 3, None);
        assert_eq!(top[0].denials, 11_000);
        let first = &top[0].ids[0];
        assert_eq!(first.id, "attacker");
        assert!(
            first.denials >= 1_000 && first.denials - first.error <= 1_000,
            "{first:?}"
        );
        let names = t.names.read();
        let ring = names.get(&name).unwrap().lock();
        assert!(ring.slots.iter().all(|s| s.entries.len() <= TOP_K));
        // Long ids are cut.
        drop(ring);
        drop(names);
        t.denied(&name, &"x".repeat(1000));
        let top = t.top(1, TOP_K, None);
        assert!(top[0].ids.iter().all(|i| i.id.len() <= MAX_ID_BYTES));
    }

    #[test]
    fn names_beyond_the_bound_are_not_tracked() {
        let (_, t) = tracker();
        for i in 0..MAX_NAMES + 10 {
            t.denied(&Arc::from(format!("Name{i}")), "1");
        }
        assert_eq!(t.top(1, 1, None).len(), MAX_NAMES);
    }

    #[test]
    fn denials_on_many_threads_are_counted_exactly_and_shown_at_once() {
        let (_, t) = tracker();
        let t = Arc::new(t);
        let name: Arc<str> = Arc::from("NewOrdersPerAccount");
        let threads: Vec<_> = (0..4)
            .map(|k| {
                let (t, name) = (t.clone(), name.clone());
                std::thread::spawn(move || {
                    for i in 0..1_000 {
                        t.denied(&name, "shared");
                        t.denied(&name, &format!("t{k}-{}", i % 3));
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|h| h.join().unwrap());
        // Still pending on their threads' lists (each thread held 4 pairs): `top` takes them.
        let top = t.top(1, TOP_K, None);
        assert_eq!(top[0].denials, 8_000);
        assert_eq!(
            top[0].ids[0],
            TopId {
                id: "shared".into(),
                denials: 4_000,
                error: 0
            }
        );
        assert_eq!(top[0].ids.len(), 13);
        assert!(top[0].ids[1..]
            .iter()
            .all(|i| i.denials == 333 || i.denials == 334));
        // Asked again: the same answer (nothing counted twice).
        assert_eq!(t.top(1, TOP_K, None), top);
    }

    #[test]
    fn a_full_pending_list_and_finished_threads_lose_nothing_and_stay_bounded() {
        let (_, t) = tracker();
        let t = Arc::new(t);
        let name: Arc<str> = Arc::from("ApiRequestsPerKey");
        // More pairs than a pending list holds, on one thread: exact while within TOP_K.
        for i in 0..PENDING + 10 {
            t.denied(&name, &format!("k{}", i % TOP_K));
        }
        // More threads than MAX_THREADS, one after another, each gone after one denial.
        for _ in 0..MAX_THREADS + 44 {
            let (t, name) = (t.clone(), name.clone());
            std::thread::spawn(move || t.denied(&name, "k0"))
                .join()
                .unwrap();
        }
        assert!(lock(&t.threads).len() <= MAX_THREADS);
        let top = t.top(1, 1, None);
        assert_eq!(top[0].denials, (PENDING + 10 + MAX_THREADS + 44) as u64);
        // k0 .. k9 were denied three times each on this thread, k0 also once per thread.
        assert_eq!(top[0].ids[0].id, "k0");
        assert_eq!(top[0].ids[0].denials, (3 + MAX_THREADS + 44) as u64);
        assert_eq!(top[0].ids[0].error, 0);
    }

    #[test]
    fn a_pending_minute_goes_to_its_own_slot() {
        let (clock, t) = tracker();
        let name: Arc<str> = Arc::from("A");
        t.denied(&name, "old");
        clock.advance(MINUTE);
        t.denied(&name, "new");
        // "old" went to the minute before, not into the current one.
        let one = t.top(1, 10, None);
        assert_eq!(one[0].denials, 1);
        assert_eq!(one[0].ids[0].id, "new");
        assert_eq!(t.top(2, 10, None)[0].denials, 2);
    }
}
