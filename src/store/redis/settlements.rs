//! The Checks kept for `Settle`, in Redis (see `settle.lua`), so that a settlement counts
//! once whichever replica it reaches: one record key per request id and an index by
//! expiry, all tagged `{settle}` (one slot), over a connection of its own with a deadline
//! of at least 1 s.

use std::time::Duration;

use super::connection::Connection;
use super::RedisSettings;
use crate::clock::{Nanos, MICROSECOND};
use crate::store::shared::{Claim, Opened, Settlements};
use crate::store::{StoreError, StoreFuture};

const SCRIPT: &str = include_str!("settle.lua");
const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Checks kept for `Settle`, shared through Redis.
pub struct RedisSettlements {
    connection: Connection,
    script: redis::Script,
    prefix: String,
    window_ms: String,
    max: String,
    timeout: Duration,
}

impl RedisSettlements {
    /// Records under `<prefix>{settle}:`, each kept `window`, at most `max`.
    pub fn new(
        settings: &RedisSettings,
        window: Nanos,
        max: usize,
    ) -> Result<RedisSettlements, StoreError> {
        let timeout = settings.timeout.max(MIN_TIMEOUT);
        Ok(RedisSettlements {
            connection: Connection::open(settings, timeout)?,
            script: redis::Script::new(SCRIPT),
            prefix: format!("{}{{settle}}:", settings.prefix),
            window_ms: (window / (1_000 * MICROSECOND)).max(1).to_string(),
            max: max.max(1).to_string(),
            timeout,
        })
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
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(format!("{}index", self.prefix))
            .key(self.key(id))
            .arg(op);
        for arg in args {
            invocation.arg(*arg);
        }
        tokio::time::timeout(self.timeout, self.connection.invoke(&invocation, op))
            .await
            .unwrap_or(Err(StoreError::Timeout {
                op,
                timeout: self.timeout,
            }))
    }
}

fn flag(reply: &[Vec<u8>]) -> Option<&[u8]> {
    reply.first().map(Vec::as_slice)
}

impl Settlements for RedisSettlements {
    fn open<'a>(&'a self, id: &'a str, record: &'a [u8]) -> StoreFuture<'a, Opened> {
        Box::pin(async move {
            let args: [&[u8]; 3] = [record, self.window_ms.as_bytes(), self.max.as_bytes()];
            let reply = self.call("open", id, &args).await?;
            let evicted = reply
                .get(1)
                .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
                .ok_or(StoreError::MalformedReply)?;
            Ok(Opened {
                written: flag(&reply) == Some(b"1"),
                evicted,
            })
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
                (Some(b"1"), 2) => Ok(Claim::Claimed(reply.swap_remove(1))),
                (Some(b"2"), 3) => {
                    let record = reply.swap_remove(2);
                    let costs = reply.swap_remove(1);
                    Ok(Claim::Settled { record, costs })
                }
                _ => Err(StoreError::MalformedReply),
            }
        })
    }

    fn unclaim<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.call("unclaim", id, &[]).await.map(|_| ()) })
    }
}
