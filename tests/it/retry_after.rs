//! `Retry-After` that says when a retry is likely to pass (#60, item 7): a full
//! concurrency key after leases were seen released, a held budget after holds were seen
//! settled, are told the typical time left (at least 1 s), never longer than the store's
//! bound (the oldest lease's expiry, the bucket's refill), which stands while nothing is
//! learned. Through Envoy's RLS and the native API over real gRPC, on the served fake
//! clock (the learned durations are timed on its monotonic reading: its advances, plus the
//! few real milliseconds between calls).

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use crate::common::settle::settle;
use crate::common::{item, nanos, Served, T0};
use crate::envoy_leases::{lease, release};
use cellrate::clock::{FakeClock, Nanos, SECOND};
use cellrate::gcra::{Limit, Mode};
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::service::{Decider, ItemSpec, Target};
use cellrate::store::MemoryStore;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

const OVER: i32 = Code::OverLimit as i32;

/// examples/concurrency: 8 leases a tenant, held at most 35 s.
fn leases_example() -> LimitTable {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/concurrency/limits");
    LimitTable::load_dir(&dir).expect("the example loads")
}

async fn ask(s: &mut Served, descriptors: Vec<RateLimitDescriptor>) -> RateLimitResponse {
    s.envoy
        .should_rate_limit(RateLimitRequest {
            domain: "inflight".to_string(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .expect("ShouldRateLimit succeeds")
        .into_inner()
}

fn retry_after(r: &RateLimitResponse) -> Option<i64> {
    let h = r.response_headers_to_add.iter();
    let mut found = h.filter(|h| h.key.eq_ignore_ascii_case("retry-after"));
    found
        .next()
        .map(|h| h.value.parse().expect("whole seconds"))
}

/// `tenant`'s leases `from..to`, each taken (and with `held`, released after it).
async fn leases(s: &mut Served, tenant: &str, ids: std::ops::Range<u32>, held: Option<Nanos>) {
    for i in ids.clone() {
        let r = ask(s, vec![lease(tenant, &format!("{tenant}-{i}"))]).await;
        assert_ne!(r.overall_code, OVER, "{tenant}-{i}");
    }
    if let Some(held) = held {
        s.clock.advance(held);
        for i in ids {
            ask(s, vec![release(tenant, &format!("{tenant}-{i}"))]).await;
        }
    }
}

/// Leases seen held 5 s: a key full since 1 s is told 5 s (4 s left, and the milliseconds
/// between the calls, rounded up), where main told 34 s (the oldest lease's expiry);
/// before four were seen, the hold stands.
#[tokio::test]
async fn a_full_key_after_short_leases_is_told_the_typical_time_left_not_the_hold() {
    let mut s = Served::with_limits(leases_example()).await;
    // Three seen: not yet learned, the bound (the oldest lease's expiry, 35 s) stands.
    leases(&mut s, "acme", 0..3, Some(5 * SECOND)).await;
    leases(&mut s, "acme", 10..18, None).await;
    let full = ask(&mut s, vec![lease("acme", "late")]).await;
    assert_eq!(full.overall_code, OVER);
    assert_eq!(retry_after(&full), Some(35), "3 leases seen: the hold");
    for i in 10..18 {
        ask(&mut s, vec![release("acme", &format!("acme-{i}"))]).await;
    }
    // Eight more seen, held 5 s each: learned.
    leases(&mut s, "acme", 20..28, Some(5 * SECOND)).await;
    leases(&mut s, "acme", 30..38, None).await;
    s.clock.advance(SECOND);
    let full = ask(&mut s, vec![lease("acme", "late")]).await;
    assert_eq!(full.overall_code, OVER);
    let told = retry_after(&full).expect("a Retry-After");
    assert!(
        (4..=5).contains(&told),
        "told {told} s where the hold is 35 s"
    );
    s.stop().await;
}

/// Tokens: 10 000 an hour (0.36 s a token), holds of 10 minutes given back unsettled.
fn budget() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("names.yaml"),
        "Tokens: {number: 100, format: string}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("defaults.yaml"),
        "Tokens: {burst: 10000, count: 10000, period: 1h, \
           reservation: {hold: 10m, unsettled: release}}\n",
    )
    .unwrap();
    dir
}

/// A held Check of 1 000 tokens under `id`: its answer.
async fn hold(s: &mut Served, id: &str) -> pb::CheckResponse {
    s.decisions
        .check(pb::CheckRequest {
            items: vec![item("Tokens", "acme", Some(1_000))],
            request_id: id.to_string(),
            headers: pb::HeaderStyle::Draft03 as i32,
        })
        .await
        .expect("the Check succeeds")
        .into_inner()
}

fn header(r: &pb::CheckResponse, name: &str) -> Option<String> {
    let mut found = r.headers.iter().filter(|h| h.name == name);
    found.next().map(|h| h.value.clone())
}

/// Holds of 1 000 tokens seen settled at 100 after 0.3 s: the held Check the budget
/// cannot take is told 1 s (the floor: the typical hold is shorter), where main told the
/// 286 s until 800 tokens refill; a retry after it passes once a hold was settled. With
/// no hold settled for a while, the refill's time stands again.
#[tokio::test]
async fn a_held_budget_after_quick_settlements_is_told_a_second_not_its_refill() {
    let dir = budget();
    let mut s = Served::with_limits(LimitTable::load_dir(dir.path()).unwrap()).await;
    let mut c = s.decisions.clone();
    // Nothing learned: the bucket's own time.
    let mut n = 0;
    while hold(&mut s, &format!("fill-{n}"))
        .await
        .overall
        .unwrap()
        .allowed
    {
        n += 1;
    }
    assert_eq!(n, 10);
    let denied = hold(&mut s, "over").await;
    let bound = nanos(&denied.items[0].retry_after);
    assert!(bound > 300 * SECOND, "nothing learned: the refill, {bound}");
    for i in 0..4 {
        s.clock.advance(SECOND / 10);
        settle(&mut c, &format!("fill-{i}"), &[100]).await.unwrap();
    }
    // Four quick ones more, seen opened to settled in 0.3 s.
    for i in 0..4 {
        assert!(
            hold(&mut s, &format!("quick-{i}"))
                .await
                .overall
                .unwrap()
                .allowed
        );
        s.clock.advance(3 * SECOND / 10);
        settle(&mut c, &format!("quick-{i}"), &[100]).await.unwrap();
    }
    while hold(&mut s, &format!("fill-{n}"))
        .await
        .overall
        .unwrap()
        .allowed
    {
        n += 1;
    }
    let denied = hold(&mut s, "over-2").await;
    assert!(!denied.overall.as_ref().unwrap().allowed);
    assert_eq!(nanos(&denied.items[0].retry_after), SECOND);
    assert_eq!(header(&denied, "Retry-After").as_deref(), Some("1"));
    // Likely to pass by then: a hold is settled, and a second later the retry passes.
    settle(&mut c, &format!("fill-{}", n - 1), &[100])
        .await
        .unwrap();
    s.clock.advance(SECOND);
    assert!(hold(&mut s, "retried").await.overall.unwrap().allowed);
    // No hold settled for 11 s: the bucket's own time again.
    s.clock.advance(11 * SECOND);
    let denied = hold(&mut s, "over-3").await;
    assert!(!denied.overall.as_ref().unwrap().allowed);
    assert!(nanos(&denied.items[0].retry_after) > 100 * SECOND);
    s.stop().await;
}

/// What another tenant's leases do to a victim's hint: held to the end of their hold, the
/// hint is never longer than the bound; released at once, it is 1 s (the floor), and the
/// victim who comes back then is denied again, told 1 s again: harmless.
#[tokio::test]
async fn another_tenant_cannot_lengthen_the_hint_and_only_shortens_it_to_a_second() {
    let mut s = Served::with_limits(leases_example()).await;
    // mallory holds her leases 34 s of the 35 s hold.
    leases(&mut s, "mallory", 0..8, Some(34 * SECOND)).await;
    leases(&mut s, "acme", 0..8, None).await;
    s.clock.advance(SECOND);
    let full = ask(&mut s, vec![lease("acme", "late")]).await;
    let told = retry_after(&full).expect("a Retry-After");
    assert!(
        told <= 34,
        "at most the oldest lease's expiry, 34 s: {told}"
    );
    for i in 0..8 {
        ask(&mut s, vec![release("acme", &format!("acme-{i}"))]).await;
    }
    // mallory releases 32 leases at once: the last 32 durations are all hers, ~0.
    for round in 0..4 {
        leases(&mut s, "mallory", round * 8..round * 8 + 8, Some(0)).await;
    }
    leases(&mut s, "acme", 10..18, None).await;
    s.clock.advance(SECOND);
    let full = ask(&mut s, vec![lease("acme", "late")]).await;
    assert_eq!(retry_after(&full), Some(1), "never under a second");
    s.clock.advance(SECOND);
    let again = ask(&mut s, vec![lease("acme", "late")]).await;
    assert_eq!(again.overall_code, OVER, "denied again, nothing taken");
    assert_eq!(retry_after(&again), Some(1));
    s.stop().await;
}

/// The learned table holds configured names only: leases of caller-given limits and of
/// a thousand tenants of one configured name make one entry.
#[tokio::test]
async fn the_learned_table_is_bounded_by_the_configured_names() {
    let clock = Arc::new(FakeClock::new(T0));
    let table = leases_example();
    let configured = table.names().iter().count();
    let decider = Decider::new(
        Arc::new(arc_swap::ArcSwap::from_pointee(table)),
        Arc::new(MemoryStore::new(clock.clone())),
    )
    .with_clock(clock.clone());
    let inline = Limit::concurrency(1, 35 * SECOND).unwrap();
    for n in 0..1_000 {
        let (key, tenant) = (format!("inline-{n}"), format!("tenant-{n}"));
        let items = [
            ItemSpec {
                target: Target::Inline {
                    key: Cow::Borrowed(&key),
                    limit: inline,
                },
                mode: Mode::Acquire,
                lease: Some(Cow::Borrowed("l")),
                ..ItemSpec::named("", "")
            },
            ItemSpec {
                mode: Mode::Acquire,
                lease: Some(Cow::Borrowed("l")),
                ..ItemSpec::named("InFlightPerTenant", &tenant)
            },
        ];
        assert!(decider.check(&items).await.unwrap().overall.allowed);
        clock.advance(SECOND / 100);
        let released: Vec<ItemSpec> = (items.iter().cloned())
            .map(|i| ItemSpec {
                mode: Mode::Release,
                ..i
            })
            .collect();
        decider.check(&released).await.unwrap();
    }
    let learned = decider.retry_hints().names();
    assert_eq!(learned, 1, "InFlightPerTenant alone");
    assert!(learned <= configured);
}
