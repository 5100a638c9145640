//! Text that reaches a log line, an error or a peer: caller text cut to a bound (at a
//! character boundary), an error with its causes on one line, and how often a kind of
//! line may be written ([`LogEvery`]). Every layer uses these; they use nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Which lines of one kind reach the log, so that a client repeating a fault cannot flood
/// it: the first, then at most one per interval, each told how many were left out since
/// the line before. Lock-free: of callers racing for a due line, one writes it and the
/// others are counted as left out.
#[derive(Debug)]
pub struct LogEvery {
    every: u64,
    /// The `now` (plus one; 0 before any line) of the last line written.
    last: AtomicU64,
    /// Events counted since the last line, the admitted call's own included until taken.
    pending: AtomicU64,
}

impl LogEvery {
    /// At most one line in `every`.
    pub const fn new(every: Duration) -> LogEvery {
        LogEvery {
            every: every.as_nanos() as u64,
            last: AtomicU64::new(0),
            pending: AtomicU64::new(0),
        }
    }

    /// Counts `events` at `now` (any monotonic time, as a duration since an origin of the
    /// caller's): `Some(events left out since the last line)`, this call's not counted,
    /// when this call is to write its line; `None` when it is only counted.
    pub fn admit(&self, now: Duration, events: u64) -> Option<u64> {
        let pending = self.pending.fetch_add(events, Ordering::Relaxed) + events;
        let stamp = (now.as_nanos() as u64).saturating_add(1);
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || stamp >= last.saturating_add(self.every);
        if due
            && (self.last)
                .compare_exchange(last, stamp, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.pending.fetch_sub(pending, Ordering::Relaxed);
            return Some(pending - events);
        }
        None
    }
}

/// Whether `id` is an id a caller may give for a lease, a kept Check or a reservation:
/// 1 to `max` bytes of printable ASCII, no spaces (0x21 to 0x7e), so that it can be
/// keyed, logged and shown as it is, and no id is empty or a space away from another.
pub fn is_plain_id(id: &str, max: usize) -> bool {
    !id.is_empty() && id.len() <= max && id.bytes().all(|b| b.is_ascii_graphic())
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub fn cut_bytes(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The first `n` characters of `text`.
pub fn first_chars(text: &str, n: usize) -> &str {
    match text.char_indices().nth(n) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// An error and its causes, on one line (a transport error's reason is in its causes).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

/// Whether `c` would act on a terminal or a log reader rather than show: a control
/// character (C0, DEL, C1: ESC, CR, LF, NUL, the OSC introducer), a format character
/// (bidirectional overrides such as U+202E, zero-width ones such as U+200B, the BOM, tag
/// characters) or a line or paragraph separator (U+2028, U+2029).
pub fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{0600}'..='\u{0605}'
                | '\u{061C}'
                | '\u{06DD}'
                | '\u{070F}'
                | '\u{0890}'..='\u{0891}'
                | '\u{08E2}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{110BD}'
                | '\u{110CD}'
                | '\u{13430}'..='\u{1343F}'
                | '\u{1BCA0}'..='\u{1BCA3}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0001}'
                | '\u{E0020}'..='\u{E007F}'
        )
}

/// `text` with every [`unprintable`] character written as `\u{XXXX}`: safe to print to a
/// terminal or a human log line (unchanged, and not copied, when there is none).
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(unprintable) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unprintable(c) {
            out.push_str(&format!("\\u{{{:04X}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The first [`unprintable`] character of `text` and its byte offset, for an error that
/// refuses it.
pub fn first_unprintable(text: &str) -> Option<(usize, char)> {
    text.char_indices().find(|&(_, c)| unprintable(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_and_log_controls_are_escaped_and_text_is_kept() {
        assert_eq!(printable("admin"), "admin");
        assert!(matches!(
            printable("é ü 日本 O'Brien \"q\""),
            std::borrow::Cow::Borrowed(_)
        ));
        let hostile = "ad\u{200B}min\u{202E}\x1b]52;c;aGk=\x07\r\nfake\u{2028}\0";
        let shown = printable(hostile);
        assert_eq!(
            shown,
            "ad\\u{200B}min\\u{202E}\\u{001B}]52;c;aGk=\\u{0007}\\u{000D}\\u{000A}fake\\u{2028}\\u{0000}"
        );
        assert!(!shown.chars().any(unprintable));
        assert_eq!(first_unprintable("ok\x1bx"), Some((2, '\x1b')));
        assert_eq!(first_unprintable("fine"), None);
        // C1 controls (0x9B is a one-byte CSI on some terminals).
        assert!(unprintable('\u{9B}'));
    }

    #[test]
    fn a_kind_of_line_is_written_once_per_interval_with_what_was_left_out() {
        let log = LogEvery::new(Duration::from_secs(10));
        let at = |ms: u64| Duration::from_millis(ms);
        assert_eq!(log.admit(at(0), 1), Some(0), "the first is written");
        let within: Vec<_> = (1..=1000).map(|i| log.admit(at(i * 9), 1)).collect();
        assert!(within.iter().all(Option::is_none), "{within:?}");
        assert_eq!(
            log.admit(at(10_000), 3),
            Some(1000),
            "due again, with the 1 000"
        );
        assert_eq!(log.admit(at(10_001), 1), None);
        assert_eq!(log.admit(at(60_000), 1), Some(1));
        assert_eq!(LogEvery::new(Duration::ZERO).admit(at(5), 2), Some(0));
    }

    #[test]
    fn racing_callers_write_one_line_and_lose_no_count() {
        let log = LogEvery::new(Duration::from_secs(3600));
        let written: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..1000)
                            .filter(|_| log.admit(Duration::ZERO, 1).is_some())
                            .count() as u64
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(written, 1);
        assert_eq!(log.admit(Duration::from_secs(3600), 1), Some(3999));
    }

    #[test]
    fn plain_ids_are_printable_bounded_and_never_empty() {
        assert!(is_plain_id("lease-1:a/b=c", 13));
        assert!(!is_plain_id("lease-1:a/b=c", 12));
        assert!(!is_plain_id("", 8));
        assert!(!is_plain_id("a b", 8));
        assert!(!is_plain_id("caf\u{e9}", 8));
        assert!(!is_plain_id("a\x7f", 8));
    }

    #[test]
    fn cuts_at_character_boundaries() {
        assert_eq!(cut_bytes("ab\u{e9}", 3), "ab");
        assert_eq!(cut_bytes("abc", 10), "abc");
        assert_eq!(first_chars("\u{e9}\u{e9}\u{e9}", 2), "\u{e9}\u{e9}");
        assert_eq!(first_chars("ab", 5), "ab");
    }

    #[test]
    fn an_error_says_its_causes() {
        assert_eq!(error_chain(&std::io::Error::other("refused")), "refused");
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("connecting")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::other("refused"));
        assert_eq!(error_chain(&e), "connecting: refused");
    }
}
