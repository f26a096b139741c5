//! `palisade::testing` beyond what a user's crate shows (examples/custom_worker/tests/jobs.rs,
//! docs/testing-your-jobs.md): a real Postgres sink in the harness and under the zombie, a
//! queue that never empties, a deadline passing in skipped time, a flow across two queues.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use palisade::testing::{Harness, Outcome, TestError};
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
