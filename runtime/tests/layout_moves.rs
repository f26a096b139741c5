//! What an attack review of issue 20's layout moves (`palisade partitions`: the layout
//! generation, `store::redis::move_layout`, `store::partitioned::migrate`) tried, kept as
//! regression tests. "Found" marks the probes that broke the first version and what fixed
//! it; the others held from the start. Each test runs on its own private redis-server.

use std::sync::Arc;
use std::time::Duration;

use palisade::store::partitioned::{migrate, PartitionedLeaseStore};
use palisade::store::redis::{
    check_layout, coordinator, layout_prefixes, move_layout, partition_prefixes, Pool,
};
use palisade::{
    ControlStore, Error, Inspect, LeaseStore, MemoryLeaseStore, NewJob, QueueAdmin, RateLimit,
    RedisLeaseStore, Schedule, Settlement, Stores, DEFAULT_MAX_PAYLOAD_BYTES,
};
use palisade_testkit::RedisServer;

const TTL: Duration = Duration::from_secs(30);

fn layout_refusal(e: &Error) -> bool {
    matches!(e, Error::Layout(why) if why.contains("PALISADE_LAYOUT"))
}

fn layout(pool: &Pool, prefix: &str, partitions: usize, generation: u64) -> Stores {
    coordinator(
        pool.clone(),
        prefix,
        partitions,
        generation,
        DEFAULT_MAX_PAYLOAD_BYTES,
        |s| s,
    )
    .unwrap()
}

fn spec(name: &str) -> palisade::ScheduleSpec {
    Schedule::new(name, "* * * * *", NewJob::raw("k", "null"))
        .unwrap()
        .spec()
        .clone()
}

fn limit(jobs: u32) -> RateLimit {
    RateLimit {
        jobs,
        per: Duration::from_secs(1),
    }
}

/// Runs one job of `queue` through `store` so that the queue is known (`queues()`).
async fn run_one(store: &dyn LeaseStore, queue: &str) {
    store
        .enqueue(vec![NewJob::raw("k", "null").with_queue(queue)])
        .await
        .unwrap();
    let c = store.claim(queue, "w", 1, TTL).await.unwrap().remove(0);
    store
        .settle(vec![(c.lease.id, Settlement::completed())])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
}

/// The control state a migration must carry: schedule "tick" (mark 60 000), queue "q"
/// paused and limited to 6/s, kind "k" capped at 6.
async fn plant_control_state(old: &(impl LeaseStore + ControlStore + QueueAdmin)) {
    run_one(old, "q").await;
    old.put_schedule(spec("tick")).await.unwrap();
    old.advance_schedule("tick", 60_000).await.unwrap();
    old.set_paused("q", true).await.unwrap();
    old.set_rate_limit("q", Some(limit(6))).await.unwrap();
    old.set_concurrency_cap("k", Some(6)).await.unwrap();
}

/// What of `plant_control_state`'s state `new` lacks (empty: all there). Pauses are asked of
/// every partition: a queue paused in some partitions only is half stopped.
async fn missing_control_state(
    pool: &Pool,
    prefix: &str,
    partitions: usize,
    generation: u64,
) -> Vec<String> {
    let new = layout(pool, prefix, partitions, generation);
    let mut missing = Vec::new();
    let names: Vec<String> = new
        .schedules()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    if names != ["tick"] {
        missing.push(format!("schedules {names:?}"));
    }
    let mark = new.schedule_mark("tick").await.unwrap();
    if mark != Some(60_000) {
        missing.push(format!("mark {mark:?}"));
    }
    for base in layout_prefixes(prefix, partitions, generation) {
        let part = RedisLeaseStore::new(pool.clone(), &base).with_layout_generation(generation);
        if !part.paused().await.unwrap().contains(&"q".to_string()) {
            missing.push(format!("q not paused in {base}"));
        }
        if part.rate_limit("q").await.unwrap().is_none() {
            missing.push(format!("q unlimited in {base}"));
        }
        if part.concurrency_cap("k").await.unwrap().is_none() {
            missing.push(format!("k uncapped in {base}"));
        }
    }
    let rate = new.rate_limit("q").await.unwrap();
    if rate != Some(limit(6)) {
        missing.push(format!("rate limit {rate:?}"));
    }
    let caps = new.concurrency_caps().await.unwrap();
    if caps != [("k".to_string(), 6)] {
        missing.push(format!("caps {caps:?}"));
    }
    missing
}

/// Found: layouts of two partition counts could share bases (`partition_prefixes("mv", 2)`
/// and `("mv", 3)` share `mv-p0.2`, the control partition), and the migration's clearing of
/// the old layout then deleted what it had just carried there. Every move now goes to bases
/// of the next generation (`layout_prefixes`), which no earlier layout used.
#[tokio::test]
async fn a_move_between_layouts_that_share_a_partition_keeps_the_control_state() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let (from, to) = (2, 3);
    let shared: Vec<String> = partition_prefixes("mv", from)
        .into_iter()
        .filter(|p| partition_prefixes("mv", to).contains(p))
        .collect();
    assert!(
        !shared.is_empty(),
        "the probe needs counts whose plain bases coincide"
    );
    for base in layout_prefixes("mv", to, 1) {
        assert!(!partition_prefixes("mv", from).contains(&base), "{base}");
    }
    assert_eq!(check_layout(&pool, "mv", from).await.unwrap(), 0);
    plant_control_state(&layout(&pool, "mv", from, 0)).await;
    move_layout(&pool, "mv", from, to, |s| s).await.unwrap();
    let generation = check_layout(&pool, "mv", to).await.unwrap();
    let missing = missing_control_state(&pool, "mv", to, generation).await;
    assert!(
        missing.is_empty(),
        "moving {from} -> {to} (shared bases {shared:?}) lost: {missing:?}"
    );
}

/// Found: a `partitions` run that died after the migration but before the records were
/// written had already emptied the old layout, so the obvious rerun found nothing to carry and
/// cleared the new layout too. The old layout is now only read until the new one is recorded.
#[tokio::test]
async fn rerunning_a_move_that_died_after_migrating_keeps_the_control_state() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let (from, to) = (1, 2);
    assert_eq!(check_layout(&pool, "cr", from).await.unwrap(), 0);
    plant_control_state(&layout(&pool, "cr", from, 0)).await;
    // What move_locked did before it died: stamp, migrate.
    for base in layout_prefixes("cr", to, 1) {
        server.cli(&["SET", &format!("{{{base}}}:layout"), "1"]);
    }
    for base in partition_prefixes("cr", from) {
        server.cli(&["SET", &format!("{{{base}}}:layout"), "retired:1"]);
    }
    migrate(&layout(&pool, "cr", from, 0), &layout(&pool, "cr", to, 1))
        .await
        .unwrap();
    // The operator runs it again.
    move_layout(&pool, "cr", from, to, |s| s).await.unwrap();
    let generation = check_layout(&pool, "cr", to).await.unwrap();
    let missing = missing_control_state(&pool, "cr", to, generation).await;
    assert!(missing.is_empty(), "the rerun lost: {missing:?}");
}

/// Found: both layouts were stamped with the same generation and the two records were read
/// and written one at a time, so a process could pair the old number of partitions with the
/// new generation and run the retired layout (its schedules firing beside the new one's). Now
/// the old bases are stamped retired, each generation has bases of its own, and the records
/// are written in one MSET and read in one MGET. Here a run that died between the two
/// writes is simulated: even then, such a process is refused.
#[tokio::test]
async fn a_process_of_the_old_partition_count_never_runs_the_new_generation() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    assert_eq!(check_layout(&pool, "sb", 1).await.unwrap(), 0);
    move_layout(&pool, "sb", 1, 2, |s| s).await.unwrap();
    // The run died after `SET {sb}:generation 1`, before `record_layout` (or: a process read
    // the partitions record before it changed and the generation after).
    server.cli(&["SET", "{sb}:partitions", "1"]);
    let stale = match check_layout(&pool, "sb", 1).await {
        Ok(generation) => generation,
        Err(_) => return, // refused at start: fine
    };
    let old = layout(&pool, "sb", 1, stale);
    let enqueued = old.enqueue(vec![NewJob::raw("k", "null")]).await;
    assert!(
        enqueued.is_err(),
        "a process of the retired 1-partition layout at generation {stale} enqueued a job no \
         2-partition worker will ever claim"
    );
}

/// Found: the same hole without any crash — processes starting while moves ran (here 60
/// moves 1 <-> 2, a checker per partition count looping check_layout) were handed the other
/// layout's generation in about 4 % of the checks. Layout 1 runs the even generations,
/// layout 2 the odd ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_racing_a_move_never_gets_the_other_layouts_generation() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    check_layout(&pool, "rc", 1).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let checkers: Vec<_> = [1usize, 2]
        .into_iter()
        .map(|p| {
            let (pool, stop) = (pool.clone(), stop.clone());
            tokio::spawn(async move {
                let mut wrong = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(g) = check_layout(&pool, "rc", p).await {
                        if (g % 2 == 1) != (p == 2) {
                            wrong.push((p, g));
                        }
                    }
                }
                wrong
            })
        })
        .collect();
    for i in 0..60 {
        let (from, to) = if i % 2 == 0 { (1, 2) } else { (2, 1) };
        move_layout(&pool, "rc", from, to, |s| s).await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let mut wrong = Vec::new();
    for checker in checkers {
        wrong.extend(checker.await.unwrap());
    }
    assert!(
        wrong.is_empty(),
        "{} starts got the other layout's generation, e.g. (partitions, generation) {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
}

/// Found: the next generation was `was + 1` unchecked: u64::MAX panicked in a debug build with
/// the lock held (every run refused until it expired) and wrapped to 0 in release.
#[tokio::test]
async fn the_largest_generation_is_refused_cleanly() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    server.cli(&["SET", "{ov}:generation", &u64::MAX.to_string()]);
    let moved = tokio::spawn({
        let pool = pool.clone();
        async move { move_layout(&pool, "ov", 1, 2, |s| s).await.map(drop) }
    })
    .await;
    assert!(matches!(moved, Ok(Err(_))), "{moved:?}");
    assert_eq!(server.cli(&["EXISTS", "{ov}:moving"]).as_deref(), Some("0"));
    assert_ne!(server.cli(&["GET", "{ov}:layout"]).as_deref(), Some("0"));
}

/// Found: a settlement refused while a move had stamped the bases was `Error::Config`, which a
/// worker gives up, so when the move was then undone (the job was still running) the job was
/// reaped as a stall and ran again. A move is now refused before it stamps anything while the
/// old layout holds a job, and the refusal is `Error::Layout`, which is retryable: the
/// worker keeps the settlement and it goes through once the move is undone. (The stamp is
/// made by hand here, as if the job had been claimed between the check and the stamp.)
#[tokio::test]
async fn a_settlement_refused_by_a_move_that_is_undone_does_not_run_the_job_again() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    assert_eq!(check_layout(&pool, "fl", 1).await.unwrap(), 0);
    let old = RedisLeaseStore::new(pool.clone(), "fl").with_layout_generation(0);
    old.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap();
    let c = old
        .claim("default", "w", 1, Duration::from_millis(400))
        .await
        .unwrap()
        .remove(0);
    let stamp = |generation: &str| {
        for base in partition_prefixes("fl", 1) {
            server.cli(&["SET", &format!("{{{base}}}:layout"), generation]);
        }
    };
    // move_locked: the old layout retired ...
    stamp("retired:1");
    // ... the worker finishes the job and settles, as a worker does ...
    let settled = old
        .settle(vec![(c.lease.id, Settlement::completed())])
        .await;
    // ... migrate refuses (a job is running) and move_locked stamps the old generation back.
    stamp("0");
    match &settled {
        // What the worker does (worker.rs): a retryable error is retried, anything else given up.
        Err(e) if e.is_retryable() => {
            old.settle(vec![(c.lease.id, Settlement::completed())])
                .await
                .unwrap()
                .remove(0)
                .unwrap();
        }
        Err(e) => eprintln!("the worker gives the settlement up: {e}"),
        Ok(_) => {}
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let reaped = old.reap(10).await.unwrap();
    let again = old.claim("default", "w", 1, TTL).await.unwrap();
    assert!(
        reaped.is_empty() && again.is_empty(),
        "a move that was refused made a completed job run again (reaped {reaped:?}, claimed \
         again: {})",
        again.len()
    );
}

/// Found: a rate limit on a queue that had never had a job was not carried (a migration walks
/// the queues, and only a job listed one). Setting a limit now lists its queue.
#[tokio::test]
async fn a_rate_limit_on_a_queue_without_jobs_is_carried() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    assert_eq!(check_layout(&pool, "rl", 1).await.unwrap(), 0);
    let old = RedisLeaseStore::new(pool.clone(), "rl");
    old.set_rate_limit("fresh", Some(limit(5))).await.unwrap();
    move_layout(&pool, "rl", 1, 2, |s| s).await.unwrap();
    let new = layout(&pool, "rl", 2, check_layout(&pool, "rl", 2).await.unwrap());
    let old_after = RedisLeaseStore::new(pool.clone(), "rl")
        .rate_limit("fresh")
        .await
        .unwrap();
    assert_eq!(
        (new.rate_limit("fresh").await.unwrap(), old_after),
        (Some(limit(5)), None),
        "(new, old) rate limit of a queue without jobs after the move"
    );
}

/// The memory store's side of the previous test.
#[tokio::test]
async fn a_rate_limit_on_a_queue_without_jobs_is_carried_in_memory() {
    let old = Stores::from(Arc::new(MemoryLeaseStore::new()));
    let parts: Vec<Stores> = (0..2)
        .map(|_| Arc::new(MemoryLeaseStore::new()).into())
        .collect();
    let new = Stores::from(PartitionedLeaseStore::new(parts).unwrap());
    old.set_rate_limit("fresh", Some(limit(5))).await.unwrap();
    migrate(&old, &new).await.unwrap();
    palisade::store::partitioned::retire(&old).await;
    assert_eq!(
        (
            new.rate_limit("fresh").await.unwrap(),
            old.rate_limit("fresh").await.unwrap()
        ),
        (Some(limit(5)), None)
    );
}

// ---- probes that held (regression tests) ----

/// claim.lua's `n = #ARGV - first_lease` and renew.lua's `#ARGV - 1` with the generation as
/// the last ARGV: a claim mints exactly the leases asked for (any k), the generation is never
/// taken for a lease id, renew renews every lease it is given, the last one included, and
/// reports exactly the unknown ones.
#[tokio::test]
async fn claims_and_renewals_count_their_arguments_without_the_generation() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let store = RedisLeaseStore::new(pool.clone(), "cl").with_layout_generation(0);
    let jobs = (0..5)
        .map(|_| NewJob::raw("a", "null"))
        .chain((0..2).map(|_| NewJob::raw("b", "null")))
        .collect();
    store.enqueue(jobs).await.unwrap();
    let three = store.claim("default", "w", 3, TTL).await.unwrap();
    assert_eq!(three.len(), 3);
    let one_b = store
        .claim_kinds("default", &["b".to_string()], "w", 1, TTL)
        .await
        .unwrap();
    assert_eq!(one_b.len(), 1);
    assert_eq!(one_b[0].job.kind, "b");
    let both = store
        .claim_kinds("default", &["a".to_string(), "b".to_string()], "w", 2, TTL)
        .await
        .unwrap();
    assert_eq!(both.len(), 2);
    let rest = store.claim("default", "w", 10, TTL).await.unwrap();
    assert_eq!(rest.len(), 1);
    let mut ids: Vec<_> = three
        .iter()
        .chain(&one_b)
        .chain(&both)
        .chain(&rest)
        .map(|c| c.lease.id)
        .collect();
    assert_eq!(
        store.leases(100).await.unwrap().len(),
        7,
        "one lease per job, none extra"
    );
    assert!(store
        .claim("default", "w", 1, TTL)
        .await
        .unwrap()
        .is_empty());
    let unknown = palisade::LeaseId::new();
    ids.push(unknown);
    assert_eq!(store.renew(&ids, TTL).await.unwrap(), [unknown]);
    ids.pop();
    ids.insert(0, unknown);
    assert_eq!(store.renew(&ids, TTL).await.unwrap(), [unknown]);
    let last = *ids.last().unwrap();
    assert!(store.renew(&[last], TTL).await.unwrap().is_empty());
    // A short renewal of the last lease only: it alone expires.
    store
        .renew(&[last], Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let reaped = store.reap(10).await.unwrap();
    assert_eq!(reaped.len(), 1);
}

/// A `{base}layout` key of another type (a hash) refuses every checked script, and they change
/// nothing; HOLD_ROLE and ADVANCE_SCHEDULE fail too. A move writes over it (SET) and works.
#[tokio::test]
async fn a_layout_key_of_another_type_refuses_everything_and_changes_nothing() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let store = RedisLeaseStore::new(pool.clone(), "wt").with_layout_generation(0);
    store.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap();
    server.cli(&["HSET", "{wt}:layout", "gen", "0"]);
    let before = snapshot(&server);
    let lease = palisade::LeaseId::new();
    assert!(layout_refusal(
        &store
            .enqueue(vec![NewJob::raw("k", "null")])
            .await
            .unwrap_err()
    ));
    assert!(layout_refusal(
        &store.claim("default", "w", 1, TTL).await.unwrap_err()
    ));
    assert!(layout_refusal(
        &store.renew(&[lease], TTL).await.unwrap_err()
    ));
    assert!(layout_refusal(
        &store
            .settle(vec![(lease, Settlement::completed())])
            .await
            .unwrap_err()
    ));
    assert!(layout_refusal(&store.reap(10).await.unwrap_err()));
    assert!(store.hold_role("scheduler", "me", TTL).await.is_err());
    assert!(store.advance_schedule("tick", 1).await.is_err());
    assert_eq!(snapshot(&server), before);
    // Drain, then a move writes the stamp over.
    server.cli(&["DEL", "{wt}:layout"]);
    let c = store.claim("default", "w", 1, TTL).await.unwrap().remove(0);
    store
        .settle(vec![(c.lease.id, Settlement::completed())])
        .await
        .unwrap();
    server.cli(&["HSET", "{wt}:layout", "gen", "0"]);
    move_layout(&pool, "wt", 1, 2, |s| s).await.unwrap();
    assert_eq!(
        server.cli(&["GET", "{wt}:layout"]).as_deref(),
        Some("retired:1")
    );
}

/// A generation record that is not a plain number: check_layout says so (Backend), a move is
/// refused before it stamps anything, and the lock is given back.
#[tokio::test]
async fn a_generation_record_that_is_not_a_number_stops_every_start_and_every_move() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    for odd in ["abc", "1.5", "-1", ""] {
        server.cli(&["SET", "{ng}:generation", odd]);
        assert!(
            matches!(check_layout(&pool, "ng", 1).await, Err(Error::Backend(_))),
            "{odd:?}"
        );
        assert!(move_layout(&pool, "ng", 1, 2, |s| s).await.is_err());
        assert_eq!(server.cli(&["EXISTS", "{ng}:moving"]).as_deref(), Some("0"));
        assert_eq!(server.cli(&["EXISTS", "{ng}:layout"]).as_deref(), Some("0"));
    }
}

/// A move that fails late — the old layout's cap record does not decode, after schedules,
/// pauses and limits were already written to `new` — gives the old generation back, leaves the
/// old layout whole and working, and the next move (after the repair) ends with exactly the
/// old state in `new`, nothing of the failed run's left in `old`.
#[tokio::test]
async fn a_move_that_fails_late_leaves_the_old_layout_whole() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    assert_eq!(check_layout(&pool, "hf", 1).await.unwrap(), 0);
    let old = RedisLeaseStore::new(pool.clone(), "hf").with_layout_generation(0);
    plant_control_state(&old).await;
    server.cli(&["HSET", "{hf}:caps", "broken", "lots"]);
    assert!(move_layout(&pool, "hf", 1, 2, |s| s).await.is_err());
    assert_eq!(server.cli(&["GET", "{hf}:layout"]).as_deref(), Some("0"));
    assert_eq!(old.schedules().await.unwrap().len(), 1);
    assert_eq!(old.paused().await.unwrap(), ["q"]);
    assert_eq!(old.rate_limit("q").await.unwrap(), Some(limit(6)));
    old.set_paused("q", false).await.unwrap();
    run_one(&old, "q").await;
    old.set_paused("q", true).await.unwrap();
    server.cli(&["HDEL", "{hf}:caps", "broken"]);
    move_layout(&pool, "hf", 1, 2, |s| s).await.unwrap();
    let generation = check_layout(&pool, "hf", 2).await.unwrap();
    assert_eq!(generation, 1);
    assert!(missing_control_state(&pool, "hf", 2, generation)
        .await
        .is_empty());
    assert!(old.schedules().await.unwrap().is_empty());
    assert!(old.paused().await.unwrap().is_empty());
    assert!(old.concurrency_caps().await.unwrap().is_empty());
}

/// Every key and its contents (`RedisServer::snapshot`).
fn snapshot(server: &RedisServer) -> Vec<(String, String)> {
    server.snapshot()
}
