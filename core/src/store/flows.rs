//! [`FlowStore`]: what a flow needs of the coordinator's state, across partitions. The drivers
//! that use it (creating a flow, moving flows on after their steps ended) are palisade's `flow_driver`.
//!
//! A flow's steps are ordinary jobs kept in their own partitions (a named scope decides
//! where), while the flow itself — its graph, which steps ended and how, which were released
//! — lives in one partition, its *home*. No script can span both, so every step between them
//! is idempotent and kept until done (the protocol: the module docs of palisade's `flow_driver`).
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::flow::{Flow, FlowStatus, FlowStep, Release, Step, StepEnd, StepEnded};
use crate::ids::{FlowId, JobId};
use crate::job::NewJob;

/// What flows need of a store: in each job's partition, held jobs and the ends of steps; at
/// each flow's home, the flow. Every method is one atomic operation.
#[async_trait]
pub trait FlowStore: Send + Sync + 'static {
    /// Writes flow steps' jobs held by `creation` (one `create_flow` call's own id): known,
    /// never claimable until released. All or none; a job whose id is already known is left
    /// as it is (a creation done again).
    async fn hold(&self, jobs: Vec<(NewJob, FlowStep)>) -> Result<()>;

    /// Releases held jobs as each entry says: ready (after the job's delay), dead with the
    /// reason, or forgotten. A job that is not held by the entry's creation (released
    /// before, ended, unknown, held by another creation) is left alone, so a release may be delivered any number of times. Returns the jobs left
    /// held because a key their release writes holds another type (said in the log): their
    /// releases stay decided at the home, to be delivered again once it is repaired.
    async fn release(&self, releases: Vec<Release>) -> Result<Vec<JobId>>;

    /// Flow steps whose jobs ended here (an accepted completion, or dead) and that the flows'
    /// homes have not recorded yet: oldest first, at most `max`.
    async fn step_ends(&self, max: usize) -> Result<Vec<StepEnded>>;

    /// Forgets those of `jobs` (their flows' homes recorded them).
    async fn forget_step_ends(&self, jobs: &[JobId]) -> Result<()>;

    /// Keeps `flow` (already checked, its jobs held by `creation`) at its home and decides
    /// its first steps; returns whether this call kept it, and every release decided and not
    /// confirmed yet. A flow already kept is left as it is (`false`, its pending releases).
    async fn put_flow(&self, flow: &Flow) -> Result<(bool, Vec<Release>)>;

    /// At `flow`'s home: records how steps ended (each step once: a repeated end changes
    /// nothing), decides the steps that every dependency of has now ended
    /// ([`decide`](crate::flow::decide)), and forgets the releases of `applied` (their
    /// partitions confirmed them). Returns every release decided and not confirmed yet;
    /// nothing for a flow it does not keep.
    async fn advance_flow(
        &self,
        flow: FlowId,
        ended: &[(String, StepEnd)],
        applied: &[String],
    ) -> Result<Vec<Release>>;

    /// At `flow`'s home: adds the steps `added` (full names, their jobs held already) that
    /// step `step`'s accepted completion added — unless that step's end is recorded already
    /// or one of them is a step already, so a grow done again changes nothing. Every step
    /// that runs after `step` then also runs after each of them, on the same kind of edge.
    /// Called before the step's end is recorded ([`advance_flow`](Self::advance_flow)),
    /// which then decides them.
    async fn grow_flow(&self, flow: FlowId, step: &str, added: &[Step]) -> Result<()>;

    /// At `flow`'s home: cancels it ([`FlowState::Cancelled`](crate::flow::FlowState)) — every step
    /// not decided yet is decided dead unrun ("flow cancelled") — and returns the releases
    /// pending and the jobs of steps released to run that have not ended (the caller cancels
    /// them); `None` for a flow it does not keep.
    async fn cancel_flow(&self, flow: FlowId) -> Result<Option<(Vec<Release>, Vec<JobId>)>>;

    /// Flow steps' jobs held here for at least `older_than`, oldest first, at most `max` —
    /// with the creation that holds each — so the coordinator can forget those whose flow
    /// was never kept (a creation that stopped halfway).
    async fn held_jobs(&self, older_than: Duration, max: usize) -> Result<Vec<Release>>;

    /// Flows with releases decided at least `older_than` ago and not confirmed (the
    /// process that decided them stopped): at most `max`.
    async fn unreleased_flows(&self, older_than: Duration, max: usize) -> Result<Vec<FlowId>>;

    /// Flow `id`'s state, while it is kept.
    async fn flow(&self, id: FlowId) -> Result<Option<FlowStatus>>;

    /// At `flow`'s home: keeps each `(step, result)` for as long as the flow is kept (a
    /// step's first kept result stays; a flow not kept keeps nothing). Called before the
    /// steps' ends are recorded, so a step released by them finds their results.
    async fn keep_results(&self, flow: FlowId, results: &[(String, String)]) -> Result<()>;

    /// At `flow`'s home: step `step`'s result, as [`keep_results`](Self::keep_results)
    /// kept it.
    async fn step_result(&self, flow: FlowId, step: &str) -> Result<Option<String>>;

    /// How many flows kept here are running (not every step ended), and the `max` created
    /// first: each id with its creation time (unix ms), oldest first.
    async fn running_flows(&self, max: usize) -> Result<(u64, Vec<(FlowId, u64)>)>;

    /// How many flows were ever kept here, whoever created them (each counted once, by the
    /// home that kept it): the sampler exports it, so a flow created by a producer or the API
    /// shows on every sampling worker's scrape. `None` for a store that does not count them.
    async fn flows_created(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Flow `id`'s steps, each with the steps it runs after and where it is, in run order
    /// ([`in_run_order`](crate::flow::in_run_order)): for operators' pages. Empty for a flow
    /// not kept (or a store that does not list them).
    async fn flow_steps(&self, id: FlowId) -> Result<Vec<crate::flow::StepStatus>> {
        let _ = id;
        Ok(Vec::new())
    }
}
