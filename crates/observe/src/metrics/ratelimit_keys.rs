//! envoyproxy/ratelimit's per-descriptor statistics keys: one bounded, escaped key space,
//! whatever built the key (a file's configured key, or a request's own entries through
//! `detailed_metric`, `value_to_metric` or a descriptor's own `limit`).
//!
//! A key can come from a request, so three bounds hold here, where every key enters the
//! registry: a key is at most [`MAX_KEY_BYTES`] (a longer one is cut and told apart by a
//! digest of the whole), its unprintable characters (ESC, NUL, U+202E ...) are written as
//! `\u{XXXX}` so that no request text reaches the exposition raw, and all keys together
//! are at most [`MAX_KEYS`] and [`MAX_KEYS_BYTES`] bytes; beyond them, hits count under
//! `key="overflow"`.

use parking_lot::Mutex;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use prometheus::IntCounter;

use sha2::{Digest, Sha256};

/// The most keys of `cellrate_ratelimit_hits_total` with series of their own.
pub const MAX_KEYS: usize = 10_000;

/// The longest key, in bytes, as the exposition shows it.
pub const MAX_KEY_BYTES: usize = 256;

/// The most bytes of all keys together (each key is held once per statistic's series:
/// five times this, plus the series themselves, is what the keys can cost).
pub const MAX_KEYS_BYTES: usize = 1 << 20;

/// The key every hit counts under once the key space is full.
pub(super) const OVERFLOW: &str = "overflow";

/// The series a key's statistics also count in under a statsd mapping
/// ([`super::statsd_mapping`]), by stat in [`super::RATELIMIT_STATS`]' order; `None`
/// without a mapping.
pub(super) type MappedSeries = Option<Arc<[Option<IntCounter>]>>;

/// The keys that have series of their own (with their mapped series), and their bytes.
#[derive(Default)]
pub(super) struct KeySpace {
    keys: Mutex<(HashMap<Box<str>, MappedSeries>, usize)>,
}

impl KeySpace {
    /// Whether `key` has (or may now have) series of its own, and its mapped series
    /// (`map` gives them when the key is new); if not, it counts under [`OVERFLOW`]. `key`
    /// is already bounded and escaped ([`shown`]).
    pub(super) fn admit(
        &self,
        key: &str,
        map: impl FnOnce(&str) -> MappedSeries,
    ) -> Option<MappedSeries> {
        let mut guard = self.keys.lock();
        let (keys, bytes) = &mut *guard;
        if let Some(mapped) = keys.get(key) {
            return Some(mapped.clone());
        }
        if keys.len() < MAX_KEYS && *bytes + key.len() <= MAX_KEYS_BYTES {
            *bytes += key.len();
            let mapped = map(key);
            keys.insert(key.into(), mapped.clone());
            return Some(mapped);
        }
        None
    }
}

/// A statistics key as the exposition shows it: unprintable characters escaped, and a key
/// longer than [`MAX_KEY_BYTES`] cut at a character boundary and ended with `~` and 16 hex
/// digits of the whole key's SHA-256 (two long keys that share a beginning stay apart).
/// Unchanged, and not copied, when it is short and printable.
pub(super) fn shown(key: &str) -> Cow<'_, str> {
    let printable = cellrate_core::text::printable(key);
    if printable.len() <= MAX_KEY_BYTES {
        return printable;
    }
    let digest = Sha256::digest(key.as_bytes());
    let suffix = hex::encode(&digest[..8]);
    let head = cellrate_core::text::cut_bytes(&printable, MAX_KEY_BYTES - suffix.len() - 1);
    Cow::Owned(format!("{head}~{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_escaped_and_cut_but_stay_apart() {
        assert_eq!(shown("edge.user_alice"), "edge.user_alice");
        assert_eq!(
            shown("edge.user_\u{1b}[2J\u{202e}\0"),
            "edge.user_\\u{001B}[2J\\u{202E}\\u{0000}"
        );
        let a = format!("edge.user_{}", "a".repeat(20_000));
        let b = format!("edge.user_{}b", "a".repeat(20_000));
        let (a, b) = (shown(&a), shown(&b));
        assert!(a.len() <= MAX_KEY_BYTES && b.len() <= MAX_KEY_BYTES);
        assert_ne!(a, b);
        assert!(a.starts_with("edge.user_aaa"));
        // Escapes count against the bound too.
        assert!(shown(&"\u{1b}".repeat(1_000)).len() <= MAX_KEY_BYTES);
    }

    #[test]
    fn the_key_space_is_bounded_in_bytes_and_count() {
        let space = KeySpace::default();
        let long = |i: usize| format!("{i:0>width$}", width = MAX_KEY_BYTES);
        let fit = MAX_KEYS_BYTES / MAX_KEY_BYTES;
        let admit = |key: &str| space.admit(key, |_| None).is_some();
        for i in 0..fit {
            assert!(admit(&long(i)), "key {i}");
        }
        assert!(!admit(&long(fit)));
        // A key already admitted keeps its series.
        assert!(admit(&long(0)));
    }
}
