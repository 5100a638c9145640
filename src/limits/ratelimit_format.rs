//! envoyproxy/ratelimit's configuration format: files with a top-level `domain` and nested
//! `descriptors`, read as that service reads them, so that its users can switch by
//! changing the image (issue #36).
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address            # key only: every value has its own limit
//!     rate_limit: {unit: second, requests_per_unit: 10}
//!   - key: path
//!     value: "/api/*"                 # `*` anywhere in a value is a wildcard
//!     rate_limit: {unit: minute, requests_per_unit: 100}
//!   - key: user
//!     value: admin                    # a value without rate_limit: no limit (allow list)
//! ```
//!
//! Matching follows envoyproxy/ratelimit's `GetLimit` to the letter: per descriptor entry,
//! the configured `key_value` first, then the level's wildcards in file order, then the
//! `key` alone; a level that does not match ends the search (no limit, even if a level
//! above had one); a limit applies only when the request's last entry reaches it. The
//! refusals are its own too: bad YAML, an empty or duplicate domain, an empty key, a
//! duplicate `key_value` at one level, an unknown field, a bad unit, `unlimited` with a
//! unit, `replaces` naming itself or nothing, `share_threshold` without a wildcard.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::de::{self, Deserializer, Visitor};

use crate::clock::CalendarPeriod;
use serde::Deserialize;

/// The deepest nesting of descriptors (Envoy sends at most this many entries).
pub const MAX_DEPTH: usize = 16;

/// The most descriptors (at every level) in one file.
pub const MAX_DESCRIPTORS: usize = 100_000;

/// envoyproxy/ratelimit's time units. Each is a fixed window aligned to multiples of its
/// length since the epoch, as there: a MONTH is 30 days, a YEAR 365.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// A unit as the files write it, in any case (`second`, `SECOND`, ...).
    fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// From Envoy's `RateLimitUnit` number (a descriptor's `limit` override).
    pub fn from_envoy(unit: i32) -> Option<Unit> {
        Some(match unit {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }

    /// The fixed window envoyproxy/ratelimit counts this unit in.
    pub fn window(self) -> CalendarPeriod {
        match self {
            Unit::Second => CalendarPeriod::Second,
            Unit::Minute => CalendarPeriod::Minute,
            Unit::Hour => CalendarPeriod::Hour,
            Unit::Day => CalendarPeriod::Day,
            Unit::Week => CalendarPeriod::Week,
            Unit::Month => CalendarPeriod::Days30,
            Unit::Year => CalendarPeriod::Days365,
        }
    }

    /// The window's length in seconds.
    pub fn seconds(self) -> i64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }
}

/// One configured `rate_limit`, with what its descriptor entry said about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// `None`: `unlimited: true`.
    pub limit: Option<(u32, Unit)>,
    pub name: Option<String>,
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    /// `value_to_metric` on its entry: counted with the request's values, as
    /// `detailed_metric` (here for every entry, not only the flagged levels).
    pub value_to_metric: bool,
    /// Where it is configured: `domain.key1_value1.key2` (its statistics key there).
    pub full_key: String,
    /// How answers and metrics name it: its `name`, else its full key.
    pub label: Arc<str>,
}

/// A match: the limit, and for each request entry matched through a `share_threshold`
/// wildcard the pattern its bucket is counted under instead of its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<'a> {
    pub limit: &'a RateLimit,
    pub shared: Vec<(usize, &'a str)>,
}

/// Every domain read from envoyproxy/ratelimit-format files.
#[derive(Debug, Clone, Default)]
pub struct RatelimitDomains {
    domains: HashMap<String, Level>,
}

#[derive(Debug, Clone, Default)]
struct Level {
    /// By `key` or `key_value`, as envoyproxy/ratelimit keys them.
    children: HashMap<Box<str>, Node>,
    /// `key_value`s with a `*`, in file order, split at the `*`s.
    wildcards: Vec<(Box<str>, Vec<Box<str>>)>,
}

#[derive(Debug, Clone)]
struct Node {
    limit: Option<Arc<RateLimit>>,
    share_threshold: bool,
    next: Level,
}

/// Whether `value` matches `parts` (a pattern split at its `*`s; each `*` matches any
/// run of characters, the empty one too).
fn wildcard_match(parts: &[Box<str>], value: &str) -> bool {
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

impl RatelimitDomains {
    /// Whether no domain is configured.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Whether `domain` is configured in this format.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The domains configured, in no order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// The limit a descriptor of `domain` (its entries as `(key, value)`) gets, as
    /// envoyproxy/ratelimit's `GetLimit` finds it.
    pub fn find<'a>(&'a self, domain: &str, entries: &[(&str, &str)]) -> Option<Found<'a>> {
        let mut level = self.domains.get(domain)?;
        let mut found = None;
        let mut shared = Vec::new();
        let mut composite = String::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            composite.clear();
            composite.push_str(key);
            composite.push('_');
            composite.push_str(value);
            let mut node = level.children.get(composite.as_str());
            if node.is_none() {
                if let Some((pattern, _)) = level
                    .wildcards
                    .iter()
                    .find(|(_, parts)| wildcard_match(parts, &composite))
                {
                    node = level.children.get(pattern);
                    if node.is_some_and(|n| n.share_threshold) {
                        // Counted under the pattern's value, `*` and all.
                        shared.push((i, pattern.get(key.len() + 1..).unwrap_or_default()));
                    }
                }
            }
            let node = match node {
                Some(node) => node,
                None => level.children.get(*key)?,
            };
            if i + 1 == entries.len() {
                found = node.limit.as_deref();
            }
            if node.next.children.is_empty() {
                break;
            }
            level = &node.next;
        }
        found.map(|limit| Found { limit, shared })
    }
}

/// A file's root.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoot {
    #[serde(default, deserialize_with = "scalar")]
    domain: String,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    #[serde(default, deserialize_with = "scalar")]
    key: String,
    #[serde(default, deserialize_with = "scalar")]
    value: String,
    #[serde(default)]
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    /// Returned to Envoy as dynamic metadata there; read and left alone here.
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<serde_yaml_ng::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default, deserialize_with = "scalar")]
    unit: String,
    #[serde(default)]
    unlimited: bool,
    #[serde(default, deserialize_with = "scalar")]
    name: String,
    #[serde(default)]
    replaces: Vec<RawReplaces>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplaces {
    #[serde(default, deserialize_with = "scalar")]
    name: String,
}

/// Any YAML scalar as text (envoyproxy/ratelimit's YAML reads `value: 200` as "200").
fn scalar<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    struct Scalar;
    impl Visitor<'_> for Scalar {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_unit<E: de::Error>(self) -> Result<String, E> {
            Ok(String::new())
        }
    }
    deserializer.deserialize_any(Scalar)
}

/// Whether a file's text is in this format: a YAML map with a top-level `domain`.
pub fn is_ratelimit_file(text: &str) -> bool {
    matches!(
        serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text),
        Ok(serde_yaml_ng::Value::Mapping(map)) if map.contains_key("domain")
    )
}

/// Reading one file: where its descriptors are counted and errors gathered.
struct Reader<'r> {
    count: usize,
    report: &'r mut dyn FnMut(Option<String>, String),
}

impl RatelimitDomains {
    /// Adds one file's domain; every problem is reported with the entry it is in
    /// (`domain.key_value.key`), and a file with any problem adds nothing.
    pub fn add_file(&mut self, text: &str, report: &mut dyn FnMut(Option<String>, String)) {
        let root: RawRoot = match serde_yaml_ng::from_str(text) {
            Ok(root) => root,
            Err(e) => return report(None, e.to_string()),
        };
        if root.domain.is_empty() {
            return report(None, "config file cannot have empty domain".to_string());
        }
        if self.domains.contains_key(&root.domain) {
            return report(
                None,
                format!("duplicate domain '{}' in config file", root.domain),
            );
        }
        let mut failed = false;
        let mut noting = |entry: Option<String>, reason: String| {
            failed = true;
            report(entry, reason);
        };
        let mut reader = Reader {
            count: 0,
            report: &mut noting,
        };
        let level = reader.level(&format!("{}.", root.domain), root.descriptors, 1);
        if !failed {
            self.domains.insert(root.domain, level);
        }
    }
}

impl Reader<'_> {
    fn level(&mut self, parent: &str, raw: Vec<RawDescriptor>, depth: usize) -> Level {
        let mut level = Level::default();
        if depth > MAX_DEPTH && !raw.is_empty() {
            (self.report)(
                Some(parent.trim_end_matches('.').to_string()),
                format!("descriptors nested deeper than {MAX_DEPTH} levels"),
            );
            return level;
        }
        for descriptor in raw {
            self.count += 1;
            if self.count > MAX_DESCRIPTORS {
                if self.count == MAX_DESCRIPTORS + 1 {
                    (self.report)(None, format!("more than {MAX_DESCRIPTORS} descriptors"));
                }
                return level;
            }
            let Some((composite, node)) = self.node(parent, descriptor, depth) else {
                continue;
            };
            if level.children.contains_key(composite.as_str()) {
                (self.report)(
                    Some(format!("{parent}{composite}")),
                    format!("duplicate descriptor composite key '{parent}{composite}'"),
                );
                continue;
            }
            if composite.contains('*') {
                let parts = composite.split('*').map(Box::from).collect();
                level.wildcards.push((Box::from(composite.as_str()), parts));
            }
            level.children.insert(composite.into_boxed_str(), node);
        }
        level
    }

    /// One descriptor entry: its composite key (`key` or `key_value`) and node.
    fn node(&mut self, parent: &str, raw: RawDescriptor, depth: usize) -> Option<(String, Node)> {
        if raw.key.is_empty() {
            (self.report)(
                Some(parent.trim_end_matches('.').to_string()),
                "descriptor has empty key".to_string(),
            );
            return None;
        }
        let composite = match raw.value.is_empty() {
            true => raw.key.clone(),
            false => format!("{}_{}", raw.key, raw.value),
        };
        let full_key = format!("{parent}{composite}");
        let mut bad = |reason: String| (self.report)(Some(full_key.clone()), reason);
        if raw.share_threshold && !composite.contains('*') {
            bad(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but \
                 found key '{composite}'"
            ));
            return None;
        }
        let limit = match raw.rate_limit {
            None => None,
            Some(rate_limit) => {
                let unit = Unit::parse(&rate_limit.unit);
                let limit = match (rate_limit.unlimited, unit) {
                    (true, Some(_)) => {
                        bad("should not specify rate limit unit when unlimited".to_string());
                        return None;
                    }
                    (true, None) => None,
                    (false, None) => {
                        bad(format!("invalid rate limit unit '{}'", rate_limit.unit));
                        return None;
                    }
                    (false, Some(unit)) => Some((rate_limit.requests_per_unit, unit)),
                };
                let mut replaces = Vec::new();
                for replaced in rate_limit.replaces {
                    if replaced.name.is_empty() {
                        bad("should not have an empty replaces entry".to_string());
                        return None;
                    }
                    if replaced.name == rate_limit.name {
                        bad("replaces should not contain name of same descriptor".to_string());
                        return None;
                    }
                    replaces.push(replaced.name);
                }
                let label = match rate_limit.name.as_str() {
                    "" => Arc::from(full_key.as_str()),
                    name => Arc::from(name),
                };
                Some(Arc::new(RateLimit {
                    limit,
                    label,
                    name: (!rate_limit.name.is_empty()).then_some(rate_limit.name),
                    replaces,
                    shadow_mode: raw.shadow_mode,
                    quota_mode: raw.quota_mode,
                    detailed_metric: raw.detailed_metric,
                    value_to_metric: raw.value_to_metric,
                    full_key: full_key.clone(),
                }))
            }
        };
        let next = self.level(&format!("{full_key}."), raw.descriptors, depth + 1);
        Some((
            composite,
            Node {
                limit,
                share_threshold: raw.share_threshold,
                next,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loads `files`, or the errors as `entry: reason` lines.
    fn load(files: &[&str]) -> Result<RatelimitDomains, Vec<String>> {
        let mut domains = RatelimitDomains::default();
        let mut errors = Vec::new();
        for text in files {
            domains.add_file(text, &mut |entry, reason| {
                errors.push(format!("{}: {reason}", entry.unwrap_or_default()))
            });
        }
        if errors.is_empty() {
            Ok(domains)
        } else {
            Err(errors)
        }
    }

    /// The limit found for `entries` in `domain`: requests per unit, or 0 for unlimited.
    fn limit(d: &RatelimitDomains, domain: &str, entries: &[(&str, &str)]) -> Option<(u32, Unit)> {
        let found = d.find(domain, entries)?;
        Some(found.limit.limit.unwrap_or((0, Unit::Second)))
    }

    /// envoyproxy/ratelimit's test/config/basic_config.yaml, in substance.
    const BASIC: &str = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: MINUTE, requests_per_unit: 70}
";

    #[test]
    fn matching_follows_envoyproxy_ratelimit() {
        let d = load(&[BASIC]).unwrap();
        let l = |entries: &[(&str, &str)]| limit(&d, "test-domain", entries);
        assert_eq!(limit(&d, "foo_domain", &[("key1", "value1")]), None);
        assert_eq!(l(&[]), None);
        // A level without a limit of its own limits nothing.
        assert_eq!(l(&[("key1", "something")]), None);
        assert_eq!(l(&[("key1", "value1")]), None);
        // A level that does not match ends the search.
        assert_eq!(l(&[("key2", "value2"), ("subkey", "subvalue")]), None);
        assert_eq!(l(&[("key5", "value5"), ("subkey5", "subvalue")]), None);
        // key alone, then key_value beats it.
        assert_eq!(
            l(&[("key1", "value1"), ("subkey1", "something")]),
            Some((5, Unit::Second))
        );
        assert_eq!(
            l(&[("key1", "value1"), ("subkey1", "subvalue1")]),
            Some((10, Unit::Second))
        );
        assert_eq!(l(&[("key2", "something")]), Some((20, Unit::Minute)));
        assert_eq!(l(&[("key2", "value2")]), Some((30, Unit::Minute)));
        // A value without rate_limit: no limit (an allow list).
        assert_eq!(l(&[("key2", "value3")]), None);
        assert_eq!(l(&[("key3", "foo")]), Some((1, Unit::Hour)));
        assert_eq!(
            l(&[("key5", "value5"), ("subkey5", "subvalue5")]),
            Some((25, Unit::Day))
        );
        // The limit applies only where the request's last entry lands.
        assert_eq!(l(&[("key5", "value5")]), Some((15, Unit::Day)));
        assert_eq!(l(&[("key3", "foo"), ("more", "x")]), None);
        let found = d.find("test-domain", &[("key4", "foo")]).unwrap();
        assert_eq!(found.limit.name.as_deref(), Some("key4_rate_limit"));
        assert_eq!(found.limit.full_key, "test-domain.key4");
        assert!(d
            .find("test-domain", &[("key6", "foo")])
            .unwrap()
            .limit
            .limit
            .is_none());
        let found = d.find("test-domain", &[("key7", "any")]).unwrap();
        assert!(found.limit.detailed_metric);
        assert_eq!(found.limit.limit, Some((70, Unit::Minute)));
    }

    #[test]
    fn wildcards_match_anywhere_in_a_value() {
        let d = load(&["
domain: test-domain
descriptors:
  - {key: wild, value: foo*, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: noWild, value: foo, rate_limit: {unit: minute, requests_per_unit: 21}}
  - {key: midWild, value: bar*b, rate_limit: {unit: minute, requests_per_unit: 22}}
  - {key: multiWild, value: foo*bar*baz, rate_limit: {unit: minute, requests_per_unit: 10}}
  - key: nestedWild
    value: val1
    descriptors:
      - {key: wild, value: goo*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 23}}
  - {key: first, value: a*, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: first, value: ab*, rate_limit: {unit: hour, requests_per_unit: 2}}
  - {key: first, value: abc, rate_limit: {unit: hour, requests_per_unit: 3}}
"])
        .unwrap();
        let l = |entries: &[(&str, &str)]| limit(&d, "test-domain", entries).map(|(n, _)| n);
        assert_eq!(l(&[("wild", "foo1")]), Some(20));
        assert_eq!(
            l(&[("wild", "foo")]),
            Some(20),
            "a * matches the empty string"
        );
        assert_eq!(l(&[("wild", "bar")]), None);
        assert_eq!(l(&[("noWild", "foo1")]), None);
        for (value, want) in [
            ("barab", Some(22)),
            ("bar123b", Some(22)),
            ("barb", Some(22)),
            ("bara", None),
            ("xbarb", None),
            ("bab", None),
        ] {
            assert_eq!(l(&[("midWild", value)]), want, "{value}");
        }
        for (value, want) in [
            ("foo123bar456baz", Some(10)),
            ("foobarbaz", Some(10)),
            ("foo123baz", None),
            ("bar456baz", None),
            ("foobaz", None),
        ] {
            assert_eq!(l(&[("multiWild", value)]), want, "{value}");
        }
        // The exact key_value first, then the wildcards in file order.
        assert_eq!(l(&[("first", "abc")]), Some(3));
        assert_eq!(l(&[("first", "abd")]), Some(1));
        // share_threshold: every value the pattern matches counts in one bucket.
        let found = d
            .find("test-domain", &[("nestedWild", "val1"), ("wild", "goo2")])
            .unwrap();
        assert_eq!(found.shared, vec![(1, "goo*")]);
        assert_eq!(
            found.limit.full_key,
            "test-domain.nestedWild_val1.wild_goo*"
        );
        assert!(d
            .find("test-domain", &[("wild", "foo9")])
            .unwrap()
            .shared
            .is_empty());
    }

    #[test]
    fn refused_files_say_which_entry_and_why() {
        let cases = [
            ("domain: x\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1}}", "while parsing"),
            ("descriptors: []", "empty domain"),
            ("domain: \"\"", "empty domain"),
            ("domain: x\ndescriptors: [{value: v}]", "x: descriptor has empty key"),
            ("domain: x\ndescriptors: [{key: a, value: b}, {key: a, value: b}]", "x.a_b: duplicate descriptor composite key 'x.a_b'"),
            ("domain: x\ndescriptors: [{key: a_b}, {key: a, value: b}]", "duplicate descriptor composite key 'x.a_b'"),
            ("domain: x\ndescriptors: [{key: a, rate_limit: {unit: fortnight, requests_per_unit: 1}}]", "x.a: invalid rate limit unit 'fortnight'"),
            ("domain: x\ndescriptors: [{key: a, rate_limit: {requests_per_unit: 1}}]", "invalid rate limit unit ''"),
            ("domain: x\ndescriptors: [{key: a, rate_limit: {unit: unknown, requests_per_unit: 1}}]", "invalid rate limit unit"),
            ("domain: x\ndescriptors: [{key: a, rate_limit: {unlimited: true, unit: second}}]", "should not specify rate limit unit when unlimited"),
            ("domain: x\ndescriptors: [{key: a, rate_limit: {name: n, unit: second, requests_per_unit: 1, replaces: [{name: n}]}}]", "replaces should not contain name of same descriptor"),
            ("domain: x\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}}]", "should not have an empty replaces entry"),
            ("domain: x\ndescriptors: [{key: a, ratelimit: {unit: second}}]", "unknown field `ratelimit`"),
            ("domain: x\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unitt: 1}}]", "unknown field `requests_per_unitt`"),
            ("domain: x\ndescriptors: [a, b]", "invalid type"),
            ("domain: x\ndescriptors: [{key: a, value: b, share_threshold: true}]", "share_threshold can only be used with wildcard values"),
            ("domain: x\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: -1}}]", "descriptors[0].rate_limit.requests_per_unit: invalid type"),
        ];
        for (text, says) in cases {
            let errors = load(&[text]).expect_err(text);
            assert!(
                errors.iter().any(|e| e.contains(says)),
                "{text}: {errors:?}"
            );
        }
        let twice = load(&["domain: x", "domain: x"]).unwrap_err();
        assert!(twice[0].contains("duplicate domain 'x'"), "{twice:?}");
        // Nested deeper than Envoy can send, and too many descriptors.
        let mut deep = String::from("domain: x\ndescriptors:\n");
        for depth in 0..=MAX_DEPTH {
            let pad = "  ".repeat(2 * depth);
            deep.push_str(&format!("{pad}- key: k{depth}\n{pad}  descriptors:\n"));
        }
        deep.push_str(&format!("{}- key: last\n", "  ".repeat(2 * MAX_DEPTH + 2)));
        let errors = load(&[&deep]).unwrap_err();
        assert!(
            errors.iter().any(|e| e.contains("deeper than 16")),
            "{errors:?}"
        );
    }

    #[test]
    fn numbers_and_booleans_read_as_text_and_the_format_is_recognised() {
        let d = load(&["domain: 7\ndescriptors: [{key: code, value: 200, rate_limit: {unit: Second, requests_per_unit: 4}}]"]).unwrap();
        assert_eq!(limit(&d, "7", &[("code", "200")]), Some((4, Unit::Second)));
        assert!(is_ratelimit_file("domain: edge\ndescriptors: []\n"));
        assert!(!is_ratelimit_file(
            "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s}\n"
        ));
        assert!(!is_ratelimit_file("- a\n- b\n"));
        assert!(!is_ratelimit_file(": : :"));
    }
}
