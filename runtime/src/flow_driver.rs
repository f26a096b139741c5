//! The flow driver: creating a flow, and moving flows on after their steps ended, over the
//! [`FlowStore`] operations (the coordinator's state, across partitions).
//!
//! A flow's steps are ordinary jobs kept in their own partitions (a named scope decides
//! where), while the flow itself — its graph, which steps ended and how, which were released
//! — lives in one partition, its *home*. No script can span both, so every step between them
//! is idempotent and kept until done:
//!
//! - **Created written first, released last.** Every step's job is written *held* (known,
//!   never claimable) in its partition, then the flow is kept at its home, which decides the
//!   first steps; only then are those released. A creation that stops halfway leaves held
//!   jobs that never run and no flow anyone can see.
//! - **A step's end is kept with its settlement.** The accepted completion, or the burial in
//!   the dead letters, records the step's end in the same atomic step ([`FlowStore::step_ends`]);
//!   it stays until the home has recorded it. The home records each step's end once (a set
//!   of ended steps, added to — never a counter that a repeated delivery would decrement
//!   twice) and decides each dependent once.
//! - **A release is a state change that happens once.** Releasing a held job makes it ready
//!   (or dead, or gone) only if it is still held, so a release delivered twice — a sweep
//!   racing a late delivery — does nothing the second time, even after the job ran. The home
//!   keeps each decided release until its partition confirmed it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::Result;
use crate::flow::{Flow, Release, StepEnd, StepEnded};
use crate::ids::{FlowId, JobId};
use crate::store::FlowStore;

/// Creates `flow`: checks it, holds its jobs, keeps it at its home, releases its first steps.
/// Done again (the same flow id) it adds nothing. Releases that fail here are left to the
/// coordinator's sweep, decided and kept: the flow exists once this returns `Ok`.
pub(crate) async fn create(store: &dyn FlowStore, flow: &Flow, max_payload: usize) -> Result<()> {
    flow.validate(max_payload)?;
    // Done again (a retry, a second producer), `hold` skips jobs it finds known or ended, and
    // `put_flow` keeps the flow once: every step is still held, decided and released once.
    let mut held = flow.held_jobs();
    // Steps that name no trace continue the creator's (feature `otel`).
    if let Some(trace) = crate::trace::current() {
        for (job, _) in &mut held {
            job.inherit_trace(Some(&trace));
        }
    }
    store.hold(held).await?;
    let (kept, releases) = store.put_flow(flow).await?;
    if kept {
        metrics::counter!(crate::metrics::FLOWS_CREATED).increment(1);
    } else {
        // Kept by another creation meanwhile (two creators raced past `create_unless_kept`'s
        // look): the same flow, or refused. The steps this one held are never released; the
        // coordinator forgets them as a creation that stopped halfway.
        refuse_another_graph(store, flow).await?;
    }
    if let Err(e) = apply(store, flow.id(), releases).await {
        tracing::warn!(flow = %flow.id(), error = %e, "first steps not released yet; the coordinator's sweep releases them");
    }
    Ok(())
}

/// Creates `flow` unless it is kept already: done again after its steps ran and were
/// forgotten, holding them again would leave held records behind.
pub(crate) async fn create_unless_kept(store: &dyn FlowStore, flow: &Flow) -> Result<()> {
    if store.flow(flow.id()).await?.is_none() {
        return create(store, flow, usize::MAX).await;
    }
    refuse_another_graph(store, flow).await
}

/// For a flow kept already: the same flow again (a retried creation) is fine, but another
/// graph under its id (an id or Idempotency-Key reused for another flow) is refused, not
/// answered as if it had been created.
async fn refuse_another_graph(store: &dyn FlowStore, flow: &Flow) -> Result<()> {
    let kept = store.flow_steps(flow.id()).await?;
    match crate::flow::graph_difference(flow, &kept) {
        None => Ok(()),
        Some(difference) => Err(crate::Error::Conflict(format!(
            "flow {} is kept with other steps ({difference}): nothing was changed (give a new \
             flow a new id)",
            flow.id()
        ))),
    }
}

/// Releases `releases` in their partitions and tells `flow`'s home; returns the releases the
/// home decided meanwhile (none for a flow whose steps all ended).
async fn apply(
    store: &dyn FlowStore,
    flow: FlowId,
    releases: Vec<Release>,
) -> Result<Vec<Release>> {
    let mut releases = releases;
    // Each round's releases may end steps at once (dead, skipped) and so decide more.
    for _ in 0..crate::flow::MAX_FLOW_STEPS {
        if releases.is_empty() {
            break;
        }
        let all: Vec<String> = releases.iter().map(|r| r.step.clone()).collect();
        let jobs: Vec<(JobId, String)> = releases.iter().map(|r| (r.job, r.step.clone())).collect();
        let counts: Vec<&'static str> = releases
            .iter()
            .map(|r| match r.action {
                crate::flow::ReleaseAction::Run => "run",
                crate::flow::ReleaseAction::Fail(_) => "fail",
                crate::flow::ReleaseAction::Skip => "skip",
            })
            .collect();
        let left = store.release(releases).await?;
        // (Counted when delivered: a release delivered again counts again, rarely.)
        for action in counts {
            metrics::counter!(crate::metrics::FLOW_RELEASES, "action" => action).increment(1);
        }
        let applied: Vec<String> = jobs
            .into_iter()
            .filter(|(job, _)| !left.contains(job))
            .map(|(_, step)| step)
            .collect();
        let pending = store.advance_flow(flow, &[], &applied).await?;
        releases = pending
            .into_iter()
            .filter(|r| !all.contains(&r.step))
            .collect();
    }
    Ok(releases)
}

/// Cancels `flow` as a whole: steps not started go to the dead letters unrun, running and
/// ready ones are cancelled (`QueueAdmin::cancel`: a running one's lease is revoked). Returns
/// how many jobs it cancelled, or `None` for a flow not kept.
pub(crate) async fn cancel(store: &crate::store::Stores, flow: FlowId) -> Result<Option<usize>> {
    use crate::store::QueueAdmin;
    let Some((releases, running)) = store.cancel_flow(flow).await? else {
        return Ok(None);
    };
    // The steps released to run first — a held one among them is buried, so its release,
    // still pending, finds nothing to release — then the steps decided dead. Each goes on
    // past a failure, which it reports at the end: a release left pending is delivered by the
    // coordinator's sweep (dead, never run).
    let mut failed = None;
    for job in &running {
        if let Err(e) = store.cancel(*job, crate::flow::CANCELLED).await {
            failed.get_or_insert(e);
        }
    }
    let unrun = releases
        .iter()
        .filter(|r| matches!(&r.action, crate::flow::ReleaseAction::Fail(why) if why == crate::flow::CANCELLED))
        .count();
    if let Err(e) = apply(store, flow, releases).await {
        failed.get_or_insert(e);
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(Some(unrun + running.len())),
    }
}

/// How long a held job waits for its flow to be kept before it counts as an orphan: far
/// longer than a creation takes.
pub(crate) const HELD_GRACE: Duration = Duration::from_secs(600);

/// Forgets held jobs older than [`HELD_GRACE`] whose flow is not kept (its creation stopped
/// between holding and keeping, or the flow was forgotten): they could never run.
async fn forget_orphans(store: &dyn FlowStore) -> Result<()> {
    // Best effort: a flow whose home cannot be read now counts as kept (nothing is
    // forgotten on a doubt), and a failure here never stops the rest of the pass.
    let held = match store.held_jobs(HELD_GRACE, FLOWS_PER_PASS).await {
        Ok(held) => held,
        Err(e) => {
            crate::repeats::warn_repeated!(error = %e, "held flow jobs not read; the next pass tries again");
            return Ok(());
        }
    };
    let mut kept: BTreeMap<FlowId, bool> = BTreeMap::new();
    let mut orphans = Vec::new();
    for release in held {
        let is_kept = match kept.get(&release.flow) {
            Some(k) => *k,
            None => {
                let k = !matches!(store.flow(release.flow).await, Ok(None));
                kept.insert(release.flow, k);
                k
            }
        };
        if !is_kept {
            orphans.push(release);
        }
    }
    if !orphans.is_empty() {
        tracing::warn!(
            jobs = orphans.len(),
            "forgetting held flow jobs whose flow was never kept (a creation that stopped halfway)"
        );
        if let Err(e) = store.release(orphans).await {
            crate::repeats::warn_repeated!(error = %e, "orphaned held flow jobs not forgotten yet");
        }
    }
    Ok(())
}

/// Adds the steps that `ends`' completions added to `flow` — written first (held in their
/// partitions), then added at the home — before their ends are recorded, so a step that runs
/// after one of them is never decided without them. Repeated, it adds nothing.
///
/// Steps that can never be added — they break the rules ([`check_added`](crate::flow::check_added):
/// only a caller of the public settlement types can send such), a store refuses their jobs
/// for good (a smaller payload limit than the worker's), or they would take the flow past
/// [`MAX_FLOW_STEPS`](crate::MAX_FLOW_STEPS) — are dropped, loudly, and their step's end is
/// recorded without them: the flow moves on rather than waiting forever.
async fn grow(store: &dyn FlowStore, flow: FlowId, ends: &[&StepEnded]) -> Result<()> {
    for end in ends.iter().filter(|e| !e.added.is_empty()) {
        let n = end.added.len() as u64;
        let refused = match crate::flow::check_added(&end.step, &end.added, usize::MAX) {
            Err(e) => Some(e),
            Ok(()) => match store.flow(flow).await? {
                Some(s) if s.steps + end.added.len() > crate::flow::MAX_FLOW_STEPS => {
                    Some(crate::Error::InvalidJob(format!(
                        "{} steps would take the flow past {} steps",
                        end.added.len(),
                        crate::flow::MAX_FLOW_STEPS
                    )))
                }
                _ => match store.hold(crate::flow::held_jobs(flow, &end.added)).await {
                    Err(e) if !e.is_retryable() => Some(e),
                    held => {
                        held?;
                        store.grow_flow(flow, &end.step, &end.added).await?;
                        None
                    }
                },
            },
        };
        let outcome = match refused {
            None => "added",
            Some(e) => {
                tracing::error!(%flow, step = %end.step, steps = n, error = %e, "steps added by a completion refused for good; the flow moves on without them");
                "dropped"
            }
        };
        metrics::counter!(crate::metrics::FLOW_STEPS_ADDED, "outcome" => outcome).increment(n);
    }
    Ok(())
}

/// Step ends one pass records at most.
pub(crate) const ENDS_PER_PASS: usize = 1000;

/// Flows one pass re-releases at most.
const FLOWS_PER_PASS: usize = 100;

/// How long a decided release waits for the process that decided it before the sweep
/// delivers it.
pub(crate) const RELEASE_GRACE: Duration = Duration::from_secs(10);

/// One pass: tells flows' homes of the steps that ended, releases what they decide, and
/// delivers releases a stopped process left decided. Returns how many step ends it
/// recorded. Every step is idempotent: a pass repeated, or racing another process's, changes
/// nothing twice.
///
/// The coordinator runs it on every reaper tick and after a flow step settles; it is public
/// for a coordinator of one's own (and for tests that step a flow by hand).
pub async fn advance(store: &dyn FlowStore) -> Result<usize> {
    let ends = store.step_ends(ENDS_PER_PASS).await?;
    let mut by_flow: BTreeMap<FlowId, Vec<&StepEnded>> = BTreeMap::new();
    for end in &ends {
        by_flow.entry(end.flow).or_default().push(end);
    }
    // Each flow on its own: one whose home fails (another program wrote over its keys) must
    // not hold up the others. A transient failure keeps its ends for the next pass; a
    // permanent one repeats forever, so its ends are forgotten, loudly.
    let mut recorded: Vec<JobId> = Vec::with_capacity(ends.len());
    for (flow, steps) in &by_flow {
        let ended: Vec<(String, StepEnd)> = steps.iter().map(|e| (e.step.clone(), e.end)).collect();
        let results: Vec<(String, String)> = steps
            .iter()
            .filter_map(|e| Some((e.step.clone(), e.result.clone()?)))
            .collect();
        let grown = match grow(store, *flow, steps).await {
            Ok(()) if !results.is_empty() => match store.keep_results(*flow, &results).await {
                // (The results' key written over: the ends are still recorded, and a reader
                // falls back to the jobs' own result records.)
                Err(e) if !e.is_retryable() => {
                    tracing::error!(%flow, error = %e, "flow step results not kept at the flow's home");
                    Ok(())
                }
                kept => kept,
            },
            grown => grown,
        };
        let moved = match grown {
            Ok(()) => match store.advance_flow(*flow, &ended, &[]).await {
                Ok(releases) => {
                    let runs = releases
                        .iter()
                        .filter(|r| r.action == crate::flow::ReleaseAction::Run)
                        .count();
                    apply(store, *flow, releases).await.map(|_| runs)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match moved {
            Ok(runs) => {
                // From the latest of these ends (the one that unblocked them) to the steps
                // it released being ready: a callback's latency, less its claim.
                let latest = steps.iter().map(|e| e.at_ms).max().unwrap_or(0);
                if latest > 0 {
                    let waited = crate::store::unix_ms().saturating_sub(latest) as f64 / 1000.0;
                    for _ in 0..runs {
                        metrics::histogram!(crate::metrics::FLOW_RELEASE_LATENCY).record(waited);
                    }
                }
                for e in steps {
                    metrics::counter!(crate::metrics::FLOW_STEPS, "end" => e.end.as_str())
                        .increment(1);
                }
                recorded.extend(steps.iter().map(|e| e.job));
            }
            Err(e) if e.is_retryable() => {
                crate::repeats::warn_repeated!(%flow, error = %e, "flow not moved on yet; the next pass tries again");
            }
            Err(e) => {
                tracing::error!(%flow, error = %e, steps = ended.len(), "flow cannot be moved on; forgetting these step ends");
                recorded.extend(steps.iter().map(|e| e.job));
            }
        }
    }
    if !recorded.is_empty() {
        store.forget_step_ends(&recorded).await?;
    }
    forget_orphans(store).await?;
    for flow in store
        .unreleased_flows(RELEASE_GRACE, FLOWS_PER_PASS)
        .await?
    {
        let moved = match store.advance_flow(flow, &[], &[]).await {
            Ok(releases) => apply(store, flow, releases).await.map(drop),
            Err(e) => Err(e),
        };
        if let Err(e) = moved {
            crate::repeats::warn_repeated!(%flow, error = %e, "releases of a flow not delivered yet");
        }
    }
    Ok(ends.len())
}
