//! Exhaustive model check of the flow protocol (issue 25) with `stateright`: a batch of two
//! children (the second may die) with an `on_complete` callback (runs anyway) and an
//! `on_success` one (skipped if a child died); two coordinators' flow passes running at once,
//! each step of a pass one atomic store call (read the step ends, record them at the home and
//! take its decisions, release in the partition, confirm to the home and forget the ends), a
//! pass that stops at any point, and a sweep that delivers the home's unconfirmed releases.
//! Decisions use the library's own rule ([`palisade::decide_step`]).
//!
//! Invariants: **no step starts early** (a step becomes ready only when every step it runs
//! after has ended) and **each step once** (a step becomes ready at most once). Planted bugs
//! yield counterexamples: a home that counts dependencies down on every delivered end
//! instead of recording each end once (the pitfall the issue names), and a step's end
//! reported when its job starts (an attempt) rather than when it settles.

use std::collections::BTreeSet;

use palisade::{decide_step, Decision, Edge, OnDead, StepEnd};
use stateright::{Checker, Model, Property};

/// Steps: 0 and 1 the children, 2 `on_complete`, 3 `on_success`.
const STEPS: usize = 4;

fn after(step: usize) -> Vec<Edge> {
    let on_dead = match step {
        2 => OnDead::Run,
        3 => OnDead::Skip,
        _ => return Vec::new(),
    };
    ["0", "1"]
        .iter()
        .map(|s| Edge {
            step: (*s).into(),
            on_dead,
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Home {
    /// The library's rule: each end recorded once, each dependent decided once.
    Library,
    /// Planted bug: a dependency counter lowered on every delivered end.
    CountDown,
    /// Planted bug: a step's end reported when its job starts.
    EndOnAttempt,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Job {
    Held,
    Ready,
    Gone(End),
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Completed,
    Dead,
    Skipped,
}

impl End {
    fn lib(self) -> StepEnd {
        match self {
            End::Completed => StepEnd::Completed,
            End::Dead => StepEnd::Dead,
            End::Skipped => StepEnd::Skipped,
        }
    }
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Act {
    Run,
    Fail,
    Skip,
}

/// One pass, between its atomic steps: the ends it read, the releases the home gave it.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Pass {
    Idle,
    Read(Vec<(usize, End)>),
    Advanced(Vec<(usize, End)>, Vec<(usize, Act)>),
    Released(Vec<(usize, End)>, Vec<(usize, Act)>),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    jobs: [Job; STEPS],
    /// Times each step became ready (saturating at 2).
    readied: [u8; STEPS],
    /// A step became ready while one it runs after had not ended.
    early: bool,
    /// Step ends kept in the partition, not forgotten yet.
    outbox: BTreeSet<(usize, End)>,
    /// At the home: ends recorded, decisions, releases not confirmed, dependencies left.
    ends: [Option<End>; STEPS],
    decided: [Option<Act>; STEPS],
    out: [bool; STEPS],
    left: [u8; STEPS],
    passes: [Pass; 2],
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    Finish(usize, End),
    Read(usize),
    Advance(usize),
    Release(usize),
    Confirm(usize),
    Sweep(usize),
    Stop(usize),
}

struct Flows {
    home: Home,
}

impl Flows {
    /// The home records `ended` and decides what that unblocks.
    fn advance(&self, s: &mut State, ended: &[(usize, End)]) {
        let mut work = Vec::new();
        for &(step, end) in ended {
            match self.home {
                Home::CountDown => {
                    s.ends[step].get_or_insert(end);
                    for d in [2, 3] {
                        s.left[d] = s.left[d].saturating_sub(1);
                        if s.left[d] == 0 && s.decided[d].is_none() {
                            s.decided[d] = Some(Act::Run);
                            s.out[d] = true;
                        }
                    }
                }
                _ => {
                    if s.ends[step].is_none() {
                        s.ends[step] = Some(end);
                        work.push(step);
                    }
                }
            }
        }
        while let Some(step) = work.pop() {
            if step > 1 {
                continue; // (the callbacks have no dependents)
            }
            for d in [2, 3] {
                if s.decided[d].is_some() {
                    continue;
                }
                let ends = s.ends;
                let name = |n: &str| n.parse::<usize>().ok().and_then(|i| ends[i]).map(End::lib);
                let (act, end) = match decide_step(&after(d), name) {
                    None => continue,
                    Some(Decision::Run) => (Act::Run, None),
                    Some(Decision::Fail(_)) => (Act::Fail, Some(End::Dead)),
                    Some(Decision::Skip) => (Act::Skip, Some(End::Skipped)),
                };
                s.decided[d] = Some(act);
                s.out[d] = true;
                if let Some(end) = end {
                    s.ends[d].get_or_insert(end);
                }
            }
        }
    }

    fn pending(s: &State) -> Vec<(usize, Act)> {
        (0..STEPS)
            .filter(|i| s.out[*i])
            .map(|i| (i, s.decided[i].expect("out implies decided")))
            .collect()
    }
}

impl Model for Flows {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // The flow as `put` keeps it: both children decided to run, not released yet.
        vec![State {
            jobs: [Job::Held; STEPS],
            readied: [0; STEPS],
            early: false,
            outbox: BTreeSet::new(),
            ends: [None; STEPS],
            decided: [Some(Act::Run), Some(Act::Run), None, None],
            out: [true, true, false, false],
            left: [0, 0, 2, 2],
            passes: [Pass::Idle, Pass::Idle],
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (step, job) in s.jobs.iter().enumerate() {
            if *job == Job::Ready {
                actions.push(Action::Finish(step, End::Completed));
                if step == 1 {
                    actions.push(Action::Finish(step, End::Dead));
                }
            }
        }
        for (p, pass) in s.passes.iter().enumerate() {
            match pass {
                Pass::Idle => {
                    actions.push(Action::Read(p));
                    actions.push(Action::Sweep(p));
                }
                Pass::Read(_) => actions.push(Action::Advance(p)),
                Pass::Advanced(..) => actions.push(Action::Release(p)),
                Pass::Released(..) => actions.push(Action::Confirm(p)),
            }
            if *pass != Pass::Idle {
                actions.push(Action::Stop(p));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Finish(step, end) => {
                s.jobs[step] = Job::Gone(end);
                if self.home != Home::EndOnAttempt {
                    s.outbox.insert((step, end));
                }
            }
            Action::Read(p) => {
                s.passes[p] = Pass::Read(s.outbox.iter().copied().collect());
            }
            Action::Advance(p) => {
                let Pass::Read(read) = s.passes[p].clone() else {
                    return None;
                };
                self.advance(&mut s, &read);
                s.passes[p] = Pass::Advanced(read, Self::pending(&s));
            }
            Action::Sweep(p) => {
                let pending = Self::pending(&s);
                if pending.is_empty() {
                    return None;
                }
                s.passes[p] = Pass::Advanced(Vec::new(), pending);
            }
            Action::Release(p) => {
                let Pass::Advanced(read, releases) = s.passes[p].clone() else {
                    return None;
                };
                for &(step, act) in &releases {
                    if s.jobs[step] != Job::Held {
                        continue; // a release acts only on a held job
                    }
                    s.jobs[step] = match act {
                        Act::Run => {
                            s.readied[step] = (s.readied[step] + 1).min(2);
                            let deps_ended =
                                step < 2 || (0..2).all(|d| matches!(s.jobs[d], Job::Gone(_)));
                            s.early |= !deps_ended;
                            if self.home == Home::EndOnAttempt {
                                s.outbox.insert((step, End::Completed));
                            }
                            Job::Ready
                        }
                        Act::Fail => Job::Gone(End::Dead),
                        Act::Skip => Job::Gone(End::Skipped),
                    };
                }
                s.passes[p] = Pass::Released(read, releases);
            }
            Action::Confirm(p) => {
                let Pass::Released(read, releases) = s.passes[p].clone() else {
                    return None;
                };
                for (step, _) in releases {
                    s.out[step] = false;
                }
                for end in read {
                    s.outbox.remove(&end);
                }
                s.passes[p] = Pass::Idle;
            }
            Action::Stop(p) => s.passes[p] = Pass::Idle,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no_step_starts_early", |_, s: &State| !s.early),
            Property::always("each_step_once", |_, s: &State| {
                s.readied.iter().all(|n| *n <= 1)
            }),
            Property::sometimes("the callback completes", |_, s: &State| {
                s.jobs[2] == Job::Gone(End::Completed)
            }),
            Property::sometimes("on_success is skipped", |_, s: &State| {
                s.jobs[3] == Job::Gone(End::Skipped)
            }),
        ]
    }
}

fn check(home: Home) -> impl Checker<Flows> {
    let checker = Flows { home }.checker();
    let checker = if home == Home::Library {
        checker
    } else {
        checker.finish_when(stateright::HasDiscoveries::AnyFailures)
    };
    checker.spawn_bfs().join()
}

fn trace(path: stateright::Path<State, Action>) -> String {
    path.into_actions()
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(" → ")
}

#[test]
fn every_reachable_flow_state_keeps_the_invariants() {
    let checker = check(Home::Library);
    println!(
        "explored {} states ({} unique)",
        checker.state_count(),
        checker.unique_state_count()
    );
    for invariant in ["no_step_starts_early", "each_step_once"] {
        if let Some(path) = checker.discovery(invariant) {
            panic!("{invariant} violated: {}", trace(path));
        }
    }
    checker.assert_any_discovery("the callback completes");
    checker.assert_any_discovery("on_success is skipped");
    assert!(
        checker.unique_state_count() > 1_000,
        "the bounds explore too little"
    );
}

#[test]
fn a_home_that_counts_down_per_delivery_yields_a_counterexample() {
    let checker = check(Home::CountDown);
    let early = checker.discovery("no_step_starts_early");
    let twice = checker.discovery("each_step_once");
    let path = early.or(twice).expect("a counted-down home is caught");
    println!("counterexample: {}", trace(path));
}

#[test]
fn an_end_reported_at_the_attempt_yields_a_counterexample() {
    let checker = check(Home::EndOnAttempt);
    let path = checker.assert_any_discovery("no_step_starts_early");
    println!("counterexample: {}", trace(path));
}
