//! Palisade: a job runtime where a worker whose lease has expired can keep running, but can no
//! longer change anything that matters.
//!
//! Every claim carries a [`Lease`]: an opaque [`LeaseId`] plus a [`FencingToken`] that only
//! grows per [`Scope`]. Every protected write carries both to a fenced sink, which applies the
//! [admission rule](rules::ScopeFence::admit) atomically: older tokens are refused
//! ([`Rejection::StaleToken`]), a token presented by a second lease is refused
//! ([`Rejection::TokenConflict`]), and a same-generation retry is a [`Admission::Duplicate`].
//!
//! # Layout
//!
//! The root holds what a user touches to define, run, enqueue and watch jobs; [`limits`] every
//! limit and retention period, [`rules`] the pure rules, [`types`] the rest of the types the
//! coordinator and sinks speak, [`store`] the store traits and backends, [`metrics`] the metric
//! names and the exporter.
//!
//! The rules and types come from `palisade-core` (`ids`, `admission`, `mutation`, `policy`,
//! `group`, `flow`, `schedule`, `job`, `error`, `traceparent`, the store traits and the memory
//! stores), the Redis and Postgres backends from `palisade-redis` and `palisade-postgres`
//! (`store::redis`, one Lua script per operation; `store::postgres`, fenced transactions on the
//! user's own rows and the outbox). This crate's own modules:
//!
//! - `coordinator`, `worker`, `renewal`, `sink`, `relay`, `scheduler`, `sampler`, `history`:
//!   one actor each ([`Coordinator`], [`Worker`], `Renewal` (internal: one per worker),
//!   [`FencedSink`], [`OutboxRelay`], ...), messages beside their handlers; a notification lives
//!   with its sender (`renewal` sends `LeaseLost` to the worker).
//! - `client`: [`Client`], the producer's plain async handle (tokio only, no actors);
//!   `enqueue`: the one enqueue path; `flow_driver`: creating flows and moving them on.
//! - `context`: what a handler sees ([`JobContext`], [`SinkHandle`], [`PostgresHandle`]) and
//!   the handler [`Registry`].
//! - `attempt`: one attempt as a worker runs it (shared with `testing`'s harness).
//! - `trace`: the spans around a job; `otel` (feature `otel`): their OTLP export; `exporter`:
//!   `/metrics`, `/healthz`, `/readyz`.
//!
//! A user's worker binary (`App`), the operator console and the HTTP API are the crate
//! `palisade-cli`, built on this one. No file of any of these crates imports, through others,
//! a file that imports it (`.ci/cycles.py` checks).
//!
//! # Features
//!
//! On by default: `redis` (`store::redis`, [`Client::connect`]) and `postgres` (the
//! Postgres sink, `OutboxRelay`, `PostgresEpochSource`). With none, the library is the
//! embedded in-memory coordinator (`examples/embedded_only` runs it so); `otel` (off)
//! exports every attempt, fenced write, enqueue and stall as OpenTelemetry spans over OTLP
//! (`otel::Export`, docs/tracing.md); `openapi` (off) derives the HTTP API's schema on the
//! types it sends (palisade-cli turns it on); `testing` (off; for your dev-dependencies) adds
//! `testing`, the harness your handlers' unit tests run them in, and `Freeze`, the fault
//! injection this repository's own tests use.
//!
//! # Defining a job
//!
//! ```
//! use palisade::{JobContext, JobError, Mutation, Registry};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Deposit { account: u32, cents: i64 }
//!
//! async fn deposit(ctx: JobContext, d: Deposit) -> Result<(), JobError> {
//!     let ledger = ctx.sink("ledger")?;
//!     ledger
//!         .write(vec![Mutation::HashIncr {
//!             key: format!("account:{}", d.account),
//!             field: "balance".into(),
//!             by: d.cents,
//!         }])
//!         .await?
//!         .accepted()?; // a stale holder stops here with JobError::Fenced
//!     Ok(())
//! }
//!
//! let registry = Registry::new().register("deposit", deposit);
//! assert_eq!(registry.kinds().collect::<Vec<_>>(), ["deposit"]);
//! ```

#[doc(hidden)]
pub mod cli_support;
// The core's modules, so the runtime's files name them as they did inside one crate.
pub(crate) use palisade_core::{
    admission, error, flow, group, ids, job, mutation, policy, repeats, schedule, traceparent,
};
mod attempt;
mod client;
mod context;
mod coordinator;
mod enqueue;
mod exporter;
mod flow_driver;
mod history;
mod linger;
pub mod metrics;
#[cfg(feature = "otel")]
pub mod otel;
#[cfg(feature = "postgres")]
mod relay;
mod renewal;
mod sampler;
mod scheduler;
mod sink;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod trace;
mod worker;
mod write_deadline;

// The root: what a user touches to define, run, enqueue and watch jobs. Limits and retention
// periods are in `limits`, the pure rules in `rules`, the store traits and drivers in `store`.
pub use admission::{Admission, Rejection};
pub use client::Client;
pub use context::durable;
#[cfg(feature = "postgres")]
pub use context::PostgresHandle;
pub use context::{JobContext, Registry, SinkHandle, Sinks};
pub use coordinator::{Coordinator, CountJobs, Enqueue, ListDead};
pub use error::{Error, Result};
pub use flow::{Flow, FlowState, FlowStatus, OnDead, Step, StepEnd, StepState, StepStatus};
pub use group::{GroupLimits, GroupStatus};
pub use ids::{FencingToken, FlowId, IdempotencyKey, JobId, Lease, LeaseId, Scope};
pub use job::{
    Attempt, AttemptOutcome, Cancelled, CompletedJob, CompletedRetention, DeadAction, DeadFilter,
    DeadJob, DeadSweep, Enqueued, Job, JobDetails, JobError, JobState, JobView, NewJob,
    QueueCounts, RateLimit,
};
pub use mutation::{Mutation, Value};
pub use policy::RetryPolicy;
#[cfg(feature = "postgres")]
pub use relay::OutboxRelay;
pub use schedule::{CatchUp, Schedule};
pub use scheduler::Scheduler;
pub use sink::{FencedSink, Write};
pub use store::memory::{MemoryFencedStore, MemoryLeaseStore};
#[cfg(feature = "postgres")]
pub use store::postgres::{PostgresFencedStore, PostgresSink};
#[cfg(feature = "redis")]
pub use store::redis::{RedisFencedStore, RedisLeaseStore};
pub use store::{FencedStore, Stores};
pub use traceparent::TraceContext;
#[cfg(feature = "testing")]
pub use worker::Freeze;
pub use worker::{Drain, Worker, WorkerConfig};

/// The installation's format level: the window of stored-record shapes this build reads and
/// writes, and the rule `palisade upgrade finalize` follows (docs/operations.md, "Rolling
/// deploys").
pub use palisade_core::format;

/// Every limit a job, flow, name or payload is held to, and how long things are kept: the
/// numbers the rest of the API's docs refer to.
pub mod limits {
    pub use crate::context::MAX_RESULT_BYTES;
    pub use crate::coordinator::FOLLOW_UP_GRACE;
    pub use crate::flow::{FLOW_RETENTION, MAX_FLOW_BYTES, MAX_FLOW_STEPS};
    pub use crate::job::{
        DEBOUNCE_KEPT, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_SNOOZES,
        ENQUEUE_RETRY_FOR, ENQUEUE_RETRY_WINDOW, ID_RETENTION, MAX_ATTEMPTS_KEPT,
        MAX_ATTEMPT_ERROR_BYTES, MAX_COMPLETED_KEPT, MAX_DELAY, MAX_FOLLOW_UPS,
        MAX_FOLLOW_UP_BYTES, MAX_NAME_BYTES, MAX_TICK_MS, PRIORITY_RANGE, RESULT_RETENTION,
    };
    pub use crate::schedule::TICK_KEY_TTL;
    pub use crate::store::HISTORY_SAMPLES;
    pub use crate::traceparent::MAX_TRACESTATE_BYTES;
}

/// The pure rules every backend and actor carries out, for those who test or build on them:
/// the admission rule, the flow rule, Redis' integer syntax, a batch's fingerprint.
pub mod rules {
    pub use crate::admission::{advance, decide, Fence, ScopeFence};
    pub use crate::flow::{
        added_step_name, check_added, decide as decide_step, graph_difference, in_run_order,
        step_job_id, Decision, Edge, FlowStep, Release, ReleaseAction, StepEnded,
    };
    pub use crate::job::{batch_fingerprint, clip_error};
    pub use crate::mutation::redis_integer;
}

/// The types a handler's context, a claim, a settlement and the sinks' and relay's options are
/// made of, for those who build on the coordinator directly.
pub mod types {
    pub use crate::history::Historian;
    pub use crate::job::{Claim, Debounce, FollowUps, Settlement, Then, Tick, UniqueKey};
    #[cfg(feature = "postgres")]
    pub use crate::relay::{OutboxTarget, RelayConfig};
    pub use crate::schedule::ScheduleSpec;
    pub use crate::sink::{ReadFence, ReadValue};
    pub use crate::worker::Drained;
}

// Kept at the root, hidden, so code written against the earlier (wider) root still compiles;
// new code names them through `limits`, `rules`, `types` and `store`.
#[cfg(feature = "postgres")]
#[doc(hidden)]
pub use store::postgres::{
    BoxError, Fenced, FencedTx, OutboxCounts, OutboxWriter, PostgresEpochSource, TransactionFn,
};
#[doc(hidden)]
pub use {
    limits::*,
    rules::*,
    store::epoch::{EpochSource, FileEpochSource},
    store::{
        ClaimRequest, ControlStore, FencedWrite, HistorySample, Inspect, LeaseInfo, LeaseStore,
        QueueAdmin, Reaped, RecordStore, RejectionNote, WorkerBeat,
    },
    types::*,
};
