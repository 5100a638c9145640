//! Reservations through Envoy: a descriptor mapped by a `reserve: KEY` rule holds its hits
//! (the estimate) under the request id in entry `KEY`, as a native `Check` with a
//! `request_id` does; the same descriptor with `is_negative_hits` (sent when the stream
//! ends) settles that hold to its hits (the actual cost), as `Settle` does, exactly once.
//!
//! Both go through the [`Settler`] (`service::settle`), as the native API's do, so a hold
//! is kept, claimed and adjusted as a native one is (in memory, or in Redis for every
//! replica). The id it is kept under is
//! [`ENVOY_REQUEST_IDS`] and a digest of the domain, the rule's names, the key's id and
//! Envoy's request id: a native call cannot name it (the native API refuses that prefix),
//! and a stream end of another domain, limit or key finds nothing to settle.

use std::borrow::Cow;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tonic::{Code, Status};

use super::{EnvoyRateLimitService, Refusal};
use crate::service::ratelimit_bucket::fields_digest;
use crate::service::settle::Settler;
pub use crate::service::settle::ENVOY_REQUEST_IDS;
use crate::service::{ItemResult, ItemSpec, Target};
use cellrate_core::gcra::Mode;

/// A descriptor mapped by a `reserve` rule: what it holds or settles.
pub(super) struct Reservation<'a> {
    pub(super) d: usize,
    pub(super) names: &'a [Arc<str>],
    pub(super) id: Cow<'a, str>,
    /// Envoy's request id (the descriptor's request entry).
    pub(super) request_id: &'a str,
    /// The estimate to hold, or the actual cost to settle to.
    pub(super) cost: u64,
    /// `is_negative_hits`: settle the hold rather than take it.
    pub(super) settle: bool,
}

impl Reservation<'_> {
    /// The id the hold is kept under: [`ENVOY_REQUEST_IDS`] and the SHA-256 (hex) of the
    /// domain, the names, the key's id and Envoy's request id, each length-prefixed.
    fn kept_id(&self, domain: &str) -> String {
        let names = self.names.iter().map(|name| &**name);
        let fields = std::iter::once(domain)
            .chain(names)
            .chain([&*self.id, self.request_id]);
        format!("{ENVOY_REQUEST_IDS}{}", fields_digest(fields))
    }

    /// The hold's items, as a Check keeps them: one per name, at the estimate.
    fn items(&self) -> Vec<ItemSpec<'_>> {
        (self.names.iter())
            .map(|name| ItemSpec {
                target: Target::Named {
                    name: Cow::Borrowed(name),
                    id: self.id.clone(),
                },
                cost: Some(self.cost),
                mode: Mode::CheckAndSpend,
                limit: None,
                lease: None,
            })
            .collect()
    }
}

/// The reservation of descriptor `d` (mapped by a `reserve` rule), checked: its request
/// entry (`request`: its index and value) present (any value: it is kept under a digest),
/// no limit of its own. Each refusal names the descriptor and field.
pub(super) fn reservation_of<'a>(
    d: usize,
    descriptor: &'a RateLimitDescriptor,
    names: &'a [Arc<str>],
    id: Cow<'a, str>,
    request: Option<(usize, &'a str)>,
    key: &str,
    cost: u64,
) -> Result<Reservation<'a>, Refusal> {
    let refused = |message: String| Refusal::Descriptor {
        d,
        name: names.first().cloned().unwrap_or_else(|| Arc::from("")),
        message,
    };
    let Some((_, request_id)) = request else {
        return Err(refused(format!(
            "descriptors[{d}].entries: no request entry {:?} (its rule reserves under the \
             request's id)",
            cellrate_core::text::first_chars(key, 64)
        )));
    };
    // Any bytes: the id is kept under a digest of it ([`Reservation::kept_id`]), so a
    // client's header is never a reason to refuse the request.
    if descriptor.limit.is_some() {
        return Err(refused(format!(
            "descriptors[{d}].limit: a reservation takes no limit from the descriptor"
        )));
    }
    Ok(Reservation {
        d,
        names,
        id,
        request_id,
        cost,
        settle: descriptor.is_negative_hits,
    })
}

impl EnvoyRateLimitService {
    /// Holds or settles `reservation`, the request's one descriptor. A hold answers as a
    /// Check does (OVER_LIMIT when it does not fit, and nothing is held); a hold under an
    /// id kept already is OVER_LIMIT and holds nothing more. A settle answers OK, and so
    /// does one that changes nothing: replayed, or of an id that holds nothing (Envoy's
    /// own 429s, an expired hold). Items come back for a hold only.
    pub(super) async fn reserve(
        &self,
        domain: &str,
        reservation: &Reservation<'_>,
    ) -> Result<Vec<ItemResult>, Refusal> {
        let settler = self.settler()?;
        let id = reservation.kept_id(domain);
        let specs = reservation.items();
        if reservation.settle {
            let costs = vec![reservation.cost; specs.len()];
            return match settler.settle(&self.decider, &id, &costs).await {
                Ok(_) => Ok(Vec::new()),
                // Holds nothing (Envoy's own 429s, expired), or settled already.
                Err(e) if matches!(e.code(), Code::NotFound | Code::FailedPrecondition) => {
                    Ok(Vec::new())
                }
                Err(e) => Err(in_descriptor(reservation, e)),
            };
        }
        // An estimate larger than one hold may take is denied, not refused as malformed:
        // an error is `failure_mode_deny`'s to decide, and Envoy's default lets the
        // request through with nothing held (and its stream end then finds nothing).
        let largest = (settler.largest_holds(&self.decider, &specs))
            .map_err(|e| in_descriptor(reservation, e))?;
        if largest.iter().any(|&cap| reservation.cost > cap) {
            return self.denied(reservation, &specs).await;
        }
        match settler.check(&self.decider, &id, &specs).await {
            Ok(result) => Ok(result.items),
            // Held already under this id: denied, and nothing more is held. Answering OK
            // would let requests that share an id (a client's own x-request-id that Envoy
            // kept) through with one hold among them.
            Err(e) if e.code() == Code::AlreadyExists => self.denied(reservation, &specs).await,
            // The table is full of live holds: denied too, for the same reason as an
            // estimate too large (an error may let the request through with nothing held).
            Err(e) if e.code() == Code::ResourceExhausted => self.denied(reservation, &specs).await,
            Err(e) => Err(in_descriptor(reservation, e)),
        }
    }

    /// The items' buckets as they are, every one denied; nothing is held.
    async fn denied(
        &self,
        reservation: &Reservation<'_>,
        specs: &[ItemSpec<'_>],
    ) -> Result<Vec<ItemResult>, Refusal> {
        let mut peeked = (self.decider.inspect(specs).await)
            .map_err(|e| in_descriptor(reservation, e.into()))?;
        for item in &mut peeked.items {
            item.decision.allowed = false;
        }
        Ok(peeked.items)
    }

    fn settler(&self) -> Result<&Settler, Status> {
        self.settler.as_ref().ok_or_else(|| {
            Status::unimplemented(
                "a reservation is kept for its settlement, and this server keeps none",
            )
        })
    }
}

/// A Check's or Settle's error, said of the reservation's descriptor (their fields are
/// the native call's: `items[i]`, `request_id`, `costs`): what the request brought (an id,
/// a cost) makes the descriptor malformed, decided by the domain's `invalid_id` policy; a
/// failure of the server or its store is the request's.
fn in_descriptor(reservation: &Reservation<'_>, e: Status) -> Refusal {
    let d = reservation.d;
    let message = format!("descriptors[{d}] (a reservation): {}", e.message());
    match e.code() {
        Code::InvalidArgument
        | Code::OutOfRange
        | Code::FailedPrecondition
        | Code::NotFound
        | Code::AlreadyExists
        | Code::ResourceExhausted
        | Code::PermissionDenied => Refusal::Descriptor {
            d,
            name: (reservation.names.first().cloned()).unwrap_or_else(|| Arc::from("")),
            message,
        },
        code => Refusal::Request(Status::new(code, message)),
    }
}
