//! The vocabulary of one script call, shared by the call itself (`connection.rs`) and the
//! batches that wait for it (`coalesce.rs`): what a call does ([`Op`]), an item as the
//! script reads it ([`Wire`], its [`WireMode`] written by one [`WireMode::encode`]), and
//! what the call read ([`Read`]).
//!
//! The mode digits ([`Action`]) and the calendar letters ([`LETTERS`]) are defined here
//! only; batch.lua reads exactly these (its `CHECK_ONLY, SPEND_ONLY, CHARGE`, `ACQUIRE,
//! RELEASE, HOLDERS`, `FIXED` and `MONTH, YEAR` lines), and a unit test below reads the
//! script's text to hold the two equal.

use std::borrow::Cow;
use std::sync::Arc;

use cellrate_core::clock::{Nanos, SECOND};
use cellrate_core::gcra::lease::Held;
use cellrate_core::gcra::{Mode, Window};

/// The operation a script call performs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Spend,
    Refund,
    Reset,
}

impl Op {
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::Spend => "spend",
            Op::Refund => "refund",
            Op::Reset => "reset",
        }
    }
}

/// What one script call read: `now` and each key's TAT (`None` for a lease key), and
/// what it read and did of each lease key, by the item's place in the call.
pub(super) struct Read {
    pub(super) now: Nanos,
    pub(super) tats: Vec<Option<Nanos>>,
    pub(super) leases: Vec<(usize, LeaseRead)>,
}

impl Read {
    /// What the script read of the lease key of item `at`.
    pub(super) fn lease(&self, at: usize) -> Option<&LeaseRead> {
        self.leases.iter().find(|(i, _)| *i == at).map(|(_, l)| l)
    }
}

/// A lease item as the script saw it: whether its id held a live lease, and the key's live
/// leases before the batch and after the item's own write (the same when nothing was
/// written), and how many expired leases the script dropped from the key. The script's
/// reply for it: `L<0|1>,<count>,<oldest>,<latest>,<count>,<oldest>,<latest>,<expired>`,
/// times in Unix nanoseconds (0 for a key with no lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LeaseRead {
    pub(super) held: bool,
    pub(super) before: Held,
    pub(super) after: Held,
    pub(super) expired: u64,
}

impl LeaseRead {
    /// Parses the script's reply for a lease item (`text` after its `L`).
    pub(super) fn parse(text: &str, now: Nanos) -> Option<LeaseRead> {
        let mut numbers = text.split(',').map(|v| v.parse::<Nanos>().ok());
        let mut next = || numbers.next().flatten();
        let held = match next()? {
            0 => false,
            1 => true,
            _ => return None,
        };
        let mut summary = || -> Option<Held> {
            let (count, oldest, latest) = (next()?, next()?, next()?);
            Some(if count == 0 {
                Held {
                    count,
                    oldest: now,
                    latest: now,
                }
            } else {
                Held {
                    count,
                    oldest,
                    latest,
                }
            })
        };
        let before = summary()?;
        let after = summary()?;
        let expired = u64::try_from(next()?).ok()?;
        if numbers.next().is_some() {
            return None;
        }
        Some(LeaseRead {
            held,
            before,
            after,
            expired,
        })
    }
}

/// One item of a spend call, as the script reads it.
pub(super) struct Wire {
    pub(super) key: String,
    pub(super) increment: i64,
    pub(super) burst_offset: i64,
    /// A calendar window's most used when it is not twice its count (envoyproxy/ratelimit's
    /// windows: [`cellrate_core::gcra::Limit::most_used`]), sent after the count as
    /// `<count>/<most>`; 0 otherwise.
    pub(super) most_used: i64,
    pub(super) mode: WireMode,
    /// An acquire's or release's lease id, sent as it is given (1 to 128 printable bytes,
    /// checked before the store) after the item's shape number: `<shape>:<id>`.
    pub(super) lease: Option<Arc<str>>,
}

impl Wire {
    /// Bytes this item adds to a call (key and arguments, roughly as sent).
    pub(super) fn bytes(&self) -> usize {
        self.key.len() + 48 + self.lease.as_deref().map_or(0, str::len)
    }
}

/// What the script does with an item: the digit its mode starts with (the value of each
/// variant is that digit, as a byte).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub(super) enum Action {
    /// Decide, write when the batch is allowed.
    CheckAndSpend = b'0',
    /// Decide and count, never write (check-only and probes).
    CheckOnly = b'1',
    /// Left out of the batch's decision; written when it fits and the batch is allowed.
    SpendOnly = b'2',
    /// Decide and count, always written, into debt if need be.
    Charge = b'3',
    /// A lease key: take a lease (counts toward the batch; written when it is allowed).
    Acquire = b'4',
    /// A lease key: free a lease (left out of the decision; applied whatever it is).
    Release = b'5',
    /// A lease key, only read (a peek of a concurrency limit: `Inspect`, a denied request).
    Holders = b'6',
}

impl Action {
    const ALL: [Action; 7] = [
        Action::CheckAndSpend,
        Action::CheckOnly,
        Action::SpendOnly,
        Action::Charge,
        Action::Acquire,
        Action::Release,
        Action::Holders,
    ];

    fn of(mode: Mode, window: Window) -> Action {
        match (window, mode) {
            (Window::Concurrency, Mode::Acquire) => Action::Acquire,
            (Window::Concurrency, Mode::Release) => Action::Release,
            (Window::Concurrency, _) => Action::Holders,
            (_, Mode::CheckAndSpend) => Action::CheckAndSpend,
            // A lease mode on a rate is refused before the store (`lease_rules`); read only.
            (_, Mode::CheckOnly | Mode::Probe | Mode::Acquire | Mode::Release) => Action::CheckOnly,
            (_, Mode::SpendOnly) => Action::SpendOnly,
            (_, Mode::Charge) => Action::Charge,
        }
    }

    /// Its place in [`Action::ALL`] (and in the tables of codes).
    fn index(self) -> usize {
        usize::from(self as u8 - b'0')
    }
}

/// The letters the script knows the periods that need no zone by, in the order of
/// [`CalendarPeriod::UNZONED`](cellrate_core::clock::CalendarPeriod::UNZONED) (s m h d, o a month, y a year; w, t, z envoyproxy/ratelimit's
/// fixed 7, 30 and 365 days). A zoned window goes as its boundaries instead
/// ([`WireWindow::Zoned`]).
pub(super) const LETTERS: [u8; 9] = *b"smhdoywtz";

/// The letter that marks a zoned window's boundaries.
const ZONED: u8 = b'x';

/// Every mode the script reads without a zone, made once from [`Action`] and [`LETTERS`]:
/// per action its digit alone (GCRA), then the digit and each letter, so that an item's
/// mode is a borrowed static string (no allocation per item).
static CODES: [[&str; 1 + LETTERS.len()]; 7] = codes(&CODE_BYTES);
static CODE_BYTES: [[[u8; 2]; 1 + LETTERS.len()]; 7] = code_bytes();

const fn code_bytes() -> [[[u8; 2]; 1 + LETTERS.len()]; 7] {
    let mut out = [[[0; 2]; 1 + LETTERS.len()]; 7];
    let mut a = 0;
    while a < Action::ALL.len() {
        let digit = Action::ALL[a] as u8;
        out[a][0] = [digit, digit];
        let mut l = 0;
        while l < LETTERS.len() {
            out[a][1 + l] = [digit, LETTERS[l]];
            l += 1;
        }
        a += 1;
    }
    out
}

/// [`CODE_BYTES`] as text: the first column its digit alone.
const fn codes(
    bytes: &'static [[[u8; 2]; 1 + LETTERS.len()]; 7],
) -> [[&'static str; 1 + LETTERS.len()]; 7] {
    let mut out = [[""; 1 + LETTERS.len()]; 7];
    let mut a = 0;
    while a < bytes.len() {
        let mut l = 0;
        while l < bytes[a].len() {
            let (code, _) = bytes[a][l].split_at(if l == 0 { 1 } else { 2 });
            out[a][l] = match std::str::from_utf8(code) {
                Ok(text) => text,
                Err(_) => panic!("a mode code is not ASCII"),
            };
            l += 1;
        }
        a += 1;
    }
    out
}

/// An item's window as the script reads it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) enum WireWindow {
    Gcra,
    /// A period that needs no zone, by its place in [`CalendarPeriod::UNZONED`](cellrate_core::clock::CalendarPeriod::UNZONED) (and in
    /// [`LETTERS`]).
    Letter(usize),
    /// A window in a zone or from an anchor day: four boundaries in whole seconds around
    /// cellrate's now: the previous window's start, the current window's start and end,
    /// and the next window's end. The script decides in the window among them that holds
    /// its own now (Redis's clock, with `--redis-clock redis`), which the zone database
    /// (not in Redis) placed; a Redis clock outside them is an error, not a guess.
    Zoned([i64; 4]),
}

impl WireWindow {
    pub(super) fn new(window: Window, now: Nanos) -> WireWindow {
        let period = match window {
            Window::Gcra | Window::Concurrency => return WireWindow::Gcra,
            Window::Calendar(period) => period,
        };
        match period.unzoned_index() {
            Some(index) => WireWindow::Letter(index),
            None => {
                let start = period.window_start(now);
                let end = period.window_end(now);
                let before = period.window_start(start.saturating_sub(1));
                let after = period.window_end(end);
                WireWindow::Zoned([before, start, end, after].map(|t| t / SECOND))
            }
        }
    }

    /// A refund's argument: the increment in nanoseconds (GCRA, given), or the window and
    /// the cost in tokens: its letter (`o12`: 12 tokens back to a monthly window), or `x`,
    /// its boundaries and a colon (`x<b0>,<b1>,<b2>,<b3>:12`).
    pub(super) fn refund_arg(self, increment: i64, cost: u64) -> String {
        match self {
            WireWindow::Gcra => increment.to_string(),
            WireWindow::Letter(index) => format!("{}{cost}", char::from(LETTERS[index])),
            WireWindow::Zoned(_) => format!("{}:{cost}", self.zoned_text()),
        }
    }

    /// `x<b0>,<b1>,<b2>,<b3>` (empty for the others).
    fn zoned_text(self) -> String {
        match self {
            WireWindow::Zoned([b0, b1, b2, b3]) => {
                format!("{}{b0},{b1},{b2},{b3}", char::from(ZONED))
            }
            _ => String::new(),
        }
    }
}

/// An item's mode as the script reads it: what to do, and in which window.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) struct WireMode {
    pub(super) action: Action,
    pub(super) window: WireWindow,
}

impl WireMode {
    /// The mode of an item of `mode` in `window`, a zoned window placed around `now`.
    pub(super) fn new(mode: Mode, window: Window, now: Nanos) -> WireMode {
        WireMode {
            action: Action::of(mode, window),
            window: WireWindow::new(window, now),
        }
    }

    /// Whether the item names a lease key (its reply is a [`LeaseRead`]).
    pub(super) fn is_lease(&self) -> bool {
        matches!(
            self.action,
            Action::Acquire | Action::Release | Action::Holders
        )
    }

    /// As batch.lua reads it: the action's digit, then the window's letter if any ("0o":
    /// check-and-spend in a monthly window), or a zoned window's boundaries
    /// ("0x<b0>,<b1>,<b2>,<b3>"). Borrowed but for zoned windows.
    pub(super) fn encode(&self) -> Cow<'static, str> {
        let row = &CODES[self.action.index()];
        match self.window {
            WireWindow::Gcra => Cow::Borrowed(row[0]),
            WireWindow::Letter(index) => Cow::Borrowed(row[1 + index]),
            WireWindow::Zoned(_) => Cow::Owned(format!(
                "{}{}",
                char::from(self.action as u8),
                self.window.zoned_text()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::CalendarPeriod;

    const SCRIPT: &str = include_str!("batch.lua");

    /// The right-hand side of the script's line that starts with `head`.
    fn script_line(head: &str) -> &'static str {
        let line = SCRIPT.lines().find(|l| l.starts_with(head));
        line.unwrap_or_else(|| panic!("batch.lua has no line {head}"))[head.len()..].trim()
    }

    /// `'1', '2'` -> the letters.
    fn quoted(text: &str) -> Vec<u8> {
        text.split(',')
            .map(|v| {
                let v = v.trim().as_bytes();
                assert!(v.len() == 3 && v[0] == b'\'' && v[2] == b'\'', "{text}");
                v[1]
            })
            .collect()
    }

    #[test]
    fn the_script_reads_the_action_digits() {
        let digits = quoted(script_line("local CHECK_ONLY, SPEND_ONLY, CHARGE ="));
        let ours = [Action::CheckOnly, Action::SpendOnly, Action::Charge].map(|a| a as u8);
        assert_eq!(digits, ours);
        assert_eq!(Action::CheckAndSpend as u8, b'0');
        let digits = quoted(script_line("local ACQUIRE, RELEASE, HOLDERS ="));
        let ours = [Action::Acquire, Action::Release, Action::Holders].map(|a| a as u8);
        assert_eq!(digits, ours);
        // Every digit is one byte, and distinct.
        let mut all: Vec<u8> = Action::ALL.iter().map(|&a| a as u8).collect();
        all.dedup();
        assert_eq!(all.len(), Action::ALL.len());
    }

    #[test]
    fn lease_modes_go_as_their_digits_and_replies_parse() {
        let lease = Window::Concurrency;
        for (mode, text) in [
            (Mode::Acquire, "4"),
            (Mode::Release, "5"),
            (Mode::Probe, "6"),
            (Mode::CheckOnly, "6"),
        ] {
            assert_eq!(WireMode::new(mode, lease, 0).encode(), text);
        }
        // A lease mode on a rate (refused before the store) only reads.
        assert_eq!(WireMode::new(Mode::Acquire, Window::Gcra, 0).encode(), "1");
        let read = LeaseRead::parse("1,2,30,40,1,40,40,3", 5).unwrap();
        assert_eq!(read.expired, 3);
        assert!(read.held);
        assert_eq!(
            (read.before.count, read.before.oldest, read.before.latest),
            (2, 30, 40)
        );
        assert_eq!((read.after.count, read.after.oldest), (1, 40));
        let empty = LeaseRead::parse("0,0,0,0,0,0,0,0", 5).unwrap();
        assert_eq!((empty.before.oldest, empty.after.latest), (5, 5));
        let bad = [
            "",
            "2,0,0,0,0,0,0,0",
            "1,2,3",
            "1,a,0,0,0,0,0,0",
            "0,0,0,0,0,0,0",
            "0,0,0,0,0,0,0,-1",
            "0,0,0,0,0,0,0,0,0",
        ];
        for bad in bad {
            assert_eq!(LeaseRead::parse(bad, 5), None, "{bad}");
        }
    }

    #[test]
    fn the_script_reads_the_calendar_letters() {
        let fixed = script_line("local FIXED =");
        let fixed = fixed.trim_start_matches('{').trim_end_matches('}');
        let mut spans: Vec<(u8, i64)> = fixed
            .split(',')
            .map(|pair| {
                let (letter, seconds) = pair.split_once('=').unwrap();
                let letter = letter.trim().as_bytes();
                assert_eq!(letter.len(), 1, "{pair}");
                (letter[0], seconds.trim().parse().unwrap())
            })
            .collect();
        let calendar = quoted(script_line("local MONTH, YEAR ="));
        let mut letters: Vec<u8> = spans
            .iter()
            .map(|(l, _)| *l)
            .chain(calendar.clone())
            .collect();
        letters.sort_unstable();
        let mut ours: Vec<u8> = LETTERS.to_vec();
        ours.sort_unstable();
        assert_eq!(letters, ours, "batch.lua's letters against LETTERS");
        assert!(!ours.contains(&ZONED));

        let period = |letter: u8| {
            let at = LETTERS.iter().position(|l| *l == letter).unwrap();
            CalendarPeriod::UNZONED[at]
        };
        assert_eq!(
            calendar.iter().map(|&l| period(l)).collect::<Vec<_>>(),
            [CalendarPeriod::Month, CalendarPeriod::Year]
        );
        // Each fixed letter's span is its period's: the script's window ends are ours.
        spans.sort_unstable();
        for (letter, seconds) in spans {
            let p = period(letter);
            for now in [0, 1_700_000_000 * SECOND + 7, 1_772_341_199 * SECOND] {
                let end = (now / SECOND / seconds + 1) * seconds * SECOND;
                assert_eq!(p.window_end(now), end, "{}", char::from(letter));
            }
        }
    }

    #[test]
    fn encode_writes_what_the_script_reads() {
        let at = 1_700_000_040 * SECOND;
        let month = Window::Calendar(CalendarPeriod::Month);
        let cases = [
            (Mode::CheckAndSpend, Window::Gcra, "0"),
            (Mode::CheckOnly, Window::Gcra, "1"),
            (Mode::Probe, Window::Gcra, "1"),
            (Mode::SpendOnly, Window::Gcra, "2"),
            (Mode::Charge, Window::Gcra, "3"),
            (Mode::CheckAndSpend, month, "0o"),
            (
                Mode::Charge,
                Window::Calendar(CalendarPeriod::Days365),
                "3z",
            ),
            (
                Mode::SpendOnly,
                Window::Calendar(CalendarPeriod::Second),
                "2s",
            ),
        ];
        for (mode, window, text) in cases {
            let encoded = WireMode::new(mode, window, at).encode();
            assert!(matches!(encoded, Cow::Borrowed(_)), "{text} allocated");
            assert_eq!(encoded, text);
        }
        // Every action and letter: the digit, then the letter.
        for action in Action::ALL {
            for (index, (period, letter)) in CalendarPeriod::UNZONED.iter().zip(LETTERS).enumerate()
            {
                let mode = WireMode {
                    action,
                    window: WireWindow::new(Window::Calendar(*period), at),
                };
                assert_eq!(mode.window, WireWindow::Letter(index));
                let text = [action as u8, letter];
                assert_eq!(mode.encode().as_bytes(), text);
            }
        }
        // 2023-11-14T22:14:00Z in New York: November's window and its neighbours.
        let zoned = CalendarPeriod::parse("1mo@America/New_York").unwrap();
        let mode = WireMode::new(Mode::Charge, Window::Calendar(zoned), at);
        assert_eq!(
            mode.encode(),
            "3x1696132800,1698811200,1701406800,1704085200"
        );
        assert_eq!(
            mode.window.refund_arg(0, 12),
            "x1696132800,1698811200,1701406800,1704085200:12"
        );
        let monthly = WireWindow::new(month, at);
        assert_eq!(monthly.refund_arg(0, 12), "o12");
        assert_eq!(WireWindow::Gcra.refund_arg(50_000_000, 1), "50000000");
    }
}
