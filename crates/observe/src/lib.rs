//! cellrate-observe: what cellrate tells its operators, the leaves over the core.
//!
//! The Prometheus series ([`metrics`]), the health and readiness state with the metrics
//! listener's routes ([`health`]), and who is being limited ([`top`], for admin `Top`).
//! envoyproxy/ratelimit's statistics keys and its statsd_exporter mapping are here too, as
//! series. Nothing from above the core (`cellrate-core`): the stores and the service
//! report through these types.
//!
//! ```
//! use cellrate_observe::metrics::Metrics;
//!
//! let metrics = Metrics::new();
//! metrics.rpc("Check", tonic::Code::Ok, 0.001);
//! let text = metrics.render();
//! assert!(text.contains(r#"cellrate_rpc_requests_total{code="OK",rpc="Check"} 1"#));
//! ```
//!
//! # Layout
//!
//! Every file, by room (a test keeps this map equal to the files):
//!
//! ```text
//! lib.rs                     metrics, health, top; this map
//! health.rs                  /healthz and /readyz state
//! top.rs                     who is being limited
//! metrics/mod.rs             every Prometheus series, and nothing else
//! metrics/groups.rs          the series by what they watch
//! metrics/counters.rs        decisions counted without a lookup
//! metrics/extra_labels.rs    labels on every series (EXTRA_TAGS)
//! metrics/ratelimit_keys.rs  envoyproxy/ratelimit's statistics keys
//! metrics/ratelimit_stats.rs  its statistics counted under them, and mapped
//! metrics/statsd_mapping.rs  a statsd_exporter mapping, applied to a name
//! metrics/statsd_mapping_file.rs  its file read and checked, bounded
//! ```

pub mod health;
pub mod metrics;
pub mod top;
