//! Time for decisions: [`Nanos`] since the Unix epoch, read through a [`Clock`].
//!
//! This is the only module that reads the operating system's clock (`.clippy.toml` bans
//! `SystemTime::now` and `std::time::Instant::now` elsewhere). Decisions take `now` from an
//! injected clock so that tests and `cellrate simulate` move a [`FakeClock`] instead of
//! sleeping; timers of the code's own (the Redis store's breaker, the `AUTH` lockout) take
//! [`Clock::monotonic`] from the same clock, so that a test skips a cool-down instead of
//! waiting for it. Durations that are only measured or awaited (latencies, tokio sleeps)
//! use `tokio::time`, which a test can pause.
//!
//! It also knows the UTC calendar, for calendar windows ([`CalendarPeriod`]): where the
//! window that holds an instant starts and ends, for fixed spans aligned to the epoch and for
//! calendar months and years, in exact integer arithmetic on days ([`civil_from_days`]).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub mod zoned;
pub use zoned::{Zoned, ZonedUnit, TZDB_VERSION};

/// Unix time or a duration, in integer nanoseconds. `i64` covers the years 1678 to 2262.
pub type Nanos = i64;

/// Nanoseconds in one second.
pub const SECOND: Nanos = 1_000_000_000;
/// One microsecond.
pub const MICROSECOND: Nanos = 1_000;

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// The current Unix time in nanoseconds.
    fn now(&self) -> Nanos;

    /// Nanoseconds on a clock that never goes back, from an arbitrary start: what timers
    /// (cool-downs, lockouts) count on, so that a step of the wall clock neither ends nor
    /// prolongs them.
    fn monotonic(&self) -> Nanos;
}

/// The operating system's monotonic clock, in nanoseconds since this process first read it.
#[allow(clippy::disallowed_methods)] // the one sanctioned read of the monotonic clock
fn os_monotonic() -> Nanos {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    Nanos::try_from(start.elapsed().as_nanos()).unwrap_or(Nanos::MAX)
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one sanctioned read of the OS clock
    fn now(&self) -> Nanos {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Nanos::try_from(since.as_nanos()).unwrap_or(Nanos::MAX)
    }

    fn monotonic(&self) -> Nanos {
        os_monotonic()
    }
}

/// A clock whose time stands still until told to move; clones share one time.
///
/// Its monotonic reading is the real one plus every forward [`FakeClock::advance`]: a test
/// skips a timer (a breaker's cool-down) by advancing past it instead of sleeping, and the
/// timers of a test that never advances still end in real time (a server under test that
/// recovers from a Redis outage while clients hammer it).
///
/// ```
/// use cellrate_core::clock::{Clock, FakeClock};
/// let clock = FakeClock::new(1_000);
/// let timers = clock.monotonic();
/// clock.advance(500);
/// assert_eq!(clock.now(), 1_500);
/// assert!(clock.monotonic() >= timers + 500);
/// clock.set(0); // a step of the wall clock: timers do not go back
/// assert!(clock.monotonic() >= timers + 500);
/// ```
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    now: Arc<AtomicI64>,
    /// Nanoseconds that forward advances added to the monotonic reading.
    skipped: Arc<AtomicI64>,
}

impl FakeClock {
    /// A fake clock reading `start`.
    pub fn new(start: Nanos) -> FakeClock {
        FakeClock {
            now: Arc::new(AtomicI64::new(start)),
            skipped: Arc::default(),
        }
    }

    /// Move the clock forward (or back, with a negative `by`: then the wall time only;
    /// the monotonic time never goes back).
    pub fn advance(&self, by: Nanos) {
        self.now.fetch_add(by, Ordering::SeqCst);
        if by > 0 {
            self.skipped.fetch_add(by, Ordering::SeqCst);
        }
    }

    /// Set the wall time to `to` (a step, as NTP makes; the monotonic time does not move).
    pub fn set(&self, to: Nanos) {
        self.now.store(to, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Nanos {
        os_monotonic().saturating_add(self.skipped.load(Ordering::SeqCst))
    }
}
/// Nanoseconds in one day.
pub const DAY: Nanos = 86_400 * SECOND;

/// A calendar window's length: a fixed span aligned to UTC multiples since the epoch, a
/// calendar month or year in UTC, or a day, ISO week, month or year in a time zone and
/// from an anchor day ([`Zoned`]). What a `window: calendar` limit counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarPeriod {
    /// A UTC second.
    Second,
    /// A UTC minute.
    Minute,
    /// A UTC hour.
    Hour,
    /// A UTC day, from midnight.
    Day,
    /// A calendar month in UTC, from the 1st.
    Month,
    /// A calendar year in UTC, from January 1st.
    Year,
    /// envoyproxy/ratelimit's WEEK, MONTH and YEAR: fixed spans of 7, 30 and 365 days
    /// aligned to multiples since the epoch (not calendar weeks, months or years). Only
    /// its file format counts in them; `window: calendar` takes the six above.
    Week,
    /// envoyproxy/ratelimit's MONTH: 30 days since the epoch.
    Days30,
    /// envoyproxy/ratelimit's YEAR: 365 days since the epoch.
    Days365,
    /// A day, ISO week (`1w`, Monday to Sunday), month or year in an IANA time zone, or a
    /// month or week from an anchor day: `1mo~15@America/New_York`.
    Zoned(&'static Zoned),
}

impl std::fmt::Display for CalendarPeriod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text())
    }
}

impl CalendarPeriod {
    /// The periods that need no zone, in the one order every stored encoding numbers them
    /// by (a settlement record's code is 1 + the place here; the Redis script's letter is
    /// the same place in its own alphabet). Append only: a place, once written, is data.
    pub const UNZONED: [CalendarPeriod; 9] = [
        CalendarPeriod::Second,
        CalendarPeriod::Minute,
        CalendarPeriod::Hour,
        CalendarPeriod::Day,
        CalendarPeriod::Month,
        CalendarPeriod::Year,
        CalendarPeriod::Week,
        CalendarPeriod::Days30,
        CalendarPeriod::Days365,
    ];

    /// Its place in [`CalendarPeriod::UNZONED`]; `None` for a zoned period.
    pub fn unzoned_index(self) -> Option<usize> {
        Some(match self {
            CalendarPeriod::Second => 0,
            CalendarPeriod::Minute => 1,
            CalendarPeriod::Hour => 2,
            CalendarPeriod::Day => 3,
            CalendarPeriod::Month => 4,
            CalendarPeriod::Year => 5,
            CalendarPeriod::Week => 6,
            CalendarPeriod::Days30 => 7,
            CalendarPeriod::Days365 => 8,
            CalendarPeriod::Zoned(_) => return None,
        })
    }

    /// `1s`, `1m`, `1h`, `1d`, `1w`, `1mo`, `1y`: the periods a calendar window may have;
    /// a day, week, month or year may name an IANA time zone after `@`, and a month or
    /// week its anchor day after `~` (`1mo~15@Europe/Berlin`), as [`CalendarPeriod::text`]
    /// writes them.
    pub fn parse(text: &str) -> Result<CalendarPeriod, String> {
        let (rest, zone) = match text.split_once('@') {
            Some((rest, zone)) => (rest, Some(zone)),
            None => (text, None),
        };
        let (unit, anchor) = match rest.split_once('~') {
            Some((unit, anchor)) => match anchor.parse::<u8>() {
                Ok(anchor) if anchor > 0 => (unit, Some(anchor)),
                _ => return Err(Self::unknown(text)),
            },
            None => (rest, None),
        };
        let plain = match unit {
            "1s" => CalendarPeriod::Second,
            "1m" => CalendarPeriod::Minute,
            "1h" => CalendarPeriod::Hour,
            "1d" => CalendarPeriod::Day,
            "1w" => return Self::zoned(unit, zone, anchor),
            "1mo" => CalendarPeriod::Month,
            "1y" => CalendarPeriod::Year,
            _ => return Err(Self::unknown(text)),
        };
        if zone.is_none() && anchor.is_none() {
            return Ok(plain);
        }
        Self::zoned(unit, zone, anchor)
    }

    fn unknown(text: &str) -> String {
        // Quoted short: the text may come from a hostile caller.
        let shown: String = text.chars().take(16).collect();
        let cut = if shown.len() < text.len() { "..." } else { "" };
        format!(
            "{shown:?}{cut} is no calendar period: one of 1s, 1m, 1h, 1d, 1w, 1mo, 1y \
             (a day, week, month or year may add @<IANA zone>, a month or week ~<anchor day>)"
        )
    }

    /// The period `unit` (`1d`, `1w`, `1mo`, `1y`) in the IANA zone `zone` (`None`: UTC)
    /// from the anchor day `anchor` (a month's 1-31, clamped to its last day; a week's
    /// 1-7, Monday 1): the UTC period itself when both are left out (or UTC, from the
    /// 1st); refused for a second, minute or hour.
    pub fn zoned(
        unit: &str,
        zone: Option<&str>,
        anchor: Option<u8>,
    ) -> Result<CalendarPeriod, String> {
        let zoned_unit = match unit {
            "1d" => ZonedUnit::Day,
            "1w" => ZonedUnit::Week,
            "1mo" => ZonedUnit::Month,
            "1y" => ZonedUnit::Year,
            _ => {
                let shown: String = unit.chars().take(16).collect();
                return Err(format!(
                    "period {shown:?}: a time zone or anchor applies to a day (1d), week (1w), \
                     month (1mo) or year (1y)"
                ));
            }
        };
        let zoned = Zoned::intern(zoned_unit, zone, anchor.unwrap_or(0))?;
        if zoned.is_utc() {
            match zoned_unit {
                ZonedUnit::Day => return Ok(CalendarPeriod::Day),
                ZonedUnit::Month => return Ok(CalendarPeriod::Month),
                ZonedUnit::Year => return Ok(CalendarPeriod::Year),
                ZonedUnit::Week => {}
            }
        }
        Ok(CalendarPeriod::Zoned(zoned))
    }

    /// How the period is written: `1s`, `1m`, `1h`, `1d`, `1mo` or `1y`, or a zoned one's
    /// text (`1w`, `1mo~15@America/New_York`).
    pub fn text(self) -> &'static str {
        match self {
            CalendarPeriod::Zoned(zoned) => zoned.text(),
            CalendarPeriod::Second => "1s",
            CalendarPeriod::Minute => "1m",
            CalendarPeriod::Hour => "1h",
            CalendarPeriod::Day => "1d",
            CalendarPeriod::Month => "1mo",
            CalendarPeriod::Year => "1y",
            CalendarPeriod::Week => "7d",
            CalendarPeriod::Days30 => "30d",
            CalendarPeriod::Days365 => "365d",
        }
    }

    /// The fixed length of a window, or `None` for months and years.
    fn fixed(self) -> Option<Nanos> {
        match self {
            CalendarPeriod::Second => Some(SECOND),
            CalendarPeriod::Minute => Some(60 * SECOND),
            CalendarPeriod::Hour => Some(3_600 * SECOND),
            CalendarPeriod::Day => Some(DAY),
            CalendarPeriod::Week => Some(7 * DAY),
            CalendarPeriod::Days30 => Some(30 * DAY),
            CalendarPeriod::Days365 => Some(365 * DAY),
            CalendarPeriod::Month | CalendarPeriod::Year | CalendarPeriod::Zoned(_) => None,
        }
    }

    /// The longest a window may be: 31 days for a month, 366 for a year; a zoned window
    /// a day more than its unit's longest (the zone's changes of offset).
    pub fn longest(self) -> Nanos {
        match self {
            CalendarPeriod::Month => 31 * DAY,
            CalendarPeriod::Year => 366 * DAY,
            CalendarPeriod::Zoned(zoned) => match zoned.unit() {
                ZonedUnit::Day => 2 * DAY,
                ZonedUnit::Week => 8 * DAY,
                ZonedUnit::Month => 32 * DAY,
                ZonedUnit::Year => 367 * DAY,
            },
            fixed => fixed.fixed().unwrap_or(DAY),
        }
    }

    /// The shortest a window may be: 28 days for a month, 365 for a year; a zoned window
    /// is taken to be as much as half a day shorter than its unit's shortest (a day across
    /// a daylight-saving change is 23 hours; the database holds larger changes of offset).
    pub fn shortest(self) -> Nanos {
        match self {
            CalendarPeriod::Month => 28 * DAY,
            CalendarPeriod::Year => 365 * DAY,
            CalendarPeriod::Zoned(zoned) => match zoned.unit() {
                ZonedUnit::Day => DAY / 2,
                ZonedUnit::Week => 7 * DAY - DAY / 2,
                ZonedUnit::Month => 28 * DAY - DAY / 2,
                ZonedUnit::Year => 365 * DAY - DAY / 2,
            },
            fixed => fixed.fixed().unwrap_or(DAY),
        }
    }

    /// The largest count a window of this period can hold exactly. A bucket stores its
    /// window's end plus what it used (debt included, up to twice the count), and that
    /// must stay below the next window's end, or the next window would read the rest as
    /// its own: `2 x count < shortest`. 499 999 999 a second, about 1.2 x 10^15 a month.
    pub fn max_count(self) -> u64 {
        ((self.shortest() - 1) / 2) as u64
    }

    /// The start of the window that holds `now` (UTC).
    ///
    /// ```
    /// use cellrate_core::clock::{CalendarPeriod, DAY};
    /// // 2024-02-15T12:00:00Z: its month began on 2024-02-01 (day 19 754 since the epoch).
    /// let now = 19_768 * DAY + DAY / 2;
    /// assert_eq!(CalendarPeriod::Month.window_start(now), 19_754 * DAY);
    /// assert_eq!(CalendarPeriod::Month.window_end(now), 19_783 * DAY); // 2024-03-01
    /// ```
    pub fn window_start(self, now: Nanos) -> Nanos {
        if let CalendarPeriod::Zoned(zoned) = self {
            return zoned.window(now).0;
        }
        if let Some(len) = self.fixed() {
            return now - now.rem_euclid(len);
        }
        let (year, month, _) = civil_from_days(now.div_euclid(DAY));
        let first = match self {
            CalendarPeriod::Year => days_from_civil(year, 1, 1),
            _ => days_from_civil(year, month, 1),
        };
        first * DAY
    }

    /// The end of the window that holds `now` (UTC), exclusive: the next window's start.
    /// Saturates at the end of 64-bit nanoseconds (the year 2262).
    pub fn window_end(self, now: Nanos) -> Nanos {
        if let CalendarPeriod::Zoned(zoned) = self {
            return zoned.window(now).1;
        }
        if let Some(len) = self.fixed() {
            return self.window_start(now).saturating_add(len);
        }
        let (year, month, _) = civil_from_days(now.div_euclid(DAY));
        let next = match (self, month) {
            (CalendarPeriod::Year, _) | (_, 12) => days_from_civil(year + 1, 1, 1),
            _ => days_from_civil(year, month + 1, 1),
        };
        next.saturating_mul(DAY)
    }
}

/// The proleptic Gregorian date (year, month 1-12, day 1-31) of `days` since 1970-01-01.
///
/// Counted in eras of 400 years (146 097 days), each starting on a 1 March so that the
/// leap day is the last day of its year: the day of the era gives the year of the era, the
/// day of that year gives the month by a linear formula over March-based months.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146 096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // March = 0
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of the proleptic Gregorian date `year`-`month`-`day`; the inverse
/// of [`civil_from_days`].
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = year - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400); // [0, 399]
    let mp = i64::from(if month > 2 { month - 3 } else { month + 9 });
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146 096]
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_unzoned_period_is_found_at_its_place() {
        for (i, period) in CalendarPeriod::UNZONED.iter().enumerate() {
            assert_eq!(period.unzoned_index(), Some(i), "{period}");
        }
        let zoned = CalendarPeriod::parse("1d@Europe/Paris").unwrap();
        assert_eq!(zoned.unzoned_index(), None);
    }

    #[test]
    fn civil_dates_round_trip_and_hit_known_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        // Every day from 1708 to 2262, both ways.
        for z in -96_000..=106_751 {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z, "{y}-{m}-{d}");
        }
    }

    #[test]
    fn every_instant_lies_in_one_window_and_windows_follow_each_other() {
        let periods = [
            CalendarPeriod::Second,
            CalendarPeriod::Minute,
            CalendarPeriod::Hour,
            CalendarPeriod::Day,
            CalendarPeriod::Month,
            CalendarPeriod::Year,
        ];
        // A spread of instants up to 2261 (2262's windows end past 64-bit nanoseconds and
        // saturate: see below), some on a boundary or a nanosecond before one.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut instants = vec![0, DAY - 1, DAY, 19_782 * DAY, 19_783 * DAY - 1];
        for _ in 0..2_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            instants.push((x % (106_500 * DAY as u64)) as i64);
        }
        for now in instants {
            for period in periods {
                let (start, end) = (period.window_start(now), period.window_end(now));
                assert!(start <= now && now < end, "{period:?} at {now}");
                assert_eq!(
                    period.window_start(end),
                    end,
                    "{period:?}: next starts at end"
                );
                assert_eq!(period.window_start(end - 1), start);
                let len = end - start;
                match period.fixed() {
                    Some(fixed) => {
                        assert_eq!(len, fixed);
                        assert_eq!(start % fixed, 0, "aligned to the epoch");
                    }
                    None if period == CalendarPeriod::Month => {
                        assert!((28 * DAY..=31 * DAY).contains(&len), "{len}");
                        assert_eq!(civil_from_days(start / DAY).2, 1, "the 1st");
                    }
                    None => {
                        assert!(len == 365 * DAY || len == 366 * DAY, "{len}");
                        assert_eq!(civil_from_days(start / DAY).1, 1, "January");
                    }
                }
                assert!(len <= period.longest());
            }
        }
    }

    #[test]
    fn new_year_and_the_end_of_time() {
        // 2023-12-31T23:59:59.999999999Z: month and year end together.
        let last = days_from_civil(2024, 1, 1) * DAY - 1;
        assert_eq!(CalendarPeriod::Month.window_end(last), last + 1);
        assert_eq!(CalendarPeriod::Year.window_end(last), last + 1);
        // The last instant 64-bit nanoseconds hold: the window's end saturates.
        let end = i64::MAX;
        assert_eq!(CalendarPeriod::Year.window_end(end - 1), i64::MAX);
        assert!(CalendarPeriod::Month.window_start(end - 1) < end);
        assert_eq!(CalendarPeriod::Second.window_end(end - 1), i64::MAX);
    }

    #[test]
    fn only_the_listed_periods_parse() {
        for (text, period) in [
            ("1s", CalendarPeriod::Second),
            ("1m", CalendarPeriod::Minute),
            ("1h", CalendarPeriod::Hour),
            ("1d", CalendarPeriod::Day),
            ("1mo", CalendarPeriod::Month),
            ("1y", CalendarPeriod::Year),
        ] {
            assert_eq!(CalendarPeriod::parse(text), Ok(period));
        }
        for bad in [
            "",
            "2d",
            "1M",
            "1 mo",
            "30d",
            "1yr",
            "1h@Europe/Berlin",
            "1mo~0",
            "1mo~32",
        ] {
            let e = CalendarPeriod::parse(bad).unwrap_err();
            assert!(e.contains("1mo"), "{bad}: {e}");
        }
    }
}
