//! cellrate-limits: the limits as configured, the floor above the core.
//!
//! Names ([`names`]), ids and their formats ([`ids`]), the validated configuration
//! ([`config`]), envoyproxy/ratelimit's file format ([`ratelimit_format`]), Envoy
//! descriptor mapping ([`descriptors`]) and durations as the config writes them
//! ([`duration`]); [`hash`] is the hasher of their maps. Pure configuration: no I/O but
//! reading the limits directory, nothing from above the core (`cellrate-core`).
//!
//! ```
//! use cellrate_limits::config::{LimitTable, Policy};
//!
//! // A limits directory's files: the name `api`, and 10 a second for each of its callers.
//! let file = |name: &str, text: &str| (name.to_string(), text.to_string());
//! let files = [
//!     file("names.yaml", "api:\n  number: 100\n  format: string\n"),
//!     file("defaults.yaml", "api:\n  burst: 10\n  count: 10\n  period: 1s\n"),
//! ];
//! let table = LimitTable::from_files(&files).unwrap();
//! let api = table.names().get("api").unwrap();
//! match table.policy(api, "alice") {
//!     Some(Policy::Limited { limit, .. }) => assert_eq!(limit.burst(), 10),
//!     other => panic!("api is limited: {other:?}"),
//! }
//! ```
//!
//! # Layout
//!
//! Every file, by room (a test keeps this map equal to the files):
//!
//! ```text
//! lib.rs                     names, ids, the validated configuration; this map
//! names/mod.rs               limit names: the registry, built-in and declared
//! names/key.rs               bucket keys ("<number>:<id>")
//! ids.rs                     id formats and canonical ids
//! descriptors/mod.rs         Envoy descriptors -> names and ids, domain by domain
//! descriptors/rule.rs        one rule: built, checked, applied to entries
//! duration.rs                durations as written (1s, 1h30m, 7d)
//! hash.rs                    the maps' hasher
//! config/mod.rs              YAML -> validated, immutable LimitTable; its lookups
//! config/policy.rs           what applies to a bucket, what an override keeps
//! config/build.rs            the table assembled, file by kind, errors collected
//! config/entries.rs          names, defaults and overrides, entry by entry
//! config/across_files.rs     what only the files together get wrong (window kinds)
//! config/files.rs            the directory read, bounded
//! config/raw.rs              the files as written
//! config/reservation.rs      a limit's reservation policy
//! ratelimit_format/mod.rs    envoyproxy/ratelimit's file format
//! ratelimit_format/read.rs   its YAML read
//! ratelimit_format/xds.rs    its xDS resources
//! ratelimit_format/wildcards.rs  its wildcard entries
//! ```

pub mod config;
pub mod descriptors;
pub mod duration;
pub mod hash;
pub mod ids;
pub mod names;
pub mod ratelimit_format;
