//! The harness's world: a memory lease store, memory sinks and a coordinator, and one
//! attempt run in it as a worker runs it (its lease renewed, its writes recorded, and for a
//! zombie held back at a gate); `drain` and the skips that fire schedules.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Addr};
use futures_util::future::BoxFuture;
use serde_json::Value as Json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Outcome, Performed, Ran, TestError, TestResult, Written, WORKER};
use crate::admission::Admission;
use crate::context::{JobContext, Probe, Registry, RunState, Sinks};
use crate::coordinator::Coordinator;
use crate::ids::{IdempotencyKey, JobId, Lease};
use crate::job::{Claim, JobState, JobView, NewJob, Settlement};
use crate::mutation::Mutation;
use crate::policy::RetryPolicy;
use crate::schedule::Schedule;
use crate::sink::FencedSink;
use crate::store::memory::{MemoryFencedStore, MemoryLeaseStore};
use crate::store::{ControlStore, FencedStore, LeaseStore, Stores};

/// One-second steps `drain` takes at most, in a row, while ready jobs stay unclaimable with
/// nothing due (a rate limit refilling takes a few; more is a queue that never empties).
const MAX_IDLE_STEPS: u32 = 600;

/// One world of stores, sinks and a coordinator: the harness's own, or a zombie scenario's.
#[derive(Clone)]
pub(super) struct World {
    pub(super) store: Arc<MemoryLeaseStore>,
    pub(super) stores: Stores,
    pub(super) coordinator: Addr<Coordinator>,
    pub(super) sinks: Sinks,
    pub(super) sink_stores: BTreeMap<String, Arc<MemoryFencedStore>>,
    pub(super) writes: Arc<Mutex<Vec<Written>>>,
    /// Runs so far per job (a run's number in [`Written::run`]).
    pub(super) runs: Arc<Mutex<HashMap<JobId, u32>>>,
}

/// What a world runs with: the user's registry and the harness's settings.
#[derive(Clone)]
pub(super) struct Settings {
    pub(super) registry: Registry,
    pub(super) retry: RetryPolicy,
    pub(super) lease: Duration,
    pub(super) grace: Duration,
    pub(super) max_runs: usize,
    pub(super) max_skip: Duration,
    pub(super) schedules: Vec<Schedule>,
    #[cfg(feature = "postgres")]
    pub(super) postgres: Vec<(String, Arc<crate::store::postgres::PostgresSink>)>,
}

/// Where a zombie's run stops, as a paused process stops: every write from its write at `at`
/// on (the settlement counts as the write after its last) waits until it is woken.
pub(super) struct Gate {
    pub(super) at: usize,
    pub(super) held: AtomicBool,
    pub(super) reached: Notify,
    pub(super) wake: tokio::sync::watch::Sender<bool>,
}

/// Records a run's writes in its world, and holds them back at its gate.
pub(super) struct Recorder {
    pub(super) job: JobId,
    pub(super) run: u32,
    /// The next write's position (a write takes it before it goes out).
    pub(super) next: AtomicUsize,
    pub(super) writes: Arc<Mutex<Vec<Written>>>,
    pub(super) gate: Option<Arc<Gate>>,
}

impl Recorder {
    /// Takes the next position; waits there while the run is held at its gate.
    fn pass(&self) -> BoxFuture<'static, usize> {
        let position = self.next.fetch_add(1, Ordering::Relaxed);
        match &self.gate {
            Some(gate) if position >= gate.at => {
                gate.held.store(true, Ordering::Relaxed);
                gate.reached.notify_one();
                let mut woken = gate.wake.subscribe();
                Box::pin(async move {
                    let _ = woken.wait_for(|w| *w).await;
                    position
                })
            }
            _ => Box::pin(async move { position }),
        }
    }

    /// The run has been held at its gate (from then on it renews nothing).
    fn held(&self) -> bool {
        self.gate
            .as_ref()
            .is_some_and(|g| g.held.load(Ordering::Relaxed))
    }
}

impl Probe for Recorder {
    fn before_write(&self) -> BoxFuture<'static, usize> {
        self.pass()
    }

    fn written(
        &self,
        position: usize,
        sink: &str,
        lease: &Lease,
        key: &IdempotencyKey,
        mutations: Option<Vec<Mutation>>,
        admission: &crate::error::Result<Admission>,
    ) {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Written {
                sink: sink.to_owned(),
                job: self.job,
                run: self.run,
                position,
                token: lease.token,
                key: key.clone(),
                mutations,
                answer: admission.as_ref().cloned().map_err(|e| e.to_string()),
            });
    }
}

impl World {
    /// A new world (started on the current actix system) whose tokens start in `epoch`.
    pub(super) async fn new(epoch: u32, sink_names: &[String], settings: &Settings) -> Self {
        let store = Arc::new(MemoryLeaseStore::with_epoch(epoch));
        let stores = Stores::from(store.clone());
        // Its reaper, flow passes and follow-up sweep run when the harness says (`tidy`), not
        // on a timer: the coordinator is here for what a handler asks of it.
        let coordinator = Coordinator::new(stores.clone())
            .with_reap_interval(Duration::from_secs(24 * 3600))
            .with_history_interval(None)
            .start();
        let mut world = Self {
            store,
            stores,
            coordinator,
            sinks: Sinks::new(),
            sink_stores: BTreeMap::new(),
            writes: Arc::default(),
            runs: Arc::default(),
        };
        for name in sink_names {
            world.add_sink(name);
        }
        #[cfg(feature = "postgres")]
        for (name, sink) in &settings.postgres {
            world.sinks = world
                .sinks
                .clone()
                .with_postgres(name.clone(), sink.clone());
        }
        #[cfg(not(feature = "postgres"))]
        let _ = settings;
        // Lets the actors start while the runtime runs (an actor first polled as the runtime
        // is dropped would start its timers with no reactor).
        tokio::task::yield_now().await;
        world
    }

    /// Adds a memory fenced sink `name` (on the current actix system).
    pub(super) fn add_sink(&mut self, name: &str) {
        let fenced = Arc::new(MemoryFencedStore::new());
        let actor = FencedSink::new(name, fenced.clone() as Arc<dyn FencedStore>);
        self.sinks = self.sinks.clone().with(name, actor.start());
        self.sink_stores.insert(name.to_owned(), fenced);
    }

    /// Enqueues `jobs` as a producer would.
    pub(super) async fn enqueue(&self, jobs: Vec<NewJob>) -> TestResult<Vec<JobId>> {
        let done = crate::enqueue::enqueue_counted(&self.stores, jobs).await?;
        Ok(done.into_iter().map(|e| e.id()).collect())
    }

    /// What the worker's and coordinator's timers would have done by now: schedule ticks,
    /// the reaper (expired leases), the follow-up sweep and flow passes.
    pub(super) async fn tidy(&self, settings: &Settings) -> TestResult<()> {
        let now = self.stores.now_ms().await?;
        let paused = match settings.schedules.is_empty() {
            true => Vec::new(),
            false => self.stores.paused_schedules().await?,
        };
        for schedule in &settings.schedules {
            let paused = paused.iter().any(|p| p == schedule.name());
            crate::scheduler::fire(&self.stores, schedule, now, paused).await?;
        }
        self.stores.reap(1000).await?;
        for set in self.stores.follow_ups(Duration::ZERO, 1000).await? {
            crate::coordinator::deliver_follow_ups(&self.stores, set, "swept").await;
        }
        while crate::flow_driver::advance(&*self.stores.flows()).await? > 0 {}
        // As a worker passes it on after each settlement: a sink refuses every token below
        // the coordinator's low watermark, so a run whose lease was reaped (and whose job was
        // buried, or is not claimed yet) is refused too.
        if let Some(watermark) = self.store.watermark() {
            self.sinks.observe_watermark(watermark);
        }
        Ok(())
    }

    /// Claims job `id` from its queue (giving back any other job it claims first).
    pub(super) async fn claim(&self, id: JobId, settings: &Settings) -> TestResult<Claim> {
        let view =
            self.stores.inspect().job(id).await?.ok_or_else(|| {
                TestError::NotClaimable(id, "it is not waiting in a queue".into())
            })?;
        self.stores.admin().run_now(id).await?;
        let queue = view.job.queue;
        let mut others = Vec::new();
        let found = loop {
            let claims = self.store.claim(&queue, WORKER, 1, settings.lease).await?;
            let Some(claim) = claims.into_iter().next() else {
                break None;
            };
            if claim.job.id == id {
                break Some(claim);
            }
            others.push((claim.lease.id, claim.job));
        };
        let ahead: Vec<String> = others
            .iter()
            .map(|(_, job)| format!("{} {:?}", job.id, job.kind))
            .collect();
        if !others.is_empty() {
            let released = others
                .into_iter()
                .map(|(lease, _)| (lease, Settlement::Release));
            self.store.settle(released.collect()).await?;
        }
        if let Some(claim) = found {
            return Ok(claim);
        }
        let why = if self.stores.admin().paused().await?.contains(&queue) {
            format!("its queue {queue:?} is paused")
        } else if !ahead.is_empty() {
            format!(
                "jobs ahead of it in its scope or group hold it back ({}): drain the queue to \
                 run them in order",
                ahead.join(", ")
            )
        } else {
            "its scope, group or rate limit holds it back".to_owned()
        };
        Err(TestError::NotClaimable(id, why))
    }

    /// Runs `claim`'s attempt to its settlement, as a worker does; a `gate` holds it back
    /// before one of its writes (or its settlement) until woken.
    pub(super) async fn run(
        &self,
        claim: Claim,
        settings: &Settings,
        gate: Option<Arc<Gate>>,
    ) -> TestResult<Performed> {
        let Claim { job, lease } = claim;
        let job = Arc::new(job);
        let run = {
            let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
            let n = runs.entry(job.id).or_default();
            *n += 1;
            *n
        };
        let recorder = Arc::new(Recorder {
            job: job.id,
            run,
            next: AtomicUsize::new(0),
            writes: self.writes.clone(),
            gate,
        });
        let state = Arc::new(
            RunState::new(job.id, self.coordinator.clone(), None, WORKER.into())
                .with_probe(recorder.clone()),
        );
        let (settlement, timed_out) = match crate::policy::expired(&job, crate::store::unix_ms()) {
            Some(expired) => (expired, false),
            None => {
                let cancel = CancellationToken::new();
                let ctx = JobContext::new(
                    job.clone(),
                    lease.clone(),
                    cancel.clone(),
                    self.sinks.clone(),
                    state.clone(),
                );
                let attempt = crate::attempt::start(&settings.registry, &job, ctx);
                let timeout = settings.registry.timeout_of(&job);
                let finished = crate::attempt::finish(attempt, timeout, settings.grace, &cancel);
                tokio::pin!(finished);
                let renewing = self.renew(&lease, &recorder, &cancel, settings);
                let (outcome, timed_out) = tokio::select! {
                    done = &mut finished => done,
                    () = renewing => finished.await,
                };
                let s = crate::attempt::settlement(
                    &settings.registry,
                    settings.retry,
                    &job,
                    &outcome,
                    &state,
                );
                (s, timed_out)
            }
        };
        state.flush_progress();
        // A held run holds its settlement back too (a paused process settles nothing).
        recorder.pass().await;
        let (follow_ups, flows, result) = match &settlement {
            Settlement::Complete { result, then } => (
                then.jobs.clone(),
                then.flows.iter().map(|f| f.id()).collect(),
                result
                    .as_deref()
                    .and_then(|r| crate::client::decode_result::<Json>(job.id, r).ok()),
            ),
            _ => (Vec::new(), Vec::new(), None),
        };
        let mut settled = self
            .store
            .settle(vec![(lease.id, settlement.clone())])
            .await?;
        let outcome = match settled.pop().unwrap_or(Ok(())) {
            Err(e) => Outcome::Refused {
                error: e.to_string(),
            },
            Ok(()) => {
                // Its follow-ups, kept with the completion, are delivered by the sweep here.
                self.tidy(settings).await?;
                outcome_of(&settlement)
            }
        };
        let writes = self
            .writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|w| w.job == job.id && w.run == run)
            .cloned()
            .collect();
        Ok(Performed {
            job: (*job).clone(),
            outcome,
            timed_out,
            writes,
            follow_ups,
            flows,
            result,
        })
    }

    /// Renews `lease` every third of it while its run goes on, as a worker's `Renewal` does;
    /// ends when the run is held at its gate (a paused process renews nothing) or the lease
    /// is lost (then the handler's token is cancelled, as a worker cancels it).
    pub(super) async fn renew(
        &self,
        lease: &Lease,
        recorder: &Recorder,
        cancel: &CancellationToken,
        settings: &Settings,
    ) {
        loop {
            tokio::time::sleep(settings.lease / 3).await;
            if recorder.held() {
                return;
            }
            match self.store.renew(&[lease.id], settings.lease).await {
                Ok(lost) if lost.is_empty() => {}
                _ => {
                    cancel.cancel();
                    return;
                }
            }
        }
    }

    /// Runs `queue` (every queue when `None`) until nothing waits in it, skipping time to the
    /// next delayed job when nothing is ready; `only` stops once that job has ended.
    pub(super) async fn drain(
        &self,
        queue: Option<&str>,
        only: Option<JobId>,
        settings: &Settings,
    ) -> TestResult<Ran> {
        let mut ran = Ran::default();
        // Seconds in a row skipped with ready jobs none of which could be claimed.
        let mut idle = 0;
        loop {
            self.tidy(settings).await?;
            if let Some(id) = only {
                if self.stores.inspect().job(id).await?.is_none() {
                    return Ok(ran);
                }
            }
            let queues = match queue {
                Some(q) => vec![q.to_owned()],
                None => self.stores.inspect().queues().await?,
            };
            let mut claimed = None;
            for q in &queues {
                if let Some(c) = self.store.claim(q, WORKER, 1, settings.lease).await?.pop() {
                    claimed = Some(c);
                    break;
                }
            }
            if let Some(claim) = claimed {
                if ran.runs.len() >= settings.max_runs {
                    self.store
                        .settle(vec![(claim.lease.id, Settlement::Release)])
                        .await?;
                    return Err(self.never_ends(queue, &ran, &queues, "").await);
                }
                // (A durable run's journal clearing runs as a worker runs it, unlisted: what
                // the user's jobs did is what `Ran` shows.)
                let clearing = claim.job.kind == crate::durable::CLEAR;
                let performed = self.run(claim, settings, None).await?;
                if !clearing {
                    ran.runs.push(performed);
                }
                idle = 0;
                continue;
            }
            // Nothing ready: skip to the next delayed job (or the next lease to run out).
            let mut next: Option<Duration> = None;
            let mut waiting = 0;
            for q in &queues {
                let counts = self.stores.inspect().counts(q).await?;
                waiting += counts.ready + counts.delayed + counts.leased + counts.waiting;
                let due = self.stores.inspect().delayed(q, 1).await?;
                if let Some(d) = due.first().and_then(|v| v.due_in) {
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
                if counts.leased > 0 {
                    next = Some(next.map_or(settings.lease, |n| n.min(settings.lease)));
                }
            }
            if waiting == 0 {
                return Ok(ran);
            }
            // Ready yet not claimable, with nothing due: a paused queue waits for good; a
            // rate limit or a group's for its bucket to refill, a second at a time, a while.
            if next.is_none() {
                let paused = self.stores.admin().paused().await?;
                let stuck: Vec<&String> = queues.iter().filter(|q| paused.contains(q)).collect();
                idle += 1;
                if !stuck.is_empty() || idle > MAX_IDLE_STEPS {
                    let why = match stuck.is_empty() {
                        true => format!("ready jobs stayed unclaimable for {idle} s"),
                        false => format!("paused queues {stuck:?}"),
                    };
                    return Err(self.never_ends(queue, &ran, &queues, &why).await);
                }
            }
            let step = next
                .unwrap_or(Duration::from_secs(1))
                .max(Duration::from_millis(1));
            if ran.skipped + step > settings.max_skip {
                return Err(self.never_ends(queue, &ran, &queues, "").await);
            }
            self.skip(step, settings).await?;
            ran.skipped += step;
        }
    }

    /// Moves time on by `by`, stopping at each schedule tick on the way to fire it, as a
    /// running scheduler would (one jump would fire only the ticks its catch-up keeps).
    pub(super) async fn skip(&self, by: Duration, settings: &Settings) -> TestResult<()> {
        let mut left = by;
        loop {
            let now = self.stores.now_ms().await?;
            let mut next: Option<i64> = None;
            for schedule in &settings.schedules {
                let mark = self.stores.schedule_mark(schedule.name()).await?;
                if let Some(tick) = schedule.next_fired(mark, now) {
                    next = Some(next.map_or(tick, |n| n.min(tick)));
                }
            }
            let to_tick = next
                .and_then(|t| u64::try_from(t.saturating_sub(now)).ok())
                .map(Duration::from_millis);
            match to_tick {
                Some(wait) if wait <= left => {
                    // (Past the tick by a millisecond: the wall clock is read in whole ms.)
                    let step = (wait + Duration::from_millis(1)).min(left);
                    palisade_core::clock::skip(step);
                    left -= step;
                    self.tidy(settings).await?;
                }
                _ => {
                    palisade_core::clock::skip(left);
                    return self.tidy(settings).await;
                }
            }
        }
    }

    pub(super) async fn never_ends(
        &self,
        queue: Option<&str>,
        ran: &Ran,
        queues: &[String],
        why: &str,
    ) -> TestError {
        let mut left = Vec::new();
        if !why.is_empty() {
            left.push(format!("({why})"));
        }
        for q in queues {
            let inspect = self.stores.inspect();
            let ready = inspect.ready(q, 20).await.unwrap_or_default();
            let delayed = inspect.delayed(q, 20).await.unwrap_or_default();
            for v in ready.iter().chain(&delayed) {
                left.push(describe(v));
            }
        }
        TestError::NeverEnds {
            queue: queue.unwrap_or("(every queue)").to_owned(),
            runs: ran.runs.len(),
            skipped: ran.skipped,
            left: if left.is_empty() {
                "jobs still leased".into()
            } else {
                left.join("; ")
            },
        }
    }

    /// Every job waiting (ready, delayed, or behind its scope's or group's running job), in
    /// any queue.
    pub(super) async fn waiting(&self) -> TestResult<Vec<JobView>> {
        let inspect = self.stores.inspect();
        let mut all = Vec::new();
        for id in self.store.live_jobs() {
            if let Some(view) = inspect.job(id).await? {
                if matches!(
                    view.state,
                    JobState::Ready | JobState::Waiting | JobState::Delayed
                ) {
                    all.push(view);
                }
            }
        }
        Ok(all)
    }
}

/// One line about a waiting job.
pub(super) fn describe(v: &JobView) -> String {
    let due = v
        .due_in
        .map(|d| format!(", due in {d:?}"))
        .unwrap_or_default();
    let error = v
        .last_error
        .as_deref()
        .map(|e| format!(", last error {e:?}"))
        .unwrap_or_default();
    format!(
        "{} {:?} in {:?} (attempt {}{due}{error}) payload {}",
        v.job.id, v.job.kind, v.job.queue, v.job.attempt, v.job.payload
    )
}

pub(super) fn outcome_of(settlement: &Settlement) -> Outcome {
    match settlement {
        Settlement::Complete { .. } => Outcome::Completed,
        Settlement::Retry { delay, reason } => Outcome::Retry {
            after: *delay,
            reason: reason.clone(),
        },
        Settlement::Dead { reason } => Outcome::Dead {
            reason: reason.clone(),
        },
        Settlement::Release => Outcome::Released,
        Settlement::Snooze { delay } => Outcome::Snoozed { after: *delay },
        Settlement::Fenced { reason, .. } => Outcome::Fenced {
            reason: reason.clone(),
        },
    }
}
