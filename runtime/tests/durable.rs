//! Durable runs (`palisade::durable`) in the harness: a step runs once per run and its result
//! is replayed; a sleep suspends the run and resumes it in a new claim with a higher token; a
//! wait gets a value sent before it, keeps the first of two, is woken by its completion, or
//! times out; a changed handler dead-letters with the reason; a zombie's step is refused.
//! (The same refusal against real Redis, a Redis Cluster and Postgres sinks, with real
//! workers: `durable_fencing.rs`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade::durable::{Waited, WAIT_RECHECK};
use palisade::store::Completion;
use palisade::testing::{Harness, Outcome};
use palisade::{JobContext, JobError, Mutation, NewJob, Registry};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Order {
    id: u32,
    cents: i64,
}

/// What the saga's steps did, counted where they run (so a replay shows as no count).
#[derive(Default)]
struct Ran {
    reserve: AtomicUsize,
    charge: AtomicUsize,
    refund: AtomicUsize,
    ship: AtomicUsize,
}

/// An order saga: reserve, charge, wait for approval over 500 EUR (refund when refused or
/// never given), cool off, ship. Every effect goes through the `ledger` sink with its step.
fn saga(ran: Arc<Ran>) -> Registry {
    Registry::new().register("order.saga", move |ctx: JobContext, order: Order| {
        let ran = ran.clone();
        async move {
            let run = ctx.durable("ledger")?;
            let key = |what: &str| format!("{{order:{}}}:{what}", order.id);
            let reserved: i64 = run
                .step("reserve", || async {
                    ran.reserve.fetch_add(1, Ordering::SeqCst);
                    let m = Mutation::HashIncr {
                        key: key("stock"),
                        field: "held".into(),
                        by: 1,
                    };
                    Ok((vec![m], 1))
                })
                .await?;
            let receipt: String = run
                .step("charge", || async {
                    ran.charge.fetch_add(1, Ordering::SeqCst);
                    let m = Mutation::HashIncr {
                        key: key("account"),
                        field: "charged".into(),
                        by: order.cents,
                    };
                    // A result that differs on every run: a replay must give the first.
                    Ok((vec![m], uuid::Uuid::new_v4().to_string()))
                })
                .await?;
            if order.cents > 50_000 {
                let approved = run
                    .wait_for::<bool>(
                        "approval",
                        &format!("approval:{}", order.id),
                        Duration::from_secs(2 * 86_400),
                    )
                    .await?;
                if approved != Waited::Completed(true) {
                    run.step("refund", || async {
                        ran.refund.fetch_add(1, Ordering::SeqCst);
                        let m = Mutation::HashIncr {
                            key: key("account"),
                            field: "charged".into(),
                            by: -order.cents,
                        };
                        Ok((vec![m], ()))
                    })
                    .await?;
                    return Ok(());
                }
            }
            run.sleep("cool-off", Duration::from_secs(600)).await?;
            run.step("ship", || async {
                ran.ship.fetch_add(1, Ordering::SeqCst);
                let m = Mutation::Set {
                    key: key("shipped"),
                    value: receipt.clone(),
                };
                Ok((vec![m], ()))
            })
            .await?;
            assert_eq!(reserved, 1);
            Ok(())
        }
    })
}

fn order(id: u32, cents: i64) -> NewJob {
    NewJob::new("order.saga", &Order { id, cents })
        .unwrap()
        .with_scope(format!("order:{id}"))
}

/// The run's journal as its applied writes recorded it (the sink's hash is cleared when the
/// run ends): step name -> its latest entry.
fn journal(
    h: &Harness,
    scope: &str,
    job: palisade::JobId,
) -> serde_json::Map<String, serde_json::Value> {
    let key = format!("{{{scope}}}:palisade:journal:{job}");
    let mut entries = serde_json::Map::new();
    for w in h.writes().iter().filter(|w| w.applied()) {
        for m in w.mutations.iter().flatten() {
            if let Mutation::HashSet { key: k, fields } = m {
                if *k == key {
                    for (name, json) in fields {
                        entries.insert(name.clone(), serde_json::from_str(json).unwrap());
                    }
                }
            }
        }
    }
    entries
}

/// Whether the run's journal hash is gone from sink `ledger` (cleared at its end).
fn cleared(h: &Harness, scope: &str, job: palisade::JobId) -> bool {
    let key = format!("{{{scope}}}:palisade:journal:{job}");
    h.sink("ledger").unwrap().read(&key).is_none()
}

#[test]
fn a_step_runs_once_and_a_sleep_resumes_the_run_in_a_newer_claim() {
    let ran = Arc::new(Ran::default());
    let h = Harness::new(saga(ran.clone())).with_sink("ledger");
    let first = h.perform(order(1, 1_000)).unwrap();
    // Reserved and charged, then suspended by the sleep: the slot is given back.
    assert!(
        matches!(first.outcome, Outcome::Snoozed { after } if after == Duration::from_secs(600)),
        "{:?}",
        first.outcome
    );
    assert_eq!(first.writes.len(), 3, "reserve, charge, the sleep's entry");
    let ran_to_end = h.drain_all().unwrap();
    assert_eq!(ran_to_end.completed(), 1);
    // (Less the real time the first attempt took after recording the sleep.)
    assert!(
        ran_to_end.skipped >= Duration::from_secs(599),
        "{:?}",
        ran_to_end.skipped
    );
    // The resumed run replayed reserve and charge (nothing ran twice) and shipped once.
    assert_eq!(ran.reserve.load(Ordering::SeqCst), 1);
    assert_eq!(ran.charge.load(Ordering::SeqCst), 1);
    assert_eq!(ran.ship.load(Ordering::SeqCst), 1);
    let ledger = h.sink("ledger").unwrap();
    assert_eq!(
        ledger.field("{order:1}:account", "charged").as_deref(),
        Some("1000")
    );
    assert_eq!(
        ledger.field("{order:1}:stock", "held").as_deref(),
        Some("1")
    );
    // The receipt shipped is the one the charge recorded, not one made on the resume.
    let entries = journal(&h, "order:1", first.job.id);
    assert_eq!(
        ledger.text("{order:1}:shipped").as_deref(),
        entries["charge"]["result"].as_str()
    );
    // Each entry names the claim that recorded it: the resume's is newer.
    let token = |name: &str| entries[name]["token"].as_u64().unwrap();
    assert_eq!(token("reserve"), token("cool-off"));
    assert!(token("ship") > token("cool-off"), "{entries:?}");
    let seqs: Vec<u64> = ["reserve", "charge", "cool-off", "ship"]
        .iter()
        .map(|n| entries[*n]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [0, 1, 2, 3]);
    assert!(
        cleared(&h, "order:1", first.job.id),
        "the finished run's journal is cleared"
    );
}

#[test]
fn an_approval_sent_before_the_wait_is_kept_and_the_first_of_two_wins() {
    let ran = Arc::new(Ran::default());
    let h = Harness::new(saga(ran.clone())).with_sink("ledger");
    assert_eq!(
        h.complete_waitpoint("approval:2", &true).unwrap(),
        Completion::First { waiter: None }
    );
    assert_eq!(
        h.complete_waitpoint("approval:2", &false).unwrap(),
        Completion::Already {
            value: "true".into()
        }
    );
    h.enqueue(order(2, 90_000)).unwrap();
    assert_eq!(h.drain_all().unwrap().completed(), 1);
    assert_eq!(ran.ship.load(Ordering::SeqCst), 1);
    assert_eq!(ran.refund.load(Ordering::SeqCst), 0);
}

#[test]
fn a_completion_wakes_the_suspended_run_and_a_refusal_is_compensated_once() {
    let ran = Arc::new(Ran::default());
    let h = Harness::new(saga(ran.clone())).with_sink("ledger");
    let first = h.perform(order(3, 90_000)).unwrap();
    assert!(
        matches!(first.outcome, Outcome::Snoozed { after } if after == WAIT_RECHECK),
        "a wait sleeps at most WAIT_RECHECK: {:?}",
        first.outcome
    );
    // The run is the waiter: the completion names it and makes it due now.
    assert_eq!(
        h.complete_waitpoint("approval:3", &false).unwrap(),
        Completion::First {
            waiter: Some(first.job.id)
        }
    );
    let rest = h.drain_all().unwrap();
    assert_eq!(rest.completed(), 1);
    assert_eq!(
        rest.skipped,
        Duration::ZERO,
        "woken at once, not at its recheck"
    );
    assert_eq!(ran.refund.load(Ordering::SeqCst), 1);
    assert_eq!(ran.ship.load(Ordering::SeqCst), 0);
    let ledger = h.sink("ledger").unwrap();
    assert_eq!(
        ledger.field("{order:3}:account", "charged").as_deref(),
        Some("0")
    );
    // Sent again: nothing changes, the run is not run again.
    assert!(matches!(
        h.complete_waitpoint("approval:3", &true).unwrap(),
        Completion::Already { .. }
    ));
    assert_eq!(h.drain_all().unwrap().runs.len(), 0);
    let entries = journal(&h, "order:3", first.job.id);
    assert_eq!(
        entries["approval"]["outcome"],
        serde_json::json!({"completed": false})
    );
}

#[test]
fn a_wait_nobody_completes_times_out_and_its_outcome_is_journaled() {
    let ran = Arc::new(Ran::default());
    let h = Harness::new(saga(ran.clone())).with_sink("ledger");
    let id = h.enqueue(order(4, 90_000)).unwrap();
    let all = h.drain_all().unwrap();
    assert_eq!(all.completed(), 1);
    assert!(
        all.skipped >= Duration::from_secs(2 * 86_400 - 1),
        "{:?}",
        all.skipped
    );
    assert_eq!(ran.refund.load(Ordering::SeqCst), 1);
    // A late approval finds the run gone: kept, no one to wake.
    assert_eq!(
        h.complete_waitpoint("approval:4", &true).unwrap(),
        Completion::First { waiter: Some(id) }
    );
    assert_eq!(h.drain_all().unwrap().runs.len(), 0);
    assert_eq!(
        journal(&h, "order:4", id)["approval"]["outcome"],
        "timed_out"
    );
}

/// A handler whose recorded steps no longer match its code stops with the reason, never
/// replaying a different history.
#[test]
fn a_changed_handler_dead_letters_with_the_reason() {
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    let registry = Registry::new().register("changing", |ctx: JobContext, _: ()| async move {
        let run = ctx.durable("ledger")?;
        if VERSION.load(Ordering::SeqCst) == 1 {
            run.step("a", || async { Ok((vec![], 1)) }).await?;
        } else {
            // Version 2 added a step before "a".
            run.step("new", || async { Ok((vec![], 0)) }).await?;
            run.step("a", || async { Ok((vec![], 1)) }).await?;
        }
        run.sleep("nap", Duration::from_secs(60)).await?;
        Ok(())
    });
    let h = Harness::new(registry).with_sink("ledger");
    let first = h.perform(NewJob::new("changing", &()).unwrap()).unwrap();
    assert!(matches!(first.outcome, Outcome::Snoozed { .. }));
    VERSION.store(2, Ordering::SeqCst);
    let rest = h.drain_all().unwrap();
    assert_eq!(rest.dead(), 1);
    let Outcome::Dead { reason } = &rest.runs[0].outcome else {
        unreachable!()
    };
    assert!(reason.contains("the handler changed"), "{reason}");
    assert!(
        reason.contains("\"new\"") && reason.contains("\"a\""),
        "{reason}"
    );
}

#[test]
fn names_are_checked_and_used_once_per_run() {
    let registry = Registry::new()
        .register("twice", |ctx: JobContext, _: ()| async move {
            let run = ctx.durable("ledger")?;
            run.step("x", || async { Ok((vec![], 1)) }).await?;
            run.step("x", || async { Ok((vec![], 2)) }).await?;
            Ok(())
        })
        .register("slash", |ctx: JobContext, _: ()| async move {
            ctx.durable("ledger")?
                .step("a/b", || async { Ok((vec![], 1)) })
                .await?;
            Ok(())
        })
        .register("no_sink", |ctx: JobContext, _: ()| async move {
            ctx.durable("missing")?;
            Ok(())
        })
        .register("bad_waitpoint", |ctx: JobContext, _: ()| async move {
            ctx.durable("ledger")?
                .wait_for::<()>("w", "", Duration::from_secs(1))
                .await?;
            Ok(())
        });
    let h = Harness::new(registry).with_sink("ledger");
    for (kind, says) in [
        ("twice", "used twice"),
        ("slash", "without '/'"),
        ("no_sink", "missing"),
        ("bad_waitpoint", "waitpoint id"),
    ] {
        let done = h.perform(NewJob::new(kind, &()).unwrap()).unwrap();
        match &done.outcome {
            Outcome::Dead { reason } | Outcome::Retry { reason, .. } => {
                assert!(reason.contains(says), "{kind}: {reason}")
            }
            other => panic!("{kind}: {other:?}"),
        }
    }
}

/// The zombie pauses the first attempt before each write (each step's one write) and before
/// it settles, lets a rival run the saga to its end, then wakes it: every late step is
/// refused, effect and journal entry together, and every counter ends as one clean run
/// leaves it.
#[test]
fn the_zombie_finds_every_late_step_refused() {
    let ran = Arc::new(Ran::default());
    let h = Harness::new(saga(ran)).with_sink("ledger");
    h.zombie(order(5, 1_000)).unwrap().assert_fenced();
    h.zombie(order(6, 90_000)).unwrap().assert_fenced();
}

// Found by the attack (a helper trying to break durable runs), each now refused or right.

/// A job id used again after the first job finished (past its id's retention) runs afresh:
/// the finished run's journal was cleared, so nothing of it is replayed.
#[test]
fn a_job_id_used_again_later_runs_its_own_steps() {
    let registry = Registry::new().register("charge", |ctx: JobContext, cents: i64| async move {
        let run = ctx.durable("ledger")?;
        let charged: i64 = run
            .step("charge", || async {
                let m = Mutation::HashIncr {
                    key: "{acct}:balance".into(),
                    field: "n".into(),
                    by: cents,
                };
                Ok((vec![m], cents))
            })
            .await?;
        assert_eq!(charged, cents, "a replay of another job's step");
        Ok(())
    });
    let h = Harness::new(registry).with_sink("ledger");
    let id = palisade::JobId::new();
    let job = |cents: i64| {
        NewJob::new("charge", &cents)
            .unwrap()
            .with_id(id)
            .with_scope("acct")
    };
    h.enqueue(job(100)).unwrap();
    assert_eq!(h.drain_all().unwrap().completed(), 1);
    assert!(cleared(&h, "acct", id));
    h.advance(Duration::from_secs(2 * 86_400)).unwrap();
    h.enqueue(job(250)).unwrap();
    assert_eq!(h.drain_all().unwrap().completed(), 1);
    let ledger = h.sink("ledger").unwrap();
    assert_eq!(ledger.field("{acct}:balance", "n").as_deref(), Some("350"));
}

/// A step's result is what JSON carries back, on the first run as on a resume; one JSON
/// cannot carry (a NaN) fails before the step's effect.
#[test]
fn a_result_is_the_same_on_the_first_run_and_on_a_resume() {
    static SEEN: std::sync::Mutex<Vec<Option<Option<u32>>>> = std::sync::Mutex::new(Vec::new());
    let registry = Registry::new()
        .register("opt", |ctx: JobContext, _: ()| async move {
            let run = ctx.durable("ledger")?;
            let got: Option<Option<u32>> =
                run.step("s", || async { Ok((vec![], Some(None))) }).await?;
            SEEN.lock().unwrap().push(got);
            run.sleep("nap", Duration::from_secs(60)).await?;
            Ok(())
        })
        .register("nan", |ctx: JobContext, _: ()| async move {
            let m = Mutation::HashIncr {
                key: "n".into(),
                field: "n".into(),
                by: 1,
            };
            let _: f64 = ctx
                .durable("ledger")?
                .step("s", || async { Ok((vec![m], f64::NAN)) })
                .await?;
            Ok(())
        });
    let h = Harness::new(registry).with_sink("ledger");
    h.enqueue(NewJob::new("opt", &()).unwrap()).unwrap();
    assert_eq!(h.drain_all().unwrap().completed(), 1);
    assert_eq!(*SEEN.lock().unwrap(), [None, None]);
    let nan = h.perform(NewJob::new("nan", &()).unwrap()).unwrap();
    assert!(
        matches!(&nan.outcome, Outcome::Dead { reason } if reason.contains("does not come back from JSON")),
        "{:?}",
        nan.outcome
    );
    assert!(nan.writes.is_empty(), "no effect: {:?}", nan.writes);
}

/// Two steps of one run at once are refused at once (the journal records their order),
/// rather than meeting a false "handler changed" on a resume.
#[test]
fn two_steps_of_one_run_at_once_are_refused() {
    let registry = Registry::new().register("join", |ctx: JobContext, _: ()| async move {
        let run = ctx.durable("ledger")?;
        let (a, b) = tokio::join!(
            run.step("a", || async {
                tokio::task::yield_now().await;
                Ok((vec![], 1))
            }),
            run.step("b", || async { Ok((vec![], 2)) })
        );
        let _: (i32, i32) = (a?, b?);
        Ok(())
    });
    let h = Harness::new(registry).with_sink("ledger");
    let done = h.perform(NewJob::new("join", &()).unwrap()).unwrap();
    assert!(
        matches!(&done.outcome, Outcome::Dead { reason } if reason.contains("one at a time")),
        "{:?}",
        done.outcome
    );
}

/// Runs one attempt of `job` under version 1 of a handler, then drains under version 2: the
/// dead letter's reason.
fn changed_between(
    registry: Registry,
    version: &'static AtomicUsize,
    job: NewJob,
) -> (Harness, String) {
    let h = Harness::new(registry)
        .with_sink("ledger")
        .with_sink("audit");
    version.store(1, Ordering::SeqCst);
    let first = h.perform(job).unwrap();
    assert!(!first.completed(), "{:?}", first.outcome);
    version.store(2, Ordering::SeqCst);
    let rest = h.drain_all().unwrap();
    let reason = rest
        .runs
        .iter()
        .find_map(|r| match &r.outcome {
            Outcome::Dead { reason } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| {
            panic!(
                "nothing died: {:?}",
                rest.runs.iter().map(|r| &r.outcome).collect::<Vec<_>>()
            )
        });
    (h, reason)
}

/// A step removed at the end of the code is found when the run ends.
#[test]
fn a_step_removed_is_found_when_the_run_ends() {
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    let registry = Registry::new().register("trailing", |ctx: JobContext, _: ()| async move {
        let run = ctx.durable("ledger")?;
        run.step("a", || async { Ok((vec![], ())) }).await?;
        if VERSION.load(Ordering::SeqCst) == 1 {
            run.step("b", || async { Ok((vec![], ())) }).await?;
            return Err(JobError::retry("fails after b"));
        }
        Ok(())
    });
    let (_, reason) = changed_between(registry, &VERSION, NewJob::new("trailing", &()).unwrap());
    assert!(
        reason.contains("\"b\"") && reason.contains("not reached"),
        "{reason}"
    );
}

/// A wait moved to another waitpoint is a changed handler, not a silent wait for the old one.
#[test]
fn a_wait_moved_to_another_waitpoint_is_found() {
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    let registry = Registry::new().register("moved", |ctx: JobContext, _: ()| async move {
        let waitpoint = ["old", "new"][VERSION.load(Ordering::SeqCst) - 1];
        ctx.durable("ledger")?
            .wait_for::<u8>("w", waitpoint, Duration::from_secs(600))
            .await?;
        Ok(())
    });
    let (_, reason) = changed_between(registry, &VERSION, NewJob::new("moved", &()).unwrap());
    assert!(
        reason.contains("\"new\"") && reason.contains("\"old\""),
        "{reason}"
    );
}

/// A step inserted before the recorded ones, in another sink, is found before its effect.
#[test]
fn a_step_inserted_in_another_sink_is_found_before_its_effect() {
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    let registry = Registry::new().register("inserted", |ctx: JobContext, _: ()| async move {
        let run = ctx.durable("ledger")?;
        if VERSION.load(Ordering::SeqCst) == 2 {
            let audit = ctx.sink("audit")?;
            let m = Mutation::HashIncr {
                key: "audit".into(),
                field: "n".into(),
                by: 1,
            };
            run.step_in("audit", &audit, || async { Ok((vec![m], ())) })
                .await?;
        }
        run.step("a", || async { Ok((vec![], ())) }).await?;
        run.sleep("nap", Duration::from_secs(60)).await?;
        Ok(())
    });
    let (h, reason) = changed_between(registry, &VERSION, NewJob::new("inserted", &()).unwrap());
    assert!(reason.contains("the handler changed"), "{reason}");
    assert_eq!(
        h.sink("audit").unwrap().read("audit"),
        None,
        "its effect was applied"
    );
}

/// A wait longer than the job's snoozes allow at one look an hour looks less often, and ends
/// as a timeout, not as a dead job; a sleep past `u64` ms is the longest delay, not a wrap.
#[test]
fn a_week_long_wait_times_out_within_the_default_snoozes() {
    let registry = Registry::new()
        .register("week", |ctx: JobContext, _: ()| async move {
            let got = ctx
                .durable("ledger")?
                .wait_for::<u8>("w", "nobody", Duration::from_secs(7 * 86_400))
                .await?;
            assert_eq!(got, Waited::TimedOut);
            Ok(())
        })
        .register("forever", |ctx: JobContext, _: ()| async move {
            ctx.durable("ledger")?
                .sleep("z", Duration::from_secs(u64::MAX))
                .await?;
            Ok(())
        });
    let h = Harness::new(registry).with_sink("ledger");
    h.enqueue(NewJob::new("week", &()).unwrap()).unwrap();
    let ran = h.drain_all().unwrap();
    assert_eq!((ran.completed(), ran.dead()), (1, 0));
    assert!(ran.runs.len() <= 101, "{} runs", ran.runs.len());
    let forever = h.perform(NewJob::new("forever", &()).unwrap()).unwrap();
    assert!(
        matches!(forever.outcome, Outcome::Snoozed { after } if after > Duration::from_secs(365 * 86_400)),
        "{:?}",
        forever.outcome
    );
}

/// A completion while its waiter runs on (its wait over, or completing its own waitpoint)
/// returns at once; the wake is tried again in the background.
#[test]
fn a_completion_does_not_wait_for_a_busy_waiter() {
    let registry = Registry::new().register("self", |ctx: JobContext, _: ()| async move {
        let run = ctx.durable("ledger")?;
        let _ = run.wait_for::<u8>("w", "mine", Duration::ZERO).await?;
        let started = std::time::Instant::now();
        ctx.complete_waitpoint("mine", &1u8).await?;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        Ok(())
    });
    let h = Harness::new(registry).with_sink("ledger");
    let done = h.perform(NewJob::new("self", &()).unwrap()).unwrap();
    assert!(done.completed(), "{:?}", done.outcome);
}

// Found by the second attack, each now right.

fn add(key: &str, by: i64) -> Mutation {
    Mutation::HashIncr {
        key: key.into(),
        field: "n".into(),
        by,
    }
}

/// A zombie paused before it settles: its rival completes the run (the journal is cleared by
/// a job the completion sets going, never before the completion).
#[test]
fn the_rival_of_a_zombie_paused_before_settling_completes() {
    let registry = Registry::new().register("pay", |ctx: JobContext, _: ()| async move {
        let run = ctx.durable("ledger")?;
        run.step("a", || async { Ok((vec![add("{s}:acct", 5)], 1)) })
            .await?;
        run.step("b", || async { Ok((vec![add("{s}:acct", 7)], 2)) })
            .await?;
        Ok(())
    });
    let h = Harness::new(registry).with_sink("ledger");
    let z = h
        .zombie(NewJob::new("pay", &()).unwrap().with_scope("s"))
        .unwrap();
    z.assert_fenced();
    for s in &z.scenarios {
        assert!(
            s.rivals.iter().any(|r| r.completed()),
            "paused before {:?}: no rival completed: {:?}",
            s.paused_before,
            s.rivals.iter().map(|r| &r.outcome).collect::<Vec<_>>()
        );
    }
}

/// A run that did all its steps and lost its completion (its lease ran out as the handler
/// returned) is finished by its next claim from its journal, and an operator retrying a dead
/// run a day later (past the sink's key retention) replays its recorded steps: each charge
/// once.
#[test]
fn a_lost_completion_and_a_late_dead_letter_retry_charge_once() {
    static FIRST: AtomicUsize = AtomicUsize::new(0);
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let registry = Registry::new()
        .register("lost", |ctx: JobContext, _: ()| async move {
            let run = ctx.durable("ledger")?;
            run.step("charge", || async { Ok((vec![add("{l}:acct", 100)], ())) })
                .await?;
            if FIRST.fetch_add(1, Ordering::SeqCst) == 0 {
                // The attempt overruns its lease just as the handler returns.
                palisade_core::clock::skip(Duration::from_secs(31));
            }
            Ok(())
        })
        .register("dies", |ctx: JobContext, _: ()| async move {
            let run = ctx.durable("ledger")?;
            run.step("charge", || async { Ok((vec![add("{d}:acct", 100)], ())) })
                .await?;
            if RUNS.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(JobError::fatal("the shipping API refused the address"));
            }
            run.step("ship", || async { Ok((vec![], ())) }).await?;
            Ok(())
        });
    let h = Harness::new(registry).with_sink("ledger");
    h.perform(NewJob::new("lost", &()).unwrap().with_scope("l"))
        .unwrap();
    let rest = h.drain_all().unwrap();
    assert_eq!((rest.completed(), rest.dead()), (1, 0));
    let first = h
        .perform(NewJob::new("dies", &()).unwrap().with_scope("d"))
        .unwrap();
    assert!(matches!(first.outcome, Outcome::Dead { .. }));
    h.advance(Duration::from_secs(25 * 3600)).unwrap();
    let retried = h
        .block_on(h.stores().admin().retry_dead(&first.job.queue, 10))
        .unwrap();
    assert_eq!(retried, 1);
    assert_eq!(h.drain_all().unwrap().completed(), 1);
    let ledger = h.sink("ledger").unwrap();
    assert_eq!(ledger.field("{l}:acct", "n").as_deref(), Some("100"));
    assert_eq!(ledger.field("{d}:acct", "n").as_deref(), Some("100"));
}

/// Every sink that held a journal of the run is cleared, a step's other sink too when the
/// last attempt only replayed it; a run whose code dropped every durable call is found.
#[test]
fn every_journal_is_cleared_and_a_run_with_no_calls_left_is_found() {
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    let registry = Registry::new()
        .register("two", |ctx: JobContext, _: ()| async move {
            let run = ctx.durable("ledger")?;
            let audit = ctx.sink("audit")?;
            run.step_in("charge", &audit, || async {
                Ok((vec![add("{t}:audit", 1)], 1))
            })
            .await?;
            run.sleep("nap", Duration::from_secs(60)).await?;
            Ok(())
        })
        .register("emptied", |ctx: JobContext, _: ()| async move {
            let run = ctx.durable("ledger")?;
            if VERSION.load(Ordering::SeqCst) == 1 {
                run.step("a", || async { Ok((vec![], ())) }).await?;
                return Err(JobError::retry("once"));
            }
            Ok(())
        });
    let id = {
        let h = Harness::new(registry.clone())
            .with_sink("ledger")
            .with_sink("audit");
        let id = h
            .enqueue(NewJob::new("two", &()).unwrap().with_scope("t"))
            .unwrap();
        assert_eq!(h.drain_all().unwrap().completed(), 1);
        for sink in ["ledger", "audit"] {
            let key = format!("{{t}}:palisade:journal:{id}");
            assert_eq!(h.sink(sink).unwrap().read(&key), None, "{sink}");
        }
        id
    };
    let _ = id;
    let (_, reason) = changed_between(registry, &VERSION, NewJob::new("emptied", &()).unwrap());
    assert!(
        reason.contains("\"a\"") && reason.contains("not reached"),
        "{reason}"
    );
}
