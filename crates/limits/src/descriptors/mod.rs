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
//!
//! This file holds the rules of every domain and the mapping (a domain's rules in order,
//! then the convention); `rule` builds and checks one rule and applies it to entries.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::hash::ConfigMap;
use crate::names::Names;
use rule::{DescriptorRule, RawRule};

mod rule;

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

/// The module's tests' rules: `descriptors.yaml`'s text built over the built-in names, or
/// its errors as `entry: reason`.
#[cfg(test)]
mod testing {
    use super::*;

    pub(super) fn rules(yaml: &str) -> Result<(DescriptorRules, Names), Vec<String>> {
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
}

#[cfg(test)]
mod tests {
    use super::testing::rules;
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
        let (rules, names) = super::testing::rules(
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
            let errors = super::testing::rules(yaml).unwrap_err();
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
            let errors = super::testing::rules(yaml).unwrap_err();
            assert!(errors[0].contains(says), "{yaml}: {errors:?}");
        }
    }
}
