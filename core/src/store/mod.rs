//! Backend traits. Actors talk only to these; memory, Redis and Postgres implement them.
//!
//! Every method is one atomic backend operation and, where a worker does many of the same
//! thing, takes a batch — so a remote backend pays one round trip per batch, not per job.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::admission::{Admission, Fence};
use crate::error::Result;
use crate::ids::{FencingToken, IdempotencyKey, JobId, LeaseId, Scope};
use crate::job::{Claim, Enqueued, FollowUps, NewJob, Settlement};
pub use crate::mutation::{Mutation, Value};
use crate::schedule::{Schedule, ScheduleSpec};

mod admin;
pub mod epoch;
pub mod flows;
pub mod waitpoint;

pub use admin::{Inspect, QueueAdmin, SweepProgress};
pub use flows::FlowStore;
pub use waitpoint::{Completion, Waitpoint};

/// Dead-lettered jobs kept per queue unless configured otherwise; the oldest go first.
pub const DEFAULT_DEAD_RETENTION: usize = 10_000;

/// How many of a queue's newest dead letters [`QueueAdmin::retry_dead_job`] and
/// [`QueueAdmin::purge_dead_job`] search for the job: one click stays a bounded read.
pub const DEAD_JOB_SEARCH: usize = 5_000;

/// The most groups [`Inspect::groups`] lists.
pub const MAX_TOP_GROUPS: usize = 1_000;

/// How many groups of each rotation (the least recently served) [`Inspect::oldest_ready`]
/// looks at for the oldest grouped job: a bounded read however many groups wait.
pub const GROUP_HEADS_LOOKED_AT: usize = 100;

/// Largest dead-letter retention (2^40): larger numbers would reach a Lua script as a double
/// printed in exponent form, which Redis refuses halfway through a script.
pub const MAX_DEAD_RETENTION: usize = 1 << 40;

/// How many fences (and, in memory, expired keys) one sink call of `writes` writes may
/// forget: more than the call can add, so state shrinks back to the live scopes; bounded, so
/// no call blocks the backend for long. The same on every backend, so they agree exactly.
#[doc(hidden)]
pub fn collect_budget(writes: usize) -> usize {
    writes.saturating_mul(2).saturating_add(16)
}

/// How many due delayed jobs one claim of `n` moves to ready: enough to keep up with what
/// claims consume, never so many that one call blocks the backend (the Redis claim script
/// runs while every other client waits).
#[doc(hidden)]
pub fn promotions_per_claim(n: usize) -> usize {
    n.saturating_mul(2).saturating_add(16)
}
pub mod memory;
pub mod partitioned;

/// The hot path: what workers do to jobs many times a second (enqueue, claim, renew, settle,
/// reap), and the per-scope fencing counters and epoch those operations grant tokens from.
/// The `Coordinator` actor drives it.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Adds jobs; all or none. A job whose unique key another job holds (an earlier one of
    /// the same batch included) is not added: its entry is that job's id, as
    /// [`Enqueued::Existing`].
    async fn enqueue_all(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>>;

    /// [`enqueue_all`](Self::enqueue_all), the ids only (new or existing).
    async fn enqueue(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>> {
        Ok(self
            .enqueue_all(jobs)
            .await?
            .into_iter()
            .map(Enqueued::id)
            .collect())
    }

    /// Claims up to `n` ready jobs of `queue` whose scope has no live lease, granting each a
    /// fresh lease id and the next fencing token, valid for `ttl` — only jobs whose kind is
    /// in `kinds` (every kind when `kinds` is empty), so a worker never claims a job it has
    /// no handler for: such jobs wait for a worker that has one.
    async fn claim_kinds(
        &self,
        queue: &str,
        kinds: &[String],
        worker: &str,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Claim>>;

    /// [`claim_kinds`](Self::claim_kinds) of every kind.
    async fn claim(
        &self,
        queue: &str,
        worker: &str,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Claim>> {
        self.claim_kinds(queue, &[], worker, n, ttl).await
    }

    /// Extends every still-current lease in `leases` by `ttl`; returns the ones that are not
    /// current any more (expired, reaped, replaced). Lost leases are never revived.
    async fn renew(&self, leases: &[LeaseId], ttl: Duration) -> Result<Vec<LeaseId>>;

    /// Settles finished jobs. Each entry is checked by lease id: a lease that is not current
    /// gets `Err(LeaseNotCurrent)` and changes nothing.
    async fn settle(&self, settlements: Vec<(LeaseId, Settlement)>) -> Result<Vec<Result<()>>>;

    /// [`settle`](Self::settle), then [`claim_kinds`](Self::claim_kinds) as `claim` asks —
    /// the worker's usual pair, which a remote backend sends in one round trip (Redis: one
    /// pipeline, two scripts, each atomic on its own). The claim sees what the settlements
    /// freed, except on Redis in the one call after the server lost its scripts (a restart):
    /// a settle part answered `NOSCRIPT` is settled again after the claim. Each part has its
    /// own outcome: a failed claim does not undo the settlements, nor the other way round.
    /// The default makes the two calls one after the other, so a wrapper that overrides
    /// either is used.
    async fn settle_and_claim(
        &self,
        settlements: Vec<(LeaseId, Settlement)>,
        claim: &ClaimRequest,
    ) -> (Result<Vec<Result<()>>>, Result<Vec<Claim>>) {
        settle_then_claim(self, settlements, claim).await
    }

    /// The low watermark as of the latest [`settle`](Self::settle): every lease with a lower
    /// token is no longer current (see the `admission` module docs). `None` before any. Local
    /// and cheap: backends compute it inside the settle operation.
    fn watermark(&self) -> Option<FencingToken> {
        None
    }

    /// Moves up to `max` expired leases' jobs back to ready (a stall) or to dead.
    async fn reap(&self, max: usize) -> Result<Vec<Reaped>>;

    /// Follow-up jobs of accepted completions ([`Settlement::Complete`]'s `follow_ups`) kept
    /// for at least `older_than` and not forgotten yet, oldest first, at most `max` sets:
    /// what the delivery the settlement started never made (its process killed right after the
    /// completion was accepted, or the enqueue failed).
    async fn follow_ups(&self, older_than: Duration, max: usize) -> Result<Vec<FollowUps>>;

    /// Forgets job `parent`'s follow-up jobs (they were enqueued).
    async fn forget_follow_ups(&self, parent: JobId) -> Result<()>;

    /// The newest token granted for `scope`, if any.
    async fn highest_token(&self, scope: &Scope) -> Result<Option<FencingToken>>;

    /// The epoch tokens are granted in now (`None` before the coordinator has one). With
    /// [`raise_epoch`](Self::raise_epoch), for moving between coordinator layouts
    /// (partitions) without lowering any scope's tokens.
    async fn epoch(&self) -> Result<Option<u32>>;

    /// Makes every token granted from now on be in an epoch of at least `at_least`: moves
    /// there now if the current epoch is lower (leases already granted stay current), and
    /// records it as a floor for the epoch a recovery picks. Returns the epoch in force (or,
    /// before the coordinator has one, the floor it will start at). An epoch above
    /// [`FencingToken::MAX_EPOCH`] is an [`Error::Epoch`](crate::error::Error::Epoch).
    async fn raise_epoch(&self, at_least: u32) -> Result<u32>;
}

/// One claim, as [`LeaseStore::claim_kinds`] takes it (for
/// [`LeaseStore::settle_and_claim`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// Queue to claim from.
    pub queue: String,
    /// Kinds the claimer has handlers for (every kind when empty).
    pub kinds: Vec<String>,
    /// Claiming worker's name.
    pub worker: String,
    /// Most jobs to claim.
    pub n: usize,
    /// Lease length.
    pub ttl: Duration,
}

impl ClaimRequest {
    /// Makes this claim on `store`.
    #[doc(hidden)]
    pub async fn on<S: LeaseStore + ?Sized>(&self, store: &S) -> Result<Vec<Claim>> {
        store
            .claim_kinds(&self.queue, &self.kinds, &self.worker, self.n, self.ttl)
            .await
    }
}

/// [`LeaseStore::settle_and_claim`] as two calls, one after the other (its default).
#[doc(hidden)]
pub async fn settle_then_claim<S: LeaseStore + ?Sized>(
    store: &S,
    settlements: Vec<(LeaseId, Settlement)>,
    claim: &ClaimRequest,
) -> (Result<Vec<Result<()>>>, Result<Vec<Claim>>) {
    let settled = store.settle(settlements).await;
    (settled, claim.on(store).await)
}

/// Fleet-wide state kept in exactly one place (partition 0 of a partitioned layout): the
/// coordinator's clock, roles only one process may hold, and the kept schedules with their
/// marks. The `Scheduler` drives it.
#[async_trait]
pub trait ControlStore: Send + Sync + 'static {
    /// The coordinator's clock, in ms since the Unix epoch: schedules fire by it, so hosts
    /// whose clocks disagree agree on what is due.
    async fn now_ms(&self) -> Result<i64>;

    /// Takes or keeps `role` for `holder` for `ttl`, by the coordinator's clock; `true` if
    /// `holder` has it now. At most one holder at a time: roles that only one process per
    /// coordinator should play (sampling queue depth for the metrics).
    async fn hold_role(&self, role: &str, holder: &str, ttl: Duration) -> Result<bool>;

    /// Schedules kept in the coordinator (`palisade schedule add`), by name.
    async fn schedules(&self) -> Result<Vec<ScheduleSpec>>;

    /// Adds or replaces a kept schedule (checked first: a bad one is refused).
    async fn put_schedule(&self, spec: ScheduleSpec) -> Result<()>;

    /// Removes a kept schedule; `true` if there was one.
    async fn remove_schedule(&self, name: &str) -> Result<bool>;

    /// Pauses schedule `name` (a kept one or a worker binary's own: by name) or resumes it;
    /// `true` if that changed anything. A paused schedule's ticks are skipped, not saved up:
    /// the scheduler raises its mark without enqueueing, and resuming raises it to the
    /// coordinator's now, so a resumed schedule fires from its next tick on (never a tick of
    /// the pause the scheduler had not passed yet).
    async fn pause_schedule(&self, name: &str, paused: bool) -> Result<bool>;

    /// The names of paused schedules, sorted.
    async fn paused_schedules(&self) -> Result<Vec<String>>;

    /// The instant schedule `name` has been handled through (ms), if it ever fired.
    async fn schedule_mark(&self, name: &str) -> Result<Option<i64>>;

    /// Raises schedule `name`'s mark to `through`; never lowers it (a scheduler that woke
    /// from a pause cannot send it back).
    async fn advance_schedule(&self, name: &str, through: i64) -> Result<()>;

    /// Registers (or refreshes) a worker process for `ttl`, stamped with the coordinator's
    /// clock. For display (`status`, the operator page): nothing depends on it for safety —
    /// a paused worker's beat lapses like a dead one's, and the fence handles both.
    async fn beat(&self, beat: WorkerBeat, ttl: Duration) -> Result<()>;

    /// The worker processes whose last beat has not lapsed (at most 1,000), by name. (Lapsed
    /// ones are forgotten by later beats.)
    async fn workers(&self) -> Result<Vec<WorkerBeat>>;

    /// Keeps one sample of the fleet's counts, the newest [`HISTORY_SAMPLES`] kept (the
    /// console draws the last hours from them; `Historian` notes one a
    /// minute).
    async fn note_history(&self, sample: HistorySample) -> Result<()>;

    /// The newest `limit` history samples, newest first.
    async fn history(&self, limit: usize) -> Result<Vec<HistorySample>>;
}

/// History samples kept: a day of one a minute.
pub const HISTORY_SAMPLES: usize = 1_440;

/// The fleet's counts at one instant, summed over every queue ([`ControlStore::history`]):
/// the cumulative ones (completed, died, cancelled) give rates between two samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)] // a sample of another version still reads
pub struct HistorySample {
    /// When (Unix ms, the coordinator's clock).
    pub at_ms: u64,
    /// Counts summed over every queue.
    pub counts: crate::job::QueueCounts,
    /// The longest any queue's next ready job had waited (ms).
    pub oldest_ready_ms: u64,
}

/// A worker process as it last described itself ([`ControlStore::beat`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerBeat {
    /// The worker's name (unique per process: `WorkerConfig::name`).
    pub worker: String,
    /// Host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The Palisade version it runs.
    pub version: String,
    /// Queues it claims from.
    pub queues: Vec<String>,
    /// Jobs it may run at once, and runs now.
    pub concurrency: usize,
    /// See `concurrency`.
    pub running: usize,
    /// When it started (Unix ms, its own clock).
    pub started_ms: u64,
    /// When the coordinator last heard from it (Unix ms, the coordinator's clock; set by the
    /// store).
    #[serde(default)]
    pub seen_ms: u64,
    /// The format levels it reads and writes (`[lowest, highest]`, [`crate::format`]); absent
    /// from a worker of a commit before release 0.1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formats: Option<[u32; 2]>,
    /// How it backs off failed jobs, for people (`1s doubling to 6h`, then each kind with a
    /// policy of its own: `; report.build: 5s doubling to 1h`); absent from a worker of
    /// release 0.1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<String>,
}

/// What jobs and sinks leave behind for people to read, kept for a bounded time or count: job
/// results and progress, and the journal of recent fence rejections.
#[async_trait]
pub trait RecordStore: Send + Sync + 'static {
    /// Keeps job `job`'s result (JSON) for `ttl`.
    async fn put_result(&self, job: JobId, json: String, ttl: Duration) -> Result<()>;

    /// Job `job`'s result, while it is kept.
    async fn result(&self, job: JobId) -> Result<Option<String>>;

    /// Records job `job`'s progress (JSON; the latest wins, kept a day).
    async fn put_progress(&self, job: JobId, json: String) -> Result<()>;

    /// Job `job`'s latest progress.
    async fn progress(&self, job: JobId) -> Result<Option<String>>;

    /// Adds fence rejections to the coordinator's journal of recent ones (the newest
    /// [`REJECTION_JOURNAL`] are kept), for operators.
    async fn note_rejections(&self, notes: Vec<RejectionNote>) -> Result<()>;

    /// The newest `limit` journal entries, newest first.
    async fn rejections(&self, limit: usize) -> Result<Vec<RejectionNote>>;

    /// Completes waitpoint `id` with `value` (JSON) unless it was completed before, in one
    /// atomic step ([`waitpoint`] module docs): the first value stays.
    async fn complete_waitpoint(&self, id: &str, value: String) -> Result<Completion>;

    /// Waitpoint `id`'s value if it is completed; otherwise notes `waiter` as the job its
    /// completion wakes, in one atomic step.
    async fn await_waitpoint(&self, id: &str, waiter: JobId) -> Result<Option<String>>;

    /// Waitpoint `id` as kept, for status (changes nothing).
    async fn waitpoint(&self, id: &str) -> Result<Option<Waitpoint>>;
}

/// Every store trait at once, as one coordinator: what `Coordinator`,
/// `Client`, the CLI and the operator page take. Cheap to clone.
///
/// Built from one backend that implements every trait (`Stores::from(Arc::new(store))`, or
/// just pass the `Arc` wherever `impl Into<Stores>` is asked), or from a
/// [`PartitionedLeaseStore`](partitioned::PartitionedLeaseStore), which implements only what
/// partitions change and takes the fleet-wide control state and records from partition 0
/// (results excepted: each is kept in its job's partition).
/// A test wraps one concern without forwarding the rest:
/// `Stores::from(inner).with_lease_store(Arc::new(MyFaults(...)))`.
///
/// `Stores` implements every store trait by handing each call to the part that owns it.
#[derive(Clone)]
pub struct Stores {
    leases: Arc<dyn LeaseStore>,
    inspect: Arc<dyn Inspect>,
    admin: Arc<dyn QueueAdmin>,
    control: Arc<dyn ControlStore>,
    records: Arc<dyn RecordStore>,
    flows: Arc<dyn FlowStore>,
}

impl<T> From<Arc<T>> for Stores
where
    T: LeaseStore + Inspect + QueueAdmin + ControlStore + RecordStore + FlowStore,
{
    fn from(store: Arc<T>) -> Self {
        Self {
            leases: store.clone(),
            inspect: store.clone(),
            admin: store.clone(),
            control: store.clone(),
            records: store.clone(),
            flows: store,
        }
    }
}

impl Stores {
    /// The hot path.
    pub fn lease_store(&self) -> Arc<dyn LeaseStore> {
        self.leases.clone()
    }

    /// The read-only views.
    pub fn inspect(&self) -> Arc<dyn Inspect> {
        self.inspect.clone()
    }

    /// The queue controls.
    pub fn admin(&self) -> Arc<dyn QueueAdmin> {
        self.admin.clone()
    }

    /// The clock, roles and schedules.
    pub fn control(&self) -> Arc<dyn ControlStore> {
        self.control.clone()
    }

    /// Results, progress and the rejection journal.
    pub fn records(&self) -> Arc<dyn RecordStore> {
        self.records.clone()
    }

    /// Held flow jobs, step ends and flows.
    pub fn flows(&self) -> Arc<dyn FlowStore> {
        self.flows.clone()
    }

    /// The same stores with the flows replaced (a partitioned layout's, which keeps each job
    /// in its partition and each flow at its home).
    pub fn with_flows(mut self, flows: Arc<dyn FlowStore>) -> Self {
        self.flows = flows;
        self
    }

    /// The same stores with the hot path replaced (a wrapper that injects faults into claims
    /// or renewals implements [`LeaseStore`] only).
    pub fn with_lease_store(mut self, leases: Arc<dyn LeaseStore>) -> Self {
        self.leases = leases;
        self
    }

    /// The same stores with the records replaced (a partitioned layout's, which finds a
    /// result in its job's partition; a test's that fails them).
    pub fn with_records(mut self, records: Arc<dyn RecordStore>) -> Self {
        self.records = records;
        self
    }

    /// The same stores with the read-only views and queue controls replaced (a partitioned
    /// layout's, which fan out over every partition).
    pub(crate) fn with_queues(
        mut self,
        inspect: Arc<dyn Inspect>,
        admin: Arc<dyn QueueAdmin>,
    ) -> Self {
        self.inspect = inspect;
        self.admin = admin;
        self
    }
}

#[async_trait]
impl LeaseStore for Stores {
    async fn enqueue_all(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.leases.enqueue_all(jobs).await
    }
    // The provided methods too, so a part that overrides them is not bypassed.
    async fn enqueue(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>> {
        self.leases.enqueue(jobs).await
    }
    async fn claim(
        &self,
        queue: &str,
        worker: &str,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Claim>> {
        self.leases.claim(queue, worker, n, ttl).await
    }
    async fn claim_kinds(
        &self,
        queue: &str,
        kinds: &[String],
        worker: &str,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Claim>> {
        self.leases.claim_kinds(queue, kinds, worker, n, ttl).await
    }
    async fn renew(&self, leases: &[LeaseId], ttl: Duration) -> Result<Vec<LeaseId>> {
        self.leases.renew(leases, ttl).await
    }
    async fn settle(&self, settlements: Vec<(LeaseId, Settlement)>) -> Result<Vec<Result<()>>> {
        self.leases.settle(settlements).await
    }
    async fn settle_and_claim(
        &self,
        settlements: Vec<(LeaseId, Settlement)>,
        claim: &ClaimRequest,
    ) -> (Result<Vec<Result<()>>>, Result<Vec<Claim>>) {
        self.leases.settle_and_claim(settlements, claim).await
    }
    fn watermark(&self) -> Option<FencingToken> {
        self.leases.watermark()
    }
    async fn reap(&self, max: usize) -> Result<Vec<Reaped>> {
        self.leases.reap(max).await
    }
    async fn follow_ups(&self, older_than: Duration, max: usize) -> Result<Vec<FollowUps>> {
        self.leases.follow_ups(older_than, max).await
    }
    async fn forget_follow_ups(&self, parent: JobId) -> Result<()> {
        self.leases.forget_follow_ups(parent).await
    }
    async fn highest_token(&self, scope: &Scope) -> Result<Option<FencingToken>> {
        self.leases.highest_token(scope).await
    }
    async fn epoch(&self) -> Result<Option<u32>> {
        self.leases.epoch().await
    }
    async fn raise_epoch(&self, at_least: u32) -> Result<u32> {
        self.leases.raise_epoch(at_least).await
    }
}

#[async_trait]
impl ControlStore for Stores {
    async fn now_ms(&self) -> Result<i64> {
        self.control.now_ms().await
    }
    async fn hold_role(&self, role: &str, holder: &str, ttl: Duration) -> Result<bool> {
        self.control.hold_role(role, holder, ttl).await
    }
    async fn schedules(&self) -> Result<Vec<ScheduleSpec>> {
        self.control.schedules().await
    }
    async fn put_schedule(&self, spec: ScheduleSpec) -> Result<()> {
        self.control.put_schedule(spec).await
    }
    async fn remove_schedule(&self, name: &str) -> Result<bool> {
        self.control.remove_schedule(name).await
    }
    async fn schedule_mark(&self, name: &str) -> Result<Option<i64>> {
        self.control.schedule_mark(name).await
    }
    async fn pause_schedule(&self, name: &str, paused: bool) -> Result<bool> {
        self.control.pause_schedule(name, paused).await
    }
    async fn paused_schedules(&self) -> Result<Vec<String>> {
        self.control.paused_schedules().await
    }
    async fn advance_schedule(&self, name: &str, through: i64) -> Result<()> {
        self.control.advance_schedule(name, through).await
    }
    async fn beat(&self, beat: WorkerBeat, ttl: Duration) -> Result<()> {
        self.control.beat(beat, ttl).await
    }
    async fn workers(&self) -> Result<Vec<WorkerBeat>> {
        self.control.workers().await
    }
    async fn note_history(&self, sample: HistorySample) -> Result<()> {
        self.control.note_history(sample).await
    }
    async fn history(&self, limit: usize) -> Result<Vec<HistorySample>> {
        self.control.history(limit).await
    }
}

#[async_trait]
impl FlowStore for Stores {
    async fn hold(&self, jobs: Vec<(NewJob, crate::flow::FlowStep)>) -> Result<()> {
        self.flows.hold(jobs).await
    }
    async fn release(&self, releases: Vec<crate::flow::Release>) -> Result<Vec<JobId>> {
        self.flows.release(releases).await
    }
    async fn step_ends(&self, max: usize) -> Result<Vec<crate::flow::StepEnded>> {
        self.flows.step_ends(max).await
    }
    async fn forget_step_ends(&self, jobs: &[JobId]) -> Result<()> {
        self.flows.forget_step_ends(jobs).await
    }
    async fn put_flow(
        &self,
        flow: &crate::flow::Flow,
    ) -> Result<(bool, Vec<crate::flow::Release>)> {
        self.flows.put_flow(flow).await
    }
    async fn advance_flow(
        &self,
        flow: crate::ids::FlowId,
        ended: &[(String, crate::flow::StepEnd)],
        applied: &[String],
    ) -> Result<Vec<crate::flow::Release>> {
        self.flows.advance_flow(flow, ended, applied).await
    }
    async fn grow_flow(
        &self,
        flow: crate::ids::FlowId,
        step: &str,
        added: &[crate::flow::Step],
    ) -> Result<()> {
        self.flows.grow_flow(flow, step, added).await
    }
    async fn running_flows(&self, max: usize) -> Result<(u64, Vec<(crate::ids::FlowId, u64)>)> {
        self.flows.running_flows(max).await
    }
    async fn flows_created(&self) -> Result<Option<u64>> {
        self.flows.flows_created().await
    }
    async fn flow_steps(&self, id: crate::ids::FlowId) -> Result<Vec<crate::flow::StepStatus>> {
        self.flows.flow_steps(id).await
    }
    async fn keep_results(
        &self,
        flow: crate::ids::FlowId,
        results: &[(String, String)],
    ) -> Result<()> {
        self.flows.keep_results(flow, results).await
    }
    async fn step_result(&self, flow: crate::ids::FlowId, step: &str) -> Result<Option<String>> {
        self.flows.step_result(flow, step).await
    }
    async fn cancel_flow(
        &self,
        flow: crate::ids::FlowId,
    ) -> Result<Option<(Vec<crate::flow::Release>, Vec<JobId>)>> {
        self.flows.cancel_flow(flow).await
    }
    async fn held_jobs(
        &self,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<crate::flow::Release>> {
        self.flows.held_jobs(older_than, max).await
    }
    async fn unreleased_flows(
        &self,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<crate::ids::FlowId>> {
        self.flows.unreleased_flows(older_than, max).await
    }
    async fn flow(&self, id: crate::ids::FlowId) -> Result<Option<crate::flow::FlowStatus>> {
        self.flows.flow(id).await
    }
}

#[async_trait]
impl RecordStore for Stores {
    async fn put_result(&self, job: JobId, json: String, ttl: Duration) -> Result<()> {
        self.records.put_result(job, json, ttl).await
    }
    async fn result(&self, job: JobId) -> Result<Option<String>> {
        self.records.result(job).await
    }
    async fn put_progress(&self, job: JobId, json: String) -> Result<()> {
        self.records.put_progress(job, json).await
    }
    async fn progress(&self, job: JobId) -> Result<Option<String>> {
        self.records.progress(job).await
    }
    async fn note_rejections(&self, notes: Vec<RejectionNote>) -> Result<()> {
        self.records.note_rejections(notes).await
    }
    async fn rejections(&self, limit: usize) -> Result<Vec<RejectionNote>> {
        self.records.rejections(limit).await
    }
    async fn complete_waitpoint(&self, id: &str, value: String) -> Result<Completion> {
        self.records.complete_waitpoint(id, value).await
    }
    async fn await_waitpoint(&self, id: &str, waiter: JobId) -> Result<Option<String>> {
        self.records.await_waitpoint(id, waiter).await
    }
    async fn waitpoint(&self, id: &str) -> Result<Option<Waitpoint>> {
        self.records.waitpoint(id).await
    }
}
/// How long progress records are kept.
pub const PROGRESS_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Longest role lease [`ControlStore::hold_role`] grants: a day (a role is renewed every few
/// seconds; more is a mistake).
pub const MAX_ROLE_TTL: Duration = Duration::from_secs(86_400);

/// A role's ttl must be 1 ms ..= [`MAX_ROLE_TTL`], the same on every backend.
#[doc(hidden)]
pub fn check_role_ttl(ttl: Duration) -> Result<()> {
    if ttl < Duration::from_millis(1) || ttl > MAX_ROLE_TTL {
        return Err(crate::error::Error::Config(format!(
            "role ttl {ttl:?} is outside 1ms..=1 day"
        )));
    }
    Ok(())
}

/// Fence rejections the coordinator's journal keeps.
pub const REJECTION_JOURNAL: usize = 1000;

/// A fence rejection a worker met, as the journal keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectionNote {
    /// When (ms since the Unix epoch, the worker's clock).
    pub at_ms: u64,
    /// Sink that refused.
    pub sink: String,
    /// Scope written.
    pub scope: String,
    /// Token presented.
    pub token: u64,
    /// `stale_token`, `token_conflict` or `mutation`.
    pub reason: String,
    /// The rejection in words.
    pub detail: String,
    /// The trace of the run that wrote (its attempt's, or the job's), to find it in a tracing
    /// backend; absent in a note an earlier version wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The job whose run wrote, its lease and the worker that ran it (absent in a note an
    /// earlier version wrote): what the console links a rejection to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<crate::ids::JobId>,
    /// See `job`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<crate::ids::LeaseId>,
    /// See `job`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
}

/// Checks a schedule before it is kept (the same check on every backend).
#[doc(hidden)]
pub fn check_schedule(spec: &ScheduleSpec) -> Result<()> {
    Schedule::try_from(spec.clone()).map(drop)
}

/// Now, in ms since the Unix epoch (0 on a clock before it).
#[doc(hidden)]
pub fn unix_ms() -> u64 {
    crate::clock::unix_ms()
}

/// A live lease, for status output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// The lease.
    pub lease: LeaseId,
    /// Job it holds.
    pub job: JobId,
    /// Scope it covers.
    pub scope: Scope,
    /// Its token.
    pub token: FencingToken,
    /// Worker that claimed it.
    pub worker: String,
    /// Its job's queue and kind (empty when the job record is gone: a lease about to be
    /// reaped).
    pub queue: String,
    /// See `queue`.
    pub kind: String,
    /// Time since the claim.
    pub age: Duration,
    /// Time left before it expires (zero if already expired and not yet reaped).
    pub expires_in: Duration,
}

/// A job whose lease expired before it settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reaped {
    /// The job.
    pub job: JobId,
    /// Its queue (the metric label).
    pub queue: String,
    /// `true` if it ran out of stalls and is now dead, `false` if it is ready again.
    pub dead: bool,
    /// The lease that expired.
    pub lease: LeaseId,
    /// Its token (`None` where the lease entry did not say: one an earlier version wrote).
    pub token: Option<FencingToken>,
    /// The worker that held it (empty where the entry did not say).
    pub worker: String,
    /// The job's trace, for the stall's record in it.
    pub trace: Option<crate::traceparent::TraceContext>,
}

/// One protected write as a sink sees it: the generation it presents and what it changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedWrite {
    /// Resource the lease covers; fencing state is kept per scope.
    pub scope: Scope,
    /// Token and lease of the writer.
    pub fence: Fence,
    /// Names this logical write within its generation.
    pub key: IdempotencyKey,
    /// Applied together, or not at all.
    pub mutations: Vec<Mutation>,
}

/// A store that applies the admission rule and a mutation in one atomic operation.
#[async_trait]
pub trait FencedStore: Send + Sync + 'static {
    /// Admits (or refuses) and applies one write atomically.
    async fn write(&self, write: FencedWrite) -> Result<Admission>;

    /// Several writes that arrived together, each admitted and applied atomically on its own
    /// (a remote backend sends them in one round trip). One result per write, in order. A
    /// `FencedSink` has up to two batches on their way at once, never
    /// with one scope in both: calls may overlap, and each write must be atomic on its own.
    async fn write_batch(&self, writes: Vec<FencedWrite>) -> Result<Vec<Result<Admission>>> {
        let mut results = Vec::with_capacity(writes.len());
        for write in writes {
            results.push(self.write(write).await);
        }
        Ok(results)
    }

    /// Takes note of the coordinator's low watermark (every lease with a lower token is no
    /// longer current; see the `admission` module docs). From the next write call on, the
    /// sink refuses writes below it and may forget fences below it. Cheap and local: a remote
    /// backend sends it with its next write. The default ignores it (a sink that keeps every
    /// fence is safe, only not bounded).
    fn observe_watermark(&self, watermark: FencingToken) {
        let _ = watermark;
    }

    /// Reads a value back (for checks and status; not fenced).
    async fn read(&self, key: &str) -> Result<Option<Value>>;

    /// The newest generation accepted for `scope`.
    async fn highest(&self, scope: &Scope) -> Result<Option<Fence>>;
}
