//! In-memory backends: the embedded default and a unit-test tool.
//!
//! Each store keeps all of its state behind one `std::sync::Mutex` — not a Tokio mutex,
//! because no `.await` happens while it is held — so every trait method is one critical
//! section, the in-memory equivalent of one Lua script. Time is `tokio::time::Instant`, so
//! tests drive lease expiry with `tokio::time::pause()` / `advance()`.
//!
//! The lease store mirrors the Redis scripts step for step (the differential property test
//! runs both on the same histories): tokens come from one counter per coordinator, a shared
//! scope lets one job at a time be ready or leased (its *head*) while its other jobs wait
//! aside, and delayed jobs become ready in bounded batches.
//!
//! This file holds the lease store's state and its hot path; `admin.rs` its read-only views and
//! queue controls, `control.rs` its clock, roles, schedules and records, `sink.rs` the fenced
//! sink.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

// The store's maps are hashed with foldhash, not std's SipHash: SipHash was a large share of
// the embedded coordinator's instructions per job (docs/performance.md, settings the code
// cites). foldhash is seeded per process, but it does not claim to withstand a deliberate
// hash-flooding attack: the embedded coordinator's keys (job ids, scopes, unique keys) come
// from the application's own producers, not from strangers.
use foldhash::{HashMap, HashSet, HashSetExt};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::ids::{FencingToken, JobId, Lease, LeaseId, Scope};
use crate::job::{
    clip_error, Attempt, AttemptOutcome, Claim, CompletedJob, CompletedRetention, DeadJob,
    Enqueued, FollowUps, Job, JobDetails, NewJob, RateLimit, Settlement, Then, DEBOUNCE_KEPT,
    DEFAULT_MAX_PAYLOAD_BYTES, MAX_ATTEMPTS_KEPT, MAX_DELAY,
};
use crate::policy::{on_stall, StallOutcome};
use crate::schedule::ScheduleSpec;
use crate::store::{
    promotions_per_claim, LeaseStore, Reaped, RejectionNote, DEFAULT_DEAD_RETENTION,
    MAX_DEAD_RETENTION,
};

mod admin;
mod control;
mod flows;
mod groups;
mod leases;
mod sink;

pub use sink::MemoryFencedStore;

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
    dead_retention: usize,
    completed_retention: CompletedRetention,
}

#[derive(Debug, Default)]
struct LeaseState {
    epoch: u32,
    /// The last counter granted in `epoch` (token = epoch << 40 | counter).
    counter: u64,
    seq: u64,
    /// Jobs not yet completed or dead; where each one waits is in its queue's sets, a
    /// scope's waiting set, or `leases`.
    jobs: HashMap<JobId, StoredJob>,
    queues: HashMap<String, QueueState>,
    /// Shared (named) scopes with work: state goes when the scope is idle, so memory is
    /// bounded by live work, not by scopes ever seen.
    scopes: HashMap<Scope, ScopeState>,
    /// Live leases, by expiry and by token (`leases.rs`).
    leases: leases::Leases,
    /// The low watermark published last (only grows).
    watermark: Option<FencingToken>,
    /// When each job not yet completed or dead was first claimable (due, if delayed).
    ready_at: HashMap<JobId, Instant>,
    /// Roles: holder and until when.
    roles: HashMap<String, (String, Instant)>,
    /// History samples, newest first.
    history: VecDeque<crate::store::HistorySample>,
    /// Why each live job's last attempt was retried.
    errors: HashMap<JobId, String>,
    /// Worker processes by name: their last beat and until when it holds.
    workers: HashMap<String, (crate::store::WorkerBeat, Instant)>,
    /// Fence rejections, newest first.
    rejections: VecDeque<RejectionNote>,
    /// Unique keys: the job holding each, and until when once that job is done (`None`
    /// while it is not).
    /// Each held key: its holder, when it lapses (`None` while the holder lives), and the
    /// fingerprint it was taken with (`UniqueKey::fingerprint`).
    unique: HashMap<String, (JobId, Option<Instant>, Option<String>)>,
    /// The unique key of each job that holds one, and when its ttl ends.
    job_unique: HashMap<JobId, (String, Instant)>,
    /// Keys of done jobs by the end of their ttl, to forget them then.
    unique_expiries: Expiries,
    /// Debounce keys: the job last enqueued under each, its latest start (its first
    /// enqueue's maximum wait), and when the key is forgotten ([`DEBOUNCE_KEPT`] past its due
    /// time, as on Redis).
    debounce: HashMap<String, (JobId, Instant, Instant)>,
    debounce_expiries: Expiries,
    /// Paused queues: claims from them hand out nothing.
    paused: BTreeSet<String>,
    /// Groups with limits, leases or parked rotations (`groups.rs`).
    groups: HashMap<String, groups::GroupState>,
    /// Twice the number of claims that looked at groups (rotation turns; `groups.rs`).
    turn: u64,
    /// Parked groups to look at again when their rate bucket holds a token (one time per
    /// group: a later one replaces it, as the Redis `gwake` set keeps it).
    wakes: BTreeSet<(Instant, String)>,
    wake_of: HashMap<String, Instant>,
    /// Rate-limited queues: the limit, the bucket's tokens and when they were counted.
    rates: HashMap<String, (RateLimit, f64, Instant)>,
    /// Kinds with a fleet-wide concurrency cap, and how many of each run under one.
    caps: HashMap<String, u32>,
    running: HashMap<String, u32>,
    /// Kept schedules by name, and how far each schedule has been handled.
    schedules: BTreeMap<String, ScheduleSpec>,
    schedule_marks: HashMap<String, i64>,
    paused_schedules: BTreeSet<String>,
    /// Waitpoints by id, with when each goes (`control.rs`), and their expiries.
    waitpoints: HashMap<String, (crate::store::Waitpoint, Instant)>,
    waitpoint_expiries: Expiries,
    /// Results and progress records by job, with when each goes; and their expiries in order.
    notes: HashMap<(JobId, bool), (String, Instant)>,
    /// Accepted completions' follow-up jobs not enqueued yet, and when they were kept.
    follow_ups: HashMap<JobId, (Instant, Vec<NewJob>, Vec<crate::flow::Flow>)>,
    note_expiries: BTreeSet<(Instant, JobId, bool)>,
    /// Flow steps' jobs written and not released yet, with their delays and when they were
    /// written (`flows.rs`).
    held: HashMap<JobId, (Duration, Instant)>,
    /// Flow steps' jobs that ended (or were skipped), until [`FLOW_RETENTION`](crate::flow::FLOW_RETENTION)
    /// after: a creation done again must not write them held again.
    ended_steps: HashMap<JobId, Instant>,
    /// Ends of flow steps not recorded at their flows' homes yet, in order.
    step_ends: BTreeMap<u64, crate::flow::StepEnded>,
    step_end_of: HashMap<JobId, u64>,
    /// Flows kept here (their home), with when their releases were last decided while some
    /// are unconfirmed, and when they finished.
    flows: HashMap<crate::ids::FlowId, flows::KeptFlow>,
    /// Flows ever kept here (`FlowStore::flows_created`).
    flows_created: u64,
    /// Completed jobs kept (`CompletedRetention`), each with the number of its entry in
    /// `completed_order`: their ids by when they completed, oldest first.
    completed: HashMap<JobId, (u64, CompletedJob)>,
    completed_order: VecDeque<(Instant, u64, JobId)>,
}

type ReadyKey = (Reverse<i32>, u64, JobId);
type DelayedKey = (Instant, u64, JobId);

#[derive(Debug, Default)]
struct QueueState {
    /// Ready jobs by kind, so a worker claims only kinds it has handlers for.
    ready: BTreeMap<String, BTreeSet<ReadyKey>>,
    delayed: BTreeSet<DelayedKey>,
    priority: HashMap<JobId, i32>,
    leased: u64,
    waiting: u64,
    completed: u64,
    /// Dead letters, oldest first, each with the priority it had (a retry from here keeps it).
    dead: VecDeque<(DeadJob, i32)>,
    /// Jobs cancelled (`cancel`), dead-lettered, enqueued, and stalls, ever.
    cancelled: u64,
    died: u64,
    enqueued: u64,
    stalled: u64,
    /// Ready jobs of groups and the groups' rotations (`groups.rs`).
    grouped: groups::Grouped,
}

impl QueueState {
    fn remove_ready(&mut self, kind: &str, key: &ReadyKey) {
        if let Some(set) = self.ready.get_mut(kind) {
            set.remove(key);
            if set.is_empty() {
                self.ready.remove(kind);
            }
        }
    }
}

#[derive(Debug, Default)]
struct ScopeState {
    /// The one job of the scope that may be ready or leased.
    head: Option<JobId>,
    /// Its lease while it has one.
    live: Option<LeaseId>,
    /// Newest token granted on the scope while it has had work without pause.
    last: Option<FencingToken>,
    /// The scope's other ready jobs, in ready order (each job's queue is in its record).
    waiting: BTreeSet<ReadyKey>,
}

/// A job as the store keeps it, with whether its scope is shared (named), decided once: the
/// test of a default scope parses a UUID, and a job's claim and completion asked it twice
/// (and read and hashed its scope twice more) for nothing.
#[derive(Debug)]
struct StoredJob {
    job: Job,
    shared: bool,
    /// Its priority, times and ended attempts (`view.lua`'s fields on Redis).
    details: JobDetails,
}

impl StoredJob {
    fn new(job: Job, priority: i32) -> Self {
        let shared = job.scope.job().is_none();
        let details = JobDetails {
            priority,
            enqueued_ms: Some(crate::store::unix_ms()),
            ..JobDetails::default()
        };
        Self {
            job,
            shared,
            details,
        }
    }

    /// Its attempt that ended now with `outcome`, kept in its history (the newest
    /// [`MAX_ATTEMPTS_KEPT`], as `note_try` in common.lua keeps them).
    fn note_try(&mut self, outcome: AttemptOutcome, error: &str) {
        let attempts = &mut self.details.attempts;
        attempts.push(Attempt {
            number: self.job.attempt,
            started_ms: self.details.started_ms,
            ended_ms: crate::store::unix_ms(),
            outcome,
            error: (!error.is_empty()).then(|| clip_error(error)),
        });
        if attempts.len() > MAX_ATTEMPTS_KEPT {
            attempts.drain(..attempts.len() - MAX_ATTEMPTS_KEPT);
        }
    }
}

// (Its scope never changes once kept, so `shared` stays true to it.)
impl std::ops::Deref for StoredJob {
    type Target = Job;

    fn deref(&self) -> &Job {
        &self.job
    }
}

impl std::ops::DerefMut for StoredJob {
    fn deref_mut(&mut self) -> &mut Job {
        &mut self.job
    }
}

#[derive(Debug)]
struct LeaseRecord {
    job: JobId,
    expires_at: Instant,
    claimed_at: Instant,
    /// (Shared by the leases of one claim: one allocation a claim, not a job.)
    worker: Arc<str>,
    token: FencingToken,
    /// The kind this lease counts against, if it had a concurrency cap when claimed.
    capped: Option<String>,
    /// The group whose running jobs it counts among (one with a cap when claimed).
    group: Option<String>,
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
                epoch: epoch.min(FencingToken::MAX_EPOCH),
                ..LeaseState::default()
            }),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            dead_retention: DEFAULT_DEAD_RETENTION,
            completed_retention: CompletedRetention::default(),
        }
    }

    /// The ids of every job not yet ended, in id order: for `palisade::testing`, whose
    /// assertions look at every waiting job (`Inspect::ready` lists no job waiting behind its
    /// scope's head).
    #[doc(hidden)]
    pub fn live_jobs(&self) -> Vec<JobId> {
        let mut ids: Vec<JobId> = lock(&self.state).jobs.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Caps encoded payload size at enqueue.
    pub fn with_max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Keeps at most `max` (clamped to 1..=[`MAX_DEAD_RETENTION`]) dead-lettered jobs per
    /// queue; the oldest go first.
    pub fn with_dead_retention(mut self, max: usize) -> Self {
        self.dead_retention = max.clamp(1, MAX_DEAD_RETENTION);
        self
    }

    /// Keeps completed jobs to be looked up by id ([`Inspect::completed`](crate::store::Inspect::completed))
    /// as `retention` says (by default a day's, at most 10,000).
    pub fn with_completed_retention(mut self, retention: CompletedRetention) -> Self {
        self.completed_retention = retention.clamped();
        self
    }
}

/// Ready jobs picked by a claim, with their kinds.
type Picks = Vec<(ReadyKey, String)>;

impl LeaseState {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The scope of `id` if other jobs may share it (a named scope). A default scope
    /// (`job:<id>`) is the job's alone, so it needs no turn-taking state.
    fn shared_scope(&self, id: JobId) -> Option<Scope> {
        let job = self.jobs.get(&id)?;
        job.shared.then(|| job.scope.clone())
    }

    /// Puts a job where it belongs for its next claim: ready now (if its scope's turn is
    /// free or already its own, else waiting aside), or delayed until `at` (giving up its
    /// scope's turn meanwhile).
    fn park(&mut self, id: JobId, at: Instant, now: Instant) {
        let seq = self.next_seq();
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let queue = job.queue.clone();
        // A job requeued after a stall or release keeps the time it first became ready.
        if at <= now {
            self.ready_at.entry(id).or_insert(at);
        } else {
            self.ready_at.insert(id, at);
        }
        if at <= now {
            let priority = self.queues.get(&queue).and_then(|q| q.priority.get(&id));
            let key = (Reverse(priority.copied().unwrap_or_default()), seq, id);
            self.enter(key);
        } else {
            self.leave(id);
            self.queues
                .entry(queue)
                .or_default()
                .delayed
                .insert((at, seq, id));
        }
    }

    /// A job becomes ready: into its queue, or aside if another job holds its scope's turn.
    fn enter(&mut self, key: ReadyKey) {
        let id = key.2;
        let queue = self.jobs[&id].queue.clone();
        if let Some(scope) = self.shared_scope(id) {
            let state = self.scopes.entry(scope).or_default();
            match state.head {
                Some(head) if head != id => {
                    state.waiting.insert(key);
                    self.queues.entry(queue).or_default().waiting += 1;
                    return;
                }
                _ => state.head = Some(id),
            }
        }
        self.ready(key);
    }

    /// Puts `key`'s job in its ready set: its kind's, or its group's.
    fn ready(&mut self, key: ReadyKey) {
        let job = &self.jobs[&key.2];
        let (queue, kind) = (job.queue.clone(), job.kind.clone());
        match job.group.clone() {
            Some(group) => self.ready_grouped(&queue, &kind, &group, key),
            None => {
                let q = self.queues.entry(queue).or_default();
                q.ready.entry(kind).or_default().insert(key);
            }
        }
    }

    /// Where job `id` is ready (a linear search of its set: for an operator's cancel).
    fn ready_key_of(&self, id: JobId) -> Option<ReadyKey> {
        let job = self.jobs.get(&id)?;
        let q = self.queues.get(&job.queue)?;
        let set = match &job.group {
            Some(group) => q.grouped.ready.get(&(job.kind.clone(), group.clone())),
            None => q.ready.get(&job.kind),
        };
        set?.iter().find(|k| k.2 == id).copied()
    }

    /// Takes `key`'s job out of its ready set (claimed, set aside, cancelled).
    fn unready(&mut self, queue: &str, kind: &str, key: &ReadyKey) {
        match self.jobs.get(&key.2).and_then(|j| j.group.clone()) {
            Some(group) => self.unready_grouped(queue, kind, &group, key),
            None => {
                if let Some(q) = self.queues.get_mut(queue) {
                    q.remove_ready(kind, key);
                }
            }
        }
    }

    /// `id` gives up its scope's turn (completed, dead, or delayed): the scope's first
    /// waiting job becomes ready, or the idle scope's state goes.
    fn leave(&mut self, id: JobId) {
        let Some(scope) = self.shared_scope(id) else {
            return;
        };
        let Some(state) = self.scopes.get_mut(&scope) else {
            return;
        };
        if state.head != Some(id) {
            return;
        }
        match state.waiting.pop_first() {
            Some(key) => {
                state.head = Some(key.2);
                let queue = self.jobs[&key.2].queue.clone();
                self.queues.entry(queue).or_default().waiting -= 1;
                self.ready(key);
            }
            None => {
                state.head = None;
                if state.live.is_none() {
                    self.scopes.remove(&scope);
                }
            }
        }
    }

    /// Moves at most `limit` due delayed jobs to ready, earliest first: bounded work per
    /// claim however many fell due at once.
    fn promote_due(&mut self, queue: &str, now: Instant, limit: usize) {
        let Some(q) = self.queues.get(queue) else {
            return;
        };
        let due: Vec<DelayedKey> = q
            .delayed
            .iter()
            .take_while(|(at, _, _)| *at <= now)
            .take(limit)
            .copied()
            .collect();
        for key in due {
            if let Some(q) = self.queues.get_mut(queue) {
                q.delayed.remove(&key);
            }
            self.park(key.2, key.0, now);
        }
    }

    /// The queue's rate bucket as of `now`, if it has a limit: the tokens in it and the time
    /// they are counted to — the same arithmetic as claim.lua, in whole milliseconds as Redis'
    /// clock gives them (`at` moves by what was credited).
    fn rate_bucket(&self, queue: &str, now: Instant) -> Option<(f64, Instant)> {
        self.rates.get(queue).map(|(limit, before, at)| {
            let per = limit.per.as_millis() as f64;
            let credited = now.saturating_duration_since(*at).as_millis() as u64;
            let tokens =
                (f64::from(limit.jobs)).min(before + credited as f64 * f64::from(limit.jobs) / per);
            (tokens, *at + Duration::from_millis(credited))
        })
    }

    /// Up to `n` ready jobs of `queue` to claim (of `kinds`, every kind when empty), the
    /// ones to set aside because their scope is held, and what the claim decided about the
    /// groups it looked at (`groups.rs`); `None` for a queue never seen.
    fn pick(
        &self,
        queue: &str,
        kinds: &[String],
        n: usize,
        now: Instant,
    ) -> Option<(Picks, Picks, groups::Plan, groups::Served)> {
        let q = self.queues.get(queue)?;
        // Only the kinds asked for (all when none are named): the first few of each kind's
        // ready set, merged in ready order — the same candidates the Redis script looks at.
        // (Kinds borrowed, not copied: a claim looks at 2n + 16 candidates a kind and takes
        // at most n, and copying each one's kind was a visible part of the embedded claim's
        // work: docs/performance-log.md.)
        let asked = |kind: &String| kinds.is_empty() || kinds.contains(kind);
        let mut ungrouped: Vec<(ReadyKey, &str)> = q
            .ready
            .iter()
            .filter(|(kind, _)| asked(kind))
            .flat_map(|(kind, set)| {
                set.iter()
                    .take(promotions_per_claim(n))
                    .map(move |key| (*key, kind.as_str()))
            })
            .collect();
        // (One kind's entries come in order already.)
        if q.ready.keys().filter(|kind| asked(kind)).nth(1).is_some() {
            ungrouped.sort();
        }
        // How many more of each capped kind may start (as in claim.lua).
        let mut room: HashMap<String, i64> = self
            .caps
            .iter()
            .map(|(kind, cap)| {
                let running = self.running.get(kind).copied().unwrap_or(0);
                (kind.clone(), i64::from(*cap) - i64::from(running))
            })
            .collect();
        // Groups' lanes (group.rs): jobs without a group are one more lane, taken first in
        // each round; candidates go round by round. A kind at its cap offers none.
        let full = |kind: &str| room.get(kind).is_some_and(|r| *r <= 0);
        let mut plan = self.plan_groups(queue, kinds, n, !ungrouped.is_empty(), now, full);
        let offers = std::mem::take(&mut plan.offers);
        let mut left = std::mem::take(&mut plan.left);
        // (round, lane, key, kind, the lane's index in the plan)
        let mut candidates: Vec<(usize, usize, ReadyKey, &str, Option<usize>)> = ungrouped
            .into_iter()
            .enumerate()
            .map(|(round, (key, kind))| (round, 0, key, kind, None))
            .collect();
        // (Without groups' lanes the rounds are in order already.)
        let lanes = !offers.is_empty();
        for (lane, heads) in offers {
            let kind = plan.lanes[lane].kind.as_str();
            candidates.extend(
                heads
                    .into_iter()
                    .enumerate()
                    .map(|(round, key)| (round, lane + 1, key, kind, Some(lane))),
            );
        }
        if lanes {
            candidates.sort_by_key(|c| (c.0, c.1));
        }
        // Every ready job of a shared scope is its scope's head, so the first n candidates
        // are claimable. The check stays as a guard for invariant 3: a job whose scope is
        // held anyway waits aside instead of getting a second live lease.
        let mut picked = Vec::new();
        let mut aside = Vec::new();
        let mut taken = HashSet::new();
        let mut served = groups::Served::default();
        for (_, _, key, kind, lane) in candidates {
            if picked.len() == n {
                break;
            }
            if room.get(kind).is_some_and(|r| *r <= 0) {
                continue; // at its cap: stays ready
            }
            let group = lane.map(|i| plan.lanes[i].group.as_str());
            if group.is_some_and(|g| left.get(g).is_some_and(|l| *l == 0)) {
                continue; // its group has no room left in this claim (two kinds' lanes)
            }
            // (A default scope is its job's alone, and a job is one candidate at most.)
            let job = &self.jobs[&key.2];
            let held = |scope| self.scopes.get(scope).is_some_and(|s| s.live.is_some());
            if job.shared && (held(&job.scope) || !taken.insert(&job.scope)) {
                aside.push((key, kind.to_owned()));
            } else {
                if let Some(r) = room.get_mut(kind) {
                    *r -= 1;
                }
                if let (Some(i), Some(g)) = (lane, group) {
                    *served.started.entry(i).or_default() += 1;
                    if let Some(l) = left.get_mut(g) {
                        *l -= 1;
                    }
                }
                picked.push((key, kind.to_owned()));
            }
        }
        Some((picked, aside, plan, served))
    }

    /// Moves ready jobs whose scope is held out of `queue`'s ready sets, to wait for it.
    fn set_aside(&mut self, queue: &str, aside: Picks) {
        for (key, kind) in aside {
            self.unready(queue, &kind, &key);
            let q = self.queues.get_mut(queue).expect("queue exists");
            q.waiting += 1;
            let scope = self.jobs[&key.2].scope.clone();
            let s = self.scopes.entry(scope).or_default();
            s.waiting.insert(key);
        }
    }

    /// Grants the ready job `key` of `queue` a fresh lease with `token` until `expires_at`.
    #[allow(clippy::too_many_arguments)] // one claim's facts; a struct for them would be read once
    fn grant(
        &mut self,
        queue: &str,
        key: ReadyKey,
        kind: &str,
        token: FencingToken,
        worker: &Arc<str>,
        now: Instant,
        expires_at: Instant,
    ) -> Claim {
        let id = key.2;
        let lease_id = LeaseId::new();
        if let Some(scope) = self.shared_scope(id) {
            let s = self.scopes.entry(scope).or_default();
            s.head = Some(id);
            s.live = Some(lease_id);
            s.last = Some(token);
        }
        let capped = self.caps.contains_key(kind).then(|| kind.to_owned());
        if let Some(kind) = &capped {
            *self.running.entry(kind.clone()).or_default() += 1;
        }
        // (A group with a cap counts its running jobs; the lease says so, to give it back.)
        let group = self.jobs[&id]
            .group
            .clone()
            .filter(|g| self.groups.get(g).is_some_and(|s| s.limits.cap.is_some()));
        if let Some(group) = &group {
            self.group_started(group);
        }
        self.unready(queue, kind, &key);
        self.leases.insert(
            lease_id,
            LeaseRecord {
                job: id,
                expires_at,
                claimed_at: now,
                worker: worker.clone(),
                token,
                capped,
                group,
            },
        );
        let q = self.queues.get_mut(queue).expect("queue exists");
        q.leased += 1;
        let job = self.jobs.get_mut(&id).expect("picked job exists");
        job.attempt += 1;
        job.details.started_ms = Some(crate::store::unix_ms());
        Claim {
            job: job.clone(),
            lease: Lease {
                id: lease_id,
                token,
                scope: job.scope.clone(),
                expires_at,
            },
        }
    }

    /// The next `n` tokens, one counter per coordinator; the counter never wraps — running
    /// out moves to the next epoch, and running out of epochs is an error before anything
    /// changed.
    fn mint(&mut self, n: usize) -> Result<Vec<FencingToken>> {
        let n = n as u64;
        let (mut epoch, mut counter) = (self.epoch, self.counter);
        if counter + n > FencingToken::MAX_COUNTER {
            if epoch >= FencingToken::MAX_EPOCH {
                return Err(Error::Epoch(format!(
                    "epoch {epoch} is the largest and its counter is spent"
                )));
            }
            (epoch, counter) = (epoch + 1, 0);
        }
        self.epoch = epoch;
        self.counter = counter + n;
        Ok((1..=n)
            .map(|i| FencingToken::new(epoch, counter + i))
            .collect())
    }

    /// Removes a current lease, returning its job id, or `None` if `lease` is not current.
    fn take_current(&mut self, lease: LeaseId, now: Instant) -> Option<JobId> {
        let record = self.leases.get(&lease)?;
        if record.expires_at <= now {
            return None;
        }
        let record = self.leases.remove(&lease)?;
        let id = record.job;
        self.drop_lease(lease, record, now);
        Some(id)
    }

    /// A lease is gone: its token leaves the watermark's reckoning, its scope is no longer
    /// held, its queue has one job fewer leased.
    fn drop_lease(&mut self, lease: LeaseId, record: LeaseRecord, now: Instant) {
        let id = record.job;
        if let Some(running) = record.capped.and_then(|kind| self.running.get_mut(&kind)) {
            *running = running.saturating_sub(1);
        }
        if let Some(group) = &record.group {
            self.group_ended(group, now);
        }
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        if let Some(scope) = self.scopes.get_mut(&job.scope) {
            if scope.live == Some(lease) {
                scope.live = None;
            }
        }
        if let Some(q) = self.queues.get_mut(&job.queue) {
            q.leased = q.leased.saturating_sub(1);
        }
    }

    /// The low watermark (ARCHITECTURE.md §5.3): the smallest live token, or the next token to grant
    /// when none is live; never lower than one published before.
    fn publish_watermark(&mut self) {
        // (Always in range: `mint` keeps the counter ≤ MAX_COUNTER. Were it not, 0 is the
        // one watermark that is always safe.)
        let next = FencingToken::watermark_at(u64::from(self.epoch), self.counter + 1)
            .unwrap_or(FencingToken::ZERO);
        let w = self.leases.lowest_token().unwrap_or(next);
        self.watermark = Some(self.watermark.map_or(w, |was| was.max(w)));
    }

    /// A done job (completed or dead) gives its unique key up: held until its ttl ends.
    fn release_unique(&mut self, id: JobId) {
        let Some((key, until)) = self.job_unique.remove(&id) else {
            return;
        };
        let now = crate::clock::now();
        match self.unique.get_mut(&key) {
            Some(held) if held.0 == id && until > now => {
                held.1 = Some(until);
                self.unique_expiries
                    .push(until, key, &self.unique, |held| held.1);
            }
            Some(held) if held.0 == id => {
                self.unique.remove(&key);
            }
            _ => {}
        }
    }

    /// Keeps a result (`true`) or progress record for `ttl`, forgetting expired ones.
    fn put_note(&mut self, job: JobId, result: bool, json: String, ttl: Duration) {
        let now = crate::clock::now();
        while let Some(&(at, id, kind)) = self.note_expiries.first() {
            if at > now {
                break;
            }
            self.note_expiries.pop_first();
            if self
                .notes
                .get(&(id, kind))
                .is_some_and(|(_, until)| *until == at)
            {
                self.notes.remove(&(id, kind));
            }
        }
        let until = now.checked_add(ttl).unwrap_or(now + MAX_DELAY);
        self.notes.insert((job, result), (json, until));
        self.note_expiries.insert((until, job, result));
    }

    fn note(&self, job: JobId, result: bool) -> Option<String> {
        let (json, until) = self.notes.get(&(job, result))?;
        (*until > crate::clock::now()).then(|| json.clone())
    }

    /// Forgets the unique keys whose ttl ended.
    fn forget_unique_keys(&mut self, now: Instant) {
        self.unique_expiries
            .forget_lapsed(&mut self.unique, now, |held| held.1);
    }

    /// Forgets the debounce keys whose time is up.
    fn forget_debounce_keys(&mut self, now: Instant) {
        self.debounce_expiries
            .forget_lapsed(&mut self.debounce, now, |held| Some(held.2));
    }

    /// The job holding debounce key `key` while it is pending — it waits out its quiet period
    /// and never started (delayed, no attempt, no snooze) — with its latest start and its
    /// place in the delayed set.
    fn pending_debounce(&self, key: &str) -> Option<(JobId, Instant, DelayedKey)> {
        let &(id, latest, _) = self.debounce.get(key)?;
        let job = self.jobs.get(&id)?;
        if job.attempt != 0 || job.snoozes != 0 {
            return None;
        }
        let at = *self.ready_at.get(&id)?;
        let first = (at, 0, JobId::from(uuid::Uuid::nil()));
        let place = self
            .queues
            .get(&job.queue)?
            .delayed
            .range(first..)
            .take_while(|k| k.0 == at)
            .find(|k| k.2 == id)?;
        Some((id, latest, *place))
    }

    /// Keeps debounce key `key` for job `id`, due at `due`, starting no later than `latest`.
    fn hold_debounce(&mut self, key: String, id: JobId, latest: Instant, due: Instant) {
        let until = due + DEBOUNCE_KEPT;
        // (A key held again until the same time — enqueues capped by their maximum wait —
        // has its entry in already: the heap keeps every push, where a set kept one.)
        let again = self.debounce.get(&key).map(|held| held.2) == Some(until);
        self.debounce.insert(key.clone(), (id, latest, until));
        if !again {
            self.debounce_expiries
                .push(until, key, &self.debounce, |held| Some(held.2));
        }
    }

    /// Keeps `new` as job `id` (its first attempt not made yet), nowhere a claim looks yet:
    /// the caller parks it (an enqueue) or holds it (a flow step). Returns what the caller
    /// still needs of it: its delay and unique key.
    fn insert_job(
        &mut self,
        id: JobId,
        new: NewJob,
        flow: Option<crate::flow::FlowStep>,
    ) -> (Duration, Option<crate::job::UniqueKey>) {
        let job = Job {
            id,
            scope: new.scope.unwrap_or_else(|| Scope::of_job(id)),
            queue: new.queue,
            kind: new.kind,
            payload: new.payload,
            attempt: 0,
            stalls: 0,
            snoozes: 0,
            max_snoozes: new.max_snoozes,
            timeout: new.timeout,
            deadline_ms: new.deadline_ms,
            max_attempts: new.max_attempts,
            max_stalls: new.max_stalls,
            flow,
            tick: new.tick,
            trace: new.trace,
            group: new.group,
        };
        let queue = self.queues.entry(job.queue.clone()).or_default();
        queue.priority.insert(id, new.priority);
        self.jobs.insert(id, StoredJob::new(job, new.priority));
        (new.delay, new.unique)
    }

    /// Pending job `id` (delayed at `place`) takes `new`'s payload and options (queue, kind
    /// and scope are the same) and is due at `start`.
    fn fold(&mut self, id: JobId, new: NewJob, place: DelayedKey, start: Instant) {
        let seq = self.next_seq();
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        job.payload = new.payload;
        job.max_attempts = new.max_attempts;
        job.max_stalls = new.max_stalls;
        job.max_snoozes = new.max_snoozes;
        job.timeout = new.timeout;
        job.deadline_ms = new.deadline_ms;
        job.tick = new.tick;
        job.trace = new.trace;
        job.details.priority = new.priority;
        let q = self.queues.entry(new.queue).or_default();
        q.priority.insert(id, new.priority);
        q.delayed.remove(&place);
        q.delayed.insert((start, seq, id));
        self.ready_at.insert(id, start);
    }

    /// Completes `id`; a flow step's end carries the steps its completion `added`. Its
    /// record is kept as `retention` says.
    fn complete(
        &mut self,
        id: JobId,
        added: Vec<crate::flow::Step>,
        result: Option<&str>,
        retention: CompletedRetention,
        now: Instant,
    ) {
        self.errors.remove(&id);
        self.release_unique(id);
        self.leave(id);
        self.ready_at.remove(&id);
        if let Some(StoredJob { job, details, .. }) = self.jobs.remove(&id) {
            self.step_ended(&job, crate::flow::StepEnd::Completed, added, result);
            let q = self.queues.entry(job.queue.clone()).or_default();
            q.priority.remove(&id);
            q.completed += 1;
            if retention.is_on() {
                // (The completing attempt's end, one clock reading for both.)
                let completed_ms = match details.attempts.last() {
                    Some(a) if matches!(a.outcome, AttemptOutcome::Completed) => a.ended_ms,
                    _ => crate::store::unix_ms(),
                };
                let done = CompletedJob {
                    job,
                    completed_ms,
                    details,
                    result: None, // (read from the result note: it has its own retention)
                };
                let seq = self.next_seq();
                self.completed.insert(id, (seq, done));
                self.completed_order.push_back((now, seq, id));
                self.forget_completed(retention, now);
            }
        }
    }

    /// Completed records past `retention`: the oldest beyond its count, and those older
    /// than its time. (A job completed twice, run again under a producer-chosen id, is in
    /// the order twice, as is one that died after: an entry whose record is gone or newer
    /// goes without it, and only records count against the maximum, as on Redis.)
    fn forget_completed(&mut self, retention: CompletedRetention, now: Instant) {
        while let Some(&(at, seq, id)) = self.completed_order.front() {
            let expired = now.saturating_duration_since(at) >= retention.keep;
            if !expired && self.completed.len() <= retention.max {
                break;
            }
            self.completed_order.pop_front();
            if self
                .completed
                .get(&id)
                .is_some_and(|(kept, _)| *kept == seq)
            {
                self.completed.remove(&id);
            }
        }
    }

    /// A dead letter back in its queue with fresh attempts, stalls and snoozes, no deadline
    /// (an operator asked for it to run now) and the priority it had, as `revive` in
    /// common.lua does. The caller has checked that its id names no live job.
    fn revive(&mut self, dead: DeadJob, priority: i32, now: Instant) {
        let DeadJob { mut job, .. } = dead;
        let id = job.id;
        job.attempt = 0;
        job.stalls = 0;
        job.snoozes = 0;
        job.deadline_ms = None;
        if priority != 0 {
            let q = self.queues.entry(job.queue.clone()).or_default();
            q.priority.insert(id, priority);
        }
        self.jobs.insert(id, StoredJob::new(job, priority));
        self.park(id, now, now);
    }

    fn bury(&mut self, id: JobId, reason: String, retention: usize) {
        // (An earlier run's completed record under this id is older than this death: a
        // lookup by id finds the newest end, as on Redis.)
        self.completed.remove(&id);
        self.errors.remove(&id);
        self.release_unique(id);
        self.leave(id);
        self.ready_at.remove(&id);
        self.held.remove(&id);
        if let Some(StoredJob { job, details, .. }) = self.jobs.remove(&id) {
            self.step_ended(&job, crate::flow::StepEnd::Dead, Vec::new(), None);
            let q = self.queues.entry(job.queue.clone()).or_default();
            let priority = q.priority.remove(&id).unwrap_or_default();
            q.died += 1;
            // (A dead letter is a plain job again, as on Redis: retried, it runs outside
            // its flow, which recorded its end already.)
            let job = Job { flow: None, ..job };
            q.dead.push_back((
                DeadJob {
                    job,
                    reason,
                    died_ms: Some(crate::store::unix_ms()),
                    details,
                },
                priority,
            ));
            while q.dead.len() > retention {
                q.dead.pop_front();
            }
        }
    }
}

/// The keys of a map (`held`) by when they lapse, the earliest first; each one's time is
/// `until` of its entry in the map. A sequence number orders keys of one time, so keys are
/// never compared. A heap, not a B-tree: nearly every key lapses after every key already in
/// (a batch's keys share their time, and each completion puts one in), and a heap takes that
/// in one comparison where a B-tree searched from its root on every completion
/// (docs/performance-log.md).
#[derive(Debug, Default)]
struct Expiries {
    heap: BinaryHeap<Reverse<(Instant, u64, String)>>,
    seq: u64,
}

impl Expiries {
    /// `key` lapses `at`, as its entry in `held` now says. A key held again until another
    /// time leaves its old entry behind (a heap cannot remove it), so the heap is rebuilt from
    /// the keys still held once stale entries outnumber them: it stays in step with the keys
    /// held, not with how often they were held again (a hot debounce key: one an enqueue, kept
    /// for a day). Amortised: a rebuild is linear and at least doubles the room.
    fn push<V>(
        &mut self,
        at: Instant,
        key: String,
        held: &HashMap<String, V>,
        until: impl Fn(&V) -> Option<Instant>,
    ) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, key)));
        if self.heap.len() <= 2 * held.len() + 1024 {
            return;
        }
        let seq = &mut self.seq;
        self.heap = held
            .iter()
            .filter_map(|(key, v)| {
                *seq += 1;
                Some(Reverse((until(v)?, *seq, key.clone())))
            })
            .collect();
    }

    /// Forgets the keys of `held` whose time has come, each only if it still lapses then:
    /// a key taken again since keeps its newer entry, and its stale expiry is dropped.
    fn forget_lapsed<V>(
        &mut self,
        held: &mut HashMap<String, V>,
        now: Instant,
        until: impl Fn(&V) -> Option<Instant>,
    ) {
        while self.heap.peek().is_some_and(|Reverse((at, ..))| *at <= now) {
            let Some(Reverse((at, _, key))) = self.heap.pop() else {
                break;
            };
            if held.get(&key).is_some_and(|v| until(v) == Some(at)) {
                held.remove(&key);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.heap.len()
    }
}

#[async_trait]
impl LeaseStore for MemoryLeaseStore {
    async fn enqueue_all(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        crate::job::validate_batch(&jobs, self.max_payload_bytes)?;
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        state.forget_unique_keys(now);
        state.forget_debounce_keys(now);
        // All or nothing: a debounce key held by a pending job of another queue, kind or
        // scope refuses the batch before anything is added (as the Redis script does).
        // (An idempotency key held with another fingerprint refuses it too, as the script
        // does: `UniqueKey::fingerprint`.)
        let mut taken: HashMap<String, Option<String>> = HashMap::default();
        // (Each job's once: a fingerprint hashes the payload.)
        let fingerprints: Vec<Option<String>> = jobs.iter().map(NewJob::key_fingerprint).collect();
        for (new, fingerprint) in jobs.iter().zip(&fingerprints) {
            // Whether `key` is held (by a job kept, or an earlier one of this batch), refused
            // when it was taken with another fingerprint.
            let held = |key: &str| -> Result<bool> {
                let (holder, kept) = match state.unique.get(key) {
                    Some((holder, _, kept)) => (holder.to_string(), kept.as_ref()),
                    None => match taken.get(key) {
                        Some(kept) => ("an earlier one of this batch".to_owned(), kept.as_ref()),
                        None => return Ok(false),
                    },
                };
                match (kept, fingerprint) {
                    (Some(kept), Some(fp)) if kept != fp => Err(crate::job::conflict(key, &holder)),
                    _ => Ok(true),
                }
            };
            let id_key = new.id.map(|id| format!("id:{id}"));
            let live = new.id.is_some_and(|id| state.jobs.contains_key(&id));
            let away = match (&new.unique, &id_key) {
                (Some(u), _) if held(&u.key)? => true,
                // A producer-chosen id beside a key of another name keeps its own key too.
                (_, Some(k)) if new.id_key_ttl().is_some() && held(k)? => true,
                // A live job of its id holds its id key (taken with its fingerprint).
                (_, Some(k)) if live => {
                    held(k)?;
                    true
                }
                _ => false,
            };
            if away {
                continue;
            }
            if let Some(u) = &new.unique {
                taken.insert(u.key.clone(), fingerprint.clone());
            }
            if let (Some(k), Some(_)) = (id_key, new.id_key_ttl()) {
                taken.insert(k, fingerprint.clone());
            }
            let Some(d) = &new.debounce else { continue };
            if let Some((holder, _, _)) = state.pending_debounce(&d.key) {
                let held = &state.jobs[&holder];
                let scope = new.scope.clone().unwrap_or_else(|| Scope::of_job(holder));
                if held.queue != new.queue
                    || held.kind != new.kind
                    || held.scope != scope
                    || held.group != new.group
                {
                    return Err(Error::InvalidJob(format!(
                        "debounce key {} is held by pending job {holder} of queue {}, kind {}, \
                         scope {}, group {}; a job under it must name the same: nothing was \
                         changed",
                        d.key,
                        held.queue,
                        held.kind,
                        held.scope,
                        held.group.as_deref().unwrap_or("(none)")
                    )));
                }
            }
        }
        let mut out = Vec::with_capacity(jobs.len());
        for (mut new, fingerprint) in jobs.into_iter().zip(fingerprints) {
            if let Some(holder) = new.unique.as_ref().and_then(|u| state.unique.get(&u.key)) {
                out.push(Enqueued::Existing(holder.0));
                continue;
            }
            let id_ttl = new.id_key_ttl();
            if let (Some(id), Some(_)) = (new.id, id_ttl) {
                if let Some(holder) = state.unique.get(&format!("id:{id}")) {
                    out.push(Enqueued::Existing(holder.0));
                    continue;
                }
            }
            let id = new.id.unwrap_or_else(JobId::new);
            // A producer-chosen id (`NewJob::with_id`) whose job is still known adds nothing.
            if state.jobs.contains_key(&id) {
                out.push(Enqueued::Existing(id));
                continue;
            }
            let debounce = new.debounce.take();
            if let Some(d) = &debounce {
                new.delay = d.quiet;
                if let Some((holder, latest, place)) = state.pending_debounce(&d.key) {
                    // The pending job takes this one's payload and options and starts a
                    // quiet period after now, but no later than its first enqueue's maximum
                    // wait; one due already (overdue, or run now) keeps its due time.
                    let start = match place.0 <= now {
                        true => place.0,
                        false => (now + d.quiet).min(latest),
                    };
                    // Its own id stays taken, by the job it folded into: a retry of this
                    // enqueue answers that job instead of adding one once the job started.
                    let ttl = |u: &crate::job::UniqueKey| crate::job::whole_ms(u.ttl);
                    if let Some(u) = new.unique.take().filter(|u| !ttl(u).is_zero()) {
                        let until = now + ttl(&u);
                        let st = &mut *state;
                        st.unique.insert(u.key.clone(), (holder, Some(until), None));
                        st.unique_expiries
                            .push(until, u.key, &st.unique, |held| held.1);
                    }
                    state.fold(holder, new, place, start);
                    state.hold_debounce(d.key.clone(), holder, latest, start.max(now));
                    out.push(Enqueued::Debounced(holder));
                    continue;
                }
            }
            let queue = new.queue.clone();
            let (delay, unique) = state.insert_job(id, new, None);
            state.park(id, now + delay, now);
            state.queues.entry(queue).or_default().enqueued += 1;
            if let Some(ttl) = id_ttl {
                let (key, until) = (format!("id:{id}"), now + ttl);
                let st = &mut *state;
                st.unique
                    .insert(key.clone(), (id, Some(until), fingerprint.clone()));
                st.unique_expiries
                    .push(until, key, &st.unique, |held| held.1);
            }
            if let Some(unique) = unique {
                state
                    .unique
                    .insert(unique.key.clone(), (id, None, fingerprint));
                state.job_unique.insert(id, (unique.key, now + unique.ttl));
            }
            if let Some(d) = debounce {
                state.hold_debounce(d.key, id, now + d.max_wait, now + d.quiet);
            }
            out.push(Enqueued::Added(id));
        }
        Ok(out)
    }

    async fn claim_kinds(
        &self,
        queue: &str,
        kinds: &[String],
        worker: &str,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Claim>> {
        // The worker name is stored in each lease entry, fields split by tabs.
        crate::job::check_name("worker name", worker).map_err(|e| Error::Config(e.to_string()))?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let now = crate::clock::now();
        let expires_at = now + ttl;
        let mut state = lock(&self.state);
        if state.paused.contains(queue) {
            return Ok(Vec::new());
        }
        let bucket = state.rate_bucket(queue, now);
        let n = match bucket {
            Some((tokens, _)) => n.min(tokens.floor() as usize),
            None => n,
        };
        if n == 0 {
            return Ok(Vec::new());
        }
        state.promote_due(queue, now, promotions_per_claim(n));
        state.wake_groups(now);
        let Some((picked, aside, plan, served)) = state.pick(queue, kinds, n, now) else {
            return Ok(Vec::new());
        };
        let tokens = state.mint(picked.len())?;
        state.set_aside(queue, aside);
        let mut claims = Vec::with_capacity(picked.len());
        let worker: Arc<str> = worker.into();
        for ((key, kind), token) in picked.into_iter().zip(tokens) {
            claims.push(state.grant(queue, key, &kind, token, &worker, now, expires_at));
        }
        state.apply_plan(queue, plan, &served);
        if let (Some((tokens, at)), Some(rate)) = (bucket, state.rates.get_mut(queue)) {
            rate.1 = tokens - claims.len() as f64;
            rate.2 = at;
        }
        Ok(claims)
    }

    async fn renew(&self, leases: &[LeaseId], ttl: Duration) -> Result<Vec<LeaseId>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        let mut lost = Vec::new();
        for lease in leases {
            if !state.leases.renew(*lease, now, now + ttl) {
                lost.push(*lease);
            }
        }
        Ok(lost)
    }

    async fn settle(&self, settlements: Vec<(LeaseId, Settlement)>) -> Result<Vec<Result<()>>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        let mut results = Vec::with_capacity(settlements.len());
        for (lease, settlement) in settlements {
            // Checked before the lease is taken, so an impossible reseed changes nothing.
            if let Settlement::Fenced { highest, .. } = &settlement {
                if highest.epoch() >= FencingToken::MAX_EPOCH {
                    results.push(Err(Error::Epoch(format!(
                        "a sink holds token {highest}: no epoch left above it"
                    ))));
                    continue;
                }
            }
            let Some(id) = state.take_current(lease, now) else {
                results.push(Err(Error::LeaseNotCurrent(lease)));
                continue;
            };
            match settlement {
                Settlement::Complete { result, then } => {
                    let Then { jobs, flows, steps } = then;
                    if let Some(job) = state.jobs.get_mut(&id) {
                        job.note_try(AttemptOutcome::Completed, "");
                    }
                    state.complete(id, steps, result.as_deref(), self.completed_retention, now);
                    if let Some(json) = result {
                        state.put_note(id, true, json, crate::job::RESULT_RETENTION);
                    }
                    if !jobs.is_empty() || !flows.is_empty() {
                        state.follow_ups.insert(id, (now, jobs, flows));
                    }
                }
                Settlement::Retry { delay, reason } => {
                    // (Redis reads an empty reason back as none.)
                    if let Some(job) = state.jobs.get_mut(&id) {
                        job.note_try(AttemptOutcome::Retried, &reason);
                    }
                    if reason.is_empty() {
                        state.errors.remove(&id);
                    } else {
                        state.errors.insert(id, reason);
                    }
                    state.park(id, now + delay.min(MAX_DELAY), now)
                }
                Settlement::Dead { reason } => {
                    if let Some(job) = state.jobs.get_mut(&id) {
                        job.note_try(AttemptOutcome::Died, &reason);
                    }
                    state.bury(id, reason, self.dead_retention)
                }
                Settlement::Release => {
                    if let Some(job) = state.jobs.get_mut(&id) {
                        job.note_try(AttemptOutcome::Released, "");
                        job.attempt = job.attempt.saturating_sub(1);
                    }
                    state.park(id, now, now);
                }
                Settlement::Snooze { delay } => {
                    // Not a failure: the attempt is given back, the snooze counted.
                    if let Some(job) = state.jobs.get_mut(&id) {
                        job.note_try(AttemptOutcome::Snoozed, "");
                        job.attempt = job.attempt.saturating_sub(1);
                        job.snoozes = job.snoozes.saturating_add(1);
                    }
                    // (In whole ms, as Redis counts it.)
                    let delay = crate::job::whole_ms(delay.min(MAX_DELAY));
                    state.park(id, now + delay, now);
                }
                Settlement::Fenced { highest, .. } => {
                    // Grant above the sink from now on: the next token is in a newer epoch
                    // than anything the sink has seen.
                    if state.epoch <= highest.epoch() {
                        state.epoch = highest.epoch() + 1;
                        state.counter = 0;
                    }
                    // Not the job's fault: the attempt does not count.
                    if let Some(job) = state.jobs.get_mut(&id) {
                        job.note_try(
                            AttemptOutcome::Released,
                            "a sink held a newer token: the coordinator moved above it",
                        );
                        job.attempt = job.attempt.saturating_sub(1);
                    }
                    state.park(id, now, now);
                }
            }
            results.push(Ok(()));
        }
        state.publish_watermark();
        Ok(results)
    }

    fn watermark(&self) -> Option<FencingToken> {
        lock(&self.state).watermark
    }

    async fn follow_ups(&self, older_than: Duration, max: usize) -> Result<Vec<FollowUps>> {
        let state = lock(&self.state);
        let now = crate::clock::now();
        let mut due: Vec<_> = state
            .follow_ups
            .iter()
            .filter(|(_, (at, ..))| now.saturating_duration_since(*at) >= older_than)
            .collect();
        due.sort_by_key(|(parent, (at, ..))| (*at, **parent));
        Ok(due
            .into_iter()
            .take(max)
            .map(|(&parent, (_, jobs, flows))| FollowUps {
                parent,
                jobs: jobs.clone(),
                flows: flows.clone(),
            })
            .collect())
    }

    async fn forget_follow_ups(&self, parent: JobId) -> Result<()> {
        lock(&self.state).follow_ups.remove(&parent);
        Ok(())
    }

    async fn reap(&self, max: usize) -> Result<Vec<Reaped>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        let expired = state.leases.due(now, max);
        let mut reaped = Vec::with_capacity(expired.len());
        for lease in expired {
            let Some(record) = state.leases.remove(&lease) else {
                continue;
            };
            let (id, token, worker) = (record.job, record.token, record.worker.to_string());
            state.drop_lease(lease, record, now);
            let Some(job) = state.jobs.get_mut(&id) else {
                continue;
            };
            job.note_try(AttemptOutcome::Stalled, "");
            job.stalls += 1;
            let (queue, job_trace) = (job.queue.clone(), job.trace.clone());
            let outcome = on_stall(job.stalls, job.max_stalls);
            state.queues.entry(queue.clone()).or_default().stalled += 1;
            let dead = match outcome {
                StallOutcome::Requeue => {
                    state.park(id, now, now);
                    false
                }
                StallOutcome::Dead(reason) => {
                    state.bury(id, reason, self.dead_retention);
                    true
                }
            };
            reaped.push(Reaped {
                job: id,
                queue,
                dead,
                lease,
                token: Some(token),
                worker,
                trace: job_trace,
            });
        }
        Ok(reaped)
    }

    async fn highest_token(&self, scope: &Scope) -> Result<Option<FencingToken>> {
        let state = lock(&self.state);
        Ok(match scope.job() {
            // A default scope has a token while its job holds a lease.
            Some(id) => state
                .leases
                .iter()
                .find(|(_, l)| l.job == id)
                .map(|(_, l)| l.token),
            None => state.scopes.get(scope).and_then(|s| s.last),
        })
    }

    async fn epoch(&self) -> Result<Option<u32>> {
        Ok(Some(lock(&self.state).epoch))
    }

    async fn raise_epoch(&self, at_least: u32) -> Result<u32> {
        if at_least > FencingToken::MAX_EPOCH {
            return Err(Error::Epoch(format!(
                "epoch {at_least} is above the largest, {}",
                FencingToken::MAX_EPOCH
            )));
        }
        let mut state = lock(&self.state);
        if state.epoch < at_least {
            state.epoch = at_least;
            state.counter = 0;
        }
        Ok(state.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{FencedStore, FencedWrite, Inspect};

    /// Enqueues held by their maximum wait keep their debounce key until one time: its
    /// expiry is in once, not once an enqueue (fails with the check in `hold_debounce` out).
    #[test]
    fn a_debounce_key_held_again_until_the_same_time_has_one_expiry() {
        let mut state = LeaseState::default();
        let (id, now) = (JobId::new(), crate::clock::now());
        for _ in 0..100 {
            state.hold_debounce("k".into(), id, now, now);
        }
        assert_eq!(state.debounce_expiries.len(), 1);
        state.hold_debounce("k".into(), id, now, now + Duration::from_secs(1));
        assert_eq!(
            state.debounce_expiries.len(),
            2,
            "a later time is a new expiry"
        );
    }

    /// A key held again and again until ever later times (a hot debounce key) does not grow
    /// the expiries without bound: stale entries are dropped once they outnumber the live
    /// ones, and each key still lapses at its newest time (fails with `compact` out).
    #[test]
    fn expiries_stay_in_step_with_the_keys_held() {
        let mut state = LeaseState::default();
        let (id, now) = (JobId::new(), crate::clock::now());
        for i in 0..10_000 {
            state.hold_debounce("hot".into(), id, now, now + Duration::from_millis(i));
        }
        state.hold_debounce("cold".into(), id, now, now);
        assert!(state.debounce_expiries.len() <= 2 * 2 + 1024 + 1);
        let newest = now + Duration::from_millis(9_999) + DEBOUNCE_KEPT;
        state.forget_debounce_keys(newest - Duration::from_millis(1));
        assert!(
            state.debounce.contains_key("hot"),
            "kept until its newest time"
        );
        assert!(!state.debounce.contains_key("cold"));
        state.forget_debounce_keys(newest);
        assert!(state.debounce.is_empty());
    }

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
            .map(|c| (c.lease.id, Settlement::completed()))
            .collect();
        store.settle(done).await.unwrap();
        let state = lock(&store.state);
        assert!(state.scopes.is_empty(), "idle scopes leave no state behind");
        assert!(state.jobs.is_empty());
    }

    /// A store made in an epoch grants its first token there (a restarted embedded
    /// coordinator must start above the epoch it used before), clamped to the largest epoch;
    /// and it holds payloads to its own cap (mutants of both survived the suite, which builds
    /// stores with the defaults).
    #[tokio::test]
    async fn a_store_keeps_the_epoch_and_payload_cap_it_was_made_with() {
        for (asked, granted) in [(7, 7), (u32::MAX, FencingToken::MAX_EPOCH)] {
            let store = MemoryLeaseStore::with_epoch(asked);
            let claim = claim_new(&store, 1, Duration::from_secs(5)).await;
            assert_eq!(claim[0].lease.token.epoch(), granted, "asked {asked}");
        }
        let store = MemoryLeaseStore::new().with_max_payload_bytes(8);
        let big = store.enqueue(vec![NewJob::raw("k", "\"123456789\"")]).await;
        assert!(matches!(big, Err(Error::InvalidJob(_))), "{big:?}");
        store.enqueue(vec![NewJob::raw("k", "1")]).await.unwrap();
    }

    /// `pick`'s guard for invariant 3, which the store's own bookkeeping never needs (a shared
    /// scope has one ready head): with a second job of a scope planted among the ready ones,
    /// and with a ready job whose scope is held, a claim still grants one live lease per scope
    /// and sets the others aside (a mutant of the guard survived every path the API reaches).
    #[tokio::test]
    async fn a_claim_never_grants_a_held_or_twice_picked_scope() {
        // (The second looks like a default scope, `job:` and 36 characters, and is not one:
        // it is shared like any named scope.)
        for name in ["s", "job:00000000-0000-0000-0000-00000000000x"] {
            let store = MemoryLeaseStore::new();
            let jobs = (0..3)
                .map(|_| NewJob::raw("k", "null").with_scope(name))
                .collect();
            store.enqueue(jobs).await.unwrap();
            let plant_waiting_as_ready = |store: &MemoryLeaseStore| {
                let mut state = lock(&store.state);
                let scope = Scope::new(name);
                let key = state
                    .scopes
                    .get_mut(&scope)
                    .unwrap()
                    .waiting
                    .pop_first()
                    .unwrap();
                let q = state.queues.get_mut("default").unwrap();
                q.waiting -= 1;
                q.ready.entry("k".into()).or_default().insert(key);
            };
            plant_waiting_as_ready(&store);
            let ttl = Duration::from_secs(5);
            let first = store.claim("default", "w", 3, ttl).await.unwrap();
            assert_eq!(first.len(), 1, "two picks of scope {name}");
            plant_waiting_as_ready(&store);
            let held = store.claim("default", "w", 3, ttl).await.unwrap();
            assert!(held.is_empty(), "held scope {name} granted again: {held:?}");
            let counts = store.counts("default").await.unwrap();
            assert_eq!((counts.ready, counts.waiting, counts.leased), (0, 2, 1));
        }
    }

    /// The token counter is spent to its last value, and a batch that would pass it takes the
    /// next epoch whole (cargo-mutants: the bound read as `>=` or `==` survived the suite,
    /// which never brings a counter near its end).
    #[tokio::test]
    async fn the_counter_is_spent_to_its_last_value_then_the_epoch_moves() {
        let store = MemoryLeaseStore::with_epoch(3);
        lock(&store.state).counter = FencingToken::MAX_COUNTER - 2;
        let jobs = (0..4).map(|_| NewJob::raw("k", "null")).collect();
        store.enqueue(jobs).await.unwrap();
        let tokens = |claims: Vec<Claim>| -> Vec<(u32, u64)> {
            claims
                .iter()
                .map(|c| (c.lease.token.epoch(), c.lease.token.counter()))
                .collect()
        };
        let ttl = Duration::from_secs(5);
        let last = FencingToken::MAX_COUNTER;
        let spent = store.claim("default", "w", 2, ttl).await.unwrap();
        assert_eq!(tokens(spent), [(3, last - 1), (3, last)]);
        let next = store.claim("default", "w", 2, ttl).await.unwrap();
        assert_eq!(tokens(next), [(4, 1), (4, 2)]);
    }

    /// A result kept again with a longer ttl outlives its first expiry, and a ttl too long for
    /// the clock keeps it (cargo-mutants: the sweep's "still the same record" check read as
    /// `!=`, and the overflow fallback's `+` read as `-`, survived the suite).
    #[tokio::test]
    async fn results_kept_again_outlive_their_first_expiry() {
        use crate::store::RecordStore;
        let store = MemoryLeaseStore::new();
        let (job, other) = (JobId::new(), JobId::new());
        store
            .put_result(job, "1".into(), Duration::from_millis(30))
            .await
            .unwrap();
        store
            .put_result(job, "2".into(), Duration::from_secs(60))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Any write sweeps what expired: the first expiry is due, its record is not.
        store
            .put_result(other, "3".into(), Duration::MAX)
            .await
            .unwrap();
        assert_eq!(store.result(job).await.unwrap().as_deref(), Some("2"));
        assert_eq!(store.result(other).await.unwrap().as_deref(), Some("3"));
    }

    /// Enqueues `n` plain jobs and claims them all for `ttl`.
    async fn claim_new(store: &MemoryLeaseStore, n: usize, ttl: Duration) -> Vec<Claim> {
        let jobs = (0..n).map(|_| NewJob::raw("k", "null")).collect();
        store.enqueue(jobs).await.unwrap();
        store.claim("default", "w", n, ttl).await.unwrap()
    }

    /// A renewed lease is reaped at its new expiry, not its old one, and a default scope's
    /// newest token is its own job's (cargo-mutants: the expiry index written as `now - ttl`
    /// on renewal, and the job match in `highest_token` read as `!=`, survived the suite).
    #[tokio::test(start_paused = true)]
    async fn a_renewed_lease_is_reaped_at_its_new_expiry_and_tokens_are_per_job() {
        let store = MemoryLeaseStore::new();
        let claims = claim_new(&store, 2, Duration::from_secs(1)).await;
        for c in &claims {
            let token = store.highest_token(&Scope::of_job(c.job.id)).await.unwrap();
            assert_eq!(token, Some(c.lease.token), "job {}", c.job.id);
        }
        let lease = [claims[0].lease.id];
        let renew = || store.renew(&lease, Duration::from_secs(10));
        assert!(renew().await.unwrap().is_empty());
        tokio::time::advance(Duration::from_secs(2)).await;
        let reaped = store.reap(10).await.unwrap();
        assert_eq!(reaped.len(), 1, "only the lease not renewed");
        assert!(renew().await.unwrap().is_empty(), "still current");
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(
            store.reap(10).await.unwrap().len(),
            1,
            "reaped once it ran out"
        );
    }

    /// Raising the epoch to the one in use changes nothing (a counter reset there would grant a
    /// token twice), the largest epoch can be reached and none above it; a delayed job that is
    /// due counts as ready, not delayed (cargo-mutants survivors in `raise_epoch` and `counts`).
    #[tokio::test(start_paused = true)]
    async fn raising_to_the_epoch_in_use_grants_no_token_twice() {
        let store = MemoryLeaseStore::with_epoch(2);
        let jobs = (0..2).map(|_| NewJob::raw("k", "null")).collect();
        store.enqueue(jobs).await.unwrap();
        let ttl = Duration::from_secs(5);
        let first = store.claim("default", "w", 1, ttl).await.unwrap();
        assert_eq!(store.raise_epoch(2).await.unwrap(), 2);
        let second = store.claim("default", "w", 1, ttl).await.unwrap();
        assert!(second[0].lease.token > first[0].lease.token);
        let top = FencingToken::MAX_EPOCH;
        assert_eq!(store.raise_epoch(top).await.unwrap(), top);
        assert!(matches!(
            store.raise_epoch(top + 1).await,
            Err(Error::Epoch(_))
        ));
        store
            .enqueue(vec![
                NewJob::raw("k", "null").with_delay(Duration::from_millis(50))
            ])
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(60)).await;
        let counts = store.counts("default").await.unwrap();
        assert_eq!((counts.ready, counts.delayed), (1, 0));
    }

    /// Cancelling a ready job leaves the delayed ones alone, and cancelling a delayed one
    /// removes just it (cargo-mutants: the delayed set's filter read as `==` survived).
    #[tokio::test]
    async fn cancelling_one_job_leaves_the_delayed_others_alone() {
        use crate::job::Cancelled;
        use crate::store::QueueAdmin;
        let store = MemoryLeaseStore::new();
        let later = |s| NewJob::raw("k", "null").with_delay(Duration::from_secs(s));
        let ids = store
            .enqueue(vec![NewJob::raw("k", "null"), later(60), later(90)])
            .await
            .unwrap();
        assert_eq!(store.cancel(ids[0], "x").await.unwrap(), Cancelled::Removed);
        assert_eq!(store.counts("default").await.unwrap().delayed, 2);
        assert_eq!(store.cancel(ids[1], "x").await.unwrap(), Cancelled::Removed);
        let counts = store.counts("default").await.unwrap();
        assert_eq!((counts.delayed, counts.dead), (1, 2));
    }

    /// Retrying dead jobs moves at most the number asked (cargo-mutants: the bound read as
    /// `<=` survived).
    #[tokio::test]
    async fn retrying_dead_jobs_moves_at_most_the_number_asked() {
        use crate::store::QueueAdmin;
        let store = MemoryLeaseStore::new();
        let claims = claim_new(&store, 3, Duration::from_secs(5)).await;
        let dead = claims
            .iter()
            .map(|c| (c.lease.id, Settlement::Dead { reason: "x".into() }))
            .collect();
        store.settle(dead).await.unwrap();
        assert_eq!(store.retry_dead("default", 1).await.unwrap(), 1);
        let counts = store.counts("default").await.unwrap();
        assert_eq!((counts.ready, counts.dead), (1, 2));
    }

    /// A lease is expired at its deadline exactly, for renew as for settle and reap
    /// (mutation tests found the boundary unchecked).
    #[tokio::test(start_paused = true)]
    async fn a_lease_is_lost_at_its_deadline_exactly() {
        let store = MemoryLeaseStore::new();
        store.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap();
        let ttl = Duration::from_millis(100);
        let lease = store.claim("default", "w", 1, ttl).await.unwrap()[0]
            .lease
            .id;
        tokio::time::advance(ttl - Duration::from_millis(1)).await;
        assert_eq!(store.renew(&[lease], ttl).await.unwrap(), []);
        tokio::time::advance(ttl).await;
        assert_eq!(store.renew(&[lease], ttl).await.unwrap(), [lease]);
    }

    #[tokio::test]
    async fn the_sink_holds_state_for_live_scopes_only() {
        let sink = MemoryFencedStore::new().with_key_retention(Duration::ZERO);
        let w = |scope: &str, token: u64| FencedWrite {
            scope: Scope::new(scope),
            fence: crate::admission::Fence {
                token: FencingToken::from_u64(token),
                lease: LeaseId::new(),
            },
            key: crate::ids::IdempotencyKey::new(format!("{scope}/{token}")),
            mutations: vec![],
        };
        for (i, scope) in ["a", "b", "c"].into_iter().enumerate() {
            sink.write(w(scope, i as u64 + 1)).await.unwrap();
        }
        assert_eq!(sink.scopes_held(), 3);
        sink.observe_watermark(FencingToken::from_u64(10));
        sink.write(w("d", 10)).await.unwrap();
        sink.write(w("d", 11)).await.unwrap();
        assert_eq!(sink.scopes_held(), 1, "only the live scope is left");
    }

    #[tokio::test(start_paused = true)]
    async fn claims_promote_boundedly_and_dead_letters_are_trimmed() {
        let store = MemoryLeaseStore::new().with_dead_retention(2);
        let delayed = (0..1000)
            .map(|_| NewJob::raw("d", "null").with_delay(Duration::from_millis(20)))
            .collect();
        store.enqueue(delayed).await.unwrap();
        tokio::time::advance(Duration::from_millis(60)).await;
        let ttl = Duration::from_secs(30);
        assert_eq!(store.claim("default", "t", 1, ttl).await.unwrap().len(), 1);
        let left = lock(&store.state).queues["default"].delayed.len();
        assert_eq!(left, 1000 - 18, "one claim of 1 promotes 2n + 16 due jobs");
        let mut claimed = 1;
        for _ in 0..20 {
            claimed += store.claim("default", "t", 100, ttl).await.unwrap().len();
        }
        assert_eq!(claimed, 1000);
        let jobs = (0..3)
            .map(|i| NewJob::raw(format!("dead{i}"), "null"))
            .collect();
        store.enqueue(jobs).await.unwrap();
        for c in store.claim("default", "t", 3, ttl).await.unwrap() {
            let dead = Settlement::Dead {
                reason: c.job.kind.clone(),
            };
            store.settle(vec![(c.lease.id, dead)]).await.unwrap();
        }
        let kept: Vec<String> = store
            .dead("default", 10)
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.reason)
            .collect();
        assert_eq!(kept, ["dead1", "dead2"]);
    }
}
