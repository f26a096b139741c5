//! Pure lease-state decisions: what a handler outcome or a stall does to a job.
//!
//! Workers and stores only carry these decisions to storage, so every branch is unit-tested
//! here without actors or clocks.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::job::{Job, JobError, Settlement};

/// Exponential backoff for handler retries, each delay drawn from the upper half of its
/// ceiling ("equal jitter").
///
/// The default (1 s doubling to 6 h) with the default [`DEFAULT_MAX_ATTEMPTS`](crate::job::DEFAULT_MAX_ATTEMPTS)
/// (20) retries a failing job for 16½ to 33 hours: the first five retries span 15 to 31 s, so a
/// blip of seconds (a restarting Redis, a deploy of the service a handler calls) costs a few
/// attempts and no dead letter, and an outage of a night still leaves the job to run in the
/// morning. A job that must not wait that long says so with
/// [`NewJob::with_max_attempts`](crate::job::NewJob::with_max_attempts), a kind with
/// `Registry::with_retry`, a worker with `WorkerConfig::retry` (`palisade worker
/// --retry-base/--retry-max`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Delay ceiling for the first retry.
    pub base: Duration,
    /// Upper bound on any delay.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Self::DEFAULT_BASE,
            max: Self::DEFAULT_MAX,
        }
    }
}

impl RetryPolicy {
    /// The default [`RetryPolicy::base`].
    pub const DEFAULT_BASE: Duration = Duration::from_secs(1);
    /// The default [`RetryPolicy::max`].
    pub const DEFAULT_MAX: Duration = Duration::from_secs(6 * 3600);

    /// Refuses a policy that cannot be meant: a zero base (retries at once, a hot loop against
    /// whatever is failing), a ceiling below the base, or one past the longest delay a store
    /// keeps ([`MAX_DELAY`](crate::job::MAX_DELAY)). `what` names it in the error.
    pub fn validate(&self, what: &str) -> Result<(), String> {
        if self.base < Duration::from_millis(1) {
            return Err(format!("{what}: retry base must be at least 1ms"));
        }
        if self.max < self.base {
            return Err(format!(
                "{what}: retry max {:?} is below its base {:?}",
                self.max, self.base
            ));
        }
        if self.max > crate::job::MAX_DELAY {
            return Err(format!(
                "{what}: retry max {:?} is past the longest delay {:?}",
                self.max,
                crate::job::MAX_DELAY
            ));
        }
        Ok(())
    }

    /// The shortest and longest time from a job's first failure to its last attempt's
    /// start, when each of its `attempts` fails (the sum of the delays at their lowest and
    /// highest jitter).
    pub fn span(&self, attempts: u32) -> (Duration, Duration) {
        let (mut low, mut high) = (Duration::ZERO, Duration::ZERO);
        // Past attempt 33 every delay is the same (the exponent stops growing): counted once
        // and multiplied, so any count is quick.
        for attempt in 1..attempts.min(34) {
            low = low.saturating_add(self.backoff(attempt, 0.0));
            high = high.saturating_add(self.backoff(attempt, 1.0));
        }
        let rest = attempts.saturating_sub(34);
        low = low.saturating_add(self.backoff(34, 0.0).saturating_mul(rest));
        high = high.saturating_add(self.backoff(34, 1.0).saturating_mul(rest));
        (low, high)
    }

    /// Delay before attempt `attempt + 1`, given a uniform `jitter` in `[0, 1)`.
    ///
    /// Jitter (`rand(ceiling / 2, ceiling)`, `ceiling = min(base * 2^(attempt-1), max)`)
    /// spreads a burst of failures instead of re-synchronising them; the floor of half the
    /// ceiling keeps a retry from firing at once.
    pub fn backoff(&self, attempt: u32, jitter: f64) -> Duration {
        let exp = attempt.saturating_sub(1).min(32);
        let ceiling = self.base.saturating_mul(1u32 << exp.min(31)).min(self.max);
        // (NaN is no jitter; a product that rounds past what a Duration holds is the ceiling.)
        let jitter = if jitter.is_nan() {
            0.0
        } else {
            jitter.clamp(0.0, 1.0)
        };
        let delay = Duration::try_from_secs_f64(ceiling.as_secs_f64() * (0.5 + 0.5 * jitter));
        delay.map_or(ceiling, |d| d.min(ceiling))
    }

    /// How a job that ended with `outcome` settles.
    pub fn settle(&self, job: &Job, outcome: &Result<(), JobError>, jitter: f64) -> Settlement {
        match outcome {
            Ok(()) => Settlement::completed(),
            Err(JobError::Fatal(reason)) => Settlement::Dead {
                reason: reason.clone(),
            },
            // A fenced-off writer is not the owner any more; the coordinator refuses this
            // settlement for a stale lease. If it still believes the lease current (a token
            // regression), it reseeds above the sink and runs the job again.
            Err(JobError::Fenced(rejection)) => match rejection.highest() {
                Some(highest) => Settlement::Fenced {
                    highest,
                    reason: rejection.to_string(),
                },
                // A mutation that does not fit is refused the same way every time: retrying
                // cannot help, so the job is dead with the sink's reason.
                None => Settlement::Dead {
                    reason: rejection.to_string(),
                },
            },
            Err(JobError::Snooze { after }) => {
                if job.snoozes >= job.max_snoozes {
                    Settlement::Dead {
                        reason: format!(
                            "snoozed {} times (max_snoozes = {}); asked again for {after:?}",
                            job.snoozes, job.max_snoozes
                        ),
                    }
                } else {
                    Settlement::Snooze { delay: *after }
                }
            }
            Err(JobError::Retry { after, reason }) => {
                if job.attempt >= job.max_attempts {
                    Settlement::Dead {
                        reason: format!("{} attempts failed; last: {reason}", job.attempt),
                    }
                } else {
                    Settlement::Retry {
                        delay: after.unwrap_or_else(|| self.backoff(job.attempt, jitter)),
                        reason: reason.clone(),
                    }
                }
            }
        }
    }
}

/// How an attempt claimed at `now_ms` (Unix ms, the claiming worker's clock) that must not
/// start settles without running: dead as "expired" when the job's deadline passed
/// ([`NewJob::with_deadline`](crate::job::NewJob::with_deadline)); `None` when it may run. Every
/// attempt is judged, a retry too: none starts late.
#[doc(hidden)]
pub fn expired(job: &Job, now_ms: u64) -> Option<Settlement> {
    let deadline = job.deadline_ms?;
    (now_ms > deadline).then(|| {
        // (Validated deadlines are below 10^14 ms: the year 5138, well inside chrono's range.)
        let at = i64::try_from(deadline)
            .ok()
            .and_then(chrono::DateTime::from_timestamp_millis)
            .map_or_else(
                || format!("{deadline} ms"),
                |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            );
        Settlement::Dead {
            reason: format!(
                "expired: attempt {} not started by its deadline {at} (claimed {} ms after it)",
                job.attempt,
                now_ms - deadline
            ),
        }
    })
}

/// The outcome of an attempt that ran past its timeout: retryable, whatever the handler
/// returned once its token fired (its work is cut short, and its lease ends with the
/// settlement), or `aborted` when it did not return within the grace period.
#[doc(hidden)]
pub fn timed_out(timeout: Duration, aborted: Option<Duration>) -> JobError {
    match aborted {
        None => JobError::retry(format!("timed out after {timeout:?}")),
        Some(grace) => JobError::retry(format!(
            "timed out after {timeout:?}; did not stop within {grace:?} of its cancellation and was aborted"
        )),
    }
}

/// What the reaper does with a job whose lease expired before it settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StallOutcome {
    /// Claimable again; the next claim counts as a new attempt.
    Requeue,
    /// Too many stalls: dead with this reason.
    Dead(String),
}

/// Decides a stall; `stalls` is the count *including* this one.
pub(crate) fn on_stall(stalls: u32, max_stalls: u32) -> StallOutcome {
    if stalls > max_stalls {
        StallOutcome::Dead(format!(
            "lease expired {stalls} times (max_stalls = {max_stalls})"
        ))
    } else {
        StallOutcome::Requeue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{FencingToken, JobId, Scope};

    fn job(attempt: u32, max_attempts: u32) -> Job {
        Job {
            id: JobId::new(),
            queue: "q".into(),
            kind: "k".into(),
            payload: "{}".into(),
            scope: Scope::new("s"),
            attempt,
            stalls: 0,
            snoozes: 0,
            max_snoozes: 2,
            timeout: None,
            deadline_ms: None,
            max_attempts,
            max_stalls: 1,
            flow: None,
            tick: None,
            trace: None,
            group: None,
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        assert_eq!(p.backoff(1, 1.0), Duration::from_millis(100));
        assert_eq!(p.backoff(1, 0.0), Duration::from_millis(50));
        assert_eq!(p.backoff(3, 1.0), Duration::from_millis(400));
        assert_eq!(p.backoff(40, 1.0), Duration::from_secs(1));
    }

    /// The defaults ride out an outage of seconds without using up a job's attempts, and
    /// give up after about a day (the figures the policy's docs state).
    #[test]
    fn the_default_retries_span_about_a_day() {
        let p = RetryPolicy::default();
        let (low, high) = p.span(6);
        assert_eq!((low.as_secs(), high.as_secs()), (15, 31));
        let (low, high) = p.span(crate::job::DEFAULT_MAX_ATTEMPTS);
        assert_eq!((low.as_secs() / 3600, high.as_secs() / 3600), (16, 33));
        assert!(p.validate("default").is_ok());
    }

    #[test]
    fn nonsense_policies_are_refused() {
        let p = |base, max| RetryPolicy { base, max };
        assert!(p(Duration::ZERO, Duration::from_secs(1))
            .validate("w")
            .is_err());
        assert!(p(Duration::from_secs(2), Duration::from_secs(1))
            .validate("w")
            .is_err());
        let e = p(Duration::from_secs(1), Duration::MAX)
            .validate("kind \"x\"")
            .unwrap_err();
        assert!(e.starts_with("kind \"x\": retry max"), "{e}");
        assert!(p(Duration::from_millis(1), Duration::from_millis(1))
            .validate("w")
            .is_ok());
    }

    #[test]
    fn retry_until_attempts_run_out() {
        let p = RetryPolicy::default();
        let err = Err(JobError::retry("flaky"));
        assert!(matches!(
            p.settle(&job(1, 3), &err, 0.5),
            Settlement::Retry { .. }
        ));
        match p.settle(&job(3, 3), &err, 0.5) {
            Settlement::Dead { reason } => assert!(reason.contains("3 attempts"), "{reason}"),
            other => panic!("expected dead, got {other:?}"),
        }
    }

    #[test]
    fn explicit_delay_wins_and_fatal_is_dead() {
        let p = RetryPolicy::default();
        let after = Duration::from_secs(7);
        let err = Err(JobError::Retry {
            after: Some(after),
            reason: "later".into(),
        });
        assert_eq!(
            p.settle(&job(1, 3), &err, 0.0),
            Settlement::Retry {
                delay: after,
                reason: "later".into()
            }
        );
        assert_eq!(
            p.settle(&job(1, 3), &Err(JobError::fatal("bad")), 0.0),
            Settlement::Dead {
                reason: "bad".into()
            }
        );
        assert_eq!(p.settle(&job(1, 3), &Ok(()), 0.0), Settlement::completed());
    }

    #[test]
    fn fenced_settles_with_the_sinks_highest_token() {
        let p = RetryPolicy::default();
        let rejection = crate::admission::Rejection::StaleToken {
            presented: FencingToken::from_u64(1),
            highest: FencingToken::from_u64(2),
        };
        assert!(matches!(
            p.settle(&job(3, 3), &Err(JobError::Fenced(rejection)), 0.9),
            Settlement::Fenced { highest, .. } if highest == FencingToken::from_u64(2)
        ));
    }

    /// A snooze gives its attempt back even on the last attempt (it is no failure), until the
    /// snoozes run out: then the job is dead with the count as its reason.
    #[test]
    fn snoozes_until_they_run_out() {
        let p = RetryPolicy::default();
        let snooze = Err(JobError::snooze(Duration::from_secs(3)));
        let mut j = job(3, 3);
        for snoozes in 0..2 {
            j.snoozes = snoozes;
            assert_eq!(
                p.settle(&j, &snooze, 0.5),
                Settlement::Snooze {
                    delay: Duration::from_secs(3)
                }
            );
        }
        j.snoozes = 2;
        match p.settle(&j, &snooze, 0.5) {
            Settlement::Dead { reason } => {
                assert!(
                    reason.contains("snoozed 2 times (max_snoozes = 2)"),
                    "{reason}"
                )
            }
            other => panic!("expected dead, got {other:?}"),
        }
        // Longer than any delay is the longest delay.
        assert_eq!(
            JobError::snooze(Duration::MAX),
            JobError::Snooze {
                after: crate::job::MAX_DELAY
            }
        );
    }

    /// An attempt claimed after the deadline does not run (a retry neither); at the deadline
    /// exactly, or without one, it does.
    #[test]
    fn attempts_after_the_deadline_expire() {
        let mut j = job(2, 3);
        assert_eq!(expired(&j, u64::MAX), None);
        j.deadline_ms = Some(1_000);
        assert_eq!(expired(&j, 999), None);
        assert_eq!(expired(&j, 1_000), None);
        match expired(&j, 1_250) {
            Some(Settlement::Dead { reason }) => {
                assert!(reason.starts_with("expired"), "{reason}");
                assert!(reason.contains("1970-01-01T00:00:01.000Z"), "{reason}");
                assert!(reason.contains("250 ms after"), "{reason}");
            }
            other => panic!("expected expired, got {other:?}"),
        }
    }

    #[test]
    fn stalls_beyond_the_limit_are_dead() {
        assert_eq!(on_stall(1, 1), StallOutcome::Requeue);
        assert!(matches!(on_stall(2, 1), StallOutcome::Dead(_)));
    }
}
