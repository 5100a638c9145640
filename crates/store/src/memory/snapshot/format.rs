//! The snapshot file's format, and the check of a whole file before any of its buckets is
//! restored.
//!
//! Layout, little-endian:
//!
//! | bytes | what |
//! |---|---|
//! | 8 | `cellrate` |
//! | 4 | format version, [`VERSION`] (2; a file of version 1 is read too) |
//! | 4 | 0 (reserved) |
//! | 16 | the fingerprints' SipHash keys ([`crate::memory::BucketHasher`]) |
//! | 8 | when it was written, Unix nanoseconds |
//! | 8, 8 | n, m: the buckets that follow, of configured and of caller-given limits |
//! | 18 × n | the configured limits' buckets: fingerprint, TAT, tag (the limit name's number, 65 535 for higher ones) |
//! | 18 × m | the caller-given limits' buckets: fingerprint, TAT, tag |
//! | 8 | CRC-64/XZ of the buckets, then of the header |
//!
//! A file is read through once before anything of it is restored (`check`): its size
//! against what the store's bound (`--max-buckets`) allows, before any of it is read; then
//! its magic, version, size against its counts, and checksum.

use std::fs::File;
use std::io::{BufReader, Read};

use super::Ignored;
use crate::table::Tag;

pub(super) const MAGIC: &[u8; 8] = b"cellrate";
/// The format's version; a file of another (but 1, [`UNTAGGED`]) is ignored.
pub(super) const VERSION: u32 = 2;
/// The format before buckets carried their tag: 16-byte entries.
pub(super) const UNTAGGED: u32 = 1;
pub(super) const HEADER: u64 = 8 + 4 + 4 + 16 + 8 + 16;
pub(super) const TRAILER: u64 = 8;
pub(super) const ENTRY: u64 = 18;
/// The tag a format-1 file's buckets are restored under: one with no name share (the
/// number of envoyproxy/ratelimit-format limits, which has none).
pub(super) const NO_SHARE: Tag = cellrate_limits::names::RATELIMIT_NUMBER as Tag;
pub(super) const BUFFER: usize = 1 << 20;
pub(super) const CRC: crc::Crc<u64, crc::Table<16>> =
    crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_XZ);

/// What the first reading of a file found: it is whole, and these are its keys and counts.
pub(super) struct Header {
    pub(super) keys: (u64, u64),
    pub(super) counts: [u64; 2],
    /// Bytes an entry takes in its format.
    pub(super) entry: u64,
}

/// Reads the open snapshot once: its size against `most`, magic, version, size against
/// its counts, and checksum.
pub(super) fn check(file: &File, most: u64) -> Result<Header, Ignored> {
    let size = file.metadata().map_err(Ignored::Unreadable)?.len();
    if size > most {
        return Err(Ignored::TooLarge { size, most });
    }
    let mut input = BufReader::with_capacity(BUFFER, file);
    let mut header = [0u8; HEADER as usize];
    let mut start = Vec::with_capacity(HEADER as usize);
    (&mut input)
        .take(HEADER)
        .read_to_end(&mut start)
        .map_err(Ignored::Unreadable)?;
    if !start.starts_with(MAGIC) {
        // A file cut inside the magic is still ours, cut short.
        return Err(if MAGIC.starts_with(&start) && !start.is_empty() {
            Ignored::Truncated(size, HEADER + TRAILER)
        } else {
            Ignored::Foreign
        });
    }
    if start.len() < 12 {
        return Err(Ignored::Truncated(size, HEADER + TRAILER));
    }
    let version = u32::from_le_bytes(start[8..12].try_into().unwrap_or_default());
    let entry = match version {
        VERSION => ENTRY,
        UNTAGGED => ENTRY - 2,
        _ => return Err(Ignored::Version(version)),
    };
    if start.len() < HEADER as usize {
        return Err(Ignored::Truncated(size, HEADER + TRAILER));
    }
    header.copy_from_slice(&start);
    let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap_or_default());
    let (keys, counts) = ((word(16), word(24)), [word(40), word(48)]);
    let needed = counts[0]
        .checked_add(counts[1])
        .and_then(|n| n.checked_mul(entry))
        .and_then(|n| n.checked_add(HEADER + TRAILER));
    if needed != Some(size) {
        return Err(Ignored::Truncated(size, needed.unwrap_or(u64::MAX)));
    }
    let mut digest = CRC.digest();
    let mut left = size - HEADER - TRAILER;
    let mut buffer = vec![0u8; BUFFER];
    while left > 0 {
        let n = left.min(BUFFER as u64) as usize;
        input
            .read_exact(&mut buffer[..n])
            .map_err(Ignored::Unreadable)?;
        digest.update(&buffer[..n]);
        left -= n as u64;
    }
    digest.update(&header);
    let mut sum = [0u8; 8];
    input.read_exact(&mut sum).map_err(Ignored::Unreadable)?;
    if digest.finalize() != u64::from_le_bytes(sum) {
        return Err(Ignored::Corrupt);
    }
    Ok(Header {
        keys,
        counts,
        entry,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use tokio::time::Instant;

    use super::super::tests::{private, store, written, T0};
    use super::*;
    use cellrate_core::clock::FakeClock;

    /// The header of a snapshot claiming `counts` buckets.
    fn header_claiming(counts: [u64; 2]) -> Vec<u8> {
        let mut header = Vec::new();
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&[0; 4 + 16]);
        header.extend_from_slice(&T0.to_le_bytes());
        header.extend_from_slice(&counts[0].to_le_bytes());
        header.extend_from_slice(&counts[1].to_le_bytes());
        header
    }

    /// The attacker: a file that claims 2^28 buckets (a 4 GiB sparse file, no disk used)
    /// where the store holds 1 000 000. It was read whole for its checksum (16 to 19 s
    /// before the server was ready); it is refused from its size, unread.
    #[test]
    fn a_file_claiming_more_than_the_bound_is_refused_unread() {
        let clock = FakeClock::new(T0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("buckets.snapshot");
        let claimed: u64 = 1 << 28;
        let mut file = File::create(&path).unwrap();
        file.write_all(&header_claiming([claimed, 0])).unwrap();
        file.set_len(HEADER + claimed * ENTRY + TRAILER).unwrap();
        drop(file);
        private(&path);
        let mut fresh = store(&clock, 1_000_000);
        let started = Instant::now();
        let e = fresh.restore_snapshot(&path).unwrap_err();
        let took = started.elapsed();
        assert_eq!(e.reason(), "too_large", "{e} after {took:?}");
        assert!(took < std::time::Duration::from_secs(1), "{took:?}");
        assert_eq!(fresh.live_buckets(), 0);
    }

    /// Every way a file can be wrong is ignored whole, with its reason, and the store stays
    /// empty: missing, not ours, another version, cut anywhere, any byte changed.
    #[test]
    fn unusable_files_are_ignored_whole_with_their_reason() {
        let (clock, dir, path, _old) = written();
        let good = std::fs::read(&path).unwrap();
        let try_bytes = |bytes: &[u8]| {
            let file = dir.path().join("bad");
            std::fs::write(&file, bytes).unwrap();
            private(&file);
            let mut fresh = store(&clock, 1_000);
            let e = fresh.restore_snapshot(&file).unwrap_err();
            assert_eq!(fresh.live_buckets(), 0, "{e}");
            e.reason()
        };
        let mut fresh = store(&clock, 1_000);
        let e = fresh
            .restore_snapshot(&dir.path().join("none"))
            .unwrap_err();
        assert_eq!(e.reason(), "missing");
        let e = fresh.restore_snapshot(dir.path()).unwrap_err();
        assert_eq!(e.reason(), "not_a_file", "{e}");
        assert_eq!(try_bytes(b""), "foreign");
        assert_eq!(try_bytes(b"REDIS0011\xfa\x09redis-ver"), "foreign");
        assert_eq!(try_bytes(&[0xffu8; 4096]), "foreign");
        let mut other = good.clone();
        other[8] = 3;
        assert_eq!(try_bytes(&other), "version");
        for cut in [3, 8, 12, 40, 56, 57, good.len() - 17, good.len() - 1] {
            assert_eq!(try_bytes(&good[..cut]), "truncated", "cut at {cut}");
        }
        let mut padded = good.clone();
        padded.extend_from_slice(&[0; 16]);
        assert_eq!(try_bytes(&padded), "truncated");
        // Every byte after the version, changed: the keys, the time, the counts, the
        // buckets, the checksum.
        for at in 12..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x20;
            let reason = try_bytes(&bad);
            assert!(
                reason == "corrupt" || reason == "truncated",
                "byte {at} changed: {reason}"
            );
        }
        // Counts that overflow are no crash.
        let mut huge = good.clone();
        huge[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(try_bytes(&huge), "truncated");
    }
}
