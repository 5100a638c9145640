//! `--snapshot-file` against an attacker who can put things at its path: a FIFO, or a file
//! planted in a world-writable sticky directory by another user. The server still starts
//! at once, restores nothing it cannot trust, and says what it cannot write.

#![cfg(unix)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{serve_as, serve_with};
use crate::process_ops::{budget_left, metric, spend_budget, terminate};

/// The user the server runs as in these tests, and the other user who plants files.
const SERVICE: u32 = 65534;
const OTHER: u32 = 65533;

/// [`crate::common::budget_limits`], readable by any user.
fn budget_limits() -> tempfile::TempDir {
    let limits = crate::common::budget_limits();
    set_mode(limits.path(), 0o755);
    limits
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Writes `bytes` at `path` as `OTHER`'s file with `mode` (as that user would have).
fn plant(path: &Path, bytes: &[u8], mode: u32) {
    std::fs::write(path, bytes).unwrap();
    set_mode(path, mode);
    std::os::unix::fs::chown(path, Some(OTHER), Some(OTHER)).unwrap();
}

/// The attacker: a FIFO at the path. The start waited for a writer for ever; now it is
/// refused at once, counted, and the shutdown puts a snapshot in its place.
#[tokio::test]
async fn a_fifo_at_the_snapshot_path_does_not_hold_the_start() {
    let limits = budget_limits();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("buckets.snapshot");
    let made = std::process::Command::new("mkfifo").arg(&file).status();
    assert!(made.unwrap().success(), "mkfifo");
    let flags = [
        "--snapshot-file",
        file.to_str().unwrap(),
        "--grace-seconds",
        "1",
    ];
    let started = Instant::now();
    let server = serve_with(limits.path(), &flags);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "serving after {took:?}");
    assert_eq!(
        metric(
            &server,
            "cellrate_snapshot_ignored_total{reason=\"not_a_file\"}"
        ),
        Some(1.0)
    );
    spend_budget(&server.listen, "key-1", 5).await;
    terminate(server);
    assert!(std::fs::metadata(&file).unwrap().is_file(), "no snapshot");
}

/// The attacker, another user, plants files in the sticky world-writable directory of
/// `--snapshot-file` (the server runs as an unprivileged user): a snapshot at the path was
/// restored (it chose who is denied), and a temporary file beside it stopped every write.
/// Now the first is not restored and each write says why it fails; the second is no
/// obstacle.
#[tokio::test]
async fn in_a_sticky_directory_another_users_files_are_not_trusted_nor_a_block() {
    let limits = budget_limits();
    // A real snapshot, written by a server of our own: the attacker's copy of it.
    let own = tempfile::tempdir().unwrap();
    let good = own.path().join("buckets.snapshot");
    let server = serve_with(
        limits.path(),
        &[
            "--snapshot-file",
            good.to_str().unwrap(),
            "--grace-seconds",
            "1",
        ],
    );
    spend_budget(&server.listen, "key-1", 300).await;
    terminate(server);
    let forged = std::fs::read(&good).unwrap();

    let sticky = tempfile::tempdir().unwrap();
    set_mode(sticky.path(), 0o1777);
    let file = sticky.path().join("buckets.snapshot");
    let flags = [
        "--snapshot-file",
        file.to_str().unwrap(),
        "--snapshot-interval-seconds",
        "1",
        "--grace-seconds",
        "1",
    ];

    // The snapshot planted at the path: not restored, and not replaceable.
    plant(&file, &forged, 0o644);
    let server = serve_as(SERVICE, limits.path(), &flags);
    assert_eq!(
        metric(
            &server,
            "cellrate_snapshot_ignored_total{reason=\"untrusted\"}"
        ),
        Some(1.0)
    );
    assert_eq!(budget_left(&server.admin, "key-1").await, 10_000);
    let deadline = Instant::now() + Duration::from_secs(10);
    let said = (0..1_000)
        .map_while(|_| {
            let left = deadline.saturating_duration_since(Instant::now());
            server.logs.recv_timeout(left).ok()
        })
        .find(|line| line.contains("could not write the memory store snapshot"))
        .expect("a failed write is logged");
    assert!(said.contains("cannot replace it"), "{said}");
    assert!(said.contains(&format!("owned by uid {OTHER}")), "{said}");
    assert!(
        metric(&server, "cellrate_snapshot_writes_total{result=\"failed\"}") >= Some(1.0),
        "the failed write is counted"
    );
    terminate(server);
    assert_eq!(std::fs::metadata(&file).unwrap().uid(), OTHER);

    // Only a temporary file planted beside the path: the snapshot is written anyway.
    std::fs::remove_file(&file).unwrap();
    let temporary = sticky.path().join(".buckets.snapshot.tmp");
    plant(&temporary, b"not yours", 0o666);
    let server = serve_as(SERVICE, limits.path(), &flags);
    spend_budget(&server.listen, "key-2", 7).await;
    let written = crate::common::poll_until(
        Duration::from_secs(10),
        async || metric(&server, "cellrate_snapshot_writes_total{result=\"ok\"}"),
        |w| w.is_some_and(|w| w >= 1.0),
    )
    .await;
    assert!(written.is_some_and(|w| w >= 1.0), "no write: {written:?}");
    terminate(server);
    assert_eq!(std::fs::metadata(&file).unwrap().uid(), SERVICE);
    assert_eq!(std::fs::read(&temporary).unwrap(), b"not yours");
    let server = serve_as(SERVICE, limits.path(), &flags);
    assert_eq!(budget_left(&server.admin, "key-2").await, 9_993);
    terminate(server);
}
