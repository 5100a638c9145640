//! A statsd_exporter mapping file (envoyproxy/ratelimit's `PROMETHEUS_MAPPER_YAML`, which
//! Envoy Gateway passes) applied to envoyproxy/ratelimit's per-descriptor statistics, so
//! that the series upstream exports under it (Envoy Gateway's dashboard queries
//! `ratelimit_service_rate_limit_total_hits{domain,key1,key2}`) are exported here too.
//!
//! A bounded subset of statsd_exporter's format: `mappings` of `match` (a glob whose `*`
//! matches within one dot-separated part, or with `match_type: regex` an unanchored
//! regular expression), `name`, `labels` (values may use the match's `$1`, `${1}`, `$name`),
//! `action: drop`, `match_metric_type` and `help`. As statsd_exporter, globs are tried
//! first in file order, then regular expressions in file order; the first that matches
//! decides. The settings of timers and histograms (`timer_type`, `buckets`, `scale` ...)
//! are accepted and mean nothing here: every statistic is a counter. What is matched is
//! the statistic's statsd name, `ratelimit.service.rate_limit.<key>.<stat>`, with `<key>`
//! already bounded and escaped (`ratelimit_keys`), so that the mapped series are
//! never more than the keys that have series of their own.
//!
//! Bounded in memory, not only in bytes: a few bytes of pattern can compile to a
//! megabyte (`\w{20}` is about 1 MiB), so each rule's compiled expression is at most
//! [`MAX_REGEX_BYTES`] and the file's together at most [`MAX_TOTAL_REGEX_BYTES`] (as the
//! engine measures it), each rule's search cache at most [`SEARCH_CACHE_BYTES`] a thread;
//! a label template names at most [`MAX_REFERENCES`] captures and its value is cut at
//! [`MAX_LABEL_VALUE_BYTES`].
//!
//! This file holds the mapping and how a statistic's name is mapped;
//! `statsd_mapping_file` reads and checks the file into it ([`StatsdMapping::parse`]).

use regex::Regex;
use regex_automata::meta::Regex as Automaton;

/// The largest mapping file, in bytes.
pub const MAX_FILE_BYTES: usize = 256 * 1024;
/// The most rules in a mapping file.
pub const MAX_RULES: usize = 1_000;
/// The most labels a rule gives.
pub const MAX_LABELS: usize = 16;
/// The longest `match`, name, label name or label value template, in bytes.
pub(super) const MAX_TEXT_BYTES: usize = 4_096;
/// The most memory one compiled regular expression may take.
pub const MAX_REGEX_BYTES: usize = 1 << 20;
/// The most memory the file's compiled expressions may take together.
pub const MAX_TOTAL_REGEX_BYTES: usize = 8 << 20;
/// Each rule's lazy DFA cache, per thread that searches with it (beyond, the search goes
/// on without it, slower).
pub const SEARCH_CACHE_BYTES: usize = 64 << 10;
/// The most `$` references in one label template (`$0$0...` would repeat the name).
pub const MAX_REFERENCES: usize = 16;
/// The longest label value a template gives; cut beyond (at a character's boundary).
pub const MAX_LABEL_VALUE_BYTES: usize = 1_024;

/// upstream's own mapping, used when `USE_PROMETHEUS` is set without a mapping file.
pub const RATELIMIT_DEFAULT: &str = include_str!("ratelimit_mapping.yaml");

/// What a statistic's statsd name becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    /// Index of the series' family in [`StatsdMapping::families`].
    pub family: usize,
    /// The family's label values, in the order of its label names ("" for a label this
    /// rule does not give: Prometheus reads an empty label as an absent one).
    pub values: Vec<String>,
}

/// A family of mapped series: its name, label names (every rule's that gives it) and help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    pub name: String,
    pub labels: Vec<String>,
    pub help: String,
}

/// A checked mapping file.
#[derive(Debug)]
pub struct StatsdMapping {
    pub(super) rules: Vec<Rule>,
    pub(super) families: Vec<Family>,
}

#[derive(Debug)]
pub(super) struct Rule {
    pub(super) regex: Automaton,
    /// Whether the rule may match a counter (`match_metric_type` unset or `counter`).
    pub(super) counters: bool,
    /// `None`: `action: drop`; else the family and (label index in it, template).
    pub(super) to: Option<(usize, Vec<(usize, String)>)>,
}
impl StatsdMapping {
    /// The families of series the mapping can give, each registered once.
    pub fn families(&self) -> &[Family] {
        &self.families
    }

    /// What the statistic `name` becomes: `None` when no rule matches it (it is not
    /// exported under a mapped name) or the rule that does drops it.
    pub fn map(&self, name: &str) -> Option<Mapped> {
        let rule = self.rules.iter().filter(|r| r.counters).find_map(|r| {
            let mut captures = r.regex.create_captures();
            r.regex.captures(name, &mut captures);
            captures.is_match().then_some((r, captures))
        });
        let (rule, captures) = rule?;
        let (family, labels) = rule.to.as_ref()?;
        let mut values = vec![String::new(); self.families[*family].labels.len()];
        for (index, template) in labels {
            let value = &mut values[*index];
            captures.interpolate_string_into(name, template, value);
            let cut = cellrate_core::text::cut_bytes(value, MAX_LABEL_VALUE_BYTES).len();
            value.truncate(cut);
        }
        Some(Mapped {
            family: *family,
            values,
        })
    }
}

/// The statsd name upstream gives statistic `stat` of `key`: `:` and `|` (statsd's own
/// separators) made `_`, and so the dots of anything shaped like an IPv4 address (its
/// `SanitizeStatName`), so that `rl.remote_address_10.0.0.1` stays one part.
pub fn statsd_name(key: &str, stat: &str) -> String {
    static IPV4: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
        Regex::new(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}").expect("a valid pattern")
    });
    let key = key.replace([':', '|'], "_");
    let key = IPV4.replace_all(&key, |ip: &regex::Captures<'_>| ip[0].replace('.', "_"));
    format!("ratelimit.service.rate_limit.{key}.{stat}")
}

/// Envoy Gateway's mapping file, as it passes it in `PROMETHEUS_MAPPER_YAML`, for the tests.
#[cfg(test)]
pub(super) const ENVOY_GATEWAY: &str =
    include_str!("../../../../tests/data/envoy-gateway-statsd-mapping.yaml");

#[cfg(test)]
mod tests {
    use super::*;

    /// (family name, label name -> value) of what `name` maps to.
    fn mapped(mapping: &StatsdMapping, name: &str) -> Option<(String, Vec<(String, String)>)> {
        let to = mapping.map(name)?;
        let family = &mapping.families()[to.family];
        let labels = family.labels.iter().cloned().zip(to.values).collect();
        Some((family.name.clone(), labels))
    }

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn envoy_gateways_mapping_names_the_statistics_as_its_dashboard_reads_them() {
        let eg = StatsdMapping::parse(ENVOY_GATEWAY).unwrap();
        let key = "default/eg/http.httproute/r_httproute/r.rule-0-match-0_rule-0-match-0";
        for stat in [
            "total_hits",
            "over_limit",
            "near_limit",
            "within_limit",
            "shadow_mode",
        ] {
            assert_eq!(
                mapped(&eg, &format!("ratelimit.service.rate_limit.{key}.{stat}")),
                Some((
                    format!("ratelimit_service_rate_limit_{stat}"),
                    labels(&[
                        ("domain", "default/eg/http"),
                        ("key1", "httproute/r_httproute/r"),
                        ("key2", "rule-0-match-0_rule-0-match-0")
                    ])
                )),
                "{stat}"
            );
        }
        // Two parts: the glob, no key2 (empty: absent to Prometheus).
        assert_eq!(
            mapped(
                &eg,
                "ratelimit.service.rate_limit.rl.remote_address.over_limit"
            ),
            Some((
                "ratelimit_service_rate_limit_over_limit".to_string(),
                labels(&[("domain", "rl"), ("key1", "remote_address"), ("key2", "")])
            ))
        );
        // No rule for it: not exported under a mapped name.
        assert_eq!(
            mapped(
                &eg,
                "ratelimit.service.rate_limit.rl.k_v.total_negative_hits"
            ),
            None
        );
        assert_eq!(
            mapped(&eg, "ratelimit.service.rate_limit.overflow.total_hits"),
            None
        );
        // An address in a value (detailed_metric) stays in its part, as upstream's name
        // keeps it; statsd's separators too.
        let name = statsd_name("rl.remote_address_10.0.0.1", "over_limit");
        assert_eq!(
            name,
            "ratelimit.service.rate_limit.rl.remote_address_10_0_0_1.over_limit"
        );
        assert_eq!(
            mapped(&eg, &name).unwrap().1,
            labels(&[
                ("domain", "rl"),
                ("key1", "remote_address_10_0_0_1"),
                ("key2", "")
            ])
        );
        assert_eq!(
            statsd_name("d.k_a:b|c.v_1.2.3", "total_hits"),
            "ratelimit.service.rate_limit.d.k_a_b_c.v_1.2.3.total_hits"
        );
    }

    #[test]
    fn the_built_in_mapping_names_as_envoy_gateways() {
        let (eg, own) = (
            StatsdMapping::parse(ENVOY_GATEWAY).unwrap(),
            StatsdMapping::parse(RATELIMIT_DEFAULT).unwrap(),
        );
        for key in [
            "a.b_c",
            "a.b_c.d_e",
            "a.b_c.d_e.f_g",
            "rl.remote_address_10.0.0.1",
            "x",
        ] {
            for stat in [
                "total_hits",
                "over_limit",
                "near_limit",
                "within_limit",
                "shadow_mode",
            ] {
                let name = format!("ratelimit.service.rate_limit.{key}.{stat}");
                assert_eq!(mapped(&eg, &name), mapped(&own, &name), "{name}");
            }
        }
    }

    #[test]
    fn rules_are_tried_globs_first_and_a_drop_drops() {
        let mapping = StatsdMapping::parse(
            "mappings:
  - {match: 'a\\.(.*)', match_type: regex, name: by_regex, labels: {x: '$1'}}
  - {match: 'a.*', name: by_glob, labels: {x: 'g-$1'}}
  - {match: 'b.*', action: drop}
  - {match: 'b.*', name: never}
  - {match: 'c.*', match_metric_type: gauge, name: gauges_only}
",
        )
        .unwrap();
        assert_eq!(
            mapped(&mapping, "a.one"),
            Some(("by_glob".to_string(), labels(&[("x", "g-one")])))
        );
        assert_eq!(
            mapped(&mapping, "a.one.two"),
            Some(("by_regex".to_string(), labels(&[("x", "one.two")])))
        );
        assert_eq!(mapped(&mapping, "b.one"), None);
        assert_eq!(mapped(&mapping, "c.one"), None);
    }
}
