//! A slot group's items as the script reads them ([`Wire`]): each item's increment and
//! burst offset (a calendar window's cost and count in tokens, a lease key's hold and
//! count), its mode and its lease id.

use super::leases;
use super::wire::{Wire, WireMode};
use crate::StoreItem;
use cellrate_core::clock::Nanos;
use cellrate_core::gcra::{Mode, Window};

/// One slot group's items as the script reads them (`refused`: per item, an acquire
/// sent with a count of 0, see [`super::lease_keys`]).
pub(super) fn wires(
    items: &[StoreItem],
    keys: &[String],
    members: &[usize],
    now: Nanos,
    refused: &[bool],
) -> Vec<Wire> {
    members
        .iter()
        .map(|&i| {
            let item = &items[i];
            // A calendar item carries its cost and count in tokens, and its
            // window in the mode (see batch.lua).
            // A lease key carries its hold and count.
            let (increment, burst_offset) = match item.limit.window() {
                Window::Gcra => (increment_nanos(item), item.limit.burst_offset()),
                Window::Calendar(_) => (
                    i64::try_from(item.cost).unwrap_or(i64::MAX),
                    item.limit.burst() as i64,
                ),
                Window::Concurrency if refused[i] => (item.limit.period(), 0),
                Window::Concurrency => (item.limit.period(), item.limit.count() as i64),
            };
            // Sent only when it is not the default the script assumes.
            let most_used = match item.limit.most_used() {
                Some(most) if most != 2 * item.limit.count() => most as i64,
                _ => 0,
            };
            let lease = leases::lease_id(item).cloned();
            // Without an id an acquire or release only reads its key.
            let mode = match lease {
                None if leases::is_lease(item) => Mode::Probe,
                _ => item.mode,
            };
            Wire {
                key: keys[i].clone(),
                increment,
                burst_offset,
                most_used,
                mode: WireMode::new(mode, item.limit.window(), now),
                lease,
            }
        })
        .collect()
}

/// What spending `item` adds to its bucket's TAT: the emission interval times the cost.
pub(super) fn increment_nanos(item: &StoreItem) -> i64 {
    item.limit
        .emission_interval()
        .saturating_mul(i64::try_from(item.cost).unwrap_or(i64::MAX))
}
