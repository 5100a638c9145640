//! Concurrency limits through a real Envoy 1.40 with no shim (`examples/concurrency/`): a
//! backend that holds each request 200 ms and records, per tenant (`x-tenant`), the most
//! requests it had in flight at once. 64 concurrent streams per tenant never put more than
//! the tenant's N at the backend; every lease is released when the streams end; a
//! `kill -9` of Envoy mid-flight leaks its leases until the hold, then capacity is back;
//! the same with two replicas on one Redis and on one Valkey, Envoy asking both.
//! The fast tier (`tests/it/envoy_leases.rs`) checks the answers themselves.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_yaml_ng::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::envoy::{rate_limit_filter, yaml, Envoy};
use crate::common::http1::{self, head_header, read_head};
use crate::common::{http_get_async, poll_until, remaining, sample, Served};
use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;

const EXAMPLE: &str = "examples/concurrency/envoy.yaml";
const STREAMS: usize = 64;
const HOLD_REQUEST: Duration = Duration::from_millis(200);
/// How long each stream keeps sending (a request after each answer).
const PRESSURE: Duration = Duration::from_secs(1);
const ONCE: Duration = Duration::ZERO;
const BACKOFF: Duration = Duration::from_millis(50);
/// The example's hold (defaults.yaml).
const HOLD: i64 = 35 * SECOND;
/// Tenants and their N (examples/concurrency/limits: 8, and 4 by an override).
const TENANTS: [(&str, usize); 3] = [("acme", 8), ("trial-co", 4), ("globex", 8)];

/// The tenant whose requests the backend holds until [`InFlight::open_gate`] (at most
/// 20 s), so that a step can be taken while they are certainly in flight.
const GATED: &str = "gated";

/// Per tenant: requests in flight now, and the most at once since the last reset; and the
/// gate that holds [`GATED`]'s requests.
#[derive(Default)]
struct InFlight {
    counts: Mutex<HashMap<String, (usize, usize)>>,
    opened: std::sync::atomic::AtomicBool,
    gate: tokio::sync::Notify,
}

impl InFlight {
    /// Holds a request of `tenant`: [`GATED`]'s until the gate opens (at most 20 s), any
    /// other's for 200 ms.
    async fn hold(&self, tenant: &str) {
        if tenant != GATED {
            return tokio::time::sleep(HOLD_REQUEST).await;
        }
        let opened = async {
            loop {
                let notified = self.gate.notified();
                if self.opened.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(20), opened).await;
    }

    fn open_gate(&self) {
        self.opened.store(true, std::sync::atomic::Ordering::SeqCst);
        self.gate.notify_waiters();
    }

    fn enter(&self, tenant: &str) {
        let mut map = self.counts.lock().unwrap();
        let (now, peak) = map.entry(tenant.to_string()).or_default();
        *now += 1;
        *peak = (*peak).max(*now);
    }

    fn leave(&self, tenant: &str) {
        if let Some((now, _)) = self.counts.lock().unwrap().get_mut(tenant) {
            *now -= 1;
        }
    }

    fn now(&self, tenant: &str) -> usize {
        self.counts.lock().unwrap().get(tenant).map_or(0, |t| t.0)
    }

    /// The peaks since the last call, by tenant; starts the next measure.
    fn take_peaks(&self) -> HashMap<String, usize> {
        let mut map = self.counts.lock().unwrap();
        let peaks = map
            .iter()
            .map(|(t, (_, peak))| (t.clone(), *peak))
            .collect();
        map.values_mut().for_each(|(now, peak)| *peak = *now);
        peaks
    }
}

/// The backend: HTTP/1.1 with keep-alive (Envoy pools its connections), each request held
/// 200 ms and counted under its `x-tenant` while held.
async fn backend() -> (SocketAddr, Arc<InFlight>) {
    let counts = Arc::new(InFlight::default());
    (
        http1::backend(counts.clone(), serve_connection).await,
        counts,
    )
}

async fn serve_connection(mut stream: TcpStream, counts: Arc<InFlight>) {
    let mut buffer = Vec::new();
    loop {
        let Some(head) = read_head(&mut stream, &mut buffer).await else {
            return;
        };
        let tenant = head_header(&head, "x-tenant")
            .unwrap_or_default()
            .to_string();
        counts.enter(&tenant);
        counts.hold(&tenant).await;
        counts.leave(&tenant);
        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        if stream.write_all(reply).await.is_err() {
            return;
        }
    }
}

/// One GET of `tenant` through Envoy on a connection of its own, with the client's own
/// `x-request-id` if given: its status, or `None` when the connection failed (Envoy
/// killed), within 20 s.
async fn get(ingress: SocketAddr, tenant: &str, request_id: Option<&str>) -> Option<u16> {
    let request = format!(
        "GET /v1/work HTTP/1.1\r\nhost: example\r\nx-tenant: {tenant}\r\n{}connection: close\r\n\r\n",
        request_id.map(|id| format!("x-request-id: {id}\r\n")).unwrap_or_default()
    );
    let exchange = async {
        let mut stream = TcpStream::connect(ingress).await.ok()?;
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await.ok()?;
        let text = String::from_utf8_lossy(&reply);
        text.split(' ').nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(20), exchange)
        .await
        .ok()
        .flatten()
}

type Streams = Vec<(String, tokio::task::JoinHandle<Vec<Option<u16>>>)>;

/// `STREAMS` concurrent streams per tenant, started at once, each a client that sends its
/// GETs one after the other for `pressure` (at most 20, 50 ms after a 429), or once when
/// `pressure` is zero.
fn burst(ingress: SocketAddr, tenants: &[&str], pressure: Duration) -> Streams {
    burst_as(ingress, tenants, pressure, None)
}

/// [`burst`], every request with the client's `x-request-id` if given.
fn burst_as(
    ingress: SocketAddr,
    tenants: &[&str],
    pressure: Duration,
    request_id: Option<&'static str>,
) -> Streams {
    let mut tasks = Vec::new();
    for tenant in tenants {
        for _ in 0..STREAMS {
            let t = tenant.to_string();
            tasks.push((
                t.clone(),
                tokio::spawn(async move {
                    let start = std::time::Instant::now();
                    let mut answers = vec![get(ingress, &t, request_id).await];
                    while start.elapsed() < pressure && answers.len() < 20 {
                        // A client backs off a little after a 429, so that the pressure
                        // lasts while the admitted requests end and release.
                        if answers.last() == Some(&Some(429)) {
                            tokio::time::sleep(BACKOFF).await;
                        }
                        answers.push(get(ingress, &t, request_id).await);
                    }
                    answers
                }),
            ));
        }
    }
    tasks
}

/// Statuses by tenant: (200s, 429s, others).
async fn statuses(tasks: Streams) -> HashMap<String, (usize, usize, usize)> {
    let mut by_tenant: HashMap<String, (usize, usize, usize)> = HashMap::new();
    for (tenant, task) in tasks {
        let counts = by_tenant.entry(tenant).or_default();
        for answer in task.await.unwrap() {
            match answer {
                Some(200) => counts.0 += 1,
                Some(429) => counts.1 += 1,
                _ => counts.2 += 1,
            }
        }
    }
    by_tenant
}

/// The example's Envoy in front of `backend`, asking the cellrate replicas at `rls` (its
/// `cellrate` cluster one endpoint each, round robin), its RLS timeout raised from 0.1 s
/// to 2 s (192 concurrent calls on a shared two-core machine), after `edit`.
async fn envoy(rls: &[SocketAddr], backend: SocketAddr, edit: impl FnOnce(&mut Value)) -> Envoy {
    Envoy::example_of(EXAMPLE, rls[0], |config| {
        let clusters = config["static_resources"]["clusters"]
            .as_sequence_mut()
            .unwrap();
        let cluster = clusters
            .iter_mut()
            .find(|c| c["name"].as_str() == Some("backend"))
            .unwrap();
        *cluster = yaml(&format!(
            "{{name: backend, type: STATIC, connect_timeout: 1s, load_assignment: \
             {{cluster_name: backend, endpoints: [{{lb_endpoints: [{{endpoint: {{address: \
             {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}}}}}]}}]}}}}",
            backend.port()
        ));
        let cellrate = clusters
            .iter_mut()
            .find(|c| c["name"].as_str() == Some("cellrate"))
            .unwrap();
        cellrate["load_assignment"]["endpoints"][0]["lb_endpoints"] = rls
            .iter()
            .map(|a| {
                yaml(&format!(
                    "{{endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}}}",
                    a.ip(),
                    a.port()
                ))
            })
            .collect();
        rate_limit_filter(config).insert("timeout".into(), "2s".into());
        edit(config);
    })
    .await
}

fn concurrency_example_limits() -> LimitTable {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/concurrency/limits");
    LimitTable::load_dir(&dir).expect("the example loads")
}

/// Waits until every lease of every tenant is free again (the stream-end releases arrive
/// after the clients have their answers), as every replica sees it, and asserts it.
async fn all_free(replicas: &mut [Served]) {
    for s in replicas {
        for (tenant, n) in TENANTS {
            let free = poll_until(
                Duration::from_secs(10),
                async || remaining(s, "InFlightPerTenant", tenant).await,
                |&free| free == n as i64,
            )
            .await;
            assert_eq!(free, n as i64, "{tenant}: every lease released");
        }
    }
}

/// A replica's decisions through Envoy's API on the example's limit, by `result`.
async fn decided(s: &Served, result: &str) -> f64 {
    let (_, text) = http_get_async(s.metrics_addr, "/metrics").await;
    let series = format!(
        "cellrate_decisions_total{{api=\"envoy\",limit=\"InFlightPerTenant\",result=\"{result}\"}}"
    );
    sample(&text, &series).unwrap_or(0.0)
}

#[tokio::test]
async fn a_real_envoy_holds_each_tenant_to_n_in_flight_and_heals_after_a_kill() {
    let s = Served::with_limits(concurrency_example_limits()).await;
    holds_to_n_and_heals_after_a_kill(vec![s]).await;
}

/// Two cellrate replicas on one Redis, Envoy's `cellrate` cluster spreading its calls over
/// both (an acquire on one, its release often on the other): the same bounds as one
/// replica. Time is the replicas' (`RedisClock::Local`), fake and moved together, so the
/// hold is skipped exactly rather than waited for.
#[cfg(feature = "redis")]
#[tokio::test]
async fn two_replicas_on_redis_hold_each_tenant_to_n_and_heal_after_a_kill() {
    let server = crate::common::redis_server::RedisServer::start();
    holds_to_n_and_heals_after_a_kill(replicas_on(&server).await).await;
}

/// [`two_replicas_on_redis_hold_each_tenant_to_n_and_heal_after_a_kill`] on Valkey.
#[cfg(feature = "redis")]
#[tokio::test]
async fn two_replicas_on_valkey_hold_each_tenant_to_n_and_heal_after_a_kill() {
    let server = crate::common::redis_server::RedisServer::start_valkey();
    holds_to_n_and_heals_after_a_kill(replicas_on(&server).await).await;
}

/// Two replicas serving the example on `server`, deciding time by their own (fake) clocks,
/// with 5 s store deadlines (a loaded machine must not turn a slow release into a leak).
#[cfg(feature = "redis")]
async fn replicas_on(server: &crate::common::redis_server::RedisServer) -> Vec<Served> {
    use cellrate::server::StoreSettings;
    let mut settings = server.settings();
    if let StoreSettings::Redis { settings, .. } = &mut settings.store {
        settings.clock = cellrate::store::redis::RedisClock::Local;
        settings.timeout = Duration::from_secs(5);
    }
    let a = Served::with_settings(concurrency_example_limits(), settings.clone()).await;
    let b = Served::with_settings(concurrency_example_limits(), settings).await;
    vec![a, b]
}

/// 64 concurrent streams for each of three tenants through Envoy in front of `replicas`
/// (one store): no tenant has more than its N at the backend, and every replica decided
/// some; every lease is free after the streams. Then a `kill -9` of Envoy with acme's 8
/// at the backend: after a restart its leases are held (every request denied) until the
/// hold has passed, then capacity is back.
async fn holds_to_n_and_heals_after_a_kill(mut replicas: Vec<Served>) {
    let (backend_addr, counts) = backend().await;
    let tenants: Vec<&str> = TENANTS.iter().map(|(t, _)| *t).collect();
    let rls: Vec<SocketAddr> = replicas.iter().map(|s| s.decisions_addr).collect();
    let proxy = envoy(&rls, backend_addr, |_| {}).await;

    // 64 concurrent streams for each of three tenants.
    let answered = statuses(burst(proxy.ingress, &tenants, PRESSURE)).await;
    let peaks = counts.take_peaks();
    println!("leases: peaks {peaks:?}, (200, 429, other) {answered:?}");
    for (tenant, n) in TENANTS {
        let peak = peaks.get(tenant).copied().unwrap_or(0);
        let (ok, limited, other) = answered[tenant];
        assert!(peak <= n, "{tenant}: {peak} in flight at once, N = {n}");
        assert!(peak > 0 && ok > 0, "{tenant}: some got through");
        assert!(limited > 0, "{tenant}: some got 429");
        assert!(ok + limited + other >= STREAMS);
    }
    all_free(&mut replicas).await;
    for (i, s) in replicas.iter().enumerate() {
        let (allowed, released) = (decided(s, "allowed").await, decided(s, "released").await);
        println!("replica {i}: {allowed} acquires allowed, {released} released");
        assert!(allowed > 0.0 && released > 0.0, "replica {i} decided some");
    }

    // kill -9 of Envoy while acme's streams are at the backend: no release is sent.
    let tasks = burst(proxy.ingress, &["acme"], ONCE);
    let full = poll_until(
        Duration::from_secs(10),
        async || counts.now("acme"),
        |&now| now == 8,
    )
    .await;
    assert_eq!(full, 8, "acme's 8 in flight");
    drop(proxy);
    statuses(tasks).await;
    // The backend finishes the killed Envoy's requests (200 ms; the hold is 35 s, longer
    // than any request, which the fake clock below would otherwise skip).
    let left = poll_until(
        Duration::from_secs(10),
        async || counts.now("acme"),
        |&now| now == 0,
    )
    .await;
    assert_eq!(left, 0, "the orphaned requests have ended at the backend");
    for s in &mut replicas {
        let free = remaining(s, "InFlightPerTenant", "acme").await;
        assert_eq!(free, 0, "the killed Envoy's leases are held");
    }
    let proxy = envoy(&rls, backend_addr, |_| {}).await;
    counts.take_peaks();
    let answered = statuses(burst(proxy.ingress, &["acme"], ONCE)).await;
    assert_eq!(
        answered["acme"],
        (0, STREAMS, 0),
        "right after the restart: no slot until the hold has passed"
    );
    // The leases expire a hold after they were taken (the served clocks are fake ones).
    for s in &mut replicas {
        s.clock.advance(HOLD);
    }
    for s in &mut replicas {
        assert_eq!(remaining(s, "InFlightPerTenant", "acme").await, 8);
    }
    let answered = statuses(burst(proxy.ingress, &["acme"], PRESSURE)).await;
    let peak = counts.take_peaks()["acme"];
    println!(
        "after the hold: peak {peak}, (200, 429, other) {:?}",
        answered["acme"]
    );
    assert!(
        peak <= 8 && answered["acme"].0 > 0,
        "capacity is back: {peak}"
    );
    all_free(&mut replicas).await;
    drop(proxy);
    for s in replicas {
        s.stop().await;
    }
}

/// The example as written (with its own addresses and ports) is a valid Envoy 1.40 config.
#[test]
fn the_example_is_valid_as_written() {
    let config = crate::common::envoy::load_yaml(EXAMPLE);
    crate::common::envoy::validate(&config).unwrap_or_else(|e| panic!("{EXAMPLE}: {e}"));
}

/// The attacker: a client sends one `x-request-id` on all its requests, so that they would
/// share one lease (a retried acquire takes no second slot). The example's
/// `use_remote_address: true` makes Envoy replace an external client's id with its own
/// (measured without it: 64 in flight against 8).
#[tokio::test]
async fn a_client_cannot_share_one_lease_among_its_requests() {
    let (backend_addr, counts) = backend().await;
    let mut s = Served::with_limits(concurrency_example_limits()).await;
    let proxy = envoy(&[s.decisions_addr], backend_addr, |_| {}).await;
    let answered = statuses(burst_as(proxy.ingress, &["acme"], PRESSURE, Some("same"))).await;
    let peak = counts.take_peaks()["acme"];
    println!(
        "one client id: peak {peak}, (200, 429, other) {:?}",
        answered["acme"]
    );
    assert!(
        peak <= 8,
        "{peak} in flight at once under one client id, N = 8"
    );
    assert!(answered["acme"].1 > 0, "some got 429");
    all_free(std::slice::from_mut(&mut s)).await;
    drop(proxy);
    s.stop().await;
}

/// The naive counter beside the leases: a rate of 8 spent by 1 on the request path and
/// given back with `is_negative_hits` at stream end, no lease id. Envoy sends the stream-end
/// call for the requests its filter denied too, so each 429 gives back a token it never
/// took. Shown step by step, with the backend holding the admitted requests until the end:
/// 8 in flight fill the counter; then 8 times, a request is denied, its stream end gives a
/// token back, and one more request is let through: 16 at the backend against 8.
#[tokio::test]
async fn a_counter_given_back_at_stream_end_lets_more_than_n_in_flight() {
    let (backend_addr, counts) = backend().await;
    let counter = crate::common::naive_in_flight_counter();
    let mut s = Served::with_limits(counter).await;
    let proxy = envoy(&[s.decisions_addr], backend_addr, |config| {
        // No lease entry: the tenant alone, spent and given back.
        let route = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
            [0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0];
        let entries = route["typed_per_filter_config"]["envoy.filters.http.ratelimit"]
            ["rate_limits"]
            .as_sequence_mut()
            .unwrap();
        for entry in entries {
            entry["actions"].as_sequence_mut().unwrap().truncate(1);
        }
    })
    .await;
    let in_flight = async |want: usize| {
        poll_until(
            Duration::from_secs(10),
            async || counts.now(GATED),
            |&now| now == want,
        )
        .await
    };
    let first = burst_of(proxy.ingress, GATED, 8);
    assert_eq!(in_flight(8).await, 8, "the first 8 are at the backend");
    assert_eq!(
        remaining(&mut s, "Counter", GATED).await,
        0,
        "the counter is full"
    );

    // One denied request at a time (each one's stream end gives a token back, so a second
    // denied request sent at once may already be let through).
    let mut admitted = Vec::new();
    for more in 1..=8 {
        let denied = statuses(burst_of(proxy.ingress, GATED, 1)).await;
        assert_eq!(denied[GATED], (0, 1, 0), "a request past the 8 is denied");
        let free = poll_until(
            Duration::from_secs(10),
            async || remaining(&mut s, "Counter", GATED).await,
            |&free| free == 1,
        )
        .await;
        assert_eq!(free, 1, "its stream end gave back a token it never took");
        admitted.extend(burst_of(proxy.ingress, GATED, 1));
        assert_eq!(
            in_flight(8 + more).await,
            8 + more,
            "so one more is let through"
        );
    }
    let peak = counts.now(GATED);
    println!("naive counter (N = 8): {peak} in flight at once");
    assert_eq!(peak, 16, "the naive counter lets 16 in flight against 8");
    counts.open_gate();
    let answered = statuses(first.into_iter().chain(admitted).collect()).await;
    assert_eq!(answered[GATED], (16, 0, 0));
    drop(proxy);
    s.stop().await;
}

/// `n` concurrent GETs of `tenant`, each once, on connections of their own.
fn burst_of(ingress: SocketAddr, tenant: &str, n: usize) -> Streams {
    (0..n)
        .map(|_| {
            let t = tenant.to_string();
            let task = tokio::spawn(async move { vec![get(ingress, &t, None).await] });
            (tenant.to_string(), task)
        })
        .collect()
}
