//! The limits directory: YAML files -> one validated, immutable [`LimitTable`].
//!
//! Files are recognised by name (`.yaml` or `.yml`); hidden entries (editor swap files,
//! Kubernetes ConfigMaps' `..data`) and files of other extensions are skipped:
//!
//! | file | holds |
//! |---|---|
//! | `names.yaml` | user-declared names: `Name: {number, format, description}` |
//! | `defaults.yaml` | `Name: {burst, count, period}`, one per name |
//! | `descriptors.yaml` | Envoy descriptor rules per domain (see [`crate::limits::descriptors`]) |
//! | `quota.yaml` | Envoy RLQS bucket-id rules per domain: as `descriptors.yaml`, keys in any order |
//! | `overrides*.yaml` | a list of `- Name: {burst, count, period, ids: [...]}`, or `unlimited: true` / `deny: true` instead of the three numbers |
//!
//! Loading is a pure function of the files' contents ([`LimitTable::from_files`]), so a
//! reload is: read, build, swap. Any error rejects the whole load; every error found is
//! reported with its file, entry and reason (and the line, where the YAML parser gives it).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::clock::Nanos;
use crate::gcra::Limit;
use crate::limits::descriptors::{DescriptorRules, RawDomain};
use crate::limits::hash::ConfigMap;
use crate::limits::names::{IdFormat, Name, Names};

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
    /// Decide with this limit. In shadow mode, Envoy's answers report OK even when the
    /// limit denies (the decision is still made, spent when allowed, and counted).
    Limited { limit: Limit, shadow: bool },
    /// On the allow list: always allowed, nothing stored.
    Unlimited,
    /// On the deny list: always denied, nothing stored.
    Denied,
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

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.entry {
            Some(entry) => write!(f, "{}: {}: {}", self.file, entry, self.reason),
            None => write!(f, "{}: {}", self.file, self.reason),
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
    version: String,
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
            version: content_version(&[]),
        }
    }

    /// Loads a limits directory.
    pub fn load_dir(dir: &Path) -> Result<LimitTable, LoadError> {
        let files = read_dir(dir).map_err(|reason| {
            LoadError(vec![ConfigError {
                file: dir.display().to_string(),
                entry: None,
                reason,
            }])
        })?;
        LimitTable::from_files(&files)
    }

    /// Builds a table from `(file name, contents)` pairs, as found in a directory.
    pub fn from_files(files: &[(String, String)]) -> Result<LimitTable, LoadError> {
        let mut errors = Vec::new();
        let mut kinds: Vec<(FileKind, &str, &str)> = Vec::new();
        for (file, text) in files {
            match FileKind::of(file) {
                Some(kind) => kinds.push((kind, file, text)),
                None if errors.len() >= MAX_ERRORS => {}
                None => errors.push(ConfigError {
                    file: short(file),
                    entry: None,
                    reason: "unknown limits file: expected names.yaml, defaults.yaml, \
                             overrides*.yaml, descriptors.yaml or quota.yaml"
                        .to_string(),
                }),
            }
        }
        kinds.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));

        let mut table = LimitTable {
            names: Names::builtin(),
            policies: ConfigMap::default(),
            override_sources: Vec::new(),
            descriptors: DescriptorRules::default(),
            quota: DescriptorRules::default(),
            version: content_version(files),
        };
        // Where each override id was set, to name both places of a duplicate.
        let mut override_origin: HashMap<(u32, String), String> = HashMap::new();
        let mut suppressed = 0usize;
        for (kind, file, text) in kinds {
            let mut report = |entry: Option<String>, reason: String| {
                if errors.len() >= MAX_ERRORS {
                    suppressed += 1;
                    return;
                }
                errors.push(ConfigError {
                    file: short(file),
                    entry: entry.as_deref().map(short),
                    reason: short(&reason),
                })
            };
            match kind {
                FileKind::Names => match parse::<BTreeMap<String, RawName>>(text) {
                    Ok(raw) => table.add_names(raw, &mut report),
                    Err(reason) => report(None, reason),
                },
                FileKind::Defaults => match parse::<BTreeMap<String, RawLimit>>(text) {
                    Ok(raw) => table.add_defaults(raw, &mut report),
                    Err(reason) => report(None, reason),
                },
                FileKind::Overrides => match parse::<OverrideEntries>(text) {
                    Ok(raw) => table.add_overrides(file, raw.0, &mut override_origin, &mut report),
                    Err(reason) => report(None, reason),
                },
                FileKind::Descriptors => match parse::<BTreeMap<String, RawDomain>>(text) {
                    Ok(raw) => {
                        table.descriptors = DescriptorRules::build(raw, &table.names, &mut report)
                    }
                    Err(reason) => report(None, reason),
                },
                FileKind::Quota => match parse::<BTreeMap<String, RawDomain>>(text) {
                    Ok(raw) => {
                        table.quota =
                            DescriptorRules::build_unordered(raw, &table.names, &mut report)
                    }
                    Err(reason) => report(None, reason),
                },
            }
        }
        if suppressed > 0 {
            errors.push(ConfigError {
                file: "(all files)".to_string(),
                entry: None,
                reason: format!("and {suppressed} more errors"),
            });
        }
        if errors.is_empty() {
            Ok(table)
        } else {
            Err(LoadError(errors))
        }
    }

    fn add_names(
        &mut self,
        raw: BTreeMap<String, RawName>,
        report: &mut impl FnMut(Option<String>, String),
    ) {
        // Declared in number order, so that errors do not depend on map order.
        let mut raw: Vec<_> = raw.into_iter().collect();
        raw.sort_by_key(|(_, name)| name.number);
        for (text, name) in raw {
            let Some(format) = IdFormat::from_config(&name.format) else {
                report(
                    Some(text),
                    format!(
                        "unknown id format {:?} (one of {})",
                        name.format,
                        IdFormat::CONFIG_NAMES
                    ),
                );
                continue;
            };
            if let Err(e) = self
                .names
                .declare(&text, name.number, format, name.description)
            {
                report(Some(text), e.to_string());
            }
        }
    }

    fn add_defaults(
        &mut self,
        raw: BTreeMap<String, RawLimit>,
        report: &mut impl FnMut(Option<String>, String),
    ) {
        for (text, limit) in raw {
            let Some(name) = self.names.get(&text) else {
                report(Some(text.clone()), unknown_name(&self.names, &text));
                continue;
            };
            let number = name.number;
            match limit.build() {
                Ok(policy) => {
                    self.policies.entry(number).or_default().default = Some(policy);
                }
                Err(reason) => report(Some(text), reason),
            }
        }
    }

    fn add_overrides(
        &mut self,
        file: &str,
        raw: Vec<OverrideEntry>,
        origin: &mut HashMap<(u32, String), String>,
        report: &mut impl FnMut(Option<String>, String),
    ) {
        for (index, OverrideEntry(entry)) in raw.into_iter().enumerate() {
            let at = |text: &str| format!("entry {} ({text})", index + 1);
            if entry.len() != 1 {
                report(
                    Some(format!("entry {}", index + 1)),
                    format!(
                        "an override entry is a map with exactly one limit name, found {}",
                        entry.len()
                    ),
                );
                continue;
            }
            let Some((text, over)) = entry.into_iter().next() else {
                continue;
            };
            let Some(name) = self.names.get(&text).cloned() else {
                report(Some(at(&text)), unknown_name(&self.names, &text));
                continue;
            };
            let policy = match over.policy() {
                Ok(policy) => policy,
                Err(reason) => {
                    report(Some(at(&text)), reason);
                    continue;
                }
            };
            if over.ids.is_empty() {
                report(Some(at(&text)), "ids must list at least one id".to_string());
            }
            let file: Arc<str> = Arc::from(file);
            let entry = u32::try_from(index + 1).unwrap_or(u32::MAX);
            let mut entry_source = None;
            for id in over.ids {
                let format = name.format.override_format();
                let canonical = match format.canonicalize(&id.id) {
                    Ok(canonical) => canonical,
                    Err(e) => {
                        report(Some(at(&text)), format!("{e} (format {format})"));
                        continue;
                    }
                };
                let here = format!("{file} {}", at(&text));
                if let Some(first) = origin.get(&(name.number, canonical.clone())) {
                    report(
                        Some(at(&text)),
                        format!("id {:?} is already overridden in {first}", id.id),
                    );
                    continue;
                }
                origin.insert((name.number, canonical.clone()), here);
                let source = match id.comment {
                    Some(comment) => self.add_source(Source::Override {
                        file: file.clone(),
                        entry,
                        comment: Some(Arc::from(short(&comment))),
                    }),
                    None => *entry_source.get_or_insert_with(|| {
                        self.add_source(Source::Override {
                            file: file.clone(),
                            entry,
                            comment: None,
                        })
                    }),
                };
                self.policies
                    .entry(name.number)
                    .or_default()
                    .overrides
                    .insert(canonical.into_boxed_str(), (policy, source));
            }
        }
    }

    fn add_source(&mut self, source: Source) -> u32 {
        self.override_sources.push(source);
        u32::try_from(self.override_sources.len() - 1).unwrap_or(u32::MAX)
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

    /// A short hash of the loaded files' names and contents: equal contents, equal version.
    pub fn version(&self) -> &str {
        &self.version
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum FileKind {
    // Order matters: names are declared before defaults and overrides use them.
    Names,
    Defaults,
    Overrides,
    Descriptors,
    Quota,
}

impl FileKind {
    fn of(file: &str) -> Option<FileKind> {
        let stem = file
            .strip_suffix(".yaml")
            .or_else(|| file.strip_suffix(".yml"))?;
        match stem {
            "names" => Some(FileKind::Names),
            "defaults" => Some(FileKind::Defaults),
            "descriptors" => Some(FileKind::Descriptors),
            "quota" => Some(FileKind::Quota),
            _ if stem.starts_with("overrides") => Some(FileKind::Overrides),
            _ => None,
        }
    }
}

/// Whether a directory entry is a limits file candidate: YAML and not hidden.
pub fn is_config_file(file_name: &str) -> bool {
    !file_name.starts_with('.') && (file_name.ends_with(".yaml") || file_name.ends_with(".yml"))
}

/// Reads every YAML file of `dir`, following symlinks (ConfigMaps link each file to
/// `..data/<file>`), in name order.
fn read_dir(dir: &Path) -> Result<Vec<(String, String)>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read directory: {e}"))?;
    let mut files = Vec::new();
    let mut total = 0u64;
    for (seen, entry) in entries.enumerate() {
        if seen >= MAX_DIR_ENTRIES {
            return Err(format!(
                "more than {MAX_DIR_ENTRIES} directory entries: is this the limits directory?"
            ));
        }
        let entry = entry.map_err(|e| format!("cannot read directory: {e}"))?;
        let file_name = short(&entry.file_name().to_string_lossy());
        if !is_config_file(&file_name) {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks; a dangling link or a directory named *.yaml is an error.
        let size = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => meta.len(),
            Ok(_) => return Err(format!("{file_name}: not a regular file")),
            Err(e) => return Err(format!("{file_name}: {e}")),
        };
        total += size;
        if size > MAX_FILE_BYTES || total > MAX_DIR_BYTES {
            return Err(format!(
                "{file_name}: too large ({size} bytes; at most {MAX_FILE_BYTES} per file and \
                 {MAX_DIR_BYTES} in all)"
            ));
        }
        // Read at most one byte past the bound, in case the file grew since `metadata`.
        let mut text = String::new();
        std::fs::File::open(&path)
            .and_then(|f| {
                std::io::Read::read_to_string(
                    &mut std::io::Read::take(f, MAX_FILE_BYTES + 1),
                    &mut text,
                )
            })
            .map_err(|e| format!("{file_name}: cannot read: {e}"))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(format!(
                "{file_name}: too large (at most {MAX_FILE_BYTES} bytes)"
            ));
        }
        files.push((file_name, text));
    }
    files.sort();
    Ok(files)
}

fn content_version(files: &[(String, String)]) -> String {
    let mut sorted: Vec<_> = files.iter().collect();
    sorted.sort();
    let mut hash = Sha256::new();
    for (name, text) in sorted {
        hash.update((name.len() as u64).to_le_bytes());
        hash.update(name.as_bytes());
        hash.update((text.len() as u64).to_le_bytes());
        hash.update(text.as_bytes());
    }
    hex::encode(&hash.finalize()[..8])
}

/// An unknown name in a config file: a close known name if there is one, else how to
/// declare a new one.
fn unknown_name(names: &Names, text: &str) -> String {
    match names.closest(text) {
        Some(_) => names.unknown(text),
        None => format!(
            "{} (declare it in names.yaml, with a number >= 100)",
            names.unknown(text)
        ),
    }
}

/// Parses one file; an empty file (or only comments) is an empty document.
fn parse<T: serde::de::DeserializeOwned + Default>(text: &str) -> Result<T, String> {
    match serde_yaml_ng::from_str::<Option<T>>(text) {
        Ok(value) => Ok(value.unwrap_or_default()),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawName {
    number: u32,
    format: String,
    #[serde(default)]
    description: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    burst: u64,
    count: u64,
    period: String,
    #[serde(default)]
    shadow: bool,
}

impl RawLimit {
    fn build(&self) -> Result<Policy, String> {
        let period = parse_duration(&self.period).map_err(|e| format!("period: {e}"))?;
        let limit = Limit::new(self.burst, self.count, period).map_err(|e| e.to_string())?;
        Ok(Policy::Limited {
            limit,
            shadow: self.shadow,
        })
    }
}

/// An overrides file's entries, at most [`MAX_OVERRIDE_ENTRIES`] of them.
#[derive(Debug, Default)]
struct OverrideEntries(Vec<OverrideEntry>);

/// One entry: a map that should hold exactly one limit name, kept as its pairs (a
/// `BTreeMap` would allocate a whole node, over a kilobyte, per entry).
#[derive(Debug)]
struct OverrideEntry(Vec<(String, RawOverride)>);

impl<'de> Deserialize<'de> for OverrideEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs;
        impl<'de> Visitor<'de> for Pairs {
            type Value = OverrideEntry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from one limit name to its override")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::with_capacity(1);
                while let Some(pair) = map.next_entry()? {
                    if pairs.len() == 16 {
                        return Err(de::Error::custom("an override entry with over 16 keys"));
                    }
                    pairs.push(pair);
                }
                Ok(OverrideEntry(pairs))
            }
        }
        deserializer.deserialize_map(Pairs)
    }
}

impl<'de> Deserialize<'de> for OverrideEntries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = OverrideEntries;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of override entries")
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = seq.next_element()? {
                    if entries.len() == MAX_OVERRIDE_ENTRIES {
                        return Err(de::Error::custom(format!(
                            "more than {MAX_OVERRIDE_ENTRIES} override entries"
                        )));
                    }
                    entries.push(entry);
                }
                Ok(OverrideEntries(entries))
            }
        }
        deserializer.deserialize_seq(Entries)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    burst: Option<u64>,
    count: Option<u64>,
    period: Option<String>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    deny: bool,
    #[serde(default)]
    shadow: bool,
    #[serde(default)]
    ids: Vec<IdEntry>,
}

impl RawOverride {
    fn policy(&self) -> Result<Policy, String> {
        let numbers = [
            self.burst.is_some(),
            self.count.is_some(),
            self.period.is_some(),
        ];
        match (self.unlimited, self.deny, numbers) {
            (false, false, [true, true, true]) => RawLimit {
                burst: self.burst.unwrap_or_default(),
                count: self.count.unwrap_or_default(),
                period: self.period.clone().unwrap_or_default(),
                shadow: self.shadow,
            }
            .build(),
            _ if self.shadow => Err("shadow applies to a limit, not to unlimited or deny".into()),
            (true, false, [false, false, false]) => Ok(Policy::Unlimited),
            (false, true, [false, false, false]) => Ok(Policy::Denied),
            (true, true, _) => Err("unlimited and deny exclude each other".to_string()),
            (true, false, _) | (false, true, _) => {
                Err("unlimited or deny stands alone: leave out burst, count and period".to_string())
            }
            (false, false, _) => {
                Err("an override needs burst, count and period (or unlimited/deny)".to_string())
            }
        }
    }
}

/// An override id: a plain scalar (the seed's form; numbers allowed, since YAML reads
/// `12345678` as one) or `{id, comment}` (Boulder's current form).
#[derive(Debug)]
struct IdEntry {
    id: String,
    /// `{id, comment}`'s comment: for people, and reported by admin `Inspect`.
    comment: Option<String>,
}

impl<'de> Deserialize<'de> for IdEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<IdEntry, D::Error> {
        struct IdVisitor;

        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Detailed {
            id: IdEntry,
            #[serde(default)]
            comment: Option<String>,
        }

        impl<'de> Visitor<'de> for IdVisitor {
            type Value = IdEntry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an id (string or number) or {id: ..., comment: ...}")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<IdEntry, E> {
                Ok(IdEntry {
                    id: v.to_string(),
                    comment: None,
                })
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<IdEntry, E> {
                Ok(IdEntry {
                    id: v.to_string(),
                    comment: None,
                })
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<IdEntry, E> {
                Ok(IdEntry {
                    id: v.to_string(),
                    comment: None,
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<IdEntry, A::Error> {
                let detailed = Detailed::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(IdEntry {
                    id: detailed.id.id,
                    comment: detailed.comment,
                })
            }
        }

        deserializer.deserialize_any(IdVisitor)
    }
}

/// Parses a Go-style duration (`1s`, `500ms`, `180m`, `1h30m`, `1.5h`) plus `d` for days,
/// into exact nanoseconds.
///
/// ```
/// use cellrate::limits::config::parse_duration;
/// assert_eq!(parse_duration("1h30m"), Ok(5_400_000_000_000));
/// assert_eq!(parse_duration("1.5s"), Ok(1_500_000_000));
/// assert!(parse_duration("10").is_err()); // a unit is required
/// ```
pub fn parse_duration(text: &str) -> Result<Nanos, String> {
    if text.is_empty() {
        return Err("empty duration (write e.g. 1s, 500ms, 180m, 1h30m, 7d)".to_string());
    }
    if text.starts_with('-') {
        return Err(format!("{text:?} is negative"));
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let int_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int_part, after) = rest.split_at(int_end);
        rest = after;
        let mut frac = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let frac_end = after_dot
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after_dot.len());
            (frac, rest) = after_dot.split_at(frac_end);
        }
        if int_part.is_empty() && frac.is_empty() {
            return Err(format!("{text:?}: expected a number before {rest:?}"));
        }
        if int_part.len() > 19 || frac.len() > 18 {
            return Err(format!("{text:?}: number too long"));
        }
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let (unit, after) = rest.split_at(unit_end);
        rest = after;
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "" => return Err(format!("{text:?}: missing unit (ns, us, ms, s, m, h, d)")),
            other => {
                return Err(format!(
                    "{text:?}: unknown unit {other:?} (ns, us, ms, s, m, h, d)"
                ))
            }
        };
        let int_value: i128 = if int_part.is_empty() {
            0
        } else {
            int_part
                .parse()
                .map_err(|_| format!("{text:?}: bad number"))?
        };
        let mut value = int_value * scale;
        if !frac.is_empty() {
            let frac_value: i128 = frac.parse().map_err(|_| format!("{text:?}: bad number"))?;
            let denominator = 10i128.pow(frac.len() as u32);
            let scaled = frac_value * scale;
            if scaled % denominator != 0 {
                return Err(format!("{text:?} is finer than a nanosecond"));
            }
            value += scaled / denominator;
        }
        total += value;
        if total > i64::MAX as i128 {
            return Err(format!("{text:?} is longer than 64-bit nanoseconds allow"));
        }
    }
    Ok(total as Nanos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SECOND;

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
    fn durations() {
        let ok = |t: &str| parse_duration(t).unwrap();
        assert_eq!(ok("1s"), SECOND);
        assert_eq!(ok("500ms"), SECOND / 2);
        assert_eq!(ok("180m"), 180 * 60 * SECOND);
        assert_eq!(ok("1h30m"), 90 * 60 * SECOND);
        assert_eq!(ok("7d"), 7 * 86_400 * SECOND);
        assert_eq!(ok("1.5h"), 90 * 60 * SECOND);
        assert_eq!(ok(".5s"), SECOND / 2);
        assert_eq!(ok("10ns"), 10);
        assert_eq!(ok("3us"), 3_000);
        assert_eq!(ok("3µs"), 3_000);
        assert_eq!(ok("1m0.000000001s"), 60 * SECOND + 1);
        assert_eq!(ok("0s"), 0);
        for bad in [
            "",
            "10",
            "1x",
            "-1s",
            "s",
            "1.5ns",
            "1..5s",
            "99999999999999999999d",
            "300000d",
            "1 s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }

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
        let limit = |b, c, p| {
            Some(Policy::Limited {
                limit: Limit::new(b, c, p).unwrap(),
                shadow: false,
            })
        };
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
        assert_eq!((name.number, name.format), (100, IdFormat::String));
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
}
