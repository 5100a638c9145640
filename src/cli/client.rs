//! The client commands (`cellrate check`, `refund`, `admin inspect|reset`): one call to a
//! running server over its gRPC APIs, printed as an aligned table or as JSON, and an exit
//! code that tells a denied check from an error (see [`Exit`]).

use std::time::Duration;

use serde_json::{json, Value};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::cli::{
    AdminCommand, ClientArgs, ClientCheckArgs, ClientItemArgs, ClientMode, OverrideCommand,
    OverrideListArgs, OverrideSetArgs, TopArgs,
};
use crate::proto::v1 as pb;

/// The client commands' exit codes (the server commands' set, plus 2, 65, 69 and 77).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done; a check was allowed.
    Ok,
    /// 2: the check was denied.
    Denied,
    /// 64: the command line is wrong (a TLS option without the rest).
    Usage,
    /// 65 (EX_DATAERR): the server refused the request as malformed (INVALID_ARGUMENT).
    Refused,
    /// 69 (EX_UNAVAILABLE): no answer: the server unreachable, UNAVAILABLE, a timeout.
    Unavailable,
    /// 77 (EX_NOPERM): the admin token or client certificate was refused.
    NoPermission,
    /// 78: a TLS file could not be read.
    Config,
    /// 1: any other failure.
    Failure,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Denied => 2,
            Exit::Usage => 64,
            Exit::Refused => 65,
            Exit::Unavailable => 69,
            Exit::NoPermission => 77,
            Exit::Config => 78,
            Exit::Failure => 1,
        }
    }

    fn of(status: &tonic::Status) -> Exit {
        use tonic::Code::*;
        match status.code() {
            InvalidArgument | OutOfRange | FailedPrecondition => Exit::Refused,
            Unavailable | DeadlineExceeded | Cancelled => Exit::Unavailable,
            Unauthenticated | PermissionDenied => Exit::NoPermission,
            _ => Exit::Failure,
        }
    }
}

/// A failure, with what to print on stderr.
struct Failed(Exit, String);

impl From<tonic::Status> for Failed {
    fn from(status: tonic::Status) -> Failed {
        let code = format!("{:?}", status.code());
        Failed(Exit::of(&status), format!("{code}: {}", status.message()))
    }
}

/// Runs a client command; prints its answer (stdout) or its error (stderr).
pub fn run_check(args: ClientCheckArgs) -> Exit {
    let mode = match args.mode {
        ClientMode::CheckAndSpend => pb::Mode::CheckAndSpend,
        ClientMode::CheckOnly => pb::Mode::CheckOnly,
        ClientMode::SpendOnly => pb::Mode::SpendOnly,
    };
    let item = args.item;
    finish(&item.client, block_on(&item.client, check(&item, mode)))
}

pub fn run_refund(args: ClientItemArgs) -> Exit {
    finish(&args.client, block_on(&args.client, refund(&args)))
}

pub fn run_admin(command: AdminCommand) -> Exit {
    match command {
        AdminCommand::Inspect(args) => finish(&args.client, block_on(&args.client, inspect(&args))),
        AdminCommand::Reset(args) => finish(&args.client, block_on(&args.client, reset(&args))),
        AdminCommand::Top(args) => finish(&args.client, block_on(&args.client, top(&args))),
        AdminCommand::Override { command } => match command {
            OverrideCommand::Set(args) => {
                finish(&args.client, block_on(&args.client, override_set(&args)))
            }
            OverrideCommand::Clear(args) => {
                finish(&args.client, block_on(&args.client, override_clear(&args)))
            }
            OverrideCommand::List(args) => {
                finish(&args.client, block_on(&args.client, override_list(&args)))
            }
        },
    }
}

/// What a command prints: rows for the table (the first is the header), the same as JSON,
/// and how it exits.
struct Answer {
    rows: Vec<Vec<String>>,
    json: Value,
    exit: Exit,
}

fn finish(client: &ClientArgs, result: Result<Answer, Failed>) -> Exit {
    match result.map_err(|failed| hint(client, failed)) {
        Ok(answer) => {
            if client.json {
                println!("{}", answer.json);
            } else {
                print!("{}", table(&answer.rows));
            }
            answer.exit
        }
        Err(Failed(exit, message)) => {
            eprintln!("cellrate: {message}");
            exit
        }
    }
}

fn block_on<T>(
    client: &ClientArgs,
    work: impl std::future::Future<Output = Result<T, Failed>>,
) -> Result<T, Failed> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failed(Exit::Failure, format!("cannot start the runtime: {e}")))?;
    let limit = Duration::from_secs(client.timeout_seconds.max(1));
    runtime.block_on(async {
        tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
            Err(Failed(
                Exit::Unavailable,
                format!("no answer within {} s", limit.as_secs()),
            ))
        })
    })
}

/// A channel to `addr` (`host:port` or a URL), with TLS when a CA is given.
async fn connect(client: &ClientArgs, addr: &str) -> Result<Channel, Failed> {
    let tls = client.tls_ca.is_some();
    let uri = if addr.contains("://") {
        addr.to_string()
    } else if tls {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    };
    if uri.starts_with("https://") && !tls {
        return Err(Failed(Exit::Usage, format!("{uri}: TLS needs --tls-ca")));
    }
    let timeout = Duration::from_secs(client.timeout_seconds.max(1));
    let mut endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| Failed(Exit::Usage, format!("{addr}: not an address: {e}")))?
        .connect_timeout(timeout)
        .timeout(timeout);
    if let Some(ca) = &client.tls_ca {
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| Failed(Exit::Config, format!("reading {}: {e}", path.display())))
        };
        let host = endpoint.uri().host().unwrap_or("localhost").to_string();
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(ca)?))
            .domain_name(client.tls_domain.clone().unwrap_or(host));
        if let (Some(cert), Some(key)) = (&client.client_cert, &client.client_key) {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| Failed(Exit::Config, format!("TLS: {e}")))?;
    }
    endpoint.connect().await.map_err(|e| {
        Failed(
            Exit::Unavailable,
            format!("cannot connect to {uri}: {}", source_chain(&e)),
        )
    })
}

/// An error and its causes, on one line.
fn source_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

fn item(args: &ClientItemArgs, mode: pb::Mode) -> pb::Item {
    pb::Item {
        name: args.name.clone(),
        id: args.id.clone(),
        cost: args.cost,
        mode: mode as i32,
        ..Default::default()
    }
}

/// Largest admin answer read: a full `ListOverrides` (10 000 overrides with the longest
/// comments) or `Top` (1 024 names x 32 ids) is above tonic's 4 MiB default.
const MAX_ADMIN_ANSWER: usize = 64 << 20;

fn admin_client(channel: Channel) -> pb::admin_client::AdminClient<Channel> {
    pb::admin_client::AdminClient::new(channel).max_decoding_message_size(MAX_ADMIN_ANSWER)
}

/// An admin request, with the bearer token when one is given.
fn admin_request<T>(client: &ClientArgs, message: T) -> Result<tonic::Request<T>, Failed> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = &client.admin_token {
        let value = format!("Bearer {token}").parse().map_err(|_| {
            Failed(
                Exit::Usage,
                "--admin-token: not a valid header value".into(),
            )
        })?;
        request.metadata_mut().insert("authorization", value);
    }
    Ok(request)
}

/// A hint for the commonest misconfiguration: plaintext to a TLS listener, which answers
/// the HTTP/2 preface with a TLS alert (an h2 protocol or transport error here).
fn hint(client: &ClientArgs, failed: Failed) -> Failed {
    let Failed(exit, message) = failed;
    let transport = message.contains("h2 protocol error") || message.contains("transport error");
    if client.tls_ca.is_none() && exit == Exit::Failure && transport {
        return Failed(
            exit,
            format!("{message} (does the server use TLS? then give --tls-ca)"),
        );
    }
    Failed(exit, message)
}

async fn check(args: &ClientItemArgs, mode: pb::Mode) -> Result<Answer, Failed> {
    let channel = connect(&args.client, &args.client.addr).await?;
    let response = pb::rate_limiter_client::RateLimiterClient::new(channel)
        .check(pb::CheckRequest {
            items: vec![item(args, mode)],
        })
        .await?
        .into_inner();
    let decision = one(response.items)?;
    let exit = if decision.allowed {
        Exit::Ok
    } else {
        Exit::Denied
    };
    Ok(decision_answer(args, &decision, exit))
}

async fn refund(args: &ClientItemArgs) -> Result<Answer, Failed> {
    let channel = connect(&args.client, &args.client.addr).await?;
    let response = pb::rate_limiter_client::RateLimiterClient::new(channel)
        .refund(pb::RefundRequest {
            items: vec![item(args, pb::Mode::CheckAndSpend)],
        })
        .await?
        .into_inner();
    Ok(decision_answer(args, &one(response.items)?, Exit::Ok))
}

async fn inspect(args: &ClientItemArgs) -> Result<Answer, Failed> {
    let channel = connect(&args.client, single_admin(&args.client)?).await?;
    let request = admin_request(
        &args.client,
        pb::InspectRequest {
            items: vec![item(args, pb::Mode::CheckAndSpend)],
        },
    )?;
    let response = admin_client(channel).inspect(request).await?.into_inner();
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

async fn reset(args: &ClientItemArgs) -> Result<Answer, Failed> {
    let channel = connect(&args.client, single_admin(&args.client)?).await?;
    let request = admin_request(
        &args.client,
        pb::ResetRequest {
            items: vec![item(args, pb::Mode::CheckAndSpend)],
        },
    )?;
    let deleted = admin_client(channel)
        .reset(request)
        .await?
        .into_inner()
        .deleted;
    Ok(Answer {
        rows: vec![
            vec!["NAME".into(), "ID".into(), "DELETED".into()],
            vec![args.name.clone(), args.id.clone(), deleted.to_string()],
        ],
        json: json!({"name": args.name, "id": args.id, "deleted": deleted}),
        exit: Exit::Ok,
    })
}

/// The one admin address of a command that acts on one replica.
fn single_admin(client: &ClientArgs) -> Result<&str, Failed> {
    match client.admin_addr.as_slice() {
        [one] => Ok(one),
        _ => Err(Failed(
            Exit::Usage,
            "--admin-addr: this command takes one address (only `admin top` merges several)".into(),
        )),
    }
}

/// `admin top`: every replica asked, counts added per name and id.
async fn top(args: &TopArgs) -> Result<Answer, Failed> {
    use crate::observe::top::{TopId, TopName};
    use std::collections::BTreeMap;
    // name -> (denials, id -> its summed counts)
    type Ids = BTreeMap<String, TopId>;
    let mut merged: BTreeMap<String, (u64, Ids)> = BTreeMap::new();
    for addr in &args.client.admin_addr {
        let channel = connect(&args.client, addr).await?;
        let request = admin_request(
            &args.client,
            pb::TopRequest {
                minutes: args.minutes,
                limit: args.limit,
                name: args.name.clone().unwrap_or_default(),
            },
        )?;
        let response = admin_client(channel).top(request).await?.into_inner();
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
    })
}

fn nanos_duration(ns: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: ns / 1_000_000_000,
        nanos: (ns % 1_000_000_000) as i32,
    }
}

const OVERRIDE_HEADER: [&str; 6] = ["NAME", "ID", "OVERRIDE", "EXPIRES IN", "AUTHOR", "COMMENT"];

fn override_row(o: &pb::RuntimeOverride) -> (Vec<String>, Value) {
    let what = if o.unlimited {
        "unlimited".to_string()
    } else if o.deny {
        "deny".to_string()
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
        "expires_in_ns": left, "author": o.author, "comment": o.comment,
    });
    (row, json)
}

/// Sets the override on every admin address given (each replica keeps its own).
async fn override_set(args: &OverrideSetArgs) -> Result<Answer, Failed> {
    let mut rows = vec![OVERRIDE_HEADER.map(String::from).to_vec()];
    let mut entries = Vec::new();
    for addr in &args.client.admin_addr {
        let channel = connect(&args.client, addr).await?;
        let request = admin_request(
            &args.client,
            pb::SetOverrideRequest {
                name: args.name.clone(),
                id: args.id.clone(),
                burst: args.burst.unwrap_or(0),
                count: args.count.unwrap_or(0),
                period: args.period.map(nanos_duration),
                unlimited: args.unlimited,
                deny: args.deny,
                ttl: Some(nanos_duration(args.ttl)),
                comment: args.comment.clone(),
                author: args.author.clone(),
            },
        )?;
        let entry = admin_client(channel)
            .set_override(request)
            .await?
            .into_inner()
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
    })
}

async fn override_clear(args: &ClientItemArgs) -> Result<Answer, Failed> {
    let mut cleared = 0;
    for addr in &args.client.admin_addr {
        let channel = connect(&args.client, addr).await?;
        let request = admin_request(
            &args.client,
            pb::ClearOverrideRequest {
                name: args.name.clone(),
                id: args.id.clone(),
            },
        )?;
        let answer = admin_client(channel)
            .clear_override(request)
            .await?
            .into_inner();
        cleared += u32::from(answer.cleared);
    }
    Ok(Answer {
        rows: vec![
            ["NAME", "ID", "CLEARED"].map(String::from).to_vec(),
            vec![args.name.clone(), args.id.clone(), cleared.to_string()],
        ],
        json: json!({"name": args.name, "id": args.id, "cleared": cleared}),
        exit: Exit::Ok,
    })
}

async fn override_list(args: &OverrideListArgs) -> Result<Answer, Failed> {
    let mut rows = vec![OVERRIDE_HEADER.map(String::from).to_vec()];
    let mut replicas = Vec::new();
    for addr in &args.client.admin_addr {
        let channel = connect(&args.client, addr).await?;
        let request = admin_request(
            &args.client,
            pb::ListOverridesRequest {
                name: args.name.clone().unwrap_or_default(),
            },
        )?;
        let entries = admin_client(channel)
            .list_overrides(request)
            .await?
            .into_inner()
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
    })
}

fn one(mut items: Vec<pb::Decision>) -> Result<pb::Decision, Failed> {
    match items.len() {
        1 => Ok(items.remove(0)),
        n => Err(Failed(
            Exit::Failure,
            format!("the server answered {n} decisions for one item"),
        )),
    }
}

fn nanos(d: Option<&prost_types::Duration>) -> i64 {
    d.map_or(0, |d| {
        d.seconds
            .saturating_mul(1_000_000_000)
            .saturating_add(i64::from(d.nanos))
    })
}

fn policy(decision: &pb::Decision) -> &'static str {
    match pb::Policy::try_from(decision.policy) {
        Ok(pb::Policy::Limited) => "limited",
        Ok(pb::Policy::Unlimited) => "unlimited",
        Ok(pb::Policy::Denied) => "denied",
        Ok(pb::Policy::NotConfigured) => "not_configured",
        Err(_) => "unknown",
    }
}

fn decision_answer(args: &ClientItemArgs, d: &pb::Decision, exit: Exit) -> Answer {
    let limit = d.limit.clone().unwrap_or_default();
    let period = nanos(limit.period.as_ref());
    let (retry, reset) = (nanos(d.retry_after.as_ref()), nanos(d.reset_after.as_ref()));
    let limit_text = if limit.burst == 0 {
        "-".to_string()
    } else {
        format!(
            "{} per {}, burst {}",
            limit.count,
            duration(period),
            limit.burst
        )
    };
    Answer {
        rows: vec![
            [
                "NAME",
                "ID",
                "ALLOWED",
                "REMAINING",
                "RETRY AFTER",
                "RESET AFTER",
                "LIMIT",
                "POLICY",
            ]
            .map(String::from)
            .to_vec(),
            vec![
                args.name.clone(),
                args.id.clone(),
                if d.allowed { "yes" } else { "no" }.to_string(),
                d.remaining.to_string(),
                duration(retry),
                duration(reset),
                limit_text,
                policy(d).to_string(),
            ],
        ],
        json: json!({
            "name": args.name,
            "id": args.id,
            "allowed": d.allowed,
            "remaining": d.remaining,
            "retry_after_ns": retry,
            "reset_after_ns": reset,
            "limit": {
                "name": limit.name,
                "key": limit.key,
                "burst": limit.burst,
                "count": limit.count,
                "period_ns": period,
            },
            "policy": policy(d),
        }),
        exit,
    }
}

/// A duration for people: `0s`, `18s`, `3h`, `1m30s`; under a minute with a fraction,
/// seconds to the millisecond rounded up (`17.488s`); from a minute, whole seconds rounded
/// up: a wait is never understated.
pub fn duration(ns: i64) -> String {
    const S: i64 = 1_000_000_000;
    if ns <= 0 {
        return "0s".to_string();
    }
    if ns % S != 0 && ns < 60 * S {
        let ms = (ns + 999_999) / 1_000_000;
        return format!("{}.{:03}s", ms / 1000, ms % 1000);
    }
    // A minute or more: whole seconds, rounded up.
    let mut seconds = (ns + S - 1) / S;
    let mut text = String::new();
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if seconds >= size {
            text.push_str(&format!("{}{unit}", seconds / size));
            seconds %= size;
        }
    }
    text
}

/// Rows as columns aligned on two spaces (no trailing spaces).
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if c + 1 < row.len() {
                let pad = widths[c] - cell.chars().count() + 2;
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_for_people() {
        let s = 1_000_000_000;
        assert_eq!(duration(0), "0s");
        assert_eq!(duration(18 * s), "18s");
        assert_eq!(duration(10_800 * s), "3h");
        assert_eq!(duration(90 * s), "1m30s");
        assert_eq!(duration(86_400 * s + 1), "1d1s");
        assert_eq!(duration(1_799_968_000_000), "30m");
        assert_eq!(duration(17_487_432_278), "17.488s");
        assert_eq!(duration(1), "0.001s");
    }

    #[test]
    fn tables_align_columns() {
        let rows = vec![
            vec!["A".to_string(), "LONG HEADER".into(), "C".into()],
            vec!["wide value".to_string(), "x".into(), "".into()],
        ];
        assert_eq!(table(&rows), "A           LONG HEADER  C\nwide value  x\n");
    }
}
