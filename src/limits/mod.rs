//! Limits: names and id formats ([`names`]), the validated configuration ([`config`]) and
//! Envoy descriptor mapping ([`descriptors`]); [`hash`] is the hasher of their maps.

pub mod config;
pub mod descriptors;
pub mod hash;
pub mod names;
