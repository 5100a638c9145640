//! cellrate-core: exact rate-limit arithmetic, the floor of cellrate.
//!
//! Every decision cellrate makes is computed here, in integer nanoseconds, with no I/O and
//! no async runtime: a store (memory, Redis, the Redis module) holds the state, and calls
//! these functions to decide over it atomically.
//!
//! - [`gcra`]: a [`gcra::Limit`] (GCRA, a calendar window or a concurrency limit), and
//!   what a request does to its bucket: spend, charge (debt), refund; batches decided all
//!   or nothing; leases acquired and released.
//! - [`clock`]: [`clock::Nanos`], the [`clock::Clock`] decisions read (the only OS clock
//!   read of the project), calendar windows in UTC and in IANA zones.
//! - [`text`]: caller text cut for logs and errors, and a throttle for log lines.
//! - [`cell`]: redis-cell's `CL.THROTTLE`, its five numbers from a GCRA spend (the RESP
//!   listener and the Redis module answer it); [`redis_gcra`]: Redis 8.8's `GCRA`, the same.
//!
//! ```
//! use cellrate_core::clock::SECOND;
//! use cellrate_core::gcra::{spend, Limit};
//!
//! // 10 a second, bursts of 10: the eleventh request at one instant is denied.
//! let limit = Limit::new(10, 10, SECOND).unwrap();
//! let (now, mut tat) = (1_000 * SECOND, None);
//! for _ in 0..10 {
//!     let (decision, next) = spend(&limit, now, tat, 1);
//!     assert!(decision.allowed);
//!     tat = next;
//! }
//! let (denied, _) = spend(&limit, now, tat, 1);
//! assert!(!denied.allowed);
//! assert_eq!(denied.retry_in, SECOND / 10);
//! ```
//!
//! # Layout
//!
//! Every file, by room (a test keeps this map equal to the files):
//!
//! ```text
//! lib.rs                 this map
//! gcra/                  pure arithmetic
//! gcra/mod.rs            Limit (GCRA, calendar, concurrency): its numbers and bounds
//! gcra/bucket.rs         one bucket: spend, charge (into debt), refund; the Decision
//! gcra/batch.rs          batches, all or nothing: each item's Mode; the strictest
//! gcra/calendar.rs       calendar windows: Limit::calendar, spend and refund in one
//! gcra/lease.rs          leases: acquire, release
//! gcra/stored.rs         a bucket's steps on its stored number (the Redis module's too)
//! gcra/fixtures.rs      (tests) the times and limit the bucket and batch tests share
//! clock.rs               Nanos, Clock, FakeClock; UTC windows (the only OS clock read)
//! clock/zoned.rs         days, weeks, months, years in an IANA zone
//! text.rs                caller text cut for logs and errors; log lines throttled
//! cell.rs                redis-cell's CL.THROTTLE: its five numbers from cellrate's GCRA
//! redis_gcra.rs          Redis 8.8's GCRA command: its arguments and five numbers
//! ```

pub mod cell;
pub mod clock;
pub mod gcra;
pub mod redis_gcra;
pub mod text;
