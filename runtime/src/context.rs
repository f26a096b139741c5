//! What a handler sees: [`JobContext`] with its lease, cancellation token and sink handles,
//! and the [`Registry`] that maps job kinds to handlers.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::admission::{Admission, Fence};
use crate::error::{Error, Result};
use crate::ids::{IdempotencyKey, JobId, Lease};
use crate::job::{Job, JobError, NewJob};
use crate::sink::{FencedSink, Write};
#[cfg(feature = "postgres")]
use crate::store::postgres::{
    check_key_part, inside_transaction_of, Fenced, PostgresSink, TransactionFn,
};
use crate::store::{FencedWrite, Mutation, RejectionNote};

pub mod durable;

/// The fenced sinks a worker's handlers may write to, by name.
#[derive(Clone, Default)]
pub struct Sinks(Arc<SinkMap>);

#[derive(Clone, Default)]
struct SinkMap {
    /// `ctx.sink(name)`: `Mutation` writes through a [`FencedSink`] actor.
    actors: HashMap<String, Addr<FencedSink>>,
    /// `ctx.postgres(name)`: fenced transactions, run on the handler's own task.
    #[cfg(feature = "postgres")]
    postgres: HashMap<String, Arc<PostgresSink>>,
}

impl Sinks {
    /// No sinks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sink under `name`, for `ctx.sink(name)`.
    pub fn with(mut self, name: impl Into<String>, sink: Addr<FencedSink>) -> Self {
        Arc::make_mut(&mut self.0).actors.insert(name.into(), sink);
        self
    }

    #[cfg(feature = "postgres")]
    /// Adds a Postgres sink under `name`, for `ctx.postgres(name)` (add a [`FencedSink`] over
    /// a [`PostgresFencedStore`](crate::PostgresFencedStore) of the same sink with
    /// [`Sinks::with`] for `ctx.sink(name)` as well: both share its fences).
    pub fn with_postgres(mut self, name: impl Into<String>, sink: Arc<PostgresSink>) -> Self {
        Arc::make_mut(&mut self.0)
            .postgres
            .insert(name.into(), sink);
        self
    }

    /// Passes the coordinator's low watermark on to every sink.
    pub(crate) fn observe_watermark(&self, watermark: crate::ids::FencingToken) {
        for sink in self.0.actors.values() {
            sink.do_send(crate::sink::ObserveWatermark(watermark));
        }
        #[cfg(feature = "postgres")]
        for sink in self.0.postgres.values() {
            sink.observe_watermark(watermark);
        }
    }
}

/// Everything a handler needs about the claim it runs under.
pub struct JobContext {
    job: Arc<Job>,
    lease: Lease,
    cancel: CancellationToken,
    sinks: Sinks,
    run: Arc<RunState>,
}

/// What one run of a handler shares with its sink handles: the sequence of derived write
/// keys, and the fence rejections it met (the worker passes them to the coordinator's
/// journal when the run ends, for operators).
pub(crate) struct RunState {
    writes: AtomicU32,
    rejections: std::sync::Mutex<Vec<RejectionNote>>,
    /// The handler's result (JSON), for the worker to store with the completion.
    result: std::sync::Mutex<Option<String>>,
    /// What the completion sets going once accepted (follow-up jobs, flows, added steps).
    follow_ups: std::sync::Mutex<Asked>,
    /// Where `ctx.progress` goes.
    progress: Option<(crate::ids::JobId, Addr<crate::coordinator::Coordinator>)>,
    /// When progress was last sent, and the latest not sent yet.
    progress_sent: std::sync::Mutex<(Option<std::time::Instant>, Option<String>)>,
    /// The trace the run is in (its attempt span's context where one is exported): its
    /// follow-up jobs and flows continue it, its rejection notes name it.
    trace: Option<crate::traceparent::TraceContext>,
    /// The worker running it, for its rejection notes.
    worker: String,
    /// Shown every write besides the sink: the testing harness's record (none in a worker).
    probe: Option<Arc<dyn Probe>>,
    /// What the run's durable calls share ([`JobContext::durable`]).
    durable: Arc<std::sync::Mutex<crate::durable::DurableState>>,
}

/// What sees a run's fenced writes besides its sinks: the testing harness, which records
/// each one with its answer and can hold one back (a zombie paused before it).
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) trait Probe: Send + Sync {
    /// Awaited before each write goes out: gives the write its position among the run's
    /// writes (taken at once, so writes sent together each get their own).
    fn before_write(&self) -> BoxFuture<'static, usize>;
    /// The answer of the write at `position`; `mutations` for a `ctx.sink` write (a Postgres
    /// transaction's statements are its own).
    fn written(
        &self,
        position: usize,
        sink: &str,
        lease: &Lease,
        key: &IdempotencyKey,
        mutations: Option<Vec<Mutation>>,
        admission: &Result<Admission>,
    );
}

/// What a run asked to set going with its completion, its bytes of JSON so far, and whether
/// the run has ended (it was taken: nothing more can join it).
#[derive(Default)]
struct Asked {
    then: crate::job::Then,
    bytes: usize,
    ended: bool,
}

/// Progress goes to the coordinator at most this often per job; the latest value always
/// goes (with the next update, or when the job ends).
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// Largest result kept, in bytes of JSON: results are for answers, not for data.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

impl RunState {
    pub(crate) fn new(
        job: crate::ids::JobId,
        coordinator: Addr<crate::Coordinator>,
        trace: Option<crate::traceparent::TraceContext>,
        worker: String,
    ) -> Self {
        Self {
            trace,
            worker,
            writes: AtomicU32::new(0),
            rejections: std::sync::Mutex::default(),
            result: std::sync::Mutex::default(),
            follow_ups: std::sync::Mutex::default(),
            progress: Some((job, coordinator)),
            progress_sent: std::sync::Mutex::default(),
            probe: None,
            durable: Arc::default(),
        }
    }

    /// Shows this run's writes to `probe` too.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn with_probe(mut self, probe: Arc<dyn Probe>) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Waits for the probe, if any, to let a write go out; the write's position for it.
    async fn before_write(&self) -> Option<usize> {
        match &self.probe {
            Some(probe) => Some(probe.before_write().await),
            None => None,
        }
    }

    /// Shows the answer of the write at `position` (one [`before_write`](Self::before_write)
    /// gave) to the probe.
    fn show(
        &self,
        position: usize,
        (sink, lease, key): (&str, &Lease, &IdempotencyKey),
        mutations: Option<Vec<Mutation>>,
        admission: &Result<Admission>,
    ) {
        if let Some(probe) = &self.probe {
            probe.written(position, sink, lease, key, mutations, admission);
        }
    }

    /// Sends `json` as the job's progress now, or keeps it as the latest if one went out
    /// less than [`PROGRESS_EVERY`] ago: a handler reporting in a tight loop cannot flood
    /// the coordinator (and its renewals).
    fn report_progress(&self, json: String) {
        let Some((job, coordinator)) = &self.progress else {
            return;
        };
        let mut sent = self.progress_sent.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        if sent
            .0
            .is_some_and(|at| now.duration_since(at) < PROGRESS_EVERY)
        {
            sent.1 = Some(json);
        } else {
            *sent = (Some(now), None);
            coordinator.do_send(crate::coordinator::PutProgress(*job, json));
        }
    }

    /// Sends the latest progress not sent yet (the job ended).
    pub(crate) fn flush_progress(&self) {
        let Some((job, coordinator)) = &self.progress else {
            return;
        };
        let latest = self
            .progress_sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .take();
        if let Some(json) = latest {
            coordinator.do_send(crate::coordinator::PutProgress(*job, json));
        }
    }

    /// Keeps the handler's result: its JSON, or a note that it could not be kept.
    fn set_result(&self, result: &impl Serialize) {
        let json = match serde_json::to_string(result) {
            Ok(json) if json.len() <= MAX_RESULT_BYTES => format!("{{\"ok\":{json}}}"),
            Ok(json) => {
                tracing::warn!(bytes = json.len(), "job result too large to keep");
                serde_json::json!({"error": format!("the result was {} bytes; the limit is {MAX_RESULT_BYTES}", json.len())}).to_string()
            }
            Err(e) => {
                serde_json::json!({"error": format!("the result does not encode: {e}")}).to_string()
            }
        };
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(json);
    }

    /// The kept result (taken: stored once).
    pub(crate) fn take_result(&self) -> Option<String> {
        self.result.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The follow-up jobs, flows and added steps asked for (taken: they go with the
    /// completion once).
    pub(crate) fn take_follow_ups(&self) -> crate::job::Then {
        let mut kept = self.follow_ups.lock().unwrap_or_else(|p| p.into_inner());
        kept.ended = true;
        std::mem::take(&mut kept.then)
    }

    /// Notes a write's answer: on its `span`, and if it is a rejection, for the journal and
    /// as a log line (inside `span`) that carries the run's trace id whether or not its trace
    /// is sampled (a refusal is never lost to sampling).
    fn note(&self, span: &tracing::Span, sink: &str, lease: &Lease, admission: &Result<Admission>) {
        crate::trace::record_write(span, admission);
        let _inside = span.enter();
        if let Ok(Admission::Rejected(rejection)) = admission {
            let trace_id = self.trace.as_ref().map(|t| t.trace_id().to_owned());
            tracing::warn!(
                target: "palisade::fence",
                trace_id = trace_id.as_deref().unwrap_or(""),
                sink,
                scope = %lease.scope,
                presented = lease.token.as_u64(),
                highest = crate::trace::highest_token(rejection),
                lease = %lease.id,
                reason = rejection.reason(),
                "fenced write refused: {rejection}"
            );
            let note = RejectionNote {
                at_ms: crate::store::unix_ms(),
                sink: sink.to_owned(),
                scope: lease.scope.to_string(),
                token: lease.token.as_u64(),
                reason: rejection.reason().to_owned(),
                detail: rejection.to_string(),
                trace_id,
                job: self.progress.as_ref().map(|(job, _)| *job),
                lease: Some(lease.id),
                worker: Some(self.worker.clone()),
            };
            let mut notes = self
                .rejections
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            // A handler that keeps writing after its lease is gone keeps only the newest
            // notes: as many as the journal holds.
            if notes.len() >= crate::store::REJECTION_JOURNAL {
                notes.remove(0);
            }
            notes.push(note);
        }
    }

    /// The rejections noted so far (taken: each is passed on once).
    pub(crate) fn take_rejections(&self) -> Vec<RejectionNote> {
        std::mem::take(
            &mut self
                .rejections
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }
}

impl JobContext {
    pub(crate) fn new(
        job: Arc<Job>,
        lease: Lease,
        cancel: CancellationToken,
        sinks: Sinks,
        run: Arc<RunState>,
    ) -> Self {
        Self {
            job,
            lease,
            cancel,
            sinks,
            run,
        }
    }

    /// Enqueues `job` when this run's completion is accepted, in the same atomic step as
    /// the completion: it exists once the coordinator accepted this lease's completion, and
    /// never for a run that fails, is retried or released, or whose lease is no longer
    /// current (a paused holder's follow-ups are refused with its settlement). Each gets a
    /// fixed id unless it has one (`NewJob::with_id`), made from this run's lease and its
    /// position, so enqueueing the kept set again (the coordinator's sweep racing a late
    /// delivery) adds nothing. A job with a unique key of its own is deduplicated by that
    /// key instead (`NewJob::with_unique_key`): give it a ttl of at least a minute. Returns
    /// its id.
    ///
    /// Checked now, with the library's rules (names, payload size at the default limit): a
    /// job that could not be enqueued is an `Error::InvalidJob` here, not a lost job later.
    /// At most [`MAX_FOLLOW_UPS`](crate::MAX_FOLLOW_UPS) jobs and
    /// [`MAX_FOLLOW_UP_BYTES`](crate::MAX_FOLLOW_UP_BYTES) of JSON per completion.
    pub fn follow_up(&self, job: NewJob) -> Result<JobId> {
        self.said("follow-up job", || {
            job.validate(crate::job::DEFAULT_MAX_PAYLOAD_BYTES)?;
            self.ask(|then| {
                let id = job
                    .id
                    .unwrap_or_else(|| follow_up_id(self.lease.id, then.jobs.len()));
                if then.jobs.iter().any(|j| j.id == Some(id)) {
                    return Err(Error::InvalidJob(format!(
                        "follow-up job id {id} is asked for twice"
                    )));
                }
                let mut job = job.with_id(id);
                job.inherit_trace(self.run.trace.as_ref());
                let size = json_len(&job)?;
                Ok((size, id, move |then: &mut crate::job::Then| {
                    then.jobs.push(job)
                }))
            })
        })
    }

    /// Creates `flow` when this run's completion is accepted, like a
    /// [`follow_up`](Self::follow_up) job: it exists once the coordinator accepted this
    /// lease's completion, and never for a run that fails, is retried or released, or whose
    /// lease is no longer current. Creating it again (a repeated delivery) adds nothing: its
    /// id is fixed now. Checked now ([`Flow::validate`](crate::Flow::validate) at the
    /// default payload limit); it counts once toward
    /// [`MAX_FOLLOW_UPS`](crate::MAX_FOLLOW_UPS) and its JSON toward
    /// [`MAX_FOLLOW_UP_BYTES`](crate::MAX_FOLLOW_UP_BYTES). Returns its id.
    pub fn start_flow(&self, mut flow: crate::flow::Flow) -> Result<crate::ids::FlowId> {
        if let Some(trace) = &self.run.trace {
            flow.inherit_trace(trace);
        }
        self.said("flow", || {
            flow.validate(crate::job::DEFAULT_MAX_PAYLOAD_BYTES)?;
            self.ask(|then| {
                let id = flow.id();
                if then.flows.iter().any(|f| f.id() == id) {
                    return Err(Error::InvalidJob(format!("flow {id} is started twice")));
                }
                let size = json_len(&flow)?;
                Ok((size, id, move |then: &mut crate::job::Then| {
                    then.flows.push(flow)
                }))
            })
        })
    }

    /// Adds step `name` to this job's flow (it must be a flow step) when this run's
    /// completion is accepted: its full name is `"<this step>/<name>"`
    /// ([`added_step_name`](crate::flow::added_step_name)), and it runs after this step and
    /// after the steps `after` names — steps this run added before it, by the names given
    /// here — each with what it does if that one dies. Every step that runs after this one
    /// also runs after every step it adds, on the same kind of edge: a fan-in step waits for
    /// a fan-out it did not know of when the flow was created.
    ///
    /// Like a [`follow_up`](Self::follow_up) job it is fenced: the step exists once this
    /// lease's completion is accepted, never for a run that fails or whose lease is no longer
    /// current, and a re-run adds it under the same name, once. Checked now (names, the job
    /// as in [`Flow::validate`](crate::Flow::validate)); each counts toward
    /// [`MAX_FOLLOW_UPS`](crate::MAX_FOLLOW_UPS) and
    /// [`MAX_FOLLOW_UP_BYTES`](crate::MAX_FOLLOW_UP_BYTES). Returns its job's id.
    pub fn add_step<'a>(
        &self,
        name: &str,
        job: NewJob,
        after: impl IntoIterator<Item = (&'a str, crate::flow::OnDead)>,
    ) -> Result<JobId> {
        let after: Vec<(&str, crate::flow::OnDead)> = after.into_iter().collect();
        self.said("flow step", || {
            let Some(me) = &self.job.flow else {
                return Err(Error::InvalidJob(format!(
                    "job {} is no flow step: it cannot add steps to a flow",
                    self.job.id
                )));
            };
            crate::flow::check_step_name(name)?;
            job.validate(crate::job::DEFAULT_MAX_PAYLOAD_BYTES)?;
            if job.id.is_some() || job.unique.is_some() {
                return Err(Error::InvalidJob(format!(
                    "step {name:?} has an id or unique key of its own; a step's id is the flow's"
                )));
            }
            let full = crate::flow::added_step_name(&me.step, name);
            self.ask(|then| {
                if then.steps.iter().any(|s| s.name == full) {
                    return Err(Error::InvalidJob(format!("step {name:?} is added twice")));
                }
                let mut edges = vec![crate::flow::Edge {
                    step: me.step.clone(),
                    on_dead: crate::flow::OnDead::Fail,
                }];
                for (dep, on_dead) in &after {
                    let dep_full = crate::flow::added_step_name(&me.step, dep);
                    if !then.steps.iter().any(|s| s.name == dep_full)
                        || edges.iter().any(|e| e.step == dep_full)
                    {
                        return Err(Error::InvalidJob(format!(
                            "step {name:?} runs after {dep:?}, which is not a step this run added before it (or is named twice)"
                        )));
                    }
                    edges.push(crate::flow::Edge {
                        step: dep_full,
                        on_dead: *on_dead,
                    });
                }
                let mut job = job.clone();
                job.inherit_trace(self.run.trace.as_ref());
                let step = crate::flow::Step {
                    name: full.clone(),
                    job,
                    after: edges,
                };
                let size = json_len(&step)?;
                let id = crate::flow::step_job_id(me.flow, &full);
                Ok((size, id, move |then: &mut crate::job::Then| {
                    then.steps.push(step)
                }))
            })
        })
    }

    /// Runs `ask`, saying a refusal in the log too: a handler that drops the error would
    /// lose the `what` unseen.
    fn said<T>(&self, what: &str, ask: impl FnOnce() -> Result<T>) -> Result<T> {
        let asked = ask();
        if let Err(e) = &asked {
            tracing::warn!(job = %self.job.id, kind = %self.job.kind, error = %e, "{what} refused");
        }
        asked
    }

    /// Keeps what `prepare` makes of the run's set so far — its size in bytes of JSON, the id
    /// it answers, and how to add it — within the run's limits, unless the run has ended.
    fn ask<T, F: FnOnce(&mut crate::job::Then)>(
        &self,
        prepare: impl FnOnce(&crate::job::Then) -> Result<(usize, T, F)>,
    ) -> Result<T> {
        let mut kept = self
            .run
            .follow_ups
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if kept.ended {
            // (A task the handler left running: its completion has gone without it.)
            return Err(Error::InvalidJob(
                "the run has ended: follow-up jobs, flows and steps must be asked for before the handler returns"
                    .into(),
            ));
        }
        let then = &kept.then;
        if then.jobs.len() + then.flows.len() + then.steps.len() >= crate::job::MAX_FOLLOW_UPS {
            return Err(Error::InvalidJob(format!(
                "a completion carries at most {} follow-up jobs, flows and steps",
                crate::job::MAX_FOLLOW_UPS
            )));
        }
        let (size, answer, add) = prepare(then)?;
        if kept.bytes + size > crate::job::MAX_FOLLOW_UP_BYTES {
            return Err(Error::InvalidJob(format!(
                "a completion's follow-up jobs, flows and steps take at most {} bytes of JSON",
                crate::job::MAX_FOLLOW_UP_BYTES
            )));
        }
        kept.bytes += size;
        add(&mut kept.then);
        Ok(answer)
    }

    /// The result of step `step` of this job's flow — a step it runs after, whose result
    /// (`Registry::register_with_result`) was kept with its accepted completion — decoded as
    /// `T`. Its flow's home keeps it for as long as the flow is kept (however long the flow
    /// runs, then [`FLOW_RETENTION`](crate::FLOW_RETENTION)). `Ok(None)` when that step kept
    /// no result (it returned none, was skipped or died). An
    /// `Error::InvalidJob` for a job that is no flow step; `Error::Payload` when the result
    /// does not decode as `T`.
    pub async fn dependency<T: DeserializeOwned>(&self, step: &str) -> Result<Option<T>> {
        let Some(flow) = &self.job.flow else {
            return Err(Error::InvalidJob(format!(
                "job {} is no flow step: it has no dependencies",
                self.job.id
            )));
        };
        let Some((_, coordinator)) = &self.run.progress else {
            return Ok(None);
        };
        let id = crate::flow::step_job_id(flow.flow, step);
        let json = coordinator
            .send(crate::coordinator::ReadStepResult {
                flow: flow.flow,
                step: step.to_owned(),
            })
            .await??;
        json.map(|envelope| crate::client::decode_result(id, &envelope))
            .transpose()
    }

    /// The job being run.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// The lease it runs under.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Records how far the job has got (any serde value: `42`, `{"done": 3, "of": 10}`),
    /// visible in `palisade status`, on the operator page and through
    /// [`Client::progress`](crate::Client::progress) while the job runs. Best effort: sent
    /// to the coordinator without waiting, at most every 200 ms (the latest value always
    /// arrives).
    pub fn progress(&self, progress: &impl Serialize) {
        match serde_json::to_string(progress) {
            Ok(json) if json.len() <= MAX_RESULT_BYTES => self.run.report_progress(json),
            Ok(json) => tracing::warn!(bytes = json.len(), "progress too large to record"),
            Err(e) => tracing::warn!(error = %e, "progress does not encode"),
        }
    }

    /// Fired when the worker learns the lease is lost or is shutting down past its drain
    /// deadline. Advisory: a paused process cannot observe it in time — the sink is the fence.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// A handle to the sink called `name`, whose writes carry this lease's fence.
    pub fn sink(&self, name: &str) -> Result<SinkHandle> {
        let addr = self
            .sinks
            .0
            .actors
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownSink(name.to_owned()))?;
        Ok(SinkHandle {
            addr,
            name: name.to_owned(),
            #[cfg(feature = "postgres")]
            postgres: self.sinks.0.postgres.get(name).cloned(),
            fence: self.fence(),
            lease: self.lease.clone(),
            job: self.job.id,
            run: self.run.clone(),
        })
    }

    /// This run as a durable one, its journal kept in sink `home` (a Redis or memory sink):
    /// steps recorded once per run, sleeps and waits that suspend it (the
    /// [`durable`](crate::durable) module, and the guide in `docs/jobs.md`).
    ///
    /// ```no_run
    /// # use palisade::{JobContext, JobError, Mutation};
    /// # use palisade::durable::Waited;
    /// # use std::time::Duration;
    /// # async fn handler(ctx: JobContext) -> Result<(), JobError> {
    /// let run = ctx.durable("ledger")?;
    /// let hold: u64 = run
    ///     .step("reserve", || async {
    ///         let change = Mutation::HashIncr {
    ///             key: "{order:7}:stock".into(),
    ///             field: "held".into(),
    ///             by: 1,
    ///         };
    ///         Ok((vec![change], 1))
    ///     })
    ///     .await?;
    /// match run
    ///     .wait_for::<bool>("approval", "approval:order-7", Duration::from_secs(86_400))
    ///     .await?
    /// {
    ///     Waited::Completed(true) => run.sleep("cool-off", Duration::from_secs(600)).await?,
    ///     _ => return Err(JobError::fatal("not approved")),
    /// }
    /// # let _ = hold; Ok(()) }
    /// ```
    pub fn durable(&self, home: &str) -> Result<crate::durable::Durable> {
        Ok(crate::durable::Durable::new(
            self.sink(home)?,
            &self.job,
            &self.lease,
            self.run.progress.as_ref().map(|(_, c)| c.clone()),
            self.run.durable.clone(),
        ))
    }

    /// Completes waitpoint `id` with `value` (another run's wait, say) and wakes the run
    /// waiting for it, as [`Client::complete_waitpoint`](crate::Client::complete_waitpoint)
    /// does. Not fenced: a completion is kept once, whoever sends it first.
    pub async fn complete_waitpoint(
        &self,
        id: &str,
        value: &impl Serialize,
    ) -> Result<crate::store::Completion> {
        let value = serde_json::to_string(value)
            .map_err(|e| Error::Payload(format!("waitpoint value: {e}")))?;
        let Some((_, coordinator)) = &self.run.progress else {
            return Err(Error::InvalidJob("this run has no coordinator".into()));
        };
        coordinator
            .send(crate::coordinator::CompleteWaitpoint {
                id: id.to_owned(),
                value,
            })
            .await?
    }

    /// Another handle on this run (the same job, lease, sinks and run state), for the end of
    /// the run ([`durable::finish`]) after the handler took the first.
    pub(crate) fn twin(&self) -> JobContext {
        JobContext {
            job: self.job.clone(),
            lease: self.lease.clone(),
            cancel: self.cancel.clone(),
            sinks: self.sinks.clone(),
            run: self.run.clone(),
        }
    }

    /// What the run's durable calls share.
    pub(crate) fn durable_state(&self) -> Arc<std::sync::Mutex<durable::DurableState>> {
        self.run.durable.clone()
    }

    /// The generation this lease's writes present.
    fn fence(&self) -> Fence {
        Fence {
            token: self.lease.token,
            lease: self.lease.id,
        }
    }

    #[cfg(feature = "postgres")]
    /// A handle to the Postgres sink called `name`, whose transactions are fenced by this
    /// lease: `ctx.postgres("orders")?.transaction("pay", |tx| Box::pin(async move { .. }))`.
    pub fn postgres(&self, name: &str) -> Result<PostgresHandle> {
        let sink = self
            .sinks
            .0
            .postgres
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownSink(name.to_owned()))?;
        Ok(PostgresHandle {
            sink,
            name: name.to_owned(),
            scope: self.lease.scope.clone(),
            fence: self.fence(),
            job: self.job.id,
            lease: self.lease.clone(),
            run: self.run.clone(),
        })
    }
}

/// Fenced transactions on one Postgres sink under one lease.
#[cfg(feature = "postgres")]
pub struct PostgresHandle {
    sink: Arc<PostgresSink>,
    name: String,
    scope: crate::ids::Scope,
    fence: Fence,
    job: crate::ids::JobId,
    lease: Lease,
    run: Arc<RunState>,
}

#[cfg(feature = "postgres")]
impl PostgresHandle {
    /// The sink's name, as the worker was given it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sink's schema, quoted for SQL (see [`FencedTx::schema`](crate::FencedTx::schema)).
    pub fn schema(&self) -> &str {
        self.sink.schema()
    }

    /// Runs `f` in one transaction fenced by this lease (see [`PostgresSink::transaction`]):
    /// the scope's fence is locked and checked first, so a stale holder's `f` never runs;
    /// `key` names this write within the job (1-200 bytes, no `/`; stored as
    /// `<job id>/tx/<key>`, the same in every run of the job), so a re-run gets [`Fenced::Duplicate`] with the first run's result
    /// instead of running `f` again.
    ///
    /// ```no_run
    /// # async fn handler(ctx: palisade::JobContext) -> Result<(), palisade::JobError> {
    /// let pg = ctx.postgres("orders")?;
    /// let paid: i64 = pg
    ///     .transaction("pay", |tx| {
    ///         Box::pin(async move {
    ///             let row = tx
    ///                 .query_one("UPDATE invoice SET paid = true WHERE id = 7 RETURNING total", &[])
    ///                 .await?;
    ///             tx.outbox("email").push("receipt", &row.get::<_, i64>(0)).await?;
    ///             Ok(row.get(0))
    ///         })
    ///     })
    ///     .await?
    ///     .accepted()?; // refused: JobError::Fenced, settled as the fence requires
    /// # let _ = paid; Ok(()) }
    /// ```
    pub async fn transaction<R, F>(&self, key: &str, f: F) -> Result<Fenced<R>>
    where
        R: Serialize + DeserializeOwned + Send,
        F: TransactionFn<R>,
    {
        check_key_part("transaction key", key)?;
        self.run(transaction_key(self.job, key), f).await
    }

    /// Records one effect for `target` in its own fenced transaction (inside a transaction,
    /// use [`FencedTx::outbox`](crate::FencedTx::outbox) instead, so the effect commits with the rows). Keyed by
    /// `key` within the job, like [`transaction`](Self::transaction).
    pub async fn push_outbox(
        &self,
        target: &str,
        key: &str,
        payload: &impl Serialize,
    ) -> Result<Fenced<()>> {
        check_key_part("outbox target", target)?;
        check_key_part("outbox key", key)?;
        let payload = serde_json::to_value(payload)
            .map_err(|e| Error::Payload(format!("outbox payload: {e}")))?;
        let (target_name, push_key) = (target.to_owned(), key.to_owned());
        let stored = outbox_key(self.job, target, key);
        self.run(stored, move |tx| {
            Box::pin(async move {
                tx.outbox(&target_name).push(&push_key, &payload).await?;
                Ok(())
            })
        })
        .await
    }

    /// One fenced transaction under the full stored key, counted in the sink metrics.
    pub(crate) async fn run<R, F>(&self, key: String, f: F) -> Result<Fenced<R>>
    where
        R: Serialize + DeserializeOwned + Send,
        F: TransactionFn<R>,
    {
        let key = IdempotencyKey::new(key);
        let span = crate::trace::write_span(
            "palisade.pg_transaction",
            &self.name,
            &self.scope,
            self.fence,
            &key,
        );
        let position = self.run.before_write().await;
        let result = self
            .sink
            .transaction(&self.scope, self.fence, &key, f)
            .instrument(span.clone())
            .await;
        let admission = result.as_ref().map(Fenced::admission).map_err(|e| {
            // `record` only reads the error; a copy keeps the caller's error intact.
            Error::Backend(e.to_string())
        });
        crate::sink::record(&self.name, &self.scope, &admission);
        self.run.note(&span, &self.name, &self.lease, &admission);
        if let Some(position) = position {
            self.run
                .show(position, (&self.name, &self.lease, &key), None, &admission);
        }
        result
    }
}

/// Writes to one fenced sink under one lease.
#[derive(Clone)]
pub struct SinkHandle {
    addr: Addr<FencedSink>,
    name: String,
    /// The Postgres sink behind it, if it is one (to refuse a write from inside one of its
    /// own transactions, which would wait for that transaction's lock).
    #[cfg(feature = "postgres")]
    postgres: Option<Arc<PostgresSink>>,
    fence: Fence,
    lease: Lease,
    job: crate::ids::JobId,
    run: Arc<RunState>,
}

impl SinkHandle {
    /// The sink's name, as the worker was given it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads a value back (not fenced: what the sink holds now, for checks and a durable
    /// run's journal).
    pub async fn read(&self, key: &str) -> Result<Option<crate::store::Value>> {
        self.addr
            .send(crate::sink::ReadValue(key.to_owned()))
            .await?
    }

    /// Writes `mutations` under a derived idempotency key: job id + the write's sequence
    /// number in this run of the handler. Deterministic across runs, so a job that re-runs
    /// after a stall (its earlier run wrote, then paused or died before settling) and repeats
    /// the same writes in the same order gets `Duplicate`s, not second applications. A handler
    /// whose writes differ between runs should name them with [`SinkHandle::write_keyed`].
    pub async fn write(&self, mutations: Vec<Mutation>) -> Result<Admission> {
        let seq = self.run.writes.fetch_add(1, Ordering::Relaxed);
        let key = IdempotencyKey::new(write_key(self.job, seq));
        self.write_keyed(key, mutations).await
    }

    /// Writes `mutations` under a caller-chosen idempotency key. An empty key, or an empty
    /// data key in `mutations`, is refused before anything is sent ([`Error::InvalidJob`]).
    pub async fn write_keyed(
        &self,
        key: IdempotencyKey,
        mutations: Vec<Mutation>,
    ) -> Result<Admission> {
        #[cfg(feature = "postgres")]
        if self.postgres.as_deref().is_some_and(inside_transaction_of) {
            return Err(Error::InvalidJob(
                "a fenced write cannot go to the Postgres sink whose transaction it runs \
                 inside (it would wait for that transaction's lock); write through `tx`"
                    .into(),
            ));
        }
        let span = crate::trace::write_span(
            "palisade.fenced_write",
            &self.name,
            &self.lease.scope,
            self.fence,
            &key,
        );
        // (Kept only for a probe: a worker's write clones nothing.)
        let shown = self
            .run
            .before_write()
            .await
            .map(|position| (position, key.clone(), mutations.clone()));
        let admission = self
            .addr
            .send(Write(FencedWrite {
                scope: self.lease.scope.clone(),
                fence: self.fence,
                key,
                mutations,
            }))
            .instrument(span.clone())
            .await
            .map_err(Error::from)
            .and_then(|a| a);
        self.run.note(&span, &self.name, &self.lease, &admission);
        if let Some((position, key, mutations)) = shown {
            self.run.show(
                position,
                (&self.name, &self.lease, &key),
                Some(mutations),
                &admission,
            );
        }
        admission
    }
}

pub(crate) type ErasedHandler =
    Arc<dyn Fn(JobContext, &str) -> BoxFuture<'static, Result<(), JobError>> + Send + Sync>;

type PayloadCheck = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Maps job kinds to handlers (and, optionally, to a default timeout per attempt).
#[derive(Clone, Default)]
pub struct Registry {
    handlers: HashMap<String, (ErasedHandler, PayloadCheck)>,
    timeouts: HashMap<String, Duration>,
    retries: HashMap<String, crate::RetryPolicy>,
    examples: HashMap<String, String>,
}

impl Registry {
    /// No handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for jobs of `kind` whose payload decodes as `T`, keeping what it
    /// returns as the job's result ([`Client::result`](crate::Client::result),
    /// [`Client::wait`](crate::Client::wait); up to [`MAX_RESULT_BYTES`] of JSON, kept
    /// a day).
    pub fn register_with_result<T, R, F, Fut>(self, kind: impl Into<String>, handler: F) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(JobContext, T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, JobError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        self.register(kind, move |ctx: JobContext, payload: T| {
            let (handler, run) = (handler.clone(), ctx.run.clone());
            async move {
                let result = handler(ctx, payload).await?;
                run.set_result(&result);
                Ok(())
            }
        })
    }

    /// Registers `handler` for jobs of `kind` whose payload decodes as `T`. A payload that
    /// does not decode is dead-lettered with the decode error, never retried.
    pub fn register<T, F, Fut>(mut self, kind: impl Into<String>, handler: F) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        F: Fn(JobContext, T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        let kind = kind.into();
        let name = kind.clone();
        let erased: ErasedHandler = Arc::new(
            move |ctx, payload: &str| match serde_json::from_str::<T>(payload) {
                Ok(value) => Box::pin(handler(ctx, value)),
                Err(e) => {
                    let reason = format!("payload does not decode for kind {name:?}: {e}");
                    Box::pin(async move { Err(JobError::Fatal(reason)) })
                }
            },
        );
        let check: PayloadCheck = Arc::new(|payload: &str| {
            serde_json::from_str::<T>(payload)
                .map(drop)
                .map_err(|e| e.to_string())
        });
        self.handlers.insert(kind, (erased, check));
        self
    }

    /// Bounds every attempt of `kind` to `timeout` unless its job sets its own
    /// ([`NewJob::with_timeout`](crate::NewJob::with_timeout), which says what a timeout
    /// does). Must be 1 ms ..= [`MAX_DELAY`](crate::job::MAX_DELAY): a worker refuses a
    /// registry with another.
    pub fn with_timeout(mut self, kind: impl Into<String>, timeout: Duration) -> Self {
        self.timeouts.insert(kind.into(), timeout);
        self
    }

    /// Backs off retries of `kind` by `policy` instead of the worker's
    /// ([`WorkerConfig::retry`](crate::WorkerConfig::retry)): a kind that calls a rate-limited
    /// API waits longer, one whose failures are local retries sooner. How many attempts a job
    /// gets is the job's own ([`NewJob::with_max_attempts`](crate::NewJob::with_max_attempts)).
    /// A worker refuses a registry whose policy [`RetryPolicy::validate`](crate::RetryPolicy::validate)
    /// refuses.
    pub fn with_retry(mut self, kind: impl Into<String>, policy: crate::RetryPolicy) -> Self {
        self.retries.insert(kind.into(), policy);
        self
    }

    /// Gives `kind` an example payload (JSON text) for people: `palisade kinds` prints it, the
    /// HTTP API's and the CLI's users copy it. A worker refuses a registry whose example does
    /// not decode as its kind's payload, so an example cannot drift from the type.
    pub fn with_example(mut self, kind: impl Into<String>, payload: impl Into<String>) -> Self {
        self.examples.insert(kind.into(), payload.into());
        self
    }

    /// `kind`'s example payload ([`Registry::with_example`]), if it has one.
    pub fn example(&self, kind: &str) -> Option<&str> {
        self.examples.get(kind).map(String::as_str)
    }

    /// The backoff for retries of `kind`: its own, else `fallback` (the worker's).
    pub(crate) fn retry_of(&self, kind: &str, fallback: crate::RetryPolicy) -> crate::RetryPolicy {
        self.retries.get(kind).copied().unwrap_or(fallback)
    }

    pub(crate) fn get(&self, kind: &str) -> Option<&ErasedHandler> {
        self.handlers.get(kind).map(|(handler, _)| handler)
    }

    /// How long an attempt of `job` may run: its own timeout, else its kind's.
    pub(crate) fn timeout_of(&self, job: &Job) -> Option<Duration> {
        job.timeout
            .or_else(|| self.timeouts.get(&job.kind).copied())
    }

    /// How retries back off, for people (a worker's heartbeat, `palisade status`): `fallback`
    /// (the worker's), then each kind with a policy of its own, by name; at most 1,000 bytes.
    pub(crate) fn retry_summary(&self, fallback: crate::RetryPolicy) -> String {
        let said = |p: &crate::RetryPolicy| {
            format!(
                "{} doubling to {}",
                humantime::format_duration(p.base),
                humantime::format_duration(p.max)
            )
        };
        let mut kinds: Vec<_> = self.retries.iter().collect();
        kinds.sort_by(|a, b| a.0.cmp(b.0));
        let mut summary = said(&fallback);
        for (kind, policy) in kinds {
            let part = format!("; {kind}: {}", said(policy));
            if summary.len() + part.len() > 996 {
                summary.push_str("; …");
                break;
            }
            summary.push_str(&part);
        }
        summary
    }

    /// Checks the kinds' timeouts (as `NewJob::validate` checks a job's), each of a kind with
    /// a handler (a timeout for another is a typo).
    pub(crate) fn validate(&self) -> Result<()> {
        for (kind, example) in &self.examples {
            self.check(kind, example)
                .map_err(|e| Error::Config(format!("the example payload of kind {kind:?}: {e}")))?;
        }
        for (kind, policy) in &self.retries {
            if !self.handlers.contains_key(kind) {
                return Err(Error::Config(format!(
                    "a retry policy is set for kind {kind:?}, which has no handler"
                )));
            }
            policy
                .validate(&format!("kind {kind:?}"))
                .map_err(Error::Config)?;
        }
        for (kind, timeout) in &self.timeouts {
            if !self.handlers.contains_key(kind) {
                return Err(Error::Config(format!(
                    "a timeout is set for kind {kind:?}, which has no handler"
                )));
            }
            if *timeout < Duration::from_millis(1) || *timeout > crate::job::MAX_DELAY {
                return Err(Error::Config(format!(
                    "timeout {timeout:?} of kind {kind:?} is outside 1 ms ..= {:?}",
                    crate::job::MAX_DELAY
                )));
            }
        }
        Ok(())
    }

    /// Checks, before enqueueing, that `kind` is registered and `payload` decodes for it — so
    /// a producer hears about a typo now instead of finding a dead-letter entry later.
    pub fn check(&self, kind: &str, payload: &str) -> Result<()> {
        let (_, check) = self.handlers.get(kind).ok_or_else(|| {
            let mut known: Vec<&str> = self.kinds().collect();
            known.sort_unstable();
            Error::InvalidJob(format!(
                "unknown job kind {kind:?}; known kinds: {}",
                known.join(", ")
            ))
        })?;
        check(payload)
            .map_err(|e| Error::Payload(format!("payload for {kind:?} does not decode: {e}")))
    }

    /// Registered kinds.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.handlers.keys().map(String::as_str)
    }
}

/// Bytes of `value`'s JSON.
fn json_len(value: &impl Serialize) -> Result<usize> {
    Ok(serde_json::to_string(value)
        .map_err(|e| Error::Payload(e.to_string()))?
        .len())
}

/// The id of the `index`-th follow-up job of the run under lease `lease`: fixed for that run
/// (only one run's completion is ever accepted, and its set may be enqueued more than once),
/// different for every other run — a job enqueued again under the same id gets new ones.
fn follow_up_id(lease: crate::ids::LeaseId, index: usize) -> JobId {
    /// Palisade's namespace for follow-up job ids of completions (a random UUID, fixed
    /// forever: changing it would let an upgraded worker add a follow-up a second time).
    const COMPLETION_FOLLOW_UPS: uuid::Uuid =
        uuid::Uuid::from_u128(0x2c7d_41a9_8e3b_4f60_b1d2_93a4_e5f6_0718);
    let name = format!("{lease}\n{index}");
    uuid::Uuid::new_v5(&COMPLETION_FOLLOW_UPS, name.as_bytes()).into()
}

/// The idempotency key of a run's `seq`-th [`SinkHandle::write`]: `<job>/<seq>`, the same in
/// every run and every release (a re-run's writes must find its earlier run's).
fn write_key(job: JobId, seq: u32) -> String {
    format!("{job}/{seq}")
}

/// The stored key of [`PostgresHandle::transaction`]`(key, ..)`: `<job>/tx/<key>`.
#[cfg(feature = "postgres")]
fn transaction_key(job: JobId, key: &str) -> String {
    format!("{job}/tx/{key}")
}

/// The stored key of [`PostgresHandle::push_outbox`]`(target, key, ..)`:
/// `<job>/outbox/<target>/<key>`.
#[cfg(feature = "postgres")]
fn outbox_key(job: JobId, target: &str, key: &str) -> String {
    format!("{job}/outbox/{target}/{key}")
}

/// The identities above pinned to literal values: a previous release computes the same, so
/// changing one re-applies writes and re-adds follow-ups during a rolling deploy. Never update
/// a literal to make a test pass (see palisade-core's `tests/golden.rs`).
#[cfg(test)]
mod golden {
    use super::*;

    const JOB: &str = "00000000-0000-4000-8000-000000000001";

    fn job() -> JobId {
        JobId::from(uuid::Uuid::parse_str(JOB).unwrap())
    }

    #[test]
    fn default_write_keys_are_job_slash_sequence() {
        assert_eq!(write_key(job(), 0), format!("{JOB}/0"));
        assert_eq!(write_key(job(), 12), format!("{JOB}/12"));
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn transaction_and_outbox_keys_name_the_job() {
        assert_eq!(transaction_key(job(), "pay"), format!("{JOB}/tx/pay"));
        assert_eq!(
            outbox_key(job(), "email", "receipt"),
            format!("{JOB}/outbox/email/receipt")
        );
    }

    /// Computed apart from this code: Python's `uuid.uuid5` over the namespace and
    /// `"<lease>\n<index>"`.
    #[test]
    fn completion_follow_up_ids_are_uuid5_of_lease_and_index() {
        let lease = crate::ids::LeaseId::from(
            uuid::Uuid::parse_str("00000000-0000-4000-8000-000000000002").unwrap(),
        );
        assert_eq!(
            follow_up_id(lease, 0).to_string(),
            "f6188e38-7345-54ce-b09b-c1f7a0470673"
        );
        assert_eq!(
            follow_up_id(lease, 1).to_string(),
            "929bc3f7-043c-52fe-9a39-27ce5c47eb6e"
        );
    }
}

#[cfg(test)]
mod registry_tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Mail {
        #[allow(dead_code)]
        to: String,
    }

    fn registry() -> Registry {
        Registry::new().register("mail", |_ctx: JobContext, _m: Mail| async { Ok(()) })
    }

    /// An example that no longer decodes (the payload type changed) is refused, as are a
    /// retry policy that cannot be meant and one for a kind without a handler.
    #[test]
    fn examples_and_retry_policies_are_checked() {
        let good = registry().with_example("mail", r#"{"to":"a@x"}"#);
        assert!(good.validate().is_ok());
        assert_eq!(good.example("mail"), Some(r#"{"to":"a@x"}"#));
        let stale = registry().with_example("mail", r#"{"recipient":"a@x"}"#);
        let e = stale.validate().unwrap_err().to_string();
        assert!(e.contains("example payload of kind \"mail\""), "{e}");
        let zero = crate::RetryPolicy {
            base: Duration::ZERO,
            max: Duration::from_secs(1),
        };
        assert!(registry().with_retry("mail", zero).validate().is_err());
        let typo = registry().with_retry("mial", crate::RetryPolicy::default());
        let e = typo.validate().unwrap_err().to_string();
        assert!(e.contains("\"mial\", which has no handler"), "{e}");
    }
}
