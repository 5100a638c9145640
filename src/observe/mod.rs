//! What the process tells its operators: the Prometheus series ([`metrics`]), the health
//! and readiness state with the metrics listener's routes ([`health`]), and who is being
//! limited ([`top`], for admin `Top`).

pub mod health;
pub mod metrics;
pub mod top;
