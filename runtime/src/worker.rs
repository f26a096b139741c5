//! `Worker`: claims jobs in batches, runs their handlers under a concurrency limit, cancels a
//! handler whose lease is lost, settles outcomes in batches, and drains on shutdown.
//!
//! Handlers run as tasks on the worker's own arbiter and report back with `JobFinished`; the
//! actor itself never awaits a handler, so claims, renewals and settlements keep flowing while
//! jobs run. Give each worker its own `Arbiter` so several workers use several cores.

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use metrics::{counter, histogram, Counter, Histogram};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::context::{JobContext, Registry, RunState, Sinks};
use crate::coordinator::{Coordinator, Exchange, Exchanged, NoteRejections, Settle, Settled};
use crate::error::{Error, Result};
use crate::ids::LeaseId;
use crate::job::{Claim, Job, JobError, Settlement};
use crate::linger::{Due, Linger};
use crate::metrics as m;
use crate::policy::RetryPolicy;
#[cfg(feature = "testing")]
use crate::renewal::SuspendRenewals;
use crate::renewal::{ForgetLeases, LeaseLost, LossReason, Renewal, TrackLeases};
use crate::store::ClaimRequest;

/// How a worker runs.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Name shown in status output and logs.
    pub name: String,
    /// Queues to claim from, in turn.
    pub queues: Vec<String>,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Most jobs claimed per round trip.
    pub batch: usize,
    /// Lease length; renewed every third of it.
    pub lease_ttl: Duration,
    /// How often an idle worker asks for work.
    pub poll_interval: Duration,
    /// Backoff for handler retries.
    pub retry: RetryPolicy,
    /// How long a finished job's settlement, and a freed slot's claim, may wait for others to
    /// share their round trip (default 2 ms). A batch goes at once when it is full or when
    /// no running handler could join it, so no-op and CPU-bound handlers never wait; handlers
    /// that await I/O finish spread out, and without it each costs two round trips of its
    /// own. `Duration::ZERO` sends each at once. Waits run on tokio's millisecond timer: a
    /// batch goes between `linger - 1 ms` and `linger` after its first item, and a linger of
    /// 1 ms or less is none. A lingering settlement still holds its scope: a hot scope runs
    /// at most 1 / (handler + linger + round trip) jobs a second.
    pub linger: Duration,
    /// How long a handler past its timeout ([`NewJob::with_timeout`](crate::NewJob::with_timeout),
    /// [`Registry::with_timeout`](crate::Registry::with_timeout)) has, once its cancellation
    /// token fired, to return before its task is aborted and its slot freed (default 5 s).
    pub timeout_grace: Duration,
}

impl WorkerConfig {
    /// Defaults for a worker called `name` on the `default` queue.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            queues: vec!["default".into()],
            concurrency: 16,
            batch: 16,
            lease_ttl: Duration::from_secs(30),
            poll_interval: Duration::from_millis(50),
            retry: RetryPolicy::default(),
            linger: Self::DEFAULT_LINGER,
            timeout_grace: Self::DEFAULT_TIMEOUT_GRACE,
        }
    }

    /// The default [`WorkerConfig::timeout_grace`].
    pub const DEFAULT_TIMEOUT_GRACE: Duration = Duration::from_secs(5);

    /// The default [`WorkerConfig::linger`].
    pub const DEFAULT_LINGER: Duration = Duration::from_millis(2);

    /// Free slots that make a claim worth its round trip at once: half the claim batch.
    /// Fewer wait up to `linger` for more.
    fn refill_at(&self) -> usize {
        self.batch.min(self.concurrency).div_ceil(2)
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::Config(format!("worker {:?}: {what}", self.name)));
        if let Err(e) = crate::job::check_name("worker name", &self.name) {
            return bad(&e.to_string());
        }
        if self.queues.is_empty() || self.queues.iter().any(String::is_empty) {
            return bad("needs at least one non-empty queue name");
        }
        if self.concurrency == 0 || self.batch == 0 {
            return bad("concurrency and batch must be at least 1");
        }
        if self.lease_ttl < Duration::from_millis(30) {
            return bad("lease_ttl must be at least 30ms (it is renewed every ttl/3)");
        }
        if self.poll_interval.is_zero() {
            return bad("poll_interval must be positive");
        }
        if let Err(e) = self.retry.validate("retry") {
            return bad(&e);
        }
        // A settlement lingers while its lease is renewed; a linger near the lease would be a
        // misconfiguration (it exists to share round trips, which takes milliseconds).
        if self.linger > self.lease_ttl / 10 {
            return bad("linger must be at most a tenth of lease_ttl");
        }
        Ok(())
    }
}

/// Exponential backoff after consecutive failures: 200 ms, 400 ms, ... up to 5 s.
#[derive(Default)]
struct Backoff {
    failures: u32,
    resume_at: Option<Instant>,
}

impl Backoff {
    fn ready(&self) -> bool {
        self.resume_at.is_none_or(|at| Instant::now() >= at)
    }

    /// Records a failure; returns how long to wait.
    fn failed(&mut self) -> Duration {
        self.failures += 1;
        let wait = Duration::from_millis(100)
            .saturating_mul(1 << self.failures.min(6))
            .min(Duration::from_secs(5));
        self.resume_at = Some(Instant::now() + wait);
        wait
    }

    /// Records a success; returns the failures it ends.
    fn succeeded(&mut self) -> u32 {
        self.resume_at = None;
        std::mem::take(&mut self.failures)
    }
}

struct Running {
    job: Arc<Job>,
    /// Its (queue, kind)'s metric handles, looked up once, at its launch.
    metrics: Arc<KindMetrics>,
    cancel: CancellationToken,
    started: Instant,
    run: Arc<RunState>,
    /// The attempt's span (`palisade.job`): what the worker notes about the run goes in it.
    span: tracing::Span,
    /// Its lease was lost (expired and reaped, or the job cancelled): whatever it returns
    /// settles nothing, and is logged as that, not as a retry or a death.
    lost: bool,
}

struct Pending {
    lease: LeaseId,
    settlement: Settlement,
    job: Arc<Job>,
    /// When the handler returned (or the job was released).
    finished: Instant,
    /// Where the settle wait is recorded (its `settle_wait`).
    metrics: Arc<KindMetrics>,
}

/// Metric handles of one (queue, kind), looked up once instead of per job.
struct KindMetrics {
    duration: Histogram,
    claim_to_start: Histogram,
    settle_wait: Histogram,
    /// By outcome: see `Outcome`.
    finished: [Counter; 8],
}

/// How an attempt ended, as `palisade_jobs_finished_total` counts it (the index of its
/// counter in `KindMetrics::finished`).
#[derive(Clone, Copy)]
enum Outcome {
    Completed,
    Retried,
    Dead,
    Fenced,
    Released,
    Snoozed,
    /// Claimed after its deadline: dead-lettered, never run.
    Expired,
    /// Ran past its timeout (retried, or dead if that was its last attempt).
    TimedOut,
}

impl Outcome {
    const LABELS: [&'static str; 8] = [
        "completed",
        "retried",
        "dead",
        "fenced",
        "released",
        "snoozed",
        "expired",
        "timed_out",
    ];

    fn of(settlement: &Settlement) -> Self {
        match settlement {
            Settlement::Complete { .. } => Self::Completed,
            Settlement::Retry { .. } => Self::Retried,
            Settlement::Dead { .. } => Self::Dead,
            Settlement::Fenced { .. } => Self::Fenced,
            Settlement::Release => Self::Released,
            Settlement::Snooze { .. } => Self::Snoozed,
        }
    }
}

impl KindMetrics {
    fn new(queue: &str, kind: &str) -> Self {
        let labels = [("queue", queue.to_owned()), ("kind", kind.to_owned())];
        let finished = |outcome: &'static str| counter!(m::JOBS_FINISHED, "queue" => queue.to_owned(), "kind" => kind.to_owned(), "outcome" => outcome);
        Self {
            duration: histogram!(m::JOB_DURATION, &labels),
            claim_to_start: histogram!(m::CLAIM_TO_START, "queue" => queue.to_owned()),
            settle_wait: histogram!(m::SETTLE_WAIT, "queue" => queue.to_owned()),
            finished: Outcome::LABELS.map(finished),
        }
    }
}

/// Runs handlers for claimed jobs.
pub struct Worker {
    config: WorkerConfig,
    coordinator: Addr<Coordinator>,
    registry: Registry,
    /// The registry's kinds: claims ask for these only.
    kinds: Vec<String>,
    /// How it backs off retries, as its heartbeat says it (fixed once it is built).
    retry_summary: String,
    sinks: Sinks,
    renewal: Option<Addr<Renewal>>,
    running: HashMap<LeaseId, Running>,
    /// Handlers released at the drain deadline that have not returned yet: what they meet
    /// afterwards (their late writes are fenced) still reaches the rejection journal.
    released_runs: HashMap<LeaseId, Arc<RunState>>,
    pending: Vec<Pending>,
    /// When the settlements in `pending` go out.
    settle_linger: Linger,
    /// When the free slots are claimed for.
    claim_linger: Linger,
    /// Claims on their way to the coordinator, and the slots they asked for.
    claims_out: usize,
    asked: usize,
    frozen: bool,
    next_queue: usize,
    drain: Option<oneshot::Sender<Drained>>,
    /// Settlement batches on their way to the coordinator, and the settlements in them (a
    /// batch is never empty).
    batches_out: usize,
    in_flight: usize,
    /// Jobs given back unfinished (`Drained::released`).
    released: usize,
    /// The drain deadline passed (or a second `Drain` cut it short): what still ran was
    /// released.
    deadline_passed: bool,
    /// An unreachable backend gets exponentially fewer claims and settlement retries (and log
    /// lines), not one per poll tick.
    claim_backoff: Backoff,
    settle_backoff: Backoff,
    /// queue → kind → metric handles.
    metrics: HashMap<String, HashMap<String, Arc<KindMetrics>>>,
    /// When it was made (Unix ms), for its heartbeat.
    started_ms: u64,
}

impl Worker {
    /// How long releasing unfinished jobs may take after the drain deadline.
    const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

    /// A worker that claims from `coordinator`, runs handlers from `registry`, and gives them
    /// `sinks`. Fails on an invalid config.
    pub fn new(
        config: WorkerConfig,
        coordinator: Addr<Coordinator>,
        registry: Registry,
        sinks: Sinks,
    ) -> Result<Self> {
        config.validate()?;
        registry.validate()?;
        let mut kinds: Vec<String> = registry.kinds().map(str::to_owned).collect();
        kinds.sort_unstable();
        let none = kinds.is_empty();
        // Every worker clears durable runs' journals (the job a durable run's completion sets
        // going, context/durable.rs).
        kinds.push(crate::context::durable::CLEAR.to_owned());
        if none {
            return Err(Error::Config(format!(
                "worker {:?}: the registry has no job kinds",
                config.name
            )));
        }
        let retry_summary = registry.retry_summary(config.retry);
        Ok(Self {
            config,
            coordinator,
            registry,
            kinds,
            retry_summary,
            sinks,
            renewal: None,
            running: HashMap::new(),
            released_runs: HashMap::new(),
            pending: Vec::new(),
            settle_linger: Linger::default(),
            claim_linger: Linger::default(),
            claims_out: 0,
            asked: 0,
            frozen: false,
            next_queue: 0,
            drain: None,
            batches_out: 0,
            in_flight: 0,
            released: 0,
            deadline_passed: false,
            claim_backoff: Backoff::default(),
            settle_backoff: Backoff::default(),
            metrics: HashMap::new(),
            started_ms: crate::store::unix_ms(),
        })
    }

    fn renewal(&self) -> &Addr<Renewal> {
        self.renewal
            .as_ref()
            .expect("renewal starts with the worker")
    }

    /// Slots neither running a job nor asked for by a claim on its way.
    fn room(&self) -> usize {
        self.config
            .concurrency
            .saturating_sub(self.running.len() + self.asked)
    }

    /// Whether a claim could go now: room for a job, not frozen or draining, fewer than
    /// [`Self::EXCHANGES_OUT`] in flight, not backing off.
    fn may_claim(&self) -> bool {
        self.room() > 0
            && !self.frozen
            && self.drain.is_none()
            && self.claims_out < Self::EXCHANGES_OUT
            && self.claim_backoff.ready()
    }

    /// Whether settlements could go now: some wait, fewer than [`Self::EXCHANGES_OUT`]
    /// batches in flight, not backing off.
    fn may_settle(&self) -> bool {
        self.batches_out < Self::EXCHANGES_OUT
            && !self.pending.is_empty()
            && self.settle_backoff.ready()
    }

    /// The claim for every free slot (up to the batch), from the next queue in turn.
    fn next_claim(&mut self) -> ClaimRequest {
        self.claim_linger.sent();
        let room = self.room();
        let queue = self.config.queues[self.next_queue % self.config.queues.len()].clone();
        self.next_queue = self.next_queue.wrapping_add(1);
        ClaimRequest {
            queue,
            kinds: self.kinds.clone(),
            worker: self.config.name.clone(),
            n: room.min(self.config.batch),
            ttl: self.config.lease_ttl,
        }
    }

    /// Asks for as many jobs as there is room for, once enough slots are free (or they have
    /// waited the linger); settlements waiting meanwhile go along in the same round trip.
    fn fill(&mut self, ctx: &mut Context<Self>) {
        if !self.may_claim() {
            return;
        }
        self.claim_linger.joined();
        let room = self.room();
        let full = self.config.refill_at();
        if !self.due_now(|w| &mut w.claim_linger, room, full, Self::fill, ctx) {
            return;
        }
        let batch = if self.may_settle() {
            self.settle_linger.sent();
            std::mem::take(&mut self.pending)
        } else {
            Vec::new()
        };
        let claim = self.next_claim();
        self.exchange(batch, Some(claim), ctx);
    }

    /// Sends finished jobs' settlements in one batch, with a claim for the free slots if one
    /// may go; more pile up while two are in flight, or while the batch lingers
    /// (`WorkerConfig::linger`).
    fn flush(&mut self, ctx: &mut Context<Self>) {
        if !self.may_settle() {
            return;
        }
        let (items, full) = (self.pending.len(), self.config.batch);
        if !self.due_now(|w| &mut w.settle_linger, items, full, Self::flush, ctx) {
            return;
        }
        let batch = std::mem::take(&mut self.pending);
        let claim = self.may_claim().then(|| self.next_claim());
        self.exchange(batch, claim, ctx);
    }

    /// Sends `batch`'s settlements and `claim` to the coordinator in one message (one round
    /// trip where the backend can) and handles each part's answer.
    fn exchange(
        &mut self,
        batch: Vec<Pending>,
        claim: Option<ClaimRequest>,
        ctx: &mut Context<Self>,
    ) {
        let (settling, claiming) = (!batch.is_empty(), claim.is_some());
        // Only what this exchange carries is in flight: a claim-only exchange leaves a
        // settlement batch already on its way alone, and the other way round.
        if settling {
            self.batches_out += 1;
            self.in_flight += batch.len();
        }
        let asked = claim.as_ref().map_or(0, |c| c.n);
        if claiming {
            self.claims_out += 1;
            self.asked += asked;
        }
        let sent = Instant::now();
        let request = self.coordinator.send(Exchange {
            settlements: batch
                .iter()
                .map(|p| Settle {
                    lease: p.lease,
                    job: p.job.id,
                    flow_step: p.job.flow.is_some(),
                    settlement: p.settlement.clone(),
                })
                .collect(),
            claim,
        });
        ctx.spawn(request.into_actor(self).map(move |reply, act, ctx| {
            let Exchanged { settled, claimed } = reply.unwrap_or_else(|closed| Exchanged {
                settled: settling.then(|| Err(closed.into())),
                claimed: claiming.then(|| Err(closed.into())),
            });
            if let Some(settled) = settled {
                act.settled(batch, settled, ctx);
            }
            if let Some(claimed) = claimed {
                act.claims_out -= 1;
                act.asked -= asked;
                act.claimed(claimed, sent, ctx);
            }
        }));
    }

    /// A claim's answer: starts the claimed jobs and asks for more if there is room.
    fn claimed(&mut self, result: Result<Vec<Claim>>, sent: Instant, ctx: &mut Context<Self>) {
        match result {
            Ok(claims) if self.drain.is_some() => {
                // The claim went out before the drain began: give the jobs straight back
                // (ready at once, nothing charged) instead of starting them.
                self.give_back(claims, ctx);
            }
            Ok(claims) => {
                let failures = self.claim_backoff.succeeded();
                if failures > 0 {
                    tracing::info!(worker = %self.config.name, failures, "claiming again");
                }
                if !claims.is_empty() {
                    // Renewed until its settlement is answered, whether its handler runs or
                    // not: one message for the batch, sent before any of them can settle.
                    let leases = claims.iter().map(|c| c.lease.clone()).collect();
                    self.renewal().do_send(TrackLeases(leases));
                    for claim in claims {
                        self.launch(claim, sent, ctx);
                    }
                    // Settlements of jobs that expired unrun go now, with a claim for the
                    // slots they left.
                    self.flush(ctx);
                    self.fill(ctx);
                }
            }
            Err(e) => {
                let backoff = self.claim_backoff.failed();
                crate::repeats::warn_repeated!(worker = %self.config.name, error = %e, ?backoff, "claim failed; backing off");
                counter!(m::BACKEND_ERRORS, "op" => "claim").increment(1);
            }
        }
        self.check_drained(ctx);
    }

    /// Releases `claims` unstarted; counted among the drain's released jobs.
    fn give_back(&mut self, claims: Vec<Claim>, ctx: &mut Context<Self>) {
        if claims.is_empty() {
            return;
        }
        tracing::info!(worker = %self.config.name, jobs = claims.len(), "draining: releasing jobs claimed as the drain began");
        self.released += claims.len();
        // Renewed until the release is answered, like any lease this worker holds.
        let leases = claims.iter().map(|c| c.lease.clone()).collect();
        self.renewal().do_send(TrackLeases(leases));
        for Claim { job, lease } in claims {
            let metrics = self.metrics(&job);
            self.queue_settlement(lease.id, Settlement::Release, Arc::new(job), metrics);
        }
        self.flush(ctx);
    }

    /// Adds a settlement to the next batch (the first one starts its linger).
    fn queue_settlement(
        &mut self,
        lease: LeaseId,
        settlement: Settlement,
        job: Arc<Job>,
        metrics: Arc<KindMetrics>,
    ) {
        self.settle_linger.joined();
        self.pending.push(Pending {
            lease,
            settlement,
            job,
            finished: Instant::now(),
            metrics,
        });
    }

    /// Starts `claim`'s handler; `sent` is when the claim that granted it was sent.
    fn launch(&mut self, claim: Claim, sent: Instant, ctx: &mut Context<Self>) {
        let Claim { job, lease } = claim;
        let job = Arc::new(job);
        let metrics = self.metrics(&job);
        let claim_to_start = metrics.claim_to_start.clone();
        let cancel = CancellationToken::new();
        let lease_id = lease.id;
        // The attempt's span continues the job's trace; its follow-up jobs and rejection
        // notes carry the attempt's own context (its trace id, for the operator).
        let span = crate::trace::job_span(&job, &lease, &self.config.name);
        if let Some(expired) = crate::policy::expired(&job, crate::store::unix_ms()) {
            span.record("palisade.outcome", "expired");
            if let Settlement::Dead { reason } = &expired {
                tracing::warn!(parent: &span, job = %job.id, kind = %job.kind, attempt = job.attempt, %reason, "job expired before it started: dead-lettered, not run");
            }
            metrics.finished[Outcome::Expired as usize].increment(1);
            // (Sent by `claimed` once the whole batch is launched: a flush from here would
            // claim for slots the batch's later jobs are about to take.)
            self.queue_settlement(lease_id, expired, job, metrics);
            return;
        }
        let timeout = self.registry.timeout_of(&job);
        let grace = self.config.timeout_grace;
        let trace = crate::trace::attempt_context(&span, &job);
        let state = Arc::new(RunState::new(
            job.id,
            self.coordinator.clone(),
            trace,
            self.config.name.clone(),
        ));
        let jctx = JobContext::new(
            job.clone(),
            lease,
            cancel.clone(),
            self.sinks.clone(),
            state.clone(),
        );
        let run = crate::attempt::start(&self.registry, &job, jctx);
        self.running.insert(
            lease_id,
            Running {
                job,
                metrics,
                cancel: cancel.clone(),
                started: Instant::now(),
                run: state,
                span: span.clone(),
                lost: false,
            },
        );
        let worker = ctx.address();
        actix::spawn(async move {
            claim_to_start.record(sent.elapsed());
            // The handler's own spans nest in the attempt's.
            let run = run.instrument(span.clone());
            let (outcome, timed_out) = crate::attempt::finish(run, timeout, grace, &cancel).await;
            crate::trace::record_attempt(&span, &outcome);
            drop(span);
            worker.do_send(JobFinished {
                lease: lease_id,
                outcome,
                timed_out,
            });
        });
    }

    /// Whether the batch of `items` kept by `which` goes out now (then its clock restarts);
    /// if not, `again` runs once its linger is over. Running handlers are what could still
    /// join a batch (finished jobs' settlements, freed slots).
    fn due_now(
        &mut self,
        which: fn(&mut Self) -> &mut Linger,
        items: usize,
        full: usize,
        again: fn(&mut Self, &mut Context<Self>),
        ctx: &mut Context<Self>,
    ) -> bool {
        let (more_coming, linger) = (!self.running.is_empty(), self.config.linger);
        match which(self).due(items, full, more_coming, linger) {
            Due::Now => {
                which(self).sent();
                true
            }
            Due::In(wait) => {
                if which(self).arm() {
                    ctx.run_later(wait, move |act, ctx| {
                        which(act).fired();
                        again(act, ctx);
                    });
                }
                false
            }
        }
    }

    /// A settlement batch's answer: forgets the leases, notes refusals, and keeps the batch
    /// for another try if the coordinator could not be reached. (Accepted completions'
    /// follow-ups and flow passes the coordinator starts from the settlements themselves.)
    fn settled(&mut self, batch: Vec<Pending>, result: Settled, ctx: &mut Context<Self>) {
        self.batches_out -= 1;
        self.in_flight -= batch.len();
        match result {
            Ok((results, watermark)) => {
                self.settle_backoff.succeeded();
                if let Some(w) = watermark {
                    self.sinks.observe_watermark(w);
                }
                let settled = batch.iter().map(|p| p.lease).collect();
                self.renewal().do_send(ForgetLeases(settled));
                for (p, result) in batch.iter().zip(results) {
                    p.metrics.settle_wait.record(p.finished.elapsed());
                    match result {
                        // Its follow-ups and flow pass the coordinator started.
                        Ok(()) => {}
                        Err(e @ Error::LeaseNotCurrent(_)) => {
                            tracing::warn!(lease = %p.lease, job = %p.job.id, error = %e, "settlement refused: the lease is no longer current (the job was cancelled, or it expired and was reaped)");
                            counter!(m::SETTLEMENTS_REFUSED, "queue" => p.job.queue.clone())
                                .increment(1);
                        }
                        Err(e) => {
                            // Refused for another reason (an exhausted epoch): the lease
                            // runs out and the reaper requeues the job.
                            tracing::error!(lease = %p.lease, job = %p.job.id, error = %e, "settlement failed");
                            counter!(m::BACKEND_ERRORS, "op" => "settle").increment(1);
                        }
                    }
                }
            }
            Err(e) if !e.is_retryable() => {
                // Retrying a permanent error repeats it forever: give the settlements
                // up loudly. Their leases run out and the reaper requeues the jobs (as
                // stalls), so nothing is lost.
                tracing::error!(error = %e, jobs = batch.len(), "settlement failed permanently; leaving the jobs to the reaper");
                counter!(m::BACKEND_ERRORS, "op" => "settle").increment(1);
                let settled = batch.iter().map(|p| p.lease).collect();
                self.renewal().do_send(ForgetLeases(settled));
            }
            Err(e) => {
                // Keep renewing and try again; if the leases expire first, the reaper
                // requeues the jobs and our late settlement is refused — never lost.
                let backoff = self.settle_backoff.failed();
                crate::repeats::warn_repeated!(error = %e, jobs = batch.len(), ?backoff, "settlement failed; retrying");
                counter!(m::BACKEND_ERRORS, "op" => "settle").increment(1);
                self.settle_linger.joined();
                self.pending.extend(batch);
            }
        }
        self.flush(ctx);
        self.check_drained(ctx);
    }

    fn check_drained(&mut self, ctx: &mut Context<Self>) {
        // A claim in flight may still bring jobs back, which must be given back before the
        // worker stops (or they would stay leased to a stopped worker until they expire).
        let idle = self.running.is_empty() && self.pending.is_empty() && self.in_flight == 0;
        if idle && self.claims_out == 0 {
            if let Some(done) = self.drain.take() {
                // Its heartbeat leaves with it: a last beat that lapses at once, so `status`
                // and the console stop listing a worker that drained (instead of for three
                // beats). Bounded: a coordinator that does not answer costs the drain a second.
                let farewell = self.coordinator.send(crate::coordinator::Beat(
                    self.heartbeat(),
                    Duration::from_millis(1),
                ));
                let farewell = tokio::time::timeout(Duration::from_secs(1), farewell);
                let released = self.released;
                ctx.wait(farewell.into_actor(self).map(move |_, _, ctx| {
                    let _ = done.send(Drained {
                        released,
                        unsettled: 0,
                    });
                    ctx.stop();
                }));
            }
        }
    }
}

impl Worker {
    /// How often a worker tells the coordinator it is alive ([`ControlStore::beat`]); its
    /// record lapses after three beats missed.
    ///
    /// [`ControlStore::beat`]: crate::ControlStore::beat
    const BEAT_EVERY: Duration = Duration::from_secs(5);

    /// Claims, and settlement batches, a worker keeps on their way at once: two, so that one
    /// is answered while the next is out. With one of each, a settle-only and a claim-only
    /// exchange went side by side, two backend calls where one carries both
    /// (docs/performance.md).
    const EXCHANGES_OUT: usize = 2;

    fn beat(&mut self) {
        let beat = self.heartbeat();
        self.coordinator
            .do_send(crate::coordinator::Beat(beat, Self::BEAT_EVERY * 3));
    }

    /// What this worker tells the coordinator of itself.
    fn heartbeat(&self) -> crate::store::WorkerBeat {
        crate::store::WorkerBeat {
            worker: self.config.name.clone(),
            host: hostname(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            queues: self.config.queues.clone(),
            concurrency: self.config.concurrency,
            running: self.running.len(),
            started_ms: self.started_ms,
            seen_ms: 0,
            formats: Some([*crate::format::LEVELS.start(), *crate::format::LEVELS.end()]),
            retry: Some(self.retry_summary.clone()),
        }
    }
}

/// The one log line of a settlement a worker sends (a completion at debug level).
fn log_settlement(span: &tracing::Span, job: &Job, settlement: &Settlement) {
    match &settlement {
        Settlement::Complete { .. } => {
            tracing::debug!(parent: span, job = %job.id, kind = %job.kind, "job completed")
        }
        Settlement::Retry { delay, reason } => {
            tracing::info!(parent: span, job = %job.id, kind = %job.kind, attempt = job.attempt, ?delay, %reason, "job will be retried")
        }
        Settlement::Dead { reason } => {
            tracing::warn!(parent: span, job = %job.id, kind = %job.kind, attempt = job.attempt, %reason, "job dead-lettered")
        }
        Settlement::Fenced { reason, .. } => {
            tracing::warn!(parent: span, job = %job.id, kind = %job.kind, %reason, "fenced off by a sink")
        }
        Settlement::Release => {
            tracing::info!(parent: span, job = %job.id, kind = %job.kind, "job released unfinished")
        }
        Settlement::Snooze { delay } => {
            tracing::debug!(parent: span, job = %job.id, kind = %job.kind, snoozes = job.snoozes + 1, ?delay, "job snoozed")
        }
    }
}

/// This host's name (Linux), or "worker".
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "worker".into())
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.beat();
        ctx.run_interval(Self::BEAT_EVERY, |act, _| act.beat());
        let renewal = Renewal::new(
            self.coordinator.clone(),
            ctx.address().recipient(),
            self.config.lease_ttl,
        );
        self.renewal = Some(renewal.start());
        ctx.run_interval(self.config.poll_interval, |act, ctx| {
            act.fill(ctx);
            act.flush(ctx);
        });
        self.fill(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        for running in self.running.values() {
            running.cancel.cancel();
        }
    }
}

impl Handler<LeaseLost> for Worker {
    type Result = ();

    fn handle(&mut self, msg: LeaseLost, _: &mut Self::Context) {
        if let Some(running) = self.running.get_mut(&msg.lease) {
            let why = match msg.reason {
                LossReason::Expired => "the coordinator no longer holds it: it expired and was reaped, or the job was cancelled",
                LossReason::Unconfirmed => "no renewal was confirmed before it expired",
            };
            tracing::warn!(parent: &running.span, job = %running.job.id, lease = %msg.lease, "lease lost ({why}); stopping its handler");
            running.lost = true;
            running.cancel.cancel();
        }
    }
}

/// A handler returned (or panicked).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct JobFinished {
    /// Lease it ran under.
    pub lease: LeaseId,
    /// What it returned.
    pub outcome: std::result::Result<(), JobError>,
    /// It ran past its timeout (`outcome` says so as a retry).
    pub timed_out: bool,
}

impl Handler<JobFinished> for Worker {
    type Result = ();

    fn handle(&mut self, msg: JobFinished, ctx: &mut Self::Context) {
        let Some(running) = self.running.remove(&msg.lease) else {
            if let Some(run) = self.released_runs.remove(&msg.lease) {
                self.journal(&run);
            }
            return;
        };
        let (job, span, metrics) = (running.job, running.span, running.metrics);
        self.journal(&running.run);
        running.run.flush_progress();
        let settlement = crate::attempt::settlement(
            &self.registry,
            self.config.retry,
            &job,
            &msg.outcome,
            &running.run,
        );
        let outcome = if msg.timed_out {
            let returned = match &msg.outcome {
                Ok(()) => "returned".to_owned(),
                Err(e) => e.to_string(),
            };
            tracing::warn!(parent: &span, job = %job.id, kind = %job.kind, attempt = job.attempt, %returned, "job timed out");
            Outcome::TimedOut
        } else {
            Outcome::of(&settlement)
        };
        if running.lost {
            // (Its settlement goes to a coordinator that refuses it: nothing is retried or
            // dead-lettered by this worker, whatever the handler returned.)
            tracing::info!(parent: &span, job = %job.id, kind = %job.kind, "handler stopped after its lease was lost; nothing settled by this worker");
        } else {
            log_settlement(&span, &job, &settlement);
        }
        metrics
            .duration
            .record(running.started.elapsed().as_secs_f64());
        metrics.finished[outcome as usize].increment(1);
        self.queue_settlement(msg.lease, settlement, job, metrics);
        self.flush(ctx);
        self.fill(ctx);
    }
}

impl Worker {
    /// Passes the fence rejections `run` met on to the coordinator's journal.
    fn journal(&self, run: &RunState) {
        let rejections = run.take_rejections();
        if !rejections.is_empty() {
            self.coordinator.do_send(NoteRejections(rejections));
        }
    }

    /// The metric handles of `job`'s (queue, kind): two lookups once known (a job takes them
    /// at its launch and keeps them to its settlement).
    fn metrics(&mut self, job: &Job) -> Arc<KindMetrics> {
        if let Some(known) = self.metrics.get(&job.queue).and_then(|k| k.get(&job.kind)) {
            return known.clone();
        }
        let handles = Arc::new(KindMetrics::new(&job.queue, &job.kind));
        let by_kind = self.metrics.entry(job.queue.clone()).or_default();
        by_kind.insert(job.kind.clone(), handles.clone());
        handles
    }

    /// The drain deadline passed: every unfinished job is given back to the coordinator
    /// (`Settlement::Release`: ready at once, no attempt, no stall) rather than left to
    /// expire, so a rolling restart charges nothing. Their handlers are cancelled; one that
    /// still writes is fenced once the job runs again.
    fn release_unfinished(&mut self, ctx: &mut Context<Self>) {
        if std::mem::replace(&mut self.deadline_passed, true) {
            return;
        }
        let unfinished: Vec<(LeaseId, Running)> = self.running.drain().collect();
        self.released += unfinished.len();
        if !unfinished.is_empty() {
            tracing::warn!(worker = %self.config.name, released = unfinished.len(), "drain deadline passed; releasing unfinished jobs");
        }
        for (lease, running) in unfinished {
            tracing::warn!(parent: &running.span, job = %running.job.id, "drain deadline passed: released unfinished, handler cancelled");
            running.cancel.cancel();
            self.journal(&running.run);
            self.released_runs.insert(lease, running.run.clone());
            running.metrics.finished[Outcome::Released as usize].increment(1);
            self.queue_settlement(lease, Settlement::Release, running.job, running.metrics);
        }
        self.flush(ctx);
        self.check_drained(ctx);
        // An unreachable coordinator cannot take the jobs back: stop anyway after a while;
        // their leases then expire and the reaper requeues them (as stalls).
        ctx.run_later(Self::RELEASE_TIMEOUT, |act, ctx| {
            if let Some(done) = act.drain.take() {
                let unsettled = act.pending.len() + act.in_flight;
                tracing::warn!(worker = %act.config.name, unsettled, "could not settle or release every job; stopping");
                let _ = done.send(Drained {
                    released: act.released,
                    unsettled,
                });
                ctx.stop();
            }
        });
    }
}

/// Fault injection (feature `testing`, never in a default build): `Freeze(true)` makes the
/// worker behave like a paused process — no claims, no renewals — while its handlers keep
/// running; `Freeze(false)` resumes.
#[cfg(feature = "testing")]
#[derive(Message)]
#[rtype(result = "()")]
pub struct Freeze(pub bool);

#[cfg(feature = "testing")]
impl Handler<Freeze> for Worker {
    type Result = ();

    fn handle(&mut self, msg: Freeze, ctx: &mut Self::Context) {
        self.frozen = msg.0;
        self.renewal().do_send(SuspendRenewals(msg.0));
        if !msg.0 {
            self.fill(ctx);
        }
    }
}

/// How a drain ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Jobs given back to the coordinator unfinished: still running at the deadline, or
    /// claimed just as the drain began (never started).
    pub released: usize,
    /// Settlements (releases included) that never reached the coordinator (it was
    /// unreachable); their leases expire and the reaper requeues the jobs as stalls.
    pub unsettled: usize,
}

/// Stops claiming, waits up to `deadline` for running handlers, then cancels the rest,
/// releases their jobs back to the coordinator (ready at once, no attempt or stall charged)
/// and stops. A second `Drain` while one runs only brings the deadline closer (an operator's
/// second Ctrl-C: `Duration::ZERO` releases at once); the first one's answer reports the
/// drain, the second answers `Drained::default()`.
#[derive(Message)]
#[rtype(result = "Drained")]
pub struct Drain {
    /// How long running handlers get to finish.
    pub deadline: Duration,
}

impl Handler<Drain> for Worker {
    type Result = ResponseFuture<Drained>;

    fn handle(&mut self, msg: Drain, ctx: &mut Self::Context) -> Self::Result {
        if self.drain.is_some() {
            tracing::info!(worker = %self.config.name, running = self.running.len(), deadline = ?msg.deadline, "drain cut short");
            ctx.run_later(msg.deadline, |act, ctx| {
                if act.drain.is_some() {
                    act.release_unfinished(ctx);
                }
            });
            return Box::pin(async { Drained::default() });
        }
        let (tx, rx) = oneshot::channel();
        self.drain = Some(tx);
        tracing::info!(worker = %self.config.name, running = self.running.len(), "draining");
        ctx.run_later(msg.deadline, |act, ctx| {
            if act.drain.is_some() {
                act.release_unfinished(ctx);
            }
        });
        self.check_drained(ctx);
        Box::pin(async move { rx.await.unwrap_or_default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linger_beyond_a_tenth_of_the_lease_is_refused() {
        let config = |linger| WorkerConfig {
            lease_ttl: Duration::from_secs(30),
            linger,
            ..WorkerConfig::new("w")
        };
        assert!(config(Duration::ZERO).validate().is_ok());
        assert!(config(Duration::from_secs(3)).validate().is_ok());
        let refused = config(Duration::from_millis(3001)).validate();
        assert!(
            matches!(&refused, Err(Error::Config(why)) if why.contains("linger")),
            "{refused:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_caps_and_resets() {
        let mut backoff = Backoff::default();
        assert!(backoff.ready());
        let waits: Vec<Duration> = (0..8).map(|_| backoff.failed()).collect();
        assert_eq!(waits[0], Duration::from_millis(200));
        assert_eq!(waits[1], Duration::from_millis(400));
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(waits[7], Duration::from_secs(5));
        assert!(!backoff.ready());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(backoff.ready());
        assert_eq!(backoff.succeeded(), 8);
        assert_eq!(backoff.failed(), Duration::from_millis(200));
    }
}
