//! What an attack review of issue 20 tried against its changes — a content refusal still
//! fences (invariant 8), settlements decided one by one, the lease entry carrying what its
//! lease holds — each kept as a regression test. "Found" marks the probes that broke the first
//! version (and what fixed it); the others held from the start. Every Redis test runs on a
//! private redis-server; Postgres tests use a fresh schema each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade::*;
use palisade_testkit::suite::{fence, set, write};
use palisade_testkit::{drop_postgres_schema, fresh_postgres_schema, RedisServer};

const TTL: Duration = Duration::from_secs(30);

fn lease_store(server: &RedisServer, prefix: &str) -> RedisLeaseStore {
    RedisLeaseStore::new(palisade::store::redis::pool(&server.url()).unwrap(), prefix)
}

// ---------------------------------------------------------------------------------------
// 9b6b60f: the lease entry's named scope
// ---------------------------------------------------------------------------------------

/// Found: a worker name is stored in each lease entry, fields split by tabs, but it was never
/// checked on the library path; worker "w\tx" made the entry's scope read "x\tacct:1", so a
/// lease whose job record was gone handed on the wrong scope and left the real one wedged, and
/// the lease listing showed a wrong scope. Now a worker name with a control character is
/// refused at the claim (and by `WorkerConfig`), before anything is written.
#[tokio::test]
async fn a_worker_name_with_a_tab_is_refused_before_anything_is_written() {
    let server = RedisServer::start();
    let store = lease_store(&server, "wt");
    store
        .enqueue(vec![NewJob::raw("k", "null").with_scope("acct:1")])
        .await
        .unwrap();
    for name in ["w\tx", "w\nx", ""] {
        let r = store.claim("default", name, 5, TTL).await;
        assert!(matches!(&r, Err(Error::Config(_))), "{name:?}: {r:?}");
    }
    let memory = MemoryLeaseStore::new();
    memory
        .enqueue(vec![NewJob::raw("k", "null")])
        .await
        .unwrap();
    assert!(matches!(
        memory.claim("default", "w\tx", 5, TTL).await,
        Err(Error::Config(_))
    ));
    assert!(store.leases(10).await.unwrap().is_empty());
    let ok = store.claim("default", "w", 5, TTL).await.unwrap();
    assert_eq!(ok.len(), 1);
    let listed = store.leases(10).await.unwrap();
    assert_eq!(
        (listed[0].scope.as_str(), listed[0].worker.as_str()),
        ("acct:1", "w")
    );
}

/// Found (older than issue 20): a capped job's slot was given back from its job record only, so
/// when the record was written over, settling or reaping ended the lease but never gave the
/// slot back — with cap 1 the kind never ran again. The lease entry now carries the capped
/// kind too (`common.lua`, `let_go`). (The queue's `leased` count still drifts by one then.)
#[tokio::test]
async fn a_capped_job_whose_record_is_gone_gives_its_slot_back() {
    let server = RedisServer::start();
    let store = lease_store(&server, "cp");
    store.set_concurrency_cap("k", Some(1)).await.unwrap();
    store
        .enqueue((0..2).map(|_| NewJob::raw("k", "null")).collect())
        .await
        .unwrap();
    let first = store.claim("default", "w", 5, TTL).await.unwrap();
    assert_eq!(first.len(), 1, "cap 1");
    let job = format!("{{cp}}:job:{}", first[0].job.id);
    server.write_over(&job, "written over");
    let r = store
        .settle(vec![(first[0].lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    assert!(store.leases(10).await.unwrap().is_empty());
    let second = store.claim("default", "w", 5, TTL).await.unwrap();
    assert_eq!(
        second.len(),
        1,
        "no lease is live, yet the capped kind cannot run: running = {:?}",
        server.cli(&["HGET", "{cp}:running", "k"])
    );
}

/// Found: a lease named twice in one batch is current only for its first settlement, but a
/// first settlement refused as corrupt did not count, so the second naming was applied and the
/// caller heard both "nothing changed, lease kept" and "settled". Now the second is stale.
#[tokio::test]
async fn a_lease_named_twice_is_current_only_for_its_first_settlement_even_if_corrupt() {
    let server = RedisServer::start();
    let store = lease_store(&server, "tw");
    store
        .enqueue(vec![NewJob::raw("k", "null").with_queue("q")])
        .await
        .unwrap();
    let c = store.claim("q", "w", 1, TTL).await.unwrap();
    server.cli(&["SET", "{tw}:q:q:dead", "not a list"]);
    let lease = c[0].lease.id;
    let r = store
        .settle(vec![
            (lease, Settlement::Dead { reason: "r".into() }),
            (lease, Settlement::completed()),
        ])
        .await
        .unwrap();
    assert!(
        matches!(&r[0], Err(Error::Backend(why)) if why.contains("PALISADE_CORRUPT")),
        "{r:?}"
    );
    assert!(
        matches!(r[1], Err(Error::LeaseNotCurrent(_))),
        "the second naming of a lease whose first settlement 'changed nothing and keeps its \
         lease' was applied: {r:?}"
    );
}

/// A scoped lease whose record is gone, and whose scope's first waiting job's record
/// is gone too: settling hands the turn past the dead entry to the next job, without a
/// script error (every key leave() writes is checked or guarded).
#[tokio::test]
async fn a_gone_record_hands_on_past_a_waiting_job_whose_record_is_gone_too() {
    let server = RedisServer::start();
    let store = lease_store(&server, "gw");
    let ids = store
        .enqueue(
            (0..3)
                .map(|_| NewJob::raw("k", "null").with_scope("s"))
                .collect(),
        )
        .await
        .unwrap();
    let first = store.claim("default", "w", 5, TTL).await.unwrap();
    assert_eq!(first[0].job.id, ids[0]);
    let job = |id: &JobId| format!("{{gw}}:job:{id}");
    server.write_over(&job(&ids[0]), "written over");
    server.cli(&["DEL", &job(&ids[1])]);
    let r = store
        .settle(vec![(first[0].lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let next = store.claim("default", "w", 5, TTL).await.unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(
        next[0].job.id, ids[2],
        "the turn skipped the gone waiting job"
    );
    // Reap does the same with the same shape (record gone, gone waiter in front).
    let more = store
        .enqueue(
            (0..2)
                .map(|_| NewJob::raw("k", "null").with_scope("s"))
                .collect(),
        )
        .await
        .unwrap();
    store
        .settle(vec![(next[0].lease.id, Settlement::completed())])
        .await
        .unwrap();
    let short = store
        .claim("default", "w", 5, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(short[0].job.id, more[0]);
    server.write_over(&job(&more[0]), "x");
    tokio::time::sleep(Duration::from_millis(200)).await;
    store.reap(10).await.unwrap();
    let last = store.claim("default", "w", 5, TTL).await.unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].job.id, more[1]);
}

/// lease_job entries of the previous version (five fields, no scope) still list with
/// their scope (from the job record), settle, cancel and reap, handing their scope's turn on.
#[tokio::test]
async fn old_format_lease_entries_still_list_settle_cancel_and_reap() {
    let server = RedisServer::start();
    let store = lease_store(&server, "of");
    let scopes = ["a", "b", "c"];
    for s in scopes {
        store
            .enqueue(
                (0..2)
                    .map(|_| NewJob::raw("k", "null").with_scope(s))
                    .collect(),
            )
            .await
            .unwrap();
    }
    let claims = store
        .claim("default", "w", 3, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(claims.len(), 3);
    for c in &claims {
        let lease = c.lease.id.to_string();
        let entry = server.cli(&["HGET", "{of}:lease_job", &lease]).unwrap();
        let fields: Vec<&str> = entry.split('\t').collect();
        assert!(
            fields.len() >= 6,
            "a scope (and an empty capped kind): {entry:?}"
        );
        let old = fields[..5].join("\t");
        server.cli(&["HSET", "{of}:lease_job", &lease, &old]);
    }
    let listed = store.leases(10).await.unwrap();
    assert_eq!(listed.len(), 3);
    for l in &listed {
        assert!(scopes.contains(&l.scope.as_str()), "{listed:?}");
        assert_eq!(l.worker, "w");
    }
    let by_scope = |s: &str| claims.iter().find(|c| c.lease.scope.as_str() == s).unwrap();
    let r = store
        .settle(vec![(by_scope("a").lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    assert_eq!(
        store.cancel(by_scope("b").job.id, "stop").await.unwrap(),
        Cancelled::Revoked
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let reaped = store.reap(10).await.unwrap();
    assert_eq!(reaped.len(), 1, "{reaped:?}");
    // Each scope's turn was handed on: a's and b's second jobs, and c's reaped job (or its
    // sibling) are claimable, one per scope.
    let next = store.claim("default", "w", 10, TTL).await.unwrap();
    let mut got: Vec<&str> = next.iter().map(|c| c.lease.scope.as_str()).collect();
    got.sort_unstable();
    assert_eq!(got, ["a", "b", "c"]);
}

// ---------------------------------------------------------------------------------------
// ddcc2ab: a content refusal still fences
// ---------------------------------------------------------------------------------------

/// One write_batch mixing, for one scope: a content refusal (own-step clash), a now-stale
/// write, a duplicate, the corrected retry of the refused key, a token conflict, an overflow
/// refusal at a newer token, a stale write behind it, and a write whose keys and fields are
/// named "refuse" (never confused with the Cluster marker).
async fn mixed_batch(sink: Arc<dyn FencedStore>, ns: &str) {
    let (l1, l2, l3, l4, l5) = (
        LeaseId::new(),
        LeaseId::new(),
        LeaseId::new(),
        LeaseId::new(),
        LeaseId::new(),
    );
    let scope = format!("{ns}s");
    let x = format!("{ns}x");
    let first = sink
        .write(write(&scope, fence(1, l1), "a", set(&x, "1")))
        .await
        .unwrap();
    assert_eq!(first, Admission::Applied);
    let clash = vec![
        Mutation::Set {
            key: x.clone(),
            value: "3".into(),
        },
        Mutation::HashSet {
            key: x.clone(),
            fields: vec![("f".into(), "v".into())],
        },
    ];
    let incr_string = vec![Mutation::HashIncr {
        key: x.clone(),
        field: "n".into(),
        by: 1,
    }];
    let refuse_named = vec![
        Mutation::Set {
            key: format!("{ns}refuse"),
            value: "v".into(),
        },
        Mutation::HashSet {
            key: format!("{ns}h"),
            fields: vec![("refuse".into(), "why".into())],
        },
    ];
    let out = sink
        .write_batch(vec![
            write(&scope, fence(3, l3), "b", clash),
            write(&scope, fence(2, l2), "a2", set(&x, "2")),
            write(&scope, fence(3, l3), "a", set(&x, "dup")),
            write(&scope, fence(3, l3), "b", set(&x, "4")),
            write(&scope, fence(3, l4), "c", set(&x, "5")),
            write(&scope, fence(4, l5), "d", incr_string),
            write(&scope, fence(3, l3), "e", set(&x, "6")),
            write(&scope, fence(4, l5), "f", refuse_named),
        ])
        .await
        .unwrap();
    let out: Vec<Admission> = out.into_iter().map(Result::unwrap).collect();
    assert!(
        matches!(out[0], Admission::Rejected(Rejection::Mutation { .. })),
        "{out:?}"
    );
    assert!(
        matches!(out[1], Admission::Rejected(Rejection::StaleToken { highest, .. }) if highest == FencingToken::from_u64(3)),
        "{out:?}"
    );
    assert_eq!(out[2], Admission::Duplicate, "{out:?}");
    assert_eq!(
        out[3],
        Admission::Applied,
        "the refusal recorded no key: {out:?}"
    );
    assert!(
        matches!(out[4], Admission::Rejected(Rejection::TokenConflict { .. })),
        "{out:?}"
    );
    assert!(
        matches!(out[5], Admission::Rejected(Rejection::Mutation { .. })),
        "{out:?}"
    );
    assert!(
        matches!(out[6], Admission::Rejected(Rejection::StaleToken { highest, .. }) if highest == FencingToken::from_u64(4)),
        "the overflow refusal at T4 fenced T3 out: {out:?}"
    );
    assert_eq!(out[7], Admission::Applied, "{out:?}");
    assert_eq!(sink.read(&x).await.unwrap(), Some(Value::Text("4".into())));
    assert_eq!(
        sink.read(&format!("{ns}refuse")).await.unwrap(),
        Some(Value::Text("v".into()))
    );
    assert_eq!(
        sink.highest(&Scope::new(scope)).await.unwrap(),
        Some(fence(4, l5))
    );
}

/// On memory and Redis.
#[tokio::test]
async fn a_batch_mixing_refusals_duplicates_and_stale_writes_of_one_scope() {
    mixed_batch(Arc::new(MemoryFencedStore::new()), "m:").await;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    mixed_batch(Arc::new(RedisFencedStore::new(pool, "mb")), "r:").await;
}

/// A fence forgotten below the watermark: a refusal under it is stale and creates
/// nothing; a refusal above it re-creates the fence, queues it, and the next watermark
/// collects it again (state stays bounded). Memory and Redis alike.
#[tokio::test]
async fn a_refusal_after_collection_recreates_a_fence_that_is_collected_again() {
    let bad = |k: &str| {
        vec![Mutation::HashSet {
            key: k.into(),
            fields: vec![],
        }]
    };
    let lease = LeaseId::new();
    // Memory.
    let mem = MemoryFencedStore::new().with_key_retention(Duration::ZERO);
    mem.write(write("s", fence(5, lease), "k5", set("d", "1")))
        .await
        .unwrap();
    mem.observe_watermark(FencingToken::from_u64(10));
    mem.write(write("o", fence(10, lease), "o", vec![]))
        .await
        .unwrap();
    assert_eq!(mem.highest(&Scope::new("s")).await.unwrap(), None);
    let r = mem
        .write(write("s", fence(7, lease), "k7", bad("d")))
        .await
        .unwrap();
    assert!(
        matches!(r, Admission::Rejected(Rejection::StaleToken { .. })),
        "{r:?}"
    );
    assert_eq!(mem.highest(&Scope::new("s")).await.unwrap(), None);
    let r = mem
        .write(write("s", fence(12, lease), "k12", bad("d")))
        .await
        .unwrap();
    assert!(
        matches!(r, Admission::Rejected(Rejection::Mutation { .. })),
        "{r:?}"
    );
    assert_eq!(
        mem.highest(&Scope::new("s")).await.unwrap(),
        Some(fence(12, lease))
    );
    mem.observe_watermark(FencingToken::from_u64(20));
    mem.write(write("p", fence(20, lease), "p", vec![]))
        .await
        .unwrap();
    mem.write(write("p", fence(21, lease), "p2", vec![]))
        .await
        .unwrap();
    assert_eq!(mem.scopes_held(), 1, "only the live scope is left");

    // Redis, looking at the keys.
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let sink = RedisFencedStore::new(pool, "rc");
    sink.write(write("s", fence(5, lease), "k5", set("d", "1")))
        .await
        .unwrap();
    sink.observe_watermark(FencingToken::from_u64(10));
    sink.write(write("o", fence(10, lease), "o", vec![]))
        .await
        .unwrap();
    assert_eq!(
        server.cli(&["EXISTS", "rc:{s}:fence"]).as_deref(),
        Some("0")
    );
    let r = sink
        .write(write("s", fence(7, lease), "k7", bad("d")))
        .await
        .unwrap();
    assert!(
        matches!(r, Admission::Rejected(Rejection::StaleToken { .. })),
        "{r:?}"
    );
    assert_eq!(
        server.cli(&["EXISTS", "rc:{s}:fence"]).as_deref(),
        Some("0")
    );
    let r = sink
        .write(write("s", fence(12, lease), "k12", bad("d")))
        .await
        .unwrap();
    assert!(
        matches!(r, Admission::Rejected(Rejection::Mutation { .. })),
        "{r:?}"
    );
    let member = format!("{:020}\ts", 12);
    assert_eq!(
        server.cli(&["ZSCORE", "rc:collect", &member]).as_deref(),
        Some("0"),
        "the re-created fence is queued for collection"
    );
    assert_eq!(
        server.cli(&["EXISTS", "rc:{s}:keys"]).as_deref(),
        Some("1"),
        "k5's key stays"
    );
    assert_eq!(
        server.cli(&["ZSCORE", "rc:{s}:keys", "k12"]).as_deref(),
        Some(""),
        "no key recorded for the refusal"
    );
    sink.observe_watermark(FencingToken::from_u64(20));
    sink.write(write("p", fence(20, lease), "p", vec![]))
        .await
        .unwrap();
    assert_eq!(
        server.cli(&["EXISTS", "rc:{s}:fence"]).as_deref(),
        Some("0")
    );
    assert_eq!(
        server.cli(&["ZSCORE", "rc:collect", &member]).as_deref(),
        Some("")
    );
}

/// A corrupt fence record (bad text, or another type) fails a would-be content
/// refusal alone: no SET, nothing queued, the batch's other write still decided.
#[tokio::test]
async fn a_corrupt_fence_record_fails_a_refused_write_without_a_change() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let sink = RedisFencedStore::new(pool, "cf");
    server.cli(&["SET", "cf:{a}:fence", "garbage"]);
    server.cli(&["RPUSH", "cf:{b}:fence", "x"]);
    let bad = vec![Mutation::HashSet {
        key: "d".into(),
        fields: vec![],
    }];
    let lease = LeaseId::new();
    let out = sink
        .write_batch(vec![
            write("a", fence(9, lease), "k", bad.clone()),
            write("b", fence(9, lease), "k", bad),
            write("c", fence(9, lease), "k", set("d", "v")),
        ])
        .await
        .unwrap();
    assert!(out[0].is_err() && out[1].is_err(), "{out:?}");
    assert_eq!(out[2].as_ref().unwrap(), &Admission::Applied);
    assert_eq!(
        server.cli(&["GET", "cf:{a}:fence"]).as_deref(),
        Some("garbage")
    );
    assert_eq!(
        server.cli(&["TYPE", "cf:{b}:fence"]).as_deref(),
        Some("list")
    );
    assert_eq!(
        server.cli(&["ZCARD", "cf:collect"]).as_deref(),
        Some("1"),
        "only c's"
    );
}

// ---------------------------------------------------------------------------------------
// ddcc2ab on Postgres: the second transaction after a failing closure
// ---------------------------------------------------------------------------------------

async fn pg_sink() -> Arc<PostgresSink> {
    let (_, url) = fresh_postgres_schema();
    Arc::new(
        PostgresSink::connect(&url)
            .await
            .expect("PostgreSQL is running")
            .with_collect_interval(Duration::ZERO),
    )
}

/// Found: after a failing closure the fence was advanced on a *second* pooled connection while
/// the first was still held; with every pooled connection in a failing transaction (one
/// systematic handler bug under load), all waited out the pool's 30 s timeout and left their
/// fences behind (invariant 8 lost). The advance now runs on the closure's own connection once
/// the rollback has freed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_closures_that_fill_the_pool_still_fence_promptly() {
    let sink = pg_sink().await;
    let n = std::thread::available_parallelism().map_or(4, |n| n.get() * 4);
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let lease = LeaseId::new();
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (sink, barrier) = (sink.clone(), barrier.clone());
            tokio::spawn(async move {
                let scope = Scope::new(format!("s{i}"));
                let outcome: Result<Fenced<()>> = sink
                    .transaction(
                        &scope,
                        fence(5, lease),
                        &IdempotencyKey::new("k"),
                        move |_tx| {
                            Box::pin(async move {
                                barrier.wait().await;
                                Err("the handler's bug".into())
                            })
                        },
                    )
                    .await;
                assert!(matches!(outcome, Err(Error::Aborted(_))), "{outcome:?}");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let took = started.elapsed();
    let mut unfenced = Vec::new();
    for i in 0..n {
        let scope = Scope::new(format!("s{i}"));
        if sink.highest(&scope).await.unwrap() != Some(fence(5, lease)) {
            unfenced.push(i);
        }
    }
    drop_postgres_schema(&sink).await;
    assert!(
        unfenced.is_empty() && took < Duration::from_secs(10),
        "{n} failing closures took {took:?}; scopes left unfenced: {unfenced:?}"
    );
}

/// Found (user misuse, older than issue 20): a closure that ends the transaction with its own
/// COMMIT and then fails was reported as `Aborted` ("everything rolled back") although its rows
/// were committed with no key, so a retry applied them again. It now gets the same error as a
/// closure that commits and succeeds: ended inside its closure, not covered by the fence.
#[tokio::test]
async fn a_closure_that_commits_then_fails_is_reported_as_ended_inside_it() {
    let sink = pg_sink().await;
    let table = format!("{}.ledger", sink.schema());
    sink.pool()
        .get()
        .await
        .unwrap()
        .batch_execute(&format!("CREATE TABLE {table} (id bigserial PRIMARY KEY)"))
        .await
        .unwrap();
    let scope = Scope::new("s");
    let lease = LeaseId::new();
    let sql = format!("INSERT INTO {table} DEFAULT VALUES; COMMIT");
    let outcome: Result<Fenced<()>> = sink
        .transaction(
            &scope,
            fence(3, lease),
            &IdempotencyKey::new("k"),
            move |tx| {
                Box::pin(async move {
                    tx.batch_execute(&sql).await?;
                    Err("failed after its own COMMIT".into())
                })
            },
        )
        .await;
    let rows = sink
        .pool()
        .get()
        .await
        .unwrap()
        .query(&format!("SELECT 1 FROM {table}"), &[])
        .await
        .unwrap()
        .len();
    drop_postgres_schema(&sink).await;
    assert_eq!(rows, 1, "the closure's own COMMIT kept its row");
    assert!(
        matches!(&outcome, Err(Error::Backend(why)) if why.contains("ended inside its closure")),
        "the caller is told the write rolled back, but its row is committed and unkeyed: \
         {outcome:?}"
    );
}

/// A content-refused Mutation write on a scope with no fence row yet, racing an older
/// holder's writes: whatever the interleaving, the fence ends at the refused write's token,
/// no key is recorded for it, and after it returns the older holder is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_refusal_on_a_fresh_scope_racing_an_older_holder() {
    let sink = pg_sink().await;
    let store = Arc::new(PostgresFencedStore::new(sink.clone()));
    let (old, new) = (LeaseId::new(), LeaseId::new());
    for round in 0..5 {
        let scope = format!("r{round}");
        let older = {
            let (store, scope) = (store.clone(), scope.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                for i in 0..5 {
                    let w = write(
                        &scope,
                        fence(1, old),
                        &format!("o{i}"),
                        set(&format!("{scope}x"), "old"),
                    );
                    out.push(store.write(w).await.unwrap());
                }
                out
            })
        };
        let bad = vec![Mutation::HashSet {
            key: format!("{scope}y"),
            fields: vec![],
        }];
        let r = store
            .write(write(&scope, fence(2, new), "n", bad))
            .await
            .unwrap();
        assert!(
            matches!(r, Admission::Rejected(Rejection::Mutation { .. })),
            "{r:?}"
        );
        let after = store
            .write(write(
                &scope,
                fence(1, old),
                "late",
                set(&format!("{scope}x"), "late"),
            ))
            .await
            .unwrap();
        assert!(
            matches!(after, Admission::Rejected(Rejection::StaleToken { .. })),
            "{after:?}"
        );
        older.await.unwrap();
        assert_eq!(
            store.highest(&Scope::new(scope.clone())).await.unwrap(),
            Some(fence(2, new))
        );
        let retry = store
            .write(write(
                &scope,
                fence(2, new),
                "n",
                set(&format!("{scope}y"), "ok"),
            ))
            .await
            .unwrap();
        assert_eq!(retry, Admission::Applied, "the refusal recorded no key");
    }
    drop_postgres_schema(&sink).await;
}
