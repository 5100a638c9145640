//! The memory store's snapshot file: its live buckets, written on graceful shutdown (and
//! every `--snapshot-interval-seconds` if set) and read back at the next start, so that a
//! restarted replica goes on where it stopped instead of handing every client a full burst.
//!
//! Its parts: the format (`format.rs`: the layout, and the check of a whole file before
//! any of it is restored) and the file on disk (`file.rs`: a private temporary file to
//! write, and the checks that a file at the path may be trusted before it is opened).
//!
//! Written to a temporary file beside the target (mode 0600: the hash keys let whoever reads
//! them aim for collisions), fsynced, renamed over the target, and the directory fsynced: a
//! crash leaves the old file or the new one, never half of one.
//!
//! The file is trusted no further than its checks. It is used only when it is a regular
//! file (a FIFO or a device at the path is refused before it is opened, and it is opened
//! without blocking in case one is put there in between), owned by this process's user and
//! writable by no one else (its contents decide who is denied), and no larger than the
//! store's bound (`--max-buckets`) allows, before any of it is read. Then it is read twice
//! through the one open file: once to check the size and checksum, then to restore; a file
//! that fails any check is ignored whole.
//!
//! Restored buckets are fingerprints of `"<number>:<id>"` keys with their TATs, so they
//! meet the limits in force now exactly as a reload's do: a limit that changed since
//! applies to the old TAT, a name or window that changed makes another key (a fresh
//! bucket), and a TAT that has passed is a full bucket, not restored. Each bucket is
//! counted against the bounds as a new one would be, its name's share included
//! (`--bucket-name-share`): what does not fit is left out (`over_bound`), so a file written
//! while one name flooded the table gives that name no more than its share. (A file of
//! format 1, written before buckets carried their name, restores its buckets under no
//! name's share, bounded by the table alone.) A TAT further ahead
//! than any accepted limit can put one ([`HORIZON`]) is not restored either: only a forged
//! file has one, and restored it would deny its key for centuries.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;
use tokio::time::Instant;

use super::{BucketHasher, MemoryStore, Space};
use crate::table::Tag;
use cellrate_core::clock::Nanos;
use cellrate_core::gcra::MAX_BURST_OFFSET;

mod file;
mod format;
use file::{create_temporary, open_trusted, unreplaceable};
use format::{check, BUFFER, CRC, ENTRY, HEADER, MAGIC, NO_SHARE, TRAILER, VERSION};

/// How far past now a restored TAT may lie: twice the longest burst offset a limit may have
/// (20 years). A charge in debt puts a TAT at most two burst offsets ahead, a calendar
/// window's value at most its end (a year) plus its use, at most 2^52 ns (52 days), debt
/// and envoyproxy/ratelimit's every hit included: nothing an accepted limit wrote lies
/// further.
pub(super) const HORIZON: Nanos = 2 * MAX_BURST_OFFSET;

/// A snapshot written.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    pub buckets: usize,
    pub bytes: u64,
    pub seconds: f64,
    /// When it was written (the store's clock).
    pub at: Nanos,
}

/// A snapshot restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Buckets restored (live at the time of reading).
    pub buckets: usize,
    /// Buckets in the file that had expired since (full: nothing to restore).
    pub expired: usize,
    /// Live buckets left out because the bound (`--max-buckets`) was reached.
    pub over_bound: usize,
    /// Buckets left out because their TAT lay further ahead than [`HORIZON`].
    pub too_far: usize,
}

/// Why a snapshot file was not used (the store then starts empty).
#[derive(Debug, thiserror::Error)]
pub enum Ignored {
    #[error("no snapshot file (a first start)")]
    Missing,
    #[error("cannot read it: {0}")]
    Unreadable(io::Error),
    #[error("it is a {0}, not a regular file: not opened")]
    NotAFile(&'static str),
    #[error("not trusted: {0}")]
    Untrusted(String),
    #[error(
        "{size} bytes, more than a snapshot of the store's bound (--max-buckets) can be \
         ({most}): not read"
    )]
    TooLarge { size: u64, most: u64 },
    #[error("not a cellrate snapshot")]
    Foreign,
    #[error("snapshot format {0}, this cellrate reads {VERSION}")]
    Version(u32),
    #[error("truncated or padded: {0} bytes where its counts need {1}")]
    Truncated(u64, u64),
    #[error("its checksum does not match: corrupt")]
    Corrupt,
    #[error("every bucket in it has refilled since it was written: nothing to restore")]
    Stale,
}

impl Ignored {
    /// The metric's label.
    pub fn reason(&self) -> &'static str {
        match self {
            Ignored::Missing => "missing",
            Ignored::Unreadable(_) => "unreadable",
            Ignored::NotAFile(_) => "not_a_file",
            Ignored::Untrusted(_) => "untrusted",
            Ignored::TooLarge { .. } => "too_large",
            Ignored::Foreign => "foreign",
            Ignored::Version(_) => "version",
            Ignored::Truncated(..) => "truncated",
            Ignored::Corrupt => "corrupt",
            Ignored::Stale => "stale",
        }
    }
}

impl MemoryStore {
    /// Writes the live buckets to `path` (atomically: a temporary file renamed over it).
    /// One shard is locked at a time, long enough to copy its buckets.
    pub fn write_snapshot(&self, path: &Path) -> io::Result<Written> {
        let started = Instant::now();
        let (temporary, file) = create_temporary(path)?;
        let written = match self.write_to(file) {
            Ok(written) => written,
            Err(e) => {
                let _ = std::fs::remove_file(&temporary);
                return Err(e);
            }
        };
        if let Err(e) = std::fs::rename(&temporary, path) {
            let _ = std::fs::remove_file(&temporary);
            let why = unreplaceable(path).map(|why| format!(": {why}"));
            let said = format!("cannot rename the new file over the old: {e}");
            return Err(io::Error::new(e.kind(), said + &why.unwrap_or_default()));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        Ok(Written {
            seconds: started.elapsed().as_secs_f64(),
            ..written
        })
    }

    /// Whether a snapshot can be written at `path`: its temporary file is created there
    /// and removed, and a file at `path` can be replaced.
    pub fn check_writable(path: &Path) -> io::Result<()> {
        let (temporary, _) = create_temporary(path)?;
        std::fs::remove_file(&temporary)?;
        match unreplaceable(path) {
            Some(why) => Err(io::Error::new(io::ErrorKind::PermissionDenied, why)),
            None => Ok(()),
        }
    }

    fn write_to(&self, file: File) -> io::Result<Written> {
        let mut out = BufWriter::with_capacity(BUFFER, file);
        // The header's counts are known at the end: it is written again then.
        out.write_all(&[0u8; HEADER as usize])?;
        let mut digest = CRC.digest();
        let mut counts = [0u64; 2];
        let mut copy = Vec::new();
        for space in [Space::Configured, Space::CallerGiven] {
            for shard in 0..self.shards.len() {
                copy.clear();
                copy.extend(self.lock(shard).table(space).entries());
                for (print, tat, tag) in &copy {
                    let mut entry = [0u8; ENTRY as usize];
                    entry[..8].copy_from_slice(&print.to_le_bytes());
                    entry[8..16].copy_from_slice(&tat.to_le_bytes());
                    entry[16..].copy_from_slice(&tag.to_le_bytes());
                    digest.update(&entry);
                    out.write_all(&entry)?;
                }
                counts[space as usize] += copy.len() as u64;
            }
        }
        let mut header = Vec::with_capacity(HEADER as usize);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&self.hasher.keys.0.to_le_bytes());
        header.extend_from_slice(&self.hasher.keys.1.to_le_bytes());
        header.extend_from_slice(&self.clock.now().to_le_bytes());
        header.extend_from_slice(&counts[0].to_le_bytes());
        header.extend_from_slice(&counts[1].to_le_bytes());
        digest.update(&header);
        out.write_all(&digest.finalize().to_le_bytes())?;
        out.seek(SeekFrom::Start(0))?;
        out.write_all(&header)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        let buckets = (counts[0] + counts[1]) as usize;
        Ok(Written {
            buckets,
            bytes: HEADER + ENTRY * buckets as u64 + TRAILER,
            seconds: 0.0,
            at: self.clock.now(),
        })
    }

    /// Restores the buckets of the snapshot at `path` into this store, which must be new
    /// (empty): it takes the file's hash keys. Buckets whose TAT has passed are left out,
    /// and so are those beyond the bound or the [`HORIZON`].
    pub fn restore_snapshot(&mut self, path: &Path) -> Result<Restored, Ignored> {
        debug_assert_eq!(self.live_buckets(), 0, "restoring into a store in use");
        let file = open_trusted(path)?;
        let buckets = (self.room.bound[0] as u64).saturating_add(self.room.bound[1] as u64);
        let most = buckets
            .saturating_mul(ENTRY)
            .saturating_add(HEADER + TRAILER);
        let header = check(&file, most)?;
        let now = self.clock.now();
        let horizon = now.saturating_add(HORIZON);
        (&file)
            .seek(SeekFrom::Start(HEADER))
            .map_err(Ignored::Unreadable)?;
        let mut input = BufReader::with_capacity(BUFFER, &file);
        self.hasher = BucketHasher { keys: header.keys };
        let mut restored = Restored {
            buckets: 0,
            expired: 0,
            over_bound: 0,
            too_far: 0,
        };
        // Each table sized for its share first: the file lists a shard's buckets in slot
        // order, and a table growing as sorted fingerprints arrive would pack them all in
        // its first part (restoring 10^7 buckets took 23 s that way, not 1).
        let shards = self.shards.len() as u64;
        for (space, count) in [
            (Space::Configured, header.counts[0]),
            (Space::CallerGiven, header.counts[1]),
        ] {
            let kept = count.min(self.room.bound[space as usize] as u64);
            let each = (kept / shards + kept / shards / 8 + 16) as usize;
            for shard in self.shards.iter_mut() {
                let tables = shard.0.get_mut();
                *tables.table(space) = crate::table::TatTable::with_capacity(each);
            }
        }
        let mut entry = [0u8; ENTRY as usize];
        let entry = &mut entry[..header.entry as usize];
        for (space, count) in [
            (Space::Configured, header.counts[0]),
            (Space::CallerGiven, header.counts[1]),
        ] {
            for _ in 0..count {
                input.read_exact(entry).map_err(Ignored::Unreadable)?;
                let print = u64::from_le_bytes(entry[..8].try_into().unwrap_or_default());
                let tat = Nanos::from_le_bytes(entry[8..16].try_into().unwrap_or_default());
                let tag = match entry.get(16..18) {
                    Some(tag) => Tag::from_le_bytes(tag.try_into().unwrap_or_default()),
                    None => NO_SHARE,
                };
                if tat <= now || print < crate::table::MIN_PRINT {
                    restored.expired += 1;
                } else if tat > horizon {
                    restored.too_far += 1;
                } else if self.reserve(space, tag, 1).is_err() {
                    restored.over_bound += 1;
                } else {
                    let shard = self.shard_of((print, space));
                    let added = self.shards[shard]
                        .0
                        .get_mut()
                        .table(space)
                        .insert(print, tat, tag);
                    if added {
                        restored.buckets += 1;
                    } else {
                        // The same fingerprint twice: only a damaged file has that.
                        self.dropped(space, tag, 1);
                    }
                }
            }
        }
        if restored.buckets == 0 && restored.expired > 0 && restored.too_far == 0 {
            return Err(Ignored::Stale);
        }
        Ok(restored)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::format::UNTAGGED;

    use super::*;
    use crate::StoreItem;
    use cellrate_core::clock::{FakeClock, SECOND};
    use cellrate_core::gcra::{Limit, Mode};
    use cellrate_limits::names::BucketKey;
    pub(super) const T0: Nanos = 1_700_000_000 * SECOND;

    fn item(key: &str) -> StoreItem {
        StoreItem {
            key: BucketKey::new(100, key),
            limit: Limit::new(10, 10, 10 * SECOND).unwrap(),
            cost: 4,
            mode: Mode::CheckAndSpend,
            lease: None,
        }
    }

    /// A store with no name share (the bound's own tests).
    pub(super) fn store(clock: &FakeClock, max: usize) -> MemoryStore {
        MemoryStore::with_caller_share(Arc::new(clock.clone()), 16, max, 10)
            .with_bucket_name_share(100)
    }

    /// A store with three buckets, written: the clock, the directory and the file.
    pub(super) fn written() -> (FakeClock, tempfile::TempDir, PathBuf, MemoryStore) {
        let clock = FakeClock::new(T0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("buckets.snapshot");
        let old = store(&clock, 1_000);
        for key in ["a", "b", "c"] {
            assert!(old.spend_now(&[item(key)]).unwrap().allowed);
        }
        let caller = StoreItem {
            key: BucketKey::new(0, "i/10/10s/k"),
            ..item("k")
        };
        assert!(caller.key.is_caller_given());
        old.spend_now(&[caller]).unwrap();
        let written = old.write_snapshot(&path).unwrap();
        assert_eq!(written.buckets, 4);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), written.bytes);
        (clock, dir, path, old)
    }

    #[test]
    fn a_restored_store_goes_on_where_the_old_one_stopped() {
        let (clock, _dir, path, old) = written();
        // A new process: other random hash keys, another shard count, later.
        clock.advance(SECOND);
        let mut new = MemoryStore::with_caller_share(Arc::new(clock.clone()), 64, 1_000, 10);
        assert!(new.hasher != old.hasher);
        let restored = new.restore_snapshot(&path).unwrap();
        assert_eq!(
            restored,
            Restored {
                buckets: 4,
                expired: 0,
                over_bound: 0,
                too_far: 0
            }
        );
        assert_eq!(new.live_buckets(), 4);
        for key in ["a", "b", "c"] {
            assert_eq!(new.tat(&item(key).key), old.tat(&item(key).key), "{key}");
        }
        // 4 of 10 spent a second ago (1 back since): 7 left, so a cost of 4 leaves 3.
        let out = new.spend_now(&[item("a")]).unwrap();
        assert!(out.allowed);
        assert_eq!(out.decisions[0].remaining, 3);
        // Nothing is left of the temporary file, and only the owner may read the file.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("buckets.snapshot")]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn expired_buckets_are_left_out_and_an_all_expired_file_is_stale() {
        let (clock, _dir, path, old) = written();
        // One bucket is spent further: it outlives the others.
        clock.advance(SECOND);
        old.spend_now(&[item("a")]).unwrap();
        old.write_snapshot(&path).unwrap();
        // "a" is full at T0 + 8 s, the others at T0 + 4 s.
        clock.advance(5 * SECOND);
        let mut new = store(&clock, 1_000);
        let restored = new.restore_snapshot(&path).unwrap();
        assert_eq!((restored.buckets, restored.expired), (1, 3));
        clock.advance(60 * SECOND);
        let mut later = store(&clock, 1_000);
        let e = later.restore_snapshot(&path).unwrap_err();
        assert_eq!(e.reason(), "stale", "{e}");
        assert_eq!(later.live_buckets(), 0);
    }

    #[test]
    fn the_bound_holds_on_restore() {
        let (clock, _dir, path, _old) = written();
        // 4 with a 10 % caller share: 4 for configured limits, none for caller-given ones.
        let mut small = store(&clock, 4);
        let restored = small.restore_snapshot(&path).unwrap();
        assert_eq!((restored.buckets, restored.over_bound), (3, 1));
        assert_eq!(small.live_buckets(), 3);
        // 3 cannot hold the file's 4: it is not read.
        let mut smaller = store(&clock, 3);
        let e = smaller.restore_snapshot(&path).unwrap_err();
        assert_eq!(e.reason(), "too_large", "{e}");
        assert_eq!(smaller.live_buckets(), 0);
    }

    /// A file written while one name flooded the table (900 of its ids, 10 of another
    /// name's) gives that name no more than its share at the next start: 225 of 900 (25 %
    /// of 900 configured), the other name's 10 all. A format-1 file (no tags) restores
    /// under no name's share, bounded by the table (900 of 910). On 3ebe882 there was no
    /// name share: 900 restored, the table full at start.
    #[test]
    fn a_restore_respects_the_name_shares() {
        let clock = FakeClock::new(T0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("buckets.snapshot");
        let flooded = store(&clock, 2_000);
        let of = |number: u32, id: String| StoreItem {
            key: BucketKey::new(number, &id),
            ..item("")
        };
        for n in 0..900 {
            assert!(
                flooded
                    .spend_now(&[of(100, format!("k{n}"))])
                    .unwrap()
                    .allowed
            );
        }
        for n in 0..10 {
            assert!(
                flooded
                    .spend_now(&[of(101, format!("ip{n}"))])
                    .unwrap()
                    .allowed
            );
        }
        flooded.write_snapshot(&path).unwrap();
        let shared = || MemoryStore::with_caller_share(Arc::new(clock.clone()), 16, 1_000, 10);
        let mut restarted = shared();
        let restored = restarted.restore_snapshot(&path).unwrap();
        assert_eq!((restored.buckets, restored.over_bound), (235, 675));
        assert_eq!(
            (restarted.name_buckets(100), restarted.name_buckets(101)),
            (225, 10)
        );
        assert!(
            !restarted
                .spend_now(&[of(100, "new".into())])
                .unwrap()
                .allowed
        );
        assert!(
            restarted
                .spend_now(&[of(101, "new".into())])
                .unwrap()
                .allowed
        );
        // The same buckets in format 1: entries of 16 bytes, no tag.
        let v2 = std::fs::read(&path).unwrap();
        let mut v1 = v2[..HEADER as usize].to_vec();
        v1[8..12].copy_from_slice(&UNTAGGED.to_le_bytes());
        for entry in v2[HEADER as usize..v2.len() - TRAILER as usize].chunks(ENTRY as usize) {
            v1.extend_from_slice(&entry[..16]);
        }
        v1.extend_from_slice(&[0; TRAILER as usize]);
        std::fs::write(&path, resealed(v1)).unwrap();
        let mut old_format = shared();
        let restored = old_format.restore_snapshot(&path).unwrap();
        let counts = (restored.buckets, restored.over_bound);
        assert_eq!((counts, old_format.name_buckets(100)), ((900, 10), 0));
    }

    /// `bytes` with its checksum made good again, as a forger who knows the format makes it.
    fn resealed(mut bytes: Vec<u8>) -> Vec<u8> {
        let end = bytes.len() - TRAILER as usize;
        let mut digest = CRC.digest();
        digest.update(&bytes[HEADER as usize..end]);
        digest.update(&bytes[..HEADER as usize]);
        bytes[end..].copy_from_slice(&digest.finalize().to_le_bytes());
        bytes
    }

    /// The attacker: a file (with a good checksum) whose first bucket is due 235 years from
    /// now, which would deny its key for as long. It was restored; now it is left out and
    /// the other buckets are restored.
    #[test]
    fn a_tat_further_ahead_than_any_limit_can_put_one_is_not_restored() {
        let (clock, dir, path, old) = written();
        let mut bytes = std::fs::read(&path).unwrap();
        let at = HEADER as usize + 8;
        let forged = T0 + 235 * 365 * 86_400 * SECOND;
        bytes[at..at + 8].copy_from_slice(&forged.to_le_bytes());
        let file = dir.path().join("forged");
        std::fs::write(&file, resealed(bytes)).unwrap();
        private(&file);
        let mut new = store(&clock, 1_000);
        let restored = new.restore_snapshot(&file).unwrap();
        assert_eq!(restored.buckets, 3);
        assert_eq!(new.live_buckets(), 3);
        for key in ["a", "b", "c"] {
            let tat = new.tat(&item(key).key);
            assert!(
                tat.is_none() || tat == old.tat(&item(key).key),
                "{key}: {tat:?}"
            );
        }
    }

    /// The horizon is exact: a TAT at it is restored, one nanosecond past it is counted and
    /// left out; a file of such buckets alone restores nothing and says why (not "stale").
    #[test]
    fn the_horizon_is_exact_and_counted() {
        let (clock, dir, path, _old) = written();
        let good = std::fs::read(&path).unwrap();
        let with_first = |tat: Nanos| {
            let mut bytes = good.clone();
            let at = HEADER as usize + 8;
            bytes[at..at + 8].copy_from_slice(&tat.to_le_bytes());
            let file = dir.path().join("edge");
            std::fs::write(&file, resealed(bytes)).unwrap();
            private(&file);
            store(&clock, 1_000).restore_snapshot(&file).unwrap()
        };
        assert_eq!(HORIZON, 7_300 * 86_400 * SECOND);
        let at = with_first(T0 + HORIZON);
        assert_eq!((at.buckets, at.too_far), (4, 0));
        let past = with_first(T0 + HORIZON + 1);
        assert_eq!((past.buckets, past.too_far), (3, 1));
        let mut bytes = std::fs::read(&path).unwrap();
        let count = (bytes.len() - (HEADER + TRAILER) as usize) / ENTRY as usize;
        for n in 0..count {
            let at = (HEADER + ENTRY * n as u64 + 8) as usize;
            bytes[at..at + 8].copy_from_slice(&Nanos::MAX.to_le_bytes());
        }
        std::fs::write(&path, resealed(bytes)).unwrap();
        let all = store(&clock, 1_000).restore_snapshot(&path).unwrap();
        assert_eq!((all.buckets, all.too_far), (0, 4));
    }

    /// Only the owner may write `path` (whatever the umask made it).
    pub(super) fn private(path: &Path) {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let _ = path;
    }

    #[test]
    fn every_reason_has_its_series() {
        let reasons = [
            Ignored::Missing,
            Ignored::Unreadable(io::Error::other("x")),
            Ignored::NotAFile("FIFO"),
            Ignored::Untrusted("x".to_string()),
            Ignored::TooLarge { size: 2, most: 1 },
            Ignored::Foreign,
            Ignored::Version(2),
            Ignored::Truncated(1, 2),
            Ignored::Corrupt,
            Ignored::Stale,
        ];
        let labels: Vec<&str> = reasons.iter().map(Ignored::reason).collect();
        assert_eq!(labels, cellrate_observe::metrics::SNAPSHOT_IGNORED_REASONS);
    }
}
