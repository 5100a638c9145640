//! `admin inspect`, `admin reset` (one replica) and `admin top` (every replica given,
//! merged).

use serde_json::{json, Value};

use super::decide::item;
use super::render::{decision_answer, duration, nanos, one};
use super::transport::{admin_call, single_admin};
use super::{Answer, Exit, Failed};
use crate::cli::{ClientItemArgs, TopArgs};
use crate::proto::v1 as pb;

pub(super) async fn inspect(args: &ClientItemArgs) -> Result<Answer, Failed> {
    let message = pb::InspectRequest {
        items: vec![item(args, pb::Mode::CheckAndSpend)],
    };
    let addr = single_admin(&args.client)?;
    let response = admin_call(
        &args.client,
        addr,
        message,
        |mut admin, request| async move { admin.inspect(request).await },
    )
    .await?;
    let decision = one(response.items)?;
    let mut answer = decision_answer(args, &decision, Exit::Ok);
    let source = decision.source.unwrap_or_default();
    answer.rows[0].push("SOURCE".into());
    answer.rows[1].push(source_text(&source));
    answer.json["source"] = source_json(&source);
    Ok(answer)
}

fn source_kind(source: &pb::LimitSource) -> &'static str {
    use pb::limit_source::Kind;
    match Kind::try_from(source.kind) {
        Ok(Kind::Default) => "default",
        Ok(Kind::Override) => "override",
        Ok(Kind::NotConfigured) => "not_configured",
        Ok(Kind::CallerGiven) => "caller_given",
        Ok(Kind::RuntimeOverride) => "runtime_override",
        Ok(Kind::Unspecified) | Err(_) => "unknown",
    }
}

/// `defaults.yaml`, `overrides.yaml entry 2: doubled for a hosting provider`, ...
fn source_text(source: &pb::LimitSource) -> String {
    match source_kind(source) {
        "default" => "defaults.yaml".to_string(),
        "override" if source.comment.is_empty() => {
            format!("{} entry {}", source.file, source.entry)
        }
        "override" => format!("{} entry {}: {}", source.file, source.entry, source.comment),
        "not_configured" => "not configured".to_string(),
        "caller_given" => "caller-given".to_string(),
        "runtime_override" => {
            let left = duration(nanos(source.expires_in.as_ref()));
            let by = if source.author.is_empty() {
                String::new()
            } else {
                format!(" by {}", source.author)
            };
            let why = if source.comment.is_empty() {
                String::new()
            } else {
                format!(": {}", source.comment)
            };
            format!("temporary override{by}, {left} left{why}")
        }
        other => other.to_string(),
    }
}

fn source_json(source: &pb::LimitSource) -> Value {
    let mut value = json!({"kind": source_kind(source)});
    if !source.file.is_empty() {
        value["file"] = json!(source.file);
        value["entry"] = json!(source.entry);
    }
    if !source.comment.is_empty() {
        value["comment"] = json!(source.comment);
    }
    if !source.author.is_empty() {
        value["author"] = json!(source.author);
    }
    if source.expires_in.is_some() {
        value["expires_in_ns"] = json!(nanos(source.expires_in.as_ref()));
    }
    value
}

pub(super) async fn reset(args: &ClientItemArgs) -> Result<Answer, Failed> {
    let message = pb::ResetRequest {
        items: vec![item(args, pb::Mode::CheckAndSpend)],
    };
    let addr = single_admin(&args.client)?;
    let deleted = admin_call(
        &args.client,
        addr,
        message,
        |mut admin, request| async move { admin.reset(request).await },
    )
    .await?
    .deleted;
    Ok(Answer {
        rows: vec![
            vec!["NAME".into(), "ID".into(), "DELETED".into()],
            vec![args.name.clone(), args.id.clone(), deleted.to_string()],
        ],
        json: json!({"name": args.name, "id": args.id, "deleted": deleted}),
        exit: Exit::Ok,
        after: Vec::new(),
    })
}

/// `admin top`: every replica asked, counts added per name and id.
pub(super) async fn top(args: &TopArgs) -> Result<Answer, Failed> {
    if args.in_flight {
        return top_in_flight(args).await;
    }
    use crate::observe::top::{TopId, TopName};
    use std::collections::BTreeMap;
    // name -> (denials, id -> its summed counts)
    type Ids = BTreeMap<String, TopId>;
    let mut merged: BTreeMap<String, (u64, Ids)> = BTreeMap::new();
    for addr in &args.client.admin_addr {
        let message = pb::TopRequest {
            minutes: args.minutes,
            limit: args.limit,
            name: args.name.clone().unwrap_or_default(),
            in_flight: false,
        };
        let response = admin_call(
            &args.client,
            addr,
            message,
            |mut admin, request| async move { admin.top(request).await },
        )
        .await?;
        for name in response.names {
            let (total, ids) = merged.entry(name.name).or_default();
            *total += name.denials;
            for id in name.ids {
                let sum = ids.entry(id.id.clone()).or_insert(TopId {
                    id: id.id,
                    denials: 0,
                    error: 0,
                });
                sum.denials += id.denials;
                sum.error += id.error;
            }
        }
    }
    let mut names: Vec<TopName> = merged
        .into_iter()
        .map(|(name, (denials, ids))| {
            let mut ids: Vec<TopId> = ids.into_values().collect();
            ids.sort_by(|a, b| b.denials.cmp(&a.denials).then_with(|| a.id.cmp(&b.id)));
            ids.truncate(args.limit as usize);
            TopName { name, denials, ids }
        })
        .collect();
    names.sort_by(|a, b| b.denials.cmp(&a.denials).then_with(|| a.name.cmp(&b.name)));
    let mut rows = vec![["NAME", "ID", "DENIALS", "ERROR"]
        .map(String::from)
        .to_vec()];
    let mut json_names = Vec::new();
    for name in &names {
        rows.push(vec![
            name.name.clone(),
            "(all)".into(),
            name.denials.to_string(),
            String::new(),
        ]);
        for id in &name.ids {
            rows.push(vec![
                name.name.clone(),
                id.id.clone(),
                id.denials.to_string(),
                id.error.to_string(),
            ]);
        }
        let ids: Vec<Value> = name
            .ids
            .iter()
            .map(|id| json!({"id": id.id, "denials": id.denials, "error": id.error}))
            .collect();
        json_names.push(json!({"name": name.name, "denials": name.denials, "ids": ids}));
    }
    Ok(Answer {
        rows,
        json: json!({
            "minutes": args.minutes,
            "replicas": args.client.admin_addr.len(),
            "names": json_names,
        }),
        exit: Exit::Ok,
        after: Vec::new(),
    })
}

/// `admin top --in-flight`: every replica asked (each counts the leases it holds), leases
/// added per name and id.
async fn top_in_flight(args: &TopArgs) -> Result<Answer, Failed> {
    use std::collections::BTreeMap;
    /// An id's (leases, count).
    type Ids = BTreeMap<String, (u64, u64)>;
    /// One name's leases and its ids, listed: (id, leases, count).
    type Listed = (String, u64, Vec<(String, u64, u64)>);
    // name -> (leases, ids)
    let mut merged: BTreeMap<String, (u64, Ids)> = BTreeMap::new();
    for addr in &args.client.admin_addr {
        let message = pb::TopRequest {
            limit: args.limit,
            name: args.name.clone().unwrap_or_default(),
            in_flight: true,
            ..Default::default()
        };
        let response = admin_call(
            &args.client,
            addr,
            message,
            |mut admin, request| async move { admin.top(request).await },
        )
        .await?;
        for name in response.in_flight {
            let (total, ids) = merged.entry(name.name).or_default();
            *total += name.leases;
            for id in name.ids {
                let (leases, count) = ids.entry(id.id).or_default();
                *leases += id.leases;
                *count = (*count).max(id.count);
            }
        }
    }
    let mut names: Vec<Listed> = merged
        .into_iter()
        .map(|(name, (leases, ids))| {
            let mut ids: Vec<_> = ids.into_iter().map(|(id, (l, c))| (id, l, c)).collect();
            ids.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            ids.truncate(args.limit.max(1) as usize);
            (name, leases, ids)
        })
        .collect();
    names.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut rows = vec![["NAME", "ID", "IN FLIGHT", "LIMIT"]
        .map(String::from)
        .to_vec()];
    let mut json_names = Vec::new();
    for (name, leases, ids) in &names {
        rows.push(vec![
            name.clone(),
            "(all)".into(),
            leases.to_string(),
            String::new(),
        ]);
        for (id, held, count) in ids {
            rows.push(vec![
                name.clone(),
                id.clone(),
                held.to_string(),
                count.to_string(),
            ]);
        }
        let ids: Vec<Value> = ids
            .iter()
            .map(|(id, held, count)| json!({"id": id, "leases": held, "count": count}))
            .collect();
        json_names.push(json!({"name": name, "leases": leases, "ids": ids}));
    }
    Ok(Answer {
        rows,
        json: json!({"replicas": args.client.admin_addr.len(), "in_flight": json_names}),
        exit: Exit::Ok,
        after: Vec::new(),
    })
}
