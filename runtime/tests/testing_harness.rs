//! `palisade::testing` beyond what a user's crate shows (examples/custom_worker/tests/jobs.rs,
//! docs/testing-your-jobs.md): a real Postgres sink in the harness and under the zombie, a
//! queue that never empties, a deadline passing in skipped time, a flow across two queues.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use palisade::testing::{assert_enqueued, refute_enqueued, Harness, Outcome, TestError};
use palisade::{Flow, JobContext, JobError, Mutation, NewJob, PostgresSink, Registry};
use palisade_testkit::{fresh_postgres_schema, postgres_url};

/// Records an order's payment in the user's own table, in a fenced transaction.
async fn pay(ctx: JobContext, order: i64) -> Result<(), JobError> {
    let pg = ctx.postgres("orders")?;
    let table = format!("{}.paid", pg.schema());
    pg.transaction("pay", move |tx| {
        Box::pin(async move {
            let sql = format!("INSERT INTO {table} (order_id) VALUES ($1)");
            tx.execute(&sql, &[&order]).await?;
            Ok(())
        })
    })
    .await?
    .accepted()?;
    Ok(())
}

fn rows(client: &tokio_postgres::Client, schema: &str, h: &Harness) -> i64 {
    let sql = format!("SELECT count(*) FROM {schema}.paid");
    h.block_on(client.query_one(&sql, &[])).unwrap().get(0)
}

#[test]
fn a_postgres_sink_commits_once_in_the_harness_and_refuses_the_zombie() {
    let (schema, url) = fresh_postgres_schema();
    let h = Harness::new(Registry::new().register("pay", pay));
    let sink = h.block_on(PostgresSink::connect(&url)).unwrap();
    let (client, conn) = h
        .block_on(tokio_postgres::connect(
            &postgres_url(),
            tokio_postgres::NoTls,
        ))
        .unwrap();
    h.block_on(async {
        actix::spawn(conn);
        let sql = format!("CREATE TABLE {schema}.paid (order_id bigint NOT NULL)");
        client.batch_execute(&sql).await.unwrap();
    });
    let h = h.with_postgres("orders", Arc::new(sink));

    let done = h.perform(NewJob::new("pay", &7).unwrap()).unwrap();
    assert!(done.completed(), "{:?}", done.outcome);
    assert!(done.writes[0].applied(), "{}", done.writes[0]);
    assert_eq!(
        done.writes[0].mutations, None,
        "a transaction's statements are its own"
    );
    assert_eq!(rows(&client, &schema, &h), 1);

    // Each scenario is a job of its own (its own transaction keys), in a world whose tokens are
    // newer than the last one's: one row each, and the woken run's transaction refused.
    let zombie = h.zombie(NewJob::new("pay", &8).unwrap()).unwrap();
    zombie.assert_fenced();
    assert_eq!(zombie.scenarios.len(), 2);
    let paused_first = &zombie.scenarios[0];
    assert!(
        paused_first.zombie.writes[0].refused(),
        "{}",
        paused_first.zombie.writes[0]
    );
    assert!(matches!(
        paused_first.zombie.outcome,
        Outcome::Refused { .. } | Outcome::Fenced { .. }
    ));
    let paused_after = &zombie.scenarios[1];
    assert!(
        paused_after.rivals[0].writes[0].duplicate(),
        "{}",
        paused_after.rivals[0].writes[0]
    );
    // The counting run, then one row per scenario.
    assert_eq!(rows(&client, &schema, &h), 1 + 1 + 2);
}

async fn again(ctx: JobContext, n: u64) -> Result<(), JobError> {
    ctx.follow_up(NewJob::new("again", &(n + 1))?.with_delay(Duration::from_secs(60)))?;
    Ok(())
}

#[test]
fn a_queue_that_never_empties_ends_with_what_is_left() {
    let h = Harness::new(Registry::new().register("again", again))
        .with_bounds(50, Duration::from_secs(24 * 3600));
    h.enqueue(NewJob::new("again", &0).unwrap()).unwrap();
    let err = h.drain("default").unwrap_err();
    let TestError::NeverEnds { runs, ref left, .. } = err else {
        panic!("{err}");
    };
    assert_eq!(runs, 50);
    assert!(
        left.contains("\"again\"") && left.contains("payload 50"),
        "{err}"
    );
}

async fn noop(_: JobContext, _: ()) -> Result<(), JobError> {
    Ok(())
}

#[test]
fn a_deadline_that_passes_while_time_skips_dead_letters_the_job() {
    let h = Harness::new(Registry::new().register("noop", noop));
    let deadline = SystemTime::now() + Duration::from_secs(3600);
    let late = NewJob::new("noop", &())
        .unwrap()
        .with_delay(Duration::from_secs(7200))
        .with_deadline(deadline);
    h.enqueue(late).unwrap();
    let ran = h.drain("default").unwrap();
    assert_eq!(ran.runs.len(), 1);
    assert!(
        matches!(&ran.runs[0].outcome, Outcome::Dead { reason } if reason.contains("deadline")),
        "{:?}",
        ran.runs[0].outcome
    );
    assert!(ran.skipped >= Duration::from_secs(7190));
}

async fn split(ctx: JobContext, parts: u32) -> Result<(), JobError> {
    let mut flow = Flow::new();
    let mut names = Vec::new();
    for part in 0..parts {
        names.push(format!("part:{part}"));
        flow = flow.step(
            names[part as usize].clone(),
            NewJob::new("part", &part)?.with_queue("parts"),
        );
    }
    let after: Vec<&str> = names.iter().map(String::as_str).collect();
    ctx.start_flow(flow.step_after("sum", NewJob::new("sum", &parts)?, &after))?;
    Ok(())
}

async fn part(ctx: JobContext, part: u32) -> Result<u32, JobError> {
    ctx.sink("totals")?
        .write(vec![Mutation::HashIncr {
            key: "parts".into(),
            field: "done".into(),
            by: 1,
        }])
        .await?
        .accepted()?;
    Ok(part * 10)
}

async fn sum(ctx: JobContext, parts: u32) -> Result<(), JobError> {
    let mut total = 0;
    for p in 0..parts {
        total += ctx
            .dependency::<u32>(&format!("part:{p}"))
            .await?
            .unwrap_or(0);
    }
    ctx.sink("totals")?
        .write(vec![Mutation::Set {
            key: "sum".into(),
            value: total.to_string(),
        }])
        .await?
        .accepted()?;
    Ok(())
}

#[test]
fn a_flow_started_by_a_handler_runs_across_two_queues() {
    let registry = Registry::new()
        .register("split", split)
        .register_with_result("part", part)
        .register("sum", sum);
    let h = Harness::new(registry).with_sink("totals");
    let done = h.perform(NewJob::new("split", &4).unwrap()).unwrap();
    assert_eq!(done.flows.len(), 1);
    let ran = h.drain_all().unwrap();
    assert_eq!(ran.completed(), 5, "4 parts and the sum");
    let totals = h.sink("totals").unwrap();
    assert_eq!(totals.field("parts", "done").as_deref(), Some("4"));
    assert_eq!(totals.text("sum").as_deref(), Some("60"));
    let flow = h
        .block_on(h.stores().flows().flow(done.flows[0]))
        .unwrap()
        .unwrap();
    assert_eq!(flow.state, palisade::FlowState::Succeeded);
}

#[test]
fn a_schedule_fires_each_tick_as_time_moves_on() {
    let every_minute = palisade::Schedule::new(
        "heartbeat",
        "0 * * * * *",
        NewJob::new("noop", &()).unwrap(),
    )
    .unwrap();
    let h = Harness::new(Registry::new().register("noop", noop))
        .with_schedule(every_minute)
        .unwrap();
    assert!(
        h.enqueued().is_empty(),
        "it starts now: no tick from before"
    );
    h.advance(Duration::from_secs(3600)).unwrap();
    // One an hour's minutes; one jump would have fired only what the catch-up keeps.
    let ticks = h.enqueued().len();
    assert!((59..=61).contains(&ticks), "{ticks} ticks");
    assert_eq!(h.drain("default").unwrap().completed(), ticks);
}

async fn slow(ctx: JobContext, minutes: u64) -> Result<(), JobError> {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(60 * minutes)) => Ok(()),
        _ = ctx.cancellation().cancelled() => Err(JobError::retry("cancelled")),
    }
}

#[test]
fn virtual_timers_pass_a_handlers_sleep_and_its_timeout_at_once() {
    let started = std::time::Instant::now();
    let registry = Registry::new()
        .register("slow", slow)
        .with_timeout("slow", Duration::from_secs(600));
    let h = Harness::new(registry).with_virtual_timers();
    let quick = h.perform(NewJob::new("slow", &5).unwrap()).unwrap();
    assert!(quick.completed(), "{:?}", quick.outcome);
    let late = h.perform(NewJob::new("slow", &30).unwrap()).unwrap();
    assert!(late.timed_out, "{:?}", late.outcome);
    assert!(
        matches!(&late.outcome, Outcome::Retry { reason, .. } if reason.contains("timed out")),
        "{:?}",
        late.outcome
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

// Found by the attack on the harness (issue 59): each was wrong before its fix.

use palisade::{IdempotencyKey, RetryPolicy};

/// Runs `f` on a thread of its own (a harness is made on the thread that uses it), failing
/// the test instead of hanging it when `f` does not end within `secs`.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(Duration::from_secs(secs)).expect("hung")
}

fn incr(key: &str, by: i64) -> Vec<Mutation> {
    vec![Mutation::HashIncr {
        key: key.into(),
        field: "n".into(),
        by,
    }]
}

/// Correct keys, but a retry writes one more thing first: the ledger write moves from
/// `job/0` to `job/1`, and a re-run applies it again.
async fn shifting(ctx: JobContext, _: ()) -> Result<(), JobError> {
    if ctx.job().attempt > 1 {
        ctx.sink("s")?
            .write(vec![Mutation::Set {
                key: "audit".into(),
                value: "retried".into(),
            }])
            .await?
            .accepted()?;
    }
    ctx.sink("s")?.write(incr("acct", 100)).await?.accepted()?;
    Ok(())
}

/// Sixty-four correct writes, then one under a fresh key.
async fn long_careless(ctx: JobContext, _: ()) -> Result<(), JobError> {
    let sink = ctx.sink("s")?;
    for i in 0..64 {
        sink.write(incr(&format!("k{i}"), 1)).await?.accepted()?;
    }
    let fresh = IdempotencyKey::new(format!("late-{}", uuid::Uuid::new_v4()));
    sink.write_keyed(fresh, incr("total", 1))
        .await?
        .accepted()?;
    Ok(())
}

#[test]
fn a_write_applied_twice_is_found_when_its_position_moves_or_past_64_writes() {
    for kind in ["shifting", "long_careless"] {
        let registry = Registry::new()
            .register("shifting", shifting)
            .register("long_careless", long_careless);
        let h = Harness::new(registry).with_sink("s");
        let zombie = h.zombie(NewJob::new(kind, &()).unwrap()).unwrap();
        let last = zombie.scenarios.last().unwrap();
        assert_eq!(
            last.paused_before,
            if kind == "shifting" { 1 } else { 65 },
            "{kind}: the last pause is before settling"
        );
        let leaked: Vec<String> = zombie.leaks().map(|l| l.to_string()).collect();
        assert!(
            leaked.iter().any(|l| l.contains("applied twice")),
            "{kind}: {leaked:?}"
        );
    }
}

/// Two writes sent together; a write from a task left running after the handler returned;
/// fewer writes on later runs.
async fn together(ctx: JobContext, _: ()) -> Result<(), JobError> {
    let (a, b) = (ctx.sink("s")?, ctx.sink("s")?);
    let (x, y) = tokio::join!(a.write(incr("a", 1)), b.write(incr("b", 1)));
    x?.accepted()?;
    y?.accepted()?;
    let late = ctx.sink("s")?;
    tokio::spawn(async move { late.write(incr("c", 1)).await });
    Ok(())
}

async fn fewer(ctx: JobContext, _: ()) -> Result<(), JobError> {
    if ctx.job().attempt == 1 {
        let sink = ctx.sink("s")?;
        sink.write(incr("a", 1)).await?.accepted()?;
        sink.write(incr("b", 1)).await?.accepted()?;
    }
    Ok(())
}

#[test]
fn the_zombie_ends_with_writes_sent_together_varying_or_a_deadline() {
    within(60, || {
        let registry = Registry::new()
            .register("together", together)
            .register("fewer", fewer);
        let h = Harness::new(registry).with_sink("s");
        h.zombie(NewJob::new("together", &()).unwrap())
            .unwrap()
            .assert_fenced();
        // Writes on its first attempt only: a rival's re-run makes none, so they are lost.
        let varying = h.zombie(NewJob::new("fewer", &()).unwrap()).unwrap();
        let lost: Vec<String> = varying.leaks().map(|l| l.to_string()).collect();
        assert!(
            !lost.is_empty() && lost.iter().all(|l| l.contains("a change lost")),
            "{lost:?}"
        );
        let deadline = h.now() + Duration::from_secs(40);
        let job = NewJob::new("together", &())
            .unwrap()
            .with_deadline(deadline);
        let zombie = h.zombie(job).unwrap();
        zombie.assert_fenced();
        assert!(
            zombie.scenarios.iter().all(|s| s.paused),
            "each scenario starts at the harness's time"
        );
    });
}

#[test]
fn the_zombie_leaves_the_harness_clock_alone() {
    let h = Harness::new(
        Registry::new()
            .register("fewer", fewer)
            .register("noop", noop),
    )
    .with_sink("s");
    let before = h.now();
    h.enqueue(
        NewJob::new("noop", &())
            .unwrap()
            .with_delay(Duration::from_secs(600)),
    )
    .unwrap();
    h.zombie(NewJob::new("fewer", &()).unwrap()).unwrap();
    assert!(h.now().duration_since(before).unwrap() < Duration::from_secs(5));
    assert_eq!(
        h.block_on(h.stores().inspect().counts("default"))
            .unwrap()
            .delayed,
        1
    );
}

/// Correct, but each attempt records its own audit entry under its own key.
async fn audited(ctx: JobContext, _: ()) -> Result<(), JobError> {
    let audit = format!("{}/audit-{}", ctx.job().id, ctx.job().attempt);
    let entry = vec![Mutation::Set {
        key: format!("audit:{}", ctx.job().attempt),
        value: "ran".into(),
    }];
    ctx.sink("s")?
        .write_keyed(IdempotencyKey::new(audit), entry)
        .await?
        .accepted()?;
    ctx.sink("s")?.write(incr("acct", 1)).await?.accepted()?;
    Ok(())
}

#[test]
fn a_correct_handler_passes_the_zombie_when_the_job_is_buried_or_audits_each_attempt() {
    let registry = Registry::new()
        .register("fewer", fewer)
        .register("audited", audited);
    let h = Harness::new(registry).with_sink("s");
    // Out of stalls: the reaper buries the job and no rival runs; the woken run's write is
    // the job's only one (no newer token exists to refuse it), not a leak.
    let buried = h
        .zombie(NewJob::new("fewer", &()).unwrap().with_max_stalls(0))
        .unwrap();
    buried.assert_fenced();
    for s in &buried.scenarios {
        assert!(s.rivals.is_empty());
        assert_eq!(s.sink("s").unwrap().field("b", "n").as_deref(), Some("1"));
    }
    h.zombie(NewJob::new("audited", &()).unwrap())
        .unwrap()
        .assert_fenced();
}

#[test]
fn perform_and_drain_say_why_a_job_cannot_run() {
    let h = Harness::new(Registry::new().register("noop", noop));
    h.enqueue(NewJob::new("noop", &()).unwrap().with_scope("sku:1"))
        .unwrap();
    let err = h
        .perform(NewJob::new("noop", &()).unwrap().with_scope("sku:1"))
        .unwrap_err();
    assert!(err.to_string().contains("ahead of it"), "{err}");

    let paused = Harness::new(Registry::new().register("noop", noop));
    paused.enqueue(NewJob::new("noop", &()).unwrap()).unwrap();
    paused
        .block_on(paused.stores().admin().set_paused("default", true))
        .unwrap();
    let started = std::time::Instant::now();
    let err = paused.drain("default").unwrap_err();
    assert!(err.to_string().contains("paused"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_registry_or_policy_a_worker_refuses_is_refused() {
    let typo = std::panic::catch_unwind(|| {
        Harness::new(
            Registry::new()
                .register("noop", noop)
                .with_timeout("nop", Duration::from_secs(1)),
        )
    });
    let message = *typo.err().unwrap().downcast::<String>().unwrap();
    assert!(message.contains("\"nop\""), "{message}");
    let zero = std::panic::catch_unwind(|| {
        Harness::new(Registry::new()).with_retry(RetryPolicy {
            base: Duration::ZERO,
            max: Duration::ZERO,
        })
    });
    assert!(zero.is_err());
}

#[test]
fn inside_an_async_test_the_harness_says_to_write_a_plain_test() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let inside =
        runtime.block_on(async { std::panic::catch_unwind(|| Harness::new(Registry::new())) });
    let panic = inside.err().unwrap();
    let message = panic.downcast_ref::<&str>().copied().unwrap_or_default();
    assert!(message.contains("plain #[test]"), "{message}");
}

#[test]
fn time_only_moves_forward_and_a_sink_added_late_keeps_the_queue() {
    let h = Harness::new(Registry::new().register("noop", noop));
    h.enqueue(
        NewJob::new("noop", &())
            .unwrap()
            .with_delay(Duration::from_secs(3600)),
    )
    .unwrap();
    let h = h.with_sink("late");
    h.advance(Duration::from_secs(1800)).unwrap();
    h.advance(Duration::MAX).unwrap();
    let counts = h.block_on(h.stores().inspect().counts("default")).unwrap();
    assert_eq!(
        (counts.ready, counts.delayed),
        (1, 0),
        "due after the huge jump, never back to an hour away"
    );
}

// Found by the second attack on the harness (issue 59).

/// A fresh key and a timestamp beside the credit: the mutations differ on each run.
async fn stamped(ctx: JobContext, _: ()) -> Result<(), JobError> {
    let now = format!("{:?}", SystemTime::now());
    let key = IdempotencyKey::new(format!("credit-{now}"));
    let mut credit = incr("acct", 100);
    credit.push(Mutation::Set {
        key: "acct:updated_at".into(),
        value: now,
    });
    ctx.sink("s")?.write_keyed(key, credit).await?.accepted()?;
    Ok(())
}

/// Two bonuses of the same size, on purpose.
async fn bonuses(ctx: JobContext, _: ()) -> Result<(), JobError> {
    let s = ctx.sink("s")?;
    s.write(incr("points", 10)).await?.accepted()?;
    s.write(incr("points", 10)).await?.accepted()?;
    Ok(())
}

#[test]
fn a_double_credit_is_found_by_its_total_and_two_equal_bonuses_are_not() {
    let registry = Registry::new()
        .register("stamped", stamped)
        .register("bonuses", bonuses);
    let h = Harness::new(registry).with_sink("s");
    let stamped = h.zombie(NewJob::new("stamped", &()).unwrap()).unwrap();
    let leaked: Vec<String> = stamped.leaks().map(|l| l.to_string()).collect();
    assert!(
        leaked
            .iter()
            .any(|l| l.contains("acct.n is 200 but 100") && l.contains("applied twice")),
        "{leaked:?}"
    );
    h.zombie(NewJob::new("bonuses", &()).unwrap())
        .unwrap()
        .assert_fenced();
}

#[test]
fn a_paused_schedule_fires_nothing_and_every_waiting_job_is_seen() {
    let hourly =
        palisade::Schedule::new("hourly", "0 0 * * * *", NewJob::new("noop", &()).unwrap())
            .unwrap();
    let h = Harness::new(Registry::new().register("noop", noop))
        .with_schedule(hourly)
        .unwrap();
    assert!(h
        .block_on(h.stores().control().pause_schedule("hourly", true))
        .unwrap());
    h.advance(Duration::from_secs(5 * 3600)).unwrap();
    assert!(h.enqueued().is_empty(), "{:?}", h.enqueued());

    for _ in 0..10_001 {
        h.enqueue(NewJob::new("noop", &()).unwrap()).unwrap();
    }
    h.enqueue(NewJob::new("noop", &()).unwrap().with_queue("late"))
        .unwrap();
    h.enqueue(NewJob::new("noop", &"behind").unwrap().with_scope("one"))
        .unwrap();
    h.enqueue(NewJob::new("noop", &"second").unwrap().with_scope("one"))
        .unwrap();
    let all = h.enqueued();
    assert_eq!(all.len(), 10_004);
    refute_enqueued!(h, kind = "bad");
    assert_enqueued!(h, payload = serde_json::json!("second"));
}

#[test]
fn a_lease_a_worker_refuses_is_refused() {
    let short = std::panic::catch_unwind(|| {
        Harness::new(Registry::new()).with_lease(Duration::from_millis(1))
    });
    assert!(short.is_err());
    let _ = Harness::new(Registry::new()).with_lease(Duration::from_millis(30));
}
