//! Settlements: a native `Check` made with a `request_id` is kept (its items, as the caller
//! sent them) in a bounded table ([`Settlements`]: in memory, or in Redis for every
//! replica), and `Settle` adjusts it once to the costs the items actually had. For each
//! item the difference to what the Check spent is charged (into debt if need be) or
//! refunded (never fuller than full, a refund capped at the bucket's burst). The claim is
//! atomic in the table, so a retried or concurrent `Settle` counts once; one that cannot
//! be applied (the store failed) is opened again for the retry.

use std::sync::Arc;

use prost::Message;
use tonic::Status;

use super::native::{decisions, item_specs, Use};
use super::{CheckOptions, Decider, ItemSpec, Rule, MAX_BATCH};
use crate::observe::metrics::Metrics;
use crate::proto::v1 as pb;
use crate::store::shared::{Claim, Settlements};
use crate::store::StoreError;

/// The longest request id (bytes).
pub const MAX_REQUEST_ID: usize = 128;

/// The largest kept Check (its items, encoded): with `--settle-max-records` this bounds
/// the table's memory.
pub const MAX_RECORD: usize = 1024;

/// What settles: the table, and the metrics that count it.
pub struct Settler {
    table: Arc<dyn Settlements>,
    metrics: Arc<Metrics>,
}

fn counted(metrics: &Metrics, result: &str) {
    metrics.settlements.with_label_values(&[result]).inc();
}

fn store_failed(e: StoreError) -> Status {
    super::store_unavailable(&e)
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

/// What a Check item spent when it was allowed: its cost, unless it only checked.
fn spent(item: &pb::Item) -> u64 {
    if item.mode == pb::Mode::CheckOnly as i32 {
        0
    } else {
        item.cost.unwrap_or(1)
    }
}

/// The costs as the table keeps them (compared byte for byte on a retry).
fn costs_bytes(costs: &[u64]) -> Vec<u8> {
    costs.iter().flat_map(|c| c.to_le_bytes()).collect()
}

impl Settler {
    pub fn new(table: Arc<dyn Settlements>, metrics: Arc<Metrics>) -> Settler {
        Settler { table, metrics }
    }

    /// Keeps `request` under its id before it is decided (an id kept already is
    /// ALREADY_EXISTS, and nothing is decided). Returns the id to [`Settler::close`].
    pub async fn open<'r>(&self, request: &'r pb::CheckRequest) -> Result<&'r str, Status> {
        let id = request.request_id.as_str();
        checked_id("request_id", id)?;
        let record = pb::CheckRequest {
            items: request.items.clone(),
            request_id: String::new(),
        }
        .encode_to_vec();
        if record.len() > MAX_RECORD {
            return Err(Status::invalid_argument(format!(
                "request_id: the items take {} bytes, more than the {MAX_RECORD} a kept Check may",
                record.len()
            )));
        }
        let opened = self.table.open(id, &record).await.map_err(store_failed)?;
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

    /// After the Check: a denied or failed one is not kept (there is nothing to settle).
    pub async fn close(&self, id: &str, allowed: bool) {
        if !allowed {
            if let Err(e) = self.table.forget(id).await {
                tracing::warn!(error = %e, "a denied Check's request id could not be dropped");
            }
        }
    }

    /// `Settle`: claims the kept Check, charges or refunds each item's difference, and
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
        let (record, already_settled) = match self.table.claim(id, &costs).await {
            Err(e) => return Err(store_failed(e)),
            Ok(Claim::Unknown) => {
                counted(&self.metrics, "unknown");
                return Err(Status::not_found(format!(
                    "request_id {id:?} is unknown: no allowed Check kept it, or it expired \
                     (--settle-window) or was pushed out (--settle-max-records)"
                )));
            }
            Ok(Claim::Settled { costs: before, .. }) if before != costs => {
                counted(&self.metrics, "conflict");
                return Err(Status::failed_precondition(format!(
                    "request_id {id:?} was settled already, at other costs"
                )));
            }
            Ok(Claim::Settled { record, .. }) => (record, true),
            Ok(Claim::Claimed(record)) => (record, false),
        };
        let answer = self.apply(decider, &record, request, already_settled).await;
        match &answer {
            Err(_) if !already_settled => {
                // Not applied: the retry may settle it.
                if let Err(e) = self.table.unclaim(id).await {
                    tracing::warn!(error = %e, "a settlement not applied could not be reopened");
                }
            }
            Err(_) => {}
            Ok(_) => counted(
                &self.metrics,
                if already_settled {
                    "retried"
                } else {
                    "settled"
                },
            ),
        }
        answer
    }

    async fn apply(
        &self,
        decider: &Decider,
        record: &[u8],
        request: &pb::SettleRequest,
        already_settled: bool,
    ) -> Result<pb::SettleResponse, Status> {
        let kept = pb::CheckRequest::decode(record)
            .map_err(|_| Status::internal("a kept Check could not be read"))?;
        if kept.items.len() != request.costs.len() {
            return Err(Status::invalid_argument(format!(
                "costs: {} given, the Check had {} items",
                request.costs.len(),
                kept.items.len()
            )));
        }
        let plain = |item: &pb::Item| pb::Item {
            cost: None,
            mode: pb::Mode::CheckAndSpend as i32,
            ..item.clone()
        };
        if !already_settled {
            let mut charges = Vec::new();
            let mut refunds = Vec::new();
            for (item, &actual) in kept.items.iter().zip(&request.costs) {
                let before = spent(item);
                if actual > before {
                    charges.push(pb::Item {
                        cost: Some(actual - before),
                        mode: pb::Mode::Charge as i32,
                        ..item.clone()
                    });
                } else if actual < before {
                    refunds.push(pb::Item {
                        cost: Some(before - actual),
                        ..plain(item)
                    });
                }
            }
            if !charges.is_empty() {
                decider.check(&item_specs(&charges, Use::Check)?).await?;
            }
            if !refunds.is_empty() {
                let mut specs = item_specs(&refunds, Use::Refund)?;
                capped(decider, &mut specs)?;
                decider.refund(&specs).await?;
            }
        }
        let peeks: Vec<pb::Item> = kept.items.iter().map(plain).collect();
        let result = decider.inspect(&item_specs(&peeks, Use::Admin)?).await?;
        Ok(pb::SettleResponse {
            items: decisions(&result).1,
            already_settled,
        })
    }
}

/// A refund gives back at most a full bucket: a larger one is cut to the bucket's burst
/// (which a plain `Refund` refuses as a mistake).
fn capped(decider: &Decider, specs: &mut [ItemSpec<'_>]) -> Result<(), Status> {
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
