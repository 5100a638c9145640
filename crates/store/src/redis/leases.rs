//! Leases of concurrency limits on Redis (docs/concurrency.md, "Stores"): one sorted set
//! per lease key, read and written by batch.lua in the same script call as the batch's
//! TATs, so a batch mixing leases and rates stays all-or-nothing. The script decides which
//! leases to take or free and reports, per lease item, whether its id held a live lease
//! and the key's live leases before and after ([`LeaseRead`]); every reported number is
//! computed here by [`cellrate_core::gcra::lease::answer`], as the memory store computes it.
//!
//! Lease ids are stored as given (printable, checked before the store), never hashed with
//! a per-process key: every replica must find the lease another one took.

use super::lease_keys::{Claim, LeaseKeys, Settled};
use super::wire::{LeaseRead, Read};
use crate::{LeaseCounters, StoreError, StoreItem};
use cellrate_core::clock::Nanos;
use cellrate_core::gcra::lease::{self, Held};
use cellrate_core::gcra::{self, BatchItem, BatchOutcome, Decision, Mode, Window};

/// Whether an item names a concurrency limit's key.
pub(super) fn is_lease(item: &StoreItem) -> bool {
    item.limit.window() == Window::Concurrency
}

/// The lease id an item sends: an acquire's or release's (an item of a concurrency limit
/// in any other mode, or without an id, only reads its key, as on the memory store).
pub(super) fn lease_id(item: &StoreItem) -> Option<&std::sync::Arc<str>> {
    (is_lease(item) && item.mode.is_lease())
        .then_some(item.lease.as_ref())
        .flatten()
}

/// Refuses a lease id the script cannot store as given (the service refuses it first,
/// naming the item): 1 to 128 printable ASCII bytes, so that no id is empty, or a space
/// away from the key's base member.
pub(super) fn check_ids(items: &[StoreItem]) -> Result<(), StoreError> {
    for item in items {
        if let Some(id) = lease_id(item) {
            if !cellrate_core::text::is_plain_id(id, lease::MAX_ID_BYTES) {
                return Err(StoreError::Config(format!(
                    "lease id {:?} is not 1 to 128 printable ASCII bytes",
                    id.chars().take(40).collect::<String>()
                )));
            }
        }
    }
    Ok(())
}

/// Replays one slot group's decision as the script made it. `denied`: the request was
/// denied as a whole (another group denied, or failed): nothing stays spent but charges,
/// an acquire reports its key as it stands, a release as it left it (releases are applied
/// whatever the batch decides). `refused`, per item: an acquire sent with a count of 0
/// (its key not counted and its name's share full, [`LeaseKeys`]): it takes no lease.
pub(super) fn replay(
    items: &[StoreItem],
    members: &[usize],
    read: &Read,
    denied: bool,
    refused: &[bool],
) -> Result<BatchOutcome, StoreError> {
    let mode = |item: &StoreItem| match item.mode {
        Mode::Charge => Mode::Charge,
        _ if denied => Mode::Probe,
        mode => mode,
    };
    if read.leases.is_empty() && !members.iter().any(|&i| is_lease(&items[i])) {
        // No lease: the rates alone, from the TATs as read (the common path).
        let rates: Vec<BatchItem<'_>> = members
            .iter()
            .map(|&i| BatchItem {
                limit: &items[i].limit,
                cost: items[i].cost,
                mode: mode(&items[i]),
            })
            .collect();
        return Ok(gcra::spend_batch(read.now, &rates, &read.tats));
    }
    let mut acquired = true;
    let (mut rates, mut tats) = (Vec::new(), Vec::new());
    for (n, &i) in members.iter().enumerate() {
        let item = &items[i];
        if is_lease(item) {
            let seen = read.lease(n).ok_or(StoreError::MalformedReply)?;
            if item.mode == Mode::Acquire && lease_id(item).is_some() {
                acquired &= seen.held || (!refused[i] && free(item, seen.before));
            }
        } else {
            rates.push(BatchItem {
                limit: &item.limit,
                cost: item.cost,
                mode: mode(item),
            });
            tats.push(read.tats.get(n).copied().flatten());
        }
    }
    let out = gcra::spend_batch_with(read.now, &rates, &tats, acquired || denied);
    let taken = out.allowed && !denied;
    let mut rate_out = out.decisions.into_iter().zip(out.writes);
    let (mut decisions, mut writes) = (Vec::new(), Vec::new());
    for (n, &i) in members.iter().enumerate() {
        let (decision, write) = match read.lease(n) {
            Some(seen) if is_lease(&items[i]) => (decide(&items[i], read.now, seen, taken), None),
            _ => rate_out.next().ok_or(StoreError::MalformedReply)?,
        };
        decisions.push(decision);
        writes.push(write);
    }
    Ok(BatchOutcome {
        allowed: out.allowed,
        decisions,
        writes,
    })
}

fn free(item: &StoreItem, held: Held) -> bool {
    held.count < item.limit.count() as i64
}

/// A lease item's answer from what the script saw (`taken`: its batch was allowed).
fn decide(item: &StoreItem, now: Nanos, seen: &LeaseRead, taken: bool) -> Decision {
    let limit = &item.limit;
    match (item.mode, lease_id(item).is_some()) {
        (Mode::Acquire, true) if taken => lease::answer(limit, now, true, seen.after),
        (Mode::Release, true) => lease::answer(limit, now, seen.held, seen.after),
        _ => lease::answer(limit, now, free(item, seen.before), seen.before),
    }
}

/// The leases a group took in a request that was denied as a whole (a cross-slot batch's
/// compensation): each as its item's index and the refund argument that takes it back
/// (`#<id>`). A retried acquire took nothing, and is left alone.
pub(super) fn taken_back(
    items: &[StoreItem],
    members: &[usize],
    read: &Read,
    out: &BatchOutcome,
) -> Vec<(usize, String)> {
    if !out.allowed {
        return Vec::new();
    }
    members
        .iter()
        .enumerate()
        .filter(|&(_, &i)| items[i].mode == Mode::Acquire)
        .filter_map(|(n, &i)| {
            let id = lease_id(&items[i])?;
            let seen = read.lease(n)?;
            (!seen.held).then(|| (i, format!("#{id}")))
        })
        .collect()
}

/// Counts what a request's lease items did (`allowed`: the request as a whole): leases
/// taken (not a retry's), released, and found expired by the script.
pub(super) fn count<'a>(
    counters: &LeaseCounters,
    items: &[StoreItem],
    groups: &[(usize, Vec<usize>)],
    reads: impl Iterator<Item = Option<&'a Read>>,
    allowed: bool,
) {
    let (mut acquired, mut released, mut expired) = (0, 0, 0);
    for ((_, members), read) in groups.iter().zip(reads) {
        let Some(read) = read else { continue };
        for (n, &i) in members.iter().enumerate() {
            let (Some(seen), Some(_)) = (read.lease(n), lease_id(&items[i])) else {
                continue;
            };
            match items[i].mode {
                Mode::Acquire if allowed && !seen.held => acquired += 1,
                Mode::Release if seen.held => released += 1,
                _ => {}
            }
        }
        expired += read.leases.iter().map(|(_, l)| l.expired).sum::<u64>();
    }
    counters.add(acquired, released, expired);
}

/// The answer of the failure policies `allow` and `deny` for a lease item: an acquire is
/// allowed (no lease taken anywhere: nothing to leak, the bound not enforced while Redis
/// fails) or denied; a release frees nothing it could know of (`allowed = false`).
pub(super) fn fixed(item: &StoreItem, allowed: bool) -> Decision {
    let acquire = allowed && item.mode != Mode::Release;
    Decision {
        allowed: acquire,
        remaining: if acquire {
            item.limit.count() as i64
        } else {
            0
        },
        retry_in: 0,
        reset_in: 0,
    }
}

/// Per item, the claim of an acquire that sends an id on its key ([`LeaseKeys::claim`]),
/// `None` for any other item; `redis_keys` the items' Redis keys.
pub(super) fn claim(
    keys: &LeaseKeys,
    items: &[StoreItem],
    redis_keys: &[String],
    now: Nanos,
) -> Vec<Option<Claim>> {
    items
        .iter()
        .zip(redis_keys)
        .map(|(item, key)| {
            (item.mode == Mode::Acquire && lease_id(item).is_some()).then(|| {
                let until = now.saturating_add(item.limit.period());
                keys.claim(item.key.parts().0, key, now, until)
            })
        })
        .collect()
}

/// Whether each item's claim was refused.
pub(super) fn refusals(claims: &[Option<Claim>]) -> Vec<bool> {
    claims.iter().map(|c| *c == Some(Claim::Refused)).collect()
}

/// Settles a request's claims from what each group's call did (`None`: it failed), and
/// lets go of the keys its releases emptied (`seq`: [`LeaseKeys::seq`] before the calls).
/// `allowed`: the request as a whole (when not, a lease a group took was taken back by a
/// compensation, which can fail: its key stays counted for the hold).
#[allow(clippy::too_many_arguments)]
pub(super) fn settle(
    keys: &LeaseKeys,
    items: &[StoreItem],
    redis_keys: &[String],
    groups: &[(usize, Vec<usize>)],
    outcomes: &[Option<(Read, BatchOutcome)>],
    claims: &[Option<Claim>],
    seq: u64,
    allowed: bool,
) {
    for ((_, members), outcome) in groups.iter().zip(outcomes) {
        for (n, &i) in members.iter().enumerate() {
            let item = &items[i];
            let number = item.key.parts().0;
            let seen = outcome.as_ref().and_then(|(read, out)| {
                read.lease(n).map(|seen| {
                    (
                        seen,
                        out.allowed,
                        read.now.saturating_add(item.limit.period()),
                    )
                })
            });
            if let Some(claim) = claims[i] {
                let settled = match seen {
                    None => Settled::Unknown,
                    Some((seen, true, _)) if !seen.held && !allowed => Settled::Unknown,
                    Some((seen, true, expires)) if !seen.held => Settled::Taken(expires),
                    Some(_) => Settled::NotTaken,
                };
                keys.settle(number, &redis_keys[i], claim, settled);
            } else if let (Mode::Release, Some((seen, _, _))) = (item.mode, seen) {
                if seen.after.count == 0 && lease_id(item).is_some() {
                    keys.emptied(number, &redis_keys[i], seq);
                }
            }
        }
    }
}

/// A request with an acquire refused for its name's share of lease keys, that would have
/// been allowed but for it: answered as the memory store answers a full share (every
/// acquire that would have taken a lease [`lease::refused`]-like: denied, `remaining` 0, a
/// retry after the hold; nothing taken). Overwrites `decisions` and returns true then;
/// else (nothing refused, a group failed, or the request was denied anyway) false.
pub(super) fn refuse(
    items: &[StoreItem],
    groups: &[(usize, Vec<usize>)],
    outcomes: &[Option<(Read, BatchOutcome)>],
    refused: &[bool],
    decisions: &mut [Decision],
) -> bool {
    if !refused.contains(&true) {
        return false;
    }
    let none = vec![false; items.len()];
    let mut adds = Vec::new();
    for ((_, members), outcome) in groups.iter().zip(outcomes) {
        let Some((read, out)) = outcome else {
            return false;
        };
        let mut shut_out = false;
        for (n, &i) in members.iter().enumerate() {
            let item = &items[i];
            let Some(seen) = read.lease(n) else { continue };
            let acquire = item.mode == Mode::Acquire && lease_id(item).is_some();
            if acquire && !seen.held && free(item, seen.before) {
                shut_out |= refused[i];
                adds.push((i, read.now, seen.before));
            }
        }
        // The group as it would have gone with its acquires counted.
        let would = match shut_out {
            true => replay(items, members, read, false, &none).is_ok_and(|o| o.allowed),
            false => out.allowed,
        };
        if !would {
            return false;
        }
    }
    if !adds.iter().any(|&(i, _, _)| refused[i]) {
        return false;
    }
    for (i, now, before) in adds {
        let limit = &items[i].limit;
        decisions[i] = Decision {
            allowed: false,
            remaining: 0,
            retry_in: limit.period(),
            ..lease::answer(limit, now, false, before)
        };
    }
    true
}

/// Each group's decision replayed exactly as the script made it (`None`: a group that
/// failed, or was resolved as not spent): the outcomes, the first failure, and whether a
/// group was resolved as not spent.
#[allow(clippy::type_complexity)]
pub(super) fn replay_groups(
    items: &[StoreItem],
    groups: &[(usize, Vec<usize>)],
    reads: Vec<Result<Option<Read>, StoreError>>,
    refused: &[bool],
) -> (
    Vec<Option<(Read, cellrate_core::gcra::BatchOutcome)>>,
    Option<StoreError>,
    bool,
) {
    let mut outcomes = Vec::with_capacity(groups.len());
    let (mut failure, mut void) = (None, false);
    for ((_, members), read) in groups.iter().zip(reads) {
        let replayed = read.and_then(|read| match read {
            Some(read) => Ok(Some((replay(items, members, &read, false, refused)?, read))),
            None => Ok(None),
        });
        match replayed {
            Ok(Some((out, read))) => outcomes.push(Some((read, out))),
            Ok(None) => {
                void = true;
                outcomes.push(None);
            }
            Err(e) => {
                failure = Some(e);
                outcomes.push(None);
            }
        }
    }
    (outcomes, failure, void)
}
