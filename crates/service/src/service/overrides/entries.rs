//! The overrides a process applies, by where they apply: a configured name's id, or a
//! ratelimit-format bucket's text (one lookup on ShouldRateLimit).

use std::collections::HashMap;

use super::RuntimeOverride;
use cellrate_core::clock::Nanos;
use cellrate_limits::names::RATELIMIT_NUMBER;

/// Where an override applies: an id of the configured name of this number (the entry's
/// id), or the bucket of a ratelimit-format limit with this text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Slot {
    Named(u32),
    Ratelimit(Box<str>),
}

impl Slot {
    /// The number its shared field and record carry.
    pub(super) fn number(&self) -> u32 {
        match self {
            Slot::Named(number) => *number,
            Slot::Ratelimit(_) => RATELIMIT_NUMBER,
        }
    }
}

/// The overrides applied, looked up by `&str` (no allocation per request).
#[derive(Default)]
pub(super) struct Entries {
    /// Name number -> override id -> entry.
    pub(super) named: HashMap<u32, HashMap<Box<str>, RuntimeOverride>>,
    /// Bucket text -> entry (a ratelimit-format bucket: one lookup on ShouldRateLimit).
    pub(super) ratelimit: HashMap<Box<str>, RuntimeOverride>,
}

impl Entries {
    pub(super) fn get(&self, slot: &Slot, id: &str) -> Option<&RuntimeOverride> {
        match slot {
            Slot::Named(number) => self.named.get(number)?.get(id),
            Slot::Ratelimit(bucket) => self.ratelimit.get(bucket),
        }
    }

    /// Adds or replaces; whether it replaced one.
    pub(super) fn insert(&mut self, slot: Slot, entry: RuntimeOverride) -> bool {
        match slot {
            Slot::Named(number) => self.named.entry(number).or_default(),
            Slot::Ratelimit(bucket) => return self.ratelimit.insert(bucket, entry).is_some(),
        }
        .insert(entry.id.clone(), entry)
        .is_some()
    }

    pub(super) fn remove(&mut self, slot: &Slot, id: &str) -> Option<RuntimeOverride> {
        match slot {
            Slot::Named(number) => self.named.get_mut(number)?.remove(id),
            Slot::Ratelimit(bucket) => self.ratelimit.remove(bucket),
        }
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &RuntimeOverride> {
        let named = self.named.values().flat_map(HashMap::values);
        named.chain(self.ratelimit.values())
    }

    /// Drops expired entries (and names left without any); the number still held.
    pub(super) fn purge(&mut self, now: Nanos) -> usize {
        self.named.retain(|_, ids| {
            ids.retain(|_, e| e.expires_at > now);
            !ids.is_empty()
        });
        self.ratelimit.retain(|_, e| e.expires_at > now);
        self.named.values().map(HashMap::len).sum::<usize>() + self.ratelimit.len()
    }
}
