//! The limits directory: YAML files -> one validated, immutable [`LimitTable`].
//!
//! Files are recognised by name (`.yaml` or `.yml`); hidden entries (editor swap files,
//! Kubernetes ConfigMaps' `..data`) and files of other extensions are skipped:
//!
//! | file | holds |
//! |---|---|
//! | `names.yaml` | user-declared names: `Name: {number, format, description}` |
//! | `defaults.yaml` | `Name: {burst, count, period}`, one per name |
//! | `descriptors.yaml` | Envoy descriptor rules per domain (see [`crate::descriptors`]) |
//! | `quota.yaml` | Envoy RLQS bucket-id rules per domain: as `descriptors.yaml`, keys in any order |
//! | `overrides*.yaml` | a list of `- Name: {burst, count, period, ids: [...]}`, or `unlimited: true` / `deny: true` instead of the three numbers |
//! | any other `*.yaml` with a top-level `domain` | envoyproxy/ratelimit's format (see [`crate::ratelimit_format`]) |
//!
//! Loading is a pure function of the files' contents ([`LimitTable::from_files`]), so a
//! reload is: read, build, swap. Any error rejects the whole load; every error found is
//! reported with its file, entry and reason (and the line, where the YAML parser gives it).
//!
//! The module's files: `build` assembles a table from files' contents, `files` reads a
//! directory (bounded), `raw` is the YAML as written (serde), and this file holds the
//! table and its lookups.

mod build;
mod files;
mod raw;
mod reservation;

use std::fmt;
use std::sync::Arc;

use crate::descriptors::DescriptorRules;
use crate::hash::ConfigMap;
use crate::names::{Name, Names};
use crate::ratelimit_format::RatelimitDomains;
use cellrate_core::gcra::{Limit, Window};
use cellrate_core::text::printable;

use crate::ratelimit_format::RateLimitConfig;
pub use build::read_files;
use files::content_version;
pub use files::is_config_file;
pub use reservation::{Reservation, MAX_HOLD, MIN_HOLD};

/// Errors collected in one load at most; more are counted ("and N more errors").
pub const MAX_ERRORS: usize = 100;

/// The longest reason (or entry name) an error quotes, in characters: errors go to logs and
/// `/healthz`, and must not echo a file's contents.
pub const MAX_QUOTE: usize = 200;

/// The largest limits file, and all files of the directory together.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
pub const MAX_DIR_BYTES: u64 = 64 * 1024 * 1024;

/// The most directory entries read (of any kind).
pub const MAX_DIR_ENTRIES: usize = 1_000;

/// The most override entries in one file, counted while parsing so that YAML aliases
/// cannot expand a small file into millions of entries.
pub const MAX_OVERRIDE_ENTRIES: usize = 500_000;

/// `text` cut to [`MAX_QUOTE`] characters, marked when cut.
fn short(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTE) {
        None => text.to_string(),
        Some((at, _)) => format!("{}... [cut]", &text[..at]),
    }
}

/// What applies to a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Decide with this limit's numbers (and its window kind, which is part of what the
    /// numbers mean), behaving as `behaviour` says.
    Limited { limit: Limit, behaviour: Behaviour },
    /// On the allow list: always allowed, nothing stored.
    Unlimited,
    /// On the deny list: always denied, nothing stored.
    Denied,
}

/// How a limit behaves, apart from its numbers: what a temporary override or a caller's
/// own numbers keep of the configured limit they replace ([`Policy::overridden_by`],
/// `service::resolve`), so that a field added here is carried by those places without
/// a change there. (A [`Limit`] scaled for the Redis store's local fallback keeps its
/// window kind the same way: [`Limit::divided`] replaces the numbers only.)
///
/// ```
/// use cellrate_limits::config::{Behaviour, Policy};
/// use cellrate_core::gcra::Limit;
/// let configured = Policy::Limited {
///     limit: Limit::new(10, 10, 1_000_000_000).unwrap(),
///     behaviour: Behaviour { shadow: true, ..Behaviour::default() },
/// };
/// let raised = Limit::new(100, 100, 1_000_000_000).unwrap();
/// let temporary = Policy::Limited { limit: raised, behaviour: Behaviour::default() };
/// assert_eq!(
///     Policy::overridden_by(Some(configured), temporary),
///     Policy::Limited { limit: raised, behaviour: configured.behaviour() },
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Behaviour {
    /// In shadow mode, Envoy's answers report OK even when the limit denies (the decision
    /// is still made, spent when allowed, and counted).
    pub shadow: bool,
    /// Every spend is recorded, into debt if need be ([`cellrate_core::gcra::charge`]).
    pub overdraw: bool,
    /// What rate-limit headers may say of the limit. The name's own: an override in a file
    /// takes its default's ([`LimitTable::from_files`]), a temporary one keeps it too.
    pub headers: Headers,
}

/// What the rate-limit headers of Envoy's answers say of a limit (`headers` and `measures`
/// in `defaults.yaml`).
///
/// ```
/// use cellrate_limits::config::{Headers, Measures};
/// let shown = Headers::default();
/// assert!(!shown.hidden);
/// assert_eq!(shown.measures, Measures::Requests);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Headers {
    /// `headers: hidden`: never in any rate-limit header, `Retry-After` or
    /// `dynamic_metadata` (an abuse guard tells a client nothing); it still denies.
    pub hidden: bool,
    /// What one token of the limit is, for the OpenAI-style headers' `-requests` and
    /// `-tokens` fields.
    pub measures: Measures,
}

/// What a limit counts (`measures: requests | tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Measures {
    /// Requests (the default): `x-ratelimit-*-requests`.
    #[default]
    Requests,
    /// Tokens of a model API: `x-ratelimit-*-tokens`.
    Tokens,
}

impl Policy {
    /// A limit with the default behaviour (enforced, no debt).
    pub fn limited(limit: Limit) -> Policy {
        Policy::Limited {
            limit,
            behaviour: Behaviour::default(),
        }
    }

    /// The limit's behaviour (the default for unlimited and denied).
    pub fn behaviour(&self) -> Behaviour {
        match self {
            Policy::Limited { behaviour, .. } => *behaviour,
            Policy::Unlimited | Policy::Denied => Behaviour::default(),
        }
    }

    /// What applies while `temporary` overrides `configured`: a temporary limit changes
    /// the numbers, not how the limit behaves. A limit configured `shadow` stays in shadow
    /// mode (raising it in an incident must not start enforcing it), one configured
    /// `overdraw` keeps charging; the whole [`Behaviour`] is kept, whatever it holds.
    /// A temporary `unlimited` or `deny`, or a limit over nothing limited, applies as it is.
    pub fn overridden_by(configured: Option<Policy>, temporary: Policy) -> Policy {
        match (temporary, configured) {
            (Policy::Limited { limit, .. }, Some(Policy::Limited { behaviour, .. })) => {
                Policy::Limited { limit, behaviour }
            }
            (temporary, _) => temporary,
        }
    }

    /// How a bucket under this policy counts (GCRA when nothing is stored).
    pub fn window(&self) -> Window {
        match self {
            Policy::Limited { limit, .. } => limit.window(),
            Policy::Unlimited | Policy::Denied => Window::Gcra,
        }
    }
}

/// One problem found while loading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (name within the directory), or the directory itself.
    pub file: String,
    /// The entry, e.g. `NewOrdersPerAccount` or `entry 3 (NewOrdersPerAccount)`.
    pub entry: Option<String>,
    pub reason: String,
}

/// File names, entries and reasons quote a file's own text (a YAML key, a file name):
/// control characters in them (a CR that would overwrite the line on a terminal, an ESC)
/// are shown escaped, wherever the error is printed (`validate`, logs, a NACK).
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (file, reason) = (printable(&self.file), printable(&self.reason));
        match &self.entry {
            Some(entry) => write!(f, "{file}: {}: {reason}", printable(entry)),
            None => write!(f, "{file}: {reason}"),
        }
    }
}

/// Every problem found in one load; the load as a whole is rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct LoadError(pub Vec<ConfigError>);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// One name's default and overrides.
#[derive(Debug, Clone, Default)]
struct NamePolicies {
    default: Option<Policy>,
    /// override id (canonical) -> policy, and where it was set (an index into the table's
    /// `override_sources`)
    overrides: ConfigMap<Box<str>, (Policy, u32)>,
    /// The name's reservation policy (its default's `reservation:`), for every id.
    reservation: Option<Reservation>,
}

/// What [`LimitTable::lookup`] found: an override (with its source index), a default.
enum Found {
    Override(Policy, u32),
    Default(Policy),
    Nothing,
}

/// Where the policy in force for a bucket comes from (reported by admin `Inspect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The name's entry in defaults.yaml.
    Default,
    /// An override: its file, its entry (counted from 1 in that file) and the id's comment
    /// (cut to 200 characters).
    Override {
        file: Arc<str>,
        entry: u32,
        comment: Option<Arc<str>>,
    },
    /// Neither a default nor an override: the name is not enforced.
    NotConfigured,
}

/// The validated limits: names, defaults and overrides. Immutable; a reload builds a new
/// one and swaps it in.
#[derive(Debug, Clone)]
pub struct LimitTable {
    names: Names,
    /// name number -> its default and overrides: one lookup by number per decision.
    policies: ConfigMap<u32, NamePolicies>,
    /// Where overrides were set: one per override entry, plus one per commented id.
    override_sources: Vec<Source>,
    descriptors: DescriptorRules,
    /// RLQS bucket-id rules (`quota.yaml`): keys matched as a set.
    quota: DescriptorRules,
    /// Domains in envoyproxy/ratelimit's file format.
    ratelimit: RatelimitDomains,
    version: String,
    /// What it was built from: a change to one source rebuilds with the others.
    sources: Sources,
}

/// What a table is built from: the limits directory's files, and the resources received
/// over xDS (`--xds-server`).
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// `(file name, contents)`, in name order.
    pub files: Arc<Vec<(String, String)>>,
    /// envoyproxy/ratelimit's `RateLimitConfig`s, as the control plane sent them.
    pub xds: Arc<Vec<RateLimitConfig>>,
    /// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG: files (and resources) of one domain
    /// in its format are merged instead of refused as duplicates.
    pub merge_domains: bool,
}
impl LimitTable {
    /// A table with the built-in names and no limits.
    pub fn empty() -> LimitTable {
        LimitTable {
            names: Names::builtin(),
            policies: ConfigMap::default(),
            override_sources: Vec::new(),
            descriptors: DescriptorRules::default(),
            quota: DescriptorRules::default(),
            ratelimit: RatelimitDomains::default(),
            version: content_version(&[], &[]),
            sources: Sources::default(),
        }
    }

    /// Where the policy for `canonical_id` under `name` comes from (as [`Self::policy`]
    /// finds it).
    pub fn source(&self, name: &Name, canonical_id: &str) -> Source {
        match self.lookup(name, canonical_id) {
            Found::Override(_, source) => self
                .override_sources
                .get(source as usize)
                .cloned()
                .unwrap_or(Source::NotConfigured),
            Found::Default(_) => Source::Default,
            Found::Nothing => Source::NotConfigured,
        }
    }

    /// The override of `canonical_id` under `name`, else the name's default: the one
    /// lookup that both [`Self::policy`] and [`Self::source`] make.
    fn lookup(&self, name: &Name, canonical_id: &str) -> Found {
        let Some(policies) = self.policies.get(&name.number) else {
            return Found::Nothing;
        };
        if !policies.overrides.is_empty() {
            let override_id = name.format.override_id(canonical_id);
            if let Some(&(policy, source)) = policies.overrides.get(override_id) {
                return Found::Override(policy, source);
            }
        }
        match policies.default {
            Some(policy) => Found::Default(policy),
            None => Found::Nothing,
        }
    }

    /// The names known to this table.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// What applies to `canonical_id` under `name`: its override, else the name's
    /// default, else `None` (not enforced).
    pub fn policy(&self, name: &Name, canonical_id: &str) -> Option<Policy> {
        match self.lookup(name, canonical_id) {
            Found::Override(policy, _) | Found::Default(policy) => Some(policy),
            Found::Nothing => None,
        }
    }

    /// How Envoy descriptors map to names and ids.
    pub fn descriptors(&self) -> &DescriptorRules {
        &self.descriptors
    }

    /// The RLQS bucket-id rules (`quota.yaml`).
    pub fn quota(&self) -> &DescriptorRules {
        &self.quota
    }

    /// The domains configured in envoyproxy/ratelimit's file format.
    pub fn ratelimit(&self) -> &RatelimitDomains {
        &self.ratelimit
    }

    /// What the headers say of `name`'s limits: its default's [`Headers`] (every override
    /// of it, allow and deny lists included, is shown or hidden as its default is).
    pub fn headers(&self, name: &Name) -> Headers {
        self.policies
            .get(&name.number)
            .and_then(|p| p.default)
            .map(|p| p.behaviour().headers)
            .unwrap_or_default()
    }

    /// How a native `Check` with a `request_id` holds an estimate of `name`'s limits:
    /// its default's `reservation:` (every override of the name holds as its default).
    pub fn reservation(&self, name: &Name) -> Option<Reservation> {
        self.policies.get(&name.number).and_then(|p| p.reservation)
    }

    /// The default limit of `name`, if any.
    pub fn default_limit(&self, name: &Name) -> Option<Limit> {
        match self.policies.get(&name.number).and_then(|p| p.default) {
            Some(Policy::Limited { limit, .. }) => Some(limit),
            _ => None,
        }
    }

    /// Number of override ids, over all names.
    pub fn override_count(&self) -> usize {
        self.policies.values().map(|p| p.overrides.len()).sum()
    }

    /// Whether any limit is configured: a domain (in either format) or a name's policy.
    /// envoyproxy/ratelimit's `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` waits for one.
    pub fn has_limits(&self) -> bool {
        !self.ratelimit.is_empty() || !self.descriptors.is_empty() || !self.policies.is_empty()
    }

    /// A short hash of the loaded files' names and contents: equal contents, equal version.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// What this table was built from.
    pub fn sources(&self) -> &Sources {
        &self.sources
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::{CalendarPeriod, SECOND};

    #[test]
    fn an_override_replaces_the_numbers_and_keeps_the_whole_behaviour() {
        let configured = |shadow, overdraw| Policy::Limited {
            limit: Limit::new(10, 10, SECOND).unwrap(),
            behaviour: Behaviour {
                shadow,
                overdraw,
                headers: Headers::default(),
            },
        };
        let raised = Limit::new(100, 100, SECOND).unwrap();
        let monthly = Limit::calendar(1_000, CalendarPeriod::Month).unwrap();
        for (shadow, overdraw) in [(false, false), (true, false), (false, true), (true, true)] {
            for limit in [raised, monthly] {
                let over = Policy::overridden_by(
                    Some(configured(shadow, overdraw)),
                    Policy::limited(limit),
                );
                let behaviour = Behaviour {
                    shadow,
                    overdraw,
                    headers: Headers::default(),
                };
                assert_eq!(over, Policy::Limited { limit, behaviour });
                // The override's window kind is its own (the loader refuses one that
                // differs from the default's: `window_mismatch`).
                assert_eq!(over.window(), limit.window());
            }
            // Unlimited and deny apply as they are; so does a limit over no limit.
            for temporary in [Policy::Unlimited, Policy::Denied] {
                let over = Policy::overridden_by(Some(configured(shadow, overdraw)), temporary);
                assert_eq!(over, temporary);
            }
        }
        for configured in [None, Some(Policy::Unlimited), Some(Policy::Denied)] {
            let over = Policy::overridden_by(configured, Policy::limited(raised));
            assert_eq!(over, Policy::limited(raised));
        }
    }

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect()
    }

    fn load(list: &[(&str, &str)]) -> Result<LimitTable, LoadError> {
        LimitTable::from_files(&files(list))
    }

    /// The one error of a load that must fail, as text.
    fn error(list: &[(&str, &str)]) -> String {
        let errors = load(list).expect_err("load should fail").0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors[0].to_string()
    }

    const DEFAULTS: &str = "
NewRegistrationsPerIPAddress:
  burst: 20
  count: 20
  period: 1s
NewOrdersPerAccount:
  burst: 300
  count: 300
  period: 180m
";

    #[test]
    fn defaults_and_both_override_id_forms() {
        let table = load(&[
            ("defaults.yaml", DEFAULTS),
            (
                "overrides.yaml",
                "
- NewRegistrationsPerIPAddress:
    burst: 20
    count: 40
    period: 1s
    ids:
      - 10.0.0.2
      - 10.0.0.5
- NewOrdersPerAccount:
    burst: 300
    count: 600
    period: 180m
    ids:
      - 12345678
      - id: 87654321
        comment: a big customer
",
            ),
        ])
        .unwrap();
        let names = table.names();
        let ip = names.get("NewRegistrationsPerIPAddress").unwrap();
        let orders = names.get("NewOrdersPerAccount").unwrap();
        let limit = |b, c, p| Some(Policy::limited(Limit::new(b, c, p).unwrap()));
        assert_eq!(table.policy(ip, "10.0.0.2"), limit(20, 40, SECOND));
        assert_eq!(table.policy(ip, "10.0.0.3"), limit(20, 20, SECOND));
        // Where each comes from: the entry (counted from 1), the id's comment.
        let entry = |entry: u32, comment: Option<&str>| Source::Override {
            file: Arc::from("overrides.yaml"),
            entry,
            comment: comment.map(Arc::from),
        };
        assert_eq!(table.source(ip, "10.0.0.2"), entry(1, None));
        assert_eq!(table.source(ip, "10.0.0.3"), Source::Default);
        assert_eq!(table.source(orders, "12345678"), entry(2, None));
        assert_eq!(
            table.source(orders, "87654321"),
            entry(2, Some("a big customer"))
        );
        let unconfigured = names.get("CertificatesPerDomain").unwrap();
        assert_eq!(
            table.source(unconfigured, "example.com"),
            Source::NotConfigured
        );
        assert_eq!(
            table.policy(orders, "87654321"),
            limit(300, 600, 10_800 * SECOND)
        );
        assert_eq!(
            table.policy(orders, "12345678"),
            limit(300, 600, 10_800 * SECOND)
        );
        assert_eq!(table.policy(orders, "1"), limit(300, 300, 10_800 * SECOND));
        let not_configured = names.get("CertificatesPerDomain").unwrap();
        assert_eq!(table.policy(not_configured, "example.com"), None);
        assert_eq!(table.override_count(), 4);
    }

    #[test]
    fn user_names_unlimited_and_deny() {
        let table = load(&[
            (
                "names.yaml",
                "ApiRequestsPerKey: {number: 100, format: string, description: per key}\n",
            ),
            (
                "defaults.yaml",
                "ApiRequestsPerKey: {burst: 10, count: 10, period: 1s}\n",
            ),
            (
                "overrides-lists.yaml",
                "
- ApiRequestsPerKey: {unlimited: true, ids: [key-internal]}
- ApiRequestsPerKey: {deny: true, ids: [{id: key-abuser, comment: ticket 12}]}
",
            ),
        ])
        .unwrap();
        let name = table.names().get("ApiRequestsPerKey").unwrap();
        assert_eq!(
            (name.number, name.format),
            (100, crate::ids::IdFormat::String)
        );
        assert_eq!(table.policy(name, "key-internal"), Some(Policy::Unlimited));
        assert_eq!(table.policy(name, "key-abuser"), Some(Policy::Denied));
        assert!(matches!(
            table.policy(name, "other"),
            Some(Policy::Limited { .. })
        ));
    }

    #[test]
    fn composite_names_are_overridden_by_reg_id() {
        let table = load(&[(
            "overrides.yaml",
            "- CertificatesPerDomainPerAccount: {burst: 5, count: 5, period: 1h, ids: [0042]}\n",
        )])
        .unwrap();
        let name = table
            .names()
            .get("CertificatesPerDomainPerAccount")
            .unwrap();
        assert!(matches!(
            table.policy(name, "42:example.com"),
            Some(Policy::Limited { .. })
        ));
        assert_eq!(table.policy(name, "43:example.com"), None);
    }

    #[test]
    fn overrides_canonicalise_ids() {
        let table = load(&[(
            "overrides.yaml",
            "- NewRegistrationsPerIPAddress: {burst: 1, count: 1, period: 1s, ids: ['2001:0db8:0000::1']}\n",
        )])
        .unwrap();
        let name = table.names().get("NewRegistrationsPerIPAddress").unwrap();
        assert!(table.policy(name, "2001:db8::1").is_some());
    }

    #[test]
    fn empty_files_and_hidden_entries_are_fine() {
        let table = load(&[("defaults.yaml", "# nothing yet\n"), ("overrides.yml", "")]).unwrap();
        assert_eq!(table.override_count(), 0);
        assert!(is_config_file("defaults.yaml"));
        assert!(!is_config_file("..data"));
        assert!(!is_config_file(".defaults.yaml.swp"));
        assert!(!is_config_file("README.md"));
    }

    #[test]
    fn version_follows_content() {
        let a = load(&[("defaults.yaml", DEFAULTS)]).unwrap();
        let b = load(&[("defaults.yaml", DEFAULTS)]).unwrap();
        let c = load(&[("defaults.yaml", "")]).unwrap();
        assert_eq!(a.version(), b.version());
        assert_ne!(a.version(), c.version());
        assert_eq!(a.version().len(), 16);
    }

    #[test]
    fn every_error_names_file_entry_and_reason() {
        let cases: &[(&str, &str, &str)] = &[
            // unknown file
            ("limits.yaml", "", "limits.yaml: unknown limits file"),
            // YAML syntax, with a line
            ("defaults.yaml", "A: [", "defaults.yaml: "),
            // unknown field, with a line
            (
                "defaults.yaml",
                "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s, brust: 2}",
                "unknown field `brust`",
            ),
            // a bucket that would take 250 years to refill (TATs would saturate)
            (
                "defaults.yaml",
                "NewOrdersPerAccount: {burst: 1, count: 1, period: 91250d}",
                "defaults.yaml: NewOrdersPerAccount: a full burst takes 91250 days to refill",
            ),
            // a domain's invalid-id policy
            (
                "descriptors.yaml",
                "edge: {invalid_id: maybe, rules: []}",
                "unknown variant `maybe`, expected one of `reject`, `deny`, `ignore`",
            ),
            (
                "descriptors.yaml",
                "edge: {invalid_ids: deny}",
                "unknown field `invalid_ids`",
            ),
            // unknown name
            (
                "defaults.yaml",
                "NoSuchLimit: {burst: 1, count: 1, period: 1s}",
                "defaults.yaml: NoSuchLimit: unknown limit name \"NoSuchLimit\" (declare it in names.yaml",
            ),
            (
                "defaults.yaml",
                "NewOrderPerAccount: {burst: 1, count: 1, period: 1s}",
                "NewOrderPerAccount: unknown limit name \"NewOrderPerAccount\" (did you mean \"NewOrdersPerAccount\"?)",
            ),
            // non-positive values
            (
                "defaults.yaml",
                "NewOrdersPerAccount: {burst: 0, count: 1, period: 1s}",
                "NewOrdersPerAccount: burst must be at least 1",
            ),
            (
                "defaults.yaml",
                "NewOrdersPerAccount: {burst: 1, count: 0, period: 1s}",
                "count must be at least 1",
            ),
            (
                "defaults.yaml",
                "NewOrdersPerAccount: {burst: 1, count: 1, period: 0s}",
                "period must be positive",
            ),
            (
                "defaults.yaml",
                "NewOrdersPerAccount: {burst: -1, count: 1, period: 1s}",
                "NewOrdersPerAccount.burst: invalid type: integer `-1`, expected u64 at line 1",
            ),
            // bad duration
            (
                "defaults.yaml",
                "NewOrdersPerAccount: {burst: 1, count: 1, period: 1 fortnight}",
                "NewOrdersPerAccount: period: \"1 fortnight\"",
            ),
            // ei == 0
            (
                "defaults.yaml",
                "NewOrdersPerAccount: {burst: 1, count: 2000000000, period: 1s}",
                "emission interval of 0ns",
            ),
            // overflow
            (
                "defaults.yaml",
                "NewOrdersPerAccount: {burst: 9000000000000000000, count: 1, period: 1s}",
                "overflows",
            ),
            // id that does not match the format
            (
                "overrides.yaml",
                "- NewOrdersPerAccount: {burst: 1, count: 1, period: 1s, ids: [abc]}",
                "overrides.yaml: entry 1 (NewOrdersPerAccount): id \"abc\": not an unsigned",
            ),
            (
                "overrides.yaml",
                "- NewRegistrationsPerIPAddress: {burst: 1, count: 1, period: 1s, ids: [10.0.0.300]}",
                "not an IPv4 or IPv6 address",
            ),
            // malformed override entries
            (
                "overrides.yaml",
                "- NewOrdersPerAccount: {burst: 1, period: 1s, ids: [1]}",
                "needs burst, count and period",
            ),
            (
                "overrides.yaml",
                "- NewOrdersPerAccount: {unlimited: true, burst: 1, ids: [1]}",
                "stands alone",
            ),
            (
                "overrides.yaml",
                "- NewOrdersPerAccount: {unlimited: true, deny: true, ids: [1]}",
                "exclude each other",
            ),
            (
                "overrides.yaml",
                "- NewOrdersPerAccount: {unlimited: true, ids: []}",
                "at least one id",
            ),
            (
                "overrides.yaml",
                "- NewOrdersPerAccount: {unlimited: true, ids: [1]}\n  CertificatesPerDomain: {deny: true, ids: [a.com]}",
                "entry 1: an override entry is a map with exactly one limit name, found 2",
            ),
            (
                "overrides.yaml",
                "- NewOrdersPerAccount: {unlimited: true, ids: [{id: 1, note: x}]}",
                "unknown field `note`",
            ),
            (
                "overrides.yaml",
                "- NewOrdersPerAccount: {unlimited: true, ids: [1, 01]}",
                "entry 1 (NewOrdersPerAccount): id \"01\" is already overridden in overrides.yaml entry 1",
            ),
            (
                "overrides.yaml",
                "NewOrdersPerAccount: {unlimited: true}",
                "invalid type: map, expected a list of override entries",
            ),
            // names
            (
                "names.yaml",
                "Mine: {number: 100, format: email}",
                "names.yaml: Mine: unknown id format \"email\"",
            ),
            (
                "names.yaml",
                "Mine: {number: 7, format: string}",
                "Mine: number 7 of \"Mine\" is below 100",
            ),
            (
                "names.yaml",
                "Mine: {number: 100, format: string}\nYours: {number: 100, format: string}",
                "Yours: number 100 of \"Yours\" is already taken by \"Mine\"",
            ),
        ];
        for (file, text, expected) in cases {
            let message = error(&[(file, text)]);
            assert!(
                message.contains(expected),
                "{file} {text:?}\n  gave:     {message}\n  expected: {expected}"
            );
        }
    }

    #[test]
    fn yaml_errors_carry_the_line() {
        let message = error(&[(
            "defaults.yaml",
            "NewOrdersPerAccount:\n  burst: 1\n  count: 1\n  period: 1s\n  extra: 2\n",
        )]);
        assert!(message.contains("unknown field `extra`"), "{message}");
        assert!(message.contains("at line 5 column 3"), "{message}");
    }

    #[test]
    fn all_errors_are_reported_and_nothing_loads() {
        let errors = load(&[
            ("defaults.yaml", "NoSuch: {burst: 1, count: 1, period: 1s}\nNewOrdersPerAccount: {burst: 0, count: 1, period: 1s}"),
            ("overrides.yaml", "- Other: {deny: true, ids: [x]}"),
        ])
        .unwrap_err()
        .0;
        assert_eq!(errors.len(), 3, "{errors:?}");
    }

    #[test]
    fn an_alias_bomb_gives_a_bounded_error_list_of_short_quotes() {
        // 3 000 aliases of one override: 2 999 duplicate-id errors, reported as 100.
        let mut text = String::from("- &o\n  NewOrdersPerAccount: {deny: true, ids: [\"1\"]}\n");
        for _ in 0..3_000 {
            text.push_str("- *o\n");
        }
        let errors = load(&[("overrides.yaml", &text)]).unwrap_err().0;
        assert_eq!(errors.len(), MAX_ERRORS + 1, "capped, plus the count line");
        assert!(
            errors[MAX_ERRORS].reason.starts_with("and ")
                && errors[MAX_ERRORS].reason.ends_with(" more errors"),
            "{}",
            errors[MAX_ERRORS]
        );
        // A file whose contents end up in an error message is quoted briefly.
        let secret = format!("root:{}", "x".repeat(10_000));
        let errors = load(&[("overrides.yaml", &secret)]).unwrap_err().0;
        assert!(
            errors[0].reason.chars().count() <= MAX_QUOTE + 10,
            "{}",
            errors[0]
        );
        assert!(
            !errors[0].reason.contains(&"x".repeat(MAX_QUOTE)),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn a_carriage_return_in_a_file_name_or_an_entry_is_shown_escaped() {
        let errors = load(&[
            ("b\rc.yaml", "x: 1\n"),
            (
                "defaults.yaml",
                "\"New\\rName\": {burst: 1, count: 1, period: 1s}\n",
            ),
        ])
        .unwrap_err()
        .0;
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(shown.iter().all(|e| !e.contains('\r')), "{shown:?}");
        assert!(shown[0].starts_with("b\\u{000D}c.yaml: "), "{shown:?}");
        assert!(
            shown[1].starts_with("defaults.yaml: New\\u{000D}Name: "),
            "{shown:?}"
        );
    }

    #[test]
    fn an_alias_bomb_of_no_known_kind_is_reported_as_unreadable_yaml() {
        // Nine levels of ten aliases each: 10^9 strings if expanded. Refused while parsing,
        // and said so, naming the file (it was "unknown limits file").
        let mut text = String::from("l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..10 {
            let below = format!("*l{}", level - 1);
            let list = [below.as_str(); 10].join(", ");
            text.push_str(&format!("l{level}: &l{level} [{list}]\n"));
        }
        text.push_str("domain: bomb\n");
        let errors = load(&[("bomb.yaml", &text)]).unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        let shown = errors[0].to_string();
        assert!(
            shown.starts_with("bomb.yaml: the YAML could not be read: too many aliases"),
            "{shown}"
        );
    }

    #[test]
    fn override_entries_are_counted_while_parsing() {
        // More entries than allowed (as aliases could produce): refused while parsing.
        let mut text = String::from("- &o\n  NewOrdersPerAccount: {deny: true, ids: [\"1\"]}\n");
        text.push_str(&"- *o\n".repeat(MAX_OVERRIDE_ENTRIES));
        let errors = load(&[("overrides.yaml", &text)]).unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0]
                .reason
                .contains("more than 500000 override entries"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn oversized_files_and_directories_are_refused_by_size() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![b'#'; (MAX_FILE_BYTES + 1) as usize];
        std::fs::write(dir.path().join("overrides.yaml"), big).unwrap();
        let errors = LimitTable::load_dir(dir.path()).unwrap_err().0;
        assert!(errors[0].reason.contains("too large"), "{}", errors[0]);
        // A symlink to some other file is read like any file, and quoted briefly if bad.
        std::fs::remove_file(dir.path().join("overrides.yaml")).unwrap();
        let other = dir.path().join("secret.txt");
        std::fs::write(&other, format!("password: {}", "s".repeat(5_000))).unwrap();
        std::os::unix::fs::symlink(&other, dir.path().join("defaults.yaml")).unwrap();
        let errors = LimitTable::load_dir(dir.path()).unwrap_err().0;
        let text = LoadError(errors).to_string();
        assert!(text.len() < 600, "{text}");
    }

    #[test]
    fn calendar_windows_load_with_their_kind_and_bad_ones_are_refused() {
        use cellrate_core::clock::CalendarPeriod;
        use cellrate_core::gcra::Window;
        let names = ("names.yaml", "Monthly: {number: 150, format: string}");
        let table = load(&[
            names,
            (
                "defaults.yaml",
                "Monthly: {window: calendar, count: 1000000, period: 1mo}",
            ),
            (
                "overrides.yaml",
                "- Monthly: {window: calendar, count: 5, burst: 5, period: 1d, ids: [small]}\n\
                 - Monthly: {window: calendar, count: 7, period: 1mo, timezone: America/New_York, \
                   anchor: 15, ids: [billed]}\n\
                 - Monthly: {window: calendar, count: 3, period: 1w, timezone: Europe/Berlin, \
                   ids: [weekly]}\n",
            ),
        ])
        .unwrap();
        let monthly = table.names().get("Monthly").unwrap();
        let limit = |id| match table.policy(monthly, id) {
            Some(Policy::Limited { limit, .. }) => limit,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            limit("any").window(),
            Window::Calendar(CalendarPeriod::Month)
        );
        assert_eq!(limit("any").count(), 1_000_000);
        assert_eq!(
            limit("small").window(),
            Window::Calendar(CalendarPeriod::Day)
        );
        assert_eq!(limit("small").burst(), 5);
        for (id, text) in [
            ("billed", "1mo~15@America/New_York"),
            ("weekly", "1w@Europe/Berlin"),
        ] {
            match limit(id).window() {
                Window::Calendar(period) => assert_eq!(period.text(), text),
                other => panic!("{other:?}"),
            }
        }

        let defaults = |text| error(&[names, ("defaults.yaml", text)]);
        for (text, says) in [
            (
                "Monthly: {burst: 10, count: 10, period: 1mo}",
                "needs `window: calendar`",
            ),
            (
                "Monthly: {burst: 10, count: 10, period: 1y}",
                "needs `window: calendar`",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 2d}",
                "no calendar period",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 2w}",
                "one of 1s, 1m, 1h, 1d, 1w, 1mo, 1y",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 1mo, timezone: Europe/Berln}",
                "timezone \"Europe/Berln\": no IANA time zone",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 1h, timezone: Asia/Tokyo}",
                "a time zone or anchor applies to a day",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 1mo, anchor: 300}",
                "anchor 300",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 1mo, anchor: 0}",
                "anchor 0",
            ),
            (
                "Monthly: {count: 10, burst: 10, period: 1d, timezone: Asia/Tokyo}",
                "apply to `window: calendar` limits",
            ),
            (
                "Monthly: {window: calendar, count: 10, period: 1mo@UTC, anchor: 3}",
                "not both",
            ),
            (
                "Monthly: {window: calendar, count: 10, burst: 20, period: 1d}",
                "burst 20",
            ),
            ("Monthly: {window: calendar, count: 0, period: 1d}", "count"),
            (
                "Monthly: {window: calender, count: 10, period: 1d}",
                "unknown variant",
            ),
            ("Monthly: {count: 10, period: 1d}", "burst: missing"),
            (
                "Monthly: {window: calendar, count: 9007199254740993, period: 1d}",
                "too large",
            ),
        ] {
            let e = defaults(text);
            assert!(e.contains(says), "{text}: {e}");
            assert!(e.contains("Monthly"), "{text}: {e}");
        }

        // An override counts as its default does; unlimited and deny take no window.
        let calendar = (
            "defaults.yaml",
            "Monthly: {window: calendar, count: 10, period: 1mo}",
        );
        let gcra = (
            "defaults.yaml",
            "Monthly: {burst: 10, count: 10, period: 1d}",
        );
        for (default, over, says) in [
            (
                calendar,
                "{burst: 5, count: 5, period: 1d, ids: [a]}",
                "add `window: calendar`",
            ),
            (
                gcra,
                "{window: calendar, count: 5, period: 1d, ids: [a]}",
                "counts by GCRA",
            ),
            (
                calendar,
                "{window: calendar, unlimited: true, ids: [a]}",
                "not to unlimited",
            ),
        ] {
            let e = error(&[
                names,
                default,
                ("overrides.yaml", &format!("- Monthly: {over}")),
            ]);
            assert!(e.contains(says), "{over}: {e}");
            assert!(e.contains("entry 1 (Monthly)"), "{over}: {e}");
        }

        // RLQS assigns refilling rates: quota.yaml cannot use a calendar limit.
        let e = error(&[
            names,
            calendar,
            (
                "quota.yaml",
                "edge:\n  - match: [{key: tenant}]\n    limits: [Monthly]\n",
            ),
        ]);
        assert!(
            e.contains("quota.yaml: Monthly: counts in calendar windows"),
            "{e}"
        );
    }

    #[test]
    fn user_names_are_usable_across_files_in_any_order() {
        // overrides-a.yaml sorts before names.yaml, yet names load first.
        let table = load(&[
            ("overrides-a.yaml", "- Mine: {deny: true, ids: [x]}"),
            ("names.yaml", "Mine: {number: 150, format: string}"),
        ])
        .unwrap();
        let mine = table.names().get("Mine").unwrap();
        assert_eq!(table.policy(mine, "x"), Some(Policy::Denied));
    }

    #[test]
    fn load_dir_reads_yaml_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("defaults.yaml"), DEFAULTS).unwrap();
        std::fs::write(dir.path().join("README.md"), "not config").unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        let table = LimitTable::load_dir(dir.path()).unwrap();
        let orders = table.names().get("NewOrdersPerAccount").unwrap();
        assert!(table.default_limit(orders).is_some());
        let missing = LimitTable::load_dir(&dir.path().join("nope")).unwrap_err();
        assert!(missing.to_string().contains("cannot read directory"));
    }

    #[test]
    fn headers_and_measures_are_the_names_and_overrides_keep_them() {
        let table = load(&[
            (
                "defaults.yaml",
                "
NewRegistrationsPerIPAddress: {burst: 20, count: 20, period: 1s, headers: hidden}
NewOrdersPerAccount: {burst: 300, count: 300, period: 1m, measures: tokens}
",
            ),
            (
                "overrides.yaml",
                "
- NewRegistrationsPerIPAddress: {burst: 40, count: 40, period: 1s, ids: [10.0.0.2]}
- NewRegistrationsPerIPAddress: {deny: true, ids: [10.0.0.3]}
- NewOrdersPerAccount: {burst: 600, count: 600, period: 1m, ids: [12345678]}
",
            ),
        ])
        .unwrap();
        let ip = table.names().get("NewRegistrationsPerIPAddress").unwrap();
        let orders = table.names().get("NewOrdersPerAccount").unwrap();
        let hidden = Headers {
            hidden: true,
            measures: Measures::Requests,
        };
        let tokens = Headers {
            hidden: false,
            measures: Measures::Tokens,
        };
        assert_eq!(table.headers(ip), hidden);
        assert_eq!(table.headers(orders), tokens);
        let headers = |name, id| table.policy(name, id).unwrap().behaviour().headers;
        assert_eq!(headers(ip, "10.0.0.1"), hidden);
        assert_eq!(
            headers(ip, "10.0.0.2"),
            hidden,
            "a file override keeps them"
        );
        assert_eq!(headers(orders, "12345678"), tokens);
        // A temporary override keeps the whole behaviour, headers too.
        let raised = Policy::limited(Limit::new(9, 9, SECOND).unwrap());
        let temporary = Policy::overridden_by(table.policy(ip, "10.0.0.1"), raised);
        assert_eq!(temporary.behaviour().headers, hidden);
        // Unnamed in headers, not configured: shown, requests.
        let other = table.names().get("CertificatesPerDomain").unwrap();
        assert_eq!(table.headers(other), Headers::default());
    }

    #[test]
    fn bad_headers_and_measures_are_refused_with_file_and_field() {
        let e = error(&[(
            "defaults.yaml",
            "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s, headers: secret}",
        )]);
        assert!(e.starts_with("defaults.yaml: "), "{e}");
        assert!(e.contains("headers") && e.contains("`hidden`"), "{e}");
        let e = error(&[(
            "defaults.yaml",
            "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s, measures: bytes}",
        )]);
        assert!(e.contains("measures") && e.contains("`tokens`"), "{e}");
        let e = error(&[
            (
                "defaults.yaml",
                "NewOrdersPerAccount: {burst: 1, count: 1, period: 1s}",
            ),
            (
                "overrides.yaml",
                "- NewOrdersPerAccount: {burst: 2, count: 2, period: 1s, headers: hidden, ids: [1]}",
            ),
        ]);
        assert!(
            e.starts_with("overrides.yaml: entry 1 (NewOrdersPerAccount): headers and measures"),
            "{e}"
        );
    }

    /// `window: concurrency` loads as a concurrency limit (count leases, period the hold);
    /// what does not apply to leases, and an override of another kind, are refused.
    #[test]
    fn concurrency_limits_load_and_bad_ones_are_refused() {
        use cellrate_core::gcra::Window;
        let names = ("names.yaml", "InFlight: {number: 150, format: string}");
        let table = load(&[
            names,
            (
                "defaults.yaml",
                "InFlight: {window: concurrency, count: 8, period: 30s}",
            ),
            (
                "overrides.yaml",
                "- InFlight: {window: concurrency, count: 32, period: 2m, ids: [big]}\n",
            ),
        ])
        .unwrap();
        let name = table.names().get("InFlight").unwrap();
        for (id, count, hold) in [("any", 8, 30), ("big", 32, 120)] {
            match table.policy(name, id) {
                Some(Policy::Limited { limit, .. }) => {
                    assert_eq!(limit.window(), Window::Concurrency);
                    assert_eq!((limit.count(), limit.period()), (count, hold * SECOND));
                }
                other => panic!("{other:?}"),
            }
        }
        let defaults = |text: &str| error(&[names, ("defaults.yaml", text)]);
        for (text, says) in [
            (
                "{window: concurrency, count: 8, burst: 9, period: 30s}",
                "burst 9",
            ),
            (
                "{window: concurrency, count: 8, period: 30s, overdraw: true}",
                "overdraw",
            ),
            (
                "{window: concurrency, count: 10001, period: 30s}",
                "at most 10000 leases",
            ),
            ("{window: concurrency, count: 8, period: 2d}", "hold"),
            ("{window: concurrency, count: 8, period: 0s}", "period"),
        ] {
            let e = defaults(&format!("InFlight: {text}"));
            assert!(e.contains(says), "{text}: {e}");
        }
        let e = error(&[
            names,
            (
                "defaults.yaml",
                "InFlight: {window: concurrency, count: 8, period: 30s}",
            ),
            (
                "overrides.yaml",
                "- InFlight: {burst: 5, count: 5, period: 1s, ids: [x]}\n",
            ),
        ]);
        assert!(e.contains("a concurrency limit's overrides"), "{e}");
        let e = error(&[
            names,
            (
                "defaults.yaml",
                "InFlight: {window: concurrency, count: 8, period: 30s}",
            ),
            (
                "quota.yaml",
                "edge:\n  - match: [{key: tenant}]\n    limits: [InFlight]\n",
            ),
        ]);
        assert!(
            e.contains("InFlight: is a concurrency limit, which RLQS"),
            "{e}"
        );
    }
}
