//! The module's `CELLRATE.SETTLE` (issue #61, item 1: the settlement ledger's atomic steps
//! without Lua) against `settle.lua` itself, on real redis-server and Valkey: the same
//! generated sequences of every op (open with and without holds and bucket keys, decide,
//! claim, reopen, forget, due, queue, oldest), with time moving (records and holds expire),
//! give the same replies and leave the same keys (hashes field by field, sorted sets with
//! their scores, TTLs). A ledger moves between the script and the module at any step, both
//! ways; a replica without the module follows a server that uses it (the writes replicate
//! as their effects); a hostile caller gets an error and changes nothing.
//!
//! Time: every deadline the ledger sets falls in a part of a 150 ms tick where no op runs
//! (ops run at 3-30 ms of a tick, `due` at 38-45 ms; windows and holds are 50 mod 150 ms,
//! and `due`'s retry of 1 000 ms is 100 mod 150), so the two sides, called a few ms apart,
//! never disagree on whether something expired; times written are compared to within
//! [`TOLERANCE_MS`].

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::redis_module::{redis_with_module, valkey_with_module};
use crate::common::redis_server::RedisServer;
use crate::common::resp_client::{Reply, RespClient};
use crate::common::Rng;

const SCRIPT: &str = include_str!("../../crates/store/src/redis/settle.lua");
const PREFIX: &str = "cr{settle}:";
const TICK: u64 = 150;
const TOLERANCE_MS: f64 = 60.0;
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Which of the two answers a call.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
enum Via {
    Script,
    Module,
}

/// How a side picks who answers each call.
type Chooser<'a> = &'a mut dyn FnMut(&mut Rng) -> Via;

/// One connection to a server, the script loaded.
struct Side {
    client: RespClient,
    sha: String,
}

impl Side {
    fn connect(server: &RedisServer) -> Side {
        let mut client = RespClient::connect(&format!("127.0.0.1:{}", server.port));
        let Reply::Bulk(sha) = client.call(&["SCRIPT", "LOAD", SCRIPT]) else {
            panic!("SCRIPT LOAD failed");
        };
        Side {
            client,
            sha: String::from_utf8(sha).unwrap(),
        }
    }

    /// The ledger's call `argv` on `keys`, through the script (`EVALSHA`, as cellrate
    /// sends it) or the module.
    fn call(&mut self, via: Via, keys: &[String], argv: &[String]) -> Reply {
        let n = keys.len().to_string();
        let head = match via {
            Via::Script => vec!["EVALSHA", self.sha.as_str(), &n],
            Via::Module => vec!["CELLRATE.SETTLE", &n],
        };
        let mut args: Vec<&str> = head;
        args.extend(keys.iter().chain(argv).map(String::as_str));
        self.client.call(&args)
    }
}

/// settle.lua's KEYS as the store sends them: index, record, holds, prefix of the
/// per-key sets, and a queue for `queue` and `oldest`.
fn keys(id: &str, queue: Option<&str>) -> Vec<String> {
    let mut keys: Vec<String> = ["index", &format!("r:{id}"), "holds", "k:"]
        .iter()
        .map(|k| format!("{PREFIX}{k}"))
        .collect();
    keys.extend(queue.map(|q| format!("{PREFIX}q:{q}")));
    keys
}

/// Every key of the server: name, type, contents, PTTL.
fn snapshot(c: &mut RespClient) -> Vec<(String, Reply, i64)> {
    let Reply::Array(names) = c.call(&["KEYS", "*"]) else {
        panic!("KEYS failed");
    };
    let mut names: Vec<String> = names
        .into_iter()
        .map(|n| match n {
            Reply::Bulk(b) => String::from_utf8(b).unwrap(),
            other => panic!("{other:?}"),
        })
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|k| {
            let content = match c.call(&["TYPE", &k]) {
                Reply::Simple(t) if t == "hash" => c.call(&["HGETALL", &k]),
                Reply::Simple(t) if t == "zset" => {
                    by_member(c.call(&["ZRANGE", &k, "0", "-1", "WITHSCORES"]))
                }
                Reply::Simple(t) if t == "string" => c.call(&["GET", &k]),
                Reply::Simple(t) if t == "list" => c.call(&["LRANGE", &k, "0", "-1"]),
                other => other,
            };
            let Reply::Integer(ttl) = c.call(&["PTTL", &k]) else {
                panic!("PTTL failed");
            };
            (k, content, ttl)
        })
        .collect()
}

/// A sorted set's members with their scores, by member: two sides whose scores (times)
/// differ by a ms may order members of nearly equal scores differently.
fn by_member(range: Reply) -> Reply {
    let Reply::Array(items) = range else {
        return range;
    };
    let mut pairs: Vec<Vec<Reply>> = items.chunks(2).map(<[Reply]>::to_vec).collect();
    pairs.sort_by(|a, b| format!("{:?}", a[0]).cmp(&format!("{:?}", b[0])));
    Reply::Array(pairs.concat())
}

/// Two texts equal, or two times (ms or µs of the epoch) within the tolerance.
fn close(a: &[u8], b: &[u8]) -> bool {
    let number = |t: &[u8]| std::str::from_utf8(t).ok()?.parse::<f64>().ok();
    match (number(a), number(b)) {
        _ if a == b => true,
        (Some(x), Some(y)) if x > 1e15 && y > 1e15 => (x - y).abs() <= TOLERANCE_MS * 1e3,
        (Some(x), Some(y)) if x > 1e12 && y > 1e12 => (x - y).abs() <= TOLERANCE_MS,
        _ => false,
    }
}

/// Replies equal but for times within the tolerance (errors: both errors).
fn same(a: &Reply, b: &Reply) -> bool {
    match (a, b) {
        (Reply::Bulk(x), Reply::Bulk(y)) => close(x, y),
        (Reply::Array(x), Reply::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Reply::Error(_), Reply::Error(_)) => true,
        _ => a == b,
    }
}

fn same_keys(a: &[(String, Reply, i64)], b: &[(String, Reply, i64)]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((ka, ca, ta), (kb, cb, tb))| {
            let ttl = ta == tb || (*ta > 0 && *tb > 0 && (ta - tb).abs() as f64 <= TOLERANCE_MS);
            ka == kb && same(ca, cb) && ttl
        })
}

/// The keys as text, one a line.
fn show(keys: &[(String, Reply, i64)]) -> String {
    fn text(r: &Reply) -> String {
        match r {
            Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            Reply::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(" "),
            other => format!("{other:?}"),
        }
    }
    keys.iter()
        .map(|(k, c, t)| format!("{k} [{t}] {}\n", text(c)))
        .collect()
}

/// Where the clock is in the tick (ms).
fn phase() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    (now.as_millis() as u64) % TICK
}

/// Sleeps to `at` ms of a tick (the next one if past it).
fn sleep_to(at: u64) {
    let wait = (at + TICK - phase()) % TICK;
    std::thread::sleep(Duration::from_millis(wait));
}

/// One generated call: KEYS and ARGV. Most calls take one of the ids opened last
/// (`recent`, each with the op its story goes on with) a step further: open, decide,
/// queue, oldest or claim, claim again, reopen, forget; the rest are any op on any id.
fn generate(
    rng: &mut Rng,
    recent: &mut Vec<(String, &'static str)>,
    (window, hold): (&str, &str),
) -> (Vec<String>, Vec<String>) {
    let below = |rng: &mut Rng, n: usize| rng.below(n as u64) as usize;
    let ops = [
        "open", "open", "open", "open", "decide", "claim", "reopen", "forget", "queue", "oldest",
    ];
    let ids = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"];
    let (id, op) = match recent.len() {
        n if n > 0 && rng.chance(55) => {
            let at = n - 1 - below(rng, n.min(3));
            let (id, op) = recent[at].clone();
            let next: &[&'static str] = match op {
                "decide" => &["claim", "queue", "queue"],
                "queue" => &["oldest"],
                "claim" | "oldest" => &["claim", "reopen"],
                "reopen" => &["claim", "forget"],
                _ => &["open"],
            };
            recent[at].1 = next[below(rng, next.len())];
            (id, op)
        }
        _ => (
            ids[below(rng, ids.len())].to_string(),
            ops[below(rng, ops.len())],
        ),
    };
    let n = ["1", "2", "3"][below(rng, 3)];
    // Each id's anonymous holds in one queue, so that a story's oldest finds its queue.
    let queue = if id.as_str() < "g" { "qa" } else { "qb" };
    let argv: Vec<String> = match op {
        "open" => {
            recent.retain(|(r, _)| *r != id);
            recent.push((
                id.clone(),
                ["decide", "decide", "decide", "claim"][below(rng, 4)],
            ));
            let mut pick = |options: &[&str]| options[below(rng, options.len())].to_string();
            let names = ["k1", "k2", "k3", "k1"];
            let count = pick(&["0", "1", "1", "2"]).parse::<usize>().unwrap();
            let start = pick(&["0", "1", "2"]).parse::<usize>().unwrap();
            let mut argv = vec![
                op.to_string(),
                format!("check-{id}-{n}"),
                window.to_string(),
                pick(&["3", "5", "40"]),
                pick(&["0", "0", hold, hold]),
                pick(&["1", "1", "2"]),
            ];
            argv.extend(names[start..start + count].iter().map(|k| k.to_string()));
            argv
        }
        "decide" | "reopen" => vec![op.to_string(), format!("facts-{n}")],
        "claim" | "oldest" => vec![op.to_string(), format!("costs-{n}")],
        _ => vec![op.to_string()],
    };
    let queued = matches!(op, "queue" | "oldest").then_some(queue);
    (keys(&id, queued), argv)
}

/// Runs `steps` generated calls on every side, each side's calls through `via` (its
/// choice per step), asserting the same replies; every few ticks, the same keys on every
/// side and on each of `observers` (replicas). Returns the steps whose record (an id
/// opened through one) was claimed through the other, per direction.
fn drive(
    seed: u64,
    steps: usize,
    sides: &mut [(Side, Chooser)],
    observers: &mut [RespClient],
) -> (HashMap<(Via, Via), usize>, HashMap<String, usize>) {
    // One sequence at a time: each needs its ops to run in their part of the tick.
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng(seed | 1);
    // Which side answers and when `due` runs: apart, so that the ops are the seed's alone.
    let mut other = Rng(seed.wrapping_mul(0x9E37_79B9) | 1);
    let mut recent = Vec::new();
    // One window and one hold per seed: two records' deadlines then never fall within a
    // ms of each other (ops run 6 ms apart), which the two sides could order differently.
    let times = [("500", "650"), ("800", "200")][(seed % 2) as usize];
    let mut opened: HashMap<String, Via> = HashMap::new();
    let mut crossed = HashMap::new();
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    let (mut step, mut tick, mut compared) = (0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(240);
    while step < steps {
        assert!(
            Instant::now() < deadline,
            "seed {seed}: the sequence overran"
        );
        tick += 1;
        sleep_to(3);
        if tick % 3 == 0 {
            // The keys, read on every side before a deadline can pass (else read again),
            // once the replicas have every write.
            if !observers.is_empty() {
                sides[0]
                    .0
                    .client
                    .call(&["WAIT", &observers.len().to_string(), "1000"]);
            }
            let mut all: Vec<_> = sides
                .iter_mut()
                .map(|(s, _)| snapshot(&mut s.client))
                .collect();
            all.extend(observers.iter_mut().map(snapshot));
            if phase() < 45 {
                for other in &all[1..] {
                    assert!(
                        same_keys(&all[0], other),
                        "seed {seed} step {step}:\n{}\n{}",
                        show(&all[0]),
                        show(other)
                    );
                }
                compared += 1;
            }
            // Nothing the ledger writes outlives its window: a record or a queue without
            // an expiry would be kept forever.
            for (name, _, ttl) in &all[0] {
                let kept = [":r:", ":q:"].iter().any(|p| name.contains(p));
                assert!(
                    !kept || *ttl >= 0,
                    "seed {seed} step {step}: {name} has no expiry\n{}",
                    show(&all[0])
                );
            }
            continue;
        }
        for slot in 0..4 {
            // Each op at its own place in the tick: 3, 9, 15, 21 ms (skipped when late).
            if step >= steps || phase() > 3 + 6 * slot {
                break;
            }
            sleep_to(3 + 6 * slot);
            let (keys, argv) = generate(&mut rng, &mut recent, times);
            let mut replies = Vec::new();
            for (side, choose) in sides.iter_mut() {
                let via = choose(&mut other);
                replies.push((via, side.call(via, &keys, &argv)));
            }
            for (via, reply) in &replies[1..] {
                assert!(
                    same(&replies[0].1, reply),
                    "seed {seed} step {step}: {keys:?} {argv:?}\n  {:?}: {:?}\n  {via:?}: {reply:?}",
                    replies[0].0, replies[0].1
                );
            }
            let (last_via, last) = replies.last().unwrap();
            *outcomes.entry(outcome(&argv[0], last)).or_insert(0) += 1;
            let settled = |r: &Reply| matches!(r, Reply::Array(items) if items.first() == Some(&Reply::Bulk(b"2".to_vec())));
            let flag = |r: &Reply| matches!(r, Reply::Array(items) if items.first() == Some(&Reply::Bulk(b"1".to_vec())));
            match argv[0].as_str() {
                "open" if flag(last) => {
                    opened.insert(keys[1].clone(), *last_via);
                }
                "claim" | "decide" if flag(last) || settled(last) => {
                    if let Some(&by) = opened.get(&keys[1]) {
                        *crossed.entry((by, *last_via)).or_insert(0) += 1;
                    }
                }
                _ => {}
            }
            step += 1;
        }
        sleep_to(38);
        if other.chance(60) && (38..45).contains(&phase()) {
            let argv = vec![
                "due".to_string(),
                ["1", "3", "10"][other.below(3) as usize].to_string(),
            ];
            let keys = keys("", None);
            let replies: Vec<Reply> = sides
                .iter_mut()
                .map(|(side, choose)| {
                    let via = choose(&mut other);
                    side.call(via, &keys, &argv)
                })
                .collect();
            for reply in &replies[1..] {
                assert!(
                    same(&replies[0], reply),
                    "seed {seed} due: {:?}\n{reply:?}",
                    replies[0]
                );
            }
            *outcomes.entry(outcome("due", &replies[0])).or_insert(0) += 1;
            step += 1;
        }
    }
    assert!(
        compared >= 3,
        "seed {seed}: the keys were compared {compared} times"
    );
    eprintln!("seed {seed}: {compared} comparisons of the keys, outcomes {outcomes:?}");
    (crossed, outcomes)
}

/// An op's outcome: its flag (the first item), `open`'s evictions, `due`'s claims.
fn outcome(op: &str, reply: &Reply) -> String {
    let Reply::Array(items) = reply else {
        return format!("{op}:error");
    };
    let text = |i: usize| match items.get(i) {
        Some(Reply::Bulk(b)) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    match op {
        "open" if text(0) == "1" && text(1) != "0" => "open:evicted".into(),
        "due" => format!("due:{}", (items.len() - 1) / 5 > 0),
        _ => format!("{op}:{}", text(0)),
    }
}

fn script(_: &mut Rng) -> Via {
    Via::Script
}

fn the_module(_: &mut Rng) -> Via {
    Via::Module
}

/// Every answer of every op, which the differential must have compared.
const OUTCOMES: [&str; 18] = [
    "open:1",
    "open:evicted",
    "open:2",
    "open:3",
    "open:0",
    "decide:1",
    "decide:0",
    "claim:0",
    "claim:1",
    "claim:2",
    "claim:3",
    "claim:4",
    "reopen:1",
    "forget:1",
    "queue:1",
    "oldest:1",
    "oldest:0",
    "due:true",
];

/// The differential: the script on one server, the module on another of the same kind.
/// Time moves under the ops (records and holds expire), so which outcomes a seed reaches
/// depends a little on the machine's pace: seeds after the given ones (at most four more)
/// run until every outcome has been compared.
fn differential(start: fn() -> RedisServer, seeds: &[u64]) {
    let mut all: HashMap<String, usize> = HashMap::new();
    let more = (1..=4).map(|n| seeds.iter().max().copied().unwrap_or(0) + 100 * n);
    let mut ran = Vec::new();
    for seed in seeds.iter().copied().chain(more) {
        let missing = OUTCOMES.iter().any(|o| !all.contains_key(*o));
        if ran.len() >= seeds.len() && !missing {
            break;
        }
        ran.push(seed);
        let (a, b) = (start(), start());
        let (mut s, mut m) = (script, the_module);
        let mut sides: [(Side, Chooser); 2] =
            [(Side::connect(&a), &mut s), (Side::connect(&b), &mut m)];
        let (_, outcomes) = drive(seed, 250, &mut sides, &mut []);
        for (outcome, n) in outcomes {
            *all.entry(outcome).or_insert(0) += n;
        }
    }
    for seen in OUTCOMES {
        assert!(
            all.contains_key(seen),
            "seeds {ran:?}: no {seen} in {all:?}"
        );
    }
}

#[test]
fn cellrate_settle_does_what_settle_lua_does_in_redis() {
    differential(redis_with_module, &[1, 2]);
}

#[test]
fn cellrate_settle_does_what_settle_lua_does_in_valkey() {
    differential(valkey_with_module, &[3, 4]);
}

/// The switch: one ledger called through the script and the module in turns (runs of 3
/// calls), against one called through the script alone: the same replies and keys,
/// and records opened through each decided or claimed through the other.
#[test]
fn a_ledger_moves_between_the_script_and_the_module_both_ways() {
    for (start, seed) in [
        (redis_with_module as fn() -> RedisServer, 4),
        (valkey_with_module, 5),
    ] {
        let (a, b) = (start(), start());
        // Runs of 3 calls each: a record is often opened through one, decided through the other.
        let mut calls = 0;
        let mut mixed = move |_: &mut Rng| {
            calls += 1;
            [Via::Script, Via::Module][(calls / 3) % 2]
        };
        let mut s = script;
        let mut sides: [(Side, Chooser); 2] =
            [(Side::connect(&a), &mut s), (Side::connect(&b), &mut mixed)];
        let (crossed, _) = drive(seed, 250, &mut sides, &mut []);
        for direction in [(Via::Script, Via::Module), (Via::Module, Via::Script)] {
            assert!(
                crossed.get(&direction).copied().unwrap_or(0) > 0,
                "{direction:?}: {crossed:?}"
            );
        }
    }
}

/// A replica started without the module follows a server whose ledger the module keeps:
/// the module's writes replicate as plain commands (their effects), not as the command.
#[test]
fn a_replica_without_the_module_keeps_the_same_ledger() {
    let primary = redis_with_module();
    let port = primary.port.to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]);
    let mut observer = RespClient::connect(&format!("127.0.0.1:{}", replica.port));
    let up = (0..200).any(|_| {
        let Reply::Bulk(info) = observer.call(&["INFO", "replication"]) else {
            return false;
        };
        let up = String::from_utf8_lossy(&info).contains("master_link_status:up");
        if !up {
            std::thread::sleep(Duration::from_millis(25));
        }
        up
    });
    assert!(up, "the replica never synced");
    let mut m = the_module;
    let mut sides: [(Side, Chooser); 1] = [(Side::connect(&primary), &mut m)];
    drive(6, 200, &mut sides, std::slice::from_mut(&mut observer));
    let mut primary_client = RespClient::connect(&format!("127.0.0.1:{}", primary.port));
    assert_eq!(
        primary_client.call(&["WAIT", "1", "2000"]),
        Reply::Integer(1)
    );
    let (p, r) = (snapshot(&mut primary_client), snapshot(&mut observer));
    assert!(!p.is_empty(), "a ledger was written");
    assert!(same_keys(&p, &r), "{p:#?}\n{r:#?}");
    // The replica never saw the command itself: it has no such command.
    let Reply::Error(e) = observer.call(&["CELLRATE.SETTLE", "0", "due", "1"]) else {
        panic!("the replica knows CELLRATE.SETTLE");
    };
    assert!(e.contains("unknown command"), "{e}");
}

/// The attacker: a wrong arity, numbers that are none or out of range, too few keys, an
/// unknown op, keys of other types where the ledger writes (met by the script only after
/// a write), a record pointing at a key of another type: each an error, and nothing
/// changed; a flood of opens stays within the ledger's most records.
#[test]
fn a_hostile_caller_of_cellrate_settle_gets_an_error_and_changes_nothing() {
    let server = redis_with_module();
    let mut side = Side::connect(&server);
    let c = &mut side.client;
    let k = |id: &str| keys(id, None).join(" ");
    // A ledger with a live hold, a decided record, and keys of other types around it.
    for call in [
        format!("CELLRATE.SETTLE 4 {} open chk 5000 100 60000 5 b1", k("h")),
        format!("CELLRATE.SETTLE 4 {} decide f", k("h")),
        format!("CELLRATE.SETTLE 4 {} open chk 5000 100 0 5", k("d")),
        format!("CELLRATE.SETTLE 4 {} decide f", k("d")),
        format!("SET {PREFIX}k:b2 text"),
        format!("SET {PREFIX}q:qa text"),
        format!("SET {PREFIX}r:s text"),
    ] {
        let args: Vec<&str> = call.split(' ').collect();
        assert!(!matches!(c.call(&args), Reply::Error(_)), "{call}");
    }
    let r = |id: &str| format!("{PREFIX}r:{id}");
    let (index, holds, prefix) = (
        format!("{PREFIX}index"),
        format!("{PREFIX}holds"),
        format!("{PREFIX}k:"),
    );
    let hostile: Vec<Vec<String>> = [
        "CELLRATE.SETTLE",
        "CELLRATE.SETTLE x",
        "CELLRATE.SETTLE -1 open",
        "CELLRATE.SETTLE 9 a b",
        "CELLRATE.SETTLE 1 a decide f",
        "CELLRATE.SETTLE 3 a b c claim x",
        "CELLRATE.SETTLE 4 I R:n H K: nope",
        "CELLRATE.SETTLE 4 I R:n H K:",
        "CELLRATE.SETTLE 4 I R:n H K: open chk",
        "CELLRATE.SETTLE 4 I R:n H K: open chk x 100 0 5",
        "CELLRATE.SETTLE 4 I R:n H K: open chk 0 100 0 5",
        "CELLRATE.SETTLE 4 I R:n H K: open chk 1.5 100 0 5",
        "CELLRATE.SETTLE 4 I R:n H K: open chk 99999999999999999999 100 0 5",
        "CELLRATE.SETTLE 4 I R:n H K: open chk 5000 x 0 5",
        "CELLRATE.SETTLE 4 I R:n H K: open chk 5000 100 inf 5",
        "CELLRATE.SETTLE 4 I R:n H K: open chk 5000 100 0.5 5",
        "CELLRATE.SETTLE 4 I R:n H K: open chk 5000 100 9e18 5",
        "CELLRATE.SETTLE 4 I R:n H K: open chk 5000 100 100 x b1",
        "CELLRATE.SETTLE 4 I R:n H K: due x",
        "CELLRATE.SETTLE 4 I R:n H K: due 1.5",
        "CELLRATE.SETTLE 4 I R:n H K: due",
        "CELLRATE.SETTLE 4 I R:h H K: queue",
        // A bucket key's set that is no sorted set, for a new hold.
        "CELLRATE.SETTLE 4 I R:n H K: open chk 5000 100 100 5 b2",
        // The queue is no sorted set.
        "CELLRATE.SETTLE 5 I R:h H K: Q queue",
        "CELLRATE.SETTLE 5 I R:h H K: Q oldest costs",
        // The index, the holds: keys of another type.
        "CELLRATE.SETTLE 4 R:s R:n H K: open chk 5000 100 0 5",
        "CELLRATE.SETTLE 4 I R:n R:s K: open chk 5000 100 0 5",
        "CELLRATE.SETTLE 4 I R:h R:s K: forget",
        "CELLRATE.SETTLE 4 R:s R:h H K: claim costs",
        "CELLRATE.SETTLE 4 I R:h R:s K: claim costs",
        "CELLRATE.SETTLE 4 I R:n R:s K: due 5",
    ]
    .iter()
    .map(|call| {
        call.split(' ')
            .map(|a| match a {
                "I" => index.clone(),
                "H" => holds.clone(),
                "K:" => prefix.clone(),
                "Q" => format!("{PREFIX}q:qa"),
                a if a.starts_with("R:") => r(&a[2..]),
                a => a.to_string(),
            })
            .collect()
    })
    .collect();
    for call in &hostile {
        // Read just before each call: the TTLs are compared within TOLERANCE_MS, which
        // the whole list's calls could outlast on a loaded machine (a CI run did).
        let before = snapshot(c);
        let args: Vec<&str> = call.iter().map(String::as_str).collect();
        let reply = c.call(&args);
        assert!(matches!(reply, Reply::Error(_)), "{call:?}: {reply:?}");
        assert!(
            same_keys(&before, &snapshot(c)),
            "{call:?} changed the ledger"
        );
    }
    // The flood: 2 000 opens of new ids, at most 50 records, each refused or evicting.
    for i in 0..2000 {
        let id = format!("flood-{i}");
        let reply = side.call(
            Via::Module,
            &keys(&id, None),
            &["open", "c", "60000", "50", "0", "5"].map(String::from),
        );
        assert!(matches!(reply, Reply::Array(_)), "{reply:?}");
    }
    let Reply::Integer(records) = side.client.call(&["ZCARD", &index]) else {
        panic!("ZCARD");
    };
    let Reply::Integer(live) = side.client.call(&["ZCARD", &holds]) else {
        panic!("ZCARD");
    };
    assert!(records + live <= 50, "{records} records and {live} holds");
    let Reply::Array(all) = side.client.call(&["KEYS", &format!("{PREFIX}r:*")]) else {
        panic!("KEYS");
    };
    assert!(all.len() <= 51, "{} records kept", all.len());
}
