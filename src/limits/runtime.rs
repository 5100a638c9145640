//! Temporary overrides set at run time (admin `SetOverride`): for one id of a name, a limit,
//! the allow list or the deny list, taking precedence over the configuration files until
//! they expire. They live beside the `LimitTable`, so reloads leave them alone. Bounded in
//! number and lifetime; per process (the memory of this replica).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crate::clock::{Clock, Nanos, SECOND};
use crate::limits::config::Policy;
use crate::limits::names::Name;

/// Longest comment and author kept (characters).
pub const MAX_COMMENT: usize = 200;
pub const MAX_AUTHOR: usize = 64;

/// One temporary override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeOverride {
    pub name: Arc<str>,
    /// The id in its override form (canonical; a range for range-keyed names).
    pub id: Box<str>,
    pub policy: Policy,
    pub expires_at: Nanos,
    pub comment: String,
    pub author: String,
}

/// The temporary overrides of this process.
pub struct RuntimeOverrides {
    clock: Arc<dyn Clock>,
    max_count: usize,
    max_ttl: Nanos,
    /// name number -> override id -> entry (looked up by `&str`: no allocation per request).
    entries: RwLock<HashMap<u32, HashMap<Box<str>, RuntimeOverride>>>,
    /// Entries held (expired ones included until purged): 0 skips the lookup.
    held: AtomicUsize,
}

impl RuntimeOverrides {
    pub fn new(clock: Arc<dyn Clock>, max_count: usize, max_ttl: Nanos) -> RuntimeOverrides {
        RuntimeOverrides {
            clock,
            max_count,
            max_ttl,
            entries: RwLock::new(HashMap::new()),
            held: AtomicUsize::new(0),
        }
    }

    /// The override in force for `canonical_id` under `name`, if any.
    pub fn get(&self, name: &Name, canonical_id: &str) -> Option<RuntimeOverride> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let id = name.format.override_id(canonical_id);
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        let found = entries.get(&name.number)?.get(id)?;
        (found.expires_at > self.clock.now()).then(|| found.clone())
    }

    /// Sets (or replaces) the override of `canonical_id` under `name` for `ttl`.
    pub fn set(
        &self,
        name: &Name,
        canonical_id: &str,
        policy: Policy,
        ttl: Nanos,
        comment: &str,
        author: &str,
    ) -> Result<RuntimeOverride, String> {
        if ttl < SECOND || ttl > self.max_ttl {
            return Err(format!(
                "ttl: {} s is not 1 s to {} s (--max-override-ttl)",
                ttl / SECOND,
                self.max_ttl / SECOND
            ));
        }
        let comment = bounded(comment, MAX_COMMENT, "comment")?;
        let author = bounded(author, MAX_AUTHOR, "author")?;
        let id: Box<str> = Box::from(name.format.override_id(canonical_id));
        let now = self.clock.now();
        let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
        let held = purge(&mut entries, now);
        let replacing = entries
            .get(&name.number)
            .is_some_and(|ids| ids.contains_key(&id));
        if !replacing && held >= self.max_count {
            self.held.store(held, Ordering::Relaxed);
            return Err(format!(
                "{held} temporary overrides are in force, the most allowed (--max-runtime-overrides)"
            ));
        }
        let entry = RuntimeOverride {
            name: name.text.clone(),
            id,
            policy,
            expires_at: now.saturating_add(ttl),
            comment: comment.to_string(),
            author: author.to_string(),
        };
        entries
            .entry(name.number)
            .or_default()
            .insert(entry.id.clone(), entry.clone());
        self.held
            .store(held + usize::from(!replacing), Ordering::Relaxed);
        Ok(entry)
    }

    /// Removes the override of `canonical_id` under `name`; whether one was in force.
    pub fn clear(&self, name: &Name, canonical_id: &str) -> bool {
        let id = name.format.override_id(canonical_id);
        let now = self.clock.now();
        let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
        let removed = entries
            .get_mut(&name.number)
            .and_then(|ids| ids.remove(id))
            .is_some_and(|e| e.expires_at > now);
        let held = purge(&mut entries, now);
        self.held.store(held, Ordering::Relaxed);
        removed
    }

    /// The overrides in force (of `only`, if given), by name and id.
    pub fn list(&self, only: Option<u32>) -> Vec<RuntimeOverride> {
        let now = self.clock.now();
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        let mut list: Vec<RuntimeOverride> = entries
            .iter()
            .filter(|(number, _)| only.is_none_or(|o| o == **number))
            .flat_map(|(_, ids)| ids.values())
            .filter(|e| e.expires_at > now)
            .cloned()
            .collect();
        list.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
        list
    }

    /// Time left before `entry` expires.
    pub fn expires_in(&self, entry: &RuntimeOverride) -> Nanos {
        (entry.expires_at - self.clock.now()).max(0)
    }
}

/// Drops expired entries (and names left without any); the number still held.
fn purge(entries: &mut HashMap<u32, HashMap<Box<str>, RuntimeOverride>>, now: Nanos) -> usize {
    entries.retain(|_, ids| {
        ids.retain(|_, e| e.expires_at > now);
        !ids.is_empty()
    });
    entries.values().map(HashMap::len).sum()
}

fn bounded<'a>(text: &'a str, max: usize, field: &str) -> Result<&'a str, String> {
    if text.chars().count() > max {
        return Err(format!("{field}: longer than {max} characters"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use crate::gcra::Limit;
    use crate::limits::names::Names;

    #[test]
    fn overrides_expire_are_bounded_and_keyed_by_override_id() {
        let clock = FakeClock::new(1_700_000_000 * SECOND);
        let r = RuntimeOverrides::new(Arc::new(clock.clone()), 2, 3_600 * SECOND);
        let names = Names::builtin();
        let orders = names.get("NewOrdersPerAccount").unwrap();
        let limited = Policy::Limited {
            limit: Limit::new(5, 5, SECOND).unwrap(),
            shadow: false,
        };
        assert!(r.get(orders, "1").is_none());
        let set = r
            .set(orders, "1", limited, 60 * SECOND, "ticket 7", "ops")
            .unwrap();
        assert_eq!(r.get(orders, "1"), Some(set));
        assert!(
            r.set(orders, "2", Policy::Denied, 0, "", "").is_err(),
            "ttl 0"
        );
        assert!(r
            .set(orders, "2", Policy::Denied, 7_200 * SECOND, "", "")
            .is_err());
        assert!(r
            .set(orders, "2", Policy::Denied, SECOND, &"c".repeat(201), "")
            .is_err());
        r.set(orders, "2", Policy::Denied, 120 * SECOND, "", "")
            .unwrap();
        let full = r.set(orders, "3", Policy::Unlimited, 60 * SECOND, "", "");
        assert!(full.unwrap_err().contains("--max-runtime-overrides"));
        // Replacing one in force is not a new one.
        r.set(orders, "2", Policy::Unlimited, 120 * SECOND, "", "")
            .unwrap();
        assert_eq!(r.list(None).len(), 2);
        clock.advance(61 * SECOND);
        assert!(r.get(orders, "1").is_none(), "expired");
        assert_eq!(r.list(Some(orders.number)).len(), 1);
        r.set(orders, "3", Policy::Unlimited, 60 * SECOND, "", "")
            .unwrap();
        assert!(r.clear(orders, "3"));
        assert!(!r.clear(orders, "3"));
        // Range-keyed names share one override per range.
        let v6 = names.get("NewRegistrationsPerIPv6Range").unwrap();
        let canonical = v6.format.canonicalize("2001:db8::1").unwrap();
        r.clear(orders, "2");
        r.set(v6, &canonical, Policy::Denied, 60 * SECOND, "", "")
            .unwrap();
        let other = v6.format.canonicalize("2001:db8::2").unwrap();
        assert!(r.get(v6, &other).is_some());
    }
}
