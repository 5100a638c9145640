//! A report's domain and bucket ids checked (bounded, named in the error), and a bucket
//! mapped to the limit it counts for by `quota.yaml`'s rules, with the action Envoy is sent.

use std::sync::Arc;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, Strategy as PbStrategy,
};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Act, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::google::protobuf as pbw;
use tonic::Status;

use super::{RlqsSettings, MAX_BUCKET_ENTRIES, MAX_BUCKET_KEY, MAX_BUCKET_VALUE, MAX_DOMAIN};
use crate::service::quota_book::{Action, Resolution, Strategy};
use crate::service::Decider;
use cellrate_limits::config::{Behaviour, Policy};
use cellrate_limits::descriptors::{InvalidIds, Mapping};
use cellrate_limits::names::BucketKey;

/// The domain of this message: the first message names it; later ones repeat it or leave
/// it empty.
pub(super) fn check_domain<'a>(known: Option<&'a str>, given: &'a str) -> Result<&'a str, Status> {
    if given.len() > MAX_DOMAIN {
        return Err(Status::invalid_argument(format!(
            "domain: longer than {MAX_DOMAIN} bytes"
        )));
    }
    match known {
        None if given.is_empty() => Err(Status::invalid_argument(
            "domain: missing from the stream's first report",
        )),
        None => Ok(given),
        Some(known) if given.is_empty() || given == known => Ok(known),
        Some(known) => Err(Status::invalid_argument(format!(
            "domain: {given:?} differs from the stream's {known:?} (open a new stream)"
        ))),
    }
}

/// A bucket id's entries sorted by key, or what is wrong with it (after `bucket_id`).
pub(super) fn check_bucket(id: &BucketId) -> Result<Vec<(&str, &str)>, String> {
    if id.bucket.is_empty() {
        return Err(".bucket: empty".to_string());
    }
    if id.bucket.len() > MAX_BUCKET_ENTRIES {
        return Err(format!(
            ".bucket: {} entries, at most {MAX_BUCKET_ENTRIES}",
            id.bucket.len()
        ));
    }
    let mut entries = Vec::with_capacity(id.bucket.len());
    for (key, value) in &id.bucket {
        let shown: String = key.chars().take(40).collect();
        if key.is_empty() || key.len() > MAX_BUCKET_KEY || key.contains('\u{0}') {
            return Err(format!(
                ".bucket: key {shown:?} is not 1 to {MAX_BUCKET_KEY} bytes without NUL"
            ));
        }
        if value.is_empty() || value.len() > MAX_BUCKET_VALUE || value.contains('\u{0}') {
            return Err(format!(
                ".bucket[{shown:?}]: value is not 1 to {MAX_BUCKET_VALUE} bytes without NUL"
            ));
        }
        entries.push((key.as_str(), value.as_str()));
    }
    entries.sort_unstable();
    Ok(entries)
}

/// Where a bucket leads under `table`, and the names it counts for (metrics).
pub(super) fn resolve<'t>(
    decider: &Decider,
    table: &'t cellrate_limits::config::LimitTable,
    domain: &str,
    entries: &[(&str, &str)],
) -> (Resolution, &'t [Arc<str>]) {
    let Mapping::Limits { names, id } = table.quota().map(table.names(), domain, entries) else {
        return (Resolution::Unmatched, &[]);
    };
    let mut keys = Vec::with_capacity(names.len());
    for text in names {
        let Some(name) = table.names().get(text) else {
            continue;
        };
        let Ok(canonical) = name.format.canonicalize_cow(&id) else {
            match table.quota().invalid_ids(domain) {
                InvalidIds::Ignore => continue,
                // A bucket cannot be refused alone: reject denies, as deny does.
                InvalidIds::Deny | InvalidIds::Reject => {
                    return (Resolution::Deny, names);
                }
            }
        };
        match decider.policy(table, name, &canonical) {
            Some(Policy::Denied) => return (Resolution::Deny, names),
            Some(Policy::Limited {
                limit,
                behaviour: Behaviour { shadow: false, .. },
            }) => {
                // quota.yaml refuses calendar limits; one that arrives later (another
                // replica's temporary override) is assigned as its refilling rate.
                let key = BucketKey::new(name.number, &canonical);
                keys.push((Arc::from(key.as_str()), limit.as_gcra()));
            }
            // Shadow mode decides without enforcing; nothing configured does not limit.
            Some(
                Policy::Limited {
                    behaviour: Behaviour { shadow: true, .. },
                    ..
                }
                | Policy::Unlimited,
            )
            | None => {}
        }
    }
    let resolution = if keys.is_empty() {
        Resolution::Allow
    } else {
        Resolution::Limits(keys)
    };
    (resolution, names)
}

/// The message for `action` on `id` (`None` for a refused bucket).
pub(super) fn bucket_action(
    id: &BucketId,
    action: Action,
    settings: &RlqsSettings,
) -> Option<BucketAction> {
    let act = match action {
        Action::Refused => return None,
        Action::Abandon => Act::AbandonAction(AbandonAction {}),
        Action::Assign(strategy) => {
            let strategy = match strategy {
                Strategy::AllowAll => PbStrategy::BlanketRule(BlanketRule::AllowAll as i32),
                Strategy::DenyAll => PbStrategy::BlanketRule(BlanketRule::DenyAll as i32),
                Strategy::TokenBucket {
                    max_tokens,
                    tokens_per_fill,
                    fill_seconds,
                } => PbStrategy::TokenBucket(TokenBucket {
                    max_tokens,
                    tokens_per_fill: Some(pbw::UInt32Value {
                        value: tokens_per_fill,
                    }),
                    fill_interval: Some(pbw::Duration {
                        seconds: i64::from(fill_seconds),
                        nanos: 0,
                    }),
                }),
            };
            Act::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(pbw::Duration {
                    seconds: settings.assignment_ttl.as_secs() as i64,
                    nanos: 0,
                }),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            })
        }
    };
    Some(BucketAction {
        bucket_id: Some(id.clone()),
        bucket_action: Some(act),
    })
}
