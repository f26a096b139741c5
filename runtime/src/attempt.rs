//! One attempt of a job as the [`Worker`](crate::Worker) runs it and as the testing harness
//! runs it: the handler (a fatal error for a kind without one), a panic turned into a retry,
//! the timeout with its grace, and the settlement the outcome makes. Kept apart from the
//! worker's actor so the harness runs exactly what a worker runs.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::context::{JobContext, Registry, RunState};
use crate::job::{Job, JobError, Settlement};
use crate::policy::RetryPolicy;

/// What an attempt's handler returns.
pub(crate) type Outcome = std::result::Result<(), JobError>;

/// The run of `ctx`'s job: its kind's handler, or a fatal error naming the unknown kind.
pub(crate) fn start(
    registry: &Registry,
    job: &Job,
    ctx: JobContext,
) -> BoxFuture<'static, Outcome> {
    match registry.get(&job.kind) {
        Some(handler) => {
            // A durable run's end is checked, and its journals' clearing set going with its
            // completion (context/durable.rs).
            let end = ctx.twin();
            let run = handler(ctx, &job.payload);
            Box::pin(async move {
                run.await?;
                crate::context::durable::finish(&end).await
            })
        }
        None if job.kind == crate::context::durable::CLEAR => {
            Box::pin(crate::context::durable::clear(ctx, job.payload.clone()))
        }
        None => {
            let reason = format!("unknown job kind {:?}", job.kind);
            Box::pin(async move { Err(JobError::Fatal(reason)) })
        }
    }
}

/// Runs `run` to its outcome: a panic becomes a retry (it must not take the worker down or
/// lose the job), and with a `timeout` it is [`bounded`]. Returns the outcome and whether it
/// timed out.
pub(crate) async fn finish(
    run: impl Future<Output = Outcome>,
    timeout: Option<Duration>,
    grace: Duration,
    cancel: &CancellationToken,
) -> (Outcome, bool) {
    let run = AssertUnwindSafe(run).catch_unwind().map(|ran| {
        ran.unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            Err(JobError::retry(format!("handler panicked: {what}")))
        })
    });
    match timeout {
        Some(limit) => bounded(run, limit, grace, cancel).await,
        None => (run.await, false),
    }
}

/// Runs an attempt's handler `run` for at most `limit`; then fires its cancellation token and
/// gives it `grace` to return. One that does not is dropped — aborted at the `.await` it
/// waits in, which frees its slot (a handler that blocks its thread without awaiting cannot
/// be aborted: run blocking work in `spawn_blocking`). What it had sent is not undone: a
/// write already at a sink is decided there, and once the job's next attempt holds a newer
/// token, or the lease is gone, the fence refuses anything later. Returns the outcome and
/// whether it is "timed out": a handler that returns within the grace keeps a fatal error,
/// a fence refusal (which may reseed the coordinator) or a snooze; its success or retry
/// becomes the timed-out retry — it was cut short.
async fn bounded(
    run: impl Future<Output = Outcome>,
    limit: Duration,
    grace: Duration,
    cancel: &CancellationToken,
) -> (Outcome, bool) {
    tokio::pin!(run);
    if let Ok(outcome) = tokio::time::timeout(limit, &mut run).await {
        return (outcome, false);
    }
    cancel.cancel();
    match tokio::time::timeout(grace, &mut run).await {
        Ok(Err(e @ (JobError::Fatal(_) | JobError::Fenced(_) | JobError::Snooze { .. }))) => {
            (Err(e), false)
        }
        Ok(_) => (Err(crate::policy::timed_out(limit, None)), true),
        Err(_) => (Err(crate::policy::timed_out(limit, Some(grace))), true),
    }
}

/// How the attempt of `job` that ended with `outcome` settles under `retry` (the kind's
/// policy, else the worker's). The result and the follow-up jobs go with a completion, in
/// the same atomic step: an accepted completion has them, a refused one (the lease is no
/// longer current) leaves none. Follow-ups are taken whatever the outcome, so none can be
/// asked for after the run ended.
pub(crate) fn settlement(
    registry: &Registry,
    retry: RetryPolicy,
    job: &Job,
    outcome: &Outcome,
    run: &RunState,
) -> Settlement {
    let mut settlement =
        registry
            .retry_of(&job.kind, retry)
            .settle(job, outcome, rand::random::<f64>());
    let asked = run.take_follow_ups();
    if let Settlement::Complete { result, then } = &mut settlement {
        *result = run.take_result();
        *then = asked;
    }
    settlement
}
