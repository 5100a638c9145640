//! Temporary overrides of envoyproxy/ratelimit-format limits: a bucket named by its limit's
//! label and its readable name (`domain/key=value/...`, as `top` shows it), kept by the
//! bucket's text (the digest the Envoy front end counts on), so that ShouldRateLimit finds
//! one with a single lookup. Such a limit counts in fixed windows of its unit (or with
//! `--ratelimit-counting gcra` by GCRA, `requests_per_unit` a unit): an override keeps
//! that, so that it counts on the same bucket.

use std::sync::Arc;

use crate::service::ratelimit_bucket::{named_bucket, RatelimitShape};
use cellrate_core::clock::{CalendarPeriod, Nanos, SECOND};
use cellrate_core::gcra::{Limit, Window};
use cellrate_core::text::{cut_bytes, printable};
use cellrate_limits::config::{LimitTable, Policy};
use cellrate_limits::ratelimit_format::Unit;

/// A bucket of a ratelimit-format limit, as an override names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatelimitSlot {
    /// The limit's label (its `name`, else its full key).
    pub label: Arc<str>,
    /// The bucket's readable name, canonical (the entries as counted).
    pub id: String,
    /// The bucket's text: what the Envoy front end counts on, and overrides are kept by.
    pub bucket: Box<str>,
    /// How the bucket counts: a calendar window of the unit, or GCRA.
    pub window: Window,
    /// The limit's unit.
    pub unit: Unit,
}

/// The bucket `name` and `id` name when `name` is the label of a ratelimit-format limit
/// (and no configured name): `Ok(None)` when it is no such label, an error saying why when
/// `id` names no bucket of it.
pub fn ratelimit_slot(
    table: &LimitTable,
    shape: RatelimitShape,
    name: &str,
    id: &str,
) -> Result<Option<RatelimitSlot>, String> {
    if table.names().get(name).is_some() || !table.ratelimit().labels().contains(&name) {
        return Ok(None);
    }
    let shown_id = printable(cut_bytes(id, 160));
    let Some(named) = named_bucket(table, shape, name, id) else {
        return Err(format!(
            "id: {shown_id:?} names no bucket of {name} (a limit of envoyproxy/ratelimit's file \
             format, or a zero or unlimited one): name its bucket as `top` shows it, \
             domain/key=value/..."
        ));
    };
    let Some(canonical) = named.shown else {
        return Err(format!(
            "id: {shown_id:?}: its bucket's name is longer than 128 bytes, which no override \
             takes"
        ));
    };
    let target = named.target;
    Ok(Some(RatelimitSlot {
        label: target.name.clone(),
        id: canonical,
        bucket: target.digest.into_boxed_str(),
        window: target
            .limit
            .map_or(Window::Calendar(target.unit), |l| l.window()),
        unit: named.unit,
    }))
}

/// The policy an override of `slot` gives: `count` alone (or with `calendar` naming the
/// unit's window) is `count` requests a unit, counted as the limit counts; `burst`, `count`
/// and `period` a GCRA limit, only where the limit counts by GCRA; else `unlimited` or
/// `deny`.
pub fn ratelimit_policy(
    slot: &RatelimitSlot,
    (burst, count, period): (u64, u64, Option<Nanos>),
    unlimited: bool,
    deny: bool,
    calendar: Option<CalendarPeriod>,
) -> Result<Policy, String> {
    let unit = slot.unit.window();
    let per_unit = |count: u64| match slot.window {
        Window::Calendar(window) => Limit::calendar(count, window),
        _ => {
            let length = slot.unit.seconds() * SECOND;
            Limit::new(count, count.min(length as u64), length)
        }
    };
    let named = match calendar {
        None => true,
        Some(given) => given == unit,
    };
    match (unlimited, deny, period) {
        (true, false, None) | (false, true, None)
            if burst == 0 && count == 0 && calendar.is_none() =>
        {
            Ok(if unlimited {
                Policy::Unlimited
            } else {
                Policy::Denied
            })
        }
        (false, false, None) if named && (burst == 0 || burst == count) => per_unit(count)
            .map(Policy::limited)
            .map_err(|e| format!("count: {e}")),
        (false, false, None) if !named => Err(format!(
            "calendar: {} counts in windows of its unit ({}): an override counts in them \
             too (give count alone: requests a {})",
            slot.label,
            unit.text(),
            unit_word(slot.unit)
        )),
        (false, false, Some(period)) if slot.window == Window::Gcra && calendar.is_none() => {
            Limit::new(burst, count, period)
                .map(Policy::limited)
                .map_err(|e| format!("burst, count, period: {e}"))
        }
        (false, false, Some(_)) if slot.window != Window::Gcra => Err(format!(
            "{} is a limit of envoyproxy/ratelimit's file format, which counts in fixed \
             windows of its unit as envoyproxy/ratelimit does: a GCRA limit (burst, count, \
             period) would count on another bucket; give count alone (requests a {}), \
             unlimited or deny",
            slot.label,
            unit_word(slot.unit)
        )),
        _ => Err(format!(
            "give exactly one of: count (requests a {} for {}); burst, count and period \
             (--ratelimit-counting gcra only); unlimited; deny",
            unit_word(slot.unit),
            slot.label
        )),
    }
}

fn unit_word(unit: Unit) -> &'static str {
    match unit {
        Unit::Second => "second",
        Unit::Minute => "minute",
        Unit::Hour => "hour",
        Unit::Day => "day",
        Unit::Week => "week",
        Unit::Month => "month (30 days)",
        Unit::Year => "year (365 days)",
    }
}

#[cfg(test)]
mod tests {
    use super::super::{OverrideError, RuntimeOverrides};
    use super::*;
    use crate::service::request::RatelimitTarget;
    use cellrate_core::clock::FakeClock;

    const CONFIG: &str = "
domain: rl
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {name: api, unit: week, requests_per_unit: 2}
";

    fn table() -> LimitTable {
        LimitTable::from_files(&[("rl.yaml".to_string(), CONFIG.to_string())]).unwrap()
    }

    #[test]
    fn a_bucket_is_named_canonically_and_its_override_counts_as_the_limit_counts() {
        let table = table();
        let fixed = RatelimitShape::default();
        let slot = ratelimit_slot(&table, fixed, "rl.user", "rl/user=alice")
            .unwrap()
            .unwrap();
        assert_eq!(&*slot.label, "rl.user");
        assert_eq!(slot.window, Window::Calendar(CalendarPeriod::Minute));
        assert_eq!(slot.bucket.len(), 64, "the digest");
        // A wildcard's buckets are named by the pattern they count under.
        let api = ratelimit_slot(&table, fixed, "api", "rl/path=%2Fapi%2Fv1")
            .unwrap()
            .unwrap();
        assert_eq!(api.id, "rl/path=%2Fapi%2F*");
        let same = ratelimit_slot(&table, fixed, "api", &api.id)
            .unwrap()
            .unwrap();
        assert_eq!(same, api);
        // Not a label: left to the configured names.
        assert_eq!(
            ratelimit_slot(&table, fixed, "other", "rl/user=a"),
            Ok(None)
        );
        for bad in ["rl/user", "rl/path=/x", "x/user=a", "rl/user=a/extra=b"] {
            let e = ratelimit_slot(&table, fixed, "rl.user", bad).unwrap_err();
            assert!(
                e.starts_with("id: ") && e.contains("names no bucket"),
                "{e}"
            );
        }

        let numbers = |burst, count, period| (burst, count, period);
        let policy = |slot, n, calendar| ratelimit_policy(slot, n, false, false, calendar);
        assert_eq!(
            policy(&slot, numbers(0, 50, None), None),
            Ok(Policy::limited(
                Limit::calendar(50, CalendarPeriod::Minute).unwrap()
            ))
        );
        assert_eq!(
            policy(&slot, numbers(0, 50, None), Some(CalendarPeriod::Minute)),
            policy(&slot, numbers(0, 50, None), None)
        );
        let hourly = policy(&slot, numbers(0, 50, None), Some(CalendarPeriod::Hour));
        assert!(hourly.unwrap_err().contains("windows of its unit (1m)"));
        let gcra = policy(&slot, numbers(5, 5, Some(SECOND)), None).unwrap_err();
        assert!(gcra.contains("fixed windows"), "{gcra}");
        // A weekly limit has no calendar text: its count alone names it.
        assert_eq!(
            policy(&api, numbers(0, 9, None), None),
            Ok(Policy::limited(
                Limit::calendar(9, CalendarPeriod::Week).unwrap()
            ))
        );
        assert!(policy(&slot, numbers(0, 0, None), None).is_err(), "zero");
        assert_eq!(
            ratelimit_policy(&slot, numbers(0, 0, None), false, true, None),
            Ok(Policy::Denied)
        );
        assert_eq!(
            ratelimit_policy(&slot, numbers(0, 0, None), true, false, None),
            Ok(Policy::Unlimited)
        );
        let both = ratelimit_policy(&slot, numbers(0, 5, None), true, false, None);
        assert!(both.unwrap_err().contains("exactly one"));

        // Counted by GCRA: the same names, GCRA numbers.
        let gcra_shape = RatelimitShape {
            fixed_window: false,
            ..fixed
        };
        let slot = ratelimit_slot(&table, gcra_shape, "rl.user", "rl/user=alice")
            .unwrap()
            .unwrap();
        assert_eq!(slot.window, Window::Gcra);
        assert_eq!(
            policy(&slot, numbers(0, 50, None), None),
            Ok(Policy::limited(Limit::new(50, 50, 60 * SECOND).unwrap()))
        );
        assert_eq!(
            policy(&slot, numbers(5, 1, Some(SECOND)), None),
            Ok(Policy::limited(Limit::new(5, 1, SECOND).unwrap()))
        );
    }

    #[tokio::test]
    async fn a_ratelimit_bucket_is_overridden_by_its_text_under_the_same_bound() {
        let config = "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
        let table = LimitTable::from_files(&[("rl.yaml".into(), config.into())]).unwrap();
        let clock = FakeClock::new(1_700_000_000 * SECOND);
        let r = RuntimeOverrides::new(Arc::new(clock.clone()), 2, 3_600 * SECOND);
        let shape = RatelimitShape::default();
        let slot = |id: &str| {
            ratelimit_slot(&table, shape, "rl.user", id)
                .unwrap()
                .unwrap()
        };
        let (alice, bob) = (slot("rl/user=alice"), slot("rl/user=bob"));
        let target = |slot: &RatelimitSlot| RatelimitTarget {
            digest: slot.bucket.to_string(),
            limit: Limit::calendar(5, cellrate_core::clock::CalendarPeriod::Minute).ok(),
            unit: cellrate_core::clock::CalendarPeriod::Minute,
            name: slot.label.clone(),
            shadow: false,
            every_hit: true,
            caller_given: false,
        };
        assert_eq!(r.ratelimit(&target(&alice)), None);
        r.set_ratelimit(&alice, Policy::Denied, 60 * SECOND, "", "")
            .await
            .unwrap();
        assert_eq!(r.ratelimit(&target(&alice)), Some(Policy::Denied));
        assert_eq!(r.ratelimit(&target(&bob)), None, "another bucket");
        // Not for a descriptor's own limit, nor under another label, nor counting otherwise.
        let given = RatelimitTarget {
            caller_given: true,
            ..target(&alice)
        };
        assert_eq!(r.ratelimit(&given), None);
        let relabelled = RatelimitTarget {
            name: "other".into(),
            ..target(&alice)
        };
        assert_eq!(r.ratelimit(&relabelled), None);
        let hourly = Policy::limited(
            Limit::calendar(9, cellrate_core::clock::CalendarPeriod::Hour).unwrap(),
        );
        r.set_ratelimit(&alice, hourly, 60 * SECOND, "", "")
            .await
            .unwrap();
        assert_eq!(r.ratelimit(&target(&alice)), None, "another window");
        // One bound for both kinds.
        let orders = table.names().get("NewOrdersPerAccount").unwrap();
        r.set(orders, "1", Policy::Denied, 60 * SECOND, "", "")
            .await
            .unwrap();
        let full = r
            .set_ratelimit(&bob, Policy::Denied, 60 * SECOND, "", "")
            .await;
        assert!(
            matches!(full, Err(OverrideError::Full { held: 2 })),
            "{full:?}"
        );
        let listed = r.list(&table, Some("rl.user")).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (&*listed[0].name, &*listed[0].id),
            ("rl.user", "rl/user=alice")
        );
        assert!(r.clear_ratelimit(&alice).await.unwrap());
        assert!(!r.clear_ratelimit(&alice).await.unwrap());
        r.set_ratelimit(&bob, Policy::Unlimited, 60 * SECOND, "", "")
            .await
            .unwrap();
        assert_eq!(r.ratelimit(&target(&bob)), Some(Policy::Unlimited));
        clock.advance(60 * SECOND);
        assert_eq!(r.ratelimit(&target(&bob)), None, "expired");
    }
}
