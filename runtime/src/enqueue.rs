//! The one enqueue path: [`Client`](crate::Client), the [`Coordinator`](crate::Coordinator)
//! actor, the scheduler and the CLI all enqueue through [`enqueue_counted`], so every job gets
//! its id before the first attempt, a lost reply is retried with the same ids, and the
//! enqueue counter and span are the same whoever enqueued.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use metrics::counter;
use tracing::Instrument as _;

use crate::error::{Error, Result};
use crate::ids::JobId;
use crate::job::{Enqueued, NewJob, ENQUEUE_RETRY_FOR, ENQUEUE_RETRY_WINDOW};
use crate::metrics as m;
use crate::store::LeaseStore;

/// Enqueues and counts the jobs added per queue in `palisade_jobs_enqueued_total`: the one
/// enqueue path of [`Client`](crate::Client), the [`Coordinator`](crate::Coordinator) actor, the scheduler and
/// `palisade enqueue`.
///
/// Every job without an id gets one here, before the first attempt ([`NewJob::with_id`], kept
/// taken for [`ENQUEUE_RETRY_WINDOW`]), and a transient failure is retried with the same ids
/// for up to [`ENQUEUE_RETRY_FOR`]: a reply lost after the backend acted cannot add a job
/// twice. A batch with a job whose own unique key lapses within the window is not retried
/// (its failure is [`Error::OutcomeUnknown`] at once). A job found existing under the very id
/// minted for it was added by an earlier attempt of this call (no one else knows the id), so
/// it is reported as added.
pub async fn enqueue_counted(
    store: &dyn LeaseStore,
    mut jobs: Vec<NewJob>,
) -> Result<Vec<Enqueued>> {
    let span = crate::trace::enqueue_span(&mut jobs);
    let done = enqueue_minted(store, jobs).instrument(span.clone()).await;
    if let Err(e) = &done {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", tracing::field::display(e));
    }
    done
}

/// [`enqueue_counted`] inside its span.
async fn enqueue_minted(store: &dyn LeaseStore, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
    let mut minted = HashSet::new();
    let jobs: Vec<NewJob> = jobs
        .into_iter()
        .map(|job| match job.id {
            Some(_) => job,
            None => {
                let id = JobId::new();
                minted.insert(id);
                job.with_id_for(id, ENQUEUE_RETRY_WINDOW)
            }
        })
        .collect();
    let queues: Vec<String> = jobs.iter().map(|j| j.queue.clone()).collect();
    // A retry is safe only if every job's id stays taken longer than the retries go on: a job
    // whose own unique key lapses sooner (`--unique-ttl 0s`) could be done and gone, key and
    // all, when the retry arrives, and would be added again.
    let retry_safe = jobs.iter().all(|j| {
        j.unique
            .as_ref()
            .is_some_and(|u| u.ttl >= ENQUEUE_RETRY_WINDOW)
    });
    let done = with_retries(retry_safe, jobs.len(), || store.enqueue_all(jobs.clone())).await?;
    let done: Vec<Enqueued> = done
        .into_iter()
        .zip(&jobs)
        .map(|(what, job)| match what {
            // This job itself, under the id minted for it (not another job of the batch's).
            Enqueued::Existing(id) if job.id == Some(id) && minted.contains(&id) => {
                Enqueued::Added(id)
            }
            what => what,
        })
        .collect();
    let mut per_queue: HashMap<String, u64> = HashMap::new();
    for (queue, what) in queues.into_iter().zip(&done) {
        if matches!(what, Enqueued::Added(_)) {
            *per_queue.entry(queue).or_default() += 1;
        }
    }
    for (queue, n) in per_queue {
        counter!(m::JOBS_ENQUEUED, "queue" => queue).increment(n);
    }
    Ok(done)
}

/// Runs the enqueue `attempt` of `jobs` jobs until it succeeds, fails for good, or has failed
/// transiently for [`ENQUEUE_RETRY_FOR`], backing off from 50 ms to 1 s (once only, when a
/// retry is not `safe`). A transient failure it gives up on may have happened after the
/// backend acted (a lost reply), so it is [`Error::OutcomeUnknown`], never "not added": the
/// same jobs enqueued again add nothing if they carry ids ([`NewJob::with_id`]).
pub(crate) async fn with_retries<T, F, Fut>(safe: bool, jobs: usize, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let started = tokio::time::Instant::now();
    let mut backoff = Duration::from_millis(50);
    loop {
        match attempt().await {
            // A layout error is decided before anything changes; the others may not be.
            Err(e @ (Error::Unavailable(_) | Error::OutcomeUnknown(_))) => {
                if !safe || started.elapsed() + backoff >= ENQUEUE_RETRY_FOR {
                    return Err(Error::OutcomeUnknown(format!(
                        "{jobs} job(s) may or may not have been enqueued: {e}"
                    )));
                }
                crate::repeats::warn_repeated!(error = %e, "enqueue failed; retrying with the same job ids");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            done => return done,
        }
    }
}
