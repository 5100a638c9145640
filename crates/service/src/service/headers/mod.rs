//! The HTTP rate-limit headers of a batch's answer, in one of the styles
//! (`--rate-limit-headers` for Envoy's `response_headers_to_add`, `CheckRequest.headers`
//! for the native `Check`): one builder for both, so both answers say the same.
//!
//! A limit configured `headers: hidden` never appears in them, nor in a `Retry-After`:
//! when only hidden limits deny, there is no `Retry-After`. `openai.rs`: OpenAI's fields;
//! `trio.rs`: a descriptor's status and envoyproxy/ratelimit's three fields made from it.

mod openai;
pub(crate) mod trio;

pub use trio::{requests_per_unit, HeaderNames, ResetStyle};

use std::collections::HashMap;

use crate::service::{ItemResult, Rule};
use cellrate_core::clock::{Nanos, SECOND};
use cellrate_core::gcra::{Decision, Limit};

use openai::ceil_millis;

/// Which rate-limit headers an answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HeaderStyle {
    /// No rate-limit fields (Envoy's answer still has `Retry-After` on OVER_LIMIT unless
    /// turned off; a native Check gets no header at all).
    #[default]
    Off,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (Envoy's draft 03).
    Draft03,
    /// The IETF `RateLimit-Policy` and `RateLimit` structured fields, every limit named.
    Ietf,
    /// envoyproxy/ratelimit's three: the limit, the remaining and the reset of the
    /// descriptor (in a native Check, the item) closest to its limit (an over-limit one
    /// first), RateLimit-Limit, -Remaining and -Reset unless renamed.
    Ratelimit,
    /// OpenAI's: `x-ratelimit-limit-`, `-remaining-` and `-reset-requests` for the
    /// strictest limit that `measures: requests`, the same `-tokens` for the strictest
    /// that `measures: tokens`; resets as `1s`, `6m0s`, `20ms`; `retry-after-ms` beside
    /// `Retry-After`.
    Openai,
}

/// One header field, as both answers carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: String,
}

pub(crate) fn header(name: &str, value: String) -> Header {
    Header {
        name: name.to_string(),
        value,
    }
}

/// An item that decides: limited (including shadow) or deny-listed.
pub(crate) fn restricts(item: &ItemResult) -> bool {
    item.rule.restricts()
}

/// A denial that is enforced (not in shadow mode).
pub(crate) fn enforced_denial(item: &ItemResult) -> bool {
    restricts(item) && !item.decision.allowed && !item.shadow
}

/// An item the answer may describe: its limit is not `headers: hidden`.
pub(crate) fn visible(item: &ItemResult) -> bool {
    !item.headers.hidden
}

/// The strictest of `items` by the batch rule, if any.
pub(crate) fn strictest<'a>(items: impl Iterator<Item = &'a ItemResult>) -> Option<&'a ItemResult> {
    items.fold(None, |best: Option<&ItemResult>, item| match best {
        Some(b) if !item.decision.is_stricter_than(&b.decision) => Some(b),
        _ => Some(item),
    })
}

/// Time to report: until the cost passes when denied, until full when allowed.
pub(crate) fn until_reset(d: &Decision) -> Nanos {
    if d.allowed {
        d.reset_in
    } else {
        d.retry_in
    }
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_seconds(nanos: Nanos) -> i64 {
    let nanos = nanos.max(0);
    nanos / SECOND + i64::from(nanos % SECOND != 0)
}

/// The visible item that fired (or, when none did, the one closest to firing).
pub(crate) fn fired(results: &[ItemResult]) -> Option<&ItemResult> {
    let shown = || results.iter().filter(|i| visible(i));
    if shown().any(enforced_denial) {
        strictest(shown().filter(|i| enforced_denial(i)))
    } else {
        strictest(shown().filter(|i| restricts(i) && !i.shadow))
    }
}

/// The fields of `style` that are made from the items alone: draft 03, the IETF fields
/// and OpenAI's (envoyproxy/ratelimit's three come from descriptor statuses: `trio.rs`).
/// `top` is [`fired`]`(results)`, which the caller has found once for the whole answer.
pub(crate) fn rate_limit_headers(
    style: HeaderStyle,
    top: Option<&ItemResult>,
    results: &[ItemResult],
    out: &mut Vec<Header>,
) {
    match style {
        HeaderStyle::Off | HeaderStyle::Ratelimit => {}
        HeaderStyle::Draft03 => {
            if let Some(item) = top.filter(|i| matches!(i.rule, Rule::Limited(_))) {
                draft03_headers(item, results, out);
            }
        }
        HeaderStyle::Ietf => ietf_headers(results, out),
        HeaderStyle::Openai => openai::openai_headers(results, out),
    }
}

/// `Retry-After` (and OpenAI's `retry-after-ms`) when a visible limit's enforced denial
/// fired (`top`, [`fired`] of the answer's items): an abuse guard does not tell when to
/// retry.
pub(crate) fn retry_after(style: HeaderStyle, top: Option<&ItemResult>, out: &mut Vec<Header>) {
    let Some(item) = top.filter(|i| enforced_denial(i)) else {
        return;
    };
    let retry = item.decision.retry_in;
    if retry > 0 {
        out.push(header("Retry-After", ceil_seconds(retry).to_string()));
        if style == HeaderStyle::Openai {
            out.push(header("retry-after-ms", ceil_millis(retry).to_string()));
        }
    }
}

/// A native `Check`'s headers: the fields of `style`, each item taken as its own
/// descriptor for envoyproxy/ratelimit's three, then `Retry-After`. Off: none at all.
pub(crate) fn for_items(style: HeaderStyle, results: &[ItemResult]) -> Vec<Header> {
    let mut out = Vec::new();
    let top = fired(results);
    match style {
        HeaderStyle::Off => return out,
        HeaderStyle::Ratelimit => trio::for_items(results, &mut out),
        _ => rate_limit_headers(style, top, results, &mut out),
    }
    retry_after(style, top, &mut out);
    out
}

/// `q` and `w`: count per period, the period in whole seconds (rounded up).
fn quota(limit: &Limit) -> (u64, i64) {
    (limit.count(), ceil_seconds(limit.period()).max(1))
}

/// Envoy's draft 03: the limit closest to firing first, then every limit's policy.
fn draft03_headers(fired: &ItemResult, results: &[ItemResult], headers: &mut Vec<Header>) {
    let Rule::Limited(limit) = fired.rule else {
        return;
    };
    let (q, _) = quota(&limit);
    let mut policies = vec![q.to_string()];
    for item in results.iter().filter(|i| !i.shadow && visible(i)) {
        if let Rule::Limited(limit) = item.rule {
            let (q, w) = quota(&limit);
            policies.push(format!("{q};w={w}"));
        }
    }
    headers.push(header("X-RateLimit-Limit", policies.join(", ")));
    headers.push(header(
        "X-RateLimit-Remaining",
        fired.decision.remaining.max(0).to_string(),
    ));
    headers.push(header(
        "X-RateLimit-Reset",
        ceil_seconds(until_reset(&fired.decision)).to_string(),
    ));
}

/// The IETF fields, one member per limit, named (repeated names get `-2`, `-3`, ...).
fn ietf_headers(results: &[ItemResult], headers: &mut Vec<Header>) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut policy = Vec::new();
    let mut state = Vec::new();
    for item in results.iter().filter(|i| !i.shadow && visible(i)) {
        let Rule::Limited(limit) = item.rule else {
            continue;
        };
        let n = seen.entry(&item.name).or_insert(0);
        *n += 1;
        let name = if *n == 1 {
            item.name.to_string()
        } else {
            format!("{}-{n}", item.name)
        };
        let name = sf_string(&name);
        let (q, w) = quota(&limit);
        policy.push(format!("{name};q={q};w={w}"));
        let d = item.decision;
        state.push(format!(
            "{name};r={};t={}",
            d.remaining.max(0),
            ceil_seconds(until_reset(&d))
        ));
    }
    if !policy.is_empty() {
        headers.push(header("RateLimit-Policy", policy.join(", ")));
        headers.push(header("RateLimit", state.join(", ")));
    }
}

/// A structured-field string (RFC 8941): quoted, with `"` and `\` escaped, printable ASCII.
fn sf_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_field_strings_are_escaped() {
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_string("é"), "\"?\"");
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_seconds(1), 1);
        assert_eq!(ceil_seconds(SECOND), 1);
        assert_eq!(ceil_seconds(SECOND + 1), 2);
        assert_eq!(ceil_seconds(0), 0);
        assert_eq!(ceil_seconds(-3), 0);
    }
}
