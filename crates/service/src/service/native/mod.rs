//! The native API (`cellrate.v1.RateLimiter` and `cellrate.v1.Admin`): protobuf <-> domain
//! conversion only (`convert.rs`); deciding is the [`Decider`]'s, settling the
//! [`Settler`]'s (`service::settle`).

mod convert;
mod in_flight;
mod wire;

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::proto::v1 as pb;
use crate::service::overrides::{
    calendar_of, policy_of, ratelimit_policy, ratelimit_slot, OverrideError, RatelimitSlot,
    RuntimeOverride, RuntimeOverrides,
};
use cellrate_core::gcra::Window;
use cellrate_limits::config::{LimitTable, Policy};
use cellrate_limits::names::Name;
use cellrate_observe::metrics::Metrics;
pub use convert::duration;
use convert::{check_headers, header_style};
pub(crate) use convert::{decisions, item_specs, Use};
use convert::{duration_nanos, invalid};
pub use wire::NativeServer;

use crate::service::ratelimit_bucket::named_target;
use crate::service::settle::{Settler, ENVOY_REQUEST_IDS};
use crate::service::{count_decisions, trace, Decider, ItemSpec};
use cellrate_store::shared::Settlements;

/// The decision service (`Check`, `Refund`), served on the decision listener.
pub struct RateLimiterService {
    decider: Arc<Decider>,
    metrics: Arc<Metrics>,
    /// Where Checks with a request id are kept for `Settle` (none: `Settle` is off).
    settler: Option<Settler>,
}

impl RateLimiterService {
    pub fn new(decider: Arc<Decider>, metrics: Arc<Metrics>) -> RateLimiterService {
        RateLimiterService {
            decider,
            metrics,
            settler: None,
        }
    }

    /// Keeps Checks with a request id in `table`, for `Settle`.
    pub fn with_settlements(mut self, table: Arc<dyn Settlements>) -> RateLimiterService {
        self.settler = Some(Settler::new(table, self.metrics.clone()));
        self
    }

    fn settler(&self) -> Result<&Settler, Status> {
        self.settler
            .as_ref()
            .ok_or_else(|| Status::unimplemented("settlements are not kept by this server"))
    }
}

/// Refuses a request id in the space of Envoy's reservations (`envoy:`), which a native
/// call may neither hold nor settle.
fn not_envoys(request_id: &str) -> Result<(), Status> {
    if request_id.starts_with(ENVOY_REQUEST_IDS) {
        return Err(Status::invalid_argument(format!(
            "request_id: ids beginning {ENVOY_REQUEST_IDS:?} are Envoy's reservations"
        )));
    }
    Ok(())
}

/// The admin service (`Reset`, `Inspect`), served only on the admin listener.
pub struct AdminService {
    decider: Arc<Decider>,
    denials: Option<Arc<cellrate_observe::top::DenialTracker>>,
    metrics: Option<Arc<Metrics>>,
    /// One `Top` in flight counted at a time.
    in_flight_gate: Arc<tokio::sync::Semaphore>,
}

impl AdminService {
    pub fn new(decider: Arc<Decider>) -> AdminService {
        AdminService {
            decider,
            denials: None,
            metrics: None,
            in_flight_gate: Arc::new(tokio::sync::Semaphore::new(1)),
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
        tracker: Arc<cellrate_observe::top::DenialTracker>,
    ) -> AdminService {
        self.denials = Some(tracker);
        self
    }
}

impl AdminService {
    /// An admin request's items: a limit of envoyproxy/ratelimit's format is named by its
    /// label (as answers, metrics and `top` name it) and the readable name of its bucket
    /// (`domain/key=value/...`, as `top` shows it), and reaches the bucket the Envoy front
    /// end counts on; every other item as the native API reads it.
    fn admin_items<'r>(&self, items: &'r [pb::Item]) -> Result<Vec<ItemSpec<'r>>, Status> {
        let mut specs = item_specs(items, Use::Admin)?;
        let table = self.decider.limits();
        let shape = self.decider.ratelimit_shape();
        for (spec, item) in specs.iter_mut().zip(items) {
            if item.inline.is_some() || table.names().get(&item.name).is_some() {
                continue;
            }
            if let Some(target) = named_target(&table, shape, &item.name, &item.id) {
                spec.target = target;
            }
        }
        Ok(specs)
    }

    fn runtime(&self) -> Result<&RuntimeOverrides, Status> {
        self.decider
            .runtime_overrides()
            .map(|r| &**r)
            .ok_or_else(|| Status::unimplemented("temporary overrides are off on this server"))
    }
}

/// What a temporary override names: a configured name and an id in its canonical form,
/// or a bucket of a limit of envoyproxy/ratelimit's format (its label and the bucket's
/// readable name, as `top` shows them).
enum Overridden<'t> {
    Named(&'t Name, String),
    Ratelimit(RatelimitSlot),
}

/// What `name` and `id` name, or INVALID_ARGUMENT saying what is wrong.
fn named<'t>(
    table: &'t LimitTable,
    shape: crate::service::RatelimitShape,
    name: &str,
    id: &str,
) -> Result<Overridden<'t>, Status> {
    if name.len() > super::MAX_NAME {
        return Err(invalid(format!(
            "name: longer than {} bytes",
            super::MAX_NAME
        )));
    }
    if let Some(slot) = ratelimit_slot(table, shape, name, id).map_err(invalid)? {
        return Ok(Overridden::Ratelimit(slot));
    }
    let found = known(table, name)?;
    let canonical = found
        .format
        .canonicalize_cow(id)
        .map_err(|e| invalid(format!("id: {e} (format {} of {name})", found.format)))?;
    Ok(Overridden::Named(found, canonical.into_owned()))
}

/// A known name, or INVALID_ARGUMENT saying what is known.
fn known<'t>(table: &'t LimitTable, name: &str) -> Result<&'t Name, Status> {
    (table.names().get(name))
        .ok_or_else(|| invalid(format!("name: {}", table.names().unknown(name))))
}

/// The number of the name a listing is narrowed to (`None`: empty, every name).
fn only_name(table: &LimitTable, name: &str) -> Result<Option<u32>, Status> {
    match name {
        "" => Ok(None),
        name => Ok(Some(known(table, name)?.number)),
    }
}

/// The name (or ratelimit-format label) a listing of overrides is narrowed to (`None`:
/// empty, all).
fn only_overridden<'r>(table: &LimitTable, name: &'r str) -> Result<Option<&'r str>, Status> {
    match name {
        "" => Ok(None),
        label if table.ratelimit().labels().contains(&label) => Ok(Some(label)),
        name => known(table, name).map(|_| Some(name)),
    }
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
                // A concurrency limit's period is its hold.
                Window::Gcra | Window::Concurrency => out.period = Some(duration(limit.period())),
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
    use cellrate_observe::top::{SLOTS, TOP_K};
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
            let style = header_style(request.get_ref().headers)?;
            let result = match request.get_ref().request_id.is_empty() {
                true => self.decider.check(&items).await?,
                false => {
                    // A Check kept for Settle spends tokens; a lease is released, not settled.
                    if let Some(i) = items.iter().position(|i| i.mode.is_lease()) {
                        return Err(Status::invalid_argument(format!(
                            "items[{i}].mode: a Check with a request_id (kept for Settle) \
                             takes no MODE_ACQUIRE or MODE_RELEASE items"
                        )));
                    }
                    not_envoys(&request.get_ref().request_id)?;
                    let settler = self.settler()?;
                    let id = &request.get_ref().request_id;
                    settler.check(&self.decider, id, &items).await?
                }
            };
            count_decisions(&self.metrics, "native", &result.items, |_| None);
            trace::log_decision("native", request.metadata(), &result.items);
            let (overall, items) = decisions(&result);
            Ok(Response::new(pb::CheckResponse {
                overall: Some(overall),
                items,
                headers: check_headers(style, &result),
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

    async fn settle(
        &self,
        request: Request<pb::SettleRequest>,
    ) -> Result<Response<pb::SettleResponse>, Status> {
        let answer = async {
            not_envoys(&request.get_ref().request_id)?;
            let settler = self.settler()?;
            let r = request.get_ref();
            let settled = settler
                .settle(&self.decider, &r.request_id, &r.costs)
                .await?;
            Ok(Response::new(pb::SettleResponse {
                items: decisions(&settled.result).1,
                already_settled: settled.already_settled,
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
        let items = self.admin_items(&request.get_ref().items)?;
        let deleted = self.decider.reset(&items).await?;
        tracing::info!(items = items.len(), deleted, "admin reset");
        Ok(Response::new(pb::ResetResponse { deleted }))
    }

    async fn inspect(
        &self,
        request: Request<pb::InspectRequest>,
    ) -> Result<Response<pb::InspectResponse>, Status> {
        let items = self.admin_items(&request.get_ref().items)?;
        let table = self.decider.limits();
        let result = self.decider.inspect(&items).await?;
        let mut answers = decisions(&result).1;
        let runtime = self.decider.runtime_overrides();
        for (answer, item) in answers.iter_mut().zip(&request.get_ref().items) {
            let shape = self.decider.ratelimit_shape();
            answer.source = Some(source(&table, shape, runtime.map(|r| &**r), item));
        }
        Ok(Response::new(pb::InspectResponse { items: answers }))
    }

    async fn top(
        &self,
        request: Request<pb::TopRequest>,
    ) -> Result<Response<pb::TopResponse>, Status> {
        if request.get_ref().in_flight {
            let gate = &self.in_flight_gate;
            let answer = in_flight::top_in_flight(&self.decider, gate, request.get_ref());
            return answer.await.map(Response::new);
        }
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
            in_flight: Vec::new(),
        }))
    }

    async fn set_override(
        &self,
        request: Request<pb::SetOverrideRequest>,
    ) -> Result<Response<pb::SetOverrideResponse>, Status> {
        let runtime = self.runtime()?;
        let r = request.get_ref();
        let table = self.decider.limits();
        let named = named(&table, self.decider.ratelimit_shape(), &r.name, &r.id)?;
        let period = match r.period.as_ref() {
            None => None,
            Some(period) => Some(
                duration_nanos(period)
                    .ok_or_else(|| invalid("period: out of range".to_string()))?,
            ),
        };
        let calendar = calendar_of(&r.calendar).map_err(invalid)?;
        let policy = match &named {
            Overridden::Named(name, _) => {
                let policy = policy_of(r.burst, r.count, period, r.unlimited, r.deny, calendar)
                    .map_err(invalid)?;
                if let Some(reason) = table.window_mismatch(name.number, &policy) {
                    return Err(invalid(reason));
                }
                policy
            }
            Overridden::Ratelimit(slot) => {
                let numbers = (r.burst, r.count, period);
                ratelimit_policy(slot, numbers, r.unlimited, r.deny, calendar).map_err(invalid)?
            }
        };
        let ttl = r
            .ttl
            .as_ref()
            .and_then(duration_nanos)
            .ok_or_else(|| invalid("ttl: missing or out of range".to_string()))?;
        let entry = match &named {
            Overridden::Named(name, id) => {
                { runtime.set(name, id, policy, ttl, &r.comment, &r.author) }.await
            }
            Overridden::Ratelimit(slot) => {
                (runtime.set_ratelimit(slot, policy, ttl, &r.comment, &r.author)).await
            }
        }
        .map_err(override_status)?;
        tracing::info!(
            name = %entry.name,
            id = %cellrate_core::text::printable(&entry.id),
            ?policy,
            ttl_s = ttl / cellrate_core::clock::SECOND,
            comment = %cellrate_core::text::printable(&entry.comment),
            author = %cellrate_core::text::printable(&entry.author),
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
        let (cleared, name, id) =
            match named(&table, self.decider.ratelimit_shape(), &r.name, &r.id)? {
                Overridden::Named(name, id) => {
                    let cleared = runtime.clear(name, &id).await;
                    (cleared, name.text.clone(), id)
                }
                Overridden::Ratelimit(slot) => {
                    let cleared = runtime.clear_ratelimit(&slot).await;
                    (cleared, slot.label, slot.id)
                }
            };
        let cleared = cleared.map_err(override_status)?;
        tracing::info!(
            name = %name,
            id = %cellrate_core::text::printable(&id),
            cleared,
            "temporary override cleared"
        );
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
        let only = only_overridden(&table, &request.get_ref().name)?;
        let entries = runtime
            .list(&table, only)
            .await
            .map_err(override_status)?
            .iter()
            .map(|e| runtime_override(runtime, e))
            .collect();
        Ok(Response::new(pb::ListOverridesResponse { entries }))
    }
}

/// Where the limit of a (valid) item comes from: a temporary override, else `table` (a
/// ratelimit-format bucket's file: unspecified).
fn source(
    table: &cellrate_limits::config::LimitTable,
    shape: crate::service::RatelimitShape,
    runtime: Option<&RuntimeOverrides>,
    item: &pb::Item,
) -> pb::LimitSource {
    use cellrate_limits::config::Source;
    use pb::limit_source::Kind;
    let of = |kind: Kind| pb::LimitSource {
        kind: kind as i32,
        ..Default::default()
    };
    if item.inline.is_some() {
        return of(Kind::CallerGiven);
    }
    let temporary = |runtime: &RuntimeOverrides, temporary: RuntimeOverride| pb::LimitSource {
        kind: Kind::RuntimeOverride as i32,
        expires_in: Some(duration(runtime.expires_in(&temporary))),
        comment: temporary.comment,
        author: temporary.author,
        ..Default::default()
    };
    let Some(name) = table.names().get(&item.name) else {
        let slot = ratelimit_slot(table, shape, &item.name, &item.id)
            .ok()
            .flatten();
        return match runtime.zip(slot) {
            Some((r, slot)) => r.ratelimit_entry(&slot).map(|t| temporary(r, t)),
            None => None,
        }
        .unwrap_or_else(|| of(Kind::Unspecified));
    };
    let Ok(id) = name.format.canonicalize_cow(&item.id) else {
        return of(Kind::Unspecified);
    };
    if let Some((runtime, found)) = runtime.and_then(|r| Some((r, r.get(name, &id)?))) {
        return temporary(runtime, found);
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
