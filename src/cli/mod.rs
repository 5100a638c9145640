//! The command line: its flags ([`Cli`], each with an environment fallback), the client
//! commands that ask a running server ([`client`]), and `cellrate simulate` ([`simulate`]).

mod args;
pub use args::*;

pub mod client;
pub mod simulate;
