//! The native API's messages to and from the domain: request items into [`ItemSpec`]s
//! (saying which item and field is wrong), inline limits, durations, and decisions back
//! into protobuf.

use std::borrow::Cow;

use tonic::Status;

use crate::proto::v1 as pb;
use crate::service::headers::{self, HeaderStyle};
use crate::service::overrides::calendar_of;
use crate::service::{BatchResult, ItemResult, ItemSpec, Rule, Target};
use cellrate_core::clock::{Nanos, SECOND};
use cellrate_core::gcra::{Decision, Limit, Mode, Window};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    Check,
    Refund,
    Admin,
}

pub(super) fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

/// The header style a Check asks for; a value the enum does not list is INVALID_ARGUMENT.
pub(crate) fn header_style(value: i32) -> Result<HeaderStyle, Status> {
    Ok(match pb::HeaderStyle::try_from(value) {
        Ok(pb::HeaderStyle::None) => HeaderStyle::Off,
        Ok(pb::HeaderStyle::Draft03) => HeaderStyle::Draft03,
        Ok(pb::HeaderStyle::Ietf) => HeaderStyle::Ietf,
        Ok(pb::HeaderStyle::Ratelimit) => HeaderStyle::Ratelimit,
        Ok(pb::HeaderStyle::Openai) => HeaderStyle::Openai,
        Err(_) => {
            return Err(invalid(format!(
                "headers: {value} is not a HeaderStyle (0 NONE, 1 DRAFT03, 2 IETF, 3 RATELIMIT, \
                 4 OPENAI)"
            )))
        }
    })
}

/// The headers of `style` for a Check's answer (none, without a word of work, for Off).
pub(crate) fn check_headers(style: HeaderStyle, result: &BatchResult) -> Vec<pb::Header> {
    headers::for_items(style, &result.items)
        .into_iter()
        .map(|h| pb::Header {
            name: h.name,
            value: h.value,
        })
        .collect()
}

/// Converts request items, saying which item and field is wrong.
pub(crate) fn item_specs(items: &[pb::Item], usage: Use) -> Result<Vec<ItemSpec<'_>>, Status> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| item_spec(i, item, usage))
        .collect()
}

fn item_spec(i: usize, item: &pb::Item, usage: Use) -> Result<ItemSpec<'_>, Status> {
    let target = match (&item.inline, item.name.is_empty()) {
        (Some(_), false) => {
            return Err(invalid(format!(
                "items[{i}]: give either name and id, or inline, not both"
            )))
        }
        (None, true) => {
            return Err(invalid(format!(
                "items[{i}].name: empty (give name and id, or inline)"
            )))
        }
        (None, false) => Target::Named {
            name: Cow::Borrowed(&item.name),
            id: Cow::Borrowed(&item.id),
        },
        (Some(inline), true) => {
            if !item.id.is_empty() {
                return Err(invalid(format!(
                    "items[{i}].id: an inline limit takes inline.key, not id"
                )));
            }
            let limit = inline_limit(i, inline)?;
            Target::Inline {
                key: Cow::Borrowed(&inline.key),
                limit,
            }
        }
    };
    let mode: Mode = pb::Mode::try_from(item.mode)
        .map_err(|_| invalid(format!("items[{i}].mode: unknown mode {}", item.mode)))?
        .into();
    match usage {
        Use::Check => {}
        Use::Refund if mode != Mode::CheckAndSpend => {
            return Err(invalid(format!(
                "items[{i}].mode: Refund takes no mode (leave it unset)"
            )))
        }
        Use::Refund => {}
        Use::Admin if mode != Mode::CheckAndSpend || item.cost.is_some() => {
            return Err(invalid(format!(
                "items[{i}]: Reset and Inspect take no cost or mode (leave them unset)"
            )))
        }
        Use::Admin => {}
    }
    Ok(ItemSpec {
        target,
        cost: item.cost,
        mode,
        limit: None,
        lease: (!item.lease_id.is_empty()).then_some(Cow::Borrowed(item.lease_id.as_str())),
    })
}

/// A protobuf duration as nanoseconds; `None` if negative or out of range.
pub(super) fn duration_nanos(d: &prost_types::Duration) -> Option<Nanos> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return None;
    }
    d.seconds
        .checked_mul(SECOND)?
        .checked_add(i64::from(d.nanos))
}

/// Nanoseconds as a protobuf duration.
pub fn duration(nanos: Nanos) -> prost_types::Duration {
    prost_types::Duration {
        seconds: nanos.div_euclid(SECOND),
        nanos: nanos.rem_euclid(SECOND) as i32,
    }
}

fn limit_info(item: &ItemResult) -> Option<pb::LimitInfo> {
    let limit = match item.rule {
        Rule::Limited(limit) => Some(limit),
        _ => None,
    };
    Some(pb::LimitInfo {
        name: item.name.to_string(),
        burst: limit.map_or(0, |l| l.burst()),
        count: limit.map_or(0, |l| l.count()),
        period: limit.map(|l| duration(l.period())),
        key: item.key.to_string(),
        calendar: match limit.map(|l| l.window()) {
            Some(Window::Calendar(period)) => Some(period.text().to_string()),
            _ => None,
        },
        concurrency: limit
            .is_some_and(|l| l.window() == Window::Concurrency)
            .then_some(true),
    })
}

/// An inline limit's numbers: burst, count and period, or count and a calendar window.
fn inline_limit(i: usize, inline: &pb::InlineLimit) -> Result<Limit, Status> {
    let calendar =
        calendar_of(&inline.calendar).map_err(|e| invalid(format!("items[{i}].inline.{e}")))?;
    let period = match (&inline.period, calendar) {
        (Some(_), Some(_)) => {
            return Err(invalid(format!(
                "items[{i}].inline.period: a calendar limit takes no period (its window is it)"
            )))
        }
        (None, Some(_)) => None,
        (None, None) => return Err(invalid(format!("items[{i}].inline.period: missing"))),
        (Some(d), None) => Some(
            duration_nanos(d)
                .ok_or_else(|| invalid(format!("items[{i}].inline.period: out of range")))?,
        ),
    };
    let limit = match (period, calendar) {
        (Some(period), _) => Limit::new(inline.burst, inline.count, period),
        (None, Some(calendar)) if inline.burst == 0 || inline.burst == inline.count => {
            Limit::calendar(inline.count, calendar)
        }
        (None, _) => {
            return Err(invalid(format!(
                "items[{i}].inline.burst: {} is not the calendar window's count {} (leave it 0)",
                inline.burst, inline.count
            )))
        }
    };
    limit.map_err(|e| invalid(format!("items[{i}].inline: {e}")))
}

fn policy(rule: Rule) -> pb::Policy {
    match rule {
        // A zero limit (envoyproxy/ratelimit's format, Envoy's path only) is a limit.
        Rule::Limited(_) | Rule::Zero(_) => pb::Policy::Limited,
        Rule::Unlimited => pb::Policy::Unlimited,
        Rule::Denied | Rule::InvalidId { deny: true } => pb::Policy::Denied,
        // Never reached: the native API rejects invalid ids.
        Rule::InvalidId { deny: false } => pb::Policy::NotConfigured,
        Rule::NotConfigured => pb::Policy::NotConfigured,
    }
}

fn decision(d: &Decision, limit: Option<pb::LimitInfo>, rule: pb::Policy) -> pb::Decision {
    pb::Decision {
        allowed: d.allowed,
        remaining: d.remaining,
        retry_after: Some(duration(d.retry_in)),
        reset_after: Some(duration(d.reset_in)),
        limit,
        policy: rule as i32,
        source: None,
    }
}

/// The overall and per-item decisions of a batch.
pub(crate) fn decisions(result: &BatchResult) -> (pb::Decision, Vec<pb::Decision>) {
    let items = result
        .items
        .iter()
        .map(|item| decision(&item.decision, limit_info(item), policy(item.rule)))
        .collect();
    let overall = match result.overall_item {
        Some(i) => {
            let item = &result.items[i];
            decision(&result.overall, limit_info(item), policy(item.rule))
        }
        None => {
            // Nothing restricted the batch: say why (an allow-listed item, or no limit).
            let rule = if result.items.iter().any(|i| i.rule == Rule::Unlimited) {
                pb::Policy::Unlimited
            } else {
                pb::Policy::NotConfigured
            };
            decision(&result.overall, None, rule)
        }
    };
    (overall, items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip_and_reject_negatives() {
        let d = duration(1_500_000_000);
        assert_eq!((d.seconds, d.nanos), (1, 500_000_000));
        assert_eq!(duration_nanos(&d), Some(1_500_000_000));
        let negative = prost_types::Duration {
            seconds: -1,
            nanos: 0,
        };
        assert_eq!(duration_nanos(&negative), None);
        let huge = prost_types::Duration {
            seconds: i64::MAX,
            nanos: 0,
        };
        assert_eq!(duration_nanos(&huge), None);
    }
}
