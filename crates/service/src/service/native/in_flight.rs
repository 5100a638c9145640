//! Admin `Top` with `in_flight`: per concurrency limit name, the ids holding the most leases
//! now (docs/concurrency.md, "What operators see"), from the store's leases.
//!
//! The store counts shard by shard, each shard's lock held only while its own leases are
//! counted; the count runs on a blocking thread, not on the runtime's, and one at a time
//! (`gate`), so that admin calls cannot add up to a stall of the decisions.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tonic::Status;

use super::convert::invalid;
use crate::proto::v1 as pb;
use crate::service::Decider;
use cellrate_limits::names::INLINE_NUMBER;
use cellrate_store::InFlightName;

/// The name under which leases of caller-given (inline) concurrency limits are listed.
pub(super) const INLINE: &str = "(inline)";

/// Answers a `Top` request with `in_flight` set: `limit` ids per name (1 to 32, 0 means
/// 10, as for denials), of `name` only if not empty.
pub(super) async fn top_in_flight(
    decider: &Decider,
    gate: &Arc<Semaphore>,
    request: &pb::TopRequest,
) -> Result<pb::TopResponse, Status> {
    if request.minutes != 0 {
        return Err(invalid(format!(
            "minutes: {} is not used with in_flight (leases held now); leave it 0",
            request.minutes
        )));
    }
    let (_, limit, _) = super::top_request(request)?;
    let table = decider.limits();
    let only = super::only_name(&table, &request.name)?;
    // The turn goes with the count: a caller that gives up does not free it early.
    let turn = Arc::clone(gate)
        .acquire_owned()
        .await
        .map_err(|_| Status::unavailable("the server is stopping"))?;
    let store = Arc::clone(decider.store());
    let names = tokio::task::spawn_blocking(move || {
        let names = store.in_flight(limit, only);
        drop(turn);
        names
    })
    .await
    .map_err(|e| Status::internal(format!("in-flight count failed: {e}")))?
    .ok_or_else(|| {
        Status::unimplemented(
            "in_flight: this server's store cannot list the keys holding leases (only \
                 the memory store keeps them in a form it can scan; on Redis, admin Inspect \
                 reads one key's)",
        )
    })?;
    let in_flight = names.into_iter().map(|name| answer(&table, name)).collect();
    Ok(pb::TopResponse {
        names: Vec::new(),
        minutes: 0,
        in_flight,
    })
}

/// One name's answer, named by the limits in force.
fn answer(table: &cellrate_limits::config::LimitTable, name: InFlightName) -> pb::TopInFlightName {
    let text = match table.names().by_number(name.number) {
        Some(found) => found.text.to_string(),
        None if name.number == INLINE_NUMBER => INLINE.to_string(),
        // A name a reload removed, whose leases are still held.
        None => format!("#{}", name.number),
    };
    pb::TopInFlightName {
        name: text,
        leases: name.leases,
        ids: name
            .keys
            .into_iter()
            .map(|key| pb::TopInFlightId {
                id: key.key.parts().1.to_string(),
                leases: key.leases,
                count: key.count,
            })
            .collect(),
    }
}
