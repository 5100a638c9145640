//! A kept Check's spend, made once under a token (docs/concurrency.md, "A Check cut
//! short"): each slot group's script call names a marker key of the token in that slot
//! (hash-tagged into it), which the script reads first and writes when it spent (with its
//! reply). When the call's outcome is not known (it missed `--redis-timeout-ms`, or lost
//! its connection after it was sent), [`RedisStore::resolve_once`]'s call of the same
//! script under the same token learns it: a marker with a reply is replayed as the
//! outcome; no marker becomes "void", so that a call still on its way (queued in Redis, or
//! run after the deadline) finds it and spends nothing. A cross-slot batch that is not
//! spent in every group is given back in the groups that spent, under their markers
//! ("undo": a marker with a reply becomes "void" and its spend is refunded, once).
//! Requests without a token never name a marker, and cost what they did.

use std::sync::OnceLock;

use super::cluster::{slot, SLOTS};
use super::wire::{Op, Read, Wire};
use super::RedisStore;
use crate::{Once, StoreError};
use cellrate_core::clock::Nanos;

/// The error of a spend whose token was resolved before it ran: it spent nothing.
pub(super) const VOIDED: &str = "redis: this Check's spend was resolved as not made before \
     it ran (its outcome was not known in time); nothing was spent";

/// Whether `e` is a spend that found its token resolved (it spent nothing).
pub(super) fn voided(e: &StoreError) -> bool {
    matches!(e, StoreError::Capacity(m) if m == VOIDED)
}

/// A spend under a token, or its resolution.
#[derive(Clone, Copy)]
pub(super) struct Under<'a> {
    pub(super) once: &'a Once,
    pub(super) resolve: bool,
}

/// Per cluster slot, a short hash tag that falls in it (the smallest number whose text
/// does): a marker is tagged with its group's slot, whatever its keys look like.
fn tag_of(wanted: usize) -> u32 {
    static TAGS: OnceLock<Vec<u32>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let (mut tags, mut left) = (vec![u32::MAX; SLOTS], SLOTS);
        // About 170 000 numbers fill every slot; the bound is far above that.
        for n in 0..16_000_000u32 {
            let at = &mut tags[slot(&n.to_string())];
            if *at == u32::MAX {
                *at = n;
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        tags
    });
    tags[wanted % SLOTS]
}

/// Whole milliseconds, rounded up, at least 1.
fn ttl_ms(ttl: Nanos) -> String {
    (ttl.max(1).saturating_add(999_999) / 1_000_000).to_string()
}

impl RedisStore {
    /// The marker of `once`'s token in cluster slot `slot` (for a standalone server, the
    /// one group's slot 0).
    pub(super) fn marker(&self, slot: usize, once: &Once) -> String {
        format!(
            "{}once:{{{}}}:{:032x}",
            self.settings.prefix,
            tag_of(slot),
            once.token
        )
    }

    /// One slot group's spend: as a request without a token (through its lane, coalesced
    /// with others), or under a token, alone. `None`: the group spent nothing, and never
    /// will under this token (a resolution that found or made "void").
    pub(super) async fn group_call(
        &self,
        slot: usize,
        batch: Vec<Wire>,
        under: Option<Under<'_>>,
    ) -> Result<Option<Read>, StoreError> {
        let Some(under) = under else {
            return self.spend_group(slot, batch).await.map(Some);
        };
        let marker = self.marker(slot, under.once);
        let op = match under.resolve {
            true => "resolve",
            false => "once",
        };
        let op = format!("{op}:{}", ttl_ms(under.once.ttl));
        let reads = self
            .call_spend(slot, &[&batch], Some((&marker, &op)))
            .await?;
        match reads.into_iter().next() {
            Some(read) => read.map(Some),
            None if under.resolve => Ok(None),
            None => Err(StoreError::Capacity(VOIDED.into())),
        }
    }

    /// Gives back a group's spend under its marker, once: a marker holding a reply
    /// becomes "void" and `keys` are refunded by `args`; any other refunds nothing.
    pub(super) async fn undo(
        &self,
        slot: usize,
        once: &Once,
        keys: &[String],
        args: &[String],
    ) -> Result<(), StoreError> {
        let mut invocation = self.invocation(slot);
        for key in keys {
            invocation.key(key);
        }
        invocation
            .key(self.marker(slot, once))
            .arg(format!("undo:{}", ttl_ms(once.ttl)))
            .arg(self.now_arg());
        for arg in args {
            invocation.arg(arg);
        }
        self.run(Op::Refund, slot, &invocation).await?;
        self.note(slot, true);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_has_a_tag_that_falls_in_it() {
        for wanted in [0, 1, 5_000, 12_182, SLOTS - 1] {
            assert_eq!(slot(&format!("x{{{}}}:y", tag_of(wanted))), wanted);
        }
    }
}
