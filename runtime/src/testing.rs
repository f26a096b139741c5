//! Testing your jobs (feature `testing`, for your dev-dependencies): a [`Harness`] that runs
//! your [`Registry`]'s handlers as a worker runs them, over the memory stores and sinks, on a
//! clock it moves on by itself.
//!
//! - [`Harness::perform`] runs one job's attempt now and answers what it did: its
//!   [`Outcome`], every fenced write with its answer, the follow-up jobs it asked for.
//! - [`Harness::drain`] runs a queue until it is empty, skipping time through delays,
//!   retries, snoozes and ticks; bounded, with [`TestError::NeverEnds`] naming what is left.
//! - [`assert_enqueued!`](crate::assert_enqueued) and [`Harness::enqueued`] look at what
//!   waits in the queues; [`Harness::sink`] reads what the fenced writes left.
//! - [`Harness::zombie`] pauses a run of the job before each of its writes in turn, lets a
//!   rival take the job over and finish it, then wakes the first: [`Zombie::assert_fenced`]
//!   fails, naming the write, when a late write was applied or a write was applied twice.
//!
//! The harness runs on the thread of the test that makes it (its own actix system, so write
//! plain `#[test]` functions, not async ones); its time is that thread's
//! ([`palisade_core::clock`]): the memory stores' delays, leases, deadlines, schedules and
//! retention move with it, while a handler's own `tokio::time::sleep` and its timeout keep
//! tokio's time (paused, and skipped when idle, with [`Harness::with_virtual_timers`]).
//! The guide is docs/testing-your-jobs.md.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Addr};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::Value as Json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use crate::context::{JobContext, Probe, Registry, RunState, Sinks};
use crate::coordinator::Coordinator;
use crate::error::Error;
use crate::ids::{FencingToken, IdempotencyKey, JobId, Lease};
use crate::job::{Claim, FollowUps, Job, JobView, NewJob, Settlement};
use crate::mutation::{Mutation, Value};
use crate::policy::RetryPolicy;
use crate::schedule::Schedule;
use crate::sink::FencedSink;
use crate::store::memory::{MemoryFencedStore, MemoryLeaseStore};
use crate::store::{ControlStore, FencedStore, LeaseStore, Stores};

pub use crate::{assert_enqueued, refute_enqueued};

/// The harness's worker name, on its claims and rejection notes.
const WORKER: &str = "palisade-testing";

/// Scenarios [`Harness::zombie`] runs at most: pauses before the first 63 writes, and one
/// before settling.
const MAX_PAUSES: usize = 64;

/// One-second steps `drain` takes at most, in a row, while ready jobs stay unclaimable with
/// nothing due (a rate limit refilling takes a few; more is a queue that never empties).
const MAX_IDLE_STEPS: u32 = 600;

/// What can go wrong in a harness, besides the library's own errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestError {
    /// The library refused something (a job that does not validate, a key reused with
    /// another request).
    #[error(transparent)]
    Palisade(#[from] Error),
    /// [`Harness::drain`] ran out of runs or of time with jobs left.
    #[error("queue {queue:?} did not empty within {runs} runs and {skipped:?} of skipped time; left: {left}")]
    NeverEnds {
        /// The queue drained.
        queue: String,
        /// Runs made.
        runs: usize,
        /// Time skipped.
        skipped: Duration,
        /// The jobs left, one line each.
        left: String,
    },
    /// [`Harness::perform`] found its job not claimable (its queue paused, its scope, group
    /// or rate limit holding it back, or it was deduplicated into a job already ended).
    #[error("job {0} could not be claimed: {1}")]
    NotClaimable(JobId, String),
    /// A sink the test named was never added ([`Harness::with_sink`]).
    #[error("no sink named {0:?}: add it with Harness::with_sink")]
    NoSink(String),
}

/// The harness's answers.
pub type TestResult<T> = std::result::Result<T, TestError>;

/// One fenced write a run made, with its answer.
#[derive(Clone, Debug)]
pub struct Written {
    /// The sink it went to.
    pub sink: String,
    /// The job whose run made it.
    pub job: JobId,
    /// The run of that job that made it (1 for its first run in this harness).
    pub run: u32,
    /// Its position among the run's writes (0 for the first).
    pub position: usize,
    /// The token it presented.
    pub token: FencingToken,
    /// Its idempotency key.
    pub key: IdempotencyKey,
    /// What it asked to change (`None` for a Postgres transaction).
    pub mutations: Option<Vec<Mutation>>,
    /// The sink's answer, or the error that kept it from one.
    pub answer: std::result::Result<Admission, String>,
}

impl Written {
    /// The sink applied it.
    pub fn applied(&self) -> bool {
        matches!(self.answer, Ok(Admission::Applied))
    }

    /// The sink had applied it before (the same key in the same scope): nothing changed.
    pub fn duplicate(&self) -> bool {
        matches!(self.answer, Ok(Admission::Duplicate))
    }

    /// The sink refused it (a stale token, a conflicting lease, a mutation that does not fit).
    pub fn refused(&self) -> bool {
        matches!(self.answer, Ok(Admission::Rejected(_)))
    }
}

impl Written {
    /// Its run, token, key and mutations, on one line.
    fn brief(&self) -> String {
        let mut line = format!(
            "run {} (token {}): key {:?}",
            self.run,
            self.token.as_u64(),
            self.key.as_str()
        );
        if let Some(m) = &self.mutations {
            line.push_str(&format!(", {m:?}"));
        }
        line
    }
}

impl fmt::Display for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "write #{} of run {} of job {} to sink {:?} (key {:?}, token {}",
            self.position,
            self.run,
            self.job,
            self.sink,
            self.key.as_str(),
            self.token.as_u64()
        )?;
        if let Some(m) = &self.mutations {
            write!(f, ", {m:?}")?;
        }
        match &self.answer {
            Ok(Admission::Applied) => write!(f, "): applied"),
            Ok(Admission::Duplicate) => write!(f, "): duplicate"),
            Ok(Admission::Rejected(r)) => write!(f, "): refused, {r}"),
            Err(e) => write!(f, "): failed, {e}"),
        }
    }
}

/// How one attempt settled.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Done: the job completed (its follow-ups set going).
    Completed,
    /// Failed; back in its queue after `after`.
    Retry {
        /// The backoff.
        after: Duration,
        /// The error.
        reason: String,
    },
    /// It snoozed; claimable again after `after`, the attempt not counted.
    Snoozed {
        /// How long.
        after: Duration,
    },
    /// Dead-lettered (a fatal error, attempts used up, an unknown kind, a bad payload).
    Dead {
        /// Why.
        reason: String,
    },
    /// Given back unfinished.
    Released,
    /// A fenced sink refused its lease (the coordinator reseeds and runs it again).
    Fenced {
        /// The refusal.
        reason: String,
    },
    /// The coordinator refused the settlement: the lease was no longer current (a zombie's
    /// run, or one whose lease ran out).
    Refused {
        /// The coordinator's error.
        error: String,
    },
}

/// What one attempt did.
#[derive(Clone, Debug)]
pub struct Performed {
    /// The job as its attempt saw it (its `attempt`, `payload`, `scope`).
    pub job: Job,
    /// How it settled.
    pub outcome: Outcome,
    /// It ran past its timeout.
    pub timed_out: bool,
    /// Its fenced writes, in order, with their answers.
    pub writes: Vec<Written>,
    /// The follow-up jobs it asked for (`ctx.follow_up`): enqueued only with an accepted
    /// completion (so not for an `Outcome::Refused` one), and not run.
    pub follow_ups: Vec<NewJob>,
    /// The flows it started (`ctx.start_flow`), by id.
    pub flows: Vec<crate::ids::FlowId>,
    /// Its result (`Registry::register_with_result`), as JSON; `None` when it kept none,
    /// or could not keep it (over `MAX_RESULT_BYTES`, as a worker keeps none).
    pub result: Option<Json>,
}

impl Performed {
    /// It completed.
    pub fn completed(&self) -> bool {
        self.outcome == Outcome::Completed
    }
}

/// What [`Harness::drain`] ran.
#[derive(Clone, Debug, Default)]
pub struct Ran {
    /// Every attempt, in the order they ran.
    pub runs: Vec<Performed>,
    /// The time skipped to reach delayed jobs.
    pub skipped: Duration,
}

impl Ran {
    /// The attempts that completed their job.
    pub fn completed(&self) -> usize {
        self.runs.iter().filter(|r| r.completed()).count()
    }

    /// The attempts that dead-lettered their job.
    pub fn dead(&self) -> usize {
        let dead = |r: &&Performed| matches!(r.outcome, Outcome::Dead { .. });
        self.runs.iter().filter(dead).count()
    }
}

/// What a job should look like, for [`assert_enqueued!`](crate::assert_enqueued): every field
/// given must match; a payload matches when every field it names has the same value in the
/// job's payload (so `json!({"to": "ann"})` matches `{"to": "ann", "cc": []}`).
#[derive(Clone, Debug, Default)]
pub struct Expect {
    kind: Option<String>,
    queue: Option<String>,
    scope: Option<String>,
    payload: Option<Json>,
}

impl Expect {
    /// Of this kind.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// In this queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// In this fencing scope.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// With a payload that contains `payload` (any serde value: a struct, `json!({..})`).
    pub fn payload(mut self, payload: impl serde::Serialize) -> Self {
        self.payload = Some(serde_json::to_value(payload).unwrap_or(Json::Null));
        self
    }

    /// Whether `job` is such a job.
    pub fn matches(&self, job: &Job) -> bool {
        let payload = || serde_json::from_str::<Json>(&job.payload).unwrap_or(Json::Null);
        self.kind.as_ref().is_none_or(|k| *k == job.kind)
            && self.queue.as_ref().is_none_or(|q| *q == job.queue)
            && self.scope.as_ref().is_none_or(|s| s == job.scope.as_str())
            && self
                .payload
                .as_ref()
                .is_none_or(|want| contains(&payload(), want))
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut said = Vec::new();
        if let Some(k) = &self.kind {
            said.push(format!("kind = {k:?}"));
        }
        if let Some(q) = &self.queue {
            said.push(format!("queue = {q:?}"));
        }
        if let Some(s) = &self.scope {
            said.push(format!("scope = {s:?}"));
        }
        if let Some(p) = &self.payload {
            said.push(format!("payload containing {p}"));
        }
        if said.is_empty() {
            return f.write_str("any job");
        }
        f.write_str(&said.join(", "))
    }
}

/// Whether `have` holds everything `want` says: objects by their fields, recursively; every
/// other value (arrays too) equal.
fn contains(have: &Json, want: &Json) -> bool {
    match (have, want) {
        (Json::Object(have), Json::Object(want)) => want
            .iter()
            .all(|(k, v)| have.get(k).is_some_and(|h| contains(h, v))),
        _ => have == want,
    }
}

/// Asserts that a job waits (ready or delayed) in the harness `h` that matches every field
/// given: `kind`, `queue`, `scope`, `payload` (contained, see [`Expect`]). On failure it
/// lists what does wait.
///
/// ```ignore
/// assert_enqueued!(h, kind = "email", payload = json!({"to": "ann@example.com"}));
/// ```
#[macro_export]
macro_rules! assert_enqueued {
    ($h:expr $(, $field:ident = $value:expr)* $(,)?) => {{
        let want = $crate::testing::Expect::default() $( .$field($value) )*;
        $h.assert_enqueued(&want)
    }};
}

/// Asserts that no job matching the fields given waits in the harness `h`, as
/// [`assert_enqueued!`](crate::assert_enqueued) reads them.
#[macro_export]
macro_rules! refute_enqueued {
    ($h:expr $(, $field:ident = $value:expr)* $(,)?) => {{
        let want = $crate::testing::Expect::default() $( .$field($value) )*;
        $h.refute_enqueued(&want)
    }};
}

/// A sink's contents, for assertions.
pub struct SinkView(Arc<MemoryFencedStore>);

impl SinkView {
    /// What `key` holds.
    pub fn read(&self, key: &str) -> Option<Value> {
        // The memory store answers at once: its future is ready on its first poll.
        self.0
            .read(key)
            .now_or_never()
            .and_then(|r| r.ok())
            .flatten()
    }

    /// The string at `key`.
    pub fn text(&self, key: &str) -> Option<String> {
        match self.read(key)? {
            Value::Text(t) => Some(t),
            Value::Hash(_) => None,
        }
    }

    /// Field `field` of the hash at `key`.
    pub fn field(&self, key: &str, field: &str) -> Option<String> {
        match self.read(key)? {
            Value::Hash(mut h) => h.remove(field),
            Value::Text(_) => None,
        }
    }
}

/// One world of stores, sinks and a coordinator: the harness's own, or a zombie scenario's.
#[derive(Clone)]
struct World {
    store: Arc<MemoryLeaseStore>,
    stores: Stores,
    coordinator: Addr<Coordinator>,
    sinks: Sinks,
    sink_stores: BTreeMap<String, Arc<MemoryFencedStore>>,
    writes: Arc<Mutex<Vec<Written>>>,
    /// Runs so far per job (a run's number in [`Written::run`]).
    runs: Arc<Mutex<HashMap<JobId, u32>>>,
}

/// What a world runs with: the user's registry and the harness's settings.
#[derive(Clone)]
struct Settings {
    registry: Registry,
    retry: RetryPolicy,
    lease: Duration,
    grace: Duration,
    max_runs: usize,
    max_skip: Duration,
    schedules: Vec<Schedule>,
    #[cfg(feature = "postgres")]
    postgres: Vec<(String, Arc<crate::store::postgres::PostgresSink>)>,
}

/// Where a zombie's run stops, as a paused process stops: every write from its write at `at`
/// on (the settlement counts as the write after its last) waits until it is woken.
struct Gate {
    at: usize,
    held: AtomicBool,
    reached: Notify,
    wake: tokio::sync::watch::Sender<bool>,
}

/// Records a run's writes in its world, and holds them back at its gate.
struct Recorder {
    job: JobId,
    run: u32,
    /// The next write's position (a write takes it before it goes out).
    next: AtomicUsize,
    writes: Arc<Mutex<Vec<Written>>>,
    gate: Option<Arc<Gate>>,
}

impl Recorder {
    /// Takes the next position; waits there while the run is held at its gate.
    fn pass(&self) -> BoxFuture<'static, usize> {
        let position = self.next.fetch_add(1, Ordering::Relaxed);
        match &self.gate {
            Some(gate) if position >= gate.at => {
                gate.held.store(true, Ordering::Relaxed);
                gate.reached.notify_one();
                let mut woken = gate.wake.subscribe();
                Box::pin(async move {
                    let _ = woken.wait_for(|w| *w).await;
                    position
                })
            }
            _ => Box::pin(async move { position }),
        }
    }

    /// The run has been held at its gate (from then on it renews nothing).
    fn held(&self) -> bool {
        self.gate
            .as_ref()
            .is_some_and(|g| g.held.load(Ordering::Relaxed))
    }
}

impl Probe for Recorder {
    fn before_write(&self) -> BoxFuture<'static, usize> {
        self.pass()
    }

    fn written(
        &self,
        position: usize,
        sink: &str,
        lease: &Lease,
        key: &IdempotencyKey,
        mutations: Option<Vec<Mutation>>,
        admission: &crate::error::Result<Admission>,
    ) {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Written {
                sink: sink.to_owned(),
                job: self.job,
                run: self.run,
                position,
                token: lease.token,
                key: key.clone(),
                mutations,
                answer: admission.as_ref().cloned().map_err(|e| e.to_string()),
            });
    }
}

impl World {
    /// A new world (started on the current actix system) whose tokens start in `epoch`.
    async fn new(epoch: u32, sink_names: &[String], settings: &Settings) -> Self {
        let store = Arc::new(MemoryLeaseStore::with_epoch(epoch));
        let stores = Stores::from(store.clone());
        // Its reaper, flow passes and follow-up sweep run when the harness says (`tidy`), not
        // on a timer: the coordinator is here for what a handler asks of it.
        let coordinator = Coordinator::new(stores.clone())
            .with_reap_interval(Duration::from_secs(24 * 3600))
            .with_history_interval(None)
            .start();
        let mut world = Self {
            store,
            stores,
            coordinator,
            sinks: Sinks::new(),
            sink_stores: BTreeMap::new(),
            writes: Arc::default(),
            runs: Arc::default(),
        };
        for name in sink_names {
            world.add_sink(name);
        }
        #[cfg(feature = "postgres")]
        for (name, sink) in &settings.postgres {
            world.sinks = world
                .sinks
                .clone()
                .with_postgres(name.clone(), sink.clone());
        }
        #[cfg(not(feature = "postgres"))]
        let _ = settings;
        // Lets the actors start while the runtime runs (an actor first polled as the runtime
        // is dropped would start its timers with no reactor).
        tokio::task::yield_now().await;
        world
    }

    /// Adds a memory fenced sink `name` (on the current actix system).
    fn add_sink(&mut self, name: &str) {
        let fenced = Arc::new(MemoryFencedStore::new());
        let actor = FencedSink::new(name, fenced.clone() as Arc<dyn FencedStore>);
        self.sinks = self.sinks.clone().with(name, actor.start());
        self.sink_stores.insert(name.to_owned(), fenced);
    }

    /// Enqueues `jobs` as a producer would.
    async fn enqueue(&self, jobs: Vec<NewJob>) -> TestResult<Vec<JobId>> {
        let done = crate::enqueue::enqueue_counted(&self.stores, jobs).await?;
        Ok(done.into_iter().map(|e| e.id()).collect())
    }

    /// What the worker's and coordinator's timers would have done by now: schedule ticks,
    /// the reaper (expired leases), the follow-up sweep and flow passes.
    async fn tidy(&self, settings: &Settings) -> TestResult<()> {
        let now = self.stores.now_ms().await?;
        for schedule in &settings.schedules {
            crate::scheduler::fire(&self.stores, schedule, now, false).await?;
        }
        self.stores.reap(1000).await?;
        for set in self.stores.follow_ups(Duration::ZERO, 1000).await? {
            crate::coordinator::deliver_follow_ups(&self.stores, set, "swept").await;
        }
        while crate::flow_driver::advance(&*self.stores.flows()).await? > 0 {}
        // As a worker passes it on after each settlement: a sink refuses every token below
        // the coordinator's low watermark, so a run whose lease was reaped (and whose job was
        // buried, or is not claimed yet) is refused too.
        if let Some(watermark) = self.store.watermark() {
            self.sinks.observe_watermark(watermark);
        }
        Ok(())
    }

    /// Claims job `id` from its queue (giving back any other job it claims first).
    async fn claim(&self, id: JobId, settings: &Settings) -> TestResult<Claim> {
        let view =
            self.stores.inspect().job(id).await?.ok_or_else(|| {
                TestError::NotClaimable(id, "it is not waiting in a queue".into())
            })?;
        self.stores.admin().run_now(id).await?;
        let queue = view.job.queue;
        let mut others = Vec::new();
        let found = loop {
            let claims = self.store.claim(&queue, WORKER, 1, settings.lease).await?;
            let Some(claim) = claims.into_iter().next() else {
                break None;
            };
            if claim.job.id == id {
                break Some(claim);
            }
            others.push((claim.lease.id, claim.job));
        };
        let ahead: Vec<String> = others
            .iter()
            .map(|(_, job)| format!("{} {:?}", job.id, job.kind))
            .collect();
        if !others.is_empty() {
            let released = others
                .into_iter()
                .map(|(lease, _)| (lease, Settlement::Release));
            self.store.settle(released.collect()).await?;
        }
        if let Some(claim) = found {
            return Ok(claim);
        }
        let why = if self.stores.admin().paused().await?.contains(&queue) {
            format!("its queue {queue:?} is paused")
        } else if !ahead.is_empty() {
            format!(
                "jobs ahead of it in its scope or group hold it back ({}): drain the queue to \
                 run them in order",
                ahead.join(", ")
            )
        } else {
            "its scope, group or rate limit holds it back".to_owned()
        };
        Err(TestError::NotClaimable(id, why))
    }

    /// Runs `claim`'s attempt to its settlement, as a worker does; a `gate` holds it back
    /// before one of its writes (or its settlement) until woken.
    async fn run(
        &self,
        claim: Claim,
        settings: &Settings,
        gate: Option<Arc<Gate>>,
    ) -> TestResult<Performed> {
        let Claim { job, lease } = claim;
        let job = Arc::new(job);
        let run = {
            let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
            let n = runs.entry(job.id).or_default();
            *n += 1;
            *n
        };
        let recorder = Arc::new(Recorder {
            job: job.id,
            run,
            next: AtomicUsize::new(0),
            writes: self.writes.clone(),
            gate,
        });
        let state = Arc::new(
            RunState::new(job.id, self.coordinator.clone(), None, WORKER.into())
                .with_probe(recorder.clone()),
        );
        let (settlement, timed_out) = match crate::policy::expired(&job, crate::store::unix_ms()) {
            Some(expired) => (expired, false),
            None => {
                let cancel = CancellationToken::new();
                let ctx = JobContext::new(
                    job.clone(),
                    lease.clone(),
                    cancel.clone(),
                    self.sinks.clone(),
                    state.clone(),
                );
                let attempt = crate::attempt::start(&settings.registry, &job, ctx);
                let timeout = settings.registry.timeout_of(&job);
                let finished = crate::attempt::finish(attempt, timeout, settings.grace, &cancel);
                tokio::pin!(finished);
                let renewing = self.renew(&lease, &recorder, &cancel, settings);
                let (outcome, timed_out) = tokio::select! {
                    done = &mut finished => done,
                    () = renewing => finished.await,
                };
                let s = crate::attempt::settlement(
                    &settings.registry,
                    settings.retry,
                    &job,
                    &outcome,
                    &state,
                );
                (s, timed_out)
            }
        };
        state.flush_progress();
        // A held run holds its settlement back too (a paused process settles nothing).
        recorder.pass().await;
        let (follow_ups, flows, result) = match &settlement {
            Settlement::Complete { result, then } => (
                then.jobs.clone(),
                then.flows.iter().map(|f| f.id()).collect(),
                result
                    .as_deref()
                    .and_then(|r| serde_json::from_str::<Json>(r).ok())
                    .and_then(|mut r| r.get_mut("ok").map(Json::take)),
            ),
            _ => (Vec::new(), Vec::new(), None),
        };
        let then = match &settlement {
            Settlement::Complete { then, .. } => then.clone(),
            _ => Default::default(),
        };
        let mut settled = self
            .store
            .settle(vec![(lease.id, settlement.clone())])
            .await?;
        let outcome = match settled.pop().unwrap_or(Ok(())) {
            Err(e) => Outcome::Refused {
                error: e.to_string(),
            },
            Ok(()) => {
                if !then.jobs.is_empty() || !then.flows.is_empty() {
                    let set = FollowUps {
                        parent: job.id,
                        jobs: then.jobs,
                        flows: then.flows,
                    };
                    crate::coordinator::deliver_follow_ups(&self.stores, set, "enqueued").await;
                }
                self.tidy(settings).await?;
                outcome_of(&settlement)
            }
        };
        let writes = self
            .writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|w| w.job == job.id && w.run == run)
            .cloned()
            .collect();
        Ok(Performed {
            job: (*job).clone(),
            outcome,
            timed_out,
            writes,
            follow_ups,
            flows,
            result,
        })
    }

    /// Renews `lease` every third of it while its run goes on, as a worker's `Renewal` does;
    /// ends when the run is held at its gate (a paused process renews nothing) or the lease
    /// is lost (then the handler's token is cancelled, as a worker cancels it).
    async fn renew(
        &self,
        lease: &Lease,
        recorder: &Recorder,
        cancel: &CancellationToken,
        settings: &Settings,
    ) {
        loop {
            tokio::time::sleep(settings.lease / 3).await;
            if recorder.held() {
                return;
            }
            match self.store.renew(&[lease.id], settings.lease).await {
                Ok(lost) if lost.is_empty() => {}
                _ => {
                    cancel.cancel();
                    return;
                }
            }
        }
    }

    /// Runs `queue` (every queue when `None`) until nothing waits in it, skipping time to the
    /// next delayed job when nothing is ready; `only` stops once that job has ended.
    async fn drain(
        &self,
        queue: Option<&str>,
        only: Option<JobId>,
        settings: &Settings,
    ) -> TestResult<Ran> {
        let mut ran = Ran::default();
        // Seconds in a row skipped with ready jobs none of which could be claimed.
        let mut idle = 0;
        loop {
            self.tidy(settings).await?;
            if let Some(id) = only {
                if self.stores.inspect().job(id).await?.is_none() {
                    return Ok(ran);
                }
            }
            let queues = match queue {
                Some(q) => vec![q.to_owned()],
                None => self.stores.inspect().queues().await?,
            };
            let mut claimed = None;
            for q in &queues {
                if let Some(c) = self.store.claim(q, WORKER, 1, settings.lease).await?.pop() {
                    claimed = Some(c);
                    break;
                }
            }
            if let Some(claim) = claimed {
                if ran.runs.len() >= settings.max_runs {
                    self.store
                        .settle(vec![(claim.lease.id, Settlement::Release)])
                        .await?;
                    return Err(self.never_ends(queue, &ran, &queues, "").await);
                }
                ran.runs.push(self.run(claim, settings, None).await?);
                idle = 0;
                continue;
            }
            // Nothing ready: skip to the next delayed job (or the next lease to run out).
            let mut next: Option<Duration> = None;
            let mut waiting = 0;
            for q in &queues {
                let counts = self.stores.inspect().counts(q).await?;
                waiting += counts.ready + counts.delayed + counts.leased + counts.waiting;
                let due = self.stores.inspect().delayed(q, 1).await?;
                if let Some(d) = due.first().and_then(|v| v.due_in) {
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
                if counts.leased > 0 {
                    next = Some(next.map_or(settings.lease, |n| n.min(settings.lease)));
                }
            }
            if waiting == 0 {
                return Ok(ran);
            }
            // Ready yet not claimable, with nothing due: a paused queue waits for good; a
            // rate limit or a group's for its bucket to refill, a second at a time, a while.
            if next.is_none() {
                let paused = self.stores.admin().paused().await?;
                let stuck: Vec<&String> = queues.iter().filter(|q| paused.contains(q)).collect();
                idle += 1;
                if !stuck.is_empty() || idle > MAX_IDLE_STEPS {
                    let why = match stuck.is_empty() {
                        true => format!("ready jobs stayed unclaimable for {idle} s"),
                        false => format!("paused queues {stuck:?}"),
                    };
                    return Err(self.never_ends(queue, &ran, &queues, &why).await);
                }
            }
            let step = next
                .unwrap_or(Duration::from_secs(1))
                .max(Duration::from_millis(1));
            if ran.skipped + step > settings.max_skip {
                return Err(self.never_ends(queue, &ran, &queues, "").await);
            }
            self.skip(step, settings).await?;
            ran.skipped += step;
        }
    }

    /// Moves time on by `by`, stopping at each schedule tick on the way to fire it, as a
    /// running scheduler would (one jump would fire only the ticks its catch-up keeps).
    async fn skip(&self, by: Duration, settings: &Settings) -> TestResult<()> {
        let mut left = by;
        loop {
            let now = self.stores.now_ms().await?;
            let mut next: Option<i64> = None;
            for schedule in &settings.schedules {
                let mark = self.stores.schedule_mark(schedule.name()).await?;
                if let Some(tick) = schedule.next_fired(mark, now) {
                    next = Some(next.map_or(tick, |n| n.min(tick)));
                }
            }
            let to_tick = next
                .and_then(|t| u64::try_from(t.saturating_sub(now)).ok())
                .map(Duration::from_millis);
            match to_tick {
                Some(wait) if wait <= left => {
                    // (Past the tick by a millisecond: the wall clock is read in whole ms.)
                    let step = (wait + Duration::from_millis(1)).min(left);
                    palisade_core::clock::skip(step);
                    left -= step;
                    self.tidy(settings).await?;
                }
                _ => {
                    palisade_core::clock::skip(left);
                    return self.tidy(settings).await;
                }
            }
        }
    }

    async fn never_ends(
        &self,
        queue: Option<&str>,
        ran: &Ran,
        queues: &[String],
        why: &str,
    ) -> TestError {
        let mut left = Vec::new();
        if !why.is_empty() {
            left.push(format!("({why})"));
        }
        for q in queues {
            let inspect = self.stores.inspect();
            let ready = inspect.ready(q, 20).await.unwrap_or_default();
            let delayed = inspect.delayed(q, 20).await.unwrap_or_default();
            for v in ready.iter().chain(&delayed) {
                left.push(describe(v));
            }
        }
        TestError::NeverEnds {
            queue: queue.unwrap_or("(every queue)").to_owned(),
            runs: ran.runs.len(),
            skipped: ran.skipped,
            left: if left.is_empty() {
                "jobs still leased".into()
            } else {
                left.join("; ")
            },
        }
    }

    /// Every job waiting (ready or delayed) in any queue.
    async fn waiting(&self) -> TestResult<Vec<JobView>> {
        let inspect = self.stores.inspect();
        let mut all = Vec::new();
        for q in inspect.queues().await? {
            all.extend(inspect.ready(&q, 10_000).await?);
            all.extend(inspect.delayed(&q, 10_000).await?);
        }
        Ok(all)
    }
}

/// One line about a waiting job.
fn describe(v: &JobView) -> String {
    let due = v
        .due_in
        .map(|d| format!(", due in {d:?}"))
        .unwrap_or_default();
    let error = v
        .last_error
        .as_deref()
        .map(|e| format!(", last error {e:?}"))
        .unwrap_or_default();
    format!(
        "{} {:?} in {:?} (attempt {}{due}{error}) payload {}",
        v.job.id, v.job.kind, v.job.queue, v.job.attempt, v.job.payload
    )
}

fn outcome_of(settlement: &Settlement) -> Outcome {
    match settlement {
        Settlement::Complete { .. } => Outcome::Completed,
        Settlement::Retry { delay, reason } => Outcome::Retry {
            after: *delay,
            reason: reason.clone(),
        },
        Settlement::Dead { reason } => Outcome::Dead {
            reason: reason.clone(),
        },
        Settlement::Release => Outcome::Released,
        Settlement::Snooze { delay } => Outcome::Snoozed { after: *delay },
        Settlement::Fenced { reason, .. } => Outcome::Fenced {
            reason: reason.clone(),
        },
    }
}

/// Runs a registry's handlers as a worker does, over the memory stores and sinks, on a clock
/// it moves on itself. Made on, and used from, one test's thread (a plain `#[test]`).
///
/// ```
/// use palisade::testing::Harness;
/// use palisade::{JobContext, JobError, Mutation, NewJob, Registry};
///
/// async fn credit(ctx: JobContext, cents: i64) -> Result<(), JobError> {
///     ctx.sink("ledger")?
///         .write(vec![Mutation::HashIncr { key: "acct:1".into(), field: "cents".into(), by: cents }])
///         .await?
///         .accepted()?;
///     Ok(())
/// }
///
/// let h = Harness::new(Registry::new().register("credit", credit)).with_sink("ledger");
/// let done = h.perform(NewJob::new("credit", &250).unwrap()).unwrap();
/// assert!(done.completed());
/// assert_eq!(h.sink("ledger").unwrap().field("acct:1", "cents").as_deref(), Some("250"));
/// ```
pub struct Harness {
    system: actix::SystemRunner,
    world: World,
    settings: Settings,
    sink_names: Vec<String>,
    /// The epoch of the newest world, so a later one's tokens are all newer.
    epoch: std::cell::Cell<u32>,
}

impl Harness {
    /// A harness running `registry`'s handlers, with no sinks yet, the default retry policy
    /// and a 30-second lease; `drain` stops after 10,000 runs or 30 days of skipped time.
    ///
    /// Panics when called inside an async runtime (it runs its own: write a plain `#[test]`)
    /// and on a registry a worker would refuse to start with (a timeout or retry policy for
    /// a kind without a handler, an example payload its handler does not decode).
    pub fn new(registry: Registry) -> Self {
        if tokio::runtime::Handle::try_current().is_ok() {
            panic!(
                "palisade::testing::Harness runs its own runtime on the test's thread: write a \
                 plain #[test], not #[tokio::test] or #[actix_rt::test], and run async code of \
                 your own with h.block_on(..)"
            );
        }
        let system = actix::System::new();
        let settings = Settings {
            registry,
            retry: RetryPolicy::default(),
            lease: Duration::from_secs(30),
            grace: Duration::from_secs(5),
            max_runs: 10_000,
            max_skip: Duration::from_secs(30 * 24 * 3600),
            schedules: Vec::new(),
            #[cfg(feature = "postgres")]
            postgres: Vec::new(),
        };
        if let Err(e) = settings.registry.validate() {
            panic!("the registry would not start a worker: {e}");
        }
        let world = system.block_on(World::new(1, &[], &settings));
        Self {
            system,
            world,
            settings,
            sink_names: Vec::new(),
            epoch: std::cell::Cell::new(1),
        }
    }

    /// Adds a memory fenced sink, for `ctx.sink(name)`.
    pub fn with_sink(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.system.block_on(async { self.world.add_sink(&name) });
        self.sink_names.push(name);
        self
    }

    /// Adds your Postgres sink, for `ctx.postgres(name)`: its transactions run against your
    /// database, fenced by its own fence rows. Give each test its own schema.
    #[cfg(feature = "postgres")]
    pub fn with_postgres(
        mut self,
        name: impl Into<String>,
        sink: Arc<crate::store::postgres::PostgresSink>,
    ) -> Self {
        let name = name.into();
        self.world.sinks = self
            .world
            .sinks
            .clone()
            .with_postgres(name.clone(), sink.clone());
        self.settings.postgres.push((name, sink));
        self
    }

    /// The retry policy for kinds without their own (`Registry::with_retry`). Panics on a
    /// policy a worker would refuse.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        if let Err(e) = policy.validate("the harness's default") {
            panic!("a worker would refuse this retry policy: {e}");
        }
        self.settings.retry = policy;
        self
    }

    /// The lease each claim gets (30 s by default): the time a zombie is paused past.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// Where `drain` gives up: after `runs` attempts, or `skipped` of skipped time.
    pub fn with_bounds(mut self, runs: usize, skipped: Duration) -> Self {
        (self.settings.max_runs, self.settings.max_skip) = (runs, skipped);
        self
    }

    /// Runs `fut` on the harness's system (to set up a database, read one, or call your
    /// own async code between steps).
    pub fn block_on<F: std::future::Future>(&self, fut: F) -> F::Output {
        self.system.block_on(fut)
    }

    /// Enqueues `job` as a producer would (validated, deduplicated by its keys); nothing
    /// runs until [`drain`](Self::drain) or [`perform`](Self::perform).
    pub fn enqueue(&self, job: NewJob) -> TestResult<JobId> {
        let ids = self.block_on(self.world.enqueue(vec![job]))?;
        Ok(ids[0])
    }

    /// Enqueues `job` and runs one attempt of it now, ahead of its queue and its delay;
    /// what it sets going (follow-ups, a retry) waits for [`drain`](Self::drain).
    pub fn perform(&self, job: NewJob) -> TestResult<Performed> {
        self.block_on(async {
            let id = self.world.enqueue(vec![job]).await?[0];
            let claim = self.world.claim(id, &self.settings).await?;
            self.world.run(claim, &self.settings, None).await
        })
    }

    /// Runs `queue` until nothing waits in it: ready jobs now, delayed ones (retries,
    /// snoozes, delays) by skipping time to them, follow-ups and flow steps as they come.
    pub fn drain(&self, queue: &str) -> TestResult<Ran> {
        self.block_on(self.world.drain(Some(queue), None, &self.settings))
    }

    /// [`drain`](Self::drain) every queue.
    pub fn drain_all(&self) -> TestResult<Ran> {
        self.block_on(self.world.drain(None, None, &self.settings))
    }

    /// Moves the harness's time on by `by` (its thread's, see the module docs), doing what
    /// came due on the way: each schedule tick fired at its time, expired leases reaped,
    /// follow-ups swept, flows moved on. Nothing runs.
    pub fn advance(&self, by: Duration) -> TestResult<()> {
        self.block_on(self.world.skip(by, &self.settings))
    }

    /// Fires `schedule` as a scheduler would while time moves on ([`advance`](Self::advance),
    /// [`drain`](Self::drain)'s skips): it starts now, firing no tick from before.
    pub fn with_schedule(mut self, schedule: Schedule) -> TestResult<Self> {
        self.settings.schedules.push(schedule);
        self.block_on(self.world.tidy(&self.settings))?;
        Ok(self)
    }

    /// Pauses tokio's clock on the harness's runtime, as `#[tokio::test(start_paused = true)]`
    /// does: whenever nothing is left to do but wait, tokio's time jumps to the next timer. A
    /// handler's `tokio::time::sleep`, its timeout (`Registry::with_timeout`) and its grace
    /// then pass at once. Off by default: a handler awaiting real I/O (your database, a mock
    /// server) lets time jump too, which fires its client's own timeouts early.
    pub fn with_virtual_timers(self) -> Self {
        self.block_on(async { tokio::time::pause() });
        self
    }

    /// The harness's time now, on the wall clock: the real one plus all it skipped (for a
    /// deadline or a payload's time made relative to it).
    pub fn now(&self) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + Duration::from_millis(palisade_core::clock::unix_ms())
    }

    /// Every job waiting (ready or delayed), in every queue.
    pub fn enqueued(&self) -> Vec<Job> {
        let views = self.block_on(self.world.waiting()).unwrap_or_default();
        views.into_iter().map(|v| v.job).collect()
    }

    /// Panics, listing what waits, unless a job matching `want` waits
    /// ([`assert_enqueued!`](crate::assert_enqueued)).
    #[track_caller]
    pub fn assert_enqueued(&self, want: &Expect) -> Job {
        let all = self.enqueued();
        match all.iter().find(|j| want.matches(j)) {
            Some(job) => job.clone(),
            None => panic!("no job enqueued with {want}; waiting: {}", listing(&all)),
        }
    }

    /// Panics, naming it, if a job matching `want` waits
    /// ([`refute_enqueued!`](crate::refute_enqueued)).
    #[track_caller]
    pub fn refute_enqueued(&self, want: &Expect) {
        let all = self.enqueued();
        if let Some(job) = all.iter().find(|j| want.matches(j)) {
            panic!(
                "a job is enqueued with {want}: {}",
                listing(std::slice::from_ref(job))
            );
        }
    }

    /// Sink `name`'s contents.
    pub fn sink(&self, name: &str) -> TestResult<SinkView> {
        self.world
            .sink_stores
            .get(name)
            .map(|s| SinkView(s.clone()))
            .ok_or_else(|| TestError::NoSink(name.to_owned()))
    }

    /// Every fenced write so far, in order.
    pub fn writes(&self) -> Vec<Written> {
        self.world
            .writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The stores underneath, for anything the harness does not say (a job's details, a
    /// flow's status, the dead letters).
    pub fn stores(&self) -> &Stores {
        &self.world.stores
    }

    /// Summons a zombie: runs `job` once to count its writes, then, for each of them and for
    /// its settlement, in a world of its own (new memory stores and sinks; this harness's own
    /// are untouched): a first run pauses before that write, its lease runs out, a rival
    /// claims the job and runs it to its end, and the first run wakes and goes on.
    /// [`Zombie::assert_fenced`] then checks that no write the woken run made after its pause
    /// was applied once a rival had held the job, and that no two runs applied the same change
    /// under different keys. Each world starts at this harness's time, which it leaves as it
    /// was. With a Postgres sink ([`with_postgres`](Self::with_postgres)) each world writes to
    /// your database.
    pub fn zombie(&self, job: NewJob) -> TestResult<Zombie> {
        // Each world's time is put back when it is done: the time a scenario skips (its
        // first run's lease running out) is its own, and this harness's clock never moves.
        let saved = palisade_core::clock::skipped();
        let zombie = self.block_on(async {
            let counted = self.world_for_zombie().await;
            let id = counted.enqueue(vec![job.clone()]).await?[0];
            let claim = counted.claim(id, &self.settings).await?;
            let writes = counted.run(claim, &self.settings, None).await?.writes.len();
            palisade_core::clock::restore(saved);
            // Before each write, then before settling (past the cap, before settling only).
            let mut pauses: Vec<usize> = (0..writes.min(MAX_PAUSES - 1)).collect();
            pauses.push(writes);
            let mut scenarios = Vec::new();
            for at in pauses {
                let scenario = self.scenario(&job, at).await;
                palisade_core::clock::restore(saved);
                scenarios.push(scenario?);
            }
            Ok(Zombie { scenarios })
        });
        palisade_core::clock::restore(saved);
        zombie
    }

    /// A new world whose tokens are all newer than every earlier world's.
    async fn world_for_zombie(&self) -> World {
        self.epoch.set(self.epoch.get() + 1);
        World::new(self.epoch.get(), &self.sink_names, &self.settings).await
    }

    async fn scenario(&self, job: &NewJob, at: usize) -> TestResult<Scenario> {
        let world = self.world_for_zombie().await;
        let id = world.enqueue(vec![job.clone()]).await?[0];
        let claim = world.claim(id, &self.settings).await?;
        let gate = Arc::new(Gate {
            at,
            held: AtomicBool::new(false),
            reached: Notify::new(),
            wake: tokio::sync::watch::Sender::new(false),
        });
        let mut first = {
            let (world, settings, gate) = (world.clone(), self.settings.clone(), gate.clone());
            actix::spawn(async move { world.run(claim, &settings, Some(gate)).await })
        };
        let panicked = |e: tokio::task::JoinError| {
            TestError::from(Error::Backend(format!("the first run panicked: {e}")))
        };
        // A run that makes fewer writes this time never reaches its pause: it ran to its end.
        let ended = tokio::select! {
            () = gate.reached.notified() => None,
            ran = &mut first => Some(ran),
        };
        let (zombie, rivals, paused) = match ended {
            Some(ran) => (ran.map_err(panicked)??, Vec::new(), false),
            None => {
                // Paused past its lease: the reaper gives the job back (or, out of stalls,
                // buries it), and a rival runs it to its end. Then the first run wakes.
                palisade_core::clock::skip(self.settings.lease + Duration::from_secs(1));
                let rivals = world.drain(None, Some(id), &self.settings).await;
                gate.wake.send_replace(true);
                let ran = first.await.map_err(panicked)??;
                (ran, rivals?.runs, true)
            }
        };
        let writes = world
            .writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // A late write is a leak once a rival held the job: a newer token, or the watermark
        // its settlement moved, must refuse it. With no rival (the reaper buried the job, out
        // of stalls) the woken run's write is the job's only one, as the fence allows.
        let late_from = (paused && !rivals.is_empty()).then_some(at);
        let leaks = leaks(&writes, id, late_from);
        Ok(Scenario {
            paused_before: at,
            paused,
            zombie,
            rivals,
            leaks,
            sinks: world.sink_stores,
        })
    }
}

/// The writes in `writes` that break fencing, for job `id` whose first run was paused before
/// its write `paused` while a rival ran the job (`None`: no rival did):
/// - a write of the first run from its pause on (made after it woke) that was applied;
/// - a write applied by one run that another run had applied already under another key:
///   the same mutations to the same sink (a `ctx.sink` write), or the same position (a
///   Postgres transaction, whose statements the harness does not see). A re-run must repeat
///   a write under its key, so the sink answers `Duplicate`.
fn leaks(writes: &[Written], id: JobId, paused: Option<usize>) -> Vec<Leak> {
    let mut found = Vec::new();
    let mut applied: Vec<&Written> = Vec::new();
    for w in writes.iter().filter(|w| w.job == id && w.applied()) {
        if paused.is_some_and(|at| w.run == 1 && w.position >= at) {
            found.push(Leak {
                paused_before: paused.unwrap_or_default(),
                write: w.clone(),
                earlier: None,
            });
            continue;
        }
        let twin = applied.iter().find(|e| {
            e.run != w.run
                && e.sink == w.sink
                && e.key != w.key
                && match (&e.mutations, &w.mutations) {
                    (Some(a), Some(b)) => a == b,
                    (None, None) => e.position == w.position,
                    _ => false,
                }
        });
        match twin {
            Some(earlier) => found.push(Leak {
                paused_before: paused.unwrap_or_default(),
                write: w.clone(),
                earlier: Some((*earlier).clone()),
            }),
            None => applied.push(w),
        }
    }
    found
}

/// One way a zombie scenario broke fencing.
#[derive(Clone, Debug)]
pub struct Leak {
    /// Writes the first run had made when it paused.
    pub paused_before: usize,
    /// The write that should not have been applied.
    pub write: Written,
    /// The earlier run's write at the same position, applied before it (`None`: the write
    /// is the woken zombie's own).
    pub earlier: Option<Written>,
}

impl fmt::Display for Leak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = &self.write;
        match &self.earlier {
            None => write!(
                f,
                "paused before its write #{}, the first run woke after its lease had run out, \
                 and its write #{} to sink {:?} was applied:\n    {}\n  a late write must be \
                 refused: write through ctx.sink or ctx.postgres, under the lease's fence",
                self.paused_before,
                w.position,
                w.sink,
                w.brief()
            ),
            Some(earlier) => write!(
                f,
                "paused before its write #{}, then re-run by a rival: write #{} to sink {:?} was \
                 applied twice, under two keys:\n    {}\n    {}\n  a re-run must repeat a write \
                 under the same idempotency key: ctx.sink(..).write numbers a run's writes in \
                 order; give write_keyed a key made from the job, never a fresh one",
                self.paused_before,
                w.position,
                w.sink,
                earlier.brief(),
                w.brief()
            ),
        }
    }
}

/// One scenario of [`Harness::zombie`].
pub struct Scenario {
    /// The write the first run was to pause before (after its last: before settling).
    pub paused_before: usize,
    /// It did pause there; `false`: this run made fewer writes than the first one counted, and
    /// ran to its end.
    pub paused: bool,
    /// The first run, woken after the rivals.
    pub zombie: Performed,
    /// The rivals' runs, in order.
    pub rivals: Vec<Performed>,
    /// What broke fencing.
    pub leaks: Vec<Leak>,
    sinks: BTreeMap<String, Arc<MemoryFencedStore>>,
}

impl Scenario {
    /// Sink `name`'s contents at the scenario's end.
    pub fn sink(&self, name: &str) -> TestResult<SinkView> {
        self.sinks
            .get(name)
            .map(|s| SinkView(s.clone()))
            .ok_or_else(|| TestError::NoSink(name.to_owned()))
    }
}

/// What [`Harness::zombie`] saw, one scenario per pause.
pub struct Zombie {
    /// Paused before each write, then before its settlement.
    pub scenarios: Vec<Scenario>,
}

impl Zombie {
    /// Every leak, in every scenario.
    pub fn leaks(&self) -> impl Iterator<Item = &Leak> {
        self.scenarios.iter().flat_map(|s| &s.leaks)
    }

    /// The woken runs' writes that were refused, in every scenario.
    pub fn refused(&self) -> usize {
        self.scenarios
            .iter()
            .flat_map(|s| &s.zombie.writes)
            .filter(|w| w.refused())
            .count()
    }

    /// Panics, naming each write, if any scenario let a late write through or applied a
    /// write twice.
    #[track_caller]
    pub fn assert_fenced(&self) {
        let leaks: Vec<String> = self.leaks().map(|l| format!("- {l}")).collect();
        // (One line per leak, then its writes, indented.)
        if !leaks.is_empty() {
            panic!(
                "{} of {} zombie scenarios broke fencing:\n{}",
                self.scenarios
                    .iter()
                    .filter(|s| !s.leaks.is_empty())
                    .count(),
                self.scenarios.len(),
                leaks.join("\n")
            );
        }
    }
}

/// The jobs, one line each, for a failed assertion.
fn listing(jobs: &[Job]) -> String {
    if jobs.is_empty() {
        return "none".into();
    }
    let lines: Vec<String> = jobs
        .iter()
        .map(|j| {
            format!(
                "\n  {} {:?} in {:?} scope {:?} payload {}",
                j.id,
                j.kind,
                j.queue,
                j.scope.as_str(),
                j.payload
            )
        })
        .collect();
    lines.concat()
}
