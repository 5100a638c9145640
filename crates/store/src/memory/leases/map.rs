//! A shard's leases: a map from a key's fingerprint to its leases ([`Held`]), each lease a
//! keyed hash of its id ([`LeaseIdHasher`]) and its expiry, and the sweep of expired
//! leases.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::Ordering;

use crate::memory::lease_shares::Share;
use crate::memory::Fingerprint;
use cellrate_core::clock::Nanos;
use cellrate_core::gcra::lease::Lease;
use cellrate_limits::names::BucketKey;

/// A shard's leases, by key fingerprint.
pub(in crate::memory) type LeaseMap = HashMap<Fingerprint, Held, BuildHasherDefault<PrintHasher>>;

/// The lease map's hasher: a fingerprint is already a keyed hash of its key (SipHash-1-3
/// under the store's secret keys), so callers cannot aim keys at one slot; hashing it
/// again would cost a SipHash pass a lookup. Its halves are swapped: a shard holds the
/// fingerprints of one residue of the low bits (`shard_of`), and the map takes a slot by
/// the low bits.
#[derive(Default)]
pub(crate) struct PrintHasher(u64);

impl Hasher for PrintHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only fingerprints (u64) are hashed; any other input still spreads.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, print: u64) {
        self.0 = print.rotate_left(32);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Hashes lease ids to the 64 bits a lease keeps: foldhash's quality variant under seeds
/// drawn at random when the store is made (a few nanoseconds for a 36-byte id, against
/// about 20 for SipHash-1-3). Unknown seeds make the hashes unpredictable; foldhash does
/// not claim to resist an attacker who probes for collisions, and no more is needed here:
/// two ids of one key that collide act as one lease, which a caller choosing its own ids
/// gets anyway by sending one id twice (a retry), and a caller cannot aim at another's
/// lease without that lease's id (BENCHMARKS.md, "A lease against a spend").
pub(in crate::memory) struct LeaseIdHasher {
    seed: u64,
    shared: foldhash::SharedSeed,
}

impl LeaseIdHasher {
    /// Seeds from the operating system's randomness, through std's `RandomState`.
    pub(in crate::memory) fn random() -> LeaseIdHasher {
        let random = RandomState::new();
        LeaseIdHasher {
            seed: random.hash_one(0x6c65_6173_u64),
            shared: foldhash::SharedSeed::from_u64(random.hash_one(0x6964_u64)),
        }
    }

    pub(super) fn hash(&self, id: &str) -> u64 {
        let mut hasher = foldhash::quality::FoldHasher::with_seed(self.seed, &self.shared);
        hasher.write(id.as_bytes());
        hasher.finish()
    }
}

/// A key's leases, with the key itself (the request's own `Arc`, kept: no allocation), the
/// count of the limit its latest lease was taken under, for admin `Top` in flight, and the
/// count of its name's leases, which its own are part of.
#[derive(Debug)]
pub(in crate::memory) struct Held {
    pub(super) key: BucketKey,
    pub(super) count: u32,
    pub(in crate::memory) share: Share,
    pub(in crate::memory) leases: Vec<Lease>,
}

/// Drops a shard's expired leases (and from their names' counts); returns how many.
pub(in crate::memory) fn sweep(leases: &mut LeaseMap, now: Nanos) -> usize {
    let mut dropped = 0;
    leases.retain(|_, held| {
        let before = held.leases.len();
        held.leases.retain(|l| l.expires > now);
        let gone = before - held.leases.len();
        if gone > 0 {
            held.share.fetch_sub(gone, Ordering::AcqRel);
        }
        dropped += gone;
        !held.leases.is_empty()
    });
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One shard's fingerprints share their low bits (the shard is chosen by them); the
    /// lease map's hasher must not hand them to the map as they are, or they would all
    /// probe from one slot. 4 096 fingerprints of one shard of 512 (well-spread 64-bit
    /// values, as SipHash makes them, their low 9 bits 7): the map's slot bits (the low
    /// 12) of their hashes take at least 2 000 values (as they are: 8).
    #[test]
    fn one_shards_fingerprints_spread_over_the_lease_map() {
        use std::hash::BuildHasher;
        let prints = (1..=4_096u64).map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) & !511) | 7);
        let hasher = BuildHasherDefault::<PrintHasher>::default();
        let slots: std::collections::HashSet<u64> =
            prints.map(|p| hasher.hash_one(p) & 0xfff).collect();
        assert!(slots.len() > 2_000, "{} slots", slots.len());
    }
}
