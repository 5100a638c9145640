//! A ShouldRateLimit request's descriptors as one batch of items, and what every way of
//! adding descriptors to it shares: how a descriptor's items take part, and the bucket of
//! a descriptor that brings its own limit.

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::google::protobuf::Struct;

use crate::gcra::Mode;
use crate::service::ItemSpec;

/// A request's descriptors as one batch: the items, the descriptor each item comes from,
/// and how many descriptors matched nothing (counted once the request is decided: a
/// rejected request decided nothing).
#[derive(Default)]
pub(super) struct Batch<'a> {
    pub(super) items: Vec<ItemSpec<'a>>,
    pub(super) owner: Vec<usize>,
    pub(super) unmatched: usize,
    /// Descriptors whose limit is in envoyproxy/ratelimit's `quota_mode`.
    pub(super) quota: Vec<usize>,
    /// envoyproxy/ratelimit's statistics key of each item from its file format.
    pub(super) stats: Vec<(usize, String)>,
    /// Descriptors whose `current_limit.name` is answered as envoyproxy/ratelimit names
    /// it (its YAML's `name`, else empty), with that name.
    pub(super) answer_names: Vec<(usize, String)>,
    /// Descriptors whose limit in envoyproxy/ratelimit's format is `unlimited: true`:
    /// answered, as there, with 4 294 967 295 remaining.
    pub(super) unlimited: Vec<usize>,
    /// Descriptors whose matched limit has `metadata`, with it.
    pub(super) metadata: Vec<(usize, Arc<Struct>)>,
    /// Whether some item releases a lease (answered OK whatever it freed).
    pub(super) releases: bool,
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

/// Identifies an unmatched descriptor with its own limit: the SHA-256 (hex) of its domain
/// and entries, each length-prefixed, so that no two different descriptors (nor a domain
/// and an entry, nor `a=b|c=d` and two entries) share a bucket, and the key stays short
/// whatever the entries' lengths.
pub(super) fn descriptor_digest(domain: &str, entries: &[(&str, &str)]) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    let mut field = |text: &str| {
        hash.update((text.len() as u64).to_le_bytes());
        hash.update(text.as_bytes());
    };
    field(domain);
    for (key, value) in entries {
        field(key);
        field(value);
    }
    hex::encode(hash.finalize())
}

/// A request's items with each bucket once: the items, the descriptor each comes from, and
/// for every item of the request the index of the item that decides it.
pub(super) struct Merged<'a> {
    pub(super) items: Vec<ItemSpec<'a>>,
    pub(super) owner: Vec<usize>,
    pub(super) of: Vec<usize>,
}

impl<'a> Batch<'a> {
    /// When descriptors of one request name the same item more than once (Envoy's
    /// `rate_limits` of a virtual host and of its route both making `remote_address`, or
    /// two header actions given the same value by the client), the batch with that item
    /// once, costing the sum of its hits, as envoyproxy/ratelimit counts every descriptor's
    /// hits on one key. A bucket may be named once per batch, so without this the whole
    /// request would be an error, which Envoy lets through by default: a way around every
    /// limit of the request. `None`, allocating nothing, when every item is distinct.
    /// Lease items are left as they are (an acquire is one slot).
    pub(super) fn merged(&self) -> Option<Merged<'a>> {
        let same = |a: &ItemSpec<'_>, b: &ItemSpec<'_>| {
            a.lease.is_none() && a.target == b.target && a.limit == b.limit && a.mode == b.mode
        };
        let items = &self.items;
        // At most MAX_DESCRIPTORS items of a few names each: a scan allocates nothing.
        let any = (1..items.len()).any(|i| items[..i].iter().any(|e| same(e, &items[i])));
        if !any {
            return None;
        }
        let mut merged = Merged {
            items: Vec::with_capacity(items.len()),
            owner: Vec::with_capacity(items.len()),
            of: Vec::with_capacity(items.len()),
        };
        for (item, &d) in items.iter().zip(&self.owner) {
            match merged.items.iter().position(|e| same(e, item)) {
                Some(at) => {
                    let hits = |i: &ItemSpec<'_>| i.cost.unwrap_or(1);
                    let sum = hits(&merged.items[at]).saturating_add(hits(item));
                    merged.items[at].cost = Some(sum);
                    merged.of.push(at);
                }
                None => {
                    merged.of.push(merged.items.len());
                    merged.items.push(item.clone());
                    merged.owner.push(d);
                }
            }
        }
        Some(merged)
    }
}
