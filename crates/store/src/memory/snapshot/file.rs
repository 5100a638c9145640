//! The snapshot file on disk: the private temporary file a snapshot is written to before
//! it is renamed over the target, and the checks that a file at the path is one to trust
//! before it is read (a regular file, this process's user's, writable by no one else).

use std::fs::{File, Metadata};
use std::io;
use std::path::{Path, PathBuf};

use super::Ignored;

/// Opens the snapshot at `path` for reading if it is a regular file this process's user
/// owns and no one else may write. Looked at before it is opened (opening a FIFO waits
/// for a writer, a device may act), opened without blocking, and looked at again through
/// the open file (what is read is what was checked).
pub(super) fn open_trusted(path: &Path) -> Result<File, Ignored> {
    let missing = |e: io::Error| match e.kind() {
        io::ErrorKind::NotFound => Ignored::Missing,
        _ => Ignored::Unreadable(e),
    };
    regular(&std::fs::metadata(path).map_err(missing)?)?;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path).map_err(missing)?;
    let metadata = file.metadata().map_err(Ignored::Unreadable)?;
    regular(&metadata)?;
    trusted(&metadata)?;
    Ok(file)
}

/// A regular file, or what else it is.
fn regular(metadata: &Metadata) -> Result<(), Ignored> {
    let kind = metadata.file_type();
    if kind.is_file() {
        return Ok(());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return Err(Ignored::NotAFile("FIFO"));
        }
        if kind.is_socket() {
            return Err(Ignored::NotAFile("socket"));
        }
        if kind.is_block_device() || kind.is_char_device() {
            return Err(Ignored::NotAFile("device"));
        }
    }
    Err(Ignored::NotAFile(if kind.is_dir() {
        "directory"
    } else {
        "special file"
    }))
}

/// Owned by this process's user and writable by no one else: whoever could write the file
/// could choose who is denied after the next start.
#[cfg(unix)]
fn trusted(metadata: &Metadata) -> Result<(), Ignored> {
    use std::os::unix::fs::MetadataExt;
    let me = effective_uid();
    if metadata.uid() != me {
        return Err(Ignored::Untrusted(format!(
            "owned by uid {}, not by this process's uid {me}: another user may have written it",
            metadata.uid()
        )));
    }
    if metadata.mode() & 0o022 != 0 {
        return Err(Ignored::Untrusted(format!(
            "mode {:04o}: its group or others may write it",
            metadata.mode() & 0o7777
        )));
    }
    Ok(())
}

#[cfg(not(unix))]
fn trusted(_: &Metadata) -> Result<(), Ignored> {
    Ok(())
}

#[cfg(unix)]
#[allow(unsafe_code)]
fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// Why a file at `path` cannot be replaced by a rename, when it is another user's in a
/// sticky directory (such as /tmp) this process's user does not own: only the file's or
/// the directory's owner (or root) may replace it there.
#[cfg(unix)]
pub(super) fn unreplaceable(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let me = effective_uid();
    let target = std::fs::symlink_metadata(path).ok()?;
    let parent = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = std::fs::metadata(parent.unwrap_or(Path::new("."))).ok()?;
    let sticky = dir.mode() & 0o1000 != 0;
    (me != 0 && sticky && target.uid() != me && dir.uid() != me).then(|| {
        format!(
            "the file there is owned by uid {}, in a sticky directory: this process's uid \
             {me} cannot replace it (keep the snapshot in a directory only its user can write)",
            target.uid()
        )
    })
}

#[cfg(not(unix))]
pub(super) fn unreplaceable(_: &Path) -> Option<String> {
    None
}

/// A new file at `path` (what was there is removed first) that only its owner may read: it
/// holds the store's hash keys.
fn create_private(path: &Path) -> io::Result<File> {
    // A file left there (by a crash, or by someone else) keeps its own mode: start anew.
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// The temporary file beside `path`: `.<name>.tmp`, or, when another user's file of that
/// name cannot be removed (in a sticky directory), `.<name>.<random>.tmp`.
pub(super) fn create_temporary(path: &Path) -> io::Result<(PathBuf, File)> {
    let usual = temporary_beside(path, "");
    match create_private(&usual) {
        Ok(file) => Ok((usual, file)),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied && usual.exists() => {
            use std::hash::BuildHasher;
            let random = std::collections::hash_map::RandomState::new().hash_one(0u8);
            let other = temporary_beside(path, &format!(".{random:016x}"));
            Ok((other.clone(), create_private(&other)?))
        }
        Err(e) => Err(e),
    }
}

/// `.<name><suffix>.tmp` in the target's directory (a rename within one file system is
/// atomic).
fn temporary_beside(path: &Path, suffix: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "snapshot".to_string());
    path.with_file_name(format!(".{name}{suffix}.tmp"))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{private, store, written, T0};
    use cellrate_core::clock::FakeClock;

    /// The attacker: a FIFO at the path. Opening it waited for a writer, for ever (the
    /// server never started); it is refused at once.
    #[cfg(unix)]
    #[test]
    fn a_fifo_at_the_path_is_refused_without_waiting() {
        let clock = FakeClock::new(T0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("buckets.snapshot");
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.unwrap().success(), "mkfifo");
        let (tx, rx) = std::sync::mpsc::channel();
        let fifo = path.clone();
        std::thread::spawn(move || {
            let mut fresh = store(&clock, 1_000);
            let _ = tx.send(fresh.restore_snapshot(&fifo).map_err(|e| e.reason()));
        });
        let answer = rx.recv_timeout(std::time::Duration::from_secs(5));
        if answer.is_err() {
            // Lets the reader waiting in open(2) go, so that its thread ends.
            use std::os::unix::fs::OpenOptionsExt;
            let mut writer = std::fs::OpenOptions::new();
            let _ = writer
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path);
        }
        let answer = answer.expect("restore_snapshot returned within 5 s");
        assert_eq!(answer.unwrap_err(), "not_a_file");
    }

    /// The attacker: a file others may write, or another user's. Either was restored; now
    /// neither is, and the store starts empty.
    #[cfg(unix)]
    #[test]
    fn a_file_another_user_may_have_written_is_not_restored() {
        use std::os::unix::fs::PermissionsExt;
        let (clock, _dir, path, _old) = written();
        for mode in [0o620, 0o602, 0o666] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let mut fresh = store(&clock, 1_000);
            let e = fresh.restore_snapshot(&path).unwrap_err();
            assert_eq!(e.reason(), "untrusted", "mode {mode:o}: {e}");
            assert_eq!(fresh.live_buckets(), 0);
        }
        // Readable by others (which it should not be) but writable by its owner alone.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            store(&clock, 1_000)
                .restore_snapshot(&path)
                .unwrap()
                .buckets,
            4
        );
        private(&path);
        // Another user's (the tests run as root, who may give it away).
        match std::os::unix::fs::chown(&path, Some(65534), Some(65534)) {
            Ok(()) => {
                let mut fresh = store(&clock, 1_000);
                let e = fresh.restore_snapshot(&path).unwrap_err();
                assert_eq!(e.reason(), "untrusted", "{e}");
                assert!(e.to_string().contains("owned by uid 65534"), "{e}");
                assert_eq!(fresh.live_buckets(), 0);
            }
            Err(e) => eprintln!("not root ({e}): the owner part of this test is not run"),
        }
    }

    /// A temporary file someone left readable does not make the next snapshot readable.
    #[cfg(unix)]
    #[test]
    fn a_leftover_temporary_file_does_not_lend_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let (_clock, dir, path, old) = written();
        let leftover = dir.path().join(".buckets.snapshot.tmp");
        std::fs::write(&leftover, b"old").unwrap();
        std::fs::set_permissions(&leftover, std::fs::Permissions::from_mode(0o644)).unwrap();
        old.write_snapshot(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let (_clock, dir, path, old) = written();
        let before = std::fs::read(&path).unwrap();
        // The target is a directory now: the rename fails.
        let blocked = dir.path().join("blocked");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("x"), b"x").unwrap();
        assert!(old.write_snapshot(&blocked).is_err());
        assert!(!dir.path().join(".blocked.tmp").exists());
        // A directory that does not exist: nothing is written anywhere.
        assert!(old
            .write_snapshot(&dir.path().join("no/such/file"))
            .is_err());
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }
}
