//! Envoy descriptors -> limit names and ids (`descriptors.yaml`).
//!
//! Per Envoy domain, an ordered list of rules. A rule matches a descriptor whose entries
//! have exactly the rule's keys, in order (and the rule's value, where it fixes one); it
//! maps the descriptor to one or more names, with the id built from the entries' values by
//! a template such as `{remote_address}` or `{account_id}:{domain}`. The first matching rule
//! wins. Without a matching rule, the convention applies in every domain: a descriptor of a
//! single entry whose key is a limit name maps to that name, with the value as id. Anything
//! else maps to nothing (allowed, unlimited).
//!
//! ```yaml
//! edge:
//!   - match: [{key: generic_key, value: signup}, {key: remote_address}]
//!     limits: [NewRegistrationsPerIPAddress]
//!   - match: [{key: api_key}]
//!     limits: [ApiRequestsPerKey, ApiRequestsPerKeyDaily]
//!     id: "{api_key}"
//! ```
//!
//! A rule may name the match entry that carries the request's id: `lease: KEY` (the
//! descriptor takes or frees a slot of a concurrency limit under that id) or `reserve: KEY`
//! (it holds its hits as an estimate under that id, and the same descriptor with
//! `is_negative_hits` settles the hold to its hits: the actual cost).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::hash::ConfigMap;
use crate::names::Names;

/// The descriptor rules of every domain.
#[derive(Debug, Clone, Default)]
pub struct DescriptorRules {
    by_domain: ConfigMap<String, Vec<DescriptorRule>>,
    /// Domains whose `invalid_id` policy is not the default ([`InvalidIds::Deny`]).
    invalid_ids: ConfigMap<String, InvalidIds>,
}

/// What a descriptor (or native item) whose id does not fit its name's format does to
/// the request. Envoy domains choose in `descriptors.yaml` (`invalid_id`, default `deny`);
/// the native API always rejects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InvalidIds {
    /// The request is INVALID_ARGUMENT.
    #[default]
    Reject,
    /// That item is denied for good (OVER_LIMIT, no retry time helps); the rest are
    /// decided as usual.
    Deny,
    /// That item is left out, as if it mapped to nothing.
    Ignore,
}

/// A domain in `descriptors.yaml`: a list of rules, or `{invalid_id, rules}`.
#[derive(Debug, Default)]
pub(crate) struct RawDomain {
    invalid_id: Option<InvalidIds>,
    rules: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDomainMap {
    #[serde(default)]
    invalid_id: Option<InvalidIds>,
    #[serde(default)]
    rules: Vec<RawRule>,
}

impl<'de> Deserialize<'de> for RawDomain {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Domain;
        impl<'de> serde::de::Visitor<'de> for Domain {
            type Value = RawDomain;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of rules, or a map with `rules` and `invalid_id`")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<RawDomain, A::Error> {
                let rules =
                    Vec::<RawRule>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))?;
                Ok(RawDomain {
                    invalid_id: None,
                    rules,
                })
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RawDomain, A::Error> {
                let raw =
                    RawDomainMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(RawDomain {
                    invalid_id: raw.invalid_id,
                    rules: raw.rules,
                })
            }
        }
        deserializer.deserialize_any(Domain)
    }
}

#[derive(Debug, Clone)]
struct DescriptorRule {
    entries: Vec<EntryMatch>,
    names: Vec<Arc<str>>,
    id: Vec<Part>,
    /// The index (in `entries`) of the entry whose value names the request: a lease id,
    /// or (`reserves`) the request id of a reservation.
    lease: Option<usize>,
    /// Whether that entry names a reservation (`reserve: KEY`) rather than a lease.
    reserves: bool,
}

#[derive(Debug, Clone)]
struct EntryMatch {
    key: String,
    value: Option<String>,
}

/// A piece of an id template: literal text, or the value of the entry at an index.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Entry(usize),
}

/// Where a descriptor leads: borrowed from the rules (`'a`) and the descriptor (`'e`), so
/// that mapping allocates only for ids built from a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapping<'a, 'e> {
    /// Names (one or more) and the id built for them.
    Limits {
        names: &'a [Arc<str>],
        id: Cow<'e, str>,
    },
    /// Concurrency limits (a rule with a `lease` entry), the id built for them, and the
    /// descriptor's lease entry: its index among the descriptor's entries and its value
    /// (`None`: the descriptor lacks it).
    Leases {
        names: &'a [Arc<str>],
        id: Cow<'e, str>,
        lease: Option<(usize, &'e str)>,
        /// The rule's lease key, to name a missing entry.
        lease_key: &'a str,
    },
    /// Rate limits reserved under a request id (a rule with a `reserve` entry): the names,
    /// the id built for them, and the descriptor's request entry: its index among the
    /// descriptor's entries and its value (`None`: the descriptor lacks it).
    Reservations {
        names: &'a [Arc<str>],
        id: Cow<'e, str>,
        request: Option<(usize, &'e str)>,
        /// The rule's request key, to name a missing entry.
        request_key: &'a str,
    },
    /// No rule and no convention: not limited.
    Unmatched,
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

impl DescriptorRules {
    /// Whether no domain has descriptor rules.
    pub fn is_empty(&self) -> bool {
        self.by_domain.is_empty()
    }

    /// Validates raw rules against `names`; problems go to `report(entry, reason)`.
    pub(crate) fn build(
        raw: BTreeMap<String, RawDomain>,
        names: &Names,
        report: &mut impl FnMut(Option<String>, String),
    ) -> DescriptorRules {
        DescriptorRules::build_as(raw, names, report, false)
    }

    /// As [`DescriptorRules::build`], for entries whose keys form a set (Envoy RLQS bucket
    /// ids, which are maps): a rule matches whatever the order of its keys, and
    /// [`DescriptorRules::map`] must be given entries sorted by key.
    pub(crate) fn build_unordered(
        raw: BTreeMap<String, RawDomain>,
        names: &Names,
        report: &mut impl FnMut(Option<String>, String),
    ) -> DescriptorRules {
        DescriptorRules::build_as(raw, names, report, true)
    }

    fn build_as(
        raw: BTreeMap<String, RawDomain>,
        names: &Names,
        report: &mut impl FnMut(Option<String>, String),
        unordered: bool,
    ) -> DescriptorRules {
        let mut rules = DescriptorRules::default();
        for (domain, raw_domain) in raw {
            if domain.is_empty() {
                report(None, "a domain name is empty".to_string());
                continue;
            }
            if let Some(policy) = raw_domain.invalid_id.filter(|p| *p != InvalidIds::Deny) {
                rules.invalid_ids.insert(domain.clone(), policy);
            }
            let raw_rules = raw_domain.rules;
            let mut built = Vec::new();
            for (index, rule) in raw_rules.into_iter().enumerate() {
                let at = Some(format!("{domain} rule {}", index + 1));
                match DescriptorRule::build(rule, names, unordered) {
                    Ok(rule) => built.push(rule),
                    Err(reason) => report(at, reason),
                }
            }
            rules.by_domain.insert(domain, built);
        }
        rules
    }

    /// Whether `domain` has rules.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.by_domain.contains_key(domain)
    }

    /// Every name a rule maps to (repeats included).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_domain
            .values()
            .flatten()
            .flat_map(|rule| rule.names.iter().map(|name| name.as_ref()))
    }

    /// Maps one descriptor of `domain` (entries as `(key, value)`).
    ///
    /// ```
    /// use cellrate_limits::descriptors::{DescriptorRules, Mapping};
    /// use cellrate_limits::names::Names;
    /// let rules = DescriptorRules::default();
    /// let names = Names::builtin();
    /// let Mapping::Limits { names: found, id } =
    ///     rules.map(&names, "any", &[("NewOrdersPerAccount", "42")])
    /// else {
    ///     panic!("a limit name maps by convention")
    /// };
    /// assert_eq!((&*found[0], &*id), ("NewOrdersPerAccount", "42"));
    /// assert_eq!(rules.map(&names, "any", &[("path", "/")]), Mapping::Unmatched);
    /// ```
    pub fn map<'a, 'e>(
        &'a self,
        names: &'a Names,
        domain: &str,
        entries: &[(&'e str, &'e str)],
    ) -> Mapping<'a, 'e> {
        if let Some(rules) = self.by_domain.get(domain) {
            for rule in rules {
                if let Some((id, lease)) = rule.apply(entries) {
                    return match rule.lease {
                        None => Mapping::Limits {
                            names: &rule.names,
                            id,
                        },
                        Some(key) if rule.reserves => Mapping::Reservations {
                            names: &rule.names,
                            id,
                            request: lease.map(|at| (at, entries[at].1)),
                            request_key: &rule.entries[key].key,
                        },
                        Some(key) => Mapping::Leases {
                            names: &rule.names,
                            id,
                            lease: lease.map(|at| (at, entries[at].1)),
                            lease_key: &rule.entries[key].key,
                        },
                    };
                }
            }
        }
        // Convention: one entry whose key is a limit name.
        if let [(key, value)] = entries {
            if let Some(name) = names.get(key) {
                return Mapping::Limits {
                    names: std::slice::from_ref(&name.text),
                    id: Cow::Borrowed(value),
                };
            }
        }
        Mapping::Unmatched
    }

    /// What an invalid id does in `domain` (`deny` unless the domain says otherwise).
    pub fn invalid_ids(&self, domain: &str) -> InvalidIds {
        if self.invalid_ids.is_empty() {
            return InvalidIds::Deny;
        }
        self.invalid_ids
            .get(domain)
            .copied()
            .unwrap_or(InvalidIds::Deny)
    }

    /// Every rule as (domain, its number from 1, the names it maps to, whether it has a
    /// lease entry), for checks across files.
    pub fn rules(&self) -> impl Iterator<Item = (&str, usize, &[Arc<str>], bool)> {
        self.by_domain.iter().flat_map(|(domain, rules)| {
            (rules.iter().enumerate()).map(move |(i, r)| {
                let lease = r.lease.is_some() && !r.reserves;
                (domain.as_str(), i + 1, &r.names[..], lease)
            })
        })
    }

    /// Number of rules over all domains.
    pub fn rule_count(&self) -> usize {
        self.by_domain.values().map(Vec::len).sum()
    }
}

impl DescriptorRule {
    fn build(raw: RawRule, names: &Names, unordered: bool) -> Result<DescriptorRule, String> {
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
    fn apply<'e>(&self, entries: &[(&'e str, &'e str)]) -> Option<(Cow<'e, str>, Option<usize>)> {
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
    use super::*;

    /// A mapping as owned names and id (`None` when unmatched), to compare.
    fn mapped<'a>(mapping: Mapping<'a, '_>) -> Option<(Vec<&'a str>, String)> {
        match mapping {
            Mapping::Limits { names, id } => Some((
                names.iter().map(|n| -> &str { n }).collect(),
                id.into_owned(),
            )),
            Mapping::Leases { .. } | Mapping::Reservations { .. } | Mapping::Unmatched => None,
        }
    }

    fn rules(yaml: &str) -> Result<(DescriptorRules, Names), Vec<String>> {
        let names = Names::builtin();
        let raw: BTreeMap<String, RawDomain> = serde_yaml_ng::from_str(yaml).unwrap();
        let mut errors = Vec::new();
        let built = DescriptorRules::build(raw, &names, &mut |entry, reason| {
            errors.push(format!("{}: {reason}", entry.unwrap_or_default()))
        });
        if errors.is_empty() {
            Ok((built, names))
        } else {
            Err(errors)
        }
    }

    const EDGE: &str = r#"
edge:
  - match: [{key: generic_key, value: signup}, {key: remote_address}]
    limits: [NewRegistrationsPerIPAddress]
  - match: [{key: account}, {key: domain}]
    limits: [CertificatesPerDomainPerAccount, FailedAuthorizationsPerDomainPerAccount]
    id: "{account}:{domain}"
"#;

    #[test]
    fn rules_match_keys_in_order_with_fixed_values() {
        let (rules, names) = rules(EDGE).unwrap();
        assert_eq!(
            mapped(rules.map(
                &names,
                "edge",
                &[("generic_key", "signup"), ("remote_address", "10.0.0.1")]
            )),
            Some((vec!["NewRegistrationsPerIPAddress"], "10.0.0.1".to_string()))
        );
        assert_eq!(
            mapped(rules.map(
                &names,
                "edge",
                &[("generic_key", "login"), ("remote_address", "10.0.0.1")]
            )),
            None
        );
        assert_eq!(
            mapped(rules.map(
                &names,
                "edge",
                &[("remote_address", "10.0.0.1"), ("generic_key", "signup")]
            )),
            None
        );
        assert_eq!(
            mapped(rules.map(
                &names,
                "edge",
                &[("account", "42"), ("domain", "www.example.com")]
            )),
            Some((
                vec![
                    "CertificatesPerDomainPerAccount",
                    "FailedAuthorizationsPerDomainPerAccount"
                ],
                "42:www.example.com".to_string()
            ))
        );
        // Rules are per domain; the convention works everywhere.
        assert_eq!(
            mapped(rules.map(
                &names,
                "other",
                &[("generic_key", "signup"), ("remote_address", "10.0.0.1")]
            )),
            None
        );
        assert_eq!(
            mapped(rules.map(&names, "other", &[("NewOrdersPerAccount", "7")])),
            Some((vec!["NewOrdersPerAccount"], "7".to_string()))
        );
        assert_eq!(rules.rule_count(), 2);
    }

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

    #[test]
    fn fixed_ids_are_allowed_when_they_fit() {
        let (rules, names) =
            rules("d: [{match: [{key: generic_key, value: global}], limits: [NewOrdersPerAccount], id: '0'}]")
                .unwrap();
        assert_eq!(
            mapped(rules.map(&names, "d", &[("generic_key", "global")])),
            Some((vec!["NewOrdersPerAccount"], "0".to_string()))
        );
    }

    #[test]
    fn a_lease_entry_names_the_lease_and_may_be_missing() {
        let (rules, names) = rules(
            "d: [{match: [{key: tenant}, {key: lease}, {key: route}], \
             limits: [NewOrdersPerAccount], id: '{tenant}/{route}', lease: lease}]",
        )
        .unwrap();
        let leases =
            |entries: &[(&'static str, &'static str)]| match rules.map(&names, "d", entries) {
                Mapping::Leases {
                    names,
                    id,
                    lease,
                    lease_key,
                } => {
                    assert_eq!(lease_key, "lease");
                    Some((names.len(), id, lease))
                }
                _ => None,
            };
        assert_eq!(
            leases(&[("tenant", "7"), ("lease", "r1"), ("route", "a")]),
            Some((1, Cow::Borrowed("7/a"), Some((1, "r1"))))
        );
        // Without its lease entry: matched, the lease missing (refused by the service).
        assert_eq!(
            leases(&[("tenant", "7"), ("route", "a")]),
            Some((1, Cow::Borrowed("7/a"), None))
        );
        assert_eq!(leases(&[("tenant", "7")]), None);
        assert_eq!(
            leases(&[("tenant", "7"), ("other", "r1"), ("route", "a")]),
            None
        );
        // The default id leaves the lease entry out.
        let (rules, names) = super::tests::rules(
            "d: [{match: [{key: tenant}, {key: lease}], limits: [NewOrdersPerAccount], lease: lease}]",
        )
        .unwrap();
        assert!(matches!(
            rules.map(&names, "d", &[("tenant", "7"), ("lease", "r")]),
            Mapping::Leases { id, lease: Some((1, "r")), .. } if id == "7"
        ));
        for (yaml, says) in [
            ("d: [{match: [{key: a}], limits: [NewOrdersPerAccount], id: x, lease: b}]", "not a match key"),
            ("d: [{match: [{key: a}, {key: b, value: v}], limits: [NewOrdersPerAccount], lease: b}]", "fixed value"),
            ("d: [{match: [{key: a}, {key: b}], limits: [NewOrdersPerAccount], id: '{b}', lease: b}]", "names the lease entry"),
        ] {
            let errors = super::tests::rules(yaml).unwrap_err();
            assert!(errors[0].contains(says), "{yaml}: {errors:?}");
        }
    }

    #[test]
    fn a_reserve_entry_names_the_request_and_is_not_a_lease() {
        let (rules, names) = rules(
            "d: [{match: [{key: tenant}, {key: request}], limits: [NewOrdersPerAccount], \
             reserve: request}]",
        )
        .unwrap();
        assert!(matches!(
            rules.map(&names, "d", &[("tenant", "7"), ("request", "r1")]),
            Mapping::Reservations { id, request: Some((1, "r1")), request_key: "request", .. }
                if id == "7"
        ));
        assert!(matches!(
            rules.map(&names, "d", &[("tenant", "7")]),
            Mapping::Reservations { request: None, .. }
        ));
        // Not counted as a lease rule (which maps only to concurrency limits).
        assert!(rules.rules().all(|(_, _, _, lease)| !lease));
        for (yaml, says) in [
            ("d: [{match: [{key: a}, {key: b}], limits: [NewOrdersPerAccount], lease: b, reserve: b}]", "a rule takes one"),
            ("d: [{match: [{key: a}], limits: [NewOrdersPerAccount], id: x, reserve: b}]", "reserve \"b\" is not a match key"),
            ("d: [{match: [{key: a}, {key: b, value: v}], limits: [NewOrdersPerAccount], reserve: b}]", "a request id differs"),
            ("d: [{match: [{key: a}, {key: b}], limits: [NewOrdersPerAccount], id: '{b}', reserve: b}]", "names the reserve entry"),
        ] {
            let errors = super::tests::rules(yaml).unwrap_err();
            assert!(errors[0].contains(says), "{yaml}: {errors:?}");
        }
    }
}
