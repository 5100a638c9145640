//! cellrate's module deciding the Redis store's batches (`CELLRATE.BATCH`, issue #61): the
//! store finds it at start and uses it (`--redis-module auto`), keeps to the script where it
//! is not loaded or is unloaded while running (the call the server did not know is sent
//! again as the script, and a bucket spent through one is read by the other), fails clearly
//! when it is required and absent; a kept Check's marker answers as the script's does; a
//! replica without the module holds what the module wrote; and a hostile caller of the
//! command gets an error and changes nothing.
//!
//! The generated differential (memory = script = module at every step, switching between
//! the two at each step) is in `store_differential.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellrate::clock::{SystemClock, SECOND};
use cellrate::gcra::{Limit, Mode, Window};
use cellrate::limits::names::BucketKey;
use cellrate::observe::metrics::Metrics;
use cellrate::store::redis::{RedisModule, RedisSettings, RedisStore};
use cellrate::store::{Store, StoreItem};

use crate::common::redis_module::{module, redis_with_module, valkey_with_module};
use crate::common::redis_server::RedisServer;
use crate::common::resp_client::{Reply, RespClient};

fn addr(server: &RedisServer) -> String {
    format!("127.0.0.1:{}", server.port)
}

fn store(server: &RedisServer, module: RedisModule) -> Arc<RedisStore> {
    RedisStore::new(
        settings(server, module),
        Arc::new(SystemClock),
        Metrics::new(),
    )
    .unwrap()
}

/// A Redis store's settings on `server`.
fn settings(server: &RedisServer, module: RedisModule) -> RedisSettings {
    RedisSettings {
        url: Some(server.url()),
        timeout: Duration::from_secs(5),
        module,
        ..RedisSettings::default()
    }
}

/// The flags that load the module at `path` and let `MODULE UNLOAD` take it out.
fn unloadable_args(path: &std::path::Path) -> [&str; 4] {
    let path = path.to_str().unwrap();
    ["--loadmodule", path, "--enable-module-command", "yes"]
}

/// A redis-server with the module loaded, which a test may unload.
fn unloadable() -> RedisServer {
    RedisServer::start_with_args(&unloadable_args(&module()))
}

/// A spend of one token of a 3-a-minute limit on `id`.
fn one(id: &str) -> StoreItem {
    StoreItem {
        key: BucketKey::windowed(1, id, Window::Gcra),
        limit: Limit::new(3, 3, 60 * SECOND).unwrap(),
        cost: 1,
        mode: Mode::CheckAndSpend,
        lease: None,
    }
}

/// How many times the server ran `command` (`INFO commandstats`).
fn calls(server: &RedisServer, command: &str) -> u64 {
    // A module's command is listed as it was registered (upper case).
    let info = server
        .cli(&["INFO", "commandstats"])
        .unwrap_or_default()
        .to_lowercase();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn allowed(store: &RedisStore, id: &str) -> bool {
    store.spend(&[one(id)]).await.expect("an answer").allowed
}

#[tokio::test]
async fn auto_decides_with_the_module_where_it_is_loaded_and_with_the_script_elsewhere() {
    for (server, with_module) in [(redis_with_module(), true), (RedisServer::start(), false)] {
        let store = store(&server, RedisModule::Auto);
        store.probe_at_start().await;
        // The start's first call is the script's, whatever is loaded; then the question.
        let module_before = calls(&server, "cellrate.batch");
        let script_before = calls(&server, "evalsha");
        assert_eq!(
            module_before,
            u64::from(with_module),
            "the start's question"
        );
        for _ in 0..3 {
            assert!(allowed(&store, "a").await);
        }
        assert!(!allowed(&store, "a").await, "the fourth of three");
        let module_calls = calls(&server, "cellrate.batch") - module_before;
        let script_calls = calls(&server, "evalsha") - script_before;
        if with_module {
            assert_eq!((module_calls, script_calls), (4, 0));
        } else {
            assert_eq!((module_calls, script_calls), (0, 4));
        }
    }
}

/// The module unloaded under a running store: the next call is answered (sent again as the
/// script, which reads the bucket the module wrote), and the script decides from then on.
#[tokio::test]
async fn a_module_unloaded_while_running_hands_over_to_the_script_without_an_error() {
    let server = unloadable();
    let store = store(&server, RedisModule::Auto);
    store.probe_at_start().await;
    let script_before = calls(&server, "evalsha");
    assert!(allowed(&store, "b").await);
    assert!(allowed(&store, "b").await);
    assert_eq!(calls(&server, "evalsha"), script_before);
    let unloaded = server.cli(&["MODULE", "UNLOAD", "cellrate"]);
    assert_eq!(unloaded.as_deref().map(str::trim), Some("OK"));
    assert!(
        allowed(&store, "b").await,
        "the third token, through the script"
    );
    assert!(
        !allowed(&store, "b").await,
        "the bucket the module wrote is counted"
    );
    assert_eq!(calls(&server, "evalsha"), script_before + 2);
}

#[tokio::test]
async fn require_without_the_module_fails_every_decision_and_says_why() {
    let server = RedisServer::start();
    let store = store(&server, RedisModule::Require);
    store.probe_at_start().await;
    let script_before = calls(&server, "evalsha");
    let e = store
        .spend(&[one("c")])
        .await
        .expect_err("no module, no decision");
    assert!(e.to_string().contains("CELLRATE.BATCH"), "{e}");
    assert_eq!(
        calls(&server, "evalsha"),
        script_before,
        "the script is not used"
    );
    assert_eq!(server.cli(&["DBSIZE"]).as_deref().map(str::trim), Some("0"));
}

/// `forbid` keeps to the script on a server that has the module.
#[tokio::test]
async fn forbid_keeps_to_the_script_where_the_module_is_loaded() {
    let server = redis_with_module();
    let store = store(&server, RedisModule::Forbid);
    store.probe_at_start().await;
    assert!(allowed(&store, "d").await);
    assert_eq!(calls(&server, "cellrate.batch"), 0);
}

/// The same call to the script and to the module, on keys of their own (`s:` and `m:`):
/// both replies, with each side's key names made alike.
fn both(client: &mut RespClient, sha: &str, keys: &[&str], args: &[&str]) -> (Reply, Reply) {
    let n = keys.len().to_string();
    let named = |prefix: &str| {
        keys.iter()
            .map(|k| format!("{prefix}{k}"))
            .collect::<Vec<_>>()
    };
    let (s, m) = (named("s:"), named("m:"));
    let mut script: Vec<&str> = vec!["EVALSHA", sha, &n];
    script.extend(s.iter().map(String::as_str));
    script.extend(args);
    let mut module: Vec<&str> = vec!["CELLRATE.BATCH", &n];
    module.extend(m.iter().map(String::as_str));
    module.extend(args);
    (client.call(&script), client.call(&module))
}

/// Every key of one side (`s:` or `m:`), its value (a string, or a sorted set's members and
/// scores) and whether it expires, with the prefix taken off.
fn keyspace(client: &mut RespClient, prefix: &str) -> Vec<(String, Reply, bool)> {
    let Reply::Array(names) = client.call(&["KEYS", &format!("{prefix}*")]) else {
        panic!("KEYS")
    };
    let mut out: Vec<(String, Reply, bool)> = names
        .into_iter()
        .map(|name| {
            let Reply::Bulk(name) = name else {
                panic!("a key name")
            };
            let name = String::from_utf8(name).unwrap();
            let value = match client.call(&["TYPE", &name]) {
                Reply::Simple(t) if t == "zset" => {
                    client.call(&["ZRANGE", &name, "0", "-1", "WITHSCORES"])
                }
                _ => client.call(&["GET", &name]),
            };
            let Reply::Integer(ttl) = client.call(&["PTTL", &name]) else {
                panic!("PTTL")
            };
            (name[prefix.len()..].to_string(), value, ttl > 0)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A kept Check's marker (`once`, `resolve`, `undo`), a cross-slot compensation's lease
/// taken back (`#id`), charges into debt, calendar windows and resets answer through the
/// module exactly as through the script, and leave the same keys.
fn markers_and_give_backs_answer_as_the_scripts(server: &RedisServer) {
    let mut c = RespClient::connect(&addr(server));
    let script = include_str!("../../crates/store/src/redis/batch.lua");
    let Reply::Bulk(sha) = c.call(&["SCRIPT", "LOAD", script]) else {
        panic!("SCRIPT LOAD")
    };
    let sha = String::from_utf8(sha).unwrap();
    // Far ahead of the real clock: nothing expires during the test.
    let now = "1900000000123456789";
    let later = "1900000000623456789";
    // Shapes: GCRA 1/s burst 3; a charge of 5 on it; a UTC-hour window of 4; a lease key.
    let shapes = [
        "4",
        "1000000000",
        "3000000000",
        "0",
        "5000000000",
        "3000000000",
        "3",
        "1",
        "4",
        "0h",
        "60000000000",
        "2",
        "4",
    ];
    let spend = |op: &str, now: &str, items: &[&str]| {
        let mut args: Vec<String> = vec![op.into(), now.into()];
        args.extend(shapes.iter().map(|s| s.to_string()));
        args.push(items.len().to_string());
        args.extend(items.iter().map(|s| s.to_string()));
        args
    };
    let undo = || -> Vec<String> {
        ["undo:60000", later, "1000000000", "h1"]
            .map(String::from)
            .to_vec()
    };
    let steps: Vec<(Vec<&str>, Vec<String>)> = vec![
        (
            vec!["g", "w", "l"],
            spend("spend", now, &["1", "3", "4:r1"]),
        ),
        (
            vec!["g", "w", "l", "{t}1"],
            spend("once:60000", now, &["1", "3", "4:r2"]),
        ),
        // The marker found: its reply again, nothing spent.
        (
            vec!["g", "w", "l", "{t}1"],
            spend("once:60000", later, &["1", "3", "4:r2"]),
        ),
        (vec!["g", "{t}1"], spend("resolve:60000", later, &["1"])),
        // Undone once: the second finds the marker void.
        (vec!["g", "w", "{t}1"], undo()),
        (vec!["g", "w", "{t}1"], undo()),
        (vec!["g", "{t}2"], spend("resolve:60000", later, &["1"])),
        (vec!["g", "{t}2"], spend("once:60000", later, &["1"])),
        (
            vec!["g", "{t}3"],
            vec!["undo:60000".into(), later.into(), "1000000000".into()],
        ),
        // A charge into debt, then a spend refused by it.
        (vec!["g"], spend("spend", later, &["2"])),
        (vec!["g", "w"], spend("spend", later, &["1", "3"])),
        (vec!["l"], vec!["refund".into(), later.into(), "#r1".into()]),
        (
            vec!["g", "g", "w"],
            vec![
                "refund".into(),
                later.into(),
                "1000000000".into(),
                "2000000000".into(),
                "h5".into(),
            ],
        ),
        (
            vec!["w", "l", "g", "none"],
            vec!["reset".into(), later.into()],
        ),
    ];
    for (n, (keys, args)) in steps.iter().enumerate() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (s, m) = both(&mut c, &sha, keys, &args);
        assert!(
            !matches!(s, Reply::Error(_)),
            "step {n}: the script failed: {s:?}"
        );
        assert_eq!(s, m, "step {n}: {keys:?} {args:?}");
        assert_eq!(
            keyspace(&mut c, "s:"),
            keyspace(&mut c, "m:"),
            "step {n}: the keys differ"
        );
    }
}

#[test]
fn markers_and_give_backs_answer_as_the_scripts_in_redis() {
    markers_and_give_backs_answer_as_the_scripts(&redis_with_module());
}

#[test]
fn markers_and_give_backs_answer_as_the_scripts_in_valkey() {
    markers_and_give_backs_answer_as_the_scripts(&valkey_with_module());
}

/// The module's writes reach a replica that has no module as plain writes (`SET ...
/// PXAT`, `DEL`, the sorted sets' own commands): the replica holds the same keys.
#[test]
fn a_replica_without_the_module_holds_what_the_module_wrote() {
    let master = redis_with_module();
    let port = master.port.to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]);
    let mut m = RespClient::connect(&addr(&master));
    // Ten-minute increments and a year's window: nothing expires while the replica catches
    // up, whatever the hour (an hour's window refunded 5 min before its end was deleted).
    // `_` is the empty now (the server's clock).
    let calls = [
        "CELLRATE.BATCH 2 g w spend _ 2 600000000000 1800000000000 0 1 4 0y 2 1 2",
        "CELLRATE.BATCH 1 l spend _ 1 600000000000 2 4 1 1:r1",
        "CELLRATE.BATCH 2 g2 {t}1 once:600000 _ 1 600000000000 1800000000000 0 1 1",
        "CELLRATE.BATCH 1 g refund _ 300000000000",
        "CELLRATE.BATCH 1 gone reset _",
    ];
    for call in calls {
        let call: Vec<&str> = call
            .split(' ')
            .map(|w| if w == "_" { "" } else { w })
            .collect();
        let reply = m.call(&call);
        assert!(!matches!(reply, Reply::Error(_)), "{call:?}: {reply:?}");
    }
    m.call(&["SET", "fence", "1"]);
    let mut r = RespClient::connect(&addr(&replica));
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.call(&["GET", "fence"]) != Reply::Bulk(b"1".to_vec()) {
        assert!(Instant::now() < deadline, "the replica never caught up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (on_master, on_replica) = (keyspace(&mut m, ""), keyspace(&mut r, ""));
    assert_eq!(
        on_master.len(),
        6,
        "g, w, l, g2, the marker, the fence: {on_master:?}"
    );
    assert_eq!(on_master, on_replica);
    assert_eq!(
        replica.cli(&["MODULE", "LIST"]).unwrap_or_default().trim(),
        "",
        "no module there"
    );
}

/// Wrong arity, numbers that are no numbers or too large, a call that names more items
/// than it has, unknown ops and modes, and keys of other types: each an error, nothing
/// written, over a flood of them.
#[test]
fn a_hostile_caller_of_cellrate_batch_gets_an_error_and_changes_nothing() {
    let server = redis_with_module();
    let mut c = RespClient::connect(&addr(&server));
    c.call(&["RPUSH", "list", "a"]);
    c.call(&["SET", "text", "hello"]);
    c.call(&["ZADD", "lease", "-inf", "no base"]);
    let gcra = ["1", "1000000000", "3000000000", "0"];
    let with = |keys: &[&'static str], tail: &[&'static str]| -> Vec<&'static str> {
        let mut call = vec!["CELLRATE.BATCH"];
        let n: &'static str = ["0", "1", "2", "3"][keys.len()];
        call.push(n);
        call.extend(keys);
        call.extend(tail);
        call
    };
    let spend = |keys: &[&'static str], items: &[&'static str]| {
        let mut tail = vec!["spend", ""];
        tail.extend(gcra);
        tail.push(["0", "1", "2", "3"][items.len()]);
        tail.extend(items);
        with(keys, &tail)
    };
    let calls: Vec<Vec<&str>> = vec![
        vec!["CELLRATE.BATCH"],
        vec!["CELLRATE.BATCH", "x", "spend", ""],
        vec!["CELLRATE.BATCH", "5", "k", "spend", ""],
        vec!["CELLRATE.BATCH", "99999999999999999999", "k", "spend", ""],
        with(&["k"], &["explode", ""]),
        with(&["k"], &["spend", "soon"]),
        with(&["k"], &["spend", "", "99999999999", "1", "2", "0"]),
        with(&["k"], &["spend", "", "1", "1", "2", "9", "1", "1"]),
        with(&["k"], &["spend", "", "1", "1", "2", "0q", "1", "1"]),
        with(&["k"], &["spend", "", "1", "-1", "2", "0", "1", "1"]),
        spend(&["k"], &["2"]),
        spend(&["k", "k2"], &["1"]),
        spend(&["k"], &["1", "1"]),
        spend(&["list"], &["1"]),
        spend(&["k", "list"], &["1", "1"]),
        with(
            &["text"],
            &["spend", "", "1", "1000", "2", "4", "1", "1:id"],
        ),
        with(
            &["lease"],
            &["spend", "", "1", "1000", "2", "4", "1", "1:id"],
        ),
        with(&["k", "list"], &["refund", "", "1", "1"]),
        with(&["text"], &["refund", "", "1"]),
        with(&["k"], &["refund", "", "1", "2"]),
        with(&["list"], &["reset", ""]),
        with(
            &["k", "list"],
            &["once:1000", "", "1", "1", "2", "0", "1", "1"],
        ),
    ];
    let before = server.cli(&["DBSIZE"]);
    for round in 0..200 {
        for call in &calls {
            let reply = c.call(call);
            assert!(
                matches!(reply, Reply::Error(_)),
                "round {round}: {call:?}: {reply:?}"
            );
        }
    }
    assert_eq!(server.cli(&["DBSIZE"]), before, "nothing written");
    assert_eq!(c.call(&["GET", "text"]), Reply::Bulk(b"hello".to_vec()));
    assert_eq!(c.call(&["LLEN", "list"]), Reply::Integer(1));
    assert_eq!(c.call(&["ZCARD", "lease"]), Reply::Integer(1));
    // And the command still decides.
    let reply = c.call(&spend(&["k"], &["1"]));
    assert!(
        matches!(reply, Reply::Array(ref v) if v.len() == 2),
        "{reply:?}"
    );
}

/// A cluster knows the command's keys (`getkeys-api`, the `numkeys` after the count, as
/// `EVALSHA`'s): keys of two slots are refused (CROSSSLOT), a key of another master's slot
/// is redirected (MOVED), never decided on the wrong node; `CELLRATE.SETTLE` the same.
#[test]
fn a_cluster_checks_the_modules_keys_as_a_scripts() {
    let cluster = crate::common::redis_module::cluster_with_module();
    let mut c = RespClient::connect(&addr(&cluster.nodes[0]));
    let keys = c.call(&[
        "COMMAND",
        "GETKEYS",
        "CELLRATE.BATCH",
        "2",
        "a",
        "b",
        "reset",
        "",
    ]);
    let names = |r: Reply| match r {
        Reply::Array(v) => v.len(),
        other => panic!("{other:?}"),
    };
    assert_eq!(names(keys), 2);
    for command in ["CELLRATE.BATCH", "CELLRATE.SETTLE"] {
        // "a" and "b" hash to different slots (15495 and 3300).
        let reply = c.call(&[command, "2", "a", "b", "reset", ""]);
        assert!(
            matches!(&reply, Reply::Error(e) if e.starts_with("CROSSSLOT")),
            "{reply:?}"
        );
        let theirs = (0..100)
            .map(|n| format!("k{n}"))
            .find(|k| cluster.node_of_slot(cellrate::store::redis::slot(k)) != 0)
            .unwrap();
        let reply = c.call(&[command, "1", &theirs, "reset", ""]);
        assert!(
            matches!(&reply, Reply::Error(e) if e.starts_with("MOVED")),
            "{reply:?}"
        );
    }
}

/// The settlement ledger through the module (`CELLRATE.SETTLE`) where the store's question
/// at start found it, and through the script where it did not: the same record opened,
/// decided and claimed either way.
#[tokio::test]
async fn kept_checks_are_settled_through_the_module_where_it_is_loaded() {
    use cellrate::store::redis::RedisSettlements;
    use cellrate::store::shared::{Claim, Settlements};
    for (server, with_module) in [(redis_with_module(), true), (RedisServer::start(), false)] {
        let settings = RedisSettings {
            url: Some(server.url()),
            timeout: Duration::from_secs(5),
            ..RedisSettings::default()
        };
        let found = store(&server, RedisModule::Auto);
        found.probe_at_start().await;
        let ledger = RedisSettlements::new(&settings, 60 * SECOND, 100)
            .unwrap()
            .following(&found);
        let (module_before, script_before) =
            (calls(&server, "cellrate.settle"), calls(&server, "evalsha"));
        ledger.open("r1", b"check", None, &[]).await.unwrap();
        assert!(ledger.decide("r1", b"facts").await.unwrap());
        let claim = ledger.claim("r1", b"costs").await.unwrap();
        assert!(matches!(claim, Claim::Claimed(_)), "{claim:?}");
        let module_calls = calls(&server, "cellrate.settle") - module_before;
        let script_calls = calls(&server, "evalsha") - script_before;
        if with_module {
            assert_eq!((module_calls, script_calls), (3, 0));
        } else {
            // The script's (loaded once, on NOSCRIPT).
            assert_eq!(module_calls, 0);
            assert!((3..=4).contains(&script_calls), "{script_calls}");
        }
    }
}

/// On a cluster the question at start goes to every master: the module is used when every
/// one has it, and the script when one has not (a call to that master would fail).
#[tokio::test]
async fn on_a_cluster_auto_uses_the_module_only_where_every_master_has_it() {
    let path = module();
    let cluster =
        crate::common::redis_server::RedisCluster::start_with_args(&unloadable_args(&path));
    let on_masters = |command: &str| cluster.nodes.iter().map(|n| calls(n, command)).sum::<u64>();
    for unload_one in [false, true] {
        if unload_one {
            let unloaded = cluster.nodes[1].cli(&["MODULE", "UNLOAD", "cellrate"]);
            assert_eq!(unloaded.as_deref().map(str::trim), Some("OK"));
        }
        let settings = RedisSettings {
            cluster_nodes: cluster.urls(),
            timeout: Duration::from_secs(5),
            ..RedisSettings::default()
        };
        let store = RedisStore::new(settings, Arc::new(SystemClock), Metrics::new()).unwrap();
        store.probe_at_start().await;
        let (module_before, script_before) = (on_masters("cellrate.batch"), on_masters("evalsha"));
        // Ids spread over the three masters.
        for n in 0..12 {
            assert!(allowed(&store, &format!("c{unload_one}{n}")).await);
        }
        let module_calls = on_masters("cellrate.batch") - module_before;
        let script_calls = on_masters("evalsha") - script_before;
        match unload_one {
            false => assert_eq!((module_calls, script_calls), (12, 0)),
            true => assert_eq!(module_calls, 0, "{script_calls} through the script"),
        }
    }
}

/// The module unloaded under a ledger that used it: the server's "unknown command" echoes
/// the call's first arguments, a kept Check's bytes that are no UTF-8, and that answer
/// cannot be read. The call fails (it is not sent again: an unreadable answer may be one of
/// a call that ran), and the ledger keeps to the script from the next call on.
#[tokio::test]
async fn a_ledger_whose_module_is_unloaded_keeps_to_the_script_after_one_failed_call() {
    use cellrate::store::redis::RedisSettlements;
    use cellrate::store::shared::Settlements;
    let server = unloadable();
    let found = store(&server, RedisModule::Auto);
    found.probe_at_start().await;
    let settings = settings(&server, RedisModule::Auto);
    let ledger = RedisSettlements::new(&settings, 60 * SECOND, 100)
        .unwrap()
        .following(&found);
    let check: &[u8] = b"\xff\xfe a kept Check's bytes";
    ledger.open("r1", check, None, &[]).await.unwrap();
    assert_eq!(calls(&server, "cellrate.settle"), 1);
    let unloaded = server.cli(&["MODULE", "UNLOAD", "cellrate"]);
    assert_eq!(unloaded.as_deref().map(str::trim), Some("OK"));
    assert!(
        ledger.open("r2", check, None, &[]).await.is_err(),
        "one call fails"
    );
    ledger
        .open("r3", check, None, &[])
        .await
        .expect("the script from then on");
    assert!(
        ledger.decide("r1", b"facts").await.unwrap(),
        "r1, opened by the module"
    );
}

/// Redis down when cellrate starts (it often starts first): the question at start gets no
/// answer, the script decides meanwhile, and once a call is answered the server is asked
/// again and its module used from then on.
#[tokio::test]
async fn a_redis_that_was_down_at_start_is_asked_again_once_it_answers() {
    let mut server = redis_with_module();
    server.kill();
    let store = store(&server, RedisModule::Auto);
    store.probe_at_start().await;
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    while calls(&server, "cellrate.batch") < 2 {
        assert!(Instant::now() < deadline, "the module never used");
        // A new bucket each time: a call through the script, then through the module.
        let _ = store.spend(&[one(&format!("e{n}"))]).await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        calls(&server, "evalsha") >= 1,
        "the script before the answer"
    );
}
