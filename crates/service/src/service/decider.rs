//! The [`Decider`]: resolves a request's items against one snapshot of the limits (see
//! `resolve.rs`), makes one store call for the limited ones, and assembles per-item and
//! overall decisions; all-or-nothing for checks, per item for refunds.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::overrides::RuntimeOverrides;
use super::resolve::Resolved;
use super::retry_hint::RetryHints;
use super::{BatchResult, CallerLimits, CheckOptions, DecideError, ItemResult, ItemSpec, Rule};
use cellrate_core::clock::{CalendarPeriod, Clock, Nanos, SystemClock};
use cellrate_core::gcra::{Decision, Mode, Window};
use cellrate_limits::config::{LimitTable, Policy};
use cellrate_limits::names::{BucketKey, Name};
use cellrate_store::{Store, StoreError, StoreItem};

/// Decides requests against the current limits and a store.
pub struct Decider {
    limits: Arc<ArcSwap<LimitTable>>,
    store: Arc<dyn Store>,
    pub(super) caller: CallerLimits,
    runtime: Option<Arc<RuntimeOverrides>>,
    ratelimit_shape: super::RatelimitShape,
    hints: RetryHints,
}

impl Decider {
    /// A decider reading limits from `limits` (swapped by reload) and buckets from `store`.
    pub fn new(limits: Arc<ArcSwap<LimitTable>>, store: Arc<dyn Store>) -> Decider {
        Decider {
            limits,
            store,
            caller: CallerLimits::default(),
            runtime: None,
            ratelimit_shape: super::RatelimitShape::default(),
            hints: RetryHints::new(Arc::new(SystemClock)),
        }
    }

    /// This decider with `clock` to time the leases and holds it learns from (the
    /// store's, so that a test's fake clock moves them too).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Decider {
        self.hints = RetryHints::new(clock);
        self
    }

    /// What this replica learned of how soon capacity is back (`retry_hint.rs`).
    pub fn retry_hints(&self) -> &RetryHints {
        &self.hints
    }

    /// This decider with the shape of envoyproxy/ratelimit-format buckets the Envoy front
    /// end counts on, so that the admin commands name the same buckets.
    pub fn with_ratelimit_shape(mut self, shape: super::RatelimitShape) -> Decider {
        self.ratelimit_shape = shape;
        self
    }

    /// The shape of envoyproxy/ratelimit-format buckets.
    pub fn ratelimit_shape(&self) -> super::RatelimitShape {
        self.ratelimit_shape
    }

    /// This decider with temporary overrides, which take precedence over the table's.
    pub fn with_runtime_overrides(mut self, runtime: Arc<RuntimeOverrides>) -> Decider {
        self.runtime = Some(runtime);
        self
    }

    /// The temporary overrides, if this decider has them.
    pub fn runtime_overrides(&self) -> Option<&Arc<RuntimeOverrides>> {
        self.runtime.as_ref()
    }

    /// This decider with other bounds on caller-given limits.
    pub fn with_caller_limits(mut self, caller: CallerLimits) -> Decider {
        self.caller = caller;
        self
    }

    /// The bounds on caller-given limits.
    pub fn caller_limits(&self) -> CallerLimits {
        self.caller
    }

    /// The policy for `canonical_id` under `name`: a temporary override, else `table`'s.
    pub fn policy(&self, table: &LimitTable, name: &Name, canonical_id: &str) -> Option<Policy> {
        match self
            .runtime
            .as_ref()
            .and_then(|r| r.get(name, canonical_id))
        {
            Some(temporary) => Some(Policy::overridden_by(
                table.policy(name, canonical_id),
                temporary.policy,
            )),
            None => table.policy(name, canonical_id),
        }
    }

    /// The store, for admin reads that decide nothing (`Top` in flight).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The limits in force. Take one snapshot per request, so that a reload never splits
    /// a request.
    pub fn limits(&self) -> Arc<LimitTable> {
        self.limits.load_full()
    }

    /// Decides `items` all-or-nothing against the current limits and spends when allowed.
    pub async fn check(&self, items: &[ItemSpec<'_>]) -> Result<BatchResult, DecideError> {
        self.check_with(&self.limits(), items, CheckOptions::default())
            .await
    }

    /// Decides `items` against `table` (a snapshot the caller already used, e.g. to map
    /// Envoy descriptors) with `options`.
    pub async fn check_with<'i, S: AsRef<ItemSpec<'i>> + Sync>(
        &self,
        table: &LimitTable,
        items: &[S],
        options: CheckOptions,
    ) -> Result<BatchResult, DecideError> {
        let resolved = self.resolve(table, items, options)?;
        super::resolve::lease_rules(&resolved, false)?;
        // A counting item that can never pass (deny-listed, or oversize) denies the batch:
        // decide the rest without spending.
        let blocked = resolved.iter().any(|r| {
            (matches!(r.rule, Rule::Denied | Rule::InvalidId { deny: true })
                || r.oversize
                || matches!(r.rule, Rule::Zero(_)) && r.cost > 0 && !r.shadow)
                && r.mode.counts()
        });
        // Charges are recorded even in a blocked batch.
        let store_items = store_items(&resolved, true, |r| match r.mode {
            _ if r.oversize => Mode::Probe,
            Mode::Charge => Mode::Charge,
            // A release gives back what was held, whatever the batch decides.
            Mode::Release => Mode::Release,
            _ if blocked => Mode::Probe,
            mode => mode,
        });
        let store_decisions = if store_items.is_empty() {
            Vec::new()
        } else if let Some(once) = &options.once {
            match once.resolve {
                true => self.store.resolve_once(&store_items, &once.once).await?,
                false => self.store.spend_once(&store_items, &once.once).await?,
            }
            .decisions
        } else if let Some(outcome) = self.store.try_spend_now(&store_items) {
            outcome?.decisions
        } else {
            self.store.spend(&store_items).await?.decisions
        };
        let mut store_decisions = one_each(store_decisions, store_items.len())?.into_iter();
        let leases = leases_of(&resolved);
        let mut items: Vec<ItemResult> = Vec::with_capacity(resolved.len());
        for r in resolved {
            let merged = r.merged_into.and_then(|first| items.get(first));
            let item = {
                let mut decision = match r.rule {
                    // A merged item answers its bucket's one decision.
                    _ if merged.is_some() => merged.map_or(DENIED, |m| m.decision),
                    Rule::Limited(_) => store_decisions.next().unwrap_or(DENIED),
                    Rule::Denied | Rule::InvalidId { deny: true } => DENIED,
                    // Its window went to the store only when it could be made (as
                    // `store_items` makes it): the decisions stay one per store item.
                    Rule::Zero(unit) => match zero_window(unit) {
                        Some(_) => zero(unit, store_decisions.next().unwrap_or(DENIED), r.cost),
                        None => DENIED,
                    },
                    Rule::Unlimited | Rule::NotConfigured | Rule::InvalidId { deny: false } => {
                        UNLIMITED
                    }
                };
                if r.oversize {
                    // Never allowed: no retry time would help.
                    decision.allowed = false;
                    decision.retry_in = 0;
                }
                if let (Rule::Limited(limit), None) = (r.rule, merged) {
                    if !decision.allowed && !r.key.is_caller_given() {
                        self.hints.hinted(&r.name, &limit, r.mode, &mut decision);
                    }
                }
                let oversize = r.oversize || merged.is_some_and(|m| m.oversize);
                ItemResult {
                    decision,
                    rule: r.rule,
                    name: r.name,
                    key: r.key,
                    shadow: r.shadow,
                    oversize,
                    mode: r.mode,
                    headers: r.headers,
                }
            };
            items.push(item);
        }
        let result = with_overall(items);
        self.learn_leases(&leases, &result);
        Ok(result)
    }

    /// Leases taken (the batch allowed) and released, for [`RetryHints`]: `leases` are
    /// the batch's items of configured concurrency limits, with their lease ids.
    fn learn_leases(&self, leases: &[(usize, Nanos, Arc<str>)], result: &BatchResult) {
        for (i, hold, lease) in leases {
            let Some(item) = result.items.get(*i) else {
                continue;
            };
            match item.mode {
                Mode::Acquire if result.overall.allowed && item.decision.allowed => {
                    (self.hints).acquired(&item.name, item.key.as_str(), lease, *hold)
                }
                Mode::Release if item.decision.allowed => {
                    (self.hints).released(&item.name, item.key.as_str(), lease)
                }
                _ => {}
            }
        }
    }

    /// Refunds each item's cost. Per item, `allowed` says whether its bucket changed.
    pub async fn refund(&self, items: &[ItemSpec<'_>]) -> Result<BatchResult, DecideError> {
        self.refund_with(&self.limits(), items, CheckOptions::default())
            .await
    }

    /// [`Decider::refund`] against `table` (a snapshot the caller already used) with
    /// `options`. A refund never fills a bucket past full, so an item in [`Mode::Charge`]
    /// may give back more than the burst (Envoy's `is_negative_hits`).
    pub async fn refund_with<'i, S: AsRef<ItemSpec<'i>> + Sync>(
        &self,
        table: &LimitTable,
        items: &[S],
        options: CheckOptions,
    ) -> Result<BatchResult, DecideError> {
        let resolved = self.resolve(table, items, options)?;
        super::resolve::lease_rules(&resolved, true)?;
        // Nothing is given back to a zero limit's window (it answers unchanged).
        let store_items = store_items(&resolved, false, |_| Mode::CheckAndSpend);
        let decisions = if store_items.is_empty() {
            Vec::new()
        } else {
            self.store.refund(&store_items).await?
        };
        let mut decisions = one_each(decisions, store_items.len())?.into_iter();
        let mut answered: Vec<Decision> = Vec::with_capacity(resolved.len());
        let items: Vec<ItemResult> = resolved
            .into_iter()
            .map(|r| ItemResult {
                decision: {
                    let decision = match (r.merged_into, r.rule) {
                        // A merged item answers its bucket's one decision.
                        (Some(first), _) => answered.get(first).copied().unwrap_or(UNCHANGED),
                        (None, Rule::Limited(_)) => decisions.next().unwrap_or(UNCHANGED),
                        _ => UNCHANGED,
                    };
                    answered.push(decision);
                    decision
                },
                rule: r.rule,
                name: r.name,
                key: r.key,
                shadow: false,
                oversize: false,
                mode: Mode::CheckAndSpend,
                headers: r.headers,
            })
            .collect();
        Ok(refund_overall(items))
    }

    /// Reports each item's bucket without spending (a cost-0 peek).
    pub async fn inspect(&self, items: &[ItemSpec<'_>]) -> Result<BatchResult, DecideError> {
        let peeks: Vec<ItemSpec> = items
            .iter()
            .map(|item| ItemSpec {
                cost: Some(0),
                mode: Mode::Probe,
                ..item.clone()
            })
            .collect();
        self.check(&peeks).await
    }

    /// Deletes the items' buckets; returns how many were not full.
    pub async fn reset(&self, items: &[ItemSpec<'_>]) -> Result<u32, DecideError> {
        let keys: Vec<BucketKey> = self
            .resolve(&self.limits(), items, CheckOptions::default())?
            .into_iter()
            .map(|r| r.key)
            .collect();
        Ok(self.store.reset(&keys).await?)
    }
}

/// The items of configured concurrency limits that take or free a lease: their places,
/// holds and lease ids (none allocated for a batch without leases).
fn leases_of(resolved: &[Resolved]) -> Vec<(usize, Nanos, Arc<str>)> {
    if resolved.iter().all(|r| r.lease.is_none()) {
        return Vec::new();
    }
    (resolved.iter().enumerate())
        .filter_map(|(i, r)| match (r.rule, &r.lease) {
            (Rule::Limited(limit), Some(lease))
                if limit.window() == Window::Concurrency && !r.key.is_caller_given() =>
            {
                Some((i, limit.period(), lease.clone()))
            }
            _ => None,
        })
        .collect()
}

/// The store items of `resolved`'s limited items, each in the mode `mode` gives it; with
/// `zero`, the windows of zero limits too (see [`zero_window`]).
fn store_items(
    resolved: &[Resolved],
    zero: bool,
    mode: impl Fn(&Resolved) -> Mode,
) -> Vec<StoreItem> {
    resolved
        .iter()
        .filter_map(|r| match r.rule {
            // Decided by the item it was merged into.
            _ if r.merged_into.is_some() => None,
            Rule::Limited(limit) => Some(StoreItem {
                key: r.key.clone(),
                limit,
                cost: r.cost,
                mode: mode(r),
                lease: r.lease.clone(),
            }),
            // Every hit counts in a zero limit's window; no hits peek at it.
            Rule::Zero(unit) if zero => Some(StoreItem {
                key: r.key.clone(),
                limit: zero_window(unit)?,
                cost: r.cost,
                mode: if r.cost > 0 {
                    Mode::Charge
                } else {
                    Mode::Probe
                },
                lease: None,
            }),
            _ => None,
        })
        .collect()
}

/// The window a zero limit counts its hits in, as envoyproxy/ratelimit's counter does
/// (`INCRBY`, then over when above 0): a window of one, charged whatever a request's hits
/// (recorded, over the limit too) and peeked at a cost of 0. A request of no hits passes
/// only while the window has counted nothing (one token left). Every hit is kept, as by
/// the window of a limit of that format that is not zero, which may read the same window
/// (a caller-given limit raised from 0 within the window).
fn zero_window(unit: CalendarPeriod) -> Option<cellrate_core::gcra::Limit> {
    cellrate_core::gcra::Limit::fixed_window(1, unit).ok()
}

/// The answer of a zero limit whose window (of `unit`) answered `counted`: a request of no
/// hits passes while the window is empty, any hit is over; nothing remains, and the
/// window's end on the wall clock is the reset (an empty window's own is 0), and a
/// denial's retry, as envoyproxy/ratelimit answers it: no retry passes while the limit is
/// zero.
fn zero(unit: CalendarPeriod, counted: Decision, cost: u64) -> Decision {
    let allowed = cost == 0 && counted.remaining >= 1;
    let now = SystemClock.now();
    let reset_in = unit.window_end(now).saturating_sub(now);
    Decision {
        allowed,
        remaining: 0,
        retry_in: if allowed { 0 } else { reset_in },
        reset_in,
    }
}

/// The store's decisions, checked to be one per item: a store that answers for fewer
/// items must not turn the rest into allows.
fn one_each(decisions: Vec<Decision>, items: usize) -> Result<Vec<Decision>, DecideError> {
    if decisions.len() == items {
        Ok(decisions)
    } else {
        Err(DecideError::Store(StoreError::Inconsistent(format!(
            "the store answered {} decisions for {items} items",
            decisions.len()
        ))))
    }
}

/// A refund's overall decision: `allowed` when any bucket changed; the other fields those
/// of the limited bucket with the fewest tokens after the refund (then the one furthest
/// from full), which is what a caller deciding whether to retry needs.
fn refund_overall(items: Vec<ItemResult>) -> BatchResult {
    let changed = items.iter().any(|i| i.decision.allowed);
    let overall_item = items
        .iter()
        .enumerate()
        .filter(|(_, item)| matches!(item.rule, Rule::Limited(_)))
        .min_by_key(|(_, item)| {
            (
                item.decision.remaining,
                std::cmp::Reverse(item.decision.reset_in),
            )
        })
        .map(|(i, _)| i);
    let mut overall = overall_item.map_or(UNCHANGED, |i| items[i].decision);
    overall.allowed = changed;
    BatchResult {
        overall,
        overall_item,
        items,
    }
}

/// Adds the overall decision: the strictest of the counting items that are limited or
/// deny-listed (unlimited and not-configured items never restrict).
fn with_overall(items: Vec<ItemResult>) -> BatchResult {
    let mut overall_item = None;
    let mut overall = UNLIMITED;
    for (i, item) in items.iter().enumerate() {
        let restricts = item.rule.restricts() && item.mode.counts();
        if restricts && (overall_item.is_none() || item.decision.is_stricter_than(&overall)) {
            overall = item.decision;
            overall_item = Some(i);
        }
    }
    BatchResult {
        overall,
        overall_item,
        items,
    }
}

/// The decision reported for unlimited and not-configured items.
const UNLIMITED: Decision = Decision {
    allowed: true,
    remaining: 0,
    retry_in: 0,
    reset_in: 0,
};

/// The decision reported for deny-listed items.
const DENIED: Decision = Decision {
    allowed: false,
    remaining: 0,
    retry_in: 0,
    reset_in: 0,
};

/// The decision reported for refunds that changed nothing.
const UNCHANGED: Decision = Decision {
    allowed: false,
    remaining: 0,
    retry_in: 0,
    reset_in: 0,
};
