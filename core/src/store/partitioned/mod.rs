//! A coordinator split into P partitions, each a whole coordinator of its own (on Redis:
//! its own hash tag, so its own Redis Cluster slot, epoch and token counter), so one
//! deployment is no longer bound to one Redis core.
//!
//! - **Scopes stay on one counter.** A job with a named scope goes to the partition its
//!   scope hashes to (CRC16 of the scope, modulo P: stable across processes and versions), so
//!   every token of a scope comes from one counter and only grows. A job in its default
//!   scope has no ordering to keep: it goes to the partition its unique key (or its
//!   producer-chosen id) hashes to, so a retry finds its first attempt, or round-robin.
//! - **Claims** take the whole batch from one partition, the next one each claim of the
//!   queue (round-robin), and what it lacked from the partitions after it, one after another
//!   (work stealing): one script call per claim while the queues have work, as with one
//!   coordinator; up to P round trips when they hold less than the batch.
//! - **Leases** are routed back to the partition that granted them (remembered at claim); a
//!   lease this process did not claim is offered to every partition.
//! - **The watermark** is the lowest of the partitions' watermarks, and none until every
//!   partition has one: each partition's tokens are below its own watermark only, and a sink
//!   compares every scope's tokens against one watermark.
//! - **Control state** — roles, schedules, the rejection journal, progress, the clock —
//!   lives in partition 0. A result is kept by its job's completion, in the job's partition,
//!   and looked for in every partition. Pauses go to every partition. A rate limit or a
//!   concurrency cap is split into shares, one per partition, that add up to it (each at
//!   least 1, so a limit below P allows P).
//! - **Flows** keep each step's job in the partition it would be enqueued to, and the flow
//!   itself at its home, the partition its id hashes to; every step between them is
//!   idempotent (`store/flows.rs`).
//!
//! The queue views and controls fan out as `store/admin.rs` says, beside each operation.
//!
//! Limits, by construction: unique keys are unique per partition (jobs that share a unique
//! key must share a named scope or have none), and so are debounce keys (a debounced job
//! without a named scope goes where its key hashes to); a group lives in the partition its
//! name hashes to (its cap and limits whole there), so a grouped job's named scope must hash
//! there too (else the enqueue is refused) and its unique and debounce keys are kept there
//! (jobs sharing one must share a group, a named scope, or have neither); an enqueue batch that spans partitions is
//! atomic per partition, not across them (every job is validated before any is sent, so only
//! a backend error can split it).

mod admin;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::{join_all, try_join_all};

use crate::error::{Error, Result};
use crate::group::GroupLimits;
use crate::ids::{FencingToken, JobId, LeaseId, Scope};
use crate::job::{Claim, Enqueued, FollowUps, NewJob, Settlement, DEFAULT_MAX_PAYLOAD_BYTES};
use crate::store::{
    ClaimRequest, ControlStore, FlowStore, Inspect, LeaseStore, QueueAdmin, Reaped, RecordStore,
    RejectionNote, Stores,
};
use crate::store::{Completion, Waitpoint};

/// Most partitions: a claim asks each of them.
pub const MAX_PARTITIONS: usize = 256;

/// A coordinator over P partitions; see the module documentation.
pub struct PartitionedLeaseStore {
    pub(super) parts: Vec<Stores>,
    /// Where the next default-scoped job without a unique key goes.
    next_job: AtomicUsize,
    /// Where the next claim of each queue starts: per queue, because one counter for all
    /// let a worker that cycles through queues start every claim of one queue at the same
    /// partition (2 queues, 2 partitions), starving that queue's jobs in the other.
    next_claim: Mutex<HashMap<String, usize>>,
    /// The partition of every lease this process claimed and has not settled.
    owners: Mutex<HashMap<LeaseId, usize>>,
    max_payload_bytes: usize,
}

/// The partition of `key` among `p`: CRC16/XMODEM, as Redis Cluster slots use.
pub fn partition_of(key: &str, p: usize) -> usize {
    usize::from(crc16::State::<crc16::XMODEM>::calculate(key.as_bytes())) % p.max(1)
}

/// `total` split into `p` shares that add up to it, each at least 1 (so the sum is
/// `max(total, p)`).
pub(super) fn shares(total: u32, p: usize) -> Vec<u32> {
    let p32 = p as u32;
    (0..p32)
        .map(|j| (total / p32 + u32::from(j < total % p32)).max(1))
        .collect()
}

/// Settlements as a store takes them.
type Batch = Vec<(LeaseId, Settlement)>;

/// A store's answer to a settle call.
type SettleReply = Result<Vec<Result<()>>>;

impl PartitionedLeaseStore {
    /// A coordinator over `parts` (1..=[`MAX_PARTITIONS`]), in a fixed order: every process
    /// of a deployment must list the same partitions in the same order. On Redis, give each
    /// its own prefix (`palisade::store::redis::partition_prefixes`).
    pub fn new(parts: Vec<Stores>) -> Result<Self> {
        if parts.is_empty() || parts.len() > MAX_PARTITIONS {
            return Err(Error::Config(format!(
                "{} partitions: 1..={MAX_PARTITIONS} are allowed",
                parts.len()
            )));
        }
        Ok(Self {
            parts,
            next_job: AtomicUsize::new(0),
            next_claim: Mutex::new(HashMap::new()),
            owners: Mutex::default(),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        })
    }

    /// The payload limit every job of a batch is checked against before any partition sees
    /// it (set it to the partitions' own limit).
    pub fn with_max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// How many partitions.
    pub fn partitions(&self) -> usize {
        self.parts.len()
    }

    pub(super) fn control(&self) -> &Stores {
        &self.parts[0]
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseId, usize>> {
        self.owners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The partition that keeps `group`'s jobs and limits.
    pub(super) fn group_part(&self, group: &str) -> &Stores {
        &self.parts[partition_of(group, self.parts.len())]
    }

    /// The partition a job goes to.
    fn place(&self, job: &NewJob) -> usize {
        let p = self.parts.len();
        // A grouped job lives with its group (its cap is never split into shares); with a
        // named scope too, both must hash to one partition (checked by `enqueue_all`).
        if let Some(group) = &job.group {
            return partition_of(group, p);
        }
        // A retried enqueue goes where its first attempt went: by its unique key, or by its
        // id as `with_id`'s unique key names it (so with or without that key, one partition).
        // A debounced job goes where its key's pending job is (jobs under one key share a
        // scope, if they have one).
        if let (None, Some(debounce)) = (&job.scope, &job.debounce) {
            return partition_of(&debounce.key, p);
        }
        match (&job.scope, &job.unique, job.id) {
            (Some(scope), _, _) => partition_of(scope.as_str(), p),
            (None, Some(unique), _) => partition_of(&unique.key, p),
            (None, None, Some(id)) => partition_of(&format!("id:{id}"), p),
            (None, None, None) => self.next_job.fetch_add(1, Ordering::Relaxed) % p,
        }
    }

    /// Runs `op` on every partition at once; the first error wins.
    pub(super) async fn on_all<T, F, Fut>(&self, op: F) -> Result<Vec<T>>
    where
        F: Fn(Stores) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.on_each(|_, part| op(part)).await
    }

    /// [`on_all`](Self::on_all), with each partition's index.
    pub(super) async fn on_each<T, F, Fut>(&self, op: F) -> Result<Vec<T>>
    where
        F: Fn(usize, Stores) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        try_join_all(
            self.parts
                .iter()
                .enumerate()
                .map(|(i, part)| op(i, part.clone())),
        )
        .await
    }

    /// Runs `op` on one partition after another with what is left of `limit`; how many it
    /// did in all.
    pub(super) async fn up_to<F, Fut>(&self, limit: usize, op: F) -> Result<usize>
    where
        F: Fn(Stores, usize) -> Fut,
        Fut: std::future::Future<Output = Result<usize>>,
    {
        let mut left = limit;
        for part in &self.parts {
            left = left.saturating_sub(op(part.clone(), left).await?);
        }
        Ok(limit - left)
    }

    /// The partition `queue`'s next claim starts at: the next one each claim (round-robin).
    fn claim_start(&self, queue: &str) -> usize {
        let mut next = self
            .next_claim
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let at = next.entry(queue.to_owned()).or_default();
        let start = *at % self.parts.len();
        *at = at.wrapping_add(1);
        start
    }

    /// Claims the rest of `request` from the partitions after `start`, from the `from`-th
    /// on, on top of `claims` (what the earlier ones granted). A failure is said here; the
    /// caller hears of one only if no partition had work.
    async fn claim_on(
        &self,
        start: usize,
        from: usize,
        request: &ClaimRequest,
        mut claims: Vec<Claim>,
        mut first_error: Option<Error>,
    ) -> Result<Vec<Claim>> {
        let p = self.parts.len();
        // The whole batch from one partition, the next one each claim (round-robin), and
        // what it lacked from the partitions after it (work stealing). Not a share from
        // each: every script call has a fixed cost (pause, rate and cap checks, the epoch
        // check, the watermark at settle), and splitting each claim P ways multiplied the
        // calls per job, and the Redis CPU per job with them (docs/performance.md, settings
        // the code cites).
        let ClaimRequest {
            queue,
            kinds,
            worker,
            n,
            ttl,
        } = request;
        for k in from..p {
            if claims.len() >= *n {
                break;
            }
            let i = (start + k) % p;
            match self
                .claim_from(i, queue, kinds, worker, n - claims.len(), *ttl)
                .await
            {
                Ok(got) => claims.extend(got),
                Err(e) => {
                    crate::repeats::warn_repeated!(key = i; partition = i, error = %e, "claim from a partition failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if claims.is_empty() => Err(e),
            _ => Ok(claims),
        }
    }

    /// Settles each settlement on the partition that granted its lease (all of them at
    /// once), and, with `claim` = (partition, request), claims there in the same call — after
    /// that partition's settlements, in their round trip.
    async fn settle_routed(
        &self,
        settlements: Vec<(LeaseId, Settlement)>,
        claim: Option<(usize, &ClaimRequest)>,
    ) -> (Result<Vec<Result<()>>>, Option<Result<Vec<Claim>>>) {
        let p = self.parts.len();
        let total = settlements.len();
        let ids: Vec<LeaseId> = settlements.iter().map(|(lease, _)| *lease).collect();
        let mut routed: Vec<(Vec<usize>, Batch)> = vec![Default::default(); p];
        let mut unknown = Vec::new();
        {
            let owners = self.owners();
            for (k, s) in settlements.into_iter().enumerate() {
                match owners.get(&s.0) {
                    Some(&i) => {
                        routed[i].0.push(k);
                        routed[i].1.push(s);
                    }
                    None => unknown.push((k, s)),
                }
            }
        }
        let rides = claim.is_some_and(|(c, _)| !routed[c].0.is_empty());
        let calls = routed
            .into_iter()
            .enumerate()
            .filter(|(_, (at, _))| !at.is_empty())
            .map(|(i, (at, batch))| async move {
                match claim {
                    Some((c, request)) if c == i => {
                        let (settled, claimed) =
                            self.parts[i].settle_and_claim(batch, request).await;
                        (at, settled, Some(claimed))
                    }
                    _ => (at, self.parts[i].settle(batch).await, None),
                }
            });
        let alone = async {
            match claim {
                Some((c, r)) if !rides => Some(r.on(&self.parts[c]).await),
                _ => None,
            }
        };
        let (answers, mut claimed) = futures_util::join!(join_all(calls), alone);
        let mut replies = Vec::with_capacity(answers.len());
        for (at, settled, got) in answers {
            claimed = claimed.or(got);
            replies.push((at, settled));
        }
        if let (Some((c, _)), Some(Ok(claims))) = (claim, &claimed) {
            self.own(c, claims);
        }
        (self.settled(total, ids, replies, unknown).await, claimed)
    }

    /// Puts the partitions' settle `replies` (each with the positions of its settlements)
    /// together, settles the leases no partition is known to own, and forgets the settled
    /// leases.
    async fn settled(
        &self,
        total: usize,
        ids: Vec<LeaseId>,
        replies: Vec<(Vec<usize>, SettleReply)>,
        unknown: Vec<(usize, (LeaseId, Settlement))>,
    ) -> Result<Vec<Result<()>>> {
        let mut out: Vec<Option<Result<()>>> = (0..total).map(|_| None).collect();
        let mut failed = None;
        for (at, reply) in replies {
            match reply {
                Ok(results) => {
                    for (k, r) in at.into_iter().zip(results) {
                        out[k] = Some(r);
                    }
                }
                Err(e) if e.is_retryable() => {
                    // The caller retries a failed call whole (a worker keeps its settlements
                    // for the next attempt): leases another partition settled meanwhile then
                    // answer "not current", and nothing is lost.
                    return Err(e);
                }
                Err(e) => {
                    for k in at {
                        out[k] = Some(Err(Error::Backend(e.to_string())));
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        // A lease this process did not claim: every partition is asked; it is settled where
        // it is current, and stale everywhere else.
        for (k, settlement) in unknown {
            let tries = self.on_all(|part| {
                let settlement = settlement.clone();
                async move { Ok(part.settle(vec![settlement]).await?.pop()) }
            });
            let result = match tries.await {
                Ok(results) => {
                    let mut results: Vec<Result<()>> = results.into_iter().flatten().collect();
                    match results.iter().position(|r| r.is_ok()) {
                        Some(i) => results.swap_remove(i),
                        None => results
                            .into_iter()
                            .find(|r| !matches!(r, Err(Error::LeaseNotCurrent(_))))
                            .unwrap_or(Err(Error::LeaseNotCurrent(settlement.0))),
                    }
                }
                Err(e) => Err(e),
            };
            out[k] = Some(result);
        }
        if let (Some(e), true) = (failed, out.iter().all(|r| matches!(r, Some(Err(_)) | None))) {
            return Err(e);
        }
        let results: Vec<Result<()>> = out
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Backend("no settle reply".into()))))
            .collect();
        // A settled lease is over whatever the answer, unless the answer was "try again".
        let mut owners = self.owners();
        for (lease, result) in ids.iter().zip(&results) {
            if !matches!(result, Err(e) if e.is_retryable()) {
                owners.remove(lease);
            }
        }
        Ok(results)
    }

    /// Claims from partition `i` and remembers who granted the leases.
    async fn claim_from(
        &self,
        i: usize,
        queue: &str,
        kinds: &[String],
        worker: &str,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Claim>> {
        let claims = self.parts[i]
            .claim_kinds(queue, kinds, worker, n, ttl)
            .await?;
        self.own(i, &claims);
        Ok(claims)
    }

    /// Remembers that partition `i` granted `claims`' leases (renewals and settlements go
    /// there).
    fn own(&self, i: usize, claims: &[Claim]) {
        let mut owners = self.owners();
        for claim in claims {
            owners.insert(claim.lease.id, i);
        }
    }
}

/// Refuses (`Error::Config`, naming what is left) while the coordinator layout `layout` still
/// holds queued, delayed or running jobs, dead letters, or completions' follow-up jobs not
/// enqueued yet: a migration moves no jobs, and dead letters left behind could not be seen or
/// retried from the new layout (retry or purge them).
pub async fn check_drained(layout: &Stores) -> Result<()> {
    let mut pending = Vec::new();
    for queue in layout.queues().await? {
        let counts = layout.counts(&queue).await?;
        if counts.pending() > 0 {
            pending.push(format!("{queue}: {} queued or running", counts.pending()));
        }
        if counts.dead > 0 {
            pending.push(format!("{queue}: {} dead", counts.dead));
        }
    }
    // Follow-up jobs kept with completions are enqueued from the layout that kept them.
    let kept = layout.follow_ups(Duration::ZERO, 1000).await?.len();
    if kept > 0 {
        pending.push(format!(
            "follow-up jobs of {kept} completions not enqueued yet (a coordinator's sweep \
             enqueues them within seconds)"
        ));
    }
    // Flows live in the layout that keeps them: their held steps, step ends not recorded
    // yet, and releases not delivered.
    let held = layout.held_jobs(Duration::ZERO, 1000).await?.len();
    let ends = layout.step_ends(1000).await?.len();
    let unreleased = layout.unreleased_flows(Duration::ZERO, 1000).await?.len();
    if held + ends + unreleased > 0 {
        pending.push(format!(
            "flows still running ({held} steps waiting, {ends} step ends and {unreleased} \
             flows' releases not delivered yet): let them finish or cancel them"
        ));
    }
    if !pending.is_empty() {
        return Err(Error::Config(format!(
            "the old layout still holds jobs ({}): drain it (and retry or purge its dead \
             letters) before migrating",
            pending.join(", ")
        )));
    }
    Ok(())
}

/// Moves a deployment from the coordinator layout `old` to `new` (another number of
/// partitions) without lowering any scope's tokens: a scope may land in a partition whose
/// counter is behind the one it came from, so every partition of `new` is raised to an epoch
/// above every epoch `old` used.
///
/// Every piece of control state is carried: `new` ends with exactly `old`'s kept schedules
/// (and their marks, so no tick fires twice), paused queues, rate limits and concurrency caps
/// — whatever `new` held before (a run that died half-way) is cleared. `old` is only read, so
/// a migration that fails leaves it as it was; once the new layout is in use, [`retire`]
/// clears it (so nothing stale is left in a layout no process runs).
///
/// Run it once `old` is drained: it refuses while `old` still holds queued, delayed or
/// running jobs, or dead letters ([`check_drained`]). Returns the epoch `new` grants in from
/// now on. On Redis, `move_layout` runs it under a lock,
/// fences the processes of the old layout out first and retires it after.
pub async fn migrate(old: &Stores, new: &Stores) -> Result<u32> {
    check_drained(old).await?;
    let queues = old.queues().await?;
    let above = old.epoch().await?.unwrap_or(0).saturating_add(1);
    let epoch = new.raise_epoch(above).await?;

    let schedules = old.schedules().await?;
    for stale in new.schedules().await? {
        if !schedules.iter().any(|s| s.name == stale.name) {
            new.remove_schedule(&stale.name).await?;
        }
    }
    for spec in &schedules {
        let mark = old.schedule_mark(&spec.name).await?;
        new.put_schedule(spec.clone()).await?;
        if let Some(mark) = mark {
            new.advance_schedule(&spec.name, mark).await?;
        }
    }

    let paused = old.paused().await?;
    for queue in new.paused().await? {
        if !paused.contains(&queue) {
            new.set_paused(&queue, false).await?;
        }
    }
    for queue in &paused {
        new.set_paused(queue, true).await?;
    }

    let mut all_queues = new.queues().await?;
    all_queues.extend(queues.iter().cloned());
    all_queues.sort();
    all_queues.dedup();
    for queue in &all_queues {
        let limit = match queues.contains(queue) {
            true => old.rate_limit(queue).await?,
            false => None,
        };
        if limit != new.rate_limit(queue).await? {
            new.set_rate_limit(queue, limit).await?;
        }
    }

    let caps = old.concurrency_caps().await?;
    for (kind, _) in new.concurrency_caps().await? {
        if !caps.iter().any(|(k, _)| *k == kind) {
            new.set_concurrency_cap(&kind, None).await?;
        }
    }
    for (kind, cap) in &caps {
        new.set_concurrency_cap(kind, Some(*cap)).await?;
    }

    let groups = old.limited_groups(usize::MAX).await?;
    for (group, _) in new.limited_groups(usize::MAX).await? {
        if !groups.iter().any(|(g, _)| *g == group) {
            new.set_group_limits(&group, GroupLimits::default()).await?;
        }
    }
    for (group, limits) in &groups {
        new.set_group_limits(group, *limits).await?;
    }
    Ok(epoch)
}

/// Clears the control state of a layout no process runs any more (after [`migrate`] carried
/// it to the new one): its kept schedules, pauses, rate limits and caps. Best-effort — what is
/// left is stale state nobody reads, and a failure is logged — so it never fails a migration
/// that is complete.
pub async fn retire(old: &Stores) {
    let cleared = async {
        for spec in old.schedules().await? {
            old.remove_schedule(&spec.name).await?;
        }
        for queue in old.paused().await? {
            old.set_paused(&queue, false).await?;
        }
        for queue in old.queues().await? {
            if old.rate_limit(&queue).await?.is_some() {
                old.set_rate_limit(&queue, None).await?;
            }
        }
        for (group, _) in old.limited_groups(usize::MAX).await? {
            old.set_group_limits(&group, GroupLimits::default()).await?;
        }
        for (kind, _) in old.concurrency_caps().await? {
            old.set_concurrency_cap(&kind, None).await?;
        }
        Ok::<_, Error>(())
    };
    if let Err(e) = cleared.await {
        tracing::warn!(error = %e, "the old layout keeps some control state after the migration");
    }
}

#[async_trait]
impl LeaseStore for PartitionedLeaseStore {
    async fn enqueue_all(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        crate::job::validate_batch(&jobs, self.max_payload_bytes)?;
        let p = self.parts.len();
        for job in &jobs {
            // A named scope must live where the group does, or its turns would be kept in two
            // partitions (two live leases on one scope). A unique or debounce key is kept in
            // the group's partition, as a scope's job keeps it in the scope's: per partition.
            if let (Some(group), Some(scope)) = (&job.group, &job.scope) {
                if partition_of(group, p) != partition_of(scope.as_str(), p) {
                    return Err(Error::InvalidJob(format!(
                        "group {group:?} and scope {scope} live in different partitions of {p}: \
                         a grouped job's named scope must hash to its group's partition \
                         (`palisade::store::partitioned::partition_of`)"
                    )));
                }
            }
        }
        let mut batches: Vec<(Vec<usize>, Vec<NewJob>)> =
            vec![Default::default(); self.parts.len()];
        for (i, job) in jobs.into_iter().enumerate() {
            let (at, batch) = &mut batches[self.place(&job)];
            at.push(i);
            batch.push(job);
        }
        let total: usize = batches.iter().map(|(at, _)| at.len()).sum();
        let spans = batches.iter().filter(|(at, _)| !at.is_empty()).count();
        let sent = batches
            .into_iter()
            .enumerate()
            .filter(|(_, (at, _))| !at.is_empty())
            .map(|(i, (at, batch))| async move {
                Ok::<_, Error>((at, self.parts[i].enqueue_all(batch).await?))
            });
        let mut out: Vec<Option<Enqueued>> = vec![None; total];
        let done = try_join_all(sent).await.map_err(|e| match e {
            // One partition's refusal is its own: say so rather than "nothing was changed".
            Error::Conflict(m) if spans > 1 => Error::Conflict(m.replace(
                "nothing was changed",
                &format!(
                    "nothing of its partition was changed (the batch spans {spans} partitions; \
                     the others may have taken their jobs)"
                ),
            )),
            e => e,
        })?;
        for (at, enqueued) in done {
            for (i, e) in at.into_iter().zip(enqueued) {
                out[i] = Some(e);
            }
        }
        out.into_iter()
            .map(|e| e.ok_or_else(|| Error::Backend("a partition answered too few jobs".into())))
            .collect()
    }

    async fn claim_kinds(
        &self,
        queue: &str,
        kinds: &[String],
        worker: &str,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Claim>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let request = ClaimRequest {
            queue: queue.to_owned(),
            kinds: kinds.to_vec(),
            worker: worker.to_owned(),
            n,
            ttl,
        };
        let start = self.claim_start(queue);
        self.claim_on(start, 0, &request, Vec::new(), None).await
    }

    /// The claim goes with the settlements its first partition owns (one round trip there,
    /// as on one server); the other partitions' settlements go to theirs at the same time.
    /// When the first partition has fewer jobs than asked, the rest are taken from the
    /// partitions after it as in [`claim_kinds`](LeaseStore::claim_kinds), one round trip
    /// each — and the settlements' answer waits for that too (a near-empty queue on P
    /// partitions: up to P − 1 round trips later than a settlement sent alone).
    async fn settle_and_claim(
        &self,
        settlements: Vec<(LeaseId, Settlement)>,
        claim: &ClaimRequest,
    ) -> (Result<Vec<Result<()>>>, Result<Vec<Claim>>) {
        if claim.n == 0 {
            return (self.settle(settlements).await, Ok(Vec::new()));
        }
        let start = self.claim_start(&claim.queue);
        let (settled, first) = self.settle_routed(settlements, Some((start, claim))).await;
        let (claims, failed) = match first {
            Some(Ok(claims)) => (claims, None),
            Some(Err(e)) => {
                crate::repeats::warn_repeated!(key = start; partition = start, error = %e, "claim from a partition failed");
                (Vec::new(), Some(e))
            }
            None => (Vec::new(), None),
        };
        (
            settled,
            self.claim_on(start, 1, claim, claims, failed).await,
        )
    }

    async fn renew(&self, leases: &[LeaseId], ttl: Duration) -> Result<Vec<LeaseId>> {
        let p = self.parts.len();
        let mut routed: Vec<Vec<LeaseId>> = vec![Vec::new(); p];
        let mut unknown = Vec::new();
        {
            let owners = self.owners();
            for lease in leases {
                match owners.get(lease) {
                    Some(&i) => routed[i].push(*lease),
                    None => unknown.push(*lease),
                }
            }
        }
        // A partition that cannot answer has its leases reported lost (their handlers stop;
        // the jobs run again after expiry), so the others' renewals still count; only when
        // no partition answered does the whole call fail, to be retried.
        let asked: Vec<usize> = (0..p).filter(|&i| !routed[i].is_empty()).collect();
        let replies = join_all(asked.iter().map(|&i| self.parts[i].renew(&routed[i], ttl))).await;
        let mut lost = Vec::new();
        let mut failed = None;
        let mut answered = asked.is_empty();
        for (&i, reply) in asked.iter().zip(replies) {
            match reply {
                Ok(gone) => {
                    answered = true;
                    lost.extend(gone);
                }
                Err(e) => {
                    crate::repeats::warn_repeated!(key = i; partition = i, error = %e, "renewal failed; its leases count as lost");
                    lost.extend(routed[i].iter().copied());
                    failed.get_or_insert(e);
                }
            }
        }
        if let (Some(e), false) = (failed, answered) {
            return Err(e);
        }
        if !unknown.is_empty() {
            // Offered to every partition: lost only where none of them renewed it.
            let replies = self.on_all(|part| {
                let unknown = unknown.clone();
                async move { part.renew(&unknown, ttl).await }
            });
            let replies = replies.await?;
            lost.extend(
                unknown
                    .iter()
                    .filter(|l| replies.iter().all(|lost| lost.contains(l))),
            );
        }
        let mut owners = self.owners();
        for lease in &lost {
            owners.remove(lease);
        }
        Ok(lost)
    }

    async fn settle(&self, settlements: Vec<(LeaseId, Settlement)>) -> Result<Vec<Result<()>>> {
        self.settle_routed(settlements, None).await.0
    }

    fn watermark(&self) -> Option<FencingToken> {
        self.parts
            .iter()
            .map(|part| part.watermark())
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .min()
    }

    /// Each partition keeps the follow-ups of the completions it accepted. Taken in turns
    /// (the oldest of each, then the next of each, ...), so sets one partition cannot
    /// deliver do not starve the others'; a partition that cannot answer is skipped while
    /// another one answers.
    async fn follow_ups(&self, older_than: Duration, max: usize) -> Result<Vec<FollowUps>> {
        let answers = join_all(
            self.parts
                .iter()
                .map(|part| part.follow_ups(older_than, max)),
        )
        .await;
        let mut lists = Vec::new();
        let mut failed = None;
        for answer in answers {
            match answer {
                Ok(list) => lists.push(list.into_iter()),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let (true, Some(e)) = (lists.is_empty(), failed) {
            return Err(e);
        }
        let mut all = Vec::new();
        while all.len() < max {
            let before = all.len();
            all.extend(lists.iter_mut().filter_map(Iterator::next));
            if all.len() == before {
                break;
            }
        }
        all.truncate(max);
        Ok(all)
    }

    /// Asked of every partition (a parent's partition is not known from its id); done
    /// where it is kept even if another partition cannot answer.
    async fn forget_follow_ups(&self, parent: JobId) -> Result<()> {
        let answers = join_all(self.parts.iter().map(|part| part.forget_follow_ups(parent))).await;
        match answers.iter().any(Result::is_ok) {
            true => Ok(()),
            false => answers
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), Err),
        }
    }

    async fn reap(&self, max: usize) -> Result<Vec<Reaped>> {
        let reaped = self
            .on_all(|part| async move {
                let reaped = part.reap(max).await?;
                // A partition publishes its watermark in settle replies only: one that settles
                // nothing (idle, or no scope hashes there) would hold the lowest watermark
                // back for good. A settlement of a lease nobody holds changes nothing and is
                // answered with the partition's watermark.
                let _ = part
                    .settle(vec![(LeaseId::new(), Settlement::Release)])
                    .await;
                Ok(reaped)
            })
            .await?;
        Ok(reaped.concat())
    }

    async fn highest_token(&self, scope: &Scope) -> Result<Option<FencingToken>> {
        if scope.job().is_none() {
            return self.parts[partition_of(scope.as_str(), self.parts.len())]
                .highest_token(scope)
                .await;
        }
        // A job's default scope is not placed by its hash: ask every partition.
        let all = self
            .on_all(|part| async move { part.highest_token(scope).await })
            .await?;
        Ok(all.into_iter().flatten().max())
    }

    /// The highest epoch of any partition.
    async fn epoch(&self) -> Result<Option<u32>> {
        let all = self
            .on_all(|part| async move { part.epoch().await })
            .await?;
        Ok(all.into_iter().flatten().max())
    }

    /// Raises every partition.
    async fn raise_epoch(&self, at_least: u32) -> Result<u32> {
        let all = self
            .on_all(|part| async move { part.raise_epoch(at_least).await })
            .await?;
        Ok(all.into_iter().min().unwrap_or(at_least))
    }
}

/// The partitioned layout as one coordinator: its hot path, views and queue controls fan
/// out over the partitions; the clock, roles, schedules and records are partition 0's.
/// Records live in partition 0, but a result is kept with its job's completion, in the job's
/// partition: it is looked for in every partition.
#[async_trait]
impl RecordStore for PartitionedLeaseStore {
    async fn put_result(&self, job: JobId, json: String, ttl: Duration) -> Result<()> {
        self.parts[0].put_result(job, json, ttl).await
    }
    /// Found wherever it is kept: a partition that cannot answer fails the lookup only when
    /// no other partition has the result.
    async fn result(&self, job: JobId) -> Result<Option<String>> {
        let answers = join_all(self.parts.iter().map(|part| part.result(job))).await;
        let mut failed = None;
        for answer in answers {
            match answer {
                Ok(Some(json)) => return Ok(Some(json)),
                Ok(None) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(None), Err)
    }
    async fn put_progress(&self, job: JobId, json: String) -> Result<()> {
        self.parts[0].put_progress(job, json).await
    }
    async fn progress(&self, job: JobId) -> Result<Option<String>> {
        self.parts[0].progress(job).await
    }
    async fn note_rejections(&self, notes: Vec<RejectionNote>) -> Result<()> {
        self.parts[0].note_rejections(notes).await
    }
    async fn rejections(&self, limit: usize) -> Result<Vec<RejectionNote>> {
        self.parts[0].rejections(limit).await
    }
    async fn complete_waitpoint(&self, id: &str, value: String) -> Result<Completion> {
        self.parts[0].complete_waitpoint(id, value).await
    }
    async fn await_waitpoint(&self, id: &str, waiter: JobId) -> Result<Option<String>> {
        self.parts[0].await_waitpoint(id, waiter).await
    }
    async fn waitpoint(&self, id: &str) -> Result<Option<Waitpoint>> {
        self.parts[0].waitpoint(id).await
    }
}

impl PartitionedLeaseStore {
    /// The partition a flow step's job is kept in (where [`place`](Self::place) puts it).
    fn route(&self, release: &crate::flow::Release) -> usize {
        let p = self.parts.len();
        match &release.scope {
            Some(scope) => partition_of(scope.as_str(), p),
            None => partition_of(&format!("id:{}", release.job), p),
        }
    }

    /// A flow's home.
    fn home(&self, flow: crate::ids::FlowId) -> &Stores {
        &self.parts[partition_of(&format!("flow:{flow}"), self.parts.len())]
    }

    /// `items` split by partition.
    fn split<T>(&self, items: Vec<T>, at: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
        let mut parts: Vec<Vec<T>> = (0..self.parts.len()).map(|_| Vec::new()).collect();
        for item in items {
            let i = at(&item);
            parts[i].push(item);
        }
        parts
    }
}

#[async_trait]
impl FlowStore for PartitionedLeaseStore {
    async fn hold(&self, jobs: Vec<(NewJob, crate::flow::FlowStep)>) -> Result<()> {
        let parts = self.split(jobs, |(job, _)| self.place(job));
        try_join_all(
            parts
                .into_iter()
                .zip(&self.parts)
                .filter(|(jobs, _)| !jobs.is_empty())
                .map(|(jobs, part)| part.hold(jobs)),
        )
        .await?;
        Ok(())
    }
    async fn release(&self, releases: Vec<crate::flow::Release>) -> Result<Vec<JobId>> {
        let parts = self.split(releases, |r| self.route(r));
        let kept = try_join_all(
            parts
                .into_iter()
                .zip(&self.parts)
                .filter(|(releases, _)| !releases.is_empty())
                .map(|(releases, part)| part.release(releases)),
        )
        .await?;
        Ok(kept.into_iter().flatten().collect())
    }
    async fn step_ends(&self, max: usize) -> Result<Vec<crate::flow::StepEnded>> {
        let all = self
            .on_all(|part| async move { part.step_ends(max).await })
            .await?;
        Ok(all.into_iter().flatten().take(max).collect())
    }
    async fn forget_step_ends(&self, jobs: &[JobId]) -> Result<()> {
        self.on_all(|part| async move { part.forget_step_ends(jobs).await })
            .await?;
        Ok(())
    }
    async fn put_flow(
        &self,
        flow: &crate::flow::Flow,
    ) -> Result<(bool, Vec<crate::flow::Release>)> {
        self.home(flow.id()).put_flow(flow).await
    }
    async fn advance_flow(
        &self,
        flow: crate::ids::FlowId,
        ended: &[(String, crate::flow::StepEnd)],
        applied: &[String],
    ) -> Result<Vec<crate::flow::Release>> {
        self.home(flow).advance_flow(flow, ended, applied).await
    }
    async fn grow_flow(
        &self,
        flow: crate::ids::FlowId,
        step: &str,
        added: &[crate::flow::Step],
    ) -> Result<()> {
        self.home(flow).grow_flow(flow, step, added).await
    }
    async fn cancel_flow(
        &self,
        flow: crate::ids::FlowId,
    ) -> Result<Option<(Vec<crate::flow::Release>, Vec<JobId>)>> {
        self.home(flow).cancel_flow(flow).await
    }
    async fn held_jobs(
        &self,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<crate::flow::Release>> {
        let all = self
            .on_all(|part| async move { part.held_jobs(older_than, max).await })
            .await?;
        Ok(all.into_iter().flatten().collect())
    }
    async fn unreleased_flows(
        &self,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<crate::ids::FlowId>> {
        let all = self
            .on_all(|part| async move { part.unreleased_flows(older_than, max).await })
            .await?;
        Ok(all.into_iter().flatten().collect())
    }
    async fn flow(&self, id: crate::ids::FlowId) -> Result<Option<crate::flow::FlowStatus>> {
        self.home(id).flow(id).await
    }
    async fn keep_results(
        &self,
        flow: crate::ids::FlowId,
        results: &[(String, String)],
    ) -> Result<()> {
        self.home(flow).keep_results(flow, results).await
    }
    async fn step_result(&self, flow: crate::ids::FlowId, step: &str) -> Result<Option<String>> {
        self.home(flow).step_result(flow, step).await
    }
    async fn running_flows(&self, max: usize) -> Result<(u64, Vec<(crate::ids::FlowId, u64)>)> {
        let all = self
            .on_all(|part| async move { part.running_flows(max).await })
            .await?;
        let count = all.iter().map(|(n, _)| n).sum();
        // Oldest first across the partitions, not partition by partition.
        let mut listed: Vec<(crate::ids::FlowId, u64)> =
            all.into_iter().flat_map(|(_, listed)| listed).collect();
        listed.sort_by_key(|(id, created)| (*created, *id));
        listed.truncate(max);
        Ok((count, listed))
    }

    async fn flow_steps(&self, id: crate::ids::FlowId) -> Result<Vec<crate::flow::StepStatus>> {
        self.home(id).flow_steps(id).await
    }

    async fn flows_created(&self) -> Result<Option<u64>> {
        let all = self
            .on_all(|part| async move { part.flows_created().await })
            .await?;
        Ok(all.into_iter().flatten().reduce(|a, b| a + b))
    }
}

impl From<PartitionedLeaseStore> for Stores {
    fn from(store: PartitionedLeaseStore) -> Self {
        let control = store.parts[0].clone();
        let store = Arc::new(store);
        control
            .with_lease_store(store.clone())
            .with_flows(store.clone())
            .with_records(store.clone())
            .with_queues(store.clone(), store)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn shares_add_up_and_never_drop_to_zero() {
        assert_eq!(shares(10, 3), vec![4, 3, 3]);
        assert_eq!(shares(2, 3), vec![1, 1, 1]);
        assert_eq!(shares(u32::MAX, 1), vec![u32::MAX]);
        for total in 1..50 {
            for p in 1..10 {
                assert_eq!(shares(total, p).iter().sum::<u32>(), total.max(p as u32));
            }
        }
    }

    #[test]
    fn a_scope_always_maps_to_one_partition() {
        assert_eq!(partition_of("account:42", 7), partition_of("account:42", 7));
        assert_eq!(partition_of("anything", 1), 0);
        let hit: BTreeSet<usize> = (0..100)
            .map(|i| partition_of(&format!("s{i}"), 4))
            .collect();
        assert_eq!(hit.len(), 4, "scopes spread over every partition");
    }
}
