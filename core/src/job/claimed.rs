//! What a claim hands a worker: the stored [`Job`] and the lease to run it under ([`Claim`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::new::{default_max_snoozes, Tick};
use crate::ids::{JobId, Lease, Scope};
use crate::traceparent::TraceContext;

/// A job as stored, handed out inside a [`Claim`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// Queue it came from.
    pub queue: String,
    /// Handler name.
    pub kind: String,
    /// JSON payload.
    pub payload: String,
    /// Protected resource.
    pub scope: Scope,
    /// 1 on the first claim, +1 on every later claim (after a retry or a stall; a snooze
    /// gives its attempt back).
    pub attempt: u32,
    /// Expired leases so far.
    pub stalls: u32,
    /// Times it snoozed so far ([`JobError::snooze`](crate::job::JobError::snooze)).
    #[serde(default)]
    pub snoozes: u32,
    /// Snoozes allowed.
    #[serde(default = "default_max_snoozes")]
    pub max_snoozes: u32,
    /// How long one attempt may run ([`NewJob::with_timeout`](crate::job::NewJob::with_timeout)); `None`: the kind's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Not started by then (Unix ms), it dies as expired ([`NewJob::with_deadline`](crate::job::NewJob::with_deadline)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Handler failures allowed.
    pub max_attempts: u32,
    /// Stalls allowed.
    pub max_stalls: u32,
    /// The flow step it is, if it is one ([`Flow`](crate::flow::Flow)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<crate::flow::FlowStep>,
    /// The schedule tick it was enqueued for, if a schedule enqueued it: a report job learns
    /// which day it covers from this, not from the clock when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick: Option<Tick>,
    /// The trace it belongs to: the context its producer enqueued it under, kept through
    /// every retry, stall, release and dead-letter retry (each attempt is a new span in it).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::traceparent::lenient"
    )]
    pub trace: Option<TraceContext>,
    /// The group it shares claims with ([`NewJob::with_group`](crate::job::NewJob::with_group)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// A job plus the lease that lets one worker run it.
#[derive(Clone, Debug)]
pub struct Claim {
    /// The job.
    pub job: Job,
    /// The lease.
    pub lease: Lease,
}
