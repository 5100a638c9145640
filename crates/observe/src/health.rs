//! What the metrics listener says about the process: `/healthz` (alive, with the config in
//! force and the last reload error) and `/readyz` (503 once shutdown begins, or while a
//! required store fails). The routes that serve them, and `/metrics`, are
//! `cellrate::server::http`.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Health and readiness state, shared by the reloader, the shutdown path and the routes.
#[derive(Default)]
pub struct Health {
    /// The last reload error, for `/healthz`; `None` after a good load.
    last_reload_error: Mutex<Option<String>>,
    /// The config version in force, for `/healthz`.
    config_version: Mutex<String>,
    /// Set when shutdown begins: `/readyz` then answers 503.
    shutting_down: AtomicBool,
    /// When set, `/readyz` also needs the store to be answering.
    store_health: Mutex<Option<Arc<AtomicBool>>>,
    /// Set while the first xDS update is awaited (the gRPC listeners do not serve yet).
    waiting_for_config: AtomicBool,
    /// When set, readiness also needs limits in force (`--ready-needs-limits`).
    needs_limits: AtomicBool,
    /// Whether the limits in force hold any limit.
    has_limits: AtomicBool,
    /// Woken when readiness may have changed (the gRPC health service follows it).
    changed: tokio::sync::Notify,
}

fn lock<T>(m: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    m.lock()
}

impl Health {
    pub fn new() -> Arc<Health> {
        Arc::new(Health::default())
    }

    /// Limits were loaded (at startup or by reload): they are in force, and valid.
    pub fn config_loaded(&self, version: &str) {
        *lock(&self.config_version) = version.to_string();
        *lock(&self.last_reload_error) = None;
    }

    /// A reload found the limits in force again (e.g. the operator reverted a bad file).
    pub fn config_valid(&self) {
        *lock(&self.last_reload_error) = None;
    }

    /// A reload was rejected: its first error, cut to 1 KiB, and how many more there were.
    pub fn reload_failed(&self, errors: &[impl std::fmt::Display]) {
        let first = errors.first().map(ToString::to_string).unwrap_or_default();
        let mut summary: String = first.chars().take(1024).collect();
        if errors.len() > 1 {
            summary.push_str(&format!(" (and {} more)", errors.len() - 1));
        }
        *lock(&self.last_reload_error) = Some(summary);
    }

    /// Makes readiness depend on `healthy` (the store answers).
    pub fn require_store_health(&self, healthy: Arc<AtomicBool>) {
        *lock(&self.store_health) = Some(healthy);
    }

    /// Makes readiness need limits in force: until a load holds a limit, and whenever one
    /// holds none, `/readyz` and `/healthcheck` fail.
    pub fn require_limits(&self) {
        self.needs_limits.store(true, Ordering::SeqCst);
        self.changed.notify_one();
    }

    /// The limits now in force hold a limit (`true`) or none.
    pub fn limits_loaded(&self, any: bool) {
        self.has_limits.store(any, Ordering::SeqCst);
        self.changed.notify_one();
    }

    /// Whether the first xDS update is awaited: `/readyz` answers 503 meanwhile.
    pub fn set_waiting_for_config(&self, waiting: bool) {
        self.waiting_for_config.store(waiting, Ordering::SeqCst);
        self.changed.notify_one();
    }

    /// Whether `/readyz` answers 200.
    pub fn ready(&self) -> bool {
        !self.shutting_down.load(Ordering::SeqCst)
            && !self.waiting_for_config.load(Ordering::SeqCst)
            && (!self.needs_limits.load(Ordering::SeqCst) || self.has_limits.load(Ordering::SeqCst))
            && lock(&self.store_health)
                .as_ref()
                .is_none_or(|h| h.load(Ordering::Relaxed))
    }

    /// Marks the service as shutting down (`/readyz` answers 503).
    pub fn set_not_ready(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.changed.notify_one();
    }

    /// Resolves when readiness may have changed since the last call returned (one waiter:
    /// a change while nobody waits is kept for the next call). A store's health is not
    /// told here: who follows readiness also looks now and then.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// `/healthz`'s body: the config in force and the last reload error, if any.
    pub fn body(&self) -> String {
        serde_json::json!({
            "status": "ok",
            "config_version": *lock(&self.config_version),
            "last_reload_error": *lock(&self.last_reload_error),
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` errors as a reload reports them (a config error displays as `file: reason`).
    fn bad(reason: &str, n: usize) -> Vec<String> {
        vec![format!("defaults.yaml: {reason}"); n]
    }

    #[test]
    fn healthz_stays_small_and_forgets_a_reverted_error() {
        let h = Health::new();
        h.config_loaded("abc");
        h.reload_failed(&bad("bad", 1));
        assert!(h
            .body()
            .contains("\"last_reload_error\":\"defaults.yaml: bad\""));
        // Many long errors: the first, cut, and a count.
        h.reload_failed(&bad(&"x".repeat(5_000), 1_000));
        let body = h.body();
        assert!(body.len() < 1_200, "{} bytes", body.len());
        assert!(body.contains("(and 999 more)"), "{body}");
        // A reload that finds the limits in force (the operator reverted) clears it.
        h.config_valid();
        assert!(h.body().contains("\"last_reload_error\":null"));
        h.reload_failed(&bad("bad", 1));
        h.config_loaded("def");
        assert!(h.body().contains("\"last_reload_error\":null"));
        assert!(h.body().contains("\"config_version\":\"def\""));
    }

    /// A change told before anyone waits is kept for the next wait (the gRPC health
    /// follower would otherwise miss it until its next look).
    #[tokio::test]
    async fn a_change_told_before_the_wait_is_kept() {
        let h = Health::new();
        h.require_limits();
        let told = tokio::time::timeout(std::time::Duration::from_secs(5), h.changed());
        assert!(told.await.is_ok());
        assert!(!h.ready());
        h.limits_loaded(true);
        let told = tokio::time::timeout(std::time::Duration::from_secs(5), h.changed());
        assert!(told.await.is_ok());
        assert!(h.ready());
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(20), h.changed());
        assert!(quiet.await.is_err(), "nothing changed since");
    }

    #[test]
    fn readiness_follows_shutdown_and_a_required_store() {
        let h = Health::new();
        assert!(h.ready());
        let store = Arc::new(AtomicBool::new(false));
        h.require_store_health(store.clone());
        assert!(!h.ready());
        store.store(true, Ordering::Relaxed);
        assert!(h.ready());
        h.set_not_ready();
        assert!(!h.ready());
    }
}
