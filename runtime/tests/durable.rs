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
use palisade::{JobContext, Mutation, NewJob, Registry, Value};
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

/// The run's journal in sink `ledger`: step name -> entry (JSON).
fn journal(
    h: &Harness,
    scope: &str,
    job: palisade::JobId,
) -> serde_json::Map<String, serde_json::Value> {
    let key = format!("{{{scope}}}:palisade:journal:{job}");
    match h.sink("ledger").unwrap().read(&key) {
        Some(Value::Hash(fields)) => fields
            .into_iter()
            .map(|(k, v)| (k, serde_json::from_str(&v).unwrap()))
            .collect(),
        other => panic!("no journal at {key}: {other:?}"),
    }
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
