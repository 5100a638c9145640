//! Reservations through Envoy's RLS (docs/concurrency.md, "Reservations"): a descriptor
//! mapped by a rule with a `reserve` entry holds its hits under the request id in that
//! entry; the same descriptor with `is_negative_hits` settles the hold to its hits, once.
//! Through a real gRPC client on loopback, on the served fake clock, with
//! `examples/reservations/limits/` (a budget of 1 000 000 tokens a tenant).

use std::path::Path;

use crate::common::{descriptor, remaining, Served};
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;
const BUDGET: i64 = 1_000_000;
const NAME: &str = "TokensPerTenant";

fn example() -> LimitTable {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/reservations/limits");
    LimitTable::load_dir(&dir).expect("the example loads")
}

/// The example's limits, its rule served in a second domain (`other`) too.
fn two_domains() -> LimitTable {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/reservations/limits");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    let rules = read("descriptors.yaml");
    let files = [
        ("names.yaml", read("names.yaml")),
        ("defaults.yaml", read("defaults.yaml")),
        (
            "descriptors.yaml",
            rules.clone() + &rules.replace("tokens:", "other:"),
        ),
    ];
    let files: Vec<(String, String)> = files.into_iter().map(|(f, t)| (f.to_string(), t)).collect();
    LimitTable::from_files(&files).expect("the limits load")
}

/// The request-path descriptor Envoy builds from the example: `hits_addend` the estimate.
fn hold(tenant: &str, id: &str, estimate: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: estimate }),
        ..descriptor(&[("tenant", tenant), ("request", id)])
    }
}

/// The same at stream done: `hits_addend` the actual cost, with `is_negative_hits`.
fn settle(tenant: &str, id: &str, actual: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        is_negative_hits: true,
        ..hold(tenant, id, actual)
    }
}

async fn ask(s: &mut Served, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> i32 {
    let r = try_ask(s, domain, descriptors)
        .await
        .expect("ShouldRateLimit succeeds");
    r.overall_code
}

async fn try_ask(
    s: &mut Served,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> Result<RateLimitResponse, tonic::Status> {
    Ok(s.envoy
        .should_rate_limit(RateLimitRequest {
            domain: domain.to_string(),
            descriptors,
            hits_addend: 0,
        })
        .await?
        .into_inner())
}

#[tokio::test]
async fn a_hold_is_settled_to_the_actual_cost_once() {
    let mut s = Served::with_limits(example()).await;
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "r1", 30_000)]).await,
        OK
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 30_000);
    // The stream ends: settled to 120 000.
    assert_eq!(
        ask(&mut s, "tokens", vec![settle("acme", "r1", 12_000)]).await,
        OK
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 12_000);
    // Replayed, with the same cost or another: OK, and nothing changes.
    for actual in [12_000, 5, 90_000] {
        assert_eq!(
            ask(&mut s, "tokens", vec![settle("acme", "r1", actual)]).await,
            OK
        );
        assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 12_000);
    }
    // A settlement above the estimate charges the difference.
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "r2", 1_000)]).await,
        OK
    );
    assert_eq!(
        ask(&mut s, "tokens", vec![settle("acme", "r2", 4_000)]).await,
        OK
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 16_000);
    s.stop().await;
}

/// The attacker: requests that share one request id (a client's own x-request-id, where
/// Envoy keeps it) must not share one hold. A second hold under a kept id is OVER_LIMIT
/// and holds nothing; so is a replayed one (its first try holds).
#[tokio::test]
async fn requests_that_share_an_id_do_not_share_a_hold() {
    let mut s = Served::with_limits(example()).await;
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "same", 30_000)]).await,
        OK
    );
    for _ in 0..3 {
        assert_eq!(
            ask(&mut s, "tokens", vec![hold("acme", "same", 30_000)]).await,
            OVER,
            "a second request under a held id"
        );
    }
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 30_000);
    // Settled, the id stays taken (until --settle-window).
    assert_eq!(
        ask(&mut s, "tokens", vec![settle("acme", "same", 10)]).await,
        OK
    );
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "same", 5)]).await,
        OVER
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 10);
    s.stop().await;
}

/// A hold that does not fit is OVER_LIMIT and holds nothing; its stream end (Envoy sends
/// it for its own 429s too) settles nothing.
#[tokio::test]
async fn a_denied_hold_holds_nothing_and_its_stream_end_changes_nothing() {
    let mut s = Served::with_limits(example()).await;
    // Nine holds of a tenth of the budget each, and one of a twentieth: 50 000 left.
    for i in 0..9 {
        let id = format!("big{i}");
        assert_eq!(
            ask(&mut s, "tokens", vec![hold("acme", &id, 100_000)]).await,
            OK
        );
    }
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "big9", 50_000)]).await,
        OK
    );
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "r1", 100_000)]).await,
        OVER
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, 50_000);
    assert_eq!(
        ask(&mut s, "tokens", vec![settle("acme", "r1", 0)]).await,
        OK
    );
    assert_eq!(
        remaining(&mut s, NAME, "acme").await,
        50_000,
        "nothing given back"
    );
    // An id never held: OK, nothing changes.
    assert_eq!(
        ask(&mut s, "tokens", vec![settle("acme", "never", 0)]).await,
        OK
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, 50_000);
    // The denied id may hold later, once there is room.
    assert_eq!(
        ask(&mut s, "tokens", vec![settle("acme", "big0", 0)]).await,
        OK
    );
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "r1", 100_000)]).await,
        OK
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, 50_000);
    s.stop().await;
}

/// The attacker: an estimate larger than one hold may take (the example's `max_share`,
/// a tenth of the budget; or more than the whole budget) is denied (OVER_LIMIT), holds
/// nothing, and its stream end takes nothing. Refusing it as malformed would be an error
/// that Envoy's default `failure_mode_deny: false` lets through with nothing held.
#[tokio::test]
async fn an_estimate_over_the_share_is_denied_and_holds_nothing() {
    let mut s = Served::with_limits(example()).await;
    for (id, estimate) in [("greedy", 100_001), ("huge", 2_000_000), ("max", u64::MAX)] {
        assert_eq!(
            ask(&mut s, "tokens", vec![hold("acme", id, estimate)]).await,
            OVER,
            "{estimate}"
        );
        assert_eq!(ask(&mut s, "tokens", vec![settle("acme", id, 0)]).await, OK);
        assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET, "{estimate}");
    }
    // A hold of the share itself fits.
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "fair", 100_000)]).await,
        OK
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 100_000);
    s.stop().await;
}

/// The attacker: a stream end that names the same request id in another domain, or for
/// another tenant, must not settle this hold (give its estimate back).
#[tokio::test]
async fn a_stream_end_settles_only_its_own_domain_and_key() {
    let mut s = Served::with_limits(two_domains()).await;
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "r1", 50_000)]).await,
        OK
    );
    assert_eq!(
        ask(&mut s, "other", vec![settle("acme", "r1", 0)]).await,
        OK
    );
    assert_eq!(
        ask(&mut s, "tokens", vec![settle("globex", "r1", 0)]).await,
        OK
    );
    assert_eq!(
        remaining(&mut s, NAME, "acme").await,
        BUDGET - 50_000,
        "held still"
    );
    assert_eq!(
        ask(&mut s, "tokens", vec![settle("acme", "r1", 0)]).await,
        OK
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET);
    s.stop().await;
}

/// The id an Envoy hold is kept under, as `crates/service/src/service/envoy/reserve.rs` builds it.
fn kept_id(domain: &str, names: &[&str], id: &str, request_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    let fields = [domain].into_iter().chain(names.iter().copied());
    for text in fields.chain([id, request_id]) {
        hash.update((text.len() as u64).to_le_bytes());
        hash.update(text.as_bytes());
    }
    format!("envoy:{}", hex::encode(hash.finalize()))
}

/// The attacker: a native caller who knows how an Envoy hold is kept must not settle it
/// (its estimate refunded) nor take its id first. The native API refuses the `envoy:`
/// ids.
#[tokio::test]
async fn a_native_call_cannot_settle_or_take_an_envoy_hold() {
    let mut s = Served::with_limits(example()).await;
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "r1", 50_000)]).await,
        OK
    );
    let id = kept_id("tokens", &[NAME], "acme", "r1");
    let settled = s
        .decisions
        .settle(pb::SettleRequest {
            request_id: id.clone(),
            costs: vec![0],
        })
        .await;
    let e = settled.expect_err("a native Settle of an Envoy hold is refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("request_id"), "{e:?}");
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 50_000);
    // Nor may a native Check take an Envoy id first (its settlement would then be the
    // native caller's).
    let next = kept_id("tokens", &[NAME], "acme", "r2");
    let checked = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![crate::common::item(NAME, "acme", Some(1))],
            request_id: next,
            ..Default::default()
        })
        .await;
    assert_eq!(
        checked.expect_err("refused").code(),
        tonic::Code::InvalidArgument
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 50_000);
    s.stop().await;
}

/// Shapes a reservation's rule cannot take (no request entry, a limit of its own, a
/// reservation beside other descriptors) are decided by the domain's `invalid_id` policy,
/// never refused (Envoy's default would let the request through, nothing held): denied by
/// default, and nothing changes.
#[tokio::test]
async fn bad_reservations_are_denied_and_change_nothing() {
    let mut s = Served::with_limits(example()).await;
    let no_request = RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: 10 }),
        ..descriptor(&[("tenant", "acme")])
    };
    let with_limit = RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: 1,
        }),
        ..hold("acme", "r3", 10)
    };
    let cases: Vec<(Vec<RateLimitDescriptor>, usize)> = vec![
        (vec![no_request], 0),
        (vec![with_limit], 0),
        (vec![hold("acme", "r1", 10), hold("acme", "r2", 10)], 0),
        (
            vec![descriptor(&[(NAME, "acme")]), hold("acme", "r2", 10)],
            1,
        ),
    ];
    for (descriptors, d) in cases {
        let r = try_ask(&mut s, "tokens", descriptors.clone())
            .await
            .expect("decided");
        assert_eq!(r.overall_code, OVER, "{descriptors:?}");
        assert_eq!(r.statuses[d].code, OVER, "{descriptors:?}");
    }
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET);
    s.stop().await;
}

/// A request id of any bytes (a client's `x-request-id` as it came: spaces, empty, long)
/// is held and settled by the same bytes: it is kept under a digest, never refused.
#[tokio::test]
async fn request_ids_of_any_shape_are_held_and_settled() {
    let mut s = Served::with_limits(example()).await;
    for (tenant, id) in [
        ("t0", "a b".to_string()),
        ("t1", "x".repeat(129)),
        ("t2", String::new()),
    ] {
        assert_eq!(
            ask(&mut s, "tokens", vec![hold(tenant, &id, 10)]).await,
            OK,
            "{id:?}"
        );
        assert_eq!(remaining(&mut s, NAME, tenant).await, BUDGET - 10);
        assert_eq!(
            ask(&mut s, "tokens", vec![settle(tenant, &id, 4)]).await,
            OK
        );
        assert_eq!(remaining(&mut s, NAME, tenant).await, BUDGET - 4);
    }
    s.stop().await;
}

/// A key id that does not fit the limit's format is decided for a reservation by the
/// domain's `invalid_id` policy, as for any descriptor: `ignore` leaves it unmatched (OK,
/// nothing held), the default denies it.
#[tokio::test]
async fn a_reservation_with_an_id_out_of_format_follows_the_policy() {
    let files = |policy: &str| -> Vec<(String, String)> {
        [
            (
                "names.yaml",
                "TokensPerAddress: {number: 121, format: ipAddress}\n".to_string(),
            ),
            (
                "defaults.yaml",
                "TokensPerAddress: {burst: 1000, count: 1000, period: 1d}\n".to_string(),
            ),
            (
                "descriptors.yaml",
                format!(
                    "tokens:\n  invalid_id: {policy}\n  rules:\n    - match: [{{key: tenant}}, \
                     {{key: request}}]\n      limits: [TokensPerAddress]\n      \
                     id: \"{{tenant}}\"\n      reserve: request\n"
                ),
            ),
        ]
        .into_iter()
        .map(|(f, t)| (f.to_string(), t))
        .collect()
    };
    for (policy, answer) in [("ignore", OK), ("deny", OVER)] {
        let mut s = Served::with_limits(LimitTable::from_files(&files(policy)).unwrap()).await;
        let bad = hold("not-an-address", "r1", 10);
        assert_eq!(ask(&mut s, "tokens", vec![bad]).await, answer, "{policy}");
        assert_eq!(
            ask(&mut s, "tokens", vec![hold("192.0.2.7", "r1", 10)]).await,
            OK
        );
        assert_eq!(
            remaining(&mut s, "TokensPerAddress", "192.0.2.7").await,
            990
        );
        s.stop().await;
    }
}

/// The attacker: holds that fill the table of kept `Check`s (`--settle-max-records`) make
/// a further hold OVER_LIMIT, holding nothing, not an error that Envoy's default
/// `failure_mode_deny: false` would let through unheld; the holds in the table stand.
#[tokio::test]
async fn a_table_full_of_holds_denies_the_next_hold() {
    let settings = cellrate::server::Settings {
        settle_max_records: 2,
        ..Default::default()
    };
    let mut s = Served::with_settings(example(), settings).await;
    for id in ["r1", "r2"] {
        assert_eq!(
            ask(&mut s, "tokens", vec![hold("acme", id, 1_000)]).await,
            OK
        );
    }
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("globex", "r3", 1_000)]).await,
        OVER
    );
    assert_eq!(remaining(&mut s, NAME, "globex").await, BUDGET);
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 2_000);
    assert_eq!(
        ask(&mut s, "tokens", vec![settle("acme", "r1", 10)]).await,
        OK
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 1_010);
    s.stop().await;
}

/// The attacker (one tenant, through the example's Envoy rule: 1 token a hold) takes its
/// share of the table of kept `Check`s (`--settle-max-holds-per-key`, 1 000) and then is
/// OVER_LIMIT, holding nothing (a denial, not an error Envoy's default would let through),
/// while another tenant's hold is still taken. On 3ebe882 the attacker's 1 100 holds were
/// all taken and the other tenant was OVER_LIMIT with its budget full.
#[tokio::test]
async fn one_tenants_holds_cannot_deny_another_tenants_hold() {
    let settings = cellrate::server::Settings {
        settle_max_records: 1_100,
        ..Default::default()
    };
    let mut s = Served::with_settings(example(), settings).await;
    let mut over = 0;
    for i in 0..1_100 {
        let id = format!("r{i}");
        match ask(&mut s, "tokens", vec![hold("acme", &id, 1)]).await {
            OK => {}
            code => {
                assert_eq!(code, OVER);
                over += 1;
            }
        }
    }
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("globex", "g1", 1_000)]).await,
        OK,
        "another tenant's hold"
    );
    assert_eq!(over, 100);
    assert_eq!(remaining(&mut s, NAME, "acme").await, BUDGET - 1_000);
    assert_eq!(remaining(&mut s, NAME, "globex").await, BUDGET - 1_000);
    // A stream end settles one of acme's holds: its share has room for one more.
    assert_eq!(
        ask(&mut s, "tokens", vec![settle("acme", "r0", 1)]).await,
        OK
    );
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "r-more", 1)]).await,
        OK
    );
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "r-over", 1)]).await,
        OVER
    );
    s.stop().await;
}

/// A budget declared `overdraw: true` with a `reservation:` block (the tokens a response
/// used charged after the fact, into debt if need be): a hold's estimate is decided as a
/// spend, so a denied hold charges nothing. 20 requests holding 3 000 each on 30 000
/// tokens, each using 1 000: 10 held and settled leave 20 000, where every denied hold's
/// estimate stayed charged (-10 000). A settlement beyond its estimate still overdraws.
#[tokio::test]
async fn on_an_overdraw_budget_a_denied_hold_charges_nothing() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/reservations/limits");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    let defaults = "TokensPerTenant:\n  burst: 30000\n  count: 30000\n  period: 1d\n  \
                    overdraw: true\n  reservation: {hold: 10m, unsettled: release}\n";
    let files: Vec<(String, String)> = [
        ("names.yaml", read("names.yaml")),
        ("defaults.yaml", defaults.to_string()),
        ("descriptors.yaml", read("descriptors.yaml")),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_string(), t))
    .collect();
    let table = LimitTable::from_files(&files).expect("the limits load");
    let mut s = Served::with_limits(table).await;
    let mut held = Vec::new();
    for i in 0..20 {
        let id = format!("r{i}");
        match ask(&mut s, "tokens", vec![hold("acme", &id, 3_000)]).await {
            OK => held.push(id),
            code => assert_eq!(code, OVER),
        }
    }
    assert_eq!(held.len(), 10);
    assert_eq!(remaining(&mut s, NAME, "acme").await, 0);
    for id in &held {
        assert_eq!(
            ask(&mut s, "tokens", vec![settle("acme", id, 1_000)]).await,
            OK
        );
    }
    assert_eq!(remaining(&mut s, NAME, "acme").await, 20_000);
    // Used beyond its estimate: charged whatever is left (the budget's overdraw).
    assert_eq!(
        ask(&mut s, "tokens", vec![hold("acme", "big", 3_000)]).await,
        OK
    );
    assert_eq!(
        ask(&mut s, "tokens", vec![settle("acme", "big", 25_000)]).await,
        OK
    );
    assert_eq!(remaining(&mut s, NAME, "acme").await, -5_000);
    s.stop().await;
}
