//! Issue 25: flows — one conformance suite run against the memory store, one Redis, and three
//! Redis partitions (a flow's steps spread over them, its home in one). Each scenario makes
//! the bad thing try to happen: a dependent claimed early, a step's end or a release
//! delivered twice or lost, a paused holder's completion, a creation stopped halfway.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use palisade::store::{FlowStore, Stores};
use palisade::*;
use palisade_testkit::RedisServer;

const TTL: Duration = Duration::from_secs(30);

fn ok(value: i64) -> Settlement {
    Settlement::Complete {
        result: Some(format!("{{\"ok\":{value}}}")),
        then: palisade::Then::default(),
    }
}

fn job(kind: &str) -> NewJob {
    NewJob::raw(kind, "null")
}

/// A pass of the flow driver, as the coordinator runs it on every reaper tick.
async fn pass(stores: &Stores) {
    palisade::store::advance_flows(stores).await.unwrap();
}

/// Claims everything claimable of `kinds` (in `queue` default), by kind.
async fn claim_all(stores: &Stores, worker: &str) -> Vec<Claim> {
    stores.claim("default", worker, 100, TTL).await.unwrap()
}

fn kinds(claims: &[Claim]) -> Vec<String> {
    let mut k: Vec<String> = claims
        .iter()
        .map(|c| c.job.flow.as_ref().unwrap().step.clone())
        .collect();
    k.sort();
    k
}

async fn complete(stores: &Stores, claims: &[Claim], value: i64) {
    let settled = stores
        .settle(claims.iter().map(|c| (c.lease.id, ok(value))).collect())
        .await
        .unwrap();
    assert!(settled.iter().all(|r| r.is_ok()), "{settled:?}");
}

/// A diamond a → (b, c) → d: nothing but `a` is claimable until `a` completed, `d` only
/// after both; results are kept with each completion; the flow ends succeeded.
async fn diamond(stores: &Stores) {
    let client = Client::new(stores.clone());
    let flow = Flow::new()
        .step("a", job("k"))
        .step_after("b", job("k"), &["a"])
        .step_after("c", job("k").with_scope("shared-scope"), &["a"])
        .step_after("d", job("k"), &["b", "c"]);
    let before = stores.flows_created().await.unwrap().unwrap();
    let id = client.create_flow(&flow).await.unwrap();
    // Counted once where it is kept, a creation done again not at all.
    assert_eq!(client.create_flow(&flow).await.unwrap(), id);
    assert_eq!(stores.flows_created().await.unwrap(), Some(before + 1));
    let status = client.flow(id).await.unwrap().unwrap();
    assert_eq!(
        (status.state, status.steps, status.released),
        (FlowState::Running, 4, 1)
    );
    // Each step where it is, in run order, with what it runs after (for operators' pages).
    let steps = |list: Vec<StepStatus>| -> Vec<(String, StepState, Vec<String>)> {
        list.into_iter()
            .map(|s| {
                assert_eq!(s.job, flow.job_id(&s.name));
                (s.name, s.state, s.after)
            })
            .collect()
    };
    let (w, r) = (StepState::Waiting, StepState::Released);
    let after = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        steps(stores.flow_steps(id).await.unwrap()),
        [
            ("a".into(), r, after(&[])),
            ("b".into(), w, after(&["a"])),
            ("c".into(), w, after(&["a"])),
            ("d".into(), w, after(&["b", "c"])),
        ]
    );
    let (running, ids) = stores.running_flows(100).await.unwrap();
    assert!(
        running >= 1 && ids.iter().any(|(f, _)| *f == id),
        "{running} {ids:?}"
    );
    let a = claim_all(stores, "w").await;
    assert_eq!(kinds(&a), ["a"], "only the root is claimable");
    assert_eq!(a[0].job.flow.as_ref().unwrap().flow, id);
    pass(stores).await;
    assert!(
        claim_all(stores, "w").await.is_empty(),
        "b and c wait for a"
    );
    complete(stores, &a, 1).await;
    pass(stores).await;
    let bc = claim_all(stores, "w").await;
    assert_eq!(kinds(&bc), ["b", "c"]);
    complete(stores, &bc[..1], 2).await;
    pass(stores).await;
    assert!(claim_all(stores, "w").await.is_empty(), "d waits for both");
    complete(stores, &bc[1..], 3).await;
    pass(stores).await;
    let d = claim_all(stores, "w").await;
    assert_eq!(kinds(&d), ["d"]);
    assert_eq!(d[0].job.flow.as_ref().unwrap().after, ["b", "c"]);
    // What d's handler reads through its context: the results kept with b's and c's
    // completions.
    let b: Option<i64> = client.result(flow.job_id("b")).await.unwrap();
    let c: Option<i64> = client.result(flow.job_id("c")).await.unwrap();
    assert_eq!(b.unwrap() + c.unwrap(), 5);
    // The flow's home keeps them too, for as long as the flow (a job's own result record
    // expires a day after its completion, however long the flow runs).
    let kept = |step: &'static str| async move {
        let json = stores.step_result(id, step).await.unwrap().unwrap();
        serde_json::from_str::<serde_json::Value>(&json).unwrap()["ok"]
            .as_i64()
            .unwrap()
    };
    assert_eq!((kept("a").await, kept("b").await + kept("c").await), (1, 5));
    assert_eq!(
        stores.step_result(id, "d").await.unwrap(),
        None,
        "d has not run"
    );
    complete(stores, &d, 4).await;
    pass(stores).await;
    let done = client
        .wait_flow(id, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.state, FlowState::Succeeded);
    assert_eq!(done.count(StepEnd::Completed), 4);
    let ended = StepState::Ended(StepEnd::Completed);
    let states: Vec<StepState> = stores
        .flow_steps(id)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.state)
        .collect();
    assert_eq!(states, [ended; 4]);
    assert!(stores.flow_steps(FlowId::new()).await.unwrap().is_empty());
    let (_, ids) = stores.running_flows(100).await.unwrap();
    assert!(
        !ids.iter().any(|(f, _)| *f == id),
        "a finished flow is no longer running"
    );
    assert_eq!(stores.counts("default").await.unwrap().pending(), 0);
}

/// A batch of 5 whose child 2 dies: `on_success` is skipped (never runs, no dead letter),
/// `on_complete` runs once — however often the step ends and releases are delivered again.
async fn batch_callbacks_once(stores: &Stores) {
    let client = Client::new(stores.clone());
    let flow = Flow::batch((0..5).map(|_| job("child")))
        .on_success(job("yay"))
        .on_complete(job("done"));
    let id = client.create_flow(&flow).await.unwrap();
    let children = claim_all(stores, "w").await;
    assert_eq!(children.len(), 5);
    let mut settlements = Vec::new();
    for c in &children {
        let dies = c.job.flow.as_ref().unwrap().step == "child:2";
        settlements.push((
            c.lease.id,
            if dies {
                Settlement::Dead {
                    reason: "boom".into(),
                }
            } else {
                ok(1)
            },
        ));
    }
    stores.settle(settlements).await.unwrap();
    // The step ends delivered twice (a sweep racing a late delivery): recorded once.
    let ends = stores.step_ends(100).await.unwrap();
    assert_eq!(ends.len(), 5, "{ends:?}");
    let ended: Vec<(String, StepEnd)> = ends.iter().map(|e| (e.step.clone(), e.end)).collect();
    let first = stores.advance_flow(id, &ended, &[]).await.unwrap();
    let again = stores.advance_flow(id, &ended, &[]).await.unwrap();
    assert_eq!(first, again, "a repeated end decides nothing new");
    let mut steps: Vec<(&str, &ReleaseAction)> =
        first.iter().map(|r| (r.step.as_str(), &r.action)).collect();
    steps.sort_by_key(|s| s.0);
    assert_eq!(
        steps,
        [
            ("on_complete", &ReleaseAction::Run),
            ("on_success", &ReleaseAction::Skip)
        ]
    );
    // Released twice: the callback becomes ready once.
    stores.release(first.clone()).await.unwrap();
    stores.release(first.clone()).await.unwrap();
    pass(stores).await;
    let callbacks = claim_all(stores, "w").await;
    assert_eq!(kinds(&callbacks), ["on_complete"]);
    complete(stores, &callbacks, 0).await;
    // Released again after it ran and completed: nothing comes back.
    stores.release(first).await.unwrap();
    pass(stores).await;
    pass(stores).await;
    assert!(
        claim_all(stores, "w").await.is_empty(),
        "the callback ran once"
    );
    let done = client.flow(id).await.unwrap().unwrap();
    assert_eq!(done.state, FlowState::Failed);
    assert_eq!(
        (
            done.count(StepEnd::Completed),
            done.count(StepEnd::Dead),
            done.count(StepEnd::Skipped)
        ),
        (5, 1, 1)
    );
    assert_eq!(
        stores.dead("default", 10).await.unwrap().len(),
        1,
        "only child 2"
    );
}

/// A dead step fails its dependent on a fail edge — to the dead letters, unrun, with the
/// reason — and that one's run-anyway dependent still runs.
async fn fail_edges_cascade(stores: &Stores) {
    let client = Client::new(stores.clone());
    let flow = Flow::new()
        .step("a", job("k").with_queue("cascade"))
        .step_after("b", job("k").with_queue("cascade"), &["a"])
        .step_with("c", job("k").with_queue("cascade"), [("b", OnDead::Run)]);
    let id = client.create_flow(&flow).await.unwrap();
    let a = stores.claim("cascade", "w", 10, TTL).await.unwrap();
    stores
        .settle(vec![(
            a[0].lease.id,
            Settlement::Dead {
                reason: "no".into(),
            },
        )])
        .await
        .unwrap();
    pass(stores).await;
    let c = stores.claim("cascade", "w", 10, TTL).await.unwrap();
    assert_eq!(kinds(&c), ["c"], "b failed unrun; c runs anyway");
    let dead = stores.dead("cascade", 10).await.unwrap();
    assert_eq!(dead.len(), 2);
    assert!(
        dead.iter().any(|d| d.job.id == flow.job_id("b")
            && d.reason.contains("step \"a\" it runs after was dead")),
        "{dead:?}"
    );
    complete(stores, &c, 0).await;
    pass(stores).await;
    let done = client.flow(id).await.unwrap().unwrap();
    assert_eq!(done.state, FlowState::Failed);
    assert_eq!(done.ended["b"], StepEnd::Dead);
}

/// A holder paused past its lease: the step runs again under a new lease; the paused
/// holder's completion is refused, so no end of its is kept and the dependent waits for the
/// new holder's completion.
async fn a_stale_holder_moves_nothing(stores: &Stores) {
    let client = Client::new(stores.clone());
    let flow = Flow::chain([job("k").with_queue("stale"), job("k").with_queue("stale")]);
    let id = client.create_flow(&flow).await.unwrap();
    let first = stores
        .claim("stale", "paused", 1, Duration::from_millis(100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stores.reap(100).await.unwrap();
    let second = stores.claim("stale", "w", 1, TTL).await.unwrap();
    assert_eq!(second[0].job.id, first[0].job.id);
    let late = stores
        .settle(vec![(first[0].lease.id, ok(666))])
        .await
        .unwrap();
    assert!(
        matches!(late[0], Err(Error::LeaseNotCurrent(_))),
        "{late:?}"
    );
    assert!(
        stores.step_ends(10).await.unwrap().is_empty(),
        "no end for a refused completion"
    );
    pass(stores).await;
    assert!(stores.claim("stale", "w", 1, TTL).await.unwrap().is_empty());
    assert_eq!(client.result::<i64>(flow.job_id("0")).await.unwrap(), None);
    stores
        .settle(vec![(second[0].lease.id, ok(7))])
        .await
        .unwrap();
    pass(stores).await;
    let next = stores.claim("stale", "w", 1, TTL).await.unwrap();
    assert_eq!(kinds(&next), ["1"]);
    assert_eq!(
        client.result::<i64>(flow.job_id("0")).await.unwrap(),
        Some(7)
    );
    complete(stores, &next, 0).await;
    pass(stores).await;
    assert_eq!(
        client.flow(id).await.unwrap().unwrap().state,
        FlowState::Succeeded
    );
}

/// A flow's jobs, as `create_flow` holds them.
fn held(flow: &Flow) -> Vec<(NewJob, FlowStep)> {
    flow.steps()
        .iter()
        .map(|s| {
            let mut j = s.job.clone();
            j.id = Some(flow.job_id(&s.name));
            let step = FlowStep {
                flow: flow.id(),
                step: s.name.clone(),
                after: s.after.iter().map(|e| e.step.clone()).collect(),
            };
            (j, step)
        })
        .collect()
}

/// From the attack reviews: a creation done again — a retry after a lost reply, a second
/// producer racing the first — after a step already ran and its job was forgotten. Its
/// `hold` must not write that step held again (the first creation's release of it, not yet
/// confirmed and delivered again by a sweep, would run it twice), and the flow must still
/// move on: nothing is stuck, nothing runs twice.
async fn a_creation_done_again_runs_nothing_twice(stores: &Stores) {
    let flow = Flow::chain([job("k").with_queue("race"), job("k").with_queue("race")]);
    stores.hold(held(&flow)).await.unwrap();
    let (kept, pending) = stores.put_flow(&flow).await.unwrap();
    assert!(kept);
    stores.release(pending.clone()).await.unwrap();
    let a = stores.claim("race", "w", 10, TTL).await.unwrap();
    assert_eq!(kinds(&a), ["0"]);
    complete(stores, &a, 1).await;
    // The second creation: holds (step 0 ran and is gone: not written again), keeps nothing.
    stores.hold(held(&flow)).await.unwrap();
    let (kept, again) = stores.put_flow(&flow).await.unwrap();
    assert!(!kept, "the flow was kept by the first creation");
    assert_eq!(again, pending, "the first creation's release, unconfirmed");
    let waiting: Vec<String> = stores
        .held_jobs(Duration::ZERO, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.flow == flow.id())
        .map(|r| r.step)
        .collect();
    assert_eq!(waiting, ["1"], "step 0 is not held again");
    stores.release(again).await.unwrap();
    assert!(
        stores.claim("race", "w", 10, TTL).await.unwrap().is_empty(),
        "step 0 does not run twice"
    );
    // And through the client: a retried create_flow of the same flow adds nothing either.
    Client::new(stores.clone())
        .create_flow(&flow)
        .await
        .unwrap();
    let applied: Vec<String> = pending.iter().map(|r| r.step.clone()).collect();
    stores.advance_flow(flow.id(), &[], &applied).await.unwrap();
    pass(stores).await;
    let b = stores.claim("race", "w", 10, TTL).await.unwrap();
    assert_eq!(kinds(&b), ["1"], "step 1 runs once, after step 0");
    complete(stores, &b, 2).await;
    pass(stores).await;
    assert!(stores.claim("race", "w", 10, TTL).await.unwrap().is_empty());
    let status = stores.flow(flow.id()).await.unwrap().unwrap();
    assert_eq!(status.state, FlowState::Succeeded);
}

/// From the attack review: a creation's `put_flow` failed after its `hold` succeeded; the
/// retried creation finds the jobs held and must still release them.
async fn a_retried_creation_is_not_stuck(stores: &Stores) {
    let flow = Flow::chain([
        job("k").with_queue("retried"),
        job("k").with_queue("retried"),
    ]);
    stores.hold(held(&flow)).await.unwrap();
    Client::new(stores.clone())
        .create_flow(&flow)
        .await
        .unwrap();
    let a = stores.claim("retried", "w", 10, TTL).await.unwrap();
    assert_eq!(kinds(&a), ["0"], "the first step runs");
}

/// A flow cancelled as a whole: the running step's lease is revoked (its completion
/// refused), the ready one cancelled, the ones not started go to the dead letters unrun; the
/// state is cancelled and nothing runs afterwards, whatever is delivered again.
async fn cancelling_a_flow(stores: &Stores) {
    let client = Client::new(stores.clone());
    let q = |kind: &str| job(kind).with_queue("cancel");
    let flow = Flow::new()
        .step("a", q("k"))
        .step_after("b", q("k"), &["a"])
        .step_after("c", q("k"), &["b"])
        .step("d", q("slow"));
    let id = client.create_flow(&flow).await.unwrap();
    let a = stores
        .claim_kinds("cancel", &["k".to_owned()], "w", 10, TTL)
        .await
        .unwrap();
    assert_eq!(kinds(&a), ["a"]);
    assert_eq!(client.cancel_flow(id).await.unwrap(), Some(4));
    assert_eq!(client.cancel_flow(FlowId::new()).await.unwrap(), None);
    let late = stores.settle(vec![(a[0].lease.id, ok(1))]).await.unwrap();
    assert!(
        matches!(late[0], Err(Error::LeaseNotCurrent(_))),
        "{late:?}"
    );
    pass(stores).await;
    pass(stores).await;
    assert!(stores
        .claim("cancel", "w", 10, TTL)
        .await
        .unwrap()
        .is_empty());
    let dead = stores.dead("cancel", 10).await.unwrap();
    assert_eq!(dead.len(), 4, "{dead:?}");
    assert!(
        dead.iter().all(|d| d.reason == "flow cancelled"),
        "{dead:?}"
    );
    let status = client
        .wait_flow(id, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state, FlowState::Cancelled);
    assert_eq!(status.count(StepEnd::Dead), 4);
    assert_eq!(
        client.cancel_flow(id).await.unwrap(),
        Some(0),
        "nothing left to stop"
    );
}

/// Written first, released last: held jobs alone (a creation that stopped before the flow
/// was kept) never run and show nowhere; a flow kept whose first releases were lost is
/// released by the sweep; a cycle is refused before anything is written.
async fn halfway_and_lost_steps(stores: &Stores) {
    let client = Client::new(stores.clone());
    let flow = Flow::new()
        .step("a", job("k").with_queue("halfway"))
        .step_after("b", job("k").with_queue("halfway"), &["a"]);
    stores.hold(held(&flow)).await.unwrap();
    let mut listed: Vec<(String, JobId)> = stores
        .held_jobs(Duration::ZERO, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.flow == flow.id())
        .map(|r| (r.step, r.job))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            ("a".into(), flow.job_id("a")),
            ("b".into(), flow.job_id("b"))
        ]
    );
    assert!(stores
        .claim("halfway", "w", 10, TTL)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(stores.counts("halfway").await.unwrap().pending(), 0);
    assert!(client.flow(flow.id()).await.unwrap().is_none());
    // Kept, its first release decided and not delivered (the creator stopped): still
    // nothing runs, until the sweep finds the flow.
    let (kept, decided) = stores.put_flow(&flow).await.unwrap();
    assert!(kept);
    assert_eq!(decided.len(), 1);
    assert!(stores
        .claim("halfway", "w", 10, TTL)
        .await
        .unwrap()
        .is_empty());
    let stuck = stores.unreleased_flows(Duration::ZERO, 10).await.unwrap();
    assert!(stuck.contains(&flow.id()), "{stuck:?}");
    let releases = stores.advance_flow(flow.id(), &[], &[]).await.unwrap();
    stores.release(releases).await.unwrap();
    let a = stores.claim("halfway", "w", 10, TTL).await.unwrap();
    assert_eq!(kinds(&a), ["a"]);
    // Creating it again (a retried request) adds nothing.
    client.create_flow(&flow).await.unwrap();
    assert!(stores
        .claim("halfway", "w", 10, TTL)
        .await
        .unwrap()
        .is_empty());
    let cycle = Flow::new()
        .step_after("x", job("k").with_queue("cycle"), &["y"])
        .step_after("y", job("k").with_queue("cycle"), &["x"]);
    let refused = client.create_flow(&cycle).await;
    assert!(
        matches!(&refused, Err(Error::InvalidJob(why)) if why.contains("cycle")),
        "{refused:?}"
    );
    assert!(client.flow(cycle.id()).await.unwrap().is_none());
}

/// A step `name` added by `parent`: runs after it, and after `after` (full names).
fn added(parent: &str, name: &str, after: &[(&str, OnDead)]) -> Step {
    let mut edges = vec![Edge {
        step: parent.to_owned(),
        on_dead: OnDead::Fail,
    }];
    edges.extend(after.iter().map(|(s, on_dead)| Edge {
        step: (*s).to_owned(),
        on_dead: *on_dead,
    }));
    Step {
        name: palisade::added_step_name(parent, name),
        job: job("part").with_scope(format!("part-{name}")),
        after: edges,
    }
}

fn completing_with(steps: Vec<Step>) -> Settlement {
    Settlement::Complete {
        result: None,
        then: palisade::Then {
            steps,
            ..Default::default()
        },
    }
}

/// Issue 25, scope 4: a step's completion adds steps to its flow. They exist only once that
/// lease's completion is accepted (a stale holder's are never added), they run after it,
/// and the steps that ran after it wait for them too, on the same kind of edge (`sum` fails
/// when an added step dies, `tail` runs anyway). A pass done again, or the grow delivered
/// again, adds nothing.
async fn a_step_adds_steps(stores: &Stores) {
    let client = Client::new(stores.clone());
    let flow = Flow::new()
        .step("split", job("k"))
        .step_after("sum", job("k"), &["split"])
        .step_with("tail", job("k"), [("split", OnDead::Run)]);
    let id = client.create_flow(&flow).await.unwrap();
    let first = claim_all(stores, "w").await;
    assert_eq!(kinds(&first), ["split"]);
    // The first holder is replaced (released here; a paused holder's lease expires alike).
    let released = stores
        .settle(vec![(first[0].lease.id, Settlement::Release)])
        .await
        .unwrap();
    assert!(released[0].is_ok());
    let second = claim_all(stores, "w2").await;
    assert_eq!(kinds(&second), ["split"]);
    let stale = stores
        .settle(vec![(
            first[0].lease.id,
            completing_with(vec![added("split", "stale", &[])]),
        )])
        .await
        .unwrap();
    assert!(
        matches!(stale[0], Err(Error::LeaseNotCurrent(_))),
        "{stale:?}"
    );
    let parts = vec![
        added("split", "p0", &[]),
        added("split", "p1", &[]),
        added("split", "p2", &[("split/p1", OnDead::Fail)]),
    ];
    let done = stores
        .settle(vec![(second[0].lease.id, completing_with(parts.clone()))])
        .await
        .unwrap();
    assert!(done[0].is_ok(), "{done:?}");
    pass(stores).await;
    pass(stores).await;
    // Delivered again (a second coordinator's pass racing this one): nothing more.
    stores.grow_flow(id, "split", &parts).await.unwrap();
    let status = client.flow(id).await.unwrap().unwrap();
    assert_eq!(
        status.steps, 6,
        "split, sum, tail and three parts: {status:?}"
    );
    let p = claim_all(stores, "w").await;
    assert_eq!(
        kinds(&p),
        ["split/p0", "split/p1"],
        "p2 waits for p1; sum and tail for all"
    );
    assert_eq!(p[0].job.flow.as_ref().unwrap().after, ["split"]);
    complete(stores, &p, 1).await;
    pass(stores).await;
    let p2 = claim_all(stores, "w").await;
    assert_eq!(kinds(&p2), ["split/p2"]);
    assert!(
        !stores.counts("default").await.unwrap().pending().eq(&0),
        "sum and tail are still held"
    );
    let dead = stores
        .settle(vec![(
            p2[0].lease.id,
            Settlement::Dead {
                reason: "bad part".into(),
            },
        )])
        .await
        .unwrap();
    assert!(dead[0].is_ok());
    pass(stores).await;
    let tail = claim_all(stores, "w").await;
    assert_eq!(
        kinds(&tail),
        ["tail"],
        "sum failed with p2; tail runs anyway"
    );
    complete(stores, &tail, 0).await;
    pass(stores).await;
    let status = client.flow(id).await.unwrap().unwrap();
    assert_eq!(status.state, FlowState::Failed, "{status:?}");
    assert_eq!(
        (
            status.count(StepEnd::Completed),
            status.count(StepEnd::Dead)
        ),
        (4, 2)
    );
    assert!(!status.ended.contains_key("split/stale"));
    let letters = stores.dead("default", 100).await.unwrap();
    let sum = letters
        .iter()
        .find(|d| d.job.id == flow.job_id("sum"))
        .expect("sum is a dead letter");
    assert!(sum.reason.contains("split/p2"), "{}", sum.reason);
    assert!(
        !letters
            .iter()
            .any(|d| d.job.id == flow.job_id("split/stale")),
        "the stale holder's step was never written"
    );
    assert_eq!(stores.counts("default").await.unwrap().pending(), 0);
}

/// A completion that adds steps to a flow cancelled meanwhile (its cancel raced the
/// completion): the steps go to the dead letters unrun, and the flow still finishes.
async fn steps_added_to_a_cancelled_flow_never_run(stores: &Stores) {
    let client = Client::new(stores.clone());
    let flow = Flow::new()
        .step("a", job("k"))
        .step_after("b", job("k"), &["a"]);
    let id = client.create_flow(&flow).await.unwrap();
    let a = claim_all(stores, "w").await;
    // The home is cancelled; the running step's own cancel has not reached it yet.
    stores.cancel_flow(id).await.unwrap().unwrap();
    let done = stores
        .settle(vec![(
            a[0].lease.id,
            completing_with(vec![added("a", "x", &[])]),
        )])
        .await
        .unwrap();
    assert!(done[0].is_ok());
    pass(stores).await;
    assert!(claim_all(stores, "w").await.is_empty());
    let status = client.flow(id).await.unwrap().unwrap();
    assert_eq!(status.state, FlowState::Cancelled);
    assert_eq!((status.steps, status.ended.len()), (3, 3), "{status:?}");
    let x = flow.job_id("a/x");
    assert!(
        stores
            .dead("default", 100)
            .await
            .unwrap()
            .iter()
            .any(|d| d.job.id == x),
        "the added step is a dead letter, not held forever"
    );
}

/// Steps a completion added that can never be added are dropped loudly and the flow moves
/// on without them, instead of waiting forever: ones a store refuses for good (its payload
/// limit is smaller than the worker's), and ones that break the rules (a caller of the public
/// settlement types is not held to `add_step`'s checks). Both on every backend.
async fn unaddable_steps_are_dropped_and_the_flow_moves_on(stores: &Stores) {
    let client = Client::new(stores.clone());
    let flow = Flow::new()
        .step("a", job("k"))
        .step_after("b", job("k"), &["a"]);
    let id = client.create_flow(&flow).await.unwrap();
    let a = claim_all(stores, "w").await;
    let mut big = added("a", "big", &[]);
    big.job = NewJob::raw("part", format!("\"{}\"", "x".repeat(4096)));
    let mut stray = added("a", "stray", &[]);
    stray.name = "elsewhere/stray".into();
    let done = stores
        .settle(vec![(a[0].lease.id, completing_with(vec![big, stray]))])
        .await
        .unwrap();
    assert!(done[0].is_ok());
    pass(stores).await;
    let b = claim_all(stores, "w").await;
    assert_eq!(kinds(&b), ["b"], "b runs: a's end was recorded");
    complete(stores, &b, 0).await;
    pass(stores).await;
    let status = client.flow(id).await.unwrap().unwrap();
    assert_eq!(
        (status.state, status.steps),
        (FlowState::Succeeded, 2),
        "{status:?}"
    );
    assert_eq!(stores.counts("default").await.unwrap().pending(), 0);
}

/// The same on stores that keep payloads of at most 1 KiB.
#[tokio::test]
async fn unaddable_steps_on_memory_and_redis() {
    let memory = MemoryLeaseStore::new().with_max_payload_bytes(1024);
    unaddable_steps_are_dropped_and_the_flow_moves_on(&Stores::from(Arc::new(memory))).await;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    for partitions in [1, 3] {
        let stores = palisade::store::redis::coordinator(
            pool.clone(),
            &format!("small{partitions}"),
            partitions,
            0,
            1024,
            |s| s,
        )
        .unwrap();
        unaddable_steps_are_dropped_and_the_flow_moves_on(&stores).await;
    }
}

/// A flow cannot grow past `MAX_FLOW_STEPS`: a completion that would take it there has its
/// steps dropped, and the flow moves on.
#[tokio::test]
async fn growth_stops_at_the_step_cap() {
    let stores = Stores::from(Arc::new(MemoryLeaseStore::new()));
    let client = Client::new(stores.clone());
    let mut flow = Flow::new().step("a", job("k"));
    for i in 0..MAX_FLOW_STEPS - 2 {
        flow = flow.step_after(format!("w{i}"), job("k"), &["a"]);
    }
    let id = client.create_flow(&flow).await.unwrap();
    let a = claim_all(&stores, "w").await;
    let parts = vec![added("a", "one", &[]), added("a", "two", &[])];
    let done = stores
        .settle(vec![(a[0].lease.id, completing_with(parts))])
        .await
        .unwrap();
    assert!(done[0].is_ok());
    pass(&stores).await;
    let status = client.flow(id).await.unwrap().unwrap();
    assert_eq!(
        status.steps,
        MAX_FLOW_STEPS - 1,
        "nothing added past the cap"
    );
    assert_eq!(status.ended.get("a"), Some(&StepEnd::Completed));
}

async fn conformance(stores: Stores) {
    diamond(&stores).await;
    batch_callbacks_once(&stores).await;
    fail_edges_cascade(&stores).await;
    a_stale_holder_moves_nothing(&stores).await;
    halfway_and_lost_steps(&stores).await;
    a_creation_done_again_runs_nothing_twice(&stores).await;
    a_retried_creation_is_not_stuck(&stores).await;
    cancelling_a_flow(&stores).await;
    a_step_adds_steps(&stores).await;
    steps_added_to_a_cancelled_flow_never_run(&stores).await;
}

#[tokio::test]
async fn flows_on_the_memory_store() {
    conformance(Stores::from(Arc::new(MemoryLeaseStore::new()))).await;
}

#[tokio::test]
async fn flows_on_redis() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let stores = palisade::store::redis::coordinator(pool, "flows", 1, 0, 1 << 20, |s| s).unwrap();
    conformance(stores).await;
}

#[tokio::test]
async fn flows_on_three_redis_partitions() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let stores = palisade::store::redis::coordinator(pool, "flows", 3, 0, 1 << 20, |s| s).unwrap();
    conformance(stores).await;
}

/// Fan-out/fan-in through real actors: 50 children return their numbers, a `sum` step reads
/// every child's result from its context, and the batch's `on_complete` callback makes one
/// fenced write; child 7 fails once (a retry is no end), so the sum waits for its retry. The
/// sum is exact and the callback ran once.
async fn fan_in(stores: Stores) {
    use std::sync::atomic::{AtomicU32, Ordering};
    let coordinator = Coordinator::new(stores.clone())
        .with_reap_interval(Duration::from_millis(50))
        .start();
    let sink_store = Arc::new(MemoryFencedStore::new());
    let sinks = Sinks::new().with(
        "ledger",
        FencedSink::new("ledger", sink_store.clone()).start(),
    );
    let callbacks = Arc::new(AtomicU32::new(0));
    let failed_once = Arc::new(AtomicU32::new(0));
    let registry = Registry::new()
        .register_with_result("child", {
            let failed_once = failed_once.clone();
            move |_: JobContext, n: i64| {
                let fail = n == 7 && failed_once.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    if fail {
                        return Err(JobError::retry("first attempt of child 7 fails"));
                    }
                    Ok(n)
                }
            }
        })
        .register_with_result("sum", |ctx: JobContext, _: ()| async move {
            let mut total = 0i64;
            for step in &ctx.job().flow.as_ref().unwrap().after {
                let n: i64 = ctx
                    .dependency(step)
                    .await?
                    .ok_or_else(|| JobError::fatal(format!("no result of {step}")))?;
                total += n;
            }
            Ok(total)
        })
        .register("announce", {
            let callbacks = callbacks.clone();
            move |ctx: JobContext, _: ()| {
                callbacks.fetch_add(1, Ordering::SeqCst);
                async move {
                    let total: Option<i64> = ctx.dependency("sum").await?;
                    ctx.sink("ledger")?
                        .write(vec![Mutation::Set {
                            key: "announced".into(),
                            value: total.unwrap_or(-1).to_string(),
                        }])
                        .await?;
                    Ok(())
                }
            }
        });
    let worker = Worker::new(
        WorkerConfig {
            poll_interval: Duration::from_millis(20),
            retry: RetryPolicy {
                base: Duration::from_millis(10),
                max: Duration::from_millis(50),
            },
            ..WorkerConfig::new("fan-in")
        },
        coordinator.clone(),
        registry,
        sinks,
    )
    .expect("valid config")
    .start();
    let mut flow = Flow::new();
    let mut children = Vec::new();
    for n in 1..=50i64 {
        let name = format!("child:{n}");
        flow = flow.step(
            &name,
            NewJob::new("child", &n).unwrap().with_max_attempts(3),
        );
        children.push(name);
    }
    let names: Vec<&str> = children.iter().map(String::as_str).collect();
    let flow = flow
        .step_after("sum", NewJob::new("sum", &()).unwrap(), &names)
        .on_complete(NewJob::new("announce", &()).unwrap());
    let client = Client::new(stores.clone());
    let id = client.create_flow(&flow).await.unwrap();
    let done = client
        .wait_flow(id, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the flow finished");
    assert_eq!(done.state, FlowState::Succeeded, "{done:?}");
    assert_eq!(
        client.result::<i64>(flow.job_id("sum")).await.unwrap(),
        Some(1275)
    );
    assert_eq!(callbacks.load(Ordering::SeqCst), 1, "the callback ran once");
    assert_eq!(
        sink_store.read("announced").await.unwrap(),
        Some(Value::Text("1275".into()))
    );
    assert_eq!(failed_once.load(Ordering::SeqCst), 2, "child 7 ran twice");
    worker
        .send(Drain {
            deadline: Duration::from_secs(5),
        })
        .await
        .ok();
}

#[actix::test]
async fn fan_in_through_actors_on_the_memory_store() {
    fan_in(Stores::from(Arc::new(MemoryLeaseStore::new()))).await;
}

#[actix::test]
async fn fan_in_through_actors_on_redis_partitions() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let stores = palisade::store::redis::coordinator(pool, "fanin", 3, 0, 1 << 20, |s| s).unwrap();
    fan_in(stores).await;
}

/// The rule exists twice — `flow::Home` (the memory store) and `flow_home.lua` — so both get
/// the same random flows and histories: random DAGs whose step names carry quotes,
/// backslashes, non-ASCII and digits, ends delivered in random order, replayed, for unknown
/// steps, releases confirmed at random, and steps added by random steps (`grow_flow`: to a
/// step that ended or not, replayed, into a cancelled flow). Every answer (the pending
/// releases, reasons word for word) and every status must be equal.
#[tokio::test]
async fn the_home_rule_is_the_same_in_memory_and_in_lua() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let names = [
        "a",
        "b\"q",
        "c\\d",
        "ünï",
        "7",
        "x y",
        "{}",
        "[]",
        "on_success",
        "z-1",
        "é\"\\",
        "1e3",
    ];
    let policies = [OnDead::Fail, OnDead::Skip, OnDead::Run];
    let ends = [StepEnd::Completed, StepEnd::Dead];
    let mut grows = 0;
    for case in 0..150u64 {
        let mut rng = StdRng::seed_from_u64(case);
        let memory = Stores::from(Arc::new(MemoryLeaseStore::new()));
        let redis = palisade::store::redis::coordinator(
            pool.clone(),
            &format!("diff{case}"),
            1,
            0,
            1 << 20,
            |s| s,
        )
        .unwrap();
        let n = rng.random_range(1..=names.len());
        let mut flow = Flow::new();
        for i in 0..n {
            let mut after = Vec::new();
            for earlier in &names[..i] {
                if rng.random_bool(0.4) {
                    after.push((*earlier, policies[rng.random_range(0..3)]));
                }
            }
            flow = flow.step_with(names[i], job("k"), after);
        }
        let sorted = |mut r: Vec<Release>| {
            r.sort_by(|a, b| a.step.cmp(&b.step));
            r
        };
        let a = sorted(memory.put_flow(&flow).await.unwrap().1);
        let b = sorted(redis.put_flow(&flow).await.unwrap().1);
        assert_eq!(a, b, "case {case}: put");
        let mut ended: Vec<(String, StepEnd)> = Vec::new();
        let mut all: Vec<String> = names[..n].iter().map(|s| s.to_string()).collect();
        let mut grown: Vec<(String, Vec<Step>)> = Vec::new();
        for round in 0..rng.random_range(1..30) {
            if rng.random_bool(0.2) {
                let parent = all[rng.random_range(0..all.len())].clone();
                let mut steps: Vec<Step> = Vec::new();
                for k in 0..rng.random_range(1..4) {
                    let mut after = Vec::new();
                    for earlier in &steps {
                        if rng.random_bool(0.5) {
                            after.push((earlier.name.as_str(), policies[rng.random_range(0..3)]));
                        }
                    }
                    let mut step = added(&parent, &format!("g{round}.{k}\"é"), &[]);
                    step.after
                        .extend(after.into_iter().map(|(s, on_dead)| Edge {
                            step: s.to_owned(),
                            on_dead,
                        }));
                    steps.push(step);
                }
                grown.push((parent, steps));
            }
            if !grown.is_empty() && rng.random_bool(0.3) {
                // A grow delivered (again, or late: its step may have ended since).
                let (parent, steps) = grown[rng.random_range(0..grown.len())].clone();
                memory.grow_flow(flow.id(), &parent, &steps).await.unwrap();
                redis.grow_flow(flow.id(), &parent, &steps).await.unwrap();
                let status = memory.flow(flow.id()).await.unwrap().unwrap();
                if status.steps > all.len() {
                    grows += 1;
                    all.extend(steps.iter().map(|s| s.name.clone()));
                }
            }
            let mut batch = Vec::new();
            for _ in 0..rng.random_range(0..4) {
                let pick = rng.random_range(0..all.len() + 1);
                let name = if pick == all.len() {
                    "not-a-step".to_owned()
                } else {
                    all[pick].clone()
                };
                let end = ends[rng.random_range(0..2)];
                batch.push((name, end));
            }
            if !ended.is_empty() && rng.random_bool(0.3) {
                batch.push(ended[rng.random_range(0..ended.len())].clone());
            }
            let pending = sorted(memory.advance_flow(flow.id(), &[], &[]).await.unwrap());
            let applied: Vec<String> = pending
                .iter()
                .filter(|_| rng.random_bool(0.5))
                .map(|r| r.step.clone())
                .collect();
            let a = sorted(
                memory
                    .advance_flow(flow.id(), &batch, &applied)
                    .await
                    .unwrap(),
            );
            let b = sorted(
                redis
                    .advance_flow(flow.id(), &batch, &applied)
                    .await
                    .unwrap(),
            );
            assert_eq!(
                a, b,
                "case {case} round {round}: {batch:?} applied {applied:?}"
            );
            if rng.random_bool(0.03) {
                let a = memory.cancel_flow(flow.id()).await.unwrap().unwrap();
                let b = redis.cancel_flow(flow.id()).await.unwrap().unwrap();
                assert_eq!(
                    (sorted(a.0), a.1),
                    (sorted(b.0), b.1),
                    "case {case} round {round}: cancel"
                );
            }
            ended.extend(batch);
            let sa = memory.flow(flow.id()).await.unwrap().unwrap();
            let sb = redis.flow(flow.id()).await.unwrap().unwrap();
            assert_eq!(sa, sb, "case {case} round {round}: status");
        }
    }
    assert!(
        grows >= 30,
        "only {grows} grows added steps: the histories miss the rule"
    );
}

/// From the attack review: another program's writes under the prefix stop only what they
/// touch. A flow whose home keys were written over (`flow:<id>:left` a string) is not moved
/// on, but the coordinator's pass still moves every other flow; a `held` key of another
/// type does not break burying a plain job; a step-end entry that is no job id is dropped.
#[actix::test]
async fn a_corrupt_flow_stops_only_itself() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let stores =
        palisade::store::redis::coordinator(pool.clone(), "corrupt", 1, 0, 1 << 20, |s| s).unwrap();
    let client = Client::new(stores.clone());
    let chain = |queue: &str| Flow::chain([job("k").with_queue(queue), job("k").with_queue(queue)]);
    let (bad, good) = (chain("bad"), chain("good"));
    client.create_flow(&bad).await.unwrap();
    client.create_flow(&good).await.unwrap();
    let mut conn = pool.get().await.unwrap();
    let _: () = deadpool_redis::redis::cmd("SET")
        .arg(format!("{{corrupt}}:flow:{}:ends", bad.id()))
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = deadpool_redis::redis::cmd("ZADD")
        .arg("{corrupt}:stepends")
        .arg(0)
        .arg("not-a-job")
        .query_async(&mut conn)
        .await
        .unwrap();
    for queue in ["bad", "good"] {
        let c = stores.claim(queue, "w", 1, TTL).await.unwrap();
        complete(&stores, &c, 1).await;
    }
    let _coordinator = Coordinator::new(stores.clone())
        .with_reap_interval(Duration::from_millis(50))
        .start();
    let mut next = Vec::new();
    for _ in 0..500 {
        next = stores.claim("good", "w", 1, TTL).await.unwrap();
        if !next.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        kinds(&next),
        ["1"],
        "the good flow moved on past the corrupt one"
    );
    assert!(stores.claim("bad", "w", 1, TTL).await.unwrap().is_empty());
    let left: Vec<String> = deadpool_redis::redis::cmd("ZRANGE")
        .arg("{corrupt}:stepends")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!left.contains(&"not-a-job".to_owned()), "{left:?}");
    // A `held` key of another type: burying a plain job is not broken by it.
    let _: () = deadpool_redis::redis::cmd("SET")
        .arg("{corrupt}:held")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let plain = client.enqueue(job("k").with_queue("plain")).await.unwrap();
    assert!(client.cancel(plain).await.is_ok());
    assert_eq!(stores.dead("plain", 10).await.unwrap().len(), 1);
}

/// Issue 55: records a process cannot read — a later release's format during a rolling
/// deploy — are left in place, never delivered in part and forgotten (they used to be
/// deleted: a follow-up record's jobs lost, a step end forgotten so its flow never
/// finished). More of them than a sweep lists at once do not hold up the readable ones.
#[actix::test]
async fn records_a_release_cannot_read_are_left_in_place_and_passed() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let stores = palisade::store::redis::coordinator(pool, "later", 1, 0, 1 << 20, |s| s).unwrap();
    let cli = |args: &[&str]| server.cli(args).unwrap();
    // 150 follow-up records of a later format, the oldest, then one this release reads.
    let later: Vec<String> = (0..150).map(|_| JobId::new().to_string()).collect();
    for parent in &later {
        let record = r#"{"v":2,"jobs":[],"waits":[{"name":"approval"}]}"#;
        cli(&["SET", &format!("{{later}}:then:{parent}"), record]);
        cli(&["ZADD", "{later}:thens", "0", parent]);
    }
    let (readable, child) = (JobId::new(), JobId::new());
    let record = serde_json::to_string(&[job("child").with_id(child)]).unwrap();
    cli(&["SET", &format!("{{later}}:then:{readable}"), &record]);
    cli(&["ZADD", "{later}:thens", "1", &readable.to_string()]);
    let due = stores.follow_ups(Duration::ZERO, 100).await.unwrap();
    let parents: Vec<JobId> = due.iter().map(|s| s.parent).collect();
    assert_eq!(
        parents,
        [readable],
        "the readable set is found past the others"
    );
    // The coordinator's sweep delivers the readable one and leaves the others where they are.
    let _coordinator = Coordinator::new(stores.clone())
        .with_reap_interval(Duration::from_millis(50))
        .start();
    let mut left = String::new();
    for _ in 0..300 {
        left = cli(&["ZCARD", "{later}:thens"]);
        if left == "150" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(left, "150", "the readable set was not delivered");
    assert!(
        stores.job(child).await.unwrap().is_some(),
        "its job was enqueued"
    );
    for parent in &later {
        let kept = cli(&["GET", &format!("{{later}}:then:{parent}")]);
        assert!(kept.contains("approval"), "{parent}'s record was deleted");
    }

    // A step end with an end this release does not know, and one whose added steps it cannot
    // decode: both stay where they are through the flow passes.
    let flow = FlowId::new();
    let ends = [
        (JobId::new(), format!("{flow}\tcharge\tsuspended")),
        (
            JobId::new(),
            format!("{flow}\tcharge\tcompleted\t{{\"steps_v2\":1}}"),
        ),
    ];
    for (job, end) in &ends {
        cli(&["HSET", "{later}:stepend", &job.to_string(), end]);
        cli(&["ZADD", "{later}:stepends", "0", &job.to_string()]);
    }
    assert!(stores.step_ends(10).await.unwrap().is_empty());
    pass(&stores).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (job, end) in &ends {
        let kept = cli(&["HGET", "{later}:stepend", &job.to_string()]);
        assert_eq!(&kept, end, "a step end was forgotten");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flows_on_a_cluster_with_three_partitions() {
    let cluster = tokio::task::spawn_blocking(palisade_testkit::RedisCluster::start)
        .await
        .unwrap();
    let stores =
        palisade::store::redis::coordinator(cluster.target(), "flows", 3, 0, 1 << 20, |s| s)
            .unwrap();
    conformance(stores).await;
}

/// From the attack review: held jobs of a creation that stopped between holding and keeping
/// the flow are forgotten by the coordinator's pass once `HELD_GRACE` (10 minutes) passed;
/// a layout with a running flow is not drained.
#[actix::test]
async fn orphaned_held_jobs_are_forgotten_and_a_running_flow_blocks_a_layout_move() {
    tokio::time::pause();
    let stores = Stores::from(Arc::new(MemoryLeaseStore::new()));
    let orphan = Flow::chain([job("k").with_queue("orphan"), job("k").with_queue("orphan")]);
    stores.hold(held(&orphan)).await.unwrap();
    let running = Flow::chain([job("k").with_queue("kept"), job("k").with_queue("kept")]);
    Client::new(stores.clone())
        .create_flow(&running)
        .await
        .unwrap();
    let refused = palisade::store::partitioned::check_drained(&stores).await;
    assert!(
        matches!(&refused, Err(Error::Config(why)) if why.contains("flows still running")),
        "{refused:?}"
    );
    let _coordinator = Coordinator::new(stores.clone())
        .with_reap_interval(Duration::from_secs(1))
        .start();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        stores.held_jobs(Duration::ZERO, 10).await.unwrap().len(),
        3,
        "not yet"
    );
    tokio::time::sleep(Duration::from_secs(600)).await;
    let left = stores.held_jobs(Duration::ZERO, 10).await.unwrap();
    assert_eq!(left.len(), 1, "only the kept flow's waiting step: {left:?}");
    assert_eq!(left[0].flow, running.id());
    assert_eq!(
        stores.cancel(orphan.job_id("0"), "x").await.unwrap(),
        Cancelled::Missing,
        "the orphan's jobs are gone"
    );
}

/// Issue 25, scope 3: a step's result is kept at its flow's home for as long as the flow, so a
/// step that runs long after the steps it depends on (a day later, when their own result
/// records have expired — simulated here by deleting them) still reads their results; the
/// home's copy expires with the finished flow.
#[tokio::test]
async fn results_live_as_long_as_their_flow() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let stores = palisade::store::redis::coordinator(pool, "long", 1, 0, 1 << 20, |s| s).unwrap();
    let client = Client::new(stores.clone());
    let flow = Flow::new()
        .step("a", job("k"))
        .step_after("b", job("k"), &["a"]);
    let id = client.create_flow(&flow).await.unwrap();
    let a = claim_all(&stores, "w").await;
    complete(&stores, &a, 7).await;
    pass(&stores).await;
    let key = format!("{{long}}:result:{}", flow.job_id("a"));
    assert_eq!(server.cli(&["DEL", &key]).as_deref(), Some("1"));
    assert_eq!(client.result::<i64>(flow.job_id("a")).await.unwrap(), None);
    assert_eq!(
        stores.step_result(id, "a").await.unwrap().as_deref(),
        Some("{\"ok\":7}"),
        "the home's copy outlives the job's own record"
    );
    let results = format!("{{long}}:flow:{id}:results");
    assert_eq!(server.cli(&["PTTL", &results]).as_deref(), Some("-1"));
    let b = claim_all(&stores, "w").await;
    complete(&stores, &b, 8).await;
    pass(&stores).await;
    let ttl: i64 = server.cli(&["PTTL", &results]).unwrap().parse().unwrap();
    assert!(
        ttl > 0 && ttl <= FLOW_RETENTION.as_millis() as i64,
        "kept for the finished flow's retention: {ttl}"
    );
}

/// From the second attack review: the list of running flows forgets flows that are gone
/// (forgotten, or finished by an older version), lists the oldest first across partitions,
/// and — like the home's copy of results — is best effort: another program's key in its
/// place, or in the results' place, does not stop a flow.
#[tokio::test]
async fn running_flows_and_results_survive_gone_flows_and_odd_keys() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let stores =
        palisade::store::redis::coordinator(pool.clone(), "odd", 1, 0, 1 << 20, |s| s).unwrap();
    let client = Client::new(stores.clone());
    let gone = client
        .create_flow(&Flow::new().step("a", job("gone")))
        .await
        .unwrap();
    server
        .cli(&["DEL", &format!("{{odd}}:flow:{gone}")])
        .unwrap();
    assert_eq!(stores.running_flows(10).await.unwrap(), (0, Vec::new()));

    // Both keys written over by another program: the flow still runs to its end.
    server.cli(&["SET", "{odd}:flows:running", "x"]).unwrap();
    let flow = Flow::new()
        .step("a", job("k"))
        .step_after("b", job("k"), &["a"]);
    let id = client.create_flow(&flow).await.unwrap();
    server
        .cli(&["SET", &format!("{{odd}}:flow:{id}:results"), "x"])
        .unwrap();
    let a = claim_all(&stores, "w")
        .await
        .into_iter()
        .filter(|c| c.job.kind == "k")
        .collect::<Vec<_>>();
    complete(&stores, &a, 1).await;
    pass(&stores).await;
    let b = claim_all(&stores, "w").await;
    assert_eq!(
        kinds(&b),
        ["b"],
        "b runs though a's result was not kept at the home"
    );
    // A step the flow does not have keeps no result (as in memory).
    server
        .cli(&["DEL", &format!("{{odd}}:flow:{id}:results")])
        .unwrap();
    stores
        .keep_results(id, &[("nope".into(), "1".into())])
        .await
        .unwrap();
    assert_eq!(stores.step_result(id, "nope").await.unwrap(), None);

    // Its step list with records another program wrote (found by the attack on issue 57): an
    // unreadable record is listed as such, never as a root; a key of another type is read as
    // empty, not the page's failure.
    let steps_key = format!("{{odd}}:flow:{id}:steps");
    for (step, record) in [("c", "not json"), ("d", r#"{"job":"x","after":"y"}"#)] {
        server.cli(&["HSET", &steps_key, step, record]).unwrap();
    }
    server
        .cli(&["SET", &format!("{{odd}}:flow:{id}:decided"), "x"])
        .unwrap();
    let listed = stores.flow_steps(id).await.unwrap();
    let state = |name: &str| listed.iter().find(|s| s.name == name).unwrap().state;
    assert_eq!(
        (state("a"), state("c"), state("d")),
        (
            StepState::Ended(StepEnd::Completed),
            StepState::Unreadable,
            StepState::Unreadable
        ),
        "{listed:?}"
    );
    assert_eq!(
        state("b"),
        StepState::Waiting,
        "decided unreadable: none read as released"
    );
    server.cli(&["SET", &steps_key, "x"]).unwrap();
    assert!(stores.flow_steps(id).await.unwrap().is_empty());

    // Oldest first across three partitions, whichever partition each flow's home is in.
    let parts = palisade::store::redis::coordinator(pool, "oldest", 3, 0, 1 << 20, |s| s).unwrap();
    let client = Client::new(parts.clone());
    let mut created = Vec::new();
    for _ in 0..12 {
        created.push(
            client
                .create_flow(&Flow::new().step("a", job("k")))
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let (count, listed) = parts.running_flows(5).await.unwrap();
    assert_eq!(count, 12);
    let ids: Vec<FlowId> = listed.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, created[..5], "the five created first");
}
