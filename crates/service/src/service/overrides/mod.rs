//! Temporary overrides set at run time (admin `SetOverride`): for one id of a name, or one
//! bucket of a limit of envoyproxy/ratelimit's file format (`ratelimit.rs`), a limit, the
//! allow list or the deny list, taking precedence over the configuration files until they
//! expire. They live beside the `LimitTable`, so reloads leave them alone. Bounded in
//! number (both kinds together) and lifetime.
//!
//! Alone, a process keeps them in its memory (lost on restart). With a [`SharedOverrides`]
//! (the Redis store) they live there: a change is written there first, and every replica
//! copies the shared table into its memory at each [`RuntimeOverrides::sync`] (the server
//! syncs every `--override-sync-interval`), so decisions never wait for Redis to find one.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::ratelimit_bucket::RatelimitShape;
use super::request::RatelimitTarget;
use cellrate_core::clock::{Clock, Nanos, SECOND};
use cellrate_core::gcra::Window;
use cellrate_limits::config::{LimitTable, Policy};
use cellrate_limits::names::Name;
use cellrate_store::shared::{Fetched, Put, SharedOverrides};
use cellrate_store::StoreError;

mod entries;
mod ratelimit;
mod record;
use entries::{Entries, Slot};
pub use ratelimit::{ratelimit_policy, ratelimit_slot, RatelimitSlot};
use record::{bounded, parse_record, record_of, shown};
pub use record::{calendar_of, policy_of, MAX_RECORD};

/// Longest comment and author kept (characters).
pub const MAX_COMMENT: usize = 200;
pub const MAX_AUTHOR: usize = 64;

/// One temporary override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeOverride {
    pub name: Arc<str>,
    /// The id in its override form (canonical; a range for range-keyed names; a bucket's
    /// readable name for a limit of envoyproxy/ratelimit's format).
    pub id: Box<str>,
    pub policy: Policy,
    pub expires_at: Nanos,
    pub comment: String,
    pub author: String,
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    /// The request is wrong (INVALID_ARGUMENT).
    #[error("{0}")]
    Invalid(String),
    /// The most overrides are in force (RESOURCE_EXHAUSTED).
    #[error("{held} temporary overrides are in force, the most allowed (--max-runtime-overrides)")]
    Full { held: usize },
    /// The shared table could not be reached (UNAVAILABLE); nothing changed.
    #[error("temporary overrides are shared through redis, which failed: {0}")]
    Shared(#[from] StoreError),
}

/// What a sync found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Synced {
    /// Whether the shared table had changed (and was copied).
    pub changed: bool,
    /// Overrides now applied.
    pub applied: usize,
    /// Entries of names this replica does not know (kept in the table, not applied).
    pub unknown_names: usize,
    /// Entries that are no override of ours, with why (not applied).
    pub rejected: Vec<String>,
}

/// The temporary overrides this process applies.
pub struct RuntimeOverrides {
    clock: Arc<dyn Clock>,
    max_count: usize,
    max_ttl: Nanos,
    entries: RwLock<Entries>,
    /// Entries held (expired ones included until purged): 0 skips the lookup.
    held: AtomicUsize,
    /// Of them, of ratelimit-format buckets: 0 skips ShouldRateLimit's lookup.
    ratelimit_held: AtomicUsize,
    /// How the Envoy front end names ratelimit-format buckets (to find a shared one's).
    ratelimit_shape: RatelimitShape,
    shared: Option<Arc<dyn SharedOverrides>>,
    /// Serialises changes and syncs, so that a sync that read the shared table before a
    /// change cannot undo the change's local copy; holds the version last copied.
    syncing: tokio::sync::Mutex<String>,
    /// The shared table as this replica last saw it (field -> record, local expiry), to put
    /// back should the store lose it. Changed only under `syncing`.
    copy: parking_lot::Mutex<HashMap<String, (String, Nanos)>>,
    /// Overrides put back and not yet reported ([`RuntimeOverrides::take_restored`]): a
    /// sync for an admin `ListOverrides` may be the one that puts them back.
    restored: AtomicUsize,
}

impl RuntimeOverrides {
    pub fn new(clock: Arc<dyn Clock>, max_count: usize, max_ttl: Nanos) -> RuntimeOverrides {
        RuntimeOverrides {
            clock,
            max_count,
            max_ttl,
            entries: RwLock::new(Entries::default()),
            held: AtomicUsize::new(0),
            ratelimit_held: AtomicUsize::new(0),
            ratelimit_shape: RatelimitShape::default(),
            shared: None,
            syncing: tokio::sync::Mutex::new(String::new()),
            copy: parking_lot::Mutex::new(HashMap::new()),
            restored: AtomicUsize::new(0),
        }
    }

    /// Keeps the overrides in `shared` (every replica on it applies them).
    pub fn shared(mut self, shared: Arc<dyn SharedOverrides>) -> RuntimeOverrides {
        self.shared = Some(shared);
        self
    }

    /// Names ratelimit-format buckets read back from the shared table as the Envoy front
    /// end counts on them (its `shape`).
    pub fn with_ratelimit_shape(mut self, shape: RatelimitShape) -> RuntimeOverrides {
        self.ratelimit_shape = shape;
        self
    }

    /// How ratelimit-format buckets are named here.
    pub fn ratelimit_shape(&self) -> RatelimitShape {
        self.ratelimit_shape
    }

    /// Whether the overrides are shared with other replicas.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The override in force for `canonical_id` under `name`, if any.
    pub fn get(&self, name: &Name, canonical_id: &str) -> Option<RuntimeOverride> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let id = name.format.override_id(canonical_id);
        let entries = self.entries.read();
        let found = entries.named.get(&name.number)?.get(id)?;
        (found.expires_at > self.clock.now()).then(|| found.clone())
    }

    /// The policy of the override in force for the bucket of `target` (ShouldRateLimit's
    /// path): with none of a ratelimit-format bucket held, one atomic load; else one
    /// lookup. Only an override set for the label `target` counts under, whose limit
    /// counts as the bucket counts (a reload may have changed either), applies.
    pub fn ratelimit(&self, target: &RatelimitTarget) -> Option<Policy> {
        if self.ratelimit_held.load(Ordering::Relaxed) == 0 || target.caller_given {
            return None;
        }
        let entries = self.entries.read();
        let found = entries.ratelimit.get(target.digest.as_str())?;
        let window = target
            .limit
            .map_or(Window::Calendar(target.unit), |l| l.window());
        let fits = match found.policy {
            Policy::Limited { limit, .. } => limit.window() == window,
            Policy::Unlimited | Policy::Denied => true,
        };
        (fits && found.expires_at > self.clock.now() && found.name == target.name)
            .then_some(found.policy)
    }

    /// The override in force for the ratelimit-format bucket `slot`, if any.
    pub fn ratelimit_entry(&self, slot: &RatelimitSlot) -> Option<RuntimeOverride> {
        let entries = self.entries.read();
        let found = entries.ratelimit.get(&slot.bucket)?;
        (found.expires_at > self.clock.now() && found.name == slot.label).then(|| found.clone())
    }

    /// Sets (or replaces) the override of `canonical_id` under `name` for `ttl`: in the
    /// shared table first, when there is one.
    pub async fn set(
        &self,
        name: &Name,
        canonical_id: &str,
        policy: Policy,
        ttl: Nanos,
        comment: &str,
        author: &str,
    ) -> Result<RuntimeOverride, OverrideError> {
        let id = name.format.override_id(canonical_id);
        let slot = Slot::Named(name.number);
        (self.insert(slot, &name.text, id, policy, ttl, (comment, author))).await
    }

    /// Sets (or replaces) the override of the ratelimit-format bucket `slot` for `ttl`, as
    /// [`RuntimeOverrides::set`] does; under the same bound.
    pub async fn set_ratelimit(
        &self,
        slot: &RatelimitSlot,
        policy: Policy,
        ttl: Nanos,
        comment: &str,
        author: &str,
    ) -> Result<RuntimeOverride, OverrideError> {
        let place = Slot::Ratelimit(slot.bucket.clone());
        (self.insert(place, &slot.label, &slot.id, policy, ttl, (comment, author))).await
    }

    async fn insert(
        &self,
        slot: Slot,
        name: &Arc<str>,
        id: &str,
        policy: Policy,
        ttl: Nanos,
        (comment, author): (&str, &str),
    ) -> Result<RuntimeOverride, OverrideError> {
        if ttl < SECOND || ttl > self.max_ttl {
            return Err(OverrideError::Invalid(format!(
                "ttl: {} is not 1 s to {} (--max-override-ttl)",
                exact_seconds(ttl),
                exact_seconds(self.max_ttl)
            )));
        }
        let comment = bounded(comment, MAX_COMMENT, "comment").map_err(OverrideError::Invalid)?;
        let author = bounded(author, MAX_AUTHOR, "author").map_err(OverrideError::Invalid)?;
        let id: Box<str> = Box::from(id);
        let _syncing = self.syncing.lock().await;
        let shared_put = match &self.shared {
            None => None,
            Some(shared) => {
                let record = record_of(name, slot.number(), &id, policy, comment, author);
                let field = format!("{}:{id}", slot.number());
                let put = shared.put(&field, &record, ttl, self.max_count).await?;
                if put == Put::Written {
                    let expires = self.clock.now().saturating_add(ttl);
                    self.copy().insert(field, (record, expires));
                }
                Some(put)
            }
        };
        if let Some(Put::Full(held)) = shared_put {
            return Err(OverrideError::Full { held });
        }
        let now = self.clock.now();
        let mut entries = self.entries.write();
        let held = entries.purge(now);
        let replacing = entries.get(&slot, &id).is_some();
        // The shared table counted every replica's overrides; alone, this one counts.
        if shared_put.is_none() && !replacing && held >= self.max_count {
            self.count(&entries);
            return Err(OverrideError::Full { held });
        }
        let entry = RuntimeOverride {
            name: name.clone(),
            id,
            policy,
            expires_at: now.saturating_add(ttl),
            comment: comment.to_string(),
            author: author.to_string(),
        };
        entries.insert(slot, entry.clone());
        self.count(&entries);
        Ok(entry)
    }

    /// Stores how many entries `entries` holds (under its write lock).
    fn count(&self, entries: &Entries) {
        let ratelimit = entries.ratelimit.len();
        let named: usize = entries.named.values().map(HashMap::len).sum();
        self.ratelimit_held.store(ratelimit, Ordering::Relaxed);
        self.held.store(named + ratelimit, Ordering::Relaxed);
    }

    /// Removes the override of `canonical_id` under `name` (from the shared table first,
    /// when there is one); whether one was in force.
    pub async fn clear(&self, name: &Name, canonical_id: &str) -> Result<bool, OverrideError> {
        let id = name.format.override_id(canonical_id);
        self.remove(Slot::Named(name.number), id).await
    }

    /// Removes the override of the ratelimit-format bucket `slot`, as
    /// [`RuntimeOverrides::clear`] does.
    pub async fn clear_ratelimit(&self, slot: &RatelimitSlot) -> Result<bool, OverrideError> {
        (self.remove(Slot::Ratelimit(slot.bucket.clone()), &slot.id)).await
    }

    async fn remove(&self, slot: Slot, id: &str) -> Result<bool, OverrideError> {
        let _syncing = self.syncing.lock().await;
        let shared_removed = match &self.shared {
            None => None,
            Some(shared) => {
                let field = format!("{}:{id}", slot.number());
                let removed = shared.remove(&field).await?;
                self.copy().remove(&field);
                Some(removed)
            }
        };
        let now = self.clock.now();
        let mut entries = self.entries.write();
        let removed = (entries.remove(&slot, id)).is_some_and(|e| e.expires_at > now);
        entries.purge(now);
        self.count(&entries);
        Ok(shared_removed.unwrap_or(removed))
    }

    /// The overrides in force (of the name or label `only`, if given), by name and id;
    /// copied from the shared table first, when there is one, so that every replica lists
    /// the same.
    pub async fn list(
        &self,
        table: &LimitTable,
        only: Option<&str>,
    ) -> Result<Vec<RuntimeOverride>, OverrideError> {
        self.sync(table).await?;
        let now = self.clock.now();
        let entries = self.entries.read();
        let mut list: Vec<RuntimeOverride> = entries
            .values()
            .filter(|e| only.is_none_or(|o| *e.name == *o))
            .filter(|e| e.expires_at > now)
            .cloned()
            .collect();
        list.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
        Ok(list)
    }

    /// Copies the shared table, if there is one and it changed since the last copy: it
    /// then replaces what this process applies. Entries that are no valid override here
    /// are left out and reported; at most `--max-runtime-overrides` are applied.
    pub async fn sync(&self, table: &LimitTable) -> Result<Synced, StoreError> {
        let Some(shared) = &self.shared else {
            return Ok(Synced::default());
        };
        let mut version = self.syncing.lock().await;
        let mut fetched = shared.fetch(&version).await?;
        let restored = self.restore_if_lost(shared, &version, &fetched).await?;
        if restored > 0 {
            self.restored.fetch_add(restored, Ordering::Relaxed);
            fetched = shared.fetch("").await?;
        }
        let Fetched::Changed {
            version: fetched,
            entries: found,
            ..
        } = fetched
        else {
            return Ok(Synced::default());
        };
        let now = self.clock.now();
        let mut synced = Synced {
            changed: true,
            ..Synced::default()
        };
        let mut copy = self.copy();
        copy.clear();
        let mut applied = Entries::default();
        for (field, record, expires_in) in found {
            let read = expires_in
                .ok_or_else(|| "no expiry".to_string())
                .and_then(|left| {
                    parse_record(table, self.ratelimit_shape, &field, &record).map(|r| (r, left))
                });
            match read {
                Ok((Some((slot, entry)), left)) if synced.applied < self.max_count => {
                    copy.insert(field.clone(), (record.clone(), now.saturating_add(left)));
                    let entry = RuntimeOverride {
                        expires_at: now.saturating_add(left),
                        ..entry
                    };
                    applied.insert(slot, entry);
                    synced.applied += 1;
                }
                Ok((Some(_), _)) => synced
                    .rejected
                    .push(format!("{}: over --max-runtime-overrides", shown(&field))),
                Ok((None, _)) => synced.unknown_names += 1,
                Err(why) => synced.rejected.push(format!("{}: {why}", shown(&field))),
            }
        }
        drop(copy);
        let mut entries = self.entries.write();
        *entries = applied;
        self.count(&entries);
        *version = fetched;
        Ok(synced)
    }

    /// Overrides this replica put back since the last call (to log and count once).
    pub fn take_restored(&self) -> usize {
        self.restored.swap(0, Ordering::Relaxed)
    }

    /// The shared table as this replica last saw it.
    fn copy(&self) -> parking_lot::MutexGuard<'_, HashMap<String, (String, Nanos)>> {
        self.copy.lock()
    }

    /// When the shared table is gone although this replica copied version `known` of it
    /// (its store restarted empty), or was put back from a copy older than `known`: puts
    /// this replica's copy back (the newest copy wins; the store refuses once an operator
    /// changed the table since). How many overrides it put back.
    async fn restore_if_lost(
        &self,
        shared: &Arc<dyn SharedOverrides>,
        known: &str,
        fetched: &Fetched,
    ) -> Result<usize, StoreError> {
        let Fetched::Changed {
            version,
            restored_from,
            ..
        } = fetched
        else {
            return Ok(0);
        };
        let number = |v: &str| v.parse::<i64>().ok();
        let older = matches!((number(restored_from), number(known)), (Some(from), Some(held)) if from < held);
        if known.is_empty() || !(version.is_empty() || older) {
            return Ok(0);
        }
        let now = self.clock.now();
        let copy: Vec<(String, String, Nanos)> = self
            .copy()
            .iter()
            .filter(|(_, (_, expires))| *expires > now)
            .map(|(field, (record, expires))| (field.clone(), record.clone(), expires - now))
            .collect();
        if copy.is_empty() || !shared.restore(known, &copy).await? {
            return Ok(0);
        }
        Ok(copy.len())
    }

    /// Time left before `entry` expires.
    pub fn expires_in(&self, entry: &RuntimeOverride) -> Nanos {
        (entry.expires_at - self.clock.now()).max(0)
    }
}

/// `n` nanoseconds as seconds, exactly: `7200 s`, `604800.000000001 s`, `-1.5 s`.
fn exact_seconds(n: Nanos) -> String {
    let (whole, part) = (n / SECOND, (n % SECOND).abs());
    let sign = if n < 0 && whole == 0 { "-" } else { "" };
    if part == 0 {
        return format!("{whole} s");
    }
    let fraction = format!("{part:09}");
    format!("{sign}{whole}.{} s", fraction.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::FakeClock;
    use cellrate_core::gcra::Limit;

    #[test]
    fn ttl_errors_say_the_exact_figures() {
        assert_eq!(exact_seconds(7_200 * SECOND), "7200 s");
        assert_eq!(exact_seconds(604_800 * SECOND + 1), "604800.000000001 s");
        assert_eq!(exact_seconds(SECOND / 2), "0.5 s");
        assert_eq!(exact_seconds(-SECOND / 2), "-0.5 s");
    }

    #[tokio::test]
    async fn overrides_expire_are_bounded_and_keyed_by_override_id() {
        let clock = FakeClock::new(1_700_000_000 * SECOND);
        let r = RuntimeOverrides::new(Arc::new(clock.clone()), 2, 3_600 * SECOND);
        let table = LimitTable::from_files(&[]).unwrap();
        let names = table.names();
        let orders = names.get("NewOrdersPerAccount").unwrap();
        let limited = Policy::limited(Limit::new(5, 5, SECOND).unwrap());
        assert!(r.get(orders, "1").is_none());
        let set = r
            .set(orders, "1", limited, 60 * SECOND, "ticket 7", "ops")
            .await
            .unwrap();
        assert_eq!(r.get(orders, "1"), Some(set));
        assert!(
            r.set(orders, "2", Policy::Denied, 0, "", "").await.is_err(),
            "ttl 0"
        );
        assert!(r
            .set(orders, "2", Policy::Denied, 7_200 * SECOND, "", "")
            .await
            .is_err());
        assert!(r
            .set(orders, "2", Policy::Denied, SECOND, &"c".repeat(201), "")
            .await
            .is_err());
        r.set(orders, "2", Policy::Denied, 120 * SECOND, "", "")
            .await
            .unwrap();
        let full = r
            .set(orders, "3", Policy::Unlimited, 60 * SECOND, "", "")
            .await;
        assert!(full
            .unwrap_err()
            .to_string()
            .contains("--max-runtime-overrides"));
        // Replacing one in force is not a new one.
        r.set(orders, "2", Policy::Unlimited, 120 * SECOND, "", "")
            .await
            .unwrap();
        assert_eq!(r.list(&table, None).await.unwrap().len(), 2);
        clock.advance(61 * SECOND);
        assert!(r.get(orders, "1").is_none(), "expired");
        assert_eq!(
            r.list(&table, Some("NewOrdersPerAccount"))
                .await
                .unwrap()
                .len(),
            1
        );
        r.set(orders, "3", Policy::Unlimited, 60 * SECOND, "", "")
            .await
            .unwrap();
        assert!(r.clear(orders, "3").await.unwrap());
        assert!(!r.clear(orders, "3").await.unwrap());
        // Range-keyed names share one override per range.
        let v6 = names.get("NewRegistrationsPerIPv6Range").unwrap();
        let canonical = v6.format.canonicalize("2001:db8::1").unwrap();
        r.clear(orders, "2").await.unwrap();
        r.set(v6, &canonical, Policy::Denied, 60 * SECOND, "", "")
            .await
            .unwrap();
        let other = v6.format.canonicalize("2001:db8::2").unwrap();
        assert!(r.get(v6, &other).is_some());
    }
}
