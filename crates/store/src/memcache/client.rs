//! The memcached client: one pool of connections per server, keys spread over the servers
//! as envoyproxy/ratelimit's client (gomemcache) spreads them (the CRC-32 of the key,
//! modulo the number of servers, in the order given), every call within a deadline.
//!
//! A server's pool keeps at most `max_idle` idle connections (MEMCACHE_MAX_IDLE_CONNS)
//! and opens at most [`MAX_OPEN`] at once; a call that finds none free waits for one
//! within its deadline. A connection is put back only after a call that completed: one
//! that failed or missed its deadline is dropped, and the next call connects again (so a
//! restarted memcached is reached again without anything to do). An idle connection the
//! server closed is seen before it is reused.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::wire::{self, Conn, Reply, WireError};
use crate::{FailureKind, StoreError};

/// The most connections open to one server at once.
pub const MAX_OPEN: usize = 128;

/// What one server is asked in one call, on one connection: counters to read, to add to
/// (created with their expiry when missing), to take from (never below 0), and to delete.
#[derive(Debug, Default)]
pub(super) struct Plan<'k> {
    pub reads: Vec<&'k str>,
    /// Key, amount, expiry in seconds (memcached's exptime) if created.
    pub adds: Vec<(&'k str, u64, u64)>,
    pub takes: Vec<(&'k str, u64)>,
    pub deletes: Vec<&'k str>,
}

/// What the call got, in the plan's order.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Got {
    pub reads: Vec<Option<u64>>,
    /// Each counter after the addition.
    pub adds: Vec<u64>,
    /// Each counter after the subtraction; `None`: not there.
    pub takes: Vec<Option<u64>>,
    pub deleted: Vec<bool>,
}

struct Pooled {
    conn: Conn,
    _permit: OwnedSemaphorePermit,
}

struct Server {
    address: String,
    idle: Mutex<Vec<Pooled>>,
    open: Arc<Semaphore>,
}

/// The servers and their pools.
pub(super) struct Client {
    servers: Vec<Server>,
    timeout: Duration,
    max_idle: usize,
}

impl Client {
    /// A client of `servers` (`host:port`, in order); nothing is connected yet.
    pub(super) fn new(servers: &[String], timeout: Duration, max_idle: usize) -> Client {
        Client {
            servers: servers
                .iter()
                .map(|address| Server {
                    address: address.clone(),
                    idle: Mutex::new(Vec::new()),
                    open: Arc::new(Semaphore::new(MAX_OPEN)),
                })
                .collect(),
            timeout,
            max_idle,
        }
    }

    /// The server `key` lives on: gomemcache's choice (CRC-32/IEEE of the key, modulo the
    /// number of servers).
    pub(super) fn server_of(&self, key: &str) -> usize {
        const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
        match self.servers.len() {
            0 | 1 => 0,
            n => (CRC.checksum(key.as_bytes()) % n as u32) as usize,
        }
    }

    /// Runs `plan` on server `s` within the deadline.
    pub(super) async fn run(
        &self,
        s: usize,
        op: &'static str,
        plan: &Plan<'_>,
    ) -> Result<Got, StoreError> {
        let server = &self.servers[s];
        let call = async {
            let mut pooled = self.checkout(server).await?;
            let got = execute(&mut pooled.conn, plan)
                .await
                .map_err(|e| wire_error(op, e))?;
            self.checkin(server, pooled);
            Ok(got)
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout {
                op,
                timeout: self.timeout,
            }),
        }
    }

    /// An idle connection that is still usable, else a new one (waiting for room).
    async fn checkout(&self, server: &Server) -> Result<Pooled, StoreError> {
        loop {
            let idle = server.idle.lock().pop();
            match idle {
                Some(pooled) if pooled.conn.is_usable() => return Ok(pooled),
                Some(_) => continue,
                None => break,
            }
        }
        let permit = server
            .open
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| StoreError::backend("memcache connect", e))?;
        let stream = TcpStream::connect(&server.address)
            .await
            .map_err(|e| StoreError::backend_of(io_kind(&e), "memcache connect", e))?;
        let _ = stream.set_nodelay(true);
        Ok(Pooled {
            conn: Conn::new(stream),
            _permit: permit,
        })
    }

    fn checkin(&self, server: &Server, pooled: Pooled) {
        let mut idle = server.idle.lock();
        if idle.len() < self.max_idle {
            idle.push(pooled);
        }
    }
}

/// The plan's commands: reads in one `get`, then the additions (`incr`; `add` for each
/// counter missing; `incr` again for each that another call added meanwhile, as
/// envoyproxy/ratelimit does), then `decr`s and `delete`s, each step's commands in one write.
async fn execute(conn: &mut Conn, plan: &Plan<'_>) -> Result<Got, WireError> {
    let mut got = Got::default();
    if !plan.reads.is_empty() {
        // Each key once: memcached answers a key asked twice twice, which the reply's
        // bound (each key at most once) would refuse.
        let mut unique = plan.reads.clone();
        unique.sort_unstable();
        unique.dedup();
        conn.send(&wire::get(&unique)).await?;
        let values = conn.values(&unique).await?;
        got.reads = (plan.reads.iter())
            .map(|k| unique.binary_search(k).ok().and_then(|i| values[i]))
            .collect();
    }
    if !plan.adds.is_empty() {
        got.adds = additions(conn, &plan.adds).await?;
    }
    if !plan.takes.is_empty() {
        let mut out = Vec::new();
        for (key, n) in &plan.takes {
            wire::arithmetic(&mut out, "decr", key, *n);
        }
        conn.send(&out).await?;
        for _ in &plan.takes {
            got.takes.push(match conn.reply().await? {
                Reply::Value(v) => Some(v),
                Reply::NotFound => None,
                other => return Err(unexpected("decr", other)),
            });
        }
    }
    if !plan.deletes.is_empty() {
        let mut out = Vec::new();
        for key in &plan.deletes {
            wire::delete(&mut out, key);
        }
        conn.send(&out).await?;
        for _ in &plan.deletes {
            got.deleted.push(match conn.reply().await? {
                Reply::Stored => true,
                Reply::NotFound => false,
                other => return Err(unexpected("delete", other)),
            });
        }
    }
    Ok(got)
}

/// `incr` each counter; `add` those missing; `incr` again those another call added first.
async fn additions(conn: &mut Conn, adds: &[(&str, u64, u64)]) -> Result<Vec<u64>, WireError> {
    let mut after: Vec<Option<u64>> = vec![None; adds.len()];
    let mut out = Vec::new();
    for (key, n, _) in adds {
        wire::arithmetic(&mut out, "incr", key, *n);
    }
    conn.send(&out).await?;
    let mut missing = Vec::new();
    for (i, slot) in after.iter_mut().enumerate() {
        match conn.reply().await? {
            Reply::Value(v) => *slot = Some(v),
            Reply::NotFound => missing.push(i),
            other => return Err(unexpected("incr", other)),
        }
    }
    if missing.is_empty() {
        return Ok(after.into_iter().flatten().collect());
    }
    out.clear();
    for &i in &missing {
        let (key, n, exptime) = adds[i];
        wire::add(&mut out, key, n, exptime);
    }
    conn.send(&out).await?;
    let mut raced = Vec::new();
    for &i in &missing {
        match conn.reply().await? {
            Reply::Stored => after[i] = Some(adds[i].1),
            Reply::NotStored => raced.push(i),
            other => return Err(unexpected("add", other)),
        }
    }
    if !raced.is_empty() {
        out.clear();
        for &i in &raced {
            wire::arithmetic(&mut out, "incr", adds[i].0, adds[i].1);
        }
        conn.send(&out).await?;
        for &i in &raced {
            match conn.reply().await? {
                Reply::Value(v) => after[i] = Some(v),
                other => return Err(unexpected("incr after add", other)),
            }
        }
    }
    Ok(after.into_iter().flatten().collect())
}

fn unexpected(command: &str, reply: Reply) -> WireError {
    WireError::Malformed(format!("{command} answered {reply:?}"))
}

/// A failed call as a store error, classified by how it failed.
fn wire_error(op: &'static str, e: WireError) -> StoreError {
    let kind = match &e {
        WireError::Io(io) => io_kind(io),
        WireError::Closed => FailureKind::Reset,
        WireError::Malformed(_) | WireError::Server(_) => FailureKind::Other,
    };
    StoreError::backend_of(kind, op, e)
}

fn io_kind(e: &std::io::Error) -> FailureKind {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => FailureKind::Refused,
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
            FailureKind::Reset
        }
        _ => FailureKind::Other,
    }
}
