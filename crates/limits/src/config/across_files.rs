//! What is wrong only when the files are taken together: an override that counts
//! otherwise than its default (GCRA, calendar windows, concurrency), a name `quota.yaml`
//! cannot assign, a descriptor rule that does not fit its limits' kind, a domain in both
//! formats.

use super::{short, ConfigError, LimitTable, Policy};
use cellrate_core::gcra::Window;

impl LimitTable {
    /// Why an override (from a file, or temporary) cannot count as `policy` does: its
    /// name's default counts the other way (GCRA against calendar windows), or the name
    /// is used in `quota.yaml` and `policy` counts in calendar windows. An override
    /// without `window` on a calendar default would otherwise silently become a
    /// refilling rate.
    pub fn window_mismatch(&self, number: u32, policy: &Policy) -> Option<String> {
        let Policy::Limited { limit: over, .. } = policy else {
            return None;
        };
        if let (Window::Calendar(_) | Window::Concurrency, Some(name)) =
            (over.window(), self.names.by_number(number))
        {
            if self.quota.names().any(|used| used == &*name.text) {
                return Some(format!(
                    "{} is used in quota.yaml, and RLQS cannot assign calendar windows \
                     or concurrency limits",
                    name.text
                ));
            }
        }
        let Some(Policy::Limited { limit, .. }) = self.policies.get(&number)?.default else {
            return None;
        };
        match (limit.window(), over.window()) {
            (Window::Calendar(period), Window::Gcra) => Some(format!(
                "the default counts in calendar windows ({period}): an override counts the \
                 same way (add `window: calendar`)"
            )),
            (Window::Gcra, Window::Calendar(_)) => Some(
                "the default counts by GCRA: an override counts the same way \
                 (leave out `window: calendar`, or make the default a calendar limit)"
                    .to_string(),
            ),
            (Window::Concurrency, w) | (w, Window::Concurrency) if w != Window::Concurrency => {
                Some(
                    "a concurrency limit's overrides are concurrency limits, and a rate's are \
                     rates (`window: concurrency` on both, or on neither)"
                        .to_string(),
                )
            }
            _ => None,
        }
    }

    /// What is wrong only when the files are taken together: a domain in both
    /// `descriptors.yaml` and envoyproxy/ratelimit's format, a calendar limit in
    /// `quota.yaml`.
    pub(super) fn across_files(&self) -> Vec<ConfigError> {
        let mut errors: Vec<ConfigError> = self
            .ratelimit
            .domains()
            .filter(|domain| self.descriptors.has_domain(domain))
            .map(|domain| ConfigError {
                file: "descriptors.yaml".to_string(),
                entry: Some(short(domain)),
                reason: "this domain is also configured in envoyproxy/ratelimit's format: \
                         one file decides a domain"
                    .to_string(),
            })
            .collect();
        errors.sort_by(|a, b| a.entry.cmp(&b.entry));
        errors.extend(self.lease_rule_errors());
        for (name, reason) in self.calendar_quota_names() {
            errors.push(ConfigError {
                file: "quota.yaml".to_string(),
                entry: Some(name),
                reason,
            });
        }
        errors
    }

    /// Descriptor rules that do not fit their limits: a rule with a `lease` entry maps only
    /// to concurrency limits, and a concurrency limit only through such a rule (a spend of
    /// it would be refused on every request).
    fn lease_rule_errors(&self) -> Vec<ConfigError> {
        let concurrency = |text: &str| {
            let number = self.names.get(text).map(|n| n.number);
            let policies = number.and_then(|n| self.policies.get(&n));
            policies.is_some_and(|p| {
                (p.default.iter())
                    .chain(p.overrides.values().map(|(policy, _)| policy))
                    .any(|policy| policy.window() == Window::Concurrency)
            })
        };
        let mut errors = Vec::new();
        for (domain, rule, names, lease) in self.descriptors.rules() {
            let Some(wrong) = names.iter().find(|n| concurrency(n) != lease) else {
                continue;
            };
            errors.push(ConfigError {
                file: "descriptors.yaml".to_string(),
                entry: Some(format!("{} rule {rule}", short(domain))),
                reason: match lease {
                    true => format!(
                        "{wrong} is not a concurrency limit (window: concurrency), \
                         and this rule has a lease entry"
                    ),
                    false => format!(
                        "{wrong} is a concurrency limit: name the entry that carries the \
                         lease id (`lease: KEY`, e.g. the request's x-request-id)"
                    ),
                },
            });
        }
        errors.sort_by(|a, b| a.entry.cmp(&b.entry));
        errors
    }

    /// Why `quota.yaml` cannot use a name: a limit of it counts in calendar windows or is a
    /// concurrency limit, which an RLQS token-bucket assignment cannot express.
    fn calendar_quota_names(&self) -> Vec<(String, String)> {
        let mut found = Vec::new();
        for text in self.quota.names() {
            let Some(name) = self.names.get(text) else {
                continue;
            };
            let Some(policies) = self.policies.get(&name.number) else {
                continue;
            };
            let calendar = policies
                .default
                .iter()
                .chain(policies.overrides.values().map(|(policy, _)| policy))
                .any(|policy| matches!(policy.window(), Window::Calendar(_)));
            let concurrency = policies
                .default
                .iter()
                .chain(policies.overrides.values().map(|(policy, _)| policy))
                .any(|policy| policy.window() == Window::Concurrency);
            if (calendar || concurrency) && !found.iter().any(|(t, _)| t == text) {
                found.push((
                    text.to_string(),
                    if concurrency {
                        "is a concurrency limit, which RLQS cannot assign (Envoy's quota \
                         buckets refill as token buckets): use it through Check"
                    } else {
                        "counts in calendar windows, which RLQS cannot assign (Envoy's \
                         quota buckets refill as token buckets): use it through ShouldRateLimit"
                    }
                    .to_string(),
                ));
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{error, load};
    use cellrate_core::clock::SECOND;

    #[test]
    fn calendar_windows_load_with_their_kind_and_bad_ones_are_refused() {
        use cellrate_core::clock::CalendarPeriod;
        use cellrate_core::gcra::Window;
        let names = ("names.yaml", "Monthly: {number: 150, format: string}");
        let table = load(&[
            names,
            (
                "defaults.yaml",
                "Monthly: {window: calendar, count: 1000000, period: 1mo}",
            ),
            (
                "overrides.yaml",
                "- Monthly: {window: calendar, count: 5, burst: 5, period: 1d, ids: [small]}\n\
                 - Monthly: {window: calendar, count: 7, period: 1mo, timezone: America/New_York, \
                   anchor: 15, ids: [billed]}\n\
                 - Monthly: {window: calendar, count: 3, period: 1w, timezone: Europe/Berlin, \
                   ids: [weekly]}\n",
            ),
        ])
        .unwrap();
        let monthly = table.names().get("Monthly").unwrap();
        let limit = |id| match table.policy(monthly, id) {
            Some(Policy::Limited { limit, .. }) => limit,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            limit("any").window(),
            Window::Calendar(CalendarPeriod::Month)
        );
        assert_eq!(limit("any").count(), 1_000_000);
        assert_eq!(
            limit("small").window(),
            Window::Calendar(CalendarPeriod::Day)
        );
        assert_eq!(limit("small").burst(), 5);
        for (id, text) in [
            ("billed", "1mo~15@America/New_York"),
            ("weekly", "1w@Europe/Berlin"),
        ] {
            match limit(id).window() {
                Window::Calendar(period) => assert_eq!(period.text(), text),
                other => panic!("{other:?}"),
            }
        }

        let defaults = |text| error(&[names, ("defaults.yaml", text)]);
        for (text, says) in [
            (
                "Monthly: {burst: 10, count: 10, period: 1mo}",
                "needs `window: calendar`",
            ),
            (
                "Monthly: {burst: 10, count: 10, period: 1y}",
                "needs `window: calendar`",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 2d}",
                "no calendar period",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 2w}",
                "one of 1s, 1m, 1h, 1d, 1w, 1mo, 1y",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 1mo, timezone: Europe/Berln}",
                "timezone \"Europe/Berln\": no IANA time zone",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 1h, timezone: Asia/Tokyo}",
                "a time zone or anchor applies to a day",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 1mo, anchor: 300}",
                "anchor 300",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 1mo, anchor: 0}",
                "anchor 0",
            ),
            (
                "Monthly: {count: 10, burst: 10, period: 1d, timezone: Asia/Tokyo}",
                "apply to `window: calendar` limits",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 1mo@UTC, anchor: 3}",
                "not both",
            ),
            (
                "Monthly: {window: calendar, count: 10, burst: 20, period: 1d}",
                "burst 20",
            ),
            ("Monthly: {window: calendar, count: 0, period: 1d}", "count"),
            (
                "Monthly: {window: calender, count: 10, period: 1d}",
                "unknown variant",
            ),
            ("Monthly: {count: 10, period: 1d}", "burst: missing"),
            (
                "Monthly: {window: calendar, count: 9007199254740993, period: 1d}",
                "too large",
            ),
        ] {
            let e = defaults(text);
            assert!(e.contains(says), "{text}: {e}");
            assert!(e.contains("Monthly"), "{text}: {e}");
        }

        // An override counts as its default does; unlimited and deny take no window.
        let calendar = (
            "defaults.yaml",
            "Monthly: {window: calendar, count: 10, period: 1mo}",
        );
        let gcra = (
            "defaults.yaml",
            "Monthly: {burst: 10, count: 10, period: 1d}",
        );
        for (default, over, says) in [
            (
                calendar,
                "{burst: 5, count: 5, period: 1d, ids: [a]}",
                "add `window: calendar`",
            ),
            (
                gcra,
                "{window: calendar, count: 5, period: 1d, ids: [a]}",
                "counts by GCRA",
            ),
            (
                calendar,
                "{window: calendar, unlimited: true, ids: [a]}",
                "not to unlimited",
            ),
        ] {
            let e = error(&[
                names,
                default,
                ("overrides.yaml", &format!("- Monthly: {over}")),
            ]);
            assert!(e.contains(says), "{over}: {e}");
            assert!(e.contains("entry 1 (Monthly)"), "{over}: {e}");
        }

        // RLQS assigns refilling rates: quota.yaml cannot use a calendar limit.
        let e = error(&[
            names,
            calendar,
            (
                "quota.yaml",
                "edge:\n  - match: [{key: tenant}]\n    limits: [Monthly]\n",
            ),
        ]);
        assert!(
            e.contains("quota.yaml: Monthly: counts in calendar windows"),
            "{e}"
        );
    }

    /// `window: concurrency` loads as a concurrency limit (count leases, period the hold);
    /// what does not apply to leases, and an override of another kind, are refused.
    #[test]
    fn concurrency_limits_load_and_bad_ones_are_refused() {
        use cellrate_core::gcra::Window;
        let names = ("names.yaml", "InFlight: {number: 150, format: string}");
        let table = load(&[
            names,
            (
                "defaults.yaml",
                "InFlight: {window: concurrency, count: 8, period: 30s}",
            ),
            (
                "overrides.yaml",
                "- InFlight: {window: concurrency, count: 32, period: 2m, ids: [big]}\n",
            ),
        ])
        .unwrap();
        let name = table.names().get("InFlight").unwrap();
        for (id, count, hold) in [("any", 8, 30), ("big", 32, 120)] {
            match table.policy(name, id) {
                Some(Policy::Limited { limit, .. }) => {
                    assert_eq!(limit.window(), Window::Concurrency);
                    assert_eq!((limit.count(), limit.period()), (count, hold * SECOND));
                }
                other => panic!("{other:?}"),
            }
        }
        let defaults = |text: &str| error(&[names, ("defaults.yaml", text)]);
        for (text, says) in [
            (
                "{window: concurrency, count: 8, burst: 9, period: 30s}",
                "burst 9",
            ),
            (
                "{window: concurrency, count: 8, period: 30s, overdraw: true}",
                "overdraw",
            ),
            (
                "{window: concurrency, count: 10001, period: 30s}",
                "at most 10000 leases",
            ),
            ("{window: concurrency, count: 8, period: 2d}", "hold"),
            ("{window: concurrency, count: 8, period: 0s}", "period"),
        ] {
            let e = defaults(&format!("InFlight: {text}"));
            assert!(e.contains(says), "{text}: {e}");
        }
        let e = error(&[
            names,
            (
                "defaults.yaml",
                "InFlight: {window: concurrency, count: 8, period: 30s}",
            ),
            (
                "overrides.yaml",
                "- InFlight: {burst: 5, count: 5, period: 1s, ids: [x]}\n",
            ),
        ]);
        assert!(e.contains("a concurrency limit's overrides"), "{e}");
        let e = error(&[
            names,
            (
                "defaults.yaml",
                "InFlight: {window: concurrency, count: 8, period: 30s}",
            ),
            (
                "quota.yaml",
                "edge:\n  - match: [{key: tenant}]\n    limits: [InFlight]\n",
            ),
        ]);
        assert!(
            e.contains("InFlight: is a concurrency limit, which RLQS"),
            "{e}"
        );
    }
}
