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
//! The module's files: `build` assembles a table from files' contents (each file by its
//! kind, every error collected), `entries` adds one file's names, defaults and overrides,
//! `across_files` checks what only the files together can get wrong, `files` reads a
//! directory (bounded), `raw` is the YAML as written (serde), `policy` is what applies to
//! a bucket, and this file holds the table, its errors and its lookups.

mod across_files;
mod build;
mod entries;
mod files;
mod policy;
mod raw;
mod reservation;

use std::fmt;
use std::sync::Arc;

use crate::descriptors::DescriptorRules;
use crate::hash::ConfigMap;
use crate::names::{Name, Names};
use crate::ratelimit_format::RatelimitDomains;
use cellrate_core::gcra::Limit;
use cellrate_core::text::printable;

use crate::ratelimit_format::RateLimitConfig;
pub use build::read_files;
use files::content_version;
pub use files::is_config_file;
pub use policy::{Behaviour, Headers, Measures, Policy};
pub use reservation::{Estimate, Reservation, MAX_HOLD, MIN_HOLD};

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
    /// Whether some reservation policy holds checks of 0 hits (`zero_checks:`): one
    /// flag read per Envoy request instead of a look at every policy.
    zero_checks: bool,
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
            zero_checks: false,
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

    /// Whether some limit's reservation policy holds checks of 0 hits (`zero_checks:`).
    pub fn has_zero_checks(&self) -> bool {
        self.zero_checks
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

/// The module's tests' loads: a table from `(file, text)` pairs, and a load that must fail.
#[cfg(test)]
mod testing {
    use super::{LimitTable, LoadError};

    pub(super) fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect()
    }

    pub(super) fn load(list: &[(&str, &str)]) -> Result<LimitTable, LoadError> {
        LimitTable::from_files(&files(list))
    }

    /// The one error of a load that must fail, as text.
    pub(super) fn error(list: &[(&str, &str)]) -> String {
        let errors = load(list).expect_err("load should fail").0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors[0].to_string()
    }

    pub(super) const DEFAULTS: &str = "
NewRegistrationsPerIPAddress:
  burst: 20
  count: 20
  period: 1s
NewOrdersPerAccount:
  burst: 300
  count: 300
  period: 180m
";
}
