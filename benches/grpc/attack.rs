//! Hostile clients against a running cellrate, with a well-behaved probe beside them
//! (scripts/attack.sh; figures in RELIABILITY.md). Every attack is bounded in time and
//! connections, and talks to loopback only.
//!
//! ```text
//! attack ADDR KIND SECONDS SERVER_PID
//!   KIND  streams      40 connections opening streams that never send a body
//!         deaf         8 connections sending malformed requests, never reading
//!         slowloris    2 000 connections trickling the preface one byte a second
//!         idle         2 000 connections that complete the preface, then say nothing
//!         connections  up to 20 000 connections, held open
//!         caller-fill  inline limits of the longest allowed period, a new key each
//!         none         the probe alone (the baseline)
//! ```
//! Prints one line: `kind=.. probe_ok=.. probe_failed=.. p50_ms=.. p99_ms=.. max_ms=..
//! peak_rss_kib=.. end_rss_kib=.. sent=..`.

// A benchmark measures real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its benchmarks.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellrate::proto::v1 as pb;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[path = "proc_stats.rs"]
mod proc_stats;
use proc_stats::rss_kib;

// The raw HTTP/2 frames of the hostile-client tests (tests/support/, a dev-dependency).
use cellrate_test_support::h2_raw::{frame, header_block as headers, PREFACE};

/// Opens a connection with the client preface and an empty SETTINGS frame.
async fn h2_open(addr: &str) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream.write_all(PREFACE).await.ok()?;
    stream.write_all(&frame(0x4, 0, 0, &[])).await.ok()?;
    Some(stream)
}

/// Streams whose body never comes, 100 per burst, on fresh connections as old ones die.
async fn streams(addr: String, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    let block = headers(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/cellrate.v1.RateLimiter/Check"),
        (":authority", "cellrate"),
        ("content-type", "application/grpc"),
    ]);
    while !stop.load(Ordering::Relaxed) {
        let Some(mut c) = h2_open(&addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut id = 1u32;
        while !stop.load(Ordering::Relaxed) && id < 2_000_000 {
            let mut burst = Vec::new();
            for _ in 0..100 {
                burst.extend(frame(0x1, 0x4, id, &block));
                id += 2;
            }
            if c.write_all(&burst).await.is_err() {
                break;
            }
            sent.fetch_add(100, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Malformed requests (no :path) on a connection whose reads nobody does.
async fn deaf(addr: String, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    let block = headers(&[(":method", "GET")]);
    while !stop.load(Ordering::Relaxed) {
        let Some(mut c) = h2_open(&addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut id = 1u32;
        while !stop.load(Ordering::Relaxed) && id < 2_000_000 {
            let mut burst = Vec::new();
            for _ in 0..200 {
                burst.extend(frame(0x1, 0x5, id, &block));
                id += 2;
            }
            match tokio::time::timeout(Duration::from_secs(1), c.write_all(&burst)).await {
                Ok(Ok(())) => sent.fetch_add(200, Ordering::Relaxed),
                _ => break,
            };
        }
    }
}

/// Connections that trickle the preface a byte a second (`idle`: send it whole, then
/// nothing), re-opened when closed.
async fn slow(addr: String, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>, whole: bool) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut c) = TcpStream::connect(&addr).await else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        sent.fetch_add(1, Ordering::Relaxed);
        if whole && c.write_all(PREFACE).await.is_err() {
            continue;
        }
        let mut at = 0;
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let byte = if whole {
                &[][..]
            } else {
                &PREFACE[at % PREFACE.len()..][..1]
            };
            if c.write_all(byte).await.is_err() {
                break;
            }
            // An idle connection learns it was closed only by reading.
            if whole {
                let mut buf = [0u8; 256];
                match tokio::time::timeout(
                    Duration::from_millis(1),
                    tokio::io::AsyncReadExt::read(&mut c, &mut buf),
                )
                .await
                {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    _ => {}
                }
            }
            at += 1;
        }
    }
}

/// As many connections as the server takes (up to 20 000), held.
async fn connections(addr: String, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    let mut held = Vec::new();
    while !stop.load(Ordering::Relaxed) && held.len() < 20_000 {
        match tokio::time::timeout(Duration::from_millis(200), h2_open(&addr)).await {
            Ok(Some(c)) => {
                held.push(c);
                sent.fetch_add(1, Ordering::Relaxed);
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Inline limits with the longest period the server allows, each on a new key.
async fn caller_fill(addr: String, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    let Ok(mut client) =
        pb::rate_limiter_client::RateLimiterClient::connect(format!("http://{addr}")).await
    else {
        return;
    };
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let items = (0..64)
            .map(|i| pb::Item {
                inline: Some(pb::InlineLimit {
                    key: format!("fill-{n}-{i}"),
                    burst: 1,
                    count: 1,
                    period: Some(prost_types::Duration {
                        seconds: 86_400,
                        nanos: 0,
                    }),
                    calendar: String::new(),
                }),
                ..Default::default()
            })
            .collect();
        n += 1;
        let _ = client
            .check(pb::CheckRequest {
                items,
                ..Default::default()
            })
            .await;
        sent.fetch_add(64, Ordering::Relaxed);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, kind, seconds, pid] = &args[..] else {
        eprintln!("usage: attack ADDR KIND SECONDS SERVER_PID");
        std::process::exit(2);
    };
    let duration = Duration::from_secs(seconds.parse().unwrap());
    let pid: u32 = pid.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        let spawn = |n: usize, f: &dyn Fn() -> tokio::task::JoinHandle<()>| (0..n).map(|_| f()).collect::<Vec<_>>();
        let (a, s, t) = (addr.clone(), stop.clone(), sent.clone());
        tasks.extend(match kind.as_str() {
            "streams" => spawn(40, &|| tokio::spawn(streams(a.clone(), s.clone(), t.clone()))),
            "deaf" => spawn(8, &|| tokio::spawn(deaf(a.clone(), s.clone(), t.clone()))),
            "slowloris" => spawn(2_000, &|| tokio::spawn(slow(a.clone(), s.clone(), t.clone(), false))),
            "idle" => spawn(2_000, &|| tokio::spawn(slow(a.clone(), s.clone(), t.clone(), true))),
            "connections" => spawn(1, &|| tokio::spawn(connections(a.clone(), s.clone(), t.clone()))),
            "caller-fill" => spawn(4, &|| tokio::spawn(caller_fill(a.clone(), s.clone(), t.clone()))),
            "none" => Vec::new(),
            other => panic!("unknown attack {other}"),
        });

        // The well-behaved probe: a Check (a peek) every 20 ms on its own connection.
        let mut probe = pb::rate_limiter_client::RateLimiterClient::new(
            tonic::transport::Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_lazy(),
        );
        let (mut ok, mut failed, mut latencies) = (0u64, 0u64, Vec::new());
        let mut peak = 0;
        let start = Instant::now();
        while start.elapsed() < duration {
            let mut request = tonic::Request::new(pb::CheckRequest {
                items: vec![pb::Item {
                    name: "BenchHot".into(),
                    id: "probe".into(),
                    cost: Some(0),
                    ..Default::default()
                }],
                request_id: String::new(),
                ..Default::default()
            });
            request.set_timeout(Duration::from_secs(1));
            let sent_at = Instant::now();
            match tokio::time::timeout(Duration::from_secs(2), probe.check(request)).await {
                Ok(Ok(_)) => {
                    ok += 1;
                    latencies.push(sent_at.elapsed());
                }
                _ => failed += 1,
            }
            peak = peak.max(rss_kib(pid));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.abort();
        }
        latencies.sort();
        let at = |q: f64| {
            latencies
                .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
                .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        };
        println!(
            "kind={kind} probe_ok={ok} probe_failed={failed} p50_ms={:.2} p99_ms={:.2} max_ms={:.2} peak_rss_kib={peak} end_rss_kib={} sent={}",
            at(0.5),
            at(0.99),
            latencies.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3),
            rss_kib(pid),
            sent.load(Ordering::Relaxed)
        );
    });
}
