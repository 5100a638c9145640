//! `cellrate simulate`: run limits over a scripted timeline on a fake clock.
//!
//! Input is JSON lines, one operation each, with `at_ns` counted from a fixed t0:
//!
//! ```text
//! {"at_ns": 0, "op": "spend", "bucket": "api", "cost": 1}
//! {"at_ns": 0, "op": "spend", "items": [{"bucket": "a"}, {"bucket": "b", "mode": "check_only"}]}
//! ```
//!
//! `op` is `spend`, `check` (decide without writing), `charge` (always recorded, into debt
//! if need be), `refund`, `reset`, or on a concurrency limit `acquire` / `release` with a
//! `lease` (an item's `mode` may be `acquire` or `release` too, with its own `lease`). Output is one
//! JSON line per input line: `{"allowed", "remaining", "retry_in_ns", "reset_in_ns"}`, plus
//! `"items"` for the batch form; a bad line gets `{"error": "..."}` and the run goes on.
//! The decisions go through the same [`Decider`] and memory store as the server's.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::clock::{CalendarPeriod, FakeClock, Nanos, SECOND};
use crate::gcra::{Decision, Limit, Mode};
use crate::limits::config::LimitTable;
use crate::limits::duration::parse_duration;
use crate::service::{Decider, ItemSpec, Target};
use crate::store::MemoryStore;

/// The fake clock's start: 2023-11-14T22:13:20Z. Only differences show in the output.
pub const T0: Nanos = 1_700_000_000 * SECOND;

/// Limits to simulate: labelled inline limits and/or a limits directory.
pub struct Script {
    labels: HashMap<String, Limit>,
    table: Option<LimitTable>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    at_ns: i64,
    op: Op,
    bucket: Option<String>,
    cost: Option<u64>,
    lease: Option<String>,
    items: Option<Vec<LineItem>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Op {
    Spend,
    Check,
    Charge,
    Refund,
    Reset,
    Acquire,
    Release,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LineItem {
    bucket: Option<String>,
    cost: Option<u64>,
    mode: Option<ModeName>,
    lease: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ModeName {
    CheckAndSpend,
    CheckOnly,
    SpendOnly,
    Charge,
    Acquire,
    Release,
}

/// Parses `LABEL=BURST/COUNT/PERIOD` (GCRA, e.g. `api=20/20/1s`) or
/// `LABEL=COUNT/WINDOW` (a calendar limit, e.g. `monthly=1000000/1mo`, or in a time zone
/// from an anchor day, `monthly=1000/1mo~15@America/New_York`).
pub fn parse_limit_flag(flag: &str) -> Result<(String, Limit), String> {
    let bad = |why: &str| {
        format!("--limit {flag:?}: {why} (expected LABEL=BURST/COUNT/PERIOD or LABEL=COUNT/WINDOW)")
    };
    let (label, spec) = flag.split_once('=').ok_or_else(|| bad("no '='"))?;
    if label.is_empty() || label.contains(':') {
        return Err(bad("the label must be non-empty and have no ':'"));
    }
    // A zoned window's zone has slashes of its own (`1000/1mo@America/New_York`).
    let parts: Vec<&str> = match spec.contains('@') {
        true => spec.splitn(2, '/').collect(),
        false => spec.split('/').collect(),
    };
    let number = |text: &str, what: &str| {
        text.parse::<u64>()
            .map_err(|_| bad(&format!("{what} is not a number")))
    };
    let limit = match parts[..] {
        [burst, count, period] => {
            let period = parse_duration(period).map_err(|e| bad(&e))?;
            Limit::new(number(burst, "burst")?, number(count, "count")?, period)
        }
        [count, window] => {
            let window = CalendarPeriod::parse(window).map_err(|e| bad(&e))?;
            Limit::calendar(number(count, "count")?, window)
        }
        _ => return Err(bad("two or three parts needed")),
    };
    Ok((label.to_string(), limit.map_err(|e| bad(&e.to_string()))?))
}

impl Script {
    /// From the command line's `--limit` flags and optional `--config` directory.
    pub fn from_args(flags: &[String], config: Option<&Path>) -> Result<Script, String> {
        let mut labels = HashMap::new();
        for flag in flags {
            let (label, limit) = parse_limit_flag(flag)?;
            if labels.insert(label.clone(), limit).is_some() {
                return Err(format!("--limit: label {label:?} given twice"));
            }
        }
        let table = match config {
            Some(dir) => Some(LimitTable::load_dir(dir).map_err(|e| e.to_string())?),
            None => None,
        };
        if labels.is_empty() && table.is_none() {
            return Err("give at least one --limit or a --config directory".to_string());
        }
        Ok(Script { labels, table })
    }

    /// Reads operations from `input` and writes one JSON line per operation to `output`.
    pub fn run(self, input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
        let clock = FakeClock::new(T0);
        let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
        let table = self.table.clone().unwrap_or_else(LimitTable::empty);
        let decider = Decider::new(Arc::new(ArcSwap::from_pointee(table)), store)
            .with_caller_limits(crate::service::CallerLimits::unbounded());
        let runtime = tokio::runtime::Builder::new_current_thread().build()?;
        let mut last_at = 0;
        for line in input.lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let answer = match serde_json::from_str::<Line>(&line) {
                Err(e) => Err(format!("bad line: {e}")),
                Ok(op) if op.at_ns < last_at => Err(format!(
                    "at_ns {} is before the previous line's {last_at}: time only moves forward",
                    op.at_ns
                )),
                Ok(op) => {
                    last_at = op.at_ns;
                    match T0.checked_add(op.at_ns) {
                        Some(now) => {
                            clock.set(now);
                            runtime.block_on(self.apply(&decider, op))
                        }
                        None => Err(format!("at_ns {} is too large", op.at_ns)),
                    }
                }
            };
            let value = answer.unwrap_or_else(|error| json!({ "error": error }));
            writeln!(output, "{value}")?;
        }
        output.flush()
    }

    fn target(&self, bucket: Option<&str>) -> Result<Target<'static>, String> {
        let bucket = match bucket {
            Some(bucket) => bucket,
            None if self.labels.len() == 1 => self.labels.keys().next().map_or("", |k| k),
            None => return Err("bucket is required unless exactly one --limit is given".into()),
        };
        if let Some(limit) = self.labels.get(bucket) {
            return Ok(Target::Inline {
                key: bucket.to_string().into(),
                limit: *limit,
            });
        }
        match (bucket.split_once(':'), &self.table) {
            (Some((name, id)), Some(_)) => Ok(Target::Named {
                name: name.to_string().into(),
                id: id.to_string().into(),
            }),
            _ => Err(format!(
                "unknown bucket {bucket:?}: a --limit label, or Name:id with --config"
            )),
        }
    }

    async fn apply(&self, decider: &Decider, line: Line) -> Result<Value, String> {
        let batch = line.items.is_some();
        let items: Vec<ItemSpec> = match line.items {
            Some(_) if line.bucket.is_some() || line.cost.is_some() || line.lease.is_some() => {
                return Err("give bucket, cost and lease inside items, not beside them".to_string())
            }
            Some(items) => items
                .into_iter()
                .map(|item| {
                    Ok(ItemSpec {
                        target: self.target(item.bucket.as_deref())?,
                        cost: item.cost,
                        limit: None,
                        lease: item.lease.map(Into::into),
                        mode: match (item.mode, line.op) {
                            (None, Op::Check) => Mode::CheckOnly,
                            (None, Op::Acquire) => Mode::Acquire,
                            (None, Op::Release) => Mode::Release,
                            (Some(ModeName::Acquire), _) => Mode::Acquire,
                            (Some(ModeName::Release), _) => Mode::Release,
                            (None, _) => Mode::CheckAndSpend,
                            (Some(ModeName::CheckAndSpend), _) => Mode::CheckAndSpend,
                            (Some(ModeName::CheckOnly), _) => Mode::CheckOnly,
                            (Some(ModeName::SpendOnly), _) => Mode::SpendOnly,
                            (Some(ModeName::Charge), _) => Mode::Charge,
                        },
                    })
                })
                .collect::<Result<_, String>>()?,
            None => vec![ItemSpec {
                target: self.target(line.bucket.as_deref())?,
                cost: line.cost,
                limit: None,
                lease: line.lease.map(Into::into),
                mode: match line.op {
                    Op::Check => Mode::CheckOnly,
                    Op::Acquire => Mode::Acquire,
                    Op::Release => Mode::Release,
                    Op::Charge => Mode::Charge,
                    _ => Mode::CheckAndSpend,
                },
            }],
        };
        let result = match line.op {
            Op::Spend | Op::Check | Op::Charge | Op::Acquire | Op::Release => {
                decider.check(&items).await
            }
            Op::Refund => decider.refund(&items).await,
            Op::Reset => match decider.reset(&items).await {
                // Report the buckets as they are after the reset.
                Ok(_) => decider.inspect(&items).await,
                Err(e) => Err(e),
            },
        }
        .map_err(|e| e.to_string())?;
        if !batch {
            return Ok(decision_json(&result.items[0].decision));
        }
        let mut value = decision_json(&result.overall);
        value["items"] = result
            .items
            .iter()
            .map(|item| decision_json(&item.decision))
            .collect();
        Ok(value)
    }
}

fn decision_json(d: &Decision) -> Value {
    json!({
        "allowed": d.allowed,
        "remaining": d.remaining,
        "retry_in_ns": d.retry_in,
        "reset_in_ns": d.reset_in,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(flags: &[&str], input: &str) -> Vec<Value> {
        let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
        let script = Script::from_args(&flags, None).unwrap();
        let mut out = Vec::new();
        script.run(input.as_bytes(), &mut out).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn limit_flags_are_checked() {
        assert!(parse_limit_flag("api=20/20/1s").is_ok());
        for bad in [
            "api",
            "=1/1/1s",
            "a:b=1/1/1s",
            "api=1/1",
            "api=x/1/1s",
            "api=1/1/1",
            "api=0/1/1s",
        ] {
            assert!(parse_limit_flag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn calendar_limits_count_per_window() {
        assert!(parse_limit_flag("monthly=1000000/1mo").is_ok());
        assert!(parse_limit_flag("bad=10/2w").is_err());
        let (_, zoned) = parse_limit_flag("billed=10/1mo~15@America/New_York").unwrap();
        assert_eq!(
            zoned.window(),
            crate::gcra::Window::Calendar(
                CalendarPeriod::parse("1mo~15@America/New_York").unwrap()
            )
        );
        assert!(parse_limit_flag("bad=10/1mo@America/Nowhere").is_err());
        assert!(parse_limit_flag("bad=0/1d").is_err());
        // t0 is 22:13:20 UTC: the minute's window ends 40 s later, whatever was spent.
        let s = SECOND;
        let out = run(
            &["m=2/1m"],
            &format!(
                "{{\"at_ns\": 0, \"op\": \"spend\"}}\n{{\"at_ns\": {}, \"op\": \"spend\"}}\n\
                 {{\"at_ns\": {}, \"op\": \"spend\"}}\n{{\"at_ns\": {}, \"op\": \"spend\"}}\n",
                30 * s,
                39 * s,
                40 * s
            ),
        );
        assert_eq!(out[0]["remaining"], 1);
        assert_eq!(out[0]["reset_in_ns"], 40 * s);
        assert_eq!(out[1]["remaining"], 0);
        assert_eq!(out[2]["allowed"], false);
        assert_eq!(out[2]["retry_in_ns"], s);
        assert_eq!(out[3]["allowed"], true);
        assert_eq!(out[3]["remaining"], 1);
        assert_eq!(out[3]["reset_in_ns"], 60 * s);
    }

    #[test]
    fn bad_lines_get_errors_and_the_run_goes_on() {
        let out = run(
            &["api=2/2/1s"],
            "not json\n{\"at_ns\": 5, \"op\": \"spend\"}\n{\"at_ns\": 1, \"op\": \"spend\"}\n\
             {\"at_ns\": 6, \"op\": \"spend\", \"bucket\": \"nope\"}\n\
             {\"at_ns\": 6, \"op\": \"spend\", \"cost\": 3}\n{\"at_ns\": 7, \"op\": \"spend\"}\n",
        );
        assert!(out[0]["error"].as_str().unwrap().contains("bad line"));
        assert_eq!(out[1]["remaining"], 1);
        assert!(out[2]["error"]
            .as_str()
            .unwrap()
            .contains("time only moves forward"));
        assert!(out[3]["error"].as_str().unwrap().contains("unknown bucket"));
        assert!(out[4]["error"]
            .as_str()
            .unwrap()
            .contains("exceeds the burst"));
        assert_eq!(out[5]["remaining"], 0);
    }

    /// Leases on a timeline: N acquires, the next denied, a retry and a release, and a
    /// leaked lease back after the hold.
    #[test]
    fn leases_on_a_timeline() {
        let dir = tempfile::tempdir().unwrap();
        let write = |file: &str, text: &str| std::fs::write(dir.path().join(file), text).unwrap();
        write("names.yaml", "InFlight: {number: 100, format: string}\n");
        write(
            "defaults.yaml",
            "InFlight: {window: concurrency, count: 2, period: 10s}\n",
        );
        let script = Script::from_args(&[], Some(dir.path())).unwrap();
        let input = [
            r#"{"at_ns": 0, "op": "acquire", "bucket": "InFlight:t", "lease": "a"}"#,
            r#"{"at_ns": 1000000000, "op": "acquire", "bucket": "InFlight:t", "lease": "b"}"#,
            r#"{"at_ns": 2000000000, "op": "acquire", "bucket": "InFlight:t", "lease": "c"}"#,
            r#"{"at_ns": 2000000000, "op": "acquire", "bucket": "InFlight:t", "lease": "a"}"#,
            r#"{"at_ns": 3000000000, "op": "release", "bucket": "InFlight:t", "lease": "b"}"#,
            r#"{"at_ns": 3000000000, "op": "release", "bucket": "InFlight:t", "lease": "b"}"#,
            r#"{"at_ns": 10000000000, "op": "spend", "items": [{"bucket": "InFlight:t", "mode": "acquire", "lease": "d"}]}"#,
            r#"{"at_ns": 10000000000, "op": "acquire", "bucket": "InFlight:t"}"#,
        ]
        .join("\n");
        let mut out = Vec::new();
        script.run(input.as_bytes(), &mut out).unwrap();
        let lines: Vec<Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let seen: Vec<(Value, Value)> = lines[..7]
            .iter()
            .map(|l| (l["allowed"].clone(), l["remaining"].clone()))
            .collect();
        let (t, f) = (Value::Bool(true), Value::Bool(false));
        let expect = [
            (&t, 1),
            (&t, 0),
            (&f, 0),
            (&t, 0),
            (&t, 1),
            (&f, 1),
            (&t, 1),
        ];
        for (i, ((allowed, remaining), (want, left))) in seen.iter().zip(expect).enumerate() {
            assert_eq!(
                (allowed, remaining.as_i64()),
                (want, Some(left)),
                "line {i}"
            );
        }
        assert_eq!(lines[5]["retry_in_ns"], 0);
        assert_eq!(lines[2]["retry_in_ns"], 8 * SECOND, "a expires at 10 s");
        let error = lines[7]["error"].as_str().unwrap();
        assert!(error.contains("lease_id: missing"), "{error}");
    }
}
