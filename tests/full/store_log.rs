//! Store failures in the process's log (issue #49): `cellrate serve` on a real
//! redis-server that is absent at start, killed mid-run, restarted, or paused past the
//! deadline; each kind of failure has its WARN line naming the kind, the address (its
//! password left out) and the flag that governs it, and a flood of failures is a few lines.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::redis_server::RedisServer;
use crate::common::{item, Process};
use cellrate::proto::v1 as pb;

const PASSWORD: &str = "s3cret-pw";

/// `cellrate serve` (the example limits) on the Redis at `url`, with `extra` flags.
fn serve_on(url: &str, extra: &[&str]) -> Process {
    let mut flags = vec!["--store", "redis", "--redis-url", url];
    flags.extend(extra);
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    crate::common::serve_with(std::path::Path::new(config), &flags)
}

/// Every JSON line of a process's log read so far (level and fields), early ones first.
struct Log {
    lines: Vec<Value>,
}

impl Log {
    fn of(process: &Process) -> Log {
        let mut log = Log { lines: Vec::new() };
        for line in &process.early {
            log.push(line);
        }
        log
    }

    fn push(&mut self, line: &str) {
        if let Ok(v) = serde_json::from_str::<Value>(line) {
            self.lines.push(v);
        }
    }

    /// Reads `process`'s lines until one has `message` (returned), for at most `within`.
    fn until(&mut self, process: &Process, message: &str, within: Duration) -> Option<Value> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(found) = self.find(message) {
                return Some(found);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            let line = process.logs.recv_timeout(left).ok()?;
            self.push(&line);
        }
    }

    /// Reads whatever `process` logged by now.
    fn drain(&mut self, process: &Process) {
        while let Ok(line) = process.logs.try_recv() {
            self.push(&line);
        }
    }

    /// The first line with `message`.
    fn find(&self, message: &str) -> Option<Value> {
        self.lines
            .iter()
            .find(|v| v["fields"]["message"] == message)
            .cloned()
    }

    /// The lines whose `kind` field is `kind`.
    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.lines
            .iter()
            .filter(|v| v["fields"]["kind"] == kind)
            .collect()
    }

    /// Every line as written, for messages and for looking for the password.
    fn text(&self) -> String {
        self.lines
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A gRPC client of `process`'s decisions.
async fn client(
    process: &Process,
) -> pb::rate_limiter_client::RateLimiterClient<tonic::transport::Channel> {
    pb::rate_limiter_client::RateLimiterClient::connect(format!("http://{}", process.listen))
        .await
        .unwrap()
}

/// Sends one Check; whether it was answered (not UNAVAILABLE).
async fn check(
    client: &mut pb::rate_limiter_client::RateLimiterClient<tonic::transport::Channel>,
    id: &str,
) -> bool {
    let request = pb::CheckRequest {
        items: vec![item("ApiRequestsPerKeyDaily", id, None)],
        ..Default::default()
    };
    match client.check(request).await {
        Ok(_) => true,
        Err(e) if e.code() == tonic::Code::Unavailable => false,
        Err(e) => panic!("unexpected status: {e:?}"),
    }
}

/// Checks (at most 2 000, within 10 s) until `process` logs `message`; the line.
async fn check_until(process: &Process, log: &mut Log, message: &str) -> Option<Value> {
    let mut client = client(process).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    for i in 0..2_000 {
        check(&mut client, &format!("k{i}")).await;
        log.drain(process);
        if log.find(message).is_some() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    log.find(message)
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Asserts `line` is a WARN line of `kind` naming `address` and `flag`.
fn assert_line(line: &Value, kind: &str, address: &str, flag: &str) {
    let fields = &line["fields"];
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(fields["kind"], kind, "{line}");
    assert_eq!(fields["address"], address, "{line}");
    assert_eq!(fields["flag"], flag, "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_at_start_is_said_and_a_flood_of_refusals_is_a_few_lines() {
    let port = closed_port();
    let url = format!("redis://cellrate:{PASSWORD}@127.0.0.1:{port}");
    let process = serve_on(&url, &["--redis-timeout-ms", "200"]);
    let mut log = Log::of(&process);
    let address = format!("redis://cellrate:***@127.0.0.1:{port}");

    let start = log
        .until(
            &process,
            "redis store did not answer at start; the failure policy answers while it does not",
            Duration::from_secs(10),
        )
        .expect("a line says the store did not answer at start");
    assert_line(&start, "unreachable_at_start", &address, "--redis-url");
    assert_eq!(start["fields"]["cause"], "refused", "{start}");

    // A flood for longer than the breaker's cool-down: failures, breaker trials, failures.
    let mut client = client(&process).await;
    let (began, mut unavailable) = (Instant::now(), 0);
    for i in 0..20_000 {
        if began.elapsed() > Duration::from_millis(2_500) {
            break;
        }
        if !check(&mut client, &format!("k{i}")).await {
            unavailable += 1;
        }
    }
    log.until(
        &process,
        "redis store: circuit breaker opened; calls fail fast and the failure policy answers",
        Duration::from_secs(5),
    );
    log.drain(&process);
    assert!(
        unavailable >= 100,
        "a flood: {unavailable} answered UNAVAILABLE"
    );
    let refused = log.of_kind("refused");
    assert_eq!(refused.len(), 1, "one line in 10 s: {}", log.text());
    assert_line(refused[0], "refused", &address, "--redis-url");
    assert_eq!(refused[0]["fields"]["policy"], "unavailable");
    let opened = log.of_kind("breaker_opened");
    assert_eq!(opened.len(), 1, "{}", log.text());
    assert_line(
        opened[0],
        "breaker_opened",
        &address,
        "--redis-failure-policy",
    );
    assert_eq!(opened[0]["fields"]["threshold"], 5);

    let text = log.text();
    eprintln!(
        "{} lines for {unavailable} failed requests",
        log.lines.len()
    );
    assert!(
        !text.contains(PASSWORD),
        "the password is never logged: {text}"
    );
    assert!(
        !text.contains("the last copy stays in force"),
        "nothing was copied, so no copy stays in force: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_killed_mid_run_is_a_broken_connection_and_the_breaker_says_so() {
    let mut redis = RedisServer::start_with_args(&["--requirepass", PASSWORD]);
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}", redis.port);
    let process = serve_on(&url, &["--redis-timeout-ms", "500"]);
    let mut log = Log::of(&process);
    let address = format!("redis://:***@127.0.0.1:{}", redis.port);

    let start = log
        .until(
            &process,
            "redis store answered at start",
            Duration::from_secs(10),
        )
        .expect("a line says the store answered at start");
    assert_eq!(start["level"], "INFO", "{start}");
    assert_eq!(start["fields"]["address"], address.as_str(), "{start}");
    assert!(
        start["fields"]["round_trip_ms"].as_f64().is_some(),
        "{start}"
    );
    let mut client = client(&process).await;
    assert!(check(&mut client, "before").await, "redis answers");

    redis.kill();
    let reset = check_until(&process, &mut log, "redis store: connection reset").await;
    let reset = reset.unwrap_or_else(|| panic!("a reset line: {}", log.text()));
    assert_line(&reset, "reset", &address, "--redis-url");
    let opened = check_until(
        &process,
        &mut log,
        "redis store: circuit breaker opened; calls fail fast and the failure policy answers",
    )
    .await;
    let opened = opened.unwrap_or_else(|| panic!("a breaker line: {}", log.text()));
    assert_line(
        &opened,
        "breaker_opened",
        &address,
        "--redis-failure-policy",
    );
    let refused = check_until(&process, &mut log, "redis store: connection refused").await;
    let refused = refused.unwrap_or_else(|| panic!("a refused line: {}", log.text()));
    assert_line(&refused, "refused", &address, "--redis-url");

    redis.restart();
    let closed = check_until(
        &process,
        &mut log,
        "redis store: circuit breaker closed; calls go to redis again",
    )
    .await;
    let closed = closed.unwrap_or_else(|| panic!("a closed line: {}", log.text()));
    assert_line(
        &closed,
        "breaker_closed",
        &address,
        "--redis-failure-policy",
    );
    assert!(check(&mut client, "after").await, "redis answers again");
    assert!(!log.text().contains(PASSWORD), "{}", log.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_answers_too_late_is_a_deadline_line_naming_its_flag() {
    let redis = RedisServer::start();
    let process = serve_on(&redis.url(), &["--redis-timeout-ms", "50"]);
    let mut log = Log::of(&process);
    log.until(
        &process,
        "redis store answered at start",
        Duration::from_secs(10),
    )
    .expect("a line says the store answered at start");

    // Redis holds every other client's commands for 2 s: each call misses its deadline.
    assert!(redis.cli(&["CLIENT", "PAUSE", "2000", "ALL"]).is_some());
    let line = check_until(
        &process,
        &mut log,
        "redis store: no answer within the deadline",
    )
    .await;
    let line = line.unwrap_or_else(|| panic!("a deadline line: {}", log.text()));
    assert_line(&line, "deadline", &redis.url(), "--redis-timeout-ms");
    assert_eq!(line["fields"]["timeout_ms"], 50, "{line}");
    let error = line["fields"]["error"].as_str().unwrap_or_default();
    assert!(error.ends_with("no answer within 50ms"), "{line}");
}
