//! The [`Decider`]: requests in domain terms -> one store batch -> decisions.
//!
//! Both front ends (the native API and Envoy's RLS) convert their protobuf requests into
//! [`ItemSpec`]s and call the decider, which resolves names and ids against the current
//! [`LimitTable`], checks the batch (size, duplicates, cost <= burst), sends the limited
//! items to the [`Store`] in one call and assembles per-item and overall decisions.
//! This is also the single place where a [`StoreError`] becomes a `tonic::Status`.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::gcra::{Decision, Limit, Mode};
use crate::limits::config::{LimitTable, Policy};
use crate::limits::names::{BucketKey, IdFormat, INLINE_NUMBER};
use crate::store::{Store, StoreError, StoreItem};

pub mod native;

/// The most items one request may name.
pub const MAX_BATCH: usize = 64;

/// The name reported for inline limits.
pub const INLINE_NAME: &str = "inline";

/// Which bucket an item names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A configured name and an id in its format.
    Named { name: String, id: String },
    /// A limit given in the request, keyed `"0:<key>"`.
    Inline { key: String, limit: Limit },
}

/// One item of a request, before resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemSpec {
    pub target: Target,
    /// Tokens; `None` means 1.
    pub cost: Option<u64>,
    pub mode: Mode,
}

impl ItemSpec {
    /// A named item of cost 1.
    pub fn named(name: &str, id: &str) -> ItemSpec {
        ItemSpec {
            target: Target::Named {
                name: name.to_string(),
                id: id.to_string(),
            },
            cost: None,
            mode: Mode::CheckAndSpend,
        }
    }
}

/// Which rule decided an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Limited(Limit),
    Unlimited,
    Denied,
    NotConfigured,
}

/// One item's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemResult {
    pub decision: Decision,
    pub rule: Rule,
    /// The limit's name (or [`INLINE_NAME`]).
    pub name: Arc<str>,
    pub key: BucketKey,
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

/// Why a request was not decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// The request is malformed: nothing was spent.
    #[error("{0}")]
    Invalid(String),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

impl From<DecideError> for tonic::Status {
    fn from(error: DecideError) -> tonic::Status {
        match error {
            DecideError::Invalid(message) => tonic::Status::invalid_argument(message),
            // UNAVAILABLE, never UNKNOWN: Envoy treats UNKNOWN as "allow", while UNAVAILABLE
            // lets its failure_mode_deny decide. A full memory store is transient too.
            DecideError::Store(e) => tonic::Status::unavailable(format!("store: {}", e.message)),
        }
    }
}

/// A resolved item.
struct Resolved {
    key: BucketKey,
    name: Arc<str>,
    rule: Rule,
    cost: u64,
    mode: Mode,
}

/// Decides requests against the current limits and a store.
pub struct Decider {
    limits: Arc<ArcSwap<LimitTable>>,
    store: Arc<dyn Store>,
}

impl Decider {
    /// A decider reading limits from `limits` (swapped by reload) and buckets from `store`.
    pub fn new(limits: Arc<ArcSwap<LimitTable>>, store: Arc<dyn Store>) -> Decider {
        Decider { limits, store }
    }

    /// The limits in force.
    pub fn limits(&self) -> Arc<LimitTable> {
        self.limits.load_full()
    }

    fn resolve(&self, items: &[ItemSpec]) -> Result<Vec<Resolved>, DecideError> {
        if items.is_empty() {
            return Err(DecideError::Invalid("items: empty batch".to_string()));
        }
        if items.len() > MAX_BATCH {
            return Err(DecideError::Invalid(format!(
                "items: {} items, at most {MAX_BATCH} per request",
                items.len()
            )));
        }
        // One snapshot for the whole batch: a reload never splits a request.
        let table = self.limits.load();
        let mut resolved = Vec::with_capacity(items.len());
        let mut seen: HashMap<BucketKey, usize> = HashMap::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let (key, name, rule) = match &item.target {
                Target::Named { name, id } => {
                    let found = table.names().get(name).ok_or_else(|| {
                        DecideError::Invalid(format!("items[{i}]: unknown limit name {name:?}"))
                    })?;
                    let canonical = found.format.canonicalize(id).map_err(|e| {
                        DecideError::Invalid(format!(
                            "items[{i}].id: {e} (format {} of {name})",
                            found.format
                        ))
                    })?;
                    let rule = match table.policy(found, &canonical) {
                        Some(Policy::Limited(limit)) => Rule::Limited(limit),
                        Some(Policy::Unlimited) => Rule::Unlimited,
                        Some(Policy::Denied) => Rule::Denied,
                        None => Rule::NotConfigured,
                    };
                    let key = BucketKey::new(found.number, &canonical);
                    (key, found.text.clone(), rule)
                }
                Target::Inline { key, limit } => {
                    let canonical = IdFormat::String
                        .canonicalize(key)
                        .map_err(|e| DecideError::Invalid(format!("items[{i}].inline.key: {e}")))?;
                    let key = BucketKey::new(INLINE_NUMBER, &canonical);
                    (key, Arc::from(INLINE_NAME), Rule::Limited(*limit))
                }
            };
            let cost = item.cost.unwrap_or(1);
            if let Rule::Limited(limit) = rule {
                if cost > limit.burst() {
                    return Err(DecideError::Invalid(format!(
                        "items[{i}]: cost {cost} exceeds the burst {} of {name}: it can never \
                         be allowed",
                        limit.burst()
                    )));
                }
            }
            if let Some(first) = seen.insert(key.clone(), i) {
                return Err(DecideError::Invalid(format!(
                    "items[{i}]: bucket {key} is already items[{first}] (each bucket once per \
                     request)"
                )));
            }
            resolved.push(Resolved {
                key,
                name,
                rule,
                cost,
                mode: item.mode,
            });
        }
        Ok(resolved)
    }

    /// Decides `items` all-or-nothing and spends when allowed.
    pub async fn check(&self, items: &[ItemSpec]) -> Result<BatchResult, DecideError> {
        let resolved = self.resolve(items)?;
        // A deny-listed item that counts denies the batch: decide the rest without spending.
        let denied = resolved
            .iter()
            .any(|r| r.rule == Rule::Denied && r.mode.counts());
        let store_items: Vec<StoreItem> = resolved
            .iter()
            .filter_map(|r| match r.rule {
                Rule::Limited(limit) => Some(StoreItem {
                    key: r.key.clone(),
                    limit,
                    cost: r.cost,
                    mode: if denied { Mode::CheckOnly } else { r.mode },
                }),
                _ => None,
            })
            .collect();
        let modes: Vec<Mode> = resolved.iter().map(|r| r.mode).collect();
        let mut store_decisions = if store_items.is_empty() {
            Vec::new()
        } else {
            self.store.spend(&store_items).await?.decisions
        }
        .into_iter();
        let items: Vec<ItemResult> = resolved
            .into_iter()
            .map(|r| {
                let decision = match r.rule {
                    Rule::Limited(_) => store_decisions.next().unwrap_or(UNLIMITED),
                    Rule::Denied => DENIED,
                    Rule::Unlimited | Rule::NotConfigured => UNLIMITED,
                };
                ItemResult {
                    decision,
                    rule: r.rule,
                    name: r.name,
                    key: r.key,
                }
            })
            .collect();
        Ok(with_overall(items, &modes))
    }

    /// Refunds each item's cost. Per item, `allowed` says whether its bucket changed.
    pub async fn refund(&self, items: &[ItemSpec]) -> Result<BatchResult, DecideError> {
        let resolved = self.resolve(items)?;
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
        let mut decisions = if store_items.is_empty() {
            Vec::new()
        } else {
            self.store.refund(&store_items).await?
        }
        .into_iter();
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
            })
            .collect();
        let changed = items.iter().any(|i| i.decision.allowed);
        // The overall refund reports the strictest bucket, and whether anything changed.
        let modes = vec![Mode::CheckAndSpend; items.len()];
        let mut result = with_overall(items, &modes);
        result.overall.allowed = changed;
        Ok(result)
    }

    /// Reports each item's bucket without spending (a cost-0 peek).
    pub async fn inspect(&self, items: &[ItemSpec]) -> Result<BatchResult, DecideError> {
        let peeks: Vec<ItemSpec> = items
            .iter()
            .map(|item| ItemSpec {
                cost: Some(0),
                mode: Mode::CheckOnly,
                ..item.clone()
            })
            .collect();
        self.check(&peeks).await
    }

    /// Deletes the items' buckets; returns how many were not full.
    pub async fn reset(&self, items: &[ItemSpec]) -> Result<u32, DecideError> {
        let keys: Vec<BucketKey> = self.resolve(items)?.into_iter().map(|r| r.key).collect();
        Ok(self.store.reset(&keys).await?)
    }
}

/// Adds the overall decision: the strictest of the counting items that are limited or
/// deny-listed (unlimited and not-configured items never restrict).
fn with_overall(items: Vec<ItemResult>, modes: &[Mode]) -> BatchResult {
    let mut overall_item = None;
    let mut overall = UNLIMITED;
    for (i, (item, mode)) in items.iter().zip(modes).enumerate() {
        let restricts = matches!(item.rule, Rule::Limited(_) | Rule::Denied) && mode.counts();
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
