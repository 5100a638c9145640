//! The command line: its flags ([`Cli`], each with an environment fallback), the client
//! commands that ask a running server ([`client`]), `cellrate simulate` ([`simulate`]), and
//! what `cellrate serve`'s flags mean for the server (`serve.rs`: settings, listeners).

mod args;
pub mod bucket_args;
pub mod envoy_args;
mod flag_values;
pub use args::*;

pub mod client;
pub mod memcache_args;
mod ratelimit_behaviour;
pub mod ratelimit_env;
mod ratelimit_listeners;
mod ratelimit_memcache;
mod ratelimit_redis;
mod ratelimit_warned;
mod ratelimit_xds;
pub mod redis_args;
mod serve;
mod shares;
pub mod simulate;
pub mod xds_args;
