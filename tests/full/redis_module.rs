//! cellrate's Redis module (`crates/module`, issue #61) loaded into a real redis-server and
//! a real Valkey: its `CL.THROTTLE` answers the differential's generated sequences as
//! redis-cell 0.2.2 does (all five numbers and every error's text, with the differential's
//! stated tolerance for the two servers' clocks), a bucket moves between redis-cell and the
//! module both ways without losing a token, `RL.THROTTLE` answers the same numbers with
//! Valkey's errors, `GCRA` Redis 8.8's on the same bucket, and a hostile caller gets an
//! error and changes nothing.

use crate::common::redis_cell::redis_with_cell;
use crate::common::redis_module::{redis_with_module, valkey_with_module};
use crate::common::redis_server::RedisServer;
use crate::common::resp_client::{Reply, RespClient};
use crate::resp_differential::differential;

fn addr(server: &RedisServer) -> String {
    format!("127.0.0.1:{}", server.port)
}

#[test]
fn the_modules_cl_throttle_answers_as_redis_cell_in_redis() {
    let (cell, module) = (redis_with_cell(), redis_with_module());
    differential(&[11, 12, 13], 250, &addr(&cell), &addr(&module));
}

#[test]
fn the_modules_cl_throttle_answers_as_redis_cell_in_valkey() {
    let (cell, module) = (redis_with_cell(), valkey_with_module());
    differential(&[14, 15], 250, &addr(&cell), &addr(&module));
}

/// The stored bucket and its time to live, as `GET` and `PTTL` read them.
fn bucket(client: &mut RespClient, key: &str) -> (String, i64) {
    let Reply::Bulk(value) = client.call(&["GET", key]) else {
        panic!("no bucket at {key}");
    };
    let Reply::Integer(ttl) = client.call(&["PTTL", key]) else {
        panic!("no PTTL");
    };
    (String::from_utf8(value).unwrap(), ttl)
}

/// A bucket written by one moved into the other (`SET key value PX ttl`, as a migration
/// or a replica would carry it) is read there as where it was written: the same tokens
/// left, both ways.
#[test]
fn a_bucket_moves_between_redis_cell_and_the_module_both_ways() {
    let (cell, module) = (redis_with_cell(), redis_with_module());
    let throttle = |client: &mut RespClient, key: &str, quantity: &str| {
        client
            .call(&["CL.THROTTLE", key, "99", "10", "3600", quantity])
            .integers()
    };
    for (from, to, key) in [(&cell, &module, "from-cell"), (&module, &cell, "to-cell")] {
        let (mut from, mut to) = (
            RespClient::connect(&addr(from)),
            RespClient::connect(&addr(to)),
        );
        assert_eq!(throttle(&mut from, key, "40")[..3], [0, 100, 60]);
        let (value, ttl) = bucket(&mut from, key);
        let set = to.call(&["SET", key, &value, "PX", &ttl.to_string()]);
        assert_eq!(set, Reply::Simple("OK".into()));
        // A peek where it moved: 60 left there too; the next 60 pass, the 61st does not.
        assert_eq!(throttle(&mut to, key, "0")[..3], [0, 100, 60], "{key}");
        assert_eq!(throttle(&mut to, key, "60")[..3], [0, 100, 0], "{key}");
        assert_eq!(throttle(&mut to, key, "1")[0], 1, "{key}");
    }
}

/// `RL.THROTTLE`: the numbers of `CL.THROTTLE` on the same bucket, Valkey's errors.
#[test]
fn rl_throttle_answers_cl_throttles_numbers_with_valkeys_errors() {
    let module = valkey_with_module();
    let mut m = RespClient::connect(&addr(&module));
    let rl = m
        .call(&["RL.THROTTLE", "k", "15", "30", "60", "1"])
        .integers();
    assert_eq!(rl, [0, 16, 15, -1, 2]);
    let cl = m
        .call(&["CL.THROTTLE", "k", "15", "30", "60", "0"])
        .integers();
    assert_eq!(cl[..3], [0, 16, 15], "the same bucket");
    let Reply::Error(e) = m.call(&["RL.THROTTLE", "k", "15", "x", "60"]) else {
        panic!("an error expected");
    };
    assert_eq!(e, "ERR Couldn't parse as integer: x");
    let Reply::Error(e) = m.call(&["RL.THROTTLE", "k"]) else {
        panic!("an error expected");
    };
    assert!(e.contains("wrong number of arguments"), "{e}");
}

/// `GCRA`: Redis 8.8's numbers (its documented example: 5 burst, 10 per 60 s), on the
/// bucket `CL.THROTTLE` of the same key uses, in redis-server (which has no `GCRA` of its
/// own before 8.8) and Valkey.
#[test]
fn gcra_answers_redis_numbers_on_the_cl_throttle_bucket() {
    for module in [redis_with_module(), valkey_with_module()] {
        let mut m = RespClient::connect(&addr(&module));
        let first = m.call(&["GCRA", "k", "5", "10", "60"]).integers();
        assert_eq!(first, [0, 6, 5, -1, 6]);
        for _ in 0..5 {
            m.call(&["GCRA", "k", "5", "10", "60"]);
        }
        let limited = m.call(&["GCRA", "k", "5", "10", "60"]).integers();
        assert_eq!(limited[..3], [1, 6, 0]);
        // CL.THROTTLE of the same numbers (max_burst 5, 10 per 60 s) reads the same bucket.
        let cell = m
            .call(&["CL.THROTTLE", "k", "5", "10", "60", "0"])
            .integers();
        assert_eq!(cell[..3], [0, 6, 0]);
        let Reply::Error(e) = m.call(&["GCRA", "k", "5", "10", "0"]) else {
            panic!("an error expected");
        };
        assert_eq!(e, "ERR period must be > 0 and < 1e12");
    }
}

/// The attacker: a wrong arity, numbers that are no integers or that would overflow or
/// divide by zero, a key of another type, a value that is no bucket: each an error, and
/// nothing written.
#[test]
fn a_hostile_caller_gets_an_error_and_changes_nothing() {
    let module = redis_with_module();
    let mut m = RespClient::connect(&addr(&module));
    m.call(&["RPUSH", "list", "a"]);
    m.call(&["SET", "text", "hello"]);
    let calls: [&[&str]; 9] = [
        &["CL.THROTTLE"],
        &["CL.THROTTLE", "k", "1", "2"],
        &["CL.THROTTLE", "k", "1", "2", "3", "4", "5"],
        &["CL.THROTTLE", "k", "x", "30", "60"],
        &["CL.THROTTLE", "k", "15", "0", "60"],
        &["CL.THROTTLE", "k", "9223372036854775807", "1", "1"],
        &["CL.THROTTLE", "k", "1", "1", "1", "-1"],
        &["CL.THROTTLE", "list", "15", "30", "60"],
        &["CL.THROTTLE", "text", "15", "30", "60"],
    ];
    for call in calls {
        let reply = m.call(call);
        assert!(matches!(reply, Reply::Error(_)), "{call:?}: {reply:?}");
    }
    assert_eq!(
        m.call(&["EXISTS", "k"]),
        Reply::Integer(0),
        "nothing written"
    );
    assert_eq!(m.call(&["LLEN", "list"]), Reply::Integer(1));
    assert_eq!(m.call(&["GET", "text"]), Reply::Bulk(b"hello".to_vec()));
    let Reply::Error(e) = m.call(&["CL.THROTTLE", "list", "15", "30", "60"]) else {
        unreachable!()
    };
    assert!(e.starts_with("WRONGTYPE"), "{e}");
}
