//! Concurrency limits through Envoy's RLS (docs/concurrency.md, "Envoy"): a descriptor
//! mapped by a rule with a `lease` entry acquires a lease named by that entry, the same
//! descriptor with `is_negative_hits` releases it. Through a real gRPC client on loopback,
//! on the served fake clock, with `examples/concurrency/limits/`.

use std::path::Path;

use crate::common::{descriptor, remaining, Served};
use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;
const HOLD: i64 = 35 * SECOND;

fn example() -> LimitTable {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/concurrency/limits");
    LimitTable::load_dir(&dir).expect("the example loads")
}

/// The example's limits plus a rate (`RequestsPerTenant`, 2 a second on `requests`), to
/// check all-or-nothing across descriptors.
fn with_a_rate() -> LimitTable {
    with_a_rate_and_policy(None)
}

/// [`with_a_rate`], the `inflight` domain's `invalid_id` policy set to `policy` if given.
fn with_a_rate_and_policy(policy: Option<&str>) -> LimitTable {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/concurrency/limits");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    let rate = "  - match: [{key: requests}, {key: tenant}]\n    \
                limits: [RequestsPerTenant]\n    id: \"{tenant}\"\n";
    let descriptors = read("descriptors.yaml") + rate;
    let descriptors = match policy {
        // The domain as a map: its policy, and its rules indented under `rules`.
        Some(policy) => descriptors.replace(
            "inflight:\n",
            &format!("inflight:\n  invalid_id: {policy}\n  rules:\n"),
        ),
        None => descriptors,
    };
    let files = [
        (
            "names.yaml",
            read("names.yaml") + "RequestsPerTenant: {number: 111, format: string}\n",
        ),
        (
            "defaults.yaml",
            read("defaults.yaml") + "RequestsPerTenant: {burst: 2, count: 2, period: 1s}\n",
        ),
        ("overrides.yaml", read("overrides.yaml")),
        ("descriptors.yaml", descriptors),
    ];
    let files: Vec<(String, String)> = files.into_iter().map(|(f, t)| (f.to_string(), t)).collect();
    LimitTable::from_files(&files).expect("the limits load")
}

/// The descriptor Envoy builds from the example's actions.
pub(crate) fn lease(tenant: &str, id: &str) -> RateLimitDescriptor {
    descriptor(&[("tenant", tenant), ("lease", id)])
}

/// The same at stream done: `hits_addend: {number: 1, is_negative_hits: true}`.
pub(crate) fn release(tenant: &str, id: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: 1 }),
        is_negative_hits: true,
        ..lease(tenant, id)
    }
}

async fn ask(s: &mut Served, descriptors: Vec<RateLimitDescriptor>) -> RateLimitResponse {
    try_ask(s, descriptors)
        .await
        .expect("ShouldRateLimit succeeds")
}

async fn try_ask(
    s: &mut Served,
    descriptors: Vec<RateLimitDescriptor>,
) -> Result<RateLimitResponse, tonic::Status> {
    Ok(s.envoy
        .should_rate_limit(RateLimitRequest {
            domain: "inflight".to_string(),
            descriptors,
            hits_addend: 0,
        })
        .await?
        .into_inner())
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// Acquires by request id up to the tenant's N (8; 4 for the override's tenant), the next
/// OVER_LIMIT with its status and Retry-After; a retried acquire takes no second slot; a
/// release frees exactly its lease and answers OK; a release of an id that holds none
/// answers OK and frees nothing; a lease never released is back after the hold.
#[tokio::test]
async fn envoy_acquires_and_releases_leases_by_request_id() {
    let mut s = Served::with_limits(example()).await;
    for (tenant, n) in [("acme", 8u32), ("trial-co", 4)] {
        for i in 0..n {
            let r = ask(&mut s, vec![lease(tenant, &format!("r{i}"))]).await;
            assert_eq!(r.overall_code, OK, "{tenant} r{i}");
            assert_eq!(r.statuses[0].limit_remaining, n - 1 - i);
        }
        let full = ask(&mut s, vec![lease(tenant, "late")]).await;
        assert_eq!(full.overall_code, OVER, "{tenant}: the N+1st");
        assert_eq!(full.statuses[0].code, OVER);
        assert_eq!(full.statuses[0].limit_remaining, 0);
        // The oldest lease expires after the hold: 35 s.
        assert_eq!(header(&full, "retry-after"), Some("35"));
        let limit = full.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(limit.name, "InFlightPerTenant");
        let retried = ask(&mut s, vec![lease(tenant, "r1")]).await;
        assert_eq!(retried.overall_code, OK, "a retried acquire");
        assert_eq!(remaining(&mut s, "InFlightPerTenant", tenant).await, 0);
    }
    // The denied request's stream end: its release changes nothing.
    assert_eq!(
        ask(&mut s, vec![release("acme", "late")])
            .await
            .overall_code,
        OK
    );
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "acme").await, 0);
    assert_eq!(
        ask(&mut s, vec![lease("acme", "late2")]).await.overall_code,
        OVER
    );
    // A release frees its lease (once: a repeated one nothing), and only on its tenant.
    assert_eq!(
        ask(&mut s, vec![release("acme", "r3")]).await.overall_code,
        OK
    );
    assert_eq!(
        ask(&mut s, vec![release("acme", "r3")]).await.overall_code,
        OK
    );
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "acme").await, 1);
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "trial-co").await, 0);
    assert_eq!(
        ask(&mut s, vec![lease("acme", "late2")]).await.overall_code,
        OK
    );
    assert_eq!(
        ask(&mut s, vec![lease("acme", "late3")]).await.overall_code,
        OVER
    );
    // Never released: back after the hold, to the nanosecond.
    s.clock.advance(HOLD - 1);
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "trial-co").await, 0);
    s.clock.advance(1);
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "trial-co").await, 4);
    s.stop().await;
}

/// All-or-nothing with the other descriptors of the request: a denied rate takes no lease,
/// a full key spends no rate; a release in a request another descriptor denies is applied.
#[tokio::test]
async fn leases_are_all_or_nothing_with_other_descriptors() {
    let mut s = Served::with_limits(with_a_rate()).await;
    let rate = |tenant| descriptor(&[("requests", "1"), ("tenant", tenant)]);
    for i in 0..2 {
        let r = ask(&mut s, vec![rate("acme"), lease("acme", &format!("r{i}"))]).await;
        assert_eq!(r.overall_code, OK);
    }
    let denied = ask(&mut s, vec![rate("acme"), lease("acme", "r2")]).await;
    assert_eq!((denied.overall_code, denied.statuses[0].code), (OVER, OVER));
    assert_eq!(
        remaining(&mut s, "InFlightPerTenant", "acme").await,
        6,
        "the denied request took no lease"
    );
    // trial-co: fill its 4 slots one second apart (the rate refills), then a fifth.
    for i in 0..4 {
        s.clock.advance(SECOND);
        let r = ask(
            &mut s,
            vec![rate("trial-co"), lease("trial-co", &format!("t{i}"))],
        )
        .await;
        assert_eq!(r.overall_code, OK);
    }
    s.clock.advance(SECOND);
    let full = ask(&mut s, vec![rate("trial-co"), lease("trial-co", "t4")]).await;
    assert_eq!((full.overall_code, full.statuses[1].code), (OVER, OVER));
    assert_eq!(
        remaining(&mut s, "RequestsPerTenant", "trial-co").await,
        2,
        "the full key spent no rate"
    );
    // A release beside a denied rate is still applied, and answered OK.
    for _ in 0..2 {
        assert_eq!(ask(&mut s, vec![rate("zed")]).await.overall_code, OK);
    }
    let mixed = ask(&mut s, vec![rate("zed"), release("trial-co", "t0")]).await;
    assert_eq!(mixed.overall_code, OVER);
    assert_eq!(mixed.statuses[1].code, OK);
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "trial-co").await, 1);
    s.stop().await;
}

/// The attacker is Envoy itself, replaying its stream-end calls: 64 concurrent requests of
/// one tenant, 8 admitted, 56 denied, then the 56 denied requests' stream-end releases.
/// With leases the tenant still has 8 in flight and the next request is denied; the naive
/// counter (a rate spent by 1 and given back with `is_negative_hits`) is handed 56 slots it
/// never gave, so 56 more requests get in while the first 8 are still running.
#[tokio::test]
async fn stray_releases_of_denied_requests_free_no_slot() {
    let mut s = Served::with_limits(example()).await;
    let mut admitted = 0;
    for i in 0..64 {
        if ask(&mut s, vec![lease("acme", &format!("r{i}"))])
            .await
            .overall_code
            == OK
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 8);
    for i in 8..64 {
        assert_eq!(
            ask(&mut s, vec![release("acme", &format!("r{i}"))])
                .await
                .overall_code,
            OK
        );
    }
    let mut more = 0;
    for i in 0..64 {
        if ask(&mut s, vec![lease("acme", &format!("again{i}"))])
            .await
            .overall_code
            == OK
        {
            more += 1;
        }
    }
    assert_eq!(
        more, 0,
        "no slot freed by a release of an id that held none"
    );
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "acme").await, 0);
    s.stop().await;

    // The naive counter, for comparison: 8 of an hour's worth, spent and given back.
    let counter = crate::common::naive_in_flight_counter();
    let mut s = Served::with_limits(counter).await;
    let spend = || descriptor(&[("tenant", "acme")]);
    let give = || RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: 1 }),
        is_negative_hits: true,
        ..spend()
    };
    let mut admitted = 0;
    for _ in 0..64 {
        admitted += usize::from(ask(&mut s, vec![spend()]).await.overall_code == OK);
    }
    for _ in 8..64 {
        ask(&mut s, vec![give()]).await;
    }
    let mut more = 0;
    for _ in 0..64 {
        more += usize::from(ask(&mut s, vec![spend()]).await.overall_code == OK);
    }
    println!("naive counter: {admitted} admitted, then {more} more while they ran");
    assert_eq!(
        (admitted, more),
        (8, 8),
        "the counter's leak (a full bucket stays full)"
    );
    s.stop().await;
}

/// A lease descriptor whose shape its rule cannot take (no lease entry, hits other than
/// 1, a limit of its own) is decided by the domain's `invalid_id` policy, never refused
/// (Envoy would let the request through with its other descriptors skipped): by default
/// it is denied, so the request is OVER_LIMIT and nothing changes (no lease taken, the
/// other descriptors not spent); under `invalid_id: reject` it is INVALID_ARGUMENT naming
/// the descriptor and field, as the operator asked.
#[tokio::test]
async fn bad_lease_descriptors_are_denied_by_default_and_change_nothing() {
    let rate = descriptor(&[("requests", "1"), ("tenant", "acme")]);
    let hits = |value| RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value }),
        ..lease("acme", "h")
    };
    let cases: Vec<(RateLimitDescriptor, &str)> = vec![
        (
            descriptor(&[("tenant", "acme")]),
            "descriptors[1].entries: no lease entry \"lease\"",
        ),
        (
            hits(2),
            "descriptors[1].hits_addend: 2: a lease is one slot",
        ),
        (
            hits(0),
            "descriptors[1].hits_addend: 0: a lease is one slot",
        ),
        (
            hits(u64::MAX - 7),
            "descriptors[1].hits_addend: 18446744073709551608: a lease is one slot",
        ),
        (
            RateLimitDescriptor {
                is_negative_hits: true,
                ..hits(5)
            },
            "descriptors[1].hits_addend: 5: a lease is one slot",
        ),
        (
            RateLimitDescriptor {
                limit: Some(RateLimitOverride {
                    requests_per_unit: 5,
                    unit: 1,
                }),
                ..lease("acme", "l")
            },
            "descriptors[1].limit: a concurrency limit takes no limit",
        ),
    ];
    let mut s = Served::with_limits(with_a_rate()).await;
    for (bad, _) in &cases {
        let r = ask(&mut s, vec![rate.clone(), bad.clone()]).await;
        assert_eq!(r.overall_code, OVER, "{bad:?}");
        assert_eq!(r.statuses[1].code, OVER, "{bad:?}: the malformed one");
        assert_eq!(header(&r, "retry-after"), None, "no wait would help");
    }
    // The request-wide hits_addend.
    let r = (s.envoy)
        .should_rate_limit(RateLimitRequest {
            domain: "inflight".to_string(),
            descriptors: vec![rate.clone(), lease("acme", "w")],
            hits_addend: 3,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OVER);
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "acme").await, 8);
    assert_eq!(remaining(&mut s, "RequestsPerTenant", "acme").await, 2);
    s.stop().await;

    let mut s = Served::with_limits(with_a_rate_and_policy(Some("reject"))).await;
    for (bad, says) in cases {
        let e = try_ask(&mut s, vec![rate.clone(), bad.clone()])
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}: {e}");
        assert!(e.message().starts_with(says), "{bad:?}: {}", e.message());
    }
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "acme").await, 8);
    assert_eq!(remaining(&mut s, "RequestsPerTenant", "acme").await, 2);
    s.stop().await;

    // `ignore`: the malformed descriptor is unmatched, the rest decided as usual.
    let mut s = Served::with_limits(with_a_rate_and_policy(Some("ignore"))).await;
    let r = ask(&mut s, vec![rate.clone(), hits(2)]).await;
    assert_eq!((r.overall_code, r.statuses[1].code), (OK, OK));
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "acme").await, 8);
    assert_eq!(remaining(&mut s, "RequestsPerTenant", "acme").await, 1);
    s.stop().await;
}

/// A lease id that is not 1 to 128 printable ASCII bytes (a client's header as it came)
/// stands for itself as `sha256:` and its digest's hex: acquired as any other id, and
/// released by the same bytes; never an error.
#[tokio::test]
async fn lease_ids_out_of_shape_stand_for_themselves() {
    let mut s = Served::with_limits(with_a_rate()).await;
    let odd = [
        "x".repeat(129),
        String::new(),
        "a b".to_string(),
        "caf\u{e9}".to_string(),
    ];
    for id in &odd {
        let r = ask(&mut s, vec![lease("acme", id)]).await;
        assert_eq!(r.overall_code, OK, "{id:?}");
    }
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "acme").await, 4);
    // A retried acquire of the same bytes takes no second slot.
    ask(&mut s, vec![lease("acme", &odd[0])]).await;
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "acme").await, 4);
    for id in &odd {
        let r = ask(&mut s, vec![release("acme", id)]).await;
        assert_eq!(r.overall_code, OK, "{id:?}");
    }
    assert_eq!(remaining(&mut s, "InFlightPerTenant", "acme").await, 8);
    s.stop().await;
}

/// A concurrency limit is reached through Envoy only by a rule with a lease entry, and a
/// rule with one maps only to concurrency limits: anything else is refused at load, naming
/// the rule. The convention (a descriptor whose one key is the limit's name) is denied per
/// request, as a descriptor that cannot be decided as it came; RLQS buckets take no lease.
#[tokio::test]
async fn lease_rules_must_fit_their_limits() {
    let files = |descriptors: &str, quota: Option<&str>| {
        let mut files = vec![
            (
                "names.yaml".to_string(),
                "InFlight: {number: 100, format: string}\nRate: {number: 101, format: string}\n"
                    .to_string(),
            ),
            (
                "defaults.yaml".to_string(),
                "InFlight: {window: concurrency, count: 3, period: 30s}\n\
                 Rate: {burst: 2, count: 2, period: 1s}\n"
                    .to_string(),
            ),
            ("descriptors.yaml".to_string(), descriptors.to_string()),
        ];
        if let Some(quota) = quota {
            files.push(("quota.yaml".to_string(), quota.to_string()));
        }
        LimitTable::from_files(&files)
    };
    for (descriptors, quota, says) in [
        (
            "d:\n  - match: [{key: tenant}]\n    limits: [InFlight]\n",
            None,
            "descriptors.yaml: d rule 1: InFlight is a concurrency limit: name the entry",
        ),
        (
            "d:\n  - match: [{key: tenant}, {key: lease}]\n    limits: [Rate]\n    lease: lease\n",
            None,
            "descriptors.yaml: d rule 1: Rate is not a concurrency limit",
        ),
        (
            "",
            Some("q:\n  - match: [{key: tenant}, {key: lease}]\n    limits: [Rate]\n    lease: lease\n"),
            "an RLQS bucket takes no lease",
        ),
    ] {
        let e = files(descriptors, quota).unwrap_err().to_string();
        assert!(e.contains(says), "{descriptors}: {e}");
    }
    let mut s = Served::with_limits(
        files(
            "d:\n  - match: [{key: tenant}, {key: lease}]\n    limits: [InFlight]\n    lease: lease\n",
            None,
        )
        .unwrap(),
    )
    .await;
    // Denied (the domain's default policy), never an error that Envoy would let through.
    let r = s
        .envoy
        .should_rate_limit(RateLimitRequest {
            domain: "d".to_string(),
            descriptors: vec![descriptor(&[("InFlight", "acme")])],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.overall_code, r.statuses[0].code), (OVER, OVER));
    assert_eq!(remaining(&mut s, "InFlight", "acme").await, 3);
    s.stop().await;
}

/// Issue #58, defect 3: a caller sending fresh tenant ids fills the memory store's table of
/// leases (before: 1 000 000 one-lease keys in about 11 s, then every acquire of every
/// concurrency limit UNAVAILABLE, which Envoy's default `failure_mode_deny: false` lets
/// through). Now one name holds at most its share (`--lease-name-share`) of the table
/// (`--max-leases`; here 200 and 25 %: 50 leases), and an acquire beyond either bound is
/// OVER_LIMIT, never an error; another name's tenants still take leases, and the native
/// API answers the same acquire denied.
#[tokio::test]
async fn a_flood_of_fresh_tenants_is_denied_within_its_names_share() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/concurrency/limits");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    let files = [
        (
            "names.yaml",
            read("names.yaml") + "InFlightPerUser: {number: 112, format: string}\n",
        ),
        (
            "defaults.yaml",
            read("defaults.yaml")
                + "InFlightPerUser: {window: concurrency, count: 8, period: 35s}\n",
        ),
        ("overrides.yaml", read("overrides.yaml")),
        (
            "descriptors.yaml",
            read("descriptors.yaml")
                + "  - match: [{key: user}, {key: lease}]\n    \
                   limits: [InFlightPerUser]\n    id: \"{user}\"\n    lease: lease\n",
        ),
    ];
    let files: Vec<(String, String)> = files.into_iter().map(|(f, t)| (f.to_string(), t)).collect();
    let limits = LimitTable::from_files(&files).expect("the limits load");
    let settings = cellrate::server::Settings {
        max_leases: 200,
        lease_name_share: 25,
        ..crate::common::harness_settings()
    };
    let mut s = Served::with_settings(limits, settings).await;
    let (mut ok, mut over) = (0, 0);
    for i in 0..300 {
        let r = try_ask(&mut s, vec![lease(&format!("fresh-{i}"), "r")])
            .await
            .unwrap_or_else(|e| panic!("acquire {i}: an error is a bypass through Envoy: {e}"));
        match r.overall_code {
            OK => ok += 1,
            OVER => {
                assert_eq!(r.statuses[0].limit_remaining, 0);
                over += 1;
            }
            code => panic!("acquire {i}: code {code}"),
        }
    }
    assert_eq!(
        (ok, over),
        (50, 250),
        "the flooded name's share, then denials"
    );
    // A tenant of the flooded name that holds nothing yet is denied too (its name's share
    // is full), while another name's users take leases as before.
    let user = |u: &str, id: &str| descriptor(&[("user", u), ("lease", id)]);
    for i in 0..8 {
        let r = ask(&mut s, vec![user("alice", &format!("a{i}"))]).await;
        assert_eq!(r.overall_code, OK, "another name's lease {i}");
    }
    assert_eq!(
        ask(&mut s, vec![user("alice", "a8")]).await.overall_code,
        OVER,
        "and its own count still holds"
    );
    // The native API: the same acquire is a denial, not an error.
    let item = cellrate::proto::v1::Item {
        name: "InFlightPerTenant".to_string(),
        id: "native-fresh".to_string(),
        mode: cellrate::proto::v1::Mode::Acquire as i32,
        lease_id: "n1".to_string(),
        ..Default::default()
    };
    let answer = crate::common::check(&mut s, vec![item])
        .await
        .expect("a denial");
    assert!(!answer.overall.expect("an overall decision").allowed);
    // A release frees a slot of the share for the next fresh tenant.
    assert_eq!(
        ask(&mut s, vec![release("fresh-0", "r")])
            .await
            .overall_code,
        OK
    );
    assert_eq!(
        ask(&mut s, vec![lease("fresh-new", "r")])
            .await
            .overall_code,
        OK
    );
}
