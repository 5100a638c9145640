//! A kept Check whose spend's outcome is not known (docs/concurrency.md, "A Check cut
//! short"): its store call missed `--redis-timeout-ms` or lost its connection after it
//! was sent, so Redis may have run the script, or may still run it.
//!
//! The Check spends under a random token kept in its record (on a store that keeps tokens:
//! Redis; see `store/redis/once.rs`). When its outcome is not known, its record stays
//! pending, and its spend is *resolved* under the same token: what it spent, if it spent,
//! is read back (the record is then decided with it, and settled or released by the usual
//! rules, `unsettled: release` giving it back), else it is made sure that it never spends
//! (the record is dropped). The Check's own task tries a few times over a few seconds;
//! after that, the sweeper hands out the record at its hold's due and resolves it then
//! (again a little later while that fails).

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tonic::Status;

use super::record::read_record;
use super::Settler;
use crate::service::{CheckOptions, DecideError, Decider, ItemSpec, OnceSpend};
use cellrate_core::clock::Nanos;
use cellrate_store::shared::Kept;
use cellrate_store::Once;

/// When the Check's task tries to resolve its spend, after the outcome was not known
/// (each a wait after the one before): about 6 s in all, then the sweeper's.
const RESOLVE_AFTER: [Duration; 4] = [
    Duration::from_millis(20),
    Duration::from_millis(200),
    Duration::from_secs(1),
    Duration::from_secs(5),
];

/// A random token, one per kept Check (never the same twice, in any replica).
pub(super) fn fresh_token() -> u128 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let half = || {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
        u128::from(hasher.finish())
    };
    (half() << 64) | half()
}

/// Why a spend was not resolved; `lasting`: it never will be (its limit is gone, its
/// record cannot be read), and its record is dropped, its estimate, if spent, standing.
pub(super) struct Unresolved {
    pub status: Status,
    pub lasting: bool,
}

impl Settler {
    /// The token a kept Check spends under, when the store keeps tokens; its marker lives
    /// as long as the record may (its hold and a `--settle-window`).
    pub(super) fn once_for(&self, decider: &Decider, hold: Option<Nanos>) -> Option<Once> {
        decider.store().keeps_tokens().then(|| Once {
            token: fresh_token(),
            ttl: hold.unwrap_or(0).saturating_add(self.table.window()),
        })
    }

    /// The answer to a Check whose spend's outcome is not known, whose resolution starts
    /// now, in a task of its own.
    pub(super) fn unknown(
        &self,
        decider: Arc<Decider>,
        id: &str,
        items: Vec<ItemSpec<'static>>,
        once: Once,
        e: &DecideError,
    ) -> Status {
        let (settler, owned) = (self.clone(), id.to_string());
        tokio::spawn(async move {
            for wait in RESOLVE_AFTER {
                tokio::time::sleep(wait).await;
                match settler.resolve(&decider, &owned, &items, once).await {
                    Ok(()) => return,
                    Err(u) if u.lasting => {
                        settler.give_up(&owned, &u.status).await;
                        return;
                    }
                    Err(_) => {}
                }
            }
            tracing::warn!(
                request_id = %owned,
                "a kept Check's spend could not be resolved in its own time; the sweeper \
                 resolves it at its hold's end"
            );
        });
        Status::unavailable(format!(
            "{e}; request_id {id:?}: whether this Check spent is not known yet, and is \
             being resolved: its record stays pending (a Settle is UNAVAILABLE, retry), \
             then what it spent, if anything, is settled or released as usual"
        ))
    }

    /// Resolves the spend of `id`'s record (its Check's `items`, under `once`): the
    /// record decided with what it spent, or dropped when it spent nothing.
    pub(super) async fn resolve(
        &self,
        decider: &Decider,
        id: &str,
        items: &[ItemSpec<'_>],
        once: Once,
    ) -> Result<(), Unresolved> {
        let lasting = |status: Status| Unresolved {
            status,
            lasting: true,
        };
        let table = decider.limits();
        let holds = super::holds::reservations(decider, &table, items).map_err(lasting)?;
        let releases: Vec<Option<bool>> = (holds.iter())
            .map(|h| h.as_ref().map(|h| h.reservation.release))
            .collect();
        let options = CheckOptions {
            once: Some(OnceSpend {
                once,
                resolve: true,
            }),
            // Resolved as it was spent (see `Settler::check`).
            holds: holds.iter().flatten().any(|h| h.holds),
            ..CheckOptions::default()
        };
        let result = decider.check_with(&table, items, options).await;
        if let Err(e) = &result {
            let lasting = matches!(e, DecideError::Invalid(_));
            return Err(Unresolved {
                status: e.clone().into(),
                lasting,
            });
        }
        self.decided(id, items, &releases, &result).await;
        Ok(())
    }

    /// A pending record the sweeper handed out (`kept.facts` empty): its spend resolved.
    pub(super) async fn resolve_due(
        &self,
        decider: &Decider,
        id: &str,
        kept: &Kept,
    ) -> Result<(), Unresolved> {
        let record = read_record(&kept.check);
        let Some((record, token)) = record.and_then(|r| Some((r.items, r.token?))) else {
            // No token (kept by an older version): nothing can tell what it spent.
            self.give_up(id, &Status::internal("a pending record without a token"))
                .await;
            return Ok(());
        };
        let once = Once {
            token,
            ttl: self.table.window(),
        };
        match self.resolve(decider, id, &record, once).await {
            Err(u) if u.lasting => {
                self.give_up(id, &u.status).await;
                Err(u)
            }
            other => other,
        }
    }

    /// Drops a record whose spend can never be resolved: its estimate, if spent, stands.
    async fn give_up(&self, id: &str, status: &Status) {
        tracing::warn!(
            request_id = %id,
            error = %status.message(),
            "a kept Check's spend cannot be resolved; its record is dropped, and its \
             estimate, if it was spent, stands"
        );
        if let Err(e) = self.table.forget(id).await {
            tracing::warn!(error = %e, "a kept Check's record could not be dropped");
        }
    }
}
