//! `cellrate serve`'s shares of the shared tables: how much of a table one tenant (a limit
//! name, a bucket key, a client address) may take, so that one misbehaving client cannot
//! take what everyone else needs (RELIABILITY.md, docs/operations.md's memory budget).

use super::flag_values::parse_settle_max;
use crate::server::Settings;

#[derive(Debug, Clone, clap::Args)]
pub struct ShareArgs {
    /// Leases of concurrency limits held at most in the memory store; on the Redis store,
    /// lease keys each replica counts at most (more are denied).
    #[arg(long, env = "CELLRATE_MAX_LEASES", default_value_t = crate::store::memory::DEFAULT_MAX_LEASES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_leases: usize,

    /// Percent of --max-leases that one limit name's leases (on Redis: lease keys) may
    /// hold (more are denied).
    #[arg(long, env = "CELLRATE_LEASE_NAME_SHARE", default_value_t = crate::store::memory::DEFAULT_LEASE_NAME_SHARE_PERCENT as u8, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub lease_name_share: u8,

    /// Live holds (reservations not yet settled) per bucket key at most; a further hold of
    /// that key is refused.
    #[arg(long, env = "CELLRATE_SETTLE_MAX_HOLDS_PER_KEY", default_value_t = Settings::default().settle_max_holds_per_key, value_parser = parse_settle_max)]
    pub settle_max_holds_per_key: usize,

    /// Requests in flight from one client address (IPv6: its /64) per gRPC listener; more
    /// get UNAVAILABLE at once. Default: a quarter of --max-in-flight. 0: no such share.
    #[arg(long, env = "CELLRATE_MAX_IN_FLIGHT_PER_ADDRESS")]
    pub max_in_flight_per_address: Option<usize>,
}
