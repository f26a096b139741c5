//! Cases for the hot path ([`LeaseStore`]): claims, leases, tokens, settlements, epochs.

use super::*;

/// Every one of the hot-path cases in this file: add a new one here too.
#[doc(hidden)]
#[macro_export]
macro_rules! lease_cases {
    ($($how:tt)*) => {
        $crate::lease_store_case!($($how)*;
            claim_honours_batch_priority_and_delay,
            one_live_lease_per_scope,
            tokens_grow_per_scope,
            renew_extends_and_reports_lost,
            stale_lease_is_powerless,
            stalls_requeue_then_bury,
            retry_and_dead_settlements,
            fenced_settlement_reseeds_above_the_sink,
            enqueue_rejects_bad_jobs_whole,
            names_are_checked_and_default_scopes_are_private,
            a_held_scope_blocks_only_itself,
            release_gives_the_job_back_uncharged,
            epoch_limit_and_dead_purge,
            one_settlement_per_lease_per_batch,
            claims_only_the_kinds_asked_for,
            the_watermark_stays_below_every_live_lease,
            unique_keys_make_enqueue_idempotent,
            a_producer_chosen_id_is_one_job_however_often_it_is_enqueued,
            an_idempotency_key_refuses_a_different_request,
            a_dead_job_is_not_revived_over_a_live_job_of_its_id,
            a_retried_dead_letter_keeps_its_priority,
            a_job_id_is_taken_while_the_job_is_known_and_for_its_ttl,
            settle_and_claim_settles_first,
            a_result_is_kept_with_its_completion,
            follow_ups_are_kept_with_an_accepted_completion,
            a_job_keeps_its_trace_through_every_path,
        );
    };
}

pub async fn claim_honours_batch_priority_and_delay(store: Stores) {
    store
        .enqueue(vec![
            job("low"),
            job("high").with_priority(5),
            job("later").with_delay(Duration::from_millis(300)),
            job("low2"),
        ])
        .await
        .unwrap();
    let first = claim(&store, 2).await;
    let kinds: Vec<&str> = first.iter().map(|c| c.job.kind.as_str()).collect();
    assert_eq!(kinds, ["high", "low"]);
    assert!(first.iter().all(|c| c.job.attempt == 1));
    assert_eq!(
        claim(&store, 5).await.len(),
        1,
        "delayed job claimable too early"
    );
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.ready, counts.delayed, counts.leased), (0, 1, 3));
    tokio::time::sleep(Duration::from_millis(350)).await;
    let later = claim(&store, 5).await;
    assert_eq!(later.len(), 1);
    assert_eq!(later[0].job.kind, "later");
    assert!(store
        .claim("other-queue", "suite", 5, TTL)
        .await
        .unwrap()
        .is_empty());
}

pub async fn one_live_lease_per_scope(store: Stores) {
    store
        .enqueue(vec![
            job("a").with_scope("s"),
            job("b").with_scope("s"),
            job("c").with_scope("t"),
        ])
        .await
        .unwrap();
    let first = claim(&store, 10).await;
    let mut scopes: Vec<&str> = first.iter().map(|c| c.lease.scope.as_str()).collect();
    scopes.sort_unstable();
    assert_eq!(scopes, ["s", "t"], "a busy scope was granted twice");
    assert!(claim(&store, 10).await.is_empty());
    let a = first.iter().find(|c| c.job.kind == "a").unwrap();
    settle(&store, a.lease.id, Settlement::completed())
        .await
        .unwrap();
    let second = claim(&store, 10).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].job.kind, "b");
    assert!(second[0].lease.token > a.lease.token);
}

pub async fn tokens_grow_per_scope(store: Stores) {
    let mut last = None;
    for _ in 0..5 {
        store
            .enqueue(vec![job("x").with_scope("grow")])
            .await
            .unwrap();
        let c = claim(&store, 1).await.remove(0);
        assert!(Some(c.lease.token) > last, "token did not grow");
        last = Some(c.lease.token);
        assert_eq!(
            store.highest_token(&Scope::new("grow")).await.unwrap(),
            last
        );
        settle(&store, c.lease.id, Settlement::completed())
            .await
            .unwrap();
    }
    // An idle scope leaves nothing behind (bounded state); tokens still grow, since they
    // come from one counter per coordinator.
    assert_eq!(
        store.highest_token(&Scope::new("grow")).await.unwrap(),
        None
    );
    store
        .enqueue(vec![job("y").with_scope("fresh")])
        .await
        .unwrap();
    let fresh = claim(&store, 1).await.remove(0);
    assert_eq!(
        store.highest_token(&Scope::new("fresh")).await.unwrap(),
        Some(fresh.lease.token)
    );
    assert_eq!(
        store.highest_token(&Scope::new("never")).await.unwrap(),
        None
    );
}

pub async fn renew_extends_and_reports_lost(store: Stores) {
    store.enqueue(vec![job("r")]).await.unwrap();
    // (A longer ttl than the suite's: the suite's cases run side by side, and on two loaded
    // cores a renewal sent half a 400 ms ttl after the last one can arrive after it expired —
    // which failed this case once in CI on a cluster.)
    let ttl = TTL * 5;
    let lease = claim_ttl(&store, ttl).await;
    let stranger = LeaseId::new();
    // Renew well past the first ttl: still held.
    for _ in 0..3 {
        tokio::time::sleep(ttl / 2).await;
        let lost = store.renew(&[lease, stranger], ttl).await.unwrap();
        assert_eq!(lost, [stranger]);
    }
    settle(&store, lease, Settlement::completed())
        .await
        .unwrap();
    assert_eq!(store.renew(&[lease], TTL).await.unwrap(), [lease]);
    // A lease that expired is lost even before the reaper has seen it: a renewal must not
    // revive it (a mutation test found this unchecked).
    store.enqueue(vec![job("x")]).await.unwrap();
    let short = claim_ttl(&store, Duration::from_millis(20)).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(store.renew(&[short], TTL).await.unwrap(), [short]);
    // Nor may it settle: the coordinator's clock ended it, whether or not a reaper ran.
    let late = settle(&store, short, Settlement::completed()).await;
    assert!(
        matches!(late, Err(Error::LeaseNotCurrent(l)) if l == short),
        "an expired lease settled: {late:?}"
    );
    assert_eq!(
        store.reap(10).await.unwrap().len(),
        1,
        "reaped, not revived"
    );
    assert_eq!(claim(&store, 1).await.len(), 1, "the job runs again");
}

async fn claim_ttl(store: &Stores, ttl: Duration) -> LeaseId {
    store.claim("default", "w", 1, ttl).await.unwrap()[0]
        .lease
        .id
}

pub async fn stale_lease_is_powerless(store: Stores) {
    store.enqueue(vec![job("p").with_scope("p")]).await.unwrap();
    let old = claim(&store, 1).await.remove(0);
    // Let it expire and be reaped; a new holder takes over.
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
    assert_eq!(store.reap(100).await.unwrap().len(), 1);
    let new = claim(&store, 1).await.remove(0);
    assert_eq!(new.job.id, old.job.id);
    assert_eq!(new.job.attempt, 2);
    assert_eq!(new.job.stalls, 1);
    assert!(new.lease.token > old.lease.token);
    // Every operation by the old lease is refused and leaves the new claim alone.
    assert_eq!(
        store.renew(&[old.lease.id], TTL).await.unwrap(),
        [old.lease.id]
    );
    for s in [
        Settlement::completed(),
        Settlement::Retry {
            delay: Duration::ZERO,
            reason: "x".into(),
        },
        Settlement::Dead { reason: "x".into() },
    ] {
        let r = settle(&store, old.lease.id, s).await;
        assert!(
            matches!(r, Err(Error::LeaseNotCurrent(l)) if l == old.lease.id),
            "{r:?}"
        );
    }
    assert!(settle(&store, LeaseId::new(), Settlement::completed())
        .await
        .is_err());
    assert_eq!(
        store.renew(&[new.lease.id], TTL).await.unwrap(),
        Vec::<LeaseId>::new()
    );
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.leased, counts.completed, counts.dead), (1, 0, 0));
    settle(&store, new.lease.id, Settlement::completed())
        .await
        .unwrap();
    assert!(
        settle(&store, new.lease.id, Settlement::completed())
            .await
            .is_err(),
        "completed twice"
    );
    assert_eq!(store.counts("default").await.unwrap().completed, 1);
}

pub async fn stalls_requeue_then_bury(store: Stores) {
    store
        .enqueue(vec![job("stall").with_max_stalls(1)])
        .await
        .unwrap();
    for round in 1..=2 {
        let c = claim(&store, 1).await;
        assert_eq!(c.len(), 1, "round {round}");
        tokio::time::sleep(TTL + Duration::from_millis(50)).await;
        let reaped = store.reap(100).await.unwrap();
        assert_eq!(reaped.len(), 1);
        assert_eq!(reaped[0].dead, round == 2);
        assert_eq!(reaped[0].queue, "default");
    }
    let dead = store.dead("default", 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].job.stalls, 2);
    assert!(dead[0].reason.contains("expired"), "{}", dead[0].reason);
    assert!(claim(&store, 1).await.is_empty());
}

pub async fn retry_and_dead_settlements(store: Stores) {
    store.enqueue(vec![job("retry"), job("die")]).await.unwrap();
    let claims = claim(&store, 2).await;
    let lease = |k: &str| claims.iter().find(|c| c.job.kind == k).unwrap().lease.id;
    let retry = Settlement::Retry {
        delay: Duration::from_millis(200),
        reason: "later".into(),
    };
    settle(&store, lease("retry"), retry).await.unwrap();
    settle(
        &store,
        lease("die"),
        Settlement::Dead {
            reason: "bad input".into(),
        },
    )
    .await
    .unwrap();
    assert!(claim(&store, 1).await.is_empty(), "retry ignored its delay");
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.delayed, counts.dead, counts.leased), (1, 1, 0));
    tokio::time::sleep(Duration::from_millis(250)).await;
    let again = claim(&store, 1).await;
    assert_eq!(again[0].job.attempt, 2);
    let dead = store.dead("default", 10).await.unwrap();
    assert_eq!(dead[0].reason, "bad input");
    assert_eq!(dead[0].job.kind, "die");
}

pub async fn fenced_settlement_reseeds_above_the_sink(store: Stores) {
    store
        .enqueue(vec![job("f").with_scope("f"), job("g").with_scope("g")])
        .await
        .unwrap();
    let claims = claim(&store, 2).await;
    let (f, g) = (&claims[0].lease, &claims[1].lease);
    // A sink reports a token far above what this coordinator granted: its counters regressed.
    let highest = FencingToken::new(f.token.epoch() + 3, 5);
    let reason = "token conflict".to_string();
    settle(
        &store,
        f.id,
        Settlement::Fenced {
            highest,
            reason: reason.clone(),
        },
    )
    .await
    .unwrap();
    let again = claim(&store, 1).await.remove(0);
    assert_eq!(again.job.kind, "f", "a fenced job runs again at once");
    assert!(
        again.lease.token > highest,
        "{:?} is not above {highest:?}",
        again.lease.token
    );
    // A stale lease's fenced settlement is refused and moves nothing.
    settle(&store, g.id, Settlement::completed()).await.unwrap();
    let far = FencingToken::new(again.lease.token.epoch() + 50, 1);
    let r = settle(
        &store,
        g.id,
        Settlement::Fenced {
            highest: far,
            reason,
        },
    )
    .await;
    assert!(matches!(r, Err(Error::LeaseNotCurrent(_))));
    settle(&store, again.lease.id, Settlement::completed())
        .await
        .unwrap();
    store.enqueue(vec![job("h").with_scope("f")]).await.unwrap();
    assert!(claim(&store, 1).await[0].lease.token < far);
}

pub async fn enqueue_rejects_bad_jobs_whole(store: Stores) {
    let huge = NewJob::raw(
        "big",
        format!("\"{}\"", "x".repeat(DEFAULT_MAX_PAYLOAD_BYTES)),
    );
    let r = store.enqueue(vec![job("fine"), huge]).await;
    assert!(
        matches!(r, Err(Error::InvalidJob(ref m)) if m.contains("payload")),
        "{r:?}"
    );
    assert!(matches!(
        store.enqueue(vec![job("")]).await,
        Err(Error::InvalidJob(_))
    ));
    assert_eq!(
        store.counts("default").await.unwrap(),
        QueueCounts::default(),
        "partial enqueue"
    );
}

/// Issue 7, case 4: every name a careless caller can send is checked before anything is
/// stored, the same way on every backend, and a named scope can never be another job's
/// default scope (which used to give two live leases on one scope).
pub async fn names_are_checked_and_default_scopes_are_private(store: Stores) {
    let a = store.enqueue(vec![job("a")]).await.unwrap()[0];
    let bad = [
        job("b").with_scope(Scope::of_job(a)),
        job("b").with_scope(""),
        job("b").with_scope("line\nbreak"),
        job("b").with_scope("x".repeat(MAX_NAME_BYTES + 1)),
        job("b").with_queue(""),
        job("b").with_queue("tab\tqueue"),
        job("\u{7f}"),
        job("b").with_priority(5000),
        job("b").with_priority(i32::MIN),
        job("b").with_delay(Duration::MAX),
    ];
    for b in bad {
        let r = store.enqueue(vec![job("fine"), b.clone()]).await;
        assert!(
            matches!(r, Err(Error::InvalidJob(_))),
            "{b:?} accepted: {r:?}"
        );
    }
    let counts = store.counts("default").await.unwrap();
    assert_eq!(counts.ready, 1, "a refused batch left jobs behind");
    let ok = store
        .enqueue(vec![job("b").with_scope("job:42").with_priority(4096)])
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    let claims = claim(&store, 10).await;
    assert_eq!(claims.len(), 2);
    let mine = claims.iter().find(|c| c.job.id == a).unwrap();
    assert_eq!(mine.lease.scope, Scope::of_job(a));
    assert_eq!(mine.job.scope, Scope::of_job(a));
    assert_eq!(mine.lease.scope.job(), Some(a));
}

/// Issue 7, case 9: jobs of a held scope wait aside, so `claim(n)` returns
/// min(n, ready jobs whose scope is free) however many blocked jobs sit ahead of them.
pub async fn a_held_scope_blocks_only_itself(store: Stores) {
    store
        .enqueue(vec![job("hot").with_scope("hot")])
        .await
        .unwrap();
    // (Held for the whole case: enqueueing 3000 jobs on a partitioned cluster under a loaded
    // test run can outlast the suite's short TTL, and a lapsed holder would free the scope.)
    let holder = store
        .claim("default", "suite", 1, Duration::from_secs(60))
        .await
        .unwrap()
        .remove(0);
    let blocked: Vec<NewJob> = (0..3000)
        .map(|_| job("hot").with_scope("hot").with_priority(9))
        .collect();
    store.enqueue(blocked).await.unwrap();
    let free: Vec<NewJob> = (0..5)
        .map(|i| job("free").with_scope(format!("free:{i}")))
        .collect();
    store.enqueue(free).await.unwrap();
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.ready, counts.waiting, counts.leased), (5, 3000, 1));
    let got = claim(&store, 10).await;
    assert_eq!(
        got.len(),
        5,
        "free scopes did not all flow past the held one"
    );
    assert!(got.iter().all(|c| c.job.kind == "free"));
    assert!(claim(&store, 10).await.is_empty());
    // Blocked ahead of free ones that were enqueued *before* the scope was held, too.
    store
        .enqueue((0..100).map(|_| job("cold").with_scope("cold")).collect())
        .await
        .unwrap();
    store
        .enqueue(vec![job("late").with_scope("late")])
        .await
        .unwrap();
    let got = claim(&store, 10).await;
    let kinds: Vec<&str> = got.iter().map(|c| c.job.kind.as_str()).collect();
    assert_eq!(kinds, ["cold", "late"]);
    // The holder finishes: the next job of its scope (and only one) becomes claimable.
    settle(&store, holder.lease.id, Settlement::completed())
        .await
        .unwrap();
    let next = claim(&store, 10).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].job.kind, "hot");
    assert!(next[0].lease.token > holder.lease.token);
    // A retry with a delay gives the scope's turn to the next job meanwhile.
    settle(
        &store,
        next[0].lease.id,
        Settlement::Retry {
            delay: Duration::from_secs(3600),
            reason: "later".into(),
        },
    )
    .await
    .unwrap();
    let after = claim(&store, 10).await;
    assert_eq!(after.len(), 1);
    assert_ne!(after[0].job.id, next[0].job.id);
    let counts = store.counts("default").await.unwrap();
    assert_eq!(counts.waiting, 2998 + 99);
    assert_eq!(counts.delayed, 1);
}

/// Issue 7, case 8: a released job is ready again at once with its attempt not counted and
/// no stall charged; the released lease is powerless.
pub async fn release_gives_the_job_back_uncharged(store: Stores) {
    store
        .enqueue(vec![job("r").with_scope("rel"), job("w").with_scope("rel")])
        .await
        .unwrap();
    let first = claim(&store, 5).await;
    assert_eq!(first.len(), 1);
    let c = &first[0];
    assert_eq!((c.job.kind.as_str(), c.job.attempt), ("r", 1));
    settle(&store, c.lease.id, Settlement::Release)
        .await
        .unwrap();
    let again = claim(&store, 5).await;
    assert_eq!(again.len(), 1, "released job lost its scope's turn");
    assert_eq!(
        (again[0].job.id, again[0].job.attempt, again[0].job.stalls),
        (c.job.id, 1, 0)
    );
    assert!(again[0].lease.token > c.lease.token);
    assert!(matches!(
        settle(&store, c.lease.id, Settlement::completed()).await,
        Err(Error::LeaseNotCurrent(_))
    ));
    assert_eq!(
        store.renew(&[c.lease.id], TTL).await.unwrap(),
        vec![c.lease.id]
    );
}

/// Issue 7, cases 6-7: a reseed above the last epoch is a typed error that changes nothing;
/// dead letters can be purged.
pub async fn epoch_limit_and_dead_purge(store: Stores) {
    store.enqueue(vec![job("e")]).await.unwrap();
    let c = claim(&store, 1).await.remove(0);
    let top = FencingToken::new(FencingToken::MAX_EPOCH, 5);
    let r = settle(
        &store,
        c.lease.id,
        Settlement::Fenced {
            highest: top,
            reason: "x".into(),
        },
    )
    .await;
    assert!(matches!(r, Err(Error::Epoch(_))), "{r:?}");
    assert!(!r.unwrap_err().is_retryable());
    assert_eq!(
        store.counts("default").await.unwrap().leased,
        1,
        "the refused reseed changed state"
    );
    settle(
        &store,
        c.lease.id,
        Settlement::Dead {
            reason: "d0".into(),
        },
    )
    .await
    .unwrap();
    store.enqueue(vec![job("d1"), job("d2")]).await.unwrap();
    for c in claim(&store, 2).await {
        settle(
            &store,
            c.lease.id,
            Settlement::Dead {
                reason: c.job.kind.clone(),
            },
        )
        .await
        .unwrap();
    }
    assert_eq!(store.purge_dead("default", 2).await.unwrap(), 2);
    let left = store.dead("default", 10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].reason, "d2", "purge takes the oldest first");
    assert_eq!(store.purge_dead("default", 10).await.unwrap(), 1);
    assert_eq!(store.purge_dead("nowhere", 10).await.unwrap(), 0);
}

/// A lease named twice in one settle batch is current for its first settlement only (found
/// by the differential test: Redis used to complete the job twice and hand its scope's turn
/// to the deleted job). A fenced settlement does not spend an attempt.
pub async fn one_settlement_per_lease_per_batch(store: Stores) {
    store
        .enqueue(vec![job("x").with_scope("dup")])
        .await
        .unwrap();
    let c = claim(&store, 1).await.remove(0);
    let results = store
        .settle(vec![
            (c.lease.id, Settlement::completed()),
            (c.lease.id, Settlement::Release),
        ])
        .await
        .unwrap();
    assert!(results[0].is_ok());
    assert!(
        matches!(results[1], Err(Error::LeaseNotCurrent(_))),
        "{results:?}"
    );
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.ready, counts.leased, counts.completed), (0, 0, 1));
    store
        .enqueue(vec![job("y").with_scope("dup")])
        .await
        .unwrap();
    let y = claim(&store, 1).await.remove(0);
    assert_eq!(y.job.kind, "y", "the scope's turn went to a deleted job");
    let fenced = Settlement::Fenced {
        highest: y.lease.token,
        reason: "regressed".into(),
    };
    settle(&store, y.lease.id, fenced).await.unwrap();
    let again = claim(&store, 1).await.remove(0);
    assert_eq!((again.job.id, again.job.attempt), (y.job.id, 1));
}

/// Issue 8, case 6: a worker claims only kinds it has handlers for, however many jobs of
/// other kinds sit ahead; those wait (visible as ready) for a worker that has them.
pub async fn claims_only_the_kinds_asked_for(store: Stores) {
    let others: Vec<NewJob> = (0..3000).map(|_| job("other").with_priority(5)).collect();
    store.enqueue(others).await.unwrap();
    store
        .enqueue(vec![
            job("mine"),
            job("also-mine").with_scope("m"),
            job("mine").with_priority(1),
        ])
        .await
        .unwrap();
    let kinds = ["mine".to_owned(), "also-mine".to_owned()];
    let got = store
        .claim_kinds("default", &kinds, "w", 10, TTL)
        .await
        .unwrap();
    let kinds_got: Vec<&str> = got.iter().map(|c| c.job.kind.as_str()).collect();
    assert_eq!(
        kinds_got,
        ["mine", "mine", "also-mine"],
        "ready order within the asked kinds"
    );
    assert_eq!(got[0].job.attempt, 1);
    assert_eq!(store.counts("default").await.unwrap().ready, 3000);
    assert!(store
        .claim_kinds("default", &kinds, "w", 10, TTL)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store.claim("default", "w", 4, TTL).await.unwrap().len(),
        4,
        "no kinds: any kind"
    );
}

/// Issue 9: the coordinator's low watermark is the smallest live token (or the next token
/// when none is live): below every current lease, never lower than before.
pub async fn the_watermark_stays_below_every_live_lease(store: Stores) {
    assert_eq!(store.watermark(), None, "nothing published before a settle");
    store
        .enqueue(vec![job("a"), job("b"), job("c")])
        .await
        .unwrap();
    let claims = claim(&store, 3).await;
    let t: Vec<FencingToken> = claims.iter().map(|c| c.lease.token).collect();
    assert!(t[0] < t[1] && t[1] < t[2]);
    settle(&store, claims[1].lease.id, Settlement::completed())
        .await
        .unwrap();
    assert_eq!(
        store.watermark(),
        Some(t[0]),
        "the oldest live lease holds it back"
    );
    settle(&store, claims[0].lease.id, Settlement::completed())
        .await
        .unwrap();
    assert_eq!(store.watermark(), Some(t[2]));
    settle(&store, claims[2].lease.id, Settlement::Release)
        .await
        .unwrap();
    let idle = store.watermark().unwrap();
    assert!(idle > t[2], "no live lease: the next token");
    // A refused settlement publishes too, and the watermark never goes back.
    assert!(settle(&store, claims[0].lease.id, Settlement::completed())
        .await
        .is_err());
    assert_eq!(store.watermark(), Some(idle));
    let again = claim(&store, 1).await.remove(0);
    assert!(
        again.lease.token >= idle,
        "every new lease is at or above it"
    );
    settle(&store, again.lease.id, Settlement::completed())
        .await
        .unwrap();
    assert!(store.watermark().unwrap() > again.lease.token);
}

/// `NewJob::with_unique_key`: a second enqueue while the first job is pending, or within its
/// ttl after it is done, adds nothing and returns the first job's id; a batch is still all or
/// nothing; the key goes after completion or death plus the ttl.
pub async fn unique_keys_make_enqueue_idempotent(store: Stores) {
    // (Long enough that the steps before the job's end fit in it on a loaded 3-master
    // cluster: 300 ms did not, once in CI.)
    let ttl = Duration::from_secs(2);
    let keyed = |queue: &str, key: &str, ttl: Duration| {
        job("a").with_queue(queue).with_unique_key(key, ttl)
    };
    let first = store
        .enqueue_all(vec![keyed("q1", "k", ttl)])
        .await
        .unwrap();
    let Enqueued::Added(a) = first[0] else {
        panic!("{first:?}")
    };
    // Pending: the same key in another queue, of another kind, is still the same key.
    let again = store
        .enqueue_all(vec![job("b").with_queue("q2").with_unique_key("k", ttl)])
        .await
        .unwrap();
    assert_eq!(again, vec![Enqueued::Existing(a)]);
    assert_eq!(store.counts("q2").await.unwrap(), QueueCounts::default());

    // In one batch, the second job with a key is turned away by the first.
    let batch = store
        .enqueue_all(vec![
            keyed("q3", "x", ttl),
            keyed("q3", "x", ttl),
            job("c").with_queue("q3"),
        ])
        .await
        .unwrap();
    let (Enqueued::Added(c), Enqueued::Existing(c2), Enqueued::Added(_)) =
        (batch[0], batch[1], batch[2])
    else {
        panic!("{batch:?}")
    };
    assert_eq!(c, c2);
    assert_eq!(store.counts("q3").await.unwrap().ready, 2);

    // Running, then done: held until the ttl (from enqueue) ends, then free.
    let lease = store
        .claim("q1", "suite", 1, TTL)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(lease.job.id, a);
    let running = store.enqueue(vec![keyed("q1", "k", ttl)]).await.unwrap();
    assert_eq!(running, vec![a]);
    settle(&store, lease.lease.id, Settlement::completed())
        .await
        .unwrap();
    assert_eq!(
        store.enqueue(vec![keyed("q1", "k", ttl)]).await.unwrap(),
        vec![a]
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let later = store
        .enqueue_all(vec![keyed("q1", "k", ttl)])
        .await
        .unwrap();
    assert!(
        matches!(later[0], Enqueued::Added(id) if id != a),
        "{later:?}"
    );

    // A zero ttl holds only while the job is pending; death gives the key up too.
    for (queue, end) in [
        ("q4", Settlement::completed()),
        (
            "q5",
            Settlement::Dead {
                reason: "no".into(),
            },
        ),
    ] {
        let held = store
            .enqueue(vec![keyed(queue, queue, Duration::ZERO)])
            .await
            .unwrap();
        let lease = store
            .claim(queue, "suite", 1, TTL)
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(lease.job.id, held[0]);
        settle(&store, lease.lease.id, end).await.unwrap();
        let next = store
            .enqueue_all(vec![keyed(queue, queue, Duration::ZERO)])
            .await
            .unwrap();
        assert!(
            matches!(next[0], Enqueued::Added(id) if id != held[0]),
            "{queue}: {next:?}"
        );
    }

    // Bad keys refuse the whole batch.
    for bad in ["", "a\nb"] {
        let refused = store
            .enqueue_all(vec![keyed("q6", "fine", ttl), keyed("q6", bad, ttl)])
            .await;
        assert!(
            matches!(refused, Err(Error::InvalidJob(_))),
            "{bad:?}: {refused:?}"
        );
    }
    let too_long = store.enqueue(vec![keyed("q6", "t", MAX_DELAY * 2)]).await;
    assert!(matches!(too_long, Err(Error::InvalidJob(_))));
    assert_eq!(store.counts("q6").await.unwrap(), QueueCounts::default());
    let fine = store
        .enqueue_all(vec![keyed("q6", "fine", ttl)])
        .await
        .unwrap();
    assert!(matches!(fine[0], Enqueued::Added(_)));
}

/// Issue 23: a retried enqueue (the reply of the first was lost) is the same job when the job
/// carries its id.
pub async fn a_producer_chosen_id_is_one_job_however_often_it_is_enqueued(store: Stores) {
    let (x, y, z) = (JobId::new(), JobId::new(), JobId::new());
    let q = |kind: &str| job(kind).with_queue("ids");
    assert_eq!(
        store.enqueue_all(vec![q("a").with_id(x)]).await.unwrap(),
        [Enqueued::Added(x)]
    );
    // Again, alone or in a batch with a new job: the known one adds nothing.
    let again = store
        .enqueue_all(vec![q("a").with_id(x), q("b").with_id(y)])
        .await
        .unwrap();
    assert_eq!(again, [Enqueued::Existing(x), Enqueued::Added(y)]);
    // Two jobs with one id in one batch: refused whole, nothing added.
    let twice = store
        .enqueue_all(vec![q("c").with_id(z), q("d").with_id(z)])
        .await;
    assert!(matches!(twice, Err(Error::InvalidJob(_))), "{twice:?}");
    assert_eq!(store.counts("ids").await.unwrap().ready, 2);
    // Without the unique key `with_id` makes, a live job's id still adds nothing.
    let mut bare = q("e").with_id(z);
    bare.unique = None;
    assert_eq!(
        store.enqueue_all(vec![bare.clone()]).await.unwrap(),
        [Enqueued::Added(z)]
    );
    assert_eq!(
        store.enqueue_all(vec![bare]).await.unwrap(),
        [Enqueued::Existing(z)]
    );
    // Done: the id stays taken (for `ID_RETENTION`).
    let claims = store.claim("ids", "suite", 10, TTL).await.unwrap();
    assert_eq!(claims.len(), 3);
    for c in &claims {
        settle(&store, c.lease.id, Settlement::completed())
            .await
            .unwrap();
    }
    assert_eq!(
        store.enqueue_all(vec![q("a").with_id(x)]).await.unwrap(),
        [Enqueued::Existing(x)]
    );
    // A unique key of the job's own decides: another id under a held key is turned away.
    let w = JobId::new();
    let keyed = store
        .enqueue_all(vec![
            q("f").with_unique_key("ids-k", TTL).with_id(w),
            q("g").with_unique_key("ids-k", TTL).with_id(JobId::new()),
        ])
        .await
        .unwrap();
    assert_eq!(keyed, [Enqueued::Added(w), Enqueued::Existing(w)]);
    let counts = store.counts("ids").await.unwrap();
    assert_eq!((counts.ready, counts.completed), (1, 3), "{counts:?}");
}

/// Issue 58 (M4): a key taken with a fingerprint (an HTTP `Idempotency-Key`, a job's own id)
/// answers the same request with its job and refuses a different one — the whole batch,
/// naming the key — where a plain unique key turns any job away.
pub async fn an_idempotency_key_refuses_a_different_request(store: Stores) {
    let keyed = |kind: &str, key: &str, fp: Option<&str>| {
        let mut job = job(kind).with_queue("idem").with_unique_key(key, TTL);
        job.unique.as_mut().unwrap().fingerprint = fp.map(str::to_owned);
        job
    };
    let first = store
        .enqueue_all(vec![keyed("a", "idem-k", Some("f1"))])
        .await
        .unwrap();
    let Enqueued::Added(x) = first[0] else {
        panic!("{first:?}")
    };
    assert_eq!(
        store
            .enqueue_all(vec![keyed("a", "idem-k", Some("f1"))])
            .await
            .unwrap(),
        [Enqueued::Existing(x)]
    );
    let other = store
        .enqueue_all(vec![keyed("b", "idem-k", Some("f2"))])
        .await;
    assert!(
        matches!(&other, Err(Error::Conflict(m)) if m.contains("idem-k")),
        "{other:?}"
    );
    assert_eq!(store.counts("idem").await.unwrap().ready, 1);
    // A plain key under it deduplicates, as before fingerprints.
    assert_eq!(
        store
            .enqueue_all(vec![keyed("c", "idem-k", None)])
            .await
            .unwrap(),
        [Enqueued::Existing(x)]
    );
    // Within one batch: the same request twice is one job; two different ones are refused,
    // the first not added either. (A batch that spans partitions is decided per partition.)
    let same = store
        .enqueue_all(vec![
            keyed("m", "idem-b", Some("g1")),
            keyed("m", "idem-b", Some("g1")),
        ])
        .await
        .unwrap();
    assert_eq!(same[1], Enqueued::Existing(same[0].id()));
    let split = store
        .enqueue_all(vec![
            keyed("m", "idem-c", Some("g1")),
            keyed("m", "idem-c", Some("g2")),
        ])
        .await;
    assert!(matches!(split, Err(Error::Conflict(_))), "{split:?}");
    assert_eq!(store.counts("idem").await.unwrap().ready, 2);
    // A producer-chosen id is fingerprinted by its job, queued, running and completed.
    let y = JobId::new();
    let named = |kind: &str| job(kind).with_queue("idem").with_id(y);
    for expected in [Enqueued::Added(y), Enqueued::Existing(y)] {
        assert_eq!(
            store.enqueue_all(vec![named("d")]).await.unwrap(),
            [expected]
        );
    }
    let claims = store.claim("idem", "suite", 10, TTL).await.unwrap();
    assert_eq!(claims.len(), 3);
    for done in [false, true] {
        let other = store.enqueue_all(vec![named("e")]).await;
        assert!(
            matches!(&other, Err(Error::Conflict(m)) if m.contains(&y.to_string())),
            "{other:?}"
        );
        assert_eq!(
            store.enqueue_all(vec![named("d")]).await.unwrap(),
            [Enqueued::Existing(y)]
        );
        if !done {
            for c in &claims {
                settle(&store, c.lease.id, Settlement::completed())
                    .await
                    .unwrap();
            }
        }
    }
    // A producer-chosen id beside an idempotency key of another name: the id stays taken
    // after its job completed (found by the attack on issue 58: another job under the id was
    // added over the completed one's record). (Beside a plain key, that key decides alone.)
    // (One named scope for them all: on a partitioned coordinator a key or an id is unique
    // per partition, and the scope keeps these in one.)
    let z = JobId::new();
    let mut first = job("z1")
        .with_queue("idem2")
        .with_scope("idem-z")
        .with_unique_key("idem-z", TTL)
        .with_id(z);
    first.unique.as_mut().unwrap().fingerprint = Some(first.fingerprint());
    assert_eq!(
        store.enqueue_all(vec![first]).await.unwrap(),
        [Enqueued::Added(z)]
    );
    let c = store.claim("idem2", "suite", 1, TTL).await.unwrap();
    settle(&store, c[0].lease.id, Settlement::completed())
        .await
        .unwrap();
    let under_z = |kind: &str| {
        job(kind)
            .with_queue("idem2")
            .with_scope("idem-z")
            .with_id(z)
    };
    let other = store.enqueue_all(vec![under_z("z2")]).await;
    assert!(matches!(other, Err(Error::Conflict(_))), "{other:?}");
    assert_eq!(
        store.enqueue_all(vec![under_z("z1")]).await.unwrap(),
        [Enqueued::Existing(z)]
    );
    assert_eq!(store.counts("idem2").await.unwrap().ready, 0);
}

/// Issue 24: the key of a job's own id (`with_id`) may lapse while the job is still pending or
/// running (Redis sets it with its ttl at enqueue and a job's end leaves it alone): the job
/// itself keeps its id taken until it is done, the key until its ttl from enqueue ends, and
/// then the id is free again.
pub async fn a_job_id_is_taken_while_the_job_is_known_and_for_its_ttl(store: Stores) {
    let ttl = Duration::from_secs(2);
    let q = |kind: &str, id: JobId| {
        let mut job = job(kind).with_queue("idttl").with_id(id);
        job.unique = Some(UniqueKey {
            key: format!("id:{id}"),
            ttl,
            fingerprint: None,
        });
        job
    };
    let (x, y, z) = (JobId::new(), JobId::new(), JobId::new());
    assert_eq!(
        store.enqueue_all(vec![q("a", x), q("a", y)]).await.unwrap(),
        [Enqueued::Added(x), Enqueued::Added(y)]
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    // Past the ttl, pending: still one job each (another job under the id is refused as a
    // different request), and its id's key is still held for a job that names it as its
    // unique key.
    assert_eq!(
        store.enqueue_all(vec![q("a", x)]).await.unwrap(),
        [Enqueued::Existing(x)]
    );
    let other = store.enqueue_all(vec![q("b", x)]).await;
    assert!(matches!(other, Err(Error::Conflict(_))), "{other:?}");
    let naming = job("n")
        .with_queue("idttl")
        .with_unique_key(format!("id:{x}"), ttl);
    assert_eq!(
        store.enqueue_all(vec![naming]).await.unwrap(),
        [Enqueued::Existing(x)]
    );
    let claims = store.claim("idttl", "suite", 2, TTL).await.unwrap();
    assert_eq!(claims.len(), 2);
    // Running: still one job; done past its ttl: free, a new job under the same id.
    let (done, running) = if claims[0].job.id == x {
        (&claims[0], &claims[1])
    } else {
        (&claims[1], &claims[0])
    };
    settle(&store, done.lease.id, Settlement::completed())
        .await
        .unwrap();
    assert_eq!(
        store.enqueue_all(vec![q("c", x), q("a", y)]).await.unwrap(),
        [Enqueued::Added(x), Enqueued::Existing(y)]
    );
    assert_eq!(running.job.id, y);
    // Done within its ttl: taken until the ttl ends, then free.
    store.enqueue_all(vec![q("e", z)]).await.unwrap();
    let c = store.claim("idttl", "suite", 5, TTL).await.unwrap();
    let zc = c.iter().find(|c| c.job.id == z).expect("z is claimed");
    settle(&store, zc.lease.id, Settlement::completed())
        .await
        .unwrap();
    assert_eq!(
        store.enqueue_all(vec![q("e", z)]).await.unwrap(),
        [Enqueued::Existing(z)]
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(
        store.enqueue_all(vec![q("e", z)]).await.unwrap(),
        [Enqueued::Added(z)]
    );
}

/// Found by the attack review of issue 23: a dead job's id enqueued again (its id no longer
/// taken) names a live job; retrying the dead record must not write over that job.
pub async fn a_dead_job_is_not_revived_over_a_live_job_of_its_id(store: Stores) {
    let x = JobId::new();
    let mut bare = job("a").with_queue("revive").with_id(x);
    bare.unique = None;
    store.enqueue_all(vec![bare.clone()]).await.unwrap();
    let c = store
        .claim("revive", "suite", 1, TTL)
        .await
        .unwrap()
        .remove(0);
    settle(
        &store,
        c.lease.id,
        Settlement::Dead {
            reason: "bad".into(),
        },
    )
    .await
    .unwrap();
    let mut again = bare;
    again.payload = "\"second\"".into();
    assert_eq!(
        store.enqueue_all(vec![again]).await.unwrap(),
        [Enqueued::Added(x)]
    );
    assert_eq!(store.retry_dead("revive", 10).await.unwrap(), 0);
    let counts = store.counts("revive").await.unwrap();
    assert_eq!((counts.ready, counts.dead), (1, 1), "{counts:?}");
    let c = store.claim("revive", "suite", 10, TTL).await.unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(
        c[0].job.payload, "\"second\"",
        "the live job kept its payload"
    );
}

/// Issue 55: a dead letter retried by an operator goes back with the priority it was
/// enqueued with (both stores reset it to 0 before), ahead of plain jobs enqueued earlier.
/// (One group for all three: it places them in one partition of a partitioned coordinator,
/// where priority orders a partition's jobs; a scope would, but its jobs wait in turn.)
pub async fn a_retried_dead_letter_keeps_its_priority(store: Stores) {
    let q = "prio-revive";
    // One kind for all three (a claim merges kinds' ready sets by their own rules).
    let job = || job("k").with_queue(q).with_group("prio-revive");
    let urgent = store.enqueue(vec![job().with_priority(7)]).await.unwrap()[0];
    let c = store.claim(q, "suite", 1, TTL).await.unwrap().remove(0);
    settle(
        &store,
        c.lease.id,
        Settlement::Dead {
            reason: "bad".into(),
        },
    )
    .await
    .unwrap();
    store.enqueue(vec![job(), job()]).await.unwrap();
    assert_eq!(store.retry_dead(q, 10).await.unwrap(), 1);
    let first = store.claim(q, "suite", 1, TTL).await.unwrap();
    assert_eq!(first[0].job.id, urgent, "the revived job lost its priority");
    assert_eq!((first[0].job.attempt, first[0].job.stalls), (1, 0));
}

/// Issue 24: a worker's settlements and its next claim in one call (one round trip on Redis).
/// The claim comes after the settlements — it gets the job whose scope one of them freed —
/// and each part has its own outcome: a refused settlement or a refused claim leaves the
/// other part applied.
pub async fn settle_and_claim_settles_first(store: Stores) {
    store
        .enqueue(vec![job("a").with_scope("s"), job("b").with_scope("s")])
        .await
        .unwrap();
    let a = claim(&store, 10).await;
    assert_eq!(a.len(), 1, "scope s is busy until a settles");
    let a = &a[0];
    store.enqueue(vec![job("c").with_scope("t")]).await.unwrap();
    // In steady state: a Redis that has not run the settle script yet answers the pipelined
    // pair's settle part with NOSCRIPT, and it is settled again after the claim.
    let never_granted = LeaseId::new();
    let warm = store
        .settle(vec![(never_granted, Settlement::Release)])
        .await;
    assert!(matches!(warm.unwrap()[0], Err(Error::LeaseNotCurrent(_))));
    let request = |worker: &str, n| ClaimRequest {
        queue: "default".into(),
        kinds: Vec::new(),
        worker: worker.into(),
        n,
        ttl: TTL,
    };
    let (settled, claimed) = store
        .settle_and_claim(
            vec![
                (a.lease.id, Settlement::completed()),
                (never_granted, Settlement::completed()),
            ],
            &request("suite", 10),
        )
        .await;
    let settled = settled.unwrap();
    assert!(settled[0].is_ok(), "{settled:?}");
    assert!(
        matches!(settled[1], Err(Error::LeaseNotCurrent(_))),
        "{settled:?}"
    );
    let mut claimed = claimed.unwrap();
    claimed.sort_by(|x, y| x.job.kind.cmp(&y.job.kind));
    let kinds: Vec<&str> = claimed.iter().map(|c| c.job.kind.as_str()).collect();
    assert_eq!(kinds, ["b", "c"], "the claim did not see the scope a freed");
    assert!(claimed[0].lease.token > a.lease.token);

    // A claim refused whole (a worker name no lease can hold) does not undo the settlement
    // that went with it; a claim of none claims nothing.
    let (settled, refused) = store
        .settle_and_claim(
            vec![(claimed[0].lease.id, Settlement::completed())],
            &request("bad\tname", 10),
        )
        .await;
    assert!(settled.unwrap()[0].is_ok());
    assert!(matches!(refused, Err(Error::Config(_))), "{refused:?}");
    let (settled, none) = store
        .settle_and_claim(
            vec![(claimed[1].lease.id, Settlement::completed())],
            &request("suite", 0),
        )
        .await;
    assert!(settled.unwrap()[0].is_ok());
    assert!(none.unwrap().is_empty());
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.ready, counts.leased, counts.completed), (0, 0, 3));
}

/// Issue 25: a handler's result is kept by the settlement that completes its job, in the same
/// step — never by a later call a crash could lose. A completion that is refused (its lease is
/// no longer current) leaves no result, and does not replace the accepted one.
pub async fn a_result_is_kept_with_its_completion(store: Stores) {
    let ids = store
        .enqueue(vec![
            job("with"),
            job("without"),
            job("stale").with_scope("r"),
        ])
        .await
        .unwrap();
    let claims = claim(&store, 10).await;
    assert_eq!(claims.len(), 3);
    let of = |kind: &str| claims.iter().find(|c| c.job.kind == kind).unwrap();
    let done = |json: Option<&str>| Settlement::Complete {
        result: json.map(str::to_owned),
        then: palisade::Then::default(),
    };
    let results = store
        .settle(vec![
            (of("with").lease.id, done(Some(r#"{"sum":42}"#))),
            (of("without").lease.id, done(None)),
            (of("with").lease.id, done(Some(r#"{"sum":-1}"#))),
        ])
        .await
        .unwrap();
    assert!(results[0].is_ok() && results[1].is_ok(), "{results:?}");
    assert!(matches!(results[2], Err(Error::LeaseNotCurrent(_))));
    assert_eq!(
        store.result(ids[0]).await.unwrap().as_deref(),
        Some(r#"{"sum":42}"#),
        "the accepted completion's result, not the refused one's"
    );
    assert_eq!(store.result(ids[1]).await.unwrap(), None);
    // A run whose lease another run replaced: its completion and its result are refused.
    let stale = of("stale");
    let released = store
        .settle(vec![(stale.lease.id, Settlement::Release)])
        .await
        .unwrap();
    assert!(released[0].is_ok());
    let again = claim(&store, 1).await.remove(0);
    let late = settle(&store, stale.lease.id, done(Some("\"late\""))).await;
    assert!(matches!(late, Err(Error::LeaseNotCurrent(_))), "{late:?}");
    assert_eq!(
        store.result(ids[2]).await.unwrap(),
        None,
        "a stale run left a result"
    );
    settle(&store, again.lease.id, done(Some("\"fresh\"")))
        .await
        .unwrap();
    assert_eq!(
        store.result(ids[2]).await.unwrap().as_deref(),
        Some("\"fresh\"")
    );
}

/// Issue 25, scope 4: a completion's follow-up jobs are kept by the settlement that accepts
/// it — none for a refused one — until the coordinator has enqueued and forgotten them. The
/// store does not enqueue them itself.
pub async fn follow_ups_are_kept_with_an_accepted_completion(store: Stores) {
    store
        .enqueue(vec![job("parent").with_scope("fu"), job("other")])
        .await
        .unwrap();
    let claims = claim(&store, 10).await;
    let of = |kind: &str| claims.iter().find(|c| c.job.kind == kind).unwrap();
    let child = |kind: &str| job(kind).with_id(JobId::new());
    let with = |jobs: Vec<NewJob>| Settlement::Complete {
        result: None,
        then: palisade::Then {
            jobs,
            ..Default::default()
        },
    };
    let parent = of("parent");
    let results = store
        .settle(vec![
            (parent.lease.id, with(vec![child("a"), child("b")])),
            (parent.lease.id, with(vec![child("twice")])),
            (LeaseId::new(), with(vec![child("never")])),
            (of("other").lease.id, Settlement::completed()),
        ])
        .await
        .unwrap();
    assert!(results[0].is_ok() && results[3].is_ok(), "{results:?}");
    assert!(matches!(results[1], Err(Error::LeaseNotCurrent(_))));
    assert!(matches!(results[2], Err(Error::LeaseNotCurrent(_))));
    let kept = store.follow_ups(Duration::ZERO, 10).await.unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].parent, parent.job.id);
    let kinds: Vec<&str> = kept[0].jobs.iter().map(|j| j.kind.as_str()).collect();
    assert_eq!(kinds, ["a", "b"]);
    assert!(
        store
            .follow_ups(Duration::from_secs(3600), 10)
            .await
            .unwrap()
            .is_empty(),
        "listed before its grace"
    );
    assert_eq!(store.counts("default").await.unwrap().ready, 0);
    store.forget_follow_ups(parent.job.id).await.unwrap();
    store.forget_follow_ups(JobId::new()).await.unwrap();
    assert!(store
        .follow_ups(Duration::ZERO, 10)
        .await
        .unwrap()
        .is_empty());
}

/// The trace a job was enqueued under comes back with every claim — after a retry, a stall,
/// a release, a death and a dead-letter retry — in the reaper's stall record, and in the
/// dead-letter record; a job enqueued without one has none.
pub async fn a_job_keeps_its_trace_through_every_path(store: Stores) {
    let trace = palisade::TraceContext::from_w3c(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        Some("vendor=opaque,other=x"),
    )
    .unwrap();
    store
        .enqueue(vec![
            job("traced").with_trace(trace.clone()).with_max_stalls(0),
            job("plain"),
        ])
        .await
        .unwrap();
    let claims = claim(&store, 2).await;
    let traced = claims.iter().find(|c| c.job.kind == "traced").unwrap();
    let plain = claims.iter().find(|c| c.job.kind == "plain").unwrap();
    assert_eq!(traced.job.trace.as_ref(), Some(&trace));
    assert_eq!(plain.job.trace, None);
    settle(&store, plain.lease.id, Settlement::completed())
        .await
        .unwrap();
    // A retry and a release keep it.
    let retry = Settlement::Retry {
        delay: Duration::ZERO,
        reason: "again".into(),
    };
    settle(&store, traced.lease.id, retry).await.unwrap();
    let again = claim(&store, 1).await.remove(0);
    assert_eq!(
        (again.job.attempt, again.job.trace.as_ref()),
        (2, Some(&trace))
    );
    settle(&store, again.lease.id, Settlement::Release)
        .await
        .unwrap();
    // A stall (past max_stalls = 0: it dies) names the trace in the reaper's record.
    let third = claim(&store, 1).await.remove(0);
    assert_eq!(third.job.trace.as_ref(), Some(&trace));
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
    let reaped = store.reap(100).await.unwrap();
    assert_eq!(reaped.len(), 1);
    let stall = &reaped[0];
    assert!(stall.dead);
    assert_eq!((stall.job, stall.lease), (third.job.id, third.lease.id));
    assert_eq!(stall.token, Some(third.lease.token));
    assert_eq!(stall.worker, "suite");
    assert_eq!(stall.trace.as_ref(), Some(&trace));
    // The dead letter keeps it, and so does the job a dead-letter retry makes again.
    let dead = store.dead("default", 10).await.unwrap();
    assert_eq!(dead[0].job.trace.as_ref(), Some(&trace));
    assert!(store.retry_dead_job("default", third.job.id).await.unwrap());
    let revived = claim(&store, 1).await.remove(0);
    assert_eq!(revived.job.id, third.job.id);
    assert_eq!(revived.job.trace.as_ref(), Some(&trace));
}
