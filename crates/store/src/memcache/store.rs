//! [`MemcacheStore`]: envoyproxy/ratelimit's fixed windows counted in memcached.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::client::{Client, Plan};
use super::{MemcacheSettings, MAX_KEY_BYTES};
use crate::{Outcome, Store, StoreError, StoreFuture, StoreItem};
use cellrate_core::clock::{Clock, Nanos, SECOND};
use cellrate_core::gcra::{Decision, Mode, Window};
use cellrate_core::text::LogEvery;
use cellrate_limits::names::{BucketKey, RATELIMIT_NUMBER};

/// memcached reads an expiry above 30 days as a Unix time, not a number of seconds.
const RELATIVE_EXPIRY_MAX: u64 = 30 * 86_400;

/// The memcache store: each item's counter is a memcached key, named and spread over the
/// servers as envoyproxy/ratelimit names and spreads it.
pub struct MemcacheStore {
    client: Client,
    clock: Arc<dyn Clock>,
    prefix: String,
    jitter_max_seconds: u64,
    /// The jitter's pseudo-random state (xorshift64*).
    jitter: AtomicU64,
    /// The failure lines: at most one in [`LOG_EVERY`].
    failures: LogEvery,
}

/// At most one failure line in this long (a memcached that is down fails every request).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// One item as memcached sees it.
struct Counter {
    key: String,
    count: i64,
    /// The window's end and how long it lasts, in seconds.
    end: Nanos,
    length: u64,
}

impl MemcacheStore {
    pub fn new(
        settings: &MemcacheSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<MemcacheStore, StoreError> {
        if settings.servers.is_empty() {
            return Err(StoreError::Config("memcache: no server given".into()));
        }
        let seed = clock.now() as u64 ^ 0x9e37_79b9_7f4a_7c15;
        Ok(MemcacheStore {
            client: Client::new(&settings.servers, settings.timeout, settings.max_idle),
            clock,
            prefix: settings.prefix.clone(),
            jitter_max_seconds: settings.jitter_max_seconds,
            jitter: AtomicU64::new(seed | 1),
            failures: LogEvery::new(LOG_EVERY),
        })
    }

    /// The memcached key of `item` at `now`: envoyproxy/ratelimit's
    /// `<prefix><domain>_<key>_<value>_..._<window start>`, or, when that is no legal
    /// memcached key (over 250 bytes, or a space or control character in it), `#` and the
    /// SHA-256 of all but the window start, then `_<window start>`: a caller's text never
    /// reaches memcached's command line as it is unless it is one legal key.
    fn counter(&self, item: &StoreItem, now: Nanos) -> Result<Counter, StoreError> {
        let Window::Calendar(period) = item.limit.window() else {
            return Err(refused(
                "a limit that is not a fixed window (GCRA or concurrency)",
            ));
        };
        let text = upstream_text(&item.key)
            .ok_or_else(|| refused("a limit that is not in envoyproxy/ratelimit's format"))?;
        let start = period.window_start(now);
        let end = period.window_end(now);
        let start_seconds = start.div_euclid(SECOND);
        let mut key = format!("{}{text}{start_seconds}", self.prefix);
        if !legal_key(&key) {
            use sha2::{Digest, Sha256};
            let digest = Sha256::new()
                .chain_update(self.prefix.as_bytes())
                .chain_update(text.as_bytes())
                .finalize();
            key = format!("#{}_{start_seconds}", hex::encode(digest));
        }
        Ok(Counter {
            key,
            count: item.limit.count() as i64,
            end,
            length: ((end - start) / SECOND).max(1) as u64,
        })
    }

    /// The expiry of a counter created now: the window's length plus a jitter below
    /// `jitter_max_seconds` (EXPIRATION_JITTER_MAX_SECONDS), as envoyproxy/ratelimit sets
    /// it; beyond 30 days as the Unix time it ends, which is what memcached reads there.
    fn exptime(&self, counter: &Counter, now: Nanos) -> u64 {
        let mut seconds = counter.length;
        if self.jitter_max_seconds > 0 {
            let mut x = self.jitter.load(Ordering::Relaxed);
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.jitter.store(x, Ordering::Relaxed);
            seconds += x.wrapping_mul(0x2545_f491_4f6c_dd1d) % self.jitter_max_seconds;
        }
        match seconds > RELATIVE_EXPIRY_MAX {
            true => (now / SECOND).max(0) as u64 + seconds,
            false => seconds,
        }
    }

    /// The counters of `items`, grouped by server: (server, item indexes).
    fn by_server(&self, counters: &[Counter]) -> Vec<(usize, Vec<usize>)> {
        let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, c) in counters.iter().enumerate() {
            groups
                .entry(self.client.server_of(&c.key))
                .or_default()
                .push(i);
        }
        let mut groups: Vec<_> = groups.into_iter().collect();
        groups.sort();
        groups
    }

    /// Logs a failed call at WARN: the first at once, then at most one line every 10 s,
    /// saying how many failed since the last line.
    fn note<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        let Err(e) = &result else {
            return result;
        };
        let now = Duration::from_nanos(self.clock.monotonic().max(0) as u64);
        if let Some(left_out) = self.failures.admit(now, 1) {
            let failed = left_out + 1;
            tracing::warn!(error = %e, failed, "memcache store: not answered");
        }
        result
    }

    async fn spend_items(&self, items: &[StoreItem]) -> Result<Outcome, StoreError> {
        let now = self.clock.now();
        let counters = self.counters(items, now)?;
        // Per item: the counter after the call.
        let mut after: Vec<u64> = vec![0; items.len()];
        let calls = self.by_server(&counters).into_iter().map(|(server, at)| {
            let mut plan = Plan::default();
            let (mut reads, mut adds) = (Vec::new(), Vec::new());
            for &i in &at {
                let key = counters[i].key.as_str();
                match adds_to(&items[i], &counters[i]) {
                    true => {
                        plan.adds
                            .push((key, items[i].cost, self.exptime(&counters[i], now)));
                        adds.push(i);
                    }
                    false => {
                        plan.reads.push(key);
                        reads.push(i);
                    }
                }
            }
            async move {
                let got = self.client.run(server, "memcache spend", &plan).await?;
                Ok::<_, StoreError>((reads, got.reads, adds, got.adds))
            }
        });
        for result in futures_util::future::join_all(calls).await {
            let (reads, read, adds, added) = result?;
            for (i, v) in reads.into_iter().zip(read) {
                after[i] = v.unwrap_or(0);
            }
            for (i, v) in adds.into_iter().zip(added) {
                // memcached's `incr` wraps at 2^64: a counter below what was just added
                // to it went round, and is read as full (saturated), never as nearly empty.
                after[i] = if v < items[i].cost { u64::MAX } else { v };
            }
        }
        let decisions: Vec<Decision> = items
            .iter()
            .zip(&counters)
            .zip(&after)
            .map(|((item, c), &after)| decision(item, c, after, now))
            .collect();
        let allowed = items
            .iter()
            .zip(&decisions)
            .all(|(item, d)| !item.mode.counts() || d.allowed);
        Ok(Outcome { allowed, decisions })
    }

    /// Every item's counter, or the refusal of an item this store cannot count: a GCRA or
    /// concurrency limit, a lease, or a spend that must be all-or-nothing across keys
    /// (memcached has no transaction over several keys).
    fn counters(&self, items: &[StoreItem], now: Nanos) -> Result<Vec<Counter>, StoreError> {
        items
            .iter()
            .map(|item| match item.mode {
                Mode::Charge | Mode::SpendOnly | Mode::CheckOnly | Mode::Probe => {
                    self.counter(item, now)
                }
                Mode::CheckAndSpend if item.cost == 0 => self.counter(item, now),
                Mode::CheckAndSpend => Err(refused(
                    "an all-or-nothing spend (memcached has no transaction over several keys)",
                )),
                Mode::Acquire | Mode::Release => Err(refused("a concurrency limit's lease")),
            })
            .collect()
    }

    async fn refund_items(&self, items: &[StoreItem]) -> Result<Vec<Decision>, StoreError> {
        let now = self.clock.now();
        let counters = items
            .iter()
            .map(|item| self.counter(item, now))
            .collect::<Result<Vec<_>, _>>()?;
        let mut after: Vec<Option<u64>> = vec![None; items.len()];
        let calls = self.by_server(&counters).into_iter().map(|(server, at)| {
            let mut plan = Plan::default();
            for &i in &at {
                plan.takes.push((counters[i].key.as_str(), items[i].cost));
            }
            async move {
                let got = self.client.run(server, "memcache refund", &plan).await?;
                Ok::<_, StoreError>((at, got.takes))
            }
        });
        for result in futures_util::future::join_all(calls).await {
            let (at, taken) = result?;
            for (i, v) in at.into_iter().zip(taken) {
                after[i] = v;
            }
        }
        Ok(counters
            .iter()
            .zip(&after)
            .zip(items)
            .map(|((c, after), item)| {
                let used = after.unwrap_or(0) as i64;
                Decision {
                    allowed: after.is_some() && item.cost > 0,
                    remaining: c.count - used,
                    retry_in: 0,
                    reset_in: if used > 0 { c.end - now } else { 0 },
                }
            })
            .collect())
    }

    async fn reset_keys(&self, keys: &[BucketKey]) -> Result<u32, StoreError> {
        let now = self.clock.now();
        let mut names = Vec::new();
        for key in keys {
            let (head, _) = key.as_str().split_once(':').unwrap_or_default();
            let period = head
                .split_once('@')
                .and_then(|(_, p)| cellrate_core::clock::CalendarPeriod::parse(p).ok())
                .ok_or_else(|| refused("a bucket that is not a fixed window"))?;
            let limit = cellrate_core::gcra::Limit::calendar(1, period)
                .map_err(|e| StoreError::Config(e.to_string()))?;
            let item = StoreItem {
                key: key.clone(),
                limit,
                cost: 0,
                mode: Mode::Probe,
                lease: None,
            };
            names.push(self.counter(&item, now)?);
        }
        names.sort_by(|a, b| a.key.cmp(&b.key));
        names.dedup_by(|a, b| a.key == b.key);
        let mut deleted = 0;
        for (server, at) in self.by_server(&names) {
            let plan = Plan {
                deletes: at.iter().map(|&i| names[i].key.as_str()).collect(),
                ..Plan::default()
            };
            let got = self.client.run(server, "memcache reset", &plan).await?;
            deleted += got.deleted.iter().filter(|&&d| d).count() as u32;
        }
        Ok(deleted)
    }
}

/// Whether `item` adds its cost to its counter: a spend of at least one hit and at most
/// the limit's count. A cost above the count can never be within the limit: it is read,
/// decided over the limit, and not added, so that no hit count (Envoy's `hits_addend` is
/// a u64 the caller chooses: 2^64 - 8 would wrap memcached's counter round to nearly 0)
/// can empty a window that others share.
fn adds_to(item: &StoreItem, c: &Counter) -> bool {
    matches!(item.mode, Mode::Charge | Mode::SpendOnly)
        && item.cost > 0
        && item.cost <= c.count.max(0) as u64
}

/// The decision of a counter that holds `after` once the item's cost is counted (for a
/// read, what it holds): allowed while within the count, the remaining as the counter
/// says (below 0 when over, as envoyproxy/ratelimit's statistics count it).
fn decision(item: &StoreItem, c: &Counter, after: u64, now: Nanos) -> Decision {
    let reads_only = !adds_to(item, c);
    let cost = i64::try_from(item.cost).unwrap_or(i64::MAX);
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    // A read decides what the cost would get.
    let counted = match reads_only {
        true => after.saturating_add(cost),
        false => after,
    };
    let allowed = counted <= c.count;
    let remaining = match (reads_only, matches!(item.mode, Mode::CheckOnly)) {
        // A check-only item of an allowed batch reports the bucket as the spend would leave it.
        (true, true) if allowed => c.count - counted,
        (true, _) => c.count - after,
        (false, _) => c.count - after,
    };
    let until_end = c.end - now;
    Decision {
        allowed,
        remaining,
        retry_in: if allowed && remaining >= cost {
            0
        } else {
            until_end
        },
        reset_in: if after > 0 { until_end } else { 0 },
    }
}

/// envoyproxy/ratelimit's key text of a bucket, `<domain>_<key>_<value>_..._`, as the
/// RLS service names buckets for this store (its digest replaced by the text): a file's
/// limit `99@<period>:<text>`, a descriptor's own `0:r/<period>/<text>`.
fn upstream_text(key: &BucketKey) -> Option<&str> {
    let text = key.as_str();
    if let Some(rest) = text.strip_prefix("0:r/") {
        return rest.split_once('/').map(|(_, text)| text);
    }
    let (head, rest) = text.split_once(':')?;
    let number = head.split_once('@')?.0;
    (number == RATELIMIT_NUMBER.to_string()).then_some(rest)
}

/// memcached's rule for a key (as gomemcache checks it): at most 250 bytes, no space or
/// control character.
pub fn legal_key(key: &str) -> bool {
    key.len() <= MAX_KEY_BYTES && key.bytes().all(|b| b > b' ' && b != 0x7f)
}

fn refused(what: &str) -> StoreError {
    StoreError::Config(format!(
        "the memcache store counts only envoyproxy/ratelimit's fixed windows (hits counted \
         on every descriptor); it was asked for {what}"
    ))
}

impl Store for MemcacheStore {
    fn spend<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Outcome> {
        Box::pin(async move { self.note(self.spend_items(items).await) })
    }

    fn refund<'a>(&'a self, items: &'a [StoreItem]) -> StoreFuture<'a, Vec<Decision>> {
        Box::pin(async move { self.note(self.refund_items(items).await) })
    }

    fn reset<'a>(&'a self, keys: &'a [BucketKey]) -> StoreFuture<'a, u32> {
        Box::pin(async move { self.note(self.reset_keys(keys).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_upstreams_unless_memcached_would_refuse_them() {
        let file = BucketKey::windowed(
            RATELIMIT_NUMBER,
            "domain_key_value_",
            Window::Calendar(cellrate_core::clock::CalendarPeriod::Minute),
        );
        assert_eq!(upstream_text(&file), Some("domain_key_value_"));
        let given = BucketKey::new(0, "r/1m/d_k_v/w_");
        assert_eq!(upstream_text(&given), Some("d_k_v/w_"));
        assert_eq!(upstream_text(&BucketKey::new(3, "x")), None);
        assert!(legal_key("d_k_v_60"));
        for bad in ["d_k v_60", "d_k\r\nflush_all_60", "d\x7f", &"x".repeat(251)] {
            assert!(!legal_key(bad), "{bad:?}");
        }
        assert!(legal_key(&"x".repeat(250)));
    }
}
