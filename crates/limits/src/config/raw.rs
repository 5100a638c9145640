//! The limits files as written: serde structures that mirror the YAML, with the bounds that
//! hold while parsing (override entries counted, so aliases cannot multiply them). They
//! are turned into validated types by [`super::entries`]; nothing else reads them.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::reservation::RawReservation;
use super::{Behaviour, Headers, Measures, Policy, MAX_OVERRIDE_ENTRIES};
use crate::duration::parse_duration;
use cellrate_core::clock::CalendarPeriod;
use cellrate_core::gcra::Limit;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawName {
    pub(super) number: u32,
    pub(super) format: String,
    #[serde(default)]
    pub(super) description: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    /// Required for GCRA; a calendar limit's burst is its count (absent or equal).
    #[serde(default)]
    pub(super) burst: Option<u64>,
    pub(super) count: u64,
    pub(super) period: String,
    #[serde(default)]
    pub(super) window: RawWindow,
    #[serde(default)]
    pub(super) shadow: bool,
    /// Every spend is recorded, into debt if need be (token and cost budgets).
    #[serde(default)]
    pub(super) overdraw: bool,
    /// A calendar window's IANA time zone (`Europe/Berlin`; UTC when left out).
    #[serde(default)]
    pub(super) timezone: Option<String>,
    /// The day a calendar month (1-31, clamped to the month's last day) or week (1-7,
    /// Monday 1) starts on.
    #[serde(default)]
    pub(super) anchor: Option<u64>,
    /// `visible` (the default) or `hidden`: whether rate-limit headers may show the limit.
    #[serde(default)]
    pub(super) headers: RawVisibility,
    /// `requests` (the default) or `tokens`, for the OpenAI-style headers.
    #[serde(default)]
    pub(super) measures: Measures,
    /// How a native `Check` with a `request_id` holds an estimate of this limit.
    #[serde(default)]
    pub(super) reservation: Option<RawReservation>,
}

/// `headers:` of a limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawVisibility {
    #[default]
    Visible,
    Hidden,
}

/// How a limit counts: `gcra` (the default), `calendar`, or `concurrency` (leases).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawWindow {
    #[default]
    Gcra,
    Calendar,
    Concurrency,
}

impl RawLimit {
    pub(super) fn build(&self) -> Result<Policy, String> {
        let limit = match self.window {
            RawWindow::Gcra if self.timezone.is_some() || self.anchor.is_some() => {
                return Err("timezone and anchor apply to `window: calendar` limits".into())
            }
            RawWindow::Gcra => {
                let period =
                    parse_duration(&self.period).map_err(|e| match self.period.as_str() {
                        "1mo" | "1y" => format!(
                            "period: {e}; a calendar month or year needs `window: calendar` \
                         (count per window, everything back when the next one starts)"
                        ),
                        _ => format!("period: {e}"),
                    })?;
                let burst = self.burst.ok_or(
                    "burst: missing (a GCRA limit needs burst, count and period; \
                     `window: calendar` limits take count and period)",
                )?;
                Limit::new(burst, self.count, period).map_err(|e| e.to_string())?
            }
            RawWindow::Concurrency => self.concurrency()?,
            RawWindow::Calendar => {
                let period = self.calendar_period()?;
                if let Some(burst) = self.burst.filter(|&b| b != self.count) {
                    return Err(format!(
                        "burst {burst}: a calendar window's burst is its count {} \
                         (leave burst out)",
                        self.count
                    ));
                }
                Limit::calendar(self.count, period).map_err(|e| e.to_string())?
            }
        };
        Ok(Policy::Limited {
            limit,
            behaviour: Behaviour {
                shadow: self.shadow,
                overdraw: self.overdraw,
                headers: Headers {
                    hidden: self.headers == RawVisibility::Hidden,
                    measures: self.measures,
                },
            },
        })
    }

    /// A concurrency limit: `count` leases a key, each held at most `period`.
    fn concurrency(&self) -> Result<Limit, String> {
        if self.timezone.is_some() || self.anchor.is_some() || self.overdraw {
            return Err(
                "timezone, anchor and overdraw do not apply to `window: concurrency` \
                 (count leases, each held at most period)"
                    .into(),
            );
        }
        if let Some(burst) = self.burst.filter(|&b| b != self.count) {
            return Err(format!(
                "burst {burst}: a concurrency limit's burst is its count {} (leave burst out)",
                self.count
            ));
        }
        let hold = parse_duration(&self.period).map_err(|e| format!("period: {e}"))?;
        Limit::concurrency(self.count, hold).map_err(|e| e.to_string())
    }

    /// The calendar period of `period`, `timezone` and `anchor`.
    fn calendar_period(&self) -> Result<CalendarPeriod, String> {
        if self.timezone.is_none() && self.anchor.is_none() {
            return CalendarPeriod::parse(&self.period).map_err(|e| {
                format!(
                    "period: {e} (a calendar window is a second, minute, hour, day, ISO \
                     week, month or year; UTC unless `timezone` names a zone)"
                )
            });
        }
        if self.period.contains(['@', '~']) {
            return Err(
                "period: give the zone and anchor either in it or as timezone and \
                        anchor, not both"
                    .into(),
            );
        }
        let anchor = match self.anchor {
            None => None,
            Some(a) => Some(u8::try_from(a).ok().filter(|&a| a > 0).ok_or(format!(
                "anchor {a}: a month's day 1-31 or a week's day 1-7"
            ))?),
        };
        CalendarPeriod::zoned(&self.period, self.timezone.as_deref(), anchor)
    }
}

/// An overrides file's entries, at most [`MAX_OVERRIDE_ENTRIES`] of them.
#[derive(Debug, Default)]
pub(super) struct OverrideEntries(pub(super) Vec<OverrideEntry>);

/// One entry: a map that should hold exactly one limit name, kept as its pairs (a
/// `BTreeMap` would allocate a whole node, over a kilobyte, per entry).
#[derive(Debug)]
pub(super) struct OverrideEntry(pub(super) Vec<(String, RawOverride)>);

impl<'de> Deserialize<'de> for OverrideEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs;
        impl<'de> Visitor<'de> for Pairs {
            type Value = OverrideEntry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from one limit name to its override")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::with_capacity(1);
                while let Some(pair) = map.next_entry()? {
                    if pairs.len() == 16 {
                        return Err(de::Error::custom("an override entry with over 16 keys"));
                    }
                    pairs.push(pair);
                }
                Ok(OverrideEntry(pairs))
            }
        }
        deserializer.deserialize_map(Pairs)
    }
}

impl<'de> Deserialize<'de> for OverrideEntries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = OverrideEntries;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of override entries")
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = seq.next_element()? {
                    if entries.len() == MAX_OVERRIDE_ENTRIES {
                        return Err(de::Error::custom(format!(
                            "more than {MAX_OVERRIDE_ENTRIES} override entries"
                        )));
                    }
                    entries.push(entry);
                }
                Ok(OverrideEntries(entries))
            }
        }
        deserializer.deserialize_seq(Entries)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOverride {
    pub(super) burst: Option<u64>,
    pub(super) count: Option<u64>,
    pub(super) period: Option<String>,
    #[serde(default)]
    pub(super) unlimited: bool,
    #[serde(default)]
    pub(super) deny: bool,
    #[serde(default)]
    pub(super) shadow: bool,
    #[serde(default)]
    pub(super) overdraw: bool,
    #[serde(default)]
    pub(super) window: RawWindow,
    #[serde(default)]
    pub(super) timezone: Option<String>,
    #[serde(default)]
    pub(super) anchor: Option<u64>,
    #[serde(default)]
    pub(super) ids: Vec<IdEntry>,
    /// Refused: how the headers show a limit is its default's (read to say so).
    #[serde(default)]
    pub(super) headers: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    pub(super) measures: Option<serde::de::IgnoredAny>,
    /// Refused: a reservation policy is its name's (read to say so).
    #[serde(default)]
    pub(super) reservation: Option<serde::de::IgnoredAny>,
}

impl RawOverride {
    pub(super) fn policy(&self) -> Result<Policy, String> {
        let numbers = [
            self.burst.is_some(),
            self.count.is_some(),
            self.period.is_some(),
        ];
        if self.headers.is_some() || self.measures.is_some() {
            return Err(
                "headers and measures are the limit's own: set them on its default in \
                 defaults.yaml (an override replaces the numbers only, and is shown or hidden \
                 as its default is)"
                    .to_string(),
            );
        }
        if self.reservation.is_some() {
            return Err(
                "reservation is the limit's own: set it on its default in defaults.yaml \
                 (every override of the name holds estimates as its default says)"
                    .to_string(),
            );
        }
        if self.window != RawWindow::Gcra && (self.unlimited || self.deny) {
            return Err(
                "window applies to a limit (count, period), not to unlimited or deny".to_string(),
            );
        }
        if (self.timezone.is_some() || self.anchor.is_some()) && (self.unlimited || self.deny) {
            return Err(
                "timezone and anchor apply to a calendar limit, not to unlimited or deny".into(),
            );
        }
        if self.overdraw && (self.unlimited || self.deny) {
            return Err(
                "overdraw applies to a limit (burst, count, period), not to unlimited or deny"
                    .to_string(),
            );
        }
        match (self.unlimited, self.deny, numbers) {
            (false, false, [_, true, true]) => RawLimit {
                burst: self.burst,
                count: self.count.unwrap_or_default(),
                period: self.period.clone().unwrap_or_default(),
                window: self.window,
                shadow: self.shadow,
                overdraw: self.overdraw,
                timezone: self.timezone.clone(),
                anchor: self.anchor,
                headers: RawVisibility::Visible,
                measures: Measures::Requests,
                reservation: None,
            }
            .build(),
            _ if self.shadow => Err("shadow applies to a limit, not to unlimited or deny".into()),
            (true, false, [false, false, false]) => Ok(Policy::Unlimited),
            (false, true, [false, false, false]) => Ok(Policy::Denied),
            (true, true, _) => Err("unlimited and deny exclude each other".to_string()),
            (true, false, _) | (false, true, _) => {
                Err("unlimited or deny stands alone: leave out burst, count and period".to_string())
            }
            (false, false, _) => {
                Err("an override needs burst, count and period (or unlimited/deny)".to_string())
            }
        }
    }
}

/// An override id: a plain scalar (the seed's form; numbers allowed, since YAML reads
/// `12345678` as one) or `{id, comment}` (Boulder's current form).
#[derive(Debug)]
pub(super) struct IdEntry {
    pub(super) id: String,
    /// `{id, comment}`'s comment: for people, and reported by admin `Inspect`.
    pub(super) comment: Option<String>,
}

impl<'de> Deserialize<'de> for IdEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<IdEntry, D::Error> {
        struct IdVisitor;

        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Detailed {
            id: IdEntry,
            #[serde(default)]
            comment: Option<String>,
        }

        impl<'de> Visitor<'de> for IdVisitor {
            type Value = IdEntry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an id (string or number) or {id: ..., comment: ...}")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<IdEntry, E> {
                Ok(IdEntry {
                    id: v.to_string(),
                    comment: None,
                })
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<IdEntry, E> {
                Ok(IdEntry {
                    id: v.to_string(),
                    comment: None,
                })
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<IdEntry, E> {
                Ok(IdEntry {
                    id: v.to_string(),
                    comment: None,
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<IdEntry, A::Error> {
                let detailed = Detailed::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(IdEntry {
                    id: detailed.id.id,
                    comment: detailed.comment,
                })
            }
        }

        deserializer.deserialize_any(IdVisitor)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{error, load};
    use crate::config::MAX_OVERRIDE_ENTRIES;

    #[test]
    fn override_entries_are_counted_while_parsing() {
        // More entries than allowed (as aliases could produce): refused while parsing.
        let mut text = String::from("- &o\n  NewOrdersPerAccount: {deny: true, ids: [\"1\"]}\n");
        text.push_str(&"- *o\n".repeat(MAX_OVERRIDE_ENTRIES));
        let errors = load(&[("overrides.yaml", &text)]).unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0]
                .reason
                .contains("more than 500000 override entries"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn bad_headers_and_measures_are_refused_with_file_and_field() {
        let e = error(&[(
            "defaults.yaml",
            "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s, headers: secret}",
        )]);
        assert!(e.starts_with("defaults.yaml: "), "{e}");
        assert!(e.contains("headers") && e.contains("`hidden`"), "{e}");
        let e = error(&[(
            "defaults.yaml",
            "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s, measures: bytes}",
        )]);
        assert!(e.contains("measures") && e.contains("`tokens`"), "{e}");
        let e = error(&[
            (
                "defaults.yaml",
                "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s}",
            ),
            (
                "overrides.yaml",
                "- NewOrdersPerAccount: {burst: 2, count: 2, period: 1s, headers: hidden, ids: [1]}",
            ),
        ]);
        assert!(
            e.starts_with("overrides.yaml: entry 1 (NewOrdersPerAccount): headers and measures"),
            "{e}"
        );
    }
}
