//! The decision listener on a Unix socket (`--grpc-uds`, envoyproxy/ratelimit's
//! `GRPC_UDS`), instead of TCP, as upstream serves it: the same services, bounds and
//! timeouts as on TCP (the per-address bound aside: every peer of a Unix socket is local,
//! and the socket file's mode decides who may connect).
//!
//! The socket file is the one thing here that touches the file system, carefully:
//!
//! - At start, a file already at the path is removed only if it is a socket (never
//!   through a symlink: `lstat`) and no server answers on it (a stale socket left by a
//!   crash); a regular file, a directory, a symlink or a live socket is left as it is and
//!   startup stops, naming it.
//! - The new socket is made `0660` (owner and group may connect).
//! - At shutdown it is removed, if the path still holds the very socket made here (same
//!   device and inode): a socket another process has put there since stays.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, UnixListener};

/// A listening socket for the decision listener: TCP, or a Unix socket with its file.
pub enum Bound {
    Tcp(TcpListener),
    Unix(UnixListener, SocketFile),
}

impl From<TcpListener> for Bound {
    fn from(listener: TcpListener) -> Bound {
        Bound::Tcp(listener)
    }
}

impl Bound {
    /// Where it listens, for logs: `127.0.0.1:8081`, or `unix:/run/ratelimit.sock`.
    pub fn describe(&self) -> String {
        match self {
            Bound::Tcp(listener) => listener
                .local_addr()
                .map_or_else(|_| "?".to_string(), |a| a.to_string()),
            Bound::Unix(_, file) => format!("unix:{}", file.path.display()),
        }
    }
}

/// Why a Unix socket could not be made at a path: the configuration's fault (exit 78).
#[derive(Debug, thiserror::Error)]
pub enum UnixSocketError {
    #[error("{0}: exists and is not a socket (a {1}); it is left as it is: remove it or name another path")]
    NotASocket(PathBuf, &'static str),
    #[error("{0}: a server is listening on this socket already")]
    InUse(PathBuf),
    #[error("{0}: {1}")]
    Io(PathBuf, io::Error),
}

/// The socket file made by [`bind`]: removed when dropped, if the path still holds it.
pub struct SocketFile {
    path: PathBuf,
    /// Its device and inode, as made.
    id: (u64, u64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == self.id);
        if ours {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!(path = %self.path.display(), error = %e, "could not remove the Unix socket");
            }
        }
    }
}

/// A Unix socket listening at `path`, mode 0660, after removing a stale one (see the
/// module's documentation). Needs a Tokio runtime.
pub fn bind(path: &Path) -> Result<Bound, UnixSocketError> {
    let failed = |e| UnixSocketError::Io(path.to_path_buf(), e);
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(failed(e)),
        Ok(meta) => {
            let kind = meta.file_type();
            if !kind.is_socket() {
                let what = match () {
                    _ if kind.is_symlink() => "symbolic link",
                    _ if kind.is_dir() => "directory",
                    _ if kind.is_file() => "regular file",
                    _ => "special file",
                };
                return Err(UnixSocketError::NotASocket(path.to_path_buf(), what));
            }
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => return Err(UnixSocketError::InUse(path.to_path_buf())),
                // Nobody listens: left by a process that is gone.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    tracing::info!(path = %path.display(), "removing a stale Unix socket");
                    std::fs::remove_file(path).map_err(failed)?;
                }
                Err(e) => return Err(failed(e)),
            }
        }
    }
    let listener = UnixListener::bind(path).map_err(failed)?;
    let meta = std::fs::symlink_metadata(path).map_err(failed)?;
    let file = SocketFile {
        path: path.to_path_buf(),
        id: (meta.dev(), meta.ino()),
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(failed)?;
    Ok(Bound::Unix(listener, file))
}
