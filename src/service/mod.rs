//! The [`Decider`]: requests in domain terms -> one store batch -> decisions.
//!
//! Both front ends (the native API and Envoy's RLS) convert their protobuf requests into
//! [`ItemSpec`]s and call the decider, which resolves names and ids against the current
//! [`LimitTable`], checks the batch (size, duplicates, cost <= burst), sends the limited
//! items to the [`Store`] in one call and assembles per-item and overall decisions.
//! This is also the single place where a [`StoreError`] becomes a `tonic::Status`.

use std::borrow::Cow;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::gcra::{Decision, Limit, Mode};
use crate::limits::config::{LimitTable, Policy};
pub use crate::limits::descriptors::InvalidIds;
use crate::limits::ids::IdFormat;
use crate::limits::names::BucketKey;
use crate::store::{Store, StoreError, StoreItem};

mod caller_limits;
pub mod envoy;
mod errors;
pub mod native;
pub mod overrides;
pub mod quota_book;
pub mod rlqs;
pub mod token;
pub mod trace;

pub use caller_limits::CallerLimits;
pub use errors::{store_unavailable, DecideError, Invalid};

/// The most items one request may name.
pub const MAX_BATCH: usize = 64;

/// The longest limit name a request may give (declared names are at most 128 bytes).
pub const MAX_NAME: usize = 128;

/// The largest request message any gRPC service decodes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The name reported for inline limits.
pub const INLINE_NAME: &str = "inline";

/// Which bucket an item names. The strings borrow from the request where they can: the
/// request path copies no name or id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target<'a> {
    /// A configured name and an id in its format.
    Named {
        name: Cow<'a, str>,
        id: Cow<'a, str>,
    },
    /// A limit given in the request (native inline), on the caller's key.
    Inline { key: Cow<'a, str>, limit: Limit },
    /// An unmatched Envoy descriptor with its own limit; `digest` identifies its domain
    /// and entries unambiguously (see [`envoy`]).
    Descriptor { digest: String, limit: Limit },
}

/// One item of a request, before resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemSpec<'a> {
    pub target: Target<'a>,
    /// Tokens; `None` means 1.
    pub cost: Option<u64>,
    pub mode: Mode,
    /// A limit given by the caller for this bucket (Envoy's descriptor `limit`), in place
    /// of the configured one. Allow and deny lists still apply.
    pub limit: Option<Limit>,
}

impl<'a> ItemSpec<'a> {
    /// A named item of cost 1.
    pub fn named(name: &'a str, id: &'a str) -> ItemSpec<'a> {
        ItemSpec {
            target: Target::Named {
                name: Cow::Borrowed(name),
                id: Cow::Borrowed(id),
            },
            cost: None,
            mode: Mode::CheckAndSpend,
            limit: None,
        }
    }
}

/// The `result` label of a decided item, for `cellrate_decisions_total`.
pub fn outcome(item: &ItemResult) -> &'static str {
    match item.rule {
        Rule::Unlimited => "unlimited",
        Rule::NotConfigured => "not_configured",
        Rule::Denied => "denied",
        Rule::InvalidId { .. } => "invalid",
        Rule::Limited(_) if item.decision.allowed => "allowed",
        Rule::Limited(_) if item.shadow => "shadow_denied",
        Rule::Limited(_) => "denied",
    }
}

/// Counts a batch's items in `metrics` under `api`.
pub fn count_decisions(
    metrics: &crate::observe::metrics::Metrics,
    api: &str,
    items: &[ItemResult],
) {
    for item in items {
        let outcome = outcome(item);
        metrics.decision(api, &item.name, outcome);
        if outcome == "denied" {
            metrics.denied_id(&item.name, item.key.parts().1);
        }
    }
}

/// How a front end wants a batch decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// A cost above the limit's burst denies the item (and so the batch) instead of being
    /// an error. Envoy cannot act on a per-descriptor error.
    pub oversize_denies: bool,
    /// Honour the `shadow` flag of configured limits: decide and spend, never deny.
    pub honour_shadow: bool,
    /// Treat every limit as shadow (global shadow mode).
    pub shadow_all: bool,
    /// What an id that does not fit its name's format does to the request.
    pub invalid_ids: InvalidIds,
}

/// Which rule decided an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Limited(Limit),
    Unlimited,
    Denied,
    NotConfigured,
    /// The id does not fit the name's format; `deny` under [`InvalidIds::Deny`].
    InvalidId {
        deny: bool,
    },
}

impl Rule {
    /// Whether the rule can restrict a batch (limited, deny-listed, a denied invalid id).
    pub fn restricts(&self) -> bool {
        matches!(
            self,
            Rule::Limited(_) | Rule::Denied | Rule::InvalidId { deny: true }
        )
    }
}

/// One item's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemResult {
    pub decision: Decision,
    pub rule: Rule,
    /// The limit's name (or [`INLINE_NAME`]).
    pub name: Arc<str>,
    pub key: BucketKey,
    /// Decided in shadow mode: a denial here did not deny the batch.
    pub shadow: bool,
    /// The cost exceeded the burst ([`CheckOptions::oversize_denies`]): denied for good.
    pub oversize: bool,
    /// How the item took part (a shadow item is spend-only).
    pub mode: Mode,
}

/// A batch's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchResult {
    /// The strictest decision among counting items that are limited or denied; allowed
    /// with zeros when there is none.
    pub overall: Decision,
    /// The item the overall decision comes from, if any.
    pub overall_item: Option<usize>,
    pub items: Vec<ItemResult>,
}

/// A resolved item.
struct Resolved {
    key: BucketKey,
    name: Arc<str>,
    rule: Rule,
    cost: u64,
    mode: Mode,
    shadow: bool,
    oversize: bool,
}

/// Decides requests against the current limits and a store.
pub struct Decider {
    limits: Arc<ArcSwap<LimitTable>>,
    store: Arc<dyn Store>,
    caller: CallerLimits,
    runtime: Option<Arc<crate::service::overrides::RuntimeOverrides>>,
}

impl Decider {
    /// A decider reading limits from `limits` (swapped by reload) and buckets from `store`.
    pub fn new(limits: Arc<ArcSwap<LimitTable>>, store: Arc<dyn Store>) -> Decider {
        Decider {
            limits,
            store,
            caller: CallerLimits::default(),
            runtime: None,
        }
    }

    /// This decider with temporary overrides, which take precedence over the table's.
    pub fn with_runtime_overrides(
        mut self,
        runtime: Arc<crate::service::overrides::RuntimeOverrides>,
    ) -> Decider {
        self.runtime = Some(runtime);
        self
    }

    /// The temporary overrides, if this decider has them.
    pub fn runtime_overrides(&self) -> Option<&Arc<crate::service::overrides::RuntimeOverrides>> {
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
    pub fn policy(
        &self,
        table: &LimitTable,
        name: &crate::limits::names::Name,
        canonical_id: &str,
    ) -> Option<Policy> {
        match self
            .runtime
            .as_ref()
            .and_then(|r| r.get(name, canonical_id))
        {
            Some(temporary) => Some(temporary.policy),
            None => table.policy(name, canonical_id),
        }
    }

    /// The limits in force. Take one snapshot per request, so that a reload never splits
    /// a request.
    pub fn limits(&self) -> Arc<LimitTable> {
        self.limits.load_full()
    }

    fn resolve(
        &self,
        table: &LimitTable,
        items: &[ItemSpec<'_>],
        options: CheckOptions,
    ) -> Result<Vec<Resolved>, DecideError> {
        let invalid = |i, field, message| DecideError::Invalid(Invalid::at(i, field, message));
        if items.is_empty() {
            return Err(DecideError::Invalid(Invalid {
                item: None,
                field: "",
                message: "empty batch".to_string(),
            }));
        }
        if items.len() > MAX_BATCH {
            return Err(DecideError::Invalid(Invalid {
                item: None,
                field: "",
                message: format!("{} items, at most {MAX_BATCH} per request", items.len()),
            }));
        }
        let mut resolved: Vec<Resolved> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            // A caller-given limit outside the bounds: an error, or for Envoy a denial.
            let mut refused = false;
            let mut check_caller = |limit: &Limit| -> Result<(), DecideError> {
                if !self.caller.enabled {
                    return Err(invalid(
                        i,
                        ".inline",
                        "caller-given limits are turned off on this server".to_string(),
                    ));
                }
                match self.caller.refuse(limit) {
                    Some(_) if options.oversize_denies => {
                        refused = true;
                        Ok(())
                    }
                    Some(reason) => Err(invalid(i, ".inline", reason)),
                    None => Ok(()),
                }
            };
            let (key, name, policy) = match &item.target {
                Target::Named { name, id } => {
                    if name.len() > MAX_NAME {
                        return Err(invalid(i, ".name", format!("longer than {MAX_NAME} bytes")));
                    }
                    let found = table
                        .names()
                        .get(name)
                        .ok_or_else(|| invalid(i, ".name", table.names().unknown(name)))?;
                    let canonical = match found.format.canonicalize_cow(id) {
                        Ok(canonical) => canonical,
                        Err(e) if options.invalid_ids == InvalidIds::Reject => {
                            return Err(invalid(
                                i,
                                ".id",
                                format!("{e} (format {} of {name})", found.format),
                            ))
                        }
                        Err(_) => {
                            // No bucket: decided without the store, never a duplicate.
                            resolved.push(Resolved {
                                key: BucketKey::new(found.number, ""),
                                name: found.text.clone(),
                                rule: Rule::InvalidId {
                                    deny: options.invalid_ids == InvalidIds::Deny,
                                },
                                cost: 0,
                                mode: if options.shadow_all {
                                    Mode::SpendOnly
                                } else {
                                    item.mode
                                },
                                shadow: options.shadow_all,
                                oversize: false,
                            });
                            continue;
                        }
                    };
                    let policy = self.policy(table, found, &canonical);
                    let key = match item.limit {
                        // The caller's limit on a configured name: a bucket of its own.
                        Some(given) => BucketKey::caller_given(
                            'n',
                            &given,
                            BucketKey::new(found.number, &canonical).as_str(),
                        ),
                        None => BucketKey::new(found.number, &canonical),
                    };
                    (key, found.text.clone(), policy)
                }
                Target::Inline { key, limit } => {
                    check_caller(limit)?;
                    let canonical = IdFormat::String
                        .canonicalize_cow(key)
                        .map_err(|e| invalid(i, ".inline.key", e.to_string()))?;
                    let key = BucketKey::caller_given('i', limit, &canonical);
                    let policy = Policy::Limited {
                        limit: *limit,
                        shadow: false,
                    };
                    (key, Arc::from(INLINE_NAME), Some(policy))
                }
                Target::Descriptor { digest, limit } => {
                    check_caller(limit)?;
                    let key = BucketKey::caller_given('d', limit, digest);
                    let policy = Policy::Limited {
                        limit: *limit,
                        shadow: false,
                    };
                    (key, Arc::from(INLINE_NAME), Some(policy))
                }
            };
            if let Some(given) = &item.limit {
                check_caller(given)?;
            }
            let (rule, configured_shadow) = match (policy, item.limit) {
                (Some(Policy::Unlimited), _) => (Rule::Unlimited, false),
                (Some(Policy::Denied), _) => (Rule::Denied, false),
                (Some(Policy::Limited { shadow, .. }), Some(given)) => {
                    (Rule::Limited(given), shadow)
                }
                (Some(Policy::Limited { limit, shadow }), None) => (Rule::Limited(limit), shadow),
                (None, Some(given)) => (Rule::Limited(given), false),
                (None, None) => (Rule::NotConfigured, false),
            };
            let shadow = options.shadow_all || (options.honour_shadow && configured_shadow);
            let mut cost = item.cost.unwrap_or(1);
            let mut oversize = false;
            if refused {
                // Never allowed, whatever the bucket holds (as a cost above the burst).
                oversize = true;
                cost = 0;
            } else if let Rule::Limited(limit) = rule {
                if cost > limit.burst() {
                    if !options.oversize_denies {
                        return Err(invalid(
                            i,
                            "",
                            format!(
                                "cost {cost} exceeds the burst {} of {name}: it can never be \
                                 allowed",
                                limit.burst()
                            ),
                        ));
                    }
                    // Report the bucket as it is (a peek); the item is denied below.
                    oversize = true;
                    cost = 0;
                }
            }
            // At most 64 items: a scan beats hashing, and allocates nothing.
            if let Some(first) = resolved
                .iter()
                .position(|r| r.key == key && !matches!(r.rule, Rule::InvalidId { .. }))
            {
                return Err(invalid(
                    i,
                    "",
                    format!(
                        "bucket {key} is already items[{first}] (each bucket once per request)"
                    ),
                ));
            }
            resolved.push(Resolved {
                key,
                name,
                rule,
                cost,
                mode: if shadow { Mode::SpendOnly } else { item.mode },
                shadow,
                oversize,
            });
        }
        Ok(resolved)
    }

    /// Decides `items` all-or-nothing against the current limits and spends when allowed.
    pub async fn check(&self, items: &[ItemSpec<'_>]) -> Result<BatchResult, DecideError> {
        self.check_with(&self.limits(), items, CheckOptions::default())
            .await
    }

    /// Decides `items` against `table` (a snapshot the caller already used, e.g. to map
    /// Envoy descriptors) with `options`.
    pub async fn check_with(
        &self,
        table: &LimitTable,
        items: &[ItemSpec<'_>],
        options: CheckOptions,
    ) -> Result<BatchResult, DecideError> {
        let resolved = self.resolve(table, items, options)?;
        // A counting item that can never pass (deny-listed, or oversize) denies the batch:
        // decide the rest without spending.
        let blocked = resolved.iter().any(|r| {
            (matches!(r.rule, Rule::Denied | Rule::InvalidId { deny: true }) || r.oversize)
                && r.mode.counts()
        });
        let store_items: Vec<StoreItem> = resolved
            .iter()
            .filter_map(|r| match r.rule {
                Rule::Limited(limit) => Some(StoreItem {
                    key: r.key.clone(),
                    limit,
                    cost: r.cost,
                    mode: if blocked || r.oversize {
                        Mode::Probe
                    } else {
                        r.mode
                    },
                }),
                _ => None,
            })
            .collect();
        let store_decisions = if store_items.is_empty() {
            Vec::new()
        } else if let Some(outcome) = self.store.try_spend_now(&store_items) {
            outcome?.decisions
        } else {
            self.store.spend(&store_items).await?.decisions
        };
        let mut store_decisions = one_each(store_decisions, store_items.len())?.into_iter();
        let items: Vec<ItemResult> = resolved
            .into_iter()
            .map(|r| {
                let mut decision = match r.rule {
                    Rule::Limited(_) => store_decisions.next().unwrap_or(DENIED),
                    Rule::Denied | Rule::InvalidId { deny: true } => DENIED,
                    Rule::Unlimited | Rule::NotConfigured | Rule::InvalidId { deny: false } => {
                        UNLIMITED
                    }
                };
                if r.oversize {
                    // Never allowed: no retry time would help.
                    decision.allowed = false;
                    decision.retry_in = 0;
                }
                ItemResult {
                    decision,
                    rule: r.rule,
                    name: r.name,
                    key: r.key,
                    shadow: r.shadow,
                    oversize: r.oversize,
                    mode: r.mode,
                }
            })
            .collect();
        Ok(with_overall(items))
    }

    /// Refunds each item's cost. Per item, `allowed` says whether its bucket changed.
    pub async fn refund(&self, items: &[ItemSpec<'_>]) -> Result<BatchResult, DecideError> {
        let resolved = self.resolve(&self.limits(), items, CheckOptions::default())?;
        let store_items: Vec<StoreItem> = resolved
            .iter()
            .filter_map(|r| match r.rule {
                Rule::Limited(limit) => Some(StoreItem {
                    key: r.key.clone(),
                    limit,
                    cost: r.cost,
                    mode: Mode::CheckAndSpend,
                }),
                _ => None,
            })
            .collect();
        let decisions = if store_items.is_empty() {
            Vec::new()
        } else {
            self.store.refund(&store_items).await?
        };
        let mut decisions = one_each(decisions, store_items.len())?.into_iter();
        let items: Vec<ItemResult> = resolved
            .into_iter()
            .map(|r| ItemResult {
                decision: match r.rule {
                    Rule::Limited(_) => decisions.next().unwrap_or(UNCHANGED),
                    _ => UNCHANGED,
                },
                rule: r.rule,
                name: r.name,
                key: r.key,
                shadow: false,
                oversize: false,
                mode: Mode::CheckAndSpend,
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
