//! Limits: names ([`names`]), ids and their formats ([`ids`]), the validated configuration ([`config`]),
//! envoyproxy/ratelimit's file format ([`ratelimit_format`]),
//! Envoy descriptor mapping ([`descriptors`]) and durations as the config writes them
//! ([`duration`]); [`hash`] is the hasher of their maps. Pure configuration: no I/O but
//! reading the limits directory, no imports above the core.

pub mod config;
pub mod descriptors;
pub mod duration;
pub mod hash;
pub mod ids;
pub mod names;
pub mod ratelimit_format;
