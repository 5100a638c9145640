//! One descriptor rule: built from `descriptors.yaml` (or `quota.yaml`) and checked (its
//! keys, names, id template and lease or reserve entry), and applied to a descriptor's
//! entries (whether it matches, the id it builds, where the request's entry is).

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;

use crate::names::Names;

#[derive(Debug, Clone)]
pub(super) struct DescriptorRule {
    pub(super) entries: Vec<EntryMatch>,
    pub(super) names: Vec<Arc<str>>,
    id: Vec<Part>,
    /// The index (in `entries`) of the entry whose value names the request: a lease id,
    /// or (`reserves`) the request id of a reservation.
    pub(super) lease: Option<usize>,
    /// Whether that entry names a reservation (`reserve: KEY`) rather than a lease.
    pub(super) reserves: bool,
}

#[derive(Debug, Clone)]
pub(super) struct EntryMatch {
    pub(super) key: String,
    value: Option<String>,
}

/// A piece of an id template: literal text, or the value of the entry at an index.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Entry(usize),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    #[serde(rename = "match")]
    entries: Vec<RawEntry>,
    limits: Vec<String>,
    #[serde(default)]
    id: Option<String>,
    /// The match key whose value is the lease id of a concurrency limit.
    #[serde(default)]
    lease: Option<String>,
    /// The match key whose value is the request id a reservation is held under.
    #[serde(default)]
    reserve: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    key: String,
    #[serde(default)]
    value: Option<String>,
}

impl DescriptorRule {
    pub(super) fn build(
        raw: RawRule,
        names: &Names,
        unordered: bool,
    ) -> Result<DescriptorRule, String> {
        if raw.entries.is_empty() {
            return Err("match lists no entries".to_string());
        }
        let mut entries: Vec<EntryMatch> = Vec::new();
        for entry in raw.entries {
            if entry.key.is_empty() {
                return Err("a match entry has an empty key".to_string());
            }
            if entries.iter().any(|e| e.key == entry.key) {
                return Err(format!("match names key {:?} twice", entry.key));
            }
            entries.push(EntryMatch {
                key: entry.key,
                value: entry.value,
            });
        }
        if unordered {
            entries.sort_by(|a, b| a.key.cmp(&b.key));
        }
        if raw.limits.is_empty() {
            return Err("limits lists no names".to_string());
        }
        let mut rule_names = Vec::new();
        for text in &raw.limits {
            let name = names.get(text).ok_or_else(|| names.unknown(text))?;
            rule_names.push(name.text.clone());
        }
        let (lease, field, what) = request_entry(
            raw.lease.as_deref(),
            raw.reserve.as_deref(),
            &entries,
            unordered,
        )?;
        let template = match raw.id {
            Some(template) => template,
            None => {
                let open: Vec<&EntryMatch> = (entries.iter().enumerate())
                    .filter(|(i, e)| e.value.is_none() && Some(*i) != lease)
                    .map(|(_, e)| e)
                    .collect();
                match open[..] {
                    [only] => format!("{{{}}}", only.key),
                    _ => {
                        return Err(
                            "id is required unless exactly one match entry has no fixed value"
                                .to_string(),
                        )
                    }
                }
            }
        };
        let id = parse_template(&template, &entries)?;
        if let Some(at) = lease {
            if id.contains(&Part::Entry(at)) {
                return Err(format!(
                    "id template {template:?} names the {field} entry: the id is the key's, \
                     the {what}'s is apart"
                ));
            }
        }
        // A template without placeholders is one fixed id: check it now, for every name.
        if id.iter().all(|part| matches!(part, Part::Text(_))) {
            let fixed = fixed_text(&id);
            for text in &raw.limits {
                if let Some(name) = names.get(text) {
                    name.format.canonicalize(&fixed).map_err(|e| {
                        format!("fixed id does not fit {text} ({}): {e}", name.format)
                    })?;
                }
            }
        }
        Ok(DescriptorRule {
            entries,
            names: rule_names,
            id,
            lease,
            reserves: raw.reserve.is_some(),
        })
    }

    /// The id for `entries` if this rule matches them, and the index of the lease entry
    /// among them (`None`: no lease entry, or the descriptor lacks it). A rule with a
    /// lease entry also matches the descriptor without it.
    pub(super) fn apply<'e>(
        &self,
        entries: &[(&'e str, &'e str)],
    ) -> Option<(Cow<'e, str>, Option<usize>)> {
        // The rule's entry left out of the descriptor (its lease entry), if any.
        let missing = match self.lease {
            _ if entries.len() == self.entries.len() => None,
            Some(at) if entries.len() + 1 == self.entries.len() => Some(at),
            _ => return None,
        };
        // The descriptor's index of the rule's entry `r`.
        let at = |r: usize| match missing {
            Some(m) if r > m => r - 1,
            _ => r,
        };
        let fits = |rule: &EntryMatch, (key, value): (&str, &str)| {
            rule.key == key && rule.value.as_deref().is_none_or(|fixed| fixed == value)
        };
        let matches = match missing {
            None => (self.entries.iter().zip(entries)).all(|(rule, &entry)| fits(rule, entry)),
            Some(m) => (self.entries.iter().enumerate())
                .filter(|&(r, _)| r != m)
                .all(|(r, rule)| fits(rule, entries[at(r)])),
        };
        if !matches {
            return None;
        }
        let lease = self.lease.filter(|_| missing.is_none());
        // The common template, `{key}`: the entry's value as it is.
        if let [Part::Entry(i)] = self.id[..] {
            return Some((Cow::Borrowed(entries[at(i)].1), lease));
        }
        let mut id = String::new();
        for part in &self.id {
            match part {
                Part::Text(text) => id.push_str(text),
                Part::Entry(i) => id.push_str(entries[at(*i)].1),
            }
        }
        Some((Cow::Owned(id), lease))
    }
}

/// The rule's entry that names the request (`lease: KEY` or `reserve: KEY`): its index
/// among `entries`, and the field and what its value is, for the rule's errors.
fn request_entry(
    lease: Option<&str>,
    reserve: Option<&str>,
    entries: &[EntryMatch],
    unordered: bool,
) -> Result<(Option<usize>, &'static str, &'static str), String> {
    let (field, what, key) = match (lease, reserve) {
        (Some(_), Some(_)) => {
            return Err(
                "lease and reserve: a rule takes one (a lease is a slot of a \
                        concurrency limit, a reservation holds tokens)"
                    .to_string(),
            )
        }
        (None, Some(key)) => ("reserve", "request", Some(key)),
        (lease, None) => ("lease", "lease", lease),
    };
    let Some(key) = key else {
        return Ok((None, field, what));
    };
    if unordered {
        return Err(format!(
            "{field}: an RLQS bucket takes no {field} (quota.yaml)"
        ));
    }
    let at = entries
        .iter()
        .position(|e| e.key == key)
        .ok_or_else(|| format!("{field} {key:?} is not a match key (list it in match)"))?;
    if entries[at].value.is_some() {
        return Err(format!(
            "{field} {key:?} has a fixed value: a {what} id differs per request"
        ));
    }
    Ok((Some(at), field, what))
}

fn fixed_text(parts: &[Part]) -> String {
    parts
        .iter()
        .map(|p| match p {
            Part::Text(t) => t.as_str(),
            Part::Entry(_) => "",
        })
        .collect()
}

/// Parses `{key}` placeholders; every key must be one of the rule's entries.
fn parse_template(template: &str, entries: &[EntryMatch]) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        match rest.find(['{', '}']) {
            None => {
                parts.push(Part::Text(rest.to_string()));
                break;
            }
            Some(at) if rest.as_bytes()[at] == b'}' => {
                return Err(format!("id template {template:?} has an unmatched '}}'"))
            }
            Some(at) => {
                if at > 0 {
                    parts.push(Part::Text(rest[..at].to_string()));
                }
                let close = rest[at..]
                    .find('}')
                    .ok_or_else(|| format!("id template {template:?} has an unclosed '{{'"))?;
                let key = &rest[at + 1..at + close];
                let index = entries.iter().position(|e| e.key == key).ok_or_else(|| {
                    format!("id template {template:?} names {{{key}}}, which is not a match key")
                })?;
                parts.push(Part::Entry(index));
                rest = &rest[at + close + 1..];
            }
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::super::testing::rules;

    #[test]
    fn rule_errors_are_reported() {
        let cases = [
            (
                "d: [{match: [], limits: [NewOrdersPerAccount]}]",
                "match lists no entries",
            ),
            (
                "d: [{match: [{key: ''}], limits: [NewOrdersPerAccount]}]",
                "empty key",
            ),
            (
                "d: [{match: [{key: a}, {key: a}], limits: [NewOrdersPerAccount]}]",
                "twice",
            ),
            ("d: [{match: [{key: a}], limits: []}]", "no names"),
            (
                "d: [{match: [{key: a}], limits: [Nope]}]",
                "unknown limit name \"Nope\"",
            ),
            (
                "d: [{match: [{key: a}, {key: b}], limits: [NewOrdersPerAccount]}]",
                "id is required",
            ),
            (
                "d: [{match: [{key: a}], limits: [NewOrdersPerAccount], id: '{b}'}]",
                "not a match key",
            ),
            (
                "d: [{match: [{key: a}], limits: [NewOrdersPerAccount], id: '{a'}]",
                "unclosed",
            ),
            (
                "d: [{match: [{key: a}], limits: [NewOrdersPerAccount], id: 'a}'}]",
                "unmatched",
            ),
            (
                "d: [{match: [{key: a, value: x}], limits: [NewOrdersPerAccount], id: 'abc'}]",
                "fixed id does not fit NewOrdersPerAccount",
            ),
        ];
        for (yaml, expected) in cases {
            let errors = rules(yaml).unwrap_err();
            assert!(errors[0].starts_with("d rule 1: "), "{errors:?}");
            assert!(errors[0].contains(expected), "{yaml}: {errors:?}");
        }
    }
}
