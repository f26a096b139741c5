//! One conformance suite for every backend (openraft `Suite` style): each backend's test file
//! calls [`lease_store_suite!`] and [`fenced_store_suite!`] with an expression that builds a
//! fresh, isolated store, so no backend can quietly differ from another.
//!
//! Time here is real and short (hundreds of milliseconds), because a remote backend keeps its
//! own clock.

#![allow(dead_code, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use palisade::*;

pub const TTL: Duration = Duration::from_millis(400);

pub fn job(kind: &str) -> NewJob {
    NewJob::raw(kind, "null")
}

async fn claim(store: &dyn LeaseStore, n: usize) -> Vec<Claim> {
    store.claim("default", "suite", n, TTL).await.unwrap()
}

async fn settle(store: &dyn LeaseStore, lease: LeaseId, s: Settlement) -> Result<()> {
    store.settle(vec![(lease, s)]).await.unwrap().pop().unwrap()
}

pub async fn claim_honours_batch_priority_and_delay(store: Arc<dyn LeaseStore>) {
    store
        .enqueue(vec![
            job("low"),
            job("high").with_priority(5),
            job("later").with_delay(Duration::from_millis(300)),
            job("low2"),
        ])
        .await
        .unwrap();
    let first = claim(&*store, 2).await;
    let kinds: Vec<&str> = first.iter().map(|c| c.job.kind.as_str()).collect();
    assert_eq!(kinds, ["high", "low"]);
    assert!(first.iter().all(|c| c.job.attempt == 1));
    assert_eq!(
        claim(&*store, 5).await.len(),
        1,
        "delayed job claimable too early"
    );
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.ready, counts.delayed, counts.leased), (0, 1, 3));
    tokio::time::sleep(Duration::from_millis(350)).await;
    let later = claim(&*store, 5).await;
    assert_eq!(later.len(), 1);
    assert_eq!(later[0].job.kind, "later");
    assert!(store
        .claim("other-queue", "suite", 5, TTL)
        .await
        .unwrap()
        .is_empty());
}

pub async fn one_live_lease_per_scope(store: Arc<dyn LeaseStore>) {
    store
        .enqueue(vec![
            job("a").with_scope("s"),
            job("b").with_scope("s"),
            job("c").with_scope("t"),
        ])
        .await
        .unwrap();
    let first = claim(&*store, 10).await;
    let mut scopes: Vec<&str> = first.iter().map(|c| c.lease.scope.as_str()).collect();
    scopes.sort_unstable();
    assert_eq!(scopes, ["s", "t"], "a busy scope was granted twice");
    assert!(claim(&*store, 10).await.is_empty());
    let a = first.iter().find(|c| c.job.kind == "a").unwrap();
    settle(&*store, a.lease.id, Settlement::Complete)
        .await
        .unwrap();
    let second = claim(&*store, 10).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].job.kind, "b");
    assert!(second[0].lease.token > a.lease.token);
}

pub async fn tokens_grow_per_scope(store: Arc<dyn LeaseStore>) {
    let mut last = None;
    for _ in 0..5 {
        store
            .enqueue(vec![job("x").with_scope("grow")])
            .await
            .unwrap();
        let c = claim(&*store, 1).await.remove(0);
        assert!(Some(c.lease.token) > last, "token did not grow");
        last = Some(c.lease.token);
        assert_eq!(
            store.highest_token(&Scope::new("grow")).await.unwrap(),
            last
        );
        settle(&*store, c.lease.id, Settlement::Complete)
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
    let fresh = claim(&*store, 1).await.remove(0);
    assert_eq!(
        store.highest_token(&Scope::new("fresh")).await.unwrap(),
        Some(fresh.lease.token)
    );
    assert_eq!(
        store.highest_token(&Scope::new("never")).await.unwrap(),
        None
    );
}

pub async fn renew_extends_and_reports_lost(store: Arc<dyn LeaseStore>) {
    store.enqueue(vec![job("r")]).await.unwrap();
    let c = claim(&*store, 1).await.remove(0);
    let stranger = LeaseId::new();
    // Renew well past the first ttl: still held.
    for _ in 0..3 {
        tokio::time::sleep(TTL / 2).await;
        let lost = store.renew(&[c.lease.id, stranger], TTL).await.unwrap();
        assert_eq!(lost, [stranger]);
    }
    settle(&*store, c.lease.id, Settlement::Complete)
        .await
        .unwrap();
    assert_eq!(store.renew(&[c.lease.id], TTL).await.unwrap(), [c.lease.id]);
    // A lease that expired is lost even before the reaper has seen it: a renewal must not
    // revive it (a mutation test found this unchecked).
    store.enqueue(vec![job("x")]).await.unwrap();
    let short = claim_ttl(&*store, Duration::from_millis(20)).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(store.renew(&[short], TTL).await.unwrap(), [short]);
    assert_eq!(
        store.reap(10).await.unwrap().len(),
        1,
        "reaped, not revived"
    );
    assert_eq!(claim(&*store, 1).await.len(), 1, "the job runs again");
}

async fn claim_ttl(store: &dyn LeaseStore, ttl: Duration) -> LeaseId {
    store.claim("default", "w", 1, ttl).await.unwrap()[0]
        .lease
        .id
}

pub async fn stale_lease_is_powerless(store: Arc<dyn LeaseStore>) {
    store.enqueue(vec![job("p").with_scope("p")]).await.unwrap();
    let old = claim(&*store, 1).await.remove(0);
    // Let it expire and be reaped; a new holder takes over.
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
    assert_eq!(store.reap(100).await.unwrap().len(), 1);
    let new = claim(&*store, 1).await.remove(0);
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
        Settlement::Complete,
        Settlement::Retry {
            delay: Duration::ZERO,
            reason: "x".into(),
        },
        Settlement::Dead { reason: "x".into() },
    ] {
        let r = settle(&*store, old.lease.id, s).await;
        assert!(
            matches!(r, Err(Error::LeaseNotCurrent(l)) if l == old.lease.id),
            "{r:?}"
        );
    }
    assert!(settle(&*store, LeaseId::new(), Settlement::Complete)
        .await
        .is_err());
    assert_eq!(
        store.renew(&[new.lease.id], TTL).await.unwrap(),
        Vec::<LeaseId>::new()
    );
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.leased, counts.completed, counts.dead), (1, 0, 0));
    settle(&*store, new.lease.id, Settlement::Complete)
        .await
        .unwrap();
    assert!(
        settle(&*store, new.lease.id, Settlement::Complete)
            .await
            .is_err(),
        "completed twice"
    );
    assert_eq!(store.counts("default").await.unwrap().completed, 1);
}

pub async fn stalls_requeue_then_bury(store: Arc<dyn LeaseStore>) {
    store
        .enqueue(vec![job("stall").with_max_stalls(1)])
        .await
        .unwrap();
    for round in 1..=2 {
        let c = claim(&*store, 1).await;
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
    assert!(claim(&*store, 1).await.is_empty());
}

pub async fn retry_and_dead_settlements(store: Arc<dyn LeaseStore>) {
    store.enqueue(vec![job("retry"), job("die")]).await.unwrap();
    let claims = claim(&*store, 2).await;
    let lease = |k: &str| claims.iter().find(|c| c.job.kind == k).unwrap().lease.id;
    let retry = Settlement::Retry {
        delay: Duration::from_millis(200),
        reason: "later".into(),
    };
    settle(&*store, lease("retry"), retry).await.unwrap();
    settle(
        &*store,
        lease("die"),
        Settlement::Dead {
            reason: "bad input".into(),
        },
    )
    .await
    .unwrap();
    assert!(
        claim(&*store, 1).await.is_empty(),
        "retry ignored its delay"
    );
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.delayed, counts.dead, counts.leased), (1, 1, 0));
    tokio::time::sleep(Duration::from_millis(250)).await;
    let again = claim(&*store, 1).await;
    assert_eq!(again[0].job.attempt, 2);
    let dead = store.dead("default", 10).await.unwrap();
    assert_eq!(dead[0].reason, "bad input");
    assert_eq!(dead[0].job.kind, "die");
}

pub async fn fenced_settlement_reseeds_above_the_sink(store: Arc<dyn LeaseStore>) {
    store
        .enqueue(vec![job("f").with_scope("f"), job("g").with_scope("g")])
        .await
        .unwrap();
    let claims = claim(&*store, 2).await;
    let (f, g) = (&claims[0].lease, &claims[1].lease);
    // A sink reports a token far above what this coordinator granted: its counters regressed.
    let highest = FencingToken::new(f.token.epoch() + 3, 5);
    let reason = "token conflict".to_string();
    settle(
        &*store,
        f.id,
        Settlement::Fenced {
            highest,
            reason: reason.clone(),
        },
    )
    .await
    .unwrap();
    let again = claim(&*store, 1).await.remove(0);
    assert_eq!(again.job.kind, "f", "a fenced job runs again at once");
    assert!(
        again.lease.token > highest,
        "{:?} is not above {highest:?}",
        again.lease.token
    );
    // A stale lease's fenced settlement is refused and moves nothing.
    settle(&*store, g.id, Settlement::Complete).await.unwrap();
    let far = FencingToken::new(again.lease.token.epoch() + 50, 1);
    let r = settle(
        &*store,
        g.id,
        Settlement::Fenced {
            highest: far,
            reason,
        },
    )
    .await;
    assert!(matches!(r, Err(Error::LeaseNotCurrent(_))));
    settle(&*store, again.lease.id, Settlement::Complete)
        .await
        .unwrap();
    store.enqueue(vec![job("h").with_scope("f")]).await.unwrap();
    assert!(claim(&*store, 1).await[0].lease.token < far);
}

pub async fn status_views_and_dead_letter_retry(store: Arc<dyn LeaseStore>) {
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
        &*store,
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
    let again = claim(&*store, 1).await.remove(0);
    assert_eq!((again.job.id, again.job.attempt), (c.job.id, 1));
    assert!(again.lease.token > c.lease.token);
}

pub async fn enqueue_rejects_bad_jobs_whole(store: Arc<dyn LeaseStore>) {
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
pub async fn names_are_checked_and_default_scopes_are_private(store: Arc<dyn LeaseStore>) {
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
    let claims = claim(&*store, 10).await;
    assert_eq!(claims.len(), 2);
    let mine = claims.iter().find(|c| c.job.id == a).unwrap();
    assert_eq!(mine.lease.scope, Scope::of_job(a));
    assert_eq!(mine.job.scope, Scope::of_job(a));
    assert_eq!(mine.lease.scope.job(), Some(a));
}

/// Issue 7, case 9: jobs of a held scope wait aside, so `claim(n)` returns
/// min(n, ready jobs whose scope is free) however many blocked jobs sit ahead of them.
pub async fn a_held_scope_blocks_only_itself(store: Arc<dyn LeaseStore>) {
    store
        .enqueue(vec![job("hot").with_scope("hot")])
        .await
        .unwrap();
    let holder = claim(&*store, 1).await.remove(0);
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
    let got = claim(&*store, 10).await;
    assert_eq!(
        got.len(),
        5,
        "free scopes did not all flow past the held one"
    );
    assert!(got.iter().all(|c| c.job.kind == "free"));
    assert!(claim(&*store, 10).await.is_empty());
    // Blocked ahead of free ones that were enqueued *before* the scope was held, too.
    store
        .enqueue((0..100).map(|_| job("cold").with_scope("cold")).collect())
        .await
        .unwrap();
    store
        .enqueue(vec![job("late").with_scope("late")])
        .await
        .unwrap();
    let got = claim(&*store, 10).await;
    let kinds: Vec<&str> = got.iter().map(|c| c.job.kind.as_str()).collect();
    assert_eq!(kinds, ["cold", "late"]);
    // The holder finishes: the next job of its scope (and only one) becomes claimable.
    settle(&*store, holder.lease.id, Settlement::Complete)
        .await
        .unwrap();
    let next = claim(&*store, 10).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].job.kind, "hot");
    assert!(next[0].lease.token > holder.lease.token);
    // A retry with a delay gives the scope's turn to the next job meanwhile.
    settle(
        &*store,
        next[0].lease.id,
        Settlement::Retry {
            delay: Duration::from_secs(3600),
            reason: "later".into(),
        },
    )
    .await
    .unwrap();
    let after = claim(&*store, 10).await;
    assert_eq!(after.len(), 1);
    assert_ne!(after[0].job.id, next[0].job.id);
    let counts = store.counts("default").await.unwrap();
    assert_eq!(counts.waiting, 2998 + 99);
    assert_eq!(counts.delayed, 1);
}

/// Issue 7, case 8: a released job is ready again at once with its attempt not counted and
/// no stall charged; the released lease is powerless.
pub async fn release_gives_the_job_back_uncharged(store: Arc<dyn LeaseStore>) {
    store
        .enqueue(vec![job("r").with_scope("rel"), job("w").with_scope("rel")])
        .await
        .unwrap();
    let first = claim(&*store, 5).await;
    assert_eq!(first.len(), 1);
    let c = &first[0];
    assert_eq!((c.job.kind.as_str(), c.job.attempt), ("r", 1));
    settle(&*store, c.lease.id, Settlement::Release)
        .await
        .unwrap();
    let again = claim(&*store, 5).await;
    assert_eq!(again.len(), 1, "released job lost its scope's turn");
    assert_eq!(
        (again[0].job.id, again[0].job.attempt, again[0].job.stalls),
        (c.job.id, 1, 0)
    );
    assert!(again[0].lease.token > c.lease.token);
    assert!(matches!(
        settle(&*store, c.lease.id, Settlement::Complete).await,
        Err(Error::LeaseNotCurrent(_))
    ));
    assert_eq!(
        store.renew(&[c.lease.id], TTL).await.unwrap(),
        vec![c.lease.id]
    );
}

/// Issue 7, cases 6-7: a reseed above the last epoch is a typed error that changes nothing;
/// dead letters can be purged.
pub async fn epoch_limit_and_dead_purge(store: Arc<dyn LeaseStore>) {
    store.enqueue(vec![job("e")]).await.unwrap();
    let c = claim(&*store, 1).await.remove(0);
    let top = FencingToken::new(FencingToken::MAX_EPOCH, 5);
    let r = settle(
        &*store,
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
        &*store,
        c.lease.id,
        Settlement::Dead {
            reason: "d0".into(),
        },
    )
    .await
    .unwrap();
    store.enqueue(vec![job("d1"), job("d2")]).await.unwrap();
    for c in claim(&*store, 2).await {
        settle(
            &*store,
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
pub async fn one_settlement_per_lease_per_batch(store: Arc<dyn LeaseStore>) {
    store
        .enqueue(vec![job("x").with_scope("dup")])
        .await
        .unwrap();
    let c = claim(&*store, 1).await.remove(0);
    let results = store
        .settle(vec![
            (c.lease.id, Settlement::Complete),
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
    let y = claim(&*store, 1).await.remove(0);
    assert_eq!(y.job.kind, "y", "the scope's turn went to a deleted job");
    let fenced = Settlement::Fenced {
        highest: y.lease.token,
        reason: "regressed".into(),
    };
    settle(&*store, y.lease.id, fenced).await.unwrap();
    let again = claim(&*store, 1).await.remove(0);
    assert_eq!((again.job.id, again.job.attempt), (y.job.id, 1));
}

/// Issue 8, case 6: a worker claims only kinds it has handlers for, however many jobs of
/// other kinds sit ahead; those wait (visible as ready) for a worker that has them.
pub async fn claims_only_the_kinds_asked_for(store: Arc<dyn LeaseStore>) {
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
pub async fn the_watermark_stays_below_every_live_lease(store: Arc<dyn LeaseStore>) {
    assert_eq!(store.watermark(), None, "nothing published before a settle");
    store
        .enqueue(vec![job("a"), job("b"), job("c")])
        .await
        .unwrap();
    let claims = claim(&*store, 3).await;
    let t: Vec<FencingToken> = claims.iter().map(|c| c.lease.token).collect();
    assert!(t[0] < t[1] && t[1] < t[2]);
    settle(&*store, claims[1].lease.id, Settlement::Complete)
        .await
        .unwrap();
    assert_eq!(
        store.watermark(),
        Some(t[0]),
        "the oldest live lease holds it back"
    );
    settle(&*store, claims[0].lease.id, Settlement::Complete)
        .await
        .unwrap();
    assert_eq!(store.watermark(), Some(t[2]));
    settle(&*store, claims[2].lease.id, Settlement::Release)
        .await
        .unwrap();
    let idle = store.watermark().unwrap();
    assert!(idle > t[2], "no live lease: the next token");
    // A refused settlement publishes too, and the watermark never goes back.
    assert!(settle(&*store, claims[0].lease.id, Settlement::Complete)
        .await
        .is_err());
    assert_eq!(store.watermark(), Some(idle));
    let again = claim(&*store, 1).await.remove(0);
    assert!(
        again.lease.token >= idle,
        "every new lease is at or above it"
    );
    settle(&*store, again.lease.id, Settlement::Complete)
        .await
        .unwrap();
    assert!(store.watermark().unwrap() > again.lease.token);
}

/// The sampler's and the operator page's views: how long the next job has waited, one holder
/// per role, and the journal of fence rejections (newest first, bounded).
pub async fn operator_views_oldest_ready_role_and_journal(store: Arc<dyn LeaseStore>) {
    assert_eq!(store.oldest_ready("default").await.unwrap(), None);
    store.enqueue(vec![job("a")]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let age = store.oldest_ready("default").await.unwrap().unwrap();
    assert!(
        age >= Duration::from_millis(100) && age < Duration::from_secs(5),
        "{age:?}"
    );
    // Released, it is next in line again and still counts from when it first became ready.
    let lease = claim(&*store, 1).await.pop().unwrap().lease.id;
    assert_eq!(store.oldest_ready("default").await.unwrap(), None);
    settle(&*store, lease, Settlement::Release).await.unwrap();
    let again = store.oldest_ready("default").await.unwrap().unwrap();
    assert!(again >= age, "{again:?} < {age:?}");
    // A delayed job counts from when it falls due.
    store
        .enqueue(vec![job("b")
            .with_queue("later")
            .with_delay(Duration::from_millis(100))])
        .await
        .unwrap();
    assert_eq!(store.oldest_ready("later").await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let due = store.oldest_ready("later").await.unwrap().unwrap();
    assert!(
        due >= Duration::from_millis(100) && due < Duration::from_millis(1000),
        "{due:?}"
    );

    for bad in [Duration::ZERO, Duration::MAX, store::MAX_ROLE_TTL * 2] {
        assert!(
            matches!(
                store.hold_role("sampler", "a", bad).await,
                Err(Error::Config(_))
            ),
            "{bad:?}"
        );
    }
    let ttl = Duration::from_millis(200);
    assert!(store.hold_role("sampler", "a", ttl).await.unwrap());
    assert!(!store.hold_role("sampler", "b", ttl).await.unwrap());
    assert!(store.hold_role("sampler", "a", ttl).await.unwrap());
    assert!(store.hold_role("other", "b", ttl).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(store.hold_role("sampler", "b", ttl).await.unwrap());
    assert!(!store.hold_role("sampler", "a", ttl).await.unwrap());

    let note = |i: u64| store::RejectionNote {
        at_ms: i,
        sink: "ledger".into(),
        scope: format!("s{i}"),
        token: i,
        reason: "stale_token".into(),
        detail: format!("stale token {i}"),
    };
    assert!(store.rejections(10).await.unwrap().is_empty());
    store.note_rejections(vec![note(1), note(2)]).await.unwrap();
    store.note_rejections(vec![note(3)]).await.unwrap();
    assert_eq!(store.rejections(2).await.unwrap(), vec![note(3), note(2)]);
    let many: Vec<_> = (10..10 + store::REJECTION_JOURNAL as u64 + 5)
        .map(note)
        .collect();
    store.note_rejections(many).await.unwrap();
    let kept = store.rejections(usize::MAX).await.unwrap();
    assert_eq!(kept.len(), store::REJECTION_JOURNAL);
    assert_eq!(kept[0].token, 10 + store::REJECTION_JOURNAL as u64 + 4);
}

/// `NewJob::with_unique_key`: a second enqueue while the first job is pending, or within its
/// ttl after it is done, adds nothing and returns the first job's id; a batch is still all or
/// nothing; the key goes after completion or death plus the ttl.
pub async fn unique_keys_make_enqueue_idempotent(store: Arc<dyn LeaseStore>) {
    let ttl = Duration::from_millis(300);
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
    settle(&*store, lease.lease.id, Settlement::Complete)
        .await
        .unwrap();
    assert_eq!(
        store.enqueue(vec![keyed("q1", "k", ttl)]).await.unwrap(),
        vec![a]
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
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
        ("q4", Settlement::Complete),
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
        settle(&*store, lease.lease.id, end).await.unwrap();
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

/// `set_paused`: claims from a paused queue hand out nothing, while its running job renews and
/// completes, enqueue still adds, other queues run on; resumed, every job is there.
pub async fn a_paused_queue_hands_out_nothing_and_loses_nothing(store: Arc<dyn LeaseStore>) {
    store
        .enqueue(vec![
            job("a"),
            job("a"),
            job("a"),
            job("b").with_queue("other"),
        ])
        .await
        .unwrap();
    let running = claim(&*store, 1).await.pop().unwrap();
    store.set_paused("default", true).await.unwrap();
    store.set_paused("default", true).await.unwrap(); // twice is once
    assert_eq!(store.paused().await.unwrap(), vec!["default".to_owned()]);
    assert!(claim(&*store, 5).await.is_empty());
    store
        .enqueue(vec![job("a").with_delay(Duration::from_millis(1))])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(claim(&*store, 5).await.is_empty());
    assert_eq!(
        store.renew(&[running.lease.id], TTL).await.unwrap(),
        Vec::<LeaseId>::new()
    );
    settle(&*store, running.lease.id, Settlement::Complete)
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
    assert_eq!(claim(&*store, 5).await.len(), 3);
}

/// Schedules kept in the coordinator, and each schedule's mark, which never goes back.
pub async fn kept_schedules_and_their_marks(store: Arc<dyn LeaseStore>) {
    let now = store.now_ms().await.unwrap();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((now - wall).abs() < 5_000, "{now} vs {wall}");

    let spec = |name: &str, pattern: &str| ScheduleSpec {
        name: name.to_owned(),
        ..Schedule::new("x", "* * * * *", job("report"))
            .unwrap()
            .spec()
            .clone()
            .with_pattern(pattern)
    };
    assert!(store.schedules().await.unwrap().is_empty());
    store.put_schedule(spec("b", "0 7 * * 1-5")).await.unwrap();
    store
        .put_schedule(spec("a", "*/5 * * * * *"))
        .await
        .unwrap();
    store
        .put_schedule(spec("a", "*/10 * * * * *"))
        .await
        .unwrap(); // replaces
    let kept = store.schedules().await.unwrap();
    let names: Vec<(&str, &str)> = kept
        .iter()
        .map(|s| (s.name.as_str(), s.pattern.as_str()))
        .collect();
    assert_eq!(names, vec![("a", "*/10 * * * * *"), ("b", "0 7 * * 1-5")]);
    for bad in [spec("c", "not cron"), spec("", "* * * * *")] {
        assert!(matches!(
            store.put_schedule(bad).await,
            Err(Error::InvalidJob(_))
        ));
    }
    store.advance_schedule("a", 7).await.unwrap();
    assert!(store.remove_schedule("a").await.unwrap());
    assert!(!store.remove_schedule("a").await.unwrap());
    assert_eq!(
        store.schedule_mark("a").await.unwrap(),
        None,
        "added again, it starts afresh"
    );
    assert_eq!(store.schedules().await.unwrap().len(), 1);

    assert_eq!(store.schedule_mark("b").await.unwrap(), None);
    store.advance_schedule("b", 1_000).await.unwrap();
    store.advance_schedule("b", 500).await.unwrap(); // a woken scheduler cannot send it back
    assert_eq!(store.schedule_mark("b").await.unwrap(), Some(1_000));
    store.advance_schedule("b", 2_000).await.unwrap();
    assert_eq!(store.schedule_mark("b").await.unwrap(), Some(2_000));
}

/// Results and progress records: kept, replaced, and gone after their time.
pub async fn results_and_progress_are_kept_for_their_time(store: Arc<dyn LeaseStore>) {
    let (a, b) = (JobId::new(), JobId::new());
    assert_eq!(store.result(a).await.unwrap(), None);
    store
        .put_result(a, r#"{"ok":1}"#.into(), Duration::from_millis(200))
        .await
        .unwrap();
    store
        .put_result(b, r#"{"ok":2}"#.into(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        store.result(a).await.unwrap().as_deref(),
        Some(r#"{"ok":1}"#)
    );
    store.put_progress(a, "1".into()).await.unwrap();
    store.put_progress(a, "2".into()).await.unwrap();
    assert_eq!(store.progress(a).await.unwrap().as_deref(), Some("2"));
    assert_eq!(store.progress(b).await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.result(a).await.unwrap(), None, "kept past its time");
    assert_eq!(
        store.result(b).await.unwrap().as_deref(),
        Some(r#"{"ok":2}"#)
    );
}

/// `set_rate_limit`: at most the bucket's whole tokens per claim, refilled at the rate, shared
/// by every claimer; other queues and lifted limits are unaffected.
pub async fn a_rate_limited_queue_hands_out_no_more_than_its_rate(store: Arc<dyn LeaseStore>) {
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
        claim(&*store, 100).await.len(),
        5,
        "a full bucket: the burst"
    );
    assert_eq!(claim(&*store, 100).await.len(), 0, "empty until it refills");
    tokio::time::sleep(Duration::from_millis(450)).await;
    let refilled = claim(&*store, 100).await.len();
    // 5 per second for ~0.45 s: 2 whole tokens (3 if this machine slept long).
    assert!((2..=3).contains(&refilled), "{refilled}");
    // However it is asked (many small claims), the total follows the rate.
    let mut total = 5 + refilled;
    while started.elapsed() < Duration::from_millis(1_500) {
        total += claim(&*store, 1).await.len();
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
    let rest = claim(&*store, 100).await.len();
    assert_eq!(rest, 40 - total, "lifted: everything left");
}

/// `cancel`: a ready, a waiting and a delayed job go to the dead letters; a running job's
/// lease is revoked at once (renew says lost, its settlement is refused) and its scope's turn
/// passes on; cancelling again finds nothing.
pub async fn cancel_removes_a_queued_job_and_revokes_a_running_one(store: Arc<dyn LeaseStore>) {
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
        settle(&*store, lease, Settlement::Complete).await,
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
}

/// `set_concurrency_cap`: claims never start more of a kind than its cap allows while others
/// run; every way a lease ends (completion, cancel, expiry) frees its place; other kinds are
/// not held back.
pub async fn a_capped_kind_never_runs_more_than_its_cap(store: Arc<dyn LeaseStore>) {
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
    settle(&*store, capped[0].lease.id, Settlement::Complete)
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

/// A coordinator over `parts`: jobs of a scope land in one partition and its tokens only
/// grow; default-scoped jobs spread; one claim takes work from every partition (stealing
/// what one lacks from the others); a lease claimed through another view of the same
/// partitions is renewed and settled here; the watermark waits for every partition; limits
/// and caps are split into shares; a batch with one bad job adds nothing anywhere.
pub async fn partitions_keep_scopes_and_share_work(
    store: Arc<dyn LeaseStore>,
    parts: Vec<Arc<dyn LeaseStore>>,
) {
    let p = parts.len() as u64;
    let mut jobs: Vec<NewJob> = (0..30)
        .map(|i| job("k").with_scope(format!("acct:{}", i % 10)))
        .collect();
    jobs.extend((0..30).map(|_| job("k")));
    let mut bad = jobs.clone();
    bad.push(job(""));
    assert!(store.enqueue(bad).await.is_err());
    for part in &parts {
        assert_eq!(
            part.counts("default").await.unwrap().pending(),
            0,
            "a bad batch added jobs"
        );
    }
    store.enqueue(jobs).await.unwrap();
    for part in &parts {
        let c = part.counts("default").await.unwrap();
        assert!(c.pending() > 0, "a partition got nothing: {c:?}");
    }
    assert_eq!(store.counts("default").await.unwrap().pending(), 60);
    // Work concentrated in one partition is still taken in one claim.
    let first = claim(&*store, 100).await;
    assert_eq!(first.len(), 40, "10 scope heads and 30 default-scoped jobs");
    let scopes: std::collections::BTreeSet<&Scope> = first.iter().map(|c| &c.lease.scope).collect();
    assert_eq!(scopes.len(), 40, "a scope was granted twice");
    // Each scope's tokens only grow, job after job.
    let mut last: std::collections::HashMap<Scope, FencingToken> = first
        .iter()
        .map(|c| (c.lease.scope.clone(), c.lease.token))
        .collect();
    // A second view of the same partitions (another process) settles what this one claimed.
    let other: Arc<dyn LeaseStore> =
        Arc::new(palisade::store::partitioned::PartitionedLeaseStore::new(parts.clone()).unwrap());
    let ids: Vec<LeaseId> = first.iter().map(|c| c.lease.id).collect();
    assert!(
        other.renew(&ids, TTL).await.unwrap().is_empty(),
        "a lease was lost"
    );
    let done: Vec<(LeaseId, Settlement)> = ids.iter().map(|&l| (l, Settlement::Complete)).collect();
    assert!(other
        .settle(done.clone())
        .await
        .unwrap()
        .iter()
        .all(|r| r.is_ok()));
    assert!(store
        .settle(done)
        .await
        .unwrap()
        .iter()
        .all(|r| matches!(r, Err(Error::LeaseNotCurrent(_)))));
    for _ in 0..2 {
        let more = claim(&*store, 100).await;
        assert_eq!(more.len(), 10);
        for c in &more {
            let before = last.insert(c.lease.scope.clone(), c.lease.token).unwrap();
            assert!(
                c.lease.token > before,
                "{}: {:?} after {before:?}",
                c.lease.scope,
                c.lease.token
            );
            settle(&*store, c.lease.id, Settlement::Complete)
                .await
                .unwrap();
        }
    }
    assert_eq!(store.counts("default").await.unwrap().completed, 60);
    // Work that sits in one partition alone is still taken in one claim: what the others
    // lack is stolen from it.
    let crowded: Vec<NewJob> = (0..1000)
        .map(|i| format!("crowd:{i}"))
        .filter(|s| palisade::store::partitioned::partition_of(s, parts.len()) == 0)
        .take(9)
        .map(|s| job("k").with_scope(s))
        .collect();
    store.enqueue(crowded).await.unwrap();
    let stolen = claim(&*store, 9).await;
    assert_eq!(
        stolen.len(),
        9,
        "a claim did not steal from the partition that had the work"
    );
    for c in stolen {
        settle(&*store, c.lease.id, Settlement::Complete)
            .await
            .unwrap();
    }
    // The watermark is the lowest of the partitions' once every one has one.
    let marks: Vec<Option<FencingToken>> = parts.iter().map(|p| p.watermark()).collect();
    assert_eq!(
        store.watermark(),
        marks
            .iter()
            .copied()
            .collect::<Option<Vec<_>>>()
            .and_then(|m| m.into_iter().min())
    );
    // The watermark never passes a live lease, whichever partition granted it (a sink
    // refuses every token below it).
    store
        .enqueue((0..12).map(|_| job("k")).collect())
        .await
        .unwrap();
    let batch = claim(&*store, 12).await;
    assert_eq!(batch.len(), 12);
    let (done, live): (Vec<&Claim>, Vec<&Claim>) = batch
        .iter()
        .partition(|c| c.job.id.as_uuid().as_u128() % 2 == 0);
    for c in &done {
        settle(&*store, c.lease.id, Settlement::Complete)
            .await
            .unwrap();
    }
    let w = store
        .watermark()
        .expect("every partition has settled a lease");
    for c in &live {
        assert!(
            w <= c.lease.token,
            "watermark {w:?} passed live lease {:?}",
            c.lease.token
        );
        settle(&*store, c.lease.id, Settlement::Complete)
            .await
            .unwrap();
    }
    // Limits and caps are split into shares that add up.
    let limit = RateLimit {
        jobs: 10,
        per: Duration::from_secs(1),
    };
    store.set_rate_limit("default", Some(limit)).await.unwrap();
    assert_eq!(store.rate_limit("default").await.unwrap(), Some(limit));
    for part in &parts {
        let share = part.rate_limit("default").await.unwrap().unwrap();
        assert!(u64::from(share.jobs) <= 10 / p + 1, "{share:?}");
    }
    store
        .set_concurrency_cap("k", Some(2 * p as u32))
        .await
        .unwrap();
    assert_eq!(
        store.concurrency_cap("k").await.unwrap(),
        Some(2 * p as u32)
    );
    for part in &parts {
        assert_eq!(part.concurrency_cap("k").await.unwrap(), Some(2));
    }
    // Pause reaches every partition; cancel finds the job wherever it is.
    store.set_paused("default", true).await.unwrap();
    let id = store
        .enqueue(vec![job("k").with_scope("acct:3")])
        .await
        .unwrap()[0];
    assert!(
        claim(&*store, 10).await.is_empty(),
        "a paused queue handed out a job"
    );
    store.set_paused("default", false).await.unwrap();
    let running = claim(&*store, 10).await;
    assert_eq!(running.len(), 1);
    assert_eq!(store.cancel(id, "stop").await.unwrap(), Cancelled::Revoked);
    assert!(matches!(
        settle(&*store, running[0].lease.id, Settlement::Complete).await,
        Err(Error::LeaseNotCurrent(_))
    ));
}

/// Moving from the layout `old` to `new` (fresh) never lowers a scope's tokens: the scope's
/// partition in `new` grants above everything `old` granted. `control` is another fresh
/// layout like `new`, left unmigrated, to show the test would catch a lower token.
pub async fn migration_never_lowers_a_scopes_tokens(
    old: Arc<dyn LeaseStore>,
    new: Arc<dyn LeaseStore>,
    control: Arc<dyn LeaseStore>,
) {
    use palisade::store::partitioned::migrate;
    // A history in the old layout: the scope's tokens reached epoch 7.
    old.raise_epoch(7).await.unwrap();
    old.enqueue(vec![job("k").with_scope("acct:1")])
        .await
        .unwrap();
    let before = claim(&*old, 1).await.remove(0);
    assert_eq!(before.lease.token.epoch(), 7);
    let limit = RateLimit {
        jobs: 5,
        per: Duration::from_secs(1),
    };
    old.set_rate_limit("default", Some(limit)).await.unwrap();
    old.set_paused("other", true).await.unwrap();
    old.set_concurrency_cap("k", Some(4)).await.unwrap();
    let kept = Schedule::new("kept", "* * * * *", job("k"))
        .unwrap()
        .spec()
        .clone();
    old.put_schedule(ScheduleSpec {
        name: "kept".into(),
        ..kept.clone()
    })
    .await
    .unwrap();
    old.advance_schedule("kept", 60_000).await.unwrap();
    // State `new` holds from an earlier time it was in use (a layout moved away from and
    // back to): cleared, or it would come back after the move.
    new.put_schedule(ScheduleSpec {
        name: "removed since".into(),
        ..kept.clone()
    })
    .await
    .unwrap();
    new.set_paused("resumed since", true).await.unwrap();
    new.enqueue(vec![job("k").with_queue("unlimited since")])
        .await
        .unwrap();
    let stale = new
        .claim("unlimited since", "suite", 1, TTL)
        .await
        .unwrap()
        .remove(0);
    settle(&*new, stale.lease.id, Settlement::Complete)
        .await
        .unwrap();
    new.set_rate_limit("unlimited since", Some(limit))
        .await
        .unwrap();
    new.set_concurrency_cap("uncapped since", Some(2))
        .await
        .unwrap();
    // Refused while the old layout still has work.
    assert!(matches!(migrate(&*old, &*new).await, Err(Error::Config(_))));
    settle(&*old, before.lease.id, Settlement::Complete)
        .await
        .unwrap();
    // And while it holds dead letters (they would be left behind, unseen).
    old.enqueue(vec![job("k")]).await.unwrap();
    let doomed = claim(&*old, 1).await.remove(0);
    let dead = Settlement::Dead {
        reason: "no".into(),
    };
    settle(&*old, doomed.lease.id, dead).await.unwrap();
    let refused = migrate(&*old, &*new).await;
    assert!(
        matches!(&refused, Err(Error::Config(why)) if why.contains("1 dead")),
        "{refused:?}"
    );
    assert_eq!(old.purge_dead("default", 10).await.unwrap(), 1);
    let epoch = migrate(&*old, &*new).await.unwrap();
    assert!(epoch > 7, "{epoch}");
    // The old layout is only read by the migration; retired once the new one is in use.
    assert_eq!(old.schedules().await.unwrap().len(), 1);
    palisade::store::partitioned::retire(&*old).await;
    for layout in [&new, &control] {
        layout
            .enqueue(vec![job("k").with_scope("acct:1")])
            .await
            .unwrap();
    }
    let after = claim(&*new, 1).await.remove(0);
    assert!(
        after.lease.token > before.lease.token,
        "{:?} after {:?}",
        after.lease.token,
        before.lease.token
    );
    let unmigrated = claim(&*control, 1).await.remove(0);
    assert!(
        unmigrated.lease.token < before.lease.token,
        "the control layout should start lower"
    );
    assert_eq!(new.rate_limit("default").await.unwrap(), Some(limit));
    assert_eq!(new.paused().await.unwrap(), ["other"]);
    // `new` holds exactly `old`'s control state; `old` holds none of it any more.
    let names = |specs: Vec<ScheduleSpec>| specs.into_iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names(new.schedules().await.unwrap()), ["kept"]);
    assert_eq!(new.schedule_mark("kept").await.unwrap(), Some(60_000));
    assert_eq!(new.rate_limit("unlimited since").await.unwrap(), None);
    assert_eq!(
        new.concurrency_caps().await.unwrap(),
        [("k".to_string(), 4)]
    );
    assert!(old.schedules().await.unwrap().is_empty());
    assert!(old.paused().await.unwrap().is_empty());
    assert_eq!(old.rate_limit("default").await.unwrap(), None);
    assert!(old.concurrency_caps().await.unwrap().is_empty());
}

/// Cases whose property a partitioned coordinator does not keep, by design
/// (`runtime/src/store/partitioned.rs`): priority orders claims within a partition only;
/// tokens of different scopes are ordered within a partition only; the watermark stays
/// unpublished until every partition has one (the cancel case expects one after a revoke);
/// rate limits and caps are split into shares of at least 1 each.
pub const NOT_FOR_PARTITIONS: &[&str] = &[
    "claim_honours_batch_priority_and_delay",
    "the_watermark_stays_below_every_live_lease",
    "cancel_removes_a_queued_job_and_revokes_a_running_one",
    "a_rate_limited_queue_hands_out_no_more_than_its_rate",
    "a_capped_kind_never_runs_more_than_its_cap",
];

/// Runs named cases `parallel` at a time, each as its own task, and fails with the name and
/// message of every case that failed.
pub async fn run_together(
    runs: Vec<(String, futures_util::future::BoxFuture<'static, ()>)>,
    parallel: usize,
) {
    let total = runs.len();
    let gate = Arc::new(tokio::sync::Semaphore::new(parallel));
    let handles: Vec<_> = runs
        .into_iter()
        .map(|(name, run)| {
            let gate = gate.clone();
            let handle = tokio::spawn(async move {
                let _turn = gate.acquire_owned().await.unwrap();
                run.await
            });
            (name, handle)
        })
        .collect();
    let mut failed = Vec::new();
    for (name, handle) in handles {
        if let Err(e) = handle.await {
            failed.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {total} cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[macro_export]
macro_rules! lease_store_suite {
    // `lease_store_cases()`: every case by name, to run them together on one shared backend.
    (list) => {
        $crate::lease_store_suite!(@with list ());
    };
    // One test per case, each on the store `$make` makes.
    ($make:expr) => {
        $crate::lease_store_suite!(@with cases $make);
    };
    (@with $arm:ident $make:tt) => {
        $crate::lease_store_suite!(@$arm $make;
            claim_honours_batch_priority_and_delay,
            one_live_lease_per_scope,
            tokens_grow_per_scope,
            renew_extends_and_reports_lost,
            stale_lease_is_powerless,
            stalls_requeue_then_bury,
            retry_and_dead_settlements,
            fenced_settlement_reseeds_above_the_sink,
            status_views_and_dead_letter_retry,
            enqueue_rejects_bad_jobs_whole,
            names_are_checked_and_default_scopes_are_private,
            a_held_scope_blocks_only_itself,
            release_gives_the_job_back_uncharged,
            epoch_limit_and_dead_purge,
            one_settlement_per_lease_per_batch,
            claims_only_the_kinds_asked_for,
            the_watermark_stays_below_every_live_lease,
            operator_views_oldest_ready_role_and_journal,
            unique_keys_make_enqueue_idempotent,
            a_paused_queue_hands_out_nothing_and_loses_nothing,
            kept_schedules_and_their_marks,
            results_and_progress_are_kept_for_their_time,
            a_rate_limited_queue_hands_out_no_more_than_its_rate,
            cancel_removes_a_queued_job_and_revokes_a_running_one,
            a_capped_kind_never_runs_more_than_its_cap,
        );
    };
    (@list $unused:tt; $($case:ident),* $(,)?) => {
        #[allow(clippy::type_complexity)]
        fn lease_store_cases() -> Vec<(
            &'static str,
            fn(std::sync::Arc<dyn palisade::LeaseStore>) -> futures_util::future::BoxFuture<'static, ()>,
        )> {
            vec![$((stringify!($case), |store| -> futures_util::future::BoxFuture<'static, ()> {
                Box::pin(suite::$case(store))
            })),*]
        }
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        mod lease_store {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let store: std::sync::Arc<dyn palisade::LeaseStore> = $make.await;
                    suite::$case(store).await;
                }
            )*
        }
    };
}

// ---------------------------------------------------------------- fenced stores

fn fence(token: u64, lease: LeaseId) -> Fence {
    Fence {
        token: FencingToken::from_u64(token),
        lease,
    }
}

fn write(scope: &str, f: Fence, key: &str, mutations: Vec<Mutation>) -> FencedWrite {
    FencedWrite {
        scope: Scope::new(scope),
        fence: f,
        key: IdempotencyKey::new(key),
        mutations,
    }
}

fn set(key: &str, value: &str) -> Vec<Mutation> {
    vec![Mutation::Set {
        key: key.into(),
        value: value.into(),
    }]
}

pub async fn admission_rule_end_to_end(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b, c) = (LeaseId::new(), LeaseId::new(), LeaseId::new());
    let k = format!("{ns}v");
    let w = |f, key: &str, v: &str| write(&format!("{ns}s"), f, key, set(&k, v));
    assert_eq!(
        sink.write(w(fence(71, a), "1", "A1")).await.unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(w(fence(71, a), "1", "A1-again")).await.unwrap(),
        Admission::Duplicate
    );
    // The same logical write re-run by a newer generation is a duplicate — yet it fences.
    assert_eq!(
        sink.write(w(fence(72, b), "1", "B-rerun")).await.unwrap(),
        Admission::Duplicate
    );
    assert_eq!(
        sink.write(w(fence(71, a), "3", "A3")).await.unwrap(),
        Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::from_u64(71),
            highest: FencingToken::from_u64(72),
        })
    );
    assert_eq!(
        sink.write(w(fence(72, b), "2", "B1")).await.unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(w(fence(71, a), "2", "A2")).await.unwrap(),
        Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::from_u64(71),
            highest: FencingToken::from_u64(72),
        })
    );
    assert_eq!(
        sink.write(w(fence(72, c), "9", "C")).await.unwrap(),
        Admission::Rejected(Rejection::TokenConflict {
            token: FencingToken::from_u64(72),
            held_by: b,
            presented_by: c,
        })
    );
    assert_eq!(sink.read(&k).await.unwrap(), Some(Value::Text("B1".into())));
    assert_eq!(
        sink.highest(&Scope::new(format!("{ns}s"))).await.unwrap(),
        Some(fence(72, b))
    );
}

pub async fn mutations_apply_whole_or_not_at_all(sink: Arc<dyn FencedStore>, ns: String) {
    let a = LeaseId::new();
    let (h, t) = (format!("{ns}h"), format!("{ns}t"));
    let muts = vec![
        Mutation::HashSet {
            key: h.clone(),
            fields: vec![("name".into(), "acme".into())],
        },
        Mutation::HashIncr {
            key: h.clone(),
            field: "n".into(),
            by: 5,
        },
        Mutation::HashIncr {
            key: h.clone(),
            field: "n".into(),
            by: -2,
        },
        Mutation::Set {
            key: t.clone(),
            value: "text".into(),
        },
    ];
    let scope = format!("{ns}s");
    assert_eq!(
        sink.write(write(&scope, fence(1, a), "k1", muts))
            .await
            .unwrap(),
        Admission::Applied
    );
    let Some(Value::Hash(hash)) = sink.read(&h).await.unwrap() else {
        panic!("hash missing")
    };
    assert_eq!((hash["name"].as_str(), hash["n"].as_str()), ("acme", "3"));
    // Incrementing a non-integer fails the whole write; the fence moves up to its token
    // (the writer owned the scope), its key is not recorded.
    let bad = vec![
        Mutation::HashIncr {
            key: h.clone(),
            field: "n".into(),
            by: 1,
        },
        Mutation::HashIncr {
            key: h.clone(),
            field: "name".into(),
            by: 1,
        },
    ];
    let refused = LeaseId::new();
    let r = sink
        .write(write(&scope, fence(2, refused), "k2", bad))
        .await;
    assert!(
        matches!(r, Ok(Admission::Rejected(Rejection::Mutation { .. }))),
        "{r:?}"
    );
    let Some(Value::Hash(hash)) = sink.read(&h).await.unwrap() else {
        panic!("hash missing")
    };
    assert_eq!(hash["n"], "3", "a refused write changed data");
    assert_eq!(
        sink.highest(&Scope::new(&*scope)).await.unwrap(),
        Some(fence(2, refused))
    );
    // Type clash: a string key is not a hash.
    let clash = vec![Mutation::HashIncr {
        key: t.clone(),
        field: "f".into(),
        by: 1,
    }];
    assert_eq!(
        sink.write(write(&scope, fence(2, refused), "k3", clash))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::Mutation {
            why: format!("mutation 0: {t} holds a string, not a hash")
        })
    );
    assert_eq!(sink.read(&format!("{ns}missing")).await.unwrap(), None);
}

/// ARCHITECTURE.md invariant 8: a write refused for its content still fences. Its lease passed the
/// ownership checks with token T, which proves every lease below T stale; an older holder
/// that writes after the refusal is refused, while the refused writer's corrected retry (same
/// key: none was recorded) applies. Strictly by token, and only after the ownership checks.
pub async fn a_content_refusal_still_fences(sink: Arc<dyn FencedStore>, ns: String) {
    let (t1, t2, other) = (LeaseId::new(), LeaseId::new(), LeaseId::new());
    let scope = format!("{ns}doc");
    let doc = format!("{ns}d:doc");
    let highest = |sink: Arc<dyn FencedStore>, scope: String| async move {
        sink.highest(&Scope::new(scope)).await.unwrap()
    };
    // The issue's case: T2's [Set doc, HashSet doc] clashes with its own first step.
    let bad = vec![
        Mutation::Set {
            key: doc.clone(),
            value: "v2".into(),
        },
        Mutation::HashSet {
            key: doc.clone(),
            fields: vec![("f".into(), "x".into())],
        },
    ];
    let r = sink.write(write(&scope, fence(2, t2), "t2/0", bad)).await;
    assert!(
        matches!(r, Ok(Admission::Rejected(Rejection::Mutation { .. }))),
        "{r:?}"
    );
    assert_eq!(sink.read(&doc).await.unwrap(), None, "no data changed");
    assert_eq!(
        highest(sink.clone(), scope.clone()).await,
        Some(fence(2, t2))
    );
    // T1 < T2, its lease expired: its write must not apply.
    assert_eq!(
        sink.write(write(&scope, fence(1, t1), "t1/0", set(&doc, "stale")))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::from_u64(1),
            highest: FencingToken::from_u64(2),
        })
    );
    // Another lease presenting T2 conflicts, and a bad write of it never replaces the fence.
    let clash = vec![Mutation::HashSet {
        key: doc.clone(),
        fields: vec![],
    }];
    assert!(matches!(
        sink.write(write(&scope, fence(2, other), "o/0", clash))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::TokenConflict { .. })
    ));
    assert_eq!(
        highest(sink.clone(), scope.clone()).await,
        Some(fence(2, t2))
    );
    // A content refusal at the fence's own token (the same lease) leaves it as it is.
    let empty = vec![Mutation::HashSet {
        key: doc.clone(),
        fields: vec![],
    }];
    assert!(matches!(
        sink.write(write(&scope, fence(2, t2), "t2/1", empty))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::Mutation { .. })
    ));
    assert_eq!(
        highest(sink.clone(), scope.clone()).await,
        Some(fence(2, t2))
    );
    // The corrected retry under the same key applies: the refusal recorded no key.
    assert_eq!(
        sink.write(write(&scope, fence(2, t2), "t2/0", set(&doc, "v2")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.read(&doc).await.unwrap(),
        Some(Value::Text("v2".into()))
    );

    // In one batch: a refused write fences the older writes decided after it.
    let batch_scope = format!("{ns}batch");
    let batch_key = format!("{ns}d:batch");
    let (t5, t4) = (LeaseId::new(), LeaseId::new());
    let overflow = vec![
        Mutation::HashIncr {
            key: batch_key.clone(),
            field: "n".into(),
            by: i64::MAX,
        },
        Mutation::HashIncr {
            key: batch_key.clone(),
            field: "n".into(),
            by: 1,
        },
    ];
    let replies = sink
        .write_batch(vec![
            write(&batch_scope, fence(5, t5), "t5/0", overflow),
            write(&batch_scope, fence(4, t4), "t4/0", set(&batch_key, "late")),
        ])
        .await
        .unwrap();
    assert!(
        matches!(
            replies[0],
            Ok(Admission::Rejected(Rejection::Mutation { .. }))
        ),
        "{replies:?}"
    );
    assert!(
        matches!(
            replies[1],
            Ok(Admission::Rejected(Rejection::StaleToken { .. }))
        ),
        "{replies:?}"
    );
    assert_eq!(sink.read(&batch_key).await.unwrap(), None);

    // Below the watermark a content refusal is never reached: stale, and nothing moves.
    let low_scope = format!("{ns}low");
    sink.observe_watermark(FencingToken::from_u64(10));
    let bad = vec![Mutation::HashSet {
        key: format!("{ns}d:low"),
        fields: vec![],
    }];
    assert!(matches!(
        sink.write(write(&low_scope, fence(9, LeaseId::new()), "l/0", bad))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken { .. })
    ));
    assert_eq!(highest(sink.clone(), low_scope).await, None);
}

pub async fn scopes_are_fenced_independently(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b) = (LeaseId::new(), LeaseId::new());
    let k = format!("{ns}k");
    let x = format!("{ns}x");
    let y = format!("{ns}y");
    assert_eq!(
        sink.write(write(&x, fence(900, a), "1", set(&k, "x")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(write(&y, fence(3, b), "1", set(&k, "y")))
            .await
            .unwrap(),
        Admission::Applied
    );
}

/// Many writers of three generations race; the sink's atomicity is what keeps the history
/// clean, so this is the test that catches a read-then-write backend.
pub async fn racing_writers_apply_each_key_once(sink: Arc<dyn FencedStore>, ns: String) {
    let gens: Vec<Fence> = (1..=3).map(|t| fence(t, LeaseId::new())).collect();
    let scope = format!("{ns}race");
    let counter = format!("{ns}counter");
    let mut tasks = Vec::new();
    for i in 0..90 {
        let (sink, g) = (sink.clone(), gens[i % 3]);
        let w = write(
            &scope,
            g,
            &format!("k{}", i % 5),
            vec![Mutation::HashIncr {
                key: counter.clone(),
                field: g.token.to_string(),
                by: 1,
            }],
        );
        tasks.push(tokio::spawn(
            async move { (g, sink.write(w).await.unwrap()) },
        ));
    }
    let mut applied_per_gen = [0usize; 3];
    let mut highest_applied = 0;
    for t in tasks {
        let (g, admission) = t.await.unwrap();
        if admission == Admission::Applied {
            applied_per_gen[g.token.as_u64() as usize - 1] += 1;
            highest_applied = highest_applied.max(g.token.as_u64());
        }
    }
    let Some(Value::Hash(h)) = sink.read(&counter).await.unwrap() else {
        panic!("no counter")
    };
    for (i, n) in applied_per_gen.iter().enumerate() {
        let stored: usize = h
            .get(&(i + 1).to_string())
            .map_or(0, |v| v.parse().unwrap());
        assert_eq!(
            stored,
            *n,
            "generation {} applied {n} but stored {stored}",
            i + 1
        );
    }
    let total: usize = applied_per_gen.iter().sum();
    assert!(
        total <= 5,
        "5 keys, {total} applications: a key applied twice"
    );
    assert_eq!(
        sink.highest(&Scope::new(scope))
            .await
            .unwrap()
            .unwrap()
            .token
            .as_u64(),
        highest_applied
    );
}

/// A batch (group commit) decides every write on its own, in order.
pub async fn batched_writes_are_decided_one_by_one(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b) = (LeaseId::new(), LeaseId::new());
    let (s1, s2, k) = (format!("{ns}s1"), format!("{ns}s2"), format!("{ns}k"));
    let text = format!("{ns}text");
    sink.write(write(&s2, fence(9, b), "seed", set(&text, "x")))
        .await
        .unwrap();
    let incr = |by| {
        vec![Mutation::HashIncr {
            key: k.clone(),
            field: "n".into(),
            by,
        }]
    };
    let results = sink
        .write_batch(vec![
            write(&s1, fence(1, a), "one", incr(1)),
            write(&s1, fence(1, a), "one", incr(1)),
            write(&s2, fence(8, a), "late", incr(100)),
            write(
                &s1,
                fence(2, b),
                "bad",
                vec![Mutation::HashIncr {
                    key: text.clone(),
                    field: "f".into(),
                    by: 1,
                }],
            ),
            write(&s1, fence(2, b), "two", incr(2)),
        ])
        .await
        .unwrap();
    assert_eq!(results.len(), 5);
    assert_eq!(results[0].as_ref().unwrap(), &Admission::Applied);
    assert_eq!(results[1].as_ref().unwrap(), &Admission::Duplicate);
    assert!(matches!(
        results[2],
        Ok(Admission::Rejected(Rejection::StaleToken { .. }))
    ));
    assert!(
        matches!(
            results[3],
            Ok(Admission::Rejected(Rejection::Mutation { .. }))
        ),
        "{:?}",
        results[3]
    );
    assert_eq!(results[4].as_ref().unwrap(), &Admission::Applied);
    let Some(Value::Hash(h)) = sink.read(&k).await.unwrap() else {
        panic!("counter missing")
    };
    assert_eq!(h["n"], "3");
    assert!(sink.write_batch(vec![]).await.unwrap().is_empty());
}

fn incr(key: &str, field: &str, by: i64) -> Mutation {
    Mutation::HashIncr {
        key: key.into(),
        field: field.into(),
        by,
    }
}

fn hash_set(key: &str, field: &str, value: &str) -> Mutation {
    Mutation::HashSet {
        key: key.into(),
        fields: vec![(field.into(), value.into())],
    }
}

async fn field(sink: &dyn FencedStore, key: &str, field: &str) -> Option<String> {
    match sink.read(key).await.unwrap() {
        Some(Value::Hash(h)) => h.get(field).cloned(),
        other => panic!("{key} is {other:?}"),
    }
}

/// Issue 7, case 1: a later mutation that cannot apply used to leave the earlier ones applied
/// with the fence unmoved, so the stale holder could then write. Now nothing applies, and the
/// stale holder is still refused.
pub async fn a_bad_step_applies_nothing(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b) = (LeaseId::new(), LeaseId::new());
    let (scope, doc, bal) = (format!("{ns}s"), format!("{ns}doc"), format!("{ns}bal"));
    let w = |f, key: &str, m| write(&scope, f, key, m);
    assert_eq!(
        sink.write(w(fence(10, a), "a1", set(&doc, "v10")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(w(fence(11, b), "b1", vec![incr(&bal, "n", i64::MAX - 10)]))
            .await
            .unwrap(),
        Admission::Applied
    );
    let clash = vec![
        Mutation::Set {
            key: doc.clone(),
            value: "v11".into(),
        },
        hash_set(&doc, "f", "x"),
    ];
    assert_eq!(
        sink.write(w(fence(11, b), "b2", clash)).await.unwrap(),
        Admission::Rejected(Rejection::Mutation {
            why: format!("mutation 1: {doc} holds a string, not a hash")
        })
    );
    assert_eq!(
        sink.read(&doc).await.unwrap(),
        Some(Value::Text("v10".into()))
    );
    // Overflow on the second step: the first step's +5 is not kept, however often retried.
    for _ in 0..3 {
        assert_eq!(
            sink.write(w(
                fence(11, b),
                "b3",
                vec![incr(&bal, "n", 5), incr(&bal, "n", 1000)]
            ))
            .await
            .unwrap(),
            Admission::Rejected(Rejection::Mutation {
                why: format!("mutation 1: {bal}.n = 9223372036854775802 + 1000 overflows i64")
            })
        );
    }
    assert_eq!(
        field(&*sink, &bal, "n").await.as_deref(),
        Some("9223372036854775797")
    );
    // The refused writes' keys were not recorded: fixed, they apply.
    assert_eq!(
        sink.write(w(fence(11, b), "b3", vec![incr(&bal, "n", 5)]))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(w(fence(10, a), "a2", set(&doc, "stale")))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::from_u64(10),
            highest: FencingToken::from_u64(11),
        })
    );
    assert_eq!(
        sink.read(&doc).await.unwrap(),
        Some(Value::Text("v10".into()))
    );
    assert_eq!(
        sink.highest(&Scope::new(&*scope)).await.unwrap(),
        Some(fence(11, b))
    );
}

/// Issue 7, case 3: integers are exact end to end and follow Redis' own syntax.
pub async fn integers_are_exact_and_strict(sink: Arc<dyn FencedStore>, ns: String) {
    let a = LeaseId::new();
    let (scope, h) = (format!("{ns}s"), format!("{ns}h"));
    let mut n = 0;
    let mut w = |m: Vec<Mutation>| {
        n += 1;
        write(&scope, fence(1, a), &format!("k{n}"), m)
    };
    let big = (1i64 << 53) + 1;
    assert_eq!(
        sink.write(w(vec![incr(&h, "big", big)])).await.unwrap(),
        Admission::Applied
    );
    assert_eq!(field(&*sink, &h, "big").await.unwrap(), big.to_string());
    for (f, by) in [("max", i64::MAX), ("min", i64::MIN), ("neg", -1)] {
        assert_eq!(
            sink.write(w(vec![incr(&h, f, by)])).await.unwrap(),
            Admission::Applied
        );
        assert_eq!(field(&*sink, &h, f).await.unwrap(), by.to_string());
    }
    for (f, by) in [("max", 1), ("min", -1)] {
        assert!(matches!(
            sink.write(w(vec![incr(&h, f, by)])).await.unwrap(),
            Admission::Rejected(Rejection::Mutation { .. })
        ));
    }
    assert_eq!(
        sink.write(w(vec![incr(&h, "neg", i64::MIN + 1)]))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        field(&*sink, &h, "neg").await.unwrap(),
        i64::MIN.to_string()
    );
    for bad in [
        "007",
        "-0",
        "",
        "+1",
        " 1",
        "1.5",
        "99999999999999999999",
        "9223372036854775808",
    ] {
        assert_eq!(
            sink.write(w(vec![hash_set(&h, "s", bad)])).await.unwrap(),
            Admission::Applied
        );
        assert_eq!(
            sink.write(w(vec![incr(&h, "s", 1)])).await.unwrap(),
            Admission::Rejected(Rejection::Mutation {
                why: format!("mutation 0: {h}.s is not an integer")
            }),
            "{bad:?} taken for an integer"
        );
        assert_eq!(field(&*sink, &h, "s").await.unwrap(), bad);
    }
    // A step sees the effect of the steps before it.
    let steps = vec![
        hash_set(&h, "t", "12"),
        incr(&h, "t", 30),
        incr(&h, "t", -2),
    ];
    assert_eq!(sink.write(w(steps)).await.unwrap(), Admission::Applied);
    assert_eq!(field(&*sink, &h, "t").await.unwrap(), "40");
    let empty = vec![Mutation::HashSet {
        key: h.clone(),
        fields: vec![],
    }];
    assert_eq!(
        sink.write(w(empty)).await.unwrap(),
        Admission::Rejected(Rejection::Mutation {
            why: format!("mutation 0: HashSet of {h} has no fields")
        })
    );
}

/// Issue 7, case 2: one bad write in a group-committed batch fails only itself; every other
/// write gets exactly the answer it would get alone, and stale holders stay refused.
pub async fn one_bad_write_fails_only_itself(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b) = (LeaseId::new(), LeaseId::new());
    let (s1, s2) = (format!("{ns}s1"), format!("{ns}s2"));
    let (k, text) = (format!("{ns}k"), format!("{ns}text"));
    sink.write(write(&s2, fence(5, a), "seed", set(&text, "x")))
        .await
        .unwrap();
    let results = sink
        .write_batch(vec![
            write(&s1, fence(7, b), "ok1", vec![incr(&k, "n", 1)]),
            write(
                &s1,
                fence(7, b),
                "bad",
                vec![incr(&k, "n", 1), incr(&text, "f", 1)],
            ),
            write(
                &s2,
                fence(6, b),
                "overflow",
                vec![incr(&k, "m", i64::MAX), incr(&k, "m", 1)],
            ),
            write(&s1, fence(7, b), "ok2", vec![incr(&k, "n", 10)]),
            write(&s1, fence(6, a), "stale", vec![incr(&k, "n", 100)]),
        ])
        .await
        .unwrap();
    let outcomes: Vec<String> = results
        .iter()
        .map(|r| match r {
            Ok(Admission::Rejected(r)) => r.reason().to_string(),
            Ok(other) => format!("{other:?}"),
            Err(e) => format!("error: {e}"),
        })
        .collect();
    assert_eq!(
        outcomes,
        ["Applied", "mutation", "mutation", "Applied", "stale_token"]
    );
    assert_eq!(field(&*sink, &k, "n").await.as_deref(), Some("11"));
    assert_eq!(field(&*sink, &k, "m").await, None);
    // s2's fence moved to the refused write's token (its writer owned the scope): the old
    // holder at 5 may no longer write, nor may one below it.
    assert_eq!(
        sink.highest(&Scope::new(&*s2)).await.unwrap(),
        Some(fence(6, b))
    );
    for (token, key) in [(5, "old holder"), (4, "older")] {
        assert!(matches!(
            sink.write(write(&s2, fence(token, a), key, set(&text, "y")))
                .await
                .unwrap(),
            Admission::Rejected(Rejection::StaleToken { .. })
        ));
    }
    assert!(matches!(
        sink.write(write(&s1, fence(6, a), "stale2", set(&text, "y")))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken { .. })
    ));
    assert_eq!(
        sink.read(&text).await.unwrap(),
        Some(Value::Text("x".into()))
    );
}

/// Issue 9: a write below the coordinator's low watermark is stale even where the sink keeps
/// no fence, so fences below it can be forgotten; idempotency keys are kept, so a re-run of a
/// job that wrote before it stalled is still a duplicate after the collection.
pub async fn the_watermark_refuses_and_lets_fences_go(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b, c) = (LeaseId::new(), LeaseId::new(), LeaseId::new());
    // s1 is a default-scoped job's scope (`job:<id>`), the case that used to leave a fence
    // behind per job forever.
    let s1 = Scope::of_job(JobId::new()).to_string();
    let (s2, s3) = (format!("{ns}s2"), format!("{ns}s3"));
    let k = format!("{ns}k");
    assert_eq!(
        sink.write(write(&s1, fence(5, a), "job1/0", set(&k, "a")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(write(&s2, fence(6, b), "job2/0", set(&k, "b")))
            .await
            .unwrap(),
        Admission::Applied
    );
    sink.observe_watermark(FencingToken::from_u64(7));
    // The next call applies the watermark and collects the fences below it.
    assert_eq!(
        sink.write(write(&s3, fence(8, c), "job3/0", set(&k, "c")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.highest(&Scope::new(&*s1)).await.unwrap(),
        None,
        "fence below W kept"
    );
    assert_eq!(sink.highest(&Scope::new(&*s2)).await.unwrap(), None);
    assert_eq!(
        sink.highest(&Scope::new(&*s3)).await.unwrap(),
        Some(fence(8, c))
    );
    // The paused holder of s1 wakes up: no fence, but the watermark refuses it.
    assert_eq!(
        sink.write(write(&s1, fence(5, a), "job1/1", set(&k, "late")))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::from_u64(5),
            highest: FencingToken::from_u64(7),
        })
    );
    // The job re-runs under a newer token: its write is still a duplicate, and fences again.
    let rerun = LeaseId::new();
    assert_eq!(
        sink.write(write(&s1, fence(9, rerun), "job1/0", set(&k, "again")))
            .await
            .unwrap(),
        Admission::Duplicate
    );
    assert_eq!(
        sink.highest(&Scope::new(&*s1)).await.unwrap(),
        Some(fence(9, rerun))
    );
    // A lower watermark later changes nothing; the token at W itself is fine.
    sink.observe_watermark(FencingToken::from_u64(3));
    assert!(matches!(
        sink.write(write(&s2, fence(6, b), "job2/1", set(&k, "x")))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken { .. })
    ));
    assert_eq!(
        sink.write(write(&s2, fence(7, b), "job2/2", set(&k, "d")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(sink.read(&k).await.unwrap(), Some(Value::Text("d".into())));
}

/// Issue 9's workload: `jobs` default-scoped jobs (`job:<id>`), each with one fenced write,
/// while the coordinator's watermark trails the newest token by a few hundred in-flight
/// leases; then every lease ends (watermark above all), the key retention passes, and a few
/// more calls give the sink the chance to collect. The caller measures what is left.
pub async fn drive_default_scoped_writes(sink: &dyn FencedStore, jobs: u64, retention: Duration) {
    let total = format!("total:{}", LeaseId::new());
    let mut token = 0;
    while token < jobs {
        let batch: Vec<FencedWrite> = (0..1000.min(jobs - token))
            .map(|_| {
                token += 1;
                let id = JobId::new();
                write(
                    Scope::of_job(id).as_str(),
                    fence(token, LeaseId::new()),
                    &format!("{id}/0"),
                    vec![Mutation::HashIncr {
                        key: total.clone(),
                        field: "n".into(),
                        by: 1,
                    }],
                )
            })
            .collect();
        let results = sink.write_batch(batch).await.unwrap();
        assert!(results.iter().all(|r| matches!(r, Ok(Admission::Applied))));
        sink.observe_watermark(FencingToken::from_u64(token.saturating_sub(300)));
    }
    tokio::time::sleep(retention + Duration::from_millis(100)).await;
    sink.observe_watermark(FencingToken::from_u64(token + 1));
    let probe = Scope::of_job(JobId::new());
    for i in 0..100 {
        let nudge: Vec<FencedWrite> = (0..500)
            .map(|k| {
                write(
                    probe.as_str(),
                    fence(token + 1, LeaseId::from(uuid::Uuid::nil())),
                    &format!("n{i}/{k}"),
                    vec![],
                )
            })
            .collect();
        sink.write_batch(nudge).await.unwrap();
    }
    let Some(Value::Hash(h)) = sink.read(&total).await.unwrap() else {
        panic!("no total")
    };
    assert_eq!(h["n"], jobs.to_string(), "every write applied exactly once");
}

#[macro_export]
macro_rules! fenced_store_suite {
    // `fenced_store_cases()`: every case by name, to run them together on one shared backend.
    (list) => {
        $crate::fenced_store_suite!(@with list ());
    };
    // One test per case, each on the sink `$make` makes.
    ($make:expr) => {
        $crate::fenced_store_suite!(@with cases $make);
    };
    (@with $arm:ident $make:tt) => {
        $crate::fenced_store_suite!(@$arm $make;
            admission_rule_end_to_end,
            mutations_apply_whole_or_not_at_all,
            a_content_refusal_still_fences,
            scopes_are_fenced_independently,
            racing_writers_apply_each_key_once,
            batched_writes_are_decided_one_by_one,
            a_bad_step_applies_nothing,
            integers_are_exact_and_strict,
            one_bad_write_fails_only_itself,
            the_watermark_refuses_and_lets_fences_go,
        );
    };
    (@list $unused:tt; $($case:ident),* $(,)?) => {
        #[allow(clippy::type_complexity)]
        fn fenced_store_cases() -> Vec<(
            &'static str,
            fn(std::sync::Arc<dyn palisade::FencedStore>, String) -> futures_util::future::BoxFuture<'static, ()>,
        )> {
            vec![$((stringify!($case), |sink, ns| -> futures_util::future::BoxFuture<'static, ()> {
                Box::pin(suite::$case(sink, ns))
            })),*]
        }
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        mod fenced_store {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let sink: std::sync::Arc<dyn palisade::FencedStore> = $make.await;
                    let ns = format!("{}:{}:", stringify!($case), palisade::LeaseId::new());
                    suite::$case(sink, ns).await;
                }
            )*
        }
    };
}
