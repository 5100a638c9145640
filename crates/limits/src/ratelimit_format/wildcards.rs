//! A level's wildcard entries (`key_value`s with a `*`), found as envoyproxy/ratelimit
//! finds them, the first in file order that matches, without trying each in turn.
//!
//! envoyproxy/ratelimit scans a level's wildcards in order, so a domain of 10 000
//! `team-<n>-*` entries costs 10 000 comparisons per request. Here each pattern is filed
//! under its literal text before the first `*` (which always holds the key and `_`):
//! a request's `key_value` is looked up by each distinct length of those prefixes, so
//! only patterns whose prefix it starts with are tried, the earliest first. Patterns
//! whose value starts with `*` share the bare `key_` prefix; they are filed under their
//! literal text after the last `*` instead, looked up the same way from the end. Those
//! with neither (`*`, `*mid*`) are tried in order. The first match in file order among
//! all three is the answer.

use crate::hash::ConfigMap;

/// The most wildcard values in one domain that a lookup must try in turn
/// ([`Wildcards::is_scanned`]: two `*`s or more, or one between literal text, such as
/// `*mid*` or `a*z`). Each costs up to a scan of the request's value on every request,
/// so a domain full of them would cost every caller CPU; envoyproxy/ratelimit's own
/// examples use a handful.
pub const MAX_SCANNED: usize = 256;

/// Whether `value` matches `parts` (a pattern split at its `*`s; each `*` matches any
/// run of characters, the empty one too).
pub(super) fn wildcard_match(parts: &[Box<str>], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| **p == *value);
    };
    if value.len() < parts.iter().map(|p| p.len()).sum::<usize>()
        || !value.starts_with(&**first)
        || !value.ends_with(&**last)
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match rest.find(&**part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Pattern positions filed under a literal text, with the distinct lengths of those texts.
#[derive(Debug, Clone, Default)]
struct Filed {
    by_text: ConfigMap<Box<str>, Vec<u32>>,
    /// Ascending.
    lengths: Vec<usize>,
}

impl Filed {
    fn add(&mut self, text: &str, position: u32) {
        self.by_text.entry(text.into()).or_default().push(position);
        if let Err(at) = self.lengths.binary_search(&text.len()) {
            self.lengths.insert(at, text.len());
        }
    }

    /// Positions filed under a prefix (`from_end`: a suffix) of `value`.
    fn under<'a>(&'a self, value: &'a str, from_end: bool) -> impl Iterator<Item = u32> + 'a {
        self.lengths
            .iter()
            .take_while(move |&&n| n <= value.len())
            .filter_map(move |&n| match from_end {
                false => value.get(..n),
                true => value.get(value.len() - n..),
            })
            .filter_map(|text| self.by_text.get(text))
            .flatten()
            .copied()
    }
}

/// A level's wildcard patterns.
#[derive(Debug, Clone, Default)]
pub(super) struct Wildcards {
    /// In file order: the pattern as written (`key_value`), split at its `*`s.
    patterns: Vec<(Box<str>, Vec<Box<str>>)>,
    by_prefix: Filed,
    by_suffix: Filed,
    /// Neither a literal value prefix nor suffix: tried in order.
    rest: Vec<u32>,
}

impl Wildcards {
    /// Whether `composite` (`key_value`, holding a `*`) would be tried on every lookup
    /// rather than found through its prefix or suffix: anything but `key_abc*`,
    /// `key_*abc` and `key_*` (one star, at an end, or the catch-all), which a lookup
    /// finds in one probe per distinct length. These are what [`MAX_SCANNED`] bounds.
    pub(super) fn is_scanned(composite: &str, key_len: usize) -> bool {
        let value = composite.get(key_len + 1..).unwrap_or_default();
        let stars = value.matches('*').count();
        !(stars == 1 && (value.starts_with('*') || value.ends_with('*')))
    }

    /// Adds `composite` (`key_value`, holding a `*`) after those added before;
    /// `key_len` is the length of its key.
    pub(super) fn add(&mut self, composite: &str, key_len: usize) {
        let parts: Vec<Box<str>> = composite.split('*').map(Box::from).collect();
        let position = self.patterns.len() as u32;
        let (first, last) = (&parts[0], &parts[parts.len() - 1]);
        if first.len() > key_len + 1 {
            self.by_prefix.add(first, position);
        } else if !last.is_empty() {
            self.by_suffix.add(last, position);
        } else {
            self.rest.push(position);
        }
        self.patterns.push((composite.into(), parts));
    }

    /// The first pattern in file order that `composite` matches.
    pub(super) fn first_match(&self, composite: &str) -> Option<&str> {
        let candidates = self
            .by_prefix
            .under(composite, false)
            .chain(self.by_suffix.under(composite, true))
            .chain(self.rest.iter().copied());
        let mut best: Option<u32> = None;
        for position in candidates {
            if best.is_some_and(|b| b <= position) {
                continue;
            }
            if wildcard_match(&self.patterns[position as usize].1, composite) {
                best = Some(position);
            }
        }
        best.map(|p| &*self.patterns[p as usize].0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first pattern in order that matches, by trying each: envoyproxy/ratelimit's way.
    fn scan<'a>(patterns: &'a [&'a str], value: &str) -> Option<&'a str> {
        patterns.iter().copied().find(|p| {
            let parts: Vec<Box<str>> = p.split('*').map(Box::from).collect();
            wildcard_match(&parts, value)
        })
    }

    #[test]
    fn the_index_finds_what_a_scan_in_file_order_finds() {
        let patterns = [
            "k_a*",
            "k_ab*",
            "k_*b",
            "k_*",
            "k_a*c",
            "k_*x*",
            "k_abc*",
            "k_*bc",
            "kk_*",
            "k_\u{e9}*",
            "k_*\u{e9}",
        ];
        let mut w = Wildcards::default();
        for p in &patterns {
            let key_len = p.find('_').unwrap();
            w.add(p, key_len);
        }
        let values = [
            "k_abc",
            "k_ab",
            "k_a",
            "k_b",
            "k_xb",
            "k_",
            "k_zzz",
            "k_x",
            "kk_q",
            "k_\u{e9}t",
            "k_t\u{e9}",
            "k_\u{e9}",
            "q_abc",
            "k_bc",
        ];
        for value in values {
            assert_eq!(w.first_match(value), scan(&patterns, value), "{value}");
        }
        // Without the catch-all, the order among the three filings still decides.
        let later = ["k_*c", "k_ab*", "k_a*"];
        let mut w = Wildcards::default();
        for p in &later {
            w.add(p, 1);
        }
        for value in ["k_abc", "k_abd", "k_ac", "k_c", "k_zz"] {
            assert_eq!(w.first_match(value), scan(&later, value), "{value}");
        }
    }

    #[test]
    fn ten_thousand_prefixes_try_one_pattern() {
        let mut w = Wildcards::default();
        let patterns: Vec<String> = (0..10_000).map(|i| format!("user_team-{i}-*")).collect();
        for p in &patterns {
            w.add(p, 4);
        }
        assert_eq!(
            w.first_match("user_team-9999-ann"),
            Some("user_team-9999-*")
        );
        let tried = w.by_prefix.under("user_team-9999-ann", false).count();
        assert_eq!(tried, 1);
        assert_eq!(w.first_match("user_team-x"), None);
    }
}
