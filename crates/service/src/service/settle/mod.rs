//! Settlements, the domain room below the front ends: a `Check` made with a request id
//! (the native API's `request_id`, or an Envoy `reserve` rule's hold) is kept in a bounded
//! table ([`Settlements`]: in memory, or in Redis for every replica), and a settle adjusts
//! it once to the costs the items actually had. The front ends call [`Settler`] in domain
//! terms (a request id, [`ItemSpec`]s, costs; a [`BatchResult`] or [`Settled`] back) and
//! convert their own messages; none imports another (`tests/it/structure.rs`).
//!
//! The room: this file (a Check kept, decided or dropped), `adjust.rs` (a settle: the
//! record claimed, charged or refunded), `record.rs` (the kept Check's versioned format),
//! `facts.rs` (what it spent), `holds.rs` (reservation policies at Check), `anonymous.rs`
//! (holds taken without a request id, settled oldest first), `release.rs`
//! (holds not settled in time, the sweeper's work), `unknown.rs` (kept Checks whose spend
//! is unknown, resolved).
//!
//! The promise: **counted once, never more back than was spent.**
//!
//! - One record per Check, of what was actually written, in the window it was written.
//!   The record is *pending* while its Check is decided (a settle then is UNAVAILABLE
//!   and changes nothing). Once the Check is allowed, the record is *decided* with, per
//!   item, the tokens the store wrote (0 for an item not written: a spend-only item that
//!   did not fit, an unlimited or unconfigured rule, a check-only item, a cost of 0) and,
//!   for a calendar limit, its period; the table's times of opening and deciding bound
//!   when the spend happened, so they say which window it was spent in (if they straddle
//!   a window's end, it is not known, and nothing is given back).
//! - A settle charges what an item cost above what was spent, into debt if need be, now;
//!   and refunds at most what was spent (never fuller than full, at most the bucket's
//!   burst), and only into the calendar window it was spent in: nothing comes back for a
//!   window that has ended (nor in the last [`REFUND_MARGIN`] of it, when the refund
//!   could land in the next).
//! - Mark first, then apply: the claim makes the record *settled* atomically in the table
//!   before anything is charged or refunded, so a retry or a concurrent settle, on any
//!   replica, finds it settled and applies nothing. When a step fails, the record is
//!   reopened (with what the steps before it applied folded into what was spent) only if
//!   the failure surely applied nothing (the request was refused before it reached the
//!   store's data: an open breaker, a backlog, a full table, an invalid item); a failure
//!   that may have been applied (a missed deadline, a lost connection) leaves it settled
//!   for good: the rest of that adjustment is lost rather than risk making it twice.
//!
//! Errors are `tonic::Status`es, as the [`Decider`]'s are, with the native API's field
//! names (`request_id`, `costs`, `items[i]`): the Envoy front end says them of its
//! reservation's descriptor.

mod adjust;
mod anonymous;
mod facts;
mod holds;
mod record;
pub mod release;
mod unknown;

use std::sync::Arc;

use tonic::Status;

use crate::service::{
    BatchResult, CheckOptions, DecideError, Decider, ItemSpec, OnceSpend, Rule, Target,
};
pub use adjust::{Settled, REFUND_MARGIN};
pub use anonymous::{AnonymousHold, HeldCheck};
use cellrate_core::clock::Nanos;
use cellrate_core::gcra::{Mode, Window};
use cellrate_core::text::{cut_bytes, printable};
use cellrate_observe::metrics::Metrics;
use cellrate_store::shared::Settlements;
use cellrate_store::{Once, StoreError};
use facts::{facts_bytes, Spent};
use record::{items_bytes, record_bytes};
pub use release::Released;

/// The longest request id (bytes).
pub const MAX_REQUEST_ID: usize = 128;

/// The largest kept Check (its items, as `record.rs` encodes them): with
/// `--settle-max-records` this bounds the table's memory.
pub const MAX_RECORD: usize = 1024;

/// The prefix of the request ids Envoy's reservations are kept under
/// (`service::envoy`): a native `Check` or `Settle` with one is refused.
pub const ENVOY_REQUEST_IDS: &str = "envoy:";

/// What settles: the table, and the metrics that count it.
#[derive(Clone)]
pub struct Settler {
    table: Arc<dyn Settlements>,
    metrics: Arc<Metrics>,
}

fn counted(metrics: &Metrics, result: &str) {
    metrics.settlements.with_label_values(&[result]).inc();
}

fn counted_anonymous(metrics: &Metrics, event: &str) {
    metrics.anonymous_holds.with_label_values(&[event]).inc();
}

fn store_failed(e: StoreError) -> Status {
    crate::service::store_unavailable(&e)
}

/// A request id as given: 1 to [`MAX_REQUEST_ID`] bytes of printable ASCII (no spaces),
/// so that it can be logged, keyed and shown as it is.
fn checked_id(field: &str, id: &str) -> Result<(), Status> {
    if !cellrate_core::text::is_plain_id(id, MAX_REQUEST_ID) {
        return Err(Status::invalid_argument(format!(
            "{field}: not 1 to {MAX_REQUEST_ID} bytes of printable ASCII"
        )));
    }
    Ok(())
}

/// What an allowed Check wrote per item: its cost where the store spent it, else 0; with
/// each item's hold policy (`holds`: `Some(release)` for a limit that holds estimates).
fn spent_by(items: &[ItemSpec<'_>], result: &BatchResult, holds: &[Option<bool>]) -> Vec<Spent> {
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

/// An item's name and id as the native API gives them (an inline item has neither).
fn named<'a>(item: &'a ItemSpec<'_>) -> (&'a str, &'a str) {
    match &item.target {
        Target::Named { name, id } => (name, id),
        _ => ("", ""),
    }
}

impl Settler {
    pub fn new(table: Arc<dyn Settlements>, metrics: Arc<Metrics>) -> Settler {
        Settler { table, metrics }
    }

    /// A `Check` with request id `id`: kept pending under its id before it is decided (an
    /// id kept already is ALREADY_EXISTS, and nothing is decided), then decided with what
    /// it spent if it was allowed, or dropped.
    ///
    /// The Check runs to its end (kept, decided, its record decided or dropped) in a task
    /// of its own, whether or not its caller still waits: a caller's deadline shorter
    /// than the store's (Envoy's 20 ms RLS timeout under `--redis-timeout-ms`) would
    /// otherwise drop it between its spend and its record's decision, leaving the record
    /// pending for good and its estimate spent, never settled nor released.
    pub async fn check(
        &self,
        decider: &Arc<Decider>,
        id: &str,
        items: &[ItemSpec<'_>],
    ) -> Result<BatchResult, Status> {
        checked_id("request_id", id)?;
        let table = decider.limits();
        let holds = holds::reservations(decider, &table, items)?;
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
        let (settler, decider, id) = (self.clone(), decider.clone(), id.to_string());
        let checked = tokio::spawn(async move {
            let held: Vec<(&str, usize)> = keys.iter().map(|(k, i)| (k.as_str(), *i)).collect();
            settler
                .open(&id, &items, hold, &held, once.as_ref())
                .await?;
            let options = CheckOptions {
                once: once.map(|once| OnceSpend {
                    once,
                    resolve: false,
                }),
                holds: hold.is_some(),
                ..CheckOptions::default()
            };
            let result = decider.check_with(&table, &items, options).await;
            match (&result, once) {
                // Not known whether it spent: kept pending, and resolved.
                (Err(e @ DecideError::Store(store)), Some(once)) if store.may_have_applied() => {
                    return Err(settler.unknown(decider, &id, items, once, e));
                }
                _ => settler.decided(&id, &items, &releases, &result).await,
            }
            Ok::<_, Status>(result?)
        });
        checked
            .await
            .unwrap_or_else(|e| Err(Status::internal(format!("the Check's task ended: {e}"))))
    }

    /// Decides the kept record of `id` by its Check's `result`: with what it spent if it
    /// was allowed, else dropped.
    async fn decided(
        &self,
        id: &str,
        items: &[ItemSpec<'_>],
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

    /// Keeps the Check of `id` pending: its `items`, and the token `once` its spend is
    /// made under (see `unknown.rs`).
    async fn open(
        &self,
        id: &str,
        items: &[ItemSpec<'_>],
        hold: Option<Nanos>,
        held: &[(&str, usize)],
        once: Option<&Once>,
    ) -> Result<(), Status> {
        checked_id("request_id", id)?;
        let Some(kept) = items_bytes(items) else {
            return Err(Status::internal(
                "a kept Check names configured or inline limits only",
            ));
        };
        let size = kept.len();
        if size > MAX_RECORD {
            return Err(Status::invalid_argument(format!(
                "request_id: the items take {size} bytes, more than the {MAX_RECORD} a kept Check may"
            )));
        }
        let record = record_bytes(items.len(), &kept, once.map(|o| o.token));
        let keys: Vec<String> = held.iter().map(|&(key, _)| key.to_string()).collect();
        let opened = self
            .table
            .open(id, &record, hold, &keys)
            .await
            .map_err(store_failed)?;
        if let Some(at) = opened.crowded {
            counted(&self.metrics, "crowded");
            let i = held.get(at).map_or(0, |&(_, i)| i);
            let (name, item_id) = items.get(i).map_or(("", ""), named);
            return Err(Status::resource_exhausted(format!(
                "request_id {id:?}: items[{i}] ({} {}) has as many holds not yet settled as \
                 one bucket may keep, its share of the table of kept Checks \
                 (--settle-max-holds-per-key); nothing was spent: retry once some of them \
                 are settled or their hold ends",
                printable(cut_bytes(name, 128)),
                printable(cut_bytes(item_id, 128)),
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
        Ok(())
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
        holds::largest_holds(decider, &decider.limits(), items)
    }
}
