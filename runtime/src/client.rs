//! `Client`: what a producer (a web service, a cron script) needs — enqueue jobs and read
//! counts — as a plain async handle. Tokio only: no actix `System`, no actors, so it drops
//! into an axum or actix-web handler as is.

use std::collections::{HashMap, HashSet};

use metrics::counter;
use tracing::Instrument as _;

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::flow::{Flow, FlowState, FlowStatus};
use crate::ids::{FlowId, JobId};
use crate::job::{
    Cancelled, DeadJob, Enqueued, NewJob, QueueCounts, ENQUEUE_RETRY_FOR, ENQUEUE_RETRY_WINDOW,
};
use crate::metrics as m;
use crate::store::{FlowStore, Inspect, LeaseStore, QueueAdmin, RecordStore, Stores};

/// A cheap-to-clone handle for producers: enqueue one or many jobs (delayed ones too, with
/// [`NewJob::with_delay`]) and read queue counts, against Redis or an embedded coordinator.
#[derive(Clone)]
pub struct Client {
    store: Stores,
}

impl Client {
    /// A client of the Redis coordinator at `url` whose keys start with `prefix` — the same
    /// prefix the workers use (`--prefix`, default `palisade`), in one partition. Fails within
    /// seconds if Redis cannot be reached, and with [`Error::Config`](crate::Error::Config) if
    /// the installation runs in several partitions (build the store with
    /// [`store::redis::coordinator`](crate::store::redis::coordinator) then). Once the
    /// installation is moved to another layout (`palisade partitions`), this client's
    /// enqueues are refused: connect again.
    #[cfg(feature = "redis")]
    pub async fn connect(url: &str, prefix: &str) -> Result<Self> {
        use crate::store::redis::{ping, pool};
        let pool = pool(url)?;
        ping(&pool).await?;
        let generation = crate::store::redis::check_layout(pool.clone(), prefix, 1).await?;
        Ok(Self::new(crate::store::redis::coordinator(
            pool,
            prefix,
            1,
            generation,
            crate::job::DEFAULT_MAX_PAYLOAD_BYTES,
            |s| s,
        )?))
    }

    /// A client of any coordinator store, e.g. the [`MemoryLeaseStore`](crate::MemoryLeaseStore)
    /// an embedded [`Coordinator`](crate::Coordinator) runs on.
    pub fn new(store: impl Into<Stores>) -> Self {
        Self {
            store: store.into(),
        }
    }

    /// Enqueues one job; returns its id (for a job with a unique key another job holds, that
    /// job's id: see [`Client::enqueue_unique`] to tell the two apart).
    pub async fn enqueue(&self, job: NewJob) -> Result<JobId> {
        Ok(self.enqueue_unique(job).await?.id())
    }

    /// Enqueues one job and says whether it was added or another job holds its unique key
    /// ([`NewJob::with_unique_key`]).
    pub async fn enqueue_unique(&self, job: NewJob) -> Result<Enqueued> {
        let mut done = enqueue_counted(&self.store, vec![job]).await?;
        Ok(done.remove(0))
    }

    /// Enqueues jobs all or none, in one round trip; returns their ids in order.
    pub async fn enqueue_many(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>> {
        let done = enqueue_counted(&self.store, jobs).await?;
        Ok(done.into_iter().map(Enqueued::id).collect())
    }

    /// Counts of one queue.
    pub async fn counts(&self, queue: &str) -> Result<QueueCounts> {
        self.store.counts(queue).await
    }

    /// Job `id`'s result (its handler was registered with
    /// [`Registry::register_with_result`](crate::Registry::register_with_result)), once it
    /// completed and while the result is kept (a day): `None` before that. A result that
    /// could not be kept (too large, not encodable) or does not decode as `T` is an
    /// `Error::Payload` saying so.
    pub async fn result<T: DeserializeOwned>(&self, id: JobId) -> Result<Option<T>> {
        match self.store.result(id).await? {
            Some(envelope) => decode_result(id, &envelope).map(Some),
            None => Ok(None),
        }
    }

    /// Creates `flow` all or nothing ([`Flow`]): its steps' jobs are written held, then the
    /// flow is kept and its first steps released, so no step runs before the whole flow
    /// exists, and a creation that stops halfway leaves nothing that runs or shows. Creating
    /// the same flow again (a retried request: [`Flow::with_id`]) adds nothing. A transient
    /// failure is retried for up to [`ENQUEUE_RETRY_FOR`]. Returns the flow's id.
    pub async fn create_flow(&self, flow: &Flow) -> Result<FlowId> {
        let steps = flow.steps().len();
        with_retries(true, steps, || {
            crate::store::flows::create_unless_kept(&self.store, flow)
        })
        .await?;
        Ok(flow.id())
    }

    /// Flow `id`'s state, step outcomes and counts, while it is kept (a finished flow for
    /// [`FLOW_RETENTION`](crate::FLOW_RETENTION)).
    pub async fn flow(&self, id: FlowId) -> Result<Option<FlowStatus>> {
        self.store.flow(id).await
    }

    /// Cancels flow `id` as a whole: its steps that had not started go to the dead letters
    /// unrun ("flow cancelled"), its ready and running steps are cancelled like
    /// [`Client::cancel`] (a running one's lease revoked, its late writes fenced); its state
    /// is then [`FlowState::Cancelled`]. Returns how many jobs it asked to stop, or `None` for
    /// a flow not kept. A step that completed meanwhile stays completed; a flow that finished
    /// keeps its state. On an error, cancelling again finishes the work.
    pub async fn cancel_flow(&self, id: FlowId) -> Result<Option<usize>> {
        crate::store::flows::cancel(&self.store, id).await
    }

    /// Waits up to `timeout` for flow `id` to finish — succeeded, failed, or cancelled with
    /// every step ended; its status then, or `None` if it did not finish in time or is not
    /// kept.
    pub async fn wait_flow(&self, id: FlowId, timeout: Duration) -> Result<Option<FlowStatus>> {
        let start = tokio::time::Instant::now();
        let deadline = start
            .checked_add(timeout)
            .unwrap_or_else(|| start + Duration::from_secs(100 * 365 * 86_400));
        let mut pause = Duration::from_millis(10);
        loop {
            if let Some(status) = self.store.flow(id).await? {
                if status.state != FlowState::Running
                    && (status.state != FlowState::Cancelled || status.ended.len() == status.steps)
                {
                    return Ok(Some(status));
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// Waits up to `timeout` for job `id`'s result (see [`Client::result`]); `None` if it did
    /// not come in time.
    pub async fn wait<T: DeserializeOwned>(
        &self,
        id: JobId,
        timeout: Duration,
    ) -> Result<Option<T>> {
        let start = tokio::time::Instant::now();
        // A timeout too long to add is as good as forever (a century).
        let deadline = start
            .checked_add(timeout)
            .unwrap_or_else(|| start + Duration::from_secs(100 * 365 * 86_400));
        let mut pause = Duration::from_millis(10);
        loop {
            if let Some(value) = self.result(id).await? {
                return Ok(Some(value));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// Cancels job `id` (see [`Cancelled`]): a queued job goes to the dead letters with the
    /// reason "cancelled"; a running job's lease is revoked at once — its handler's
    /// cancellation token fires at its next renewal, its settlement is refused and its late
    /// writes are fenced — and it goes there too.
    pub async fn cancel(&self, id: JobId) -> Result<Cancelled> {
        self.store.cancel(id, "cancelled").await
    }

    /// Job `id`'s latest progress (`ctx.progress(..)`), if it reported any.
    pub async fn progress(&self, id: JobId) -> Result<Option<serde_json::Value>> {
        match self.store.progress(id).await? {
            Some(json) => serde_json::from_str(&json)
                .map(Some)
                .map_err(|e| Error::Payload(format!("job {id}'s progress: {e}"))),
            None => Ok(None),
        }
    }

    /// Dead-lettered jobs of one queue, oldest first, at most `limit`.
    pub async fn dead(&self, queue: &str, limit: usize) -> Result<Vec<DeadJob>> {
        self.store.dead(queue, limit).await
    }
}

/// A kept result's envelope (`{"ok": value}` or `{"error": why}`) decoded as `T`.
pub(crate) fn decode_result<T: DeserializeOwned>(id: JobId, envelope: &str) -> Result<T> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Kept<T> {
        Ok(T),
        Error(String),
    }
    match serde_json::from_str::<Kept<T>>(envelope) {
        Ok(Kept::Ok(value)) => Ok(value),
        Ok(Kept::Error(why)) => Err(Error::Payload(format!("job {id}: {why}"))),
        Err(e) => Err(Error::Payload(format!("job {id}'s result: {e}"))),
    }
}

/// Enqueues and counts the jobs added per queue in `palisade_jobs_enqueued_total`: the one
/// enqueue path of [`Client`], the [`Coordinator`](crate::Coordinator) actor, the scheduler and
/// `palisade enqueue`.
///
/// Every job without an id gets one here, before the first attempt ([`NewJob::with_id`], kept
/// taken for [`ENQUEUE_RETRY_WINDOW`]), and a transient failure is retried with the same ids
/// for up to [`ENQUEUE_RETRY_FOR`]: a reply lost after the backend acted cannot add a job
/// twice. A batch with a job whose own unique key lapses within the window is not retried
/// (its failure is [`Error::OutcomeUnknown`] at once). A job found existing under the very id
/// minted for it was added by an earlier attempt of this call (no one else knows the id), so
/// it is reported as added.
pub(crate) async fn enqueue_counted(
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
async fn with_retries<T, F, Fut>(safe: bool, jobs: usize, mut attempt: F) -> Result<T>
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
