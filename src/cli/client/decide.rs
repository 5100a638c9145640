//! `cellrate check` and `cellrate refund`: one item, on the decisions port.

use super::render::{decision_answer, duration, nanos, one};
use super::transport::connect;
use super::{Answer, Exit, Failed};
use crate::cli::{ClientItemArgs, ClientSettleArgs};
use crate::proto::v1 as pb;
use crate::service::headers::HeaderStyle;
use serde_json::json;

pub(super) fn item(args: &ClientItemArgs, mode: pb::Mode) -> pb::Item {
    pb::Item {
        name: args.name.clone(),
        id: args.id.clone(),
        cost: args.cost,
        mode: mode as i32,
        ..Default::default()
    }
}

pub(super) async fn check(
    args: &ClientItemArgs,
    mode: pb::Mode,
    lease_id: Option<&str>,
    request_id: Option<&str>,
    headers: HeaderStyle,
) -> Result<Answer, Failed> {
    let channel = connect(&args.client, &args.client.addr).await?;
    let response = pb::rate_limiter_client::RateLimiterClient::new(channel)
        .check(pb::CheckRequest {
            items: vec![pb::Item {
                lease_id: lease_id.unwrap_or_default().to_string(),
                ..item(args, mode)
            }],
            request_id: request_id.unwrap_or_default().to_string(),
            headers: match headers {
                HeaderStyle::Off => pb::HeaderStyle::None,
                HeaderStyle::Draft03 => pb::HeaderStyle::Draft03,
                HeaderStyle::Ietf => pb::HeaderStyle::Ietf,
                HeaderStyle::Ratelimit => pb::HeaderStyle::Ratelimit,
                HeaderStyle::Openai => pb::HeaderStyle::Openai,
            } as i32,
        })
        .await?
        .into_inner();
    let decision = one(response.items)?;
    let exit = if decision.allowed {
        Exit::Ok
    } else {
        Exit::Denied
    };
    let mut answer = decision_answer(args, &decision, exit);
    if headers != HeaderStyle::Off {
        let fields = response.headers.iter();
        answer.json["headers"] = fields
            .clone()
            .map(|h| json!({"name": h.name, "value": h.value}))
            .collect();
        answer.after = fields.map(|h| format!("{}: {}", h.name, h.value)).collect();
    }
    Ok(answer)
}

pub(super) async fn refund(args: &ClientItemArgs) -> Result<Answer, Failed> {
    let channel = connect(&args.client, &args.client.addr).await?;
    let response = pb::rate_limiter_client::RateLimiterClient::new(channel)
        .refund(pb::RefundRequest {
            items: vec![item(args, pb::Mode::CheckAndSpend)],
        })
        .await?
        .into_inner();
    Ok(decision_answer(args, &one(response.items)?, Exit::Ok))
}

/// `cellrate settle`: the kept check's one item adjusted to `cost`, answered as the bucket
/// then is (with whether this id had been settled before: a retry changes nothing).
pub(super) async fn settle(args: &ClientSettleArgs) -> Result<Answer, Failed> {
    let channel = connect(&args.client, &args.client.addr).await?;
    let response = pb::rate_limiter_client::RateLimiterClient::new(channel)
        .settle(pb::SettleRequest {
            request_id: args.request_id.clone(),
            costs: vec![args.cost],
        })
        .await?
        .into_inner();
    let already = response.already_settled;
    let d = one(response.items)?;
    let (retry, reset) = (nanos(d.retry_after.as_ref()), nanos(d.reset_after.as_ref()));
    Ok(Answer {
        rows: vec![
            [
                "REQUEST ID",
                "REMAINING",
                "RETRY AFTER",
                "RESET AFTER",
                "ALREADY SETTLED",
            ]
            .map(String::from)
            .to_vec(),
            vec![
                args.request_id.clone(),
                d.remaining.to_string(),
                duration(retry),
                duration(reset),
                if already { "yes" } else { "no" }.to_string(),
            ],
        ],
        json: serde_json::json!({
            "request_id": args.request_id,
            "remaining": d.remaining,
            "retry_after_ns": retry,
            "reset_after_ns": reset,
            "already_settled": already,
        }),
        exit: Exit::Ok,
        after: Vec::new(),
    })
}
