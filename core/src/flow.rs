//! Flows: jobs that wait for jobs. A [`Flow`] names its steps (ordinary jobs) and which
//! steps each one runs after; a step becomes ready only once every step it runs after has
//! ended, and what a step does when one of those died is the edge's [`OnDead`].
//!
//! Plain data and pure rules here; the stores keep a flow (ARCHITECTURE.md §5.5) and the
//! coordinator moves it on. The rules every backend applies — [`decide`] and the checks in
//! [`Flow::validate`] — live here once (the Redis scripts mirror `decide`, and a test runs
//! both on the same histories).

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ids::{FlowId, JobId, Scope};
use crate::job::{check_name, NewJob};

/// Most steps one flow may have.
pub const MAX_FLOW_STEPS: usize = 10_000;

/// Most bytes of JSON one flow's steps may take (payloads included).
pub const MAX_FLOW_BYTES: usize = 32 * 1024 * 1024;

/// How long a finished flow (its state, counts and step outcomes) is kept: as long as the
/// results of its steps ([`RESULT_RETENTION`](crate::job::RESULT_RETENTION)).
pub const FLOW_RETENTION: std::time::Duration = crate::job::RESULT_RETENTION;

/// What a step does when a step it runs after died (or was skipped) instead of completing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnDead {
    /// The step fails too: it goes to its queue's dead letters with the reason, unrun.
    #[default]
    Fail,
    /// The step is skipped: it never runs and is no dead letter (a batch's `on_success`).
    Skip,
    /// The step runs anyway (a batch's `on_complete`, a cleanup).
    Run,
}

/// One dependency of a step: the step it runs after, and what it does if that one dies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    /// The step it runs after.
    pub step: String,
    /// What happens if that step dies or is skipped.
    pub on_dead: OnDead,
}

/// One step of a flow: its job and what it runs after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// Its name, unique in the flow.
    pub name: String,
    /// The job it runs.
    pub job: NewJob,
    /// The steps it runs after (none: it is ready when the flow is created).
    pub after: Vec<Edge>,
}

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepEnd {
    /// Its completion was accepted.
    Completed,
    /// It went to the dead letters (it ran out of attempts or stalls, was cancelled, or a
    /// step it ran after died on a [`OnDead::Fail`] edge).
    Dead,
    /// It never ran: a step it ran after died on an [`OnDead::Skip`] edge.
    Skipped,
}

impl StepEnd {
    /// The word the stores keep.
    pub fn as_str(self) -> &'static str {
        match self {
            StepEnd::Completed => "completed",
            StepEnd::Dead => "dead",
            StepEnd::Skipped => "skipped",
        }
    }

    #[doc(hidden)]
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "completed" => Some(StepEnd::Completed),
            "dead" => Some(StepEnd::Dead),
            "skipped" => Some(StepEnd::Skipped),
            _ => None,
        }
    }
}

/// What becomes of a step once every step it runs after has ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// It is released: ready to run.
    Run,
    /// It goes to the dead letters unrun, with this reason.
    Fail(String),
    /// It never runs.
    Skip,
}

/// The rule: `None` while a step `after` names has not ended; then [`Decision::Fail`] if
/// one that did not complete is on a [`OnDead::Fail`] edge (the first such, in `after`'s
/// order), else [`Decision::Skip`] if one is on a [`OnDead::Skip`] edge, else
/// [`Decision::Run`]. Mirrored by `flow_home.lua`.
pub fn decide(after: &[Edge], ended: impl Fn(&str) -> Option<StepEnd>) -> Option<Decision> {
    let mut ends = Vec::with_capacity(after.len());
    for edge in after {
        ends.push(ended(&edge.step)?);
    }
    let missed = || {
        after
            .iter()
            .zip(&ends)
            .filter(|(_, end)| **end != StepEnd::Completed)
    };
    if let Some((edge, end)) = missed().find(|(e, _)| e.on_dead == OnDead::Fail) {
        return Some(Decision::Fail(format!(
            "step \"{}\" it runs after was {}",
            edge.step,
            end.as_str()
        )));
    }
    if missed().any(|(e, _)| e.on_dead == OnDead::Skip) {
        return Some(Decision::Skip);
    }
    Some(Decision::Run)
}

/// What a flow's job carries: which flow and step it is, and what it runs after (so its
/// handler can read their results: `JobContext::dependency`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowStep {
    /// The flow.
    pub flow: FlowId,
    /// This step's name.
    pub step: String,
    /// The steps it runs after.
    pub after: Vec<String>,
}

/// The id of step `name`'s job in flow `flow`: fixed, so creating the flow again (a retried
/// request) names the same jobs, and a step's job is found from its name.
pub fn step_job_id(flow: FlowId, name: &str) -> JobId {
    /// Palisade's namespace for flow step job ids (a random UUID, fixed forever).
    const FLOW_STEPS: uuid::Uuid = uuid::Uuid::from_u128(0x8f1e_2a6c_4b7d_4e39_a0c5_6d2e_9b3f_1a47);
    uuid::Uuid::new_v5(&FLOW_STEPS, format!("{flow}\n{name}").as_bytes()).into()
}

/// A DAG of jobs, created all or nothing with `Client::create_flow`.
///
/// ```
/// use palisade_core::{flow::{Flow, OnDead}, job::NewJob};
/// # fn main() -> palisade_core::Result<()> {
/// let flow = Flow::new()
///     .step("resize-1", NewJob::new("resize", &1)?)
///     .step("resize-2", NewJob::new("resize", &2)?)
///     .step_after("zip", NewJob::new("zip", &())?, &["resize-1", "resize-2"])
///     .step_with("email", NewJob::new("email", &())?, [("zip", OnDead::Run)]);
/// assert_eq!(flow.steps().len(), 4);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flow {
    id: FlowId,
    steps: Vec<Step>,
}

impl Default for Flow {
    fn default() -> Self {
        Self::new()
    }
}

impl Flow {
    /// Has every step whose job names no trace continue `trace`.
    #[doc(hidden)] // for palisade-cli's API (not API)
    pub fn inherit_trace(&mut self, trace: &crate::traceparent::TraceContext) {
        for step in &mut self.steps {
            step.job.inherit_trace(Some(trace));
        }
    }

    /// An empty flow with a fresh id.
    pub fn new() -> Self {
        Self::with_id(FlowId::new())
    }

    /// An empty flow with the producer's id: creating it again (a retried request) adds
    /// nothing and answers the flow that exists.
    pub fn with_id(id: FlowId) -> Self {
        Self {
            id,
            steps: Vec::new(),
        }
    }

    /// A chain `a → b → c`: each step (named `0`, `1`, …) runs after the one before it and
    /// fails if that one died.
    pub fn chain(jobs: impl IntoIterator<Item = NewJob>) -> Self {
        let mut flow = Self::new();
        for (i, job) in jobs.into_iter().enumerate() {
            let after: Vec<String> = i
                .checked_sub(1)
                .map(|p| p.to_string())
                .into_iter()
                .collect();
            flow = flow.step_with(
                i.to_string(),
                job,
                after.iter().map(|a| (a.as_str(), OnDead::Fail)),
            );
        }
        flow
    }

    /// A batch: the jobs as steps `child:0`, `child:1`, …, none after another. Add its
    /// callbacks with [`on_success`](Self::on_success) and [`on_complete`](Self::on_complete).
    pub fn batch(jobs: impl IntoIterator<Item = NewJob>) -> Self {
        let mut flow = Self::new();
        for (i, job) in jobs.into_iter().enumerate() {
            flow = flow.step(format!("child:{i}"), job);
        }
        flow
    }

    /// Adds step `on_success`: runs once after every step added before it completed; skipped
    /// (never run, not a dead letter) if any of them died.
    pub fn on_success(self, job: NewJob) -> Self {
        self.after_all("on_success", job, OnDead::Skip)
    }

    /// Adds step `on_complete`: runs once after every step added before it ended, completed
    /// or dead.
    pub fn on_complete(self, job: NewJob) -> Self {
        self.after_all("on_complete", job, OnDead::Run)
    }

    fn after_all(self, name: &str, job: NewJob, on_dead: OnDead) -> Self {
        let names: Vec<String> = self
            .steps
            .iter()
            .filter(|s| s.name != "on_success" && s.name != "on_complete")
            .map(|s| s.name.clone())
            .collect();
        self.step_with(name, job, names.iter().map(|n| (n.as_str(), on_dead)))
    }

    /// Adds a step that is ready as soon as the flow is created.
    pub fn step(self, name: impl Into<String>, job: NewJob) -> Self {
        self.step_with(name, job, std::iter::empty::<(&str, OnDead)>())
    }

    /// Adds a step that runs after every step in `after` completed, and fails if one died.
    pub fn step_after(self, name: impl Into<String>, job: NewJob, after: &[&str]) -> Self {
        self.step_with(name, job, after.iter().map(|a| (*a, OnDead::Fail)))
    }

    /// Adds a step that runs after the steps `after` names, each with what it does if that
    /// one dies.
    pub fn step_with<'a>(
        mut self,
        name: impl Into<String>,
        job: NewJob,
        after: impl IntoIterator<Item = (&'a str, OnDead)>,
    ) -> Self {
        self.steps.push(Step {
            name: name.into(),
            job,
            after: after
                .into_iter()
                .map(|(step, on_dead)| Edge {
                    step: step.to_owned(),
                    on_dead,
                })
                .collect(),
        });
        self
    }

    /// Its id.
    pub fn id(&self) -> FlowId {
        self.id
    }

    /// Its steps, in the order they were added.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The job id of step `name`.
    pub fn job_id(&self, name: &str) -> JobId {
        step_job_id(self.id, name)
    }

    /// Checks everything a store requires before it keeps any of the flow: 1 ..=
    /// [`MAX_FLOW_STEPS`] steps with distinct valid names, every job valid (and without an id
    /// or unique key of its own: a step's id is the flow's), every dependency a step of the
    /// flow named once and not the step itself, no cycle, at most [`MAX_FLOW_BYTES`].
    pub fn validate(&self, max_payload_bytes: usize) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidJob(format!("flow {}: {why}", self.id)));
        if self.steps.is_empty() || self.steps.len() > MAX_FLOW_STEPS {
            return bad(format!(
                "{} steps; a flow has 1 to {MAX_FLOW_STEPS}",
                self.steps.len()
            ));
        }
        let mut index = HashMap::with_capacity(self.steps.len());
        let mut bytes = 0usize;
        for (i, step) in self.steps.iter().enumerate() {
            check_step_name(&step.name)?;
            if index.insert(step.name.as_str(), i).is_some() {
                return bad(format!("step {:?} is named twice", step.name));
            }
            step.job.validate(max_payload_bytes)?;
            if step.job.debounce.is_some() {
                return bad(format!(
                    "step {:?} is debounced; a step runs once, when its flow says",
                    step.name
                ));
            }
            if step.job.group.is_some() {
                return bad(format!(
                    "step {:?} has a group; flow steps take none",
                    step.name
                ));
            }
            if step.job.id.is_some() || step.job.unique.is_some() {
                return bad(format!(
                    "step {:?} has an id or unique key of its own; a step's id is the flow's",
                    step.name
                ));
            }
            bytes = bytes.saturating_add(
                serde_json::to_string(step)
                    .map_err(|e| Error::Payload(e.to_string()))?
                    .len(),
            );
        }
        if bytes > MAX_FLOW_BYTES {
            return bad(format!(
                "{bytes} bytes of steps; the limit is {MAX_FLOW_BYTES}"
            ));
        }
        // Every edge names another step, once; then Kahn's algorithm: a cycle leaves steps
        // whose dependencies never all end.
        let mut waiting = vec![0usize; self.steps.len()];
        let mut next = vec![Vec::new(); self.steps.len()];
        for (i, step) in self.steps.iter().enumerate() {
            let mut seen = BTreeSet::new();
            for edge in &step.after {
                let Some(&j) = index.get(edge.step.as_str()) else {
                    return bad(format!(
                        "step {:?} runs after {:?}, which is not a step of the flow",
                        step.name, edge.step
                    ));
                };
                if j == i || !seen.insert(j) {
                    return bad(format!(
                        "step {:?} names {:?} twice or runs after itself",
                        step.name, edge.step
                    ));
                }
                waiting[i] += 1;
                next[j].push(i);
            }
        }
        let mut ready: Vec<usize> = (0..self.steps.len()).filter(|i| waiting[*i] == 0).collect();
        let mut ordered = 0;
        while let Some(i) = ready.pop() {
            ordered += 1;
            for &d in &next[i] {
                waiting[d] -= 1;
                if waiting[d] == 0 {
                    ready.push(d);
                }
            }
        }
        if ordered < self.steps.len() {
            let stuck = self
                .steps
                .iter()
                .zip(&waiting)
                .find(|(_, w)| **w > 0)
                .map(|(s, _)| s.name.as_str())
                .unwrap_or_default();
            return bad(format!("its steps form a cycle (through step {stuck:?})"));
        }
        Ok(())
    }

    /// The jobs to hold, each with its id and flow step.
    #[doc(hidden)]
    pub fn held_jobs(&self) -> Vec<(NewJob, FlowStep)> {
        held_jobs(self.id, &self.steps)
    }
}

/// The jobs of `steps` of flow `flow` to hold, each with its id and flow step.
#[doc(hidden)]
pub fn held_jobs(flow: FlowId, steps: &[Step]) -> Vec<(NewJob, FlowStep)> {
    steps
        .iter()
        .map(|s| {
            // (Its id only: no unique key, which a step's job would keep after it ended.)
            let mut job = s.job.clone();
            job.id = Some(step_job_id(flow, &s.name));
            (
                job,
                FlowStep {
                    flow,
                    step: s.name.clone(),
                    after: s.after.iter().map(|e| e.step.clone()).collect(),
                },
            )
        })
        .collect()
}

/// The full name of step `name` added by step `parent` (`JobContext::add_step`):
/// `"<parent>/<name>"`. A name given to a flow or to `add_step` has no `/`, so no two steps
/// can ever add a step of the same name, and none collides with a step the flow was created
/// with.
pub fn added_step_name(parent: &str, name: &str) -> String {
    format!("{parent}/{name}")
}

/// Checks a step name as given to [`Flow`] or to `add_step`: a name (as queue names are) with
/// no `/` (which joins the names of added steps).
#[doc(hidden)]
pub fn check_step_name(name: &str) -> Result<()> {
    check_name("step name", name)?;
    if name.contains('/') {
        return Err(Error::InvalidJob(format!(
            "step name {name:?} has a '/': it joins the names of steps added by a step"
        )));
    }
    Ok(())
}

/// Checks the steps that step `parent`'s completion adds, as the flow pass receives them
/// (from `add_step`, or from any caller of the public settlement types): at most
/// [`MAX_FOLLOW_UPS`](crate::job::MAX_FOLLOW_UPS), each named `"<parent>/<name>"` once, its job
/// valid at `max_payload_bytes` with no id or unique key of its own, running after `parent`
/// and otherwise only after steps added before it, each named once.
pub fn check_added(parent: &str, added: &[Step], max_payload_bytes: usize) -> Result<()> {
    let bad = |why: String| {
        Err(Error::InvalidJob(format!(
            "steps added by {parent:?}: {why}"
        )))
    };
    if added.len() > crate::job::MAX_FOLLOW_UPS {
        return bad(format!("{} steps", added.len()));
    }
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for s in added {
        let Some(short) = s
            .name
            .strip_prefix(parent)
            .and_then(|rest| rest.strip_prefix('/'))
        else {
            return bad(format!("{:?} is not named \"{parent}/<name>\"", s.name));
        };
        check_step_name(short)?;
        s.job.validate(max_payload_bytes)?;
        if s.job.debounce.is_some() {
            return bad(format!("{:?} is debounced", s.name));
        }
        if s.job.group.is_some() {
            return bad(format!("{:?} has a group; flow steps take none", s.name));
        }
        if s.job.id.is_some() || s.job.unique.is_some() {
            return bad(format!("{:?} has an id or unique key of its own", s.name));
        }
        let mut edges: BTreeSet<&str> = BTreeSet::new();
        for (i, e) in s.after.iter().enumerate() {
            let known = if i == 0 {
                e.step == parent
            } else {
                seen.contains(e.step.as_str())
            };
            if !known || !edges.insert(e.step.as_str()) {
                return bad(format!(
                    "{:?} runs after {:?}: a step added runs after {parent:?} first, then only after steps added before it, each once",
                    s.name, e.step
                ));
            }
        }
        if s.after.is_empty() {
            return bad(format!("{:?} does not run after {parent:?}", s.name));
        }
        if !seen.insert(s.name.as_str()) {
            return bad(format!("{:?} is added twice", s.name));
        }
    }
    Ok(())
}

/// A flow's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowState {
    /// Some step has not ended.
    Running,
    /// Every step completed.
    Succeeded,
    /// Every step ended, and some did not complete.
    Failed,
    /// Cancelled as a whole (`Client::cancel_flow`): its
    /// steps that had not started went to the dead letters unrun, its running ones were
    /// cancelled.
    Cancelled,
}

/// Where one step of a kept flow is ([`StepStatus`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Not decided: a step it runs after has not ended.
    Waiting,
    /// Decided and handed to its job's partition (to run, or to end unrun), not ended yet:
    /// its job is ready, delayed or running.
    Released,
    /// Ended.
    Ended(StepEnd),
    /// Its record at the flow's home does not read (another program's write, or a later
    /// release's): listed with the job its name gives, never taken for a root.
    Unreadable,
}

impl StepState {
    /// The word operators read (`waiting`, `released`, the end's word, `unreadable`): the
    /// console, `flow show` and the API say the same.
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Waiting => "waiting",
            StepState::Released => "released",
            StepState::Ended(end) => end.as_str(),
            StepState::Unreadable => "unreadable",
        }
    }
}

/// One step of a kept flow as its home sees it, for operators
/// ([`FlowStore::flow_steps`](crate::store::FlowStore::flow_steps)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepStatus {
    /// The step's name.
    pub name: String,
    /// Its job ([`step_job_id`]).
    pub job: JobId,
    /// The steps it runs after (none for a root).
    pub after: Vec<String>,
    /// Where it is.
    pub state: StepState,
}

/// How a flow being created again differs from the flow kept under its id, if it does:
/// another step, a step missing, or a step that runs after other steps (the declared graph:
/// steps added since by a running step, whose names hold a `/`, and the edges they brought
/// are left out). `None`: the same graph, a creation done again. `kept` empty (a store that
/// does not list steps) compares as the same. Payloads are not compared.
pub fn graph_difference(flow: &Flow, kept: &[StepStatus]) -> Option<String> {
    use std::collections::{BTreeMap, BTreeSet};
    if kept.is_empty() {
        return None;
    }
    let declared = |name: &str| !name.contains('/');
    let kept: BTreeMap<&str, BTreeSet<&str>> = kept
        .iter()
        .filter(|s| declared(&s.name))
        .map(|s| {
            let after = s.after.iter().map(String::as_str).filter(|a| declared(a));
            (s.name.as_str(), after.collect())
        })
        .collect();
    let given: BTreeMap<&str, BTreeSet<&str>> = flow
        .steps()
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                s.after.iter().map(|e| e.step.as_str()).collect(),
            )
        })
        .collect();
    if let Some(name) = given.keys().find(|n| !kept.contains_key(*n)) {
        return Some(format!("step {name:?} is not one of its steps"));
    }
    if let Some(name) = kept.keys().find(|n| !given.contains_key(*n)) {
        return Some(format!("its step {name:?} is missing"));
    }
    given
        .iter()
        .find(|(n, after)| kept[*n] != **after)
        .map(|(n, after)| format!("step {n:?} runs after {:?} there, {after:?} here", kept[n]))
}

/// `steps` in the order they can run: each after every step it runs after, and among those
/// free at once, by name (a flow's steps are a DAG; a dependency it does not list, or a
/// cycle another program wrote, puts the steps it holds up last, by name). Kahn's algorithm
/// layer by layer, each layer in a name-ordered set: n log n, so a chain of 10,000 steps
/// orders in milliseconds (a pass that re-read every step per layer was quadratic: seconds on
/// a page's request).
pub fn in_run_order(steps: Vec<StepStatus>) -> Vec<StepStatus> {
    use std::collections::{BTreeSet, HashMap};
    let index: HashMap<&str, usize> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    // Per step: how many listed steps it still waits for; per step, those waiting on it. An
    // unlisted dependency is never placed: counted and never released, so its step goes last.
    let mut waiting = vec![0usize; steps.len()];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for (i, s) in steps.iter().enumerate() {
        for a in &s.after {
            waiting[i] += 1;
            if let Some(&d) = index.get(a.as_str()) {
                dependents[d].push(i);
            }
        }
    }
    // Layer by layer (those free at once, then those each layer frees), each layer by name.
    let mut layer: BTreeSet<(&str, usize)> = steps
        .iter()
        .enumerate()
        .filter(|(i, _)| waiting[*i] == 0)
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let mut order = Vec::with_capacity(steps.len());
    let mut placed = vec![false; steps.len()];
    while !layer.is_empty() {
        let mut next = BTreeSet::new();
        for (_, i) in std::mem::take(&mut layer) {
            order.push(i);
            placed[i] = true;
            for &d in &dependents[i] {
                waiting[d] -= 1;
                if waiting[d] == 0 {
                    next.insert((steps[d].name.as_str(), d));
                }
            }
        }
        layer = next;
    }
    let mut held: Vec<usize> = (0..steps.len()).filter(|i| !placed[*i]).collect();
    held.sort_by(|a, b| steps[*a].name.cmp(&steps[*b].name));
    order.extend(held);
    let mut slots: Vec<Option<StepStatus>> = steps.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

/// A flow as the coordinator keeps it: its state and each step's outcome so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowStatus {
    /// The flow.
    pub id: FlowId,
    /// Its state.
    pub state: FlowState,
    /// Its number of steps.
    pub steps: usize,
    /// How each step that ended ended, by step name.
    pub ended: HashMap<String, StepEnd>,
    /// Steps released (ready, running or ended) so far.
    pub released: usize,
}

impl FlowStatus {
    /// Steps that ended as `end`.
    pub fn count(&self, end: StepEnd) -> usize {
        self.ended.values().filter(|e| **e == end).count()
    }
}

/// One step of a flow to release in its job's partition, as the flow's home decided it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// The flow.
    pub flow: FlowId,
    /// The step.
    pub step: String,
    /// Its job.
    pub job: JobId,
    /// Its job's named scope (where a partitioned layout keeps it).
    pub scope: Option<Scope>,
    /// Ready, dead with the reason, or gone.
    pub action: ReleaseAction,
}

/// What releasing a held step does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseAction {
    /// Ready to claim (after its job's delay).
    Run,
    /// To its queue's dead letters, unrun, with the reason.
    Fail(String),
    /// Forgotten, unrun.
    Skip,
}

impl From<Decision> for ReleaseAction {
    fn from(d: Decision) -> Self {
        match d {
            Decision::Run => ReleaseAction::Run,
            Decision::Fail(why) => ReleaseAction::Fail(why),
            Decision::Skip => ReleaseAction::Skip,
        }
    }
}

/// A flow step's job ended in its partition: what the flow's home is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepEnded {
    /// The job.
    pub job: JobId,
    /// Its flow.
    pub flow: FlowId,
    /// Its step.
    pub step: String,
    /// How it ended.
    pub end: StepEnd,
    /// The steps its accepted completion added to the flow (full names; empty for any other
    /// end): [`FlowStore::grow_flow`](crate::store::FlowStore::grow_flow) adds them before
    /// the end is recorded.
    pub added: Vec<Step>,
    /// When it ended (unix ms; for the release latency metric).
    pub at_ms: u64,
    /// Its result (JSON, `Registry::register_with_result`), for its flow's home to keep for
    /// as long as the flow is kept ([`FlowStore::keep_results`](crate::store::FlowStore::keep_results)).
    pub result: Option<String>,
}

/// A flow at its home, as the memory store keeps it (the Redis scripts keep the same facts in
/// hashes): its graph, how its steps ended, what was decided, and which decided releases are
/// not confirmed yet. Pure: `advance` is the rule both backends apply.
#[derive(Clone, Debug)]
pub(crate) struct Home {
    id: FlowId,
    steps: HashMap<String, HomeStep>,
    ends: HashMap<String, StepEnd>,
    decided: HashMap<String, ReleaseAction>,
    out: BTreeSet<String>,
    cancelled: bool,
    /// Results of completed steps, kept as long as the flow.
    results: HashMap<String, String>,
}

/// Why the steps of a cancelled flow that had not started went to the dead letters.
#[doc(hidden)]
pub const CANCELLED: &str = "flow cancelled";

#[derive(Clone, Debug)]
struct HomeStep {
    job: JobId,
    scope: Option<Scope>,
    after: Vec<Edge>,
    /// The steps that run after this one.
    next: Vec<String>,
}

impl Home {
    /// A flow just kept: its steps that run after nothing are decided (released) at once.
    pub(crate) fn new(flow: &Flow) -> Self {
        let mut steps: HashMap<String, HomeStep> = flow
            .steps
            .iter()
            .map(|s| {
                let step = HomeStep {
                    job: flow.job_id(&s.name),
                    scope: s.job.scope.clone(),
                    after: s.after.clone(),
                    next: Vec::new(),
                };
                (s.name.clone(), step)
            })
            .collect();
        for s in &flow.steps {
            for e in &s.after {
                if let Some(dep) = steps.get_mut(&e.step) {
                    dep.next.push(s.name.clone());
                }
            }
        }
        let mut home = Self {
            id: flow.id,
            steps,
            ends: HashMap::new(),
            decided: HashMap::new(),
            out: BTreeSet::new(),
            cancelled: false,
            results: HashMap::new(),
        };
        for s in &flow.steps {
            if s.after.is_empty() {
                home.decided.insert(s.name.clone(), ReleaseAction::Run);
                home.out.insert(s.name.clone());
            }
        }
        home
    }

    /// Records `ended` (each step's first end only; unknown steps ignored), decides every
    /// step all of whose dependencies have now ended — a step decided dead or skipped has
    /// ended too, so its own dependents are decided in the same call — and forgets the
    /// confirmed releases `applied`.
    pub(crate) fn advance(&mut self, ended: &[(String, StepEnd)], applied: &[String]) {
        let mut work = Vec::new();
        for (name, end) in ended {
            if self.steps.contains_key(name) && !self.ends.contains_key(name) {
                self.ends.insert(name.clone(), *end);
                work.push(name.clone());
            }
        }
        while let Some(name) = work.pop() {
            let next = self.steps[&name].next.clone();
            for d in next {
                if self.decided.contains_key(&d) {
                    continue;
                }
                let Some(decision) = decide(&self.steps[&d].after, |s| self.ends.get(s).copied())
                else {
                    continue;
                };
                let end = match decision {
                    Decision::Run => None,
                    Decision::Fail(_) => Some(StepEnd::Dead),
                    Decision::Skip => Some(StepEnd::Skipped),
                };
                self.decided.insert(d.clone(), decision.into());
                self.out.insert(d.clone());
                if let Some(end) = end {
                    if !self.ends.contains_key(&d) {
                        self.ends.insert(d.clone(), end);
                        work.push(d);
                    }
                }
            }
        }
        for name in applied {
            self.out.remove(name);
        }
    }

    /// Keeps each step's result (the first kept stays; unknown steps ignored).
    pub(crate) fn keep_results(&mut self, results: &[(String, String)]) {
        for (step, json) in results {
            if self.steps.contains_key(step) {
                self.results
                    .entry(step.clone())
                    .or_insert_with(|| json.clone());
            }
        }
    }

    /// Step `step`'s kept result.
    pub(crate) fn result(&self, step: &str) -> Option<String> {
        self.results.get(step).cloned()
    }

    /// Adds `added` (full names; each runs after `parent`, and may run after steps added
    /// before it) to the flow, unless `parent`'s end is recorded already or one of them is a
    /// step already (a grow done again changes nothing): every step that runs after
    /// `parent` then also runs after each of them, on the same kind of edge. In a cancelled
    /// flow they are decided dead unrun, like every step not started. Mirrored by
    /// `flow_home.lua`'s "grow".
    pub(crate) fn grow(&mut self, parent: &str, added: &[Step]) {
        if added.is_empty()
            || !self.steps.contains_key(parent)
            || self.ends.contains_key(parent)
            || added.iter().any(|s| self.steps.contains_key(&s.name))
        {
            return;
        }
        let dependents = self.steps[parent].next.clone();
        for s in added {
            let mut next: Vec<String> = added
                .iter()
                .filter(|o| o.after.iter().any(|e| e.step == s.name))
                .map(|o| o.name.clone())
                .collect();
            next.extend(dependents.iter().cloned());
            let step = HomeStep {
                job: step_job_id(self.id, &s.name),
                scope: s.job.scope.clone(),
                after: s.after.clone(),
                next,
            };
            self.steps.insert(s.name.clone(), step);
        }
        for d in &dependents {
            let Some(step) = self.steps.get_mut(d) else {
                continue;
            };
            let on_dead = step
                .after
                .iter()
                .find(|e| e.step == parent)
                .map(|e| e.on_dead)
                .unwrap_or_default();
            step.after.extend(added.iter().map(|s| Edge {
                step: s.name.clone(),
                on_dead,
            }));
        }
        if let Some(p) = self.steps.get_mut(parent) {
            p.next.extend(added.iter().map(|s| s.name.clone()));
        }
        if self.cancelled {
            for s in added {
                self.decided
                    .insert(s.name.clone(), ReleaseAction::Fail(CANCELLED.into()));
                self.out.insert(s.name.clone());
                self.ends.insert(s.name.clone(), StepEnd::Dead);
            }
        }
    }

    /// The releases decided and not confirmed, in step-name order.
    pub(crate) fn pending(&self) -> Vec<Release> {
        self.out
            .iter()
            .map(|name| {
                let step = &self.steps[name];
                Release {
                    flow: self.id,
                    step: name.clone(),
                    job: step.job,
                    scope: step.scope.clone(),
                    action: self.decided[name].clone(),
                }
            })
            .collect()
    }

    /// Every step ended.
    pub(crate) fn finished(&self) -> bool {
        self.ends.len() == self.steps.len()
    }

    /// Cancels the flow (unless it finished): every step not decided yet is decided dead unrun
    /// (and has ended);
    /// returns the jobs of the steps released to run that have not ended (ready or running:
    /// the caller cancels them). A second cancel finds nothing more to do.
    pub(crate) fn cancel(&mut self) -> Vec<JobId> {
        if self.finished() {
            return Vec::new(); // (a finished flow keeps its state)
        }
        self.cancelled = true;
        let mut names: Vec<&String> = self.steps.keys().collect();
        names.sort();
        for name in names {
            if !self.decided.contains_key(name) {
                self.decided
                    .insert(name.clone(), ReleaseAction::Fail(CANCELLED.into()));
                self.out.insert(name.clone());
                self.ends.entry(name.clone()).or_insert(StepEnd::Dead);
            }
        }
        let mut running: Vec<(&String, JobId)> = self
            .decided
            .iter()
            .filter(|(name, action)| {
                **action == ReleaseAction::Run && !self.ends.contains_key(*name)
            })
            .map(|(name, _)| (name, self.steps[name].job))
            .collect();
        running.sort();
        running.into_iter().map(|(_, job)| job).collect()
    }

    /// Every step with where it is, in run order.
    pub(crate) fn step_statuses(&self) -> Vec<StepStatus> {
        let steps = self.steps.iter().map(|(name, step)| StepStatus {
            name: name.clone(),
            job: step.job,
            after: step.after.iter().map(|e| e.step.clone()).collect(),
            state: match (self.ends.get(name), self.decided.contains_key(name)) {
                (Some(end), _) => StepState::Ended(*end),
                (None, true) => StepState::Released,
                (None, false) => StepState::Waiting,
            },
        });
        in_run_order(steps.collect())
    }

    pub(crate) fn status(&self) -> FlowStatus {
        let state = if self.cancelled {
            FlowState::Cancelled
        } else if !self.finished() {
            FlowState::Running
        } else if self.ends.values().all(|e| *e == StepEnd::Completed) {
            FlowState::Succeeded
        } else {
            FlowState::Failed
        };
        FlowStatus {
            id: self.id,
            state,
            steps: self.steps.len(),
            ended: self.ends.clone(),
            released: self.decided.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> NewJob {
        NewJob::raw("k", "{}")
    }

    /// A flow created again under its id is compared by its declared graph: the same one
    /// passes (steps added by a running step, and the edges they brought, left out); another
    /// step, a missing one or another edge is named.
    #[test]
    fn a_flow_created_again_is_compared_by_its_declared_graph() {
        let step = |name: &str, after: &[&str]| StepStatus {
            name: name.into(),
            job: JobId::new(),
            after: after.iter().map(|s| s.to_string()).collect(),
            state: StepState::Waiting,
        };
        let flow = Flow::new()
            .step("split", job())
            .step_after("total", job(), &["split"]);
        let kept = [
            step("split", &[]),
            step("split/part:1", &["split"]),
            step("total", &["split", "split/part:1"]),
        ];
        assert_eq!(graph_difference(&flow, &kept), None);
        assert_eq!(graph_difference(&flow, &[]), None);
        let more = flow.clone().step("extra", job());
        assert!(graph_difference(&more, &kept)
            .unwrap()
            .contains("\"extra\""));
        let fewer = Flow::new().step("split", job());
        assert!(graph_difference(&fewer, &kept)
            .unwrap()
            .contains("\"total\" is missing"));
        let rewired = Flow::new().step("split", job()).step("total", job());
        assert!(graph_difference(&rewired, &kept)
            .unwrap()
            .contains("runs after"));
    }

    #[test]
    fn steps_come_in_run_order_and_a_cycle_goes_last() {
        let step = |name: &str, after: &[&str]| StepStatus {
            name: name.into(),
            job: JobId::new(),
            after: after.iter().map(|s| s.to_string()).collect(),
            state: StepState::Waiting,
        };
        let names = |steps: Vec<StepStatus>| -> Vec<String> {
            in_run_order(steps).into_iter().map(|s| s.name).collect()
        };
        // A diamond given backwards, and a second root.
        let diamond = vec![
            step("d", &["b", "c"]),
            step("c", &["a"]),
            step("b", &["a"]),
            step("z", &[]),
            step("a", &[]),
        ];
        assert_eq!(names(diamond), ["a", "z", "b", "c", "d"]);
        // A step after one the flow does not list, and two waiting on each other: last.
        let odd = vec![
            step("y", &["x"]),
            step("x", &["y"]),
            step("m", &["gone"]),
            step("a", &[]),
        ];
        assert_eq!(names(odd), ["a", "m", "x", "y"]);
        // A step listed twice as a dependency, and a long chain given backwards.
        let twice = vec![step("b", &["a", "a"]), step("a", &[])];
        assert_eq!(names(twice), ["a", "b"]);
        let chain: Vec<StepStatus> = (0..20_000)
            .rev()
            .map(|i| {
                let name = format!("s{i:05}");
                let before = format!("s{:05}", i.max(1) - 1);
                let after: Vec<&str> = if i == 0 { vec![] } else { vec![&before] };
                step(&name, &after)
            })
            .collect();
        let ordered = names(chain);
        assert!(ordered.windows(2).all(|w| w[0] < w[1]), "a chain in order");
    }

    #[test]
    fn decide_waits_for_every_dependency_then_applies_the_edges() {
        let after = vec![
            Edge {
                step: "a".into(),
                on_dead: OnDead::Run,
            },
            Edge {
                step: "b".into(),
                on_dead: OnDead::Skip,
            },
            Edge {
                step: "c".into(),
                on_dead: OnDead::Fail,
            },
        ];
        let ends = |a, b, c| {
            move |s: &str| match s {
                "a" => a,
                "b" => b,
                _ => c,
            }
        };
        use StepEnd::*;
        assert_eq!(
            decide(&after, ends(Some(Completed), Some(Completed), None)),
            None
        );
        assert_eq!(
            decide(&after, ends(Some(Dead), Some(Completed), Some(Completed))),
            Some(Decision::Run)
        );
        assert_eq!(
            decide(&after, ends(Some(Dead), Some(Dead), Some(Completed))),
            Some(Decision::Skip)
        );
        assert!(
            matches!(decide(&after, ends(Some(Completed), Some(Dead), Some(Skipped))), Some(Decision::Fail(r)) if r.contains("\"c\""))
        );
        assert_eq!(decide(&[], |_| None), Some(Decision::Run));
    }

    #[test]
    fn validate_refuses_cycles_unknown_and_repeated_names_and_own_ids() {
        let ok = Flow::new().step("a", job()).step_after("b", job(), &["a"]);
        ok.validate(1 << 20).unwrap();
        let cycle = Flow::new()
            .step_after("a", job(), &["c"])
            .step_after("b", job(), &["a"])
            .step_after("c", job(), &["b"])
            .step("d", job());
        assert!(cycle
            .validate(1 << 20)
            .unwrap_err()
            .to_string()
            .contains("cycle"));
        let unknown = Flow::new().step_after("a", job(), &["nope"]);
        assert!(unknown.validate(1 << 20).is_err());
        let twice = Flow::new().step("a", job()).step("a", job());
        assert!(twice.validate(1 << 20).is_err());
        let itself = Flow::new().step_after("a", job(), &["a"]);
        assert!(itself.validate(1 << 20).is_err());
        let dup_edge = Flow::new()
            .step("a", job())
            .step_after("b", job(), &["a", "a"]);
        assert!(dup_edge.validate(1 << 20).is_err());
        let own_id = Flow::new().step("a", job().with_id(JobId::new()));
        assert!(own_id.validate(1 << 20).is_err());
        assert!(Flow::new().validate(1 << 20).is_err());
        assert!(Flow::new().step("", job()).validate(1 << 20).is_err());
        assert!(Flow::new().step("a\tb", job()).validate(1 << 20).is_err());
        // ('/' joins the names of added steps: a flow's own step may not look like one.)
        assert!(Flow::new()
            .step("split/part", job())
            .validate(1 << 20)
            .is_err());
    }

    #[test]
    fn check_added_takes_only_what_add_step_makes() {
        let step = |name: &str, after: &[&str]| Step {
            name: name.into(),
            job: job(),
            after: after
                .iter()
                .map(|s| Edge {
                    step: (*s).into(),
                    on_dead: OnDead::Fail,
                })
                .collect(),
        };
        let ok = [step("p/a", &["p"]), step("p/b", &["p", "p/a"])];
        check_added("p", &ok, 1 << 20).unwrap();
        for bad in [
            vec![step("q/a", &["p"])],                        // another step's name
            vec![step("p/a/b", &["p"])],                      // a '/' in its own name
            vec![step("p/a", &[])],                           // not after its parent
            vec![step("p/a", &["p/b"]), step("p/b", &["p"])], // after one added later
            vec![step("p/a", &["p"]), step("p/a", &["p"])],   // added twice
            vec![step("p/a", &["p"]), step("p/b", &["p", "p/a", "p/a"])], // an edge twice
            vec![step("p/a", &["p", "x"])],                   // after an unrelated step
        ] {
            assert!(check_added("p", &bad, 1 << 20).is_err(), "{bad:?}");
        }
        let mut own_id = step("p/a", &["p"]);
        own_id.job = job().with_id(JobId::new());
        assert!(check_added("p", &[own_id], 1 << 20).is_err());
        assert!(check_added("p", &ok, 1).is_err(), "payload limit");
    }

    #[test]
    fn batches_and_chains_wire_their_edges() {
        let b = Flow::batch([job(), job()])
            .on_success(job())
            .on_complete(job());
        b.validate(1 << 20).unwrap();
        let s = &b.steps()[2];
        assert_eq!(s.name, "on_success");
        assert_eq!(s.after.len(), 2);
        assert!(s.after.iter().all(|e| e.on_dead == OnDead::Skip));
        let c = &b.steps()[3];
        assert_eq!(c.after.len(), 2, "on_complete does not wait for on_success");
        let chain = Flow::chain([job(), job(), job()]);
        chain.validate(1 << 20).unwrap();
        assert_eq!(chain.steps()[2].after[0].step, "1");
        assert_ne!(chain.job_id("0"), chain.job_id("1"));
        assert_eq!(chain.job_id("0"), step_job_id(chain.id(), "0"));
    }
}
