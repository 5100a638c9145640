//! Each file's entries into the table: names declared (`names.yaml`), defaults
//! (`defaults.yaml`) and overrides (`overrides*.yaml`) validated one by one, every error
//! reported with its entry; an override id canonicalised, and set once across files.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::raw::{OverrideEntry, RawLimit, RawName, RawWindow};
use super::{short, Behaviour, LimitTable, Policy, Source};
use crate::ids::IdFormat;
use crate::names::Names;

impl LimitTable {
    pub(super) fn add_names(
        &mut self,
        raw: BTreeMap<String, RawName>,
        report: &mut impl FnMut(Option<String>, String),
    ) {
        // Declared in number order, so that errors do not depend on map order.
        let mut raw: Vec<_> = raw.into_iter().collect();
        raw.sort_by_key(|(_, name)| name.number);
        for (text, name) in raw {
            let Some(format) = IdFormat::from_config(&name.format) else {
                report(
                    Some(text),
                    format!(
                        "unknown id format {:?} (one of {})",
                        name.format,
                        IdFormat::CONFIG_NAMES
                    ),
                );
                continue;
            };
            if let Err(e) = self
                .names
                .declare(&text, name.number, format, name.description)
            {
                report(Some(text), e.to_string());
            }
        }
    }

    pub(super) fn add_defaults(
        &mut self,
        raw: BTreeMap<String, RawLimit>,
        report: &mut impl FnMut(Option<String>, String),
    ) {
        for (text, limit) in raw {
            let Some(name) = self.names.get(&text) else {
                report(Some(text.clone()), unknown_name(&self.names, &text));
                continue;
            };
            let number = name.number;
            let reservation = match limit.reservation.as_ref().map(|r| r.build()) {
                Some(Err(reason)) => {
                    report(Some(text), reason);
                    continue;
                }
                Some(Ok(_)) if limit.window == RawWindow::Concurrency => {
                    report(
                        Some(text),
                        "reservation applies to a budget (gcra or calendar), not to \
                         `window: concurrency` (whose leases expire by themselves)"
                            .to_string(),
                    );
                    continue;
                }
                Some(Ok(r)) => Some(r),
                None => None,
            };
            match limit.build() {
                Ok(policy) => {
                    self.zero_checks |= reservation.is_some_and(|r| r.zero_checks.is_some());
                    let entry = self.policies.entry(number).or_default();
                    entry.default = Some(policy);
                    entry.reservation = reservation;
                }
                Err(reason) => report(Some(text), reason),
            }
        }
    }

    pub(super) fn add_overrides(
        &mut self,
        file: &str,
        raw: Vec<OverrideEntry>,
        origin: &mut HashMap<(u32, String), String>,
        report: &mut impl FnMut(Option<String>, String),
    ) {
        for (index, OverrideEntry(entry)) in raw.into_iter().enumerate() {
            let at = |text: &str| format!("entry {} ({text})", index + 1);
            if entry.len() != 1 {
                report(
                    Some(format!("entry {}", index + 1)),
                    format!(
                        "an override entry is a map with exactly one limit name, found {}",
                        entry.len()
                    ),
                );
                continue;
            }
            let Some((text, over)) = entry.into_iter().next() else {
                continue;
            };
            let Some(name) = self.names.get(&text).cloned() else {
                report(Some(at(&text)), unknown_name(&self.names, &text));
                continue;
            };
            let policy = match over.policy() {
                // Shown or hidden, requests or tokens, as the name's default.
                Ok(Policy::Limited { limit, behaviour }) => Policy::Limited {
                    limit,
                    behaviour: Behaviour {
                        headers: self.headers(&name),
                        ..behaviour
                    },
                },
                Ok(policy) => policy,
                Err(reason) => {
                    report(Some(at(&text)), reason);
                    continue;
                }
            };
            if let Some(reason) = self.window_mismatch(name.number, &policy) {
                report(Some(at(&text)), reason);
                continue;
            }
            if over.ids.is_empty() {
                report(Some(at(&text)), "ids must list at least one id".to_string());
            }
            let file: Arc<str> = Arc::from(file);
            let entry = u32::try_from(index + 1).unwrap_or(u32::MAX);
            let mut entry_source = None;
            for id in over.ids {
                let format = name.format.override_format();
                let canonical = match format.canonicalize(&id.id) {
                    Ok(canonical) => canonical,
                    Err(e) => {
                        report(Some(at(&text)), format!("{e} (format {format})"));
                        continue;
                    }
                };
                let here = format!("{file} {}", at(&text));
                if let Some(first) = origin.get(&(name.number, canonical.clone())) {
                    report(
                        Some(at(&text)),
                        format!("id {:?} is already overridden in {first}", id.id),
                    );
                    continue;
                }
                origin.insert((name.number, canonical.clone()), here);
                let source = match id.comment {
                    Some(comment) => self.add_source(Source::Override {
                        file: file.clone(),
                        entry,
                        comment: Some(Arc::from(short(&comment))),
                    }),
                    None => *entry_source.get_or_insert_with(|| {
                        self.add_source(Source::Override {
                            file: file.clone(),
                            entry,
                            comment: None,
                        })
                    }),
                };
                self.policies
                    .entry(name.number)
                    .or_default()
                    .overrides
                    .insert(canonical.into_boxed_str(), (policy, source));
            }
        }
    }

    fn add_source(&mut self, source: Source) -> u32 {
        self.override_sources.push(source);
        u32::try_from(self.override_sources.len() - 1).unwrap_or(u32::MAX)
    }
}

/// An unknown name in a config file: a close known name if there is one, else how to
/// declare a new one.
fn unknown_name(names: &Names, text: &str) -> String {
    match names.closest(text) {
        Some(_) => names.unknown(text),
        None => format!(
            "{} (declare it in names.yaml, with a number >= 100)",
            names.unknown(text)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{load, DEFAULTS};
    use crate::config::{Headers, Measures};
    use cellrate_core::clock::SECOND;
    use cellrate_core::gcra::Limit;

    #[test]
    fn defaults_and_both_override_id_forms() {
        let table = load(&[
            ("defaults.yaml", DEFAULTS),
            (
                "overrides.yaml",
                "
- NewRegistrationsPerIPAddress:
    burst: 20
    count: 40
    period: 1s
    ids:
      - 10.0.0.2
      - 10.0.0.5
- NewOrdersPerAccount:
    burst: 300
    count: 600
    period: 180m
    ids:
      - 12345678
      - id: 87654321
        comment: a big customer
",
            ),
        ])
        .unwrap();
        let names = table.names();
        let ip = names.get("NewRegistrationsPerIPAddress").unwrap();
        let orders = names.get("NewOrdersPerAccount").unwrap();
        let limit = |b, c, p| Some(Policy::limited(Limit::new(b, c, p).unwrap()));
        assert_eq!(table.policy(ip, "10.0.0.2"), limit(20, 40, SECOND));
        assert_eq!(table.policy(ip, "10.0.0.3"), limit(20, 20, SECOND));
        // Where each comes from: the entry (counted from 1), the id's comment.
        let entry = |entry: u32, comment: Option<&str>| Source::Override {
            file: Arc::from("overrides.yaml"),
            entry,
            comment: comment.map(Arc::from),
        };
        assert_eq!(table.source(ip, "10.0.0.2"), entry(1, None));
        assert_eq!(table.source(ip, "10.0.0.3"), Source::Default);
        assert_eq!(table.source(orders, "12345678"), entry(2, None));
        assert_eq!(
            table.source(orders, "87654321"),
            entry(2, Some("a big customer"))
        );
        let unconfigured = names.get("CertificatesPerDomain").unwrap();
        assert_eq!(
            table.source(unconfigured, "example.com"),
            Source::NotConfigured
        );
        assert_eq!(
            table.policy(orders, "87654321"),
            limit(300, 600, 10_800 * SECOND)
        );
        assert_eq!(
            table.policy(orders, "12345678"),
            limit(300, 600, 10_800 * SECOND)
        );
        assert_eq!(table.policy(orders, "1"), limit(300, 300, 10_800 * SECOND));
        let not_configured = names.get("CertificatesPerDomain").unwrap();
        assert_eq!(table.policy(not_configured, "example.com"), None);
        assert_eq!(table.override_count(), 4);
    }

    #[test]
    fn user_names_unlimited_and_deny() {
        let table = load(&[
            (
                "names.yaml",
                "ApiRequestsPerKey: {number: 100, format: string, description: per key}\n",
            ),
            (
                "defaults.yaml",
                "ApiRequestsPerKey: {burst: 10, count: 10, period: 1s}\n",
            ),
            (
                "overrides-lists.yaml",
                "
- ApiRequestsPerKey: {unlimited: true, ids: [key-internal]}
- ApiRequestsPerKey: {deny: true, ids: [{id: key-abuser, comment: ticket 12}]}
",
            ),
        ])
        .unwrap();
        let name = table.names().get("ApiRequestsPerKey").unwrap();
        assert_eq!(
            (name.number, name.format),
            (100, crate::ids::IdFormat::String)
        );
        assert_eq!(table.policy(name, "key-internal"), Some(Policy::Unlimited));
        assert_eq!(table.policy(name, "key-abuser"), Some(Policy::Denied));
        assert!(matches!(
            table.policy(name, "other"),
            Some(Policy::Limited { .. })
        ));
    }

    #[test]
    fn composite_names_are_overridden_by_reg_id() {
        let table = load(&[(
            "overrides.yaml",
            "- CertificatesPerDomainPerAccount: {burst: 5, count: 5, period: 1h, ids: [0042]}\n",
        )])
        .unwrap();
        let name = table
            .names()
            .get("CertificatesPerDomainPerAccount")
            .unwrap();
        assert!(matches!(
            table.policy(name, "42:example.com"),
            Some(Policy::Limited { .. })
        ));
        assert_eq!(table.policy(name, "43:example.com"), None);
    }

    #[test]
    fn overrides_canonicalise_ids() {
        let table = load(&[(
            "overrides.yaml",
            "- NewRegistrationsPerIPAddress: {burst: 1, count: 1, period: 1s, ids: ['2001:0db8:0000::1']}\n",
        )])
        .unwrap();
        let name = table.names().get("NewRegistrationsPerIPAddress").unwrap();
        assert!(table.policy(name, "2001:db8::1").is_some());
    }

    #[test]
    fn headers_and_measures_are_the_names_and_overrides_keep_them() {
        let table = load(&[
            (
                "defaults.yaml",
                "
NewRegistrationsPerIPAddress: {burst: 20, count: 20, period: 1s, headers: hidden}
NewOrdersPerAccount: {burst: 300, count: 300, period: 1m, measures: tokens}
",
            ),
            (
                "overrides.yaml",
                "
- NewRegistrationsPerIPAddress: {burst: 40, count: 40, period: 1s, ids: [10.0.0.2]}
- NewRegistrationsPerIPAddress: {deny: true, ids: [10.0.0.3]}
- NewOrdersPerAccount: {burst: 600, count: 600, period: 1m, ids: [12345678]}
",
            ),
        ])
        .unwrap();
        let ip = table.names().get("NewRegistrationsPerIPAddress").unwrap();
        let orders = table.names().get("NewOrdersPerAccount").unwrap();
        let hidden = Headers {
            hidden: true,
            measures: Measures::Requests,
        };
        let tokens = Headers {
            hidden: false,
            measures: Measures::Tokens,
        };
        assert_eq!(table.headers(ip), hidden);
        assert_eq!(table.headers(orders), tokens);
        let headers = |name, id| table.policy(name, id).unwrap().behaviour().headers;
        assert_eq!(headers(ip, "10.0.0.1"), hidden);
        assert_eq!(
            headers(ip, "10.0.0.2"),
            hidden,
            "a file override keeps them"
        );
        assert_eq!(headers(orders, "12345678"), tokens);
        // A temporary override keeps the whole behaviour, headers too.
        let raised = Policy::limited(Limit::new(9, 9, SECOND).unwrap());
        let temporary = Policy::overridden_by(table.policy(ip, "10.0.0.1"), raised);
        assert_eq!(temporary.behaviour().headers, hidden);
        // Unnamed in headers, not configured: shown, requests.
        let other = table.names().get("CertificatesPerDomain").unwrap();
        assert_eq!(table.headers(other), Headers::default());
    }
}
