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

mod expect;
mod world;
mod zombie;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::Value as Json;

use crate::admission::Admission;
use crate::context::Registry;
use crate::error::Error;
use crate::ids::{FencingToken, IdempotencyKey, JobId};
use crate::job::{Job, NewJob};
use crate::mutation::{Mutation, Value};
use crate::policy::RetryPolicy;
use crate::schedule::Schedule;
use crate::store::memory::MemoryFencedStore;
use crate::store::{FencedStore, Stores};
use world::{Settings, World};

pub use crate::{assert_enqueued, refute_enqueued};
pub use expect::Expect;
pub use zombie::{Found, Leak, Scenario, Zombie};

/// The harness's worker name, on its claims and rejection notes.
const WORKER: &str = "palisade-testing";

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
    ///
    /// Panics below 30 ms, as a worker refuses such a lease (it is renewed every third).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        if lease < Duration::from_millis(30) {
            panic!("a worker would refuse a {lease:?} lease: at least 30 ms (it is renewed every third)");
        }
        self.settings.lease = lease;
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

    /// Completes waitpoint `id` with `value` and wakes the durable run waiting for it, as
    /// [`Client::complete_waitpoint`](crate::Client::complete_waitpoint) does; the run goes on
    /// at the next [`drain`](Self::drain). (A wait nobody completes times out as the drain
    /// skips time past its timeout.)
    pub fn complete_waitpoint(
        &self,
        id: &str,
        value: &impl serde::Serialize,
    ) -> TestResult<crate::store::Completion> {
        let client = crate::Client::new(self.world.stores.clone());
        Ok(self.block_on(client.complete_waitpoint(id, value))?)
    }

    /// The stores underneath, for anything the harness does not say (a job's details, a
    /// flow's status, the dead letters).
    pub fn stores(&self) -> &Stores {
        &self.world.stores
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
