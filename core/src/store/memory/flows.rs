//! The memory store's flows: held jobs and step ends of its partition, and the flows it is
//! home to (the rule is `flow::Home`'s; this file keeps them under the store's one lock).

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{lock, LeaseState, MemoryLeaseStore};
use crate::error::Result;
use crate::flow::{
    Flow, FlowStatus, FlowStep, Home, Release, ReleaseAction, Step, StepEnd, StepEnded,
};
use crate::ids::{FlowId, JobId};
use crate::job::{Job, NewJob};
use crate::store::FlowStore;

/// A flow at its home, with when its unconfirmed releases were decided and when it finished.
#[derive(Debug)]
pub(super) struct KeptFlow {
    home: Home,
    /// When it was kept (unix ms, as the Redis store's list of running flows).
    created_ms: u64,
    decided_at: Instant,
    finished_at: Option<Instant>,
}

impl LeaseState {
    /// A flow step's job ended here: kept until its flow's home recorded it.
    pub(super) fn step_ended(
        &mut self,
        job: &Job,
        end: StepEnd,
        added: Vec<Step>,
        result: Option<&str>,
    ) {
        let Some(step) = &job.flow else {
            return;
        };
        self.ended_steps.insert(job.id, crate::clock::now());
        if self.step_end_of.contains_key(&job.id) {
            return;
        }
        let seq = self.next_seq();
        self.step_end_of.insert(job.id, seq);
        self.step_ends.insert(
            seq,
            StepEnded {
                job: job.id,
                flow: step.flow,
                step: step.step.clone(),
                end,
                added,
                at_ms: crate::store::unix_ms(),
                // (An empty result is none, as the Redis store's record keeps it.)
                // (Copied only for a flow step: every other completion passes it by.)
                result: result.filter(|r| !r.is_empty()).map(str::to_owned),
            },
        );
    }

    /// Forgets flows finished more than [`FLOW_RETENTION`](crate::flow::FLOW_RETENTION) ago.
    fn forget_finished_flows(&mut self, now: Instant) {
        self.flows.retain(|_, f| {
            f.finished_at
                .is_none_or(|at| now.duration_since(at) < crate::flow::FLOW_RETENTION)
        });
    }

    fn kept_flow(&mut self, flow: FlowId, now: Instant) -> Option<&mut KeptFlow> {
        self.forget_finished_flows(now);
        self.flows.get_mut(&flow)
    }
}

impl KeptFlow {
    /// Its pending releases, noting when they were decided and whether it finished.
    fn settle(&mut self, now: Instant, changed: bool) -> Vec<Release> {
        if changed {
            self.decided_at = now;
        }
        if self.finished_at.is_none() && self.home.finished() {
            self.finished_at = Some(now);
        }
        self.home.pending()
    }
}

#[async_trait]
impl FlowStore for MemoryLeaseStore {
    async fn hold(&self, jobs: Vec<(NewJob, FlowStep)>) -> Result<()> {
        let news: Vec<NewJob> = jobs.iter().map(|(j, _)| j.clone()).collect();
        crate::job::validate_batch(&news, self.max_payload_bytes)?;
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        state
            .ended_steps
            .retain(|_, at| now.duration_since(*at) < crate::flow::FLOW_RETENTION);
        for (new, step) in jobs {
            let id = new.id.unwrap_or_else(JobId::new);
            // Known, or a step that already ended: a creation done again leaves it alone.
            if state.jobs.contains_key(&id) || state.ended_steps.contains_key(&id) {
                continue;
            }
            let (delay, _) = state.insert_job(id, new, Some(step));
            state.held.insert(id, (delay, now));
        }
        Ok(())
    }

    async fn release(&self, releases: Vec<Release>) -> Result<Vec<JobId>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        for r in releases {
            let delay = match state.held.get(&r.job) {
                Some((delay, _)) => *delay,
                _ => continue,
            };
            state.held.remove(&r.job);
            match r.action {
                ReleaseAction::Run => state.park(r.job, now + delay, now),
                ReleaseAction::Fail(reason) => state.bury(r.job, reason, self.dead_retention),
                ReleaseAction::Skip => {
                    state.ended_steps.insert(r.job, now);
                    if let Some(job) = state.jobs.remove(&r.job) {
                        if let Some(q) = state.queues.get_mut(&job.queue) {
                            q.priority.remove(&r.job);
                        }
                    }
                }
            }
        }
        Ok(Vec::new())
    }

    async fn step_ends(&self, max: usize) -> Result<Vec<StepEnded>> {
        let state = lock(&self.state);
        Ok(state.step_ends.values().take(max).cloned().collect())
    }

    async fn forget_step_ends(&self, jobs: &[JobId]) -> Result<()> {
        let mut state = lock(&self.state);
        for job in jobs {
            if let Some(seq) = state.step_end_of.remove(job) {
                state.step_ends.remove(&seq);
            }
        }
        Ok(())
    }

    async fn put_flow(&self, flow: &Flow) -> Result<(bool, Vec<Release>)> {
        flow.validate(self.max_payload_bytes)?;
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        state.forget_finished_flows(now);
        let new = !state.flows.contains_key(&flow.id());
        state.flows_created += u64::from(new);
        let kept = state.flows.entry(flow.id()).or_insert_with(|| KeptFlow {
            home: Home::new(flow),
            created_ms: crate::store::unix_ms(),
            decided_at: now,
            finished_at: None,
        });
        Ok((new, kept.settle(now, false)))
    }

    async fn advance_flow(
        &self,
        flow: FlowId,
        ended: &[(String, StepEnd)],
        applied: &[String],
    ) -> Result<Vec<Release>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        let Some(kept) = state.kept_flow(flow, now) else {
            return Ok(Vec::new());
        };
        let before = kept.home.status().released;
        kept.home.advance(ended, applied);
        let changed = kept.home.status().released != before;
        Ok(kept.settle(now, changed))
    }

    async fn grow_flow(&self, flow: FlowId, step: &str, added: &[Step]) -> Result<()> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        if let Some(kept) = state.kept_flow(flow, now) {
            kept.home.grow(step, added);
        }
        Ok(())
    }

    async fn cancel_flow(&self, flow: FlowId) -> Result<Option<(Vec<Release>, Vec<JobId>)>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        let Some(kept) = state.kept_flow(flow, now) else {
            return Ok(None);
        };
        let running = kept.home.cancel();
        Ok(Some((kept.settle(now, true), running)))
    }

    async fn held_jobs(&self, older_than: Duration, max: usize) -> Result<Vec<Release>> {
        let now = crate::clock::now();
        let state = lock(&self.state);
        let mut held: Vec<(Instant, Release)> = state
            .held
            .iter()
            .filter(|(_, (_, at))| now.duration_since(*at) >= older_than)
            .filter_map(|(id, (_, at))| {
                let job = state.jobs.get(id)?;
                let step = job.flow.as_ref()?;
                Some((
                    *at,
                    Release {
                        flow: step.flow,
                        step: step.step.clone(),
                        job: *id,
                        scope: job.scope.job().is_none().then(|| job.scope.clone()),
                        action: ReleaseAction::Skip,
                    },
                ))
            })
            .collect();
        held.sort_by_key(|(at, r)| (*at, r.job));
        Ok(held.into_iter().take(max).map(|(_, r)| r).collect())
    }

    async fn unreleased_flows(&self, older_than: Duration, max: usize) -> Result<Vec<FlowId>> {
        let now = crate::clock::now();
        let state = lock(&self.state);
        Ok(state
            .flows
            .iter()
            .filter(|(_, f)| {
                !f.home.pending().is_empty() && now.duration_since(f.decided_at) >= older_than
            })
            .map(|(id, _)| *id)
            .take(max)
            .collect())
    }

    async fn flow(&self, id: FlowId) -> Result<Option<FlowStatus>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        Ok(state.kept_flow(id, now).map(|f| f.home.status()))
    }

    async fn keep_results(&self, flow: FlowId, results: &[(String, String)]) -> Result<()> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        if let Some(kept) = state.kept_flow(flow, now) {
            kept.home.keep_results(results);
        }
        Ok(())
    }

    async fn step_result(&self, flow: FlowId, step: &str) -> Result<Option<String>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        Ok(state.kept_flow(flow, now).and_then(|f| f.home.result(step)))
    }

    async fn running_flows(&self, max: usize) -> Result<(u64, Vec<(FlowId, u64)>)> {
        let state = lock(&self.state);
        let mut running: Vec<(u64, FlowId)> = state
            .flows
            .iter()
            .filter(|(_, f)| !f.home.finished())
            .map(|(id, f)| (f.created_ms, *id))
            .collect();
        running.sort();
        let count = running.len() as u64;
        let listed = running.into_iter().take(max).map(|(at, id)| (id, at));
        Ok((count, listed.collect()))
    }

    async fn flow_steps(&self, id: FlowId) -> Result<Vec<crate::flow::StepStatus>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        Ok(state
            .kept_flow(id, now)
            .map(|f| f.home.step_statuses())
            .unwrap_or_default())
    }

    async fn flows_created(&self) -> Result<Option<u64>> {
        Ok(Some(lock(&self.state).flows_created))
    }
}
