//! Temporary overrides shared through Redis, end to end: `cellrate serve --store redis`
//! processes on one real `redis-server`, driven by the `cellrate` CLI as an operator would.
//! An override set on one replica applies on the others, survives their reloads, expires,
//! is cleared from any replica, is counted against one shared bound, and reaches a replica
//! started later; what Redis holds that is no override of ours is left out; with Redis gone
//! the last copy stays in force and changes are refused.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use crate::common::redis_server::{RedisCluster, RedisServer};
use crate::common::{http_get, sample, serve_with, Process};

const BIN: &str = env!("CARGO_BIN_EXE_cellrate");
const TOKEN: &str = "s3cret-admin-token";

/// Limits that never refill during a test: 300 per 3 hours.
fn config(dir: &Path, burst: u32) {
    std::fs::write(
        dir.join("defaults.yaml"),
        format!("NewOrdersPerAccount: {{burst: {burst}, count: 300, period: 180m}}\n"),
    )
    .unwrap();
}

/// A replica on `redis` that looks for override changes every 100 ms, with an admin token.
fn replica(dir: &Path, redis: &RedisServer, extra: &[&str]) -> Process {
    replica_on(dir, &["--redis-url", &redis.url()], extra)
}

/// As [`replica`], on the Redis that `store` flags name.
fn replica_on(dir: &Path, store: &[&str], extra: &[&str]) -> Process {
    let mut flags = vec!["--store", "redis"];
    flags.extend_from_slice(store);
    flags.extend_from_slice(&[
        "--redis-timeout-ms",
        "1000",
        "--redis-override-sync-ms",
        "100",
        "--admin-token",
        TOKEN,
    ]);
    flags.extend_from_slice(extra);
    serve_with(dir, &flags)
}

/// `cellrate ARGS` against `p`, with the admin token in the environment.
fn cellrate(p: &Process, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_clear()
        .env("CELLRATE_ADDR", &p.listen)
        .env("CELLRATE_ADMIN_ADDR", &p.admin)
        .env("CELLRATE_ADMIN_TOKEN", TOKEN)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The exit code of `cellrate check NewOrdersPerAccount ID` on `p`: 0 allowed, 2 denied.
fn check(p: &Process, id: &str) -> Option<i32> {
    cellrate(p, &["check", "NewOrdersPerAccount", id])
        .status
        .code()
}

/// Runs `probe` every 50 ms for at most `within` until it returns `want`; the last value.
fn poll<T: PartialEq + std::fmt::Debug>(within: Duration, want: T, probe: impl Fn() -> T) -> T {
    let tries = within.as_millis() / 50;
    let mut value = probe();
    for _ in 0..tries {
        if value == want {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        value = probe();
    }
    value
}

fn set(p: &Process, id: &str, policy: &[&str], ttl: &str) -> Output {
    let mut args = vec!["admin", "override", "set", "NewOrdersPerAccount", id];
    args.extend_from_slice(policy);
    args.extend_from_slice(&["--ttl", ttl, "--comment", "ticket 12", "--author", "ops"]);
    cellrate(p, &args)
}

/// The ids `cellrate admin override list` shows on each of `replicas`.
fn listed(replicas: &[&Process]) -> Vec<Vec<String>> {
    try_listed(replicas).unwrap_or_else(|out| panic!("{out}"))
}

/// [`listed`], or what the CLI said when it failed (Redis coming back, say).
fn try_listed(replicas: &[&Process]) -> Result<Vec<Vec<String>>, String> {
    let addrs: Vec<&str> = replicas.iter().map(|p| p.admin.as_str()).collect();
    let out = cellrate(
        replicas[0],
        &[
            "admin",
            "override",
            "list",
            "--json",
            "--admin-addr",
            &addrs.join(","),
        ],
    );
    if out.status.code() != Some(0) {
        return Err(text(&out));
    }
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    Ok(list["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_string())
                .collect()
        })
        .collect())
}

fn metric(p: &Process, series: &str) -> Option<f64> {
    sample(&http_get(&p.metrics, "/metrics").1, series)
}

#[test]
fn an_override_set_on_one_replica_applies_on_every_replica() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 300);
    let a = replica(dir.path(), &redis, &[]);
    let b = replica(dir.path(), &redis, &[]);
    let wait = Duration::from_secs(10);

    // Set on A: A applies it at once, B within its sync interval.
    let out = set(&a, "42", &["--deny"], "30m");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(check(&a, "42"), Some(2), "A applies its own change at once");
    assert_eq!(
        poll(wait, Some(2), || check(&b, "42")),
        Some(2),
        "B applies it"
    );
    assert_eq!(check(&b, "43"), Some(0), "only that id");

    // B says where its limit comes from: the runtime override, who set it and why.
    let out = cellrate(
        &b,
        &["admin", "inspect", "NewOrdersPerAccount", "42", "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let inspected: Value = serde_json::from_slice(&out.stdout).unwrap();
    let source = &inspected["source"];
    assert_eq!(source["kind"], "runtime_override", "{inspected}");
    assert_eq!(source["author"], "ops");
    assert_eq!(source["comment"], "ticket 12");

    // Every replica lists it (each from Redis).
    assert_eq!(listed(&[&a, &b]), [["42"], ["42"]]);

    // A limit replaces nothing but itself: set a limit of 1 on id 7 on B; A spends it.
    let out = set(
        &b,
        "7",
        &["--burst", "1", "--count", "1", "--period", "1h"],
        "30m",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        poll(wait, vec!["42".to_string(), "7".to_string()], || listed(&[
            &a
        ])[0]
            .clone()),
        ["42", "7"]
    );
    assert_eq!(check(&a, "7"), Some(0));
    assert_eq!(check(&a, "7"), Some(2), "A decides with B's override of 1");

    // A reload (the defaults change on disk) leaves the overrides in force on every replica.
    let reloads = |p: &Process| metric(p, "cellrate_config_reloads_total{result=\"success\"}");
    let before = (reloads(&a), reloads(&b));
    config(dir.path(), 299);
    for (p, was) in [(&a, before.0), (&b, before.1)] {
        let now = poll(wait, true, || reloads(p) > was);
        assert!(now, "the replica reloaded");
        assert_eq!(check(p, "42"), Some(2), "still denied after the reload");
    }

    // Cleared on B: A stops applying it.
    let out = cellrate(
        &b,
        &["admin", "override", "clear", "NewOrdersPerAccount", "42"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(poll(wait, Some(0), || check(&a, "42")), Some(0), "A let go");
    assert_eq!(check(&b, "42"), Some(0));

    // A replica started later finds the override in force at start.
    let c = replica(dir.path(), &redis, &[]);
    assert_eq!(
        poll(wait, vec!["7".to_string()], || listed(&[&c])[0].clone()),
        ["7"]
    );
    assert_eq!(check(&c, "7"), Some(2), "C applies B's limit, spent by A");
}

#[test]
fn shared_overrides_expire_on_every_replica() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 300);
    let bound = ["--max-runtime-overrides", "1"];
    let a = replica(dir.path(), &redis, &bound);
    let b = replica(dir.path(), &redis, &bound);
    let out = set(&a, "9", &["--deny"], "4s");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let wait = Duration::from_secs(10);
    assert_eq!(
        poll(wait, Some(2), || check(&b, "9")),
        Some(2),
        "B applies it"
    );
    // Then, with no further change in Redis, both let it go when it expires.
    assert_eq!(
        poll(wait, Some(0), || check(&b, "9")),
        Some(0),
        "expired on B"
    );
    assert_eq!(check(&a, "9"), Some(0), "expired on A");
    assert_eq!(listed(&[&a, &b]), [Vec::<String>::new(), Vec::new()]);
    // Its place is free again: with a bound of 1, a new one fits.
    let out = set(&b, "10", &["--deny"], "1m");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn the_bound_on_overrides_is_shared_by_the_replicas() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 300);
    let bound = ["--max-runtime-overrides", "2"];
    let a = replica(dir.path(), &redis, &bound);
    let b = replica(dir.path(), &redis, &bound);
    for (p, id) in [(&a, "1"), (&b, "2")] {
        let out = set(p, id, &["--deny"], "10m");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    // The third is refused on A, which set only one: Redis counts every replica's.
    let out = set(&a, "3", &["--deny"], "10m");
    assert_eq!(out.status.code(), Some(65), "{}", text(&out));
    assert!(
        text(&out).contains("2 temporary overrides are in force"),
        "{}",
        text(&out)
    );
    // Replacing one in force is no new one.
    let out = set(&a, "2", &["--unlimited"], "10m");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(listed(&[&a, &b]), [["1", "2"], ["1", "2"]]);
    assert_eq!(check(&a, "3"), Some(0), "the refused one changed nothing");
}

#[test]
fn what_redis_holds_that_is_no_override_is_left_out() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 300);
    let a = replica(dir.path(), &redis, &[]);
    let out = set(&a, "5", &["--deny"], "10m");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let key = "cellrate:overrides";
    let held = redis.cli(&["HGET", key, "3:5"]).unwrap();
    let (expires, record) = held.trim_end().split_once(' ').unwrap();
    // Whoever can write to Redis writes junk beside it, and bumps the version.
    let bad_id = record.replace("\"id\":\"5\"", "\"id\":\"x\"");
    let unknown = record.replace("NewOrdersPerAccount", "NotAName");
    let long = record.replace(
        "\"comment\":\"ticket 12\"",
        &format!("\"comment\":\"{}\"", "c".repeat(5_000)),
    );
    let junk = [
        ("3:6", "no expiry".to_string()),
        ("3:7", format!("{expires} not json")),
        ("3:x", format!("{expires} {bad_id}")),
        ("3:5x", format!("{expires} {record}")),
        ("3:8", format!("{expires} {long}")),
        ("3:9", format!("{expires} {unknown}")),
        ("3:10", format!("{expires} {}", "[".repeat(100_000))),
    ];
    for (field, value) in &junk {
        assert!(redis.cli(&["HSET", key, field, value]).is_some());
    }
    assert!(redis.cli(&["HSET", key, "version", "1"]).is_some());
    // The replica copies the table again, applies only what is an override of ours, and
    // keeps serving.
    let wait = Duration::from_secs(10);
    let b = replica(dir.path(), &redis, &[]);
    assert_eq!(
        poll(wait, vec![vec!["5".to_string()]], || listed(&[&b])),
        [["5"]]
    );
    assert_eq!(listed(&[&a]), [["5"]]);
    assert_eq!(check(&b, "5"), Some(2));
    for id in ["6", "7", "8", "9", "10"] {
        assert_eq!(check(&b, id), Some(0), "junk under 3:{id} applied");
    }
    // The operator's own commands still work beside it: a new override, then clearing one.
    let out = set(&b, "11", &["--deny"], "10m");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(poll(wait, Some(2), || check(&a, "11")), Some(2));
    let out = cellrate(
        &a,
        &["admin", "override", "clear", "NewOrdersPerAccount", "5"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(poll(wait, Some(0), || check(&b, "5")), Some(0));
}

#[test]
fn without_redis_the_last_copy_stays_in_force_and_changes_are_refused() {
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 300);
    // Decisions fail open here, so that a check still answers with Redis gone.
    let a = replica(dir.path(), &redis, &["--redis-failure-policy", "allow"]);
    let out = set(&a, "21", &["--deny"], "10m");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    redis.kill();
    let failures = "cellrate_runtime_override_sync_failures_total";
    let failed = poll(Duration::from_secs(10), true, || {
        metric(&a, failures).is_some_and(|n| n >= 1.0)
    });
    assert!(failed, "the failed copies are counted");
    assert_eq!(check(&a, "21"), Some(2), "the last copy is in force");
    assert_eq!(check(&a, "22"), Some(0), "failing open for the rest");
    for args in [
        vec![
            "admin",
            "override",
            "set",
            "NewOrdersPerAccount",
            "23",
            "--deny",
            "--ttl",
            "1m",
        ],
        vec!["admin", "override", "clear", "NewOrdersPerAccount", "21"],
        vec!["admin", "override", "list"],
    ] {
        let out = cellrate(&a, &args);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("shared through redis"),
            "{}",
            text(&out)
        );
    }
    assert_eq!(check(&a, "21"), Some(2), "a refused clear changed nothing");
    assert_eq!(check(&a, "23"), Some(0), "a refused set changed nothing");
}

#[test]
fn overrides_are_shared_on_a_redis_cluster_too() {
    let cluster = RedisCluster::start();
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 300);
    let nodes = cluster.urls().join(",");
    let store = ["--redis-cluster-nodes", nodes.as_str()];
    let a = replica_on(dir.path(), &store, &[]);
    let b = replica_on(dir.path(), &store, &[]);
    let out = set(&a, "31", &["--deny"], "10m");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let wait = Duration::from_secs(10);
    assert_eq!(
        poll(wait, Some(2), || check(&b, "31")),
        Some(2),
        "B applies it"
    );
    let out = cellrate(
        &b,
        &["admin", "override", "clear", "NewOrdersPerAccount", "31"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(poll(wait, Some(0), || check(&a, "31")), Some(0), "A let go");
}

/// Redis restarted empty (#49): the temporary overrides lived only there, and every replica
/// holds the last copy. The replicas put it back within one copy interval, each override
/// with the time it had left, and count it; one cleared before the restart stays cleared,
/// and once an operator changes the table no replica puts an older copy back over it.
#[test]
fn overrides_lost_with_redis_are_put_back_by_the_replicas() {
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 300);
    let a = replica(dir.path(), &redis, &[]);
    let b = replica(dir.path(), &redis, &[]);
    let wait = Duration::from_secs(10);
    for id in ["42", "43", "44"] {
        let out = set(&a, id, &["--deny"], "30m");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    let out = cellrate(
        &a,
        &["admin", "override", "clear", "NewOrdersPerAccount", "44"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let both = || listed(&[&a, &b]);
    let two = vec![vec!["42".to_string(), "43".to_string()]; 2];
    assert_eq!(
        poll(wait, two.clone(), both),
        two,
        "both replicas copied them"
    );

    redis.restart();
    // Within a copy interval (100 ms) of Redis answering again, the table is back: listed
    // from Redis by both replicas, and applied.
    let back = poll(wait, Ok(two.clone()), || try_listed(&[&a, &b]));
    assert_eq!(back, Ok(two.clone()), "put back from the replicas' copies");
    assert_eq!(check(&b, "42"), Some(2));
    // (The decisions' own connection to Redis may take a moment to come back.)
    assert_eq!(
        poll(wait, Some(0), || check(&b, "44")),
        Some(0),
        "a cleared override stays cleared"
    );
    let restored = |p: &Process| {
        metric(
            p,
            "cellrate_runtime_override_changes_total{action=\"restored\"}",
        )
        .unwrap_or(0.0)
    };
    let total = poll(wait, 2.0, || restored(&a) + restored(&b));
    assert_eq!(total, 2.0, "one replica put back both, counted once");

    // An operator's change after that: no copy comes back over it.
    let out = cellrate(
        &b,
        &["admin", "override", "clear", "NewOrdersPerAccount", "43"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let one = vec![vec!["42".to_string()]; 2];
    assert_eq!(poll(wait, one.clone(), both), one);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(both(), one, "43 stays cleared on every replica");
}

/// A limit of envoyproxy/ratelimit's format beside cellrate's own: 2 an hour per user.
const RATELIMIT: &str = "
domain: rl
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
";

/// The overall code of ShouldRateLimit for `user` in domain `rl` on `p`: 1 OK, 2 over.
fn rl_code(runtime: &tokio::runtime::Runtime, p: &Process, user: &str) -> i32 {
    use crate::common::ratelimit_answers::{client, request};
    runtime.block_on(async {
        let mut c = client(&p.listen).await;
        let r = c.should_rate_limit(request("rl", &[&[("user", user)]]));
        r.await.unwrap().into_inner().overall_code
    })
}

fn set_rl(p: &Process, id: &str, policy: &[&str], ttl: &str) -> Output {
    let mut args = vec!["admin", "override", "set", "rl.user", id];
    args.extend_from_slice(policy);
    args.extend_from_slice(&["--ttl", ttl, "--author", "ops"]);
    cellrate(p, &args)
}

/// A bucket of a ratelimit-format limit (its label and readable name, as `top` shows them)
/// takes a shared override as a configured name's id does: set on one replica through the
/// CLI, applied to ShouldRateLimit on the other for that bucket only, replaced there,
/// listed by both, expired on both, cleared from either.
#[test]
fn a_ratelimit_format_buckets_override_is_shared_through_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), 300);
    std::fs::write(dir.path().join("rl.yaml"), RATELIMIT).unwrap();
    let a = replica(dir.path(), &redis, &[]);
    let b = replica(dir.path(), &redis, &[]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let code = |p: &Process, user: &str| rl_code(&runtime, p, user);
    let wait = Duration::from_secs(10);
    let (ok, over) = (1, 2);

    let out = set_rl(&a, "rl/user=alice", &["--deny"], "30m");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(code(&a, "alice"), over, "A applies its own change at once");
    assert_eq!(poll(wait, over, || code(&b, "alice")), over, "B applies it");
    assert_eq!(code(&b, "bob"), ok, "only that bucket");

    // Replaced on B by a limit of 100 an hour: A lets alice past the file's 2 (the denied
    // requests spent nothing).
    let out = set_rl(&b, "rl/user=alice", &["--count", "100"], "30m");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(poll(wait, ok, || code(&a, "alice")), ok);
    for _ in 0..3 {
        assert_eq!(code(&a, "alice"), ok, "over the file's 2, within 100");
    }
    let alice = vec![vec!["rl/user=alice".to_string()]; 2];
    assert_eq!(listed(&[&a, &b]), alice);

    // A short one on carol ends on both at its TTL, with no further change in Redis.
    let out = set_rl(&b, "rl/user=carol", &["--deny"], "3s");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // (Polled by listing, not by asking: an answer before the copy would spend a hit.)
    let both = vec![vec![
        "rl/user=alice".to_string(),
        "rl/user=carol".to_string(),
    ]];
    assert_eq!(poll(wait, both.clone(), || listed(&[&a])), both);
    assert_eq!(code(&a, "carol"), over, "A applies it");
    assert_eq!(poll(wait, ok, || code(&a, "carol")), ok, "expired on A");
    // (A denied request spends nothing: polled, B answers its 2nd hit of 2.)
    assert_eq!(poll(wait, ok, || code(&b, "carol")), ok, "expired on B");

    // Cleared from A: B lists nothing.
    let out = cellrate(
        &a,
        &["admin", "override", "clear", "rl.user", "rl/user=alice"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let none = vec![Vec::<String>::new(); 2];
    assert_eq!(poll(wait, none.clone(), || listed(&[&a, &b])), none);
}
