//! The bucket of a descriptor in a domain of envoyproxy/ratelimit's file format, shared by
//! the Envoy front end, which counts on it, and the admin commands, which name it back:
//! its key text (a digest of the domain and the counted entries; for the memcache store
//! envoyproxy/ratelimit's key text), its limit in cellrate's terms, and the name operators
//! see: `domain/key=value/...`, escaped and bounded, which `top` shows as the id of the
//! limit's label and `inspect`, `reset` and the temporary overrides take back. The digest
//! stays internal.

use std::fmt::Write;

use super::request::RatelimitTarget;
use super::Target;
use cellrate_core::clock::{CalendarPeriod, SECOND};
use cellrate_core::gcra::Limit;
use cellrate_limits::config::LimitTable;
use cellrate_limits::ratelimit_format::Unit;

/// The longest readable bucket name (a longer one is not shown: `top` lists that bucket by
/// its digest, which `inspect` and `reset` do not take).
pub const MAX_SHOWN: usize = 128;

/// What shapes the buckets of envoyproxy/ratelimit-format limits (from the Envoy options
/// the server runs with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RatelimitShape {
    /// Fixed windows of the unit, every hit counted (envoyproxy/ratelimit's), else GCRA.
    pub fixed_window: bool,
    /// Buckets named by envoyproxy/ratelimit's key text (the memcache store), not a digest.
    pub upstream_keys: bool,
    /// With `upstream_keys`: values written as they are.
    pub exact_upstream_keys: bool,
}

impl Default for RatelimitShape {
    fn default() -> RatelimitShape {
        RatelimitShape {
            fixed_window: true,
            upstream_keys: false,
            exact_upstream_keys: false,
        }
    }
}

/// The hex SHA-256 of `fields`, each prefixed by its length (8 bytes, little-endian), so
/// that no two lists of fields share a digest (`ab`,`c` against `a`,`bc`): a descriptor's
/// bucket key, and the id an Envoy hold is kept under.
pub(crate) fn fields_digest<'a>(fields: impl IntoIterator<Item = &'a str>) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for text in fields {
        hash.update((text.len() as u64).to_le_bytes());
        hash.update(text.as_bytes());
    }
    hex::encode(hash.finalize())
}

/// Identifies a descriptor's bucket: the digest of its domain and entries, each
/// length-prefixed, so that no two different descriptors (nor a domain and an entry, nor
/// `a=b|c=d` and two entries) share a bucket, and the key stays short whatever the
/// entries' lengths.
pub(crate) fn descriptor_digest(domain: &str, entries: &[(&str, &str)]) -> String {
    let pairs = entries.iter().flat_map(|&(key, value)| [key, value]);
    fields_digest(std::iter::once(domain).chain(pairs))
}

/// What names the bucket of `entries` (as counted) in `domain`: a digest, or for the
/// memcache store envoyproxy/ratelimit's key text.
pub(crate) fn bucket_text(shape: RatelimitShape, domain: &str, entries: &[(&str, &str)]) -> String {
    match shape.upstream_keys {
        true => upstream_key_text(domain, entries, shape.exact_upstream_keys),
        false => descriptor_digest(domain, entries),
    }
}

/// envoyproxy/ratelimit's cache key before its window start: `<domain>_<key>_<value>_...`
/// (each entry's key and value followed by `_`), as its cache-key generator writes it;
/// unless `exact`, with `%` and `_` in each value (a caller's text) written `%25` and
/// `%5F`, so that a value cannot hold the separator and name another descriptor's counter
/// (`user: alice_plan_pro` is `user: alice, plan: pro` there). The domain and the keys
/// come from the configuration and are written as they are.
pub(crate) fn upstream_key_text(domain: &str, entries: &[(&str, &str)], exact: bool) -> String {
    let mut key = String::with_capacity(domain.len() + 1 + 16 * entries.len());
    key.push_str(domain);
    key.push('_');
    for (k, v) in entries {
        key.push_str(k);
        key.push('_');
        match exact {
            true => key.push_str(v),
            false => {
                for c in v.chars() {
                    match c {
                        '%' => key.push_str("%25"),
                        '_' => key.push_str("%5F"),
                        c => key.push(c),
                    }
                }
            }
        }
        key.push('_');
    }
    key
}

/// `requests_per_unit` per `unit` as a limit: a fixed window of the unit (every hit
/// counted, without cellrate's bound of one count of debt: [`Limit::fixed_window`]), or
/// GCRA with that burst. `None` for zero ([`super::Rule::Zero`]).
///
/// A count above what cellrate counts exactly (a window holds at most
/// [`cellrate_core::clock::CalendarPeriod::max_count`], 499 999 999 a second; GCRA at most
/// one a nanosecond) is counted at that maximum: 4 294 967 295 a second, written to mean
/// "no practical limit", lets traffic through as envoyproxy/ratelimit does, instead of
/// failing to build and denying everything.
pub(crate) fn limit((requests, unit): (u32, Unit), fixed_window: bool) -> Option<Limit> {
    let n = u64::from(requests);
    let limit = match fixed_window {
        true => return window_limit(n, unit.window()),
        false => {
            let period = unit.seconds() * SECOND;
            Limit::new(n, n.min(period as u64), period)
        }
    };
    limit.ok()
}

/// `count` per window of `period` as this format counts it (every hit, [`Limit::fixed_window`]),
/// at most what a window counts exactly; `None` for a count of 0.
pub(crate) fn window_limit(count: u64, period: CalendarPeriod) -> Option<Limit> {
    Limit::fixed_window(count.min(period.max_count()), period).ok()
}

/// The readable name of the bucket of `entries` (as counted) in `domain`:
/// `domain/key=value/...`, every byte that is not printable ASCII, and `%`, `/` and `=`,
/// written `%XX`, so that the name reads back into exactly those entries; `None` when
/// longer than [`MAX_SHOWN`].
pub(crate) fn shown(domain: &str, entries: &[(&str, &str)]) -> Option<String> {
    let mut text = String::new();
    escape_into(domain, &mut text);
    for (key, value) in entries {
        text.push('/');
        escape_into(key, &mut text);
        text.push('=');
        escape_into(value, &mut text);
        if text.len() > MAX_SHOWN {
            return None;
        }
    }
    (text.len() <= MAX_SHOWN).then_some(text)
}

fn escape_into(part: &str, out: &mut String) {
    for b in part.bytes() {
        match b {
            b'%' | b'/' | b'=' => {
                let _ = write!(out, "%{b:02X}");
            }
            b if b.is_ascii_graphic() => out.push(char::from(b)),
            b => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
}

/// The domain and entries a name of [`shown`] stands for; `None` when it is not one.
pub(crate) fn read_shown(text: &str) -> Option<(String, Vec<(String, String)>)> {
    if text.is_empty() || text.len() > MAX_SHOWN {
        return None;
    }
    let mut parts = text.split('/');
    let domain = unescape(parts.next()?)?;
    let entries = parts
        .map(|entry| {
            let (key, value) = entry.split_once('=')?;
            Some((unescape(key)?, unescape(value)?))
        })
        .collect::<Option<Vec<_>>>()?;
    (!entries.is_empty()).then_some((domain, entries))
}

fn unescape(part: &str) -> Option<String> {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'=' | b'/' => return None,
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A bucket of a ratelimit-format limit as an admin command names it: the target the Envoy
/// front end counts on, its readable name in canonical form (of the entries as counted, a
/// `share_threshold` wildcard's pattern in place of the value; `None` when longer than
/// [`MAX_SHOWN`]) and its limit's unit.
pub(crate) struct NamedBucket {
    pub(crate) target: RatelimitTarget,
    pub(crate) shown: Option<String>,
    pub(crate) unit: Unit,
}

/// The bucket an admin command names by a ratelimit-format limit's label (`name`) and a
/// readable bucket name (`id`, as `top` shows it): the same target the Envoy front end
/// counts on for those entries, or `None` when the name is not such a label, the id not
/// such a name, or the entries' limit not that one.
pub(crate) fn named_target(
    table: &LimitTable,
    shape: RatelimitShape,
    name: &str,
    id: &str,
) -> Option<Target<'static>> {
    named_bucket(table, shape, name, id).map(|b| Target::Ratelimit(b.target))
}

/// [`named_target`], with the bucket's canonical name and its limit's unit.
pub(crate) fn named_bucket(
    table: &LimitTable,
    shape: RatelimitShape,
    name: &str,
    id: &str,
) -> Option<NamedBucket> {
    let (domain, entries) = read_shown(id)?;
    let pairs: Vec<(&str, &str)> = (entries.iter())
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let found = table.ratelimit().find(&domain, &pairs)?;
    if &*found.limit.label != name {
        return None;
    }
    let numbers = found.limit.limit?;
    let mut counted = pairs.clone();
    for &(i, pattern) in &found.shared {
        if let Some(entry) = counted.get_mut(i) {
            entry.1 = pattern;
        }
    }
    Some(NamedBucket {
        target: RatelimitTarget {
            digest: bucket_text(shape, &domain, &counted),
            limit: limit(numbers, shape.fixed_window),
            unit: numbers.1.window(),
            name: found.limit.label.clone(),
            shadow: found.limit.shadow_mode,
            every_hit: shape.fixed_window,
            caller_given: false,
        },
        shown: shown(&domain, &counted),
        unit: numbers.1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shown_name_reads_back_into_exactly_its_entries() {
        let cases: &[(&str, &[(&str, &str)])] = &[
            ("rl", &[("remote_address", "10.0.0.1")]),
            ("a/b", &[("k=1", "v/2%"), ("é", " x")]),
            ("d", &[("k", ""), ("", "v")]),
        ];
        for &(domain, entries) in cases {
            let text = shown(domain, entries).unwrap();
            assert!(text.bytes().all(|b| b.is_ascii_graphic()), "{text}");
            let (d, e) = read_shown(&text).unwrap();
            let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            assert_eq!((d.as_str(), &e[..]), (domain, entries), "{text}");
        }
        assert_eq!(
            shown("rl", &[("user", "a/b")]).as_deref(),
            Some("rl/user=a%2Fb")
        );
        // Two descriptors never share a name.
        assert_ne!(
            shown("d", &[("a", "b/c=d")]),
            shown("d", &[("a", "b"), ("c", "d")])
        );
        let long = "v".repeat(MAX_SHOWN);
        assert_eq!(shown("d", &[("k", &long)]), None);
        for bad in [
            "",
            "d",
            "d/k",
            "d/k=%zz",
            "d/k=%c3",
            "a%2",
            &"d/k=v".repeat(40),
        ] {
            assert_eq!(read_shown(bad), None, "{bad}");
        }
    }
}
