//! The server's background tasks, one function each: started by [`super::serve`], stopped
//! by its cancellation tokens, joined through its task tracker.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::listener::GuardedListener;
use crate::resp::RespServer;

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
        tasks.spawn(
            resp.clone()
                .serve_connection(stream, peer.ip(), stop.clone()),
        );
    }
}
