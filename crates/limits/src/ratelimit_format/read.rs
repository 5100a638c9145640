//! Reading envoyproxy/ratelimit's YAML: the raw shape of a file (its fields and refusals
//! exactly as there) and the reader that turns a file's root into a matching tree, every
//! problem reported with the entry it is in.

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};
use std::fmt;
use std::sync::Arc;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::wildcards::{Wildcards, MAX_SCANNED};
use super::{Level, Node, RateLimit, RatelimitDomains, Unit, MAX_DEPTH, MAX_DESCRIPTORS};

/// A file's root.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoot {
    #[serde(default, deserialize_with = "scalar")]
    pub(super) domain: String,
    #[serde(default)]
    pub(super) descriptors: Vec<RawDescriptor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDescriptor {
    #[serde(default, deserialize_with = "scalar")]
    pub(super) key: String,
    #[serde(default, deserialize_with = "scalar")]
    pub(super) value: String,
    #[serde(default)]
    pub(super) rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    pub(super) descriptors: Vec<RawDescriptor>,
    #[serde(default)]
    pub(super) shadow_mode: bool,
    #[serde(default)]
    pub(super) quota_mode: bool,
    #[serde(default)]
    pub(super) detailed_metric: bool,
    #[serde(default)]
    pub(super) value_to_metric: bool,
    #[serde(default)]
    pub(super) share_threshold: bool,
    /// Returned to Envoy in dynamic metadata (RESPONSE_DYNAMIC_METADATA).
    #[serde(default)]
    pub(super) metadata: Option<serde_yaml_ng::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRateLimit {
    #[serde(default)]
    pub(super) requests_per_unit: u32,
    #[serde(default, deserialize_with = "scalar")]
    pub(super) unit: String,
    #[serde(default)]
    pub(super) unlimited: bool,
    #[serde(default, deserialize_with = "scalar")]
    pub(super) name: String,
    #[serde(default)]
    pub(super) replaces: Vec<RawReplaces>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReplaces {
    #[serde(default, deserialize_with = "scalar")]
    pub(super) name: String,
}

/// Any YAML scalar as text (envoyproxy/ratelimit's YAML reads `value: 200` as "200").
fn scalar<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    struct Scalar;
    impl Visitor<'_> for Scalar {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_unit<E: de::Error>(self) -> Result<String, E> {
            Ok(String::new())
        }
    }
    deserializer.deserialize_any(Scalar)
}

/// Whether a file's text is in this format: a YAML map with a top-level `domain`. `Err`:
/// why its YAML cannot be read (so that an alias bomb, refused here cheaply, is reported
/// as that rather than as a file of no known kind).
pub fn is_ratelimit_file(text: &str) -> Result<bool, String> {
    is_ratelimit_yaml(text, false)
}

/// Whether a file named as one of cellrate's own (`quota.yaml`, `names.yaml`, ...) is in
/// fact envoyproxy/ratelimit's: a top-level `domain` whose value is text, which none of
/// cellrate's files has (their top-level keys map to tables or lists). Upstream's users
/// may well have a `quota.yaml`.
pub fn is_ratelimit_file_named_as_ours(text: &str) -> bool {
    // Most of cellrate's files (an overrides file may be large) are never parsed twice.
    text.lines().any(|l| l.starts_with("domain:")) && is_ratelimit_yaml(text, true) == Ok(true)
}

fn is_ratelimit_yaml(text: &str, text_domain: bool) -> Result<bool, String> {
    match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) {
        Ok(serde_yaml_ng::Value::Mapping(map)) => Ok(match map.get("domain") {
            Some(serde_yaml_ng::Value::String(_)) => true,
            Some(_) => !text_domain,
            None => false,
        }),
        Ok(_) => Ok(false),
        Err(e) => {
            let e = e.to_string();
            // serde_yaml_ng's words for aliases that expand beyond its bound.
            if e.contains("repetition limit exceeded") {
                Err(format!("too many aliases ({e})"))
            } else {
                Err(e)
            }
        }
    }
}

/// Reading one file: where its descriptors are counted and errors gathered.
struct Reader<'r> {
    count: usize,
    /// Wildcard values tried in turn ([`Wildcards::is_scanned`]), in the whole domain.
    scanned: usize,
    report: &'r mut dyn FnMut(Option<String>, String),
}

impl RatelimitDomains {
    /// No domains yet; with `merge`, a domain given again (in another file or resource)
    /// is merged into the first, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG merges:
    /// its top-level descriptors are added, one whose `key`/`key_value` the domain already
    /// has is refused as a duplicate.
    pub fn merging(merge: bool) -> RatelimitDomains {
        RatelimitDomains {
            merge,
            ..RatelimitDomains::default()
        }
    }

    /// Adds one file's domain; every problem is reported with the entry it is in
    /// (`domain.key_value.key`), and a file with any problem adds nothing.
    pub fn add_file(&mut self, text: &str, report: &mut dyn FnMut(Option<String>, String)) {
        match serde_yaml_ng::from_str::<RawRoot>(text) {
            Ok(root) => self.add_root(root, report),
            Err(e) => report(None, e.to_string()),
        }
    }

    /// Adds one domain, read from a file or received over xDS.
    pub(super) fn add_root(
        &mut self,
        root: RawRoot,
        report: &mut dyn FnMut(Option<String>, String),
    ) {
        if root.domain.is_empty() {
            return report(None, "config file cannot have empty domain".to_string());
        }
        let first = match self.domains.get(&root.domain) {
            Some(_) if !self.merge => {
                return report(
                    None,
                    format!("duplicate domain '{}' in config file", root.domain),
                )
            }
            // Merged into a copy: a file with any problem adds nothing.
            Some(level) => level.clone(),
            None => Level::default(),
        };
        let mut failed = false;
        let mut noting = |entry: Option<String>, reason: String| {
            failed = true;
            report(entry, reason);
        };
        let mut reader = Reader {
            count: 0,
            scanned: self.scanned.get(&root.domain).copied().unwrap_or(0),
            report: &mut noting,
        };
        let parent = format!("{}.", root.domain);
        let level = reader.level_onto(first, &parent, root.descriptors, 1);
        let scanned = reader.scanned;
        if !failed {
            if self.merge {
                self.scanned.insert(root.domain.clone(), scanned);
            }
            self.domains.insert(root.domain, level);
        }
    }
}

impl Reader<'_> {
    fn level(&mut self, parent: &str, raw: Vec<RawDescriptor>, depth: usize) -> Level {
        self.level_onto(Level::default(), parent, raw, depth)
    }

    /// `raw`'s descriptors added to `level`'s (a composite key it has is a duplicate).
    fn level_onto(
        &mut self,
        mut level: Level,
        parent: &str,
        raw: Vec<RawDescriptor>,
        depth: usize,
    ) -> Level {
        if depth > MAX_DEPTH && !raw.is_empty() {
            (self.report)(
                Some(parent.trim_end_matches('.').to_string()),
                format!("descriptors nested deeper than {MAX_DEPTH} levels"),
            );
            return level;
        }
        for descriptor in raw {
            self.count += 1;
            if self.count > MAX_DESCRIPTORS {
                if self.count == MAX_DESCRIPTORS + 1 {
                    (self.report)(None, format!("more than {MAX_DESCRIPTORS} descriptors"));
                }
                return level;
            }
            let key_len = descriptor.key.len();
            let Some((composite, node)) = self.node(parent, descriptor, depth) else {
                continue;
            };
            if level.children.contains_key(composite.as_str()) {
                (self.report)(
                    Some(format!("{parent}{composite}")),
                    format!("duplicate descriptor composite key '{parent}{composite}'"),
                );
                continue;
            }
            if composite.contains('*') {
                if Wildcards::is_scanned(&composite, key_len) {
                    self.scanned += 1;
                    if self.scanned > MAX_SCANNED {
                        (self.report)(
                            Some(format!("{parent}{composite}")),
                            format!(
                                "more than {MAX_SCANNED} wildcard values in one domain that \
                                 are not a plain prefix (abc*) or suffix (*abc): each is tried \
                                 in turn on every request"
                            ),
                        );
                        continue;
                    }
                }
                level.wildcards.add(&composite, key_len);
            }
            level.children.insert(composite.into_boxed_str(), node);
        }
        level
    }

    /// One descriptor entry: its composite key (`key` or `key_value`) and node.
    fn node(&mut self, parent: &str, raw: RawDescriptor, depth: usize) -> Option<(String, Node)> {
        if raw.key.is_empty() {
            (self.report)(
                Some(parent.trim_end_matches('.').to_string()),
                "descriptor has empty key".to_string(),
            );
            return None;
        }
        let composite = match raw.value.is_empty() {
            true => raw.key.clone(),
            false => format!("{}_{}", raw.key, raw.value),
        };
        let full_key = format!("{parent}{composite}");
        let mut bad = |reason: String| (self.report)(Some(full_key.clone()), reason);
        if raw.share_threshold && !composite.contains('*') {
            bad(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but \
                 found key '{composite}'"
            ));
            return None;
        }
        let limit = match raw.rate_limit {
            None => None,
            Some(rate_limit) => {
                let unit = Unit::parse(&rate_limit.unit);
                let limit = match (rate_limit.unlimited, unit) {
                    (true, Some(_)) => {
                        bad("should not specify rate limit unit when unlimited".to_string());
                        return None;
                    }
                    (true, None) => None,
                    (false, None) => {
                        bad(format!("invalid rate limit unit '{}'", rate_limit.unit));
                        return None;
                    }
                    (false, Some(unit)) => Some((rate_limit.requests_per_unit, unit)),
                };
                let mut replaces = Vec::new();
                for replaced in rate_limit.replaces {
                    if replaced.name.is_empty() {
                        bad("should not have an empty replaces entry".to_string());
                        return None;
                    }
                    if replaced.name == rate_limit.name {
                        bad("replaces should not contain name of same descriptor".to_string());
                        return None;
                    }
                    replaces.push(replaced.name);
                }
                let metadata = match raw.metadata.as_ref().map(metadata_struct).transpose() {
                    Ok(m) => m.filter(|m| !m.fields.is_empty()).map(Arc::new),
                    Err(reason) => {
                        bad(format!("error parsing metadata: {reason}"));
                        return None;
                    }
                };
                let label = match rate_limit.name.as_str() {
                    "" => Arc::from(full_key.as_str()),
                    name => Arc::from(name),
                };
                Some(Arc::new(RateLimit {
                    limit,
                    label,
                    name: (!rate_limit.name.is_empty()).then_some(rate_limit.name),
                    replaces,
                    shadow_mode: raw.shadow_mode,
                    quota_mode: raw.quota_mode,
                    detailed_metric: raw.detailed_metric,
                    value_to_metric: raw.value_to_metric,
                    full_key: full_key.clone(),
                    metadata,
                }))
            }
        };
        let next = self.level(&format!("{full_key}."), raw.descriptors, depth + 1);
        Some((
            composite,
            Node {
                limit,
                share_threshold: raw.share_threshold,
                next,
            },
        ))
    }
}

/// A descriptor's YAML `metadata` as the protobuf `Struct` envoyproxy/ratelimit makes of
/// it: a mapping with string keys, numbers as doubles, a YAML tag ignored.
fn metadata_struct(yaml: &serde_yaml_ng::Value) -> Result<Struct, String> {
    match metadata_value(yaml)?.kind {
        Some(Kind::StructValue(s)) => Ok(s),
        Some(Kind::NullValue(_)) => Ok(Struct::default()),
        _ => Err("not a mapping".to_string()),
    }
}

fn metadata_value(yaml: &serde_yaml_ng::Value) -> Result<Value, String> {
    use serde_yaml_ng::Value as Y;
    let kind = match yaml {
        Y::Null => Kind::NullValue(0),
        Y::Bool(b) => Kind::BoolValue(*b),
        Y::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Y::String(s) => Kind::StringValue(s.clone()),
        Y::Sequence(items) => Kind::ListValue(ListValue {
            values: items.iter().map(metadata_value).collect::<Result<_, _>>()?,
        }),
        Y::Mapping(map) => {
            let mut fields = std::collections::HashMap::new();
            for (k, v) in map {
                let Y::String(k) = k else {
                    return Err(format!("key {k:?} is not a string"));
                };
                fields.insert(k.clone(), metadata_value(v)?);
            }
            Kind::StructValue(Struct { fields })
        }
        Y::Tagged(tagged) => return metadata_value(&tagged.value),
    };
    Ok(Value { kind: Some(kind) })
}
