//! A descriptor's status in Envoy's answer (its strictest visible limit) and
//! envoyproxy/ratelimit's three fields, made from the status closest to its limit. The
//! native `Check` takes each item as a descriptor of its own.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf as pbw;

use super::Header;
use super::{ceil_seconds, enforced_denial, header, restricts, strictest, until_reset, visible};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;

use crate::service::{ItemResult, Rule};
use cellrate_core::clock::{CalendarPeriod, Nanos, ZonedUnit, SECOND};
use cellrate_core::gcra::{Limit, Window};

/// How `duration_until_reset` is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ResetStyle {
    /// To the nanosecond: until the bucket is full (allowed) or the cost passes (denied).
    #[default]
    Exact,
    /// The same time in whole seconds, rounded up: for a fixed window, the seconds left
    /// in it as envoyproxy/ratelimit computes them (`unit - now % unit`).
    WholeSeconds,
}

/// The names of the three headers of [`super::HeaderStyle::Ratelimit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> HeaderNames {
        HeaderNames {
            limit: "RateLimit-Limit".to_string(),
            remaining: "RateLimit-Remaining".to_string(),
            reset: "RateLimit-Reset".to_string(),
        }
    }
}

/// `LIMIT,REMAINING,RESET`, as `--ratelimit-header-names` takes them.
impl std::fmt::Display for HeaderNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{},{},{}", self.limit, self.remaining, self.reset)
    }
}

/// Unit lengths as envoyproxy/ratelimit counts them (a month is 30 days, a year 365).
const UNITS: [(Unit, Nanos); 7] = [
    (Unit::Second, SECOND),
    (Unit::Minute, 60 * SECOND),
    (Unit::Hour, 3_600 * SECOND),
    (Unit::Day, 86_400 * SECOND),
    (Unit::Week, 7 * 86_400 * SECOND),
    (Unit::Month, 30 * 86_400 * SECOND),
    (Unit::Year, 365 * 86_400 * SECOND),
];

/// `count` per `period` as Envoy's `requests_per_unit` per `unit`: the smallest unit at
/// least as long as the period, with the count scaled to it and rounded down (at least 1).
/// Exact whenever the period divides the unit (1s, 500ms, 15m, 180m, 1d, ...).
///
/// ```
/// use cellrate_core::gcra::Limit;
/// use cellrate_service::service::envoy::requests_per_unit;
/// use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
/// let s = 1_000_000_000;
/// assert_eq!(requests_per_unit(&Limit::new(20, 20, s).unwrap()), (20, Unit::Second));
/// assert_eq!(requests_per_unit(&Limit::new(300, 300, 10_800 * s).unwrap()), (2_400, Unit::Day));
/// assert_eq!(requests_per_unit(&Limit::new(5, 5, s / 2).unwrap()), (10, Unit::Second));
/// ```
/// A calendar window as Envoy's unit (exact but for the zoned and 30- or 365-day windows,
/// which are the unit they stand for).
fn unit_of(period: CalendarPeriod) -> Unit {
    match period {
        CalendarPeriod::Second => Unit::Second,
        CalendarPeriod::Minute => Unit::Minute,
        CalendarPeriod::Hour => Unit::Hour,
        CalendarPeriod::Day => Unit::Day,
        CalendarPeriod::Month | CalendarPeriod::Days30 => Unit::Month,
        CalendarPeriod::Year | CalendarPeriod::Days365 => Unit::Year,
        CalendarPeriod::Week => Unit::Week,
        CalendarPeriod::Zoned(zoned) => match zoned.unit() {
            ZonedUnit::Day => Unit::Day,
            ZonedUnit::Week => Unit::Week,
            ZonedUnit::Month => Unit::Month,
            ZonedUnit::Year => Unit::Year,
        },
    }
}

pub fn requests_per_unit(limit: &Limit) -> (u32, Unit) {
    if let Window::Calendar(period) = limit.window() {
        // A calendar window is one of Envoy's units: exact.
        return (
            limit.count().min(u64::from(u32::MAX)) as u32,
            unit_of(period),
        );
    }
    let period = limit.period();
    let (unit, unit_ns) = UNITS
        .iter()
        .copied()
        .find(|&(_, ns)| ns >= period)
        .unwrap_or(UNITS[UNITS.len() - 1]);
    let scaled = i128::from(limit.count()) * i128::from(unit_ns) / i128::from(period);
    (scaled.clamp(1, i128::from(u32::MAX)) as u32, unit)
}

/// The status of a descriptor whose items are `items`: its code, and the numbers of its
/// strictest visible limit (a denying one first). Only hidden limits: the code alone.
pub(crate) fn descriptor_status(items: &[ItemResult], resets: ResetStyle) -> DescriptorStatus {
    let over = items.iter().any(enforced_denial);
    let visible = || items.iter().filter(|i| visible(i));
    let shown = if visible().any(enforced_denial) {
        strictest(visible().filter(|i| enforced_denial(i)))
    } else {
        strictest(visible().filter(|i| restricts(i)))
    };
    let Some(item) = shown else {
        // Unmatched, unlimited, not configured, or only hidden limits: the code alone.
        return DescriptorStatus {
            code: if over { Code::OverLimit } else { Code::Ok } as i32,
            ..Default::default()
        };
    };
    let current_limit = match item.rule {
        // envoyproxy/ratelimit's zero: its unit, and nothing a unit.
        Rule::Zero(period) => Some(RateLimit {
            name: String::from(&*item.name),
            requests_per_unit: 0,
            unit: unit_of(period) as i32,
        }),
        Rule::Limited(limit) => {
            let (requests_per_unit, unit) = requests_per_unit(&limit);
            Some(RateLimit {
                // Not `to_string`: on an `Arc<str>` that goes through the formatter.
                name: String::from(&*item.name),
                requests_per_unit,
                unit: unit as i32,
            })
        }
        _ => None,
    };
    let d = item.decision;
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit,
        limit_remaining: d.remaining.clamp(0, i64::from(u32::MAX)) as u32,
        duration_until_reset: Some(match resets {
            ResetStyle::Exact => pbw::Duration {
                seconds: until_reset(&d) / SECOND,
                nanos: (until_reset(&d) % SECOND) as i32,
            },
            ResetStyle::WholeSeconds => pbw::Duration {
                seconds: ceil_seconds(until_reset(&d)),
                nanos: 0,
            },
        }),
        ..Default::default()
    }
}

/// The status envoyproxy/ratelimit's headers describe: the last over-limit descriptor not
/// in quota mode, else the first with the fewest remaining among those with a limit. A
/// status over only by `headers: hidden` limits (it has no `duration_until_reset`: it
/// says nothing of them) is passed over.
pub(crate) fn closest<'a>(
    statuses: &'a [DescriptorStatus],
    quota: &[usize],
) -> Option<&'a DescriptorStatus> {
    let mut best: Option<&DescriptorStatus> = None;
    let mut least = u32::MAX;
    let mut over = false;
    for (d, status) in statuses.iter().enumerate() {
        let hidden = status.duration_until_reset.is_none();
        if status.code == Code::OverLimit as i32 && !quota.contains(&d) && !hidden {
            best = Some(status);
            least = 0;
            over = true;
        } else if !over && status.current_limit.is_some() && status.limit_remaining < least {
            best = Some(status);
            least = status.limit_remaining;
        }
    }
    best
}

/// The three fields of `status`: its limit per unit, what remains, the seconds until reset
/// (rounded up).
pub(crate) fn trio(status: &DescriptorStatus, names: &HeaderNames) -> [Header; 3] {
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds + i64::from(d.nanos > 0));
    [
        header(&names.limit, limit.to_string()),
        header(&names.remaining, status.limit_remaining.to_string()),
        header(&names.reset, reset.to_string()),
    ]
}

/// The three fields for a native `Check`, each item a descriptor, the default names.
pub(super) fn for_items(results: &[ItemResult], out: &mut Vec<Header>) {
    let statuses: Vec<DescriptorStatus> = results
        .iter()
        .map(|item| descriptor_status(std::slice::from_ref(item), ResetStyle::Exact))
        .collect();
    if let Some(status) = closest(&statuses, &[]) {
        out.extend(trio(status, &HeaderNames::default()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_rounding() {
        let s = SECOND;
        let l = |b, c, p| Limit::new(b, c, p).unwrap();
        assert_eq!(requests_per_unit(&l(1, 1, 60 * s)), (1, Unit::Minute));
        let calendar = |count, period| Limit::calendar(count, period).unwrap();
        assert_eq!(
            requests_per_unit(&calendar(1_000_000, CalendarPeriod::Month)),
            (1_000_000, Unit::Month)
        );
        assert_eq!(
            requests_per_unit(&calendar(3, CalendarPeriod::Hour)),
            (3, Unit::Hour)
        );
        assert_eq!(
            requests_per_unit(&calendar(1 << 40, CalendarPeriod::Year)),
            (u32::MAX, Unit::Year)
        );
        assert_eq!(requests_per_unit(&l(7, 7, 45 * s)), (9, Unit::Minute)); // 9.33 -> 9
        assert_eq!(
            requests_per_unit(&l(10_000, 10_000, 86_400 * s)),
            (10_000, Unit::Day)
        );
        assert_eq!(
            requests_per_unit(&l(1, 1, 2 * 365 * 86_400 * s)),
            (1, Unit::Year)
        ); // 0.5 -> 1
    }
}
