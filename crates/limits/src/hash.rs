//! The hasher of the maps built from the configuration: names by text and by number,
//! policies by name number, overrides by id, descriptor rules by domain.
//!
//! std's default SipHash is keyed to resist HashDoS, where an attacker chooses the keys
//! *inserted* into a map and makes them collide. These maps are filled only from the
//! operator's configuration; requests only look keys up, and a lookup cannot lengthen the
//! probe sequences of a table it does not write. So these maps need speed, not a key:
//! every request hashes a name, a name number and an id through them. (The memory store's
//! bucket table is filled from request ids, and keeps keyed hashing.) foldhash's fast
//! hasher with its fixed seed is that: a few multiplies per word, well mixed top bits.

use std::collections::HashMap;

/// A `HashMap` with foldhash's fast, fixed-seed hasher.
pub type ConfigMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn hash(text: &str) -> u64 {
        foldhash::fast::FixedState::default().hash_one(text)
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
