//! [`Inspect`] and [`QueueAdmin`] over a partitioned layout: each operation fans out over the
//! partitions and combines their answers as the trait's docs say (`store/admin.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;

use super::{shares, PartitionedLeaseStore};
use crate::error::Result;
use crate::group::{GroupLimits, GroupStatus};
use crate::ids::JobId;
use crate::job::{
    Cancelled, CompletedJob, DeadAction, DeadFilter, DeadJob, DeadSweep, JobView, QueueCounts,
    RateLimit,
};
use crate::store::{Inspect, LeaseInfo, QueueAdmin, SweepProgress};

// The partitioned layout: each operation fans out over the partitions.
#[async_trait]
impl Inspect for PartitionedLeaseStore {
    async fn counts(&self, queue: &str) -> Result<QueueCounts> {
        let all = self
            .on_all(|part| async move { part.counts(queue).await })
            .await?;
        let mut total = QueueCounts::default();
        for c in all {
            total += c;
        }
        Ok(total)
    }

    async fn dead(&self, queue: &str, limit: usize) -> Result<Vec<DeadJob>> {
        let all = self
            .on_all(|part| async move { part.dead(queue, limit).await })
            .await?;
        Ok(all.concat().into_iter().take(limit).collect())
    }

    /// Each partition's oldest `skip + limit`, merged by time of death (records without one
    /// first, in partition order), then the page.
    async fn dead_range(&self, queue: &str, skip: usize, limit: usize) -> Result<Vec<DeadJob>> {
        let want = skip.saturating_add(limit);
        let all = self
            .on_all(|part| async move { part.dead_range(queue, 0, want).await })
            .await?;
        let mut all = all.concat();
        all.sort_by_key(|d| d.died_ms);
        Ok(all.into_iter().skip(skip).take(limit).collect())
    }

    async fn delayed(&self, queue: &str, limit: usize) -> Result<Vec<JobView>> {
        let all = self
            .on_all(|part| async move { part.delayed(queue, limit).await })
            .await?;
        let mut all = all.concat();
        all.sort_by_key(|v| v.due_in);
        all.truncate(limit);
        Ok(all)
    }

    async fn ready(&self, queue: &str, limit: usize) -> Result<Vec<JobView>> {
        // (Each partition's in its claim order, one partition after another: the layout
        // claims from them in turn, so no order across them is the claim order.)
        let all = self
            .on_all(|part| async move { part.ready(queue, limit).await })
            .await?;
        let mut all = all.concat();
        all.truncate(limit);
        Ok(all)
    }

    async fn job(&self, job: JobId) -> Result<Option<JobView>> {
        let all = self
            .on_all(|part| async move { part.job(job).await })
            .await?;
        Ok(all.into_iter().flatten().next())
    }

    async fn completed(&self, job: JobId) -> Result<Option<CompletedJob>> {
        let all = self
            .on_all(|part| async move { part.completed(job).await })
            .await?;
        Ok(all.into_iter().flatten().next())
    }

    async fn queues(&self) -> Result<Vec<String>> {
        let all = self
            .on_all(|part| async move { part.queues().await })
            .await?;
        Ok(all
            .concat()
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect())
    }

    async fn leases(&self, limit: usize) -> Result<Vec<LeaseInfo>> {
        let all = self
            .on_all(|part| async move { part.leases(limit).await })
            .await?;
        let mut all = all.concat();
        all.sort_by_key(|l| l.expires_in);
        all.truncate(limit);
        Ok(all)
    }

    async fn oldest_ready(&self, queue: &str) -> Result<Option<Duration>> {
        let all = self
            .on_all(|part| async move { part.oldest_ready(queue).await })
            .await?;
        Ok(all.into_iter().flatten().max())
    }

    /// Each partition's top, merged (a group lives in one partition, so none is counted
    /// twice).
    async fn groups(&self, queue: &str, top: usize) -> Result<Vec<GroupStatus>> {
        let all = self
            .on_all(|part| async move { part.groups(queue, top).await })
            .await?;
        let mut all = all.concat();
        all.sort_by(|a, b| b.ready.cmp(&a.ready).then_with(|| a.group.cmp(&b.group)));
        all.truncate(top.min(crate::store::MAX_TOP_GROUPS));
        Ok(all)
    }

    /// Asked of the group's partition.
    async fn group(&self, group: &str) -> Result<GroupStatus> {
        self.group_part(group).group(group).await
    }
}

#[async_trait]
impl QueueAdmin for PartitionedLeaseStore {
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        self.on_all(|part| async move { part.set_paused(queue, paused).await })
            .await
            .map(drop)
    }

    async fn paused(&self) -> Result<Vec<String>> {
        self.control().paused().await
    }

    async fn cancel(&self, job: JobId, reason: &str) -> Result<Cancelled> {
        for part in &self.parts {
            match part.cancel(job, reason).await? {
                Cancelled::Missing => continue,
                done => return Ok(done),
            }
        }
        Ok(Cancelled::Missing)
    }

    async fn retry_dead(&self, queue: &str, limit: usize) -> Result<usize> {
        self.up_to(limit, |part, left| async move {
            part.retry_dead(queue, left).await
        })
        .await
    }

    async fn purge_dead(&self, queue: &str, limit: usize) -> Result<usize> {
        self.up_to(limit, |part, left| async move {
            part.purge_dead(queue, left).await
        })
        .await
    }

    async fn dead_where(
        &self,
        queue: &str,
        filter: &DeadFilter,
        action: DeadAction,
        limit: u64,
        progress: SweepProgress<'_>,
    ) -> Result<DeadSweep> {
        let mut total = DeadSweep::default();
        for part in &self.parts {
            if total.done >= limit {
                break;
            }
            let before = total;
            let add = |s: DeadSweep| DeadSweep {
                scanned: before.scanned + s.scanned,
                done: before.done + s.done,
                kept: before.kept + s.kept,
            };
            let step = part
                .dead_where(queue, filter, action, limit - total.done, &|s| {
                    progress(add(s))
                })
                .await?;
            total = add(step);
        }
        Ok(total)
    }

    async fn retry_dead_job(&self, queue: &str, job: JobId) -> Result<bool> {
        for part in &self.parts {
            if part.retry_dead_job(queue, job).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn purge_dead_job(&self, queue: &str, job: JobId) -> Result<bool> {
        for part in &self.parts {
            if part.purge_dead_job(queue, job).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn run_now(&self, job: JobId) -> Result<bool> {
        for part in &self.parts {
            if part.run_now(job).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Asked of a partition only when no partition counts a job in the queue, so a refusal
    /// in one partition does not drop the pause and rate-limit shares of the others. (A flow
    /// step held for the queue is not counted: its partition alone keeps the queue then.)
    async fn forget_queue(&self, queue: &str) -> Result<bool> {
        let counts = self.counts(queue).await?;
        if counts.pending() > 0 || counts.dead > 0 {
            return Ok(false);
        }
        let all = self
            .on_all(|part| async move { part.forget_queue(queue).await })
            .await?;
        Ok(all.into_iter().all(|forgotten| forgotten))
    }

    async fn set_concurrency_cap(&self, kind: &str, cap: Option<u32>) -> Result<()> {
        if cap == Some(0) {
            // Refused by every backend the same way; asked of the control partition alone.
            return self.control().set_concurrency_cap(kind, cap).await;
        }
        let shares = cap.map(|cap| shares(cap, self.parts.len()));
        self.on_each(|j, part| {
            let share = shares.as_ref().map(|s| s[j]);
            async move { part.set_concurrency_cap(kind, share).await }
        })
        .await
        .map(drop)
    }

    async fn concurrency_cap(&self, kind: &str) -> Result<Option<u32>> {
        let all = self
            .on_all(|part| async move { part.concurrency_cap(kind).await })
            .await?;
        Ok(all.into_iter().sum::<Option<u32>>())
    }

    async fn concurrency_caps(&self) -> Result<Vec<(String, u32)>> {
        // Each partition holds a share; the cap is their sum (as `concurrency_cap` says).
        let mut caps = BTreeMap::<String, u32>::new();
        for part in self
            .on_all(|part| async move { part.concurrency_caps().await })
            .await?
        {
            for (kind, share) in part {
                let cap = caps.entry(kind).or_default();
                *cap = cap.saturating_add(share);
            }
        }
        Ok(caps.into_iter().collect())
    }

    async fn set_rate_limit(&self, queue: &str, limit: Option<RateLimit>) -> Result<()> {
        if let Some(limit) = &limit {
            limit.validate()?;
        }
        let shares = limit.map(|l| shares(l.jobs, self.parts.len()));
        self.on_each(|j, part| {
            let share = limit.zip(shares.as_ref()).map(|(l, s)| RateLimit {
                jobs: s[j],
                per: l.per,
            });
            async move { part.set_rate_limit(queue, share).await }
        })
        .await
        .map(drop)
    }

    async fn rate_limit(&self, queue: &str) -> Result<Option<RateLimit>> {
        let all = self
            .on_all(|part| async move { part.rate_limit(queue).await })
            .await?;
        let Some(per) = all.iter().flatten().map(|l| l.per).next() else {
            return Ok(None);
        };
        Ok(Some(RateLimit {
            jobs: all.iter().flatten().map(|l| l.jobs).sum(),
            per,
        }))
    }

    /// Set in the group's partition alone: a group lives in one, so its cap is never split.
    async fn set_group_limits(&self, group: &str, limits: GroupLimits) -> Result<()> {
        self.group_part(group).set_group_limits(group, limits).await
    }

    /// Each partition's first `max`, merged (a group's limits live in its partition).
    async fn limited_groups(&self, max: usize) -> Result<Vec<(String, GroupLimits)>> {
        let all = self
            .on_all(|part| async move { part.limited_groups(max).await })
            .await?;
        let mut all = all.concat();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.truncate(max);
        Ok(all)
    }
}
