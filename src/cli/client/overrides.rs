//! `admin override set | clear | list`: temporary overrides on every replica given (each
//! replica keeps its own unless they share them through Redis).

use serde_json::{json, Value};

use super::render::{duration, nanos};
use super::transport::admin_call;
use super::{Answer, Exit, Failed};
use crate::cli::{ClientItemArgs, OverrideListArgs, OverrideSetArgs};
use crate::proto::v1 as pb;

fn nanos_duration(ns: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: ns / 1_000_000_000,
        nanos: (ns % 1_000_000_000) as i32,
    }
}

/// Who sets an override: `--author` (or `$USER`, its variable), else `$LOGNAME`, else the
/// process's user id, so that no override is anonymous where neither variable is set (a
/// container, cron, a CI job).
fn author(given: Option<&str>) -> String {
    if let Some(author) = given.filter(|a| !a.is_empty()) {
        return author.to_string();
    }
    if let Some(login) = std::env::var("LOGNAME").ok().filter(|l| !l.is_empty()) {
        return login;
    }
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's user; elsewhere (no procfs) leave it empty.
    std::fs::metadata("/proc/self").map_or_else(|_| String::new(), |m| format!("uid {}", m.uid()))
}

const OVERRIDE_HEADER: [&str; 6] = ["NAME", "ID", "OVERRIDE", "EXPIRES IN", "AUTHOR", "COMMENT"];

fn override_row(o: &pb::RuntimeOverride) -> (Vec<String>, Value) {
    let what = if o.unlimited {
        "unlimited".to_string()
    } else if o.deny {
        "deny".to_string()
    } else if let Some(calendar) = &o.calendar {
        format!("{} per calendar {calendar}", o.count)
    } else {
        format!(
            "{} per {}, burst {}",
            o.count,
            duration(nanos(o.period.as_ref())),
            o.burst
        )
    };
    let left = nanos(o.expires_in.as_ref());
    let row = vec![
        o.name.clone(),
        o.id.clone(),
        what.clone(),
        duration(left),
        o.author.clone(),
        o.comment.clone(),
    ];
    let json = json!({
        "name": o.name, "id": o.id, "override": what, "unlimited": o.unlimited, "deny": o.deny,
        "burst": o.burst, "count": o.count, "period_ns": nanos(o.period.as_ref()),
        "calendar": o.calendar,
        "expires_in_ns": left, "author": o.author, "comment": o.comment,
    });
    (row, json)
}

/// Sets the override on every admin address given (each replica keeps its own).
pub(super) async fn set(args: &OverrideSetArgs) -> Result<Answer, Failed> {
    let mut rows = vec![OVERRIDE_HEADER.map(String::from).to_vec()];
    let mut entries = Vec::new();
    for addr in &args.client.admin_addr {
        let message = pb::SetOverrideRequest {
            name: args.name.clone(),
            id: args.id.clone(),
            burst: args.burst.unwrap_or(0),
            count: args.count.unwrap_or(0),
            period: args.period.map(nanos_duration),
            unlimited: args.unlimited,
            deny: args.deny,
            ttl: Some(nanos_duration(args.ttl)),
            comment: args.comment.clone(),
            author: author(args.author.as_deref()),
            calendar: args.calendar.clone().unwrap_or_default(),
        };
        let entry = admin_call(
            &args.client,
            addr,
            message,
            |mut admin, request| async move { admin.set_override(request).await },
        )
        .await?
        .entry
        .unwrap_or_default();
        let (row, json) = override_row(&entry);
        if entries.is_empty() {
            rows.push(row);
        }
        entries.push(json);
    }
    Ok(Answer {
        rows,
        json: json!({"replicas": args.client.admin_addr.len(), "entries": entries}),
        exit: Exit::Ok,
        after: Vec::new(),
    })
}

pub(super) async fn clear(args: &ClientItemArgs) -> Result<Answer, Failed> {
    let mut cleared = 0;
    for addr in &args.client.admin_addr {
        let message = pb::ClearOverrideRequest {
            name: args.name.clone(),
            id: args.id.clone(),
        };
        let answer = admin_call(
            &args.client,
            addr,
            message,
            |mut admin, request| async move { admin.clear_override(request).await },
        )
        .await?;
        cleared += u32::from(answer.cleared);
    }
    Ok(Answer {
        rows: vec![
            ["NAME", "ID", "CLEARED"].map(String::from).to_vec(),
            vec![args.name.clone(), args.id.clone(), cleared.to_string()],
        ],
        json: json!({"name": args.name, "id": args.id, "cleared": cleared}),
        exit: Exit::Ok,
        after: Vec::new(),
    })
}

pub(super) async fn list(args: &OverrideListArgs) -> Result<Answer, Failed> {
    let mut rows = vec![OVERRIDE_HEADER.map(String::from).to_vec()];
    let mut replicas = Vec::new();
    for addr in &args.client.admin_addr {
        let message = pb::ListOverridesRequest {
            name: args.name.clone().unwrap_or_default(),
        };
        let entries = admin_call(
            &args.client,
            addr,
            message,
            |mut admin, request| async move { admin.list_overrides(request).await },
        )
        .await?
        .entries;
        let mut json_entries = Vec::new();
        for entry in &entries {
            let (row, json) = override_row(entry);
            rows.push(row);
            json_entries.push(json);
        }
        replicas.push(json!({"addr": addr, "entries": json_entries}));
    }
    Ok(Answer {
        rows,
        json: json!({"replicas": replicas}),
        exit: Exit::Ok,
        after: Vec::new(),
    })
}
