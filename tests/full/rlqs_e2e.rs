//! Real Envoy processes running `examples/envoy/rlqs.yaml` (the `rate_limit_quota` filter)
//! in front of a served cellrate: Envoy enforces the quotas cellrate assigns, one limit is
//! divided between two Envoys, and what all of them admit stays within the limit plus the
//! documented overshoot, with one cellrate or two sharing Redis. Short runs (4 to 11 s of
//! load) with a limit of 20 per second.

use std::time::{Duration, Instant};

use cellrate::limits::config::LimitTable;
use cellrate::server::Settings;

use crate::common::envoy::Envoy;
use crate::common::Served;

const EXAMPLE: &str = "examples/envoy/rlqs.yaml";
/// The limit: 20 a second, burst 20.
const RATE: f64 = 20.0;
const BURST: f64 = 20.0;

async fn cellrate(settings: Settings) -> (Served, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "NewOrdersPerAccount: {burst: 20, count: 20, period: 1s}\n",
    )
    .unwrap();
    let quota = concat!(env!("CARGO_MANIFEST_DIR"), "/config/quota.yaml");
    std::fs::copy(quota, dir.path().join("quota.yaml")).unwrap();
    let limits = LimitTable::load_dir(dir.path()).unwrap();
    (Served::with_settings(limits, settings).await, dir)
}

/// Requests for `account` through `envoy` for `run`, one after another on one connection,
/// at most one every `every` (none: as fast as they are answered): (admitted, limited).
async fn load(envoy: &Envoy, account: &str, run: Duration, every: Option<Duration>) -> (u64, u64) {
    let mut client = envoy.client().await;
    let (mut ok, mut limited) = (0, 0);
    let end = Instant::now() + run;
    let mut tick = every.map(tokio::time::interval);
    while Instant::now() < end {
        if let Some(tick) = tick.as_mut() {
            tick.tick().await;
        }
        match client.get("/", &[("x-account-id", account)]).await.status {
            200 => ok += 1,
            429 => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    (ok, limited)
}

/// The most a limit of `RATE`/s and `BURST` admits over `run`, plus the overshoot RLQS
/// allows: the requests before the first assignment (no-assignment behaviour ALLOW_ALL:
/// one round trip to cellrate), and a full bucket for each assignment that changes
/// (at most a burst each; `changes` of them).
fn bound(run: Duration, changes: f64) -> f64 {
    RATE * run.as_secs_f64() + BURST + changes * BURST + 20.0
}

#[test]
fn the_example_validates_as_it_is() {
    let example = crate::common::envoy::load_yaml(EXAMPLE);
    if let Err(complaint) = crate::common::envoy::validate(&example) {
        panic!("envoy --mode validate {EXAMPLE}: {complaint}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_envoy_enforces_the_quota_cellrate_assigns() {
    let (s, _dir) = cellrate(Settings::default()).await;
    let envoy = Envoy::example_of(EXAMPLE, s.decisions_addr, |_| {}).await;
    let run = Duration::from_secs(4);
    let (ok, limited) = load(&envoy, "42", run, None).await;
    assert!(limited > 0, "the load exceeded the limit: {ok} admitted");
    assert!(ok as f64 <= bound(run, 1.0), "{ok} admitted in {run:?}");
    assert!(
        ok as f64 >= 0.9 * RATE * run.as_secs_f64(),
        "{ok} admitted in {run:?}"
    );
    // Requests without the header match no bucket: never limited.
    let mut client = envoy.client().await;
    for _ in 0..50 {
        assert_eq!(client.get("/", &[]).await.status, 200);
    }
    // Another account is a bucket of its own, with the whole limit.
    let (other, _) = load(&envoy, "43", Duration::from_millis(500), None).await;
    assert!(other >= 10, "{other}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_divide_one_limit_by_demand() {
    let (s, _dir) = cellrate(Settings::default()).await;
    two_envoys_on(s.decisions_addr, s.decisions_addr).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_on_two_replicas_sharing_redis_divide_one_limit() {
    let redis = crate::common::redis_server::RedisServer::start();
    let (one, _d1) = cellrate(redis.settings()).await;
    let (two, _d2) = cellrate(redis.settings()).await;
    two_envoys_on(one.decisions_addr, two.decisions_addr).await;
}

/// Envoy A on cellrate `rls_a` asks as fast as it is answered; Envoy B on `rls_b` asks 5
/// times a second (a quarter of the limit). Envoy 1.40 reports every 5 s: the first 6 s
/// divide by what is known at once, the next 5 s by the demand both reported.
async fn two_envoys_on(rls_a: std::net::SocketAddr, rls_b: std::net::SocketAddr) {
    let a = Envoy::example_of(EXAMPLE, rls_a, |_| {}).await;
    let b = Envoy::example_of(EXAMPLE, rls_b, |_| {}).await;
    let phase = |run: Duration| {
        let (a, b) = (&a, &b);
        async move {
            tokio::join!(
                load(a, "7", run, None),
                load(b, "7", run, Some(Duration::from_millis(200)))
            )
        }
    };
    let (warm, steady) = (Duration::from_secs(6), Duration::from_secs(5));
    let (heavy, light) = phase(warm).await;
    let total = (heavy.0 + light.0) as f64;
    assert!(total <= bound(warm, 2.0), "warm-up: {heavy:?} + {light:?}");
    let (heavy, light) = phase(steady).await;
    eprintln!("steady phase: A {heavy:?}, B {light:?} (admitted, limited)");
    let total = (heavy.0 + light.0) as f64;
    let seconds = steady.as_secs_f64();
    // Steady: shares come from one view and no bucket is new; within the limit itself.
    assert!(
        total <= RATE * seconds + BURST,
        "{heavy:?} + {light:?} in {steady:?}"
    );
    assert!(
        total >= 0.9 * RATE * seconds,
        "{heavy:?} + {light:?}: under 90 % of the limit used"
    );
    // B's demand is under its share: nearly all of it passes; A, limited, gets the rest.
    let asked = (light.0 + light.1) as f64;
    assert!(light.0 as f64 >= 0.9 * asked, "B: {light:?}");
    assert!(heavy.1 > 0, "A was limited: {heavy:?}");
    // A's share leaves room for B's: A alone would take the whole limit.
    assert!(
        heavy.0 as f64 <= 0.8 * (RATE * seconds + BURST),
        "A: {heavy:?}"
    );
}
