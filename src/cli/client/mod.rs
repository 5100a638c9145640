//! The client commands (`cellrate check`, `refund`, `admin inspect|reset|top|override`):
//! calls to a running server over its gRPC APIs, printed as an aligned table or as JSON, and
//! an exit code that tells a denied check from an error (see [`Exit`]).
//!
//! `transport` connects and makes one call (TLS, the admin token, the deadline);
//! `decide` is `check` and `refund`, `admin` is `inspect`, `reset` and `top`,
//! `overrides` the temporary overrides; `render` turns answers into rows and JSON.

mod admin;
mod decide;
mod overrides;
mod render;
mod transport;

use serde_json::Value;

use crate::cli::{
    AdminCommand, ClientArgs, ClientCheckArgs, ClientItemArgs, ClientMode, ClientSettleArgs,
    OverrideCommand,
};
use crate::proto::v1 as pb;
pub use render::{duration, table};
use transport::{block_on, hint};

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

    pub(super) fn of(status: &tonic::Status) -> Exit {
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
pub(super) struct Failed(Exit, String);

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
        ClientMode::Charge => pb::Mode::Charge,
        ClientMode::Acquire => pb::Mode::Acquire,
        ClientMode::Release => pb::Mode::Release,
    };
    let item = args.item;
    finish(
        &item.client,
        block_on(
            &item.client,
            decide::check(
                &item,
                mode,
                args.lease_id.as_deref(),
                args.request_id.as_deref(),
                args.headers,
            ),
        ),
    )
}

pub fn run_settle(args: ClientSettleArgs) -> Exit {
    finish(&args.client, block_on(&args.client, decide::settle(&args)))
}

pub fn run_refund(args: ClientItemArgs) -> Exit {
    finish(&args.client, block_on(&args.client, decide::refund(&args)))
}

pub fn run_admin(command: AdminCommand) -> Exit {
    match command {
        AdminCommand::Inspect(args) => {
            finish(&args.client, block_on(&args.client, admin::inspect(&args)))
        }
        AdminCommand::Reset(args) => {
            finish(&args.client, block_on(&args.client, admin::reset(&args)))
        }
        AdminCommand::Top(args) => finish(&args.client, block_on(&args.client, admin::top(&args))),
        AdminCommand::Override { command } => match command {
            OverrideCommand::Set(args) => {
                finish(&args.client, block_on(&args.client, overrides::set(&args)))
            }
            OverrideCommand::Clear(args) => finish(
                &args.client,
                block_on(&args.client, overrides::clear(&args)),
            ),
            OverrideCommand::List(args) => {
                finish(&args.client, block_on(&args.client, overrides::list(&args)))
            }
        },
    }
}

/// What a command prints: rows for the table (the first is the header), lines after it,
/// the same as JSON, and how it exits.
pub(super) struct Answer {
    pub(super) rows: Vec<Vec<String>>,
    pub(super) json: Value,
    pub(super) exit: Exit,
    /// Printed after the table (`check --headers`: one `name: value` line per field).
    pub(super) after: Vec<String>,
}

fn finish(client: &ClientArgs, result: Result<Answer, Failed>) -> Exit {
    match result.map_err(|failed| hint(client, failed)) {
        Ok(answer) => {
            if client.json {
                println!("{}", answer.json);
            } else {
                print!("{}", table(&answer.rows));
                for line in &answer.after {
                    println!("{}", crate::text::printable(line));
                }
            }
            answer.exit
        }
        Err(Failed(exit, message)) => {
            eprintln!("cellrate: {}", crate::text::printable(&message));
            exit
        }
    }
}
