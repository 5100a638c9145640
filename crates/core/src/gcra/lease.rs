//! Leases of a concurrency limit ([`Window::Concurrency`]): at most `count` held per key,
//! each under an id and expiring by itself `hold` (the limit's period) after it was taken.
//!
//! A key's state is its list of leases, each an id (a keyed hash of the caller's lease id,
//! chosen by the store) and the Unix time it expires at; a lease is live while `now <
//! expires`. Everything here is pure, on the live leases of one key: the stores read the
//! list, decide, and apply the returned [`LeaseWrite`] atomically. An acquire of an id
//! already held changes nothing and is allowed; a release of an id not held changes
//! nothing and says so (`allowed = false`), so that a retried or stray call never takes or
//! frees a second slot.

use super::{Decision, Limit, LimitError, Window};
use crate::clock::{Nanos, DAY, SECOND};

/// The most leases one key may hold (a concurrency limit's largest `count`).
pub const MAX_LEASES_PER_KEY: u64 = 10_000;

/// The most bytes of a lease id (ids are 1 to this many printable ASCII bytes).
pub const MAX_ID_BYTES: usize = 128;

/// The shortest hold.
pub const MIN_HOLD: Nanos = SECOND / 1_000;

/// The longest hold: a leaked lease is back within a day at worst.
pub const MAX_HOLD: Nanos = DAY;

/// One lease: its id's hash and when it expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The hash of the lease's id.
    pub id: u64,
    /// When the lease ends unless renewed.
    pub expires: Nanos,
}

/// What an acquire or release changes in a key's leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseWrite {
    /// A new lease is taken.
    Add(Lease),
    /// The lease with this id is freed.
    Remove(u64),
}

impl Limit {
    /// A concurrency limit: at most `count` leases per key, each living at most `hold`
    /// nanoseconds. Its burst and count are `count`, its period the hold.
    ///
    /// ```
    /// use cellrate_core::gcra::{Limit, Window};
    /// let limit = Limit::concurrency(8, 30_000_000_000).unwrap();
    /// assert_eq!((limit.window(), limit.count(), limit.period()), (Window::Concurrency, 8, 30_000_000_000));
    /// assert!(Limit::concurrency(10_001, 30_000_000_000).is_err());
    /// ```
    pub fn concurrency(count: u64, hold: Nanos) -> Result<Limit, LimitError> {
        if count == 0 {
            return Err(LimitError::ZeroCount);
        }
        if count > MAX_LEASES_PER_KEY {
            return Err(LimitError::TooManyLeases { count });
        }
        if !(MIN_HOLD..=MAX_HOLD).contains(&hold) {
            return Err(LimitError::Hold { hold });
        }
        let count = count as i64;
        Ok(Limit {
            burst: count,
            count,
            period: hold,
            ei: (hold / count).max(1),
            bo: hold,
            window: Window::Concurrency,
            every_hit: false,
        })
    }
}

fn live(leases: &[Lease], now: Nanos) -> impl Iterator<Item = &Lease> + '_ {
    leases.iter().filter(move |l| l.expires > now)
}

/// A key's live leases summed up: how many, and the earliest and latest expiry among them
/// (`now` for both when none). What a store reads of a key to answer for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The live leases.
    pub count: i64,
    /// The earliest expiry among them (`now` when none).
    pub oldest: Nanos,
    /// The latest expiry among them (`now` when none).
    pub latest: Nanos,
}

impl Held {
    /// The live leases of `leases` at `now`.
    pub fn of(leases: &[Lease], now: Nanos) -> Held {
        Held::scan(leases, now, None).0
    }

    /// The live leases of `leases` at `now` but the one of id `skip` (when given), and
    /// whether that one is live: one pass over the list.
    fn scan(leases: &[Lease], now: Nanos, skip: Option<u64>) -> (Held, bool) {
        let (mut count, mut oldest, mut latest) = (0i64, Nanos::MAX, now);
        let mut found = false;
        for lease in live(leases, now) {
            if Some(lease.id) == skip {
                found = true;
                continue;
            }
            count += 1;
            oldest = oldest.min(lease.expires);
            latest = latest.max(lease.expires);
        }
        let held = Held {
            count,
            oldest: if count == 0 { now } else { oldest },
            latest,
        };
        (held, found)
    }

    /// These leases and one more, expiring at `expires` (after now).
    fn with(self, expires: Nanos) -> Held {
        Held {
            count: self.count + 1,
            oldest: if self.count == 0 {
                expires
            } else {
                self.oldest.min(expires)
            },
            latest: self.latest.max(expires),
        }
    }
}

/// The key as it stands at `now`, given its live leases after the call: free slots, time
/// until one frees by expiry when none is free, time until all have expired. Both stores
/// answer through this (the Redis store from what its script read of the key).
pub fn answer(limit: &Limit, now: Nanos, allowed: bool, held: Held) -> Decision {
    let remaining = limit.count - held.count;
    Decision {
        allowed,
        remaining,
        retry_in: if remaining > 0 {
            0
        } else {
            held.oldest.saturating_sub(now).max(0)
        },
        reset_in: if held.count > 0 {
            held.latest.saturating_sub(now).max(0)
        } else {
            0
        },
    }
}

fn answer_of(limit: &Limit, now: Nanos, allowed: bool, leases: &[Lease]) -> Decision {
    answer(limit, now, allowed, Held::of(leases, now))
}

/// Acquires a lease under `id` at `now` on a key holding `leases` (expired ones are
/// ignored). Allowed without a write when `id` already holds a live lease (a retry);
/// else allowed with [`LeaseWrite::Add`] when a slot is free; else denied. The decision
/// describes the key after the write.
///
/// ```
/// use cellrate_core::gcra::{lease, Limit};
/// let s = 1_000_000_000;
/// let limit = Limit::concurrency(1, 30 * s).unwrap();
/// let (d, write) = lease::acquire(&limit, 0, &[], 7);
/// assert!(d.allowed && d.remaining == 0 && write.is_some());
/// let held = [lease::Lease { id: 7, expires: 30 * s }];
/// assert_eq!(lease::acquire(&limit, s, &held, 7).1, None); // a retry: nothing new
/// let (d, _) = lease::acquire(&limit, s, &held, 8); // full until 30 s
/// assert_eq!((d.allowed, d.retry_in), (false, 29 * s));
/// ```
pub fn acquire(
    limit: &Limit,
    now: Nanos,
    leases: &[Lease],
    id: u64,
) -> (Decision, Option<LeaseWrite>) {
    let (before, held) = Held::scan(leases, now, Some(id));
    if held {
        return (answer_of(limit, now, true, leases), None);
    }
    if before.count >= limit.count {
        return (answer(limit, now, false, before), None);
    }
    let lease = Lease {
        id,
        expires: now.saturating_add(limit.period),
    };
    let after = before.with(lease.expires);
    (
        answer(limit, now, true, after),
        Some(LeaseWrite::Add(lease)),
    )
}

/// Releases the lease under `id` at `now`: `allowed` (with [`LeaseWrite::Remove`]) when
/// `id` held a live lease, else `allowed = false` and nothing changes. The decision
/// describes the key after the write.
pub fn release(
    limit: &Limit,
    now: Nanos,
    leases: &[Lease],
    id: u64,
) -> (Decision, Option<LeaseWrite>) {
    // Without the lease of `id`: the key as it stands when `id` holds none, else after.
    let (after, held) = Held::scan(leases, now, Some(id));
    if !held {
        return (answer(limit, now, false, after), None);
    }
    (
        answer(limit, now, true, after),
        Some(LeaseWrite::Remove(id)),
    )
}

/// The key as it stands (a peek): allowed while a slot is free.
pub fn peek(limit: &Limit, now: Nanos, leases: &[Lease]) -> Decision {
    let free = live(leases, now).count() < limit.count() as usize;
    answer_of(limit, now, free, leases)
}

/// An acquire that a slot of the key would allow but that the store cannot record (its
/// table of leases, or the share of it the limit's name may take, is full): denied, with
/// no slot offered (`remaining` 0) and a retry after the limit's hold, by which every
/// lease taken under it until now has expired or been released. `reset_in` is the key's.
pub fn refused(limit: &Limit, now: Nanos, leases: &[Lease]) -> Decision {
    Decision {
        allowed: false,
        remaining: 0,
        retry_in: limit.period,
        ..answer_of(limit, now, false, leases)
    }
}

/// Applies `write` to a key's leases, dropping the expired ones; returns the change in the
/// number of leases held (negative when expired ones were dropped).
pub fn apply(leases: &mut Vec<Lease>, now: Nanos, write: Option<LeaseWrite>) -> i64 {
    let before = leases.len() as i64;
    match write {
        Some(LeaseWrite::Add(lease)) => {
            leases.retain(|l| l.expires > now);
            leases.push(lease);
        }
        Some(LeaseWrite::Remove(id)) => leases.retain(|l| l.expires > now && l.id != id),
        None => leases.retain(|l| l.expires > now),
    }
    leases.len() as i64 - before
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Nanos = 30 * SECOND;

    fn limit(n: u64) -> Limit {
        Limit::concurrency(n, HOLD).unwrap()
    }

    /// N acquires with distinct ids are allowed, the next denied until the oldest expires;
    /// the answers count free slots exactly.
    #[test]
    fn n_leases_then_denied_until_the_oldest_expires() {
        let limit = limit(3);
        let mut leases = Vec::new();
        for (i, id) in [10u64, 11, 12].into_iter().enumerate() {
            let now = i as Nanos * SECOND;
            let (d, write) = acquire(&limit, now, &leases, id);
            assert!(d.allowed);
            assert_eq!(d.remaining, 2 - i as i64);
            assert_eq!(apply(&mut leases, now, write), 1);
        }
        let (d, write) = acquire(&limit, 5 * SECOND, &leases, 13);
        assert_eq!((d.allowed, d.remaining, write), (false, 0, None));
        assert_eq!(
            d.retry_in,
            HOLD - 5 * SECOND,
            "the first lease expires at 30 s"
        );
        assert_eq!(d.reset_in, HOLD + 2 * SECOND - 5 * SECOND);
        // One nanosecond before the first lease expires: still full; at its expiry: free.
        assert!(!acquire(&limit, HOLD - 1, &leases, 13).0.allowed);
        let (d, write) = acquire(&limit, HOLD, &leases, 13);
        assert!(d.allowed, "the expired lease's slot is back");
        assert_eq!(apply(&mut leases, HOLD, write), 0, "one expired, one added");
    }

    /// A repeated acquire takes no second slot and does not extend the first; a release
    /// frees exactly its own lease, and a repeated or unknown release changes nothing.
    #[test]
    fn retries_and_stray_releases_change_nothing() {
        let limit = limit(2);
        let mut leases = Vec::new();
        let (_, write) = acquire(&limit, 0, &leases, 1);
        apply(&mut leases, 0, write);
        let (d, write) = acquire(&limit, SECOND, &leases, 1);
        assert_eq!((d.allowed, d.remaining, write), (true, 1, None));
        assert_eq!(
            leases,
            vec![Lease {
                id: 1,
                expires: HOLD
            }],
            "not refreshed"
        );
        let (d, write) = release(&limit, SECOND, &leases, 99);
        assert_eq!((d.allowed, d.remaining, write), (false, 1, None));
        let (d, write) = release(&limit, SECOND, &leases, 1);
        assert_eq!((d.allowed, d.remaining), (true, 2));
        assert_eq!(apply(&mut leases, SECOND, write), -1);
        let (d, write) = release(&limit, SECOND, &leases, 1);
        assert_eq!((d.allowed, write), (false, None));
        // A lease that expired cannot be released either.
        let (_, write) = acquire(&limit, 0, &leases, 2);
        apply(&mut leases, 0, write);
        assert_eq!(release(&limit, HOLD, &leases, 2).1, None);
    }

    #[test]
    fn bounds_of_count_and_hold() {
        assert_eq!(Limit::concurrency(0, HOLD), Err(LimitError::ZeroCount));
        assert!(Limit::concurrency(MAX_LEASES_PER_KEY, MAX_HOLD).is_ok());
        assert!(Limit::concurrency(MAX_LEASES_PER_KEY + 1, HOLD).is_err());
        assert!(Limit::concurrency(1, MIN_HOLD - 1).is_err());
        assert!(Limit::concurrency(1, MAX_HOLD + 1).is_err());
    }
}
