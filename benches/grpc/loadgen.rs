//! A small gRPC load generator on raw HTTP/2 (the `h2` crate): pre-encoded request bodies,
//! C connections with S streams each, a fixed duration, per-request latency, and the
//! server's CPU time and RSS read from /proc. It decodes nothing but the grpc-status, so
//! that its own cost stays small and equal for every server it drives.
//!
//! ```text
//! loadgen ADDR RPC SCENARIO CONNECTIONS STREAMS SECONDS SERVER_PID [RATE]
//!   RPC       envoy | check
//!   SCENARIO  hot (one key, all allowed) | distinct (100 000 keys) | denied (one key, denied)
//!             | fresh (a new key every request: scripts/soak.sh)
//!             | million (1 000 000 keys in turn, each kept an hour: memory per live key)
//!   RATE      requests per second over all streams (default: as fast as answered)
//! ```
//! With `LOADGEN_TOTAL=N` in the environment it sends exactly N requests, measured from the
//! first, and ignores SECONDS (scripts/bench-callgrind.sh counts instructions per request).
//! Prints one line: `rps=.. p50_us=.. p99_us=.. cpu_us_per_req=.. rss_kib=.. errors=..`.

// A benchmark measures real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its benchmarks.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cellrate::proto::v1 as pb;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;

#[path = "proc_stats.rs"]
mod proc_stats;
use proc_stats::{cpu_ticks, rss_kib};

/// A gRPC frame: uncompressed flag, 4-byte big-endian length, message.
fn frame(message: &impl Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(0);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}

/// The request bodies of a scenario, pre-encoded; `fresh` encodes each request's body
/// with [`body`] as it goes instead.
fn bodies(rpc: &str, scenario: &str) -> (&'static str, Vec<Bytes>) {
    let (name, keys) = match scenario {
        "hot" => ("BenchHot", 1),
        "distinct" => ("BenchKeys", 100_000),
        "denied" => ("BenchDenied", 1),
        "fresh" => ("BenchFresh", 0),
        "million" => ("BenchMillion", 1_000_000),
        other => panic!("unknown scenario {other}"),
    };
    let path = match rpc {
        "envoy" => "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        "check" => "/cellrate.v1.RateLimiter/Check",
        other => panic!("unknown rpc {other}"),
    };
    (
        path,
        (0..keys)
            .map(|i| body(rpc, name, format!("key-{i}")))
            .collect(),
    )
}

/// One request body of `rpc` for `name` and `id`.
fn body(rpc: &str, name: &str, id: String) -> Bytes {
    match rpc {
        "envoy" => frame(&RateLimitRequest {
            domain: "bench".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: name.into(),
                    value: id,
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        }),
        _ => frame(&pb::CheckRequest {
            items: vec![pb::Item {
                name: name.into(),
                id,
                ..Default::default()
            }],
            request_id: String::new(),
            ..Default::default()
        }),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (addr, rpc, scenario, connections, streams, seconds, pid, rate) = match &args[..] {
        [_, a, r, s, c, st, se, p] => (a, r, s, c, st, se, p, None),
        [_, a, r, s, c, st, se, p, rate] => (a, r, s, c, st, se, p, Some(rate)),
        _ => {
            eprintln!(
                "usage: loadgen ADDR RPC SCENARIO CONNECTIONS STREAMS SECONDS SERVER_PID [RATE]"
            );
            std::process::exit(2);
        }
    };
    let rate: Option<f64> = rate.map(|r| r.parse().unwrap());
    let total: Option<u64> = std::env::var("LOADGEN_TOTAL")
        .ok()
        .map(|t| t.parse().unwrap());
    let rpc: &'static str = if rpc == "envoy" { "envoy" } else { "check" };
    let connections: usize = connections.parse().unwrap();
    let streams: usize = streams.parse().unwrap();
    let duration = Duration::from_secs(seconds.parse().unwrap());
    let pid: u32 = pid.parse().unwrap();
    let (path, bodies) = bodies(rpc, scenario);
    // Paced: each stream sends every `total streams / rate` seconds, the streams staggered.
    let total_streams = (connections * streams) as u32;
    let period = rate.map(|r| Duration::from_secs_f64(f64::from(total_streams) / r));
    let bodies = Arc::new(bodies);
    let uri: http::Uri = format!("http://{addr}{path}").parse().unwrap();

    // One thread: the machine has two cores, and the server should get the other.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let counter = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let measuring = Arc::new(AtomicBool::new(total.is_some()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for _ in 0..connections {
            let tcp = tokio::net::TcpStream::connect(addr.as_str())
                .await
                .expect("connect");
            tcp.set_nodelay(true).unwrap();
            let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
            tokio::spawn(async move {
                let _ = connection.await;
            });
            for _ in 0..streams {
                let offset = period.map(|p| p * (tasks.len() as u32) / total_streams);
                let (mut client, bodies, uri) = (client.clone(), bodies.clone(), uri.clone());
                let (counter, errors, measuring, stop) = (
                    counter.clone(),
                    errors.clone(),
                    measuring.clone(),
                    stop.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    let mut latencies: Vec<u32> = Vec::new();
                    let mut pace = period.zip(offset).map(|(period, offset)| {
                        let mut pace =
                            tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
                        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                        pace
                    });
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(pace) = pace.as_mut() {
                            pace.tick().await;
                        }
                        let n = counter.fetch_add(1, Ordering::Relaxed) as usize;
                        if total.is_some_and(|total| n as u64 >= total) {
                            break;
                        }
                        let body = if bodies.is_empty() {
                            body(rpc, "BenchFresh", format!("soak-{n}"))
                        } else {
                            bodies[n % bodies.len()].clone()
                        };
                        let request = http::Request::post(uri.clone())
                            .header("content-type", "application/grpc")
                            .header("te", "trailers")
                            .body(())
                            .unwrap();
                        let start = Instant::now();
                        let ok = async {
                            client = client.clone().ready().await.ok()?;
                            let (response, mut send) = client.send_request(request, false).ok()?;
                            send.send_data(body, true).ok()?;
                            let mut body = response.await.ok()?.into_body();
                            while let Some(chunk) = body.data().await {
                                let chunk = chunk.ok()?;
                                let _ = body.flow_control().release_capacity(chunk.len());
                            }
                            let trailers = body.trailers().await.ok()??;
                            (trailers.get("grpc-status")?.as_bytes() == b"0").then_some(())
                        }
                        .await
                        .is_some();
                        if measuring.load(Ordering::Relaxed) {
                            latencies.push(start.elapsed().as_micros() as u32);
                            if !ok {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    latencies
                }));
            }
        }
        // Warm up for a second, then measure (a counted run measures from the first).
        if total.is_none() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let (ticks, started) = (cpu_ticks(pid), Instant::now());
        measuring.store(true, Ordering::Relaxed);
        // A progress line every 10 s on stderr, for long (soak) runs.
        let mut left = if total.is_some() {
            Duration::ZERO
        } else {
            duration
        };
        while !left.is_zero() {
            let step = left.min(Duration::from_secs(10));
            tokio::time::sleep(step).await;
            left -= step;
            if duration > Duration::from_secs(10) {
                eprintln!(
                    "progress elapsed_s={} sent={} errors={}",
                    started.elapsed().as_secs(),
                    counter.load(Ordering::Relaxed),
                    errors.load(Ordering::Relaxed)
                );
            }
        }
        let mut latencies = Vec::new();
        if total.is_some() {
            for task in tasks.drain(..) {
                latencies.extend(task.await.unwrap());
            }
        }
        measuring.store(false, Ordering::Relaxed);
        let (cpu, elapsed) = (cpu_ticks(pid) - ticks, started.elapsed());
        let rss = rss_kib(pid);
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            latencies.extend(task.await.unwrap());
        }
        latencies.sort_unstable();
        let n = latencies.len().max(1);
        let pct = |p: f64| {
            latencies
                .get(((n as f64 * p) as usize).min(n - 1))
                .copied()
                .unwrap_or(0)
        };
        // Clock ticks are 1/100 s on Linux.
        let cpu_us = cpu as f64 * 10_000.0;
        println!(
            "rps={:.0} p50_us={} p99_us={} cpu_us_per_req={:.2} rss_kib={} errors={}",
            latencies.len() as f64 / elapsed.as_secs_f64(),
            pct(0.50),
            pct(0.99),
            cpu_us / n as f64,
            rss,
            errors.load(Ordering::Relaxed)
        );
    });
}
