//! Cases for what paces a job without failing it: snooze, debounce, and the options a worker
//! acts on (timeout, deadline, max snoozes) carried by the backend through every path.

use super::*;

/// Every one of the pacing cases in this file: add a new one here too.
#[doc(hidden)]
#[macro_export]
macro_rules! pacing_cases {
    ($($how:tt)*) => {
        $crate::lease_store_case!($($how)*;
            a_snoozed_job_waits_without_spending_an_attempt,
            a_debounced_burst_runs_once_with_the_latest_payload,
            a_debounced_job_starts_by_its_maximum_wait,
            a_fold_keeps_its_id_taken_and_a_due_job_due,
            a_debounce_key_of_another_kind_refuses_the_whole_enqueue,
            a_debounce_key_of_another_scope_refuses_the_enqueue,
            timeouts_and_deadlines_travel_with_the_job,
        );
    };
}

/// A snooze gives the attempt back (a job with one attempt snoozes and still runs), counts
/// itself where a claim, the job view and the dead letters see it, and waits its delay; a
/// dead-letter retry starts the count afresh.
pub async fn a_snoozed_job_waits_without_spending_an_attempt(store: Stores) {
    let id = store
        .enqueue(vec![job("a").with_max_attempts(1)])
        .await
        .unwrap()[0];
    for snoozes in 0..2u32 {
        let c = claim(&store, 1).await.remove(0);
        assert_eq!((c.job.id, c.job.attempt, c.job.snoozes), (id, 1, snoozes));
        let wait = Duration::from_millis(150);
        settle(&store, c.lease.id, Settlement::Snooze { delay: wait })
            .await
            .unwrap();
        let view = store.job(id).await.unwrap().expect("a snoozed job is live");
        assert_eq!(view.state, JobState::Delayed, "{view:?}");
        assert_eq!((view.job.attempt, view.job.snoozes), (0, snoozes + 1));
        assert!(claim(&store, 1).await.is_empty(), "it waits its snooze");
        tokio::time::sleep(wait + Duration::from_millis(50)).await;
    }
    // A snooze of zero is ready at once; the count still grows.
    let c = claim(&store, 1).await.remove(0);
    assert_eq!((c.job.attempt, c.job.snoozes), (1, 2));
    settle(
        &store,
        c.lease.id,
        Settlement::Snooze {
            delay: Duration::ZERO,
        },
    )
    .await
    .unwrap();
    let c = claim(&store, 1).await.remove(0);
    assert_eq!((c.job.attempt, c.job.snoozes), (1, 3));
    // A snooze of a lease that is not current changes nothing.
    let stale = LeaseId::new();
    assert!(matches!(
        settle(
            &store,
            stale,
            Settlement::Snooze {
                delay: Duration::ZERO
            }
        )
        .await,
        Err(Error::LeaseNotCurrent(_))
    ));
    settle(
        &store,
        c.lease.id,
        Settlement::Dead {
            reason: "snoozed too often".into(),
        },
    )
    .await
    .unwrap();
    let dead = store.dead("default", 10).await.unwrap();
    assert_eq!((dead[0].job.id, dead[0].job.snoozes), (id, 3));
    assert_eq!(store.retry_dead("default", 10).await.unwrap(), 1);
    let again = claim(&store, 1).await.remove(0);
    assert_eq!(
        (again.job.id, again.job.attempt, again.job.snoozes),
        (id, 1, 0)
    );
}

/// Three enqueues under one key within the quiet period make one job, which starts a quiet
/// period after the last, with the last payload and options; once it started, the key makes
/// a new job.
pub async fn a_debounced_burst_runs_once_with_the_latest_payload(store: Stores) {
    let quiet = Duration::from_millis(300);
    let under = |n: u32| {
        NewJob::raw("sync", format!("{{\"n\":{n}}}"))
            .with_debounce("doc:7", quiet, Duration::from_secs(30))
            .with_max_attempts(n)
    };
    let first = store.enqueue_all(vec![under(1)]).await.unwrap();
    let Enqueued::Added(id) = first[0] else {
        panic!("the first enqueue adds: {first:?}");
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    for n in [2, 3] {
        assert_eq!(
            store.enqueue_all(vec![under(n)]).await.unwrap(),
            vec![Enqueued::Debounced(id)]
        );
    }
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.delayed, counts.ready), (1, 0), "{counts:?}");
    // Pushed: the first enqueue's quiet period is over, the last one's is not.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(claim(&store, 5).await.is_empty(), "its start was pushed");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut got = claim(&store, 5).await;
    assert_eq!(got.len(), 1, "one job for the burst");
    let c = got.remove(0);
    assert_eq!(
        (c.job.id, c.job.payload.as_str(), c.job.max_attempts),
        (id, "{\"n\":3}", 3)
    );
    // Started: the key makes a new job, which does not touch the running one.
    let next = store.enqueue_all(vec![under(4)]).await.unwrap();
    assert!(
        matches!(next[0], Enqueued::Added(new) if new != id),
        "{next:?}"
    );
    assert_eq!(
        store.job(id).await.unwrap().unwrap().job.payload,
        "{\"n\":3}"
    );
}

/// A steady stream of updates still runs: however often the key is enqueued again, the job
/// starts no later than its maximum wait after the first enqueue.
pub async fn a_debounced_job_starts_by_its_maximum_wait(store: Stores) {
    let (quiet, max_wait) = (Duration::from_millis(250), Duration::from_millis(500));
    let under = |n: u32| NewJob::raw("sync", format!("{n}")).with_debounce("feed", quiet, max_wait);
    let id = store.enqueue(vec![under(0)]).await.unwrap()[0];
    let started = std::time::Instant::now();
    let mut n = 0;
    let ran = loop {
        n += 1;
        let enqueued = store.enqueue_all(vec![under(n)]).await.unwrap();
        let got = claim(&store, 5).await;
        if let Some(c) = got.first() {
            break c.clone();
        }
        assert_eq!(enqueued, vec![Enqueued::Debounced(id)], "update {n}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "still pending after 3 s of updates"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let waited = started.elapsed();
    assert_eq!(ran.job.id, id);
    assert!(
        waited >= max_wait - Duration::from_millis(60) && waited < max_wait + quiet,
        "started after {waited:?}: quiet {quiet:?}, max wait {max_wait:?}"
    );
    // It carries the update enqueued last before it started (that same round: a due job
    // not claimed yet still takes updates).
    assert_eq!(ran.job.payload, format!("{n}"));
}

/// An enqueue folded into a pending job keeps its own id taken by that job, so its retry
/// (the reply lost) answers that job even after it started, never adds a second; an update to
/// a job that is due already (run now by an operator) does not hold it back.
pub async fn a_fold_keeps_its_id_taken_and_a_due_job_due(store: Stores) {
    let hour = Duration::from_secs(3600);
    let under = |n: u32, id: JobId| {
        NewJob::raw("sync", format!("{n}"))
            .with_debounce("doc:9", hour, 2 * hour)
            .with_id(id)
    };
    let (first, second) = (JobId::new(), JobId::new());
    assert_eq!(
        store.enqueue_all(vec![under(1, first)]).await.unwrap(),
        vec![Enqueued::Added(first)]
    );
    assert_eq!(
        store.enqueue_all(vec![under(2, second)]).await.unwrap(),
        vec![Enqueued::Debounced(first)]
    );
    assert!(store.run_now(first).await.unwrap());
    // Due now: an update replaces the payload and leaves it due.
    assert_eq!(
        store
            .enqueue_all(vec![under(3, JobId::new())])
            .await
            .unwrap(),
        vec![Enqueued::Debounced(first)]
    );
    let c = claim(&store, 5).await;
    assert_eq!(c.len(), 1, "the job run now stays due: {c:?}");
    assert_eq!((c[0].job.id, c[0].job.payload.as_str()), (first, "3"));
    // The second enqueue again (its reply was lost): the job it folded into, not a new one.
    assert_eq!(
        store.enqueue_all(vec![under(2, second)]).await.unwrap(),
        vec![Enqueued::Existing(first)]
    );
    let counts = store.counts("default").await.unwrap();
    assert_eq!(counts.pending(), 1, "{counts:?}");
}

/// A job under a key whose pending job has another kind, queue or scope is refused, and the
/// whole batch with it: nothing is added and the pending job keeps its payload.
pub async fn a_debounce_key_of_another_kind_refuses_the_whole_enqueue(store: Stores) {
    let hour = Duration::from_secs(3600);
    let under =
        |kind: &str, payload: &str| NewJob::raw(kind, payload).with_debounce("k", hour, hour);
    let id = store.enqueue(vec![under("a", "1")]).await.unwrap()[0];
    for other in [under("b", "2"), under("a", "2").with_queue("elsewhere")] {
        // (The good job's unique key is the debounce key's name, so that partitions put both
        // in one partition: a batch is all or nothing per partition.)
        let fine = job("fine").with_unique_key("k", hour);
        let refused = store.enqueue_all(vec![fine, other.clone()]).await;
        assert!(
            matches!(&refused, Err(Error::InvalidJob(why)) if why.contains("debounce key")),
            "{other:?}: {refused:?}"
        );
    }
    // Two of one batch under one key: refused before anything is sent.
    let twice = store
        .enqueue_all(vec![
            under("c", "1").with_debounce("j", hour, hour),
            under("c", "2").with_debounce("j", hour, hour),
        ])
        .await;
    assert!(matches!(twice, Err(Error::InvalidJob(_))), "{twice:?}");
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.delayed, counts.ready), (1, 0), "{counts:?}");
    assert!(store
        .queues()
        .await
        .unwrap()
        .iter()
        .all(|q| q != "elsewhere"));
    let view = store.job(id).await.unwrap().unwrap();
    assert_eq!(view.job.payload, "1");
    // The same kind, queue and scope folds in.
    assert_eq!(
        store.enqueue_all(vec![under("a", "3")]).await.unwrap(),
        vec![Enqueued::Debounced(id)]
    );
    assert_eq!(store.job(id).await.unwrap().unwrap().job.payload, "3");
}

/// A job under a key whose pending job has no named scope, or another, is refused. (Not for
/// partitions: a named scope decides a job's partition, so a key is one key per partition
/// there, as unique keys are.)
pub async fn a_debounce_key_of_another_scope_refuses_the_enqueue(store: Stores) {
    let hour = Duration::from_secs(3600);
    let under = |payload: &str| NewJob::raw("a", payload).with_debounce("k", hour, hour);
    let id = store.enqueue(vec![under("1")]).await.unwrap()[0];
    let refused = store
        .enqueue_all(vec![under("2").with_scope("acct:1")])
        .await;
    assert!(matches!(refused, Err(Error::InvalidJob(_))), "{refused:?}");
    let scoped = store
        .enqueue(vec![under("1")
            .with_debounce("s", hour, hour)
            .with_scope("acct:1")])
        .await
        .unwrap()[0];
    let refused = store
        .enqueue_all(vec![under("2")
            .with_debounce("s", hour, hour)
            .with_scope("acct:2")])
        .await;
    assert!(matches!(refused, Err(Error::InvalidJob(_))), "{refused:?}");
    for (id, payload) in [(id, "1"), (scoped, "1")] {
        assert_eq!(store.job(id).await.unwrap().unwrap().job.payload, payload);
    }
}

/// A job's timeout, deadline and snooze limit come back with every claim, survive a retry, a
/// stall and its death; retried from the dead letters it keeps its timeout and loses its
/// deadline (an operator asked for it to run).
pub async fn timeouts_and_deadlines_travel_with_the_job(store: Stores) {
    let deadline = std::time::UNIX_EPOCH + Duration::from_secs(4_000_000_000);
    let timeout = Duration::from_millis(2_500);
    let id = store
        .enqueue(vec![job("a")
            .with_timeout(timeout)
            .with_deadline(deadline)
            .with_max_snoozes(7)
            .with_max_attempts(3)
            .with_max_stalls(3)])
        .await
        .unwrap()[0];
    let carried = |j: &Job| (j.id, j.timeout, j.deadline_ms, j.max_snoozes);
    let want = (id, Some(timeout), Some(4_000_000_000_000), 7);
    let c = claim(&store, 1).await.remove(0);
    assert_eq!(carried(&c.job), want);
    settle(
        &store,
        c.lease.id,
        Settlement::Retry {
            delay: Duration::ZERO,
            reason: "again".into(),
        },
    )
    .await
    .unwrap();
    // A stall: the lease runs out and the reaper puts the job back.
    let c = store
        .claim("default", "suite", 1, Duration::from_millis(30))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(carried(&c.job), want);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(store.reap(10).await.unwrap().len(), 1);
    let c = claim(&store, 1).await.remove(0);
    assert_eq!((carried(&c.job), c.job.attempt, c.job.stalls), (want, 3, 1));
    settle(
        &store,
        c.lease.id,
        Settlement::Dead {
            reason: "expired".into(),
        },
    )
    .await
    .unwrap();
    let dead = store.dead("default", 10).await.unwrap();
    assert_eq!(carried(&dead[0].job), want);
    assert!(store.retry_dead_job("default", id).await.unwrap());
    let again = claim(&store, 1).await.remove(0);
    assert_eq!(carried(&again.job), (id, Some(timeout), None, 7));
}
