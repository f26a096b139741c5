//! Palisade: a job runtime where a worker whose lease has expired can keep running, but can no
//! longer change anything that matters.
//!
//! Every claim carries a [`Lease`]: an opaque [`LeaseId`] plus a [`FencingToken`] that only
//! grows per [`Scope`]. Every protected write carries both to a fenced sink, which applies the
//! [admission rule](ScopeFence::admit) atomically: older tokens are refused
//! ([`Rejection::StaleToken`]), a token presented by a second lease is refused
//! ([`Rejection::TokenConflict`]), and a same-generation retry is a [`Admission::Duplicate`].
//!
//! # Layout
//!
//! - `ids`: [`JobId`], [`LeaseId`], [`FencingToken`], [`Scope`], [`IdempotencyKey`], [`Lease`].
//! - `admission`: the admission rule as a pure function ([`ScopeFence`], [`Admission`]).
//! - `mutation`: what a write changes ([`Mutation`]) and the pure all-or-nothing rule for
//!   when a mutation list fits the data (Redis' own integer rules, exact `i64`).
//! - `policy`: pure retry / stall decisions ([`RetryPolicy`]).
//! - `job`: what users enqueue ([`NewJob`]), a claim hands back ([`Job`]), handlers return
//!   ([`JobError`]) and operators read ([`JobView`]); `enqueue`: the one enqueue path.
//! - `store`: the coordinator traits by concern ([`LeaseStore`], [`Inspect`], [`QueueAdmin`],
//!   [`ControlStore`], [`RecordStore`]; [`Stores`] is all of them) and [`FencedStore`]; `store::memory`,
//!   `store::redis` (one Lua script per operation, `redis/lua/`), `store::postgres`
//!   ([`PostgresSink`]: fenced transactions on the user's own rows, the outbox, and
//!   [`PostgresFencedStore`]; migrations in `postgres/sql/`) and `store::epoch` (durable
//!   [`EpochSource`]s).
//! - `coordinator`, `worker`, `renewal`, `sink`, `relay`: one actor each ([`Coordinator`],
//!   [`Worker`], `Renewal` (internal: one per worker), [`FencedSink`], [`OutboxRelay`]),
//!   messages beside their handlers; a notification lives with its sender (`renewal` sends
//!   `LeaseLost` to the worker).
//! - `client`: [`Client`], the producer's plain async handle (tokio only, no actors).
//! - `flow` (rules), `flow_driver` (creating flows, moving them on): [`Flow`].
//! - `context`: what a handler sees ([`JobContext`], [`SinkHandle`], [`PostgresHandle`]) and
//!   the handler [`Registry`].
//! - `metrics`: metric names and the Prometheus exporter (`exporter`: `/metrics`, `/healthz`,
//!   `/readyz`).
//! - `traceparent`: the W3C trace context a job carries ([`TraceContext`]); `trace`: the spans
//!   around it; `otel` (feature `otel`): their OTLP export.
//!
//! A user's worker binary (`App`), the operator console and the HTTP API are the crate
//! `palisade-cli`, built on this one. No file here imports, through others, a file that
//! imports it (`.ci/cycles.py` checks).
//!
//! # Features
//!
//! On by default: `redis` (`store::redis`, [`Client::connect`]) and `postgres` (the
//! Postgres sink, `OutboxRelay`, `PostgresEpochSource`). With none, the library is the
//! embedded in-memory coordinator (`examples/embedded_only` runs it so); `otel` (off)
//! exports every attempt, fenced write, enqueue and stall as OpenTelemetry spans over OTLP
//! (`otel::Export`, docs/tracing.md); `openapi` (off) derives the HTTP API's schema on the
//! types it sends (palisade-cli turns it on); `testing` (off) exports `Freeze`, for tests.
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
mod trace;
mod worker;

pub use admission::{advance, decide, Admission, Fence, Rejection, ScopeFence};
pub use client::Client;
#[cfg(feature = "postgres")]
pub use context::PostgresHandle;
pub use context::{JobContext, Registry, SinkHandle, Sinks, MAX_RESULT_BYTES};
pub use coordinator::{Coordinator, CountJobs, Enqueue, ListDead, FOLLOW_UP_GRACE};
pub use error::{Error, Result};
pub use flow::{
    added_step_name, check_added, decide as decide_step, step_job_id, Decision, Edge, Flow,
    FlowState, FlowStatus, FlowStep, OnDead, Release, ReleaseAction, Step, StepEnd, StepEnded,
    FLOW_RETENTION, MAX_FLOW_BYTES, MAX_FLOW_STEPS,
};
pub use group::{GroupLimits, GroupStatus};
pub use history::Historian;
pub use ids::{FencingToken, FlowId, IdempotencyKey, JobId, Lease, LeaseId, Scope};
pub use job::{
    Cancelled, Claim, DeadJob, Debounce, Enqueued, FollowUps, Job, JobError, JobState, JobView,
    NewJob, QueueCounts, RateLimit, Settlement, Then, Tick, UniqueKey, DEBOUNCE_KEPT,
    DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_SNOOZES, ENQUEUE_RETRY_FOR, ENQUEUE_RETRY_WINDOW,
    ID_RETENTION, MAX_DELAY, MAX_FOLLOW_UPS, MAX_FOLLOW_UP_BYTES, MAX_NAME_BYTES, MAX_TICK_MS,
    PRIORITY_RANGE, RESULT_RETENTION,
};
pub use mutation::{redis_integer, Mutation, Value};
pub use policy::RetryPolicy;
#[cfg(feature = "postgres")]
pub use relay::{OutboxRelay, OutboxTarget, RelayConfig};
pub use schedule::{CatchUp, Schedule, ScheduleSpec, TICK_KEY_TTL};
pub use scheduler::Scheduler;
pub use sink::{FencedSink, ReadFence, ReadValue, Write};
pub use store::epoch::{EpochSource, FileEpochSource};
pub use store::memory::{MemoryFencedStore, MemoryLeaseStore};
#[cfg(feature = "postgres")]
pub use store::postgres::PostgresEpochSource;
#[cfg(feature = "postgres")]
pub use store::postgres::{
    BoxError, Fenced, FencedTx, OutboxCounts, OutboxWriter, PostgresFencedStore, PostgresSink,
    TransactionFn,
};
#[cfg(feature = "redis")]
pub use store::redis::{RedisFencedStore, RedisLeaseStore};
pub use store::{
    ClaimRequest, ControlStore, FencedStore, FencedWrite, HistorySample, Inspect, LeaseInfo,
    LeaseStore, QueueAdmin, Reaped, RecordStore, RejectionNote, Stores, WorkerBeat,
    HISTORY_SAMPLES,
};
pub use traceparent::{TraceContext, MAX_TRACESTATE_BYTES};
#[cfg(feature = "testing")]
pub use worker::Freeze;
pub use worker::{Drain, Drained, Worker, WorkerConfig};
