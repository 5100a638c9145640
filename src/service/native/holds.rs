//! Reservations: a native `Check` with a `request_id` on limits with a reservation policy
//! (`reservation:` in `defaults.yaml`) holds its estimate until its `Settle`, at most the
//! policy's `hold`; one estimate may take at most `max_share` of the limit's burst. A hold
//! not settled in time is claimed by [`Settler::release_due`] (on any replica: the table
//! claims each once) and given back per item whose policy is `unsettled: release`, as a
//! `Settle` at cost 0 would give it back; an item whose policy is `keep` (or that has no
//! policy) stands. A record with several items is due at the earliest hold among them.

use tonic::Status;

use super::settle::{facts_of, Settler};
use crate::gcra::Mode;
use crate::limits::config::{LimitTable, Reservation};
use crate::service::{CheckOptions, Decider, ItemSpec, Rule};
use crate::store::shared::Kept;
use crate::store::StoreError;
use crate::text::{cut_bytes, printable};

/// Due holds claimed per table call.
const RELEASE_BATCH: usize = 256;

/// Table calls per [`Settler::release_due`], at most.
const RELEASE_CALLS: usize = 64;

/// What one [`Settler::release_due`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Holds given back (at least one item released).
    pub released: u64,
    /// Holds whose estimates stand.
    pub kept: u64,
    /// Holds whose release failed (surely not applied: claimed again at the next call).
    pub failed: u64,
}

/// Each item's reservation policy (`None`: its limit has none), or INVALID_ARGUMENT for
/// an estimate over its limit's share.
pub(super) fn reservations(
    decider: &Decider,
    table: &LimitTable,
    items: &[ItemSpec<'_>],
) -> Result<Vec<Option<Reservation>>, Status> {
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
        holds.push(Some(reservation));
    }
    Ok(holds)
}

/// Whether a record holds an estimate (one of its items has a reservation policy).
pub(super) fn is_hold(kept: &Kept) -> bool {
    facts_of(&kept.facts).is_some_and(|spent| spent.iter().any(|s| s.hold.is_some()))
}

impl Settler {
    /// Claims the holds whose hold has ended and gives each back per its items' policies
    /// (as a `Settle` with cost 0 for a released item, the estimate for a kept one).
    pub async fn release_due(&self, decider: &Decider) -> Result<Released, StoreError> {
        let mut done = Released::default();
        for _ in 0..RELEASE_CALLS {
            let due = self.table.due(RELEASE_BATCH).await?;
            for (id, kept) in &due {
                let Some(spent) = facts_of(&kept.facts) else {
                    tracing::warn!(request_id = %id, "a due hold could not be read; it stands");
                    continue;
                };
                let released = spent.iter().any(|s| s.hold == Some(true) && s.tokens > 0);
                let costs: Vec<u64> = spent
                    .iter()
                    .map(|s| if s.hold == Some(true) { 0 } else { s.tokens })
                    .collect();
                match self.adjust(decider, id, kept, &costs, false).await {
                    Ok(_) if released => done.released += 1,
                    Ok(_) => done.kept += 1,
                    Err(e) => {
                        done.failed += 1;
                        tracing::warn!(request_id = %id, error = %e.message(), "a due hold's release failed");
                    }
                }
            }
            if due.len() < RELEASE_BATCH {
                break;
            }
        }
        let event = |name: &str, n: u64| {
            if n > 0 {
                self.metrics.holds.with_label_values(&[name]).inc_by(n);
            }
        };
        event("released", done.released);
        event("kept", done.kept);
        Ok(done)
    }
}
