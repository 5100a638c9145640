//! Settlements: a native `Check` made with a `request_id` is kept in a bounded table
//! ([`Settlements`]: in memory, or in Redis for every replica), and `Settle` adjusts it
//! once to the costs the items actually had.
//!
//! The promise: **counted once, never more back than was spent.**
//!
//! - One record per Check, of what was actually written, in the window it was written.
//!   The record is *pending* while its Check is decided (a `Settle` then is UNAVAILABLE
//!   and changes nothing). Once the Check is allowed, the record is *decided* with, per
//!   item, the tokens the store wrote (0 for an item not written: a spend-only item that
//!   did not fit, an unlimited or unconfigured rule, a check-only item, a cost of 0) and,
//!   for a calendar limit, its period; the table's times of opening and deciding bound
//!   when the spend happened, so they say which window it was spent in (if they straddle
//!   a window's end, it is not known, and nothing is given back).
//! - `Settle` charges what an item cost above what was spent, into debt if need be, now;
//!   and refunds at most what was spent (never fuller than full, at most the bucket's
//!   burst), and only into the calendar window it was spent in: nothing comes back for a
//!   window that has ended (nor in the last [`REFUND_MARGIN`] of it, when the refund
//!   could land in the next).
//! - Mark first, then apply: the claim makes the record *settled* atomically in the table
//!   before anything is charged or refunded, so a retry or a concurrent `Settle`, on any
//!   replica, finds it settled and applies nothing. When a step fails, the record is
//!   reopened (with what the steps before it applied folded into what was spent) only if
//!   the failure surely applied nothing (the request was refused before it reached the
//!   store's data: an open breaker, a backlog, a full table, an invalid item); a failure
//!   that may have been applied (a missed deadline, a lost connection) leaves it settled
//!   for good: the rest of that adjustment is lost rather than risk making it twice.

use std::sync::Arc;

use prost::Message;
use tonic::Status;

use super::convert::{decisions, item_specs, Use};
use super::facts::{facts_bytes, facts_of, is_hold, Spent};
use crate::clock::{CalendarPeriod, Nanos, SECOND};
use crate::gcra::{Mode, Window};
use crate::observe::metrics::Metrics;
use crate::proto::v1 as pb;
use crate::service::{
    BatchResult, CheckOptions, DecideError, Decider, ItemSpec, OnceSpend, Rule, MAX_BATCH,
};
use crate::store::shared::{Claim, Kept, Settlements};
use crate::store::{Once, StoreError};
use crate::text::{cut_bytes, printable};

/// The longest request id (bytes).
pub const MAX_REQUEST_ID: usize = 128;

/// The largest kept Check (its items, encoded): with `--settle-max-records` this bounds
/// the table's memory.
pub const MAX_RECORD: usize = 1024;

/// A refund to a calendar window is given only while its window has this long left: a
/// refund decided just before the window's end could land in the next one.
pub const REFUND_MARGIN: Nanos = SECOND;

/// What settles: the table, and the metrics that count it.
#[derive(Clone)]
pub struct Settler {
    pub(super) table: Arc<dyn Settlements>,
    pub(super) metrics: Arc<Metrics>,
}

fn counted(metrics: &Metrics, result: &str) {
    metrics.settlements.with_label_values(&[result]).inc();
}

fn store_failed(e: StoreError) -> Status {
    crate::service::store_unavailable(&e)
}

/// A request id as given: 1 to [`MAX_REQUEST_ID`] bytes of printable ASCII (no spaces),
/// so that it can be logged, keyed and shown as it is.
fn checked_id(field: &str, id: &str) -> Result<(), Status> {
    if id.is_empty() || id.len() > MAX_REQUEST_ID || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Status::invalid_argument(format!(
            "{field}: not 1 to {MAX_REQUEST_ID} bytes of printable ASCII"
        )));
    }
    Ok(())
}

/// The costs as the table keeps them (compared byte for byte on a retry).
fn costs_bytes(costs: &[u64]) -> Vec<u8> {
    costs.iter().flat_map(|c| c.to_le_bytes()).collect()
}

/// What an allowed Check wrote per item: its cost where the store spent it, else 0; with
/// each item's hold policy (`holds`: `Some(release)` for a limit that holds estimates).
fn spent_by(items: &[pb::Item], result: &BatchResult, holds: &[Option<bool>]) -> Vec<Spent> {
    items
        .iter()
        .zip(&result.items)
        .zip(holds.iter().chain(std::iter::repeat(&None)))
        .map(|((item, decided), &hold)| match decided.rule {
            Rule::Limited(limit) => {
                let written = decided.decision.allowed
                    && matches!(
                        decided.mode,
                        Mode::CheckAndSpend | Mode::SpendOnly | Mode::Charge
                    );
                Spent {
                    tokens: if written { item.cost.unwrap_or(1) } else { 0 },
                    period: match limit.window() {
                        Window::Calendar(period) => Some(period),
                        Window::Gcra | Window::Concurrency => None,
                    },
                    hold,
                }
            }
            _ => Spent {
                tokens: 0,
                period: None,
                hold: None,
            },
        })
        .collect()
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

/// One `Settle`'s adjustment of a claimed record.
struct Plan {
    items: Vec<pb::Item>,
    spent: Vec<Spent>,
    charges: Vec<pb::Item>,
    refunds: Vec<pb::Item>,
    /// The facts once the charges are made (what a reopened record holds).
    charged: Vec<Spent>,
}

/// The item as a plain spend of its bucket (a peek, or with a cost a refund).
fn plain(item: &pb::Item) -> pb::Item {
    pb::Item {
        cost: None,
        mode: pb::Mode::CheckAndSpend as i32,
        ..item.clone()
    }
}

impl Plan {
    fn new(items: Vec<pb::Item>, spent: Vec<Spent>, costs: &[u64], kept: &Kept) -> Plan {
        let mut charged = spent.clone();
        let (mut charges, mut refunds) = (Vec::new(), Vec::new());
        for ((item, s), (&actual, after)) in items
            .iter()
            .zip(&spent)
            .zip(costs.iter().zip(charged.iter_mut()))
        {
            if actual > s.tokens {
                charges.push(pb::Item {
                    cost: Some(actual - s.tokens),
                    mode: pb::Mode::Charge as i32,
                    ..item.clone()
                });
                after.tokens = actual;
            } else if actual < s.tokens && credited(s.period, kept) {
                refunds.push(pb::Item {
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
    pub fn new(table: Arc<dyn Settlements>, metrics: Arc<Metrics>) -> Settler {
        Settler { table, metrics }
    }

    /// A `Check` with a request id: kept pending under its id before it is decided (an id
    /// kept already is ALREADY_EXISTS, and nothing is decided), then decided with what it
    /// spent if it was allowed, or dropped.
    ///
    /// The Check runs to its end (kept, decided, its record decided or dropped) in a task
    /// of its own, whether or not its caller still waits: a caller's deadline shorter
    /// than the store's (Envoy's 20 ms RLS timeout under `--redis-timeout-ms`) would
    /// otherwise drop it between its spend and its record's decision, leaving the record
    /// pending for good and its estimate spent, never settled nor released.
    pub async fn check(
        &self,
        decider: &Arc<Decider>,
        request: &pb::CheckRequest,
        items: &[ItemSpec<'_>],
    ) -> Result<BatchResult, Status> {
        checked_id("request_id", &request.request_id)?;
        let table = decider.limits();
        let holds = super::holds::reservations(decider, &table, items)?;
        // Only the items that hold tokens make a hold, and count it against their keys.
        let holding = || holds.iter().flatten().filter(|h| h.holds);
        let hold = holding().map(|h| h.reservation.hold).min();
        // Each key once, with the first item of it.
        let mut keys: Vec<(String, usize)> = (holds.iter().enumerate())
            .filter_map(|(i, h)| {
                Some((h.as_ref().filter(|h| h.holds)?.key.as_str().to_string(), i))
            })
            .collect();
        keys.sort_unstable();
        keys.dedup_by(|a, b| a.0 == b.0);
        let releases: Vec<Option<bool>> = (holds.iter())
            .map(|h| h.as_ref().map(|h| h.reservation.release))
            .collect();
        let items: Vec<ItemSpec<'static>> =
            items.iter().cloned().map(ItemSpec::into_owned).collect();
        let once = self.once_for(decider, hold);
        let (settler, decider, request) = (self.clone(), decider.clone(), request.clone());
        let checked = tokio::spawn(async move {
            let held: Vec<(&str, usize)> = keys.iter().map(|(k, i)| (k.as_str(), *i)).collect();
            let id = settler.open(&request, hold, &held, once.as_ref()).await?;
            let options = CheckOptions {
                once: once.map(|once| OnceSpend {
                    once,
                    resolve: false,
                }),
                ..CheckOptions::default()
            };
            let result = decider.check_with(&table, &items, options).await;
            match (&result, once) {
                // Not known whether it spent: kept pending, and resolved.
                (Err(e @ DecideError::Store(store)), Some(once)) if store.may_have_applied() => {
                    let items = request.items.clone();
                    return Err(settler.unknown(decider, id, items, once, e));
                }
                _ => {
                    settler
                        .decided(id, &request.items, &releases, &result)
                        .await
                }
            }
            Ok::<_, Status>(result?)
        });
        checked
            .await
            .unwrap_or_else(|e| Err(Status::internal(format!("the Check's task ended: {e}"))))
    }

    /// Decides the kept record of `id` by its Check's `result`: with what it spent if it
    /// was allowed, else dropped.
    pub(super) async fn decided(
        &self,
        id: &str,
        items: &[pb::Item],
        releases: &[Option<bool>],
        result: &Result<BatchResult, DecideError>,
    ) {
        match result {
            Ok(r) if r.overall.allowed => {
                let facts = facts_bytes(&spent_by(items, r, releases));
                match self.table.decide(id, &facts).await {
                    Ok(_) => {}
                    // Left pending: it expires unsettled, and the estimate stands.
                    Err(e) => tracing::warn!(error = %e, "an allowed Check could not be kept"),
                }
            }
            // Denied, or failed: nothing to settle.
            _ => {
                if let Err(e) = self.table.forget(id).await {
                    tracing::warn!(error = %e, "a denied Check's request id could not be dropped");
                }
            }
        }
    }

    async fn open<'r>(
        &self,
        request: &'r pb::CheckRequest,
        hold: Option<Nanos>,
        held: &[(&str, usize)],
        once: Option<&Once>,
    ) -> Result<&'r str, Status> {
        let id = request.request_id.as_str();
        checked_id("request_id", id)?;
        let mut record = pb::CheckRequest {
            items: request.items.clone(),
            ..Default::default()
        };
        let size = record.encoded_len();
        if size > MAX_RECORD {
            return Err(Status::invalid_argument(format!(
                "request_id: the items take {size} bytes, more than the {MAX_RECORD} a kept Check may"
            )));
        }
        // The spend's token, for its resolution (see `unknown.rs`).
        // (32 hex digits, as `unknown.rs` reads it).
        record.request_id = once.map_or_else(String::new, |o| format!("{:032x}", o.token));
        let record = record.encode_to_vec();
        let keys: Vec<String> = held.iter().map(|&(key, _)| key.to_string()).collect();
        let opened = self
            .table
            .open(id, &record, hold, &keys)
            .await
            .map_err(store_failed)?;
        if let Some(at) = opened.crowded {
            counted(&self.metrics, "crowded");
            let i = held.get(at).map_or(0, |&(_, i)| i);
            let item = request.items.get(i).cloned().unwrap_or_default();
            return Err(Status::resource_exhausted(format!(
                "request_id {id:?}: items[{i}] ({} {}) has as many holds not yet settled as \
                 one bucket may keep, its share of the table of kept Checks \
                 (--settle-max-holds-per-key); nothing was spent: retry once some of them \
                 are settled or their hold ends",
                printable(cut_bytes(&item.name, 128)),
                printable(cut_bytes(&item.id, 128)),
            )));
        }
        if opened.full {
            counted(&self.metrics, "full");
            return Err(Status::resource_exhausted(format!(
                "request_id {id:?}: the table of kept Checks is full of holds not yet \
                 settled (--settle-max-records); none is pushed out, nothing was spent: \
                 retry once some are settled or their hold ends"
            )));
        }
        if opened.evicted > 0 {
            self.metrics
                .settlements
                .with_label_values(&["pushed_out"])
                .inc_by(opened.evicted);
        }
        if !opened.written {
            return Err(Status::already_exists(format!(
                "request_id {id:?} is kept already: a Check with it can be settled, not repeated"
            )));
        }
        Ok(id)
    }

    /// The largest estimate each item may hold (its limit's burst, or less under its
    /// reservation's `max_share`), whatever the items' costs: for callers that must deny
    /// a hold too large rather than refuse it as malformed (Envoy: an error there is
    /// `failure_mode_deny`'s to decide, and may let the request through unheld).
    pub fn largest_holds(
        &self,
        decider: &Decider,
        items: &[ItemSpec<'_>],
    ) -> Result<Vec<u64>, Status> {
        super::holds::largest_holds(decider, &decider.limits(), items)
    }

    /// `Settle`: claims the decided record, charges or refunds each item's difference, and
    /// answers the buckets as they then are.
    pub async fn settle(
        &self,
        decider: &Decider,
        request: &pb::SettleRequest,
    ) -> Result<pb::SettleResponse, Status> {
        let id = request.request_id.as_str();
        checked_id("request_id", id)?;
        if request.costs.is_empty() || request.costs.len() > MAX_BATCH {
            return Err(Status::invalid_argument(format!(
                "costs: {} given, 1 to {MAX_BATCH} (one per item of the Check)",
                request.costs.len()
            )));
        }
        let costs = costs_bytes(&request.costs);
        match self.table.claim(id, &costs).await.map_err(store_failed)? {
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
            Claim::Settled { costs: before, .. } if before != costs => {
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
                let adjusted = self.adjust(decider, id, &kept, &request.costs, true).await;
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
    /// `settling`: for a `Settle` (else for a hold's release). On a failure the record
    /// stays settled: the caller reopens it with [`Undone::reopen`]'s facts, if any.
    pub(super) async fn adjust(
        &self,
        decider: &Decider,
        id: &str,
        kept: &Kept,
        costs: &[u64],
        settling: bool,
    ) -> Result<Vec<pb::Item>, Undone> {
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
        let plan = Plan::new(items, spent, costs, kept);
        let specs = item_specs(&plan.charges, Use::Check)
            .and_then(|charges| Ok((charges, item_specs(&plan.refunds, Use::Refund)?)));
        let (charges, mut refunds) = specs.map_err(lasting)?;
        if !charges.is_empty() {
            if let Err(e) = decider.check(&charges).await {
                return Err(self.failed(id, e, &facts_bytes(&plan.spent), settling));
            }
        }
        if !refunds.is_empty() {
            let refunded = match capped(decider, &mut refunds) {
                Ok(()) => decider.refund(&refunds).await,
                Err(e) => Err(e),
            };
            if let Err(e) = refunded {
                return Err(self.failed(id, e, &facts_bytes(&plan.charged), settling));
            }
        }
        Ok(plan.items)
    }

    /// A step failed: the record may be reopened with `facts` if the failure surely
    /// applied nothing, else it stays settled for good.
    /// `settling`: a `Settle`'s (counted as settled), not a release's.
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

/// A record's items and what each spent.
pub(super) fn read(kept: &Kept) -> Result<(Vec<pb::Item>, Vec<Spent>), Status> {
    let check = pb::CheckRequest::decode(kept.check.as_slice());
    match (check, facts_of(&kept.facts)) {
        (Ok(check), Some(spent)) if check.items.len() == spent.len() => Ok((check.items, spent)),
        _ => Err(Status::internal("a kept Check could not be read")),
    }
}

/// The items' buckets as they are now.
async fn peek(
    decider: &Decider,
    items: &[pb::Item],
    already_settled: bool,
) -> Result<pb::SettleResponse, Status> {
    let peeks: Vec<pb::Item> = items.iter().map(plain).collect();
    let result = decider.inspect(&item_specs(&peeks, Use::Admin)?).await?;
    Ok(pb::SettleResponse {
        items: decisions(&result).1,
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
