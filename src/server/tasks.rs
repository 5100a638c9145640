//! The server's background tasks, one function each: started by the server (`serve`), stopped
//! by its cancellation tokens, joined through its task tracker.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::listener::GuardedListener;
use crate::limits::config::LimitTable;
use crate::observe::metrics::Metrics;
use crate::resp::RespServer;
use crate::service::overrides::RuntimeOverrides;
use crate::service::settle::Settler;
use crate::service::Decider;
use crate::store::{MemoryStore, Store};

/// Drops expired buckets every `every` and keeps the live-bucket gauge current, until
/// `stopped`.
pub async fn sweep(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    every: Duration,
    stopped: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut leases = store.lease_events();
    let mut refused = store.bucket_refusals();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.cancelled() => return,
        }
        let dropped = store.sweep();
        // The store counts leases; the series get what it counted since the last tick.
        let now = store.lease_events();
        metrics.leases_counted([
            now.acquired.saturating_sub(leases.acquired),
            now.released.saturating_sub(leases.released),
            now.expired.saturating_sub(leases.expired),
            now.refused.saturating_sub(leases.refused),
        ]);
        leases = now;
        let refused_now = store.bucket_refusals();
        metrics.buckets_refused(std::array::from_fn(|i| {
            refused_now[i].saturating_sub(refused[i])
        }));
        refused = refused_now;
        metrics.store.swept_buckets.inc_by(dropped as u64);
        if let Some(live) = store.live_buckets() {
            metrics.store.live_buckets.set(live as i64);
        }
    }
}

/// Releases the reservations whose hold has ended, every `every`, until `stopped`
/// (docs/concurrency.md, "Reservations"). Every replica runs it; the table claims each
/// due hold once, so one of them releases it.
pub async fn release_holds(
    settler: Settler,
    decider: Arc<Decider>,
    every: Duration,
    stopped: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.cancelled() => return,
        }
        match settler.release_due(&decider).await {
            Ok(_) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "holds: the due ones could not be claimed; retrying");
            }
            Err(_) => {}
        }
    }
}

/// Copies the shared temporary overrides every `every` (at once first) until `stopped`.
/// A failure keeps the last copy in force (each override still expiring on time); before
/// the first copy there is none, and the store's own lines say why Redis does not answer.
pub async fn sync_overrides(
    runtime: Arc<RuntimeOverrides>,
    limits: Arc<ArcSwap<LimitTable>>,
    metrics: Arc<Metrics>,
    every: Duration,
    stopped: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut failing, mut copied) = (false, false);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.cancelled() => return,
        }
        let table = limits.load_full();
        match runtime.sync(&table).await {
            Ok(synced) => {
                if failing {
                    tracing::info!("temporary overrides: copied from redis again");
                    failing = false;
                }
                copied = true;
                let restored = runtime.take_restored();
                if restored > 0 {
                    metrics.runtime_overrides("restored", restored as u64);
                    tracing::warn!(
                        restored,
                        "temporary overrides: redis had lost them (restarted empty?); put \
                         back this replica's copy (each with the time it had left)"
                    );
                }
                if synced.changed {
                    tracing::info!(
                        applied = synced.applied,
                        unknown_names = synced.unknown_names,
                        "temporary overrides changed in redis: copied"
                    );
                }
                if !synced.rejected.is_empty() {
                    tracing::warn!(
                        rejected = synced.rejected.len(),
                        first = ?&synced.rejected[..synced.rejected.len().min(5)],
                        "temporary overrides in redis that are no valid override here were left out"
                    );
                }
            }
            Err(e) => {
                metrics.config.override_sync_failures.inc();
                if !failing && copied {
                    tracing::warn!(
                        error = %e,
                        "temporary overrides: cannot copy them from redis; the last copy stays in force"
                    );
                } else if !failing {
                    // Nothing was copied, so nothing stays in force: the store's start
                    // line says whether Redis answers.
                    tracing::info!(
                        error = %e,
                        "temporary overrides: not copied from redis yet; none applies until it answers"
                    );
                }
                failing = true;
            }
        }
    }
}

/// Accepts Redis-protocol connections until `stop`; each then finishes what it has read
/// (within the grace period) and closes. Connection tasks join `tasks`.
pub async fn accept_resp(
    resp: Arc<RespServer>,
    listener: GuardedListener,
    stop: CancellationToken,
    tasks: TaskTracker,
) {
    // The first byte of a command is its handshake (bounded by the handshake timeout).
    let mut listener = listener.with_handshake_bytes(1);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.cancelled() => return,
        };
        // Always TCP: the Redis-protocol listener is never a Unix socket.
        let Some(peer) = peer else { continue };
        tasks.spawn(
            resp.clone()
                .serve_connection(stream, peer.ip(), stop.clone()),
        );
    }
}

/// Writes the memory store's snapshot every `every`, until `stopped` (the last one is
/// written after the drain, by the server).
pub async fn snapshots(
    store: Arc<MemoryStore>,
    path: std::path::PathBuf,
    metrics: Arc<Metrics>,
    every: Duration,
    stopped: CancellationToken,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.cancelled() => return,
        }
        write_snapshot(store.clone(), path.clone(), metrics.clone()).await;
    }
}

/// Writes the memory store's snapshot once (on a blocking thread), logging and counting
/// the result.
pub async fn write_snapshot(
    store: Arc<MemoryStore>,
    path: std::path::PathBuf,
    metrics: Arc<Metrics>,
) {
    let shown = path.display().to_string();
    let written = tokio::task::spawn_blocking(move || store.write_snapshot(&path)).await;
    let error = match written {
        Ok(Ok(written)) => {
            metrics
                .store
                .snapshot
                .writes
                .with_label_values(&["ok"])
                .inc();
            metrics.store.snapshot.write_seconds.set(written.seconds);
            let at = written.at as f64 / crate::clock::SECOND as f64;
            metrics.store.snapshot.written_at.set(at);
            tracing::info!(
                path = %shown,
                buckets = written.buckets,
                bytes = written.bytes,
                seconds = written.seconds,
                "memory store snapshot written"
            );
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(e) => format!("the writer failed: {e}"),
    };
    metrics
        .store
        .snapshot
        .writes
        .with_label_values(&["failed"])
        .inc();
    tracing::error!(path = %shown, %error, "could not write the memory store snapshot");
}
