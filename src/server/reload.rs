//! Hot reload of the limits directory.
//!
//! Three things ask for a reload, all funnelled into one channel so that reloads never
//! overlap: a file-system watcher on the **directory** (editors and Kubernetes replace files
//! by rename or by swapping the ConfigMap's `..data` symlink, which a watch on a file would
//! miss), `SIGHUP`, and a slow timer as a safety net (a watch can be lost, e.g. when the
//! directory itself is replaced). A reload re-reads every file through its path (following
//! symlinks), validates the whole directory, compares the content hash with the limits in
//! force, and swaps the new [`LimitTable`] in atomically only when it is valid and
//! different. On any error the old limits stay, and the error is logged, counted and shown
//! by `/healthz`. Buckets are untouched: the new limits read the old TATs.

use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::{EventKind, RecursiveMode};
use notify_debouncer_full::{new_debouncer, DebounceEventResult};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::limits::ratelimit_format::RateLimitConfig;

use super::Shared;
use crate::limits::config::{read_files, LimitTable, LoadError, Sources};

type Watcher = notify_debouncer_full::Debouncer<
    notify::RecommendedWatcher,
    notify_debouncer_full::RecommendedCache,
>;

/// Watches `settings.dir` (not recursively), sending a reload request after each debounced
/// batch of events other than accesses. `None` (logged) when watching is impossible.
fn watch_dir(settings: &ReloadSettings, tx: mpsc::Sender<&'static str>) -> Option<Watcher> {
    let handler = move |result: DebounceEventResult| match result {
        Ok(events) => {
            // Our own reads produce access events: they are no reason to reload.
            if events
                .iter()
                .any(|e| !matches!(e.event.kind, EventKind::Access(_)))
            {
                let _ = tx.try_send("file change");
            }
        }
        Err(errors) => {
            tracing::warn!(?errors, "watching the limits directory");
            let _ = tx.try_send("watch error");
        }
    };
    let mut debouncer = match new_debouncer(settings.debounce, None, handler) {
        Ok(debouncer) => debouncer,
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the file watcher; reloading on SIGHUP and timer only");
            return None;
        }
    };
    match debouncer.watch(&settings.dir, RecursiveMode::NonRecursive) {
        Ok(()) => Some(debouncer),
        Err(e) => {
            tracing::warn!(error = %e, dir = %settings.dir.display(), "cannot watch the limits directory; reloading on SIGHUP and timer only");
            None
        }
    }
}

/// How reloads are triggered.
#[derive(Debug, Clone)]
pub struct ReloadSettings {
    /// The limits directory.
    pub dir: PathBuf,
    /// Watch the directory for changes (off: SIGHUP and the timer only).
    pub watch: bool,
    /// Quiet time after the last file event before reloading.
    pub debounce: Duration,
    /// Re-read this often regardless of events.
    pub interval: Duration,
    /// Reload on SIGHUP.
    pub sighup: bool,
}

/// Loads the directory (and applies xDS updates) and swaps valid, changed limits in.
pub struct Reloader {
    /// The limits directory; `None`: no files (limits from xDS alone, or fixed).
    dir: Option<PathBuf>,
    /// With xDS, a directory that does not exist holds no files instead of being an error.
    missing_dir_ok: bool,
    /// The limits it swaps; the store it tells after every swap (so that nothing derived
    /// from the old limits survives); the counters and health it reports to.
    shared: Shared,
    /// Held while a new table is built and swapped in: a file reload and an xDS update
    /// each rebuild with the other's sources in force, so they must not interleave.
    building: Mutex<()>,
    /// The errors of the last rejected reload, to log a repeat in one line.
    last_failure: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    m.lock()
}

impl Reloader {
    pub fn new(dir: Option<PathBuf>, missing_dir_ok: bool, shared: Shared) -> Reloader {
        Reloader {
            dir,
            missing_dir_ok,
            shared,
            building: Mutex::new(()),
            last_failure: Mutex::new(None),
        }
    }

    /// Swaps `table` in unless its version is in force; `true`: swapped.
    fn install(&self, table: LimitTable, cause: &str) -> bool {
        if table.version() == self.shared.limits.load().version() {
            return false;
        }
        let version = table.version().to_string();
        self.shared.health.limits_loaded(table.has_limits());
        self.shared.limits.store(Arc::new(table));
        self.shared.store.limits_changed();
        self.shared
            .metrics
            .config_loaded(&version, self.shared.clock.now());
        self.shared.health.config_loaded(&version);
        tracing::info!(cause, %version, "limits reloaded");
        true
    }

    /// Re-reads the directory now, with the xDS resources in force. `Ok(true)`: new
    /// limits are in force; `Ok(false)`: unchanged content.
    pub fn reload(&self, cause: &str) -> Result<bool, LoadError> {
        let Some(dir) = &self.dir else {
            return Ok(false);
        };
        let _building = lock(&self.building);
        let built = read_files(dir, self.missing_dir_ok).and_then(|files| {
            let in_force = self.shared.limits.load();
            LimitTable::from_sources(Sources {
                files: Arc::new(files),
                xds: in_force.sources().xds.clone(),
                merge_domains: in_force.sources().merge_domains,
            })
        });
        match built {
            Ok(table) => {
                *lock(&self.last_failure) = None;
                if self.install(table, cause) {
                    self.shared.metrics.reload("success");
                    return Ok(true);
                }
                // Logged when an event or SIGHUP caused it (after a rejected reload this is
                // the operator's revert taking effect); the timer's quiet re-reads only at
                // debug level, not a line every interval.
                let version = self.shared.limits.load().version().to_string();
                if cause == "timer" {
                    tracing::debug!(cause, %version, "limits unchanged");
                } else {
                    tracing::info!(cause, %version, "limits unchanged");
                }
                self.shared.health.config_valid();
                self.shared.metrics.reload("unchanged");
                Ok(false)
            }
            Err(errors) => {
                let message = errors.to_string();
                let mut last = lock(&self.last_failure);
                if last.as_deref() == Some(message.as_str()) {
                    // The timer retries a broken directory every interval: one line, not
                    // every error again.
                    tracing::warn!(cause, errors = errors.0.len(), "limits reload still rejected (same errors); the previous limits stay in force");
                } else {
                    for error in &errors.0 {
                        tracing::error!(cause, %error, "limits reload rejected; the previous limits stay in force");
                    }
                    *last = Some(message);
                }
                self.shared.health.reload_failed(&errors.0);
                self.shared.metrics.reload("failure");
                Err(errors)
            }
        }
    }

    /// Applies the resources of one xDS update (all of them: state of the world) with the
    /// files in force. `Ok(true)`: new limits are in force; `Ok(false)`: the same content;
    /// `Err`: nothing changed (the update is to be NACKed with the errors).
    pub fn apply_xds(&self, resources: Vec<RateLimitConfig>) -> Result<bool, LoadError> {
        let _building = lock(&self.building);
        let in_force = self.shared.limits.load();
        let built = LimitTable::from_sources(Sources {
            files: in_force.sources().files.clone(),
            xds: Arc::new(resources),
            merge_domains: in_force.sources().merge_domains,
        });
        let updates = &self.shared.metrics.config.xds_updates;
        match built.map(|table| self.install(table, "xds")) {
            Ok(true) => {
                updates.with_label_values(&["applied"]).inc();
                Ok(true)
            }
            Ok(false) => {
                updates.with_label_values(&["unchanged"]).inc();
                Ok(false)
            }
            // Logged and counted by the xDS client, which NACKs it.
            Err(errors) => Err(errors),
        }
    }

    /// Starts watching now (so that no change after this call is missed) and spawns, on
    /// `tasks`, the task that reloads on file events, SIGHUP and the timer until `stop` is
    /// cancelled.
    pub fn spawn(
        self: Arc<Self>,
        settings: ReloadSettings,
        stop: CancellationToken,
        tasks: &TaskTracker,
    ) {
        // Capacity 1: events that arrive while a reload is pending fold into it.
        let (tx, rx) = mpsc::channel::<&'static str>(1);
        let debouncer = if settings.watch {
            watch_dir(&settings, tx)
        } else {
            None
        };
        // Installed now: SIGHUP's default action would end the process.
        #[cfg(unix)]
        let hangup = if settings.sighup {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
        } else {
            None
        };
        #[cfg(not(unix))]
        let hangup: Option<()> = None;
        tasks.spawn(async move {
            // The debouncer's thread watches as long as this task holds it.
            let _debouncer = debouncer;
            self.run(settings, rx, hangup, stop).await
        });
    }

    async fn run(
        self: Arc<Self>,
        settings: ReloadSettings,
        mut rx: mpsc::Receiver<&'static str>,
        #[cfg(unix)] mut hangup: Option<tokio::signal::unix::Signal>,
        #[cfg(not(unix))] _hangup: Option<()>,
        stop: CancellationToken,
    ) {
        let mut timer = tokio::time::interval(settings.interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        timer.tick().await; // the first tick is immediate; the limits were just loaded

        loop {
            let cause = tokio::select! {
                Some(cause) = rx.recv() => cause,
                _ = timer.tick() => "timer",
                _ = async {
                    #[cfg(unix)]
                    if let Some(h) = hangup.as_mut() {
                        h.recv().await;
                        return;
                    }
                    std::future::pending::<()>().await
                } => "SIGHUP",
                _ = stop.cancelled() => return,
            };
            // Loading reads files: keep it off the runtime's worker threads. The outcome is
            // already logged and counted by `reload`.
            let reloader = self.clone();
            let _ = tokio::task::spawn_blocking(move || reloader.reload(cause)).await;
        }
    }
}
