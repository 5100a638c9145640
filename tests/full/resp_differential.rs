//! Differential tests: the same generated `CL.THROTTLE` sequences against the real
//! redis-cell 0.2.2 (built from its crates.io source and loaded into a real redis-server)
//! and against cellrate's Redis-protocol listener (the real binary), comparing all five
//! numbers of every reply and the text of every error.
//!
//! The sequences mix many keys, bursts, costs above one, peeks (quantity 0), costs above
//! the whole burst, parameter changes on a key, waits across refills, and malformed calls.
//!
//! **The tolerance that remains, and why.** Both servers read the wall clock, and the two
//! calls of a step cannot run at the same nanosecond: they are sent one after the other
//! (in alternating order), so their `now`s differ by the time between them (well under a
//! millisecond here), and so do the TATs they store. redis-cell also lets a key expire up
//! to 1 ms before its TAT (it truncates the time to live to whole milliseconds). Every
//! number redis-cell replies is a floor or a truncation of a time (`remaining` in
//! emission intervals, `retry_after` and `reset_after` in whole seconds), so when a step
//! of such a rounding falls between the two `now`s, the two answers differ there by one.
//! A step may therefore differ only so:
//! - *a straddled rounding*: `limited` and `limit` equal, each other number off by at most
//!   one;
//! - *a straddled refill*: `limited` differs, and the limited side's `retry_after` is 0
//!   (its token was due within the second). The two buckets then legitimately differ by
//!   one call's cost, so that key is retired (both continue on a fresh key).
//!
//! Such steps are printed, and at most 1 % of the steps may be either. Everything else —
//! every error, every step not at a rounding edge — must be identical, and a mismatch
//! prints the step, its arguments and both replies.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::redis_cell::redis_with_cell;
#[cfg(feature = "redis")]
use crate::common::redis_server::RedisServer;
use crate::common::resp_client::{Reply, RespClient};
use crate::common::{serve_with, Rng};

/// Rates as (count, period in seconds): emission intervals from 100 ms to 10 s, several
/// of them not whole in nanoseconds (7 per 3 s), so that redis-cell's f64 truncation shows,
/// and the common quotas (a day, a week, a 30-day month, a year) that the default bounds
/// on caller-given limits must take.
const RATES: [(i64, i64); 18] = [
    (1, 1),
    (2, 1),
    (3, 1),
    (5, 1),
    (10, 1),
    (3, 2),
    (7, 3),
    (10, 3),
    (30, 60),
    (2, 5),
    (1, 10),
    (100, 60),
    (4, 10),
    (1, 86_400),
    (1_000, 86_400),
    (1, 604_800),
    (30, 2_592_000),
    (12, 31_536_000),
];

const KEYS: usize = 12;

/// A step: a pause before it, then one command.
struct Step {
    wait: Duration,
    args: Vec<String>,
    /// The key slot of a `CL.THROTTLE` with a valid shape, to retire after a refill.
    slot: Option<usize>,
}

/// One generated sequence: `steps` commands over [`KEYS`] keys, each with parameters of its
/// own that sometimes change.
fn generate(seed: u64, steps: usize) -> Vec<(usize, Step)> {
    let mut rng = Rng(seed | 1);
    let mut params: Vec<(i64, i64, i64)> = (0..KEYS)
        .map(|_| {
            let (count, period) = RATES[rng.below(RATES.len() as u64) as usize];
            (rng.below(13) as i64, count, period)
        })
        .collect();
    (0..steps)
        .map(|i| {
            let wait = if rng.chance(10) {
                Duration::from_millis(20 + rng.below(600))
            } else {
                Duration::ZERO
            };
            let slot = rng.below(KEYS as u64) as usize;
            if rng.chance(5) {
                let (count, period) = RATES[rng.below(RATES.len() as u64) as usize];
                params[slot] = (rng.below(13) as i64, count, period);
            }
            let (burst, count, period) = params[slot];
            let mut args = vec![
                "CL.THROTTLE".to_string(),
                String::new(), // the key, named at run time (keys are retired)
                burst.to_string(),
                count.to_string(),
                period.to_string(),
            ];
            match rng.below(100) {
                0..=59 => {}
                60..=69 => args.push("0".into()),
                70..=74 => args.push("1".into()),
                75..=94 => args.push((2 + rng.below(burst as u64 + 3)).to_string()),
                // Malformed calls: both sides must give the same error.
                _ => {
                    match rng.below(6) {
                        0 => args.truncate(4),
                        1 => args.extend(["1".into(), "extra".into()]),
                        2 => args[2] = "x".into(),
                        3 => args[3] = "1.5".into(),
                        4 => args[4] = String::new(),
                        // Rust's integers take a sign: redis-cell accepts "+3", so must we.
                        _ => args[2] = format!("+{burst}"),
                    }
                    let shaped = args.len() == 5 || args.len() == 6;
                    let valid = shaped && args[2..].iter().all(|a| a.parse::<i64>().is_ok());
                    return (
                        i,
                        Step {
                            wait,
                            args,
                            slot: valid.then_some(slot),
                        },
                    );
                }
            }
            (
                i,
                Step {
                    wait,
                    args,
                    slot: Some(slot),
                },
            )
        })
        .collect()
}

/// What a run found.
#[derive(Default, Debug)]
struct Tally {
    identical: usize,
    edges: Vec<String>,
    allowed: usize,
    limited: usize,
    errors: usize,
}

fn call(client: &mut RespClient, args: &[String]) -> Reply {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    client.call(&args)
}

/// Runs `seed`'s sequence against both, asserting identity up to the stated tolerance.
fn run(seed: u64, steps: usize, cell: &mut RespClient, ours: &mut RespClient) -> Tally {
    let mut tally = Tally::default();
    let mut generation = [0u32; KEYS];
    let started = Instant::now();
    for (i, mut step) in generate(seed, steps) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "seed {seed}: the sequence overran its time"
        );
        std::thread::sleep(step.wait);
        let slot = step.slot.unwrap_or(0);
        if step.args.len() > 1 {
            step.args[1] = format!("diff:{seed}:{slot}:{}", generation[slot]);
        }
        // Alternate who goes first, so that neither side is always the later clock.
        let (a, b) = if i % 2 == 0 {
            let a = call(cell, &step.args);
            (a, call(ours, &step.args))
        } else {
            let b = call(ours, &step.args);
            (call(cell, &step.args), b)
        };
        let context = || {
            format!(
                "seed {seed} step {i}: {}\n  redis-cell: {a:?}\n  cellrate:   {b:?}",
                step.args.join(" ")
            )
        };
        match (&a, &b) {
            (Reply::Error(_), _) | (_, Reply::Error(_)) => {
                assert_eq!(a, b, "{}", context());
                tally.errors += 1;
                continue;
            }
            _ if a == b => {
                tally.identical += 1;
            }
            _ => {
                let (x, y) = (a.integers(), b.integers());
                assert_eq!(x[1], y[1], "limits differ: {}", context());
                if x[0] == y[0] {
                    assert!(
                        (2..5).all(|k| (x[k] - y[k]).abs() <= 1),
                        "more than a straddled rounding: {}",
                        context()
                    );
                    tally.edges.push(format!("rounding: {}", context()));
                } else {
                    let limited = if x[0] == 1 { &x } else { &y };
                    assert_eq!(
                        limited[3],
                        0,
                        "`limited` differs away from a refill: {}",
                        context()
                    );
                    tally.edges.push(format!("refill: {}", context()));
                    generation[slot] += 1;
                }
            }
        }
        let limited = b.integers()[0];
        if limited == 0 {
            tally.allowed += 1;
        } else {
            tally.limited += 1;
        }
    }
    tally
}

/// Runs the seeds and checks the tally: identical but for at most 1 % of edge steps, and
/// the sequences really exercised allowing, limiting and errors.
pub(crate) fn differential(seeds: &[u64], steps: usize, cell_addr: &str, ours_addr: &str) {
    let mut cell = RespClient::connect(cell_addr);
    let mut ours = RespClient::connect(ours_addr);
    let mut total = Tally::default();
    for &seed in seeds {
        let t = run(seed, steps, &mut cell, &mut ours);
        total.identical += t.identical;
        total.allowed += t.allowed;
        total.limited += t.limited;
        total.errors += t.errors;
        total.edges.extend(t.edges);
    }
    for edge in &total.edges {
        eprintln!("within tolerance: {edge}");
    }
    let all = seeds.len() * steps;
    eprintln!(
        "differential: {all} steps, {} identical numbers, {} errors identical, {} at a rounding edge ({} allowed, {} limited)",
        total.identical,
        total.errors,
        total.edges.len(),
        total.allowed,
        total.limited
    );
    assert!(
        total.edges.len() * 100 <= all,
        "{} of {all} steps at a rounding edge: more than 1 %",
        total.edges.len()
    );
    assert!(
        total.allowed > all / 5 && total.limited > all / 10,
        "{total:?}"
    );
    assert!(total.errors > all / 50, "{total:?}");
}

fn config() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"))
}

#[test]
fn cl_throttle_answers_as_redis_cell_on_the_memory_store() {
    let redis = redis_with_cell();
    let cellrate = serve_with(config(), &["--resp-listen", "127.0.0.1:0"]);
    differential(
        &[1, 2, 3],
        250,
        &format!("127.0.0.1:{}", redis.port),
        &cellrate.resp,
    );
}

#[cfg(feature = "redis")]
#[test]
fn cl_throttle_answers_as_redis_cell_on_the_redis_store() {
    let redis = redis_with_cell();
    let store = RedisServer::start();
    let cellrate = serve_with(
        config(),
        &[
            "--resp-listen",
            "127.0.0.1:0",
            "--store",
            "redis",
            "--redis-url",
            &store.url(),
            // The answers are compared, not the deadline: the old default 10 ms failed a first
            // call on a loaded two-core CI machine ("no answer within 10ms").
            "--redis-timeout-ms",
            "1000",
        ],
    );
    differential(
        &[4, 5],
        200,
        &format!("127.0.0.1:{}", redis.port),
        &cellrate.resp,
    );
}
