//! `Retry-After` advertised against the actual wait (#60, item 7; BENCHMARKS.md, "Retry-After
//! against the actual wait"), in real time: a served cellrate (memory store) whose fake
//! clock a ticker keeps on the wall clock, and clients over real gRPC on loopback, each
//! asking with `headers: DRAFT03` for the `Retry-After` Envoy's answer would carry too.
//!
//! - a concurrency key of 4 slots, 4 clients each holding a lease 0.1-2 s, then releasing;
//! - a held budget of 10 000 tokens an hour (`reservation:`), 10 clients each holding 1 000
//!   for 0.1-0.5 s, then settling at 0-10 tokens.
//!
//! Each client pauses 0.2 s after giving back what it took, then takes again (polling every
//! 50 ms while denied), so that the key or the budget stays about full. One more client,
//! the prober, does the same, and when denied reads `Retry-After`, polls every 50 ms (at
//! most 60 s) until it passes, and records both. The figures are printed
//! (`--nocapture`), never asserted: the test asserts only that each run made its samples
//! and that nothing was told longer than the store's bound.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{item, Served, T0};
use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;

type Client = pb::rate_limiter_client::RateLimiterClient<tonic::transport::Channel>;

/// The prober's samples: `Retry-After` (s), the wait until a retry passed (s), the
/// store's retry (ns).
type Samples = Arc<parking_lot::Mutex<Vec<(i64, f64, i64)>>>;

/// Samples a run takes at most, and its longest time.
const SAMPLES: usize = 30;
const RUN: Duration = Duration::from_secs(40);
/// The first seconds of a run are not sampled: what is learned then is being learned.
const WARM_UP: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(50);
const PAUSE: Duration = Duration::from_millis(200);
const LONGEST_WAIT: Duration = Duration::from_secs(60);

/// A small deterministic generator (xorshift), one per client.
struct Random(u64);

impl Random {
    fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = (high - low).as_micros() as u64;
        low + Duration::from_micros(self.next() % span.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The served clock kept on the wall clock (stores, holds and leases read it).
fn tick(s: &Served, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let clock = s.clock.clone();
    let start = Instant::now();
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            clock.set(T0 + start.elapsed().as_nanos() as i64);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
}

fn limits() -> LimitTable {
    let files = [
        (
            "names.yaml",
            "Slots: {number: 100, format: string}\nTokens: {number: 101, format: string}\n",
        ),
        (
            "defaults.yaml",
            "Slots: {window: concurrency, count: 4, period: 35s}\n\
             Tokens: {burst: 10000, count: 10000, period: 1h, \
               reservation: {hold: 10m, unsettled: release}}\n",
        ),
    ];
    let files: Vec<(String, String)> = (files.iter())
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect();
    LimitTable::from_files(&files).unwrap()
}

/// What a client asks: a lease of the key, or a hold of the budget.
#[derive(Clone, Copy)]
enum Kind {
    Lease,
    Hold,
}

/// One attempt: allowed, or denied with `Retry-After` (s) and the store's retry (ns).
async fn attempt(c: &mut Client, kind: Kind, id: &str) -> Result<(), (i64, i64)> {
    let (item, request_id) = match kind {
        Kind::Lease => (
            pb::Item {
                mode: pb::Mode::Acquire as i32,
                lease_id: id.to_string(),
                ..item("Slots", "acme", None)
            },
            String::new(),
        ),
        Kind::Hold => (item("Tokens", "acme", Some(1_000)), id.to_string()),
    };
    let answer = c
        .check(pb::CheckRequest {
            items: vec![item],
            request_id,
            headers: pb::HeaderStyle::Draft03 as i32,
        })
        .await
        .expect("the Check succeeds")
        .into_inner();
    if answer.overall.unwrap().allowed {
        return Ok(());
    }
    let header = answer.headers.iter().find(|h| h.name == "Retry-After");
    let told = header.map_or(0, |h| h.value.parse().unwrap());
    let retry = answer.items[0].retry_after.as_ref().unwrap();
    Err((told, retry.seconds * SECOND + i64::from(retry.nanos)))
}

/// What was taken is given back: the lease released, the hold settled at 0-10 tokens.
async fn give_back(c: &mut Client, kind: Kind, id: &str, random: &mut Random) {
    match kind {
        Kind::Lease => {
            let release = pb::Item {
                mode: pb::Mode::Release as i32,
                lease_id: id.to_string(),
                ..item("Slots", "acme", None)
            };
            let request = pb::CheckRequest {
                items: vec![release],
                ..Default::default()
            };
            c.check(request).await.expect("the release succeeds");
        }
        Kind::Hold => {
            let request = pb::SettleRequest {
                request_id: id.to_string(),
                costs: vec![random.next() % 11],
            };
            c.settle(request).await.expect("the Settle succeeds");
        }
    }
}

/// A client's loop until `stop`: take, hold `held`, give back; when denied, poll. The
/// prober (`samples`) records each denial's `Retry-After` and the wait until it passed.
async fn client(
    mut c: Client,
    kind: Kind,
    n: u64,
    held: (Duration, Duration),
    stop: Arc<AtomicBool>,
    samples: Option<Samples>,
) {
    let mut random = Random(0x9e37_79b9_7f4a_7c15 ^ ((n + 1) * 0x1000_0001));
    let started = Instant::now();
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let id = format!("c{n}-{round}");
        if let Err((told, bound)) = attempt(&mut c, kind, &id).await {
            let denied = Instant::now();
            let mut passed = false;
            while denied.elapsed() < LONGEST_WAIT && !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(POLL).await;
                if attempt(&mut c, kind, &id).await.is_ok() {
                    passed = true;
                    break;
                }
            }
            if !passed {
                continue;
            }
            let waited = denied.elapsed().as_secs_f64();
            if let Some(samples) = samples.as_ref().filter(|_| started.elapsed() > WARM_UP) {
                let mut samples = samples.lock();
                samples.push((told, waited, bound));
                if samples.len() >= SAMPLES {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }
        tokio::time::sleep(random.between(held.0, held.1)).await;
        give_back(&mut c, kind, &id, &mut random).await;
        tokio::time::sleep(PAUSE).await;
    }
}

fn quantile(mut values: Vec<f64>, q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() as f64 * q).ceil() as usize).clamp(1, values.len()) - 1]
}

/// Runs `clients` of `kind` and the prober until the prober has its samples (or the run's time is up),
/// prints the figures; the samples.
async fn run(kind: Kind, clients: u64, held: (Duration, Duration), what: &str) -> usize {
    let s = Served::with_limits(limits()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = tick(&s, stop.clone());
    let samples = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for n in 0..=clients {
        let prober = (n == 0).then(|| samples.clone());
        let c = s.decisions.clone();
        tasks.push(tokio::spawn(client(c, kind, n, held, stop.clone(), prober)));
    }
    let deadline = Instant::now() + RUN;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = tokio::time::timeout(LONGEST_WAIT, task).await;
    }
    let _ = ticker.await;
    let samples = samples.lock().clone();
    for &(told, _, bound) in &samples {
        // Never longer than the store's bound (whole seconds, rounded up).
        assert!(
            told * SECOND < bound + SECOND,
            "told {told} s, bound {bound} ns"
        );
    }
    if !samples.is_empty() {
        let told: Vec<f64> = samples.iter().map(|s| s.0 as f64).collect();
        let waited: Vec<f64> = samples.iter().map(|s| s.1).collect();
        let ratio: Vec<f64> = samples.iter().map(|s| s.0 as f64 / s.1).collect();
        println!(
            "{what}: {} denials; Retry-After median {:.0} s, p90 {:.0} s; actual wait median \
             {:.2} s, p90 {:.2} s; advertised/actual median {:.1}, p90 {:.1}",
            samples.len(),
            quantile(told.clone(), 0.5),
            quantile(told, 0.9),
            quantile(waited.clone(), 0.5),
            quantile(waited, 0.9),
            quantile(ratio.clone(), 0.5),
            quantile(ratio, 0.9),
        );
    }
    s.stop().await;
    samples.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_against_the_actual_wait() {
    let ms = Duration::from_millis;
    let leases = run(
        Kind::Lease,
        4,
        (ms(100), ms(2_000)),
        "4 slots, 4 clients and the prober holding 0.1-2 s",
    )
    .await;
    let holds = run(
        Kind::Hold,
        10,
        (ms(100), ms(500)),
        "10 000 tokens an hour, 10 clients and the prober holding 1 000 for 0.1-0.5 s",
    )
    .await;
    assert!(leases >= 5 && holds >= 5, "{leases} and {holds} samples");
}
