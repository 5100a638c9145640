//! Answers for people and for scripts: rows for an aligned table, the same as JSON, and
//! durations written the way people read them.

use serde_json::json;

use super::{Answer, Exit, Failed};
use crate::cli::ClientItemArgs;
use crate::proto::v1 as pb;

pub(super) fn one(mut items: Vec<pb::Decision>) -> Result<pb::Decision, Failed> {
    match items.len() {
        1 => Ok(items.remove(0)),
        n => Err(Failed(
            Exit::Failure,
            format!("the server answered {n} decisions for one item"),
        )),
    }
}

pub(super) fn nanos(d: Option<&prost_types::Duration>) -> i64 {
    d.map_or(0, |d| {
        d.seconds
            .saturating_mul(1_000_000_000)
            .saturating_add(i64::from(d.nanos))
    })
}

fn policy(decision: &pb::Decision) -> &'static str {
    match pb::Policy::try_from(decision.policy) {
        Ok(pb::Policy::Limited) => "limited",
        Ok(pb::Policy::Unlimited) => "unlimited",
        Ok(pb::Policy::Denied) => "denied",
        Ok(pb::Policy::NotConfigured) => "not_configured",
        Err(_) => "unknown",
    }
}

pub(super) fn decision_answer(args: &ClientItemArgs, d: &pb::Decision, exit: Exit) -> Answer {
    let limit = d.limit.clone().unwrap_or_default();
    let period = nanos(limit.period.as_ref());
    let (retry, reset) = (nanos(d.retry_after.as_ref()), nanos(d.reset_after.as_ref()));
    let limit_text = if limit.burst == 0 {
        "-".to_string()
    } else if limit.concurrency == Some(true) {
        format!("{} in flight, hold {}", limit.count, duration(period))
    } else if let Some(calendar) = &limit.calendar {
        format!("{} per calendar {calendar}", limit.count)
    } else {
        format!(
            "{} per {}, burst {}",
            limit.count,
            duration(period),
            limit.burst
        )
    };
    let mut json = json!({
        "name": args.name,
        "id": args.id,
        "allowed": d.allowed,
        "remaining": d.remaining,
        "retry_after_ns": retry,
        "reset_after_ns": reset,
        "limit": {
            "name": limit.name,
            "key": limit.key,
            "burst": limit.burst,
            "count": limit.count,
            "period_ns": period,
        },
        "policy": policy(d),
    });
    // A calendar limit's window; left out for GCRA (the common case).
    if let Some(calendar) = &limit.calendar {
        json["limit"]["calendar"] = calendar.clone().into();
    }
    Answer {
        rows: vec![
            [
                "NAME",
                "ID",
                "ALLOWED",
                "REMAINING",
                "RETRY AFTER",
                "RESET AFTER",
                "LIMIT",
                "POLICY",
            ]
            .map(String::from)
            .to_vec(),
            vec![
                args.name.clone(),
                args.id.clone(),
                if d.allowed { "yes" } else { "no" }.to_string(),
                d.remaining.to_string(),
                duration(retry),
                duration(reset),
                limit_text,
                policy(d).to_string(),
            ],
        ],
        json,
        exit,
        after: Vec::new(),
    }
}

/// A duration for people: `0s`, `18s`, `3h`, `1m30s`; under a minute with a fraction,
/// seconds to the millisecond rounded up (`17.488s`); from a minute, whole seconds rounded
/// up: a wait is never understated.
pub fn duration(ns: i64) -> String {
    const S: i64 = 1_000_000_000;
    if ns <= 0 {
        return "0s".to_string();
    }
    if ns % S != 0 && ns < 60 * S {
        let ms = (ns + 999_999) / 1_000_000;
        return format!("{}.{:03}s", ms / 1000, ms % 1000);
    }
    // A minute or more: whole seconds, rounded up.
    let mut seconds = (ns + S - 1) / S;
    let mut text = String::new();
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if seconds >= size {
            text.push_str(&format!("{}{unit}", seconds / size));
            seconds %= size;
        }
    }
    text
}

/// Rows as columns aligned on two spaces (no trailing spaces). Cells come from the server
/// (ids, comments, authors): control and format characters are shown escaped, never sent to
/// the terminal.
pub fn table(rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<std::borrow::Cow<'_, str>>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| crate::text::printable(cell))
                .collect()
        })
        .collect();
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if c + 1 < row.len() {
                let pad = widths[c] - cell.chars().count() + 2;
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_for_people() {
        let s = 1_000_000_000;
        assert_eq!(duration(0), "0s");
        assert_eq!(duration(18 * s), "18s");
        assert_eq!(duration(10_800 * s), "3h");
        assert_eq!(duration(90 * s), "1m30s");
        assert_eq!(duration(86_400 * s + 1), "1d1s");
        assert_eq!(duration(1_799_968_000_000), "30m");
        assert_eq!(duration(17_487_432_278), "17.488s");
        assert_eq!(duration(1), "0.001s");
    }

    #[test]
    fn tables_align_columns() {
        let rows = vec![
            vec!["A".to_string(), "LONG HEADER".into(), "C".into()],
            vec!["wide value".to_string(), "x".into(), "".into()],
        ];
        assert_eq!(table(&rows), "A           LONG HEADER  C\nwide value  x\n");
    }
}
