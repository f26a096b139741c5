//! Cases for the read-only views ([`Inspect`]) and queue controls ([`QueueAdmin`]).

use super::*;

/// Every one of the view and queue-control cases in this file: add a new one here too.
#[doc(hidden)]
#[macro_export]
macro_rules! queue_cases {
    ($($how:tt)*) => {
        $crate::lease_store_case!($($how)*;
            status_views_and_dead_letter_retry,
            a_paused_queue_hands_out_nothing_and_loses_nothing,
            a_rate_limited_queue_hands_out_no_more_than_its_rate,
            cancel_removes_a_queued_job_and_revokes_a_running_one,
            a_capped_kind_never_runs_more_than_its_cap,
            single_jobs_seen_and_acted_on_one_by_one,
            only_an_unused_queue_is_forgotten,
            a_tick_travels_with_its_job,
            dead_letters_are_retried_and_purged_whole_by_filter,
            ready_jobs_are_listed_in_claim_order,
            completed_jobs_are_kept_with_their_times_and_attempts,
        );
    };
}

pub async fn status_views_and_dead_letter_retry(store: Stores) {
    store
        .enqueue(vec![
            job("a").with_queue("mail"),
            job("b").with_scope("acct:9"),
        ])
        .await
        .unwrap();
    assert_eq!(store.queues().await.unwrap(), ["default", "mail"]);
    let c = store
        .claim("default", "worker-7", 1, TTL)
        .await
        .unwrap()
        .remove(0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let leases = store.leases(10).await.unwrap();
    assert_eq!(leases.len(), 1);
    let l = &leases[0];
    assert_eq!(
        (l.lease, l.job, l.token),
        (c.lease.id, c.job.id, c.lease.token)
    );
    assert_eq!(
        (l.scope.as_str(), l.worker.as_str()),
        ("acct:9", "worker-7")
    );
    assert!(
        l.age >= Duration::from_millis(40) && l.expires_in <= TTL,
        "{l:?}"
    );
    settle(
        &store,
        c.lease.id,
        Settlement::Dead {
            reason: "bad".into(),
        },
    )
    .await
    .unwrap();
    assert!(store.leases(10).await.unwrap().is_empty());
    assert_eq!(store.retry_dead("default", 10).await.unwrap(), 1);
    assert_eq!(store.retry_dead("default", 10).await.unwrap(), 0);
    let again = claim(&store, 1).await.remove(0);
    assert_eq!((again.job.id, again.job.attempt), (c.job.id, 1));
    assert!(again.lease.token > c.lease.token);
}

/// `set_paused`: claims from a paused queue hand out nothing, while its running job renews and
/// completes, enqueue still adds, other queues run on; resumed, every job is there.
pub async fn a_paused_queue_hands_out_nothing_and_loses_nothing(store: Stores) {
    store
        .enqueue(vec![
            job("a"),
            job("a"),
            job("a"),
            job("b").with_queue("other"),
        ])
        .await
        .unwrap();
    let running = claim(&store, 1).await.pop().unwrap();
    store.set_paused("default", true).await.unwrap();
    store.set_paused("default", true).await.unwrap(); // twice is once
    assert_eq!(store.paused().await.unwrap(), vec!["default".to_owned()]);
    assert!(claim(&store, 5).await.is_empty());
    store
        .enqueue(vec![job("a").with_delay(Duration::from_millis(1))])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(claim(&store, 5).await.is_empty());
    assert_eq!(
        store.renew(&[running.lease.id], TTL).await.unwrap(),
        Vec::<LeaseId>::new()
    );
    settle(&store, running.lease.id, Settlement::completed())
        .await
        .unwrap();
    let other = store.claim("other", "suite", 5, TTL).await.unwrap();
    assert_eq!(other.len(), 1, "another queue is not paused");
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.ready, counts.completed), (3, 1), "{counts:?}");

    assert!(matches!(
        store.set_paused("", true).await,
        Err(Error::InvalidJob(_))
    ));
    store.set_paused("default", false).await.unwrap();
    store.set_paused("never-paused", false).await.unwrap();
    assert!(store.paused().await.unwrap().is_empty());
    assert_eq!(claim(&store, 5).await.len(), 3);
}

/// `set_rate_limit`: at most the bucket's whole tokens per claim, refilled at the rate, shared
/// by every claimer; other queues and lifted limits are unaffected.
pub async fn a_rate_limited_queue_hands_out_no_more_than_its_rate(store: Stores) {
    let jobs: Vec<NewJob> = (0..40).map(|_| job("a")).collect();
    store.enqueue(jobs).await.unwrap();
    let limit = RateLimit {
        jobs: 5,
        per: Duration::from_secs(1),
    };
    store.set_rate_limit("default", Some(limit)).await.unwrap();
    assert_eq!(store.rate_limit("default").await.unwrap(), Some(limit));
    assert_eq!(store.rate_limit("other").await.unwrap(), None);
    let started = std::time::Instant::now();
    assert_eq!(
        claim(&store, 100).await.len(),
        5,
        "a full bucket: the burst"
    );
    assert_eq!(claim(&store, 100).await.len(), 0, "empty until it refills");
    tokio::time::sleep(Duration::from_millis(450)).await;
    let refilled = claim(&store, 100).await.len();
    // 5 per second for ~0.45 s: 2 whole tokens (3 if this machine slept long).
    assert!((2..=3).contains(&refilled), "{refilled}");
    // However it is asked (many small claims), the total follows the rate.
    let mut total = 5 + refilled;
    while started.elapsed() < Duration::from_millis(1_500) {
        total += claim(&store, 1).await.len();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let allowed = 5 + (started.elapsed().as_secs_f64() * 5.0).floor() as usize;
    assert!(
        total <= allowed && total >= allowed - 2,
        "{total} of {allowed}"
    );
    for bad in [
        RateLimit {
            jobs: 0,
            per: Duration::from_secs(1),
        },
        RateLimit {
            jobs: 1,
            per: Duration::ZERO,
        },
        RateLimit {
            jobs: 1,
            per: Duration::from_secs(86_401),
        },
        RateLimit {
            jobs: 1,
            per: Duration::from_micros(1500),
        },
    ] {
        assert!(matches!(
            store.set_rate_limit("default", Some(bad)).await,
            Err(Error::InvalidJob(_))
        ));
    }
    store.set_rate_limit("default", None).await.unwrap();
    assert_eq!(store.rate_limit("default").await.unwrap(), None);
    let rest = claim(&store, 100).await.len();
    assert_eq!(rest, 40 - total, "lifted: everything left");
}

/// `cancel`: a ready, a waiting and a delayed job go to the dead letters; a running job's
/// lease is revoked at once (renew says lost, its settlement is refused) and its scope's turn
/// passes on; cancelling again finds nothing.
pub async fn cancel_removes_a_queued_job_and_revokes_a_running_one(store: Stores) {
    let q = |j: NewJob| j.with_queue("c");
    let ids = store
        .enqueue(vec![
            q(job("a")),
            q(job("a").with_scope("s")),
            q(job("a").with_scope("s")),
            q(job("a").with_delay(Duration::from_secs(3600))),
        ])
        .await
        .unwrap();
    let counts = || async { store.counts("c").await.unwrap() };
    let c = counts().await;
    assert_eq!((c.ready, c.waiting, c.delayed), (2, 1, 1));
    for (id, what) in [(ids[0], "ready"), (ids[2], "waiting"), (ids[3], "delayed")] {
        assert_eq!(
            store.cancel(id, "stop").await.unwrap(),
            Cancelled::Removed,
            "{what}"
        );
    }
    let c = counts().await;
    assert_eq!(
        (c.ready, c.waiting, c.delayed, c.dead),
        (1, 0, 0, 3),
        "{c:?}"
    );

    let running = store.claim("c", "w", 5, TTL).await.unwrap();
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].job.id, ids[1]);
    let next = store
        .enqueue(vec![q(job("a").with_scope("s"))])
        .await
        .unwrap()[0];
    assert_eq!(counts().await.waiting, 1, "behind the running job");
    let lease = running[0].lease.id;
    assert_eq!(
        store.cancel(ids[1], "stop").await.unwrap(),
        Cancelled::Revoked
    );
    // Its token no longer holds the watermark back: sinks refuse its late writes once told.
    assert!(
        store
            .watermark()
            .is_some_and(|w| w > running[0].lease.token),
        "{:?} vs {}",
        store.watermark(),
        running[0].lease.token
    );
    assert_eq!(
        store.renew(&[lease], TTL).await.unwrap(),
        vec![lease],
        "lost"
    );
    assert!(matches!(
        settle(&store, lease, Settlement::completed()).await,
        Err(Error::LeaseNotCurrent(_))
    ));
    let c = counts().await;
    assert_eq!(
        (c.leased, c.ready, c.waiting, c.dead),
        (0, 1, 0, 4),
        "{c:?}"
    );
    let again = store.claim("c", "w", 5, TTL).await.unwrap();
    assert_eq!(again[0].job.id, next, "the scope's turn passed on");

    for id in [ids[1], ids[0], JobId::new()] {
        assert_eq!(store.cancel(id, "stop").await.unwrap(), Cancelled::Missing);
    }
    let dead = store.dead("c", 10).await.unwrap();
    assert_eq!(dead.len(), 4);
    assert!(dead.iter().all(|d| d.reason == "stop"), "{dead:?}");
    // Four cancels took effect (three queued, one running); the misses count nothing, and
    // neither does a job that died on its own.
    assert_eq!(counts().await.cancelled, 4);
    assert_eq!(store.counts("elsewhere").await.unwrap().cancelled, 0);
}

/// `set_concurrency_cap`: claims never start more of a kind than its cap allows while others
/// run; every way a lease ends (completion, cancel, expiry) frees its place; other kinds are
/// not held back.
pub async fn a_capped_kind_never_runs_more_than_its_cap(store: Stores) {
    let k = |kind: &str| job(kind).with_queue("k");
    let mut jobs: Vec<NewJob> = (0..5).map(|_| k("capped")).collect();
    jobs.extend([k("free"), k("free")]);
    store.enqueue(jobs).await.unwrap();
    store.set_concurrency_cap("capped", Some(2)).await.unwrap();
    assert_eq!(store.concurrency_cap("capped").await.unwrap(), Some(2));
    let claim_k = |n: usize| {
        let store = store.clone();
        async move { store.claim("k", "w", n, TTL).await.unwrap() }
    };
    let of = |claims: &[Claim], kind: &str| claims.iter().filter(|c| c.job.kind == kind).count();
    let first = claim_k(10).await;
    assert_eq!((of(&first, "capped"), of(&first, "free")), (2, 2));
    assert!(claim_k(10).await.is_empty(), "at the cap");
    let capped: Vec<&Claim> = first.iter().filter(|c| c.job.kind == "capped").collect();
    settle(&store, capped[0].lease.id, Settlement::completed())
        .await
        .unwrap();
    assert_eq!(
        of(&claim_k(10).await, "capped"),
        1,
        "a completion frees a place"
    );
    assert_eq!(
        store.cancel(capped[1].job.id, "stop").await.unwrap(),
        Cancelled::Revoked
    );
    assert_eq!(
        of(&claim_k(10).await, "capped"),
        1,
        "a cancel frees a place"
    );
    assert!(claim_k(10).await.is_empty());
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    assert_eq!(
        store.reap(100).await.unwrap().len(),
        4,
        "two capped, two free"
    );
    let after = claim_k(10).await;
    assert_eq!(
        (of(&after, "capped"), of(&after, "free")),
        (2, 2),
        "expiry frees places"
    );
    store.set_concurrency_cap("capped", None).await.unwrap();
    assert_eq!(of(&claim_k(10).await, "capped"), 1, "lifted: the last one");
    for (kind, cap) in [("", Some(1)), ("capped", Some(0))] {
        assert!(matches!(
            store.set_concurrency_cap(kind, cap).await,
            Err(Error::InvalidJob(_))
        ));
    }
}

/// The operator page's per-job views and actions: where a job is (`job`), the delayed list,
/// leases with their queue and kind, dead letters by page with their time of death, and
/// retrying, deleting or running one job without touching the others.
pub async fn single_jobs_seen_and_acted_on_one_by_one(store: Stores) {
    let q = |j: NewJob| j.with_queue("v");
    let hour = Duration::from_secs(3600);
    let ids = store
        .enqueue(vec![
            q(job("a").with_scope("s")),
            q(job("a").with_scope("s")),
            q(job("b").with_delay(hour)),
            q(job("b").with_delay(hour * 2)),
        ])
        .await
        .unwrap();
    let state = |id| {
        let store = store.clone();
        async move { store.job(id).await.unwrap().map(|v| v.state) }
    };
    assert_eq!(state(ids[0]).await, Some(JobState::Ready));
    assert_eq!(state(ids[1]).await, Some(JobState::Waiting));
    assert_eq!(state(ids[2]).await, Some(JobState::Delayed));
    assert_eq!(state(JobId::new()).await, None);

    let delayed = store.delayed("v", 10).await.unwrap();
    let listed: Vec<JobId> = delayed.iter().map(|v| v.job.id).collect();
    assert_eq!(listed, [ids[2], ids[3]], "soonest due first");
    let due = delayed[0].due_in.unwrap();
    assert!(
        due > hour - Duration::from_secs(60) && due <= hour,
        "{due:?}"
    );
    assert_eq!(delayed[0].job.kind, "b");
    assert_eq!(store.delayed("v", 1).await.unwrap().len(), 1);

    // Run one delayed job now: it is claimed next, the other stays delayed.
    assert!(store.run_now(ids[3]).await.unwrap());
    assert!(!store.run_now(ids[0]).await.unwrap(), "not delayed");
    assert!(!store.run_now(JobId::new()).await.unwrap());
    let claims = store.claim("v", "w-1", 10, TTL).await.unwrap();
    let mut claimed: Vec<JobId> = claims.iter().map(|c| c.job.id).collect();
    claimed.sort();
    let mut expect = vec![ids[0], ids[3]];
    expect.sort();
    assert_eq!(claimed, expect, "the ready head and the job run now");
    let view = store.job(ids[3]).await.unwrap().unwrap();
    assert_eq!(view.state, JobState::Leased);
    assert!(claims.iter().any(|c| Some(c.lease.id) == view.lease));
    let leases = store.leases(10).await.unwrap();
    assert!(
        leases
            .iter()
            .all(|l| l.queue == "v" && (l.kind == "a" || l.kind == "b")),
        "{leases:?}"
    );
    assert_eq!(
        store.delayed("v", 10).await.unwrap().len(),
        1,
        "the other stays delayed"
    );

    // Both die; the dead letters page and carry their time of death.
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for c in &claims {
        let reason = format!("bad {}", c.job.id);
        settle(&store, c.lease.id, Settlement::Dead { reason })
            .await
            .unwrap();
    }
    let dead = store.dead_range("v", 0, 10).await.unwrap();
    assert_eq!(dead.len(), 2);
    assert_eq!(store.dead_range("v", 0, usize::MAX).await.unwrap(), dead);
    assert_eq!(store.counts("v").await.unwrap().died, 2);
    for d in &dead {
        let died = d.died_ms.expect("a time of death");
        // (The coordinator's clock; a minute either way for a remote one.)
        assert!(
            died + 60_000 > before && died < before + 60_000,
            "{died} vs {before}"
        );
    }
    assert_eq!(store.dead_range("v", 1, 10).await.unwrap(), dead[1..]);
    assert_eq!(store.dead_range("v", 2, 10).await.unwrap(), []);
    assert_eq!(
        store.dead_range("v", usize::MAX, usize::MAX).await.unwrap(),
        []
    );

    // Retry one, delete the other; each only once; unknown ids change nothing.
    let (first, second) = (dead[0].job.id, dead[1].job.id);
    assert!(!store.retry_dead_job("v", JobId::new()).await.unwrap());
    assert!(
        !store.retry_dead_job("other", first).await.unwrap(),
        "wrong queue"
    );
    assert!(store.retry_dead_job("v", first).await.unwrap());
    assert!(!store.retry_dead_job("v", first).await.unwrap(), "once");
    let revived = store.job(first).await.unwrap().unwrap();
    assert_eq!(revived.job.attempt, 0, "fresh attempts");
    assert!(matches!(revived.state, JobState::Ready | JobState::Waiting));
    assert!(
        !store.purge_dead_job("v", first).await.unwrap(),
        "no longer dead"
    );
    assert!(store.purge_dead_job("v", second).await.unwrap());
    assert!(!store.purge_dead_job("v", second).await.unwrap(), "once");
    let counts = store.counts("v").await.unwrap();
    assert_eq!((counts.dead, counts.died), (0, 2), "died only grows");
    assert_eq!(store.job(second).await.unwrap(), None, "deleted for good");
    assert_eq!(revived.last_error, None);

    // A retried attempt leaves its reason on the job, for its page.
    let c = store.claim("v", "w-1", 1, TTL).await.unwrap().remove(0);
    let retry = Settlement::Retry {
        delay: hour,
        reason: "smtp timeout".into(),
    };
    settle(&store, c.lease.id, retry).await.unwrap();
    let view = store.job(c.job.id).await.unwrap().unwrap();
    assert_eq!(
        (view.state, view.last_error.as_deref()),
        (JobState::Delayed, Some("smtp timeout"))
    );
}

/// `forget_queue`: a queue holding a job (ready, delayed, leased or dead) stays; an unused
/// one leaves the list with its pause and rate limit, and comes back with its next job.
pub async fn only_an_unused_queue_is_forgotten(store: Stores) {
    let q = |name: &str| job("a").with_queue(name);
    store.enqueue(vec![q("busy"), q("gone")]).await.unwrap();
    let c = store.claim("gone", "w", 1, TTL).await.unwrap().remove(0);
    assert!(!store.forget_queue("gone").await.unwrap(), "leased");
    settle(&store, c.lease.id, Settlement::completed())
        .await
        .unwrap();
    store.set_paused("gone", true).await.unwrap();
    let limit = RateLimit {
        jobs: 5,
        per: Duration::from_secs(1),
    };
    store.set_rate_limit("gone", Some(limit)).await.unwrap();
    assert!(!store.forget_queue("busy").await.unwrap(), "ready");
    assert!(store.forget_queue("gone").await.unwrap());
    assert_eq!(store.queues().await.unwrap(), ["busy"]);
    assert!(store.paused().await.unwrap().is_empty());
    assert_eq!(store.rate_limit("gone").await.unwrap(), None);
    assert!(store.forget_queue("never-used").await.unwrap());

    store
        .enqueue(vec![q("later").with_delay(Duration::from_secs(3600))])
        .await
        .unwrap();
    assert!(!store.forget_queue("later").await.unwrap(), "delayed");
    let id = store.enqueue(vec![q("gone")]).await.unwrap()[0];
    assert_eq!(store.queues().await.unwrap(), ["busy", "gone", "later"]);
    store.cancel(id, "stop").await.unwrap();
    assert!(!store.forget_queue("gone").await.unwrap(), "dead");
}

/// A scheduled job's tick (`Job::tick`) reaches its handler, and survives dying and a retry
/// of the dead letter.
pub async fn a_tick_travels_with_its_job(store: Stores) {
    let tick = Tick {
        schedule: "nightly".into(),
        at_ms: 1_790_000_000_000,
    };
    let mut scheduled = job("a").with_queue("t");
    scheduled.tick = Some(tick.clone());
    store
        .enqueue(vec![scheduled, job("a").with_queue("t")])
        .await
        .unwrap();
    let claims = store.claim("t", "w", 2, TTL).await.unwrap();
    let ticks: Vec<Option<Tick>> = claims.iter().map(|c| c.job.tick.clone()).collect();
    assert!(
        ticks.contains(&Some(tick.clone())) && ticks.contains(&None),
        "{ticks:?}"
    );
    for c in &claims {
        let reason = "down".to_owned();
        settle(&store, c.lease.id, Settlement::Dead { reason })
            .await
            .unwrap();
    }
    let dead = store.dead("t", 10).await.unwrap();
    assert!(
        dead.iter().any(|d| d.job.tick == Some(tick.clone())),
        "{dead:?}"
    );
    assert_eq!(store.retry_dead("t", 10).await.unwrap(), 2);
    let again = store.claim("t", "w", 2, TTL).await.unwrap();
    assert!(
        again.iter().any(|c| c.job.tick == Some(tick.clone())),
        "kept through a retry"
    );
}

/// `dead_where`: a whole-set retry or purge takes exactly what its filter takes (kind, reason
/// text, age), stops at its limit, tells its progress, and leaves every other dead letter.
pub async fn dead_letters_are_retried_and_purged_whole_by_filter(store: Stores) {
    // 30 dead jobs, 10 of each kind k0, k1, k2: half of each kind timed out, half had bad
    // input.
    let jobs: Vec<NewJob> = (0..30)
        .map(|i| job(&format!("k{}", i % 3)).with_queue("dq"))
        .collect();
    store.enqueue(jobs).await.unwrap();
    let claims = store.claim("dq", "suite", 30, TTL).await.unwrap();
    assert_eq!(claims.len(), 30);
    let mut kinds = std::collections::HashMap::new();
    for c in &claims {
        let even = kinds.entry(c.job.kind.clone()).or_insert(0usize);
        let reason = if *even % 2 == 0 {
            "timeout after 5s"
        } else {
            "bad input: 100% wrong"
        };
        *even += 1;
        settle(
            &store,
            c.lease.id,
            Settlement::Dead {
                reason: reason.into(),
            },
        )
        .await
        .unwrap();
    }
    let dead = |store: Stores| async move { store.counts("dq").await.unwrap().dead };
    assert_eq!(dead(store.clone()).await, 30);
    let calls = std::sync::atomic::AtomicU64::new(0);
    let last = std::sync::Mutex::new(DeadSweep::default());
    let seen = |s: DeadSweep| {
        calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *last.lock().unwrap() = s;
    };

    // Nothing died before 1970: an age takes none.
    let ancient = DeadFilter {
        died_before_ms: Some(1),
        ..DeadFilter::default()
    };
    let sweep = store
        .dead_where("dq", &ancient, DeadAction::Purge, u64::MAX, &seen)
        .await
        .unwrap();
    assert_eq!((sweep.done, sweep.scanned), (0, 30));

    // k1's timed-out jobs (5 of its 10), retried: claimable again with fresh attempts.
    let timed_out = DeadFilter {
        kind: Some("k1".into()),
        reason: Some("timeout".into()),
        died_before_ms: Some(palisade::store::unix_ms() + 60_000),
    };
    let sweep = store
        .dead_where("dq", &timed_out, DeadAction::Retry, u64::MAX, &seen)
        .await
        .unwrap();
    assert_eq!((sweep.done, sweep.kept), (5, 0), "{sweep:?}");
    assert_eq!(
        *last.lock().unwrap(),
        sweep,
        "the last progress is the result"
    );
    assert!(calls.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    assert_eq!(dead(store.clone()).await, 25);
    let back = store.claim("dq", "suite", 30, TTL).await.unwrap();
    assert_eq!(back.len(), 5);
    assert!(back
        .iter()
        .all(|c| c.job.kind == "k1" && c.job.attempt == 1));

    // A reason text is matched as written: '%' is no pattern. At most 4 of 15 purged.
    let bad = DeadFilter {
        reason: Some("100% wrong".into()),
        ..DeadFilter::default()
    };
    let sweep = store
        .dead_where("dq", &bad, DeadAction::Purge, 4, &seen)
        .await
        .unwrap();
    assert_eq!(sweep.done, 4);
    assert_eq!(dead(store.clone()).await, 21);
    let left = store.dead_range("dq", 0, 100).await.unwrap();
    assert_eq!(left.iter().filter(|d| bad.matches(d)).count(), 11);
    // An empty kind is any kind; the rest of the bad-input ones go, the timeouts stay.
    let rest = DeadFilter {
        kind: Some(String::new()),
        ..bad.clone()
    };
    let sweep = store
        .dead_where("dq", &rest, DeadAction::Purge, u64::MAX, &seen)
        .await
        .unwrap();
    assert_eq!(sweep.done, 11);
    let left = store.dead_range("dq", 0, 100).await.unwrap();
    assert_eq!(left.len(), 10);
    assert!(left.iter().all(|d| d.reason.starts_with("timeout")));
    // Everything else, retried; a queue with none, or unknown, does nothing.
    let sweep = store
        .dead_where(
            "dq",
            &DeadFilter::default(),
            DeadAction::Retry,
            u64::MAX,
            &seen,
        )
        .await
        .unwrap();
    assert_eq!(sweep.done, 10);
    assert_eq!(dead(store.clone()).await, 0);
    let none = store
        .dead_where(
            "nothing-here",
            &DeadFilter::default(),
            DeadAction::Retry,
            u64::MAX,
            &seen,
        )
        .await
        .unwrap();
    assert_eq!(none, DeadSweep::default());
}

/// `ready`: a queue's ready jobs of every kind, higher priority first then oldest, bounded;
/// neither a delayed nor a running job is listed, nor another queue's.
pub async fn ready_jobs_are_listed_in_claim_order(store: Stores) {
    let ids: Vec<JobId> = store
        .enqueue(vec![
            job("a").with_queue("rq"),
            job("b").with_queue("rq").with_priority(5),
            job("a").with_queue("rq"),
            job("b")
                .with_queue("rq")
                .with_delay(Duration::from_secs(3600)),
            job("a").with_queue("other"),
        ])
        .await
        .unwrap();
    let listed: Vec<JobId> = store
        .ready("rq", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|v| {
            assert_eq!(v.state, JobState::Ready);
            v.job.id
        })
        .collect();
    assert_eq!(listed, [ids[1], ids[0], ids[2]]);
    assert_eq!(store.ready("rq", 2).await.unwrap().len(), 2);
    assert!(store.ready("nothing-here", 10).await.unwrap().is_empty());
    // Claimed, it is no longer ready.
    let claimed = store.claim("rq", "suite", 1, TTL).await.unwrap();
    assert_eq!(claimed[0].job.id, ids[1]);
    let left: Vec<JobId> = store
        .ready("rq", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.job.id)
        .collect();
    assert_eq!(left, [ids[0], ids[2]]);
}

/// A completed job is found by id (`Inspect::completed`) with its kind, queue, priority, times
/// and every attempt (the failed one with its error, clipped on a character boundary), and its
/// result; a live job's view and a dead letter carry the attempts so far. An unknown id is
/// `None`.
pub async fn completed_jobs_are_kept_with_their_times_and_attempts(store: Stores) {
    let before = palisade::store::unix_ms();
    let enqueued = store
        .enqueue(vec![
            job("keep").with_queue("cq").with_priority(3),
            job("die").with_queue("cq"),
        ])
        .await
        .unwrap();
    let (id, doomed) = (enqueued[0], enqueued[1]);
    assert_eq!(
        store.completed(id).await.unwrap(),
        None,
        "not completed yet"
    );
    let live = store.job(id).await.unwrap().expect("live");
    assert_eq!(live.details.priority, 3);
    let at = live.details.enqueued_ms.expect("its enqueue time");
    assert!(at + 5_000 >= before, "enqueued at {at}, before {before}");
    assert_eq!(
        (live.details.started_ms, live.details.attempts.len()),
        (None, 0)
    );

    // A first attempt fails with a long error of multi-byte characters: kept clipped.
    let long = "é".repeat(400);
    let claims = store.claim("cq", "suite", 2, TTL).await.unwrap();
    assert_eq!(claims.len(), 2);
    let of = |id: JobId| claims.iter().find(|c| c.job.id == id).unwrap().lease.id;
    let results = store
        .settle(vec![
            (
                of(id),
                Settlement::Retry {
                    delay: Duration::ZERO,
                    reason: long.clone(),
                },
            ),
            (
                of(doomed),
                Settlement::Dead {
                    reason: "bad input".into(),
                },
            ),
        ])
        .await
        .unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let live = store.job(id).await.unwrap().expect("retried, live");
    let [first] = live.details.attempts.as_slice() else {
        panic!("one attempt ended: {:?}", live.details.attempts);
    };
    assert_eq!((first.number, first.outcome), (1, AttemptOutcome::Retried));
    let error = first.error.as_deref().unwrap();
    assert_eq!(error, palisade::rules::clip_error(&long));
    assert!(error.len() <= palisade::limits::MAX_ATTEMPT_ERROR_BYTES + 3);
    assert!(error.ends_with("...") && error.starts_with("éé"));
    let started = first.started_ms.expect("its start");
    assert!(started >= at && first.ended_ms >= started);

    let dead = store.dead("cq", 10).await.unwrap();
    let [dead] = dead.as_slice() else {
        panic!("one dead letter: {dead:?}")
    };
    let attempts = &dead.details.attempts;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0].outcome, AttemptOutcome::Died);
    assert_eq!(attempts[0].error.as_deref(), Some("bad input"));
    assert!(dead.details.enqueued_ms.is_some());

    // The second attempt completes with a result.
    let again = store.claim("cq", "suite", 1, TTL).await.unwrap().remove(0);
    assert_eq!((again.job.id, again.job.attempt), (id, 2));
    settle(
        &store,
        again.lease.id,
        Settlement::Complete {
            result: Some(r#"{"sum":42}"#.into()),
            then: palisade::Then::default(),
        },
    )
    .await
    .unwrap();
    assert_eq!(store.job(id).await.unwrap(), None, "no longer live");
    let done = store.completed(id).await.unwrap().expect("kept");
    assert_eq!(
        (
            done.job.kind.as_str(),
            done.job.queue.as_str(),
            done.job.attempt
        ),
        ("keep", "cq", 2)
    );
    assert_eq!(done.details.priority, 3);
    assert_eq!(done.details.enqueued_ms, Some(at));
    assert_eq!(done.result.as_deref(), Some(r#"{"sum":42}"#));
    let outcomes: Vec<_> = done
        .details
        .attempts
        .iter()
        .map(|a| (a.number, a.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [(1, AttemptOutcome::Retried), (2, AttemptOutcome::Completed)]
    );
    let last = &done.details.attempts[1];
    assert!(last.started_ms.unwrap() >= started);
    assert_eq!(last.ended_ms, done.completed_ms);
    assert!(done.completed_ms >= at);
    assert_eq!(store.counts("cq").await.unwrap().completed, 1);
    // Neither an unknown id nor a dead one is a completed job.
    assert_eq!(store.completed(JobId::new()).await.unwrap(), None);
    assert_eq!(store.completed(doomed).await.unwrap(), None);
}

/// The retention [`completed_records_keep_to_their_retention`] expects its store built with.
pub fn short_completed_retention() -> CompletedRetention {
    CompletedRetention {
        keep: Duration::from_millis(600),
        max: 3,
    }
}

/// A store built with [`short_completed_retention`] keeps the newest 3 completed jobs (the
/// oldest go first, within one batch too) and none of them past 600 ms; one built with
/// [`CompletedRetention::off`] (`kept_none`) keeps none. Not a `lease_store_suite!` case: its
/// store needs the retention set.
pub async fn completed_records_keep_to_their_retention(store: Stores, kept_none: bool) {
    let ids = store
        .enqueue((0..5).map(|_| job("r").with_queue("rq")).collect())
        .await
        .unwrap();
    let claims = store.claim("rq", "suite", 5, TTL).await.unwrap();
    assert_eq!(claims.len(), 5);
    // Completed in enqueue order within one batch: the first two are the oldest.
    let order: Vec<_> = ids
        .iter()
        .map(|id| {
            let c = claims.iter().find(|c| c.job.id == *id).unwrap();
            (c.lease.id, Settlement::completed())
        })
        .collect();
    let results = store.settle(order).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let mut kept = Vec::new();
    for id in &ids {
        kept.push(store.completed(*id).await.unwrap().is_some());
    }
    if kept_none {
        assert_eq!(kept, [false; 5]);
        return;
    }
    // (Within one batch the order of equal completion times is the batch's, on Redis by
    // id: which 3 of the 5 stay may differ, how many may not.)
    assert_eq!(kept.iter().filter(|k| **k).count(), 3, "{kept:?}");
    // One more completion pushes one more out.
    let more = store
        .enqueue(vec![job("r").with_queue("rq")])
        .await
        .unwrap();
    let c = store.claim("rq", "suite", 1, TTL).await.unwrap().remove(0);
    settle(&store, c.lease.id, Settlement::completed())
        .await
        .unwrap();
    assert!(store.completed(more[0]).await.unwrap().is_some());
    let mut left = 0;
    for id in &ids {
        left += usize::from(store.completed(*id).await.unwrap().is_some());
    }
    assert_eq!(left, 2);
    // Past the time, none.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(store.completed(more[0]).await.unwrap().is_none());
    for id in &ids {
        assert!(store.completed(*id).await.unwrap().is_none());
    }
    // A producer-chosen id run again after it completed, and dead this time: its id finds
    // the dead letter, the newest end, not the earlier completion.
    let id = JobId::new();
    let again = || {
        job("again")
            .with_queue("rq")
            .with_id_for(id, Duration::from_millis(1))
    };
    for dies in [false, true] {
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(store.enqueue(vec![again()]).await.unwrap(), [id]);
        let c = store.claim("rq", "suite", 1, TTL).await.unwrap().remove(0);
        assert_eq!(c.job.id, id, "enqueued again");
        let end = if dies {
            Settlement::Dead {
                reason: "second run died".into(),
            }
        } else {
            Settlement::completed()
        };
        settle(&store, c.lease.id, end).await.unwrap();
    }
    assert!(
        store.completed(id).await.unwrap().is_none(),
        "an older completion hides the newer death"
    );
    let dead = store.dead("rq", 10).await.unwrap();
    assert!(dead
        .iter()
        .any(|d| d.job.id == id && d.reason == "second run died"));
}
