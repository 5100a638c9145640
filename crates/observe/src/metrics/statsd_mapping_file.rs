//! A statsd_exporter mapping file read and checked: its YAML (timer and histogram settings
//! accepted and ignored), each rule's match compiled within its memory bounds, its name
//! and labels checked, the families of series it gives collected.

use std::collections::BTreeMap;

use regex_automata::meta::Regex as Automaton;
use serde::Deserialize;

use super::statsd_mapping::{
    Family, Rule, StatsdMapping, MAX_FILE_BYTES, MAX_LABELS, MAX_REFERENCES, MAX_REGEX_BYTES,
    MAX_RULES, MAX_TEXT_BYTES, MAX_TOTAL_REGEX_BYTES, SEARCH_CACHE_BYTES,
};

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
    use super::super::statsd_mapping::{statsd_name, ENVOY_GATEWAY, MAX_LABEL_VALUE_BYTES};
    use super::*;

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
