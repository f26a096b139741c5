//! The core of Palisade: the rules and types every other crate of it builds on, with no I/O of
//! its own beyond the embedded in-memory stores. Users depend on `palisade`, which re-exports
//! what they touch; this crate is what the drivers (`palisade-redis`, `palisade-postgres`)
//! and `palisade` share.
//!
//! # Layout
//!
//! - `ids`: job, flow and lease ids, fencing tokens, scopes, idempotency keys, leases.
//! - `admission`: the admission rule as a pure function (`ScopeFence`, `Admission`).
//! - `mutation`: what a write changes (`Mutation`) and the pure all-or-nothing fit rule.
//! - `policy`, `group`, `flow`, `schedule`: the pure rules of retries, groups, flows and
//!   schedules.
//! - `job`: what producers enqueue, claims hand back, handlers return and operators read.
//! - `error`: the one error type and its classifier (`Error::is_retryable`).
//! - `traceparent`: the W3C trace context a job carries.
//! - `metrics`: metric names (one place, so dashboards and code agree).
//! - `store`: the coordinator's traits by concern and `Stores`, the sink trait `FencedStore`,
//!   the partitioned layout, the memory stores and file epochs.
//!
//! Items hidden from the docs are shared with Palisade's other crates and are not API: they
//! may change in any release.

pub mod admission;
pub mod clock;
pub mod error;
pub mod flow;
pub mod format;
pub mod group;
pub mod ids;
pub mod job;
pub mod metrics;
pub mod mutation;
pub mod policy;
#[doc(hidden)]
pub mod repeats;
pub mod schedule;
pub mod store;
pub mod traceparent;

pub use error::{Error, Result};
