//! The Redis protocol side of cellrate: `CL.THROTTLE` answered as redis-cell answers it,
//! `RL.THROTTLE` (Valkey's proposal of the same) and `GCRA` as Redis 8.8's clients send it,
//! for any application with a Redis client, on an optional listener (`--resp-listen`).
//!
//! - [`protocol`]: RESP in: arrays and inline commands, bounded;
//! - [`replies`]: RESP out, in RESP2 or RESP3;
//! - [`frame`]: where a command's arguments lie once read: in the read buffer, in place;
//! - [`throttle`]: redis-cell's five numbers from cellrate's GCRA decision;
//! - [`gcra`]: the `GCRA` command's arguments and five numbers;
//! - [`server`]: one connection: read, answer what is complete (pipelines), write, bounded;
//! - [`command`]: the commands known, and what a command tells its connection;
//! - [`commands`]: the dispatch, `CL.THROTTLE` and the informational commands;
//! - [`auth`]: `HELLO` and `AUTH`;
//! - [`lockout`]: wrong `AUTH` tokens counted per client address, across connections.
//!
//! The listener and its accept loop are the server's (`crate::server::tasks`).

pub mod auth;
pub mod command;
pub mod commands;
pub mod frame;
/// Redis 8.8's `GCRA`: the core's, which the Redis module answers with too.
pub use cellrate_core::redis_gcra as gcra;
pub mod lockout;
pub mod protocol;
pub mod replies;
pub mod server;
/// redis-cell's numbers: the core's, which the Redis module answers with too.
pub use cellrate_core::cell as throttle;

pub use server::{RespServer, RespSettings};
