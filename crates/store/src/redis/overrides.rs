//! The temporary overrides' shared table in Redis (see `overrides.lua`): one hash under the
//! store's prefix, reached over a connection of its own, so that copying a large table
//! never holds up the decisions' connection, and with a deadline of its own (at least 1 s:
//! these calls are an operator's or a background task's, not a request's).

use std::time::Duration;

use super::connection::Connection;
use super::invocation::Invocation;
use super::RedisSettings;
use crate::shared::{Fetched, Put, SharedOverrides};
use crate::{StoreError, StoreFuture};
use cellrate_core::clock::{Nanos, MICROSECOND};

const SCRIPT: &str = include_str!("overrides.lua");

/// The shortest deadline of an override call.
const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// The shared table of temporary overrides.
pub struct RedisOverrides {
    connection: Connection,
    script: redis::Script,
    key: String,
    timeout: Duration,
}

impl RedisOverrides {
    /// The table of the store `settings` describe: key `<prefix>overrides`.
    pub fn new(settings: &RedisSettings) -> Result<RedisOverrides, StoreError> {
        let timeout = settings.timeout.max(MIN_TIMEOUT);
        Ok(RedisOverrides {
            connection: Connection::open(settings, timeout)?,
            script: redis::Script::new(SCRIPT),
            key: format!("{}overrides", settings.prefix),
            timeout,
        })
    }

    /// The key of the table.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// One script call: `{now µs, ...}`.
    async fn call(
        &self,
        op: &'static str,
        args: &[&str],
    ) -> Result<(i64, Vec<String>), StoreError> {
        let mut invocation = Invocation::Script(self.script.prepare_invoke());
        invocation.key(&self.key).arg(op);
        for arg in args {
            invocation.arg(*arg);
        }
        let reply = tokio::time::timeout(
            self.timeout,
            self.connection.invoke::<Vec<String>>(&invocation, op),
        )
        .await
        .unwrap_or(Err(StoreError::Timeout {
            op,
            timeout: self.timeout,
        }))?;
        let mut values = reply.into_iter();
        let now = values
            .next()
            .and_then(|v| v.parse::<i64>().ok())
            .ok_or(StoreError::MalformedReply)?;
        Ok((now, values.collect()))
    }
}

/// Microseconds to nanoseconds, saturating.
fn nanos(micros: i64) -> Nanos {
    micros.saturating_mul(MICROSECOND)
}

/// The expiry (µs) of a value `"<expires µs> <record>"` and its record.
fn split(value: &str) -> Option<(i64, &str)> {
    let (expires, record) = value.split_once(' ')?;
    if expires.is_empty() || expires.len() > 16 || !expires.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((expires.parse().ok()?, record))
}

impl SharedOverrides for RedisOverrides {
    fn put<'a>(
        &'a self,
        field: &'a str,
        record: &'a str,
        ttl: Nanos,
        max: usize,
    ) -> StoreFuture<'a, Put> {
        Box::pin(async move {
            // Whole microseconds, rounded up: never shorter than asked.
            let ttl_us = (ttl.max(0) + MICROSECOND - 1) / MICROSECOND;
            let (ttl_us, max) = (ttl_us.to_string(), max.to_string());
            let (_, reply) = self.call("put", &[field, record, &ttl_us, &max]).await?;
            match reply.as_slice() {
                [ok] if ok == "ok" => Ok(Put::Written),
                [full, held] if full == "full" => held
                    .parse()
                    .map(Put::Full)
                    .map_err(|_| StoreError::MalformedReply),
                _ => Err(StoreError::MalformedReply),
            }
        })
    }

    fn remove<'a>(&'a self, field: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let (_, reply) = self.call("remove", &[field]).await?;
            match reply.as_slice() {
                [removed] if removed == "1" || removed == "0" => Ok(removed == "1"),
                _ => Err(StoreError::MalformedReply),
            }
        })
    }

    fn fetch<'a>(&'a self, known: &'a str) -> StoreFuture<'a, Fetched> {
        Box::pin(async move {
            let (now, reply) = self.call("fetch", &[known]).await?;
            let mut values = reply.into_iter();
            let version = values.next().ok_or(StoreError::MalformedReply)?;
            let restored_from = values.next().ok_or(StoreError::MalformedReply)?;
            if version == known {
                return Ok(Fetched::Unchanged);
            }
            let mut entries = Vec::with_capacity(values.len() / 2);
            while let Some(field) = values.next() {
                let value = values.next().ok_or(StoreError::MalformedReply)?;
                let entry = match split(&value) {
                    Some((expires, record)) => {
                        let left = nanos(expires.saturating_sub(now));
                        (field, record.to_string(), Some(left))
                    }
                    None => (field, value, None),
                };
                entries.push(entry);
            }
            Ok(Fetched::Changed {
                version,
                restored_from,
                entries,
            })
        })
    }

    fn restore<'a>(
        &'a self,
        held: &'a str,
        copy: &'a [(String, String, Nanos)],
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let left: Vec<String> = copy
                .iter()
                .map(|(_, _, left)| (left.max(&0) / MICROSECOND).to_string())
                .collect();
            let mut args = Vec::with_capacity(1 + 3 * copy.len());
            args.push(held);
            for ((field, record, _), left) in copy.iter().zip(&left) {
                args.extend([field.as_str(), left.as_str(), record.as_str()]);
            }
            let (_, reply) = self.call("restore", &args).await?;
            match reply.as_slice() {
                [done] if done == "restored" || done == "kept" => Ok(done == "restored"),
                _ => Err(StoreError::MalformedReply),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn values_split_into_expiry_and_record() {
        assert_eq!(
            split("1700000000000000 {}"),
            Some((1_700_000_000_000_000, "{}"))
        );
        assert_eq!(split("17 {\"a\": 1}"), Some((17, "{\"a\": 1}")));
        for junk in [
            "",
            "{}",
            " {}",
            "-5 {}",
            "1e9 {}",
            "12345678901234567 {}",
            "x {}",
        ] {
            assert_eq!(split(junk), None, "{junk:?}");
        }
    }
}
