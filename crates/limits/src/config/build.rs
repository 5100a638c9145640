//! A [`LimitTable`] assembled from files' contents: each file parsed by its kind (names
//! first), its entries added (`entries`), the files checked together (`across_files`), and
//! every error collected (up to [`MAX_ERRORS`]) with its file and entry.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use super::files::{content_version, read_dir, FileKind};
use super::raw::{OverrideEntries, RawLimit, RawName};
use super::{short, ConfigError, LimitTable, LoadError, Sources, MAX_ERRORS};
use crate::descriptors::{DescriptorRules, RawDomain};
use crate::hash::ConfigMap;
use crate::names::Names;
use crate::ratelimit_format::{is_ratelimit_file, is_ratelimit_file_named_as_ours};

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
            zero_checks: false,
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
}

/// Parses one file; an empty file (or only comments) is an empty document.
fn parse<T: serde::de::DeserializeOwned + Default>(text: &str) -> Result<T, String> {
    match serde_yaml_ng::from_str::<Option<T>>(text) {
        Ok(value) => Ok(value.unwrap_or_default()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{error, load};
    use crate::config::{Policy, MAX_ERRORS, MAX_QUOTE};

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
}
