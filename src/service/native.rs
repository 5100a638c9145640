//! The native API (`cellrate.v1.RateLimiter` and `cellrate.v1.Admin`): protobuf <-> domain
//! conversion only; deciding is the [`Decider`]'s.

use std::borrow::Cow;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::clock::{Nanos, SECOND};
use crate::gcra::{Decision, Limit, Mode, Window};
use crate::limits::config::{LimitTable, Policy};
use crate::limits::names::Name;
use crate::observe::metrics::Metrics;
use crate::proto::v1 as pb;
use crate::service::overrides::{
    calendar_of, policy_of, OverrideError, RuntimeOverride, RuntimeOverrides,
};
use crate::service::{
    count_decisions, trace, BatchResult, Decider, ItemResult, ItemSpec, Rule, Target,
};

/// The decision service (`Check`, `Refund`), served on the decision listener.
pub struct RateLimiterService {
    decider: Arc<Decider>,
    metrics: Arc<Metrics>,
}

impl RateLimiterService {
    pub fn new(decider: Arc<Decider>, metrics: Arc<Metrics>) -> RateLimiterService {
        RateLimiterService { decider, metrics }
    }
}

/// The admin service (`Reset`, `Inspect`), served only on the admin listener.
pub struct AdminService {
    decider: Arc<Decider>,
    denials: Option<Arc<crate::observe::top::DenialTracker>>,
    metrics: Option<Arc<Metrics>>,
}

impl AdminService {
    pub fn new(decider: Arc<Decider>) -> AdminService {
        AdminService {
            decider,
            denials: None,
            metrics: None,
        }
    }

    /// Counts temporary overrides set and cleared in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> AdminService {
        self.metrics = Some(metrics);
        self
    }

    fn count(&self, action: &str) {
        if let Some(metrics) = &self.metrics {
            metrics.runtime_override(action);
        }
    }

    /// Answers `Top` from `tracker` (without one, `Top` reports nothing).
    pub fn with_denials(
        mut self,
        tracker: Arc<crate::observe::top::DenialTracker>,
    ) -> AdminService {
        self.denials = Some(tracker);
        self
    }
}

impl AdminService {
    fn runtime(&self) -> Result<&RuntimeOverrides, Status> {
        self.decider
            .runtime_overrides()
            .map(|r| &**r)
            .ok_or_else(|| Status::unimplemented("temporary overrides are off on this server"))
    }
}

/// A known name and a valid id in its canonical form, or INVALID_ARGUMENT saying which.
fn named<'t>(table: &'t LimitTable, name: &str, id: &str) -> Result<(&'t Name, String), Status> {
    if name.len() > super::MAX_NAME {
        return Err(invalid(format!(
            "name: longer than {} bytes",
            super::MAX_NAME
        )));
    }
    let found = table
        .names()
        .get(name)
        .ok_or_else(|| invalid(format!("name: {}", table.names().unknown(name))))?;
    let canonical = found
        .format
        .canonicalize_cow(id)
        .map_err(|e| invalid(format!("id: {e} (format {} of {name})", found.format)))?;
    Ok((found, canonical.into_owned()))
}

/// The status of a change to the temporary overrides that was not made.
fn override_status(e: OverrideError) -> Status {
    match e {
        OverrideError::Invalid(message) => invalid(message),
        full @ OverrideError::Full { .. } => Status::failed_precondition(full.to_string()),
        shared @ OverrideError::Shared(_) => Status::unavailable(shared.to_string()),
    }
}

fn runtime_override(runtime: &RuntimeOverrides, entry: &RuntimeOverride) -> pb::RuntimeOverride {
    let mut out = pb::RuntimeOverride {
        name: entry.name.to_string(),
        id: entry.id.to_string(),
        expires_in: Some(duration(runtime.expires_in(entry))),
        comment: entry.comment.clone(),
        author: entry.author.clone(),
        ..Default::default()
    };
    match entry.policy {
        Policy::Limited { limit, .. } => {
            out.burst = limit.burst();
            out.count = limit.count();
            match limit.window() {
                Window::Gcra => out.period = Some(duration(limit.period())),
                Window::Calendar(period) => out.calendar = Some(period.text().to_string()),
            }
        }
        Policy::Unlimited => out.unlimited = true,
        Policy::Denied => out.deny = true,
    }
    out
}

/// Checks a `Top` request: (minutes, ids per name, name filter).
fn top_request(request: &pb::TopRequest) -> Result<(usize, usize, Option<&str>), Status> {
    use crate::observe::top::{SLOTS, TOP_K};
    let minutes = match request.minutes {
        0 => 1,
        m if m as usize <= SLOTS => m as usize,
        m => return Err(invalid(format!("minutes: {m} is not 1 to {SLOTS}"))),
    };
    let limit = match request.limit {
        0 => 10,
        n if n as usize <= TOP_K => n as usize,
        n => return Err(invalid(format!("limit: {n} is not 1 to {TOP_K}"))),
    };
    if request.name.len() > super::MAX_NAME {
        return Err(invalid(format!(
            "name: longer than {} bytes",
            super::MAX_NAME
        )));
    }
    let name = (!request.name.is_empty()).then_some(request.name.as_str());
    Ok((minutes, limit, name))
}

#[tonic::async_trait]
impl pb::rate_limiter_server::RateLimiter for RateLimiterService {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let answer = async {
            let items = item_specs(&request.get_ref().items, Use::Check)?;
            let result = self.decider.check(&items).await?;
            count_decisions(&self.metrics, "native", &result.items);
            trace::log_denied("native", request.metadata(), &result.items);
            let (overall, items) = decisions(&result);
            Ok(Response::new(pb::CheckResponse {
                overall: Some(overall),
                items,
            }))
        }
        .await;
        trace::log_failed("native", request.metadata(), answer)
    }

    async fn refund(
        &self,
        request: Request<pb::RefundRequest>,
    ) -> Result<Response<pb::RefundResponse>, Status> {
        let answer = async {
            let items = item_specs(&request.get_ref().items, Use::Refund)?;
            let result = self.decider.refund(&items).await?;
            let (overall, items) = decisions(&result);
            Ok(Response::new(pb::RefundResponse {
                overall: Some(overall),
                items,
            }))
        }
        .await;
        trace::log_failed("native", request.metadata(), answer)
    }
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn reset(
        &self,
        request: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetResponse>, Status> {
        let items = item_specs(&request.get_ref().items, Use::Admin)?;
        let deleted = self.decider.reset(&items).await?;
        tracing::info!(items = items.len(), deleted, "admin reset");
        Ok(Response::new(pb::ResetResponse { deleted }))
    }

    async fn inspect(
        &self,
        request: Request<pb::InspectRequest>,
    ) -> Result<Response<pb::InspectResponse>, Status> {
        let items = item_specs(&request.get_ref().items, Use::Admin)?;
        let table = self.decider.limits();
        let result = self.decider.inspect(&items).await?;
        let mut answers = decisions(&result).1;
        let runtime = self.decider.runtime_overrides();
        for (answer, item) in answers.iter_mut().zip(&request.get_ref().items) {
            answer.source = Some(source(&table, runtime.map(|r| &**r), item));
        }
        Ok(Response::new(pb::InspectResponse { items: answers }))
    }

    async fn top(
        &self,
        request: Request<pb::TopRequest>,
    ) -> Result<Response<pb::TopResponse>, Status> {
        let (minutes, limit, name) = top_request(request.get_ref())?;
        let names = self
            .denials
            .as_ref()
            .map(|tracker| tracker.top(minutes, limit, name))
            .unwrap_or_default();
        Ok(Response::new(pb::TopResponse {
            minutes: minutes as u32,
            names: names
                .into_iter()
                .map(|n| pb::TopName {
                    name: n.name,
                    denials: n.denials,
                    ids: n
                        .ids
                        .into_iter()
                        .map(|i| pb::TopId {
                            id: i.id,
                            denials: i.denials,
                            error: i.error,
                        })
                        .collect(),
                })
                .collect(),
        }))
    }

    async fn set_override(
        &self,
        request: Request<pb::SetOverrideRequest>,
    ) -> Result<Response<pb::SetOverrideResponse>, Status> {
        let runtime = self.runtime()?;
        let r = request.get_ref();
        let table = self.decider.limits();
        let (name, id) = named(&table, &r.name, &r.id)?;
        let period = match r.period.as_ref() {
            None => None,
            Some(period) => Some(
                duration_nanos(period)
                    .ok_or_else(|| invalid("period: out of range".to_string()))?,
            ),
        };
        let calendar = calendar_of(&r.calendar).map_err(invalid)?;
        let policy =
            policy_of(r.burst, r.count, period, r.unlimited, r.deny, calendar).map_err(invalid)?;
        if let Some(reason) = table.window_mismatch(name.number, &policy) {
            return Err(invalid(reason));
        }

        let ttl = r
            .ttl
            .as_ref()
            .and_then(duration_nanos)
            .ok_or_else(|| invalid("ttl: missing or out of range".to_string()))?;
        let entry = runtime
            .set(name, &id, policy, ttl, &r.comment, &r.author)
            .await
            .map_err(override_status)?;
        tracing::info!(
            name = %entry.name,
            id = %entry.id,
            ?policy,
            ttl_s = ttl / crate::clock::SECOND,
            comment = %entry.comment,
            author = %entry.author,
            "temporary override set"
        );
        self.count("set");
        Ok(Response::new(pb::SetOverrideResponse {
            entry: Some(runtime_override(runtime, &entry)),
        }))
    }

    async fn clear_override(
        &self,
        request: Request<pb::ClearOverrideRequest>,
    ) -> Result<Response<pb::ClearOverrideResponse>, Status> {
        let runtime = self.runtime()?;
        let table = self.decider.limits();
        let r = request.get_ref();
        let (name, id) = named(&table, &r.name, &r.id)?;
        let cleared = runtime.clear(name, &id).await.map_err(override_status)?;
        tracing::info!(name = %name.text, id = %id, cleared, "temporary override cleared");
        if cleared {
            self.count("clear");
        }
        Ok(Response::new(pb::ClearOverrideResponse { cleared }))
    }

    async fn list_overrides(
        &self,
        request: Request<pb::ListOverridesRequest>,
    ) -> Result<Response<pb::ListOverridesResponse>, Status> {
        let runtime = self.runtime()?;
        let table = self.decider.limits();
        let only = match request.get_ref().name.as_str() {
            "" => None,
            name => Some(
                table
                    .names()
                    .get(name)
                    .ok_or_else(|| invalid(format!("name: {}", table.names().unknown(name))))?
                    .number,
            ),
        };
        let entries = runtime
            .list(table.names(), only)
            .await
            .map_err(override_status)?
            .iter()
            .map(|e| runtime_override(runtime, e))
            .collect();
        Ok(Response::new(pb::ListOverridesResponse { entries }))
    }
}

/// Where the limit of a (valid) item comes from: a temporary override, else `table`.
fn source(
    table: &crate::limits::config::LimitTable,
    runtime: Option<&RuntimeOverrides>,
    item: &pb::Item,
) -> pb::LimitSource {
    use crate::limits::config::Source;
    use pb::limit_source::Kind;
    let of = |kind: Kind| pb::LimitSource {
        kind: kind as i32,
        ..Default::default()
    };
    if item.inline.is_some() {
        return of(Kind::CallerGiven);
    }
    let Some(name) = table.names().get(&item.name) else {
        return of(Kind::Unspecified);
    };
    let Ok(id) = name.format.canonicalize_cow(&item.id) else {
        return of(Kind::Unspecified);
    };
    if let Some((runtime, temporary)) = runtime.and_then(|r| Some((r, r.get(name, &id)?))) {
        return pb::LimitSource {
            kind: Kind::RuntimeOverride as i32,
            comment: temporary.comment.clone(),
            author: temporary.author.clone(),
            expires_in: Some(duration(runtime.expires_in(&temporary))),
            ..Default::default()
        };
    }
    match table.source(name, &id) {
        Source::Default => of(Kind::Default),
        Source::NotConfigured => of(Kind::NotConfigured),
        Source::Override {
            file,
            entry,
            comment,
        } => pb::LimitSource {
            kind: Kind::Override as i32,
            file: file.to_string(),
            entry,
            comment: comment.map(|c| c.to_string()).unwrap_or_default(),
            ..Default::default()
        },
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Check,
    Refund,
    Admin,
}

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

/// Converts request items, saying which item and field is wrong.
fn item_specs(items: &[pb::Item], usage: Use) -> Result<Vec<ItemSpec<'_>>, Status> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| item_spec(i, item, usage))
        .collect()
}

fn item_spec(i: usize, item: &pb::Item, usage: Use) -> Result<ItemSpec<'_>, Status> {
    let target = match (&item.inline, item.name.is_empty()) {
        (Some(_), false) => {
            return Err(invalid(format!(
                "items[{i}]: give either name and id, or inline, not both"
            )))
        }
        (None, true) => {
            return Err(invalid(format!(
                "items[{i}].name: empty (give name and id, or inline)"
            )))
        }
        (None, false) => Target::Named {
            name: Cow::Borrowed(&item.name),
            id: Cow::Borrowed(&item.id),
        },
        (Some(inline), true) => {
            if !item.id.is_empty() {
                return Err(invalid(format!(
                    "items[{i}].id: an inline limit takes inline.key, not id"
                )));
            }
            let limit = inline_limit(i, inline)?;
            Target::Inline {
                key: Cow::Borrowed(&inline.key),
                limit,
            }
        }
    };
    let mode = pb::Mode::try_from(item.mode)
        .map_err(|_| invalid(format!("items[{i}].mode: unknown mode {}", item.mode)))?;
    let mode = match mode {
        pb::Mode::CheckAndSpend => Mode::CheckAndSpend,
        pb::Mode::CheckOnly => Mode::CheckOnly,
        pb::Mode::SpendOnly => Mode::SpendOnly,
        pb::Mode::Charge => Mode::Charge,
    };
    match usage {
        Use::Check => {}
        Use::Refund if mode != Mode::CheckAndSpend => {
            return Err(invalid(format!(
                "items[{i}].mode: Refund takes no mode (leave it unset)"
            )))
        }
        Use::Refund => {}
        Use::Admin if mode != Mode::CheckAndSpend || item.cost.is_some() => {
            return Err(invalid(format!(
                "items[{i}]: Reset and Inspect take no cost or mode (leave them unset)"
            )))
        }
        Use::Admin => {}
    }
    Ok(ItemSpec {
        target,
        cost: item.cost,
        mode,
        limit: None,
    })
}

/// A protobuf duration as nanoseconds; `None` if negative or out of range.
fn duration_nanos(d: &prost_types::Duration) -> Option<Nanos> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return None;
    }
    d.seconds
        .checked_mul(SECOND)?
        .checked_add(i64::from(d.nanos))
}

/// Nanoseconds as a protobuf duration.
pub fn duration(nanos: Nanos) -> prost_types::Duration {
    prost_types::Duration {
        seconds: nanos.div_euclid(SECOND),
        nanos: nanos.rem_euclid(SECOND) as i32,
    }
}

fn limit_info(item: &ItemResult) -> Option<pb::LimitInfo> {
    let limit = match item.rule {
        Rule::Limited(limit) => Some(limit),
        _ => None,
    };
    Some(pb::LimitInfo {
        name: item.name.to_string(),
        burst: limit.map_or(0, |l| l.burst()),
        count: limit.map_or(0, |l| l.count()),
        period: limit.map(|l| duration(l.period())),
        key: item.key.to_string(),
        calendar: match limit.map(|l| l.window()) {
            Some(Window::Calendar(period)) => Some(period.text().to_string()),
            _ => None,
        },
    })
}

/// An inline limit's numbers: burst, count and period, or count and a calendar window.
fn inline_limit(i: usize, inline: &pb::InlineLimit) -> Result<Limit, Status> {
    let calendar =
        calendar_of(&inline.calendar).map_err(|e| invalid(format!("items[{i}].inline.{e}")))?;
    let period = match (&inline.period, calendar) {
        (Some(_), Some(_)) => {
            return Err(invalid(format!(
                "items[{i}].inline.period: a calendar limit takes no period (its window is it)"
            )))
        }
        (None, Some(_)) => None,
        (None, None) => return Err(invalid(format!("items[{i}].inline.period: missing"))),
        (Some(d), None) => Some(
            duration_nanos(d)
                .ok_or_else(|| invalid(format!("items[{i}].inline.period: out of range")))?,
        ),
    };
    let limit = match (period, calendar) {
        (Some(period), _) => Limit::new(inline.burst, inline.count, period),
        (None, Some(calendar)) if inline.burst == 0 || inline.burst == inline.count => {
            Limit::calendar(inline.count, calendar)
        }
        (None, _) => {
            return Err(invalid(format!(
                "items[{i}].inline.burst: {} is not the calendar window's count {} (leave it 0)",
                inline.burst, inline.count
            )))
        }
    };
    limit.map_err(|e| invalid(format!("items[{i}].inline: {e}")))
}

fn policy(rule: Rule) -> pb::Policy {
    match rule {
        Rule::Limited(_) => pb::Policy::Limited,
        Rule::Unlimited => pb::Policy::Unlimited,
        Rule::Denied | Rule::InvalidId { deny: true } => pb::Policy::Denied,
        // Never reached: the native API rejects invalid ids.
        Rule::InvalidId { deny: false } => pb::Policy::NotConfigured,
        Rule::NotConfigured => pb::Policy::NotConfigured,
    }
}

fn decision(d: &Decision, limit: Option<pb::LimitInfo>, rule: pb::Policy) -> pb::Decision {
    pb::Decision {
        allowed: d.allowed,
        remaining: d.remaining,
        retry_after: Some(duration(d.retry_in)),
        reset_after: Some(duration(d.reset_in)),
        limit,
        policy: rule as i32,
        source: None,
    }
}

/// The overall and per-item decisions of a batch.
fn decisions(result: &BatchResult) -> (pb::Decision, Vec<pb::Decision>) {
    let items = result
        .items
        .iter()
        .map(|item| decision(&item.decision, limit_info(item), policy(item.rule)))
        .collect();
    let overall = match result.overall_item {
        Some(i) => {
            let item = &result.items[i];
            decision(&result.overall, limit_info(item), policy(item.rule))
        }
        None => {
            // Nothing restricted the batch: say why (an allow-listed item, or no limit).
            let rule = if result.items.iter().any(|i| i.rule == Rule::Unlimited) {
                pb::Policy::Unlimited
            } else {
                pb::Policy::NotConfigured
            };
            decision(&result.overall, None, rule)
        }
    };
    (overall, items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip_and_reject_negatives() {
        let d = duration(1_500_000_000);
        assert_eq!((d.seconds, d.nanos), (1, 500_000_000));
        assert_eq!(duration_nanos(&d), Some(1_500_000_000));
        let negative = prost_types::Duration {
            seconds: -1,
            nanos: 0,
        };
        assert_eq!(duration_nanos(&negative), None);
        let huge = prost_types::Duration {
            seconds: i64::MAX,
            nanos: 0,
        };
        assert_eq!(duration_nanos(&huge), None);
    }
}
