//! A fast, unkeyed hasher for the maps built from the configuration: names by text and by
//! number, policies by name number, overrides by id, descriptor rules by domain.
//!
//! std's default SipHash is keyed to resist HashDoS, where an attacker chooses the keys
//! *inserted* into a map and makes them collide. These maps are filled only from the
//! operator's configuration; requests only look keys up, and a lookup cannot lengthen the
//! probe sequences of a table it does not write. So these maps need speed, not a key:
//! every request hashes a name, a name number and an id through them. (The memory store's
//! bucket table is filled from request ids, and keeps keyed hashing.)
//!
//! The hash folds 8-byte words with a multiply (as FxHash does) and ends with a full
//! avalanche (the SplitMix64 finaliser), so that the top bits hashbrown groups by are
//! mixed too.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` with [`ConfigHasher`].
pub type ConfigMap<K, V> = HashMap<K, V, BuildHasherDefault<ConfigHasher>>;

/// See the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct ConfigHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl ConfigHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for ConfigHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
        // The zero padding above makes "a" and "a\0" one word: the length tells them apart.
        self.add(bytes.len() as u64);
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn hash(text: &str) -> u64 {
        BuildHasherDefault::<ConfigHasher>::default().hash_one(text)
    }

    #[test]
    fn equal_keys_hash_equal_and_near_keys_differ() {
        assert_eq!(hash("NewOrdersPerAccount"), hash("NewOrdersPerAccount"));
        let keys = [
            "",
            "a",
            "b",
            "ab",
            "ba",
            "a\0",
            "12345678",
            "123456789",
            "1234567",
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(hash(a), hash(b), "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn top_bits_spread_over_sequential_ids() {
        // hashbrown takes its 7-bit control tag from the top bits: sequential ids (the
        // common override list) must not share them.
        let tags: std::collections::HashSet<u64> =
            (0..1000).map(|i| hash(&i.to_string()) >> 57).collect();
        assert_eq!(tags.len(), 128, "every 7-bit tag is used");
    }

    #[test]
    fn a_map_of_100k_override_ids_works() {
        let mut map: ConfigMap<Box<str>, u32> = ConfigMap::default();
        for i in 0..100_000u32 {
            map.insert(format!("{i}").into_boxed_str(), i);
        }
        assert_eq!(map.len(), 100_000);
        assert_eq!(map.get("77777"), Some(&77_777));
        assert_eq!(map.get("100000"), None);
    }
}
