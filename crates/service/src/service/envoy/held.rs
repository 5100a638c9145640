//! The check-0, charge-later pattern held (`--zero-check-holds`, docs/token-budgets.md):
//! on a limit it names (by its domain, or by the limit's name), a descriptor asking with
//! 0 hits holds an estimate in its bucket, and one charging hits settles the bucket's
//! oldest hold to them ([`crate::service::settle`]'s anonymous holds). Off by default;
//! every other request takes the plain path, which pays one check of an empty list.

use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use parking_lot::Mutex;

use super::batch::{Batch, Item};
use super::refusal::envoy_error;
use super::{EnvoyRateLimitService, Refusal};
use crate::service::settle::{AnonymousHold, HeldCheck};
use crate::service::{CheckOptions, ItemResult, ItemSpec, Rule, Target};
use cellrate_core::clock::{Nanos, SECOND};
use cellrate_core::gcra::Mode;
pub use cellrate_limits::config::Estimate;
use cellrate_limits::config::LimitTable;

/// Where holds are taken: the limits (by domain, or by a limit's name) and their
/// estimates, and how long a hold lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZeroCheckHolds {
    pub scopes: Vec<(String, Estimate)>,
    pub hold: Nanos,
}

impl Default for ZeroCheckHolds {
    fn default() -> ZeroCheckHolds {
        ZeroCheckHolds {
            scopes: Vec::new(),
            hold: 600 * SECOND,
        }
    }
}

/// One `--zero-check-holds` value: `SCOPE=ESTIMATE`, a domain or a limit's name, and a
/// count of tokens or `learned`.
///
/// ```
/// use cellrate_service::service::envoy::{parse_zero_check_hold, Estimate};
/// assert_eq!(
///     parse_zero_check_hold("default/gw/http=1000"),
///     Ok(("default/gw/http".to_string(), Estimate::Fixed(1000)))
/// );
/// assert_eq!(parse_zero_check_hold("ai=learned").unwrap().1, Estimate::Learned);
/// assert!(parse_zero_check_hold("ai=0").unwrap_err().contains("at least 1"));
/// assert!(parse_zero_check_hold("ai=lots").is_err());
/// assert!(parse_zero_check_hold("ai").is_err());
/// ```
pub fn parse_zero_check_hold(text: &str) -> Result<(String, Estimate), String> {
    let Some((scope, estimate)) = text.rsplit_once('=') else {
        return Err(format!(
            "{text:?}: SCOPE=ESTIMATE expected (a domain or a limit's name, then a number \
             of tokens or `learned`)"
        ));
    };
    if scope.is_empty() || scope.len() > super::MAX_DOMAIN {
        return Err(format!(
            "{text:?}: the scope is 1 to {} bytes",
            super::MAX_DOMAIN
        ));
    }
    let estimate = Estimate::parse(estimate).map_err(|e| format!("{text:?}: {e}"))?;
    Ok((scope.to_string(), estimate))
}

/// Charges remembered per bucket for a learned estimate.
pub const LEARNED_CHARGES: usize = 8;

/// Buckets whose charges are remembered at most (all forgotten when full: a client that
/// makes many buckets only resets what was learned, at most 10 000 x about 200 bytes).
pub const MAX_LEARNED: usize = 10_000;

/// What this replica learned of each held bucket's charges.
#[derive(Default)]
pub(super) struct Learned {
    charges: Mutex<HashMap<String, [u64; LEARNED_CHARGES]>>,
}

impl Learned {
    fn remember(&self, queue: &str, cost: u64) {
        let mut charges = self.charges.lock();
        if charges.len() >= MAX_LEARNED && !charges.contains_key(queue) {
            charges.clear();
        }
        let recent = charges.entry(queue.to_string()).or_default();
        recent.rotate_right(1);
        recent[0] = cost;
    }

    /// The largest recent charge, never less than `floor` (nor before any charge): a
    /// client whose charges are tiny cannot make the estimate tiny, and so cannot have
    /// more than `count / floor` streams started at once.
    fn estimate(&self, queue: &str, floor: u64) -> u64 {
        let charges = self.charges.lock();
        let largest = charges.get(queue).and_then(|r| r.iter().max().copied());
        largest.unwrap_or(0).max(floor)
    }
}

impl EnvoyRateLimitService {
    /// The hold of `item` in `domain`, when one is taken for it: its estimate, how long
    /// it lasts, whether it is given back at its end, and the most one may take of the
    /// limit's burst (millionths). Named by `--zero-check-holds`, or by the `zero_checks:`
    /// of a configured limit's reservation policy.
    fn hold_of(
        &self,
        table: &LimitTable,
        domain: &str,
        item: &Item<'_>,
    ) -> Option<(Estimate, Nanos, bool, u64)> {
        let (name, configured) = match &item.spec.target {
            Target::Ratelimit(target) => (&*target.name, None),
            // A named limit under a limit the descriptor gave is not held (a kept Check
            // names configured limits only): decided as without holds.
            Target::Named { name, .. } if item.spec.limit.is_none() => {
                (&**name, table.names().get(name))
            }
            _ => return None,
        };
        let scopes = &self.options.zero_check_holds.scopes;
        let flag = (scopes.iter()).find(|(scope, _)| scope == domain || scope == name);
        if let Some(&(_, estimate)) = flag {
            return Some((
                estimate,
                self.options.zero_check_holds.hold,
                true,
                1_000_000,
            ));
        }
        let policy = table.reservation(configured?)?;
        let estimate = policy.zero_checks?;
        Some((estimate, policy.hold, policy.release, policy.max_share_ppm))
    }

    /// Whether some item of `request`'s `batch` may be held (the rare path:
    /// `decide_held`). A request that gives hits back (`is_negative_hits`) is decided as
    /// without holds, its refunds as ever.
    pub(super) fn holds_some(
        &self,
        table: &LimitTable,
        request: &RateLimitRequest,
        batch: &Batch<'_>,
    ) -> bool {
        self.settler.is_some()
            && (!self.options.zero_check_holds.scopes.is_empty() || table.has_zero_checks())
            && (batch.items.iter()).any(|item| self.hold_of(table, &request.domain, item).is_some())
            && !request.descriptors.iter().any(|d| d.is_negative_hits)
    }

    /// Decides a batch some of whose items are held: each charge of a held bucket
    /// settles its oldest hold first (and is then asked at 0 hits), each check of 0 hits
    /// holds its estimate; the rest is decided as it would be, with them.
    pub(super) async fn decide_held(
        &self,
        table: &Arc<LimitTable>,
        request: &RateLimitRequest,
        batch: &Batch<'_>,
    ) -> Result<Vec<ItemResult>, Refusal> {
        let domain = request.domain.as_str();
        let mut items: Vec<Item<'_>> = batch.items.clone();
        let options = self.check_options(table, domain);
        let resolved = match self.decider.resolve(table, &items, options) {
            Ok(resolved) => resolved,
            Err(e) => return Err(envoy_error(e, &items)),
        };
        let Some(settler) = self.settler.as_ref() else {
            return self.check(table, domain, &items).await;
        };
        let mut holds = Vec::new();
        for (i, r) in resolved.iter().enumerate() {
            let item = &mut items[i];
            let negative = request.descriptors[item.d].is_negative_hits;
            let hold = self.hold_of(table, domain, item).filter(|_| !negative);
            let (Some((estimate, hold, release, share)), Rule::Limited(limit)) = (hold, r.rule)
            else {
                // Counted as it would be alone (a fixed window's every hit, a denied one too).
                if r.mode == Mode::Charge {
                    item.spec.mode = Mode::Charge;
                }
                continue;
            };
            let queue = r.key.as_str();
            let cost = item.spec.cost.unwrap_or(1);
            if cost > 0 {
                self.learned.remember(queue, cost);
                // A hold settled to the cost is charged: this item only answers.
                match settler.settle_oldest(&self.decider, queue, cost).await {
                    Ok(true) => item.spec.cost = Some(0),
                    Ok(false) => {}
                    Err(e) => tracing::debug!(error = %e, "a held charge was charged in full"),
                }
                if r.mode == Mode::Charge {
                    item.spec.mode = Mode::Charge;
                }
                continue;
            }
            let count = limit.count().max(1);
            let e = match estimate {
                Estimate::Fixed(n) => n,
                Estimate::Learned => self.learned.estimate(queue, (count / 16).max(1)),
            };
            // At most the limit's count (a larger hold could never be admitted), and at
            // most the share one hold may take of its burst.
            let cap = u128::from(limit.burst()) * u128::from(share) / 1_000_000;
            let cap = u64::try_from(cap).unwrap_or(u64::MAX).max(1);
            item.spec.cost = Some(e.min(count).min(cap));
            item.spec.mode = Mode::CheckAndSpend;
            holds.push(AnonymousHold {
                item: i,
                queue: queue.to_string(),
                hold,
                release,
            });
        }
        if holds.is_empty() {
            return self.check(table, domain, &items).await;
        }
        let specs: Vec<ItemSpec<'static>> = (items.iter())
            .map(|item| item.spec.clone().into_owned())
            .collect();
        let options = CheckOptions {
            holds: true,
            ..options
        };
        let held = settler.check_anonymous(&self.decider, table.clone(), specs, holds, options);
        match held.await {
            Ok(HeldCheck::Decided(result)) => Ok(result.items),
            Ok(HeldCheck::Refused) => {
                let specs: Vec<ItemSpec<'_>> = items.iter().map(|i| i.spec.clone()).collect();
                let mut peeked =
                    (self.decider.inspect(&specs).await).map_err(|e| envoy_error(e, &items))?;
                for item in &mut peeked.items {
                    item.decision.allowed = false;
                }
                Ok(peeked.items)
            }
            Err(e) => Err(envoy_error(e, &items)),
        }
    }
}
