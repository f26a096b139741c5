//! The Redis coordinator's read-only views and queue controls.

use std::sync::atomic::Ordering;
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_redis::redis::{self, Script};
use serde::Deserialize;

use super::RedisLeaseStore;
use crate::connection::{garbage, parse};
use crate::error::Result;
use crate::group::{GroupLimits, GroupStatus};
use crate::ids::LeaseId;
use crate::ids::{JobId, Scope};
use crate::job::{
    Attempt, AttemptOutcome, Cancelled, CompletedJob, DeadAction, DeadFilter, DeadJob, DeadSweep,
    Job, JobDetails, JobState, JobView, QueueCounts, RateLimit, MAX_ATTEMPTS_KEPT,
};
use crate::scripts::{coordinator_script, decode_lease_row, decode_watermark, script_count, Meta};
use crate::store::{Inspect, LeaseInfo, QueueAdmin, SweepProgress};

static COUNTS: LazyLock<Script> = coordinator_script!("counts.lua");
static LEASES: LazyLock<Script> = coordinator_script!("leases.lua");
static OLDEST: LazyLock<Script> = coordinator_script!("oldest.lua");
static CANCEL: LazyLock<Script> = coordinator_script!("cancel.lua");
static RETRY_DEAD: LazyLock<Script> = coordinator_script!("retry_dead.lua");
static PURGE_DEAD: LazyLock<Script> = coordinator_script!("purge_dead.lua");
static DEAD_JOB: LazyLock<Script> = coordinator_script!("dead_job.lua");
static DEAD_WHERE: LazyLock<Script> = coordinator_script!("dead_where.lua");

/// Dead letters `dead_where.lua` reads per call: a call stays a short script whatever the
/// retention (a millisecond or so for records of a few KiB; each record is decoded, so
/// payloads near the 256 KiB limit make it tens of milliseconds).
const SWEEP_STEP: u64 = 250;
static RUN_NOW: LazyLock<Script> = coordinator_script!("run_now.lua");
static FORGET_QUEUE: LazyLock<Script> = coordinator_script!("forget_queue.lua");
static VIEW: LazyLock<Script> = coordinator_script!("view.lua");
static GROUPS: LazyLock<Script> = coordinator_script!("groups.lua");

/// One row of `groups.lua`: `{group, ready, running, cap, jobs, per_ms, paused, parked}`.
fn decode_group_row(row: Vec<String>) -> Result<GroupStatus> {
    let [group, ready, running, cap, jobs, per_ms, paused, parked] =
        <[String; 8]>::try_from(row).map_err(|r| garbage(format_args!("bad group row {r:?}")))?;
    // (Limits another program wrote oddly read as none, as the scripts read them.)
    let rate = match (jobs.parse::<u32>(), per_ms.parse::<u64>()) {
        (Ok(jobs), Ok(ms)) if jobs > 0 && ms > 0 => Some(RateLimit {
            jobs,
            per: Duration::from_millis(ms),
        }),
        _ => None,
    };
    Ok(GroupStatus {
        group,
        ready: parse(&ready)?,
        running: parse(&running)?,
        limits: GroupLimits {
            cap: cap.parse().ok(),
            rate,
            paused: !paused.is_empty(),
        },
        parked: !parked.is_empty(),
    })
}

/// One dead-letter record as `bury` (common.lua) writes it.
#[derive(Deserialize)]
struct DeadRecord {
    id: JobId,
    queue: String,
    kind: String,
    payload: String,
    scope: Scope,
    attempt: u32,
    stalls: u32,
    max_attempts: u32,
    max_stalls: u32,
    reason: String,
    /// Absent in a record an earlier version wrote.
    #[serde(default)]
    died: Option<u64>,
    #[serde(default)]
    tick: Option<crate::job::Tick>,
    #[serde(default, deserialize_with = "crate::traceparent::lenient")]
    trace: Option<crate::traceparent::TraceContext>,
    #[serde(default)]
    snoozes: u32,
    #[serde(default = "crate::job::default_max_snoozes")]
    max_snoozes: u32,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    deadline_ms: Option<u64>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    priority: i32,
    /// When it was enqueued and its attempts (absent in a record an earlier version wrote).
    #[serde(default)]
    enqueued: Option<u64>,
    #[serde(default)]
    attempts: Option<serde_json::Value>,
}

impl DeadRecord {
    fn decode(raw: &str) -> Result<DeadJob> {
        let r: Self = serde_json::from_str(raw).map_err(garbage)?;
        Ok(DeadJob {
            job: Job {
                id: r.id,
                queue: r.queue,
                kind: r.kind,
                payload: r.payload,
                scope: r.scope,
                attempt: r.attempt,
                stalls: r.stalls,
                snoozes: r.snoozes,
                max_snoozes: r.max_snoozes,
                timeout: r.timeout_ms.map(Duration::from_millis),
                deadline_ms: r.deadline_ms,
                max_attempts: r.max_attempts,
                max_stalls: r.max_stalls,
                flow: None,
                tick: r.tick,
                trace: r.trace,
                group: r.group,
            },
            reason: r.reason,
            died_ms: r.died,
            details: JobDetails {
                priority: r.priority,
                enqueued_ms: r.enqueued,
                // (Its last attempt's start is the start of the attempt it died of.)
                started_ms: None,
                attempts: r
                    .attempts
                    .map(|a| JobDetails::attempts_from_json(&a.to_string()))
                    .unwrap_or_default(),
            },
        })
    }
}

/// One row of `view.lua`: `{id, meta, queue, attempt, stalls, state, due in ms, lease,
/// error, snoozes, enqueued, started, tries, completed, result}`, as a view and, for a
/// completed job's record, when it completed and its result.
fn decode_row(row: Vec<String>) -> Result<(JobView, Option<u64>, Option<String>)> {
    let [id, meta, queue, attempt, stalls, state, due, lease, error, snoozes, enqueued, started, tries, completed, result] =
        <[String; 15]>::try_from(row).map_err(|r| garbage(format_args!("bad view row {r:?}")))?;
    let meta: Meta = serde_json::from_str(&meta).map_err(garbage)?;
    // (Times another program wrote that do not read are unknown, not the row's failure.)
    let ms = |text: &str| text.parse::<u64>().ok().filter(|&ms| ms > 0);
    let details = JobDetails {
        priority: meta.priority,
        enqueued_ms: ms(&enqueued),
        started_ms: ms(&started),
        attempts: JobDetails::attempts_from_json(&tries),
    };
    let completed = ms(&completed);
    let result = (!result.is_empty()).then_some(result);
    let id = JobId::from(parse::<uuid::Uuid>(&id)?);
    let state = match state.as_str() {
        "ready" => JobState::Ready,
        "waiting" => JobState::Waiting,
        "delayed" => JobState::Delayed,
        "leased" => JobState::Leased,
        "held" => JobState::Held,
        _ => JobState::Unplaced,
    };
    let count = |text: &str| parse::<u64>(text).map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    let counts = [count(&attempt)?, count(&stalls)?, count(&snoozes)?];
    let view = JobView {
        job: meta.into_job(id, queue, counts),
        state,
        due_in: (!due.is_empty())
            .then(|| parse::<u64>(&due).map(Duration::from_millis))
            .transpose()?,
        lease: (!lease.is_empty())
            .then(|| parse::<uuid::Uuid>(&lease).map(LeaseId::from))
            .transpose()?,
        last_error: (!error.is_empty()).then_some(error),
        details,
    };
    Ok((view, completed, result))
}

fn decode_view(row: Vec<String>) -> Result<JobView> {
    decode_row(row).map(|(view, ..)| view)
}

/// A `view.lua` "done" row as the completed job it keeps: its last attempt, the one that
/// completed, is the record's current one (settle.lua keeps no entry for it).
fn decode_completed(row: Vec<String>) -> Result<CompletedJob> {
    let (view, completed, result) = decode_row(row)?;
    let completed_ms =
        completed.ok_or_else(|| garbage(format_args!("a completed record without its time")))?;
    let mut details = view.details;
    details.attempts.push(Attempt {
        number: view.job.attempt,
        started_ms: details.started_ms,
        ended_ms: completed_ms,
        outcome: AttemptOutcome::Completed,
        error: None,
    });
    if details.attempts.len() > MAX_ATTEMPTS_KEPT {
        let extra = details.attempts.len() - MAX_ATTEMPTS_KEPT;
        details.attempts.drain(..extra);
    }
    Ok(CompletedJob {
        job: view.job,
        completed_ms,
        details,
        result,
    })
}

#[async_trait]
impl Inspect for RedisLeaseStore {
    async fn counts(&self, queue: &str) -> Result<QueueCounts> {
        let mut conn = self.conn().await?;
        let [ready, waiting, delayed, leased, completed, dead, cancelled, died, enqueued, stalled]: [u64; 10] = COUNTS
            .key(&self.base)
            .arg(queue)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(QueueCounts {
            ready,
            waiting,
            delayed,
            leased,
            completed,
            dead,
            cancelled,
            died,
            enqueued,
            stalled,
        })
    }

    async fn dead(&self, queue: &str, limit: usize) -> Result<Vec<DeadJob>> {
        self.dead_range(queue, 0, limit).await
    }

    async fn dead_range(&self, queue: &str, skip: usize, limit: usize) -> Result<Vec<DeadJob>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        // LRANGE's bounds are signed 64-bit: a first one past them has nothing to read; a
        // last one past them means "to the end".
        let Ok(first) = i64::try_from(skip) else {
            return Ok(Vec::new());
        };
        let last = i64::try_from(skip.saturating_add(limit - 1)).unwrap_or(i64::MAX);
        let raw: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{}q:{queue}:dead", self.base))
            .arg(first)
            .arg(last)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        // A record another program wrote (or a newer version's) is left out, not the page.
        Ok(raw
            .iter()
            .filter_map(|r| match DeadRecord::decode(r) {
                Ok(dead) => Some(dead),
                Err(e) => {
                    tracing::warn!(queue, error = %e, "a dead-letter record does not read; skipped");
                    None
                }
            })
            .collect())
    }

    async fn delayed(&self, queue: &str, limit: usize) -> Result<Vec<JobView>> {
        self.listed("delayed", queue, limit).await
    }

    async fn ready(&self, queue: &str, limit: usize) -> Result<Vec<JobView>> {
        self.listed("ready", queue, limit).await
    }

    async fn job(&self, job: JobId) -> Result<Option<JobView>> {
        let mut conn = self.conn().await?;
        let rows: Vec<Vec<String>> = VIEW
            .key(&self.base)
            .arg("job")
            .arg(job.to_string())
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        rows.into_iter().next().map(decode_view).transpose()
    }

    async fn completed(&self, job: JobId) -> Result<Option<CompletedJob>> {
        let mut conn = self.conn().await?;
        let rows: Vec<Vec<String>> = VIEW
            .key(&self.base)
            .arg("done")
            .arg(job.to_string())
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        // A kept record that does not read (another program's, or written over) is an
        // operator's aid, not the job: absent, with a warning, so a lookup goes on to the
        // dead letters and results instead of failing.
        Ok(rows
            .into_iter()
            .next()
            .and_then(|row| match decode_completed(row) {
                Ok(done) => Some(done),
                Err(e) => {
                    tracing::warn!(%job, error = %e, "a completed job's record does not read: left out");
                    None
                }
            }))
    }

    async fn queues(&self) -> Result<Vec<String>> {
        let mut conn = self.conn().await?;
        let mut queues: Vec<String> = redis::cmd("SMEMBERS")
            .arg(format!("{}queues", self.base))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        queues.sort();
        Ok(queues)
    }

    async fn leases(&self, limit: usize) -> Result<Vec<LeaseInfo>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        let rows: Vec<Vec<String>> = LEASES
            .key(&self.base)
            .arg(script_count(limit))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        rows.into_iter().map(decode_lease_row).collect()
    }

    async fn oldest_ready(&self, queue: &str) -> Result<Option<Duration>> {
        let mut conn = self.conn().await?;
        let ms: i64 = OLDEST
            .key(&self.base)
            .arg(queue)
            .arg(crate::store::GROUP_HEADS_LOOKED_AT)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(u64::try_from(ms).ok().map(Duration::from_millis))
    }

    async fn groups(&self, queue: &str, top: usize) -> Result<Vec<GroupStatus>> {
        if top == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        let rows: Vec<Vec<String>> = GROUPS
            .key(&self.base)
            .arg("top")
            .arg(queue)
            .arg(top.min(crate::store::MAX_TOP_GROUPS))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        rows.into_iter().map(decode_group_row).collect()
    }

    async fn group(&self, group: &str) -> Result<GroupStatus> {
        let mut conn = self.conn().await?;
        let rows: Vec<Vec<String>> = GROUPS
            .key(&self.base)
            .arg("status")
            .arg(group)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        rows.into_iter()
            .next()
            .map(decode_group_row)
            .unwrap_or_else(|| Err(garbage("no group row")))
    }
}

impl RedisLeaseStore {
    /// `view.lua`'s list of a queue's `what` ("delayed" or "ready") jobs, at most `limit`.
    async fn listed(&self, what: &str, queue: &str, limit: usize) -> Result<Vec<JobView>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        let rows: Vec<Vec<String>> = VIEW
            .key(&self.base)
            .arg(what)
            .arg(queue)
            .arg(script_count(limit))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(rows
            .into_iter()
            .filter_map(|row| match decode_view(row) {
                Ok(view) => Some(view),
                Err(e) => {
                    tracing::warn!(queue, error = %e, "a {what} job's record does not read; skipped");
                    None
                }
            })
            .collect())
    }

    /// `dead_job.lua`: `action` is `retry` or `purge`.
    async fn dead_job(&self, queue: &str, job: JobId, action: &str) -> Result<bool> {
        crate::job::check_name("queue", queue)?;
        let mut conn = self.conn().await?;
        let done: i64 = DEAD_JOB
            .key(&self.base)
            .arg(queue)
            .arg(job.to_string())
            .arg(action)
            .arg(crate::store::DEAD_JOB_SEARCH)
            .arg(self.generation)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(done == 1)
    }
}

#[async_trait]
impl QueueAdmin for RedisLeaseStore {
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        crate::job::check_name("queue", queue)?;
        let mut conn = self.conn().await?;
        let key = format!("{}paused", self.base);
        let command = if paused { "SADD" } else { "SREM" };
        redis::cmd(command)
            .arg(key)
            .arg(queue)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    async fn paused(&self) -> Result<Vec<String>> {
        let mut conn = self.conn().await?;
        let mut queues: Vec<String> = redis::cmd("SMEMBERS")
            .arg(format!("{}paused", self.base))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        queues.sort();
        Ok(queues)
    }

    async fn cancel(&self, job: JobId, reason: &str) -> Result<Cancelled> {
        let mut conn = self.conn().await?;
        let (done, watermark): (String, String) = CANCEL
            .key(&self.base)
            .arg(job.to_string())
            .arg(reason)
            .arg(self.dead_retention)
            .arg(self.generation)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        // A revoked lease's token leaves the reckoning: the watermark may have moved past it.
        if let Some(w) = decode_watermark(&watermark)? {
            self.watermark.fetch_max(w.as_u64(), Ordering::Relaxed);
        }
        match done.as_str() {
            "removed" => Ok(Cancelled::Removed),
            "revoked" => Ok(Cancelled::Revoked),
            "missing" => Ok(Cancelled::Missing),
            other => Err(garbage(format_args!("cancel answered {other:?}"))),
        }
    }

    async fn retry_dead(&self, queue: &str, limit: usize) -> Result<usize> {
        let mut conn = self.conn().await?;
        RETRY_DEAD
            .key(&self.base)
            .arg(queue)
            .arg(limit)
            .arg(self.generation)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    async fn dead_where(
        &self,
        queue: &str,
        filter: &DeadFilter,
        action: DeadAction,
        limit: u64,
        progress: SweepProgress<'_>,
    ) -> Result<DeadSweep> {
        crate::job::check_name("queue", queue)?;
        let action = match action {
            DeadAction::Retry => "retry",
            DeadAction::Purge => "purge",
        };
        let mut sweep = DeadSweep::default();
        let (mut from, mut anchor): (i64, String) = (0, String::new());
        while sweep.done < limit && from >= 0 {
            let mut conn = self.conn().await?;
            let (done, kept, read, next, last): (i64, i64, i64, i64, String) = DEAD_WHERE
                .key(&self.base)
                .arg(queue)
                .arg(action)
                .arg(from)
                .arg(SWEEP_STEP)
                // (Lua numbers are doubles: a limit past 2^53 is no limit.)
                .arg((limit - sweep.done).min(1 << 53))
                .arg(filter.kind.as_deref().unwrap_or(""))
                .arg(filter.reason.as_deref().unwrap_or(""))
                .arg(
                    filter
                        .died_before_ms
                        .map(|ms| ms.to_string())
                        .unwrap_or_default(),
                )
                .arg(&anchor)
                .arg(self.generation)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| self.link.broken(e))?;
            anchor = last;
            let count = |n: i64| {
                u64::try_from(n).map_err(|_| garbage(format_args!("dead_where.lua answered {n}")))
            };
            sweep.done += count(done)?;
            sweep.kept += count(kept)?;
            sweep.scanned += count(read)?;
            from = next;
            progress(sweep);
        }
        Ok(sweep)
    }

    async fn retry_dead_job(&self, queue: &str, job: JobId) -> Result<bool> {
        self.dead_job(queue, job, "retry").await
    }

    async fn purge_dead_job(&self, queue: &str, job: JobId) -> Result<bool> {
        self.dead_job(queue, job, "purge").await
    }

    async fn run_now(&self, job: JobId) -> Result<bool> {
        let mut conn = self.conn().await?;
        let done: i64 = RUN_NOW
            .key(&self.base)
            .arg(job.to_string())
            .arg(self.generation)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(done == 1)
    }

    async fn forget_queue(&self, queue: &str) -> Result<bool> {
        crate::job::check_name("queue", queue)?;
        let mut conn = self.conn().await?;
        let done: i64 = FORGET_QUEUE
            .key(&self.base)
            .arg(queue)
            .arg(self.generation)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(done == 1)
    }

    async fn purge_dead(&self, queue: &str, limit: usize) -> Result<usize> {
        let mut conn = self.conn().await?;
        PURGE_DEAD
            .key(&self.base)
            .arg(queue)
            .arg(limit)
            .arg(self.generation)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    async fn set_concurrency_cap(&self, kind: &str, cap: Option<u32>) -> Result<()> {
        crate::job::check_name("kind", kind)?;
        crate::job::check_cap(cap)?;
        let key = format!("{}caps", self.base);
        let mut conn = self.conn().await?;
        let done = match cap {
            Some(cap) => {
                redis::cmd("HSET")
                    .arg(&key)
                    .arg(kind)
                    .arg(cap)
                    .query_async::<()>(&mut conn)
                    .await
            }
            None => {
                redis::cmd("HDEL")
                    .arg(&key)
                    .arg(kind)
                    .query_async::<()>(&mut conn)
                    .await
            }
        };
        done.map_err(|e| self.link.broken(e))
    }

    async fn concurrency_cap(&self, kind: &str) -> Result<Option<u32>> {
        let mut conn = self.conn().await?;
        redis::cmd("HGET")
            .arg(format!("{}caps", self.base))
            .arg(kind)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    async fn concurrency_caps(&self) -> Result<Vec<(String, u32)>> {
        let mut conn = self.conn().await?;
        let mut caps: Vec<(String, u32)> = redis::cmd("HGETALL")
            .arg(format!("{}caps", self.base))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        caps.sort();
        Ok(caps)
    }

    async fn set_rate_limit(&self, queue: &str, limit: Option<RateLimit>) -> Result<()> {
        crate::job::check_name("queue", queue)?;
        let key = format!("{}q:{queue}:rate", self.base);
        let mut conn = self.conn().await?;
        let done = match limit {
            Some(limit) => {
                limit.validate()?;
                // One transaction: the old bucket's state goes with the old limit.
                redis::pipe()
                    .atomic()
                    .del(&key)
                    .ignore()
                    .hset_multiple(
                        &key,
                        &[
                            ("jobs", u64::from(limit.jobs)),
                            ("per_ms", limit.per.as_millis() as u64),
                        ],
                    )
                    .ignore()
                    // Listed among the queues even before its first job, so status shows it
                    // and a migration carries it.
                    .sadd(format!("{}queues", self.base), queue)
                    .ignore()
                    .query_async::<()>(&mut conn)
                    .await
            }
            None => {
                redis::cmd("DEL")
                    .arg(&key)
                    .query_async::<()>(&mut conn)
                    .await
            }
        };
        done.map_err(|e| self.link.broken(e))
    }

    async fn set_group_limits(&self, group: &str, limits: GroupLimits) -> Result<()> {
        crate::job::check_name("group", group)?;
        limits.validate()?;
        let text = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_default();
        let mut conn = self.conn().await?;
        let _: String = GROUPS
            .key(&self.base)
            .arg("set")
            .arg(group)
            .arg(text(limits.cap.map(u64::from)))
            .arg(text(limits.rate.map(|r| u64::from(r.jobs))))
            .arg(text(limits.rate.map(|r| r.per.as_millis() as u64)))
            .arg(if limits.paused { "1" } else { "" })
            .arg(self.generation)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(())
    }

    async fn limited_groups(&self, max: usize) -> Result<Vec<(String, GroupLimits)>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        let rows: Vec<Vec<String>> = GROUPS
            .key(&self.base)
            .arg("limited")
            .arg(script_count(max))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let mut all = rows
            .into_iter()
            .map(|row| decode_group_row(row).map(|g| (g.group, g.limits)))
            .collect::<Result<Vec<_>>>()?;
        all.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(all)
    }

    async fn rate_limit(&self, queue: &str) -> Result<Option<RateLimit>> {
        let mut conn = self.conn().await?;
        let (jobs, per_ms): (Option<u32>, Option<u64>) = redis::cmd("HMGET")
            .arg(format!("{}q:{queue}:rate", self.base))
            .arg("jobs")
            .arg("per_ms")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(jobs.zip(per_ms).map(|(jobs, per_ms)| RateLimit {
            jobs,
            per: Duration::from_millis(per_ms),
        }))
    }
}
