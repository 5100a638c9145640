//! The process's stop signal: SIGINT or SIGTERM, as a future.

use std::future::Future;

/// A future that resolves on the first SIGINT or SIGTERM.
///
/// The handlers are installed when this function is called, not when the future is first
/// polled, so a signal that arrives while the server is still starting is not lost to the
/// default action (which would kill the process without draining).
pub fn signal() -> impl Future<Output = ()> + Send {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => tracing::info!("SIGTERM received"),
                        _ = int.recv() => tracing::info!("SIGINT received"),
                    }
                }
                _ => {
                    tracing::warn!("cannot install signal handlers; stop with SIGKILL");
                    std::future::pending::<()>().await
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
