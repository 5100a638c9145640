//! Limits: names and id formats ([`names`]), the validated configuration ([`config`]) and
//! Envoy descriptor mapping ([`descriptors`]).

pub mod config;
pub mod descriptors;
pub mod names;
pub mod reload;
