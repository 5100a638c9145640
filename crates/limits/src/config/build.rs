//! A [`LimitTable`] assembled from files' contents: each file parsed by its kind, each entry
//! validated, every error collected (up to [`MAX_ERRORS`]) with its file and entry.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use super::files::{content_version, read_dir, FileKind};
use super::raw::{OverrideEntries, OverrideEntry, RawLimit, RawName, RawWindow};
use super::{
    short, Behaviour, ConfigError, LimitTable, LoadError, Policy, Source, Sources, MAX_ERRORS,
};
use crate::descriptors::{DescriptorRules, RawDomain};
use crate::hash::ConfigMap;
use crate::ids::IdFormat;
use crate::names::Names;
use crate::ratelimit_format::{is_ratelimit_file, is_ratelimit_file_named_as_ours};
use cellrate_core::gcra::Window;

/// The YAML files of a limits directory, in name order. `missing_ok`: a directory that
/// does not exist holds no files (limits may come from xDS alone).
pub fn read_files(dir: &Path, missing_ok: bool) -> Result<Vec<(String, String)>, LoadError> {
    if missing_ok && !dir.exists() {
        return Ok(Vec::new());
    }
    read_dir(dir).map_err(|reason| {
        LoadError(vec![ConfigError {
            file: dir.display().to_string(),
            entry: None,
            reason,
        }])
    })
}

/// Keeps one error of `file` (quoted short), or counts it as suppressed past
/// [`MAX_ERRORS`].
fn record(
    errors: &mut Vec<ConfigError>,
    suppressed: &mut usize,
    file: &str,
    entry: Option<String>,
    reason: String,
) {
    if errors.len() >= MAX_ERRORS {
        *suppressed += 1;
        return;
    }
    errors.push(ConfigError {
        file: short(file),
        entry: entry.as_deref().map(short),
        reason: short(&reason),
    })
}

/// Each file with its kind, in the order they are read (names first); a file of no kind
/// is an error.
fn kinds<'f>(
    files: &'f [(String, String)],
    errors: &mut Vec<ConfigError>,
) -> Vec<(FileKind, &'f str, &'f str)> {
    let mut kinds = Vec::new();
    for (file, text) in files {
        if let Some(kind) = FileKind::of(file) {
            // envoyproxy/ratelimit's files can have any name, one of ours too.
            let kind = match is_ratelimit_file_named_as_ours(text) {
                true => FileKind::Ratelimit,
                false => kind,
            };
            kinds.push((kind, file.as_str(), text.as_str()));
            continue;
        }
        // Any other file with a top-level `domain`: envoyproxy/ratelimit's format.
        let reason = match is_ratelimit_file(text) {
            Ok(true) => {
                kinds.push((FileKind::Ratelimit, file, text));
                continue;
            }
            Ok(false) => "unknown limits file: expected names.yaml, defaults.yaml, \
                          overrides*.yaml, descriptors.yaml, quota.yaml, or a file in \
                          envoyproxy/ratelimit's format (a top-level domain)"
                .to_string(),
            Err(why) => format!("the YAML could not be read: {why}"),
        };
        if errors.len() < MAX_ERRORS {
            errors.push(ConfigError {
                file: short(file),
                entry: None,
                reason,
            });
        }
    }
    kinds.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    kinds
}

impl LimitTable {
    /// Loads a limits directory.
    pub fn load_dir(dir: &Path) -> Result<LimitTable, LoadError> {
        LimitTable::from_sources(Sources {
            files: Arc::new(read_files(dir, false)?),
            ..Sources::default()
        })
    }

    /// Builds a table from `(file name, contents)` pairs, as found in a directory.
    pub fn from_files(files: &[(String, String)]) -> Result<LimitTable, LoadError> {
        LimitTable::from_sources(Sources {
            files: Arc::new(files.to_vec()),
            ..Sources::default()
        })
    }

    /// Builds a table from files and xDS resources (envoyproxy/ratelimit's
    /// `RateLimitConfig`, each read as a file in that format would be, and named
    /// `xds:<resource name>` in errors).
    pub fn from_sources(sources: Sources) -> Result<LimitTable, LoadError> {
        let files = &sources.files[..];
        let mut errors = Vec::new();
        let kinds = kinds(files, &mut errors);

        let mut table = LimitTable {
            names: Names::builtin(),
            policies: ConfigMap::default(),
            override_sources: Vec::new(),
            descriptors: DescriptorRules::default(),
            quota: DescriptorRules::default(),
            ratelimit: crate::ratelimit_format::RatelimitDomains::merging(sources.merge_domains),
            version: content_version(files, &sources.xds),
            sources: sources.clone(),
        };
        // Where each override id was set, to name both places of a duplicate.
        let mut override_origin: HashMap<(u32, String), String> = HashMap::new();
        let mut suppressed = 0usize;
        for (kind, file, text) in kinds {
            let mut report = |entry: Option<String>, reason: String| {
                record(&mut errors, &mut suppressed, file, entry, reason)
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
                FileKind::Ratelimit => table.ratelimit.add_file(text, &mut report),
            }
        }
        for config in sources.xds.iter() {
            let file = format!("xds:{}", config.name);
            table.ratelimit.add_xds(config, &mut |entry, reason| {
                record(&mut errors, &mut suppressed, &file, entry, reason)
            });
        }
        for error in table.across_files() {
            if errors.len() < MAX_ERRORS {
                errors.push(error);
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
            let reservation = match limit.reservation.as_ref().map(|r| r.build()) {
                Some(Err(reason)) => {
                    report(Some(text), reason);
                    continue;
                }
                Some(Ok(_)) if limit.window == RawWindow::Concurrency => {
                    report(
                        Some(text),
                        "reservation applies to a budget (gcra or calendar), not to \
                         `window: concurrency` (whose leases expire by themselves)"
                            .to_string(),
                    );
                    continue;
                }
                Some(Ok(r)) => Some(r),
                None => None,
            };
            match limit.build() {
                Ok(policy) => {
                    let entry = self.policies.entry(number).or_default();
                    entry.default = Some(policy);
                    entry.reservation = reservation;
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
                // Shown or hidden, requests or tokens, as the name's default.
                Ok(Policy::Limited { limit, behaviour }) => Policy::Limited {
                    limit,
                    behaviour: Behaviour {
                        headers: self.headers(&name),
                        ..behaviour
                    },
                },
                Ok(policy) => policy,
                Err(reason) => {
                    report(Some(at(&text)), reason);
                    continue;
                }
            };
            if let Some(reason) = self.window_mismatch(name.number, &policy) {
                report(Some(at(&text)), reason);
                continue;
            }
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

    /// Why an override (from a file, or temporary) cannot count as `policy` does: its
    /// name's default counts the other way (GCRA against calendar windows), or the name
    /// is used in `quota.yaml` and `policy` counts in calendar windows. An override
    /// without `window` on a calendar default would otherwise silently become a
    /// refilling rate.
    pub fn window_mismatch(&self, number: u32, policy: &Policy) -> Option<String> {
        let Policy::Limited { limit: over, .. } = policy else {
            return None;
        };
        if let (Window::Calendar(_) | Window::Concurrency, Some(name)) =
            (over.window(), self.names.by_number(number))
        {
            if self.quota.names().any(|used| used == &*name.text) {
                return Some(format!(
                    "{} is used in quota.yaml, and RLQS cannot assign calendar windows \
                     or concurrency limits",
                    name.text
                ));
            }
        }
        let Some(Policy::Limited { limit, .. }) = self.policies.get(&number)?.default else {
            return None;
        };
        match (limit.window(), over.window()) {
            (Window::Calendar(period), Window::Gcra) => Some(format!(
                "the default counts in calendar windows ({period}): an override counts the \
                 same way (add `window: calendar`)"
            )),
            (Window::Gcra, Window::Calendar(_)) => Some(
                "the default counts by GCRA: an override counts the same way \
                 (leave out `window: calendar`, or make the default a calendar limit)"
                    .to_string(),
            ),
            (Window::Concurrency, w) | (w, Window::Concurrency) if w != Window::Concurrency => {
                Some(
                    "a concurrency limit's overrides are concurrency limits, and a rate's are \
                     rates (`window: concurrency` on both, or on neither)"
                        .to_string(),
                )
            }
            _ => None,
        }
    }

    /// What is wrong only when the files are taken together: a domain in both
    /// `descriptors.yaml` and envoyproxy/ratelimit's format, a calendar limit in
    /// `quota.yaml`.
    fn across_files(&self) -> Vec<ConfigError> {
        let mut errors: Vec<ConfigError> = self
            .ratelimit
            .domains()
            .filter(|domain| self.descriptors.has_domain(domain))
            .map(|domain| ConfigError {
                file: "descriptors.yaml".to_string(),
                entry: Some(short(domain)),
                reason: "this domain is also configured in envoyproxy/ratelimit's format: \
                         one file decides a domain"
                    .to_string(),
            })
            .collect();
        errors.sort_by(|a, b| a.entry.cmp(&b.entry));
        errors.extend(self.lease_rule_errors());
        for (name, reason) in self.calendar_quota_names() {
            errors.push(ConfigError {
                file: "quota.yaml".to_string(),
                entry: Some(name),
                reason,
            });
        }
        errors
    }

    /// Descriptor rules that do not fit their limits: a rule with a `lease` entry maps only
    /// to concurrency limits, and a concurrency limit only through such a rule (a spend of
    /// it would be refused on every request).
    fn lease_rule_errors(&self) -> Vec<ConfigError> {
        let concurrency = |text: &str| {
            let number = self.names.get(text).map(|n| n.number);
            let policies = number.and_then(|n| self.policies.get(&n));
            policies.is_some_and(|p| {
                (p.default.iter())
                    .chain(p.overrides.values().map(|(policy, _)| policy))
                    .any(|policy| policy.window() == Window::Concurrency)
            })
        };
        let mut errors = Vec::new();
        for (domain, rule, names, lease) in self.descriptors.rules() {
            let Some(wrong) = names.iter().find(|n| concurrency(n) != lease) else {
                continue;
            };
            errors.push(ConfigError {
                file: "descriptors.yaml".to_string(),
                entry: Some(format!("{} rule {rule}", short(domain))),
                reason: match lease {
                    true => format!(
                        "{wrong} is not a concurrency limit (window: concurrency), \
                         and this rule has a lease entry"
                    ),
                    false => format!(
                        "{wrong} is a concurrency limit: name the entry that carries the \
                         lease id (`lease: KEY`, e.g. the request's x-request-id)"
                    ),
                },
            });
        }
        errors.sort_by(|a, b| a.entry.cmp(&b.entry));
        errors
    }

    /// Why `quota.yaml` cannot use a name: a limit of it counts in calendar windows or is a
    /// concurrency limit, which an RLQS token-bucket assignment cannot express.
    fn calendar_quota_names(&self) -> Vec<(String, String)> {
        let mut found = Vec::new();
        for text in self.quota.names() {
            let Some(name) = self.names.get(text) else {
                continue;
            };
            let Some(policies) = self.policies.get(&name.number) else {
                continue;
            };
            let calendar = policies
                .default
                .iter()
                .chain(policies.overrides.values().map(|(policy, _)| policy))
                .any(|policy| matches!(policy.window(), Window::Calendar(_)));
            let concurrency = policies
                .default
                .iter()
                .chain(policies.overrides.values().map(|(policy, _)| policy))
                .any(|policy| policy.window() == Window::Concurrency);
            if (calendar || concurrency) && !found.iter().any(|(t, _)| t == text) {
                found.push((
                    text.to_string(),
                    if concurrency {
                        "is a concurrency limit, which RLQS cannot assign (Envoy's quota \
                         buckets refill as token buckets): use it through Check"
                    } else {
                        "counts in calendar windows, which RLQS cannot assign (Envoy's \
                         quota buckets refill as token buckets): use it through ShouldRateLimit"
                    }
                    .to_string(),
                ));
            }
        }
        found
    }

    fn add_source(&mut self, source: Source) -> u32 {
        self.override_sources.push(source);
        u32::try_from(self.override_sources.len() - 1).unwrap_or(u32::MAX)
    }
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
