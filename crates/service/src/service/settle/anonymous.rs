//! Anonymous holds (docs/token-budgets.md): Envoy Gateway's and Envoy AI Gateway's token
//! limits ask with 0 hits when a request starts and charge its usage when its stream
//! ends, for the same descriptor, with nothing that links the two calls. On a limit that
//! holds them, the check takes a hold of an estimate in the bucket (a kept Check of one
//! item, under an id of the server's own, queued in its bucket's queue), and the charge
//! settles the bucket's oldest hold to its cost, as a `Settle` would: the difference
//! charged or given back, once. A hold no charge settles is released at its due by the
//! sweeper, as a reservation's is.
//!
//! The promise is the settlements' (counted once, never more back than was spent), and
//! the bucket's: a check is admitted only when what was spent, the live holds and its
//! own estimate all fit, since the holds are spent in the bucket. What is not promised
//! is *whose* hold a charge settles: the oldest of the bucket's. A charge from a request
//! that took no hold (admitted before holds were enabled, its hold expired, a duplicate
//! stream end) settles another request's hold early; that request's own charge then finds
//! one hold fewer and is charged in full. Each such charge lets at most one estimate's
//! worth of admissions through that the holds would have kept out: over the budget, at
//! most the estimate times the number of charges that found a hold not theirs.

use std::sync::Arc;

use tonic::Status;

use super::facts::{facts_bytes, Spent};
use super::record::{items_bytes, record_bytes};
use super::unknown::fresh_token;
use super::{counted_anonymous, store_failed, Settler, ENVOY_REQUEST_IDS};
use crate::service::{BatchResult, CheckOptions, DecideError, Decider, ItemSpec, Rule};
use cellrate_core::clock::Nanos;
use cellrate_core::gcra::{Mode, Window};
use cellrate_limits::config::LimitTable;

/// The prefix of the ids anonymous holds are kept under (no client can name one: the
/// native API refuses [`ENVOY_REQUEST_IDS`]).
fn anonymous_id() -> String {
    format!("{ENVOY_REQUEST_IDS}anon:{:032x}", fresh_token())
}

/// An item of a batch that holds its cost (the estimate) anonymously.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnonymousHold {
    /// Its place in the batch.
    pub item: usize,
    /// Its bucket's queue: the bucket key, which the hold also counts against
    /// (`--settle-max-holds-per-key`).
    pub queue: String,
    /// How long the hold lasts unless a charge settles it first.
    pub hold: Nanos,
    /// Whether its estimate is given back at its end (else it stands).
    pub release: bool,
}

/// What [`Settler::check_anonymous`] decided.
#[derive(Debug)]
pub enum HeldCheck {
    /// The batch, decided: its holds are kept if it was allowed.
    Decided(BatchResult),
    /// A hold could not be kept (its bucket has its most holds, or the table is full of
    /// holds): nothing was decided or spent.
    Refused,
}

impl Settler {
    /// Decides `items` (all-or-nothing, `options`) where the items `holds` name spend
    /// their estimate as holds: each kept (pending) before the batch is decided, then
    /// decided with what it spent and queued if the batch was allowed, else dropped. Runs
    /// to its end in a task of its own, as [`Settler::check`] does, so that Envoy's
    /// deadline cannot leave a hold pending with its estimate spent.
    pub async fn check_anonymous(
        &self,
        decider: &Arc<Decider>,
        table: Arc<LimitTable>,
        items: Vec<ItemSpec<'static>>,
        holds: Vec<AnonymousHold>,
        options: CheckOptions,
    ) -> Result<HeldCheck, DecideError> {
        let (settler, decider) = (self.clone(), decider.clone());
        let task = tokio::spawn(async move {
            let mut kept: Vec<(String, &AnonymousHold)> = Vec::with_capacity(holds.len());
            for hold in &holds {
                let id = anonymous_id();
                let item = std::slice::from_ref(&items[hold.item]);
                let record = items_bytes(item).map(|bytes| record_bytes(1, &bytes, None));
                let opened = match record {
                    Some(record) => {
                        let keys = std::slice::from_ref(&hold.queue);
                        (settler.table.open(&id, &record, Some(hold.hold), keys)).await
                    }
                    None => Err(cellrate_store::StoreError::MalformedReply),
                };
                match opened {
                    Ok(o) if o.written => kept.push((id, hold)),
                    other => {
                        settler.forget_all(&kept).await;
                        return match other {
                            Err(e) => Err(DecideError::Store(e)),
                            Ok(_) => {
                                counted_anonymous(&settler.metrics, "refused");
                                Ok(HeldCheck::Refused)
                            }
                        };
                    }
                }
            }
            let result = decider.check_with(&table, &items, options).await;
            match &result {
                Ok(r) if r.overall.allowed => {
                    for (id, hold) in &kept {
                        let decided = &r.items[hold.item];
                        let written = decided.decision.allowed
                            && matches!(decided.mode, Mode::CheckAndSpend | Mode::Charge);
                        let spent = Spent {
                            tokens: if written {
                                items[hold.item].cost.unwrap_or(1)
                            } else {
                                0
                            },
                            period: match decided.rule {
                                Rule::Limited(limit) => match limit.window() {
                                    Window::Calendar(period) => Some(period),
                                    Window::Gcra | Window::Concurrency => None,
                                },
                                _ => None,
                            },
                            hold: Some(hold.release),
                        };
                        settler.keep(id, &hold.queue, &facts_bytes(&[spent])).await;
                    }
                }
                _ => settler.forget_all(&kept).await,
            }
            result.map(HeldCheck::Decided)
        });
        // A task that panicked: what it spent is not known (as a lost store call's).
        task.await.unwrap_or_else(|e| {
            Err(DecideError::Store(
                cellrate_store::StoreError::Inconsistent(format!(
                    "the held Check's task ended: {e}"
                )),
            ))
        })
    }

    /// A held Check's record decided with `facts` and queued; on failure it stays
    /// pending, and its estimate stands until its window ends (never more spent).
    async fn keep(&self, id: &str, queue: &str, facts: &[u8]) {
        let kept = match self.table.decide(id, facts).await {
            Ok(true) => self.table.enqueue(queue, id).await,
            Ok(false) => return,
            Err(e) => Err(e),
        };
        match kept {
            Ok(()) => counted_anonymous(&self.metrics, "taken"),
            Err(e) => tracing::warn!(error = %e, "an anonymous hold could not be kept"),
        }
    }

    async fn forget_all(&self, kept: &[(String, &AnonymousHold)]) {
        for (id, _) in kept {
            if let Err(e) = self.table.forget(id).await {
                tracing::warn!(error = %e, "a denied anonymous hold could not be dropped");
            }
        }
    }

    /// A charge of `cost` for the bucket of `queue`: settles its oldest live hold to
    /// `cost`, as a `Settle` of it would (the difference charged or given back); `false`
    /// when it holds none, and the caller charges the cost as it would without holds.
    /// An error only when no hold could be claimed (the table failed); `false` too when
    /// the settlement surely changed nothing (the hold is released at its due); `true`
    /// once it may have been applied (never made twice).
    pub async fn settle_oldest(
        &self,
        decider: &Decider,
        queue: &str,
        cost: u64,
    ) -> Result<bool, Status> {
        let claimed = self.table.claim_oldest(queue, &cost.to_le_bytes()).await;
        let Some((id, kept)) = claimed.map_err(store_failed)? else {
            counted_anonymous(&self.metrics, "unmatched");
            return Ok(false);
        };
        match self.adjust(decider, &id, &kept, &[cost], true).await {
            Ok(_) => {
                counted_anonymous(&self.metrics, "settled");
                self.metrics.holds.with_label_values(&["settled"]).inc();
                Ok(true)
            }
            Err(undone) => {
                tracing::warn!(error = %undone.status.message(), "a held charge's settlement failed");
                match &undone.reopen {
                    // Surely not applied (or only its charge, folded into the facts): the
                    // hold is live again and released at its due by what it holds, and
                    // the caller charges the cost in full.
                    Some(facts) => {
                        self.reopen(&id, facts).await;
                        Ok(false)
                    }
                    // Perhaps applied: never made twice, so the charge is not made either.
                    None => Ok(true),
                }
            }
        }
    }
}
