//! Limits: names and id formats ([`names`]) and the validated configuration ([`config`]).

pub mod config;
pub mod names;
