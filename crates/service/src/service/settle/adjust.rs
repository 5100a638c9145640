//! A settle: the decided record claimed once (mark first, then apply), each item's
//! difference charged or refunded, and the buckets answered as they then are; and the
//! adjustment a hold's release makes (`release.rs`) with it.

use tonic::Status;

use super::facts::{facts_bytes, facts_of, is_hold, Spent};
use super::record::read_record;
use super::{checked_id, counted, store_failed, Settler};
use crate::service::{
    BatchResult, CheckOptions, DecideError, Decider, ItemSpec, Rule, Target, MAX_BATCH,
};
use cellrate_core::clock::{CalendarPeriod, Nanos, SECOND};
use cellrate_core::gcra::Mode;
use cellrate_store::shared::{Claim, Kept};

/// A refund to a calendar window is given only while its window has this long left: a
/// refund decided just before the window's end could land in the next one.
pub const REFUND_MARGIN: Nanos = SECOND;

/// What a settle answers: the items' buckets as they are after it.
#[derive(Debug, Clone)]
pub struct Settled {
    /// Each item of the kept Check, peeked (its bucket now, nothing spent).
    pub result: BatchResult,
    /// The record was settled before, at the same costs: nothing was applied now.
    pub already_settled: bool,
}

/// The costs as the table keeps them (compared byte for byte on a retry).
fn costs_bytes(costs: &[u64]) -> Vec<u8> {
    costs.iter().flat_map(|c| c.to_le_bytes()).collect()
}

/// Whether tokens spent in `period` while `kept` was decided may be given back at the
/// claim's time: in the same window, with [`REFUND_MARGIN`] of it left.
fn credited(period: Option<CalendarPeriod>, kept: &Kept) -> bool {
    let Some(period) = period else {
        return true;
    };
    let spent_in = period.window_end(kept.opened);
    spent_in == period.window_end(kept.decided)
        && spent_in == period.window_end(kept.now.saturating_add(REFUND_MARGIN))
}

/// Whether a failed step surely changed no bucket (so the record may be reopened).
fn surely_not_applied(e: &DecideError) -> bool {
    match e {
        DecideError::Invalid(_) => true,
        DecideError::Store(e) => !e.may_have_applied(),
    }
}

/// One settle's adjustment of a claimed record.
struct Plan {
    items: Vec<ItemSpec<'static>>,
    spent: Vec<Spent>,
    charges: Vec<ItemSpec<'static>>,
    refunds: Vec<ItemSpec<'static>>,
    /// The facts once the charges are made (what a reopened record holds).
    charged: Vec<Spent>,
}

/// The item as a plain spend of its bucket (a peek, or with a cost a refund).
fn plain(item: &ItemSpec<'static>) -> ItemSpec<'static> {
    ItemSpec {
        cost: None,
        mode: Mode::CheckAndSpend,
        ..item.clone()
    }
}

impl Plan {
    fn new(items: Vec<ItemSpec<'static>>, spent: Vec<Spent>, costs: &[u64], kept: &Kept) -> Plan {
        let mut charged = spent.clone();
        let (mut charges, mut refunds) = (Vec::new(), Vec::new());
        for ((item, s), (&actual, after)) in items
            .iter()
            .zip(&spent)
            .zip(costs.iter().zip(charged.iter_mut()))
        {
            if actual > s.tokens {
                charges.push(ItemSpec {
                    cost: Some(actual - s.tokens),
                    mode: Mode::Charge,
                    ..item.clone()
                });
                after.tokens = actual;
            } else if actual < s.tokens && credited(s.period, kept) {
                refunds.push(ItemSpec {
                    cost: Some(s.tokens - actual),
                    ..plain(item)
                });
            }
        }
        Plan {
            items,
            spent,
            charges,
            refunds,
            charged,
        }
    }
}

impl Settler {
    /// A settle of `id` at `costs` (one per item of its Check): claims the decided
    /// record, charges or refunds each item's difference, and answers the buckets as
    /// they then are.
    pub async fn settle(
        &self,
        decider: &Decider,
        id: &str,
        costs: &[u64],
    ) -> Result<Settled, Status> {
        checked_id("request_id", id)?;
        if costs.is_empty() || costs.len() > MAX_BATCH {
            return Err(Status::invalid_argument(format!(
                "costs: {} given, 1 to {MAX_BATCH} (one per item of the Check)",
                costs.len()
            )));
        }
        let costs_kept = costs_bytes(costs);
        match self
            .table
            .claim(id, &costs_kept)
            .await
            .map_err(store_failed)?
        {
            Claim::Unknown => {
                counted(&self.metrics, "unknown");
                Err(Status::not_found(format!(
                    "request_id {id:?} is unknown: no allowed Check kept it, or it expired \
                     (--settle-window), was pushed out (--settle-max-records) or was lost \
                     with the store (Redis restarted empty); the Check's estimate stands"
                )))
            }
            Claim::Expired => {
                counted(&self.metrics, "expired");
                Err(Status::failed_precondition(format!(
                    "request_id {id:?} expired: its hold (reservation.hold) ended before this \
                     Settle, and its estimate was released or stands as its limits' \
                     reservation policy says (unsettled); nothing was settled"
                )))
            }
            Claim::Pending => {
                counted(&self.metrics, "pending");
                Err(Status::unavailable(format!(
                    "request_id {id:?}: its Check is still being decided; nothing was \
                     settled, retry"
                )))
            }
            Claim::Settled { costs: before, .. } if before != costs_kept => {
                counted(&self.metrics, "conflict");
                Err(Status::failed_precondition(format!(
                    "request_id {id:?} was settled already, at other costs"
                )))
            }
            Claim::Settled { kept, .. } => {
                let items = read(&kept)?.0;
                let answer = peek(decider, &items, true).await;
                counted(&self.metrics, "retried");
                answer
            }
            Claim::Claimed(kept) => {
                let adjusted = self.adjust(decider, id, &kept, costs, true).await;
                let items = match adjusted {
                    Ok(items) => items,
                    Err(undone) => {
                        if let Some(facts) = &undone.reopen {
                            self.reopen(id, facts).await;
                        }
                        return Err(undone.status);
                    }
                };
                counted(&self.metrics, "settled");
                if is_hold(&kept) {
                    self.metrics.holds.with_label_values(&["settled"]).inc();
                }
                peek(decider, &items, false).await
            }
        }
    }

    /// Applies a claimed record's adjustment, charges first, then refunds; its items.
    /// `settling`: for a settle (else for a hold's release). On a failure the record
    /// stays settled: the caller reopens it with [`Undone::reopen`]'s facts, if any.
    pub(super) async fn adjust(
        &self,
        decider: &Decider,
        id: &str,
        kept: &Kept,
        costs: &[u64],
        settling: bool,
    ) -> Result<Vec<ItemSpec<'static>>, Undone> {
        // Nothing applied: the right costs (or limits) may still settle it.
        let lasting = |status: Status| Undone {
            status,
            reopen: Some(kept.facts.clone()),
            lasting: true,
        };
        let (items, spent) = match read(kept) {
            Ok(read) if read.0.len() == costs.len() => read,
            Ok((items, _)) => {
                return Err(lasting(Status::invalid_argument(format!(
                    "costs: {} given, the Check had {} items",
                    costs.len(),
                    items.len()
                ))))
            }
            Err(e) => return Err(lasting(e)),
        };
        let mut plan = Plan::new(items, spent, costs, kept);
        if !plan.charges.is_empty() {
            if let Err(e) = decider.check(&plan.charges).await {
                return Err(self.failed(id, e, &facts_bytes(&plan.spent), settling));
            }
        }
        if !plan.refunds.is_empty() {
            let refunded = match capped(decider, &mut plan.refunds) {
                Ok(()) => decider.refund(&plan.refunds).await,
                Err(e) => Err(e),
            };
            if let Err(e) = refunded {
                return Err(self.failed(id, e, &facts_bytes(&plan.charged), settling));
            }
        }
        hold_ended(decider, &plan.items, &plan.spent, kept);
        Ok(plan.items)
    }

    /// A step failed: the record may be reopened with `facts` if the failure surely
    /// applied nothing, else it stays settled for good.
    /// `settling`: a settle's (counted as settled), not a release's.
    fn failed(&self, id: &str, e: DecideError, facts: &[u8], settling: bool) -> Undone {
        if surely_not_applied(&e) {
            return Undone {
                lasting: matches!(e, DecideError::Invalid(_)),
                reopen: Some(facts.to_vec()),
                status: e.into(),
            };
        }
        if settling {
            counted(&self.metrics, "settled");
        }
        Undone {
            status: Status::unavailable(format!(
                "{e}; request_id {id:?} is settled: its adjustment may have been made, in \
                 part or whole, and will not be made again"
            )),
            reopen: None,
            lasting: false,
        }
    }

    pub(super) async fn reopen(&self, id: &str, facts: &[u8]) {
        if let Err(e) = self.table.reopen(id, facts).await {
            tracing::warn!(error = %e, "a settlement not applied could not be reopened");
        }
    }
}

/// An adjustment not made (see [`Settler::adjust`]).
pub(super) struct Undone {
    /// Why, as the caller answers it.
    pub status: Status,
    /// The facts to make the record decided again with (what was surely applied before
    /// the failure folded in); `None`: the failure may have been applied, and the record
    /// stays settled for good.
    pub reopen: Option<Vec<u8>>,
    /// The failure is the record's or the limits' (it cannot be read, a cost or an item
    /// is refused, the limit is gone), not the store's: the same adjustment fails again.
    pub lasting: bool,
}

/// Each limit that held tokens in `kept` learns how long its hold lasted, opening to
/// claim in the table's time (`retry_hint.rs`): a configured name, or a configured
/// envoyproxy/ratelimit-format limit's label, never a caller's limit.
fn hold_ended(decider: &Decider, items: &[ItemSpec<'_>], spent: &[Spent], kept: &Kept) {
    let duration = kept.now.saturating_sub(kept.opened);
    let table = decider.limits();
    for (item, s) in items.iter().zip(spent) {
        if s.hold.is_none() || s.tokens == 0 || item.limit.is_some() {
            continue;
        }
        let name = match &item.target {
            Target::Named { name, .. } => table.names().get(name).map(|n| n.text.clone()),
            Target::Ratelimit(target) if !target.caller_given => Some(target.name.clone()),
            _ => None,
        };
        if let Some(name) = name {
            decider.retry_hints().hold_ended(&name, duration);
        }
    }
}

/// A record's items and what each spent.
pub(super) fn read(kept: &Kept) -> Result<(Vec<ItemSpec<'static>>, Vec<Spent>), Status> {
    match (read_record(&kept.check), facts_of(&kept.facts)) {
        (Some(record), Some(spent)) if record.items.len() == spent.len() => {
            Ok((record.items, spent))
        }
        _ => Err(Status::internal("a kept Check could not be read")),
    }
}

/// The items' buckets as they are now.
async fn peek(
    decider: &Decider,
    items: &[ItemSpec<'static>],
    already_settled: bool,
) -> Result<Settled, Status> {
    let peeks: Vec<ItemSpec<'static>> = items.iter().map(plain).collect();
    let result = decider.inspect(&peeks).await?;
    Ok(Settled {
        result,
        already_settled,
    })
}

/// A refund gives back at most a full bucket: a larger one is cut to the bucket's burst
/// (which a plain `Refund` refuses as a mistake).
fn capped(decider: &Decider, specs: &mut [ItemSpec<'_>]) -> Result<(), DecideError> {
    let table = decider.limits();
    let options = CheckOptions {
        oversize_denies: true,
        ..CheckOptions::default()
    };
    let resolved = decider.resolve(&table, specs, options)?;
    for (spec, r) in specs.iter_mut().zip(resolved) {
        if let Rule::Limited(limit) = r.rule {
            spec.cost = spec.cost.map(|cost| cost.min(limit.burst()));
        }
    }
    Ok(())
}
