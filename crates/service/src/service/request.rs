//! A request and its answer in domain terms, whichever API it came through: items naming
//! buckets ([`ItemSpec`], [`Target`]), how a front end wants them decided
//! ([`CheckOptions`]), and the per-item and overall answers ([`ItemResult`],
//! [`BatchResult`]), with the labels they are counted under.

use std::borrow::Cow;
use std::sync::Arc;

use super::InvalidIds;
use cellrate_core::clock::CalendarPeriod;
use cellrate_core::gcra::{Decision, Limit, Mode};
use cellrate_limits::config::Headers;
use cellrate_limits::names::BucketKey;

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
    /// and entries unambiguously (see [`super::envoy`]).
    Descriptor { digest: String, limit: Limit },
    /// A descriptor matched in a domain in envoyproxy/ratelimit's file format.
    Ratelimit(RatelimitTarget),
    /// An Envoy descriptor that cannot be decided as it came (malformed by its client),
    /// under the `deny` policy for invalid ids: decided as an invalid id of the limit
    /// `name` (empty when none is known), which denies the batch and spends nothing.
    Malformed { name: Arc<str> },
}

/// A descriptor matched in a domain in envoyproxy/ratelimit's file format: its bucket
/// (`digest`, of the domain and the entries), its limit (`None`: zero requests per unit,
/// [`Rule::Zero`]) and the window of its unit, the name answers and metrics give it, its
/// `shadow_mode`, and whether every hit counts, a denied one too (its fixed windows), or
/// only what is allowed (cellrate's GCRA). A limit the descriptor gave itself
/// (`caller_given`) counts in the caller-given key space, under its bounds and share, as
/// every other caller-given limit does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatelimitTarget {
    pub digest: String,
    pub limit: Option<Limit>,
    pub unit: CalendarPeriod,
    pub name: Arc<str>,
    pub shadow: bool,
    pub every_hit: bool,
    pub caller_given: bool,
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
    /// The lease id of an acquire or release (docs/concurrency.md).
    pub lease: Option<Cow<'a, str>>,
}

/// A batch may be given as items that carry more than their spec (Envoy's carry the
/// descriptor each came from): the decider reads the spec.
impl<'a> AsRef<ItemSpec<'a>> for ItemSpec<'a> {
    fn as_ref(&self) -> &ItemSpec<'a> {
        self
    }
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
            lease: None,
        }
    }

    /// The item with every string owned, for a task that outlives its request.
    pub fn into_owned(self) -> ItemSpec<'static> {
        let own = |c: Cow<'_, str>| Cow::Owned(c.into_owned());
        ItemSpec {
            target: match self.target {
                Target::Named { name, id } => Target::Named {
                    name: own(name),
                    id: own(id),
                },
                Target::Inline { key, limit } => Target::Inline {
                    key: own(key),
                    limit,
                },
                Target::Descriptor { digest, limit } => Target::Descriptor { digest, limit },
                Target::Malformed { name } => Target::Malformed { name },
                Target::Ratelimit(target) => Target::Ratelimit(target),
            },
            cost: self.cost,
            mode: self.mode,
            limit: self.limit,
            lease: self.lease.map(own),
        }
    }
}

/// The `result` label of a decided item, for `cellrate_decisions_total`.
pub fn outcome(item: &ItemResult) -> &'static str {
    match item.rule {
        Rule::Unlimited => "unlimited",
        Rule::NotConfigured => "not_configured",
        Rule::Denied => "denied",
        Rule::Zero(_) if item.decision.allowed => "allowed",
        Rule::Zero(_) if item.shadow => "shadow_denied",
        Rule::Zero(_) => "denied",
        Rule::InvalidId { .. } => "invalid",
        // A release frees a lease or finds none held: never a denial (nor in `top`).
        Rule::Limited(_) if item.mode == Mode::Release && item.decision.allowed => "released",
        Rule::Limited(_) if item.mode == Mode::Release => "not_held",
        Rule::Limited(_) if item.decision.allowed => "allowed",
        Rule::Limited(_) if item.shadow => "shadow_denied",
        Rule::Limited(_) => "denied",
    }
}

/// Counts a batch's items in `metrics` under `api`; a denied item's id (for `top`) is
/// what `shown` names it by (item `i`'s readable bucket name), else its bucket's id.
pub fn count_decisions<'s>(
    metrics: &cellrate_observe::metrics::Metrics,
    api: &'static str,
    items: &[ItemResult],
    shown: impl Fn(usize) -> Option<&'s str>,
) {
    for (i, item) in items.iter().enumerate() {
        let outcome = outcome(item);
        metrics.decided(api, &item.name, outcome);
        if outcome == "denied" {
            metrics.denied_id(&item.name, shown(i).unwrap_or_else(|| item.key.id()));
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
    /// Items that name a bucket already named in the batch (in the same mode, no lease)
    /// are decided with it, their costs summed, instead of being an error: Envoy's
    /// descriptors, which the caller does not choose one by one and whose error Envoy
    /// lets through by default.
    pub merge_duplicates: bool,
    /// A kept Check's spend, made once under its token ([`cellrate_store::Store::spend_once`]),
    /// or with `resolve` only resolved ([`cellrate_store::Store::resolve_once`]).
    pub once: Option<OnceSpend>,
    /// The Check holds an estimate (a reservation): its items are decided as spends even
    /// on a limit declared `overdraw`, so that a denied hold charges nothing (an estimate
    /// is not usage; what a settlement finds used beyond it still goes into debt).
    pub holds: bool,
}

/// A spend under a token (see [`CheckOptions::once`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnceSpend {
    pub once: cellrate_store::Once,
    /// Only learn what the spend did (and make sure that a late one spends nothing).
    pub resolve: bool,
}

/// Which rule decided an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Limited(Limit),
    Unlimited,
    Denied,
    /// A limit of zero a window (envoyproxy/ratelimit's `requests_per_unit: 0`): a
    /// request of no hits passes, any hit is over; answered with its window's reset, as
    /// there, so that Envoy's headers say why.
    Zero(CalendarPeriod),
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
            Rule::Limited(_) | Rule::Denied | Rule::Zero(_) | Rule::InvalidId { deny: true }
        )
    }
}

/// One item's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemResult {
    pub decision: Decision,
    pub rule: Rule,
    /// The limit's name (or [`super::INLINE_NAME`]).
    pub name: Arc<str>,
    pub key: BucketKey,
    /// Decided in shadow mode: a denial here did not deny the batch.
    pub shadow: bool,
    /// The cost exceeded the burst ([`CheckOptions::oversize_denies`]): denied for good.
    pub oversize: bool,
    /// How the item took part (a shadow item is spend-only).
    pub mode: Mode,
    /// What Envoy's rate-limit headers may say of the item's limit (hidden: nothing).
    pub headers: Headers,
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
