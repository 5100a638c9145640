//! How the decider turns a request's items into buckets: the name and the id in its
//! canonical form (or the caller's own limit), the rule in force (a temporary override,
//! the configured override or default, the caller's limit, allow and deny lists), the
//! cost checked against the burst, and each bucket at most once per request.

use std::sync::Arc;

use super::request::RatelimitTarget;
use super::{
    CheckOptions, DecideError, Decider, Invalid, InvalidIds, ItemSpec, Rule, Target, INLINE_NAME,
    MAX_BATCH, MAX_NAME,
};
use cellrate_core::gcra::{Limit, Mode, Window};
use cellrate_limits::config::{Behaviour, Headers, LimitTable, Policy};
use cellrate_limits::ids::IdFormat;
use cellrate_limits::names::{rule_share, BucketKey, RATELIMIT_NUMBER};

/// A resolved item.
pub(super) struct Resolved {
    pub(super) key: BucketKey,
    pub(super) name: Arc<str>,
    pub(super) rule: Rule,
    pub(super) cost: u64,
    pub(super) mode: Mode,
    pub(super) shadow: bool,
    pub(super) oversize: bool,
    /// What rate-limit headers may say of the item's limit.
    pub(super) headers: Headers,
    /// The lease id of an acquire or release.
    pub(super) lease: Option<Arc<str>>,
    /// Decided by this earlier item of the batch, which names the same bucket and holds
    /// this item's cost too ([`CheckOptions::merge_duplicates`]).
    pub(super) merged_into: Option<usize>,
}

/// Where an item's bucket is, before its rule: its key, its limit's name, the policy
/// configured for it (`None`: not configured) and how headers show it (a named limit as
/// its name's default, whatever override applies: a deny-listed id of a hidden limit stays
/// hidden).
struct Bucket {
    key: BucketKey,
    name: Arc<str>,
    policy: Option<Policy>,
    headers: Headers,
}

fn invalid(i: usize, field: &'static str, message: String) -> DecideError {
    DecideError::Invalid(Invalid::at(i, field, message))
}

fn invalid_batch(message: String) -> DecideError {
    DecideError::Invalid(Invalid {
        item: None,
        field: "",
        message,
    })
}

impl Decider {
    /// Resolves every item of a batch against `table`, or says which item is wrong and why.
    pub(super) fn resolve<'i, S: AsRef<ItemSpec<'i>>>(
        &self,
        table: &LimitTable,
        items: &[S],
        options: CheckOptions,
    ) -> Result<Vec<Resolved>, DecideError> {
        if items.is_empty() {
            return Err(invalid_batch("empty batch".to_string()));
        }
        if items.len() > MAX_BATCH {
            return Err(invalid_batch(format!(
                "{} items, at most {MAX_BATCH} per request",
                items.len()
            )));
        }
        let mut resolved: Vec<Resolved> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let item = self.resolve_item(table, i, item.as_ref(), options)?;
            // An invalid id has no bucket: decided without the store, never a duplicate.
            // At most 64 items: a scan beats hashing, and allocates nothing.
            let has_bucket = |r: &Resolved| !matches!(r.rule, Rule::InvalidId { .. });
            if has_bucket(&item) {
                if let Some(first) = resolved
                    .iter()
                    .position(|r| r.key == item.key && has_bucket(r))
                {
                    if mergeable(&resolved[first], &item, options) {
                        let merged = merge(i, &mut resolved[first], item, options)?;
                        resolved.push(Resolved {
                            merged_into: Some(first),
                            ..merged
                        });
                        continue;
                    }
                    return Err(invalid(
                        i,
                        "",
                        format!(
                            "bucket {} is already items[{first}] (each bucket once per request)",
                            // A key may hold a caller's text (the memcache store's are
                            // envoyproxy/ratelimit's): cut and escaped.
                            cellrate_core::text::printable(cellrate_core::text::cut_bytes(
                                item.key.as_str(),
                                128
                            ))
                        ),
                    ));
                }
            }
            resolved.push(item);
        }
        Ok(resolved)
    }

    fn resolve_item(
        &self,
        table: &LimitTable,
        i: usize,
        item: &ItemSpec<'_>,
        options: CheckOptions,
    ) -> Result<Resolved, DecideError> {
        // A caller-given limit outside the bounds: an error, or for Envoy a denial.
        let mut refused = false;
        // envoyproxy/ratelimit's limit of zero: its window, and its shadow mode.
        let mut zero = None;
        let bucket = match &item.target {
            Target::Malformed { name } => return Ok(malformed(table, name, item, options)),
            Target::Named { name, id } => match self.named(table, i, name, id, item, options)? {
                Ok(bucket) => bucket,
                Err(invalid_id) => return Ok(invalid_id),
            },
            Target::Inline { key, limit } => {
                refused |= self.check_caller(i, limit, options)?;
                let canonical = IdFormat::String
                    .canonicalize_cow(key)
                    .map_err(|e| invalid(i, ".inline.key", e.to_string()))?;
                caller_bucket(BucketKey::caller_given('i', limit, &canonical), limit)
            }
            Target::Descriptor { digest, limit } => {
                refused |= self.check_caller(i, limit, options)?;
                caller_bucket(BucketKey::caller_given('d', limit, digest), limit)
            }
            Target::Ratelimit(target) => {
                // A temporary override of the bucket (one atomic load when none is held).
                let temporary = self.runtime_overrides().and_then(|r| r.ratelimit(target));
                if target.limit.is_none() && temporary.is_none() {
                    zero = Some((target.unit, target.shadow));
                }
                if let Some(limit) = target.limit.as_ref().filter(|_| target.caller_given) {
                    refused |= self.check_caller(i, limit, options)?;
                }
                let bucket = ratelimit_bucket(target);
                match temporary {
                    Some(temporary) => ratelimit_overridden(bucket, target, temporary),
                    None => bucket,
                }
            }
        };
        if let Some(given) = &item.limit {
            refused |= self.check_caller(i, given, options)?;
        }
        // A caller's own numbers replace the configured limit's, not how it behaves.
        let mut behaviour = bucket.policy.map(|p| p.behaviour()).unwrap_or_default();
        let rule = match (bucket.policy, item.limit) {
            (Some(Policy::Unlimited), _) => Rule::Unlimited,
            (Some(Policy::Denied), _) => Rule::Denied,
            (Some(Policy::Limited { .. }) | None, Some(given)) => Rule::Limited(given),
            (Some(Policy::Limited { limit, .. }), None) => Rule::Limited(limit),
            (None, None) => Rule::NotConfigured,
        };
        // envoyproxy/ratelimit's zero (its bucket's policy is a denial): a rule of its own.
        let rule = match zero {
            Some((unit, shadow)) if item.limit.is_none() => {
                behaviour.shadow = shadow;
                Rule::Zero(unit)
            }
            _ => rule,
        };
        let shadow = options.shadow_all || (options.honour_shadow && behaviour.shadow);
        let mode = match item.mode {
            // A lease is taken or freed, or nothing: shadow mode does not apply to it.
            mode if mode.is_lease() => mode,
            _ if shadow => Mode::SpendOnly,
            // On a limit declared `overdraw`, a spend is a charge: recorded whatever is left
            // (not a hold's estimate, `CheckOptions::holds`).
            Mode::CheckAndSpend if behaviour.overdraw && !options.holds => Mode::Charge,
            mode => mode,
        };
        let (cost, oversize) = cost(i, item, rule, mode, refused, &bucket.name, options)?;
        Ok(Resolved {
            key: bucket.key,
            name: bucket.name,
            rule,
            cost,
            mode,
            shadow,
            oversize,
            headers: bucket.headers,
            lease: item.lease.as_deref().map(Arc::from),
            merged_into: None,
        })
    }

    /// A configured name's bucket; `Err` (in `Ok`) the resolved item of an id that does
    /// not fit the name's format, when the options let such ids through.
    fn named(
        &self,
        table: &LimitTable,
        i: usize,
        name: &str,
        id: &str,
        item: &ItemSpec<'_>,
        options: CheckOptions,
    ) -> Result<Result<Bucket, Resolved>, DecideError> {
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
                let key = BucketKey::new(found.number, "");
                let headers = table.headers(found);
                return Ok(Err(invalid_id(
                    key,
                    found.text.clone(),
                    headers,
                    item,
                    options,
                )));
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
            None => BucketKey::windowed(
                found.number,
                &canonical,
                policy.map_or(Window::Gcra, |p| p.window()),
            ),
        };
        // A limited policy carries its name's visibility (an override replaces numbers
        // only); a deny or unlimited one has none, so it is read from the name's default.
        let headers = match policy {
            Some(Policy::Limited { behaviour, .. }) => behaviour.headers,
            _ => table.headers(found),
        };
        Ok(Ok(Bucket {
            key,
            name: found.text.clone(),
            policy,
            headers,
        }))
    }

    /// Checks a caller-given limit against the bounds: an error when caller-given limits
    /// are off or it is out of bounds, except that with [`CheckOptions::oversize_denies`]
    /// an out-of-bounds limit is `Ok(true)`: the item is refused (denied), not the request.
    fn check_caller(
        &self,
        i: usize,
        limit: &Limit,
        options: CheckOptions,
    ) -> Result<bool, DecideError> {
        if !self.caller.enabled {
            return Err(invalid(
                i,
                ".inline",
                "caller-given limits are turned off on this server".to_string(),
            ));
        }
        match self.caller.refuse(limit) {
            Some(_) if options.oversize_denies => Ok(true),
            Some(reason) => Err(invalid(i, ".inline", reason)),
            None => Ok(false),
        }
    }
}

/// The resolved item of an id that does not fit its name's format (or of a descriptor
/// that cannot be decided as it came): no bucket, denied under [`InvalidIds::Deny`].
fn invalid_id(
    key: BucketKey,
    name: Arc<str>,
    headers: Headers,
    item: &ItemSpec<'_>,
    options: CheckOptions,
) -> Resolved {
    Resolved {
        key,
        name,
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
        headers,
        lease: None,
        merged_into: None,
    }
}

/// The resolved item of an Envoy descriptor that cannot be decided as it came: an invalid
/// id of the limit `name` (with a configured name's visibility, else none to hide).
fn malformed(
    table: &LimitTable,
    name: &Arc<str>,
    item: &ItemSpec<'_>,
    options: CheckOptions,
) -> Resolved {
    let found = table.names().get(name);
    let key = BucketKey::new(found.map_or(0, |f| f.number), "");
    let headers = found.map_or_else(Headers::default, |f| table.headers(f));
    invalid_id(key, name.clone(), headers, item, options)
}

/// The most bytes of a lease id.
pub const MAX_LEASE_ID: usize = cellrate_core::gcra::lease::MAX_ID_BYTES;

/// Checks what acquires and releases need (docs/concurrency.md): a concurrency limit is
/// only acquired, released or peeked (`Mode::Probe`), in no other mode (`refund`: never),
/// with cost 1 and a lease id of 1 to [`MAX_LEASE_ID`] printable ASCII bytes; and only a
/// concurrency limit is acquired or released.
pub(super) fn lease_rules(resolved: &[Resolved], refund: bool) -> Result<(), DecideError> {
    for (i, r) in resolved.iter().enumerate() {
        let concurrency = matches!(r.rule, Rule::Limited(l) if l.window() == Window::Concurrency);
        if concurrency && refund {
            return Err(invalid(
                i,
                "",
                format!(
                    "{} is a concurrency limit: release its lease (MODE_RELEASE), do not refund",
                    r.name
                ),
            ));
        }
        if !r.mode.is_lease() {
            if concurrency && r.mode != Mode::Probe {
                return Err(invalid(
                    i,
                    ".mode",
                    format!(
                        "{} is a concurrency limit: MODE_ACQUIRE or MODE_RELEASE with a lease_id",
                        r.name
                    ),
                ));
            }
            if r.lease.is_some() {
                return Err(invalid(
                    i,
                    ".lease_id",
                    "only MODE_ACQUIRE and MODE_RELEASE take a lease id".to_string(),
                ));
            }
            continue;
        }
        if !concurrency && matches!(r.rule, Rule::Limited(_)) {
            return Err(invalid(
                i,
                ".mode",
                format!(
                    "{} is not a concurrency limit (window: concurrency): it has no leases",
                    r.name
                ),
            ));
        }
        if r.cost != 1 {
            return Err(invalid(
                i,
                ".cost",
                format!("{}: a lease is one slot (cost 1 or unset)", r.cost),
            ));
        }
        match r.lease.as_deref() {
            None => {
                return Err(invalid(
                    i,
                    ".lease_id",
                    "missing (an acquire or release names its lease)".to_string(),
                ))
            }
            Some(id) if id.len() > MAX_LEASE_ID => {
                return Err(invalid(
                    i,
                    ".lease_id",
                    format!("{} bytes, at most {MAX_LEASE_ID}", id.len()),
                ))
            }
            Some(id) if !id.bytes().all(|b| b.is_ascii_graphic()) => {
                return Err(invalid(
                    i,
                    ".lease_id",
                    "not printable ASCII (0x21-0x7e)".to_string(),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The bucket of a limit the caller gave (inline, or an unmatched descriptor's).
fn caller_bucket(key: BucketKey, limit: &Limit) -> Bucket {
    Bucket {
        key,
        name: Arc::from(INLINE_NAME),
        policy: Some(Policy::limited(*limit)),
        headers: Headers::default(),
    }
}

/// Whether `item`, naming the bucket of `first`, is decided with it
/// ([`CheckOptions::merge_duplicates`]): same mode and rule, and no lease (a lease is one
/// slot, taken once).
fn mergeable(first: &Resolved, item: &Resolved, options: CheckOptions) -> bool {
    options.merge_duplicates
        && first.merged_into.is_none()
        && first.mode == item.mode
        && first.rule == item.rule
        && first.lease.is_none()
        && item.lease.is_none()
}

/// Adds `item`'s cost to `first`'s (an oversize sum denies, as one oversize item does) and
/// returns `item`, costing nothing itself.
fn merge(
    i: usize,
    first: &mut Resolved,
    item: Resolved,
    options: CheckOptions,
) -> Result<Resolved, DecideError> {
    let cost = first.cost.saturating_add(item.cost);
    let over = match first.rule {
        Rule::Limited(limit) => cost > limit.burst() && first.mode != Mode::Charge,
        _ => false,
    };
    if item.oversize || over {
        if !options.oversize_denies {
            return Err(invalid(
                i,
                "",
                format!("cost {cost} exceeds the burst of {}", first.name),
            ));
        }
        first.oversize = true;
        first.cost = 0;
    } else if !first.oversize {
        first.cost = cost;
    }
    Ok(Resolved { cost: 0, ..item })
}

/// The bucket of a descriptor of envoyproxy/ratelimit's format ([`Target::Ratelimit`]).
///
/// A caller's own limit counted in a window (fixed-window counting, or zero) is keyed by
/// its window and the descriptor, not by its count, as upstream keys its counter: a limit
/// that changes within the window (AI Gateway's budget from metadata, a tenant's tier
/// raised from 2 to 6) reads what the window already counted, where a key of its own
/// would start it empty. Under GCRA counting the limit shapes what its bucket stores (the
/// TAT), so there the limit stays in the key.
fn ratelimit_bucket(target: &RatelimitTarget) -> Bucket {
    let (digest, limit) = (target.digest.as_str(), target.limit);
    // A zero limit counts in its unit's window.
    let window = limit.map_or(Window::Calendar(target.unit), |l| l.window());
    let key = match (limit, window) {
        (_, Window::Calendar(period)) if target.caller_given => {
            BucketKey::caller_window('r', period, digest)
        }
        (Some(limit), _) if target.caller_given => BucketKey::caller_given('r', &limit, digest),
        // Every such rule's buckets are number 99 in their text: each rule counts against
        // a share of the table of its own (a flood of fresh values on one rule leaves the
        // others room), by its label.
        _ => BucketKey::windowed(RATELIMIT_NUMBER, digest, window)
            .with_share(rule_share(&target.name)),
    };
    let behaviour = Behaviour {
        shadow: target.shadow,
        overdraw: target.every_hit,
        headers: Headers::default(),
    };
    Bucket {
        key,
        name: target.name.clone(),
        policy: Some(match limit {
            Some(limit) => Policy::Limited { limit, behaviour },
            None => Policy::Denied,
        }),
        headers: Headers::default(),
    }
}

/// The bucket of a descriptor of envoyproxy/ratelimit's format under a temporary override:
/// a limit replaces the numbers and keeps how the limit counts (every hit in its unit's
/// windows, its shadow mode), as a configured name's override keeps its behaviour; its
/// window is the bucket's (checked where it is set and where it is found), so the key
/// stays. `unlimited` or `deny` applies as it is.
fn ratelimit_overridden(bucket: Bucket, target: &RatelimitTarget, temporary: Policy) -> Bucket {
    let policy = match temporary {
        Policy::Limited { limit, .. } => Policy::Limited {
            limit,
            behaviour: Behaviour {
                shadow: target.shadow,
                overdraw: target.every_hit,
                headers: Headers::default(),
            },
        },
        other => other,
    };
    Bucket {
        policy: Some(policy),
        ..bucket
    }
}

/// The item's cost, and whether it is oversize: refused, or above its limit's burst (an
/// error unless [`CheckOptions::oversize_denies`]; a charge may exceed the burst, it goes
/// into debt). An oversize item costs nothing: the bucket is reported as it is (a peek)
/// and the item is denied.
fn cost(
    i: usize,
    item: &ItemSpec<'_>,
    rule: Rule,
    mode: Mode,
    refused: bool,
    name: &str,
    options: CheckOptions,
) -> Result<(u64, bool), DecideError> {
    let cost = item.cost.unwrap_or(1);
    if refused {
        // Never allowed, whatever the bucket holds (as a cost above the burst).
        return Ok((0, true));
    }
    match rule {
        Rule::Limited(limit) if cost > limit.burst() && mode != Mode::Charge => {
            if options.oversize_denies {
                Ok((0, true))
            } else {
                Err(invalid(
                    i,
                    "",
                    format!(
                        "cost {cost} exceeds the burst {} of {name}: it can never be allowed",
                        limit.burst()
                    ),
                ))
            }
        }
        _ => Ok((cost, false)),
    }
}
