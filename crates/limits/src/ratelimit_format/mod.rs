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

mod read;
mod wildcards;
mod xds;

use std::sync::Arc;

use crate::hash::ConfigMap;
use cellrate_core::clock::CalendarPeriod;
use wildcards::Wildcards;
pub use wildcards::MAX_SCANNED as MAX_SCANNED_WILDCARDS;

pub use read::{is_ratelimit_file, is_ratelimit_file_named_as_ours};
pub use xds::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, TYPE_URL};

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
    pub(crate) fn parse(text: &str) -> Option<Unit> {
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
#[derive(Debug, Clone, PartialEq)]
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
    /// Its entry's `metadata`, as envoyproxy/ratelimit returns it in dynamic metadata
    /// (RESPONSE_DYNAMIC_METADATA); `None` when absent or empty.
    pub metadata: Option<Arc<envoy_types::pb::google::protobuf::Struct>>,
}

/// A match: the limit, and for each request entry matched through a `share_threshold`
/// wildcard the pattern its bucket is counted under instead of its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Found<'a> {
    pub limit: &'a RateLimit,
    pub shared: Vec<(usize, &'a str)>,
}

/// Every domain read from envoyproxy/ratelimit-format files.
#[derive(Debug, Clone, Default)]
pub struct RatelimitDomains {
    domains: ConfigMap<String, Level>,
    /// Whether a domain given again is merged into the first (MERGE_DOMAIN_CONFIG).
    merge: bool,
    /// Scanned wildcard values so far, by domain, while merging: the bound is the
    /// domain's, however many files give it.
    scanned: ConfigMap<String, usize>,
}

#[derive(Debug, Clone, Default)]
struct Level {
    /// By `key` or `key_value`, as envoyproxy/ratelimit keys them.
    children: ConfigMap<Box<str>, Node>,
    /// `key_value`s with a `*`, found in file order.
    wildcards: Wildcards,
}

#[derive(Debug, Clone)]
struct Node {
    limit: Option<Arc<RateLimit>>,
    share_threshold: bool,
    next: Level,
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

    /// The label of every limit configured (answers, metrics and `top` name a limit by
    /// it), once per limit, in no order.
    pub fn labels(&self) -> Vec<&str> {
        let mut labels = Vec::new();
        let mut levels: Vec<&Level> = self.domains.values().collect();
        while let Some(level) = levels.pop() {
            for node in level.children.values() {
                if let Some(limit) = &node.limit {
                    labels.push(&*limit.label);
                }
                levels.push(&node.next);
            }
        }
        labels
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
                if let Some(pattern) = level.wildcards.first_match(&composite) {
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

    /// MERGE_DOMAIN_CONFIG, as upstream's loadConfig: a domain given again adds its
    /// top-level descriptors to the first's (wildcards after the first's); a `key` or
    /// `key_value` the domain already has is refused as a duplicate composite key, and
    /// nothing of that file is added. Without it, the second file is a duplicate domain.
    #[test]
    fn merged_domains_add_their_descriptors_and_refuse_a_duplicate_key() {
        let a = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: w\n    value: x*\n    rate_limit: {unit: second, requests_per_unit: 3}\n";
        let b = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: w\n    value: '*'\n    rate_limit: {unit: second, requests_per_unit: 4}\n";
        let again = "domain: d\ndescriptors:\n  - key: c\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 9}\n";
        let mut merged = RatelimitDomains::merging(true);
        let mut errors = Vec::new();
        for text in [a, b, again] {
            merged.add_file(text, &mut |entry, reason| {
                errors.push(format!("{}: {reason}", entry.unwrap_or_default()))
            });
        }
        assert_eq!(
            errors,
            ["d.a: duplicate descriptor composite key 'd.a'"],
            "the third file's a is the first's"
        );
        assert_eq!(limit(&merged, "d", &[("a", "1")]), Some((1, Unit::Second)));
        assert_eq!(limit(&merged, "d", &[("b", "1")]), Some((2, Unit::Minute)));
        // The third file added nothing, not even its own c.
        assert_eq!(limit(&merged, "d", &[("c", "1")]), None);
        // The first file's wildcard is tried first.
        assert_eq!(limit(&merged, "d", &[("w", "xy")]), Some((3, Unit::Second)));
        assert_eq!(limit(&merged, "d", &[("w", "zz")]), Some((4, Unit::Second)));
        let refused = load(&[a, b]).unwrap_err();
        assert_eq!(refused, [": duplicate domain 'd' in config file"]);
    }

    #[test]
    fn metadata_is_read_as_a_struct_and_bad_metadata_refused_naming_its_entry() {
        use envoy_types::pb::google::protobuf::value::Kind;
        let d = load(&["domain: m\ndescriptors:\n  - key: k\n    metadata: {n: 1, s: x, l: [true, null], o: {p: q}}\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: empty\n    metadata: {}\n    rate_limit: {unit: second, requests_per_unit: 1}\n"]).unwrap();
        let m = d
            .find("m", &[("k", "v")])
            .unwrap()
            .limit
            .metadata
            .clone()
            .unwrap();
        let kind = |k: &str| m.fields[k].kind.clone().unwrap();
        assert_eq!(kind("n"), Kind::NumberValue(1.0));
        assert_eq!(kind("s"), Kind::StringValue("x".into()));
        assert!(matches!(kind("l"), Kind::ListValue(l) if l.values.len() == 2));
        assert!(matches!(kind("o"), Kind::StructValue(o) if o.fields.contains_key("p")));
        assert_eq!(d.find("m", &[("empty", "v")]).unwrap().limit.metadata, None);
        let refused = |metadata: &str| {
            let text = format!(
                "domain: m\ndescriptors:\n  - key: k\n    metadata: {metadata}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            );
            load(&[&text]).unwrap_err()
        };
        assert_eq!(
            refused("{1: a}"),
            ["m.k: error parsing metadata: key Number(1) is not a string"]
        );
        assert_eq!(
            refused("[a]"),
            ["m.k: error parsing metadata: not a mapping"]
        );
        // Nested past the YAML reader's depth: an error, no panic.
        let deep = format!("{}a: b{}", "{x: ".repeat(200), "}".repeat(200));
        assert!(!refused(&deep).is_empty());
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
        assert_eq!(
            is_ratelimit_file("domain: edge\ndescriptors: []\n"),
            Ok(true)
        );
        assert_eq!(
            is_ratelimit_file("NewOrdersPerAccount: {burst: 1, count: 1, period: 1s}\n"),
            Ok(false)
        );
        assert_eq!(is_ratelimit_file("- a\n- b\n"), Ok(false));
        assert!(is_ratelimit_file("a: [").is_err());
    }
}
