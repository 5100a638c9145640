//! Reservations: a native `Check` with a `request_id` on limits with a reservation policy
//! (`reservation:` in `defaults.yaml`) holds its estimate until its `Settle`, at most the
//! policy's `hold` (a record with several items: the earliest among them); one estimate
//! may take at most `max_share` of the limit's burst. What becomes of a hold not settled
//! in time: `release.rs`.
//!
//! Only an item that spends holds something: one at cost 0 or `MODE_CHECK_ONLY` holds
//! nothing, so a `Check` whose items all are such is no hold (it is kept as a `Check`
//! on a limit with no reservation is, and may be pushed out); and each live hold counts
//! against the bucket keys of the items that hold (`--settle-max-holds-per-key`), so
//! that a hold costs its tenant at least a token and its share of the table.

use tonic::Status;

use crate::service::{CheckOptions, Decider, ItemSpec, Rule};
use cellrate_core::gcra::Mode;
use cellrate_core::text::{cut_bytes, printable};
use cellrate_limits::config::{LimitTable, Reservation};

/// An item of a limit with a reservation policy.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) reservation: Reservation,
    /// Its bucket key, which the hold counts against when the item holds tokens.
    pub(super) key: String,
    /// Whether it holds tokens: it spends an estimate above 0.
    pub(super) holds: bool,
}

/// Each item's reservation policy (`None`: its limit has none), or INVALID_ARGUMENT for
/// an estimate over its limit's share.
pub(super) fn reservations(
    decider: &Decider,
    table: &LimitTable,
    items: &[ItemSpec<'_>],
) -> Result<Vec<Option<Held>>, Status> {
    let resolved = decider.resolve(table, items, CheckOptions::default())?;
    let mut holds = Vec::with_capacity(resolved.len());
    for (i, r) in resolved.iter().enumerate() {
        let (Rule::Limited(limit), Some(name)) = (r.rule, table.names().get(&r.name)) else {
            holds.push(None);
            continue;
        };
        let Some(reservation) = table.reservation(name) else {
            holds.push(None);
            continue;
        };
        let cap = reservation.cap(limit.burst());
        let spends = matches!(r.mode, Mode::CheckAndSpend | Mode::SpendOnly | Mode::Charge);
        if r.cost > cap && spends {
            return Err(Status::invalid_argument(format!(
                "items[{i}] ({} {}): an estimate of {} tokens is over the {cap} one hold \
                 may take (reservation.max_share {} of burst {}); nothing was spent",
                r.name,
                printable(cut_bytes(r.key.parts().1, 128)),
                r.cost,
                reservation.max_share(),
                limit.burst()
            )));
        }
        holds.push(Some(Held {
            reservation,
            key: r.key.as_str().to_string(),
            holds: spends && r.cost > 0,
        }));
    }
    Ok(holds)
}

/// The largest estimate each item may hold: its limit's burst, or its reservation's
/// `max_share` of it (`u64::MAX` for an item that is unlimited or not configured). The
/// items' own costs are not looked at.
pub(super) fn largest_holds(
    decider: &Decider,
    table: &LimitTable,
    items: &[ItemSpec<'_>],
) -> Result<Vec<u64>, Status> {
    let probes: Vec<ItemSpec<'_>> = (items.iter())
        .map(|item| ItemSpec {
            cost: Some(0),
            ..item.clone()
        })
        .collect();
    let resolved = decider.resolve(table, &probes, CheckOptions::default())?;
    Ok(resolved
        .iter()
        .map(|r| match r.rule {
            Rule::Limited(limit) => {
                let reservation = (table.names().get(&r.name)).and_then(|n| table.reservation(n));
                reservation.map_or(limit.burst(), |res| res.cap(limit.burst()))
            }
            _ => u64::MAX,
        })
        .collect())
}
