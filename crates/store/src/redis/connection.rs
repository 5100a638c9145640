//! The connection (standalone or cluster) and the one script call every operation makes,
//! with its deadline, its breaker and the parsing of its reply.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use tokio::sync::OnceCell;

use super::errors::store_error;
use super::invocation::{
    holds_an_error, unknown_command, unreadable, Dedup, Invocation, BATCH_COMMAND,
};
use super::sentinel::SentinelLink;
use super::tls::TlsLink;
use super::wire::{LeaseRead, Op, Read, Wire};
use super::{RedisClock, RedisModule, RedisSettings, RedisStore};
use crate::{FailureKind, StoreError, StoreEvent};
use cellrate_core::clock::Nanos;

/// The shortest deadline of the call made at start ([`RedisStore::probe_at_start`]).
const START_DEADLINE: Duration = Duration::from_secs(1);

pub(super) enum Connection {
    Single(Box<SingleLink>),
    /// The master the sentinels name, followed across failovers.
    Sentinel(std::sync::Arc<SentinelLink>),
    /// One Redis over TLS made here, for `--redis-tls-ca` (see `tls.rs`).
    Tls(Box<TlsLink>),
    /// Connected on first use (retried on the next call while that fails; one attempt at
    /// a time); the cluster connection then reconnects to nodes by itself.
    Cluster {
        client: Box<redis::cluster::ClusterClient>,
        connection: OnceCell<ClusterConnection>,
    },
}

impl Connection {
    /// A connection for `settings` whose calls are answered within `timeout`: made lazily
    /// and re-made after failures. Fails only on unusable settings.
    pub(super) fn open(
        settings: &RedisSettings,
        timeout: Duration,
    ) -> Result<Connection, StoreError> {
        let connect_timeout = timeout.max(Duration::from_millis(100));
        let manager_config = || {
            redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(500))
        };
        if let Some(sentinel) = &settings.sentinel {
            if settings.tls.is_set() {
                return Err(StoreError::Config(format!(
                    "redis: {}",
                    super::SENTINEL_TLS_REFUSED
                )));
            }
            let link = SentinelLink::new(sentinel, settings.url.as_deref(), manager_config())?;
            return Ok(Connection::Sentinel(std::sync::Arc::new(link)));
        }
        if settings.cluster_nodes.is_empty() {
            let url = settings.url.as_deref().ok_or_else(|| {
                StoreError::Config("redis: no --redis-url or cluster nodes".into())
            })?;
            let readonly = settings.reconnect_on_readonly;
            if let Some(link) =
                TlsLink::for_url(url, &settings.tls, connect_timeout, timeout, readonly)?
            {
                return Ok(Connection::Tls(Box::new(link)));
            }
            let client = match certificates(&settings.tls) {
                Some(certificates) => redis::Client::build_with_tls(url, certificates),
                None => redis::Client::open(url),
            }
            .map_err(|e| StoreError::Config(format!("redis url: {e}")))?;
            let link = SingleLink::new(client, manager_config(), settings.reconnect_on_readonly)?;
            Ok(Connection::Single(Box::new(link)))
        } else {
            let mut builder =
                redis::cluster::ClusterClientBuilder::new(settings.cluster_nodes.clone())
                    .connection_timeout(connect_timeout)
                    .response_timeout(timeout)
                    .retries(1);
            if let Some(certificates) = certificates(&settings.tls) {
                builder = builder.certs(certificates);
            }
            let client = builder
                .build()
                .map_err(|e| StoreError::Config(format!("redis cluster nodes: {e}")))?;
            Ok(Connection::Cluster {
                client: Box::new(client),
                connection: OnceCell::new(),
            })
        }
    }

    /// Runs `invocation` (a script call with its keys and arguments) once; `context` names
    /// it in errors.
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &Invocation<'_>,
        context: &'static str,
    ) -> Result<T, StoreError> {
        match self {
            Connection::Single(link) => link.invoke(invocation, context).await,
            Connection::Sentinel(link) => link.invoke(invocation, context).await,
            Connection::Tls(link) => link.invoke(invocation, context).await,
            Connection::Cluster { client, connection } => {
                let mut conn = connection
                    .get_or_try_init(|| async {
                        client
                            .get_async_connection()
                            .await
                            .map_err(|e| store_error("cluster connection", e))
                    })
                    .await?
                    .clone();
                invocation
                    .invoke_cluster::<T>(&mut conn)
                    .await
                    .map_err(|e| store_error(context, e))
            }
        }
    }
}

/// One Redis at a URL, through redis-rs's reconnecting manager; with
/// `reconnect_on_readonly`, a `READONLY` answer replaces the manager (its connection
/// dropped once no call holds it), so that the next call connects through the URL again.
pub(super) struct SingleLink {
    client: redis::Client,
    config: redis::aio::ConnectionManagerConfig,
    /// The manager, and how many were made before it.
    manager: parking_lot::RwLock<(u64, ConnectionManager)>,
    reconnect_on_readonly: bool,
}

impl SingleLink {
    fn new(
        client: redis::Client,
        config: redis::aio::ConnectionManagerConfig,
        reconnect_on_readonly: bool,
    ) -> Result<SingleLink, StoreError> {
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| store_error("connection", e))?;
        Ok(SingleLink {
            client,
            config,
            manager: parking_lot::RwLock::new((0, manager)),
            reconnect_on_readonly,
        })
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &Invocation<'_>,
        context: &'static str,
    ) -> Result<T, StoreError> {
        let (generation, mut manager) = self.manager.read().clone();
        let result = invocation.invoke_async::<T>(&mut manager).await;
        match result {
            Err(e) if self.reconnect_on_readonly && super::errors::read_only(&e) => {
                self.replace(generation);
                Err(store_error(context, e))
            }
            result => result.map_err(|e| store_error(context, e)),
        }
    }

    /// A new manager in place of number `generation`, unless a call has replaced it
    /// already (many calls answered READONLY at once connect again once).
    fn replace(&self, generation: u64) {
        let mut current = self.manager.write();
        if current.0 != generation {
            return;
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(manager) => {
                *current = (generation + 1, manager);
                tracing::warn!(
                    "redis answered READONLY (the Redis at the URL is a replica now): \
                     connecting through the URL again"
                );
            }
            Err(e) => tracing::warn!(error = %e, "redis: connecting again after READONLY"),
        }
    }
}

/// The certificates of `tls` as redis-rs takes them; `None` keeps its defaults (the
/// Mozilla roots, no client certificate).
fn certificates(tls: &super::RedisTls) -> Option<redis::TlsCertificates> {
    tls.is_set().then(|| redis::TlsCertificates {
        client_tls: tls
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca.clone(),
    })
}

impl RedisStore {
    /// One refund or reset call over `keys` (all in one slot), with the deadline and
    /// breaker.
    pub(super) async fn call(
        &self,
        op: Op,
        slot: usize,
        keys: &[String],
        args: &[String],
    ) -> Result<Read, StoreError> {
        let mut invocation = self.invocation(slot);
        for key in keys {
            invocation.key(key);
        }
        invocation.arg(op.name()).arg(self.now_arg());
        for arg in args {
            invocation.arg(arg);
        }
        let values = self.run(op, slot, &invocation).await?;
        // A reset deletes whatever a key held, readable or not.
        let read = parse_read(
            &values,
            keys.iter().map(String::as_str),
            op == Op::Reset,
            &[],
        );
        match &read {
            // A bucket's own bad value is that bucket's problem, not Redis's: it must not
            // open the breaker for every other caller.
            Err(e) if e.is_data_error() => {
                self.note(slot, true);
                self.log_data_error_once(&e.to_string());
            }
            read => self.note(slot, read.is_ok()),
        }
        read
    }

    /// One spend call over `batches` (all in one slot), decided in order by one script
    /// run: per batch what it read, or that batch's own data error; an error of the whole
    /// call fails them all. `once`: the marker and op of a spend under a token (one
    /// batch, see `once.rs`); no reads when it found or made its marker "void".
    pub(super) async fn call_spend(
        &self,
        slot: usize,
        batches: &[&[Wire]],
        once: Option<(&str, &str)>,
    ) -> Result<Vec<Result<Read, StoreError>>, StoreError> {
        // Each item names its key (the script keeps a bucket's state by name, so a hot
        // key's later batches decide from what earlier ones wrote) and the number of its
        // shape (increment, burst offset, a window's most used, mode): a call's items
        // share a few limits, and the script parses each shape's numbers once, not per
        // item.
        let items: usize = batches.iter().map(|b| b.len()).sum();
        let mut shapes = Dedup::new(items);
        let mut invocation = self.invocation(slot);
        let mut numbers: Vec<usize> = Vec::with_capacity(items);
        for wire in batches.iter().flat_map(|b| b.iter()) {
            invocation.key(wire.key.as_str());
            let shape = (wire.increment, wire.burst_offset, wire.most_used, wire.mode);
            numbers.push(shapes.index(shape));
        }
        let op = match once {
            Some((marker, op)) => {
                invocation.key(marker);
                op
            }
            None => Op::Spend.name(),
        };
        invocation
            .arg(op)
            .arg(self.now_arg())
            .arg(shapes.order.len());
        for (increment, burst_offset, most_used, mode) in &shapes.order {
            invocation.arg(*increment);
            match most_used {
                0 => invocation.arg(*burst_offset),
                most => invocation.arg(format!("{burst_offset}/{most}")),
            };
            invocation.arg(mode.encode().as_ref());
        }
        let mut at = 0;
        for batch in batches {
            invocation.arg(batch.len());
            let numbers = &numbers[at..at + batch.len()];
            if batch.iter().all(|w| w.lease.is_none()) {
                invocation.arg(numbers);
            } else {
                // An acquire's or release's shape number carries its lease id.
                for (wire, number) in batch.iter().zip(numbers) {
                    match &wire.lease {
                        Some(id) => invocation.arg(format!("{number}:{id}")),
                        None => invocation.arg(number),
                    };
                }
            }
            at += batch.len();
        }
        let values = self.run(Op::Spend, slot, &invocation).await?;
        self.observer.event(StoreEvent::SpendCall {
            batches: batches.len(),
        });
        if once.is_some() && values.len() == 1 && values[0] == "void" {
            self.note(slot, true);
            return Ok(Vec::new());
        }
        if values.len() != items + 1 {
            self.note(slot, false);
            return Err(StoreError::MalformedReply);
        }
        // Redis answered: a batch's bad bucket (below) is that batch's problem alone.
        self.note(slot, true);
        let mut at = 1;
        let reads = batches
            .iter()
            .map(|batch| {
                let mut part = Vec::with_capacity(batch.len() + 1);
                part.push(values[0].as_str());
                part.extend(values[at..at + batch.len()].iter().map(String::as_str));
                at += batch.len();
                let keys = batch.iter().map(|w| w.key.as_str());
                let leases: Vec<bool> = batch.iter().map(|w| w.mode.is_lease()).collect();
                let read = parse_read(&part, keys, false, &leases);
                if let Err(e) = &read {
                    self.log_data_error_once(&e.to_string());
                }
                read
            })
            .collect();
        Ok(reads)
    }

    /// Asks Redis once, as the first call after start, and logs whether it answered and in
    /// how long. The call runs the script on no bucket (it changes nothing), outside the
    /// breaker, within `--redis-timeout-ms` but at least [`START_DEADLINE`]: a first call
    /// also connects (and shakes hands over TLS).
    pub async fn probe_at_start(&self) {
        let within = self.settings.timeout.max(START_DEADLINE);
        let mut invocation = Invocation::Script(self.script.prepare_invoke());
        invocation.arg(Op::Reset.name()).arg(self.now_arg());
        let started = tokio::time::Instant::now();
        let answer = tokio::time::timeout(
            within,
            self.connection
                .invoke::<Vec<String>>(&invocation, "first call"),
        )
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::Timeout {
                op: "first call",
                timeout: within,
            })
        })
        .and_then(|values| parse_read(&values, std::iter::empty(), true, &[]).map(|_| ()));
        self.failure_log.at_start(answer, started.elapsed(), within);
        // Then whether the module is there (the script decides until it is found).
        if self.module.setting() != RedisModule::Forbid {
            self.ask_for_module(within).await;
        }
    }

    /// Asks the server (every master of a cluster) whether it has cellrate's module: a
    /// module call of no key, which changes nothing. Logged either way.
    async fn ask_for_module(&self, within: Duration) {
        let mut invocation = Invocation::new(&self.script, true, BATCH_COMMAND, 0);
        invocation.arg(Op::Reset.name()).arg(self.now_arg());
        let answer = tokio::time::timeout(
            within,
            self.connection
                .invoke::<redis::Value>(&invocation, "asking for the module"),
        )
        .await;
        let there = match answer {
            // A cluster's masters answer one each: an error among them is one without it.
            Ok(Ok(value)) => Some(!holds_an_error(&value)),
            Ok(Err(e)) if unknown_command(&e.to_string()) => Some(false),
            // No answer (Redis not up yet): the script meanwhile, and asked again once a
            // call is answered.
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "redis: asking whether cellrate's module is loaded");
                None
            }
            Err(_) => None,
        };
        self.module.found(there);
        match (there, self.module.setting()) {
            (None, _) => {}
            (Some(true), _) => {
                tracing::info!("redis: deciding with cellrate's module ({BATCH_COMMAND})")
            }
            (Some(false), RedisModule::Require) => tracing::error!(
                "redis: --redis-module require, but the server does not answer {BATCH_COMMAND}: \
                 every decision fails until cellrate's module is loaded (docs/redis-store.md)"
            ),
            (Some(false), _) => {
                tracing::info!("redis: deciding with the script (no cellrate module)")
            }
        }
    }

    /// `now` for the script: empty for Redis `TIME`, else cellrate's clock.
    pub(super) fn now_arg(&self) -> String {
        match self.settings.clock {
            RedisClock::Redis => String::new(),
            RedisClock::Local => self.clock.now().to_string(),
        }
    }

    /// Runs a prepared script call through the breaker, within the deadline. A failed
    /// call counts toward the breaker here; the caller tells it of an answer.
    pub(super) async fn run(
        &self,
        op: Op,
        slot: usize,
        invocation: &Invocation<'_>,
    ) -> Result<Vec<String>, StoreError> {
        if !self.admit(slot) {
            self.observer.event(StoreEvent::BreakerRejection);
            return Err(StoreError::CircuitOpen);
        }
        let answer = self.within_deadline(op, invocation).await;
        let answer = match answer {
            Err(e) if unknown_command(&e.to_string()) && self.module.unknown_command() => {
                // Never run: sent again as the script.
                match invocation.as_script(&self.script) {
                    Some(script) => self.within_deadline(op, &script).await,
                    None => Err(e),
                }
            }
            Err(e) if unreadable(&e.to_string()) => {
                self.module.unreadable_answer(invocation.is_module());
                Err(e)
            }
            answer => answer,
        };
        if answer.is_ok() && self.module.ask_again() {
            // The server is up now: the question it could not answer at start.
            if let Some(me) = self.me.upgrade() {
                tokio::spawn(async move { me.ask_for_module(START_DEADLINE).await });
            }
        }
        answer.inspect_err(|e| {
            self.failure_log.failed(e);
            self.note(slot, false);
        })
    }

    /// Runs a call within `--redis-timeout-ms`.
    async fn within_deadline(
        &self,
        op: Op,
        invocation: &Invocation<'_>,
    ) -> Result<Vec<String>, StoreError> {
        let deadline = StoreError::Timeout {
            op: op.name(),
            timeout: self.settings.timeout,
        };
        tokio::time::timeout(
            self.settings.timeout,
            self.connection.invoke::<Vec<String>>(invocation, op.name()),
        )
        .await
        .unwrap_or_else(|_| Err(deadline.clone()))
        // One wording for a deadline missed, whether ours or redis-rs's cut the call off.
        .map_err(|e| match e.failure_kind() {
            Some(FailureKind::Deadline) => deadline,
            _ => e,
        })
    }
}

/// Parses the script's `{now, tat...}` for `keys`. A reply of the wrong shape is Redis
/// misbehaving; a stored value that is no TAT is a data error of that bucket.
/// `lenient`: an unreadable value counts as a bucket that was not full. `leases`: which
/// items name a lease key (their reply is `L...`, no TAT; any other item's `L...` is a
/// bucket's bad value).
pub(super) fn parse_read<'k, V: AsRef<str>>(
    values: &[V],
    keys: impl ExactSizeIterator<Item = &'k str>,
    lenient: bool,
    leases: &[bool],
) -> Result<Read, StoreError> {
    let bad = || StoreError::MalformedReply;
    if values.len() != keys.len() + 1 {
        return Err(bad());
    }
    let now = values[0].as_ref().parse::<Nanos>().map_err(|_| bad())?;
    let mut read_leases = Vec::new();
    let tats = values[1..]
        .iter()
        .map(AsRef::as_ref)
        .zip(keys)
        .enumerate()
        .map(|(at, (v, key))| {
            if leases.get(at) == Some(&true) {
                let lease = v.strip_prefix('L').ok_or_else(bad)?;
                read_leases.push((at, LeaseRead::parse(lease, now).ok_or_else(bad)?));
                Ok(None)
            } else if v.is_empty() {
                Ok(None)
            } else if lenient {
                Ok(Some(v.parse::<Nanos>().unwrap_or(Nanos::MAX)))
            } else {
                v.parse::<Nanos>().map(Some).map_err(|_| {
                    StoreError::Data(format!(
                        "redis: bucket {key} holds {:?}, which is no TAT; reset it",
                        v.chars().take(40).collect::<String>()
                    ))
                })
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Read {
        now,
        tats,
        leases: read_leases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_errors_are_classified_where_they_are_seen() {
        use std::io::{Error, ErrorKind};
        let kind = |io: ErrorKind| {
            store_error("spend", redis::RedisError::from(Error::from(io))).failure_kind()
        };
        assert_eq!(kind(ErrorKind::TimedOut), Some(FailureKind::Deadline));
        assert_eq!(
            kind(ErrorKind::ConnectionRefused),
            Some(FailureKind::Refused)
        );
        assert_eq!(kind(ErrorKind::ConnectionReset), Some(FailureKind::Reset));
        assert_eq!(kind(ErrorKind::BrokenPipe), Some(FailureKind::Reset));
        assert_eq!(kind(ErrorKind::UnexpectedEof), Some(FailureKind::Reset));
        assert_eq!(kind(ErrorKind::PermissionDenied), Some(FailureKind::Other));
        let reply = redis::RedisError::from((redis::ErrorKind::Client, "OOM command not allowed"));
        assert_eq!(
            store_error("spend", reply).failure_kind(),
            Some(FailureKind::Other)
        );
        // Our own refusals are no failure of Redis.
        assert_eq!(StoreError::CircuitOpen.failure_kind(), None);
    }

    #[test]
    fn script_replies_are_checked() {
        let keys = || ["a", "b"].into_iter();
        let ok = parse_read(&["5", "", "7"], keys(), false, &[]).unwrap();
        assert_eq!((ok.now, ok.tats), (5, vec![None, Some(7)]));
        assert!(parse_read(&["5"], keys(), false, &[]).is_err());
        assert!(parse_read(&["x", ""], keys().take(1), false, &[]).is_err());
        let reply = ["5".to_string(), "99999999999999999999".to_string()];
        let poisoned = parse_read(&reply, keys().take(1), false, &[]);
        assert!(poisoned.is_err_and(|e| e.is_data_error()));
        let reset = parse_read(&reply, keys().take(1), true, &[]).unwrap();
        assert_eq!(reset.tats, vec![Some(Nanos::MAX)]);
    }
}
