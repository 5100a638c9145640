//! The release of holds not settled in time (see `holds.rs`): [`Settler::release_due`]
//! claims the due ones (on any replica: the table claims each once) and gives back each
//! item whose policy is `unsettled: release`, as a `Settle` at cost 0 would; an item whose
//! policy is `keep` (or that has none) stands.

use super::facts::facts_of;
use super::settle::Settler;
use crate::service::Decider;
use crate::store::StoreError;

/// Due holds claimed per table call.
const RELEASE_BATCH: usize = 256;

/// Table calls per [`Settler::release_due`], at most.
const RELEASE_CALLS: usize = 64;

/// What one [`Settler::release_due`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Holds given back (at least one item's policy is `unsettled: release`).
    pub released: u64,
    /// Holds whose estimates stand.
    pub kept: u64,
    /// Holds whose release failed (claimed again at the next call when the failure
    /// surely applied nothing, else not made again).
    pub failed: u64,
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
                let released = spent.iter().any(|s| s.hold == Some(true));
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
