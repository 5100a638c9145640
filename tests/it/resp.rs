//! The Redis-protocol listener (`--resp-listen`): `CL.THROTTLE` with redis-cell's numbers on
//! a fake clock, the commands clients send on their own, pipelining, authentication, the
//! key space apart from gRPC callers, and clients that misbehave on purpose.
//!
//! The server runs in this process (a fake clock: exact numbers without sleeping); the
//! client is a plain blocking socket speaking RESP, on the test's own thread (the runtime's
//! workers serve), or, where the server's own deadlines are tested, a tokio socket on paused
//! time (the deadlines pass without real waits).

use std::io::Write;
use std::time::Duration;

use cellrate::proto::v1 as pb;
use cellrate::resp::RespSettings;
use cellrate::server::listener::ConnectionLimits;
use cellrate::server::{ServerLimits, Settings};

use crate::common::resp_client::{AsyncRespClient, Reply, RespClient};
use crate::common::{http_get_async, sample, Served, MS};

const TOKEN: &str = "resp-token-7f3a9c1e5b";

async fn served_with(resp: ConnectionLimits, token: Option<&str>) -> Served {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let limits = cellrate::limits::config::LimitTable::load_dir(&dir).unwrap();
    Served::with_settings(
        limits,
        Settings {
            server: ServerLimits {
                resp,
                ..ServerLimits::default()
            },
            resp: RespSettings {
                token: token.map(str::to_string),
                ..RespSettings::default()
            },
            ..Settings::default()
        },
    )
    .await
}

fn client(s: &Served) -> RespClient {
    RespClient::connect(&s.resp_addr.to_string())
}

fn throttle(c: &mut RespClient, args: &[&str]) -> Vec<i64> {
    let mut all = vec!["CL.THROTTLE"];
    all.extend_from_slice(args);
    c.call(&all).integers()
}

fn error(reply: Reply) -> String {
    match reply {
        Reply::Error(text) => text,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cl_throttle_answers_redis_cells_numbers() {
    let s = Served::start(None).await;
    let mut c = client(&s);
    // redis-cell's README: 15 burst, 30 per 60 s: the first call leaves 15, full again in 2 s.
    assert_eq!(
        throttle(&mut c, &["user123", "15", "30", "60"]),
        [0, 16, 15, -1, 2]
    );
    for spent in 2..=16 {
        let r = throttle(&mut c, &["user123", "15", "30", "60", "1"]);
        assert_eq!(r[..3], [0, 16, 16 - spent], "call {spent}");
    }
    // Empty: limited, one token back in 2 s, full in 32 s.
    assert_eq!(
        throttle(&mut c, &["user123", "15", "30", "60"]),
        [1, 16, 0, 2, 32]
    );
    // Seconds are truncated, as redis-cell truncates them: 0.5 s to wait reads 0.
    s.clock.advance(1_500 * MS);
    assert_eq!(
        throttle(&mut c, &["user123", "15", "30", "60"]),
        [1, 16, 0, 0, 30]
    );
    s.clock.advance(500 * MS);
    assert_eq!(
        throttle(&mut c, &["user123", "15", "30", "60"]),
        [0, 16, 0, -1, 32]
    );
    // A peek (quantity 0) spends nothing, and is allowed even on an empty bucket.
    for _ in 0..2 {
        assert_eq!(
            throttle(&mut c, &["user123", "15", "30", "60", "0"]),
            [0, 16, 0, -1, 32]
        );
    }
    // State is per key, parameters per call: with a deeper burst the same key has room.
    assert_eq!(
        throttle(&mut c, &["user123", "31", "30", "60", "0"]),
        [0, 32, 16, -1, 32]
    );
    // A cost above the whole burst: limited, and no wait helps (-1), as in redis-cell.
    assert_eq!(
        throttle(&mut c, &["big", "1", "1", "60", "3"]),
        [1, 2, 2, -1, 0]
    );
    // Command names are case-insensitive; other keys are fresh.
    assert_eq!(
        c.call(&["cl.throttle", "other", "0", "1", "1"]).integers(),
        [0, 1, 0, -1, 1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_get_redis_cells_errors_and_change_nothing() {
    let s = Served::start(None).await;
    let mut c = client(&s);
    assert_eq!(throttle(&mut c, &["k", "4", "1", "60"]), [0, 5, 4, -1, 60]);
    let usage =
        "Cell error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]";
    for (args, expected) in [
        (&["CL.THROTTLE", "k", "4", "1"][..], usage.to_string()),
        (&["CL.THROTTLE"], usage.to_string()),
        (
            &["CL.THROTTLE", "k", "4", "1", "60", "1", "extra"],
            usage.to_string(),
        ),
        (
            &["CL.THROTTLE", "k", "four", "1", "60"],
            "Cell error: Couldn't parse as integer: four".to_string(),
        ),
        (
            &["CL.THROTTLE", "k", "4", "1", "60", "1.5"],
            "Cell error: Couldn't parse as integer: 1.5".to_string(),
        ),
        // Departures from redis-cell, which computes nonsense with these (and stores it).
        (
            &["CL.THROTTLE", "k", "4", "1", "60", "-2"],
            "Cell error: max_burst and quantity must not be negative".to_string(),
        ),
        (
            &["CL.THROTTLE", "k", "-1", "1", "60"],
            "Cell error: max_burst and quantity must not be negative".to_string(),
        ),
        (
            &["CL.THROTTLE", "k", "4", "0", "60"],
            "Cell error: count per period and period must be positive".to_string(),
        ),
        (
            &["CL.THROTTLE", "k", "4", "1", "0"],
            "Cell error: count per period and period must be positive".to_string(),
        ),
        (
            &["CL.THROTTLE", "k", "4", "2000000000", "1"],
            "Cell error: count per period is above one per nanosecond".to_string(),
        ),
        (
            &["CL.THROTTLE", "k", "4", "1", "60", "9223372036854775807"],
            "Cell error: arguments too large: their products overflow 64-bit nanoseconds"
                .to_string(),
        ),
        // The bounds on caller-given limits (1 000 000 burst, 732 days to refill).
        (
            &["CL.THROTTLE", "k", "1000000", "1000000", "1"],
            "Cell error: max_burst 1000000 is above this server's maximum of 999999 \
             (--caller-limit-max-burst minus one)"
                .to_string(),
        ),
        (
            &["CL.THROTTLE", "k", "1", "1", "31708800"],
            "Cell error: a full burst takes 63417600s to come back ((max_burst + 1) x period / \
             count), above this server's maximum of 63244800s (--caller-limit-max-period)"
                .to_string(),
        ),
    ] {
        assert_eq!(error(c.call(args)), expected, "{args:?}");
    }
    let long_key = "k".repeat(513);
    assert_eq!(
        error(c.call(&["CL.THROTTLE", &long_key, "1", "1", "1"])),
        "Cell error: a key of 513 bytes is above this server's maximum of 512"
    );
    c.raw(&RespClient::encode(&[
        b"CL.THROTTLE",
        b"\xff\xfe",
        b"1",
        b"1",
        b"1",
    ]))
    .unwrap();
    assert_eq!(
        error(c.read().unwrap()),
        "Cell error: key must be UTF-8 text"
    );
    // Nothing was spent by any of them; the connection still works.
    assert_eq!(
        throttle(&mut c, &["k", "4", "1", "60", "0"]),
        [0, 5, 4, -1, 60]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cl_throttle_keys_live_apart_from_grpc_callers() {
    let mut s = Served::start(None).await;
    let mut c = client(&s);
    // Spend a whole burst of key "shared" over the Redis protocol...
    for _ in 0..3 {
        throttle(&mut c, &["shared", "2", "3", "3600"]);
    }
    assert_eq!(throttle(&mut c, &["shared", "2", "3", "3600"])[0], 1);
    // ...a native inline limit of the same key and numbers has its own bucket...
    let inline = pb::Item {
        inline: Some(pb::InlineLimit {
            key: "shared".to_string(),
            burst: 3,
            count: 3,
            period: Some(prost_types::Duration {
                seconds: 3600,
                nanos: 0,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let r = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![inline.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        r.items[0].allowed,
        "the gRPC caller's bucket is its own: {r:?}"
    );
    assert_eq!(r.items[0].remaining, 2);
    // ...and spending it does not touch the Redis-protocol key.
    for _ in 0..2 {
        s.decisions
            .check(pb::CheckRequest {
                items: vec![inline.clone()],
                ..Default::default()
            })
            .await
            .unwrap();
    }
    s.clock.advance(1_200 * 1_000 * MS);
    assert_eq!(
        throttle(&mut c, &["shared", "2", "3", "3600", "0"]),
        [0, 3, 1, -1, 2_400]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_commands_are_answered_in_order() {
    let s = Served::start(None).await;
    let mut c = client(&s);
    let mut batch = Vec::new();
    for i in 0..1_000 {
        if i % 100 == 0 {
            batch.extend_from_slice(b"PING\r\n");
        }
        batch.extend_from_slice(&RespClient::encode(&[
            b"CL.THROTTLE",
            b"piped",
            b"9",
            b"1",
            b"60",
        ]));
    }
    c.raw(&batch).unwrap();
    let mut limited = Vec::new();
    for i in 0..1_000 {
        if i % 100 == 0 {
            assert_eq!(c.read().unwrap(), Reply::Simple("PONG".into()));
        }
        let r = c.read().unwrap().integers();
        if i < 10 {
            assert_eq!(r[..3], [0, 10, 9 - i], "call {i}");
        }
        limited.push(r[0]);
    }
    assert_eq!(limited.iter().filter(|&&l| l == 0).count(), 10);
    assert!(limited[10..].iter().all(|&l| l == 1));
    // Counted: 10 allowed, 990 limited.
    let (_, text) = http_get_async(s.metrics_addr, "/metrics").await;
    assert_eq!(
        sample(&text, "cellrate_resp_throttle_allowed_total"),
        Some(10.0)
    );
    assert_eq!(
        sample(&text, "cellrate_resp_throttle_limited_total"),
        Some(990.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_clients_send_on_connecting() {
    let s = Served::start(None).await;
    let mut c = client(&s);
    assert_eq!(c.call(&["PING"]), Reply::Simple("PONG".into()));
    assert_eq!(c.call(&["ping", "hi"]), Reply::Bulk(b"hi".to_vec()));
    assert_eq!(c.call(&["ECHO", "x y"]), Reply::Bulk(b"x y".to_vec()));
    assert_eq!(
        error(c.call(&["ECHO"])),
        "ERR wrong number of arguments for 'echo' command"
    );
    assert_eq!(
        c.call(&["CLIENT", "SETNAME", "app-1"]),
        Reply::Simple("OK".into())
    );
    assert_eq!(
        c.call(&["CLIENT", "GETNAME"]),
        Reply::Bulk(b"app-1".to_vec())
    );
    assert_eq!(
        c.call(&["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]),
        Reply::Simple("OK".into())
    );
    assert!(error(c.call(&["CLIENT", "SETNAME", "a b"])).contains("cannot contain spaces"));
    assert!(error(c.call(&["CLIENT", "KILL", "x"])).starts_with("ERR unknown subcommand 'KILL'"));
    assert_eq!(c.call(&["SELECT", "0"]), Reply::Simple("OK".into()));
    assert_eq!(
        error(c.call(&["SELECT", "1"])),
        "ERR DB index is out of range"
    );
    // CL.THROTTLE, RL.THROTTLE, GCRA and eight informational commands.
    assert_eq!(c.call(&["COMMAND", "COUNT"]), Reply::Integer(11));
    // Key positions, for cluster-aware clients: CL.THROTTLE's key is its first argument.
    let Reply::Array(infos) = c.call(&["COMMAND", "INFO", "cl.throttle", "get"]) else {
        panic!("COMMAND INFO is an array");
    };
    assert_eq!(infos[1], Reply::Null);
    let Reply::Array(info) = &infos[0] else {
        panic!("an info is an array");
    };
    assert_eq!(info[0], Reply::Bulk(b"cl.throttle".to_vec()));
    assert_eq!(
        info[1..6][..],
        [
            Reply::Integer(-5),
            Reply::Array(vec![Reply::Simple("write".into())]),
            Reply::Integer(1),
            Reply::Integer(1),
            Reply::Integer(1)
        ]
    );
    assert_eq!(c.call(&["COMMAND", "DOCS"]), Reply::Array(vec![]));
    assert_eq!(
        error(c.call(&["GET", "k"])),
        "ERR unknown command 'GET', with args beginning with: 'k' "
    );
    // A client's text in an error cannot break the reply's line.
    c.raw(&RespClient::encode(&[b"X\r\n+OK", b"a\r\nb"]))
        .unwrap();
    assert_eq!(
        error(c.read().unwrap()),
        "ERR unknown command 'X  +OK', with args beginning with: 'a  b' "
    );
    // Inline commands, as typed at a terminal.
    c.raw(b"CL.THROTTLE inline 1 1 1\r\n").unwrap();
    assert_eq!(c.read().unwrap().integers(), [0, 2, 1, -1, 1]);
    // HELLO 3 switches to RESP3: a map, and nulls of their own.
    let Reply::Map(hello) = c.call(&["HELLO", "3"]) else {
        panic!("HELLO 3 answers a map");
    };
    assert!(hello.contains(&(Reply::Bulk(b"proto".to_vec()), Reply::Integer(3))));
    assert!(hello.contains(&(
        Reply::Bulk(b"server".to_vec()),
        Reply::Bulk(b"cellrate".to_vec())
    )));
    assert_eq!(c.call(&["COMMAND", "DOCS"]), Reply::Map(vec![]));
    assert_eq!(
        error(c.call(&["HELLO", "4"])),
        "NOPROTO unsupported protocol version"
    );
    assert_eq!(c.call(&["QUIT"]), Reply::Simple("OK".into()));
    assert!(c.closed(), "QUIT closes the connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_required_and_guessing_it_closes_the_connection() {
    let s = served_with(ConnectionLimits::default(), Some(TOKEN)).await;
    let mut c = client(&s);
    assert_eq!(
        error(c.call(&["CL.THROTTLE", "k", "1", "1", "1"])),
        "NOAUTH Authentication required."
    );
    assert_eq!(error(c.call(&["PING"])), "NOAUTH Authentication required.");
    let wrong = "WRONGPASS invalid username-password pair or user is disabled.";
    assert_eq!(error(c.call(&["AUTH", "guess-1"])), wrong);
    assert_eq!(error(c.call(&["AUTH", "root", TOKEN])), wrong);
    assert_eq!(error(c.call(&["AUTH", "guess-3"])), wrong);
    assert!(c.closed(), "three wrong tokens close the connection");

    let mut c = client(&s);
    assert_eq!(c.call(&["AUTH", TOKEN]), Reply::Simple("OK".into()));
    assert_eq!(throttle(&mut c, &["k", "1", "1", "1"]), [0, 2, 1, -1, 1]);
    // HELLO with AUTH and SETNAME, as RESP3 clients connect.
    let mut c = client(&s);
    assert!(error(c.call(&["HELLO", "3"])).starts_with("NOAUTH HELLO must be called"));
    let Reply::Map(_) = c.call(&["HELLO", "3", "AUTH", "default", TOKEN, "SETNAME", "svc"]) else {
        panic!("HELLO 3 AUTH answers a map");
    };
    assert_eq!(c.call(&["CLIENT", "GETNAME"]), Reply::Bulk(b"svc".to_vec()));
    assert_eq!(throttle(&mut c, &["k", "1", "1", "1"]), [0, 2, 0, -1, 2]);
    let (_, text) = http_get_async(s.metrics_addr, "/metrics").await;
    assert_eq!(
        sample(
            &text,
            "cellrate_resp_closed_total{reason=\"auth_failures\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_guesses_on_many_connections_is_locked_out() {
    use cellrate::resp::lockout::FAILURE_BURST;
    let s = served_with(ConnectionLimits::default(), Some(TOKEN)).await;
    let wrong = "WRONGPASS invalid username-password pair or user is disabled.";
    // The attacker opens connection after connection, three guesses each, until its
    // address has used up its allowance.
    let mut guesses = 0;
    while guesses < FAILURE_BURST {
        let mut c = client(&s);
        for _ in 0..3 {
            if guesses == FAILURE_BURST {
                break;
            }
            assert_eq!(error(c.call(&["AUTH", "guess"])), wrong);
            guesses += 1;
        }
    }
    // Now even the right token is refused from that address, without being compared, and
    // the connection is closed; so is a HELLO with AUTH.
    let mut c = client(&s);
    let locked = error(c.call(&["AUTH", TOKEN]));
    assert!(
        locked.starts_with("ERR too many wrong tokens from this address; retry in "),
        "{locked}"
    );
    assert!(c.closed(), "a locked-out AUTH closes the connection");
    let mut c = client(&s);
    let Reply::Error(locked) = c.call(&["HELLO", "3", "AUTH", "default", TOKEN]) else {
        panic!("HELLO AUTH is refused too");
    };
    assert!(locked.starts_with("ERR too many wrong tokens"), "{locked}");
    // Another client host is not affected.
    let mut other =
        RespClient::connect_from(s.resp_addr, std::net::IpAddr::from([127, 0, 0, 2])).await;
    assert_eq!(other.call(&["AUTH", TOKEN]), Reply::Simple("OK".into()));
    assert_eq!(
        throttle(&mut other, &["k", "1", "1", "1"]),
        [0, 2, 1, -1, 1]
    );
    let (_, text) = http_get_async(s.metrics_addr, "/metrics").await;
    assert_eq!(
        sample(&text, "cellrate_resp_closed_total{reason=\"auth_locked\"}"),
        Some(2.0)
    );
}

/// Tight bounds for the attacker tests: 1 s for a command to arrive, 2 s idle, 4 connections.
/// Four connections, all of which one address (127.0.0.1, every client here) may take.
fn tight() -> ConnectionLimits {
    ConnectionLimits {
        max_connections: 4,
        max_per_address: 0,
        handshake_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(2),
        ..ConnectionLimits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_commands_are_refused_on_their_headers() {
    let s = served_with(ConnectionLimits::default(), None).await;
    for (input, expected) in [
        (
            &b"*100000\r\n"[..],
            "ERR Protocol error: a command of 100000 arguments is above this server's maximum of 64",
        ),
        (
            b"*2\r\n$4\r\nECHO\r\n$1000000000\r\n",
            "ERR Protocol error: a bulk string of 1000000000 bytes is above this server's maximum of 16384",
        ),
        (b"*1\r\n$x\r\n", "ERR Protocol error: invalid bulk length"),
        (b"*2\r\nfoo\r\n", "ERR Protocol error: expected '$', got 'f'"),
        (b"\"unbalanced\r\n", "ERR Protocol error: unbalanced quotes in request"),
    ] {
        let mut c = client(&s);
        c.raw(input).unwrap();
        assert_eq!(error(c.read().unwrap()), expected);
        assert!(c.closed(), "a protocol error closes the connection");
    }
    // An inline line without end: refused once past 16 KiB, not buffered further.
    let mut c = client(&s);
    let _ = c.raw(&vec![b'a'; 64 * 1024]);
    assert_eq!(
        error(c.read().unwrap()),
        "ERR Protocol error: too big inline request"
    );
    // Many bulk strings, each within bounds, adding up past the command bound (64 KiB).
    let mut c = client(&s);
    let mut input = b"*60\r\n".to_vec();
    for _ in 0..5 {
        input.extend_from_slice(&RespClient::encode(&[&[b'x'; 16 * 1024]])[4..]);
    }
    let _ = c.raw(&input);
    assert!(error(c.read().unwrap()).contains("above this server's maximum of 65536 bytes"));
    let (_, text) = http_get_async(s.metrics_addr, "/metrics").await;
    assert_eq!(
        sample(
            &text,
            "cellrate_resp_closed_total{reason=\"protocol_error\"}"
        ),
        Some(7.0)
    );
    // Others were served all along.
    assert_eq!(client(&s).call(&["PING"]), Reply::Simple("PONG".into()));
}

/// On paused time: the server's deadlines and the client's pace read the runtime's clock,
/// which moves on only when every task waits, so the 300 ms steps and the 1 s and 2 s
/// deadlines happen in their order without a real wait.
#[tokio::test(start_paused = true)]
async fn a_trickled_command_and_an_idle_connection_are_closed() {
    let s = served_with(tight(), None).await;
    // One byte every 300 ms: each read is within the idle timeout, but the command is not
    // whole within the 1 s command timeout (fixed waits on purpose: the pace is the attack).
    let mut slow = AsyncRespClient::connect(s.resp_addr).await;
    let started = tokio::time::Instant::now();
    let mut closed_early = false;
    for &b in b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n".iter() {
        if slow.raw(&[b]).await.is_err() {
            closed_early = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    if !closed_early {
        let reply = slow.read().await;
        assert!(
            matches!(&reply, Ok(Reply::Error(e)) if e.contains("must arrive whole within 1s")),
            "{reply:?}"
        );
    }
    assert!(slow.closed().await);
    assert!(started.elapsed() < Duration::from_secs(10));
    // A connection that says nothing more after a PING is closed after the idle timeout.
    let mut idle = AsyncRespClient::connect(s.resp_addr).await;
    assert_eq!(idle.call(&["PING"]).await, Reply::Simple("PONG".into()));
    assert!(idle.closed().await, "closed within 10 s");
    let (_, text) = http_get_async(s.metrics_addr, "/metrics").await;
    assert_eq!(
        sample(&text, "cellrate_resp_closed_total{reason=\"timeout\"}"),
        Some(2.0)
    );
}

/// On paused time, as the trickle above: three command timeouts pass without a real wait.
#[tokio::test(start_paused = true)]
async fn a_busy_pipeline_split_anywhere_is_not_taken_for_a_trickle() {
    let s = served_with(tight(), None).await;
    let mut c = AsyncRespClient::connect(s.resp_addr).await;
    // For 3 s (three command timeouts), a stream of commands written in chunks that each
    // end in the middle of a command: there is always a partial command when the server
    // reads, but each is completed by the next write, so the connection lives on.
    let command = RespClient::encode(&[b"CL.THROTTLE", b"busy", b"0", b"1000", b"1", b"0"]);
    // 10 commands and 5 bytes (the command is 63 bytes: the cut moves and never lands on
    // a boundary within the test).
    let chunk = command.len() * 10 + 5;
    let mut written = 0usize;
    let mut answered = 0usize;
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let bytes: Vec<u8> = (written..written + chunk)
            .map(|i| command[i % command.len()])
            .collect();
        c.raw(&bytes).await.unwrap();
        written += chunk;
        while answered < written / command.len() {
            assert_eq!(c.read().await.unwrap().integers()[0], 0);
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answered > 300, "{answered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_bounded() {
    let s = served_with(tight(), None).await;
    let mut held: Vec<RespClient> = (0..4).map(|_| client(&s)).collect();
    for c in &mut held {
        assert_eq!(c.call(&["PING"]), Reply::Simple("PONG".into()));
    }
    // The fifth waits in the backlog, unanswered...
    let mut fifth = client(&s);
    fifth.send(&["PING"]);
    fifth
        .stream()
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    assert!(fifth.read().is_err(), "no answer beyond the bound");
    // ...until one of the four goes.
    fifth
        .stream()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    held.pop().unwrap().call(&["QUIT"]);
    assert_eq!(fifth.read().unwrap(), Reply::Simple("PONG".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_its_answers_stops_being_read() {
    let s = served_with(tight(), None).await;
    // Pipelines 16 KiB ECHOs and never reads: the server answers until its answers stop
    // being taken, then reads no more, so the client's writes stall.
    let addr = s.resp_addr;
    let writer = std::thread::spawn(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let command = RespClient::encode(&[b"ECHO", &[b'e'; 16 * 1024]]);
        let mut written = 0usize;
        while written < 512 * 1024 * 1024 {
            match stream.write(&command) {
                Ok(n) => written += n,
                Err(_) => break,
            }
        }
        written
    });
    let written = writer.join().unwrap();
    // Socket buffers on both sides take some megabytes; the server holds at most 64 KiB of
    // answers and one partial command.
    assert!(
        written < 64 * 1024 * 1024,
        "the server kept reading from a client that does not read: {written} bytes"
    );
    // Meanwhile others are served.
    assert_eq!(client(&s).call(&["PING"]), Reply::Simple("PONG".into()));
}

/// With a token, clients without it cannot hold the listener's slots: each connection that
/// has not authenticated within the handshake timeout is closed, however busily it PINGs
/// (answered NOAUTH) to look alive, and a client with the token then gets a slot. On
/// paused time, as the trickle above: the 200 ms pace and the deadlines without real waits.
#[tokio::test(start_paused = true)]
async fn unauthenticated_connections_are_closed_after_the_handshake_timeout() {
    let s = served_with(tight(), Some(TOKEN)).await;
    let started = tokio::time::Instant::now();
    let mut squatters = Vec::new();
    for _ in 0..4 {
        squatters.push(AsyncRespClient::connect(s.resp_addr).await);
    }
    // PINGs every 200 ms for 3 s: well inside the 2 s idle timeout each time.
    let mut closed = vec![None; squatters.len()];
    for _ in 0..15 {
        for (i, c) in squatters.iter_mut().enumerate() {
            if closed[i].is_some() {
                continue;
            }
            c.send(&["PING"]).await.unwrap();
            match c.read().await {
                Ok(Reply::Error(e)) if e.starts_with("NOAUTH Authentication required within") => {
                    assert!(
                        c.closed().await,
                        "answered the timeout but kept the connection"
                    );
                    closed[i] = Some(started.elapsed());
                }
                Ok(Reply::Error(e)) => assert!(e.starts_with("NOAUTH"), "{e}"),
                Ok(other) => panic!("answered without the token: {other:?}"),
                Err(_) => closed[i] = Some(started.elapsed()),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (i, at) in closed.iter().enumerate() {
        let at = at.unwrap_or_else(|| panic!("connection {i} still open after 3 s"));
        assert!(at >= Duration::from_millis(900), "closed too early: {at:?}");
    }
    // A slot is free again for a client that has the token.
    let mut good = AsyncRespClient::connect(s.resp_addr).await;
    assert_eq!(
        good.call(&["AUTH", TOKEN]).await,
        Reply::Simple("OK".into())
    );
    assert_eq!(good.call(&["PING"]).await, Reply::Simple("PONG".into()));
    // Authenticated, it is not closed at the deadline.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(good.call(&["PING"]).await, Reply::Simple("PONG".into()));
    let (_, text) = http_get_async(s.metrics_addr, "/metrics").await;
    assert_eq!(
        sample(&text, "cellrate_resp_closed_total{reason=\"auth_timeout\"}"),
        Some(4.0)
    );
}

/// One client address cannot take a listener's whole connection bound: beyond its share,
/// its new connections are closed as they are accepted, while another address still gets
/// in (and the refused address gets in again once one of its connections closes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_connections() {
    let s = served_with(
        ConnectionLimits {
            // 3, below the listener's quarter share (12 / 4).
            max_connections: 12,
            max_per_address: 3,
            ..tight()
        },
        None,
    )
    .await;
    let mut mine: Vec<RespClient> = (0..3).map(|_| client(&s)).collect();
    for c in &mut mine {
        assert_eq!(c.call(&["PING"]), Reply::Simple("PONG".into()));
    }
    let mut fourth = client(&s);
    fourth.send(&["PING"]);
    assert!(
        fourth.closed(),
        "a fourth connection from one address was served"
    );
    // 127.0.0.2 is another address on the loopback interface.
    let other: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let mut theirs = RespClient::connect_from(s.resp_addr, other).await;
    assert_eq!(theirs.call(&["PING"]), Reply::Simple("PONG".into()));
    mine.pop().unwrap().call(&["QUIT"]);
    let mut again = None;
    for _ in 0..50 {
        let mut c = client(&s);
        c.send(&["PING"]);
        if let Ok(Reply::Simple(pong)) = c.read() {
            assert_eq!(pong, "PONG");
            again = Some(c);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        again.is_some(),
        "the address's freed place was not given back"
    );
}
