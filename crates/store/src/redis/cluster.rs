//! Redis Cluster: hash slots (CRC16 of the key or its `{tag}`), grouping a batch's keys
//! by slot, and escaping ids so that callers cannot choose a slot.

use std::collections::BTreeMap;

use super::connection::Connection;
use super::RedisStore;

/// Number of Redis Cluster hash slots.
pub(super) const SLOTS: usize = 16_384;

/// Escapes `%`, `{` and `}` so that an id can neither pick a cluster slot nor collide
/// with another id's escape.
pub(super) fn escape(id: &str) -> std::borrow::Cow<'_, str> {
    if !id.contains(['%', '{', '}']) {
        return id.into();
    }
    id.replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
        .into()
}

/// CRC16/XMODEM, the checksum of Redis Cluster key slots.
fn crc16(data: &[u8]) -> u16 {
    const XMODEM: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);
    XMODEM.checksum(data)
}

/// The hash slot of a key: of its `{tag}` when it has a non-empty one, else of the key.
pub fn slot(key: &str) -> usize {
    let bytes = key.as_bytes();
    let hashed = match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    usize::from(crc16(hashed)) % SLOTS
}

impl RedisStore {
    /// Groups item indices by slot (one group for standalone), in slot order.
    pub(super) fn groups(&self, keys: &[String]) -> Vec<(usize, Vec<usize>)> {
        if matches!(self.connection, Connection::Single(_) | Connection::Tls(_)) {
            return vec![(0, (0..keys.len()).collect())];
        }
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, key) in keys.iter().enumerate() {
            groups.entry(slot(key)).or_default().push(i);
        }
        groups.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_spec() {
        // Examples from the Redis Cluster specification and redis-cli.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12_182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}")); // empty tag: the whole key
        assert_ne!(slot("foo{}{bar}"), slot("bar"));
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
    }

    #[test]
    fn ids_cannot_pick_slots() {
        assert_eq!(escape("plain"), "plain");
        assert_eq!(escape("a{b}c%"), "a%7Bb%7Dc%25");
        assert_ne!(escape("%7B"), escape("{"));
    }
}
