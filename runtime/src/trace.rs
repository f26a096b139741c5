//! The trace a job belongs to, carried with it, and the spans the runtime opens around it.
//!
//! A job carries the W3C trace context (`traceparent`, `tracestate`) of whoever enqueued it
//! ([`TraceContext`], `NewJob::trace`, `Job::trace`) through every retry, stall, release and
//! dead-letter retry. That part needs no feature: it is text kept in the job record, and every
//! log line of an attempt carries its `trace_id`. The spans are `tracing` spans (so a
//! handler's own spans nest inside them); with the `otel` feature they continue the job's
//! trace and are exported over OTLP (`crate::otel`).
//!
//! Span names and attributes follow OpenTelemetry's messaging conventions where they have one
//! (`messaging.*`), and `palisade.*` for the fence.

use tracing::{field::Empty, Span};

use crate::admission::{Admission, Fence, Rejection};
use crate::ids::{IdempotencyKey, Lease, Scope};
use crate::job::Job;
use crate::traceparent::TraceContext;

/// The span of one attempt (`palisade.job`, a messaging "process" span): its parent is the
/// job's trace context. `trace_id` and `span_id` are recorded for log lines (JSON logs carry
/// them) once the context is known: [`attempt_context`].
pub(crate) fn job_span(job: &Job, lease: &Lease, worker: &str) -> Span {
    let span = tracing::info_span!(
        target: "palisade::job",
        "palisade.job",
        otel.name = %format_args!("process {}", job.queue),
        otel.kind = "consumer",
        otel.status_code = Empty,
        otel.status_description = Empty,
        messaging.system = "palisade",
        messaging.operation.type = "process",
        messaging.destination.name = %job.queue,
        messaging.message.id = %job.id,
        palisade.job.kind = %job.kind,
        palisade.job.attempt = job.attempt,
        palisade.job.stalls = job.stalls,
        palisade.scope = %lease.scope,
        palisade.fencing_token = lease.token.as_u64(),
        palisade.lease_id = %lease.id,
        palisade.worker = worker,
        palisade.outcome = Empty,
        trace_id = Empty,
        span_id = Empty,
    );
    #[cfg(feature = "otel")]
    crate::otel::continue_trace(&span, job.trace.as_ref());
    span
}

/// The trace an attempt runs in, as its follow-up jobs and rejection notes carry it: the
/// attempt span's own context where one is exported (`otel`), else the job's. Recorded on the
/// span as `trace_id` / `span_id`.
pub(crate) fn attempt_context(span: &Span, job: &Job) -> Option<TraceContext> {
    #[cfg(feature = "otel")]
    if let Some(own) = crate::otel::context_of(span) {
        span.record("trace_id", own.trace_id());
        span.record("span_id", own.span_id());
        return Some(own);
    }
    // No span of its own: the job's trace, and no span id (the one in the job's context is
    // its producer's, not this attempt's).
    if let Some(c) = &job.trace {
        span.record("trace_id", c.trace_id());
    }
    job.trace.clone()
}

/// How an attempt ended, on its span.
pub(crate) fn record_attempt(span: &Span, outcome: &Result<(), crate::job::JobError>) {
    match outcome {
        Ok(()) => {
            span.record("palisade.outcome", "ok");
        }
        // A snooze is no failure: the span ends without an error status.
        Err(crate::job::JobError::Snooze { .. }) => {
            span.record("palisade.outcome", "snoozed");
        }
        Err(e) => {
            let outcome = e.outcome();
            span.record("palisade.outcome", outcome);
            span.record("otel.status_code", "error");
            span.record("otel.status_description", tracing::field::display(e));
        }
    }
}

/// One write span's fields (a span's name must be a literal).
macro_rules! write_fields {
    ($name:literal, $sink:expr, $scope:expr, $fence:expr, $key:expr) => {
        tracing::info_span!(
            target: "palisade::fence",
            $name,
            otel.kind = "client",
            otel.status_code = Empty,
            otel.status_description = Empty,
            palisade.sink = $sink,
            palisade.scope = %$scope,
            palisade.fencing_token = $fence.token.as_u64(),
            palisade.lease_id = %$fence.lease,
            palisade.idempotency_key = %$key,
            palisade.outcome = Empty,
            palisade.rejection = Empty,
            palisade.highest_token = Empty,
        )
    };
}

/// The span of one fenced write or transaction (`palisade.fenced_write`,
/// `palisade.pg_transaction`), a child of the attempt's: what it presented, and (recorded by
/// [`record_write`]) what the sink said.
pub(crate) fn write_span(
    name: &'static str,
    sink: &str,
    scope: &Scope,
    fence: Fence,
    key: &IdempotencyKey,
) -> Span {
    if name == "palisade.pg_transaction" {
        write_fields!("palisade.pg_transaction", sink, scope, fence, key)
    } else {
        write_fields!("palisade.fenced_write", sink, scope, fence, key)
    }
}

/// What the sink said, on a write span: `applied`, `duplicate`, `refused` (with the reason
/// and, for a token refusal, the newest token the sink holds) or `error`.
pub(crate) fn record_write(span: &Span, admission: &crate::Result<Admission>) {
    match admission {
        Ok(Admission::Applied) => {
            span.record("palisade.outcome", "applied");
        }
        Ok(Admission::Duplicate) => {
            span.record("palisade.outcome", "duplicate");
        }
        Ok(Admission::Rejected(r)) => {
            span.record("palisade.outcome", "refused");
            span.record("palisade.rejection", r.reason());
            if let Some(highest) = highest_token(r) {
                span.record("palisade.highest_token", highest);
            }
            span.record("otel.status_code", "error");
            span.record("otel.status_description", tracing::field::display(r));
        }
        Err(e) => {
            span.record("palisade.outcome", "error");
            span.record("otel.status_code", "error");
            span.record("otel.status_description", tracing::field::display(e));
        }
    }
}

/// The newest token a refusal names, if it names one.
pub(crate) fn highest_token(r: &Rejection) -> Option<u64> {
    r.highest_token()
}

/// The span of one enqueue call (`palisade.enqueue`, a messaging "send" span), whose context
/// the jobs that name no trace of their own are given (and those that name the one it
/// continues). Its parent is the caller's span or, with none, the context every job that names
/// one names (the HTTP API's `traceparent`). Without `otel` nothing is made: a job keeps the
/// trace it was given, if any.
pub(crate) fn enqueue_span(jobs: &mut [crate::job::NewJob]) -> Span {
    #[cfg(feature = "otel")]
    return crate::otel::enqueue_span(jobs);
    #[cfg(not(feature = "otel"))]
    {
        let _ = jobs;
        Span::none()
    }
}

/// The context a flow created now continues: the current span's where one is exported
/// (`otel`), else none.
pub(crate) fn current() -> Option<TraceContext> {
    #[cfg(feature = "otel")]
    return crate::otel::context_of(&Span::current());
    #[cfg(not(feature = "otel"))]
    None
}

/// Records a stall — a lease that expired while its job was unfinished, whose own attempt
/// span was never sent (its worker died or was paused) — as a short span in the job's trace
/// (`palisade.stall`) and a log line carrying its trace id.
pub(crate) fn stall(r: &crate::store::Reaped) {
    let outcome = if r.dead { "dead" } else { "requeued" };
    let trace_id = r.trace.as_ref().map_or("", |t| t.trace_id());
    let span = tracing::info_span!(
        target: "palisade::reaper",
        "palisade.stall",
        otel.status_code = "error",
        otel.status_description = "lease expired before the job settled",
        messaging.system = "palisade",
        messaging.destination.name = %r.queue,
        messaging.message.id = %r.job,
        palisade.lease_id = %r.lease,
        palisade.fencing_token = r.token.map(|t| t.as_u64()),
        palisade.worker = %r.worker,
        palisade.outcome = outcome,
        trace_id,
    );
    #[cfg(feature = "otel")]
    crate::otel::continue_trace(&span, r.trace.as_ref());
    tracing::warn!(parent: &span, job = %r.job, queue = %r.queue, lease = %r.lease, worker = %r.worker, outcome, trace_id, "lease expired before the job settled (stall)");
}
