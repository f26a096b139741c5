//! Exhaustive model check (issue 11) with `stateright`: a coordinator granting leases on one
//! scope, two workers, a network that delays, reorders, duplicates and loses writes, a
//! coordinator that may lose its state once (with or without a durable epoch), a low
//! watermark published to the sink and fences collected below it, and a sink deciding with
//! the library's own admission rule ([`palisade::decide`]). Every reachable state within the
//! bounds satisfies the invariants; a sink with the fence dropped, one that collects fences
//! but decides without the watermark, one that half-applies a refused mutation list, and one
//! that leaves its fence behind when it refuses a write for its content each yield a
//! counterexample trace.
//!
//! Leases expire at any moment (the checker tries every interleaving), so "paused past its
//! lease" is simply a worker that acts after `Expire`: the model's workers never consult the
//! coordinator before writing — only the sink stands between them and the data.

use palisade::{advance, decide, Admission, Fence, FencingToken, LeaseId, Rejection};
use stateright::{Checker, Model, Property};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sink {
    /// The library's rule.
    Fenced,
    /// Planted bug: "a lease check instead of a fence" — the sink only dedupes by key.
    NoFence,
    /// Planted bug: a refused mutation list leaves its first step applied.
    HalfApply,
    /// Planted bug: forgets fences below the watermark, then decides without it.
    Forgetful,
    /// Planted bug: a write refused for its content leaves the fence where it was.
    StuckFence,
}

struct Fencing {
    workers: usize,
    max_claims: u8,
    sink: Sink,
}

/// A claim as a worker holds it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Grant {
    token: FencingToken,
    lease: u8,
}

/// A write on its way to the sink: the job's logical write (one idempotency key, repeated
/// by each run), or — `per_run` — a write keyed by the run, which only the fence keeps a
/// stale run from applying; `bad` carries a mutation list that does not fit.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Msg {
    grant: Grant,
    bad: bool,
    per_run: bool,
}

impl Msg {
    fn key(&self) -> u8 {
        if self.per_run {
            10 + self.grant.lease
        } else {
            0
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    epoch: u32,
    counter: u64,
    holder: Option<u8>,
    claims: u8,
    lost_state: bool,
    workers: Vec<Option<Grant>>,
    net: Vec<Msg>,
    // The sink.
    highest: Option<Grant>,
    keys_applied: Vec<u8>,
    watermark: FencingToken,
    data: i64,
    // What an observer of the sink's answers has seen.
    applied_good: i64,
    /// The newest token that passed the ownership checks: accepted, or refused for its
    /// content only (invariant 8: nothing below it may be accepted after).
    max_owned: Option<FencingToken>,
    stale_accepted: bool,
    conflict_accepted: bool,
    applied_twice: bool,
    stale_refused: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Action {
    Claim(usize),
    Expire,
    Complete(usize),
    /// Worker, bad mutation list, keyed per run.
    Send(usize, bool, bool),
    Deliver(usize),
    Redeliver(usize),
    Drop(usize),
    LoseState {
        durable: bool,
    },
    /// A worker passes the coordinator's low watermark to the sink (after a settle).
    PublishWatermark,
    /// The sink forgets the scope's fence if it is below its watermark.
    Collect,
}

fn lease_id(lease: u8) -> LeaseId {
    LeaseId::from(uuid::Uuid::from_u128(u128::from(lease) + 1))
}

impl Fencing {
    /// The coordinator's low watermark: the live lease's token, or the next token when none
    /// is live (every lease below it is no longer current).
    fn coordinator_watermark(&self, state: &State) -> FencingToken {
        match state.holder {
            Some(lease) => state
                .workers
                .iter()
                .flatten()
                .find(|g| g.lease == lease)
                .map_or(FencingToken::ZERO, |g| g.token),
            None => FencingToken::new(state.epoch, state.counter + 1),
        }
    }

    /// The sink's answer to one write, and its new state.
    fn deliver(&self, state: &mut State, msg: Msg) {
        let presented = Fence {
            token: msg.grant.token,
            lease: lease_id(msg.grant.lease),
        };
        let highest = state.highest.map(|g| Fence {
            token: g.token,
            lease: lease_id(g.lease),
        });
        let key = msg.key();
        let key_applied = state.keys_applied.contains(&key);
        let admission = match self.sink {
            Sink::NoFence if key_applied => Admission::Duplicate,
            Sink::NoFence => Admission::Applied,
            Sink::Forgetful => decide(highest, presented, key_applied, FencingToken::ZERO),
            _ => decide(highest, presented, key_applied, state.watermark),
        };
        let admission = match admission {
            Admission::Applied if msg.bad => {
                if self.sink == Sink::HalfApply {
                    state.data += 1; // the first step stays
                }
                Admission::Rejected(Rejection::Mutation {
                    why: "type clash".into(),
                })
            }
            other => other,
        };
        match admission {
            Admission::Rejected(Rejection::StaleToken { .. }) => state.stale_refused = true,
            Admission::Rejected(Rejection::Mutation { .. }) => {
                // It passed the ownership checks: no data, no key, but the fence advances.
                state.max_owned = state.max_owned.max(Some(msg.grant.token));
                if self.sink != Sink::StuckFence && advance(highest, presented) == Some(presented) {
                    state.highest = Some(msg.grant);
                }
            }
            Admission::Rejected(_) => {}
            accepted => {
                if accepted == Admission::Applied {
                    state.applied_twice |= key_applied;
                    state.keys_applied.push(key);
                    state.keys_applied.sort_unstable();
                    state.data += 1;
                    state.applied_good += 1;
                }
                if state.max_owned.is_some_and(|m| msg.grant.token < m) {
                    state.stale_accepted = true;
                }
                if let Some(h) = state.highest {
                    if h.token == msg.grant.token && h.lease != msg.grant.lease {
                        state.conflict_accepted = true;
                    }
                }
                state.max_owned = state.max_owned.max(Some(msg.grant.token));
                if state.highest.is_none_or(|h| msg.grant.token > h.token) {
                    state.highest = Some(msg.grant);
                }
            }
        }
    }
}

impl Model for Fencing {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            epoch: 0,
            counter: 0,
            holder: None,
            claims: 0,
            lost_state: false,
            workers: vec![None; self.workers],
            net: Vec::new(),
            highest: None,
            keys_applied: Vec::new(),
            watermark: FencingToken::ZERO,
            data: 0,
            applied_good: 0,
            max_owned: None,
            stale_accepted: false,
            conflict_accepted: false,
            applied_twice: false,
            stale_refused: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (w, grant) in state.workers.iter().enumerate() {
            match grant {
                None if state.holder.is_none() && state.claims < self.max_claims => {
                    actions.push(Action::Claim(w))
                }
                None => {}
                Some(_) => {
                    actions.push(Action::Complete(w));
                    if state.net.len() < 2 {
                        actions.push(Action::Send(w, false, false));
                        actions.push(Action::Send(w, true, false));
                        actions.push(Action::Send(w, false, true));
                    }
                }
            }
        }
        if state.holder.is_some() {
            actions.push(Action::Expire);
        }
        for i in 0..state.net.len() {
            actions.push(Action::Deliver(i));
            actions.push(Action::Drop(i));
            if state.net.len() < 2 {
                actions.push(Action::Redeliver(i));
            }
        }
        if !state.lost_state {
            actions.push(Action::LoseState { durable: true });
            actions.push(Action::LoseState { durable: false });
        }
        if self.coordinator_watermark(state) > state.watermark {
            actions.push(Action::PublishWatermark);
        }
        if state.highest.is_some_and(|h| h.token < state.watermark) {
            actions.push(Action::Collect);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Claim(w) => {
                s.counter += 1;
                let grant = Grant {
                    token: FencingToken::new(s.epoch, s.counter),
                    lease: s.claims,
                };
                s.claims += 1;
                s.holder = Some(grant.lease);
                s.workers[w] = Some(grant);
            }
            Action::Expire => s.holder = None,
            Action::Complete(w) => {
                // Checked by lease id: a lease that is not current changes nothing.
                let grant = s.workers[w].take()?;
                if s.holder == Some(grant.lease) {
                    s.holder = None;
                }
            }
            Action::Send(w, bad, per_run) => s.net.push(Msg {
                grant: s.workers[w]?,
                bad,
                per_run,
            }),
            Action::Deliver(i) => {
                let msg = s.net.remove(i);
                self.deliver(&mut s, msg);
            }
            // The same write again (a retry after a lost reply), the original still in flight.
            Action::Redeliver(i) => {
                let msg = s.net[i];
                s.net.push(msg);
            }
            Action::Drop(i) => {
                s.net.remove(i);
            }
            // Redis restarted empty: every lease and counter gone. A durable epoch source
            // moves tokens to a new epoch; without one the counter starts over (a regression
            // the sink must refuse).
            Action::PublishWatermark => {
                s.watermark = s.watermark.max(self.coordinator_watermark(&s));
            }
            Action::Collect => s.highest = None,
            Action::LoseState { durable } => {
                s.lost_state = true;
                s.holder = None;
                s.counter = 0;
                if durable {
                    s.epoch += 1;
                }
            }
        }
        Some(s)
    }

    /// A half-applying sink could grow `data` forever; one surplus step is all a
    /// counterexample needs.
    fn within_boundary(&self, state: &State) -> bool {
        state.data <= state.applied_good + 1
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no_stale_write", |_, s: &State| !s.stale_accepted),
            Property::always("one_token_one_lease", |_, s: &State| !s.conflict_accepted),
            Property::always("at_most_once_per_key", |_, s: &State| !s.applied_twice),
            Property::always("all_or_nothing", |_, s: &State| s.data == s.applied_good),
            Property::sometimes("a stale write is refused", |_, s: &State| s.stale_refused),
        ]
    }
}

/// Explores every reachable state for the library's sink; a planted bug's run stops at the
/// first failure (BFS: a shortest counterexample).
fn check(sink: Sink) -> impl Checker<Fencing> {
    let model = Fencing {
        workers: 2,
        max_claims: 3,
        sink,
    };
    let checker = model.checker();
    let checker = if sink == Sink::Fenced {
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
fn every_reachable_state_keeps_the_invariants() {
    let checker = check(Sink::Fenced);
    println!(
        "explored {} states ({} unique)",
        checker.state_count(),
        checker.unique_state_count()
    );
    for invariant in [
        "no_stale_write",
        "one_token_one_lease",
        "at_most_once_per_key",
        "all_or_nothing",
    ] {
        if let Some(path) = checker.discovery(invariant) {
            panic!("{invariant} violated: {}", trace(path));
        }
    }
    checker.assert_any_discovery("a stale write is refused");
    assert!(
        checker.unique_state_count() > 10_000,
        "the bounds explore too little"
    );
}

#[test]
fn a_dropped_fence_yields_a_counterexample() {
    let checker = check(Sink::NoFence);
    let path = checker.assert_any_discovery("no_stale_write");
    println!("counterexample: {}", trace(path));
}

#[test]
fn collecting_fences_without_the_watermark_yields_a_counterexample() {
    let checker = check(Sink::Forgetful);
    let path = checker.assert_any_discovery("no_stale_write");
    println!("counterexample: {}", trace(path));
}

#[test]
fn a_fence_left_behind_by_a_content_refusal_yields_a_counterexample() {
    let checker = check(Sink::StuckFence);
    let path = checker.assert_any_discovery("no_stale_write");
    println!("counterexample: {}", trace(path));
}

#[test]
fn a_half_applied_write_yields_a_counterexample() {
    let checker = check(Sink::HalfApply);
    let path = checker.assert_any_discovery("all_or_nothing");
    println!("counterexample: {}", trace(path));
}

#[test]
fn the_model_sink_is_the_library_rule() {
    // A refusal the model relies on, straight from the library.
    let newer = Fence {
        token: FencingToken::new(0, 2),
        lease: lease_id(1),
    };
    let older = Fence {
        token: FencingToken::new(0, 1),
        lease: lease_id(0),
    };
    assert!(matches!(
        decide(Some(newer), older, false, FencingToken::ZERO),
        Admission::Rejected(Rejection::StaleToken { .. })
    ));
}
