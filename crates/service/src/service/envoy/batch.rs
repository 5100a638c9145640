//! A ShouldRateLimit request's descriptors as one batch of items, and what every way of
//! adding descriptors to it shares: how a descriptor's items take part, and the bucket of
//! a descriptor that brings its own limit.

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::google::protobuf::Struct;

use crate::service::ItemSpec;
use cellrate_core::gcra::Mode;

/// A request's descriptors as one batch: its items (in descriptor order), how many
/// descriptors matched nothing (counted once the request is decided: a rejected request
/// decided nothing), and what some descriptors add to their answer.
#[derive(Default)]
pub(super) struct Batch<'a> {
    pub(super) items: Vec<Item<'a>>,
    pub(super) unmatched: usize,
    /// What descriptors from envoyproxy/ratelimit's file format add to their answer, by
    /// descriptor index (none for cellrate's own formats).
    pub(super) notes: Vec<(usize, Note)>,
    /// Whether some item releases a lease (answered OK whatever it freed).
    pub(super) releases: bool,
    /// The descriptor mapped by a `reserve` rule, which is decided alone (no items).
    pub(super) reservation: Option<super::reserve::Reservation<'a>>,
}

/// What a descriptor from envoyproxy/ratelimit's file format adds to its answer.
pub(super) enum Note {
    /// Its limit is in `quota_mode`.
    Quota,
    /// Its limit is `unlimited: true`: answered, as there, with 4 294 967 295 remaining.
    Unlimited,
    /// Its `current_limit.name` as envoyproxy/ratelimit names it (its YAML's `name`, else
    /// empty).
    Name(String),
    /// Its matched limit's `metadata`.
    Metadata(Arc<Struct>),
}

impl Batch<'_> {
    /// The descriptors whose limit is in `quota_mode`.
    pub(super) fn quota(&self) -> Vec<usize> {
        let quota = self.notes.iter().filter(|(_, n)| matches!(n, Note::Quota));
        quota.map(|&(d, _)| d).collect()
    }

    /// Whether descriptor `d`'s limit is `unlimited: true`.
    pub(super) fn unlimited(&self, d: usize) -> bool {
        (self.notes.iter()).any(|&(at, ref n)| at == d && matches!(n, Note::Unlimited))
    }
}

/// One item of a batch: what is decided, and where it came from.
#[derive(Clone)]
pub(super) struct Item<'a> {
    pub(super) spec: ItemSpec<'a>,
    /// The index of the descriptor it comes from.
    pub(super) d: usize,
    /// What an item from envoyproxy/ratelimit's file format carries besides (boxed: the
    /// items of cellrate's own formats, the many, stay small).
    pub(super) ratelimit: Option<Box<RatelimitItem>>,
}

impl<'a> Item<'a> {
    /// Descriptor `d`'s item `spec` (no statistics of envoyproxy/ratelimit's).
    pub(super) fn of(d: usize, spec: ItemSpec<'a>) -> Item<'a> {
        Item {
            spec,
            d,
            ratelimit: None,
        }
    }
}

/// An item from envoyproxy/ratelimit's file format: its statistics key there, and the
/// readable name of its bucket (`top` shows it; `inspect` and `reset` take it back: see
/// [`crate::service::ratelimit_bucket`]).
#[derive(Clone)]
pub(super) struct RatelimitItem {
    pub(super) stats: String,
    pub(super) shown: Option<String>,
}

impl<'a> AsRef<ItemSpec<'a>> for Item<'a> {
    fn as_ref(&self) -> &ItemSpec<'a> {
        &self.spec
    }
}

/// How a descriptor's items take part: spent, or given back (`is_negative_hits`: a
/// refund, in the mode that lets it give back more than the burst; a full bucket stays
/// full).
pub(super) fn mode_of(descriptor: &RateLimitDescriptor) -> Mode {
    match descriptor.is_negative_hits {
        true => Mode::Charge,
        false => Mode::CheckAndSpend,
    }
}
