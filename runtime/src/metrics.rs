//! Metric names (one place, so dashboards and code agree) and the Prometheus exporter
//! ([`serve`], [`Health`]).
//!
//! Labels are low-cardinality only: queue, kind, sink, reason, outcome — never job ids or
//! scopes, which would make a series per job.

pub use crate::exporter::{serve, serve_prometheus, Health};
/// What [`serve`] and [`serve_prometheus`] return (`render()` gives the `/metrics` text),
/// re-exported so a caller needs no version-matched exporter dependency to name it.
pub use metrics_exporter_prometheus::PrometheusHandle;
pub use palisade_core::metrics::*;
