//! A stale holder's durable step is refused whole — its effect and its journal entry — by
//! each kind of sink, with real workers: the memory sink, a private Redis server, a private
//! Redis Cluster (the journal in the scope's slot) and Postgres (`pg_step`, the entry kept
//! with the transaction's key). Worker A starts the step and pauses past its lease (frozen:
//! no renewals); worker B takes the run over and records the step; A wakes and writes. The
//! step's name depends on who runs it (as a handler's does when it decides by a clock or a
//! read outside the journal), so the idempotency key cannot save A: only the fence refuses
//! its write. The checks fail when the sink's fence check is taken out (tried: the memory
//! sink's `admission::decide` without its token checks applies A's step): the effect
//! applied once, and the journal holds B's entry alone (its token, its result).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use palisade::store::postgres::PostgresFencedStore;
use palisade::*;
use palisade_testkit::{fresh_postgres_schema, RedisCluster, RedisServer};
use tokio::sync::{mpsc, Notify};

const TTL: Duration = Duration::from_millis(600);

/// What a run reports: who ran it, its token, and how its step ended (`None`: recorded).
type Report = (&'static str, FencingToken, Option<String>);

fn config(name: &str) -> WorkerConfig {
    WorkerConfig {
        lease_ttl: TTL,
        poll_interval: Duration::from_millis(10),
        ..WorkerConfig::new(name)
    }
}

/// A run of one charge step. `gate`: pause inside the step (before its write) until
/// notified; `postgres`: the step is a fenced Postgres transaction (paused before it: a
/// transaction holds its scope's lock, so the pause comes first).
fn registry(
    who: &'static str,
    gate: Option<Arc<Notify>>,
    postgres: bool,
    tx: mpsc::UnboundedSender<Report>,
) -> Registry {
    Registry::new().register("charge", move |ctx: JobContext, _: ()| {
        let (gate, tx) = (gate.clone(), tx.clone());
        async move {
            let token = ctx.lease().token;
            let run = ctx.durable("journal")?;
            let pause = || async {
                if let Some(gate) = &gate {
                    tx.send((who, token, Some("paused".into()))).unwrap();
                    gate.notified().await;
                }
            };
            let recorded: Result<String, JobError> = if postgres {
                // A first call reads the run's journal (then empty) before the pause, as a
                // holder paused inside a step has: the pause cannot be inside the transaction,
                // which holds its scope's lock.
                run.sleep("start", Duration::ZERO).await?;
                pause().await;
                let pg = ctx.postgres("orders")?;
                let table = format!("{}.charges", pg.schema());
                run.pg_step(&format!("charge-by-{who}"), &pg, move |tx| {
                    Box::pin(async move {
                        let sql = format!("INSERT INTO {table} (who) VALUES ($1)");
                        tx.execute(&sql, &[&who]).await?;
                        Ok(who.to_string())
                    })
                })
                .await
            } else {
                run.step(&format!("charge-by-{who}"), || async {
                    pause().await;
                    let m = Mutation::HashIncr {
                        key: "{acct:1}:balance".into(),
                        field: "cents".into(),
                        by: 100,
                    };
                    Ok((vec![m], who.to_string()))
                })
                .await
            };
            tx.send((who, token, recorded.as_ref().err().map(|e| e.to_string())))
                .unwrap();
            recorded?;
            // Suspended, so its journal stays for the test to read (a run that ends clears it).
            run.sleep("hold", Duration::from_secs(3600)).await?;
            Ok(())
        }
    })
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Report>) -> Report {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("no report in 30s")
        .unwrap()
}

/// A pauses in the step, B records it, A wakes: A's step is refused. Returns the job, and
/// A's and B's tokens, for the caller to read its sink.
async fn a_late_step_is_refused(
    sinks: Sinks,
    postgres: bool,
) -> (JobId, FencingToken, FencingToken) {
    let coordinator = Coordinator::new(Arc::new(MemoryLeaseStore::new()))
        .with_reap_interval(Duration::from_millis(50))
        .start();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let gate = Arc::new(Notify::new());
    let a = Worker::new(
        config("A"),
        coordinator.clone(),
        registry("A", Some(gate.clone()), postgres, tx.clone()),
        sinks.clone(),
    )
    .unwrap()
    .start();
    let job = coordinator
        .send(Enqueue(vec![NewJob::new("charge", &())
            .unwrap()
            .with_scope("acct:1")]))
        .await
        .unwrap()
        .unwrap()[0];
    let (who, a_token, paused) = next(&mut seen).await;
    assert_eq!((who, paused.as_deref()), ("A", Some("paused")));
    a.send(Freeze(true)).await.unwrap();
    let _b = Worker::new(
        config("B"),
        coordinator.clone(),
        registry("B", None, postgres, tx),
        sinks,
    )
    .unwrap()
    .start();
    let (who, b_token, recorded) = next(&mut seen).await;
    assert_eq!((who, recorded), ("B", None));
    assert!(b_token > a_token);
    a.send(Freeze(false)).await.unwrap();
    gate.notify_one();
    let (who, token, refused) = next(&mut seen).await;
    assert_eq!((who, token), ("A", a_token));
    let refused = refused.expect("A's late step was recorded");
    assert!(refused.contains("stale token"), "{refused}");
    (job, a_token, b_token)
}

/// The run's journal entries, from the journal sink.
async fn journal(sink: &dyn FencedStore, job: JobId) -> Vec<(String, serde_json::Value)> {
    let key = format!("{{acct:1}}:palisade:journal:{job}");
    match sink.read(&key).await.unwrap() {
        Some(Value::Hash(fields)) => fields
            .into_iter()
            .map(|(name, json)| (name, serde_json::from_str(&json).unwrap()))
            .collect(),
        other => panic!("no journal: {other:?}"),
    }
}

/// The effect applied once, and the entry B's.
async fn only_b_recorded(sink: &dyn FencedStore, job: JobId, b: FencingToken) {
    let balance = sink.read("{acct:1}:balance").await.unwrap();
    let Some(Value::Hash(balance)) = balance else {
        panic!("no balance: {balance:?}")
    };
    assert_eq!(balance["cents"], "100", "the step applied more than once");
    let journal = journal(sink, job).await;
    assert_eq!(journal.len(), 2, "{journal:?}");
    let (name, entry) = journal
        .iter()
        .find(|(n, _)| n.starts_with("charge"))
        .unwrap();
    assert_eq!(name, "charge-by-B");
    assert_eq!(entry["token"].as_u64(), Some(b.as_u64()), "{entry}");
    assert_eq!(entry["result"], "B", "{entry}");
}

fn journal_on(store: Arc<dyn FencedStore>) -> Sinks {
    Sinks::new().with("journal", FencedSink::new("journal", store).start())
}

#[actix::test]
async fn a_late_step_is_refused_by_the_memory_sink() {
    let store = Arc::new(MemoryFencedStore::new());
    let (job, _, b) = a_late_step_is_refused(journal_on(store.clone()), false).await;
    only_b_recorded(&*store, job, b).await;
}

#[actix::test]
async fn a_late_step_is_refused_by_a_redis_sink() {
    let redis = RedisServer::start();
    let pool = store::redis::pool(&redis.url()).unwrap();
    let store = Arc::new(RedisFencedStore::new(pool, "ledger"));
    let (job, _, b) = a_late_step_is_refused(journal_on(store.clone()), false).await;
    only_b_recorded(&*store, job, b).await;
}

#[actix::test]
async fn a_late_step_is_refused_on_a_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let store = Arc::new(RedisFencedStore::new(cluster.target(), "ledger"));
    let (job, _, b) = a_late_step_is_refused(journal_on(store.clone()), false).await;
    only_b_recorded(&*store, job, b).await;
}

/// Postgres alone: the run's journal in a Postgres-backed sink, the step a fenced
/// transaction whose entry is kept with its key. A's transaction is refused before its
/// closure runs: one row, B's.
#[actix::test]
async fn a_late_step_is_refused_by_a_postgres_sink() {
    let (schema, url) = fresh_postgres_schema();
    let pg = Arc::new(PostgresSink::connect(&url).await.unwrap());
    let (client, conn) =
        tokio_postgres::connect(&palisade_testkit::postgres_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
    actix::spawn(conn);
    client
        .batch_execute(&format!(
            "CREATE TABLE {schema}.charges (who text NOT NULL)"
        ))
        .await
        .unwrap();
    let journal = Arc::new(PostgresFencedStore::new(pg.clone()));
    let sinks = journal_on(journal).with_postgres("orders", pg.clone());
    let (_, _, _) = a_late_step_is_refused(sinks, true).await;
    let rows: Vec<String> = client
        .query(&format!("SELECT who FROM {schema}.charges"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, ["B"]);
    palisade_testkit::drop_postgres_schema(&pg).await;
}
