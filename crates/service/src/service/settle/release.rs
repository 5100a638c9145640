//! The release of holds not settled in time (see `holds.rs`): [`Settler::release_due`]
//! claims the due ones (on any replica: the table claims each once) and gives back each
//! item whose policy is `unsettled: release`, as a `Settle` at cost 0 would; an item whose
//! policy is `keep` (or that has none) stands.
//!
//! One call (one sweep) claims each due hold at most once, so that every sweep makes
//! progress through all of them: a release that failed where the store surely changed
//! nothing is reopened only once the sweep is done (due again at the next one), and one
//! that can never be made (its limit was removed or renamed by a reload, its record
//! cannot be read) is given up: its estimate stands, counted, never claimed again. Each
//! kind of failure is logged once per sweep, however many holds it hit.

use futures_util::StreamExt;

use super::facts::facts_of;
use super::Settler;
use crate::service::Decider;
use cellrate_store::shared::Kept;
use cellrate_store::StoreError;

/// Due holds claimed per table call.
const RELEASE_BATCH: usize = 256;

/// Table calls per [`Settler::release_due`], at most: a sweep releases at most
/// `RELEASE_BATCH * RELEASE_CALLS` (16 384) holds, the rest at the next.
const RELEASE_CALLS: usize = 64;

/// Releases made at once (each is one store call, which a Redis round trip bounds).
const RELEASE_CONCURRENCY: usize = 32;

/// What one [`Settler::release_due`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Holds given back (at least one item's policy is `unsettled: release`).
    pub released: u64,
    /// Holds whose estimates stand.
    pub kept: u64,
    /// Holds whose release failed (claimed again at the next call when the failure
    /// surely applied nothing, else not made again).
    pub failed: u64,
    /// Holds whose release can never be made (a limit of theirs is gone, or the record
    /// cannot be read): their estimates stand, and they are not claimed again.
    pub given_up: u64,
    /// Pending records whose Check's spend was resolved (docs/concurrency.md, "A Check
    /// cut short"): decided with what it spent, released at a later sweep, or dropped.
    pub resolved: u64,
    /// Pending records whose resolution failed (tried again a little later).
    pub unresolved: u64,
}

/// What became of one due hold.
enum Outcome {
    Released,
    Kept,
    /// Failed; with the facts to reopen it with at the sweep's end (`None`: it may have
    /// been applied, not made again).
    Failed(String, Option<Vec<u8>>),
    GivenUp(String),
    /// A pending record (its Check's spend not known to be made): resolved, or to be
    /// resolved at a later sweep (with why not).
    Resolved(Option<String>),
}

/// The first of a kind of failure in a sweep (logged once, with how many there were).
#[derive(Default)]
struct FirstOf(Option<(String, String)>);

impl FirstOf {
    fn note(&mut self, id: &str, error: &str) {
        self.0
            .get_or_insert_with(|| (id.to_string(), error.to_string()));
    }
}

impl Settler {
    /// Claims the holds whose hold has ended and gives each back per its items' policies
    /// (as a `Settle` with cost 0 for a released item, the estimate for a kept one).
    pub async fn release_due(&self, decider: &Decider) -> Result<Released, StoreError> {
        let mut done = Released::default();
        let (mut given_up, mut failed) = (FirstOf::default(), FirstOf::default());
        let mut retry: Vec<(String, Vec<u8>)> = Vec::new();
        let mut claim_failed = None;
        for _ in 0..RELEASE_CALLS {
            let due = match self.table.due(RELEASE_BATCH).await {
                Ok(due) => due,
                Err(e) => {
                    claim_failed = Some(e);
                    break;
                }
            };
            let claimed = due.len();
            let mut outcomes = futures_util::stream::iter(due)
                .map(|(id, kept)| async move {
                    let outcome = self.release_one(decider, &id, &kept).await;
                    (id, outcome)
                })
                .buffer_unordered(RELEASE_CONCURRENCY);
            while let Some((id, outcome)) = outcomes.next().await {
                match outcome {
                    Outcome::Released => done.released += 1,
                    Outcome::Kept => done.kept += 1,
                    Outcome::GivenUp(error) => {
                        done.given_up += 1;
                        given_up.note(&id, &error);
                    }
                    Outcome::Resolved(None) => done.resolved += 1,
                    Outcome::Resolved(Some(error)) => {
                        done.unresolved += 1;
                        failed.note(&id, &error);
                    }
                    Outcome::Failed(error, reopen) => {
                        done.failed += 1;
                        failed.note(&id, &error);
                        if let Some(facts) = reopen {
                            retry.push((id, facts));
                        }
                    }
                }
            }
            if claimed < RELEASE_BATCH {
                break;
            }
        }
        // Reopened only now: claimed again at the next sweep, not over and over in this
        // one (ahead of every other due hold).
        for (id, facts) in &retry {
            self.reopen(id, facts).await;
        }
        if let Some((id, error)) = given_up.0 {
            tracing::warn!(
                holds = done.given_up,
                first = %id,
                %error,
                "due holds that can never be released (their limit was removed or renamed, \
                 or the record is unreadable) were given up: their estimates stand"
            );
        }
        if let Some((id, error)) = failed.0 {
            tracing::warn!(
                holds = done.failed,
                retried = retry.len(),
                first = %id,
                %error,
                unresolved = done.unresolved,
                "due holds' releases (or resolutions of spends not known to be made) \
                 failed; those surely not applied are claimed again at the next sweep"
            );
        }
        let event = |name: &str, n: u64| {
            if n > 0 {
                self.metrics.holds.with_label_values(&[name]).inc_by(n);
            }
        };
        event("released", done.released);
        event("kept", done.kept);
        event("given_up", done.given_up);
        match claim_failed {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }

    /// Releases (or keeps) one claimed hold.
    async fn release_one(&self, decider: &Decider, id: &str, kept: &Kept) -> Outcome {
        if kept.facts.is_empty() {
            return match self.resolve_due(decider, id, kept).await {
                Ok(()) => Outcome::Resolved(None),
                Err(u) => Outcome::Resolved(Some(u.status.message().into())),
            };
        }
        let Some(spent) = facts_of(&kept.facts) else {
            return Outcome::GivenUp("its record cannot be read".into());
        };
        let released = spent.iter().any(|s| s.hold == Some(true));
        let costs: Vec<u64> = spent
            .iter()
            .map(|s| if s.hold == Some(true) { 0 } else { s.tokens })
            .collect();
        match self.adjust(decider, id, kept, &costs, false).await {
            Ok(_) if released => Outcome::Released,
            Ok(_) => Outcome::Kept,
            Err(undone) if undone.lasting => Outcome::GivenUp(undone.status.message().into()),
            Err(undone) => Outcome::Failed(undone.status.message().into(), undone.reopen),
        }
    }
}
