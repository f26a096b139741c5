//! `Coordinator`: the actor façade over the coordinator's [`Stores`], plus the reaper that turns expired
//! leases into stalls.
//!
//! Handlers return `ResponseFuture`s: they touch no actor state, so many claims, renewals and
//! settlements from many workers overlap instead of queueing behind one another. What an
//! accepted settlement sets off (follow-ups, a flow pass) starts from the settlement here.

use std::time::Duration;

use actix::prelude::*;
use metrics::counter;

use crate::error::Result;
use crate::ids::{FencingToken, JobId, LeaseId};
use crate::job::{Claim, DeadJob, FollowUps, NewJob, QueueCounts, Settlement};
use crate::metrics as m;
use crate::sampler::Sampler;
use crate::store::{ClaimRequest, FlowStore, Inspect, LeaseStore, RecordStore, Stores};

/// Façade over a coordinator's [`Stores`]; one per process is enough. Workers drive its hot
/// path ([`LeaseStore`]); it reaps, and answers counts and dead letters ([`Inspect`]) and
/// results, progress and rejection notes ([`RecordStore`]).
pub struct Coordinator {
    store: Stores,
    reap_every: Duration,
    reaping: bool,
    /// A follow-up sweep is running (one at a time, beside the reaper, never delaying it).
    sweeping: bool,
    /// A flow pass is running (one at a time), and whether another was asked for meanwhile.
    flowing: bool,
    flow_again: bool,
    /// How often the queue-depth [`Sampler`] ticks; `None`: no sampler.
    sample_every: Option<Duration>,
    sampler: Option<Addr<Sampler>>,
    /// How often the [`Historian`](crate::Historian) notes a sample; `None`: never.
    history_every: Option<Duration>,
    historian: Option<Addr<crate::Historian>>,
}

impl Coordinator {
    /// Expired leases reaped per reaper pass; bounds one pass's cost on a remote backend.
    const REAP_BATCH: usize = 1000;

    /// A coordinator over `store` (`Arc::new(MemoryLeaseStore::new())`, or [`Stores`] from
    /// [`store::redis::coordinator`](crate::store::redis::coordinator)), reaping every second.
    pub fn new(store: impl Into<Stores>) -> Self {
        Self {
            store: store.into(),
            reap_every: Duration::from_secs(1),
            reaping: false,
            sweeping: false,
            flowing: false,
            flow_again: false,
            sample_every: None,
            sampler: None,
            history_every: Some(Duration::from_secs(60)),
            historian: None,
        }
    }

    /// Notes a sample of the fleet's counts for the console's charts every `every` while
    /// this process holds the coordinator's `history` role (one process per coordinator;
    /// one small write a minute by default); `None` turns it off.
    pub fn with_history_interval(mut self, every: Option<Duration>) -> Self {
        self.history_every = every;
        self
    }

    /// Samples queue depth for the metrics every `every` (clamped to 100 ms..=10 s, so the
    /// gauges never idle out of `/metrics` between samples) while this process holds the
    /// coordinator's `sampler` role — one process per coordinator samples (the `Sampler` actor).
    /// Off by default: turn it on in processes that serve `/metrics` (`palisade worker
    /// --metrics` does); a process without a recorder would hold the role and export nothing.
    pub fn with_sample_interval(mut self, every: Option<Duration>) -> Self {
        self.sample_every =
            every.map(|e| e.clamp(Duration::from_millis(100), Duration::from_secs(10)));
        self
    }

    /// Sets how often expired leases are looked for. A stalled job waits up to this long
    /// past its lease's expiry before it is claimable again.
    pub fn with_reap_interval(mut self, every: Duration) -> Self {
        // Zero would spin the arbiter.
        self.reap_every = every.max(Duration::from_millis(1));
        self
    }

    /// Delivers follow-up jobs the fast path never delivered (see [`FOLLOW_UP_GRACE`]), on the
    /// reaper's tick but as its own task.
    fn sweep(&mut self, ctx: &mut Context<Self>) {
        if std::mem::replace(&mut self.sweeping, true) {
            return;
        }
        let store = self.store.clone();
        let pass = async move { sweep_follow_ups(&store).await };
        ctx.spawn(pass.into_actor(self).map(|(), act, _| act.sweeping = false));
    }

    /// Moves flows on: records the ends of their steps and releases what that unblocks
    /// (`core/src/store/flows.rs`). One pass at a time; one asked for meanwhile runs after it.
    fn advance_flows(&mut self, ctx: &mut Context<Self>) {
        if self.flowing {
            self.flow_again = true;
            return;
        }
        self.flowing = true;
        let store = self.store.clone();
        let pass = async move {
            let started = std::time::Instant::now();
            // A full pass means more step ends are waiting: go on at once, a while at most.
            loop {
                match crate::flow_driver::advance(&store).await {
                    Ok(n)
                        if n == crate::flow_driver::ENDS_PER_PASS
                            && started.elapsed() < Duration::from_secs(1) => {}
                    Ok(_) => break,
                    Err(e) => {
                        crate::repeats::warn_repeated!(error = %e, "flow pass failed; will retry");
                        counter!(m::BACKEND_ERRORS, "op" => "flows").increment(1);
                        break;
                    }
                }
            }
        };
        ctx.spawn(pass.into_actor(self).map(|(), act, ctx| {
            act.flowing = false;
            if std::mem::take(&mut act.flow_again) {
                act.advance_flows(ctx);
            }
        }));
    }

    fn reap(&mut self, ctx: &mut Context<Self>) {
        self.sweep(ctx);
        self.advance_flows(ctx);
        if self.reaping {
            return;
        }
        self.reaping = true;
        let store = self.store.clone();
        let pass = async move { store.reap(Self::REAP_BATCH).await };
        ctx.spawn(pass.into_actor(self).map(|result, act, ctx| {
            act.reaping = false;
            match result {
                Ok(reaped) => {
                    let full = reaped.len() == Self::REAP_BATCH;
                    for r in reaped {
                        let outcome = if r.dead { "dead" } else { "requeued" };
                        crate::trace::stall(&r);
                        counter!(m::STALLS, "queue" => r.queue, "outcome" => outcome).increment(1);
                    }
                    // A full batch means more are waiting: keep going without waiting a tick.
                    if full {
                        act.reap(ctx);
                    }
                }
                Err(e) => {
                    crate::repeats::warn_repeated!(error = %e, "reaper pass failed; will retry");
                    counter!(m::BACKEND_ERRORS, "op" => "reap").increment(1);
                }
            }
        }));
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.reap_every, Self::reap);
        if let Some(every) = self.sample_every {
            self.sampler = Some(
                Sampler::new(self.store.inspect(), self.store.control(), every)
                    .with_flows(self.store.flows())
                    .with_admin(self.store.admin())
                    .start(),
            );
        }
        if let Some(every) = self.history_every {
            self.historian = Some(crate::Historian::new(self.store.clone(), every).start());
        }
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        // Its interval would keep it running on its own.
        if let Some(sampler) = self.sampler.take() {
            sampler.do_send(crate::sampler::StopSampling);
        }
        if let Some(historian) = self.historian.take() {
            historian.do_send(crate::history::StopHistory);
        }
    }
}

/// Reads a flow step's result (a flow step reading what a step it runs after returned): as
/// its flow's home keeps it, for as long as the flow; else the job's own result record (a
/// step whose end the home has not recorded yet cannot have released the reader, but a
/// result kept before the home kept results can).
#[derive(Message)]
#[rtype(result = "Result<Option<String>>")]
pub(crate) struct ReadStepResult {
    pub flow: crate::ids::FlowId,
    pub step: String,
}

impl Handler<ReadStepResult> for Coordinator {
    type Result = ResponseFuture<Result<Option<String>>>;

    fn handle(&mut self, msg: ReadStepResult, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move {
            match store.step_result(msg.flow, &msg.step).await? {
                Some(json) => Ok(Some(json)),
                None => {
                    store
                        .result(crate::flow::step_job_id(msg.flow, &msg.step))
                        .await
                }
            }
        })
    }
}

/// A durable run asks for a waitpoint's value, leaving its job as the waiter
/// ([`RecordStore::await_waitpoint`]).
#[derive(Message)]
#[rtype(result = "Result<Option<String>>")]
pub(crate) struct AwaitWaitpoint {
    pub id: String,
    pub waiter: crate::ids::JobId,
}

impl Handler<AwaitWaitpoint> for Coordinator {
    type Result = ResponseFuture<Result<Option<String>>>;

    fn handle(&mut self, msg: AwaitWaitpoint, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move { store.await_waitpoint(&msg.id, msg.waiter).await })
    }
}

/// A job completes a waitpoint and wakes its waiter ([`crate::client::complete_waitpoint`]).
#[derive(Message)]
#[rtype(result = "Result<crate::store::Completion>")]
pub(crate) struct CompleteWaitpoint {
    pub id: String,
    pub value: String,
}

impl Handler<CompleteWaitpoint> for Coordinator {
    type Result = ResponseFuture<Result<crate::store::Completion>>;

    fn handle(&mut self, msg: CompleteWaitpoint, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move {
            crate::client::complete_waitpoint(&store, &msg.id, msg.value, false).await
        })
    }
}

/// A worker process describes itself (`ControlStore::beat`); display only, so a failed beat
/// is logged at debug and counted, never retried.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Beat(pub crate::store::WorkerBeat, pub Duration);

impl Handler<Beat> for Coordinator {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, Beat(beat, ttl): Beat, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move {
            if let Err(e) = crate::store::ControlStore::beat(&store, beat, ttl).await {
                tracing::debug!(error = %e, "worker heartbeat failed; the next one tries again");
                metrics::counter!(crate::metrics::BACKEND_ERRORS, "op" => "beat").increment(1);
            }
        })
    }
}

/// Adds jobs.
#[derive(Message)]
#[rtype(result = "Result<Vec<JobId>>")]
pub struct Enqueue(pub Vec<NewJob>);

impl Handler<Enqueue> for Coordinator {
    type Result = ResponseFuture<Result<Vec<JobId>>>;

    fn handle(&mut self, msg: Enqueue, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move {
            let done = crate::enqueue::enqueue_counted(&store, msg.0).await?;
            Ok(done.into_iter().map(crate::Enqueued::id).collect())
        })
    }
}

/// A worker's settlements and its next claim, in one message — one round trip where the
/// backend can ([`LeaseStore::settle_and_claim`]). Either part may be absent.
#[derive(Message)]
#[rtype(result = "Exchanged")]
pub(crate) struct Exchange {
    /// Finished jobs to complete, retry, dead-letter or release, each checked by lease id.
    pub settlements: Vec<Settle>,
    /// Jobs to claim after them.
    pub claim: Option<ClaimRequest>,
}

/// One finished job's settlement, with what the coordinator needs to start what it sets off.
pub(crate) struct Settle {
    pub lease: LeaseId,
    /// The job (the parent of its follow-ups).
    pub job: JobId,
    /// The job is a flow step: its end, kept with the settlement, is for its flow.
    pub flow_step: bool,
    pub settlement: Settlement,
}

/// What an accepted settlement sets off: a flow pass (a flow step ended) and its follow-up
/// jobs and flows. Both were kept with the settlement, so starting them here is the fast
/// path; the reaper's tick (flows) and the follow-up sweep find what this never starts.
struct SetsOff {
    flow_step_ended: bool,
    follow_ups: Option<FollowUps>,
}

impl SetsOff {
    /// `None` for most settlements (nothing to set off), so a plain job costs nothing here.
    fn of(s: &Settle) -> Option<Self> {
        let follow_ups = match &s.settlement {
            Settlement::Complete { then, .. }
                if !then.jobs.is_empty() || !then.flows.is_empty() =>
            {
                Some(FollowUps {
                    parent: s.job,
                    jobs: then.jobs.clone(),
                    flows: then.flows.clone(),
                })
            }
            _ => None,
        };
        let flow_step_ended = s.flow_step
            && matches!(
                s.settlement,
                Settlement::Complete { .. } | Settlement::Dead { .. }
            );
        (flow_step_ended || follow_ups.is_some()).then_some(Self {
            flow_step_ended,
            follow_ups,
        })
    }

    /// Starts what the accepted ones of `sets_off` (by their settlement's position in
    /// `results`) set off: each follow-up set as a task of its own (a slow one delays no
    /// other, and none runs on the coordinator's thread), and one flow pass for all the flow
    /// steps that ended (the coordinator runs one at a time).
    fn start(
        sets_off: Vec<(usize, SetsOff)>,
        results: &[Result<()>],
        store: &Stores,
        coordinator: &Addr<Coordinator>,
    ) {
        let mut flow_step_ended = false;
        for (i, what) in sets_off {
            if !matches!(results.get(i), Some(Ok(()))) {
                continue;
            }
            flow_step_ended |= what.flow_step_ended;
            if let Some(set) = what.follow_ups {
                let store = store.clone();
                actix::spawn(async move { deliver_follow_ups(&store, set, "enqueued").await });
            }
        }
        if flow_step_ended {
            coordinator.do_send(FlowStepsEnded);
        }
    }
}

/// Asks for a flow pass now: a settlement that ended a flow step was accepted, its end kept
/// with it, so a message lost only waits for the reaper's tick.
#[derive(Message)]
#[rtype(result = "()")]
struct FlowStepsEnded;

impl Handler<FlowStepsEnded> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: FlowStepsEnded, ctx: &mut Self::Context) {
        self.advance_flows(ctx);
    }
}

/// Each settlement's result and the low watermark after them, or why none was settled.
pub(crate) type Settled = Result<(Vec<Result<()>>, Option<FencingToken>)>;

/// The answer to an [`Exchange`], one outcome per part it had.
pub(crate) struct Exchanged {
    /// Each settlement's result and the low watermark after them (for the worker's sinks).
    pub settled: Option<Settled>,
    /// The claims granted.
    pub claimed: Option<Result<Vec<Claim>>>,
}

impl Handler<Exchange> for Coordinator {
    type Result = ResponseFuture<Exchanged>;

    fn handle(&mut self, msg: Exchange, ctx: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        let Exchange { settlements, claim } = msg;
        let sets_off: Vec<(usize, SetsOff)> = settlements
            .iter()
            .enumerate()
            .filter_map(|(i, s)| SetsOff::of(s).map(|what| (i, what)))
            .collect();
        let coordinator = (!sets_off.is_empty()).then(|| ctx.address());
        let settlements: Vec<_> = settlements
            .into_iter()
            .map(|s| (s.lease, s.settlement))
            .collect();
        Box::pin(async move {
            let (settled, claimed) = match &claim {
                Some(c) if !settlements.is_empty() => {
                    let (settled, claimed) = store.settle_and_claim(settlements, c).await;
                    (Some(settled), Some(claimed))
                }
                Some(c) => (None, Some(c.on(&store).await)),
                None => (Some(store.settle(settlements).await), None),
            };
            if let (Some(c), Some(Ok(claims))) = (claim, &claimed) {
                counter!(m::CLAIMS, "queue" => c.queue).increment(claims.len() as u64);
            }
            if let (Some(coordinator), Some(Ok(results))) = (coordinator, &settled) {
                SetsOff::start(sets_off, results, &store, &coordinator);
            }
            Exchanged {
                settled: settled.map(|r| r.map(|results| (results, store.watermark()))),
                claimed,
            }
        })
    }
}

/// Extends leases; answers with the ones that are lost.
#[derive(Message)]
#[rtype(result = "Result<Vec<LeaseId>>")]
pub(crate) struct RenewLeases {
    /// Leases to extend.
    pub leases: Vec<LeaseId>,
    /// New length, from now.
    pub ttl: Duration,
}

impl Handler<RenewLeases> for Coordinator {
    type Result = ResponseFuture<Result<Vec<LeaseId>>>;

    fn handle(&mut self, msg: RenewLeases, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move { store.renew(&msg.leases, msg.ttl).await })
    }
}

/// Counts one queue.
#[derive(Message)]
#[rtype(result = "Result<QueueCounts>")]
pub struct CountJobs(pub String);

impl Handler<CountJobs> for Coordinator {
    type Result = ResponseFuture<Result<QueueCounts>>;

    fn handle(&mut self, msg: CountJobs, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move { store.counts(&msg.0).await })
    }
}

/// Lists dead-lettered jobs of a queue.
#[derive(Message)]
#[rtype(result = "Result<Vec<DeadJob>>")]
pub struct ListDead {
    /// Queue.
    pub queue: String,
    /// At most this many.
    pub limit: usize,
}

impl Handler<ListDead> for Coordinator {
    type Result = ResponseFuture<Result<Vec<DeadJob>>>;

    fn handle(&mut self, msg: ListDead, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move { store.dead(&msg.queue, msg.limit).await })
    }
}

/// Adds fence rejections to the coordinator's journal; best effort (a failure is logged and
/// counted, the rejections themselves were already refused and counted by the sink).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct NoteRejections(pub Vec<crate::store::RejectionNote>);

impl Handler<NoteRejections> for Coordinator {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: NoteRejections, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move {
            if let Err(e) = store.note_rejections(msg.0).await {
                tracing::warn!(error = %e, "could not journal fence rejections");
                metrics::counter!(crate::metrics::BACKEND_ERRORS, "op" => "note_rejections")
                    .increment(1);
            }
        })
    }
}

/// Keeps a job's latest progress; best effort (a failure is logged and counted). A job's
/// result goes with its completion instead (`Settlement::Complete`).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct PutProgress(pub crate::ids::JobId, pub String);

/// How long an accepted completion's follow-up jobs are left to the delivery its settlement
/// started before the coordinator's sweep enqueues them (a process killed right after the
/// completion was accepted, or a delivery that failed, never delivers them).
pub const FOLLOW_UP_GRACE: Duration = Duration::from_secs(10);

/// Follow-up sets one sweep delivers at most.
const FOLLOW_UP_SWEEP: usize = 100;

/// Delivers the follow-up jobs kept longer than [`FOLLOW_UP_GRACE`] (runs with the reaper).
async fn sweep_follow_ups(store: &Stores) {
    match store.follow_ups(FOLLOW_UP_GRACE, FOLLOW_UP_SWEEP).await {
        Ok(due) => {
            for set in due {
                deliver_follow_ups(store, set, "swept").await;
            }
        }
        Err(e) => {
            crate::repeats::warn_repeated!(error = %e, "follow-up sweep failed; will retry");
            counter!(m::BACKEND_ERRORS, "op" => "follow_ups").increment(1);
        }
    }
}

/// Enqueues `set` (each job has its fixed id, so a second delivery adds nothing) and then
/// forgets it. A transient failure leaves it for the sweep; after a permanent one the jobs
/// are enqueued one by one, and a job the store refuses for good is dropped loudly rather
/// than retried forever.
pub(crate) async fn deliver_follow_ups(store: &Stores, set: FollowUps, how: &'static str) {
    let FollowUps {
        parent,
        jobs,
        flows,
    } = set;
    // A batch is all or nothing: after a permanent refusal the jobs go one by one, so one job
    // the store refuses for good (a smaller payload limit than the worker's) does not take
    // the others down with it.
    let mut batches = vec![jobs];
    let mut alone = false;
    while let Some(batch) = batches.pop() {
        match crate::enqueue::enqueue_counted(store, batch.clone()).await {
            Ok(done) => count_delivered(&done, how),
            Err(e) if e.is_retryable() => {
                crate::repeats::warn_repeated!(parent = %parent, error = %e, "follow-up jobs not enqueued yet; the sweep tries again");
                counter!(m::BACKEND_ERRORS, "op" => "follow_ups").increment(1);
                return;
            }
            Err(e) if alone => {
                tracing::error!(parent = %parent, error = %e, "a follow-up job refused by enqueue for good; dropped");
                counter!(m::FOLLOW_UPS, "outcome" => "dropped").increment(1);
            }
            Err(_) => {
                alone = true;
                batches.extend(batch.into_iter().rev().map(|job| vec![job]));
            }
        }
    }
    // Then its flows, each created once (a second delivery finds it kept).
    for flow in &flows {
        match crate::flow_driver::create_unless_kept(store, flow).await {
            Ok(()) => {}
            Err(e) if e.is_retryable() => {
                crate::repeats::warn_repeated!(parent = %parent, flow = %flow.id(), error = %e, "follow-up flow not created yet; the sweep tries again");
                counter!(m::BACKEND_ERRORS, "op" => "follow_ups").increment(1);
                return;
            }
            Err(e) => {
                tracing::error!(parent = %parent, flow = %flow.id(), error = %e, "a follow-up flow refused for good; dropped");
                counter!(m::FOLLOW_UPS, "outcome" => "dropped").increment(1);
            }
        }
    }
    if let Err(e) = store.forget_follow_ups(parent).await {
        // Kept: the sweep enqueues them again (adding nothing) and forgets them then.
        crate::repeats::warn_repeated!(parent = %parent, error = %e, "could not forget delivered follow-up jobs");
        counter!(m::BACKEND_ERRORS, "op" => "follow_ups").increment(1);
    }
}

/// Counts delivered follow-ups: added now (as `how`, a debounced one folded into its pending
/// job too), or there already (`existing`: a second delivery of the same set, which added
/// nothing).
fn count_delivered(done: &[crate::Enqueued], how: &'static str) {
    let added = done
        .iter()
        .filter(|e| matches!(e, crate::Enqueued::Added(_) | crate::Enqueued::Debounced(_)))
        .count() as u64;
    counter!(m::FOLLOW_UPS, "outcome" => how).increment(added);
    counter!(m::FOLLOW_UPS, "outcome" => "existing").increment(done.len() as u64 - added);
}

impl Handler<PutProgress> for Coordinator {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: PutProgress, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move {
            if let Err(e) = store.put_progress(msg.0, msg.1).await {
                tracing::warn!(error = %e, "could not keep a job's progress");
                metrics::counter!(crate::metrics::BACKEND_ERRORS, "op" => "put_note").increment(1);
            }
        })
    }
}
