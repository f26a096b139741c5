//! The conformance suite against the Redis backends, each test on its own private
//! redis-server (started on a free port, stopped by pid).

use palisade_testkit::{fenced_store_suite, lease_store_suite};
use std::sync::Arc;

use palisade::{ControlStore, Inspect, QueueAdmin, RedisFencedStore, RedisLeaseStore};
use palisade_testkit::RedisServer;

/// A coordinator under `prefix` on a private server of its own, and the server (kept alive
/// for the test).
fn private_coordinator(prefix: &str) -> (RedisLeaseStore, RedisServer) {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    (RedisLeaseStore::new(pool, prefix), server)
}

/// A sink under `prefix` on a private server of its own, and the server.
fn private_sink(prefix: &str) -> (RedisFencedStore, RedisServer) {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    (RedisFencedStore::new(pool, prefix), server)
}

async fn lease_store() -> (palisade::Stores, RedisServer) {
    let (store, server) = private_coordinator("suite");
    (Arc::new(store).into(), server)
}

async fn fenced_store() -> (Arc<dyn palisade::FencedStore>, RedisServer) {
    let (sink, server) = private_sink("sink");
    (Arc::new(sink), server)
}

lease_store_suite!(lease_store());
fenced_store_suite!(fenced_store());

/// Completed jobs are kept to the store's retention (a count, a time, or none), and what goes
/// leaves no key behind.
#[tokio::test]
async fn completed_records_keep_to_their_retention() {
    use palisade_testkit::suite::{
        completed_records_keep_to_their_retention as check, short_completed_retention,
    };
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let short = RedisLeaseStore::new(pool.clone(), "short")
        .with_completed_retention(short_completed_retention());
    check(Arc::new(short).into(), false).await;
    let off = RedisLeaseStore::new(pool, "off")
        .with_completed_retention(palisade::CompletedRetention::off());
    check(Arc::new(off).into(), true).await;
    let keys = server.cli(&["KEYS", "*done*"]).unwrap();
    assert!(keys.trim().is_empty(), "left behind: {keys}");
    let keys = server.cli(&["KEYS", "{off}:job:*"]).unwrap();
    assert!(keys.trim().is_empty(), "left behind: {keys}");
}

/// Found by the attack on issue 57's completed records: an attempt history another program
/// wrote (a number cjson reads as infinity, entries of another shape) fails no settlement or
/// reap after its first write; a `done` key of another type keeps no record but fails no
/// completion; a maximum lowered by far evicts a bounded step per completion, not all at once.
#[tokio::test]
async fn odd_attempt_histories_and_done_keys_fail_nothing_halfway() {
    use palisade::{CompletedRetention, LeaseStore, NewJob, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let store = RedisLeaseStore::new(pool.clone(), "h");
    let claim = |ttl| {
        let store = &store;
        async move { store.claim("default", "t", 1, ttl).await.unwrap().remove(0) }
    };
    let odd = [
        ("[1e999]", "32"),
        (
            "[[1,2,3,\"x\",\"y\"],1e999,{\"a\":1},[1e999,2,3,\"x\",\"y\"]]",
            "40",
        ),
        (
            "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
            "33",
        ),
    ];
    for (tries, n) in odd {
        let ids = store
            .enqueue(vec![NewJob::raw("odd", "null").with_max_attempts(2)])
            .await
            .unwrap();
        let key = format!("{{h}}:job:{}", ids[0]);
        let put = || {
            server
                .cli(&["HSET", &key, "tries", tries, "ntries", n])
                .unwrap();
        };
        // A retry (note_try trims past 32), then a death (bury decodes the history).
        put();
        let c = claim(Duration::from_secs(30)).await;
        let retry = Settlement::Retry {
            delay: Duration::ZERO,
            reason: "r".into(),
        };
        let out = store.settle(vec![(c.lease.id, retry)]).await.unwrap();
        assert!(out[0].is_ok(), "{tries}: {out:?}");
        put();
        let c = claim(Duration::from_secs(30)).await;
        let dead = Settlement::Dead { reason: "d".into() };
        let out = store.settle(vec![(c.lease.id, dead)]).await.unwrap();
        assert!(out[0].is_ok(), "{tries}: {out:?}");
        let letters = store.dead("default", 100).await.unwrap();
        assert_eq!(letters.len(), 1, "{tries}: buried");
        // A stall found by the reaper.
        store
            .enqueue(vec![NewJob::raw("odd", "null").with_max_stalls(0)])
            .await
            .unwrap();
        let c = claim(Duration::from_millis(1)).await;
        server
            .cli(&[
                "HSET",
                &format!("{{h}}:job:{}", c.job.id),
                "tries",
                tries,
                "ntries",
                n,
            ])
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let reaped = store.reap(10).await.unwrap();
        assert_eq!(reaped.len(), 1, "{tries}: reaped");
        assert!(
            store.job(c.job.id).await.unwrap().is_none(),
            "{tries}: dead"
        );
        assert_eq!(store.dead("default", 100).await.unwrap().len(), 2);
        store.purge_dead("default", 100).await.unwrap();
    }

    // A "done" written over: completions go through, none kept.
    server.cli(&["SET", "{h}:done", "x"]).unwrap();
    let ids = store.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap();
    let c = claim(Duration::from_secs(30)).await;
    let out = store
        .settle(vec![(c.lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(out[0].is_ok(), "{out:?}");
    assert!(store.completed(ids[0]).await.unwrap().is_none());
    assert_eq!(store.counts("default").await.unwrap().completed, 1);
    server.cli(&["DEL", "{h}:done"]).unwrap();

    // 2,000 kept, then a worker keeping 10 completes one: 1,000 go, not 1,991 in one script.
    let many = |max| {
        RedisLeaseStore::new(pool.clone(), "many").with_completed_retention(CompletedRetention {
            keep: Duration::from_secs(600),
            max,
        })
    };
    let wide = many(2_000);
    for _ in 0..4 {
        wide.enqueue((0..500).map(|_| NewJob::raw("m", "null")).collect())
            .await
            .unwrap();
        let claims = wide
            .claim("default", "t", 500, Duration::from_secs(30))
            .await
            .unwrap();
        let done = claims.iter().map(|c| (c.lease.id, Settlement::completed()));
        let out = wide.settle(done.collect()).await.unwrap();
        assert!(out.iter().all(Result::is_ok));
    }
    assert_eq!(server.cli(&["ZCARD", "{many}:done"]), Some("2000".into()));
    let narrow = many(10);
    narrow
        .enqueue(vec![NewJob::raw("m", "null")])
        .await
        .unwrap();
    let c = narrow
        .claim("default", "t", 1, Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0);
    narrow
        .settle(vec![(c.lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert_eq!(server.cli(&["ZCARD", "{many}:done"]), Some("1001".into()));
    let records = server.cli(&["EVAL", "return #redis.call('KEYS', '{many}:done:*')", "0"]);
    assert_eq!(records, Some("1001".into()), "each entry's record, no more");
}

/// Pausing a schedule on Redis: by name (a code schedule's too), listed sorted, idempotent,
/// forgotten with a removed kept schedule.
#[tokio::test]
async fn schedules_pause_and_resume_by_name() {
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let store = RedisLeaseStore::new(pool, "sp");
    let kept =
        palisade::Schedule::new("kept", "0 3 * * *", palisade::NewJob::raw("r", "null")).unwrap();
    store.put_schedule(kept.spec().clone()).await.unwrap();
    assert!(store.pause_schedule("zeta", true).await.unwrap());
    assert!(store.pause_schedule("kept", true).await.unwrap());
    assert!(!store.pause_schedule("kept", true).await.unwrap());
    assert_eq!(store.paused_schedules().await.unwrap(), ["kept", "zeta"]);
    assert!(store.pause_schedule("zeta", false).await.unwrap());
    assert!(!store.pause_schedule("zeta", false).await.unwrap());
    assert!(store.remove_schedule("kept").await.unwrap());
    assert!(store.paused_schedules().await.unwrap().is_empty());
    // Resuming raises the mark to now.
    store.pause_schedule("kept", true).await.unwrap();
    let before = store.now_ms().await.unwrap();
    store.pause_schedule("kept", false).await.unwrap();
    assert!(store.schedule_mark("kept").await.unwrap().unwrap() >= before);
    // A set written over by another program: the error names the key.
    server.cli(&["SET", "{sp}:schedules_paused", "x"]).unwrap();
    let e = store.paused_schedules().await.unwrap_err().to_string();
    assert!(
        e.contains("{sp}:schedules_paused holds another type"),
        "{e}"
    );
    assert!(!palisade::Error::Backend(e).is_retryable());
}

/// Issue 7, case 7 (Redis): one claim makes a bounded number of due delayed jobs ready (it
/// used to promote 1,000 at once, blocking Redis to hand out one job), the rest follow with
/// later claims; dead letters are trimmed to the retention.
#[tokio::test]
async fn claims_promote_boundedly_and_dead_letters_are_trimmed() {
    use palisade::{LeaseStore, NewJob, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let store = RedisLeaseStore::new(pool, "bound").with_dead_retention(2);
    let delayed = (0..1000)
        .map(|_| NewJob::raw("d", "null").with_delay(Duration::from_millis(20)))
        .collect();
    store.enqueue(delayed).await.unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    let ttl = Duration::from_secs(30);
    assert_eq!(store.claim("default", "t", 1, ttl).await.unwrap().len(), 1);
    let left: usize = server
        .cli(&["ZCARD", "{bound}:q:default:delayed"])
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(left, 1000 - 18, "one claim of 1 promotes 2n + 16 due jobs");
    let mut claimed = 1;
    for _ in 0..20 {
        claimed += store.claim("default", "t", 100, ttl).await.unwrap().len();
    }
    assert_eq!(claimed, 1000, "every due job is claimed in the end");

    store
        .enqueue(
            (0..3)
                .map(|i| NewJob::raw(format!("dead{i}"), "null"))
                .collect(),
        )
        .await
        .unwrap();
    let claims = store.claim("default", "t", 3, ttl).await.unwrap();
    for c in &claims {
        let dead = Settlement::Dead {
            reason: c.job.kind.clone(),
        };
        store.settle(vec![(c.lease.id, dead)]).await.unwrap();
    }
    let kept: Vec<String> = store
        .dead("default", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.reason)
        .collect();
    assert_eq!(
        kept,
        ["dead1", "dead2"],
        "the oldest dead letter goes first"
    );
}

/// Issue 7, case 5: errors are classified by what the caller should do. Unreachable is
/// transient; a script error (a key of the wrong type) and a reply that does not decode are
/// permanent, so they are never retried as if transient.
#[tokio::test]
async fn errors_are_classified_by_what_to_do() {
    use palisade::{Error, LeaseStore, NewJob};
    use std::time::Duration;
    let ttl = Duration::from_secs(30);
    let mut server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let store = RedisLeaseStore::new(pool, "errs");
    let ids = store.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap();

    // A job record another program scribbled over: the claim's reply does not decode.
    let job = format!("{{errs}}:job:{}", ids[0]);
    server.cli(&["HSET", &job, "meta", "not json"]).unwrap();
    let garbage = store.claim("default", "t", 1, ttl).await;
    assert!(matches!(garbage, Err(Error::Backend(_))), "{garbage:?}");
    assert!(!garbage.unwrap_err().is_retryable());

    // A coordinator key of the wrong type: the script fails (before any change).
    server.cli(&["DEL", "{errs}:seq"]).unwrap();
    server.cli(&["HSET", "{errs}:seq", "x", "1"]).unwrap();
    let script = store.enqueue(vec![NewJob::raw("k", "null")]).await;
    assert!(matches!(script, Err(Error::Backend(_))), "{script:?}");
    assert!(!script.unwrap_err().is_retryable());

    server.stop();
    let down = store.counts("default").await;
    assert!(matches!(down, Err(Error::Unavailable(_))), "{down:?}");
    assert!(down.unwrap_err().is_retryable());
}

/// Found by the adversarial review of the scripts: configuration and records no script may
/// fail halfway on. Huge retentions (which used to reach Redis as `1e+19` after the first
/// change), a job record deleted while its job was delayed, and a settlement the script does
/// not understand.
#[tokio::test]
async fn scripts_never_fail_halfway_on_odd_config_or_records() {
    use palisade::{
        Admission, Fence, FencedStore, FencedWrite, FencingToken, IdempotencyKey, LeaseId,
        LeaseStore, Mutation, NewJob, RedisFencedStore, Scope, Settlement,
    };
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();

    let sink =
        RedisFencedStore::new(pool.clone(), "odd").with_key_retention(Duration::MAX, usize::MAX);
    let lease = LeaseId::new();
    let writes = ["a", "b"]
        .map(|k| FencedWrite {
            scope: Scope::new(k),
            fence: Fence {
                token: FencingToken::from_u64(1),
                lease,
            },
            key: IdempotencyKey::new("k1"),
            mutations: vec![Mutation::Set {
                key: k.into(),
                value: "v".into(),
            }],
        })
        .to_vec();
    let results = sink.write_batch(writes).await.unwrap();
    assert!(
        results.iter().all(|r| matches!(r, Ok(Admission::Applied))),
        "{results:?}"
    );

    let store = RedisLeaseStore::new(pool, "odd").with_dead_retention(usize::MAX);
    let ids = store
        .enqueue(vec![
            NewJob::raw("gone", "null").with_delay(Duration::from_millis(5)),
            NewJob::raw("stays", "null").with_delay(Duration::from_millis(5)),
            NewJob::raw("dies", "null").with_max_stalls(0),
        ])
        .await
        .unwrap();
    server
        .cli(&["DEL", &format!("{{odd}}:job:{}", ids[0])])
        .unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let claims = store
        .claim("default", "t", 3, Duration::from_millis(1))
        .await
        .unwrap();
    let mut kinds: Vec<&str> = claims.iter().map(|c| c.job.kind.as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, ["dies", "stays"]);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reaped = store.reap(10).await.unwrap();
    assert_eq!(reaped.iter().filter(|r| r.dead).count(), 1);
    assert_eq!(store.dead("default", 10).await.unwrap().len(), 1);

    // A settlement the script does not know changes nothing (the Rust API cannot send one;
    // another client could).
    store
        .enqueue(vec![NewJob::raw("s", "null").with_scope("odd-scope")])
        .await
        .unwrap();
    let c = store
        .claim("default", "t", 1, Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0);
    let script = concat!(
        include_str!("../../redis/lua/common.lua"),
        include_str!("../../redis/lua/settle.lua")
    );
    let lease = c.lease.id.to_string();
    // Numbers Lua reads as whole but Redis' integer parser refuses (a result's PX, a delay)
    // would fail the script after its first write.
    let odd = [
        ("completed", "8388607"),
        ("retry", "nan"),
        ("retry", "x"),
        ("complete", "1e3"),
        ("complete", "5.0"),
        ("complete", "0x10"),
        ("complete", " 7"),
        ("complete", "+5"),
        ("complete", "007"),
        ("retry", "-1"),
        ("complete", "1000000000000000"),
        ("snooze", "1e3"),
        ("snooze", "x"),
        ("snooze", "-5"),
        ("snooze", "1000000000000000"),
    ];
    for (action, arg) in odd {
        let out = server
            .cli(&[
                "EVAL", script, "1", "{odd}:", "1", "5", "0", "0", &lease, action, arg, "why",
                "",  // no follow-up jobs
                "",  // no added flow steps
                "0", // the layout generation
            ])
            .unwrap();
        assert_eq!(out.lines().next(), Some("invalid"), "{action} {arg}");
    }
    // A list too short for its count: the reason and follow-ups would be read past the end.
    let out = server
        .cli(&[
            "EVAL", script, "1", "{odd}:", "1", "5", "0", "0", &lease, "complete", "0", "0",
        ])
        .unwrap();
    assert_eq!(out.lines().next(), Some("invalid"), "a short list");
    let done = store
        .settle(vec![(c.lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(
        done[0].is_ok(),
        "the lease survived the invalid settlements: {done:?}"
    );
    assert_eq!(
        server.cli(&["EXISTS", &format!("{{odd}}:result:{}", c.job.id)]),
        Some("0".into()),
        "an invalid completion kept a result"
    );
}

/// An enqueue another client sends with numbers Redis would refuse halfway (a priority, a
/// delay, a ttl or a debounce period that is no integer) is refused before anything is
/// written: no job, no unique or debounce key, the enqueue counter untouched.
#[test]
fn an_enqueue_with_odd_numbers_writes_nothing() {
    let server = RedisServer::start();
    let script = concat!(
        include_str!("../../redis/lua/common.lua"),
        include_str!("../../redis/lua/enqueue.lua")
    );
    let id = "6f1c0000-0000-4000-8000-000000000001";
    //        id, queue, kind, scope, priority, delay, meta, unique key, ttl, debounce key,
    //        quiet, max wait, group, fingerprint, id ttl
    let good = [
        id, "q", "k", "", "0", "0", "{}", "u", "1000", "d", "5", "10", "", "", "0",
    ];
    let bad_at = |at: usize, value: &str| {
        let mut job: Vec<String> = good.iter().map(|s| s.to_string()).collect();
        job[at] = value.into();
        job
    };
    for (at, value) in [
        (4, "x"),
        (4, "1.5"),
        (4, "nan"),
        (4, "99999999"),
        (5, "-1"),
        (5, "1e3"),
        (5, "x"),
        (5, ""),
        (8, "inf"),
        (10, "0x10"),
        (11, ""),
    ] {
        let job = bad_at(at, value);
        let mut args = vec!["EVAL", script, "1", "{odd}:", "1"];
        args.extend(job.iter().map(String::as_str));
        args.push("0"); // the layout generation
        let out = server.cli(&args).unwrap_or_default();
        assert!(
            out.contains("PALISADE_INVALID"),
            "field {at} = {value:?}: {out}"
        );
        assert_eq!(
            server.cli(&["DBSIZE"]),
            Some("0".into()),
            "field {at} = {value:?}"
        );
    }
    // A debounce key another program wrote as another type: refused whole, nothing written.
    server.cli(&["HSET", "{odd}:debounce:d", "x", "y"]).unwrap();
    let mut args = vec!["EVAL", script, "1", "{odd}:", "1"];
    args.extend(good);
    args.push("0");
    let out = server.cli(&args).unwrap_or_default();
    assert!(out.contains("PALISADE_CORRUPT"), "{out}");
    assert_eq!(server.cli(&["DBSIZE"]), Some("1".into()));
    // The good one goes in.
    server.cli(&["DEL", "{odd}:debounce:d"]).unwrap();
    assert_eq!(server.cli(&args), Some(id.into()));
}

/// Issue 9: 100,000 default-scoped jobs with a sink write leave the sink's state bounded once
/// their leases are behind the watermark and the key retention has passed: what remains is
/// the live scopes and the retained keys, not one fence per job ever run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_state_stays_bounded_by_live_scopes() {
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let retention = Duration::from_millis(300);
    let sink = RedisFencedStore::new(pool, "bounded").with_key_retention(retention, 10_000);
    palisade_testkit::suite::drive_default_scoped_writes(&sink, 100_000, retention).await;
    let keys: u64 = server.cli(&["DBSIZE"]).unwrap().parse().unwrap();
    // The total, the watermark, the collection queue, the probe scope's fence and keys.
    assert!(keys <= 8, "{keys} keys left after 100,000 jobs");
    let used: u64 = server
        .cli(&["MEMORY", "USAGE", "bounded:collect"])
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(used < 64 * 1024, "collection queue holds {used} bytes");
}

/// A queue's counts with keys another program wrote under our prefix: a key of another type
/// is named in the error (not a bare WRONGTYPE), and a count field that is not a count reads
/// as 0 (not a reply the client cannot decode). Both are a read: nothing changes.
#[tokio::test]
async fn counts_name_a_key_written_over_and_read_odd_counts_as_zero() {
    use palisade::{Inspect, LeaseStore, NewJob};
    let (store, server) = private_coordinator("cnt");
    store
        .enqueue(vec![NewJob::raw("k", "null"), NewJob::raw("k", "null")])
        .await
        .unwrap();
    server
        .cli(&[
            "HSET",
            "{cnt}:q:default:stats",
            "waiting",
            "-3",
            "completed",
            "1.5",
            "died",
            "x",
        ])
        .unwrap();
    let counts = store.counts("default").await.unwrap();
    assert_eq!(
        (counts.ready, counts.waiting, counts.completed, counts.died),
        (2, 0, 0, 0)
    );
    for (key, need) in [
        ("{cnt}:q:default:delayed", "zset"),
        ("{cnt}:q:default:dead", "list"),
        ("{cnt}:q:default\tk", "zset"),
    ] {
        // (The kind's ready set holds the two jobs: set aside, and back after.)
        let _ = server.cli(&["RENAME", key, "aside"]);
        server.cli(&["SET", key, "oops"]).unwrap();
        let err = store.counts("default").await.unwrap_err().to_string();
        let named = format!("{key} is a string, not a {need}");
        assert!(
            err.contains("PALISADE_CORRUPT") && err.contains(&named),
            "{key}: {err}"
        );
        server.cli(&["DEL", key]).unwrap();
        let _ = server.cli(&["RENAME", "aside", key]);
    }
    // Repaired, the counts read again, and nothing was lost.
    assert_eq!(store.counts("default").await.unwrap().ready, 2);
}

/// The age of a queue's next job with keys another program wrote over: a key of the queue is
/// named in the error (not a bare WRONGTYPE, which the views of every queue would not know to
/// leave out), and a job record of another type counts from now. Both are a read.
#[tokio::test]
async fn the_oldest_job_names_a_key_written_over_and_a_record_of_another_type_counts_from_now() {
    use palisade::{Inspect, LeaseStore, NewJob};
    let (store, server) = private_coordinator("old");
    let ids = store.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let age = store.oldest_ready("default").await.unwrap().unwrap();
    assert!(age >= std::time::Duration::from_millis(250), "{age:?}");
    let record = format!("{{old}}:job:{}", ids[0]);
    server.cli(&["RENAME", &record, "aside"]).unwrap();
    server.cli(&["SET", &record, "oops"]).unwrap();
    let age = store.oldest_ready("default").await.unwrap().unwrap();
    assert!(
        age < std::time::Duration::from_millis(250),
        "from now: {age:?}"
    );
    server.cli(&["DEL", &record]).unwrap();
    server.cli(&["RENAME", "aside", &record]).unwrap();
    for key in [
        "{old}:q:default:delayed",
        "{old}:q:default:kinds",
        "{old}:q:default\tk",
    ] {
        let _ = server.cli(&["RENAME", key, "aside"]);
        server.cli(&["SET", key, "oops"]).unwrap();
        let err = store.oldest_ready("default").await.unwrap_err().to_string();
        assert!(
            err.contains("PALISADE_CORRUPT") && err.contains(&format!("{key} is a string")),
            "{key}: {err}"
        );
        server.cli(&["DEL", key]).unwrap();
        let _ = server.cli(&["RENAME", "aside", key]);
    }
    // Repaired, the age reads again.
    assert!(store.oldest_ready("default").await.unwrap().is_some());
}

/// A scope keeps at most `max_keys` idempotency keys, the newest: the script counts its set
/// before the write (a scope without keys, as a default scope's one write finds, is not looked
/// up) and adds one for the key it records, so the bound holds from the first write over it.
#[tokio::test]
async fn a_scopes_keys_are_bounded_by_count_and_the_newest_kept() {
    use palisade::{
        Admission, Fence, FencedStore, FencedWrite, FencingToken, IdempotencyKey, LeaseId,
        Mutation, Scope,
    };
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let sink = RedisFencedStore::new(pool, "kb").with_key_retention(Duration::from_secs(3600), 3);
    let write = |key: &str| FencedWrite {
        scope: Scope::new("s"),
        fence: Fence {
            token: FencingToken::from_u64(7),
            lease: LeaseId::from(uuid::Uuid::nil()),
        },
        key: IdempotencyKey::new(key),
        mutations: vec![Mutation::HashIncr {
            key: "n".into(),
            field: "f".into(),
            by: 1,
        }],
    };
    for (i, key) in ["k1", "k2", "k3", "k4", "k5"].into_iter().enumerate() {
        assert_eq!(sink.write(write(key)).await.unwrap(), Admission::Applied);
        let kept = server.cli(&["ZCARD", "kb:{s}:keys"]).unwrap();
        assert_eq!(kept, (i + 1).min(3).to_string(), "after {key}");
    }
    // The newest three are remembered; the two oldest are forgotten, so a repeat applies.
    for key in ["k3", "k4", "k5"] {
        assert_eq!(sink.write(write(key)).await.unwrap(), Admission::Duplicate);
    }
    assert_eq!(sink.write(write("k1")).await.unwrap(), Admission::Applied);
    assert_eq!(server.cli(&["HGET", "kb:d:n", "f"]).as_deref(), Some("6"));
    assert_eq!(server.cli(&["ZCARD", "kb:{s}:keys"]).as_deref(), Some("3"));
}

/// Found by the adversarial review of the watermark: a corrupt stored watermark must fail the
/// sink closed (fences below it may be gone), and corrupt coordinator records must never make
/// a settle fail after its changes (it used to: the jobs were settled, the caller told "error").
#[tokio::test]
async fn corrupt_watermark_records_fail_safe() {
    use palisade::{
        Admission, Error, Fence, FencedStore, FencedWrite, FencingToken, IdempotencyKey, LeaseId,
        LeaseStore, Mutation, NewJob, RedisFencedStore, Scope, Settlement,
    };
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();

    let sink = RedisFencedStore::new(pool.clone(), "wm");
    let write = |token: u64, key: &str| FencedWrite {
        scope: Scope::new("s1"),
        fence: Fence {
            token: FencingToken::from_u64(token),
            lease: LeaseId::from(uuid::Uuid::nil()),
        },
        key: IdempotencyKey::new(key),
        mutations: vec![Mutation::Set {
            key: "x".into(),
            value: format!("t{token}"),
        }],
    };
    assert_eq!(
        sink.write(write(50, "a")).await.unwrap(),
        Admission::Applied
    );
    sink.observe_watermark(FencingToken::from_u64(100));
    assert!(matches!(
        sink.write(write(49, "b")).await.unwrap(),
        Admission::Rejected(_)
    ));
    server.cli(&["SET", "wm:watermark", "oops"]).unwrap();
    let r = sink.write(write(49, "c")).await;
    assert!(
        matches!(r, Err(Error::Backend(_))),
        "a corrupt watermark must fail closed: {r:?}"
    );
    assert_eq!(server.cli(&["GET", "wm:d:x"]).as_deref(), Some("t50"));

    let store = RedisLeaseStore::new(pool, "wmc");
    store
        .enqueue(vec![NewJob::raw("k", "null"), NewJob::raw("k", "null")])
        .await
        .unwrap();
    let claims = store
        .claim("default", "t", 2, Duration::from_secs(30))
        .await
        .unwrap();
    server
        .cli(&["HSET", "{wmc}:watermark", "epoch", "garbage"])
        .unwrap();
    let done = store
        .settle(vec![(claims[0].lease.id, Settlement::completed())])
        .await;
    assert!(matches!(done.as_deref(), Ok([Ok(())])), "{done:?}");
    server.cli(&["SET", "{wmc}:counter", "7x"]).unwrap();
    let done = store
        .settle(vec![(claims[1].lease.id, Settlement::completed())])
        .await;
    assert!(matches!(done.as_deref(), Ok([Ok(())])), "{done:?}");
    // A corrupt counter is "not provably intact": the next claim moves to a new epoch.
    store.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap();
    let next = store
        .claim("default", "t", 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(next.len(), 1);
    assert!(next[0].lease.token > claims[1].lease.token);
}

/// Coordinator state someone else wrote oddly — a cap count that is not a number, a cap that
/// is not one, a rate bucket stamped in the future (the clock went back) — never makes a
/// script fail after its first write, and never loses a job or freezes a queue.
#[tokio::test]
async fn odd_caps_counts_and_rate_stamps_change_nothing_halfway() {
    use palisade::{LeaseStore, NewJob, RateLimit, RedisLeaseStore};
    use std::time::Duration;
    let server = RedisServer::start();
    let store = RedisLeaseStore::new(palisade::store::redis::pool(&server.url()).unwrap(), "odd");
    store
        .enqueue(vec![NewJob::raw("k", "null"), NewJob::raw("k", "null")])
        .await
        .unwrap();
    store.set_concurrency_cap("k", Some(5)).await.unwrap();
    let first = store
        .claim("default", "w", 1, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    // The count is garbage now: the expiry of that lease must still requeue the job.
    server.cli(&["HSET", "{odd}:running", "k", "x"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reaped = store.reap(10).await.unwrap();
    assert_eq!(reaped.len(), 1, "{reaped:?}");
    assert_eq!(
        store.counts("default").await.unwrap().ready,
        2,
        "nothing lost"
    );
    assert_eq!(
        server.cli(&["HGET", "{odd}:running", "k"]).as_deref(),
        Some("0")
    );
    // A cap that is not a number is ignored; a count that is not one reads as 0.
    server.cli(&["HSET", "{odd}:caps", "k", "many"]);
    server.cli(&["HSET", "{odd}:running", "k", "1.5"]);
    let claimed = store
        .claim("default", "w", 5, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    // A bucket stamped an hour ahead: the next claim counts from now instead of freezing.
    store
        .set_rate_limit(
            "later",
            Some(RateLimit {
                jobs: 10,
                per: Duration::from_secs(1),
            }),
        )
        .await
        .unwrap();
    store
        .enqueue(vec![NewJob::raw("k", "null").with_queue("later")])
        .await
        .unwrap();
    let ahead = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3_600_000)
        .to_string();
    server.cli(&["HSET", "{odd}:q:later:rate", "tokens", "0.5", "at", &ahead]);
    assert!(store
        .claim("later", "w", 1, Duration::from_secs(10))
        .await
        .unwrap()
        .is_empty());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = store
        .claim("later", "w", 1, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(after.len(), 1, "the bucket refills from now");
}

/// The first process records the number of partitions; another number is refused until a
/// migration records the new one. Installations (prefixes) are separate.
#[tokio::test]
async fn a_process_with_another_number_of_partitions_is_refused() {
    use palisade::store::redis::{check_layout, record_layout};
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    assert_eq!(check_layout(&pool, "lay", 1).await.unwrap(), 0);
    check_layout(&pool, "lay", 1).await.unwrap();
    assert!(matches!(
        check_layout(&pool, "lay", 3).await,
        Err(palisade::Error::Config(_))
    ));
    record_layout(&pool, "lay", 3).await.unwrap();
    check_layout(&pool, "lay", 3).await.unwrap();
    assert!(check_layout(&pool, "lay", 1).await.is_err());
    check_layout(&pool, "other", 6).await.unwrap();
}

/// Claims and completes the one ready job of the default queue through `store`.
async fn complete_one(store: &dyn palisade::LeaseStore) {
    let ttl = std::time::Duration::from_secs(30);
    let c = store.claim("default", "w", 1, ttl).await.unwrap().remove(0);
    store
        .settle(vec![(c.lease.id, palisade::Settlement::completed())])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
}

/// Every operation of `store` that acts (each script that checks the layout generation and
/// format level), expected to fail: the errors, by operation.
async fn every_acting_call(
    old: &RedisLeaseStore,
    ttl: std::time::Duration,
) -> Vec<(&'static str, palisade::Error)> {
    use palisade::{ControlStore, LeaseStore, NewJob, QueueAdmin, Settlement};
    let job = NewJob::raw("k", "null");
    let lease = palisade::LeaseId::new();
    vec![
        ("enqueue", old.enqueue(vec![job.clone()]).await.unwrap_err()),
        (
            "claim",
            old.claim("default", "w", 1, ttl).await.unwrap_err(),
        ),
        ("renew", old.renew(&[lease], ttl).await.unwrap_err()),
        (
            "settle",
            old.settle(vec![(lease, Settlement::completed())])
                .await
                .unwrap_err(),
        ),
        ("reap", old.reap(10).await.unwrap_err()),
        (
            "cancel",
            old.cancel(palisade::JobId::new(), "x").await.unwrap_err(),
        ),
        (
            "retry_dead",
            old.retry_dead("default", 1).await.unwrap_err(),
        ),
        (
            "purge_dead",
            old.purge_dead("default", 1).await.unwrap_err(),
        ),
        (
            "hold_role",
            old.hold_role("scheduler", "me", ttl).await.unwrap_err(),
        ),
        (
            "advance_schedule",
            old.advance_schedule("tick", 1).await.unwrap_err(),
        ),
        (
            "set_group_limits",
            old.set_group_limits("g", palisade::GroupLimits::default())
                .await
                .unwrap_err(),
        ),
    ]
}

/// Issue 55: an installation at a format level outside this build's window (a later
/// release's `upgrade finalize` moved it on, or a record no level reads) refuses every acting
/// call of this build before any change (`Error::Format`, `PALISADE_FORMAT`), and a process
/// starting is refused. Finalize records the level under every base, never to a level the
/// build does not know, one run at a time with layout moves; a move carries the level.
#[tokio::test]
async fn a_build_that_cannot_read_the_format_level_is_refused_before_any_change() {
    use palisade::store::redis::{check_layout, finalize_format, format_level, move_layout};
    use palisade::{Error, LeaseStore, NewJob, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let ttl = Duration::from_secs(30);
    assert_eq!(check_layout(&pool, "fm", 1).await.unwrap(), 0);
    let store = RedisLeaseStore::new(pool.clone(), "fm");
    store.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap();
    let held = store.claim("default", "w", 1, ttl).await.unwrap().remove(0);
    // Never recorded: level 1. Finalizing level 1 records it; level 2 is not this build's.
    assert_eq!(format_level(&pool, "fm", 1, 0).await.unwrap(), 1);
    let done = finalize_format(&pool, "fm", 1).await.unwrap();
    assert_eq!((done.before.recorded(), done.level), (false, 1));
    assert_eq!(server.cli(&["GET", "{fm}:format"]).as_deref(), Some("1"));
    let unknown = finalize_format(&pool, "fm", 2).await;
    assert!(
        matches!(&unknown, Err(Error::Config(why)) if why.contains("not 2")),
        "{unknown:?}"
    );
    // A prefix nothing records is refused, and nothing is created for it.
    let typo = finalize_format(&pool, "fn", 1).await;
    assert!(
        matches!(&typo, Err(Error::Config(why)) if why.contains("check --prefix")),
        "{typo:?}"
    );
    assert_eq!(server.cli(&["KEYS", "{fn}*"]).as_deref(), Some(""));
    server.cli(&["SET", "{fm}:moving", "a `partitions` run"]);
    let refused = finalize_format(&pool, "fm", 1).await;
    assert!(
        matches!(&refused, Err(Error::Config(why)) if why.contains("upgrade finalize")),
        "{refused:?}"
    );
    server.cli(&["DEL", "{fm}:moving"]);
    store.renew(&[held.lease.id], ttl).await.unwrap();

    for level in ["2", "0", "1.5", "x", "99999999999"] {
        server.cli(&["SET", "{fm}:format", level]);
        let before = snapshot(&server);
        for (op, e) in every_acting_call(&store, ttl).await {
            assert!(
                matches!(&e, Error::Format(why) if why.contains("PALISADE_FORMAT")),
                "level {level:?}, {op}: {e}"
            );
            assert!(e.is_retryable(), "{op}: {e}");
        }
        let held_settle = store
            .settle(vec![(held.lease.id, Settlement::completed())])
            .await;
        assert!(
            matches!(held_settle, Err(Error::Format(_))),
            "{held_settle:?}"
        );
        assert_eq!(
            snapshot(&server),
            before,
            "level {level:?}: nothing changed"
        );
        // A process starting now is refused too, saying why.
        let start = check_layout(&pool, "fm", 1).await;
        assert!(start.is_err(), "level {level:?}: {start:?}");
    }
    // Back at a level it reads, the held lease settles: nothing was lost meanwhile.
    server.cli(&["SET", "{fm}:format", "1"]);
    let settled = store
        .settle(vec![(held.lease.id, Settlement::completed())])
        .await
        .unwrap();
    settled.into_iter().next().unwrap().unwrap();
    // A move records the level under the new layout's bases.
    move_layout(&pool, "fm", 1, 2, |s| s).await.unwrap();
    let bases = palisade::store::redis::layout_prefixes("fm", 2, 1);
    for base in &bases {
        let key = format!("{{{base}}}:format");
        assert_eq!(server.cli(&["GET", &key]).as_deref(), Some("1"), "{key}");
    }
    assert_eq!(format_level(&pool, "fm", 2, 1).await.unwrap(), 1);
    // A finalize that died part-way (one base without its record) shows as lagging, and a
    // rerun completes it.
    let read = |p| palisade::store::redis::installation(pool.clone(), p);
    assert_eq!(read("fm").await.unwrap().lagging(), 0);
    server.cli(&["SET", &format!("{{{}}}:format", bases[0]), "0"]);
    let half = read("fm").await.unwrap();
    assert_eq!((half.format(), half.lagging(), half.partitions), (1, 1, 2));
    let done = finalize_format(&pool, "fm", 1).await.unwrap();
    assert_eq!(done.before.lagging(), 1);
    assert_eq!(read("fm").await.unwrap().lagging(), 0);
    // Never lowered: an installation a later release moved to level 5 refuses this build's
    // finalize to 1, changing nothing; a record that is no level is never written over.
    server.cli(&["SET", &format!("{{{}}}:format", bases[1]), "5"]);
    let before = snapshot(&server);
    let lower = finalize_format(&pool, "fm", 1).await;
    assert!(
        matches!(&lower, Err(Error::Config(why)) if why.contains("never lowered")),
        "{lower:?}"
    );
    server.cli(&["SET", &format!("{{{}}}:format", bases[1]), "x"]);
    assert!(read("fm").await.is_err());
    assert!(finalize_format(&pool, "fm", 1).await.is_err());
    server.cli(&["SET", &format!("{{{}}}:format", bases[1]), "5"]);
    assert_eq!(snapshot(&server), before, "nothing changed");
}

/// Issue 20.3: `palisade partitions` used to exit 0 while a worker of the installation still
/// ran, and that worker kept firing the old layout's copy of a schedule (ticks enqueued twice).
/// A paused worker looks exactly like a dead one, so the guard is a layout generation every
/// acting script checks: after a move, a store of the old generation is refused at every
/// operation (`Error::Config`, `PALISADE_LAYOUT`) and changes nothing — on the old layout's
/// bases and, after moving back, on the very base it used. A move that fails gives the old
/// generation back; a second move while one runs is refused.
#[tokio::test]
async fn a_process_of_an_old_layout_is_refused_and_moves_are_serialised() {
    use palisade::store::redis::{check_layout, coordinator, move_layout};
    use palisade::{Error, LeaseStore, NewJob, DEFAULT_MAX_PAYLOAD_BYTES};
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let ttl = Duration::from_secs(30);
    let layout = |e: &Error| matches!(e, Error::Layout(why) if why.contains("PALISADE_LAYOUT"));
    assert_eq!(check_layout(&pool, "mv", 1).await.unwrap(), 0);
    let old = RedisLeaseStore::new(pool.clone(), "mv").with_layout_generation(0);
    old.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap();
    // A move while the old layout holds a job is refused, and its processes go on.
    let refused = move_layout(&pool, "mv", 1, 2, |s| s).await;
    assert!(
        matches!(&refused, Err(Error::Config(why)) if why.contains("drain")),
        "{refused:?}"
    );
    complete_one(&old).await;
    // One move at a time.
    server.cli(&["SET", "{mv}:moving", "another run"]);
    let refused = move_layout(&pool, "mv", 1, 2, |s| s).await;
    assert!(
        matches!(&refused, Err(Error::Config(why)) if why.contains("another `partitions` run")),
        "{refused:?}"
    );
    server.cli(&["DEL", "{mv}:moving"]);
    // A move that fails once it has begun writing the new layout (a key of the wrong type
    // there) leaves the old layout as it was — its schedule, its cap — and its processes
    // going on.
    let spec = palisade::Schedule::new("tick", "* * * * *", NewJob::raw("k", "null"))
        .unwrap()
        .spec()
        .clone();
    old.put_schedule(spec).await.unwrap();
    old.set_concurrency_cap("k", Some(3)).await.unwrap();
    let caps = format!(
        "{{{}}}:caps",
        palisade::store::redis::layout_prefixes("mv", 2, 1)[0]
    );
    server.cli(&["SET", &caps, "another program's"]);
    assert!(move_layout(&pool, "mv", 1, 2, |s| s).await.is_err());
    assert_eq!(old.schedules().await.unwrap().len(), 1);
    assert_eq!(old.concurrency_cap("k").await.unwrap(), Some(3));
    old.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap();
    complete_one(&old).await;
    server.cli(&["DEL", &caps]);
    move_layout(&pool, "mv", 1, 2, |s| s).await.unwrap();
    assert!(
        old.schedules().await.unwrap().is_empty(),
        "moved, not copied"
    );
    assert_eq!(
        server.cli(&["EXISTS", "{mv}:moving"]).as_deref(),
        Some("0"),
        "the lock is given back"
    );
    let before = snapshot(&server);
    let job = NewJob::raw("k", "null");
    let refusals = every_acting_call(&old, ttl).await;
    for (op, e) in &refusals {
        assert!(layout(e), "{op}: {e}");
    }
    assert_eq!(
        snapshot(&server),
        before,
        "the refused process changed nothing"
    );
    // A process started now runs the new generation in the new layout.
    assert!(check_layout(&pool, "mv", 1).await.is_err());
    let generation = check_layout(&pool, "mv", 2).await.unwrap();
    assert_eq!(generation, 1);
    let layout_at = |partitions: usize, generation: u64| {
        coordinator(
            pool.clone(),
            "mv",
            partitions,
            generation,
            DEFAULT_MAX_PAYLOAD_BYTES,
            |s| s,
        )
        .unwrap()
    };
    let new = layout_at(2, generation);
    new.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap();
    complete_one(&new).await;
    // The issue's 1 -> 2 -> 1: what was removed or lifted on 2 partitions stays so.
    assert_eq!(new.schedules().await.unwrap().len(), 1, "carried");
    assert_eq!(new.concurrency_caps().await.unwrap(), [("k".into(), 3)]);
    assert!(new.remove_schedule("tick").await.unwrap());
    new.set_concurrency_cap("k", None).await.unwrap();
    // Back to one partition: in bases of generation 2, where neither earlier generation may act.
    move_layout(&pool, "mv", 2, 1, |s| s).await.unwrap();
    assert!(layout(&old.enqueue(vec![job.clone()]).await.unwrap_err()));
    assert!(layout(&new.enqueue(vec![job.clone()]).await.unwrap_err()));
    let generation = check_layout(&pool, "mv", 1).await.unwrap();
    assert_eq!(generation, 2);
    let back = layout_at(1, generation);
    assert!(
        back.schedules().await.unwrap().is_empty(),
        "no schedule came back"
    );
    assert!(
        back.concurrency_caps().await.unwrap().is_empty(),
        "no cap came back"
    );
    back.enqueue(vec![job]).await.unwrap();
}

/// Issue 14: the lease index (`leases`) stays out of Redis' listpack encoding however few
/// leases are live — a listpack scans the whole set on every change, which cost Redis CPU per
/// job and made partitions dearer — and the member that keeps it so never shows: not as a
/// lease, not in the watermark, not reaped; a spent epoch's token set goes with its last
/// lease.
#[tokio::test]
async fn the_lease_index_stays_a_skiplist_and_its_marker_never_shows() {
    use palisade::{FencingToken, LeaseStore, NewJob, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let store = RedisLeaseStore::new(pool, "enc");
    // (Redis' default, stated: the marker is longer than this.)
    server.cli(&["CONFIG", "SET", "zset-max-listpack-value", "64"]);
    let encoding = |key: &str| server.cli(&["OBJECT", "ENCODING", key]).unwrap_or_default();
    store
        .enqueue((0..3).map(|_| NewJob::raw("k", "null")).collect())
        .await
        .unwrap();
    let claims = store
        .claim("default", "w", 2, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(claims.len(), 2);
    let epoch = claims[0].lease.token.epoch();
    let tokens = format!("{{enc}}:tokens:{epoch}");
    assert_eq!(encoding("{enc}:leases"), "skiplist");
    // (The token set too, without the marker: claim.lua removes it in the same call.)
    assert_eq!(encoding(&tokens), "skiplist");
    assert_eq!(server.cli(&["ZCARD", &tokens]).as_deref(), Some("2"));

    let mut listed: Vec<_> = store
        .leases(10)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.lease)
        .collect();
    let mut granted: Vec<_> = claims.iter().map(|c| c.lease.id).collect();
    listed.sort();
    granted.sort();
    assert_eq!(listed, granted, "only real leases are listed");

    let (first, second) = (&claims[0], &claims[1]);
    let done = store
        .settle(vec![(first.lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(done[0].is_ok());
    assert_eq!(
        store.watermark(),
        Some(second.lease.token),
        "the live lease's token"
    );

    // The last live lease of the epoch expires and is reaped: its token set goes, the marker
    // with it, and the watermark is the next token to grant.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let reaped = store.reap(100).await.unwrap();
    assert_eq!(reaped.len(), 1, "only the real lease is reaped: {reaped:?}");
    assert_eq!(server.cli(&["EXISTS", &tokens]).as_deref(), Some("0"));
    assert_eq!(
        server.cli(&["ZCARD", "{enc}:token_epochs"]).as_deref(),
        Some("0")
    );
    let third = store
        .claim("default", "w", 1, Duration::from_secs(30))
        .await
        .unwrap();
    let done = store
        .settle(vec![(third[0].lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(done[0].is_ok());
    let w = store.watermark().unwrap();
    assert!(
        w > third[0].lease.token
            && w <= FencingToken::new(epoch, third[0].lease.token.counter() + 1),
        "no live lease: the watermark is the next token ({w:?})"
    );
    assert_eq!(server.cli(&["EXISTS", &tokens]).as_deref(), Some("0"));
    assert!(store.leases(10).await.unwrap().is_empty());
}

/// Issue 24: a long collection queue of the sink leaves the listpack encoding (every insert
/// into a listpack scans it) and a short one stays in it (ten times smaller: a Redis Cluster
/// has one per slot). The member that turns a long one into a skiplist is gone when the call
/// returns: the queue holds fences only, they are still collected below the watermark, the
/// late writes refused, and the queue goes with its last fence.
#[tokio::test]
async fn a_long_collection_queue_is_a_skiplist_and_its_marker_is_never_collected() {
    use palisade::{Admission, FencedStore, FencingToken, LeaseId, Rejection, Scope};
    use palisade_testkit::suite::{fence, set, write};
    let (sink, server) = private_sink("cq");
    server.cli(&["CONFIG", "SET", "zset-max-listpack-value", "64"]);
    let lease = LeaseId::new();
    let encoding = || {
        server
            .cli(&["OBJECT", "ENCODING", "cq:collect"])
            .unwrap_or_default()
    };
    let fences = || server.cli(&["ZLEXCOUNT", "cq:collect", "-", "(~"]);
    let batch = |from: u64, to: u64| -> Vec<_> {
        (from..to)
            .map(|i| {
                write(
                    &format!("s{i}"),
                    fence(10 + i, lease),
                    "k",
                    set(&format!("d{i}"), "v"),
                )
            })
            .collect()
    };
    for out in sink.write_batch(batch(0, 3)).await.unwrap() {
        assert_eq!(out.unwrap(), Admission::Applied);
    }
    assert_eq!(encoding(), "listpack", "a short queue");
    for out in sink.write_batch(batch(3, 40)).await.unwrap() {
        assert_eq!(out.unwrap(), Admission::Applied);
    }
    // (Marked once the queue reaches 32, within the call.)
    assert_eq!(encoding(), "skiplist", "a long queue");
    assert_eq!(fences().as_deref(), Some("40"));
    assert_eq!(
        server.cli(&["ZCARD", "cq:collect"]).as_deref(),
        Some("40"),
        "fences only"
    );
    for out in sink.write_batch(batch(40, 41)).await.unwrap() {
        assert_eq!(out.unwrap(), Admission::Applied);
    }
    assert_eq!(fences().as_deref(), Some("41"));

    // Past every fence: the next calls collect them (18 a call of one write), and the queue
    // goes with the last.
    sink.observe_watermark(FencingToken::from_u64(1000));
    for key in ["k2", "k3", "k4"] {
        let late = sink
            .write(write("s0", fence(11, lease), key, set("d0", "late")))
            .await
            .unwrap();
        assert!(
            matches!(late, Admission::Rejected(Rejection::StaleToken { .. })),
            "{late:?}"
        );
        assert_eq!(encoding() == "skiplist", key != "k4", "after {key}");
    }
    assert_eq!(server.cli(&["EXISTS", "cq:collect"]).as_deref(), Some("0"));
    for i in 0..41 {
        assert_eq!(
            sink.highest(&Scope::new(format!("s{i}"))).await.unwrap(),
            None
        );
    }
    assert_eq!(server.cli(&["GET", "cq:d:d0"]).as_deref(), Some("v"));
}

/// The claim's guard for invariant 3: a ready job whose named scope is taken (a state only
/// another program or an older version could leave: of a scope only its head is ever
/// ready) waits aside with the score it had, and runs after the holder. The claim reads
/// that score only then, not for every candidate (issue 24).
#[tokio::test]
async fn a_ready_job_of_a_taken_scope_waits_aside_with_its_score() {
    use palisade::{JobId, LeaseStore, NewJob, Settlement};
    use std::time::Duration;
    let (store, server) = private_coordinator("aside");
    let (ia, ib) = (JobId::new(), JobId::new());
    let first = NewJob::raw("k", "1").with_scope("s").with_id(ia);
    let second = NewJob::raw("k", "2").with_scope("s").with_id(ib);
    let (a, b) = (ia.to_string(), ib.to_string());
    store.enqueue(vec![first, second]).await.unwrap();
    let score = server.cli(&["ZSCORE", "{aside}:wait:s", &b]).unwrap();
    assert!(!score.is_empty(), "the second waits behind the head");
    // Both ready, as no script of ours leaves them.
    server.cli(&["ZREM", "{aside}:wait:s", &b]).unwrap();
    server
        .cli(&["ZADD", "{aside}:q:default\tk", &score, &b])
        .unwrap();
    let claims = store
        .claim("default", "w", 2, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claims.len(), 1, "one lease per scope");
    assert_eq!(claims[0].job.id.to_string(), a);
    assert_eq!(
        server.cli(&["ZSCORE", "{aside}:wait:s", &b]).as_deref(),
        Some(score.as_str()),
        "aside with its score"
    );
    assert_eq!(
        server
            .cli(&["ZSCORE", "{aside}:q:default\tk", &b])
            .as_deref(),
        Some("")
    );
    let done = store
        .settle(vec![(claims[0].lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(done[0].is_ok());
    let next = store
        .claim("default", "w", 2, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].job.id.to_string(), b);
}

/// Enqueues `N` jobs under ids made here, each holding a unique key of its own, `u:<id>`
/// (not its id's key, which a job's end leaves to expire by itself), and returns the ids.
async fn enqueue_with_ids<const N: usize>(store: &RedisLeaseStore) -> [palisade::JobId; N] {
    use palisade::{JobId, LeaseStore, NewJob, ID_RETENTION};
    let ids: [JobId; N] = std::array::from_fn(|_| JobId::new());
    let jobs = ids
        .iter()
        .map(|&id| {
            NewJob::raw("k", "null")
                .with_unique_key(format!("u:{id}"), ID_RETENTION)
                .with_id(id)
        })
        .collect();
    store.enqueue(jobs).await.unwrap();
    ids
}

/// Claims `n` jobs and completes them all, each settlement accepted.
async fn claim_and_complete(store: &RedisLeaseStore, n: usize) {
    use palisade::{LeaseStore, Settlement};
    let claims = store
        .claim("default", "w", n, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claims.len(), n);
    let done = store
        .settle(
            claims
                .iter()
                .map(|c| (c.lease.id, Settlement::completed()))
                .collect(),
        )
        .await
        .unwrap();
    assert!(done.iter().all(|d| d.is_ok()), "{done:?}");
}

/// A completion gives the job's unique key up only while that key still names the job: one
/// that another job holds now, or that another program wrote over with another type, is
/// left as it is, and the completion settles (one read per job, not a TYPE and a GET).
#[tokio::test]
async fn a_completion_leaves_a_unique_key_it_does_not_hold_alone() {
    use palisade::JobId;
    let (store, server) = private_coordinator("uk");
    let ids: [JobId; 3] = enqueue_with_ids(&store).await;
    let key = |id: JobId| format!("{{uk}}:unique:u:{id}");
    // The first's key: another program's list. The second's: another job's now.
    server.cli(&["DEL", &key(ids[0])]).unwrap();
    server.cli(&["RPUSH", &key(ids[0]), "x"]).unwrap();
    server.cli(&["SET", &key(ids[1]), "someone-else"]).unwrap();
    claim_and_complete(&store, 3).await;
    assert_eq!(server.cli(&["TYPE", &key(ids[0])]).as_deref(), Some("list"));
    assert_eq!(server.cli(&["PTTL", &key(ids[0])]).as_deref(), Some("-1"));
    assert_eq!(
        server.cli(&["GET", &key(ids[1])]).as_deref(),
        Some("someone-else")
    );
    assert_eq!(server.cli(&["PTTL", &key(ids[1])]).as_deref(), Some("-1"));
    // The third held its own: kept for its ttl, then gone.
    let ttl: i64 = server
        .cli(&["PTTL", &key(ids[2])])
        .unwrap()
        .parse()
        .unwrap();
    assert!(ttl > 0, "{ttl}");
}

/// A completion hands its unique key's time to PEXPIREAT as the record holds it; a time with
/// leading zeros (written by another program: ours never has them), which PEXPIREAT refuses,
/// goes remade, so the settlement neither fails after its first write nor keeps the key forever.
#[tokio::test]
async fn a_unique_time_with_leading_zeros_still_ends_the_key_on_time() {
    use palisade::JobId;
    let (store, server) = private_coordinator("uz");
    let ids: [JobId; 2] = enqueue_with_ids(&store).await;
    let key = |id: JobId| format!("{{uz}}:unique:u:{id}");
    let record = |id: JobId| format!("{{uz}}:job:{id}");
    let until = |id: JobId| -> i64 {
        let at = server.cli(&["HGET", &record(id), "unique_until"]).unwrap();
        at.parse().unwrap()
    };
    let untils = [until(ids[0]), until(ids[1])];
    server
        .cli(&[
            "HSET",
            &record(ids[0]),
            "unique_until",
            &format!("00{}", untils[0]),
        ])
        .unwrap();
    claim_and_complete(&store, 2).await;
    for (id, until) in ids.into_iter().zip(untils) {
        let at: i64 = server
            .cli(&["PEXPIRETIME", &key(id)])
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(at, until, "{id}: the key expires at {at}, not {until}");
    }
}

/// The key of a job's own id expires by itself, at enqueue plus its ttl: the record does not
/// name it and the job's end leaves it as it was (a settlement neither reads nor writes it).
#[tokio::test]
async fn a_job_ids_key_expires_by_itself() {
    use palisade::{JobId, LeaseStore, NewJob, ID_RETENTION};
    let (store, server) = private_coordinator("ui");
    let id = JobId::new();
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let before = now_ms();
    store
        .enqueue(vec![NewJob::raw("k", "null").with_id(id)])
        .await
        .unwrap();
    let after = now_ms();
    let key = format!("{{ui}}:unique:id:{id}");
    let expiry = || -> i64 { server.cli(&["PEXPIRETIME", &key]).unwrap().parse().unwrap() };
    let at = expiry();
    let retention = ID_RETENTION.as_millis() as i64;
    assert!(
        (before + retention..=after + retention).contains(&at),
        "{at} not within {before}..={after} plus {retention}"
    );
    let record = format!("{{ui}}:job:{id}");
    assert_eq!(
        server.cli(&["HEXISTS", &record, "unique"]).as_deref(),
        Some("0")
    );
    claim_and_complete(&store, 1).await;
    assert_eq!(server.cli(&["GET", &key]), Some(id.to_string()));
    assert_eq!(expiry(), at);
}

/// A collection queue another program wrote over with another type turns collection off,
/// never the writes: they apply and fence, and the key is left as it is.
#[tokio::test]
async fn a_collection_queue_of_another_type_stops_collection_not_writes() {
    use palisade::{Admission, FencedStore, FencingToken, LeaseId, Rejection};
    use palisade_testkit::suite::{fence, set, write};
    let (sink, server) = private_sink("cw");
    server.cli(&["SET", "cw:collect", "not a queue"]).unwrap();
    let lease = LeaseId::new();
    let out = sink
        .write(write("s", fence(5, lease), "k", set("d", "v")))
        .await
        .unwrap();
    assert_eq!(out, Admission::Applied);
    sink.observe_watermark(FencingToken::from_u64(100));
    let late = sink
        .write(write("s", fence(6, lease), "k2", set("d", "late")))
        .await
        .unwrap();
    assert!(
        matches!(late, Admission::Rejected(Rejection::StaleToken { .. })),
        "{late:?}"
    );
    assert_eq!(
        server.cli(&["GET", "cw:collect"]).as_deref(),
        Some("not a queue")
    );
    assert_eq!(server.cli(&["GET", "cw:d:d"]).as_deref(), Some("v"));
    assert_eq!(
        server.cli(&["EXISTS", "cw:{s}:fence"]).as_deref(),
        Some("1"),
        "not collected"
    );
}

/// Collection forgets a queued fence only if it is still below the watermark: a scope whose
/// fence advanced after it was queued keeps it, so a writer between the watermark and the
/// newer token is still refused.
#[tokio::test]
async fn collection_keeps_a_fence_that_advanced_past_the_watermark() {
    use palisade::{Admission, FencedStore, FencingToken, LeaseId, Rejection, Scope};
    use palisade_testkit::suite::{fence, set, write};
    let (sink, server) = private_sink("adv");
    let (old, new) = (LeaseId::new(), LeaseId::new());
    for (token, lease, key) in [(10, old, "k1"), (200, new, "k2")] {
        let out = sink
            .write(write("s", fence(token, lease), key, set("d", key)))
            .await
            .unwrap();
        assert_eq!(out, Admission::Applied);
    }
    // The entry queued at 10 is due; the fence it names is at 200 now.
    sink.observe_watermark(FencingToken::from_u64(100));
    let between = sink
        .write(write(
            "s",
            fence(150, LeaseId::new()),
            "k3",
            set("d", "between"),
        ))
        .await
        .unwrap();
    assert!(
        matches!(between, Admission::Rejected(Rejection::StaleToken { ref highest, .. }) if highest.as_u64() == 200),
        "{between:?}"
    );
    let kept = sink
        .highest(&Scope::new("s"))
        .await
        .unwrap()
        .map(|f| f.token.as_u64());
    assert_eq!(kept, Some(200));
    assert_eq!(server.cli(&["GET", "adv:d:d"]).as_deref(), Some("k2"));
}

/// A lease asked for with a TTL past what a double holds as a whole number expires where it
/// did before claim.lua made its numbers "%d" (common.lua, arg_of): far in the future, not
/// at a wrapped-around negative time that the reaper would take at once.
#[tokio::test]
async fn a_lease_of_a_huge_ttl_is_never_reaped() {
    use palisade::{LeaseStore, NewJob};
    use std::time::Duration;
    let (store, _server) = private_coordinator("huge");
    store
        .enqueue(vec![NewJob::raw("k", "null"), NewJob::raw("k", "null")])
        .await
        .unwrap();
    for ttl in [
        Duration::from_millis(1 << 60),
        Duration::from_millis(u64::MAX),
    ] {
        let claims = store.claim("default", "w", 1, ttl).await.unwrap();
        assert_eq!(claims.len(), 1);
    }
    assert!(store.reap(10).await.unwrap().is_empty());
    let leases = store.leases(10).await.unwrap();
    assert_eq!(leases.len(), 2);
    // (`leases` shows the u64::MAX one as expiring in 0 s: now + u64::MAX ms does not fit the
    // u64 it is read into. It was so before; only the reaper decides, and it left it alone.)
    assert!(
        leases
            .iter()
            .any(|l| l.expires_in > Duration::from_secs(86400 * 365)),
        "{leases:?}"
    );
}

/// Whether `r` is the refusal of a call that found a key written over.
fn corrupt<T>(r: &Result<T, palisade::Error>) -> bool {
    r.as_ref()
        .err()
        .is_some_and(|e| e.to_string().contains("PALISADE_CORRUPT"))
}

/// Whether one settlement of a batch was refused for a key written over (it alone).
fn corrupt_settlement(r: &palisade::Result<()>) -> bool {
    r.as_ref()
        .err()
        .is_some_and(|e| e.to_string().contains("PALISADE_CORRUPT"))
}

/// Every key and its contents (`RedisServer::snapshot`).
fn snapshot(server: &RedisServer) -> Vec<(String, String)> {
    server.snapshot()
}

/// Enqueues `jobs` and claims them all (a lease of 30 s each).
async fn enqueue_and_claim(
    store: &RedisLeaseStore,
    jobs: impl IntoIterator<Item = palisade::NewJob>,
) -> Vec<palisade::Claim> {
    use palisade::LeaseStore;
    let jobs: Vec<_> = jobs.into_iter().collect();
    let n = jobs.len();
    store.enqueue(jobs).await.unwrap();
    let claims = store
        .claim("default", "w", n, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claims.len(), n);
    claims
}

/// A settlement batch checks the keys of alike settlements (no named scope, one queue and
/// epoch, one action) once, and a difference in what they write — a retry parking its job in
/// another kind's ready set, or in the delayed set — is checked on its own: each settlement
/// whose key another program wrote over is refused alone, the others go through.
#[tokio::test]
async fn alike_settlements_share_a_check_only_where_they_write_alike() {
    use palisade::{LeaseStore, NewJob, Settlement};
    use std::time::Duration;
    let (store, server) = private_coordinator("al");
    let kinds = ["a", "b", "a", "a"];
    let claims = enqueue_and_claim(&store, kinds.iter().map(|k| NewJob::raw(*k, "null"))).await;
    // Kind b's ready set (empty now) and the delayed set: lists of another program's.
    server.cli(&["RPUSH", "{al}:q:default\tb", "x"]).unwrap();
    server
        .cli(&["RPUSH", "{al}:q:default:delayed", "x"])
        .unwrap();
    let of = |kind: &str, nth: usize| {
        claims
            .iter()
            .filter(|c| c.job.kind == kind)
            .nth(nth)
            .unwrap()
            .lease
            .id
    };
    let retry = |ms: u64| Settlement::Retry {
        delay: Duration::from_millis(ms),
        reason: "again".into(),
    };
    let out = store
        .settle(vec![
            (of("a", 0), retry(0)),
            (of("b", 0), retry(0)),
            (of("a", 1), retry(60_000)),
            (of("a", 2), Settlement::completed()),
        ])
        .await
        .unwrap();
    assert!(out[0].is_ok(), "{out:?}");
    assert!(
        corrupt_settlement(&out[1]),
        "another kind's ready set: {out:?}"
    );
    assert!(corrupt_settlement(&out[2]), "the delayed set: {out:?}");
    assert!(out[3].is_ok(), "{out:?}");
    server
        .cli(&["DEL", "{al}:q:default\tb", "{al}:q:default:delayed"])
        .unwrap();
    let counts = store.counts("default").await.unwrap();
    assert_eq!(
        (counts.ready, counts.leased, counts.completed),
        (1, 2, 1),
        "{counts:?}"
    );
}

/// Found by the attack review of the shared checks: a job record another program edited — a
/// group of "" where the batch's first settlement had none, or its group removed while its
/// lease counts against the group's cap — is checked, and gives its slot back, on its own.
#[tokio::test]
async fn odd_records_do_not_share_a_check_or_keep_a_groups_slot() {
    use palisade::{GroupLimits, LeaseStore, NewJob, Settlement};
    use std::time::Duration;
    let (store, server) = private_coordinator("ag");
    let claims =
        enqueue_and_claim(&store, [NewJob::raw("k", "null"), NewJob::raw("k", "null")]).await;
    // The second's record names the group "", whose record is another program's string.
    let record = format!("{{ag}}:job:{}", claims[1].job.id);
    server.cli(&["HSET", &record, "group", ""]).unwrap();
    server.cli(&["SET", "{ag}:group:", "x"]).unwrap();
    let retry = || Settlement::Retry {
        delay: Duration::ZERO,
        reason: "again".into(),
    };
    let out = store
        .settle(vec![
            (claims[0].lease.id, retry()),
            (claims[1].lease.id, retry()),
        ])
        .await
        .unwrap();
    assert!(out[0].is_ok(), "{out:?}");
    assert!(
        corrupt_settlement(&out[1]),
        "a group of \"\" is not none: {out:?}"
    );
    assert_eq!(server.cli(&["GET", "{ag}:group:"]).as_deref(), Some("x"));

    // A capped group's job whose record lost its group: its end still gives the slot back.
    let capped = GroupLimits {
        cap: Some(1),
        ..GroupLimits::default()
    };
    store.set_group_limits("g", capped).await.unwrap();
    store
        .enqueue(vec![NewJob::raw("k", "null").with_group("g")])
        .await
        .unwrap();
    let grouped = store
        .claim("default", "w", 5, Duration::from_secs(30))
        .await
        .unwrap()
        .into_iter()
        .find(|c| c.job.group.as_deref() == Some("g"))
        .expect("the grouped job is claimed");
    assert_eq!(store.group("g").await.unwrap().running, 1);
    let record = format!("{{ag}}:job:{}", grouped.job.id);
    server.cli(&["HDEL", &record, "group"]).unwrap();
    let done = store
        .settle(vec![(grouped.lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(done[0].is_ok(), "{done:?}");
    assert_eq!(store.group("g").await.unwrap().running, 0);
}

/// A settlement reads its leases' expiries only when some lease has expired or the two
/// records of the leases disagree in number: an expired lease beside a current one in one
/// batch is refused alone, and with the expiries gone (the key evicted, say) no lease
/// counts as current.
#[tokio::test]
async fn a_lease_is_current_only_while_its_expiry_is_known_and_ahead() {
    use palisade::{LeaseStore, NewJob, Settlement};
    use std::time::Duration;
    let (store, server) = private_coordinator("ax");
    store
        .enqueue((0..3).map(|_| NewJob::raw("k", "null")).collect())
        .await
        .unwrap();
    let short = store
        .claim("default", "w", 1, Duration::from_millis(150))
        .await
        .unwrap();
    let long = store
        .claim("default", "w", 2, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!((short.len(), long.len()), (1, 2));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = store
        .settle(vec![
            (short[0].lease.id, Settlement::completed()),
            (long[0].lease.id, Settlement::completed()),
        ])
        .await
        .unwrap();
    assert!(out[0].is_err(), "the expired lease: {out:?}");
    assert!(out[1].is_ok(), "the current one: {out:?}");
    // The expired one reaped, no lease is expired now; then the expiries are lost.
    assert_eq!(store.reap(10).await.unwrap().len(), 1);
    server.cli(&["DEL", "{ax}:leases"]).unwrap();
    let out = store
        .settle(vec![(long[1].lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(out[0].is_err(), "no expiry, not current: {out:?}");

    // Found by the attack review: another program renewing the claims' marker (at +inf in
    // `leases`) as if it were a lease would give it a finite expiry, counted as a lease's.
    let claimed = store
        .claim("default", "w", 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "the reaped job, ready again");
    let marker = server
        .cli(&["ZRANGEBYSCORE", "{ax}:leases", "+inf", "+inf"])
        .expect("a claim keeps its marker at +inf");
    let dir = env!("CARGO_MANIFEST_DIR");
    let renew = ["common.lua", "renew.lua"]
        .map(|f| std::fs::read_to_string(format!("{dir}/../redis/lua/{f}")).unwrap())
        .concat();
    let lost = server.cli(&["EVAL", &renew, "1", "{ax}:", "10000", &marker, "0"]);
    assert_eq!(lost.as_deref(), Some(marker.as_str()), "not renewed");
    assert_eq!(
        server.cli(&["ZSCORE", "{ax}:leases", &marker]).as_deref(),
        Some("inf")
    );
}

/// Redis does not roll a script back: a key another program wrote over, in the middle of what
/// a claim, settlement, cancel or enqueue writes, fails the call whole before its first
/// write (a reap skips that lease) (`PALISADE_CORRUPT`, naming the key) — it used to fail halfway, a claim after it had
/// recorded leases nobody was told of. A job record written over counts as gone and does not
/// fail the rest of its batch; a count that is not a number reads as 0.
#[tokio::test]
async fn keys_written_over_fail_calls_whole_before_any_write() {
    use palisade::{LeaseStore, NewJob, RedisLeaseStore, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let store = RedisLeaseStore::new(palisade::store::redis::pool(&server.url()).unwrap(), "cx");
    store
        .enqueue(vec![
            NewJob::raw("k", "null"),
            NewJob::raw("k", "null").with_scope("s"),
            NewJob::raw("k", "null").with_scope("s"),
        ])
        .await
        .unwrap();

    // enqueue: the enqueue counter, a stats hash.
    for (key, value) in [("{cx}:seq", "many"), ("{cx}:wait:t", "x")] {
        let was = server.cli(&["GET", key]);
        server.cli(&["SET", key, value]);
        let before = snapshot(&server);
        let r = store
            .enqueue(vec![
                NewJob::raw("k", "null"),
                NewJob::raw("k", "null").with_scope("t"),
            ])
            .await;
        assert!(corrupt(&r), "{key}: {r:?}");
        assert_eq!(snapshot(&server), before, "{key}: nothing changed");
        match was {
            Some(v) if !v.is_empty() => server.cli(&["SET", key, &v]),
            _ => server.cli(&["DEL", key]),
        };
    }

    // claim: the lease index is written last; it must not be half-done. (A first claim
    // establishes the epoch, a write of its own.)
    store
        .claim("elsewhere", "w", 1, Duration::from_secs(1))
        .await
        .unwrap();
    server.cli(&["SET", "{cx}:lease_job", "x"]);
    let before = snapshot(&server);
    let r = store
        .claim("default", "w", 5, Duration::from_millis(300))
        .await;
    assert!(corrupt(&r), "{r:?}");
    assert_eq!(snapshot(&server), before, "claim changed nothing");
    server.cli(&["DEL", "{cx}:lease_job"]);
    // Long enough for the settlements below on a loaded machine; the reap waits it out.
    let claims = store
        .claim("default", "w", 5, Duration::from_millis(1500))
        .await
        .unwrap();
    assert_eq!(claims.len(), 2, "one of scope s waits its turn");

    // settle: the scope's newest-token record. Each settlement is checked on its own: the
    // scoped one (which writes `last`) is refused alone with nothing changed, its lease kept;
    // the default-scoped one goes through.
    server.cli(&["DEL", "{cx}:last"]);
    server.cli(&["RPUSH", "{cx}:last", "x"]);
    let scoped = claims
        .iter()
        .find(|c| c.lease.scope.as_str() == "s")
        .unwrap();
    let plain = claims
        .iter()
        .find(|c| c.lease.scope.as_str() != "s")
        .unwrap();
    let before = snapshot(&server);
    let only_scoped = store
        .settle(vec![(scoped.lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(corrupt_settlement(&only_scoped[0]), "{only_scoped:?}");
    // (The call still publishes the low watermark, which only reflects the leases.)
    let unpublished = |s: Vec<(String, String)>| -> Vec<(String, String)> {
        s.into_iter()
            .filter(|(k, _)| k != "{cx}:watermark")
            .collect()
    };
    assert_eq!(
        unpublished(snapshot(&server)),
        unpublished(before),
        "the refused settlement changed nothing"
    );
    let r = store
        .settle(vec![
            (scoped.lease.id, Settlement::completed()),
            (plain.lease.id, Settlement::completed()),
        ])
        .await
        .unwrap();
    assert!(corrupt_settlement(&r[0]), "{r:?}");
    assert!(
        r[1].is_ok(),
        "the good settlement of the batch went through: {r:?}"
    );
    let live: Vec<_> = store.leases(10).await.unwrap();
    assert_eq!(live.len(), 1, "the refused one keeps its lease: {live:?}");
    assert_eq!(live[0].lease, scoped.lease.id);
    server.cli(&["DEL", "{cx}:last"]);

    // reap: the dead-letter list (the leases expire; max_stalls lets them be requeued, but a
    // reap may bury, so the list is checked). Reaping goes per lease: the leases whose keys
    // were written over stay as they are, and the reaper carries on with the others.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    server.cli(&["SET", "{cx}:q:default:dead", "x"]);
    let before = snapshot(&server);
    let r = store.reap(10).await.unwrap();
    assert!(r.is_empty(), "{r:?}");
    assert_eq!(snapshot(&server), before, "reap changed nothing");
    server.cli(&["DEL", "{cx}:q:default:dead"]);
    assert_eq!(store.reap(10).await.unwrap().len(), 1);

    // cancel: the delayed set.
    let queued = store.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap()[0];
    server.cli(&["SET", "{cx}:q:default:delayed", "x"]);
    let before = snapshot(&server);
    let r = store.cancel(queued, "no").await;
    assert!(corrupt(&r), "{r:?}");
    assert_eq!(snapshot(&server), before, "cancel changed nothing");
    server.cli(&["DEL", "{cx}:q:default:delayed"]);

    // A job record written over, and an attempt count that is not a number: the batch goes
    // through; the written-over job counts as gone, the other is released with attempt 0.
    let claims = store
        .claim("default", "w", 3, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(claims.len() >= 2, "{claims:?}");
    let (gone, odd) = (&claims[0], &claims[1]);
    server.write_over(&format!("{{cx}}:job:{}", gone.job.id), "x");
    server.cli(&[
        "HSET",
        &format!("{{cx}}:job:{}", odd.job.id),
        "attempt",
        "x",
    ]);
    let results = store
        .settle(vec![
            (gone.lease.id, Settlement::completed()),
            (odd.lease.id, Settlement::Release),
        ])
        .await
        .unwrap();
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(
        server
            .cli(&["HGET", &format!("{{cx}}:job:{}", odd.job.id), "attempt"])
            .as_deref(),
        Some("0")
    );
    let again = store
        .claim("default", "w", 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        again.iter().any(|c| c.job.id == odd.job.id),
        "the released job is ready again"
    );
}

/// Issue 20.2: one bad record used to fail a whole settle batch — the worker dropped the good
/// settlements (their jobs re-ran after expiry). Each settlement now has its own outcome: the
/// one whose keys were written over is refused alone, changes nothing and keeps its lease
/// (nothing lost), and once the key is repaired it settles. A scoped job whose record was
/// written over while leased used to wedge its scope for good (the scope was known only from
/// the record); the lease entry carries the scope, so settling or reaping hands it on.
#[tokio::test]
async fn one_bad_record_fails_only_its_own_settlement_and_never_wedges_a_scope() {
    use palisade::{LeaseStore, NewJob, RedisLeaseStore, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let store = RedisLeaseStore::new(palisade::store::redis::pool(&server.url()).unwrap(), "ox");
    let ttl = Duration::from_secs(30);
    store
        .enqueue(vec![
            NewJob::raw("k", "null").with_queue("bad"),
            NewJob::raw("k", "null"),
            NewJob::raw("k", "null"),
        ])
        .await
        .unwrap();
    let bad = store.claim("bad", "w", 1, ttl).await.unwrap();
    let good = store.claim("default", "w", 2, ttl).await.unwrap();
    assert_eq!((bad.len(), good.len()), (1, 2));
    server.write_over("{ox}:q:bad:stats", "x");
    let results = store
        .settle(vec![
            (good[0].lease.id, Settlement::completed()),
            (bad[0].lease.id, Settlement::completed()),
            (good[1].lease.id, Settlement::completed()),
        ])
        .await
        .unwrap();
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert!(
        corrupt_settlement(&results[1]),
        "the bad one is refused, naming the key: {results:?}"
    );
    let e = results[1].as_ref().unwrap_err().to_string();
    assert!(e.contains("{ox}:q:bad:stats"), "{e}");
    let live = store.leases(10).await.unwrap();
    assert_eq!(live.len(), 1, "only the bad lease is left: {live:?}");
    assert_eq!(live[0].lease, bad[0].lease.id);
    // Repaired, it settles: nothing was lost.
    server.cli(&["DEL", "{ox}:q:bad:stats"]);
    let again = store
        .settle(vec![(bad[0].lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(again[0].is_ok(), "{again:?}");
    assert!(store.leases(10).await.unwrap().is_empty());

    // A scoped job's record written over while it is leased: settling it hands the scope's
    // turn on, and so does reaping it.
    store
        .enqueue(
            (0..3)
                .map(|_| NewJob::raw("k", "null").with_scope("acct:1"))
                .collect(),
        )
        .await
        .unwrap();
    let first = store.claim("default", "w", 5, ttl).await.unwrap();
    assert_eq!(first.len(), 1, "one at a time per scope");
    let job = format!("{{ox}}:job:{}", first[0].job.id);
    server.write_over(&job, "written over");
    let r = store
        .settle(vec![(first[0].lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let second = store
        .claim("default", "w", 5, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(second.len(), 1, "the scope's next job was handed the turn");
    assert_eq!(second[0].lease.scope.as_str(), "acct:1");
    let job = format!("{{ox}}:job:{}", second[0].job.id);
    server.write_over(&job, "written over");
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.reap(10).await.unwrap();
    assert!(store.leases(10).await.unwrap().is_empty(), "reaped");
    let third = store.claim("default", "w", 5, ttl).await.unwrap();
    assert_eq!(third.len(), 1, "the reaped lease handed the scope on too");
    assert_eq!(
        server.cli(&["HGET", "{ox}:live", "acct:1"]).as_deref(),
        Some(third[0].lease.id.to_string().as_str())
    );
}

/// Found by the attack review of the type checks: values another program wrote that Lua reads
/// as numbers but Redis or cjson refuse (NaN, inf, 1e999, fractions) never make a script fail
/// after its first write, and never lose a job: an epoch or counter that is not a plain
/// integer is not intact, counts read as 0, a meta record with one reads as corrupt (its job
/// goes on with defaults), a dead-letter record cjson cannot write back stays where it is, and
/// a scope's next job whose queue keys were written over fails the settlement whole.
#[tokio::test]
async fn numbers_lua_reads_but_redis_refuses_never_fail_halfway() {
    use palisade::{LeaseStore, NewJob, RedisLeaseStore, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let store = RedisLeaseStore::new(palisade::store::redis::pool(&server.url()).unwrap(), "nx");
    let job = |id: &palisade::JobId| format!("{{nx}}:job:{id}");
    let ttl = Duration::from_millis(300);
    store
        .enqueue((0..4).map(|_| NewJob::raw("k", "null")).collect())
        .await
        .unwrap();

    // A counter of "nan" is not intact: the claim moves to a new epoch first.
    let first = store.claim("default", "w", 1, ttl).await.unwrap();
    server.cli(&["SET", "{nx}:counter", "nan"]);
    let second = store.claim("default", "w", 1, ttl).await.unwrap();
    assert!(second[0].lease.token.epoch() > first[0].lease.token.epoch());
    // An epoch that is not a number cannot be moved past: claims fail, changing nothing.
    server.cli(&["HSET", "{nx}:epoch", "epoch", "abc"]);
    let before = snapshot(&server);
    assert!(store.claim("default", "w", 1, ttl).await.is_err());
    assert_eq!(
        snapshot(&server),
        before,
        "a claim on an unreadable epoch changed nothing"
    );
    server.cli(&["DEL", "{nx}:epoch"]);

    // Stall and attempt counts of "inf" and "1e999", a unique_until of "1e20", a priority of
    // NaN in the meta: reaped, completed and released without a raise, nothing lost.
    server.cli(&[
        "HSET",
        &job(&first[0].job.id),
        "stalls",
        "inf",
        "attempt",
        "1e999",
    ]);
    server.cli(&[
        "HSET",
        &job(&second[0].job.id),
        "unique_until",
        "1e20",
        "unique",
        "u",
    ]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let reaped = store.reap(10).await.unwrap();
    assert_eq!(reaped.len(), 2, "{reaped:?}");
    assert_eq!(
        server
            .cli(&["HGET", &job(&first[0].job.id), "stalls"])
            .as_deref(),
        Some("1"),
        "a count that is not a number reads as 0"
    );
    let claims = store
        .claim("default", "w", 4, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claims.len(), 4, "nothing lost: {claims:?}");
    let nan_meta = r#"{"kind":"k","payload":null,"queue":"default","scope":null,"priority":NaN,"max_attempts":5,"max_stalls":1e999}"#;
    server.cli(&["HSET", &job(&claims[0].job.id), "meta", nan_meta]);
    server.cli(&[
        "HSET",
        &job(&claims[1].job.id),
        "unique_until",
        "9999999999999.5",
        "unique",
        "v",
    ]);
    server.cli(&["SET", "{nx}:unique:v", &claims[1].job.id.to_string()]);
    server.cli(&[
        "HSET",
        &job(&claims[2].job.id),
        "attempt",
        "nan",
        "meta",
        nan_meta,
    ]);
    let results = store
        .settle(vec![
            (claims[0].lease.id, Settlement::Release),
            (claims[1].lease.id, Settlement::completed()),
            (
                claims[2].lease.id,
                Settlement::Dead {
                    reason: "no".into(),
                },
            ),
        ])
        .await
        .unwrap();
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    let dead = store.dead("default", 10).await.unwrap();
    assert_eq!(
        dead.len(),
        1,
        "the dead-lettered job has its record: {dead:?}"
    );

    // A dead-letter record cjson cannot write back stays in the list; the good one moves.
    server.cli(&["RPUSH", "{nx}:q:default:dead", r#"{"id":"x","queue":"default","kind":"k","scope":"job:x","payload":1e999,"max_attempts":1,"max_stalls":1}"#]);
    let moved = store.retry_dead("default", 10).await.unwrap();
    assert_eq!(moved, 1);
    assert_eq!(
        server.cli(&["LLEN", "{nx}:q:default:dead"]).as_deref(),
        Some("1")
    );

    // A scope's next job lives in a queue whose kinds set was written over: the head's
    // completion fails whole rather than drop the next job.
    store
        .enqueue(vec![
            NewJob::raw("k", "null").with_scope("s"),
            NewJob::raw("k", "null").with_scope("s").with_queue("other"),
        ])
        .await
        .unwrap();
    let head = store
        .claim("default", "w", 10, Duration::from_secs(30))
        .await
        .unwrap();
    let head: Vec<_> = head
        .into_iter()
        .filter(|c| c.lease.scope.as_str() == "s")
        .collect();
    assert_eq!(head.len(), 1);
    server.cli(&["SET", "{nx}:q:other:kinds", "x"]);
    let before = snapshot(&server);
    let r = store
        .settle(vec![(head[0].lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(corrupt_settlement(&r[0]), "{r:?}");
    assert_eq!(
        snapshot(&server),
        before,
        "nothing changed, the next job kept"
    );
}

/// Found by the third attack review: counts in forms Lua reads but INCRBY refuses ("01",
/// "-0") fail a call whole before its first write; leases skipped by the reaper never starve
/// the good ones behind them; a watermark record no client can read is ignored, not returned.
#[tokio::test]
async fn odd_integers_skipped_leases_and_odd_watermarks() {
    use palisade::{LeaseStore, NewJob, RedisLeaseStore, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let store = RedisLeaseStore::new(palisade::store::redis::pool(&server.url()).unwrap(), "oz");
    store
        .enqueue(
            (0..5)
                .map(|i| NewJob::raw("k", "null").with_queue(if i < 3 { "bad" } else { "good" }))
                .collect(),
        )
        .await
        .unwrap();
    store
        .claim("none", "w", 1, Duration::from_secs(1))
        .await
        .unwrap();
    server.cli(&["HSET", "{oz}:q:good:stats", "leased", "01"]);
    let before = snapshot(&server);
    let r = store
        .claim("good", "w", 5, Duration::from_millis(300))
        .await;
    assert!(corrupt(&r), "{r:?}");
    assert_eq!(snapshot(&server), before, "claim changed nothing");
    server.cli(&["HSET", "{oz}:q:good:stats", "leased", "0"]);

    // Three leases of a queue whose stats were written over expire first, two good ones
    // after them: a reap of 3 at a time still reaps the good ones.
    let bad = store
        .claim("bad", "w", 3, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(bad.len(), 3);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let good = store
        .claim("good", "w", 2, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(good.len(), 2);
    server.cli(&["DEL", "{oz}:q:bad:stats"]);
    server.cli(&["SET", "{oz}:q:bad:stats", "x"]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let reaped = store.reap(3).await.unwrap();
    assert_eq!(
        reaped.len(),
        2,
        "the good leases behind the stuck ones: {reaped:?}"
    );

    // A stored watermark no client can read counts as absent.
    server.cli(&["HSET", "{oz}:watermark", "epoch", "inf", "counter", "nan"]);
    let again = store
        .claim("good", "w", 1, Duration::from_secs(30))
        .await
        .unwrap();
    let done = store
        .settle(vec![(again[0].lease.id, Settlement::completed())])
        .await
        .unwrap();
    assert!(done[0].is_ok());
    assert!(store.watermark().is_some());
}

/// Issue 24: the pipelined settle-and-claim on a server that cannot run it as sent — no epoch
/// yet (the claim part is refused with PALISADE_EPOCH), and scripts flushed (both parts
/// answered NOSCRIPT) — does each refused part again on its own, losing nothing.
#[tokio::test]
async fn a_pipelined_pair_redoes_a_part_the_server_did_not_run() {
    use palisade::{ClaimRequest, Error, LeaseId, LeaseStore, NewJob, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let store = RedisLeaseStore::new(pool, "pair");
    let request = ClaimRequest {
        queue: "default".into(),
        kinds: Vec::new(),
        worker: "t".into(),
        n: 5,
        ttl: Duration::from_secs(30),
    };
    store
        .enqueue(vec![NewJob::raw("a", "null"), NewJob::raw("b", "null")])
        .await
        .unwrap();
    assert_eq!(server.cli(&["EXISTS", "{pair}:epoch"]).unwrap(), "0");
    let nobody = LeaseId::new();
    let (settled, claimed) = store
        .settle_and_claim(vec![(nobody, Settlement::Release)], &request)
        .await;
    assert!(matches!(
        settled.unwrap()[0],
        Err(Error::LeaseNotCurrent(_))
    ));
    let claimed = claimed.expect("the claim establishes an epoch and is made again");
    assert_eq!(claimed.len(), 2);

    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    store.enqueue(vec![NewJob::raw("c", "null")]).await.unwrap();
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    let (settled, again) = store
        .settle_and_claim(
            claimed
                .iter()
                .map(|c| (c.lease.id, Settlement::completed()))
                .collect(),
            &request,
        )
        .await;
    assert!(settled.unwrap().iter().all(Result::is_ok));
    let again = again.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].job.kind, "c");
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.completed, counts.leased), (2, 1));
}

/// Issue 25, changed by issue 55: a follow-up record another program wrote over (or a later
/// release's) does not stop the sweep, and it is no longer forgotten: it is left where it is,
/// unlisted, while the readable sets around it are listed. A member that is no job id does
/// not fail the listing either.
#[tokio::test]
async fn a_follow_up_record_written_over_does_not_stop_the_sweep() {
    use palisade::{JobId, LeaseStore};
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let store = RedisLeaseStore::new(pool, "fu");
    let (parent, readable) = (JobId::new(), JobId::new());
    server.cli(&["SET", &format!("{{fu}}:then:{parent}"), "not json"]);
    server.cli(&["ZADD", "{fu}:thens", "0", &parent.to_string()]);
    server.cli(&["ZADD", "{fu}:thens", "0", "not-a-job"]);
    server.cli(&["SET", &format!("{{fu}}:then:{readable}"), "[]"]);
    server.cli(&["ZADD", "{fu}:thens", "1", &readable.to_string()]);
    let listed = store.follow_ups(Duration::ZERO, 1).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].parent, readable);
    store.forget_follow_ups(readable).await.unwrap();
    assert!(store
        .follow_ups(Duration::ZERO, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        server
            .cli(&["GET", &format!("{{fu}}:then:{parent}")])
            .as_deref(),
        Some("not json"),
        "the record was deleted"
    );
    assert_eq!(server.cli(&["ZCARD", "{fu}:thens"]).as_deref(), Some("2"));
}

/// Issue 25: the follow-up list `thens` written over by another program (a type clash)
/// refuses, before any write, only the completions in a batch that carry follow-up jobs —
/// each keeps its lease for the reaper — while the rest of the batch settles.
#[tokio::test]
async fn a_thens_key_written_over_refuses_only_completions_with_follow_ups() {
    use palisade::{Error, LeaseStore, NewJob, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let store = RedisLeaseStore::new(pool, "clash");
    store
        .enqueue(vec![NewJob::raw("a", "null"), NewJob::raw("b", "null")])
        .await
        .unwrap();
    let claims = store
        .claim("default", "t", 2, Duration::from_secs(30))
        .await
        .unwrap();
    server.write_over("{clash}:thens", "not a zset");
    let with_follow_ups = Settlement::Complete {
        result: Some("1".into()),
        then: palisade::Then {
            jobs: vec![NewJob::raw("child", "null")],
            ..Default::default()
        },
    };
    let results = store
        .settle(vec![
            (claims[0].lease.id, with_follow_ups),
            (claims[1].lease.id, Settlement::completed()),
        ])
        .await
        .unwrap();
    assert!(
        matches!(&results[0], Err(Error::Backend(why)) if why.contains("PALISADE_CORRUPT")),
        "{results:?}"
    );
    assert!(results[1].is_ok(), "{results:?}");
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.completed, counts.leased), (1, 1), "{counts:?}");
    assert_eq!(
        server.cli(&["EXISTS", &format!("{{clash}}:result:{}", claims[0].job.id)]),
        Some("0".into()),
        "the refused completion wrote its result"
    );
    assert_eq!(
        server.cli(&["GET", "{clash}:thens"]),
        Some("not a zset".into())
    );
}

/// The console's one-job operations meet records another program wrote: a dead letter whose
/// id is no job id, whose payload is not a string, or whose counts are negative is never
/// revived (a claim could not read it back) and stays as it was; the dead page and the
/// delayed list leave out a record they cannot read instead of failing; a key of another type
/// reads as empty and changes nothing; names with a tab are refused.
#[tokio::test]
async fn the_console_operations_leave_foreign_records_alone() {
    use palisade::{Inspect, JobId, LeaseStore, NewJob, QueueAdmin, RedisLeaseStore, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let store = RedisLeaseStore::new(palisade::store::redis::pool(&server.url()).unwrap(), "fx");
    let dead = "{fx}:q:default:dead";
    let id = JobId::new();
    let foreign = [
        r#"{"id":"not-a-uuid","queue":"default","kind":"k","scope":"job:x","payload":"{}","max_attempts":1,"max_stalls":1}"#.to_string(),
        format!(
            r#"{{"id":"{id}","queue":"default","kind":"k","scope":"job:{id}","payload":7,"max_attempts":1,"max_stalls":1}}"#
        ),
        format!(
            r#"{{"id":"{id}","queue":"default","kind":"k","scope":"job:{id}","payload":"{{}}","max_attempts":-1,"max_stalls":1}}"#
        ),
    ];
    for record in &foreign {
        server.cli(&["RPUSH", dead, record]);
    }
    let before = snapshot(&server);
    assert!(!store.retry_dead_job("default", id).await.unwrap());
    assert_eq!(store.retry_dead("default", 10).await.unwrap(), 0);
    assert_eq!(snapshot(&server).len(), before.len());
    assert_eq!(
        server.cli(&["LLEN", dead]).as_deref(),
        Some("3"),
        "all kept"
    );
    assert!(
        server
            .cli(&["EXISTS", &format!("{{fx}}:job:{id}")])
            .as_deref()
            == Some("0"),
        "nothing revived"
    );
    // Read: the unreadable ones are left out, not the page (the last one reads: it is only
    // not revivable).
    assert!(store.dead_range("default", 0, 10).await.unwrap().len() <= 1);
    // Deleting works on what the page shows.
    assert!(store.purge_dead_job("default", id).await.unwrap());
    assert_eq!(server.cli(&["LLEN", dead]).as_deref(), Some("2"));

    // A dead list of another type: nothing found, nothing changed.
    server.cli(&["DEL", dead]);
    server.cli(&["SET", dead, "x"]);
    assert!(!store.retry_dead_job("default", id).await.unwrap());
    assert!(!store.purge_dead_job("default", id).await.unwrap());
    assert!(
        !store.forget_queue("default").await.unwrap(),
        "in use: a key of another type"
    );
    server.cli(&["DEL", dead]);

    // A delayed job whose attempt count was written over still lists; a job id in the
    // delayed set without a record is left out.
    let later = store
        .enqueue(vec![
            NewJob::raw("k", "null").with_delay(Duration::from_secs(3600))
        ])
        .await
        .unwrap()[0];
    server.cli(&["HSET", &format!("{{fx}}:job:{later}"), "attempt", "lots"]);
    server.cli(&[
        "ZADD",
        "{fx}:q:default:delayed",
        "1",
        &JobId::new().to_string(),
    ]);
    let delayed = store.delayed("default", 10).await.unwrap();
    assert_eq!(delayed.len(), 1, "{delayed:?}");
    assert_eq!((delayed[0].job.id, delayed[0].job.attempt), (later, 0));
    // run_now on it, and on a job id that is no delayed job.
    assert!(store.run_now(later).await.unwrap());
    assert!(!store.run_now(JobId::new()).await.unwrap());
    let c = store
        .claim("default", "w", 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(c.iter().any(|c| c.job.id == later), "{c:?}");
    let _ = store
        .settle(
            c.iter()
                .map(|c| (c.lease.id, Settlement::completed()))
                .collect(),
        )
        .await
        .unwrap();

    // A tick another program wrote that cjson could not keep exactly (1e20) is dropped from
    // the dead letter, which still reads.
    let ticked = store.enqueue(vec![NewJob::raw("k", "null")]).await.unwrap()[0];
    let key = format!("{{fx}}:job:{ticked}");
    let meta = server.cli(&["HGET", &key, "meta"]).unwrap();
    let meta = meta.replacen('{', r#"{"tick":{"schedule":"s","at_ms":1e20},"#, 1);
    server.cli(&["HSET", &key, "meta", &meta]);
    store.cancel(ticked, "stop").await.unwrap();
    let dead = store.dead_range("default", 0, 10).await.unwrap();
    let d = dead
        .iter()
        .find(|d| d.job.id == ticked)
        .expect("the dead letter reads");
    assert_eq!(d.job.tick, None);

    // Names with a tab would alias another queue's keys: refused before any read or write.
    assert!(store.forget_queue("a\tb").await.is_err());
    assert!(store.retry_dead_job("a\tb", id).await.is_err());
    assert!(store.purge_dead_job("a\tb", id).await.is_err());
}

/// Groups on Redis where only Redis can go wrong: a running count an older process left high
/// (it reaped a grouped lease without giving the slot back) parks a capped group, and setting
/// its limits again counts it afresh from the live leases; group keys another program wrote
/// over fail an enqueue or a claim whole, skip a reap's lease, and pass over one group's lanes
/// without stopping the others'.
#[tokio::test]
async fn group_counts_heal_and_group_keys_written_over_change_nothing_halfway() {
    use palisade::{GroupLimits, LeaseStore, NewJob, Settlement};
    use std::time::Duration;
    let server = RedisServer::start();
    let store = RedisLeaseStore::new(palisade::store::redis::pool(&server.url()).unwrap(), "gx");
    let grouped = |g: &str| NewJob::raw("k", "null").with_group(g);
    let ttl = Duration::from_secs(30);
    let capped = GroupLimits {
        cap: Some(1),
        ..GroupLimits::default()
    };
    store.set_group_limits("g", capped).await.unwrap();
    store
        .enqueue(vec![grouped("g"), grouped("g"), grouped("g")])
        .await
        .unwrap();
    let first = store.claim("default", "w", 5, ttl).await.unwrap();
    assert_eq!(first.len(), 1);
    // An older process reaped a lease of the group without giving its slot back.
    server.cli(&["HSET", "{gx}:group:g", "running", "5"]);
    store
        .settle(vec![(first[0].lease.id, Settlement::completed())])
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();
    assert!(store
        .claim("default", "w", 5, ttl)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.group("g").await.unwrap().running, 4);
    store.set_group_limits("g", capped).await.unwrap();
    let status = store.group("g").await.unwrap();
    assert_eq!((status.running, status.parked), (0, false));
    let second = store.claim("default", "w", 5, ttl).await.unwrap();
    assert_eq!(second.len(), 1, "the healed group runs again");

    // A group's ready set written over: an enqueue into it changes nothing.
    server.cli(&["SET", "{gx}:g:default\tk\th", "x"]);
    let before = snapshot(&server);
    let r = store.enqueue(vec![grouped("h")]).await;
    assert!(corrupt(&r), "{r:?}");
    assert_eq!(snapshot(&server), before, "the enqueue changed nothing");
    server.cli(&["DEL", "{gx}:g:default\tk\th"]);

    // A rotation written over: a claim changes nothing.
    store.enqueue(vec![grouped("h")]).await.unwrap();
    server.cli(&["RENAME", "{gx}:r:default\tk", "{gx}:saved"]);
    server.cli(&["SET", "{gx}:r:default\tk", "x"]);
    let before = snapshot(&server);
    let r = store.claim("default", "w", 5, ttl).await;
    assert!(corrupt(&r), "{r:?}");
    assert_eq!(snapshot(&server), before, "the claim changed nothing");
    server.cli(&["DEL", "{gx}:r:default\tk"]);
    server.cli(&["RENAME", "{gx}:saved", "{gx}:r:default\tk"]);

    // One group's record written over: its lanes are passed over, the others' claimed.
    store.set_group_limits("h", capped).await.unwrap();
    server.cli(&["DEL", "{gx}:group:h"]);
    server.cli(&["SET", "{gx}:group:h", "x"]);
    store.enqueue(vec![grouped("i")]).await.unwrap();
    let got = store.claim("default", "w", 5, ttl).await.unwrap();
    let groups: Vec<Option<&str>> = got.iter().map(|c| c.job.group.as_deref()).collect();
    assert_eq!(groups, [Some("i")], "{got:?}");
    server.cli(&["DEL", "{gx}:group:h"]);

    // A reap whose lease's group keys were written over skips that lease, changing nothing.
    let short = store
        .claim("default", "w", 5, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(short.len(), 1, "h's job: {short:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.cli(&["RENAME", "{gx}:q:default:groups", "{gx}:saved"]);
    server.cli(&["SET", "{gx}:q:default:groups", "x"]);
    let before = snapshot(&server);
    assert!(store.reap(10).await.unwrap().is_empty());
    assert_eq!(snapshot(&server), before, "the reap changed nothing");
    server.cli(&["DEL", "{gx}:q:default:groups"]);
    server.cli(&["RENAME", "{gx}:saved", "{gx}:q:default:groups"]);
    let reaped = store.reap(10).await.unwrap();
    assert_eq!(reaped.len(), 1);
    let again = store.claim("default", "w", 5, ttl).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].job.group.as_deref(), Some("h"));
}

/// Found on the re-read of issue 29: a count a script hands on to a ZRANGE reached Redis in
/// exponent form once it was past what Lua prints as an integer (17 digits), and Redis
/// refused it — `delayed` then read nothing (its read is guarded), `leases`, `reap`,
/// `follow_ups` and the flow pass's reads failed, and `limited_groups` of "all" read nothing
/// (so `migrate` carried no group limit). Every count reads like any large one.
#[tokio::test]
async fn counts_past_what_lua_prints_as_integers_read_like_any_other() {
    use palisade::store::FlowStore;
    use palisade::{GroupLimits, LeaseStore, NewJob};
    use std::time::Duration;
    let server = RedisServer::start();
    let store = RedisLeaseStore::new(palisade::store::redis::pool(&server.url()).unwrap(), "big");
    store
        .enqueue(vec![
            NewJob::raw("k", "null").with_delay(Duration::from_secs(60)),
            NewJob::raw("k", "null"),
        ])
        .await
        .unwrap();
    store
        .claim("default", "w", 1, Duration::from_secs(30))
        .await
        .unwrap();
    let paused = GroupLimits {
        paused: true,
        ..GroupLimits::default()
    };
    store.set_group_limits("g", paused).await.unwrap();
    for n in [1 << 40, (1 << 53) + 1, u64::MAX as usize] {
        assert_eq!(store.delayed("default", n).await.unwrap().len(), 1, "{n}");
        assert_eq!(store.leases(n).await.unwrap().len(), 1, "{n}");
        assert_eq!(
            store.limited_groups(n).await.unwrap(),
            [("g".to_string(), paused)],
            "{n}"
        );
        assert!(store.reap(n).await.unwrap().is_empty(), "{n}");
        assert!(store
            .follow_ups(Duration::ZERO, n)
            .await
            .unwrap()
            .is_empty());
        assert!(store.step_ends(n).await.unwrap().is_empty());
        assert!(store.held_jobs(Duration::ZERO, n).await.unwrap().is_empty());
        assert!(store
            .unreleased_flows(Duration::ZERO, n)
            .await
            .unwrap()
            .is_empty());
    }
}

/// A claim checks the keys of named scopes and of groups with one EXISTS while none exists,
/// and each by its type once one does (claim.lua, `unsafe_if_any`); the groups' turn counter
/// (never removed) with one guarded GET. Each written over by another program while it alone
/// exists fails the claim whole, before its first write, though no job it finds uses the
/// feature; once the key is gone, the same claim goes through. (Fails with the EXISTS answer
/// ignored, and with the counter's check left out.)
#[tokio::test]
async fn a_claim_refuses_a_scope_or_group_key_written_over_while_the_others_are_absent() {
    use palisade::{LeaseStore, NewJob};
    use std::time::Duration;
    let (store, server) = private_coordinator("ux");
    let ttl = Duration::from_secs(30);
    // (An empty queue's claim establishes the epoch first, so that the snapshots below
    // compare what a refused claim would have changed.)
    assert!(store.claim("warm", "w", 1, ttl).await.unwrap().is_empty());
    store
        .enqueue(vec![NewJob::raw("k", "null"), NewJob::raw("k", "null")])
        .await
        .unwrap();
    for (key, command) in [
        ("{ux}:live", "SET"),
        ("{ux}:head", "SET"),
        ("{ux}:last", "SET"),
        ("{ux}:gwake", "SET"),
        ("{ux}:glimited", "SET"),
        ("{ux}:q:default:groups", "SET"),
        ("{ux}:r:default\tk", "SET"),
        ("{ux}:turn", "SET"),
        ("{ux}:turn", "RPUSH"),
    ] {
        server.cli(&[command, key, "not a number"]);
        let before = snapshot(&server);
        let r = store.claim("default", "w", 5, ttl).await;
        assert!(corrupt(&r), "{command} {key}: {r:?}");
        assert_eq!(
            snapshot(&server),
            before,
            "{command} {key}: the claim changed nothing"
        );
        server.cli(&["DEL", key]);
    }
    let got = store.claim("default", "w", 5, ttl).await.unwrap();
    assert_eq!(got.len(), 2, "{got:?}");
}

/// Claims the next job of the default queue and settles it dead.
async fn bury_the_next(store: &RedisLeaseStore) {
    use palisade::{LeaseStore, Settlement};
    let ttl = std::time::Duration::from_secs(30);
    let c = store.claim("default", "t", 1, ttl).await.unwrap().remove(0);
    let dead = Settlement::Dead {
        reason: "bad".into(),
    };
    let settled = store.settle(vec![(c.lease.id, dead)]).await.unwrap();
    settled.into_iter().next().unwrap().unwrap();
}

/// Issue 55: a job a later release enqueued carries meta fields this release does not know.
/// Burying it and retrying it from the dead letters (both by this release, as in a rolling
/// deploy) keeps them as they were; `bury` and `revive` used to copy only the fields they
/// knew, erasing the later release's. The priority is kept too.
#[tokio::test]
async fn a_burial_and_a_revival_keep_the_meta_fields_of_a_later_release() {
    use palisade::{LeaseStore, NewJob};
    use std::time::Duration;
    let (store, server) = private_coordinator("later");
    let ids = store
        .enqueue(vec![NewJob::raw("k", r#"{"n":1}"#).with_priority(3)])
        .await
        .unwrap();
    let job = format!("{{later}}:job:{}", ids[0]);
    let later =
        serde_json::json!({"s": "text", "n": 12345678901234_u64, "on": true, "t": {"a": [1, 2]}});
    let mut meta: serde_json::Value =
        serde_json::from_str(&server.cli(&["HGET", &job, "meta"]).unwrap()).unwrap();
    meta["from_a_later_release"] = later.clone();
    server
        .cli(&["HSET", &job, "meta", &meta.to_string()])
        .unwrap();

    bury_the_next(&store).await;
    let record: serde_json::Value = serde_json::from_str(
        &server
            .cli(&["LINDEX", "{later}:q:default:dead", "0"])
            .unwrap(),
    )
    .unwrap();
    assert_eq!(record["kept"]["from_a_later_release"], later, "{record}");
    assert_eq!(record["priority"], 3, "{record}");

    assert_eq!(store.retry_dead("default", 10).await.unwrap(), 1);
    let revived: serde_json::Value =
        serde_json::from_str(&server.cli(&["HGET", &job, "meta"]).unwrap()).unwrap();
    assert_eq!(revived["from_a_later_release"], later, "{revived}");
    assert_eq!(revived["priority"], 3, "{revived}");
    assert!(revived.get("kept").is_none(), "{revived}");
    // And it still runs, read by this release.
    let again = store
        .claim("default", "t", 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!((again.len(), again[0].job.attempt), (1, 1));
}

/// Found by the attack review of issue 55: a dead record whose numbers are `-0` (JSON allows
/// it; another program, or a later release, may write it) was revived with `-0` in the job's
/// meta, which Rust reads as a float: every claim of the job failed to decode it. Revived,
/// the job is claimable and reads as written.
#[tokio::test]
async fn a_dead_record_with_negative_zeros_revives_into_a_job_that_reads() {
    use palisade::{LeaseStore, NewJob};
    use std::time::Duration;
    let (store, server) = private_coordinator("negzero");
    let ttl = Duration::from_secs(30);
    store
        .enqueue(vec![NewJob::raw("k", "1").with_priority(2)])
        .await
        .unwrap();
    bury_the_next(&store).await;
    let dead = "{negzero}:q:default:dead";
    let mut record: serde_json::Value =
        serde_json::from_str(&server.cli(&["LINDEX", dead, "0"]).unwrap()).unwrap();
    record["max_snoozes"] = 7.into();
    let text = record
        .to_string()
        .replace("\"priority\":2", "\"priority\":-0")
        .replace("\"max_stalls\":3", "\"max_stalls\":-0")
        .replace("\"max_snoozes\":7", "\"max_snoozes\":-0");
    assert!(text.matches(":-0").count() == 3, "{text}");
    server.cli(&["LSET", dead, "0", &text]).unwrap();
    assert_eq!(store.retry_dead("default", 10).await.unwrap(), 1);
    let again = store.claim("default", "t", 1, ttl).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].job.max_stalls, again[0].job.max_snoozes), (0, 0));
}

/// Issue 55, the attack review: the format level is read by the scripts' guard (`common.lua`,
/// `wrong_format`; `control.rs`, `guarded`) and by Rust (`format::parse_level`, at start-up and
/// in `upgrade plan`). They must agree on every record, or `plan` says one thing while every
/// script does another. Both run on the same inputs: a table of edge cases and random strings
/// over digits, signs, spaces, dots and letters.
#[tokio::test]
async fn the_scripts_and_rust_read_a_format_level_record_alike() {
    use palisade::{ControlStore, Error, LeaseStore, NewJob};
    use rand::{Rng, SeedableRng};
    let (store, server) = private_coordinator("lv");
    let mut inputs: Vec<String> = [
        "1",
        "01",
        "000000001",
        "0000000001",
        "0",
        "2",
        "1 ",
        " 1",
        "+1",
        "-1",
        "1.0",
        "1e0",
        "0x1",
        "4294967297",
        "99999999999999999999",
        "１",
        "",
    ]
    .map(String::from)
    .to_vec();
    let mut rng = rand::rngs::StdRng::seed_from_u64(55);
    let alphabet = b"0000111122 +-.ex";
    for _ in 0..200 {
        let len = rng.random_range(0..12);
        let text = (0..len)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
            .collect();
        inputs.push(text);
    }
    for input in inputs {
        server.cli(&["SET", "{lv}:format", &input]);
        let rust = palisade::format::parse_level(Some(&input))
            .is_ok_and(|level| palisade::format::LEVELS.contains(&level));
        let enqueued = store.enqueue(vec![NewJob::raw("k", "null")]).await;
        let role = (store.hold_role("r", "me", std::time::Duration::from_secs(5))).await;
        for (what, answer) in [("enqueue", enqueued.map(drop)), ("role", role.map(drop))] {
            match answer {
                Ok(()) => assert!(rust, "{what}: the script took {input:?}, Rust refuses it"),
                Err(Error::Format(_)) => {
                    assert!(!rust, "{what}: the script refused {input:?}, Rust takes it")
                }
                Err(e) => panic!("{what} {input:?}: {e}"),
            }
        }
    }
}
