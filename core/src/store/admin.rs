//! The queue views and controls ([`Inspect`], [`QueueAdmin`]): what each operation means and
//! how [`Stores`] hands it on. An operation's meaning across partitions (a sum, a union, an
//! OR, or shares that add up) is part of its contract, so each method's docs state it; the
//! partitioned layout's fan-out is `partitioned/admin.rs`, and each backend implements the
//! operation in its own `admin.rs`.

use std::time::Duration;

use async_trait::async_trait;

use super::{LeaseInfo, Stores};
use crate::error::Result;
use crate::group::{GroupLimits, GroupStatus};
use crate::ids::JobId;
use crate::job::{
    Cancelled, CompletedJob, DeadAction, DeadFilter, DeadJob, DeadSweep, JobView, QueueCounts,
    RateLimit,
};

/// Called by [`QueueAdmin::dead_where`] with the totals so far, after each bounded step.
pub type SweepProgress<'a> = &'a (dyn Fn(DeadSweep) + Send + Sync);

/// Read-only views of the queues, for operators and the depth sampler: counts, dead letters,
/// live leases, the age of the next job. Never changes anything.
#[async_trait]
pub trait Inspect: Send + Sync + 'static {
    /// Counts for one queue.
    async fn counts(&self, queue: &str) -> Result<QueueCounts>;

    /// Dead-lettered jobs of one queue, oldest first, at most `limit`.
    async fn dead(&self, queue: &str, limit: usize) -> Result<Vec<DeadJob>>;

    /// Dead-lettered jobs of one queue, oldest first, after skipping the oldest `skip`; at
    /// most `limit` (a page of the dead letters).
    async fn dead_range(&self, queue: &str, skip: usize, limit: usize) -> Result<Vec<DeadJob>>;

    /// Delayed jobs of one queue (waiting for a delay or a retry backoff), soonest due first,
    /// at most `limit`.
    async fn delayed(&self, queue: &str, limit: usize) -> Result<Vec<JobView>>;

    /// Ready jobs of one queue that belong to no group, next to be claimed first, at most
    /// `limit` (a group's ready jobs are counted by [`Inspect::group`], not listed). Across
    /// partitions: one partition's after another, each in its claim order.
    async fn ready(&self, queue: &str, limit: usize) -> Result<Vec<JobView>>;

    /// A live job (neither completed nor dead) and where it is, or `None`.
    async fn job(&self, job: JobId) -> Result<Option<JobView>>;

    /// A completed job while its record is kept ([`CompletedRetention`](crate::job::CompletedRetention):
    /// the store's, a day's by default), or `None`. Across partitions: the one that holds it.
    async fn completed(&self, job: JobId) -> Result<Option<CompletedJob>>;

    /// Every queue that has ever had a job or a rate limit.
    async fn queues(&self) -> Result<Vec<String>>;

    /// Live leases, soonest to expire first, at most `limit`.
    async fn leases(&self, limit: usize) -> Result<Vec<LeaseInfo>>;

    /// Age of the job next in line in `queue` — per kind, the oldest — since it first became
    /// claimable (enqueue time plus delay; a job requeued after a stall, release or retry
    /// keeps that time; a due delayed job counts from when it fell due), or `None` if nothing
    /// is ready.
    async fn oldest_ready(&self, queue: &str) -> Result<Option<Duration>>;

    /// The `top` groups of `queue` with the most ready jobs, most first (ties by name); each
    /// with its ready jobs in this queue. Bounded however many groups there are (`top` is
    /// clamped to [`MAX_TOP_GROUPS`](crate::store::MAX_TOP_GROUPS)), so the depth sampler and
    /// the console can ask every minute.
    async fn groups(&self, queue: &str, top: usize) -> Result<Vec<GroupStatus>>;

    /// One group: its ready jobs in every queue, its running jobs, limits and whether it is
    /// parked. A group never seen reads as empty, without limits.
    async fn group(&self, group: &str) -> Result<GroupStatus>;
}

/// What an operator changes about queues and kinds (pause, cancel, dead-letter retry and
/// purge, concurrency caps, rate limits), and those settings read back.
#[async_trait]
pub trait QueueAdmin: Send + Sync + 'static {
    /// Pauses (`true`) or resumes a queue: while paused, claims from it hand out nothing;
    /// its jobs stay where they are (enqueue still adds, running jobs renew and settle as
    /// usual), so nothing is lost.
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()>;

    /// The paused queues, sorted.
    async fn paused(&self) -> Result<Vec<String>>;

    /// Cancels job `job`: queued, it goes to the dead letters with `reason`; running, its
    /// lease is revoked at once and it goes there too (see [`Cancelled`]).
    async fn cancel(&self, job: JobId, reason: &str) -> Result<Cancelled>;

    /// Moves up to `limit` dead-lettered jobs of `queue` back to ready with fresh attempts,
    /// oldest first; returns how many.
    async fn retry_dead(&self, queue: &str, limit: usize) -> Result<usize>;

    /// Deletes up to `limit` dead-lettered jobs of `queue`, oldest first; returns how many.
    async fn purge_dead(&self, queue: &str, limit: usize) -> Result<usize>;

    /// Retries or purges (`action`) every dead letter of `queue` that `filter` takes, oldest
    /// first, until `limit` are done or the list's end is read: a whole-set operation in
    /// bounded steps (on Redis each a short script over at most 250 records), with
    /// `progress` told the totals after each. What a step did stays done if a later one
    /// fails. A record this release cannot decode is never taken, whatever the filter (never
    /// delete what you cannot decode); dead letters added while it runs may or may not be
    /// taken; records removed ahead of it between steps (a trim at the retention) make it
    /// go on from the last record it left, never pass one over. Across partitions: each in
    /// turn, the totals added up.
    async fn dead_where(
        &self,
        queue: &str,
        filter: &DeadFilter,
        action: DeadAction,
        limit: u64,
        progress: SweepProgress<'_>,
    ) -> Result<DeadSweep>;

    /// Moves the dead-lettered job `job` of `queue` back to ready with fresh attempts; `false`
    /// (nothing changed) if no record of it is among the queue's newest
    /// [`DEAD_JOB_SEARCH`](super::DEAD_JOB_SEARCH) dead letters, or its id names a live job
    /// again, or the record is not one a claim could read back. Of two records of one id (a
    /// job enqueued again with [`NewJob::with_id`](crate::job::NewJob::with_id) that died again)
    /// the newest is retried.
    async fn retry_dead_job(&self, queue: &str, job: JobId) -> Result<bool>;

    /// Deletes the dead-lettered job `job` of `queue` (the newest record of it, searched as
    /// `retry_dead_job` does); `false` if no record of it is there.
    async fn purge_dead_job(&self, queue: &str, job: JobId) -> Result<bool>;

    /// Makes the delayed job `job` due now (it keeps its attempts); `false` (nothing changed)
    /// if it is not delayed.
    async fn run_now(&self, job: JobId) -> Result<bool>;

    /// Forgets a queue nobody uses: with no job in it (ready, waiting, delayed, leased or
    /// dead), its name, counts, pause and rate limit go, and it leaves the queue list until a
    /// job is enqueued to it again. `false` (nothing changed) if it holds a job.
    async fn forget_queue(&self, queue: &str) -> Result<bool>;

    /// Caps (`Some(n)`) how many jobs of `kind` may run at once across the fleet, or lifts
    /// the cap. Jobs running when a cap is set do not count against it.
    async fn set_concurrency_cap(&self, kind: &str, cap: Option<u32>) -> Result<()>;

    /// A kind's concurrency cap.
    async fn concurrency_cap(&self, kind: &str) -> Result<Option<u32>>;

    /// Every kind's concurrency cap, by kind (what a layout migration carries).
    async fn concurrency_caps(&self) -> Result<Vec<(String, u32)>>;

    /// Sets (`Some`) or lifts a queue's rate limit; a new limit starts with a full bucket.
    async fn set_rate_limit(&self, queue: &str, limit: Option<RateLimit>) -> Result<()>;

    /// A queue's rate limit.
    async fn rate_limit(&self, queue: &str) -> Result<Option<RateLimit>>;

    /// Sets a group's limits, across every queue and kind (see [`GroupLimits`]): all three
    /// replace what was set (a default `GroupLimits` lifts them). A new rate limit starts
    /// with a full bucket. Lifting what held a group back brings it back to the rotation at
    /// once; a pause or a lower cap takes it out at its next turn (jobs running keep running).
    async fn set_group_limits(&self, group: &str, limits: GroupLimits) -> Result<()>;

    /// The first `max` groups with a limit or a pause, by name (bounded, for the console and
    /// `status`; a layout migration asks for all).
    async fn limited_groups(&self, max: usize) -> Result<Vec<(String, GroupLimits)>>;
}

#[async_trait]
impl Inspect for Stores {
    async fn counts(&self, queue: &str) -> Result<QueueCounts> {
        self.inspect.counts(queue).await
    }
    async fn dead(&self, queue: &str, limit: usize) -> Result<Vec<DeadJob>> {
        self.inspect.dead(queue, limit).await
    }
    async fn dead_range(&self, queue: &str, skip: usize, limit: usize) -> Result<Vec<DeadJob>> {
        self.inspect.dead_range(queue, skip, limit).await
    }
    async fn delayed(&self, queue: &str, limit: usize) -> Result<Vec<JobView>> {
        self.inspect.delayed(queue, limit).await
    }
    async fn ready(&self, queue: &str, limit: usize) -> Result<Vec<JobView>> {
        self.inspect.ready(queue, limit).await
    }
    async fn job(&self, job: JobId) -> Result<Option<JobView>> {
        self.inspect.job(job).await
    }
    async fn completed(&self, job: JobId) -> Result<Option<CompletedJob>> {
        self.inspect.completed(job).await
    }
    async fn queues(&self) -> Result<Vec<String>> {
        self.inspect.queues().await
    }
    async fn leases(&self, limit: usize) -> Result<Vec<LeaseInfo>> {
        self.inspect.leases(limit).await
    }
    async fn oldest_ready(&self, queue: &str) -> Result<Option<Duration>> {
        self.inspect.oldest_ready(queue).await
    }
    async fn groups(&self, queue: &str, top: usize) -> Result<Vec<GroupStatus>> {
        self.inspect.groups(queue, top).await
    }
    async fn group(&self, group: &str) -> Result<GroupStatus> {
        self.inspect.group(group).await
    }
}

#[async_trait]
impl QueueAdmin for Stores {
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        self.admin.set_paused(queue, paused).await
    }
    async fn paused(&self) -> Result<Vec<String>> {
        self.admin.paused().await
    }
    async fn cancel(&self, job: JobId, reason: &str) -> Result<Cancelled> {
        self.admin.cancel(job, reason).await
    }
    async fn retry_dead(&self, queue: &str, limit: usize) -> Result<usize> {
        self.admin.retry_dead(queue, limit).await
    }
    async fn purge_dead(&self, queue: &str, limit: usize) -> Result<usize> {
        self.admin.purge_dead(queue, limit).await
    }
    async fn dead_where(
        &self,
        queue: &str,
        filter: &DeadFilter,
        action: DeadAction,
        limit: u64,
        progress: SweepProgress<'_>,
    ) -> Result<DeadSweep> {
        self.admin
            .dead_where(queue, filter, action, limit, progress)
            .await
    }
    async fn retry_dead_job(&self, queue: &str, job: JobId) -> Result<bool> {
        self.admin.retry_dead_job(queue, job).await
    }
    async fn purge_dead_job(&self, queue: &str, job: JobId) -> Result<bool> {
        self.admin.purge_dead_job(queue, job).await
    }
    async fn run_now(&self, job: JobId) -> Result<bool> {
        self.admin.run_now(job).await
    }
    async fn forget_queue(&self, queue: &str) -> Result<bool> {
        self.admin.forget_queue(queue).await
    }
    async fn set_concurrency_cap(&self, kind: &str, cap: Option<u32>) -> Result<()> {
        self.admin.set_concurrency_cap(kind, cap).await
    }
    async fn concurrency_cap(&self, kind: &str) -> Result<Option<u32>> {
        self.admin.concurrency_cap(kind).await
    }
    async fn concurrency_caps(&self) -> Result<Vec<(String, u32)>> {
        self.admin.concurrency_caps().await
    }
    async fn set_rate_limit(&self, queue: &str, limit: Option<RateLimit>) -> Result<()> {
        self.admin.set_rate_limit(queue, limit).await
    }
    async fn rate_limit(&self, queue: &str) -> Result<Option<RateLimit>> {
        self.admin.rate_limit(queue).await
    }
    async fn set_group_limits(&self, group: &str, limits: GroupLimits) -> Result<()> {
        self.admin.set_group_limits(group, limits).await
    }
    async fn limited_groups(&self, max: usize) -> Result<Vec<(String, GroupLimits)>> {
        self.admin.limited_groups(max).await
    }
}
