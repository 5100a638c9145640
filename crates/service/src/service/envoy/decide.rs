//! ShouldRateLimit's request: its bounds checked, its descriptors mapped to limit names
//! and ids (or to a descriptor's own limit; one that cannot be decided as it came by its
//! domain's policy, `refusal.rs`), and the whole decided as one all-or-nothing batch.

use std::borrow::Cow;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Status;

use super::batch::{mode_of, Batch, Item, Note};
use super::ratelimit::quota_mode;
use super::refusal::{add_malformed, check_descriptor, check_request, envoy_error, target_name};
use super::reserve::reservation_of;
use super::values::stand_in_long_values;
use super::wire::Answer;
use super::{
    invalid, malformed, override_limit, stand_in, EnvoyRateLimitService, Refusal, MAX_ENTRIES,
};
use crate::service::ratelimit_bucket::descriptor_digest;
use crate::service::request::RatelimitTarget;
use crate::service::{
    count_decisions, trace, CheckOptions, DecideError, InvalidIds, ItemResult, ItemSpec, Rule,
    Target, MAX_LEASE_ID,
};
use cellrate_core::gcra::Mode;
use cellrate_limits::config::LimitTable;
use cellrate_limits::descriptors::Mapping;

impl EnvoyRateLimitService {
    /// Decides `request`. A descriptor that cannot be decided as it came is decided by its
    /// domain's `invalid_id` policy, and the request again without it (at most once per
    /// descriptor); only the request's own bounds and a store failure are errors.
    pub(super) async fn decide(
        &self,
        mut request: RateLimitRequest,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Answer, Status> {
        check_request(&request)?;
        stand_in_long_values(&mut request);
        // One snapshot for mapping and deciding: a reload never splits a request.
        let table = self.decider.limits();
        let mut malformed: Vec<(usize, Arc<str>)> = Vec::new();
        loop {
            // Spelled here, not in an async fn of its own: its future would be built and
            // moved into this one's on every request (BENCHMARKS.md #59).
            let mut batch = Batch::default();
            let results = match self.fill_batch(&table, &request, &malformed, &mut batch) {
                Err(refusal) => Err(refusal),
                Ok(()) => match &batch.reservation {
                    // Descriptors that name one bucket are decided with it, their hits
                    // summed (`CheckOptions::merge_duplicates`), each answering that one
                    // decision.
                    None if self.holds_some(&table, &request, &batch) => {
                        // Boxed, as the rare path (`held.rs`).
                        Box::pin(self.decide_held(&table, &request, &batch)).await
                    }
                    None => self.decide_items(&table, &request, &batch).await,
                    Some(reservation) => {
                        // Boxed: the reservation's states would otherwise widen every
                        // request's future, which is moved whole into its box (#52).
                        Box::pin(self.reserve(&request.domain, reservation)).await
                    }
                },
            };
            let refusal = match results {
                Ok(results) => return Ok(self.answer(&request, metadata, &batch, results)),
                Err(refusal) => refusal,
            };
            match refusal {
                Refusal::Request(status) => return Err(status),
                Refusal::Descriptor { d, name, message } => {
                    let policy = table.descriptors().invalid_ids(&request.domain);
                    if policy == InvalidIds::Reject || malformed.iter().any(|&(m, _)| m == d) {
                        return Err(invalid(message));
                    }
                    malformed.push((d, name));
                }
            }
        }
    }

    /// The answer to `request` once its `batch` is decided (`results`): the decisions
    /// counted and logged, the statuses and headers written.
    fn answer(
        &self,
        request: &RateLimitRequest,
        metadata: &tonic::metadata::MetadataMap,
        batch: &Batch<'_>,
        mut results: Vec<ItemResult>,
    ) -> Answer {
        for _ in 0..batch.unmatched {
            self.metrics.decision("envoy", "", "unmatched");
        }
        // The descriptor of each result: a reservation's are all its own.
        let owner = |i: usize| match &batch.reservation {
            Some(reservation) => reservation.d,
            None => batch.items.get(i).map_or(0, |item| item.d),
        };
        self.log_invalid_ids(request, owner, &results);
        let shown = |i: usize| match &batch.reservation {
            Some(_) => None,
            None => (batch.items.get(i)).and_then(|item| item.ratelimit.as_ref()?.shown.as_deref()),
        };
        count_decisions(&self.metrics, "envoy", &results, shown);
        trace::log_decision("envoy", metadata, &results);
        if batch.releases {
            // A release answers OK, whether it freed a lease or found none held.
            let released = results.iter_mut().filter(|r| r.mode == Mode::Release);
            released.for_each(|r| r.decision.allowed = true);
        }
        if batch.items.iter().any(|item| item.ratelimit.is_some()) {
            self.count_ratelimit(batch, &results);
        }
        let mut answer = self.respond(request.descriptors.len(), owner, &results);
        // Notes come from envoyproxy/ratelimit's format only.
        if !batch.notes.is_empty() {
            let quota = batch.quota();
            if !quota.is_empty() {
                quota_mode(&mut answer.response, &quota);
            }
            for (d, note) in &batch.notes {
                let status = answer.response.statuses.get_mut(*d);
                if let (Note::Unlimited, Some(status)) = (note, status) {
                    status.limit_remaining = u32::MAX;
                }
            }
        }
        // Descriptors that map to a `headers: hidden` limit: left out of what names them.
        let hidden: Vec<usize> = (results.iter().enumerate())
            .filter(|(_, item)| item.headers.hidden)
            .map(|(i, _)| owner(i))
            .collect();
        self.upstream_answer(request, batch, &hidden, &mut answer.response);
        answer
    }

    /// `request`'s descriptors mapped into one (empty) `batch`, those in `malformed` by the
    /// domain's `invalid_id` policy.
    fn fill_batch<'a>(
        &self,
        table: &'a LimitTable,
        request: &'a RateLimitRequest,
        malformed: &[(usize, Arc<str>)],
        batch: &mut Batch<'a>,
    ) -> Result<(), Refusal> {
        // hits_addend 0 means 1.
        let request_cost = u64::from(request.hits_addend.max(1));
        let skip = |d: usize| malformed.iter().any(|&(m, _)| m == d);
        // One lookup per request, none when no file is in that format.
        let ratelimit = table.ratelimit();
        if !ratelimit.is_empty() && ratelimit.has_domain(&request.domain) {
            // A domain in envoyproxy/ratelimit's file format: matched as it matches.
            for (d, descriptor) in request.descriptors.iter().enumerate() {
                if !skip(d) {
                    check_descriptor(d, descriptor)?;
                }
            }
            self.add_ratelimit(table, request, request_cost, batch, malformed)?;
            if self.options.quota_mode {
                // As upstream: every descriptor but an unlimited one, matched or not.
                let n = request.descriptors.len();
                batch.notes.retain(|(_, n)| !matches!(n, Note::Quota));
                let quota: Vec<usize> = (0..n).filter(|&d| !batch.unlimited(d)).collect();
                (batch.notes).extend(quota.into_iter().map(|d| (d, Note::Quota)));
            }
        } else {
            for (d, descriptor) in request.descriptors.iter().enumerate() {
                if skip(d) {
                    continue;
                }
                self.add_descriptor(table, &request.domain, request_cost, d, descriptor, batch)?;
            }
        }
        add_malformed(table, &request.domain, malformed, batch);
        // A hold is kept as one native Check: decided alone, so that its settlement
        // adjusts exactly what it held.
        if let Some(r) = batch
            .reservation
            .as_ref()
            .filter(|_| request.descriptors.len() > 1)
        {
            return Err(Refusal::Descriptor {
                d: r.d,
                name: r.names.first().cloned().unwrap_or_else(|| Arc::from("")),
                message: format!(
                    "descriptors[{}]: a reservation is decided alone, and this request has {} \
                     descriptors (send the others from a second rate limit filter)",
                    r.d,
                    request.descriptors.len()
                ),
            });
        }
        Ok(())
    }

    /// Adds descriptor `d`'s items to `batch`: one per limit name it maps to, or one on its
    /// own limit when it matches nothing but brings a limit.
    fn add_descriptor<'a>(
        &self,
        table: &'a LimitTable,
        domain: &str,
        request_cost: u64,
        d: usize,
        descriptor: &'a RateLimitDescriptor,
        batch: &mut Batch<'a>,
    ) -> Result<(), Refusal> {
        check_descriptor(d, descriptor)?;
        let given = descriptor
            .limit
            .as_ref()
            .map(override_limit)
            .transpose()
            .map_err(|e| malformed(d, format!("descriptors[{d}].limit: {e}")))?
            // Caller-given limits turned off: the field is ignored.
            .filter(|_| self.decider.caller_limits().enabled);
        let cost = descriptor
            .hits_addend
            .map_or(request_cost, |explicit| explicit.value);
        // At most MAX_ENTRIES (checked above): on the stack.
        let mut entry_buf = [("", ""); MAX_ENTRIES];
        for (slot, e) in entry_buf.iter_mut().zip(&descriptor.entries) {
            *slot = (e.key.as_str(), e.value.as_str());
        }
        let entries = &entry_buf[..descriptor.entries.len()];
        let spec = |target| ItemSpec {
            target,
            cost: Some(cost),
            mode: mode_of(descriptor),
            limit: given,
            lease: None,
        };
        match table.descriptors().map(table.names(), domain, entries) {
            Mapping::Limits { names, id } => {
                for name in names {
                    let target = Target::Named {
                        name: Cow::Borrowed(name),
                        id: id.clone(),
                    };
                    batch.items.push(Item::of(d, spec(target)));
                }
            }
            Mapping::Leases {
                names,
                id,
                lease,
                lease_key,
            } => {
                let lease = lease_of(d, descriptor, cost, lease, lease_key, names)?;
                let mode = match descriptor.is_negative_hits {
                    true => Mode::Release,
                    false => Mode::Acquire,
                };
                for name in names {
                    let spec = ItemSpec {
                        target: Target::Named {
                            name: Cow::Borrowed(name),
                            id: id.clone(),
                        },
                        cost: Some(1),
                        mode,
                        limit: None,
                        lease: Some(lease.clone()),
                    };
                    batch.items.push(Item::of(d, spec));
                }
                batch.releases |= descriptor.is_negative_hits;
            }
            Mapping::Reservations {
                names,
                id,
                request,
                request_key,
            } => {
                let reservation =
                    reservation_of(d, descriptor, names, id, request, request_key, cost)?;
                // The first is named if there are more (refused once all are mapped).
                batch.reservation.get_or_insert(reservation);
            }
            // An unmatched descriptor that brings its own limit is limited by it, on a
            // bucket named after the domain and entries (as envoyproxy/ratelimit does).
            Mapping::Unmatched => match given {
                None => batch.unmatched += 1,
                Some(limit) => {
                    let digest = descriptor_digest(domain, entries);
                    let target = Target::Descriptor { digest, limit };
                    batch.items.push(Item::of(d, spec(target)));
                }
            },
        }
        Ok(())
    }

    /// Decides a batch's items. The common case (items, none given back, no fixed-window
    /// counting) goes straight to the decider: each async layer costs instructions on
    /// every request.
    async fn decide_items(
        &self,
        table: &LimitTable,
        request: &RateLimitRequest,
        batch: &Batch<'_>,
    ) -> Result<Vec<ItemResult>, Refusal> {
        if self.plain(request, batch) {
            self.check(table, &request.domain, &batch.items).await
        } else {
            // Boxed, as the rare path: see `decide`.
            Box::pin(self.decide_batch(table, request, batch)).await
        }
    }

    /// A batch that [`Self::decide_batch`] would only pass to [`Self::check`]: it has
    /// items, none from a descriptor with `is_negative_hits`, and [`Self::check_counted`]
    /// would not count it in two steps.
    fn plain(&self, request: &RateLimitRequest, batch: &Batch<'_>) -> bool {
        !batch.items.is_empty()
            && !(batch.items.iter()).any(|item| request.descriptors[item.d].is_negative_hits)
            && !self.counts_in_two_steps(&batch.items)
    }

    /// Whether [`Self::check_counted`] reads the counts first: envoyproxy/ratelimit's
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT is asked for and every item counts in its
    /// fixed windows.
    fn counts_in_two_steps(&self, items: &[Item<'_>]) -> bool {
        let fixed_window = |i: &Item<'_>| {
            matches!(
                i.spec.target,
                Target::Ratelimit(RatelimitTarget {
                    every_hit: true,
                    ..
                })
            )
        };
        self.options.stop_increment_when_over_limit
            && !items.is_empty()
            && items.iter().all(fixed_window)
    }

    /// Decides the batch: the items of descriptors with `is_negative_hits` (Envoy 1.38+:
    /// hits given back, typically at stream end) are refunds, never past a full bucket, and
    /// answered OK; the others are decided all-or-nothing among themselves, as ever. A
    /// negative descriptor neither denies nor spends for the rest of its request.
    async fn decide_batch(
        &self,
        table: &LimitTable,
        request: &RateLimitRequest,
        batch: &Batch<'_>,
    ) -> Result<Vec<ItemResult>, Refusal> {
        // A release is decided with the rest (never refused, it counts toward nothing).
        // A malformed descriptor is denied, given back or not: it denies the request.
        let negative = |i: usize| {
            let item = &batch.items[i];
            request.descriptors[item.d].is_negative_hits
                && !item.spec.mode.is_lease()
                && !matches!(item.spec.target, Target::Malformed { .. })
        };
        let n = batch.items.len();
        if !(0..n).any(negative) {
            if n == 0 {
                return Ok(Vec::new());
            }
            return (self.check_counted(table, &request.domain, &batch.items)).await;
        }
        let (give, take): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| negative(i));
        let pick = |at: &[usize]| -> Vec<Item<'_>> {
            at.iter().map(|&i| batch.items[i].clone()).collect()
        };
        let mut results: Vec<Option<ItemResult>> = vec![None; n];
        if !take.is_empty() {
            let items = pick(&take);
            let taken = self.check_counted(table, &request.domain, &items).await?;
            for (&i, r) in take.iter().zip(taken) {
                results[i] = Some(r);
            }
        }
        let items = pick(&give);
        let options = CheckOptions {
            invalid_ids: table.descriptors().invalid_ids(&request.domain),
            oversize_denies: true,
            merge_duplicates: true,
            ..CheckOptions::default()
        };
        let given = match self.decider.refund_with(table, &items, options).await {
            Ok(result) => result.items,
            // The rest of the request has spent already, so it is not decided again (as a
            // refusal would have it): what is given back gives back nothing, as malformed.
            Err(DecideError::Invalid(_)) if !take.is_empty() => {
                Box::pin(self.gave_nothing(table, &request.domain, &items)).await?
            }
            Err(e) => return Err(envoy_error(e, &items)),
        };
        for (&i, mut r) in give.iter().zip(given) {
            // A refund is never a denial, whether or not the bucket changed.
            r.decision.allowed = true;
            results[i] = Some(r);
        }
        Ok(results.into_iter().flatten().collect())
    }

    /// The answers of give-back `items` that cannot be decided as they came: each
    /// descriptor decided as malformed (one item each), giving back nothing; an item
    /// answers its descriptor's decision.
    async fn gave_nothing(
        &self,
        table: &LimitTable,
        domain: &str,
        items: &[Item<'_>],
    ) -> Result<Vec<ItemResult>, Refusal> {
        let mut malformed: Vec<Item<'_>> = Vec::new();
        for item in items {
            if malformed.last().is_some_and(|m| m.d == item.d) {
                continue;
            }
            let spec = ItemSpec {
                target: Target::Malformed {
                    name: target_name(&item.spec),
                },
                cost: Some(1),
                mode: Mode::CheckAndSpend,
                limit: None,
                lease: None,
            };
            malformed.push(Item::of(item.d, spec));
        }
        let decided = self.check(table, domain, &malformed).await?;
        Ok((items.iter())
            .filter_map(|item| malformed.iter().position(|m| m.d == item.d))
            .filter_map(|at| decided.get(at).cloned())
            .collect())
    }

    /// [`Self::check`], with envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
    /// when asked for and every item counts in its fixed windows: the counts are read
    /// first (a cost of 0 spends nothing), and when the request takes some descriptor over
    /// its limit only those it takes over are counted, the others asked at a cost of 0.
    /// Not atomic across the two calls, as there (a GET, then INCRBY).
    async fn check_counted(
        &self,
        table: &LimitTable,
        domain: &str,
        items: &[Item<'_>],
    ) -> Result<Vec<ItemResult>, Refusal> {
        if !self.counts_in_two_steps(items) {
            return self.check(table, domain, items).await;
        }
        fn at<'s>(i: &Item<'s>, cost: u64) -> Item<'s> {
            let mut item = i.clone();
            item.spec.cost = Some(cost);
            item
        }
        let probe: Vec<Item<'_>> = items.iter().map(|i| at(i, 0)).collect();
        let seen = self.check(table, domain, &probe).await?;
        let over: Vec<bool> = seen
            .iter()
            .zip(items)
            .map(|(r, i)| {
                let cost = i.spec.cost.unwrap_or(1).min(i64::MAX as u64) as i64;
                !r.decision.allowed || r.decision.remaining < cost
            })
            .collect();
        if !over.contains(&true) {
            return self.check(table, domain, items).await;
        }
        let counted: Vec<Item<'_>> = items
            .iter()
            .zip(&over)
            .map(|(i, &o)| if o { i.clone() } else { at(i, 0) })
            .collect();
        self.check(table, domain, &counted).await
    }

    /// How a request of `domain` is decided.
    pub(super) fn check_options(&self, table: &LimitTable, domain: &str) -> CheckOptions {
        CheckOptions {
            invalid_ids: table.descriptors().invalid_ids(domain),
            oversize_denies: true,
            honour_shadow: true,
            shadow_all: self.options.shadow,
            merge_duplicates: true,
            once: None,
            holds: false,
        }
    }

    /// Decides `items` as one all-or-nothing batch.
    pub(super) async fn check(
        &self,
        table: &LimitTable,
        domain: &str,
        items: &[Item<'_>],
    ) -> Result<Vec<ItemResult>, Refusal> {
        let options = self.check_options(table, domain);
        match self.decider.check_with(table, items, options).await {
            Ok(result) => Ok(result.items),
            Err(e) => Err(envoy_error(e, items)),
        }
    }

    /// Logs descriptors whose id did not fit its name's format: at most one line a
    /// second (a client sending garbage must not flood the logs), with how many there were.
    fn log_invalid_ids(
        &self,
        request: &RateLimitRequest,
        owner: impl Fn(usize) -> usize,
        results: &[ItemResult],
    ) {
        let Some(i) = results
            .iter()
            .position(|r| matches!(r.rule, Rule::InvalidId { .. }))
        else {
            return;
        };
        let count = results
            .iter()
            .filter(|r| matches!(r.rule, Rule::InvalidId { .. }))
            .count() as u64;
        if let Some(left_out) = self.invalid_ids.admit(self.started.elapsed(), count) {
            let pending = left_out + count;
            let descriptor = &request.descriptors[owner(i)];
            let entries: Vec<String> = descriptor
                .entries
                .iter()
                .map(|e| format!("{}={}", short(&e.key), short(&e.value)))
                .collect();
            tracing::warn!(
                domain = short(&request.domain),
                limit = %results[i].name,
                example = entries.join(","),
                since_last_line = pending,
                "descriptors with an id that does not fit the limit's format"
            );
        }
    }
}

/// The lease id of descriptor `d` (mapped to concurrency limits `names`), checked: its
/// lease entry (`lease`: its index and value) present, a hit of 1 (`cost`), no limit of
/// its own; each refusal names the descriptor and field. An id that is not 1 to
/// [`MAX_LEASE_ID`] printable ASCII bytes stands for itself (`sha256:` and its digest's
/// hex), so that its release names the same lease.
fn lease_of<'e>(
    d: usize,
    descriptor: &RateLimitDescriptor,
    cost: u64,
    lease: Option<(usize, &'e str)>,
    key: &str,
    names: &[Arc<str>],
) -> Result<Cow<'e, str>, Refusal> {
    let refused = |message: String| Refusal::Descriptor {
        d,
        name: names.first().cloned().unwrap_or_else(|| Arc::from("")),
        message,
    };
    let Some((_, id)) = lease else {
        return Err(refused(format!(
            "descriptors[{d}].entries: no lease entry {:?} (its rule maps it to a \
             concurrency limit, whose leases are named by the request's id)",
            short(key)
        )));
    };
    if cost != 1 {
        let field = match descriptor.hits_addend {
            Some(_) => format!("descriptors[{d}].hits_addend"),
            None => format!("hits_addend (for descriptors[{d}])"),
        };
        return Err(refused(format!(
            "{field}: {cost}: a lease is one slot (hits 1 or unset)"
        )));
    }
    if descriptor.limit.is_some() {
        return Err(refused(format!(
            "descriptors[{d}].limit: a concurrency limit takes no limit from the descriptor"
        )));
    }
    if !id.is_empty() && id.len() <= MAX_LEASE_ID && id.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(Cow::Borrowed(id))
    } else {
        Ok(Cow::Owned(stand_in(id.as_bytes())))
    }
}

/// At most 64 characters of a caller's text, for a log line.
fn short(text: &str) -> &str {
    cellrate_core::text::first_chars(text, 64)
}
