//! `Client`: what a producer (a web service, a cron script) needs — enqueue jobs and read
//! counts — as a plain async handle. Tokio only: no actix `System`, no actors, so it drops
//! into an axum or actix-web handler as is.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::flow::{Flow, FlowState, FlowStatus};
use crate::ids::{FlowId, JobId};
use crate::job::{Cancelled, DeadJob, Enqueued, NewJob, QueueCounts};
use crate::store::{FlowStore, Inspect, QueueAdmin, RecordStore, Stores};

/// A cheap-to-clone handle for producers: enqueue one or many jobs (delayed ones too, with
/// [`NewJob::with_delay`]) and read queue counts, against Redis or an embedded coordinator.
#[derive(Clone)]
pub struct Client {
    store: Stores,
}

impl Client {
    /// Completes waitpoint `id` with `value` unless it was completed before (the first value
    /// stays: a webhook sent twice, two people clicking, change nothing), and wakes the
    /// durable run waiting for it ([`Durable::wait_for`](crate::durable::Durable::wait_for)).
    /// A value sent before the run reaches its wait is kept for it.
    pub async fn complete_waitpoint(
        &self,
        id: &str,
        value: &impl serde::Serialize,
    ) -> Result<crate::store::Completion> {
        let value = serde_json::to_string(value)
            .map_err(|e| Error::Payload(format!("waitpoint value: {e}")))?;
        complete_waitpoint(&self.store, id, value, false).await
    }

    /// Waitpoint `id` as kept: its value once completed, and the job waiting for it.
    pub async fn waitpoint(&self, id: &str) -> Result<Option<crate::store::Waitpoint>> {
        self.store.waitpoint(id).await
    }

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
        let mut done = crate::enqueue::enqueue_counted(&self.store, vec![job]).await?;
        Ok(done.remove(0))
    }

    /// Enqueues jobs all or none, in one round trip; returns their ids in order.
    pub async fn enqueue_many(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>> {
        let done = crate::enqueue::enqueue_counted(&self.store, jobs).await?;
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
    /// failure is retried for up to [`ENQUEUE_RETRY_FOR`](crate::ENQUEUE_RETRY_FOR). Returns the flow's id.
    pub async fn create_flow(&self, flow: &Flow) -> Result<FlowId> {
        let steps = flow.steps().len();
        crate::enqueue::with_retries(true, steps, || {
            crate::flow_driver::create_unless_kept(&self.store, flow)
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
        crate::flow_driver::cancel(&self.store, id).await
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

/// How long a completion keeps trying to wake its waiter while that run is still leased (it
/// asked for the waitpoint, found nothing, and has not suspended yet).
const WAKE_FOR: Duration = Duration::from_secs(30);

/// Completes waitpoint `id` and wakes its waiter: the run is made due now if it is
/// suspended. A run still leased (caught between asking and suspending, or busy past a wait
/// that ended) is tried again every 50 ms for up to [`WAKE_FOR`] — in the background unless
/// `wait` (the CLI, which exits when this returns) — so the wake is not lost; past that the
/// wait's own recheck finds the value. The completion stands whatever the wake meets: a wake
/// that fails is logged, never reported as the completion's failure.
#[doc(hidden)]
pub async fn complete_waitpoint(
    store: &Stores,
    id: &str,
    value: String,
    wait: bool,
) -> Result<crate::store::Completion> {
    use crate::store::Completion;
    let completion = store.complete_waitpoint(id, value).await?;
    let outcome = match &completion {
        Completion::First { .. } => "first",
        Completion::Already { .. } => "already",
    };
    metrics::counter!(crate::metrics::WAITPOINTS_COMPLETED, "outcome" => outcome).increment(1);
    if let Completion::First { waiter: Some(job) } = completion {
        wake(store.clone(), job, id.to_owned(), wait).await;
    }
    Ok(completion)
}

/// Makes the suspended run of `job` due now; waits out a run still leased (in a task of its
/// own past the first try, unless `wait`).
fn wake(
    store: Stores,
    job: JobId,
    waitpoint: String,
    wait: bool,
) -> futures_util::future::BoxFuture<'static, ()> {
    Box::pin(async move {
        let started = tokio::time::Instant::now();
        loop {
            let leased = match store.run_now(job).await {
                Ok(true) => return,
                Ok(false) => store
                    .job(job)
                    .await
                    .map(|view| view.is_some_and(|v| v.state == crate::job::JobState::Leased)),
                Err(e) => Err(e),
            };
            match leased {
                // Ready, done or gone: nothing to wake.
                Ok(false) => return,
                Ok(true) if !wait => {
                    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                        runtime.spawn(wake(store, job, waitpoint, true));
                    }
                    return;
                }
                Ok(true) if started.elapsed() < WAKE_FOR => {}
                Ok(true) => {
                    tracing::info!(%job, waitpoint, "the waiting run is still running: it finds the value at its next look");
                    return;
                }
                Err(e) => {
                    tracing::warn!(%job, waitpoint, error = %e, "waitpoint completed; waking its run failed: it finds the value at its next look");
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}
