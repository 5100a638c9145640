//! Fuzz harnesses: each takes arbitrary bytes, runs one part of cellrate on them and checks
//! what must hold whatever the input (a broken property panics, which the fuzzer reports).
//!
//! The `fuzz/` crate's libFuzzer targets call these, and `tests/it/fuzz_regressions.rs` runs
//! the committed seeds and reproducers (and a bounded batch of random inputs) through the
//! same functions in the normal test suite, so a crash found once stays fixed.
//!
//! | harness                 | input                                           |
//! |-------------------------|-------------------------------------------------|
//! | [`limits_config`]       | four config files, separated by NUL bytes       |
//! | [`id_canonicalisation`] | a format selector byte, then an id              |
//! | [`descriptor_mapping`]  | a domain line, then `key=value` lines           |
//! | [`should_rate_limit`]   | an encoded Envoy `RateLimitRequest` (holds and  |
//! |                         | settlements too: the reservations example)      |
//! | [`check`]               | an encoded `cellrate.v1.CheckRequest` (also run |
//! |                         | as a `RefundRequest`: the same field numbers)   |
//! | [`uds_authority`]       | an HPACK header block (then as raw frames)      |
//! | [`grpc_framing`]        | a size bound, cuts, then a unary call's body    |

use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;

use crate::clock::{FakeClock, SECOND};
use crate::limits::config::LimitTable;
use crate::limits::descriptors::Mapping;
use crate::limits::ids::IdFormat;
use crate::observe::metrics::Metrics;
use crate::proto::v1 as pb;
use crate::proto::v1::rate_limiter_server::RateLimiter;
use crate::service::envoy::{EnvoyOptions, EnvoyRateLimitService, HeaderStyle};
use crate::service::native::RateLimiterService;
use crate::service::Decider;
use crate::store::memory::MemoryStore;
use crate::store::settlements::MemorySettlements;
use crate::store::Store;

mod framing;
mod seeds;
pub use framing::grpc_framing;
pub use seeds::seeds;

/// The example configuration (`config/`), which the decision harnesses decide against.
pub const EXAMPLE_CONFIG: [(&str, &str); 4] = [
    ("names.yaml", include_str!("../../config/names.yaml")),
    ("defaults.yaml", include_str!("../../config/defaults.yaml")),
    (
        "overrides.yaml",
        include_str!("../../config/overrides.yaml"),
    ),
    (
        "descriptors.yaml",
        include_str!("../../config/descriptors.yaml"),
    ),
];

/// The reservations example (`examples/reservations/limits`): domain `tokens`, whose rule
/// holds a descriptor's hits under its `request` entry until they are settled. The Envoy
/// harness decides against the example configuration with these added, so that holds and
/// settlements are fuzzed too.
const RESERVATIONS_CONFIG: [(&str, &str); 3] = [
    (
        "names.yaml",
        include_str!("../../examples/reservations/limits/names.yaml"),
    ),
    (
        "defaults.yaml",
        include_str!("../../examples/reservations/limits/defaults.yaml"),
    ),
    (
        "descriptors.yaml",
        include_str!("../../examples/reservations/limits/descriptors.yaml"),
    ),
];

/// The example configuration with the reservations example's limit and rule (each file's
/// text after the example's: their names, numbers and domain are distinct).
fn example_table_with_reservations() -> Arc<LimitTable> {
    static TABLE: OnceLock<Arc<LimitTable>> = OnceLock::new();
    let files = EXAMPLE_CONFIG.iter().map(|(file, text)| {
        let more = RESERVATIONS_CONFIG.iter().find(|(f, _)| f == file);
        (*file, format!("{text}\n{}", more.map_or("", |(_, t)| t)))
    });
    TABLE
        .get_or_init(|| loaded(files, "the example config with reservations"))
        .clone()
}

/// The example configuration as a table.
pub fn example_table() -> Arc<LimitTable> {
    static TABLE: OnceLock<Arc<LimitTable>> = OnceLock::new();
    let files = EXAMPLE_CONFIG.iter().map(|(f, t)| (*f, t.to_string()));
    TABLE
        .get_or_init(|| loaded(files, "the example config"))
        .clone()
}

/// The table of `files`, which are the project's own and must load.
fn loaded<'a>(files: impl Iterator<Item = (&'a str, String)>, what: &str) -> Arc<LimitTable> {
    let files: Vec<(String, String)> = files.map(|(f, t)| (f.to_string(), t)).collect();
    match LimitTable::from_files(&files) {
        Ok(table) => Arc::new(table),
        Err(e) => panic!("{what} does not load: {e}"),
    }
}

/// Every id format, in selector order.
pub const FORMATS: [IdFormat; 8] = [
    IdFormat::IpAddress,
    IdFormat::Ipv6RangeCidr,
    IdFormat::RegId,
    IdFormat::Domain,
    IdFormat::FqdnSet,
    IdFormat::String,
    IdFormat::RegIdFqdn,
    IdFormat::RegIdRegisteredDomain,
];

/// The config loader on four files (names, defaults, overrides, descriptors) cut from
/// `data` at NUL bytes. Holds: a rejected config says at least one non-empty reason, each
/// naming its file; an accepted one loads again to the same version, and answers lookups
/// for every name and every example descriptor.
pub fn limits_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let files: Vec<(String, String)> = text
        .split('\0')
        .zip(EXAMPLE_CONFIG.iter())
        .map(|(part, (file, _))| (file.to_string(), part.to_string()))
        .collect();
    match LimitTable::from_files(&files) {
        Err(error) => {
            assert!(!error.0.is_empty(), "a rejected config gives no reason");
            for e in &error.0 {
                assert!(!e.reason.is_empty(), "an empty reason in {e:?}");
                assert!(
                    files.iter().any(|(f, _)| *f == e.file),
                    "an error names no file: {e:?}"
                );
            }
            assert!(!error.to_string().is_empty());
        }
        Ok(table) => {
            let again = LimitTable::from_files(&files).expect("loads once, not twice");
            assert_eq!(table.version(), again.version());
            for name in table.names().iter() {
                let _ = table.default_limit(name);
                let _ = table.policy(name, "1");
            }
            let names = table.names();
            for domain in ["edge", "", "api"] {
                for entries in [
                    &[("remote_address", "192.0.2.1")][..],
                    &[("generic_key", "signup"), ("remote_address", "192.0.2.1")],
                    &[("api_key", "k")],
                ] {
                    if let Mapping::Limits { names: found, .. } =
                        table.descriptors().map(names, domain, entries)
                    {
                        assert!(!found.is_empty());
                        for n in found {
                            assert!(names.get(n).is_some(), "a rule maps to unknown {n:?}");
                        }
                    }
                }
            }
        }
    }
}

/// Id canonicalisation: the first byte picks the format, the rest (as UTF-8, as gRPC
/// delivers strings) is the id. Holds: the borrowing and owning paths agree; a canonical
/// id is its own canonical form (except `fqdnSet`, whose canonical form is a hash: 64
/// lowercase hex digits, the same for the list reversed); a bucket key parses back.
pub fn id_canonicalisation(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(id) = std::str::from_utf8(rest) else {
        return;
    };
    let format = FORMATS[usize::from(selector) % FORMATS.len()];
    let owned = format.canonicalize(id);
    let borrowed = format.canonicalize_cow(id);
    match (&owned, &borrowed) {
        (Ok(a), Ok(b)) => assert_eq!(a, b.as_ref(), "{format}: {id:?}"),
        (Err(_), Err(_)) => {}
        _ => panic!("{format}: {id:?}: owned {owned:?}, borrowed {borrowed:?}"),
    }
    let Ok(canonical) = owned else {
        return;
    };
    assert!(
        !canonical.is_empty(),
        "{format}: {id:?} is canonically empty"
    );
    if format == IdFormat::FqdnSet {
        assert_eq!(canonical.len(), 64, "{id:?}");
        assert!(canonical
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        let reversed: Vec<&str> = id.split(',').rev().collect();
        assert_eq!(
            format.canonicalize(&reversed.join(",")).as_deref(),
            Ok(canonical.as_str()),
            "{id:?} reversed"
        );
    } else {
        assert_eq!(
            format.canonicalize(&canonical).as_deref(),
            Ok(canonical.as_str()),
            "{format}: {id:?} -> {canonical:?} is not stable"
        );
    }
    let key = crate::limits::names::BucketKey::new(7, &canonical);
    assert_eq!(key.parts(), (7, canonical.as_str()));
    // Overrides name the same bucket through their own format (fqdnSet overrides list
    // domains, which hash: nothing to compare there).
    if format != IdFormat::FqdnSet {
        let override_id = format.override_id(&canonical);
        assert_eq!(
            format
                .override_format()
                .canonicalize(override_id)
                .as_deref(),
            Ok(override_id),
            "{format}: {canonical:?}"
        );
    }
}

/// Descriptor mapping against the example rules: the first line is the domain, each
/// further line `key=value` is an entry. Holds: a mapping names at least one limit, all
/// declared; a single-entry descriptor named after a limit (and matched by no rule of the
/// domain) maps with its value as the id.
pub fn descriptor_mapping(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let domain = lines.next().unwrap_or_default();
    let entries: Vec<(&str, &str)> = lines
        .take(32)
        .map(|line| line.split_once('=').unwrap_or((line, "")))
        .collect();
    let table = example_table();
    let names = table.names();
    match table.descriptors().map(names, domain, &entries) {
        Mapping::Limits { names: found, id } => {
            assert!(!found.is_empty(), "{domain:?} {entries:?}");
            for n in found {
                assert!(names.get(n).is_some(), "maps to undeclared {n:?}");
            }
            if let ([(key, value)], [only]) = (&entries[..], found) {
                if **only == **key {
                    assert_eq!(id, *value);
                }
            }
        }
        Mapping::Leases { names: found, .. } | Mapping::Reservations { names: found, .. } => {
            assert!(!found.is_empty(), "{domain:?} {entries:?}");
        }
        Mapping::Unmatched => {
            if let [(key, _)] = entries[..] {
                assert!(
                    names.get(key).is_none(),
                    "{key:?} is a limit name, yet unmatched"
                );
            }
        }
    }
}

/// A fresh decider on the example config and an empty memory store at a fixed time.
fn fresh() -> (Arc<Decider>, Arc<MemoryStore>, Arc<Metrics>) {
    fresh_with(example_table())
}

fn fresh_with(table: Arc<LimitTable>) -> (Arc<Decider>, Arc<MemoryStore>, Arc<Metrics>) {
    static METRICS: OnceLock<Arc<Metrics>> = OnceLock::new();
    let clock = Arc::new(FakeClock::new(1_700_000_000 * SECOND));
    let store = Arc::new(MemoryStore::with_capacity(clock, 4, 4096));
    let limits = Arc::new(ArcSwap::new(table));
    let decider = Arc::new(Decider::new(limits, store.clone() as Arc<dyn Store>));
    (decider, store, METRICS.get_or_init(Metrics::new).clone())
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime");
    }
    RUNTIME.with(|rt| rt.block_on(future))
}

/// What every refusal must look like: INVALID_ARGUMENT with a message that says where
/// (`field: reason`), and nothing written to the store.
fn assert_clean_refusal(status: &tonic::Status, store: &MemoryStore) {
    assert_eq!(
        status.code(),
        tonic::Code::InvalidArgument,
        "{}",
        status.message()
    );
    assert!(
        status.message().contains(": "),
        "the message does not say where: {:?}",
        status.message()
    );
    assert_eq!(store.live_buckets(), 0, "a refused request wrote buckets");
}

/// Envoy's `ShouldRateLimit` on protobuf bytes, through the service a client reaches
/// (every header style, so every response path runs), against the example config with
/// the reservations example's domain (`tokens`), reservations kept in a table of 64.
/// Holds: one status per descriptor; a refusal is a clean INVALID_ARGUMENT; an OVER_LIMIT
/// answer (no shadow in the example config) spent nothing, since the store was empty and
/// the batch is all-or-nothing, and kept no hold; at most one hold is kept. When a hold
/// was kept, the same request as its settlement (every descriptor `is_negative_hits`)
/// answers OK, and so does that settlement replayed, which changes nothing.
pub fn should_rate_limit(data: &[u8]) {
    let Ok(request) = RateLimitRequest::decode(data) else {
        return;
    };
    let headers = <HeaderStyle as clap::ValueEnum>::value_variants();
    let style = headers[data.len() % headers.len()];
    let (decider, store, metrics) = fresh_with(example_table_with_reservations());
    let clock = Arc::new(FakeClock::new(1_700_000_000 * SECOND));
    let settlements = Arc::new(MemorySettlements::new(clock, 60 * SECOND, 64));
    let service = EnvoyRateLimitService::new(
        decider.clone(),
        EnvoyOptions {
            headers: style,
            ..EnvoyOptions::default()
        },
        metrics,
    )
    .with_settlements(settlements.clone());
    let ask = |request: RateLimitRequest| {
        let descriptors = request.descriptors.len();
        let answer = block_on(service.should_rate_limit(tonic::Request::new(request)));
        answer.map(|response| {
            let response = response.into_inner().into_response();
            assert_eq!(response.statuses.len(), descriptors);
            response
        })
    };
    let mut settle = request.clone();
    let response = match ask(request) {
        Err(status) => {
            assert_clean_refusal(&status, &store);
            assert!(settlements.is_empty(), "a refused request kept a hold");
            return;
        }
        Ok(response) => response,
    };
    let over = response.overall_code == Code::OverLimit as i32;
    assert!(over || response.overall_code == Code::Ok as i32);
    assert_eq!(
        over,
        response
            .statuses
            .iter()
            .any(|s| s.code == Code::OverLimit as i32),
        "the overall code disagrees with the statuses"
    );
    if over {
        assert_eq!(store.live_buckets(), 0, "a denied batch spent");
        assert!(settlements.is_empty(), "a denied request kept a hold");
    }
    assert!(
        settlements.len() <= 1,
        "one request kept more than one hold"
    );
    if settlements.len() == 1 && !settle.descriptors.iter().all(|d| d.is_negative_hits) {
        for d in &mut settle.descriptors {
            d.is_negative_hits = true;
        }
        // The hold's bucket: the rule's limit, keyed by its first entry (the tenant).
        let tenant = settle.descriptors[0].entries[0].value.clone();
        let spec = crate::service::ItemSpec::named("TokensPerTenant", &tenant);
        let remaining = || {
            let peeked = block_on(decider.inspect(std::slice::from_ref(&spec)));
            peeked.expect("the held bucket peeks").items[0]
                .decision
                .remaining
        };
        let (buckets, held) = (store.live_buckets(), remaining());
        for round in ["settled", "replayed"] {
            match ask(settle.clone()) {
                Ok(r) => assert_eq!(r.overall_code, Code::Ok as i32, "{round}: {r:?}"),
                Err(status) => panic!("the hold's settlement ({round}) failed: {status:?}"),
            }
            assert_eq!(
                store.live_buckets(),
                buckets,
                "{round}: buckets made or lost"
            );
            // Settled at its own estimate: nothing to give back or take, once or twice.
            assert_eq!(remaining(), held, "{round}: the balance moved");
        }
    }
}

/// The native `Check`, then the same bytes as a `Refund`, on protobuf bytes. Holds: one
/// decision per item and an overall one; headers only when asked for, a few; a refusal is a
/// clean INVALID_ARGUMENT; a denied batch spent nothing but its charges (the store was
/// empty); a refused refund changes nothing, a refund creates no bucket, and refunding what
/// an allowed check spent leaves every limited bucket full again (`remaining` = burst) and
/// reports it reset (`reset_after` = 0).
pub fn check(data: &[u8]) {
    let Ok(request) = pb::CheckRequest::decode(data) else {
        return;
    };
    let (decider, store, metrics) = fresh();
    // As `serve` builds it: Checks with a request id are kept for `Settle`.
    let clock = Arc::new(FakeClock::new(1_700_000_000 * SECOND));
    let settlements = Arc::new(MemorySettlements::new(clock, 60 * SECOND, 64));
    let service = RateLimiterService::new(decider, metrics).with_settlements(settlements);
    let (items, headers) = (request.items.len(), request.headers);
    // Charges are recorded even in a denied batch (they always count): at most one bucket
    // each.
    let charges = request
        .items
        .iter()
        .filter(|item| item.mode == pb::Mode::Charge as i32)
        .count();
    let mut allowed = false;
    match block_on(service.check(tonic::Request::new(request))) {
        Err(status) => assert_clean_refusal(&status, &store),
        Ok(response) => {
            let response = response.into_inner();
            assert_eq!(response.items.len(), items);
            let most = if headers == 0 { 0 } else { 8 }; // IETF: 2 + Retry-After; OpenAI: 6 + 2
            assert!(response.headers.len() <= most, "{:?}", response.headers);
            let overall = response.overall.expect("an overall decision");
            allowed = overall.allowed;
            if !allowed {
                assert!(
                    store.live_buckets() <= charges,
                    "a denied batch spent more than its charges"
                );
            }
        }
    }
    let Ok(refund) = pb::RefundRequest::decode(data) else {
        return;
    };
    let before = store.live_buckets();
    match block_on(service.refund(tonic::Request::new(refund))) {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert_eq!(
                store.live_buckets(),
                before,
                "a refused refund changed buckets"
            );
        }
        Ok(response) => {
            let response = response.into_inner();
            assert!(response.overall.is_some());
            assert!(store.live_buckets() <= before, "a refund created buckets");
            if allowed {
                for (i, d) in response.items.iter().enumerate() {
                    if d.policy != pb::Policy::Limited as i32 {
                        continue;
                    }
                    let burst = d.limit.as_ref().map_or(0, |l| l.burst);
                    assert_eq!(
                        u64::try_from(d.remaining).ok(),
                        Some(burst),
                        "items[{i}] not full after refunding what was spent: {d:?}"
                    );
                    let reset = d.reset_after.unwrap_or_default();
                    assert_eq!((reset.seconds, reset.nanos), (0, 0), "items[{i}]: {d:?}");
                }
            }
        }
    }
}

/// A harness: bytes in, panics when a property breaks.
pub type Harness = fn(&[u8]);

/// An HTTP/2 header block through the Unix socket's `:authority` rewriting
/// (`server/uds_authority.rs`): never a panic; what passes decodes to the same fields.
pub fn uds_authority(data: &[u8]) {
    crate::server::uds_authority::fuzz(data);
}

/// The harnesses by target name (the `fuzz/` targets and seed directories use these names).
pub const TARGETS: [(&str, Harness); 7] = [
    ("limits_config", limits_config),
    ("id_canonicalisation", id_canonicalisation),
    ("descriptor_mapping", descriptor_mapping),
    ("should_rate_limit", should_rate_limit),
    ("check", check),
    ("uds_authority", uds_authority),
    ("grpc_framing", grpc_framing),
];
