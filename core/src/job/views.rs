//! What operators and producers read back: [`QueueCounts`], [`DeadJob`], [`JobView`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::claimed::Job;

/// Counts of one queue, for status output and progress bars.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default)] // a sample kept by an older version reads with zeros for newer counts
pub struct QueueCounts {
    /// Claimable now.
    pub ready: u64,
    /// Waiting for a delay or a retry backoff.
    pub delayed: u64,
    /// Held by a lease.
    pub leased: u64,
    /// Ready, but another job of the same scope holds its turn: waits aside until that job
    /// completes, dies or is delayed, so it never blocks jobs of other scopes.
    pub waiting: u64,
    /// Completed.
    pub completed: u64,
    /// Dead-lettered.
    pub dead: u64,
    /// Cancelled by an operator or a program (`QueueAdmin::cancel`)
    /// since the queue was first used: a count that only grows (the jobs themselves are among
    /// the dead).
    pub cancelled: u64,
    /// Dead-lettered since the queue was first used, however they died (a count that only
    /// grows: `dead` is the ones still kept).
    pub died: u64,
    /// Enqueued since the queue was first used, by whatever process (a count that only grows;
    /// follow-up jobs are counted, flow steps are not; zero where a release before 0.2 kept it).
    pub enqueued: u64,
    /// Stalls reaped since the queue was first used, by whatever process (a count that only
    /// grows).
    pub stalled: u64,
}

impl std::ops::AddAssign for QueueCounts {
    /// Counts of two queues (or two partitions of one) together.
    /// (Saturating: counts another program wrote may be anything.)
    fn add_assign(&mut self, c: Self) {
        self.ready = self.ready.saturating_add(c.ready);
        self.delayed = self.delayed.saturating_add(c.delayed);
        self.leased = self.leased.saturating_add(c.leased);
        self.waiting = self.waiting.saturating_add(c.waiting);
        self.completed = self.completed.saturating_add(c.completed);
        self.dead = self.dead.saturating_add(c.dead);
        self.cancelled = self.cancelled.saturating_add(c.cancelled);
        self.died = self.died.saturating_add(c.died);
        self.enqueued = self.enqueued.saturating_add(c.enqueued);
        self.stalled = self.stalled.saturating_add(c.stalled);
    }
}

impl QueueCounts {
    /// Jobs not yet completed or dead.
    pub fn pending(&self) -> u64 {
        self.ready + self.waiting + self.delayed + self.leased
    }
}

/// A dead-lettered job and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadJob {
    /// The job as it was last claimed.
    pub job: Job,
    /// The reason recorded when it died.
    pub reason: String,
    /// When it died (Unix ms, by the coordinator's clock); `None` for a record an earlier
    /// version kept.
    #[serde(default)]
    pub died_ms: Option<u64>,
}

/// Where a live job is ([`Inspect::job`](crate::store::Inspect::job)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Claimable now.
    Ready,
    /// Ready, behind another job of its scope.
    Waiting,
    /// Waiting for its delay or retry backoff (`JobView::due_in`).
    Delayed,
    /// Running under a lease (`JobView::lease`).
    Leased,
    /// A flow step's job written but not released yet (its dependencies have not ended).
    Held,
    /// Its record exists but is in none of the places above: a record another program wrote,
    /// or one caught between two steps of a layout move.
    Unplaced,
}

/// A live job (not completed, not dead) and where it is ([`Inspect::job`](crate::store::Inspect::job),
/// [`Inspect::delayed`](crate::store::Inspect::delayed)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    /// The job (attempt: attempts started so far).
    pub job: Job,
    /// Where it is.
    pub state: JobState,
    /// Time left before a delayed job is due (zero once due and not promoted yet).
    pub due_in: Option<Duration>,
    /// The lease a leased job runs under.
    pub lease: Option<crate::ids::LeaseId>,
    /// Why its last attempt failed, when that attempt was retried.
    pub last_error: Option<String>,
}

/// Which dead letters a whole-set retry or purge takes ([`QueueAdmin::dead_where`](crate::store::QueueAdmin::dead_where)):
/// every condition given must hold; the default takes every dead letter of the queue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadFilter {
    /// Only jobs of this kind (an empty one: any).
    pub kind: Option<String>,
    /// Only jobs whose reason contains this text, as written (case and all).
    pub reason: Option<String>,
    /// Only jobs that died before this time (Unix ms; times of death are the coordinator's
    /// clock). A record an earlier version kept, without a time of death, is never taken by
    /// an age.
    pub died_before_ms: Option<u64>,
}

impl DeadFilter {
    /// Whether `dead` is one this filter takes (the rule `dead_where.lua` applies on Redis,
    /// checked against this one by a differential test).
    pub fn matches(&self, dead: &DeadJob) -> bool {
        self.kind
            .as_deref()
            .is_none_or(|kind| kind.is_empty() || dead.job.kind == kind)
            && self
                .reason
                .as_ref()
                .is_none_or(|text| dead.reason.contains(text.as_str()))
            && self
                .died_before_ms
                .is_none_or(|before| dead.died_ms.is_some_and(|died| died < before))
    }
}

/// What a whole-set operation does with the dead letters it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadAction {
    /// Back to ready with fresh attempts and stalls.
    Retry,
    /// Deleted for good.
    Purge,
}

/// How far a whole-set operation got ([`QueueAdmin::dead_where`](crate::store::QueueAdmin::dead_where)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadSweep {
    /// Dead letters read so far.
    pub scanned: u64,
    /// Retried or purged.
    pub done: u64,
    /// Taken by the filter but left where they are: a retry whose id names a live job again,
    /// or whose record a claim could not read back.
    pub kept: u64,
}
