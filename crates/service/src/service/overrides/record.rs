//! An override in numbers and as a shared record: the policy its numbers give ([`policy_of`],
//! [`calendar_of`], as `SetOverride` and a record read back check them), the JSON record
//! written to the shared table, and a record read back checked as a request is (see
//! [`super::RuntimeOverrides`]). A ratelimit-format bucket's record carries its limit's
//! label, number 99 and the bucket's readable name; its window is the limit's unit, so a
//! count a window is written as the count alone.

use serde::{Deserialize, Serialize};

use super::ratelimit::{ratelimit_policy, ratelimit_slot};
use super::{RuntimeOverride, Slot, MAX_AUTHOR, MAX_COMMENT};
use crate::service::ratelimit_bucket::RatelimitShape;
use cellrate_core::clock::{CalendarPeriod, Nanos};
use cellrate_core::gcra::{Limit, Window};
use cellrate_limits::config::{LimitTable, Policy};
use cellrate_limits::names::RATELIMIT_NUMBER;

/// Longest shared record read back (bytes): anything longer is no record of ours.
pub const MAX_RECORD: usize = 4096;

/// A shared override as stored (JSON): what `RuntimeOverride` holds but its expiry.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    name: String,
    number: u32,
    id: String,
    #[serde(default)]
    burst: u64,
    #[serde(default)]
    count: u64,
    #[serde(default)]
    period_ns: Nanos,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    deny: bool,
    #[serde(default)]
    comment: String,
    #[serde(default)]
    author: String,
    /// A calendar override's window; left out otherwise, so that GCRA records read the
    /// same in older versions.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    calendar: String,
}

/// The policy that `burst`, `count`, `period`, `unlimited` and `deny` give: exactly one of
/// a limit, unlimited or deny. With `calendar`, the limit counts `count` per calendar
/// window: no period, and a burst of 0 or `count`.
pub fn policy_of(
    burst: u64,
    count: u64,
    period: Option<Nanos>,
    unlimited: bool,
    deny: bool,
    calendar: Option<CalendarPeriod>,
) -> Result<Policy, String> {
    let limited = Policy::limited;
    match (unlimited, deny, period, calendar) {
        (true, false, None, None) if burst == 0 && count == 0 => Ok(Policy::Unlimited),
        (false, true, None, None) if burst == 0 && count == 0 => Ok(Policy::Denied),
        (false, false, Some(period), None) => Limit::new(burst, count, period)
            .map(limited)
            .map_err(|e| format!("burst, count, period: {e}")),
        (false, false, None, Some(calendar)) if burst == 0 || burst == count => {
            Limit::calendar(count, calendar)
                .map(limited)
                .map_err(|e| format!("count, calendar: {e}"))
        }
        (false, false, None, Some(_)) => Err(format!(
            "burst {burst}: a calendar window's burst is its count {count} (leave burst 0)"
        )),
        _ => Err(
            "give exactly one of: burst, count and period; count and calendar; \
                  unlimited; deny"
                .to_string(),
        ),
    }
}

/// The calendar window a request or record names (`""`: none).
pub fn calendar_of(text: &str) -> Result<Option<CalendarPeriod>, String> {
    match text {
        "" => Ok(None),
        text => CalendarPeriod::parse(text)
            .map(Some)
            .map_err(|e| format!("calendar: {e}")),
    }
}

/// The shared record of an override of `id` under the name (or label) `name` of `number`.
pub(super) fn record_of(
    name: &str,
    number: u32,
    id: &str,
    policy: Policy,
    comment: &str,
    author: &str,
) -> String {
    let mut record = Record {
        name: name.to_string(),
        number,
        id: id.to_string(),
        burst: 0,
        count: 0,
        period_ns: 0,
        unlimited: false,
        deny: false,
        comment: comment.to_string(),
        author: author.to_string(),
        calendar: String::new(),
    };
    match policy {
        Policy::Limited { limit, .. } => match limit.window() {
            // A temporary override has no way to name a concurrency limit (its numbers are
            // a rate's or a calendar window's), so none is ever recorded as one.
            Window::Gcra | Window::Concurrency => {
                record.burst = limit.burst();
                record.count = limit.count();
                record.period_ns = limit.period();
            }
            // A ratelimit-format limit's window is its unit's, which may have no text here.
            Window::Calendar(_) if number == RATELIMIT_NUMBER => record.count = limit.count(),
            Window::Calendar(period) => {
                record.count = limit.count();
                record.calendar = period.text().to_string();
            }
        },
        Policy::Unlimited => record.unlimited = true,
        Policy::Denied => record.deny = true,
    }
    serde_json::to_string(&record).unwrap_or_default()
}

/// A shared entry read back, checked as `SetOverride` checks a request: `None` for a name
/// (or a ratelimit-format bucket) this replica does not know; an error for anything that is
/// no override of ours.
pub(super) fn parse_record(
    table: &LimitTable,
    shape: RatelimitShape,
    field: &str,
    record: &str,
) -> Result<Option<(Slot, RuntimeOverride)>, String> {
    if record.len() > MAX_RECORD {
        return Err(format!("longer than {MAX_RECORD} bytes"));
    }
    let r: Record = serde_json::from_str(record).map_err(|e| format!("not a record: {e}"))?;
    if field != format!("{}:{}", r.number, r.id) {
        return Err("its field is not <number>:<id> of its record".to_string());
    }
    let (slot, name, policy) = match r.number {
        RATELIMIT_NUMBER => {
            let Ok(Some(slot)) = ratelimit_slot(table, shape, &r.name, &r.id) else {
                return Ok(None);
            };
            if slot.id != r.id {
                return Err(format!("id {:?} is not canonical", shown(&r.id)));
            }
            let calendar = calendar_of(&r.calendar)?;
            let numbers = (r.burst, r.count, (r.period_ns != 0).then_some(r.period_ns));
            let policy = ratelimit_policy(&slot, numbers, r.unlimited, r.deny, calendar)?;
            (Slot::Ratelimit(slot.bucket), slot.label, policy)
        }
        _ => {
            let Some(name) = table.names().get(&r.name) else {
                return Ok(None);
            };
            if name.number != r.number {
                return Err(format!(
                    "{} is number {} here, not {}",
                    name.text, name.number, r.number
                ));
            }
            let format = name.format.override_format();
            match format.canonicalize_cow(&r.id) {
                Ok(canonical) if canonical == r.id => {}
                Ok(_) => return Err(format!("id {:?} is not canonical", shown(&r.id))),
                Err(e) => return Err(format!("id: {e} (format {format})")),
            }
            let calendar = calendar_of(&r.calendar)?;
            let period = (!r.unlimited && !r.deny && calendar.is_none()).then_some(r.period_ns);
            let policy = policy_of(r.burst, r.count, period, r.unlimited, r.deny, calendar)?;
            (Slot::Named(name.number), name.text.clone(), policy)
        }
    };
    bounded(&r.comment, MAX_COMMENT, "comment")?;
    bounded(&r.author, MAX_AUTHOR, "author")?;
    Ok(Some((
        slot,
        RuntimeOverride {
            name,
            id: r.id.into_boxed_str(),
            policy,
            expires_at: 0,
            comment: r.comment,
            author: r.author,
        },
    )))
}

/// At most 80 characters of `text`, for messages.
pub(super) fn shown(text: &str) -> String {
    text.chars().take(80).collect()
}

pub(super) fn bounded<'a>(text: &'a str, max: usize, field: &str) -> Result<&'a str, String> {
    if text.chars().count() > max {
        return Err(format!("{field}: longer than {max} characters"));
    }
    // Shown in logs and in operators' terminals: what would act there is refused here.
    if let Some((at, c)) = cellrate_core::text::first_unprintable(text) {
        return Err(format!(
            "{field}: U+{:04X} at byte {at} is a control or format character (not allowed)",
            c as u32
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::SECOND;

    #[test]
    fn comments_and_authors_refuse_what_would_act_on_a_terminal() {
        assert_eq!(bounded("fine, é 日本", 100, "comment"), Ok("fine, é 日本"));
        for (text, code) in [
            ("a\0b", "U+0000 at byte 1"),
            ("\x1b]52;c;x\x07", "U+001B at byte 0"),
            ("two\nlines", "U+000A at byte 3"),
            ("ad\u{200b}min", "U+200B at byte 2"),
            ("\u{2028}", "U+2028 at byte 0"),
        ] {
            let e = bounded(text, 100, "author").unwrap_err();
            assert!(e.starts_with("author: ") && e.contains(code), "{e}");
        }
    }

    #[test]
    fn shared_records_read_back_only_when_they_are_overrides_of_ours() {
        let table = LimitTable::from_files(&[]).unwrap();
        let shape = RatelimitShape::default();
        let orders = table.names().get("NewOrdersPerAccount").unwrap();
        let limit = Limit::new(5, 10, 60 * SECOND).unwrap();
        let policies = [
            Policy::limited(limit),
            Policy::limited(Limit::calendar(1000, CalendarPeriod::Month).unwrap()),
            Policy::Unlimited,
            Policy::Denied,
        ];
        for policy in policies {
            let record = record_of(&orders.text, orders.number, "42", policy, "ticket 7", "ops");
            // A GCRA record reads the same as before calendar windows existed.
            assert_eq!(
                record.contains("calendar"),
                policy.window() != Window::Gcra,
                "{record}"
            );
            let field = format!("{}:42", orders.number);
            let (slot, read) = parse_record(&table, shape, &field, &record)
                .unwrap()
                .unwrap();
            assert_eq!(slot, Slot::Named(orders.number));
            assert_eq!(
                (read.policy, &*read.id, &*read.comment, &*read.author),
                (policy, "42", "ticket 7", "ops")
            );
        }
        let record_of = |id, policy| record_of(&orders.text, orders.number, id, policy, "", "");
        let good = record_of("42", Policy::Denied);
        let n = orders.number;
        let bad =
            |field: &str, record: &str| parse_record(&table, shape, field, record).unwrap_err();
        assert!(bad(&format!("{n}:43"), &good).contains("field"));
        assert!(bad(&format!("{n}:42"), "{").contains("not a record"));
        assert!(bad(&format!("{n}:42"), &"x".repeat(MAX_RECORD + 1)).contains("longer"));
        let twice = good.replace("\"unlimited\":false", "\"unlimited\":true");
        assert!(bad(&format!("{n}:42"), &twice).contains("exactly one"));
        let padded = good.replace("\"id\":\"42\"", "\"id\":\"042\"");
        assert!(bad(&format!("{n}:042"), &padded).contains("canonical"));
        let fortnightly = record_of("42", policies[1]).replace("1mo", "2w");
        assert!(bad(&format!("{n}:42"), &fortnightly).contains("calendar"));
        let unzoned = record_of("42", policies[1]).replace("1mo", "1mo@Mars/Base");
        assert!(bad(&format!("{n}:42"), &unzoned).contains("no IANA time zone"));
        let renumbered = good.replace(&format!("\"number\":{n}"), "\"number\":999");
        assert!(bad("999:42", &renumbered).contains("number"));
        let long = good.replace(
            "\"comment\":\"\"",
            &format!("\"comment\":\"{}\"", "c".repeat(201)),
        );
        assert!(bad(&format!("{n}:42"), &long).contains("comment"));
        // A name this replica does not know is kept out quietly.
        let other = good.replace("NewOrdersPerAccount", "NotHere");
        assert_eq!(
            parse_record(&table, shape, &format!("{n}:42"), &other).unwrap(),
            None
        );
    }

    #[test]
    fn a_ratelimit_buckets_record_reads_back_into_its_bucket_here() {
        let config = "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: week, requests_per_unit: 5}\n";
        let table = LimitTable::from_files(&[("rl.yaml".into(), config.into())]).unwrap();
        let shape = RatelimitShape::default();
        let slot = ratelimit_slot(&table, shape, "rl.user", "rl/user=a%2Fb")
            .unwrap()
            .unwrap();
        let weekly = Policy::limited(Limit::calendar(9, CalendarPeriod::Week).unwrap());
        let field = "99:rl/user=a%2Fb";
        for policy in [weekly, Policy::Denied, Policy::Unlimited] {
            let record = record_of("rl.user", RATELIMIT_NUMBER, &slot.id, policy, "t", "ops");
            // A week has no calendar text: the count alone, in the limit's unit.
            assert!(!record.contains("calendar"), "{record}");
            let (read_slot, read) = parse_record(&table, shape, field, &record)
                .unwrap()
                .unwrap();
            assert_eq!(read_slot, Slot::Ratelimit(slot.bucket.clone()));
            assert_eq!(
                (read.policy, &*read.name, &*read.id),
                (policy, "rl.user", field.get(3..).unwrap())
            );
        }
        let good = record_of("rl.user", RATELIMIT_NUMBER, &slot.id, weekly, "", "");
        // A bucket this replica does not configure is kept out quietly.
        let elsewhere = good.replace("rl.user", "other.user");
        assert_eq!(
            parse_record(&table, shape, field, &elsewhere).unwrap(),
            None
        );
        // GCRA numbers do not fit a limit counted in fixed windows.
        let gcra = good
            .replace("\"period_ns\":0", "\"period_ns\":1000000000")
            .replace("\"burst\":0", "\"burst\":9");
        let e = parse_record(&table, shape, field, &gcra).unwrap_err();
        assert!(e.contains("fixed windows"), "{e}");
    }
}
