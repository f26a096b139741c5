//! Flow simulation (issue 25): random flows run by simulated workers on one seeded RNG —
//! claims, completions, failures, workers paused past their lease that complete late, reaps,
//! flow passes run twice or skipped, releases delivered again — with every step recorded and
//! two invariants checked over the history:
//!
//! - **no step starts early**: a step's job is claimed only after every step it runs after
//!   has ended (an accepted completion, or dead);
//! - **each step once**: a step's job has at most one accepted completion, and when the flow
//!   has settled, every step has ended, and the callback (which runs anyway) ran and ended.
//!
//! `planted_bugs_are_caught`: a store that reports a step's end when its job is *claimed*
//! (an attempt, not an accepted settlement), and one that releases a dependent while one of its
//! dependencies is still running, both make the checkers fail.
//!
//! `PALISADE_FLOW_SIM_SEEDS=N` runs N seeds on the memory store (default 300); the Redis
//! variant runs 5 on a private server (real time).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use palisade::store::{FlowStore, Stores};
use palisade::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const QUEUE: &str = "sim";

#[derive(Clone, Debug)]
enum Event {
    Claimed { step: String },
    Completed { step: String },
    Died { step: String },
}

/// What the planted stores do wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    None,
    /// A step's end is reported when its job is claimed, not when it settles.
    EndOnAttempt,
    /// A step is released while one of its dependencies has not ended.
    EarlyRelease,
}

/// A flow store that plants `bug` in front of the real one.
struct Planted {
    inner: Stores,
    bug: Bug,
    /// Jobs claimed so far, with their flow step (for `EndOnAttempt`).
    claimed: Mutex<Vec<(JobId, FlowStep)>>,
    flow: Mutex<Option<Flow>>,
}

#[async_trait]
impl FlowStore for Planted {
    async fn hold(&self, jobs: Vec<(NewJob, FlowStep)>) -> Result<()> {
        self.inner.hold(jobs).await
    }
    async fn release(&self, releases: Vec<Release>) -> Result<Vec<JobId>> {
        self.inner.release(releases).await
    }
    async fn step_ends(&self, max: usize) -> Result<Vec<StepEnded>> {
        let mut ends = self.inner.step_ends(max).await?;
        if self.bug == Bug::EndOnAttempt {
            for (job, step) in self.claimed.lock().unwrap().iter() {
                ends.push(StepEnded {
                    job: *job,
                    flow: step.flow,
                    step: step.step.clone(),
                    end: StepEnd::Completed,
                    added: Vec::new(),
                    at_ms: 0,
                    result: None,
                });
            }
        }
        Ok(ends)
    }
    async fn forget_step_ends(&self, jobs: &[JobId]) -> Result<()> {
        self.inner.forget_step_ends(jobs).await
    }
    async fn put_flow(&self, flow: &Flow) -> Result<(bool, Vec<Release>)> {
        *self.flow.lock().unwrap() = Some(flow.clone());
        self.inner.put_flow(flow).await
    }
    async fn grow_flow(&self, flow: FlowId, step: &str, added: &[palisade::Step]) -> Result<()> {
        self.inner.grow_flow(flow, step, added).await
    }
    async fn advance_flow(
        &self,
        flow: FlowId,
        ended: &[(String, StepEnd)],
        applied: &[String],
    ) -> Result<Vec<Release>> {
        let mut releases = self.inner.advance_flow(flow, ended, applied).await?;
        if self.bug == Bug::EarlyRelease {
            // Every step with at least one dependency ended is released (to run).
            let status = self.inner.flow(flow).await?.expect("kept");
            let planned = self.flow.lock().unwrap().clone().expect("put");
            for s in planned.steps() {
                let one_ended = s.after.iter().any(|e| status.ended.contains_key(&e.step));
                if one_ended && !releases.iter().any(|r| r.step == s.name) {
                    releases.push(Release {
                        flow,
                        step: s.name.clone(),
                        job: planned.job_id(&s.name),
                        scope: s.job.scope.clone(),
                        action: ReleaseAction::Run,
                    });
                }
            }
        }
        Ok(releases)
    }
    async fn cancel_flow(&self, flow: FlowId) -> Result<Option<(Vec<Release>, Vec<JobId>)>> {
        self.inner.cancel_flow(flow).await
    }
    async fn held_jobs(&self, older_than: Duration, max: usize) -> Result<Vec<Release>> {
        self.inner.held_jobs(older_than, max).await
    }
    async fn unreleased_flows(&self, older_than: Duration, max: usize) -> Result<Vec<FlowId>> {
        self.inner.unreleased_flows(older_than, max).await
    }
    async fn flow(&self, id: FlowId) -> Result<Option<FlowStatus>> {
        self.inner.flow(id).await
    }
    async fn running_flows(&self, max: usize) -> Result<(u64, Vec<(FlowId, u64)>)> {
        self.inner.running_flows(max).await
    }
    async fn keep_results(&self, flow: FlowId, results: &[(String, String)]) -> Result<()> {
        self.inner.keep_results(flow, results).await
    }
    async fn step_result(&self, flow: FlowId, step: &str) -> Result<Option<String>> {
        self.inner.step_result(flow, step).await
    }
}

/// One pass of the flow driver (the coordinator's own), through `flows`.
async fn pass(flows: &dyn FlowStore) {
    palisade::store::advance_flows(flows).await.unwrap();
}

/// A random flow: steps `s0..sN`, each after a random set of earlier ones with random
/// edges; a batch-like callback `cb` after every other step (run anyway); some steps always
/// fail.
fn random_flow(rng: &mut StdRng) -> (Flow, HashSet<String>) {
    let n = rng.random_range(2..10);
    let policies = [OnDead::Fail, OnDead::Skip, OnDead::Run];
    let mut flow = Flow::new();
    let mut failing = HashSet::new();
    let names: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    for i in 0..n {
        let mut after = Vec::new();
        for earlier in &names[..i] {
            if rng.random_bool(0.3) {
                after.push((earlier.as_str(), policies[rng.random_range(0..3)]));
            }
        }
        let scope = rng
            .random_bool(0.3)
            .then(|| format!("scope-{}", rng.random_range(0..2)));
        let mut job = NewJob::raw("k", "null")
            .with_queue(QUEUE)
            .with_max_attempts(2);
        if let Some(scope) = scope {
            job = job.with_scope(scope);
        }
        if rng.random_bool(0.15) {
            failing.insert(names[i].clone());
        }
        flow = flow.step_with(names[i].clone(), job, after);
    }
    let flow = flow.on_complete(NewJob::raw("k", "null").with_queue(QUEUE));
    (flow, failing)
}

/// Runs one seed; returns the history and the flow, or panics on a store error.
async fn run(seed: u64, stores: Stores, bug: Bug, tick: Duration) -> (Vec<Event>, Flow, Stores) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (flow, failing) = random_flow(&mut rng);
    let planted = Arc::new(Planted {
        inner: stores.clone(),
        bug,
        claimed: Mutex::new(Vec::new()),
        flow: Mutex::new(None),
    });
    let stores = stores.with_flows(planted.clone());
    let client = Client::new(stores.clone());
    client.create_flow(&flow).await.unwrap();
    let mut history = Vec::new();
    // Claims held by simulated workers: (lease, step, paused).
    let mut held: Vec<(LeaseId, String, bool)> = Vec::new();
    let ttl = tick * 3;
    for _ in 0..400 {
        match rng.random_range(0..10) {
            0..=2 => {
                let claims = stores.claim(QUEUE, "w", 3, ttl).await.unwrap();
                note_unrun(&mut history, &stores, &flow).await;
                for c in claims {
                    let step = c.job.flow.clone().unwrap();
                    history.push(Event::Claimed {
                        step: step.step.clone(),
                    });
                    planted
                        .claimed
                        .lock()
                        .unwrap()
                        .push((c.job.id, step.clone()));
                    // Some holders pause past their lease and settle late.
                    held.push((c.lease.id, step.step, rng.random_bool(0.2)));
                }
            }
            3..=5 if !held.is_empty() => {
                let i = rng.random_range(0..held.len());
                if held[i].2 {
                    continue; // paused: settles only after a sleep
                }
                let (lease, step, _) = held.swap_remove(i);
                let fails = failing.contains(&step);
                let settlement = if fails {
                    Settlement::Dead {
                        reason: "always fails".into(),
                    }
                } else {
                    Settlement::completed()
                };
                let answer = stores.settle(vec![(lease, settlement)]).await.unwrap();
                if answer[0].is_ok() {
                    history.push(if fails {
                        Event::Died { step }
                    } else {
                        Event::Completed { step }
                    });
                }
            }
            6 => {
                // Time passes: leases of paused holders run out; the paused wake and settle.
                sleep(tick * 4).await;
                for r in stores.reap(100).await.unwrap() {
                    if r.dead {
                        let step = planted
                            .claimed
                            .lock()
                            .unwrap()
                            .iter()
                            .find(|(j, _)| *j == r.job)
                            .map(|(_, s)| s.step.clone())
                            .unwrap();
                        history.push(Event::Died { step });
                    }
                }
                for h in held.iter_mut() {
                    h.2 = false;
                }
            }
            7 | 8 => pass(planted.as_ref()).await,
            _ => {
                // A pass run twice at once (two coordinators), or releases delivered again.
                pass(planted.as_ref()).await;
                pass(planted.as_ref()).await;
            }
        }
    }
    // Settle everything: no more pauses or failures of the simulated kind, just finish.
    for _ in 0..200 {
        for (lease, step, _) in held.drain(..) {
            let fails = failing.contains(&step);
            let settlement = if fails {
                Settlement::Dead {
                    reason: "always fails".into(),
                }
            } else {
                Settlement::completed()
            };
            if stores.settle(vec![(lease, settlement)]).await.unwrap()[0].is_ok() {
                history.push(if fails {
                    Event::Died { step }
                } else {
                    Event::Completed { step }
                });
            }
        }
        sleep(tick * 4).await;
        for r in stores.reap(100).await.unwrap() {
            if r.dead {
                let claimed = planted.claimed.lock().unwrap();
                let step = claimed
                    .iter()
                    .find(|(j, _)| *j == r.job)
                    .map(|(_, s)| s.step.clone());
                history.push(Event::Died {
                    step: step.unwrap(),
                });
            }
        }
        pass(planted.as_ref()).await;
        let claims = stores.claim(QUEUE, "w", 10, ttl).await.unwrap();
        note_unrun(&mut history, &stores, &flow).await;
        for c in claims {
            let step = c.job.flow.clone().unwrap();
            history.push(Event::Claimed {
                step: step.step.clone(),
            });
            planted
                .claimed
                .lock()
                .unwrap()
                .push((c.job.id, step.clone()));
            held.push((c.lease.id, step.step, false));
        }
        if held.is_empty()
            && client.flow(flow.id()).await.unwrap().unwrap().state != FlowState::Running
        {
            break;
        }
    }
    (history, flow, stores)
}

/// Steps the flow ended without running them (decided dead on a fail edge, or skipped) enter
/// the history as ended when first seen — only steps never claimed, so a store that reports a
/// claimed step's end early is not excused by it.
async fn note_unrun(history: &mut Vec<Event>, stores: &Stores, flow: &Flow) {
    let status = stores.flow(flow.id()).await.unwrap().unwrap();
    let seen: HashSet<String> = history
        .iter()
        .map(|e| match e {
            Event::Claimed { step } | Event::Completed { step } | Event::Died { step } => {
                step.clone()
            }
        })
        .collect();
    let mut unrun: Vec<&String> = status
        .ended
        .iter()
        .filter(|(step, end)| **end != StepEnd::Completed && !seen.contains(*step))
        .map(|(step, _)| step)
        .collect();
    unrun.sort();
    for step in unrun {
        history.push(Event::Died { step: step.clone() });
    }
}

async fn sleep(d: Duration) {
    tokio::time::sleep(d).await;
}

/// The invariants; `Err` names the first broken one.
async fn check(history: &[Event], flow: &Flow, stores: &Stores) -> std::result::Result<(), String> {
    let after: HashMap<&str, Vec<&str>> = flow
        .steps()
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                s.after.iter().map(|e| e.step.as_str()).collect(),
            )
        })
        .collect();
    let mut ended: BTreeSet<&str> = BTreeSet::new();
    let mut completed: HashMap<&str, usize> = HashMap::new();
    for (i, e) in history.iter().enumerate() {
        match e {
            Event::Claimed { step } => {
                if let Some(dep) = after[step.as_str()].iter().find(|d| !ended.contains(*d)) {
                    return Err(format!(
                        "no step starts early: {step} claimed at event {i} before {dep} ended"
                    ));
                }
            }
            Event::Completed { step } => {
                ended.insert(step);
                *completed.entry(step).or_default() += 1;
                if completed[step.as_str()] > 1 {
                    return Err(format!("each step once: {step} completed twice"));
                }
            }
            Event::Died { step } => {
                ended.insert(step);
            }
        }
    }
    let status = stores.flow(flow.id()).await.unwrap().unwrap();
    if status.state == FlowState::Running {
        return Err(format!("the flow never settled: {status:?}"));
    }
    // The callback runs anyway: it ran and ended — completed once (at most once is checked
    // above), or died like any job that ran out of stalls.
    if !ended.contains("on_complete") {
        return Err("each step once: the callback never ended".into());
    }
    Ok(())
}

fn seeds() -> u64 {
    std::env::var("PALISADE_FLOW_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300)
}

#[tokio::test(start_paused = true)]
async fn flow_invariants_hold_on_the_memory_store() {
    for seed in 0..seeds() {
        let stores = Stores::from(Arc::new(MemoryLeaseStore::new()));
        let (history, flow, stores) = run(seed, stores, Bug::None, Duration::from_secs(1)).await;
        if let Err(why) = check(&history, &flow, &stores).await {
            panic!("seed {seed}: {why}\n{history:?}");
        }
    }
}

#[tokio::test]
async fn flow_invariants_hold_on_redis() {
    let server = palisade_testkit::RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    for seed in 0..5 {
        let stores = palisade::store::redis::coordinator(
            pool.clone(),
            &format!("sim{seed}"),
            2,
            0,
            1 << 20,
            |s| s,
        )
        .unwrap();
        let (history, flow, stores) = run(seed, stores, Bug::None, Duration::from_millis(15)).await;
        if let Err(why) = check(&history, &flow, &stores).await {
            panic!("seed {seed}: {why}\n{history:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn planted_bugs_are_caught() {
    for (bug, invariant) in [
        (Bug::EndOnAttempt, "no step starts early"),
        (Bug::EarlyRelease, "no step starts early"),
    ] {
        let mut caught = None;
        for seed in 0..200 {
            let stores = Stores::from(Arc::new(MemoryLeaseStore::new()));
            let (history, flow, stores) = run(seed, stores, bug, Duration::from_secs(1)).await;
            if let Err(why) = check(&history, &flow, &stores).await {
                caught = Some(why);
                break;
            }
        }
        let why = caught.unwrap_or_else(|| panic!("{bug:?} went unnoticed in 200 seeds"));
        assert!(why.contains(invariant), "{bug:?}: {why}");
    }
}
