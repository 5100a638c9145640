//! The same domains received over xDS: envoyproxy/ratelimit's `RateLimitConfig` resource
//! (`type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig`, what Envoy
//! Gateway sends) read into the raw shape of a file, so that a resource is validated and
//! matched exactly as the file with the same content would be. envoyproxy/ratelimit does
//! the same (`ConfigXdsProtoToYaml`).
//!
//! The messages are declared here with the fields cellrate reads, wire-compatible with
//! `ratelimit.config.ratelimit.v3` (the same tags). What a resource costs in memory is
//! bounded before it is decoded (`crate::server::xds` counts its descriptors and the bytes
//! of their `metadata`).

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitUnit;

use super::read::{RawDescriptor, RawRateLimit, RawReplaces, RawRoot};
use super::RatelimitDomains;

/// A unit as the file would write it: its enum name (`UNKNOWN` for 0, which is refused
/// unless `unlimited`), or the number a newer control plane sent.
fn unit_name(unit: i32) -> String {
    match RateLimitUnit::try_from(unit) {
        Ok(unit) => unit.as_str_name().to_string(),
        Err(_) => unit.to_string(),
    }
}

/// `ratelimit.config.ratelimit.v3.RateLimitConfig`: one domain.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitConfig {
    /// The resource's name (Envoy Gateway: one per gateway listener).
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub domain: String,
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
    /// Returned to Envoy in dynamic metadata (RESPONSE_DYNAMIC_METADATA), as a file's.
    #[prost(message, optional, tag = "8")]
    pub metadata: Option<Struct>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitPolicy`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitPolicy {
    /// `RateLimitUnit`: 1 second ... 6 year, 7 week.
    #[prost(int32, tag = "1")]
    pub unit: i32,
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitReplace`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReplace {
    #[prost(string, tag = "1")]
    pub name: String,
}

/// The resource's type URL.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

fn policy(policy: &RateLimitPolicy) -> RawRateLimit {
    RawRateLimit {
        requests_per_unit: policy.requests_per_unit,
        unit: unit_name(policy.unit),
        unlimited: policy.unlimited,
        name: policy.name.clone(),
        replaces: policy
            .replaces
            .iter()
            .map(|r| RawReplaces {
                name: r.name.clone(),
            })
            .collect(),
    }
}

fn descriptor(d: &RateLimitDescriptor) -> RawDescriptor {
    RawDescriptor {
        key: d.key.clone(),
        value: d.value.clone(),
        rate_limit: d.rate_limit.as_ref().map(policy),
        descriptors: d.descriptors.iter().map(descriptor).collect(),
        shadow_mode: d.shadow_mode,
        quota_mode: d.quota_mode,
        detailed_metric: d.detailed_metric,
        // Not in the resource: the file-only switches are off.
        value_to_metric: false,
        share_threshold: false,
        // As upstream reads it (`structpbToMap`): into the file's shape.
        metadata: d.metadata.as_ref().map(|m| yaml_of_fields(&m.fields)),
    }
}

/// A `Struct`'s fields as the YAML mapping a file would hold.
fn yaml_of_fields(fields: &std::collections::HashMap<String, Value>) -> serde_yaml_ng::Value {
    let mut map = serde_yaml_ng::Mapping::new();
    for (key, value) in fields {
        map.insert(serde_yaml_ng::Value::String(key.clone()), yaml_of(value));
    }
    serde_yaml_ng::Value::Mapping(map)
}

fn yaml_of(value: &Value) -> serde_yaml_ng::Value {
    use serde_yaml_ng::Value as Y;
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Y::Null,
        Some(Kind::BoolValue(b)) => Y::Bool(*b),
        Some(Kind::NumberValue(n)) => Y::Number((*n).into()),
        Some(Kind::StringValue(s)) => Y::String(s.clone()),
        Some(Kind::ListValue(list)) => Y::Sequence(list.values.iter().map(yaml_of).collect()),
        Some(Kind::StructValue(s)) => yaml_of_fields(&s.fields),
    }
}

impl RatelimitDomains {
    /// Adds the domain of one xDS resource; problems are reported as for a file.
    pub fn add_xds(
        &mut self,
        config: &RateLimitConfig,
        report: &mut dyn FnMut(Option<String>, String),
    ) {
        let root = RawRoot {
            domain: config.domain.clone(),
            descriptors: config.descriptors.iter().map(descriptor).collect(),
        };
        self.add_root(root, report);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn load(config: &RateLimitConfig) -> Result<RatelimitDomains, Vec<String>> {
        let mut domains = RatelimitDomains::default();
        let mut errors = Vec::new();
        domains.add_xds(config, &mut |entry, reason| {
            errors.push(format!("{}: {reason}", entry.unwrap_or_default()))
        });
        match errors.is_empty() {
            true => Ok(domains),
            false => Err(errors),
        }
    }

    fn entry(key: &str, value: &str, limit: Option<(i32, u32)>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit: limit.map(|(unit, n)| RateLimitPolicy {
                unit,
                requests_per_unit: n,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_resource_matches_as_the_same_file_would() {
        let mut user = entry("user", "", Some((RateLimitUnit::Minute as i32, 10)));
        user.descriptors.push(entry(
            "path",
            "/api/*",
            Some((RateLimitUnit::Second as i32, 2)),
        ));
        let config = RateLimitConfig {
            name: "default/eg/http".into(),
            domain: "default/eg/http".into(),
            descriptors: vec![user, entry("vip", "yes", None)],
        };
        let d = load(&config).unwrap();
        let found = |entries: &[(&str, &str)]| {
            d.find("default/eg/http", entries)
                .and_then(|f| f.limit.limit)
                .map(|(n, u)| (n, u.seconds()))
        };
        assert_eq!(found(&[("user", "ann")]), Some((10, 60)));
        assert_eq!(found(&[("user", "ann"), ("path", "/api/x")]), Some((2, 1)));
        assert_eq!(found(&[("user", "ann"), ("path", "/web")]), None);
        // A value without a limit: an allow-list entry, no limit.
        assert!(d.find("default/eg/http", &[("vip", "yes")]).is_none());
    }

    #[test]
    fn a_bad_resource_is_refused_with_its_entry() {
        let refused = |mut edit: Box<dyn FnMut(&mut RateLimitConfig)>| {
            let mut config = RateLimitConfig {
                name: "r".into(),
                domain: "d".into(),
                descriptors: vec![entry("k", "v", Some((RateLimitUnit::Hour as i32, 1)))],
            };
            edit(&mut config);
            load(&config).unwrap_err().join("; ")
        };
        assert_eq!(
            refused(Box::new(|c| c.domain.clear())),
            ": config file cannot have empty domain"
        );
        assert_eq!(
            refused(Box::new(|c| c.descriptors[0].key.clear())),
            "d: descriptor has empty key"
        );
        let unknown = refused(Box::new(|c| {
            c.descriptors[0].rate_limit.as_mut().unwrap().unit = 0
        }));
        assert_eq!(unknown, "d.k_v: invalid rate limit unit 'UNKNOWN'");
        let newer = refused(Box::new(|c| {
            c.descriptors[0].rate_limit.as_mut().unwrap().unit = 42
        }));
        assert_eq!(newer, "d.k_v: invalid rate limit unit '42'");
        let both = refused(Box::new(|c| {
            c.descriptors[0].rate_limit.as_mut().unwrap().unlimited = true
        }));
        assert_eq!(
            both,
            "d.k_v: should not specify rate limit unit when unlimited"
        );
        let itself = refused(Box::new(|c| {
            let limit = c.descriptors[0].rate_limit.as_mut().unwrap();
            limit.name = "n".into();
            limit.replaces.push(RateLimitReplace { name: "n".into() });
        }));
        assert_eq!(
            itself,
            "d.k_v: replaces should not contain name of same descriptor"
        );
        let twice = refused(Box::new(|c| c.descriptors.push(c.descriptors[0].clone())));
        assert_eq!(twice, "d.k_v: duplicate descriptor composite key 'd.k_v'");
        // Unlimited without a unit is fine.
        let mut ok = RateLimitConfig {
            name: "r".into(),
            domain: "d".into(),
            descriptors: vec![entry("k", "", None)],
        };
        ok.descriptors[0].rate_limit = Some(RateLimitPolicy {
            unlimited: true,
            ..Default::default()
        });
        assert!(load(&ok).is_ok());
    }

    #[test]
    fn the_messages_read_what_envoy_types_writes_metadata_too() {
        use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
        use envoy_types::pb::ratelimit::config::ratelimit::v3 as theirs;
        let sent = theirs::RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors: vec![theirs::RateLimitDescriptor {
                key: "k".into(),
                value: "v".into(),
                rate_limit: Some(theirs::RateLimitPolicy {
                    unit: theirs::RateLimitUnit::Week as i32,
                    requests_per_unit: 7,
                    unlimited: false,
                    name: "week".into(),
                    replaces: vec![theirs::RateLimitReplace { name: "r".into() }],
                }),
                shadow_mode: true,
                detailed_metric: true,
                quota_mode: true,
                metadata: Some(Struct {
                    fields: [(
                        "tier".to_string(),
                        Value {
                            kind: Some(Kind::StringValue("gold".into())),
                        },
                    )]
                    .into(),
                }),
                descriptors: vec![theirs::RateLimitDescriptor {
                    key: "sub".into(),
                    ..Default::default()
                }],
            }],
        };
        let read = RateLimitConfig::decode(&sent.encode_to_vec()[..]).unwrap();
        let d = &read.descriptors[0];
        assert_eq!((read.name.as_str(), read.domain.as_str()), ("n", "d"));
        assert_eq!((d.key.as_str(), d.value.as_str()), ("k", "v"));
        assert!(d.shadow_mode && d.detailed_metric && d.quota_mode);
        let policy = d.rate_limit.as_ref().unwrap();
        assert_eq!((policy.unit, policy.requests_per_unit), (7, 7));
        assert_eq!(policy.name, "week");
        assert_eq!(policy.replaces[0].name, "r");
        assert_eq!(d.descriptors[0].key, "sub");
        assert_eq!(d.metadata, sent.descriptors[0].metadata);
        // Read as a file's: answered back as the same Struct.
        let mut domains = RatelimitDomains::default();
        let mut problems = Vec::new();
        domains.add_xds(&read, &mut |_, why| problems.push(why));
        assert!(problems.is_empty(), "{problems:?}");
        let found = domains.find("d", &[("k", "v")]).unwrap();
        assert_eq!(
            found.limit.metadata.as_deref(),
            sent.descriptors[0].metadata.as_ref()
        );
        assert_eq!(
            TYPE_URL,
            <theirs::RateLimitConfig as prost::Name>::type_url()
        );
    }
}
