//! The last step of a fenced Postgres transaction — the key record and the COMMIT sent
//! together, the record guarded (division by zero) outside the transaction that took the
//! fence lock — under every plan mode, a deferred constraint refusing the COMMIT, a closure
//! that swallows a failed statement, and a closure that writes our own key table. Each
//! refusal must leave nothing applied and still fence older leases out, and the connection
//! handed back must be idle with no warning in the server's log. Written by an attack review
//! of that change (its two refusal cases failed before the fix).
//!
//! Each test runs in a schema of its own on one pooled connection (`pool_size=1`), so the
//! connection a write hands back is the one the next write gets, and its backend can be
//! watched from a second, plain connection (`pg_stat_activity`) and in the server's log.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade::*;
use palisade_testkit::{drop_postgres_schema, fresh_postgres_schema, postgres_url};

const SERVER_LOG: &str = "/var/log/postgresql/postgresql-15-main.log";

fn fence(token: u64) -> Fence {
    Fence {
        token: FencingToken::from_u64(token),
        lease: LeaseId::from(uuid::Uuid::from_u128(u128::from(token))),
    }
}

/// A sink on one connection, with extra libpq `options` (URL-encoded) if any.
async fn one_connection_sink(options: &str) -> Arc<PostgresSink> {
    let (_, url) = fresh_postgres_schema();
    let url = if options.is_empty() {
        format!("{url}&pool_size=1")
    } else {
        format!("{url}&pool_size=1&options={options}")
    };
    Arc::new(
        PostgresSink::connect(&url)
            .await
            .expect("PostgreSQL is running"),
    )
}

/// A one-connection sink and a `ledger` table in its schema.
async fn ledger_sink() -> (Arc<PostgresSink>, String) {
    let sink = one_connection_sink("").await;
    let table = format!("{}.ledger", sink.schema());
    exec(
        &sink,
        &format!("CREATE TABLE {table} (id bigserial PRIMARY KEY, token bigint, note text)"),
    )
    .await;
    (sink, table)
}

/// A plain connection beside the sink's pool, for watching the sink's backend.
async fn watcher() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// The state of backend `pid` a moment after its last request (the guard's ROLLBACK is sent
/// without waiting for its answer).
async fn backend_state(watch: &tokio_postgres::Client, pid: i32) -> String {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let row = watch
        .query_one(
            "SELECT coalesce(state, '?') FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap();
    row.get(0)
}

/// Where the server log ends now (None: not readable here, the log checks are skipped).
fn log_mark() -> Option<u64> {
    std::fs::metadata(SERVER_LOG).ok().map(|m| m.len())
}

/// Lines of the server log written since `mark` by backend `pid` that contain `what`.
fn log_lines(mark: Option<u64>, pid: i32, what: &str) -> Option<Vec<String>> {
    use std::io::{Read, Seek, SeekFrom};
    let mark = mark?;
    let mut f = std::fs::File::open(SERVER_LOG).ok()?;
    f.seek(SeekFrom::Start(mark)).ok()?;
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    let tag = format!("[{pid}]");
    Some(
        text.lines()
            .filter(|l| l.contains(&tag) && l.contains(what))
            .map(str::to_owned)
            .collect(),
    )
}

async fn exec(sink: &PostgresSink, sql: &str) {
    sink.pool()
        .get()
        .await
        .unwrap()
        .batch_execute(sql)
        .await
        .unwrap();
}

async fn count(sink: &PostgresSink, sql: &str) -> i64 {
    sink.pool()
        .get()
        .await
        .unwrap()
        .query_one(sql, &[])
        .await
        .unwrap()
        .get(0)
}

/// The sink's backend pid, through an applied fenced transaction.
async fn sink_pid(sink: &PostgresSink, scope: &Scope, f: Fence, key: &str) -> i32 {
    let pid: Fenced<i32> = sink
        .transaction(scope, f, &IdempotencyKey::new(key), |tx| {
            Box::pin(async move {
                Ok(tx
                    .query_one("SELECT pg_backend_pid()", &[])
                    .await?
                    .get::<_, i32>(0))
            })
        })
        .await
        .unwrap();
    match pid {
        Fenced::Applied(pid) => pid,
        other => panic!("{other:?}"),
    }
}

/// One ledger row under `f`, keyed `key`.
async fn insert(
    sink: &PostgresSink,
    table: &str,
    scope: &Scope,
    f: Fence,
    key: &str,
) -> Result<Fenced<()>> {
    let sql = format!(
        "INSERT INTO {table} (token, note) VALUES ({}, '{key}')",
        f.token.as_u64()
    );
    fenced_sql(sink, scope, f, key, sql).await
}

/// A fenced transaction under `f`, keyed `key`, whose closure runs `sql`.
async fn fenced_sql(
    sink: &PostgresSink,
    scope: &Scope,
    f: Fence,
    key: &str,
    sql: String,
) -> Result<Fenced<()>> {
    sink.transaction(scope, f, &IdempotencyKey::new(key), move |tx| {
        Box::pin(async move {
            tx.batch_execute(&sql).await?;
            Ok(())
        })
    })
    .await
}

/// The record's guard must fire whatever plan the server picks for the prepared record
/// statement: custom plans (the first five executions, `$5` a constant), the generic plan
/// (from the sixth, `$5` a parameter), and forced either way. Each sink runs a dozen applied
/// writes on its one connection first, then two closures that end the transaction and begin
/// another: their second transaction must roll back, the error must say so, and the
/// connection must come back idle, with no WARNING in the server log for any of it.
#[tokio::test]
async fn the_guard_holds_under_every_plan_and_leaves_the_connection_idle() {
    let watch = watcher().await;
    for mode in ["auto", "force_generic_plan", "force_custom_plan"] {
        let mark = log_mark();
        let sink = one_connection_sink(&format!("-cplan_cache_mode%3D{mode}")).await;
        let table = format!("{}.ledger", sink.schema());
        exec(
            &sink,
            &format!("CREATE TABLE {table} (id bigserial PRIMARY KEY, token bigint, note text)"),
        )
        .await;
        let scope = Scope::new("s");
        let pid = sink_pid(&sink, &scope, fence(1), "pid").await;
        for i in 0..12 {
            let done = insert(&sink, &table, &scope, fence(1), &format!("ok{i}")).await;
            assert!(
                matches!(done, Ok(Fenced::Applied(()))),
                "{mode} {i}: {done:?}"
            );
        }
        assert_eq!(
            backend_state(&watch, pid).await,
            "idle",
            "{mode}: after applied writes"
        );
        for end in ["COMMIT", "ROLLBACK"] {
            let sql =
                format!("{end}; BEGIN; INSERT INTO {table} (token, note) VALUES (1, 'outside')");
            let outcome = fenced_sql(&sink, &scope, fence(1), &format!("bad-{end}"), sql).await;
            assert!(
                matches!(&outcome, Err(Error::Backend(why)) if why.contains("ended inside")),
                "{mode} {end}: {outcome:?}"
            );
            assert_eq!(backend_state(&watch, pid).await, "idle", "{mode} {end}");
        }
        let outside = count(
            &sink,
            &format!("SELECT count(*) FROM {table} WHERE note = 'outside'"),
        )
        .await;
        assert_eq!(outside, 0, "{mode}: work outside the fence lock committed");
        let after = insert(&sink, &table, &scope, fence(1), "after").await;
        assert!(
            matches!(after, Ok(Fenced::Applied(()))),
            "{mode}: {after:?}"
        );
        let keys = count(
            &sink,
            &format!("SELECT count(*) FROM {}.keys", sink.schema()),
        )
        .await;
        assert_eq!(keys, 14, "{mode}: pid + 12 + after");
        if let Some(warnings) = log_lines(mark, pid, "WARNING") {
            assert!(warnings.is_empty(), "{mode}: {warnings:#?}");
        }
        drop_postgres_schema(&sink).await;
    }
}

/// A deferred constraint refuses the closure's work at COMMIT, which now goes out behind the
/// key record as `COMMIT; BEGIN`. Expected: a permanent error (nothing committed, so not
/// OutcomeUnknown), no key, an idle connection — and, as for any write refused for its content
/// after passing the ownership checks (ARCHITECTURE.md §4, step 5), the fence advanced to
/// its token so that an older holder is refused afterwards.
#[tokio::test]
async fn a_commit_refused_by_a_deferred_constraint_applies_nothing_and_still_fences() {
    let watch = watcher().await;
    let mark = log_mark();
    let sink = one_connection_sink("").await;
    let s = sink.schema();
    let table = format!("{s}.ledger");
    exec(
        &sink,
        &format!(
            "CREATE TABLE {s}.parent (id int PRIMARY KEY);
             CREATE TABLE {table} (id bigserial PRIMARY KEY, token bigint, note text,
                 parent int REFERENCES {s}.parent DEFERRABLE INITIALLY DEFERRED)"
        ),
    )
    .await;
    let scope = Scope::new("s");
    let pid = sink_pid(&sink, &scope, fence(1), "pid").await;
    let sql = format!("INSERT INTO {table} (token, note, parent) VALUES (5, 'orphan', 42)");
    let outcome = fenced_sql(&sink, &scope, fence(5), "k", sql).await;
    assert!(
        matches!(&outcome, Err(Error::Backend(why)) if why.contains("23503")),
        "{outcome:?}"
    );
    assert_eq!(backend_state(&watch, pid).await, "idle");
    assert_eq!(
        count(&sink, &format!("SELECT count(*) FROM {table}")).await,
        0
    );
    assert_eq!(
        count(
            &sink,
            &format!("SELECT count(*) FROM {s}.keys WHERE key = 'k'")
        )
        .await,
        0
    );
    let warnings = log_lines(mark, pid, "WARNING");
    eprintln!("server WARNINGs from the sink's backend after the refused COMMIT: {warnings:#?}");
    assert_fenced_at_5_and_drop(&sink, &table, &scope).await;
}

/// The refused token-5 write still fences: the fence is at 5 and an older holder (token 4)
/// is refused. Drops the schema first, so a failure leaves nothing behind.
async fn assert_fenced_at_5_and_drop(sink: &PostgresSink, table: &str, scope: &Scope) {
    let highest = sink.highest(scope).await.unwrap();
    let older = insert(sink, table, scope, fence(4), "older").await;
    drop_postgres_schema(sink).await;
    assert!(
        highest == Some(fence(5)) && matches!(older, Ok(Fenced::Rejected(_))),
        "the refused write did not fence older leases out: fence {highest:?}, then the \
         older holder's write: {older:?}"
    );
}

/// A closure that catches a failed statement and returns Ok leaves the transaction aborted:
/// the record fails (25P02), the COMMIT behind it rolls back, nothing is applied — and the
/// write, refused for its content after passing the ownership checks, should still fence
/// older leases out (step 5), as a closure returning the same error does.
#[tokio::test]
async fn a_closure_that_swallows_a_failed_statement_applies_nothing_and_still_fences() {
    let watch = watcher().await;
    let (sink, table) = ledger_sink().await;
    let scope = Scope::new("s");
    let pid = sink_pid(&sink, &scope, fence(1), "pid").await;
    let ins = format!("INSERT INTO {table} (token, note) VALUES (5, 'swallowed')");
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let outcome: Result<Fenced<String>> = sink
        .transaction(&scope, fence(5), &IdempotencyKey::new("k"), move |tx| {
            Box::pin(async move {
                r.fetch_add(1, Ordering::SeqCst);
                tx.batch_execute(&ins).await?;
                let caught = tx.execute("SELECT * FROM no_such_table", &[]).await;
                Ok(format!("caught: {}", caught.is_err()))
            })
        })
        .await;
    eprintln!("outcome: {outcome:?}");
    assert!(!matches!(outcome, Ok(Fenced::Applied(_))), "{outcome:?}");
    assert_eq!(backend_state(&watch, pid).await, "idle");
    assert_eq!(
        count(&sink, &format!("SELECT count(*) FROM {table}")).await,
        0
    );
    assert_fenced_at_5_and_drop(&sink, &table, &scope).await;
}

/// The record's `Ok(0)` arm: the key is already there in the fenced transaction itself (only a
/// closure writing the sink's own `keys` table does that). The `COMMIT` behind the record has
/// then committed the closure's work under the fence, and the caller hears an error saying
/// so. Documents the behaviour.
#[tokio::test]
async fn a_closure_that_records_our_own_key_commits_and_is_reported() {
    let (sink, table) = ledger_sink().await;
    let s = sink.schema();
    let scope = Scope::new("s");
    let sql = format!(
        "INSERT INTO {table} (token, note) VALUES (5, 'mine');
         INSERT INTO {s}.keys (scope, key, token) VALUES ('s', 'k', 5)"
    );
    let outcome = fenced_sql(&sink, &scope, fence(5), "k", sql).await;
    let committed = count(&sink, &format!("SELECT count(*) FROM {table}")).await;
    drop_postgres_schema(&sink).await;
    eprintln!("outcome {outcome:?}, rows committed {committed}");
    assert!(matches!(&outcome, Err(Error::Backend(_))), "{outcome:?}");
    assert_eq!(
        committed, 1,
        "the Ok(0) arm commits (the COMMIT went out behind the record)"
    );
}
