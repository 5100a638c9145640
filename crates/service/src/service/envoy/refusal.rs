//! What cannot be decided as it came, on Envoy's path: a descriptor that a client's
//! request makes malformed is decided by its domain's `invalid_id` policy (denied by
//! default, unmatched, or INVALID_ARGUMENT under `reject`), never by failing the call,
//! since Envoy's default (`failure_mode_deny: false`) lets an errored request through
//! with every descriptor skipped. Only the request's own bounds (which Envoy's
//! configuration sets) and a failure of the service are errors (RELIABILITY.md,
//! "Fail-open audit").

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Status;

use super::batch::{Batch, Item};
use super::{invalid, MAX_DESCRIPTORS, MAX_DOMAIN, MAX_ENTRIES, MAX_ENTRY_KEY};
use crate::service::request::RatelimitTarget;
use crate::service::{store_unavailable, DecideError, InvalidIds, ItemSpec, Target, MAX_BATCH};
use cellrate_core::gcra::Mode;
use cellrate_limits::config::LimitTable;

/// Why a request was not decided as it came.
#[derive(Debug)]
pub(super) enum Refusal {
    /// Descriptor `d` cannot be decided as it came (an entry, a lease or request id, a
    /// cost or a `limit` its limit cannot take; `name`: the limit it maps to, if known).
    /// Decided by the domain's `invalid_id` policy: denied (the default), unmatched, or
    /// INVALID_ARGUMENT with `message` (`reject`) - never an error unless asked for, since
    /// Envoy's default lets an errored request through with every descriptor skipped.
    Descriptor {
        d: usize,
        name: Arc<str>,
        message: String,
    },
    /// The request as a whole: its bounds (the operator's configuration sets them), or a
    /// store failure.
    Request(Status),
}

impl From<Status> for Refusal {
    fn from(status: Status) -> Refusal {
        Refusal::Request(status)
    }
}

/// Descriptor `d` cannot be decided as it came (an unnamed limit): `message` names where.
pub(super) fn malformed(d: usize, message: String) -> Refusal {
    Refusal::Descriptor {
        d,
        name: Arc::from(""),
        message,
    }
}

/// A decision's error in Envoy's terms: an invalid item makes its descriptor malformed
/// (an id is built from the descriptor's entries), named in the message as the field it
/// came from; a store failure is UNAVAILABLE.
pub(super) fn envoy_error(e: DecideError, items: &[Item<'_>]) -> Refusal {
    match e {
        DecideError::Invalid(e) => match e.item {
            Some(i) => {
                let field = match e.field {
                    ".id" | ".lease_id" => ".entries",
                    ".cost" => ".hits_addend",
                    // A concurrency limit reached without a lease entry, or the reverse.
                    ".mode" => "",
                    field => field,
                };
                let message = match e.field {
                    ".mode" => format!(
                        "{} (map a concurrency limit by a descriptors.yaml rule that names \
                         its lease entry)",
                        e.message
                    ),
                    _ => e.message,
                };
                let name = items
                    .get(i)
                    .map_or_else(|| Arc::from(""), |i| target_name(&i.spec));
                let d = items.get(i).map_or(0, |i| i.d);
                Refusal::Descriptor {
                    d,
                    name,
                    message: format!("descriptors[{d}]{field}: {message}"),
                }
            }
            // The batch as a whole (more items than a batch takes: descriptors that the
            // client's headers add, each mapped to several limits): a descriptor past the
            // bound (else the last one) cannot be decided; one marked so already is one
            // item, and is passed over.
            None => match (MAX_BATCH..items.len())
                .chain((0..items.len().min(MAX_BATCH)).rev())
                .find(|&i| !matches!(items[i].spec.target, Target::Malformed { .. }))
                .map(|i| items[i].d)
            {
                Some(d) => Refusal::Descriptor {
                    d,
                    name: Arc::from(""),
                    message: format!("descriptors: {}", e.message),
                },
                None => Refusal::Request(invalid(format!("descriptors: {}", e.message))),
            },
        },
        DecideError::Store(e) => Refusal::Request(store_unavailable(&e)),
    }
}

/// Adds an item for each descriptor in `malformed` under the domain's `invalid_id`
/// policy: `deny`, an invalid id of the limit it maps to (the request denied, nothing
/// spent); `ignore`, nothing (unmatched). `reject` never gets here: it refuses the request.
pub(super) fn add_malformed(
    table: &LimitTable,
    domain: &str,
    malformed: &[(usize, Arc<str>)],
    batch: &mut Batch<'_>,
) {
    if malformed.is_empty() {
        return;
    }
    let deny = table.descriptors().invalid_ids(domain) == InvalidIds::Deny;
    for (d, name) in malformed {
        if !deny {
            batch.unmatched += 1;
            continue;
        }
        // In descriptor order, as the answer reads each descriptor's run of items (a
        // malformed descriptor before the others must answer its own denial).
        let at = batch.items.partition_point(|item| item.d <= *d);
        let spec = ItemSpec {
            target: Target::Malformed { name: name.clone() },
            cost: Some(1),
            mode: Mode::CheckAndSpend,
            limit: None,
            lease: None,
        };
        batch.items.insert(at, Item::of(*d, spec));
    }
}

/// The request's own bounds: a domain, at least one descriptor, and not too many.
pub(super) fn check_request(request: &RateLimitRequest) -> Result<(), Status> {
    if request.domain.is_empty() {
        return Err(invalid("domain: empty".to_string()));
    }
    if request.descriptors.is_empty() {
        return Err(invalid("descriptors: empty".to_string()));
    }
    if request.domain.len() > MAX_DOMAIN {
        return Err(invalid(format!("domain: longer than {MAX_DOMAIN} bytes")));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(invalid(format!(
            "descriptors: {} descriptors, at most {MAX_DESCRIPTORS}",
            request.descriptors.len()
        )));
    }
    Ok(())
}

/// A descriptor's bounds: entries and keys (values over their bound stand for themselves,
/// [`stand_in_long_values`]).
pub(super) fn check_descriptor(d: usize, descriptor: &RateLimitDescriptor) -> Result<(), Refusal> {
    if descriptor.entries.is_empty() {
        return Err(malformed(d, format!("descriptors[{d}].entries: empty")));
    }
    if descriptor.entries.len() > MAX_ENTRIES {
        return Err(malformed(
            d,
            format!(
                "descriptors[{d}].entries: {} entries, at most {MAX_ENTRIES}",
                descriptor.entries.len()
            ),
        ));
    }
    if let Some(e) = descriptor.entries.iter().position(|e| e.key.is_empty()) {
        return Err(malformed(
            d,
            format!("descriptors[{d}].entries[{e}].key: empty"),
        ));
    }
    if let Some(e) = (descriptor.entries.iter()).position(|e| e.key.len() > MAX_ENTRY_KEY) {
        return Err(malformed(
            d,
            format!("descriptors[{d}].entries[{e}].key: longer than {MAX_ENTRY_KEY} bytes"),
        ));
    }
    Ok(())
}

/// The limit an item names, for a malformed descriptor's answer (empty when none).
pub(super) fn target_name(item: &ItemSpec<'_>) -> Arc<str> {
    match &item.target {
        Target::Named { name, .. } => Arc::from(name.as_ref()),
        Target::Ratelimit(RatelimitTarget { name, .. }) | Target::Malformed { name } => {
            name.clone()
        }
        _ => Arc::from(""),
    }
}
