//! Coalescing in the Redis store, against a real redis-server: batches that wait while a
//! call is in flight go in one script call, decided in arrival order and each
//! all-or-nothing; a call belongs to no request (a caller that goes away stalls nobody, and
//! a batch whose caller gave up is never sent); every request keeps its own deadline; calls
//! and queues are bounded.
//!
//! `CLIENT PAUSE` holds Redis for a while so that the order in which requests wait is known:
//! the first two requests' calls stay in flight (two calls at a time by default), the next
//! ones queue one by one behind them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::redis_server::RedisServer;
use crate::common::spend_item;
use cellrate::clock::{FakeClock, Nanos, SECOND};
use cellrate::gcra::Limit;
use cellrate::limits::names::BucketKey;
use cellrate::observe::metrics::Metrics;
use cellrate::store::redis::{Coalescing, RedisClock, RedisSettings, RedisStore};
use cellrate::store::{Outcome, Store, StoreError, StoreItem};
use tokio::task::JoinHandle;

const T0: Nanos = 1_700_000_000 * SECOND;

fn settings(url: &str, timeout: Duration) -> RedisSettings {
    RedisSettings {
        url: Some(url.to_string()),
        timeout,
        clock: RedisClock::Local,
        // A paused Redis must not open the breaker for the requests under test.
        breaker_threshold: 1_000,
        ..RedisSettings::default()
    }
}

fn store(settings: RedisSettings) -> Arc<RedisStore> {
    observed(settings).0
}

/// A store and the metrics it reports to.
fn observed(settings: RedisSettings) -> (Arc<RedisStore>, Arc<Metrics>) {
    let metrics = Metrics::new();
    let store = RedisStore::new(settings, Arc::new(FakeClock::new(T0)), metrics.clone()).unwrap();
    (store, metrics)
}

/// The value of one series (name and labels as rendered) in `metrics`.
fn series(metrics: &Metrics, name: &str) -> Option<f64> {
    metrics.render().lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        (series == name).then(|| value.parse().unwrap())
    })
}

/// Ten per ten minutes, burst ten.
fn ten() -> Limit {
    Limit::new(10, 10, 600 * SECOND).unwrap()
}

/// Spends `items` in a task of its own, and returns once the request has gone as far as
/// it goes without waiting (its call sent, or its batch queued in its lane): the order of
/// `ask`s is then the order of arrival.
async fn ask(
    store: &Arc<RedisStore>,
    items: Vec<StoreItem>,
) -> JoinHandle<Result<Outcome, StoreError>> {
    let store = store.clone();
    let (reached, waits) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let spend = store.spend(&items);
        tokio::pin!(spend);
        let first = futures_util::poll!(&mut spend);
        let _ = reached.send(());
        match first {
            std::task::Poll::Ready(outcome) => outcome,
            std::task::Poll::Pending => spend.await,
        }
    });
    waits.await.expect("the task polled its request");
    task
}

/// How many EVALSHA calls Redis ran since the last `CONFIG RESETSTAT`.
fn script_calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]).unwrap();
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// Loads the script (the first call's NOSCRIPT round trip) and zeroes Redis's counts.
async fn warm(server: &RedisServer, store: &RedisStore) {
    store.spend(&[spend_item("warm", ten(), 1)]).await.unwrap();
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).unwrap().trim(), "OK");
}

/// Holds every Redis client's commands for `ms`.
fn pause(server: &RedisServer, ms: u64) {
    let ok = server.cli(&["CLIENT", "PAUSE", &ms.to_string()]).unwrap();
    assert_eq!(ok.trim(), "OK");
}

/// Two requests whose calls go out at once and stay in flight while Redis is held.
async fn occupy(
    store: &Arc<RedisStore>,
    items: impl Fn(usize) -> StoreItem,
) -> Vec<JoinHandle<Result<Outcome, StoreError>>> {
    let mut first = Vec::new();
    for i in 0..2 {
        first.push(ask(store, vec![items(i)]).await);
    }
    first
}

/// A store on `server` with `coalescing`, its script loaded, Redis then held for a second
/// with two calls in flight (the returned tasks).
async fn held(
    server: &RedisServer,
    coalescing: Coalescing,
) -> (
    Arc<RedisStore>,
    Vec<JoinHandle<Result<Outcome, StoreError>>>,
    Arc<Metrics>,
) {
    let (store, metrics) = observed(RedisSettings {
        coalescing,
        ..settings(&server.url(), Duration::from_secs(10))
    });
    warm(server, &store).await;
    pause(server, 1_000);
    let first = occupy(&store, |i| spend_item(&format!("first-{i}"), ten(), 1)).await;
    (store, first, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_batches_go_in_one_call_in_arrival_order_each_all_or_nothing() {
    let server = RedisServer::start();
    let (store, metrics) = observed(settings(&server.url(), Duration::from_secs(10)));
    // "full" has no token left: a batch naming it is denied as a whole.
    let one = Limit::new(1, 1, 600 * SECOND).unwrap();
    store.spend(&[spend_item("full", one, 1)]).await.unwrap();
    warm(&server, &store).await;

    pause(&server, 1_500);
    let first = occupy(&store, |_| spend_item("hot", ten(), 1)).await;
    let mut waiting = Vec::new();
    for i in 1..=30 {
        let other = if i % 3 == 0 {
            spend_item("full", one, 1)
        } else {
            spend_item(&format!("own-{i}"), ten(), 1)
        };
        waiting.push(ask(&store, vec![spend_item("hot", ten(), 1), other]).await);
    }
    // What an operator sees meanwhile: 30 batches of two items wait.
    assert_eq!(series(&metrics, "cellrate_redis_queued_items"), Some(60.0));
    for (task, remaining) in first.into_iter().zip([9, 8]) {
        let out = task.await.unwrap().unwrap();
        assert_eq!((out.allowed, out.decisions[0].remaining), (true, remaining));
    }
    let mut allowed = Vec::new();
    for (i, task) in (1..).zip(waiting) {
        let out = task.await.unwrap().unwrap();
        if out.allowed {
            allowed.push(i);
        }
    }
    // Hot's eight remaining tokens go to the first eight batches that can be allowed as a
    // whole, in the order they asked; the denied batches ("full") took none of them.
    assert_eq!(allowed, vec![1, 2, 4, 5, 7, 8, 10, 11]);
    assert_eq!(
        script_calls(&server),
        3,
        "the first two calls, then one for the 30 waiting"
    );
    // The same in cellrate's metrics: five calls answered ("full", the warm-up, the first
    // two), four of one batch and one of 30, and nothing waits any more.
    let calls = |s: &str| series(&metrics, &format!("cellrate_redis_batches_per_call{s}"));
    assert_eq!(calls("_count"), Some(5.0));
    assert_eq!(calls("_sum"), Some(34.0));
    assert_eq!(calls("_bucket{le=\"1\"}"), Some(4.0));
    assert_eq!(calls("_bucket{le=\"16\"}"), Some(4.0));
    assert_eq!(calls("_bucket{le=\"32\"}"), Some(5.0));
    assert_eq!(series(&metrics, "cellrate_redis_queued_items"), Some(0.0));

    // What Redis holds agrees: hot is empty, a batch denied by "full" spent nothing.
    let hot = store.spend(&[spend_item("hot", ten(), 1)]).await.unwrap();
    assert!(!hot.allowed);
    let untouched = store
        .spend(&[spend_item("own-13", ten(), 1)])
        .await
        .unwrap();
    assert_eq!(untouched.decisions[0].remaining, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_bounded_in_items() {
    let server = RedisServer::start();
    let coalescing = Coalescing {
        call_items: 4,
        ..Coalescing::default()
    };
    let (store, mut tasks, _) = held(&server, coalescing).await;
    for i in 0..20 {
        tasks.push(
            ask(
                &store,
                vec![
                    spend_item("hot", ten(), 1),
                    spend_item(&format!("k{i}"), ten(), 1),
                ],
            )
            .await,
        );
    }
    let mut allowed = 0;
    for task in tasks {
        allowed += usize::from(task.await.unwrap().unwrap().allowed);
    }
    assert_eq!(
        allowed,
        2 + 10,
        "the first two, hot's burst of ten, then denials"
    );
    // 20 batches of two items, at most four items a call: ten calls after the first two.
    assert_eq!(script_calls(&server), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_goes_away_stalls_nobody_and_its_waiting_batch_is_never_sent() {
    let server = RedisServer::start();
    // The first requests' calls are in flight when their callers go away; a waiting one's
    // caller goes away too.
    let (store, first, metrics) = held(&server, Coalescing::default()).await;
    let mut kept = Vec::new();
    for i in 0..5 {
        kept.push(ask(&store, vec![spend_item(&format!("kept-{i}"), ten(), 1)]).await);
    }
    let abandoned = ask(&store, vec![spend_item("abandoned", ten(), 1)]).await;
    abandoned.abort();
    // Its task is gone (its waiting batch dropped) once its handle says so.
    assert!(abandoned.await.unwrap_err().is_cancelled());
    for task in first {
        task.abort();
    }
    for task in kept {
        let started = Instant::now();
        let out = task.await.unwrap();
        assert!(
            out.is_ok_and(|o| o.allowed),
            "served after the first caller left"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    let key = store.redis_key(&BucketKey::new(100, "abandoned"));
    assert_eq!(server.cli(&["EXISTS", &key]).unwrap().trim(), "0");
    // The abandoned batch left the queue's gauge with the others.
    assert_eq!(series(&metrics, "cellrate_redis_queued_items"), Some(0.0));
    // The lane is idle again: a lone request goes straight out.
    let out = store.spend(&[spend_item("after", ten(), 1)]).await.unwrap();
    assert!(out.allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiting_request_keeps_its_own_deadline() {
    let server = RedisServer::start();
    let store = store(settings(&server.url(), Duration::from_millis(300)));
    warm(&server, &store).await;

    pause(&server, 4_000);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..6 {
        tasks.push(ask(&store, vec![spend_item(&format!("d{i}"), ten(), 1)]).await);
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let e = task.await.unwrap().unwrap_err();
        // The first two calls' own deadlines may fire in the Redis client first; either
        // way a missed deadline reads as one (the waiting requests' are the store's).
        assert!(matches!(e, StoreError::Timeout { .. }), "{i}: {e}");
        assert!(
            e.to_string().ends_with("no answer within 300ms"),
            "{i}: {e}"
        );
    }
    // Each answered at its own deadline, not when the call it waited behind ended.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_at_once() {
    let server = RedisServer::start();
    let coalescing = Coalescing {
        queued_items: 4,
        ..Coalescing::default()
    };
    let (store, mut tasks, _) = held(&server, coalescing).await;
    for i in 0..2 {
        let items = vec![
            spend_item(&format!("a{i}"), ten(), 1),
            spend_item(&format!("b{i}"), ten(), 1),
        ];
        tasks.push(ask(&store, items).await);
    }
    // Four items wait: one more does not fit.
    let started = Instant::now();
    let e = store
        .spend(&[spend_item("late", ten(), 1)])
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Backlog { queued: 4 }), "{e}");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "refused while Redis was held"
    );
    for task in tasks {
        assert!(task.await.unwrap().unwrap().allowed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_bucket_fails_only_its_own_batch_in_a_shared_call() {
    let server = RedisServer::start();
    let store = store(settings(&server.url(), Duration::from_secs(10)));
    warm(&server, &store).await;
    let poisoned = store.redis_key(&BucketKey::new(100, "poisoned"));
    server.cli(&["SET", &poisoned, "not a tat"]).unwrap();

    pause(&server, 1_000);
    let first = occupy(&store, |i| spend_item(&format!("first-{i}"), ten(), 1)).await;
    let batches = [
        vec![spend_item("poisoned", ten(), 1)],
        vec![spend_item("b", ten(), 1)],
        vec![spend_item("c", ten(), 1), spend_item("poisoned", ten(), 1)],
        vec![spend_item("c", ten(), 1)],
    ];
    let mut tasks = Vec::new();
    for batch in batches {
        tasks.push(ask(&store, batch).await);
    }
    for task in first {
        assert!(task.await.unwrap().unwrap().allowed);
    }
    let results: Vec<_> = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(script_calls(&server), 3);
    for i in [0, 2] {
        let e = results[i].as_ref().unwrap_err();
        assert!(
            matches!(e, StoreError::Data(m) if m.contains("no TAT")),
            "{e}"
        );
    }
    assert_eq!(results[1].as_ref().unwrap().decisions[0].remaining, 9);
    // The failed batch spent nothing of c.
    assert_eq!(results[3].as_ref().unwrap().decisions[0].remaining, 9);
}

/// `cellrate serve` (the example limits) on the Redis store `server`, with `extra` flags.
fn serve_on(server: &RedisServer, extra: &[&str]) -> crate::common::Process {
    let url = server.url();
    let mut flags = vec!["--store", "redis", "--redis-url", &url];
    flags.extend(["--redis-timeout-ms", "5000"]);
    flags.extend(extra);
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    crate::common::serve_with(std::path::Path::new(config), &flags)
}

/// The coalescing bounds are `serve` flags: with one call in flight and one item of queue,
/// a third concurrent request is refused at once (the failure policy: UNAVAILABLE) while
/// Redis is held, where the defaults would have queued it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serve_flags_set_the_bounds() {
    use cellrate::proto::v1 as pb;
    let server = RedisServer::start();
    let served = serve_on(
        &server,
        &[
            "--redis-calls-in-flight",
            "1",
            "--redis-queue-max-items",
            "1",
        ],
    );
    let mut client =
        pb::rate_limiter_client::RateLimiterClient::connect(format!("http://{}", served.listen))
            .await
            .unwrap();
    let check = |id: &str| pb::CheckRequest {
        items: vec![crate::common::item("NewOrdersPerAccount", id, None)],
        ..Default::default()
    };
    // The script is loaded before Redis is held.
    client.check(check("1")).await.unwrap();

    pause(&server, 1_500);
    let ask = |id: &'static str| {
        let mut client = client.clone();
        tokio::spawn(async move { client.check(check(id)).await })
    };
    // One call in flight, one item waiting (whichever of the two arrived second).
    let in_flight = ask("2");
    let queued = ask("3");
    let waiting = crate::common::poll_until(
        Duration::from_secs(5),
        async || {
            let addr = served.metrics.parse().expect("an address");
            let (_, metrics) = crate::common::http_get_async(addr, "/metrics").await;
            crate::common::sample(&metrics, "cellrate_redis_queued_items")
        },
        |&items| items == Some(1.0),
    )
    .await;
    assert_eq!(waiting, Some(1.0), "one item waits");
    let started = Instant::now();
    let e = client.check(check("4")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(
        started.elapsed() < Duration::from_millis(1_000),
        "refused while Redis was held"
    );
    for task in [in_flight, queued] {
        let r = task.await.unwrap().unwrap();
        assert!(r.into_inner().overall.unwrap().allowed);
    }
}

/// A Redis-protocol pipeline of `CL.THROTTLE`s on the Redis store: decided in a few script
/// calls instead of one each, with the answers the same commands get one at a time.
#[test]
fn a_pipeline_of_throttles_takes_a_few_calls_and_answers_as_one_at_a_time() {
    use crate::common::resp_client::{Reply, RespClient};
    let server = RedisServer::start();
    let served = serve_on(&server, &["--resp-listen", "127.0.0.1:0"]);
    let mut client = RespClient::connect(&served.resp);
    // Burst 31 (max_burst 30), one token a minute: nothing refills during the test.
    let throttle = |key: &str| ["CL.THROTTLE", key, "30", "1", "60"].map(str::to_string);
    // Limited, remaining: the two numbers that no clock difference between runs changes.
    let decided = |reply: Reply| {
        let n = reply.integers();
        (n[0], n[2])
    };
    client.call(&throttle("warm-up").each_ref().map(String::as_str));

    // One at a time.
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).unwrap().trim(), "OK");
    let mut alone = Vec::new();
    for _ in 0..64 {
        alone.push(decided(
            client.call(&throttle("alone").each_ref().map(String::as_str)),
        ));
    }
    assert_eq!(script_calls(&server), 64);

    // The same 64 in one write.
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).unwrap().trim(), "OK");
    let mut pipeline = Vec::new();
    for _ in 0..64 {
        let args = throttle("piped");
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        pipeline.extend(RespClient::encode(&args));
    }
    client.raw(&pipeline).unwrap();
    let piped: Vec<(i64, i64)> = (0..64).map(|_| decided(client.read().unwrap())).collect();
    assert_eq!(piped, alone, "the same answers, in order");
    assert_eq!(
        piped.iter().filter(|(limited, _)| *limited == 0).count(),
        31
    );
    let calls = script_calls(&server);
    assert!(calls <= 8, "{calls} script calls for a pipeline of 64");
}
