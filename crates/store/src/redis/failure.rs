//! What a request gets while Redis fails: the [`FailurePolicy`].

use super::{leases, FailurePolicy, RedisStore};
use crate::{Outcome, StoreError, StoreEvent, StoreItem};
use cellrate_core::gcra::Decision;
#[cfg(doc)]
use cellrate_core::gcra::Limit;

impl RedisStore {
    /// The answer when Redis failed, by policy.
    pub(super) fn on_failure(
        &self,
        items: &[StoreItem],
        error: StoreError,
    ) -> Result<Outcome, StoreError> {
        if error.is_data_error() {
            // Redis is fine; this bucket is not: no policy would decide it better.
            return Err(error);
        }
        let policy = self.settings.failure;
        if policy != FailurePolicy::Unavailable {
            self.observer.event(StoreEvent::Fallback(match policy {
                FailurePolicy::Allow => "allow",
                FailurePolicy::Deny => "deny",
                _ => "local",
            }));
        }
        tracing::debug!(error = %error, ?policy, "redis failed; applying the failure policy");
        // A lease item: see [`leases::fixed`]; with `local`, the local store keeps leases
        // as it keeps buckets, on the share of each count.
        // A request of releases only is no denial, whatever the policy (nothing counts).
        let fixed = |allowed: bool| Outcome {
            allowed: allowed || items.iter().all(|i| !i.mode.counts()),
            decisions: items
                .iter()
                .map(|i| match leases::is_lease(i) {
                    true => leases::fixed(i, allowed),
                    false => Decision {
                        allowed,
                        remaining: if allowed { i.limit.burst() as i64 } else { 0 },
                        retry_in: 0,
                        reset_in: 0,
                    },
                })
                .collect(),
        };
        match (policy, &self.fallback) {
            (FailurePolicy::Allow, _) => Ok(fixed(true)),
            (FailurePolicy::Deny, _) => Ok(fixed(false)),
            (FailurePolicy::Local, Some(local)) => local.spend_now(&self.local_share(items)),
            _ => Err(error),
        }
    }

    /// The items with each limit divided by the local divisor ([`Limit::divided`]: a
    /// calendar limit stays a calendar limit). A cost is not cut to the share: a cost the
    /// share cannot cover is denied, as the whole limit would deny it to one replica.
    pub(super) fn local_share(&self, items: &[StoreItem]) -> Vec<StoreItem> {
        let divisor = self.settings.local_divisor.max(1);
        items
            .iter()
            .map(|item| StoreItem {
                limit: item.limit.divided(divisor),
                ..item.clone()
            })
            .collect()
    }
}
