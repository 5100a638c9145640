//! The demand of Envoy RLQS reporters shared between replicas (see `demand.lua`): each
//! replica publishes, per limit key, how many buckets report to it and their demand, and
//! reads the other replicas'. Over a connection of its own, with a deadline of at least 1 s,
//! in batches of [`BATCH`] keys.

use std::sync::Arc;
use std::time::Duration;

use super::connection::Connection;
use super::invocation::Invocation;
use super::RedisSettings;
use crate::shared::Aggregate;
use crate::shared::SharedDemand;
use crate::{StoreError, StoreFuture};

const SCRIPT: &str = include_str!("demand.lua");
/// Keys per script call.
const BATCH: usize = 500;
const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Demand shared through Redis.
pub struct RedisDemand {
    connection: Connection,
    script: redis::Script,
    prefix: String,
    replica: String,
    timeout: Duration,
    /// How long a published entry lives without being published again.
    ttl: Duration,
}

impl RedisDemand {
    /// Demand shared on the Redis of `settings`, entries living `ttl`, under a replica id
    /// unique to this process.
    pub fn new(settings: &RedisSettings, ttl: Duration) -> Result<RedisDemand, StoreError> {
        let timeout = settings.timeout.max(MIN_TIMEOUT);
        // A random number (std's hasher keys are random per process) and the process id.
        let random = {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        Ok(RedisDemand {
            connection: Connection::open(settings, timeout)?,
            script: redis::Script::new(SCRIPT),
            prefix: format!("{}{{rlqs}}:", settings.prefix),
            replica: format!("{random:016x}-{}", std::process::id()),
            timeout,
            ttl,
        })
    }

    async fn batch(&self, mine: &[(Arc<str>, Aggregate)]) -> Result<Vec<Aggregate>, StoreError> {
        let mut invocation = Invocation::Script(self.script.prepare_invoke());
        for (key, _) in mine {
            invocation.key(format!("{}{key}", self.prefix));
        }
        invocation
            .arg(&self.replica)
            .arg(self.ttl.as_millis().max(1).to_string());
        for (_, a) in mine {
            invocation
                .arg(a.reporters)
                .arg(a.known)
                .arg(format!("{}", a.sum.max(0.0)));
        }
        let reply = tokio::time::timeout(
            self.timeout,
            self.connection
                .invoke::<Vec<String>>(&invocation, "rlqs demand"),
        )
        .await
        .unwrap_or(Err(StoreError::Timeout {
            op: "rlqs demand",
            timeout: self.timeout,
        }))?;
        if reply.len() != mine.len() {
            return Err(StoreError::MalformedReply);
        }
        reply.iter().map(|line| parse(line)).collect()
    }
}

/// `"<reporters> <known> <sum>"`.
fn parse(line: &str) -> Result<Aggregate, StoreError> {
    let mut parts = line.split(' ');
    let mut next = || parts.next().ok_or(StoreError::MalformedReply);
    let reporters = next()?.parse().map_err(|_| StoreError::MalformedReply)?;
    let known = next()?.parse().map_err(|_| StoreError::MalformedReply)?;
    let sum: f64 = next()?.parse().map_err(|_| StoreError::MalformedReply)?;
    if !sum.is_finite() || sum < 0.0 {
        return Err(StoreError::MalformedReply);
    }
    Ok(Aggregate {
        reporters,
        known,
        sum,
    })
}

impl SharedDemand for RedisDemand {
    fn exchange<'a>(
        &'a self,
        mine: &'a [(Arc<str>, Aggregate)],
    ) -> StoreFuture<'a, Vec<Aggregate>> {
        Box::pin(async move {
            let mut theirs = Vec::with_capacity(mine.len());
            for chunk in mine.chunks(BATCH) {
                theirs.extend(self.batch(chunk).await?);
            }
            Ok(theirs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_or_are_malformed() {
        assert_eq!(
            parse("3 2 40.5").unwrap(),
            Aggregate {
                reporters: 3,
                known: 2,
                sum: 40.5
            }
        );
        assert_eq!(parse("0 0 0").unwrap(), Aggregate::default());
        for bad in ["", "1 2", "x 1 1", "1 1 nan", "1 1 -3", "1 1 inf"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
