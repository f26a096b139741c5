//! The Postgres fenced sink against the machine's real PostgreSQL (`.ci/run` starts it), each
//! test in a schema of its own: the `FencedStore` conformance suite, and the fenced
//! transaction's own promises — a stale holder's closure never runs, a duplicate returns the
//! first result, a lost COMMIT is `OutcomeUnknown` and resolves on retry, and hundreds of
//! racing writers on one scope (first row included) keep tokens monotonic in commit order.

use palisade_testkit::fenced_store_suite;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade::*;
use palisade_testkit::{drop_postgres_schema, fresh_postgres_schema};

async fn sink() -> Arc<PostgresSink> {
    let (_, url) = fresh_postgres_schema();
    Arc::new(
        PostgresSink::connect(&url)
            .await
            .expect("PostgreSQL is running (.ci/run starts it)")
            // Collect at every call, as the memory and Redis sinks do (the suite checks it).
            .with_collect_interval(Duration::ZERO),
    )
}

async fn fenced_store() -> (Arc<dyn FencedStore>, ()) {
    (Arc::new(PostgresFencedStore::new(sink().await)), ())
}

fenced_store_suite!(fenced_store());
fenced_store_suite!(list);

/// Issue 56: the conformance suite, each case in a schema of its own, through a private PgBouncer in
/// transaction mode (`pooler=transaction`): its mutation writes (the data lock and write),
/// fences, keys and collection go out unnamed and hold as they do on a direct connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_holds_through_a_transaction_pooler() {
    // (The sink's SQL names its schema; the pooler's search_path serves no one here.)
    let bouncer = palisade_testkit::PgBouncer::start("public");
    for (name, case) in fenced_store_cases() {
        // A schema of the case's own, as the direct-connection tests get.
        let (schema, _) = fresh_postgres_schema();
        let sink = Arc::new(
            PostgresSink::connect(&bouncer.sink_url(&schema))
                .await
                .unwrap()
                .with_collect_interval(Duration::ZERO),
        );
        let store: Arc<dyn FencedStore> = Arc::new(PostgresFencedStore::new(sink.clone()));
        case(store, format!("{name}:{}:", LeaseId::new())).await;
        drop_postgres_schema(&sink).await;
    }
    // A fenced transaction behind the pooler ends after a minute idle, as on a direct
    // connection (set per transaction there: a transaction pooler takes no session option),
    // so a paused holder does not keep its scope's lock for good.
    let (schema, _) = fresh_postgres_schema();
    let pooled = PostgresSink::connect(&bouncer.sink_url(&schema))
        .await
        .unwrap();
    let direct = sink().await;
    for sink in [&pooled, &*direct] {
        assert_eq!(idle_timeout_in_a_fenced_transaction(sink).await, "1min");
    }
    // And nothing of it stays for the next transaction on the connection.
    let client = pooled.pool().get().await.unwrap();
    let after = client
        .query_typed_one("SHOW idle_in_transaction_session_timeout", &[])
        .await
        .unwrap();
    assert_eq!(after.get::<_, String>(0), "0");
    drop(client);
    drop_postgres_schema(&pooled).await;
    drop_postgres_schema(&direct).await;
}

/// `idle_in_transaction_session_timeout` as a fenced transaction on `sink` sees it.
async fn idle_timeout_in_a_fenced_transaction(sink: &PostgresSink) -> String {
    let outcome: Result<Fenced<String>> = sink
        .transaction(
            &Scope::new("idle"),
            fence(1),
            &IdempotencyKey::new("k"),
            |tx| {
                Box::pin(async move {
                    let row = tx
                        .query_typed_one("SHOW idle_in_transaction_session_timeout", &[])
                        .await?;
                    Ok(row.get::<_, String>(0))
                })
            },
        )
        .await;
    match outcome {
        Ok(Fenced::Applied(shown)) => shown,
        other => panic!("{other:?}"),
    }
}

fn fence(token: u64) -> Fence {
    Fence {
        token: FencingToken::from_u64(token),
        lease: LeaseId::from(uuid::Uuid::from_u128(u128::from(token))),
    }
}

/// Polls the sink's outbox counts every 20 ms until `done` holds, for 20 s at most; returns
/// the last counts (the caller asserts on them).
async fn outbox_when(sink: &PostgresSink, done: impl Fn(&OutboxCounts) -> bool) -> OutboxCounts {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let counts = sink.outbox_counts().await.unwrap();
        if done(&counts) || std::time::Instant::now() > deadline {
            return counts;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A user table the closures write, in the test's schema.
async fn user_table(sink: &PostgresSink) -> String {
    let table = format!("{}.ledger", sink.schema());
    sink.pool()
        .get()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE {table} (id bigserial PRIMARY KEY, token bigint NOT NULL, note text)"
        ))
        .await
        .unwrap();
    table
}

async fn rows(sink: &PostgresSink, sql: &str) -> Vec<tokio_postgres::Row> {
    sink.pool()
        .get()
        .await
        .unwrap()
        .query(sql, &[])
        .await
        .unwrap()
}

/// Inserts one ledger row under `fence`, counting how often the closure ran.
async fn insert(
    sink: &PostgresSink,
    table: &str,
    scope: &Scope,
    f: Fence,
    key: &str,
    ran: &Arc<AtomicUsize>,
) -> Result<Fenced<i64>> {
    let (table, ran) = (table.to_owned(), ran.clone());
    let token = f.token.as_u64() as i64;
    sink.transaction(scope, f, &IdempotencyKey::new(key), move |tx| {
        Box::pin(async move {
            ran.fetch_add(1, Ordering::SeqCst);
            let row = tx
                .query_one(
                    &format!("INSERT INTO {table} (token) VALUES ($1) RETURNING id"),
                    &[&token],
                )
                .await?;
            Ok(row.get::<_, i64>(0))
        })
    })
    .await
}

#[tokio::test]
async fn a_stale_holder_never_runs_and_a_duplicate_returns_the_first_result() {
    let sink = sink().await;
    let table = user_table(&sink).await;
    let scope = Scope::new("invoice:7");
    let ran = Arc::new(AtomicUsize::new(0));
    // The first write of a scope is fenced too: it creates the fence row.
    let first = insert(&sink, &table, &scope, fence(10), "job/pay", &ran).await;
    let Ok(Fenced::Applied(id)) = first else {
        panic!("{first:?}")
    };
    // The holder of 10 was paused; 11 took over and wrote.
    let newer = insert(&sink, &table, &scope, fence(11), "job2/pay", &ran).await;
    assert!(matches!(newer, Ok(Fenced::Applied(_))), "{newer:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    // 10 wakes up: refused, its closure never runs.
    let late = insert(&sink, &table, &scope, fence(10), "job/late", &ran).await;
    assert_eq!(
        late.unwrap(),
        Fenced::Rejected(Rejection::StaleToken {
            presented: FencingToken::from_u64(10),
            highest: FencingToken::from_u64(11),
        })
    );
    // Same token, another lease: a conflict, not a write.
    let impostor = Fence {
        token: FencingToken::from_u64(11),
        lease: LeaseId::new(),
    };
    let conflict = insert(&sink, &table, &scope, impostor, "x", &ran).await;
    assert!(matches!(
        conflict,
        Ok(Fenced::Rejected(Rejection::TokenConflict { .. }))
    ));
    // Job 1 re-runs under 12 and repeats its write: the first result, no second run.
    let rerun = insert(&sink, &table, &scope, fence(12), "job/pay", &ran).await;
    assert_eq!(rerun.unwrap(), Fenced::Duplicate(id));
    assert_eq!(
        ran.load(Ordering::SeqCst),
        2,
        "no closure ran for refusals or repeats"
    );
    assert_eq!(
        sink.highest(&scope).await.unwrap(),
        Some(fence(12)),
        "a duplicate advances the fence"
    );
    assert_eq!(
        rows(&sink, &format!("SELECT 1 FROM {table}")).await.len(),
        2
    );
    drop_postgres_schema(&sink).await;
}

#[tokio::test]
async fn a_failing_closure_rolls_back_everything_and_keeps_its_class() {
    let sink = sink().await;
    let table = user_table(&sink).await;
    let scope = Scope::new("s");
    let outcome: Result<Fenced<()>> = sink
        .transaction(&scope, fence(3), &IdempotencyKey::new("k"), |tx| {
            let table = table.clone();
            Box::pin(async move {
                tx.execute(&format!("INSERT INTO {table} (token) VALUES (3)"), &[])
                    .await?;
                tx.outbox("email").push("receipt", &"hello").await?;
                Err("invoice 7 is already paid".into())
            })
        })
        .await;
    assert!(
        matches!(&outcome, Err(Error::Aborted(why)) if why.contains("already paid")),
        "{outcome:?}"
    );
    let sql_error: Result<Fenced<()>> = sink
        .transaction(&scope, fence(3), &IdempotencyKey::new("k"), |tx| {
            Box::pin(async move {
                tx.execute("SELECT * FROM no_such_table", &[]).await?;
                Ok(())
            })
        })
        .await;
    assert!(
        matches!(&sql_error, Err(Error::Backend(why)) if why.contains("42P01")),
        "{sql_error:?}"
    );
    // Nothing of either stayed: no row, no outbox entry, no key — but the fence advanced to
    // the failed closures' token (their lease passed the ownership checks), so an older
    // holder is refused before its closure runs (invariant 8).
    assert!(rows(&sink, &format!("SELECT 1 FROM {table}"))
        .await
        .is_empty());
    assert_eq!(sink.outbox_counts().await.unwrap(), OutboxCounts::default());
    assert_eq!(sink.highest(&scope).await.unwrap(), Some(fence(3)));
    let ran = Arc::new(AtomicUsize::new(0));
    let older = insert(&sink, &table, &scope, fence(2), "older", &ran).await;
    assert!(
        matches!(older, Ok(Fenced::Rejected(Rejection::StaleToken { .. }))),
        "an older holder wrote after a newer one's failed transaction: {older:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let retry = insert(&sink, &table, &scope, fence(3), "k", &ran).await;
    assert!(
        matches!(retry, Ok(Fenced::Applied(_))),
        "the key was not recorded: {retry:?}"
    );
    drop_postgres_schema(&sink).await;
}

/// Issue 10, case 3: the connection is killed (`pg_terminate_backend`) while COMMIT runs.
/// A deferred constraint trigger makes the COMMIT wait, so the kill lands inside it; the
/// caller hears `OutcomeUnknown` (retryable), and the retry with the same key applies once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_cut_off_is_outcome_unknown_and_a_retry_resolves_it() {
    let sink = sink().await;
    let table = user_table(&sink).await;
    let s = sink.schema();
    sink.pool()
        .get()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE FUNCTION {s}.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF NEW.note = 'slow' THEN PERFORM pg_sleep(3); END IF; RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON {table}
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.slow_commit();"
        ))
        .await
        .unwrap();
    let scope = Scope::new("s");
    let runs = Arc::new(AtomicUsize::new(0));
    let write = |note: &'static str| {
        let (table, runs) = (table.clone(), runs.clone());
        let sink = sink.clone();
        let scope = scope.clone();
        async move {
            sink.transaction(
                &scope,
                fence(5),
                &IdempotencyKey::new("job/pay"),
                move |tx| {
                    Box::pin(async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tx.execute(
                            &format!("INSERT INTO {table} (token, note) VALUES (5, $1)"),
                            &[&note],
                        )
                        .await?;
                        Ok(note.to_owned())
                    })
                },
            )
            .await
        }
    };
    let killer = {
        let sink = sink.clone();
        tokio::spawn(async move {
            let client = sink.pool().get().await.unwrap();
            for _ in 0..200 {
                tokio::time::sleep(Duration::from_millis(25)).await;
                let killed = client
                    .query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE wait_event = 'PgSleep' AND query LIKE 'COMMIT%'",
                        &[],
                    )
                    .await
                    .unwrap();
                if !killed.is_empty() {
                    return true;
                }
            }
            false
        })
    };
    let cut = write("slow").await;
    assert!(killer.await.unwrap(), "the COMMIT was never seen waiting");
    assert!(
        matches!(&cut, Err(Error::OutcomeUnknown(_))),
        "a lost COMMIT answer must be OutcomeUnknown, got {cut:?}"
    );
    assert!(cut.unwrap_err().is_retryable());
    // The retry (same key) resolves it: the killed COMMIT did not apply, so this applies once.
    let retry = write("fast").await.unwrap();
    assert_eq!(retry, Fenced::Applied("fast".to_owned()));
    let again = write("fast").await.unwrap();
    assert_eq!(again, Fenced::Duplicate("fast".to_owned()));
    let applied = rows(&sink, &format!("SELECT note FROM {table}")).await;
    assert_eq!(applied.len(), 1, "applied exactly once");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    drop_postgres_schema(&sink).await;
}

/// Issue 10, case 4: 300 writers with random tokens race on one scope that has no fence row
/// yet, under READ COMMITTED, several per idempotency key. Every accepted token is at least
/// the one accepted before it in commit order (the ledger's serial, taken under the fence
/// lock, is that order); the fence ends at the highest accepted token; each key applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_keep_tokens_monotonic_in_commit_order() {
    let sink = sink().await;
    let table = user_table(&sink).await;
    let scope = Scope::new("hot");
    let ran = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..300u64 {
        let (sink, table, scope, ran) = (sink.clone(), table.clone(), scope.clone(), ran.clone());
        // Tokens 1..=60, five writers each (same token, same lease: one generation retrying);
        // keys shared by pairs of generations, so duplicates cross tokens too.
        let token = 1 + (i * 7919) % 60;
        let key = format!("key{}", token / 2);
        tasks.push(tokio::spawn(async move {
            insert(&sink, &table, &scope, fence(token), &key, &ran).await
        }));
    }
    let mut accepted = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(Fenced::Applied(_)) | Ok(Fenced::Duplicate(_)) | Ok(Fenced::Rejected(_)) => {}
            Err(e) => assert!(e.is_retryable(), "only transient errors allowed: {e}"),
        }
        accepted.push(());
    }
    let ledger: Vec<(i64, i64)> =
        rows(&sink, &format!("SELECT id, token FROM {table} ORDER BY id"))
            .await
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
    assert!(!ledger.is_empty());
    for pair in ledger.windows(2) {
        assert!(
            pair[0].1 <= pair[1].1,
            "token went down in commit order: {pair:?}"
        );
    }
    let keys: std::collections::HashSet<i64> = ledger.iter().map(|(_, t)| t / 2).collect();
    assert_eq!(keys.len(), ledger.len(), "a key applied twice: {ledger:?}");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        ledger.len(),
        "closures ran only for applied writes"
    );
    let highest = sink.highest(&scope).await.unwrap().unwrap();
    assert!(highest.token.as_u64() as i64 >= ledger.last().unwrap().1);
    assert_eq!(
        highest.token.as_u64(),
        60,
        "the newest generation reached the fence"
    );
    drop_postgres_schema(&sink).await;
}

#[tokio::test]
async fn bad_urls_and_schemas_are_config_errors_and_a_dead_server_is_unavailable() {
    for url in [
        "not a url",
        "postgres://postgres@127.0.0.1/test?schema=Bad-Name",
        "postgres://postgres@127.0.0.1/test?schema=",
    ] {
        let e = PostgresSink::connect(url).await.err().unwrap();
        assert!(matches!(e, Error::Config(_)), "{url}: {e}");
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = PostgresSink::connect(&format!("postgres://postgres@127.0.0.1:{port}/test"))
        .await
        .err()
        .unwrap();
    assert!(e.is_retryable(), "{e}");
}

#[tokio::test]
async fn migrations_are_versioned_and_safe_to_run_from_many_hosts_at_once() {
    let (schema, url) = fresh_postgres_schema();
    let starts = (0..6).map(|_| PostgresSink::connect(&url));
    let sinks = futures_util::future::join_all(starts).await;
    for s in &sinks {
        assert!(s.is_ok(), "{:?}", s.as_ref().err());
    }
    let sink = sinks.into_iter().next().unwrap().unwrap();
    let versions = rows(&sink, &format!("SELECT version FROM {schema}.migrations")).await;
    assert_eq!(versions.len(), 2, "each migration applied once");
    // A schema from the previous build (version 1) is upgraded in place at the next start.
    rows(&sink, &format!("DROP INDEX {schema}.outbox_delivered")).await;
    rows(
        &sink,
        &format!("DELETE FROM {schema}.migrations WHERE version = 2"),
    )
    .await;
    PostgresSink::connect(&url).await.unwrap();
    let index = rows(
        &sink,
        &format!("SELECT 1 FROM pg_indexes WHERE schemaname = '{schema}' AND indexname = 'outbox_delivered'"),
    )
    .await;
    assert_eq!(index.len(), 1, "migration 2 applied on upgrade");
    // A schema from a newer build is refused, not half-used.
    rows(
        &sink,
        &format!("INSERT INTO {schema}.migrations (version) VALUES (999)"),
    )
    .await;
    let e = PostgresSink::connect(&url).await.err().unwrap();
    assert!(
        matches!(&e, Error::Config(why) if why.contains("999")),
        "{e}"
    );
    drop_postgres_schema(&sink).await;
}

/// Issue 55: migrations an operator controls, and builds side by side. A worker that may not
/// migrate refuses a schema missing what it needs and names the command; the plan lists the
/// SQL and changes nothing; after `migrate` the worker starts. A schema a newer build moved on
/// by an added index (it says builds from version 1 run against it) still runs this build —
/// a rollback or a rolling deploy — while one it changed beyond this build's reach is
/// refused, changing nothing.
#[tokio::test]
async fn migrations_wait_for_the_operator_and_a_newer_schema_runs_older_builds_it_keeps() {
    use palisade::store::postgres::{migrate, migration_plan, Migrations};
    let (schema, url) = fresh_postgres_schema();
    let check = |url: &str| {
        let url = url.to_owned();
        async move { PostgresSink::connect_with(&url, Duration::ZERO, Migrations::Check).await }
    };
    let e = check(&url).await.err().unwrap();
    assert!(
        matches!(&e, Error::Config(why) if why.contains("version 0") && why.contains("palisade migrate --apply")),
        "{e}"
    );
    let plan = migration_plan(&url).await.unwrap();
    assert_eq!((plan.current, plan.pending.len()), (0, 2), "{plan:?}");
    assert!(plan.pending[0]
        .sql
        .contains(&format!("CREATE TABLE \"{schema}\".fence")));
    assert_eq!(
        plan.pending[1].readers_from, 1,
        "an index keeps version-1 builds running"
    );
    // The plan changed nothing: the schema is still missing.
    assert_eq!(migration_plan(&url).await.unwrap(), plan);
    let done = migrate(&url).await.unwrap();
    assert_eq!(done.pending.len(), 2);
    let sink = check(&url).await.unwrap();
    assert!(migration_plan(&url).await.unwrap().runs_as_is());

    // A newer build's migration that keeps builds from version 1 running: this build runs.
    rows(
        &sink,
        &format!("INSERT INTO {schema}.migrations (version, readers_from) VALUES (3, 1)"),
    )
    .await;
    PostgresSink::connect(&url).await.unwrap();
    check(&url).await.unwrap();
    let plan = migration_plan(&url).await.unwrap();
    assert_eq!((plan.current, plan.newer_needs), (3, Some(1)));
    // One that needs builds from version 4 on: refused, and nothing recorded.
    rows(
        &sink,
        &format!("INSERT INTO {schema}.migrations (version, readers_from) VALUES (4, 4)"),
    )
    .await;
    for e in [
        PostgresSink::connect(&url).await.err(),
        check(&url).await.err(),
    ] {
        let e = e.unwrap();
        assert!(
            matches!(&e, Error::Config(why) if why.contains("version 4") && why.contains("upgrade")),
            "{e}"
        );
    }
    let versions = rows(&sink, &format!("SELECT version FROM {schema}.migrations")).await;
    assert_eq!(versions.len(), 4);
    // Versions an earlier build recorded without readers_from are filled in at the next start.
    let unfilled = rows(
        &sink,
        &format!(
            "SELECT version FROM {schema}.migrations WHERE version <= 2 AND readers_from IS NULL"
        ),
    )
    .await;
    assert!(unfilled.is_empty());
    drop_postgres_schema(&sink).await;
}

/// The second target kind: an outbox entry becomes a Palisade job, so a job fences its
/// follow-up jobs; an entry that is not a follow-up is dead with the reason, not retried.
#[actix_rt::test]
async fn the_relay_enqueues_follow_up_jobs_and_buries_what_is_not_one() {
    use actix::Actor as _;
    let sink = sink().await;
    let store = Arc::new(MemoryLeaseStore::new());
    let pushed: Result<Fenced<()>> = sink
        .transaction(&Scope::new("order:1"), fence(1), &IdempotencyKey::new("job/ship"), |tx| {
            Box::pin(async move {
                let ship = serde_json::json!({"kind": "ship", "payload": {"order": 1}, "scope": "order:1"});
                tx.outbox("jobs").push("ship", &ship).await?;
                tx.outbox("jobs").push("bad", &serde_json::json!({"nope": 1})).await?;
                Ok(())
            })
        })
        .await;
    assert_eq!(pushed.unwrap(), Fenced::Applied(()));
    let target = OutboxTarget::Enqueue {
        client: Client::new(store.clone()),
        queue: "followups".into(),
    };
    let config = RelayConfig {
        poll: Duration::from_millis(20),
        ..RelayConfig::default()
    };
    let targets = std::collections::HashMap::from([("jobs".to_owned(), target)]);
    let _relay = OutboxRelay::new(sink.clone(), targets, config)
        .unwrap()
        .start();
    let counts = outbox_when(&sink, |c| c.pending == 0).await;
    assert_eq!((counts.delivered, counts.dead), (1, 1));
    let claims = store
        .claim("followups", "t", 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].job.kind, "ship");
    assert_eq!(claims[0].lease.scope, Scope::new("order:1"));
    // Delivered again, as after a relay that enqueued and died before it marked the entry
    // (or whose enqueue's answer never came): the same job, not a second one — its id comes
    // from the entry, while the first is still running here.
    rows(
        &sink,
        &format!(
            "UPDATE {}.outbox SET state = 'pending', next_attempt_at = now(), delivered_at = NULL \
             WHERE state = 'delivered'",
            sink.schema()
        ),
    )
    .await;
    let counts = outbox_when(&sink, |c| c.delivered == 1 && c.pending == 0).await;
    assert_eq!(counts.delivered, 1);
    let attempts: i32 = rows(
        &sink,
        &format!(
            "SELECT attempts FROM {}.outbox WHERE state = 'delivered'",
            sink.schema()
        ),
    )
    .await[0]
        .get(0);
    assert_eq!(attempts, 2, "delivered twice");
    let followups = Client::new(store.clone())
        .counts("followups")
        .await
        .unwrap();
    assert_eq!(
        (followups.ready, followups.waiting, followups.leased),
        (0, 0, 1),
        "no second follow-up job (it would wait for the first's scope)"
    );
    let more = store
        .claim("followups", "t", 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(more.is_empty(), "{more:?}");
    let why: String = rows(
        &sink,
        &format!(
            "SELECT last_error FROM {}.outbox WHERE state = 'dead'",
            sink.schema()
        ),
    )
    .await[0]
        .get(0);
    assert!(why.contains("not a follow-up job"), "{why}");
    // An operator retries it: pending again with fresh attempts (and dead again here, since
    // it still is not a follow-up job).
    let dead = sink.outbox_dead(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].2.starts_with("order:1/job/ship/"), "{dead:?}");
    assert_eq!(sink.outbox_retry_dead(10).await.unwrap(), 1);
    assert_eq!(sink.outbox_retry_dead(10).await.unwrap(), 0);
    outbox_when(&sink, |c| c.dead > 0).await;
    let again: i32 = rows(
        &sink,
        &format!(
            "SELECT attempts FROM {}.outbox WHERE state = 'dead'",
            sink.schema()
        ),
    )
    .await[0]
        .get(0);
    assert_eq!(again, 1, "the retry started from zero attempts");
    drop_postgres_schema(&sink).await;
}

#[test]
fn relay_configuration_is_checked() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sink = rt.block_on(sink());
    let http = |url: &str| {
        std::collections::HashMap::from([("t".to_owned(), OutboxTarget::Http(url.into()))])
    };
    for bad in ["ftp://x", "not a url"] {
        assert!(matches!(
            OutboxRelay::new(sink.clone(), http(bad), RelayConfig::default()),
            Err(Error::Config(_))
        ));
    }
    assert!(OutboxRelay::new(sink.clone(), Default::default(), RelayConfig::default()).is_err());
    let zero = RelayConfig {
        batch: 0,
        ..RelayConfig::default()
    };
    assert!(OutboxRelay::new(sink.clone(), http("http://x"), zero).is_err());
    assert!(OutboxRelay::new(sink.clone(), http("https://x"), RelayConfig::default()).is_ok());
    rt.block_on(drop_postgres_schema(&sink));
}

/// Issue 10 attack findings, through a real worker: `ctx.sink` writes, transactions and
/// outbox pushes of one job live in separate key namespaces (none is mistaken for a
/// duplicate of another), a fenced write to the same sink from inside a transaction's
/// closure is refused at once instead of waiting forever for its own lock, and key names
/// that could collide or break a header are refused.
#[actix_rt::test]
async fn one_job_mixing_writes_transactions_and_pushes_on_one_sink() {
    use actix::Actor as _;
    let sink = sink().await;
    let table = user_table(&sink).await;
    let coordinator = Coordinator::new(Arc::new(MemoryLeaseStore::new())).start();
    let store = PostgresFencedStore::new(sink.clone());
    let sinks = Sinks::new()
        .with("pg", FencedSink::new("pg", Arc::new(store)).start())
        .with_postgres("pg", sink.clone());
    let (tx_report, mut report) = tokio::sync::mpsc::unbounded_channel::<Vec<String>>();
    let registry = Registry::new().register("mixed", move |ctx: JobContext, _: ()| {
        let (report, table) = (tx_report.clone(), table.clone());
        async move {
            let mut seen = Vec::new();
            let handle = ctx.sink("pg")?;
            let set = vec![Mutation::Set {
                key: "k".into(),
                value: "v".into(),
            }];
            seen.push(format!("{:?}", handle.write(set).await));
            let (inner_pg, inner_sink) = (ctx.postgres("pg")?, ctx.sink("pg")?);
            let pg = ctx.postgres("pg")?;
            let tx = pg
                .transaction("0", move |tx| {
                    Box::pin(async move {
                        tx.execute(&format!("INSERT INTO {table} (token) VALUES (1)"), &[])
                            .await?;
                        let nested = tokio::time::timeout(
                            Duration::from_secs(5),
                            inner_pg.push_outbox("email", "n", &1),
                        )
                        .await;
                        let write =
                            tokio::time::timeout(Duration::from_secs(5), inner_sink.write(vec![]))
                                .await;
                        Ok(format!("{nested:?} | {write:?}"))
                    })
                })
                .await;
            seen.push(format!("{tx:?}"));
            seen.push(format!(
                "{:?}",
                pg.push_outbox("email", "0", &"receipt").await
            ));
            for bad in ["", "a/b", "line\nbreak"] {
                seen.push(format!(
                    "{:?}",
                    pg.transaction(bad, |_| Box::pin(async { Ok(()) })).await
                ));
            }
            report.send(seen).unwrap();
            Ok(())
        }
    });
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(10),
        ..WorkerConfig::new("w")
    };
    let _worker = Worker::new(config, coordinator.clone(), registry, sinks)
        .unwrap()
        .start();
    coordinator
        .send(Enqueue(vec![NewJob::raw("mixed", "null")]))
        .await
        .unwrap()
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(30), report.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen[0], "Ok(Applied)", "{seen:#?}");
    assert!(
        seen[1].starts_with("Ok(Applied(\"Ok(Err(InvalidJob("),
        "nested push refused at once: {seen:#?}"
    );
    assert!(
        seen[1].contains("| Ok(Err(InvalidJob("),
        "nested sink write refused at once: {seen:#?}"
    );
    assert_eq!(
        seen[2], "Ok(Applied(()))",
        "the push is not a duplicate of write 0: {seen:#?}"
    );
    for bad in &seen[3..] {
        assert!(bad.starts_with("Err(InvalidJob("), "{seen:#?}");
    }
    assert_eq!(sink.outbox_counts().await.unwrap().pending, 1);
    drop_postgres_schema(&sink).await;
}

/// Issue 10 attack finding 1: the fence protocol needs READ COMMITTED; a server (or role)
/// whose default is SERIALIZABLE must not change it — not for writes, not for migrations
/// run from many hosts at once.
#[tokio::test]
async fn transactions_run_read_committed_whatever_the_server_default() {
    let (_, url) = fresh_postgres_schema();
    let url = format!("{url}&options=-cdefault_transaction_isolation%3Dserializable");
    let starts = (0..4).map(|_| PostgresSink::connect(&url));
    let sinks: Vec<_> = futures_util::future::join_all(starts).await;
    for s in &sinks {
        assert!(s.is_ok(), "{:?}", s.as_ref().err());
    }
    let sink = sinks.into_iter().next().unwrap().unwrap();
    let level: Fenced<String> = sink
        .transaction(
            &Scope::new("s"),
            fence(1),
            &IdempotencyKey::new("k"),
            |tx| {
                Box::pin(async move {
                    let row = tx.query_one("SHOW transaction_isolation", &[]).await?;
                    Ok(row.get::<_, String>(0))
                })
            },
        )
        .await
        .unwrap();
    assert_eq!(level, Fenced::Applied("read committed".to_owned()));
    drop_postgres_schema(&sink).await;
}

/// Issue 10 attack finding 9: a closure that ends the transaction itself (raw COMMIT) is
/// reported, not taken for an applied write; the fence was advanced before the closure ran,
/// so even then a stale holder stays refused.
#[tokio::test]
async fn a_closure_that_commits_on_its_own_is_an_error_and_the_fence_holds() {
    let sink = sink().await;
    let scope = Scope::new("s");
    let outcome: Result<Fenced<()>> = sink
        .transaction(&scope, fence(9), &IdempotencyKey::new("k"), |tx| {
            Box::pin(async move {
                tx.batch_execute("COMMIT").await?;
                Ok(())
            })
        })
        .await;
    assert!(
        matches!(&outcome, Err(Error::Backend(why)) if why.contains("ended inside its closure")),
        "{outcome:?}"
    );
    assert_eq!(sink.highest(&scope).await.unwrap(), Some(fence(9)));
    let ran = Arc::new(AtomicUsize::new(0));
    let table = user_table(&sink).await;
    let stale = insert(&sink, &table, &scope, fence(8), "old", &ran)
        .await
        .unwrap();
    assert!(matches!(
        stale,
        Fenced::Rejected(Rejection::StaleToken { .. })
    ));
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    drop_postgres_schema(&sink).await;
}

/// Issue 10 attack finding 5: durations far beyond any sane setting do not break writes.
#[tokio::test]
async fn huge_retentions_and_watermarks_do_not_break_writes() {
    let (_, url) = fresh_postgres_schema();
    let sink = PostgresSink::connect(&url)
        .await
        .unwrap()
        .with_key_retention(Duration::MAX);
    let store = PostgresFencedStore::new(Arc::new(sink));
    let w = |t: u64| FencedWrite {
        scope: Scope::new("s"),
        fence: fence(t),
        key: IdempotencyKey::new(format!("k{t}")),
        mutations: vec![],
    };
    assert_eq!(store.write(w(5)).await.unwrap(), Admission::Applied);
    store.observe_watermark(FencingToken::from_u64(u64::MAX));
    assert!(matches!(
        store.write(w(6)).await.unwrap(),
        Admission::Rejected(Rejection::StaleToken { .. })
    ));
    drop_postgres_schema(store.sink()).await;
}

/// A receiver that answers by path: `/moved` 302 (to `/elsewhere`), `/gone` 404, `/busy` 409
/// the first time and 200 after; returns its port and the paths it got, in order.
fn picky_receiver() -> (u16, Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let paths = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = paths.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            let path = first.split(' ').nth(1).unwrap_or_default().to_owned();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                    break;
                }
            }
            let busy_before = seen.lock().unwrap().iter().any(|p: &String| p == "/busy");
            seen.lock().unwrap().push(path.clone());
            let status = match path.as_str() {
                "/moved" => "302 Found\r\nLocation: /elsewhere",
                "/gone" => "404 Not Found",
                "/busy" if !busy_before => "409 Conflict",
                _ => "200 OK",
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    (port, paths)
}

/// Issue 10 attack findings 7 and 8: a redirect is not followed (it would turn the POST into
/// a GET) and kills the entry with the reason, as a 404 does; a 409 (the receiver still
/// processes the same Idempotency-Key) is retried until it succeeds.
#[actix_rt::test]
async fn the_relay_classifies_answers_and_never_follows_redirects() {
    use actix::Actor as _;
    let sink = sink().await;
    let (port, paths) = picky_receiver();
    let targets = std::collections::HashMap::from(["moved", "gone", "busy"].map(|t| {
        (
            t.to_owned(),
            OutboxTarget::Http(format!("http://127.0.0.1:{port}/{t}")),
        )
    }));
    sink.transaction(
        &Scope::new("s"),
        fence(1),
        &IdempotencyKey::new("job/tx/k"),
        |tx| {
            Box::pin(async move {
                for target in ["moved", "gone", "busy"] {
                    tx.outbox(target).push("e", &target).await?;
                }
                Ok(())
            })
        },
    )
    .await
    .unwrap();
    let config = RelayConfig {
        poll: Duration::from_millis(20),
        backoff: Duration::from_millis(10),
        ..RelayConfig::default()
    };
    let _relay = OutboxRelay::new(sink.clone(), targets, config)
        .unwrap()
        .start();
    outbox_when(&sink, |c| c.pending == 0).await;
    let states: Vec<(String, String, i32)> = rows(
        &sink,
        &format!(
            "SELECT target, state, attempts FROM {}.outbox ORDER BY target",
            sink.schema()
        ),
    )
    .await
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect();
    assert_eq!(
        states,
        [
            ("busy".to_owned(), "delivered".to_owned(), 2),
            ("gone".to_owned(), "dead".to_owned(), 1),
            ("moved".to_owned(), "dead".to_owned(), 1),
        ]
    );
    assert!(
        !paths.lock().unwrap().contains(&"/elsewhere".to_owned()),
        "a redirect was followed"
    );
    drop_postgres_schema(&sink).await;
}

/// A failed delivery is stored with its cause, not just "error sending request": a refused
/// connection says so, and a receiver that never answers says the delivery timed out after
/// half the outbox lease — what a longer `--outbox-lease` would change.
#[actix_rt::test]
async fn a_failed_delivery_keeps_its_cause() {
    use actix::Actor as _;
    let sink = sink().await;
    // Nothing listens on `refused`; `silent` accepts and never answers.
    let [refused] = palisade_testkit::free_ports::<1>();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let targets = std::collections::HashMap::from([
        (
            "refused".to_owned(),
            OutboxTarget::Http(format!("http://127.0.0.1:{refused}/hook")),
        ),
        (
            "silent".to_owned(),
            OutboxTarget::Http(format!("http://127.0.0.1:{silent_port}/hook")),
        ),
    ]);
    sink.transaction(
        &Scope::new("s"),
        fence(1),
        &IdempotencyKey::new("job/tx/k"),
        |tx| {
            Box::pin(async move {
                tx.outbox("refused").push("e", &1).await?;
                tx.outbox("silent").push("e", &2).await?;
                Ok(())
            })
        },
    )
    .await
    .unwrap();
    let config = RelayConfig {
        poll: Duration::from_millis(20),
        lease: Duration::from_secs(1),
        backoff: Duration::from_secs(60),
        ..RelayConfig::default()
    };
    let _relay = OutboxRelay::new(sink.clone(), targets, config)
        .unwrap()
        .start();
    let errors = || async {
        rows(
            &sink,
            &format!(
                "SELECT target, coalesce(last_error, '') FROM {}.outbox ORDER BY target",
                sink.schema()
            ),
        )
        .await
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let seen = loop {
        let seen = errors().await;
        if seen.iter().all(|(_, e)| !e.is_empty()) {
            break seen;
        }
        assert!(tokio::time::Instant::now() < deadline, "{seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (refused_error, silent_error) = (&seen[0].1, &seen[1].1);
    assert!(
        refused_error.to_lowercase().contains("connection refused"),
        "{refused_error}"
    );
    assert!(
        silent_error.contains("timed out after 500ms") && silent_error.contains("outbox lease"),
        "{silent_error}"
    );
    for error in [refused_error, silent_error] {
        assert_eq!(
            error.matches("127.0.0.1").count(),
            1,
            "the URL once: {error}"
        );
    }
    drop(silent);
    drop_postgres_schema(&sink).await;
}

/// A TCP proxy in front of PostgreSQL. Once armed, it forwards the next `COMMIT` to the
/// server, swallows the server's answer and cuts the client off: the commit happened, and
/// the client cannot know. Returns the proxy's port and the arming switch.
fn commit_swallowing_proxy() -> (u16, Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::AtomicBool;
    let url = palisade_testkit::postgres_url();
    let upstream = url
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .map(|hp| {
            if hp.contains(':') {
                hp.to_owned()
            } else {
                format!("{hp}:5432")
            }
        })
        .expect("host in the test Postgres URL");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let armed = Arc::new(AtomicBool::new(false));
    let arm = armed.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { continue };
            let mut server = TcpStream::connect(&upstream).unwrap();
            let swallow = Arc::new(AtomicBool::new(false));
            let (mut to_client, mut from_server) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            let swallowing = swallow.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n @ 1..) = from_server.read(&mut buf) {
                    if swallowing.load(Ordering::SeqCst) {
                        let _ = to_client.shutdown(Shutdown::Both);
                        return;
                    }
                    if to_client.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                let _ = to_client.shutdown(Shutdown::Both);
            });
            let armed = arm.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n @ 1..) = client.read(&mut buf) {
                    // "COMMIT", or the "COMMIT; BEGIN" sent behind a key record.
                    let commit = buf[..n]
                        .windows(7)
                        .any(|w| w[..6] == *b"COMMIT" && (w[6] == 0 || w[6] == b';'));
                    if commit && armed.swap(false, Ordering::SeqCst) {
                        swallow.store(true, Ordering::SeqCst);
                    }
                    if server.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                let _ = server.shutdown(Shutdown::Both);
            });
        }
    });
    (port, armed)
}

/// Issue 10, case 3, the other way round: the COMMIT reached the server and committed, but
/// its answer was lost on the way back. The caller hears `OutcomeUnknown`; the retry with the
/// same key finds the key and returns the first run's result as `Duplicate` — the closure
/// does not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_answer_resolves_to_duplicate_on_retry() {
    let (port, armed) = commit_swallowing_proxy();
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    // The proxy reads the protocol: no TLS (the default, prefer, would encrypt it).
    let url = format!("postgres://postgres@127.0.0.1:{port}/test?schema={schema}&sslmode=disable");
    let sink = Arc::new(PostgresSink::connect(&url).await.unwrap());
    let table = user_table(&sink).await;
    let scope = Scope::new("s");
    let ran = Arc::new(AtomicUsize::new(0));
    armed.store(true, Ordering::SeqCst);
    let cut = insert(&sink, &table, &scope, fence(4), "job/pay", &ran).await;
    assert!(matches!(&cut, Err(Error::OutcomeUnknown(_))), "{cut:?}");
    assert!(
        !armed.load(Ordering::SeqCst),
        "the COMMIT went through the proxy"
    );
    let retry = insert(&sink, &table, &scope, fence(4), "job/pay", &ran)
        .await
        .unwrap();
    let Fenced::Duplicate(id) = retry else {
        panic!("the first COMMIT applied, so the retry must be a duplicate: {retry:?}")
    };
    let ids: Vec<i64> = rows(&sink, &format!("SELECT id FROM {table}"))
        .await
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        ids,
        [id],
        "applied once, and the duplicate carries its result"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    drop_postgres_schema(&sink).await;
}

/// With the default collection interval (100 ms per process) the fence table still stays
/// bounded by the live scopes: each collection takes a batch big enough to keep up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_stay_bounded_with_the_default_collection_interval() {
    let (_, url) = fresh_postgres_schema();
    let sink = Arc::new(PostgresSink::connect(&url).await.unwrap());
    let write = |token: u64| {
        let sink = sink.clone();
        async move {
            let scope = Scope::of_job(JobId::new());
            sink.transaction(&scope, fence(token), &IdempotencyKey::new("w"), |_| {
                Box::pin(async { Ok(()) })
            })
            .await
            .unwrap()
        }
    };
    for token in 1..=1500u64 {
        assert_eq!(write(token).await, Fenced::Applied(()));
        // The coordinator's watermark trails the newest token by a few in-flight leases.
        sink.observe_watermark(FencingToken::from_u64(token.saturating_sub(20)));
    }
    sink.observe_watermark(FencingToken::from_u64(1501));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(write(1501).await, Fenced::Applied(()));
    let left: i64 = rows(
        &sink,
        &format!("SELECT count(*) FROM {}.fence", sink.schema()),
    )
    .await[0]
        .get(0);
    assert!(left <= 1, "{left} fence rows left for 1 live scope");
    drop_postgres_schema(&sink).await;
}

/// Delivered entries go after their retention: the outbox stays bounded by what is pending,
/// dead or recent.
#[actix_rt::test]
async fn delivered_entries_are_pruned_after_their_retention() {
    use actix::Actor as _;
    let sink = sink().await;
    let (port, _) = picky_receiver();
    sink.transaction(
        &Scope::new("s"),
        fence(1),
        &IdempotencyKey::new("job/tx/k"),
        |tx| {
            Box::pin(async move {
                for e in ["a", "b", "c"] {
                    tx.outbox("ok").push(e, &e).await?;
                }
                Ok(())
            })
        },
    )
    .await
    .unwrap();
    let targets = std::collections::HashMap::from([(
        "ok".to_owned(),
        OutboxTarget::Http(format!("http://127.0.0.1:{port}/ok")),
    )]);
    let config = RelayConfig {
        poll: Duration::from_millis(20),
        keep_delivered: Duration::ZERO,
        ..RelayConfig::default()
    };
    let _relay = OutboxRelay::new(sink.clone(), targets, config)
        .unwrap()
        .start();
    let left = outbox_when(&sink, |c| *c == OutboxCounts::default()).await;
    assert_eq!(left, OutboxCounts::default(), "entries never pruned");
    drop_postgres_schema(&sink).await;
}

/// A sink started while its database drops the first connections (a link flapping at start, a
/// server restarting) waits for it instead of failing; a refused connection and a wrong
/// setting still fail at once, patience or not. (Found by the soak: a worker restarted on a
/// lossy link exited on "early eof" from its Postgres sink's start-up.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_started_while_its_database_drops_connections_waits_for_it() {
    use palisade_testkit::FaultProxy;
    let (schema, _) = fresh_postgres_schema();
    let proxy = FaultProxy::start(5432, 23);
    // The default sslmode (prefer): the first reply is the server's one-byte answer to the
    // TLS request, and a cut one is an end of file.
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/test?schema={schema}",
        proxy.port()
    );
    // Without patience, the first dropped connection is the answer.
    proxy.cut_next_replies(1, b"");
    let at_once = PostgresSink::connect(&url).await;
    assert!(
        matches!(&at_once, Err(Error::Unavailable(_))),
        "{:?}",
        at_once.err()
    );
    proxy.cut_next_replies(3, b"");
    let sink = PostgresSink::connect_until_ready(&url, Duration::from_secs(30))
        .await
        .expect("waited for the link");
    assert_eq!(proxy.stats().cut, 4, "every connection dropped was tried");
    sink.ping().await.unwrap();
    drop_postgres_schema(&sink).await;
    // A wrong setting is not waited for: nothing listens (refused), or the database is unknown.
    for wrong in [
        format!(
            "postgres://postgres@127.0.0.1:{}/test?sslmode=disable",
            palisade_testkit::free_port()
        ),
        "postgres://postgres@127.0.0.1:5432/no_such_database_here?sslmode=disable".to_owned(),
    ] {
        let started = std::time::Instant::now();
        let refused = PostgresSink::connect_until_ready(&wrong, Duration::from_secs(30)).await;
        assert!(refused.is_err(), "{wrong}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{wrong} waited {:?}",
            started.elapsed()
        );
    }
}
