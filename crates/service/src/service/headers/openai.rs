//! OpenAI's rate-limit headers, as its API sends them and its clients (openai-python,
//! LiteLLM, the OpenAI-compatible gateways) read them: for requests and for tokens, the
//! limit, what remains and the time until the limit is back to its initial state
//! (full), as a Go-style duration (`1s`, `6m0s`, `20ms`, `1h2m3.5s`).
//!
//! Each kind shows one limit: among the visible, enforced limits that measure it, the
//! strictest by the batch rule (a denied one first, then the longer wait, then the fewer
//! remaining). The limit is the burst: what `remaining` counts down from.

use super::{header, strictest, visible, Header};
use crate::service::{ItemResult, Rule};
use cellrate_core::clock::Nanos;
use cellrate_limits::config::Measures;

/// Nanoseconds in a millisecond.
const MILLI: Nanos = 1_000_000;

/// Adds the `-requests` and the `-tokens` fields, each when some visible limit measures it.
pub(super) fn openai_headers(results: &[ItemResult], headers: &mut Vec<Header>) {
    for (measures, kind) in [
        (Measures::Requests, "requests"),
        (Measures::Tokens, "tokens"),
    ] {
        let candidates = results
            .iter()
            .filter(|i| visible(i) && !i.shadow && i.headers.measures == measures && limited(i));
        let Some(item) = strictest(candidates) else {
            continue;
        };
        let Rule::Limited(limit) = item.rule else {
            continue;
        };
        let d = item.decision;
        headers.push(header(
            &format!("x-ratelimit-limit-{kind}"),
            limit.burst().to_string(),
        ));
        headers.push(header(
            &format!("x-ratelimit-remaining-{kind}"),
            d.remaining.max(0).to_string(),
        ));
        headers.push(header(
            &format!("x-ratelimit-reset-{kind}"),
            duration(d.reset_in),
        ));
    }
}

fn limited(item: &ItemResult) -> bool {
    matches!(item.rule, Rule::Limited(_))
}

/// Whole milliseconds, rounded up (a client told to wait never comes back too early).
pub(super) fn ceil_millis(nanos: Nanos) -> i64 {
    let nanos = nanos.max(0);
    nanos / MILLI + i64::from(nanos % MILLI != 0)
}

/// `nanos` as OpenAI writes a reset (Go's `time.Duration` format), rounded up to the
/// millisecond: under a second in milliseconds (`20ms`, `0s` for nothing), else hours,
/// minutes and seconds with the seconds' fraction (`1s`, `1.5s`, `6m0s`, `1h0m0s`).
fn duration(nanos: Nanos) -> String {
    let ms = ceil_millis(nanos);
    if ms == 0 {
        return "0s".to_string();
    }
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let (hours, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let (seconds, fraction) = (rest / 1_000, rest % 1_000);
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&seconds.to_string());
    if fraction > 0 {
        let digits = format!("{fraction:03}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    out.push('s');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::SECOND;

    #[test]
    fn resets_are_written_as_openai_writes_them() {
        let cases = [
            (0, "0s"),
            (-5, "0s"),
            (1, "1ms"),
            (20 * MILLI, "20ms"),
            (999 * MILLI, "999ms"),
            (999 * MILLI + 1, "1s"),
            (SECOND, "1s"),
            (1_500 * MILLI, "1.5s"),
            (SECOND + 20 * MILLI, "1.02s"),
            (59 * SECOND + 999 * MILLI, "59.999s"),
            (60 * SECOND, "1m0s"),
            (360 * SECOND, "6m0s"),
            (3_600 * SECOND, "1h0m0s"),
            (3_723 * SECOND, "1h2m3s"),
            (3_723 * SECOND + 500 * MILLI, "1h2m3.5s"),
            (86_400 * SECOND, "24h0m0s"),
        ];
        for (nanos, text) in cases {
            assert_eq!(duration(nanos), text, "{nanos} ns");
        }
        assert_eq!(ceil_millis(1), 1);
        assert_eq!(ceil_millis(MILLI), 1);
        assert_eq!(ceil_millis(MILLI + 1), 2);
        assert_eq!(ceil_millis(-1), 0);
    }
}
