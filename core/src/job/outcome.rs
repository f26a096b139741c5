//! What a handler returns ([`JobError`]) and how a finished job settles ([`Settlement`]),
//! with the follow-up jobs and flows its completion carries ([`FollowUps`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::new::{whole_ms, NewJob, MAX_DELAY};
use crate::error::Error;
use crate::ids::JobId;

/// What a handler returns when it does not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// Try again later: after `after`, or after the worker's exponential backoff.
    #[error("retry requested: {reason}")]
    Retry {
        /// Explicit delay, overriding the backoff.
        after: Option<Duration>,
        /// Why, for the log and the dead-letter record if attempts run out.
        reason: String,
    },
    /// Never retry: the job goes to the dead-letter set with this reason.
    #[error("fatal: {0}")]
    Fatal(String),
    /// A fenced sink refused the write: this lease no longer owns its scope.
    #[error("fenced off: {0}")]
    Fenced(#[from] crate::admission::Rejection),
    /// Not now, and not a failure: run again after `after`, the attempt given back (see
    /// [`JobError::snooze`]).
    #[error("snoozed for {after:?}")]
    Snooze {
        /// When to run again.
        after: Duration,
    },
}

impl JobError {
    /// The word a trace gives this outcome: `retry`, `fatal`, `fenced` or `snoozed`.
    pub fn outcome(&self) -> &'static str {
        match self {
            JobError::Retry { .. } => "retry",
            JobError::Fatal(_) => "fatal",
            JobError::Fenced(_) => "fenced",
            JobError::Snooze { .. } => "snoozed",
        }
    }

    /// A retry with backoff.
    pub fn retry(reason: impl Into<String>) -> Self {
        Self::Retry {
            after: None,
            reason: reason.into(),
        }
    }

    /// A fatal failure.
    pub fn fatal(reason: impl Into<String>) -> Self {
        Self::Fatal(reason.into())
    }

    /// "Try again in `after`": the job waits that long and runs again without spending an
    /// attempt or counting as a failure (a downstream asked to wait, a resource is busy).
    /// Its snooze count grows ([`Job::snoozes`](crate::job::Job::snoozes)); a job that snoozes more than its
    /// [`max_snoozes`](NewJob::with_max_snoozes) is dead with that as its reason. At most
    /// [`MAX_DELAY`].
    pub fn snooze(after: Duration) -> Self {
        Self::Snooze {
            after: whole_ms(after.min(MAX_DELAY)),
        }
    }
}

impl From<Error> for JobError {
    fn from(e: Error) -> Self {
        if e.is_retryable() {
            Self::retry(e.to_string())
        } else {
            Self::Fatal(e.to_string())
        }
    }
}

/// How a finished job settles at the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// Done; remove it. The handler's `result` (JSON), if any, is kept with the settlement,
    /// atomically, for [`RESULT_RETENTION`](crate::job::RESULT_RETENTION): a
    /// completion that is accepted has its result, and one that is refused (the lease is no
    /// longer current) leaves none.
    Complete {
        /// The handler's result as JSON (`Registry::register_with_result`).
        result: Option<String>,
        /// What the handler set going (`JobContext::follow_up`,
        /// `start_flow`,
        /// `add_step`): kept with the completion, in the same
        /// atomic step, and acted on from there — so it happens once the completion is
        /// accepted and never for one that is refused.
        then: Then,
    },
    /// Back to the queue, claimable after `delay`.
    Retry {
        /// Backoff before the next claim.
        delay: Duration,
        /// Last failure, kept for the dead-letter record.
        reason: String,
    },
    /// Dead-letter it.
    Dead {
        /// Why.
        reason: String,
    },
    /// Give the job back unfinished (a worker draining past its deadline): ready again at
    /// once, the attempt not counted and no stall charged, the lease revoked atomically. A
    /// late write of the released run is still fenced once the job is claimed again.
    Release,
    /// The handler snoozed ([`JobError::snooze`]): claimable again after `delay`, the attempt
    /// not counted, its snooze count one higher.
    Snooze {
        /// How long it waits.
        delay: Duration,
    },
    /// A fenced sink refused this (still current) lease: a sink holds `highest`, at least as
    /// new as this lease's token, so the coordinator's counters regressed. The coordinator
    /// moves to an epoch above `highest` and runs the job again at once, without spending an
    /// attempt. For a lease that is not current this is refused like any settlement.
    Fenced {
        /// Newest token the sink reported.
        highest: crate::ids::FencingToken,
        /// The rejection, for the log.
        reason: String,
    },
}

impl Settlement {
    /// A completion with no result and no follow-up jobs.
    pub fn completed() -> Self {
        Settlement::Complete {
            result: None,
            then: Then::default(),
        }
    }
}

/// What an accepted completion sets going, kept with it in the same atomic step: follow-up
/// jobs, new flows, and steps added to the completing step's own flow.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Then {
    /// Jobs to enqueue, each with its id.
    pub jobs: Vec<NewJob>,
    /// Flows to create, each already checked.
    pub flows: Vec<crate::flow::Flow>,
    /// Steps to add to the completing job's flow (it is a flow step), under their full names
    /// (`"<its step>/<name>"`): they run after it, and every step that runs after it also
    /// runs after them.
    pub steps: Vec<crate::flow::Step>,
}

impl Then {
    /// Nothing set going.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.flows.is_empty() && self.steps.is_empty()
    }
}

/// One accepted completion's follow-up jobs and flows, kept until they are enqueued and
/// created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowUps {
    /// The job whose completion carried them.
    pub parent: JobId,
    /// The jobs, each with its id (`JobContext::follow_up` gives each one).
    pub jobs: Vec<NewJob>,
    /// The flows, each with its id (`JobContext::start_flow`).
    #[serde(default)]
    pub flows: Vec<crate::flow::Flow>,
}

/// A kept follow-up record as the stores write it: the jobs alone, as before flows could be
/// started from a handler (so a record is read by either version), or jobs and flows.
///
/// The object form may carry `v`, its format version: absent means 1, which is what this
/// release writes and the newest it reads. A later release that adds something a reader must
/// not skip writes a higher `v`; a reader of an older release then leaves the record where it
/// is for a process that reads it ([`FollowUpRecord::decode`]), never delivers half of it and
/// forgets the rest.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
#[doc(hidden)]
pub enum FollowUpRecord {
    Jobs(Vec<NewJob>),
    WithFlows {
        jobs: Vec<NewJob>,
        #[serde(default)]
        flows: Vec<crate::flow::Flow>,
        #[serde(default = "first_version")]
        v: u32,
    },
}

/// The newest follow-up record format this release reads (and the one it writes).
#[doc(hidden)]
pub const FOLLOW_UP_RECORD_VERSION: u32 = 1;

fn first_version() -> u32 {
    1
}

impl FollowUpRecord {
    /// The record for `jobs` and `flows`, as JSON (`""`: nothing to keep), written from
    /// the borrowed values: the jobs alone as the array, else both as the object.
    #[doc(hidden)]
    pub fn encode(jobs: &[NewJob], flows: &[crate::flow::Flow]) -> serde_json::Result<String> {
        #[derive(Serialize)]
        struct WithFlows<'a> {
            jobs: &'a [NewJob],
            flows: &'a [crate::flow::Flow],
        }
        match (jobs.is_empty(), flows.is_empty()) {
            (true, true) => Ok(String::new()),
            (_, true) => serde_json::to_string(jobs),
            _ => serde_json::to_string(&WithFlows { jobs, flows }),
        }
    }

    /// The kept set of `parent` from its stored record (`""`: a record gone since it was
    /// listed, an empty set). `Err` names why the record cannot be read by this release: the
    /// caller leaves it in place and says so, since it may be a later release's (see the
    /// type's docs) and deleting it would lose its jobs.
    #[doc(hidden)]
    pub fn decode(parent: JobId, record: &str) -> std::result::Result<FollowUps, String> {
        let (jobs, flows) = match record {
            "" => (Vec::new(), Vec::new()),
            json => match serde_json::from_str(json).map_err(|e| e.to_string())? {
                FollowUpRecord::Jobs(jobs) => (jobs, Vec::new()),
                FollowUpRecord::WithFlows { v, .. } if v > FOLLOW_UP_RECORD_VERSION => {
                    return Err(format!(
                        "format version {v}, this release reads up to {FOLLOW_UP_RECORD_VERSION}"
                    ))
                }
                FollowUpRecord::WithFlows { jobs, flows, .. } => (jobs, flows),
            },
        };
        Ok(FollowUps {
            parent,
            jobs,
            flows,
        })
    }
}
