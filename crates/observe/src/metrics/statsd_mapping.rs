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

use std::collections::BTreeMap;

use regex::Regex;
use regex_automata::meta::Regex as Automaton;
use serde::Deserialize;

/// The largest mapping file, in bytes.
pub const MAX_FILE_BYTES: usize = 256 * 1024;
/// The most rules in a mapping file.
pub const MAX_RULES: usize = 1_000;
/// The most labels a rule gives.
pub const MAX_LABELS: usize = 16;
/// The longest `match`, name, label name or label value template, in bytes.
const MAX_TEXT_BYTES: usize = 4_096;
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
    rules: Vec<Rule>,
    families: Vec<Family>,
}

#[derive(Debug)]
struct Rule {
    regex: Automaton,
    /// Whether the rule may match a counter (`match_metric_type` unset or `counter`).
    counters: bool,
    /// `None`: `action: drop`; else the family and (label index in it, template).
    to: Option<(usize, Vec<(usize, String)>)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    defaults: Option<RawDefaults>,
    #[serde(default)]
    mappings: Vec<RawRule>,
}

/// The settings of timers and histograms (`timer_type`, `buckets` ...) are accepted and
/// mean nothing for counters; so in a rule.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    match_type: Option<String>,
    #[serde(rename = "timer_type")]
    _timer_type: Option<serde_yaml_ng::Value>,
    #[serde(rename = "observer_type")]
    _observer_type: Option<serde_yaml_ng::Value>,
    #[serde(rename = "buckets")]
    _buckets: Option<serde_yaml_ng::Value>,
    #[serde(rename = "quantiles")]
    _quantiles: Option<serde_yaml_ng::Value>,
    #[serde(rename = "summary_options")]
    _summary_options: Option<serde_yaml_ng::Value>,
    #[serde(rename = "histogram_options")]
    _histogram_options: Option<serde_yaml_ng::Value>,
    #[serde(rename = "scale")]
    _scale: Option<serde_yaml_ng::Value>,
    #[serde(rename = "ttl")]
    _ttl: Option<serde_yaml_ng::Value>,
    #[serde(rename = "glob_disable_ordering")]
    _glob_disable_ordering: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(rename = "match")]
    pattern: String,
    match_type: Option<String>,
    name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    action: Option<String>,
    match_metric_type: Option<String>,
    help: Option<String>,
    #[serde(rename = "honor_labels")]
    _honor_labels: Option<bool>,
    #[serde(rename = "timer_type")]
    _timer_type: Option<serde_yaml_ng::Value>,
    #[serde(rename = "observer_type")]
    _observer_type: Option<serde_yaml_ng::Value>,
    #[serde(rename = "buckets")]
    _buckets: Option<serde_yaml_ng::Value>,
    #[serde(rename = "quantiles")]
    _quantiles: Option<serde_yaml_ng::Value>,
    #[serde(rename = "summary_options")]
    _summary_options: Option<serde_yaml_ng::Value>,
    #[serde(rename = "histogram_options")]
    _histogram_options: Option<serde_yaml_ng::Value>,
    #[serde(rename = "scale")]
    _scale: Option<serde_yaml_ng::Value>,
    #[serde(rename = "ttl")]
    _ttl: Option<serde_yaml_ng::Value>,
}

impl StatsdMapping {
    /// Checks the mapping file's `text`; the error says which rule and what is wrong.
    pub fn parse(text: &str) -> Result<StatsdMapping, String> {
        if text.len() > MAX_FILE_BYTES {
            return Err(format!("{} bytes: at most {MAX_FILE_BYTES}", text.len()));
        }
        let raw: RawFile =
            serde_yaml_ng::from_str(text).map_err(|e| format!("not a mapping: {e}"))?;
        if raw.mappings.len() > MAX_RULES {
            return Err(format!(
                "{} mappings: at most {MAX_RULES}",
                raw.mappings.len()
            ));
        }
        let default_regex = match raw.defaults.as_ref().and_then(|d| d.match_type.as_deref()) {
            None | Some("glob") | Some("") => false,
            Some("regex") => true,
            Some(other) => return Err(format!("defaults.match_type {other:?}: glob or regex")),
        };
        let mut mapping = StatsdMapping {
            rules: Vec::new(),
            families: Vec::new(),
        };
        let mut checked = Vec::new();
        let mut compiled = 0;
        for (i, rule) in raw.mappings.iter().enumerate() {
            let at = |e: String| {
                format!(
                    "mappings[{i}] (match {:?}): {e}",
                    cellrate_core::text::printable(cellrate_core::text::first_chars(
                        &rule.pattern,
                        80
                    ))
                )
            };
            let checked_rule = mapping.rule(rule, default_regex).map_err(at)?;
            compiled += checked_rule.1.regex.memory_usage();
            if compiled > MAX_TOTAL_REGEX_BYTES {
                return Err(at(format!(
                    "the expressions so far take {compiled} bytes compiled: at most \
                     {MAX_TOTAL_REGEX_BYTES} for the whole file"
                )));
            }
            checked.push(checked_rule);
        }
        // statsd_exporter tries the globs first, then the regular expressions.
        let (globs, regexes): (Vec<_>, Vec<_>) = checked.into_iter().partition(|(regex, _)| !regex);
        mapping.rules = globs.into_iter().chain(regexes).map(|(_, r)| r).collect();
        Ok(mapping)
    }

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

    /// One rule, checked: (whether it is a regular expression, the rule).
    fn rule(&mut self, raw: &RawRule, default_regex: bool) -> Result<(bool, Rule), String> {
        let is_regex = match raw.match_type.as_deref() {
            None | Some("") => default_regex,
            Some("glob") => false,
            Some("regex") => true,
            Some(other) => return Err(format!("match_type {other:?}: glob or regex")),
        };
        let counters = match raw.match_metric_type.as_deref() {
            None | Some("") | Some("counter") => true,
            Some("gauge" | "observer" | "timer") => false,
            Some(other) => {
                return Err(format!(
                    "match_metric_type {other:?}: counter, gauge or observer"
                ))
            }
        };
        if raw.pattern.is_empty() || raw.pattern.len() > MAX_TEXT_BYTES {
            return Err(format!("match: 1 to {MAX_TEXT_BYTES} bytes"));
        }
        let expression = match is_regex {
            true => raw.pattern.clone(),
            false => glob(&raw.pattern)?,
        };
        let config = Automaton::config()
            .nfa_size_limit(Some(MAX_REGEX_BYTES))
            .onepass_size_limit(Some(SEARCH_CACHE_BYTES))
            .dfa_size_limit(Some(SEARCH_CACHE_BYTES))
            .hybrid_cache_capacity(SEARCH_CACHE_BYTES);
        let regex = Automaton::builder()
            .configure(config)
            .build(&expression)
            .map_err(|e| format!("not a regular expression: {e}"))?;
        let to = match raw.action.as_deref() {
            Some("drop") => None,
            None | Some("") | Some("map") => Some(self.target(raw)?),
            Some(other) => return Err(format!("action {other:?}: map or drop")),
        };
        Ok((
            is_regex,
            Rule {
                regex,
                counters,
                to,
            },
        ))
    }

    /// The family a mapping rule counts in, and its labels' places there.
    fn target(&mut self, raw: &RawRule) -> Result<(usize, Vec<(usize, String)>), String> {
        let name = raw.name.as_deref().unwrap_or("");
        if !metric_name(name) {
            return Err(format!(
                "name {:?}: a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*, no $ expansion)",
                cellrate_core::text::printable(cellrate_core::text::first_chars(name, 80))
            ));
        }
        if name.starts_with("cellrate_") {
            return Err(format!("name {name:?}: cellrate_ names are cellrate's own"));
        }
        if raw.labels.len() > MAX_LABELS {
            return Err(format!("{} labels: at most {MAX_LABELS}", raw.labels.len()));
        }
        for (label, template) in &raw.labels {
            if !label_name(label) {
                return Err(format!(
                    "label {:?}: a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not __...)",
                    cellrate_core::text::printable(cellrate_core::text::first_chars(label, 80))
                ));
            }
            if template.len() > MAX_TEXT_BYTES {
                return Err(format!("label {label}: at most {MAX_TEXT_BYTES} bytes"));
            }
            if template.matches('$').count() > MAX_REFERENCES {
                return Err(format!(
                    "label {label}: at most {MAX_REFERENCES} `$` (references to the match)"
                ));
            }
        }
        let family = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    labels: Vec::new(),
                    help: String::new(),
                });
                self.families.len() - 1
            }
        };
        let f = &mut self.families[family];
        if f.help.is_empty() {
            f.help = raw.help.clone().unwrap_or_else(|| {
                "envoyproxy/ratelimit's statistic, named by the statsd mapping".to_string()
            });
        }
        let mut places = Vec::new();
        for (label, template) in &raw.labels {
            let index = match f.labels.iter().position(|l| l == label) {
                Some(i) => i,
                None if f.labels.len() < MAX_LABELS => {
                    f.labels.push(label.clone());
                    f.labels.len() - 1
                }
                None => {
                    return Err(format!(
                        "{name}: more than {MAX_LABELS} labels across its rules"
                    ))
                }
            };
            places.push((index, template.clone()));
        }
        Ok((family, places))
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

/// A glob as a regular expression: `*` matches within one dot-separated part; the rest
/// is literal; the whole name must match.
fn glob(pattern: &str) -> Result<String, String> {
    if pattern.split('.').any(str::is_empty) {
        return Err("a glob's dot-separated parts must not be empty".to_string());
    }
    let parts: Vec<String> = pattern.split('*').map(regex::escape).collect();
    Ok(format!("^{}$", parts.join("([^.]*)")))
}

fn metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        && name.len() <= MAX_TEXT_BYTES
}

fn label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
        && name.len() <= MAX_TEXT_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Envoy Gateway's mapping file, as it passes it in `PROMETHEUS_MAPPER_YAML`.
    const ENVOY_GATEWAY: &str =
        include_str!("../../../../tests/data/envoy-gateway-statsd-mapping.yaml");

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

    #[test]
    fn a_bad_mapping_is_refused_saying_where_and_what() {
        let cases = [
            ("mappings: [", "not a mapping"),
            (
                "mappings:\n  - {match: 'a.*', name: x, colour: red}",
                "unknown field `colour`",
            ),
            (
                "mappings:\n  - {match: 'a.*', name: 'bad-name'}",
                "mappings[0] (match \"a.*\"): name \"bad-name\"",
            ),
            (
                "mappings:\n  - {match: 'a.*', name: 'x_$1'}",
                "name \"x_$1\"",
            ),
            ("mappings:\n  - {match: 'a.*'}", "name \"\""),
            (
                "mappings:\n  - {match: 'a.*', name: cellrate_decisions_total}",
                "cellrate's own",
            ),
            (
                "mappings:\n  - {match: 'a.*', name: x, labels: {'__name__': v}}",
                "label \"__name__\"",
            ),
            (
                "mappings:\n  - {match: 'a.*', name: x, labels: {'a-b': v}}",
                "label \"a-b\"",
            ),
            (
                "mappings:\n  - {match: '(', match_type: regex, name: x}",
                "not a regular expression",
            ),
            (
                "mappings:\n  - {match: 'a..b', name: x}",
                "must not be empty",
            ),
            (
                "mappings:\n  - {match: 'a', match_type: fuzzy, name: x}",
                "match_type \"fuzzy\"",
            ),
            (
                "mappings:\n  - {match: 'a', action: keep, name: x}",
                "action \"keep\"",
            ),
            (
                "mappings:\n  - {match: 'a', name: x, match_metric_type: any}",
                "match_metric_type \"any\"",
            ),
            ("mappings:\n  - {match: '', name: x}", "match: 1 to"),
        ];
        for (text, want) in cases {
            let error = StatsdMapping::parse(text).unwrap_err();
            assert!(error.contains(want), "{text}: {error}");
        }
    }

    #[test]
    fn a_mapping_is_bounded_in_bytes_rules_labels_and_regex_size() {
        let big = format!("# {}\nmappings: []\n", "x".repeat(MAX_FILE_BYTES));
        assert!(StatsdMapping::parse(&big)
            .unwrap_err()
            .contains("bytes: at most"));
        let rules = "  - {match: a, name: x}\n".repeat(MAX_RULES + 1);
        let error = StatsdMapping::parse(&format!("mappings:\n{rules}")).unwrap_err();
        assert!(error.contains("mappings: at most"), "{error}");
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!("l{i}: v")).collect();
        let text = format!(
            "mappings:\n  - {{match: a, name: x, labels: {{{}}}}}",
            many.join(", ")
        );
        assert!(StatsdMapping::parse(&text)
            .unwrap_err()
            .contains("labels: at most"));
        // Labels across the rules of one name are bounded too.
        let split: String = (0..=MAX_LABELS)
            .map(|i| format!("  - {{match: a{i}, name: x, labels: {{l{i}: v}}}}\n"))
            .collect();
        let error = StatsdMapping::parse(&format!("mappings:\n{split}")).unwrap_err();
        assert!(error.contains("labels across its rules"), "{error}");
        // A regular expression that would compile huge is refused, not built.
        let huge = "mappings:\n  - {match: '(\\w{100}){100}', match_type: regex, name: x}";
        let error = StatsdMapping::parse(huge).unwrap_err();
        assert!(error.contains("not a regular expression"), "{error}");
    }

    #[test]
    fn a_mapping_is_bounded_in_memory_compiled_and_expanded() {
        // Each `\w{20}` compiles to about 1.1 MB: the eighth is over the file's 8 MiB.
        let rules: String = (0..500)
            .map(|i| format!("  - {{match: '(\\w{{20}})x{i}', match_type: regex, name: m{i}}}\n"))
            .collect();
        let error = StatsdMapping::parse(&format!("mappings:\n{rules}")).unwrap_err();
        assert!(error.starts_with("mappings[7]"), "{error}");
        assert!(error.contains("for the whole file"), "{error}");
        // Envoy Gateway's file takes a small part of it.
        let eg = StatsdMapping::parse(ENVOY_GATEWAY).unwrap();
        let used: usize = eg.rules.iter().map(|r| r.regex.memory_usage()).sum();
        assert!(used < MAX_TOTAL_REGEX_BYTES / 8, "{used}");
        // A template of more than 16 references is refused; 16 are cut at 1 024 bytes.
        let template = |n: usize| {
            format!(
                "mappings:\n  - {{match: 'ratelimit.*', match_type: regex, name: r, labels: {{l: '{}'}}}}",
                "$0".repeat(n)
            )
        };
        let error = StatsdMapping::parse(&template(17)).unwrap_err();
        assert!(error.contains("at most 16 `$`"), "{error}");
        let sixteen = StatsdMapping::parse(&template(16)).unwrap();
        let name = statsd_name(&"k".repeat(256), "total_hits");
        let value = &sixteen.map(&name).unwrap().values[0];
        assert_eq!(value.len(), MAX_LABEL_VALUE_BYTES);
        assert!(name.starts_with(&value[..name.len()]));
    }
}
