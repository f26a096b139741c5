//! What operators and producers read back: [`QueueCounts`], [`DeadJob`], [`JobView`],
//! [`CompletedJob`], and each one's [`JobDetails`] (priority, times, attempts).

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
    /// Its priority, when it was enqueued, and its attempts (the last one is the one it
    /// died of).
    #[serde(default)]
    pub details: JobDetails,
}

/// What a job's record keeps beyond the [`Job`] itself, for operators: its priority, when it
/// was enqueued, when its current attempt started, and how its earlier attempts ended.
/// Records an earlier version wrote read with `None`s and no attempts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobDetails {
    /// Higher runs first ([`NewJob::with_priority`](crate::job::NewJob::with_priority)).
    pub priority: i32,
    /// When it was enqueued (Unix ms, the coordinator's clock).
    pub enqueued_ms: Option<u64>,
    /// When its latest attempt started (Unix ms); `None` before its first claim.
    pub started_ms: Option<u64>,
    /// Its attempts that ended, oldest first: the newest [`MAX_ATTEMPTS_KEPT`], each error
    /// clipped to [`MAX_ATTEMPT_ERROR_BYTES`].
    pub attempts: Vec<Attempt>,
}

/// At most this many ended attempts are kept per job ([`JobDetails::attempts`]).
pub const MAX_ATTEMPTS_KEPT: usize = 32;

/// An attempt's error is kept clipped to this many bytes (on a character boundary, then
/// "..."), so a record stays small whatever a handler's errors say.
pub const MAX_ATTEMPT_ERROR_BYTES: usize = 480;

/// `error` as an attempt keeps it: at most [`MAX_ATTEMPT_ERROR_BYTES`] on a character
/// boundary, then "..." (the Redis scripts' `clip`).
pub fn clip_error(error: &str) -> String {
    if error.len() <= MAX_ATTEMPT_ERROR_BYTES {
        return error.to_owned();
    }
    let mut cut = MAX_ATTEMPT_ERROR_BYTES;
    while !error.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &error[..cut])
}

/// One ended attempt of a job ([`JobDetails::attempts`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// Its number (1 for the first; a snooze or release gives its number back, so the next
    /// attempt has the same one).
    pub number: u32,
    /// When it started (Unix ms), if known.
    pub started_ms: Option<u64>,
    /// When it ended (Unix ms).
    pub ended_ms: u64,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// Why, for a failure (clipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How an attempt ended ([`Attempt::outcome`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum AttemptOutcome {
    /// It succeeded.
    Completed,
    /// It failed and the job was retried after a backoff.
    Retried,
    /// It failed for the last time (or not retryably): the job died.
    Died,
    /// Its lease expired before it ended (a stall).
    Stalled,
    /// It snoozed: the job runs again later, the attempt not counted.
    Snoozed,
    /// It was handed back (a draining worker, or a sink ahead of the coordinator): the
    /// attempt not counted.
    Released,
    /// An outcome a later version records.
    #[serde(other)]
    Other,
}

impl AttemptOutcome {
    /// The name the stores keep.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Retried => "retried",
            Self::Died => "died",
            Self::Stalled => "stalled",
            Self::Snoozed => "snoozed",
            Self::Released => "released",
            Self::Other => "other",
        }
    }

    /// Reads a kept name; one this version does not know is [`Other`](Self::Other).
    pub fn parse(name: &str) -> Self {
        match name {
            "completed" => Self::Completed,
            "retried" => Self::Retried,
            "died" => Self::Died,
            "stalled" => Self::Stalled,
            "snoozed" => Self::Snoozed,
            "released" => Self::Released,
            _ => Self::Other,
        }
    }
}

impl JobDetails {
    /// The attempts of a record's history as the Redis scripts keep it (a JSON array of
    /// `[number, started ms (0: unknown), ended ms, outcome, error]`); entries that do not
    /// read are left out, and a history that does not read at all is empty.
    pub fn attempts_from_json(raw: &str) -> Vec<Attempt> {
        let Ok(entries) = serde_json::from_str::<Vec<serde_json::Value>>(raw) else {
            return Vec::new();
        };
        entries
            .iter()
            .filter_map(|e| {
                let [number, started, ended, outcome, error] = e.as_array()?.as_slice() else {
                    return None;
                };
                let error = error.as_str().filter(|e| !e.is_empty()).map(str::to_owned);
                Some(Attempt {
                    number: u32::try_from(number.as_u64()?).ok()?,
                    started_ms: started.as_u64().filter(|&ms| ms > 0),
                    ended_ms: ended.as_u64()?,
                    outcome: AttemptOutcome::parse(outcome.as_str()?),
                    error,
                })
            })
            .collect()
    }
}

/// A completed job, kept for a while after it completed ([`Inspect::completed`](crate::store::Inspect::completed);
/// [`CompletedRetention`] says how long).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletedJob {
    /// The job as it last ran.
    pub job: Job,
    /// When it completed (Unix ms, the coordinator's clock).
    pub completed_ms: u64,
    /// Its priority, times and attempts (the last one is the one that completed).
    pub details: JobDetails,
    /// Its handler's result (kinds registered with one), while that is kept
    /// ([`RESULT_RETENTION`](crate::job::RESULT_RETENTION)).
    pub result: Option<String>,
}

/// How long completed jobs are kept to be looked up by id, and how many at most: a
/// coordinator keeps the newest `max` completed within `keep` (the oldest go first). The
/// default keeps a day's, at most 10,000; [`off`](Self::off) keeps none (a completion then
/// deletes its record, as before 0.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompletedRetention {
    /// How long after its completion a record is kept.
    pub keep: Duration,
    /// At most this many records (clamped to [`MAX_COMPLETED_KEPT`]).
    pub max: usize,
}

/// The most completed records a coordinator keeps, whatever is asked.
pub const MAX_COMPLETED_KEPT: usize = 1_000_000;

impl Default for CompletedRetention {
    fn default() -> Self {
        Self {
            keep: Duration::from_secs(24 * 3600),
            max: 10_000,
        }
    }
}

impl CompletedRetention {
    /// Keeps no completed job.
    pub fn off() -> Self {
        Self {
            keep: Duration::ZERO,
            max: 0,
        }
    }

    /// Whether it keeps any.
    pub fn is_on(&self) -> bool {
        self.max > 0 && !self.keep.is_zero()
    }

    /// Clamped to what a store keeps: at most [`MAX_COMPLETED_KEPT`] records, for at most
    /// [`MAX_DELAY`](crate::job::MAX_DELAY); off when either is zero.
    pub fn clamped(self) -> Self {
        if !self.is_on() {
            return Self::off();
        }
        Self {
            keep: crate::job::whole_ms(self.keep.min(crate::job::MAX_DELAY))
                .max(Duration::from_millis(1)),
            max: self.max.min(MAX_COMPLETED_KEPT),
        }
    }
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
    /// Its priority, times and attempts so far.
    #[serde(default)]
    pub details: JobDetails,
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
