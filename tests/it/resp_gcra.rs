//! `GCRA` (Redis 8.8's command) and `RL.THROTTLE` (valkey-io/valkey#4081) on cellrate's
//! Redis-protocol listener, compared step by step with an independent model of each
//! command's documented answers.
//!
//! No server ships either command (Redis 8.8 held `GCRA` back), so the reference is a model
//! written here from the documentation and the reference sources, not from cellrate's code:
//! `GCRA` in Redis's integer microseconds (interval rounded to the nearest microsecond,
//! waits rounded up to whole seconds), `RL.THROTTLE` in redis-cell's arithmetic (interval in
//! floating point truncated to nanoseconds, seconds truncated). The server runs in this
//! process on a fake clock that the test moves in whole milliseconds (Redis's own clock
//! granularity), so every reply must be identical: there is no tolerance.

use std::collections::HashMap;

use cellrate::clock::Clock;

use crate::common::resp_client::{Reply, RespClient};
use crate::common::{Rng, Served, MS, T0};

type Answer = Result<[i64; 5], String>;

/// Redis 8.8's `GCRA`, as its documentation and `src/gcra.c` state it, in microseconds.
/// `tat` is the key's stored TAT (microseconds), absent once expired.
fn gcra_model(args: &[String], tat: &mut Option<i64>, now_us: i64) -> Answer {
    if !(5..=7).contains(&args.len()) {
        return Err("ERR wrong number of arguments for 'gcra' command".into());
    }
    let int = |s: &str| {
        s.parse::<i64>()
            .map_err(|_| "ERR value is not an integer or out of range".to_string())
    };
    let max_burst = int(&args[2])?;
    if max_burst < 0 {
        return Err("ERR value is out of range, must be positive".into());
    }
    let rate = int(&args[3])?;
    if rate < 1 {
        return Err(format!(
            "ERR value is out of range, value must between 1 and {}",
            i64::MAX
        ));
    }
    // Redis's getDoubleFromObject refuses NaN.
    let period = args[4]
        .parse::<f64>()
        .ok()
        .filter(|p| !p.is_nan())
        .ok_or_else(|| "ERR value is not a valid float".to_string())?;
    if !(period > 0.0 && period < 1e12) {
        return Err("ERR period must be > 0 and < 1e12".into());
    }
    let mut tokens = 1;
    if args.len() >= 6 {
        let word = args[5].to_ascii_uppercase();
        if word != "TOKENS" && word != "NUM_REQUESTS" {
            return Err("ERR syntax error".into());
        }
        if args.len() == 6 {
            return Err("ERR Missing TOKENS value".into());
        }
        tokens = int(&args[6])?;
        if tokens < 0 {
            return Err(format!(
                "ERR value is out of range, value must between 0 and {}",
                i64::MAX
            ));
        }
    }
    let emission = ((period * 1e6 / rate as f64 + 0.5) as i64).max(1);
    let limit = max_burst + 1;
    let variance = emission * limit;
    let increment = emission * tokens;
    let stored = tat.filter(|t| *t > now_us).unwrap_or(now_us);
    let new_tat = stored.max(now_us) + increment;
    let diff = now_us - (new_tat - variance);
    let up = |us: i64| (us as f64 / 1e6).ceil() as i64;
    let (limited, retry, ttl) = if diff < 0 {
        let retry = if increment <= variance { up(-diff) } else { -1 };
        (1, retry, stored - now_us)
    } else {
        *tat = Some(new_tat);
        (0, -1, new_tat - now_us)
    };
    let next = variance - ttl;
    let remaining = if next > -emission { next / emission } else { 0 };
    Ok([limited, limit, remaining, retry, up(ttl)])
}

/// `RL.THROTTLE key max_burst count period [quantity]` as valkey#4081 proposes it: shaped
/// like redis-cell's `CL.THROTTLE`, with redis-cell's documented arithmetic, in nanoseconds.
fn rl_model(args: &[String], tat: &mut Option<i64>, now: i64) -> Answer {
    if args.len() != 5 && args.len() != 6 {
        return Err("ERR wrong number of arguments for 'rl.throttle' command".into());
    }
    let mut n = Vec::new();
    for a in &args[2..] {
        n.push(
            a.parse::<i64>()
                .map_err(|_| format!("ERR Couldn't parse as integer: {a}"))?,
        );
    }
    let (max_burst, count, period, quantity) = (n[0], n[1], n[2], *n.get(3).unwrap_or(&1));
    if count <= 0 || period <= 0 {
        return Err("ERR count per period and period must be positive".into());
    }
    if max_burst < 0 || quantity < 0 {
        return Err("ERR max_burst and quantity must not be negative".into());
    }
    let emission = (period as f64 * 1e9 / count as f64) as i64;
    let tolerance = emission * (max_burst + 1);
    let increment = emission * quantity;
    let stored = tat.filter(|t| *t > now).unwrap_or(now);
    let new_tat = stored + increment;
    let diff = now - (new_tat - tolerance);
    let (limited, retry, ttl) = if diff < 0 {
        let retry = if increment <= tolerance {
            -diff
        } else {
            -1_000_000_000
        };
        (1, retry, stored - now)
    } else {
        *tat = Some(new_tat);
        (0, -1_000_000_000, new_tat - now)
    };
    let next = tolerance - ttl;
    let remaining = if next > -emission {
        ((next / 1000) as f64 / (emission / 1000) as f64) as i64
    } else {
        0
    };
    Ok([
        limited,
        max_burst + 1,
        remaining,
        retry / 1_000_000_000,
        ttl / 1_000_000_000,
    ])
}

/// Rates (count, period): fractional periods, intervals that are not whole microseconds
/// (1 s / 3, 2.5 s / 7), and a minute.
const GCRA_RATES: [(i64, &str); 7] = [
    (1, "1"),
    (3, "1"),
    (7, "2.5"),
    (10, "60"),
    (2, "0.5"),
    (5, "3.3"),
    (1, "1e1"),
];
const RL_RATES: [(i64, i64); 5] = [(1, 1), (3, 1), (7, 3), (10, 60), (30, 60)];

/// A generated command on `key`: mostly valid, with peeks, heavier costs, costs above the
/// whole burst, the older keyword, and malformed arguments.
fn gcra_command(rng: &mut Rng, key: &str, params: (i64, usize)) -> Vec<String> {
    let (burst, rate) = params;
    let (count, period) = GCRA_RATES[rate];
    let mut args: Vec<String> = vec![
        "GCRA".into(),
        key.into(),
        burst.to_string(),
        count.to_string(),
        period.into(),
    ];
    match rng.below(100) {
        0..=49 => {}
        50..=59 => args.extend(["TOKENS".into(), "0".into()]),
        60..=79 => args.extend(["tokens".into(), (1 + rng.below(3)).to_string()]),
        80..=84 => args.extend(["NUM_REQUESTS".into(), "2".into()]),
        85..=89 => args.extend(["TOKENS".into(), (burst + 2).to_string()]),
        _ => match rng.below(7) {
            0 => args[4] = "0".into(),
            1 => args[4] = "nan".into(),
            2 => args.extend(["COST".into(), "1".into()]),
            3 => args.push("TOKENS".into()),
            4 => args.extend(["TOKENS".into(), "-1".into()]),
            5 => args[2] = "x".into(),
            _ => args[3] = "0".into(),
        },
    }
    args
}

fn rl_command(rng: &mut Rng, key: &str, params: (i64, usize)) -> Vec<String> {
    let (burst, rate) = params;
    let (count, period) = RL_RATES[rate % RL_RATES.len()];
    let mut args: Vec<String> = vec![
        "RL.THROTTLE".into(),
        key.into(),
        burst.to_string(),
        count.to_string(),
        period.to_string(),
    ];
    match rng.below(100) {
        0..=54 => {}
        55..=64 => args.push("0".into()),
        65..=84 => args.push((1 + rng.below(burst as u64 + 3)).to_string()),
        _ => match rng.below(4) {
            0 => args.truncate(4),
            1 => args[2] = "x".into(),
            2 => args[3] = "0".into(),
            _ => args.push("-1".into()),
        },
    }
    args
}

#[derive(Default, Debug)]
struct Tally {
    allowed: usize,
    limited: usize,
    errors: usize,
}

/// Runs `steps` generated commands of both kinds against the server and the models.
fn differential(s: &Served, seed: u64, steps: usize, tally: &mut Tally) {
    let mut c = RespClient::connect(&s.resp_addr.to_string());
    let mut rng = Rng(seed | 1);
    let mut tats: HashMap<String, Option<i64>> = HashMap::new();
    let mut params: Vec<(i64, usize)> = (0..8)
        .map(|_| {
            (
                rng.below(6) as i64,
                rng.below(GCRA_RATES.len() as u64) as usize,
            )
        })
        .collect();
    for step in 0..steps {
        if rng.below(4) == 0 {
            s.clock.advance((rng.below(3_000) as i64) * MS);
        }
        let now = s.clock.now();
        let slot = rng.below(8) as usize;
        if rng.below(20) == 0 {
            params[slot] = (
                rng.below(6) as i64,
                rng.below(GCRA_RATES.len() as u64) as usize,
            );
        }
        // Slots 0-3 are GCRA keys, 4-7 RL.THROTTLE keys: the models keep their own units.
        let key = format!("d{seed}:{slot}");
        let args = if slot < 4 {
            gcra_command(&mut rng, &key, params[slot])
        } else {
            rl_command(&mut rng, &key, params[slot])
        };
        let tat = tats.entry(key).or_default();
        let expected = if slot < 4 {
            let mut us = tat.map(|t| t / 1000);
            let answer = gcra_model(&args, &mut us, now / 1000);
            *tat = us.map(|t| t * 1000);
            answer
        } else {
            rl_model(&args, tat, now)
        };
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let got = match c.call(&refs) {
            Reply::Error(text) => Err(text),
            reply => Ok(<[i64; 5]>::try_from(reply.integers()).unwrap()),
        };
        assert_eq!(
            got,
            expected,
            "seed {seed} step {step} at T0 + {} ms: {}",
            (now - T0) / MS,
            args.join(" ")
        );
        match got {
            Err(_) => tally.errors += 1,
            Ok(r) if r[0] == 0 => tally.allowed += 1,
            Ok(_) => tally.limited += 1,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_and_rl_throttle_answer_as_their_documented_models() {
    let s = Served::start(None).await;
    let mut tally = Tally::default();
    for seed in [11, 12, 13] {
        differential(&s, seed, 600, &mut tally);
    }
    eprintln!("GCRA / RL.THROTTLE differential: {tally:?}");
    assert!(
        tally.allowed > 600 && tally.limited > 300 && tally.errors > 60,
        "{tally:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_answers_redis_documented_example_on_the_throttle_buckets() {
    let s = Served::start(None).await;
    let mut c = RespClient::connect(&s.resp_addr.to_string());
    let mut gcra = |args: &[&str]| {
        let mut all = vec!["GCRA", "api:user:123", "5", "10", "60"];
        all.extend_from_slice(args);
        c.call(&all).integers()
    };
    // 10 per 60 s, burst 5: six tokens, one back every 6 s.
    assert_eq!(gcra(&[]), [0, 6, 5, -1, 6]);
    assert_eq!(gcra(&["TOKENS", "3"]), [0, 6, 2, -1, 24]);
    assert_eq!(gcra(&["TOKENS", "2"]), [0, 6, 0, -1, 36]);
    assert_eq!(gcra(&[]), [1, 6, 0, 6, 36]);
    // A peek spends nothing; 2.5 s later the wait of 3.5 s reads 4 (rounded up).
    assert_eq!(gcra(&["TOKENS", "0"]), [0, 6, 0, -1, 36]);
    s.clock.advance(2_500 * MS);
    assert_eq!(gcra(&[]), [1, 6, 0, 4, 34]);
    // The same key is one bucket for all three commands (as keys are in Redis): 6 s after
    // the start one token is back, and CL.THROTTLE and RL.THROTTLE see the same bucket.
    s.clock.advance(3_500 * MS);
    assert_eq!(
        c.call(&["CL.THROTTLE", "api:user:123", "5", "10", "60", "0"])
            .integers(),
        [0, 6, 1, -1, 30]
    );
    assert_eq!(
        c.call(&["RL.THROTTLE", "api:user:123", "5", "10", "60"])
            .integers(),
        [0, 6, 0, -1, 36]
    );
    assert_eq!(
        c.call(&["GCRA", "api:user:123", "5", "10", "60"])
            .integers(),
        [1, 6, 0, 6, 36]
    );
    // The commands are listed with their key position, for cluster-aware clients.
    let info = c.call(&["COMMAND", "INFO", "gcra", "rl.throttle"]);
    let Reply::Array(items) = info else {
        panic!("{info:?}")
    };
    for item in items {
        let Reply::Array(fields) = item else {
            panic!("{item:?}")
        };
        assert_eq!(fields[3], Reply::Integer(1), "{fields:?}");
    }
}

/// Playing the attacker: arguments that would overflow, or that Redis's C code would turn
/// into nonsense (NaN, infinity), or over this server's bounds, get an error and change
/// nothing in the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_gcra_arguments_are_refused_and_change_nothing() {
    let s = Served::start(None).await;
    let mut c = RespClient::connect(&s.resp_addr.to_string());
    let peek = ["GCRA", "victim", "3", "1", "60", "TOKENS", "0"];
    assert_eq!(
        c.call(&["GCRA", "victim", "3", "1", "60"]).integers(),
        [0, 4, 3, -1, 60]
    );
    let before = c.call(&peek).integers();
    let max = i64::MAX.to_string();
    let long_key = "k".repeat(513);
    let hostile: [(&[&str], &str); 9] = [
        (&["GCRA", "victim", "3", "1", "nan"], "not a valid float"),
        (&["GCRA", "victim", "3", "1", "inf"], "period must be > 0"),
        (&["GCRA", "victim", "3", "1", "-60"], "period must be > 0"),
        (
            &["GCRA", "victim", "3", "1", "60", "TOKENS", "-5"],
            "out of range",
        ),
        (&["GCRA", "victim", &max, "1", "60"], "overflow"),
        (
            &["GCRA", "victim", "3", "1", "9e11", "TOKENS", &max],
            "overflow",
        ),
        (
            &["GCRA", "victim", "2000000", "1", "1"],
            "--caller-limit-max-burst",
        ),
        (
            &["GCRA", "victim", "3", "1", "20000000"],
            "--caller-limit-max-period",
        ),
        (
            &["GCRA", &long_key, "3", "1", "60"],
            "above this server's maximum of 512",
        ),
    ];
    for (args, words) in hostile {
        match c.call(args) {
            Reply::Error(text) => assert!(
                text.starts_with("ERR ") && text.contains(words),
                "{}: {text}",
                args.join(" ")
            ),
            other => panic!("{}: {other:?}", args.join(" ")),
        }
    }
    assert_eq!(c.call(&peek).integers(), before);
    // The connection still answers.
    assert_eq!(c.call(&["PING"]), Reply::Simple("PONG".into()));
}
