//! Small runnable programs live in `examples/`; this crate also compiles and runs the code
//! blocks of the README and of every guide page under `docs/` as doctests, so neither can drift
//! from the API.
#![doc = include_str!("../../README.md")]

/// `docs/guarantees.md`.
#[doc = include_str!("../../docs/guarantees.md")]
pub mod guarantees {}

/// `docs/jobs.md`.
#[doc = include_str!("../../docs/jobs.md")]
pub mod jobs {}

/// `docs/redis.md`.
#[doc = include_str!("../../docs/redis.md")]
pub mod redis {}

/// `docs/postgres.md`.
#[doc = include_str!("../../docs/postgres.md")]
pub mod postgres {}

/// `docs/operations.md`.
#[doc = include_str!("../../docs/operations.md")]
pub mod operations {}

/// `docs/api.md`.
#[doc = include_str!("../../docs/api.md")]
pub mod api {}

/// `docs/tracing.md`.
#[doc = include_str!("../../docs/tracing.md")]
pub mod tracing {}

/// `docs/performance.md`.
#[doc = include_str!("../../docs/performance.md")]
pub mod performance {}

/// `docs/testing-your-jobs.md`.
#[doc = include_str!("../../docs/testing-your-jobs.md")]
pub mod testing_your_jobs {}

/// `docs/testing.md`.
#[doc = include_str!("../../docs/testing.md")]
pub mod testing {}
