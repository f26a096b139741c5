//! The memory lease store's read-only views and queue controls.

use std::time::Duration;

use async_trait::async_trait;

use super::{lock, MemoryLeaseStore};
use crate::error::Result;
use crate::group::{GroupLimits, GroupStatus};
use crate::ids::JobId;
use crate::job::{
    Cancelled, CompletedJob, DeadAction, DeadFilter, DeadJob, DeadSweep, JobState, JobView,
    QueueCounts, RateLimit,
};
use crate::store::{Inspect, LeaseInfo, QueueAdmin, SweepProgress};

#[async_trait]
impl Inspect for MemoryLeaseStore {
    async fn counts(&self, queue: &str) -> Result<QueueCounts> {
        let now = crate::clock::now();
        let state = lock(&self.state);
        Ok(state
            .queues
            .get(queue)
            .map(|q| {
                let due = q.delayed.iter().take_while(|(at, ..)| *at <= now).count() as u64;
                QueueCounts {
                    ready: q.ready.values().map(|s| s.len() as u64).sum::<u64>()
                        + q.grouped.len()
                        + due,
                    waiting: q.waiting,
                    delayed: q.delayed.len() as u64 - due,
                    leased: q.leased,
                    completed: q.completed,
                    dead: q.dead.len() as u64,
                    cancelled: q.cancelled,
                    died: q.died,
                    enqueued: q.enqueued,
                    stalled: q.stalled,
                }
            })
            .unwrap_or_default())
    }

    async fn dead(&self, queue: &str, limit: usize) -> Result<Vec<DeadJob>> {
        let state = lock(&self.state);
        Ok(state
            .queues
            .get(queue)
            .map(|q| q.dead.iter().take(limit).map(|(d, _)| d.clone()).collect())
            .unwrap_or_default())
    }

    async fn dead_range(&self, queue: &str, skip: usize, limit: usize) -> Result<Vec<DeadJob>> {
        let state = lock(&self.state);
        Ok(state
            .queues
            .get(queue)
            .map(|q| {
                q.dead
                    .iter()
                    .skip(skip)
                    .take(limit)
                    .map(|(d, _)| d.clone())
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn delayed(&self, queue: &str, limit: usize) -> Result<Vec<JobView>> {
        let now = crate::clock::now();
        let state = lock(&self.state);
        let Some(q) = state.queues.get(queue) else {
            return Ok(Vec::new());
        };
        Ok(q.delayed
            .iter()
            .filter_map(|(at, _, id)| {
                Some(JobView {
                    job: state.jobs.get(id)?.job.clone(),
                    state: JobState::Delayed,
                    due_in: Some(at.saturating_duration_since(now)),
                    lease: None,
                    last_error: state.errors.get(id).cloned(),
                    details: state.jobs.get(id)?.details.clone(),
                })
            })
            .take(limit)
            .collect())
    }

    async fn ready(&self, queue: &str, limit: usize) -> Result<Vec<JobView>> {
        let state = lock(&self.state);
        let Some(q) = state.queues.get(queue) else {
            return Ok(Vec::new());
        };
        // Every kind's first `limit`, merged in claim order (priority, then arrival).
        let mut keys: Vec<_> = q
            .ready
            .values()
            .flat_map(|set| set.iter().take(limit))
            .collect();
        keys.sort_unstable();
        Ok(keys
            .into_iter()
            .filter_map(|(_, _, id)| {
                Some(JobView {
                    job: state.jobs.get(id)?.job.clone(),
                    state: JobState::Ready,
                    due_in: None,
                    lease: None,
                    last_error: state.errors.get(id).cloned(),
                    details: state.jobs.get(id)?.details.clone(),
                })
            })
            .take(limit)
            .collect())
    }

    async fn job(&self, job: JobId) -> Result<Option<JobView>> {
        let now = crate::clock::now();
        let state = lock(&self.state);
        let Some(record) = state.jobs.get(&job) else {
            return Ok(None);
        };
        let mut view = JobView {
            job: record.job.clone(),
            state: JobState::Unplaced,
            due_in: None,
            lease: None,
            last_error: state.errors.get(&job).cloned(),
            details: record.details.clone(),
        };
        let q = state.queues.get(&record.queue);
        if let Some((lease, _)) = state.leases.iter().find(|(_, r)| r.job == job) {
            view.state = JobState::Leased;
            view.lease = Some(*lease);
        } else if let Some((at, ..)) =
            q.and_then(|q| q.delayed.iter().find(|(_, _, id)| *id == job))
        {
            view.state = JobState::Delayed;
            view.due_in = Some(at.saturating_duration_since(now));
        } else if state.held.contains_key(&job) {
            view.state = JobState::Held;
        } else if state.ready_key_of(job).is_some() {
            view.state = JobState::Ready;
        } else if state
            .scopes
            .get(&record.scope)
            .is_some_and(|s| s.waiting.iter().any(|k| k.2 == job))
        {
            view.state = JobState::Waiting;
        }
        Ok(Some(view))
    }

    async fn completed(&self, job: JobId) -> Result<Option<CompletedJob>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        state.forget_completed(self.completed_retention, now);
        let Some((_, done)) = state.completed.get(&job) else {
            return Ok(None);
        };
        let mut done = done.clone();
        done.result = state.note(job, true);
        Ok(Some(done))
    }

    async fn queues(&self) -> Result<Vec<String>> {
        let state = lock(&self.state);
        let mut queues: Vec<String> = state
            .queues
            .keys()
            .chain(state.rates.keys())
            .cloned()
            .collect();
        queues.sort();
        queues.dedup();
        Ok(queues)
    }

    async fn leases(&self, limit: usize) -> Result<Vec<LeaseInfo>> {
        let now = crate::clock::now();
        let state = lock(&self.state);
        Ok(state
            .leases
            .by_expiry(limit)
            .into_iter()
            .filter_map(|(id, record)| {
                let job = state.jobs.get(&record.job)?;
                Some(LeaseInfo {
                    queue: job.queue.clone(),
                    kind: job.kind.clone(),
                    lease: *id,
                    job: record.job,
                    scope: job.scope.clone(),
                    token: record.token,
                    worker: record.worker.to_string(),
                    age: now.saturating_duration_since(record.claimed_at),
                    expires_in: record.expires_at.saturating_duration_since(now),
                })
            })
            .collect())
    }

    async fn oldest_ready(&self, queue: &str) -> Result<Option<Duration>> {
        let now = crate::clock::now();
        let state = lock(&self.state);
        let Some(q) = state.queues.get(queue) else {
            return Ok(None);
        };
        // Of grouped jobs, the heads of the groups next in each rotation (bounded, as
        // oldest.lua looks: GROUP_HEADS_LOOKED_AT).
        let grouped = q.grouped.rotation.iter().flat_map(|(kind, rotation)| {
            rotation
                .iter()
                .take(crate::store::GROUP_HEADS_LOOKED_AT)
                .filter_map(|(_, group)| q.grouped.ready.get(&(kind.clone(), group.clone())))
        });
        let heads = q
            .ready
            .values()
            .chain(grouped)
            .filter_map(|set| set.first())
            .map(|(_, _, id)| state.ready_at.get(id).copied().unwrap_or(now));
        let due = q
            .delayed
            .first()
            .map(|(at, ..)| *at)
            .filter(|at| *at <= now);
        Ok(heads
            .chain(due)
            .min()
            .map(|at| now.saturating_duration_since(at)))
    }

    async fn groups(&self, queue: &str, top: usize) -> Result<Vec<GroupStatus>> {
        let state = lock(&self.state);
        let Some(q) = state.queues.get(queue) else {
            return Ok(Vec::new());
        };
        let mut depths: Vec<(u64, &String)> =
            q.grouped.depth.iter().map(|(g, d)| (*d, g)).collect();
        depths.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        Ok(depths
            .into_iter()
            .take(top.min(crate::store::MAX_TOP_GROUPS))
            .map(|(_, group)| state.group_status(group, Some(queue)))
            .collect())
    }

    async fn group(&self, group: &str) -> Result<GroupStatus> {
        Ok(lock(&self.state).group_status(group, None))
    }
}

/// Where the newest dead letter of `job` is among the newest
/// [`DEAD_JOB_SEARCH`](crate::store::DEAD_JOB_SEARCH), as the Redis store searches.
fn newest_dead(dead: &std::collections::VecDeque<(DeadJob, i32)>, job: JobId) -> Option<usize> {
    let from_end = dead
        .iter()
        .rev()
        .take(crate::store::DEAD_JOB_SEARCH)
        .position(|(d, _)| d.job.id == job)?;
    Some(dead.len() - 1 - from_end)
}

#[async_trait]
impl QueueAdmin for MemoryLeaseStore {
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        crate::job::check_name("queue", queue)?;
        let mut state = lock(&self.state);
        if paused {
            state.paused.insert(queue.to_owned());
        } else {
            state.paused.remove(queue);
        }
        Ok(())
    }

    async fn paused(&self) -> Result<Vec<String>> {
        Ok(lock(&self.state).paused.iter().cloned().collect())
    }

    async fn cancel(&self, job: JobId, reason: &str) -> Result<Cancelled> {
        let mut state = lock(&self.state);
        let Some(record) = state.jobs.get(&job) else {
            return Ok(Cancelled::Missing);
        };
        let (queue, kind, scope) = (
            record.queue.clone(),
            record.kind.clone(),
            record.scope.clone(),
        );
        // Running (an expired lease not yet reaped counts: the reaper would requeue it).
        let lease = state
            .leases
            .iter()
            .find(|(_, r)| r.job == job)
            .map(|(lease, _)| *lease);
        let done = if let Some(lease) = lease {
            if let Some(r) = state.leases.remove(&lease) {
                state.drop_lease(lease, r, crate::clock::now());
            }
            Cancelled::Revoked
        } else {
            if let Some(key) = state.ready_key_of(job) {
                state.unready(&queue, &kind, &key);
            }
            if let Some(q) = state.queues.get_mut(&queue) {
                q.delayed.retain(|(_, _, id)| *id != job);
            }
            let waited = state
                .scopes
                .get_mut(&scope)
                .and_then(|s| {
                    s.waiting
                        .iter()
                        .find(|k| k.2 == job)
                        .copied()
                        .map(|k| (s, k))
                })
                .map(|(s, k)| s.waiting.remove(&k))
                .unwrap_or(false);
            if waited {
                if let Some(q) = state.queues.get_mut(&queue) {
                    q.waiting = q.waiting.saturating_sub(1);
                }
            }
            Cancelled::Removed
        };
        state.queues.entry(queue).or_default().cancelled += 1;
        state.bury(job, reason.to_owned(), self.dead_retention);
        state.publish_watermark();
        Ok(done)
    }

    async fn retry_dead(&self, queue: &str, limit: usize) -> Result<usize> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        let mut count = 0;
        while count < limit {
            let Some((dead, priority)) =
                state.queues.get_mut(queue).and_then(|q| q.dead.pop_front())
            else {
                break;
            };
            if state.jobs.contains_key(&dead.job.id) {
                // Its id names a live job again (re-enqueued with that id): reviving it would
                // write over that job. The record stays (at the end), as on Redis.
                if let Some(q) = state.queues.get_mut(queue) {
                    q.dead.push_back((dead, priority));
                }
                break;
            }
            state.revive(dead, priority, now);
            count += 1;
        }
        Ok(count)
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
        let now = crate::clock::now();
        let mut sweep = DeadSweep::default();
        {
            let mut state = lock(&self.state);
            let records = state
                .queues
                .get_mut(queue)
                .map(|q| std::mem::take(&mut q.dead))
                .unwrap_or_default();
            let mut left = std::collections::VecDeque::with_capacity(records.len());
            let mut revived = Vec::new();
            let mut ids = std::collections::HashSet::new();
            for (dead, priority) in records {
                if sweep.done >= limit {
                    left.push_back((dead, priority));
                    continue;
                }
                sweep.scanned += 1;
                if !filter.matches(&dead) {
                    left.push_back((dead, priority));
                    continue;
                }
                match action {
                    DeadAction::Purge => sweep.done += 1,
                    // Its id names a live job again (or an older record of it was just
                    // revived): it stays, as on Redis.
                    DeadAction::Retry
                        if state.jobs.contains_key(&dead.job.id) || !ids.insert(dead.job.id) =>
                    {
                        sweep.kept += 1;
                        left.push_back((dead, priority));
                    }
                    DeadAction::Retry => {
                        sweep.done += 1;
                        revived.push((dead, priority));
                    }
                }
            }
            if let Some(q) = state.queues.get_mut(queue) {
                q.dead = left;
            }
            for (dead, priority) in revived {
                state.revive(dead, priority, now);
            }
        }
        progress(sweep);
        Ok(sweep)
    }

    async fn retry_dead_job(&self, queue: &str, job: JobId) -> Result<bool> {
        crate::job::check_name("queue", queue)?;
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        if state.jobs.contains_key(&job) {
            return Ok(false); // its id names a live job again, as `retry_dead` keeps it
        }
        let Some(q) = state.queues.get_mut(queue) else {
            return Ok(false);
        };
        let Some(i) = newest_dead(&q.dead, job) else {
            return Ok(false);
        };
        let Some((dead, priority)) = q.dead.remove(i) else {
            return Ok(false);
        };
        state.revive(dead, priority, now);
        Ok(true)
    }

    async fn purge_dead_job(&self, queue: &str, job: JobId) -> Result<bool> {
        crate::job::check_name("queue", queue)?;
        let mut state = lock(&self.state);
        let Some(q) = state.queues.get_mut(queue) else {
            return Ok(false);
        };
        let Some(i) = newest_dead(&q.dead, job) else {
            return Ok(false);
        };
        q.dead.remove(i);
        Ok(true)
    }

    async fn run_now(&self, job: JobId) -> Result<bool> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        let Some(queue) = state.jobs.get(&job).map(|j| j.queue.clone()) else {
            return Ok(false);
        };
        let Some(q) = state.queues.get_mut(&queue) else {
            return Ok(false);
        };
        let Some(key) = q.delayed.iter().find(|(_, _, id)| *id == job).copied() else {
            return Ok(false);
        };
        q.delayed.remove(&key);
        q.delayed.insert((now, key.1, job));
        state.ready_at.insert(job, now);
        Ok(true)
    }

    async fn forget_queue(&self, queue: &str) -> Result<bool> {
        crate::job::check_name("queue", queue)?;
        let mut state = lock(&self.state);
        let in_use = state.queues.get(queue).is_some_and(|q| {
            q.ready.values().any(|s| !s.is_empty())
                || !q.grouped.depth.is_empty()
                || !q.delayed.is_empty()
                || q.leased > 0
                || q.waiting > 0
                || !q.dead.is_empty()
        }) || state.jobs.values().any(|j| j.queue == queue);
        if in_use {
            return Ok(false);
        }
        state.queues.remove(queue);
        state.rates.remove(queue);
        state.paused.remove(queue);
        Ok(true)
    }

    async fn purge_dead(&self, queue: &str, limit: usize) -> Result<usize> {
        let mut state = lock(&self.state);
        Ok(match state.queues.get_mut(queue) {
            Some(q) => {
                let n = limit.min(q.dead.len());
                q.dead.drain(..n).for_each(drop);
                n
            }
            None => 0,
        })
    }

    async fn set_concurrency_cap(&self, kind: &str, cap: Option<u32>) -> Result<()> {
        crate::job::check_name("kind", kind)?;
        crate::job::check_cap(cap)?;
        let mut state = lock(&self.state);
        match cap {
            Some(cap) => {
                state.caps.insert(kind.to_owned(), cap);
            }
            None => {
                state.caps.remove(kind);
            }
        }
        Ok(())
    }

    async fn concurrency_cap(&self, kind: &str) -> Result<Option<u32>> {
        Ok(lock(&self.state).caps.get(kind).copied())
    }

    async fn concurrency_caps(&self) -> Result<Vec<(String, u32)>> {
        let mut caps: Vec<_> = lock(&self.state)
            .caps
            .iter()
            .map(|(kind, cap)| (kind.clone(), *cap))
            .collect();
        caps.sort();
        Ok(caps)
    }

    async fn set_rate_limit(&self, queue: &str, limit: Option<RateLimit>) -> Result<()> {
        crate::job::check_name("queue", queue)?;
        let mut state = lock(&self.state);
        match limit {
            Some(limit) => {
                limit.validate()?;
                let full = f64::from(limit.jobs);
                state
                    .rates
                    .insert(queue.to_owned(), (limit, full, crate::clock::now()));
            }
            None => {
                state.rates.remove(queue);
            }
        }
        Ok(())
    }

    async fn rate_limit(&self, queue: &str) -> Result<Option<RateLimit>> {
        Ok(lock(&self.state).rates.get(queue).map(|(limit, ..)| *limit))
    }

    async fn set_group_limits(&self, group: &str, limits: GroupLimits) -> Result<()> {
        crate::job::check_name("group", group)?;
        limits.validate()?;
        lock(&self.state).set_group_limits(group, limits, crate::clock::now());
        Ok(())
    }

    async fn limited_groups(&self, max: usize) -> Result<Vec<(String, GroupLimits)>> {
        let state = lock(&self.state);
        let mut all: Vec<(String, GroupLimits)> = state
            .groups
            .iter()
            .filter(|(_, g)| g.limits != GroupLimits::default())
            .map(|(name, g)| (name.clone(), g.limits))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.truncate(max);
        Ok(all)
    }
}
