//! `cellrate check` and `cellrate refund`: one item, on the decisions port.

use super::render::{decision_answer, one};
use super::transport::connect;
use super::{Answer, Exit, Failed};
use crate::cli::ClientItemArgs;
use crate::proto::v1 as pb;

pub(super) fn item(args: &ClientItemArgs, mode: pb::Mode) -> pb::Item {
    pb::Item {
        name: args.name.clone(),
        id: args.id.clone(),
        cost: args.cost,
        mode: mode as i32,
        ..Default::default()
    }
}

pub(super) async fn check(args: &ClientItemArgs, mode: pb::Mode) -> Result<Answer, Failed> {
    let channel = connect(&args.client, &args.client.addr).await?;
    let response = pb::rate_limiter_client::RateLimiterClient::new(channel)
        .check(pb::CheckRequest {
            items: vec![item(args, mode)],
            ..Default::default()
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
