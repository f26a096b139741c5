//! In-memory backends: the embedded default and a unit-test tool.
//!
//! Each store keeps all of its state behind one `std::sync::Mutex` — not a Tokio mutex,
//! because no `.await` happens while it is held — so every trait method is one critical
//! section, the in-memory equivalent of one Lua script. Time is `tokio::time::Instant`, so
//! tests drive lease expiry with `tokio::time::pause()` / `advance()`.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::admission::{Admission, Fence, Rejection, ScopeFence};
use crate::error::{Error, Result};
use crate::ids::{FencingToken, JobId, Lease, LeaseId, Scope};
use crate::job::{Claim, DeadJob, Job, NewJob, QueueCounts, Settlement, DEFAULT_MAX_PAYLOAD_BYTES};
use crate::mutation::{apply_all, Value};
use crate::policy::{on_stall, StallOutcome};
use crate::store::{FencedStore, FencedWrite, LeaseInfo, LeaseStore, Reaped};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave half a critical section behind (every
    // method validates before it mutates), so a poisoned lock is still consistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// In-memory [`LeaseStore`].
#[derive(Debug)]
pub struct MemoryLeaseStore {
    state: Mutex<LeaseState>,
    max_payload_bytes: usize,
}

#[derive(Debug, Default)]
struct LeaseState {
    epoch: u32,
    seq: u64,
    /// Jobs not yet completed or dead; where each one waits is in its queue's sets or `leases`.
    jobs: HashMap<JobId, Job>,
    queues: HashMap<String, QueueState>,
    scopes: HashMap<Scope, ScopeState>,
    /// Jobs scoped to their own id: their scope state goes when they do, or a long-running
    /// embedded coordinator would keep one entry per job it ever ran.
    own_scope: HashSet<JobId>,
    leases: HashMap<LeaseId, LeaseRecord>,
    expiries: BTreeSet<(Instant, LeaseId)>,
}

type ReadyKey = (Reverse<i32>, u64, JobId);
type DelayedKey = (Instant, u64, JobId);

#[derive(Debug, Default)]
struct QueueState {
    ready: BTreeSet<ReadyKey>,
    delayed: BTreeSet<DelayedKey>,
    priority: HashMap<JobId, i32>,
    leased: u64,
    completed: u64,
    dead: Vec<DeadJob>,
}

#[derive(Debug, Default)]
struct ScopeState {
    last: Option<FencingToken>,
    live: Option<LeaseId>,
}

#[derive(Debug)]
struct LeaseRecord {
    job: JobId,
    expires_at: Instant,
    claimed_at: Instant,
    worker: String,
    token: FencingToken,
}

impl Default for MemoryLeaseStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryLeaseStore {
    /// An empty store in epoch 0.
    pub fn new() -> Self {
        Self::with_epoch(0)
    }

    /// An empty store that grants tokens from `epoch` on (a restarted embedded coordinator
    /// that knows the epoch it used before must start above it).
    pub fn with_epoch(epoch: u32) -> Self {
        Self {
            state: Mutex::new(LeaseState {
                epoch,
                ..LeaseState::default()
            }),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }

    /// Caps encoded payload size at enqueue.
    pub fn with_max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }
}

impl LeaseState {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Puts a job where it belongs for its next claim.
    fn park(&mut self, id: JobId, at: Instant, now: Instant) {
        let seq = self.next_seq();
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let queue = self.queues.entry(job.queue.clone()).or_default();
        if at <= now {
            let priority = queue.priority.get(&id).copied().unwrap_or_default();
            queue.ready.insert((Reverse(priority), seq, id));
        } else {
            queue.delayed.insert((at, seq, id));
        }
    }

    fn promote_due(&mut self, queue: &str, now: Instant) {
        let Some(q) = self.queues.get_mut(queue) else {
            return;
        };
        let due: Vec<DelayedKey> = q
            .delayed
            .range(..=(now, u64::MAX, JobId::from(uuid::Uuid::max())))
            .copied()
            .collect();
        for key in due {
            q.delayed.remove(&key);
            let id = key.2;
            let priority = q.priority.get(&id).copied().unwrap_or_default();
            q.ready.insert((Reverse(priority), key.1, id));
        }
    }

    /// The scope's next token, moving to a new epoch rather than wrapping the counter.
    fn mint(&mut self, scope: &Scope) -> FencingToken {
        let last = self.scopes.get(scope).and_then(|s| s.last);
        let token = match last {
            None => FencingToken::new(self.epoch, 1),
            Some(last) => match last.successor(self.epoch) {
                Some(token) => token,
                None => {
                    self.epoch = self.epoch.max(last.epoch()) + 1;
                    FencingToken::new(self.epoch, 1)
                }
            },
        };
        self.scopes.entry(scope.clone()).or_default().last = Some(token);
        token
    }

    /// Removes a current lease, returning its job id, or `None` if `lease` is not current.
    fn take_current(&mut self, lease: LeaseId, now: Instant) -> Option<JobId> {
        let record = self.leases.get(&lease)?;
        if record.expires_at <= now {
            return None;
        }
        let record = self.leases.remove(&lease)?;
        self.expiries.remove(&(record.expires_at, lease));
        let job = self.jobs.get(&record.job)?;
        if let Some(scope) = self.scopes.get_mut(&job.scope) {
            if scope.live == Some(lease) {
                scope.live = None;
            }
        }
        if let Some(q) = self.queues.get_mut(&job.queue) {
            q.leased = q.leased.saturating_sub(1);
        }
        Some(record.job)
    }

    /// The job completed: nothing will be granted on its own scope again. (A dead job keeps
    /// its scope state: `retry_dead` may bring it back, and its next token must still be
    /// higher than the last.)
    fn forget_scope(&mut self, id: JobId, scope: &Scope) {
        if self.own_scope.remove(&id) {
            self.scopes.remove(scope);
        }
    }

    fn bury(&mut self, id: JobId, reason: String) {
        if let Some(job) = self.jobs.remove(&id) {
            let q = self.queues.entry(job.queue.clone()).or_default();
            q.priority.remove(&id);
            q.dead.push(DeadJob { job, reason });
        }
    }
}

#[async_trait]
impl LeaseStore for MemoryLeaseStore {
    async fn enqueue(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>> {
        for job in &jobs {
            job.validate(self.max_payload_bytes)?;
        }
        let now = Instant::now();
        let mut state = lock(&self.state);
        let mut ids = Vec::with_capacity(jobs.len());
        for new in jobs {
            let id = JobId::new();
            if new.scope.is_none() {
                state.own_scope.insert(id);
            }
            let job = Job {
                id,
                scope: new.scope.unwrap_or_else(|| Scope::new(id.to_string())),
                queue: new.queue,
                kind: new.kind,
                payload: new.payload,
                attempt: 0,
                stalls: 0,
                max_attempts: new.max_attempts,
                max_stalls: new.max_stalls,
            };
            let queue = state.queues.entry(job.queue.clone()).or_default();
            queue.priority.insert(id, new.priority);
            state.jobs.insert(id, job);
            state.park(id, now + new.delay, now);
            ids.push(id);
        }
        Ok(ids)
    }

    async fn claim(
        &self,
        queue: &str,
        worker: &str,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Claim>> {
        let now = Instant::now();
        let expires_at = now + ttl;
        let mut state = lock(&self.state);
        state.promote_due(queue, now);
        let Some(q) = state.queues.get(queue) else {
            return Ok(Vec::new());
        };
        // Pick first, mutate after: skipping a busy scope must not disturb queue order.
        let mut picked = Vec::new();
        let mut scopes_taken = BTreeSet::new();
        for key in &q.ready {
            if picked.len() == n {
                break;
            }
            let scope = &state.jobs[&key.2].scope;
            let busy = state.scopes.get(scope).is_some_and(|s| s.live.is_some());
            if !busy && scopes_taken.insert(scope.clone()) {
                picked.push(*key);
            }
        }
        let mut claims = Vec::with_capacity(picked.len());
        for key in picked {
            let id = key.2;
            let lease_id = LeaseId::new();
            let scope = state.jobs[&id].scope.clone();
            let token = state.mint(&scope);
            state.scopes.entry(scope.clone()).or_default().live = Some(lease_id);
            state.leases.insert(
                lease_id,
                LeaseRecord {
                    job: id,
                    expires_at,
                    claimed_at: now,
                    worker: worker.to_owned(),
                    token,
                },
            );
            state.expiries.insert((expires_at, lease_id));
            let q = state.queues.get_mut(queue).expect("queue exists");
            q.ready.remove(&key);
            q.leased += 1;
            let job = state.jobs.get_mut(&id).expect("picked job exists");
            job.attempt += 1;
            claims.push(Claim {
                job: job.clone(),
                lease: Lease {
                    id: lease_id,
                    token,
                    scope,
                    expires_at,
                },
            });
        }
        Ok(claims)
    }

    async fn renew(&self, leases: &[LeaseId], ttl: Duration) -> Result<Vec<LeaseId>> {
        let now = Instant::now();
        let mut state = lock(&self.state);
        let mut lost = Vec::new();
        for lease in leases {
            match state.leases.get_mut(lease) {
                Some(record) if record.expires_at > now => {
                    let old = (record.expires_at, *lease);
                    record.expires_at = now + ttl;
                    state.expiries.remove(&old);
                    state.expiries.insert((now + ttl, *lease));
                }
                _ => lost.push(*lease),
            }
        }
        Ok(lost)
    }

    async fn settle(&self, settlements: Vec<(LeaseId, Settlement)>) -> Result<Vec<Result<()>>> {
        let now = Instant::now();
        let mut state = lock(&self.state);
        let mut results = Vec::with_capacity(settlements.len());
        for (lease, settlement) in settlements {
            let Some(id) = state.take_current(lease, now) else {
                results.push(Err(Error::LeaseNotCurrent(lease)));
                continue;
            };
            match settlement {
                Settlement::Complete => {
                    if let Some(job) = state.jobs.remove(&id) {
                        state.forget_scope(id, &job.scope);
                        let q = state.queues.entry(job.queue).or_default();
                        q.priority.remove(&id);
                        q.completed += 1;
                    }
                }
                Settlement::Retry { delay, .. } => state.park(id, now + delay, now),
                Settlement::Dead { reason } => state.bury(id, reason),
                Settlement::Fenced { highest, .. } => {
                    // Grant above the sink from now on: the next token of every scope is in
                    // a newer epoch than anything the sink has seen.
                    state.epoch = state.epoch.max(highest.epoch() + 1);
                    state.park(id, now, now);
                }
            }
            results.push(Ok(()));
        }
        Ok(results)
    }

    async fn reap(&self, max: usize) -> Result<Vec<Reaped>> {
        let now = Instant::now();
        let mut state = lock(&self.state);
        let expired: Vec<(Instant, LeaseId)> = state
            .expiries
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(max)
            .copied()
            .collect();
        let mut reaped = Vec::with_capacity(expired.len());
        for (at, lease) in expired {
            state.expiries.remove(&(at, lease));
            let Some(record) = state.leases.remove(&lease) else {
                continue;
            };
            let Some(job) = state.jobs.get_mut(&record.job) else {
                continue;
            };
            job.stalls += 1;
            let (queue, scope) = (job.queue.clone(), job.scope.clone());
            let outcome = on_stall(job.stalls, job.max_stalls);
            if let Some(s) = state.scopes.get_mut(&scope) {
                if s.live == Some(lease) {
                    s.live = None;
                }
            }
            if let Some(q) = state.queues.get_mut(&queue) {
                q.leased = q.leased.saturating_sub(1);
            }
            let dead = match outcome {
                StallOutcome::Requeue => {
                    state.park(record.job, now, now);
                    false
                }
                StallOutcome::Dead(reason) => {
                    state.bury(record.job, reason);
                    true
                }
            };
            reaped.push(Reaped {
                job: record.job,
                queue,
                dead,
            });
        }
        Ok(reaped)
    }

    async fn counts(&self, queue: &str) -> Result<QueueCounts> {
        let now = Instant::now();
        let mut state = lock(&self.state);
        state.promote_due(queue, now);
        Ok(state
            .queues
            .get(queue)
            .map(|q| QueueCounts {
                ready: q.ready.len() as u64,
                delayed: q.delayed.len() as u64,
                leased: q.leased,
                completed: q.completed,
                dead: q.dead.len() as u64,
            })
            .unwrap_or_default())
    }

    async fn dead(&self, queue: &str, limit: usize) -> Result<Vec<DeadJob>> {
        let state = lock(&self.state);
        Ok(state
            .queues
            .get(queue)
            .map(|q| q.dead.iter().take(limit).cloned().collect())
            .unwrap_or_default())
    }

    async fn highest_token(&self, scope: &Scope) -> Result<Option<FencingToken>> {
        Ok(lock(&self.state).scopes.get(scope).and_then(|s| s.last))
    }

    async fn queues(&self) -> Result<Vec<String>> {
        let mut queues: Vec<String> = lock(&self.state).queues.keys().cloned().collect();
        queues.sort();
        Ok(queues)
    }

    async fn leases(&self, limit: usize) -> Result<Vec<LeaseInfo>> {
        let now = Instant::now();
        let state = lock(&self.state);
        Ok(state
            .expiries
            .iter()
            .take(limit)
            .filter_map(|(_, id)| {
                let record = state.leases.get(id)?;
                Some(LeaseInfo {
                    lease: *id,
                    job: record.job,
                    scope: state.jobs.get(&record.job)?.scope.clone(),
                    token: record.token,
                    worker: record.worker.clone(),
                    age: now.saturating_duration_since(record.claimed_at),
                    expires_in: record.expires_at.saturating_duration_since(now),
                })
            })
            .collect())
    }

    async fn retry_dead(&self, queue: &str, limit: usize) -> Result<usize> {
        let now = Instant::now();
        let mut state = lock(&self.state);
        let revived: Vec<DeadJob> = match state.queues.get_mut(queue) {
            Some(q) => {
                let n = limit.min(q.dead.len());
                q.dead.drain(..n).collect()
            }
            None => return Ok(0),
        };
        let count = revived.len();
        for DeadJob { mut job, .. } in revived {
            let id = job.id;
            job.attempt = 0;
            job.stalls = 0;
            state.jobs.insert(id, job);
            state.park(id, now, now);
        }
        Ok(count)
    }
}

/// In-memory [`FencedStore`].
#[derive(Debug, Default)]
pub struct MemoryFencedStore {
    state: Mutex<SinkState>,
}

#[derive(Debug, Default)]
struct SinkState {
    fences: HashMap<crate::ids::Scope, ScopeFence>,
    data: HashMap<String, Value>,
}

impl MemoryFencedStore {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl FencedStore for MemoryFencedStore {
    async fn write(&self, write: FencedWrite) -> Result<Admission> {
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let fence = state.fences.entry(write.scope).or_default();
        if fence.decide(write.fence, &write.key) == Admission::Applied {
            // Applied whole or not at all; a refusal leaves the fence and keys untouched.
            if let Err(why) = apply_all(&mut state.data, write.mutations) {
                return Ok(Admission::Rejected(Rejection::Mutation { why }));
            }
        }
        Ok(fence.admit(write.fence, &write.key))
    }

    async fn read(&self, key: &str) -> Result<Option<Value>> {
        Ok(lock(&self.state).data.get(key).cloned())
    }

    async fn highest(&self, scope: &Scope) -> Result<Option<Fence>> {
        Ok(lock(&self.state).fences.get(scope).and_then(|f| f.highest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn completed_self_scoped_jobs_leave_no_scope_state_behind() {
        let store = MemoryLeaseStore::new();
        let jobs = (0..100).map(|_| NewJob::raw("k", "null")).collect();
        store.enqueue(jobs).await.unwrap();
        store
            .enqueue(vec![NewJob::raw("k", "null").with_scope("account:1")])
            .await
            .unwrap();
        let claims = store
            .claim("default", "w", 200, Duration::from_secs(5))
            .await
            .unwrap();
        let done = claims
            .iter()
            .map(|c| (c.lease.id, Settlement::Complete))
            .collect();
        store.settle(done).await.unwrap();
        let state = lock(&store.state);
        assert_eq!(state.scopes.len(), 1, "only the shared scope remains");
        assert!(state.own_scope.is_empty());
    }
}
