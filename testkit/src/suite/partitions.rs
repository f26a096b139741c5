//! Cases for a partitioned layout and moves between layouts.

use super::*;

/// A coordinator over `parts`: jobs of a scope land in one partition and its tokens only
/// grow; default-scoped jobs spread; one claim takes work from every partition (stealing
/// what one lacks from the others); a lease claimed through another view of the same
/// partitions is renewed and settled here; the watermark waits for every partition; limits
/// and caps are split into shares; a batch with one bad job adds nothing anywhere.
pub async fn partitions_keep_scopes_and_share_work(store: Stores, parts: Vec<Stores>) {
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
    let first = claim(&store, 100).await;
    assert_eq!(first.len(), 40, "10 scope heads and 30 default-scoped jobs");
    let scopes: std::collections::BTreeSet<&Scope> = first.iter().map(|c| &c.lease.scope).collect();
    assert_eq!(scopes.len(), 40, "a scope was granted twice");
    // Each scope's tokens only grow, job after job.
    let mut last: std::collections::HashMap<Scope, FencingToken> = first
        .iter()
        .map(|c| (c.lease.scope.clone(), c.lease.token))
        .collect();
    // A second view of the same partitions (another process) settles what this one claimed.
    let other: Stores = palisade::store::partitioned::PartitionedLeaseStore::new(parts.clone())
        .unwrap()
        .into();
    let ids: Vec<LeaseId> = first.iter().map(|c| c.lease.id).collect();
    assert!(
        other.renew(&ids, TTL).await.unwrap().is_empty(),
        "a lease was lost"
    );
    let done: Vec<(LeaseId, Settlement)> =
        ids.iter().map(|&l| (l, Settlement::completed())).collect();
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
        let more = claim(&store, 100).await;
        assert_eq!(more.len(), 10);
        for c in &more {
            let before = last.insert(c.lease.scope.clone(), c.lease.token).unwrap();
            assert!(
                c.lease.token > before,
                "{}: {:?} after {before:?}",
                c.lease.scope,
                c.lease.token
            );
            settle(&store, c.lease.id, Settlement::completed())
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
    let stolen = claim(&store, 9).await;
    assert_eq!(
        stolen.len(),
        9,
        "a claim did not steal from the partition that had the work"
    );
    for c in stolen {
        settle(&store, c.lease.id, Settlement::completed())
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
    let batch = claim(&store, 12).await;
    assert_eq!(batch.len(), 12);
    let (done, live): (Vec<&Claim>, Vec<&Claim>) = batch
        .iter()
        .partition(|c| c.job.id.as_uuid().as_u128() % 2 == 0);
    for c in &done {
        settle(&store, c.lease.id, Settlement::completed())
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
        settle(&store, c.lease.id, Settlement::completed())
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
        claim(&store, 10).await.is_empty(),
        "a paused queue handed out a job"
    );
    store.set_paused("default", false).await.unwrap();
    let running = claim(&store, 10).await;
    assert_eq!(running.len(), 1);
    assert_eq!(store.cancel(id, "stop").await.unwrap(), Cancelled::Revoked);
    assert!(matches!(
        settle(&store, running[0].lease.id, Settlement::completed()).await,
        Err(Error::LeaseNotCurrent(_))
    ));
}

/// Moving from the layout `old` to `new` (fresh) never lowers a scope's tokens: the scope's
/// partition in `new` grants above everything `old` granted. `control` is another fresh
/// layout like `new`, left unmigrated, to show the test would catch a lower token.
pub async fn migration_never_lowers_a_scopes_tokens(old: Stores, new: Stores, control: Stores) {
    use palisade::store::partitioned::migrate;
    // A history in the old layout: the scope's tokens reached epoch 7.
    old.raise_epoch(7).await.unwrap();
    old.enqueue(vec![job("k").with_scope("acct:1")])
        .await
        .unwrap();
    let before = claim(&old, 1).await.remove(0);
    assert_eq!(before.lease.token.epoch(), 7);
    let limit = RateLimit {
        jobs: 5,
        per: Duration::from_secs(1),
    };
    old.set_rate_limit("default", Some(limit)).await.unwrap();
    old.set_paused("other", true).await.unwrap();
    old.set_concurrency_cap("k", Some(4)).await.unwrap();
    let paused = GroupLimits {
        cap: Some(3),
        paused: true,
        ..GroupLimits::default()
    };
    old.set_group_limits("tenant:1", paused).await.unwrap();
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
    settle(&new, stale.lease.id, Settlement::completed())
        .await
        .unwrap();
    new.set_rate_limit("unlimited since", Some(limit))
        .await
        .unwrap();
    new.set_concurrency_cap("uncapped since", Some(2))
        .await
        .unwrap();
    // Refused while the old layout still has work.
    assert!(matches!(migrate(&old, &new).await, Err(Error::Config(_))));
    settle(&old, before.lease.id, Settlement::completed())
        .await
        .unwrap();
    // And while it holds dead letters (they would be left behind, unseen).
    old.enqueue(vec![job("k")]).await.unwrap();
    let doomed = claim(&old, 1).await.remove(0);
    let dead = Settlement::Dead {
        reason: "no".into(),
    };
    settle(&old, doomed.lease.id, dead).await.unwrap();
    let refused = migrate(&old, &new).await;
    assert!(
        matches!(&refused, Err(Error::Config(why)) if why.contains("1 dead")),
        "{refused:?}"
    );
    assert_eq!(old.purge_dead("default", 10).await.unwrap(), 1);
    let epoch = migrate(&old, &new).await.unwrap();
    assert!(epoch > 7, "{epoch}");
    // The old layout is only read by the migration; retired once the new one is in use.
    assert_eq!(old.schedules().await.unwrap().len(), 1);
    palisade::store::partitioned::retire(&old).await;
    for layout in [&new, &control] {
        layout
            .enqueue(vec![job("k").with_scope("acct:1")])
            .await
            .unwrap();
    }
    let after = claim(&new, 1).await.remove(0);
    assert!(
        after.lease.token > before.lease.token,
        "{:?} after {:?}",
        after.lease.token,
        before.lease.token
    );
    let unmigrated = claim(&control, 1).await.remove(0);
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
    // A group's limits and pause move with it, whole (its new partition holds them).
    assert_eq!(
        new.limited_groups(10).await.unwrap(),
        [("tenant:1".to_string(), paused)]
    );
    assert_eq!(new.group("tenant:1").await.unwrap().limits, paused);
    assert!(old.limited_groups(10).await.unwrap().is_empty());
}

/// Issue 24: a worker's settle-and-claim pair, round after round, goes to every partition in
/// turn and stays correct past the first P rounds (the claim's partition index wraps), with
/// each round completing the previous round's job. Uses its own queue.
pub async fn the_pair_visits_every_partition(store: Stores, partitions: usize) {
    let rounds = 3 * partitions + 2;
    let jobs = (0..rounds).map(|_| job("k").with_queue("pairs")).collect();
    store.enqueue(jobs).await.unwrap();
    let request = ClaimRequest {
        queue: "pairs".into(),
        kinds: Vec::new(),
        worker: "suite".into(),
        n: 1,
        ttl: Duration::from_secs(30),
    };
    let mut held: Vec<(LeaseId, Settlement)> = Vec::new();
    let mut claimed = 0;
    for round in 0..=rounds {
        let (settled, claims) = store.settle_and_claim(held.clone(), &request).await;
        assert!(
            settled.unwrap().iter().all(Result::is_ok),
            "round {round}: a settlement was refused"
        );
        let claims = claims.unwrap();
        claimed += claims.len();
        held = claims
            .iter()
            .map(|c| (c.lease.id, Settlement::completed()))
            .collect();
    }
    assert_eq!(claimed, rounds);
    let counts = store.counts("pairs").await.unwrap();
    assert_eq!((counts.completed, counts.pending()), (rounds as u64, 0));
}

/// A group lives in one partition: its jobs go where its name hashes, its cap is whole there
/// (never split into shares), and a grouped job's named scope must hash to the same
/// partition (else the enqueue is refused whole, nothing added).
pub async fn a_group_lives_in_one_partition(store: Stores, parts: Vec<Stores>) {
    use palisade::store::partitioned::partition_of;
    let p = parts.len();
    let home = partition_of("tenant:7", p);
    store
        .set_group_limits(
            "tenant:7",
            GroupLimits {
                cap: Some(1),
                ..GroupLimits::default()
            },
        )
        .await
        .unwrap();
    let mut jobs: Vec<NewJob> = (0..12).map(|_| job("k").with_group("tenant:7")).collect();
    jobs.extend((0..12).map(|_| job("k")));
    store.enqueue(jobs).await.unwrap();
    for (i, part) in parts.iter().enumerate() {
        let group = part.group("tenant:7").await.unwrap();
        assert_eq!(group.ready, if i == home { 12 } else { 0 }, "partition {i}");
    }
    // Its cap of 1 holds across every claim, whichever partition a claim starts at.
    let mut claimed = Vec::new();
    for _ in 0..(2 * p) {
        claimed.extend(claim(&store, 10).await);
    }
    let grouped = claimed.iter().filter(|c| c.job.group.is_some()).count();
    assert_eq!((grouped, claimed.len()), (1, 13), "{claimed:?}");
    assert_eq!(store.group("tenant:7").await.unwrap().running, 1);
    // A named scope in another partition is refused; one in the group's is not.
    let scope_in = |same: bool| {
        (0..)
            .map(|i| format!("acct:{i}"))
            .find(|s| (partition_of(s, p) == home) == same)
            .unwrap()
    };
    let away = job("k").with_group("tenant:7").with_scope(scope_in(false));
    let before = store.counts("default").await.unwrap().pending();
    assert!(matches!(
        store.enqueue(vec![job("k"), away]).await,
        Err(Error::InvalidJob(_))
    ));
    assert_eq!(store.counts("default").await.unwrap().pending(), before);
    store
        .enqueue(vec![job("k")
            .with_group("tenant:7")
            .with_scope(scope_in(true))])
        .await
        .unwrap();
    // A unique key (an API Idempotency-Key, say) is kept in the group's partition, wherever
    // it hashes: the group's jobs under one key are one job.
    let key = scope_in(false);
    let hour = Duration::from_secs(3600);
    let unique = || {
        job("k")
            .with_group("tenant:7")
            .with_unique_key(key.clone(), hour)
    };
    let first = store.enqueue(vec![unique()]).await.unwrap()[0];
    let again = store.enqueue_all(vec![unique()]).await.unwrap();
    assert_eq!(again, [Enqueued::Existing(first)]);
    // Its limits are kept in its partition alone and listed once.
    assert_eq!(
        store.limited_groups(10).await.unwrap(),
        vec![(
            "tenant:7".to_owned(),
            GroupLimits {
                cap: Some(1),
                ..GroupLimits::default()
            }
        )]
    );
}
