//! A small gRPC load generator on raw HTTP/2 (the `h2` crate): pre-encoded request bodies,
//! C connections with S streams each, a fixed duration, per-request latency, and the
//! server's CPU time and RSS read from /proc. It decodes nothing but the grpc-status, so
//! that its own cost stays small and equal for every server it drives.
//!
//! ```text
//! loadgen ADDR RPC SCENARIO CONNECTIONS STREAMS SECONDS SERVER_PID [RATE]
//!   RPC       envoy | check | throttlecrab (throttlecrab-server's `Throttle`, the same
//!             limits given as its parameters: scripts/bench-peers-native.sh)
//!   SCENARIO  hot (one key, all allowed) | distinct (100 000 keys) | denied (one key, denied)
//!             | fresh (a new key every request: scripts/soak.sh)
//!             | million (1 000 000 keys in turn, each kept an hour: memory per live key)
//!             | saturate (one key, 1 000 a second, burst 1 000: scripts/bench-saturation.sh
//!               counts what it admitted)
//!             | ip (100 000 IPv4 addresses in turn as Envoy's `remote_address`, domain
//!               `benchip`: a configured limit keyed by the client's address, 100 a second
//!               each, all allowed)
//!             | desc1 | desc2 | desc10 (10 000 requests in turn of 1, 2 or 10 descriptors
//!               of the never-denying limit, each descriptor's id on its own Redis Cluster
//!               slot and the slots dealt in turn over the three masters that
//!               `redis-cli --cluster create` makes of three nodes:
//!               scripts/bench-cluster-latency.sh)
//!   RATE      requests per second over all streams (default: as fast as answered)
//! ```
//! With `LOADGEN_OPEN=1` and a RATE the load is open: each stream sends at its ticks
//! whether or not its earlier requests were answered (each request its own task), and a
//! latency is measured from the tick the request was due at, so that a server falling
//! behind is not offered less. With `LOADGEN_FROM=sent` too, a latency counts from when the
//! request was sent instead: tokio's timer (a 1 ms wheel) fires a tick about a millisecond
//! after it was due, whatever the server, which counted from the tick adds to every latency
//! and flattens their ratios (the memory store at 1 000/s: p50 1.3 ms from the tick, 0.18 ms
//! from the send; scripts/bench-cluster-latency.sh). At most CONNECTIONS x STREAMS are outstanding (what HTTP/2
//! lets onto the wire): a request due beyond that is not sent and counted as `unsent`, as
//! a client with a bounded pool drops its excess, so that the latencies are the server's
//! and not a queue inside this client.
//! With `LOADGEN_TOTAL=N` in the environment it sends exactly N requests, measured from the
//! first, and ignores SECONDS (scripts/bench-callgrind.sh counts instructions per request).
//! Prints one line: `rps=.. p50_us=.. p99_us=.. cpu_us_per_req=.. rss_kib=.. errors=..`,
//! then `p999_us=.. max_rss_kib=.. unsent=.. codes=0:N,14:M,...` (answers by grpc-status,
//! `none` for a request that got no status: a reset stream or connection).

// A benchmark measures real time: `.clippy.toml` keeps the OS clock out of the
// crate, not out of its benchmarks.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cellrate::proto::v1 as pb;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;

#[path = "proc_stats.rs"]
mod proc_stats;
use proc_stats::{cpu_ticks, peak_rss_kib, rss_kib};

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
    if let Some(count) = scenario.strip_prefix("desc") {
        let count: usize = count.parse().expect("descN: N descriptors");
        let path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
        return (path, (0..10_000).map(|i| spread(i, count)).collect());
    }
    let (name, keys) = match scenario {
        "hot" => ("BenchHot", 1),
        "distinct" => ("BenchKeys", 100_000),
        "denied" => ("BenchDenied", 1),
        "fresh" => ("BenchFresh", 0),
        "million" => ("BenchMillion", 1_000_000),
        "saturate" => ("BenchSaturate", 1),
        "ip" => ("remote_address", 100_000),
        other => panic!("unknown scenario {other}"),
    };
    let path = match rpc {
        "envoy" => "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        "check" => "/cellrate.v1.RateLimiter/Check",
        "throttlecrab" => "/throttlecrab.RateLimiter/Throttle",
        other => panic!("unknown rpc {other}"),
    };
    (
        path,
        (0..keys)
            .map(|i| match scenario {
                // 10.0.0.0 up: addresses as Envoy sends them (canonical dotted quads).
                "ip" => body(
                    rpc,
                    name,
                    std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string(),
                ),
                _ => body(rpc, name, format!("key-{i}")),
            })
            .collect(),
    )
}

/// One request body of `rpc` for `name` and `id`.
fn body(rpc: &str, name: &str, id: String) -> Bytes {
    match rpc {
        "envoy" => frame(&RateLimitRequest {
            // The address limit's rule is in a domain of its own, so that the other
            // scenarios' domain has no rules to try.
            domain: if name == "remote_address" {
                "benchip"
            } else {
                "bench"
            }
            .into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: name.into(),
                    value: id,
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        }),
        "throttlecrab" => {
            // benches/grpc/limits/defaults.yaml's limits as burst, count, period (s).
            let (max_burst, count_per_period, period) = match name {
                "BenchHot" => (1_000_000_000, 1_000_000_000, 1),
                "BenchDenied" => (1, 1, 3600),
                "BenchMillion" => (100, 100, 3600),
                "BenchFresh" => (5, 1, 60),
                "BenchSaturate" => (1000, 1000, 1),
                _ => (100, 100, 1),
            };
            frame(&ThrottleRequest {
                key: format!("{name}:{id}"),
                max_burst,
                count_per_period,
                period,
                quantity: 1,
            })
        }
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

/// throttlecrab-server's request (its `proto/throttlecrab.proto`, field for field).
#[derive(Clone, PartialEq, prost::Message)]
struct ThrottleRequest {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(int32, tag = "2")]
    max_burst: i32,
    #[prost(int32, tag = "3")]
    count_per_period: i32,
    #[prost(int32, tag = "4")]
    period: i32,
    #[prost(int32, tag = "5")]
    quantity: i32,
}

/// A ShouldRateLimit request (number `request`) of `count` descriptors of `BenchHot`,
/// whose ids hash to distinct Redis Cluster slots, the d-th on master d mod 3 of a
/// cluster that `redis-cli --cluster create` made of three masters.
fn spread(request: usize, count: usize) -> Bytes {
    // The slot of a key tagged `{id}` (the id has no braces): CRC16/XMODEM of the id, as
    // Redis Cluster hashes keys (computed here, so that the example builds without the
    // Redis store).
    const XMODEM: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);
    let slot_of = |id: &str| usize::from(XMODEM.checksum(id.as_bytes())) % 16_384;
    // The masters' slot ranges from `redis-cli --cluster create` of three nodes.
    let master = |slot: usize| match slot {
        0..=5460 => 0,
        5461..=10922 => 1,
        _ => 2,
    };
    let mut slots = Vec::with_capacity(count);
    let descriptors = (0..count)
        .map(|d| {
            // About three tries each: bounded, and every id is found well within it.
            let id = (0..10_000)
                .map(|n| format!("r{request}-d{d}-{n}"))
                .find(|id| {
                    let slot = slot_of(id);
                    master(slot) == d % 3 && !slots.contains(&slot)
                })
                .expect("an id on a free slot of the wanted third");
            slots.push(slot_of(&id));
            RateLimitDescriptor {
                entries: vec![Entry {
                    key: "BenchHot".into(),
                    value: id,
                }],
                ..Default::default()
            }
        })
        .collect();
    frame(&RateLimitRequest {
        domain: "bench".into(),
        descriptors,
        hits_addend: 0,
    })
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
    let rpc: &'static str = match rpc.as_str() {
        "envoy" => "envoy",
        "throttlecrab" => "throttlecrab",
        _ => "check",
    };
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
    let open = rate.is_some() && std::env::var("LOADGEN_OPEN").is_ok_and(|v| v == "1");
    let from_sent = std::env::var("LOADGEN_FROM").is_ok_and(|v| v == "sent");

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
        let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
        let (outstanding, unsent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
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
                let (client, bodies, uri) = (client.clone(), bodies.clone(), uri.clone());
                let (counter, errors, measuring, stop) = (
                    counter.clone(),
                    errors.clone(),
                    measuring.clone(),
                    stop.clone(),
                );
                let (answers, outstanding, unsent) =
                    (answers.clone(), outstanding.clone(), unsent.clone());
                tasks.push(tokio::spawn(async move {
                    let mut pace = period.zip(offset).map(|(period, offset)| {
                        let mut pace =
                            tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
                        // Open: a late tick is still sent (the load does not bend to the
                        // server); closed: it is skipped.
                        pace.set_missed_tick_behavior(if open {
                            tokio::time::MissedTickBehavior::Burst
                        } else {
                            tokio::time::MissedTickBehavior::Skip
                        });
                        pace
                    });
                    while !stop.load(Ordering::Relaxed) {
                        let due = match pace.as_mut() {
                            Some(pace) if open && from_sent => {
                                pace.tick().await;
                                Instant::now()
                            }
                            Some(pace) if open => pace.tick().await.into_std(),
                            Some(pace) => {
                                pace.tick().await;
                                Instant::now()
                            }
                            None => Instant::now(),
                        };
                        let n = counter.fetch_add(1, Ordering::Relaxed) as usize;
                        if total.is_some_and(|total| n as u64 >= total) {
                            break;
                        }
                        let body = if bodies.is_empty() {
                            body(rpc, "BenchFresh", format!("soak-{n}"))
                        } else {
                            bodies[n % bodies.len()].clone()
                        };
                        let one = {
                            let (client, uri, answers) =
                                (client.clone(), uri.clone(), answers.clone());
                            let (measuring, errors) = (measuring.clone(), errors.clone());
                            async move {
                                let code = call(client, uri, body).await;
                                if measuring.load(Ordering::Relaxed) {
                                    if code != Some(0) {
                                        errors.fetch_add(1, Ordering::Relaxed);
                                    }
                                    let us = due.elapsed().as_micros() as u32;
                                    answers.lock().unwrap().push((us, code));
                                }
                            }
                        };
                        if !open {
                            one.await;
                        } else if outstanding.fetch_add(1, Ordering::Relaxed)
                            < u64::from(total_streams)
                        {
                            let outstanding = outstanding.clone();
                            tokio::spawn(async move {
                                one.await;
                                outstanding.fetch_sub(1, Ordering::Relaxed);
                            });
                        } else {
                            outstanding.fetch_sub(1, Ordering::Relaxed);
                            unsent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
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
        if total.is_some() {
            for task in tasks.drain(..) {
                task.await.unwrap();
            }
        }
        measuring.store(false, Ordering::Relaxed);
        let (cpu, elapsed) = (cpu_ticks(pid) - ticks, started.elapsed());
        let (rss, peak) = (rss_kib(pid), peak_rss_kib(pid));
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.unwrap();
        }
        let answers = std::mem::take(&mut *answers.lock().unwrap());
        let mut codes = std::collections::BTreeMap::new();
        for (_, code) in &answers {
            *codes.entry(*code).or_insert(0u64) += 1;
        }
        let mut latencies: Vec<u32> = answers.iter().map(|&(us, _)| us).collect();
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
        let codes: Vec<String> = codes
            .iter()
            .map(|(code, n)| match code {
                Some(code) => format!("{code}:{n}"),
                None => format!("none:{n}"),
            })
            .collect();
        println!(
            "p999_us={} max_us={} max_rss_kib={peak} unsent={} codes={}",
            pct(0.999),
            latencies.last().copied().unwrap_or(0),
            unsent.load(Ordering::Relaxed),
            codes.join(",")
        );
    });
}

/// An answer while measuring: its latency in µs and its grpc-status (`None`: none came).
type Answer = (u32, Option<u32>);

/// One request on `client`: its grpc-status, or `None` when the stream or connection
/// failed before one came.
async fn call(client: h2::client::SendRequest<Bytes>, uri: http::Uri, body: Bytes) -> Option<u32> {
    let request = http::Request::post(uri)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let mut client = client.ready().await.ok()?;
    let (response, mut send) = client.send_request(request, false).ok()?;
    send.send_data(body, true).ok()?;
    let response = response.await.ok()?;
    // A Trailers-Only answer (an error before any message) carries grpc-status in its
    // headers.
    if let Some(status) = response.headers().get("grpc-status") {
        return status.to_str().ok()?.parse().ok();
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.ok()?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.ok()??;
    trailers.get("grpc-status")?.to_str().ok()?.parse().ok()
}
