//! The Checks kept for `Settle`, in Redis (see `settle.lua`), so that a settlement counts
//! once whichever replica it reaches: one record key per request id and an index by
//! expiry, all tagged `{settle}` (one slot), over a connection of its own with a deadline
//! of at least 1 s. Live holds are indexed by due too, so that any replica can claim
//! the due ones, once (`due`), and by bucket key, so that each key's live holds are
//! counted exactly across replicas (`--settle-max-holds-per-key`). Each change of a record's state is one script call, so atomic; its
//! times are Redis's (the buckets' clock, on one server; on a cluster, the clock of the
//! node that holds `{settle}`).

use std::sync::Arc;
use std::time::Duration;

use super::connection::Connection;
use super::invocation::{unknown_command, unreadable, Invocation, ModuleUse, SETTLE_COMMAND};
use super::RedisSettings;
use crate::shared::{Claim, Kept, Opened, Settlements, DEFAULT_MAX_HOLDS_PER_KEY};
use crate::{StoreError, StoreFuture};
use cellrate_core::clock::{Nanos, MICROSECOND};

const SCRIPT: &str = include_str!("settle.lua");
const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Checks kept for `Settle`, shared through Redis.
pub struct RedisSettlements {
    connection: Connection,
    script: redis::Script,
    /// Whether the calls go to cellrate's module (`CELLRATE.SETTLE`) instead: what the
    /// store's question at start found ([`RedisSettlements::following`]).
    module: Arc<ModuleUse>,
    /// The cluster slot of every key of the ledger (`{settle}`).
    slot: usize,
    prefix: String,
    window_ms: String,
    window: Nanos,
    max: String,
    max_per_key: String,
    timeout: Duration,
}

impl RedisSettlements {
    /// Records under `<prefix>{settle}:`, each kept `window`, at most `max`, and at most
    /// [`DEFAULT_MAX_HOLDS_PER_KEY`] live holds per bucket key
    /// ([`RedisSettlements::with_max_holds_per_key`]).
    pub fn new(
        settings: &RedisSettings,
        window: Nanos,
        max: usize,
    ) -> Result<RedisSettlements, StoreError> {
        let timeout = settings.timeout.max(MIN_TIMEOUT);
        Ok(RedisSettlements {
            connection: Connection::open(settings, timeout)?,
            script: redis::Script::new(SCRIPT),
            module: Arc::new(ModuleUse::new(settings.module)),
            slot: super::cluster::slot(&format!("{}{{settle}}:", settings.prefix)),
            prefix: format!("{}{{settle}}:", settings.prefix),
            window_ms: (window / (1_000 * MICROSECOND)).max(1).to_string(),
            window,
            max: max.max(1).to_string(),
            max_per_key: DEFAULT_MAX_HOLDS_PER_KEY.to_string(),
            timeout,
        })
    }

    /// At most `max` live holds counted against any one bucket key.
    pub fn with_max_holds_per_key(self, max: usize) -> RedisSettlements {
        RedisSettlements {
            max_per_key: max.max(1).to_string(),
            ..self
        }
    }

    /// Uses cellrate's module where `store` found it at start (`--redis-module`).
    pub fn following(self, store: &super::RedisStore) -> RedisSettlements {
        RedisSettlements {
            module: store.module.clone(),
            ..self
        }
    }

    /// The key of `id`'s record.
    pub fn key(&self, id: &str) -> String {
        format!("{}r:{id}", self.prefix)
    }

    async fn call(
        &self,
        op: &'static str,
        id: &str,
        args: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.call_queued(op, id, None, args).await
    }

    /// A call, with the key of `queue` (a queue of anonymous holds) when given.
    async fn call_queued(
        &self,
        op: &'static str,
        id: &str,
        queue: Option<&str>,
        args: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let module = self.module.used();
        let mut invocation = Invocation::new(&self.script, module, SETTLE_COMMAND, self.slot);
        invocation
            .key(format!("{}index", self.prefix))
            .key(self.key(id))
            .key(format!("{}holds", self.prefix))
            .key(format!("{}k:", self.prefix));
        if let Some(queue) = queue {
            invocation.key(format!("{}q:{}", self.prefix, share_of(queue)));
        }
        invocation.arg(op);
        for arg in args {
            invocation.arg(*arg);
        }
        let answer = self.within_deadline(&invocation, op).await;
        match answer {
            Err(e) if unknown_command(&e.to_string()) && self.module.unknown_command() => {
                // Never run: sent again as the script.
                match invocation.as_script(&self.script) {
                    Some(script) => self.within_deadline(&script, op).await,
                    None => Err(e),
                }
            }
            Err(e) if unreadable(&e.to_string()) => {
                self.module.unreadable_answer(invocation.is_module());
                Err(e)
            }
            answer => answer,
        }
    }

    async fn within_deadline(
        &self,
        invocation: &Invocation<'_>,
        op: &'static str,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        tokio::time::timeout(self.timeout, self.connection.invoke(invocation, op))
            .await
            .unwrap_or(Err(StoreError::Timeout {
                op,
                timeout: self.timeout,
            }))
    }
}

/// The name a bucket key's live holds are counted under: the first 16 bytes of its
/// SHA-256, in hex (a bucket key takes up to about 270 bytes, and a hold counts against
/// each of its keys, in its record and in each key's set).
fn share_of(bucket_key: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(bucket_key.as_bytes())[..16])
}

fn flag(reply: &[Vec<u8>]) -> Option<&[u8]> {
    reply.first().map(Vec::as_slice)
}

/// Microseconds of Redis time, as the script writes them, in nanoseconds.
fn micros(text: &[u8]) -> Result<Nanos, StoreError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .and_then(|us| us.checked_mul(MICROSECOND))
        .ok_or(StoreError::MalformedReply)
}

/// A decided record from the script's `check, facts, opened, decided, now`.
fn kept(mut parts: Vec<Vec<u8>>) -> Result<Kept, StoreError> {
    if parts.len() != 5 {
        return Err(StoreError::MalformedReply);
    }
    let now = micros(&parts[4])?;
    let decided = micros(&parts[3])?;
    let opened = micros(&parts[2])?;
    parts.truncate(2);
    let facts = parts.pop().unwrap_or_default();
    let check = parts.pop().unwrap_or_default();
    Ok(Kept {
        check,
        facts,
        opened,
        decided,
        now,
    })
}

impl Settlements for RedisSettlements {
    fn open<'a>(
        &'a self,
        id: &'a str,
        check: &'a [u8],
        hold: Option<Nanos>,
        keys: &'a [String],
    ) -> StoreFuture<'a, Opened> {
        Box::pin(async move {
            let hold_ms = hold.map_or(0, |h| (h / (1_000 * MICROSECOND)).max(1));
            let hold_ms = hold_ms.to_string();
            let keys: Vec<String> = match hold {
                Some(_) => keys.iter().map(|k| share_of(k)).collect(),
                None => Vec::new(),
            };
            let mut args: Vec<&[u8]> = vec![
                check,
                self.window_ms.as_bytes(),
                self.max.as_bytes(),
                hold_ms.as_bytes(),
                self.max_per_key.as_bytes(),
            ];
            args.extend(keys.iter().map(|k| k.as_bytes()));
            let reply = self.call("open", id, &args).await?;
            let number = |i: usize| -> Result<u64, StoreError> {
                reply
                    .get(i)
                    .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
                    .ok_or(StoreError::MalformedReply)
            };
            let evicted = number(1)?;
            let crowded = match flag(&reply) {
                Some(b"3") => Some(
                    (number(2)? as usize)
                        .checked_sub(1)
                        .filter(|&at| at < keys.len())
                        .ok_or(StoreError::MalformedReply)?,
                ),
                _ => None,
            };
            Ok(Opened {
                written: flag(&reply) == Some(b"1"),
                evicted,
                full: flag(&reply) == Some(b"2"),
                crowded,
            })
        })
    }

    fn decide<'a>(&'a self, id: &'a str, facts: &'a [u8]) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let reply = self.call("decide", id, &[facts]).await?;
            Ok(flag(&reply) == Some(b"1"))
        })
    }

    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.call("forget", id, &[]).await.map(|_| ()) })
    }

    fn claim<'a>(&'a self, id: &'a str, costs: &'a [u8]) -> StoreFuture<'a, Claim> {
        Box::pin(async move {
            let mut reply = self.call("claim", id, &[costs]).await?;
            match (flag(&reply), reply.len()) {
                (Some(b"0"), 1) => Ok(Claim::Unknown),
                (Some(b"3"), 1) => Ok(Claim::Pending),
                (Some(b"4"), 1) => Ok(Claim::Expired),
                (Some(b"1"), 6) => Ok(Claim::Claimed(kept(reply.split_off(1))?)),
                (Some(b"2"), 7) => {
                    let rest = reply.split_off(2);
                    let costs = reply.swap_remove(1);
                    Ok(Claim::Settled {
                        kept: kept(rest)?,
                        costs,
                    })
                }
                _ => Err(StoreError::MalformedReply),
            }
        })
    }

    fn reopen<'a>(&'a self, id: &'a str, facts: &'a [u8]) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.call("reopen", id, &[facts]).await.map(|_| ()) })
    }

    fn window(&self) -> Nanos {
        self.window
    }

    fn due(&self, max: usize) -> StoreFuture<'_, Vec<(String, Kept)>> {
        Box::pin(async move {
            let max = max.to_string();
            let mut reply = self.call("due", "", &[max.as_bytes()]).await?.into_iter();
            let now = reply.next().ok_or(StoreError::MalformedReply)?;
            let record_prefix = self.key("");
            let mut claimed = Vec::new();
            while let Some(key) = reply.next() {
                let parts: Vec<Vec<u8>> = reply.by_ref().take(4).chain([now.clone()]).collect();
                let id = String::from_utf8(key)
                    .ok()
                    .and_then(|k| k.strip_prefix(&record_prefix).map(str::to_string))
                    .ok_or(StoreError::MalformedReply)?;
                claimed.push((id, kept(parts)?));
            }
            Ok(claimed)
        })
    }

    fn enqueue<'a>(&'a self, queue: &'a str, id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move { (self.call_queued("queue", id, Some(queue), &[]).await).map(|_| ()) })
    }

    fn claim_oldest<'a>(
        &'a self,
        queue: &'a str,
        costs: &'a [u8],
    ) -> StoreFuture<'a, Option<(String, Kept)>> {
        Box::pin(async move {
            let mut reply = self
                .call_queued("oldest", "", Some(queue), &[costs])
                .await?;
            match (flag(&reply), reply.len()) {
                (Some(b"0"), 1) => Ok(None),
                (Some(b"1"), 7) => {
                    let rest = reply.split_off(2);
                    let key = reply.swap_remove(1);
                    let id = String::from_utf8(key)
                        .ok()
                        .and_then(|k| k.strip_prefix(&self.key("")).map(str::to_string))
                        .ok_or(StoreError::MalformedReply)?;
                    Ok(Some((id, kept(rest)?)))
                }
                _ => Err(StoreError::MalformedReply),
            }
        })
    }
}
