//! Cases for groups (`NewJob::with_group`): round-robin claims, per-group caps, rate limits
//! and pause, and how groups compose with scopes, priorities, cancels and dead-letter retries.

use super::*;

/// Every one of the group cases in this file: add a new one here too.
#[doc(hidden)]
#[macro_export]
macro_rules! group_cases {
    ($($how:tt)*) => {
        $crate::lease_store_case!($($how)*;
            claims_rotate_over_groups_whatever_their_backlog,
            a_capped_group_runs_no_more_than_its_cap_and_others_pass_it,
            a_rate_limited_group_starts_no_more_than_its_rate,
            a_paused_group_waits_and_resumes,
            a_kind_at_its_cap_never_holds_back_another_kinds_groups,
            groups_keep_scopes_priorities_cancels_and_dead_letters,
            bad_group_names_and_limits_are_refused_whole,
        );
    };
}

fn grouped(group: &str) -> NewJob {
    job("k").with_group(group)
}

async fn settle_all(store: &Stores, claims: &[Claim]) {
    let done = claims
        .iter()
        .map(|c| (c.lease.id, Settlement::completed()))
        .collect();
    for r in store.settle(done).await.unwrap() {
        r.unwrap();
    }
}

/// A group with a big backlog enqueued first takes one turn per round like every other
/// group, and jobs without a group take one lane of their own: the small groups are all
/// claimed within the first rounds, not after the backlog.
pub async fn claims_rotate_over_groups_whatever_their_backlog(store: Stores) {
    store
        .enqueue((0..200).map(|_| grouped("big")).collect())
        .await
        .unwrap();
    let mut small = Vec::new();
    for g in ["b", "c", "d", "e", "f"] {
        small.extend([grouped(g), grouped(g)]);
    }
    small.extend([job("k"), job("k")]);
    store.enqueue(small).await.unwrap();
    assert_eq!(store.counts("default").await.unwrap().ready, 212);
    let (mut big, mut rest, mut claims) = (0, 0, 0);
    let mut served = std::collections::BTreeSet::new();
    while rest < 12 {
        let got = claim(&store, 4).await;
        assert!(!got.is_empty(), "jobs are ready");
        claims += 1;
        served.extend(got.iter().map(|c| c.job.group.clone()));
        if claims == 1 {
            // Jobs without a group are one lane: one job a round, however many are ready.
            let ungrouped = got.iter().filter(|c| c.job.group.is_none()).count();
            assert_eq!(ungrouped, 1, "the ungrouped lane took more than its turn");
        }
        if claims == 2 {
            // 7 lanes, 4 a claim: a served group goes to the back, so two claims reach every
            // lane (the ungrouped one first in each).
            assert_eq!(served.len(), 7, "two claims reach every lane: {served:?}");
        }
        for c in &got {
            if c.job.group.as_deref() == Some("big") {
                big += 1;
            } else {
                rest += 1;
            }
        }
        settle_all(&store, &got).await;
        assert!(claims < 20, "the small groups wait behind the backlog");
    }
    // 7 lanes of 2 jobs each for the small ones: each claim of 4 serves 4 lanes, the big group
    // in at most one of them.
    assert!(
        big <= claims,
        "the big group took {big} of {claims} claims' jobs: more than its turn"
    );
    let top = store.groups("default", 2).await.unwrap();
    assert_eq!(
        top.len(),
        1,
        "only the big group has ready jobs left: {top:?}"
    );
    assert_eq!(
        (top[0].group.as_str(), top[0].ready),
        ("big", 200 - big as u64)
    );
}

/// A capped group never runs more than its cap at once; the claim passes it by for other
/// groups, takes it out of the rotation, and brings it back when one of its leases ends.
pub async fn a_capped_group_runs_no_more_than_its_cap_and_others_pass_it(store: Stores) {
    let capped = GroupLimits {
        cap: Some(2),
        ..GroupLimits::default()
    };
    store.set_group_limits("a", capped).await.unwrap();
    assert!(store
        .set_group_limits(
            "a",
            GroupLimits {
                cap: Some(0),
                ..GroupLimits::default()
            }
        )
        .await
        .is_err());
    store
        .enqueue((0..10).map(|_| grouped("a")).collect())
        .await
        .unwrap();
    store
        .enqueue((0..3).map(|_| grouped("b")).collect())
        .await
        .unwrap();
    let mut first = Vec::new();
    for _ in 0..4 {
        first.extend(claim(&store, 10).await);
    }
    let of = |claims: &[Claim], g: &str| {
        claims
            .iter()
            .filter(|c| c.job.group.as_deref() == Some(g))
            .count()
    };
    assert_eq!((of(&first, "a"), of(&first, "b")), (2, 3), "{first:?}");
    let status = store.group("a").await.unwrap();
    assert_eq!(
        (status.ready, status.running, status.limits, status.parked),
        (8, 2, capped, true)
    );
    // One ends: the group is back in the rotation and one more starts.
    let a: Vec<Claim> = first
        .into_iter()
        .filter(|c| c.job.group.as_deref() == Some("a"))
        .collect();
    settle_all(&store, &a[..1]).await;
    assert!(!store.group("a").await.unwrap().parked);
    let next = claim(&store, 10).await;
    assert_eq!(of(&next, "a"), 1, "{next:?}");
    // Lifting the cap lets the rest run.
    store
        .set_group_limits("a", GroupLimits::default())
        .await
        .unwrap();
    let mut rest = Vec::new();
    for _ in 0..3 {
        rest.extend(claim(&store, 10).await);
    }
    assert_eq!(of(&rest, "a"), 7);
    // Only leases claimed under the cap are counted (as a kind's cap counts).
    assert_eq!(store.group("a").await.unwrap().running, 2);
}

/// A rate-limited group starts at most its bucket's whole tokens, is parked when it has none,
/// and comes back when the bucket refilled.
pub async fn a_rate_limited_group_starts_no_more_than_its_rate(store: Stores) {
    let limited = GroupLimits {
        rate: Some(RateLimit {
            jobs: 2,
            per: Duration::from_millis(600),
        }),
        ..GroupLimits::default()
    };
    store.set_group_limits("a", limited).await.unwrap();
    store
        .enqueue((0..10).map(|_| grouped("a")).collect())
        .await
        .unwrap();
    store.enqueue(vec![grouped("b")]).await.unwrap();
    let mut first = Vec::new();
    for _ in 0..3 {
        first.extend(claim(&store, 10).await);
    }
    let a = first
        .iter()
        .filter(|c| c.job.group.as_deref() == Some("a"))
        .count();
    assert_eq!((a, first.len()), (2, 3), "{first:?}");
    assert!(store.group("a").await.unwrap().parked);
    // One token is back after 300 ms.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let next = claim(&store, 10).await;
    assert_eq!(next.len(), 1, "{next:?}");
    assert!(claim(&store, 10).await.is_empty());
}

/// Found by the attack review: groups of a kind at its concurrency cap filled a claim's
/// lanes, so a worker of two kinds saw no group of the other kind until the capped kind's
/// jobs ended one by one.
pub async fn a_kind_at_its_cap_never_holds_back_another_kinds_groups(store: Stores) {
    store.set_concurrency_cap("capped", Some(1)).await.unwrap();
    let mut jobs: Vec<NewJob> = (0..40)
        .map(|i| job("capped").with_group(format!("a{i:02}")))
        .collect();
    jobs.push(job("free").with_group("b0"));
    store.enqueue(jobs).await.unwrap();
    let kinds = ["capped".to_string(), "free".to_string()];
    let mut got = Vec::new();
    for _ in 0..3 {
        got.extend(
            store
                .claim_kinds("default", &kinds, "suite", 1, TTL)
                .await
                .unwrap(),
        );
    }
    let kinds: Vec<&str> = got.iter().map(|c| c.job.kind.as_str()).collect();
    assert_eq!(kinds, ["capped", "free"], "{got:?}");
    store.set_concurrency_cap("capped", None).await.unwrap();
}

/// A paused group's jobs stay ready and counted, other groups run; resumed, they run.
pub async fn a_paused_group_waits_and_resumes(store: Stores) {
    let paused = GroupLimits {
        paused: true,
        ..GroupLimits::default()
    };
    store.set_group_limits("a", paused).await.unwrap();
    store
        .enqueue(vec![grouped("a"), grouped("a"), grouped("a"), grouped("b")])
        .await
        .unwrap();
    let got = claim(&store, 10).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job.group.as_deref(), Some("b"));
    assert!(
        claim(&store, 10).await.is_empty(),
        "a paused group starts nothing"
    );
    let status = store.group("a").await.unwrap();
    assert_eq!(
        (status.ready, status.parked, status.limits),
        (3, true, paused)
    );
    assert_eq!(store.counts("default").await.unwrap().ready, 3);
    // A job enqueued while it is parked waits with it.
    store.enqueue(vec![grouped("a")]).await.unwrap();
    assert!(claim(&store, 10).await.is_empty());
    store
        .set_group_limits("a", GroupLimits::default())
        .await
        .unwrap();
    assert!(!store.group("a").await.unwrap().parked);
    assert_eq!(claim(&store, 10).await.len(), 4);
}

/// Jobs of one scope still run one at a time across groups; priority orders a group's jobs;
/// a cancelled ready job leaves its group's counts; a dead letter keeps its group and a retry
/// brings it back into it; the job view shows where a grouped job is.
pub async fn groups_keep_scopes_priorities_cancels_and_dead_letters(store: Stores) {
    let ids = store
        .enqueue(vec![
            grouped("a").with_scope("acct:1"),
            grouped("b").with_scope("acct:1"),
            grouped("c").with_priority(1),
            grouped("c").with_priority(5),
            grouped("c"),
        ])
        .await
        .unwrap();
    let view = store.job(ids[2]).await.unwrap().unwrap();
    assert_eq!(view.state, JobState::Ready);
    assert_eq!(view.job.group.as_deref(), Some("c"));
    assert_eq!(
        store.job(ids[1]).await.unwrap().unwrap().state,
        JobState::Waiting
    );
    let first = claim(&store, 10).await;
    let got: Vec<JobId> = first.iter().map(|c| c.job.id).collect();
    assert!(got.contains(&ids[0]) && !got.contains(&ids[1]), "{got:?}");
    // Group c's share of this claim: its highest priority first.
    let c: Vec<JobId> = first
        .iter()
        .filter(|c| c.job.group.as_deref() == Some("c"))
        .map(|c| c.job.id)
        .collect();
    assert_eq!(c.first(), Some(&ids[3]), "{c:?}");
    let left: Vec<JobId> = [ids[2], ids[4]]
        .into_iter()
        .filter(|id| !c.contains(id))
        .collect();
    for id in &left {
        assert_eq!(
            store.cancel(*id, "not wanted").await.unwrap(),
            Cancelled::Removed
        );
    }
    assert_eq!(store.group("c").await.unwrap().ready, 0);
    // The scope's head ends: the other group's job of the scope becomes ready and runs.
    let head = first.iter().find(|c| c.job.id == ids[0]).unwrap();
    settle(
        &store,
        head.lease.id,
        Settlement::Dead {
            reason: "no".into(),
        },
    )
    .await
    .unwrap();
    let next = claim(&store, 10).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].job.id, ids[1]);
    let dead = store.dead("default", 10).await.unwrap();
    let a = dead.iter().find(|d| d.job.id == ids[0]).unwrap();
    assert_eq!(a.job.group.as_deref(), Some("a"));
    settle_all(&store, &next).await;
    assert!(store.retry_dead_job("default", ids[0]).await.unwrap());
    assert_eq!(store.group("a").await.unwrap().ready, 1);
    let again = claim(&store, 10).await;
    assert_eq!(again.len(), 1);
    assert_eq!(
        (again[0].job.id, again[0].job.group.as_deref()),
        (ids[0], Some("a"))
    );
    // A debounce key held by a job of another group refuses the enqueue whole.
    let quiet = Duration::from_secs(60);
    store
        .enqueue(vec![grouped("a").with_debounce("d", quiet, quiet)])
        .await
        .unwrap();
    assert!(matches!(
        store
            .enqueue(vec![grouped("b").with_debounce("d", quiet, quiet)])
            .await,
        Err(Error::InvalidJob(_))
    ));
}

/// A careless caller: an empty group name, one with a control character (a tab would split
/// the keys built from it), one past the name limit, each as the one bad job of a good batch;
/// limits for such a name, a cap of 0, a rate of 0 jobs. Each is refused whole, typed, and
/// nothing is added or set.
pub async fn bad_group_names_and_limits_are_refused_whole(store: Stores) {
    let long = "g".repeat(MAX_NAME_BYTES + 1);
    for bad in ["", "a\tb", "line\nbreak", long.as_str()] {
        let batch = vec![grouped("fine"), grouped(bad), job("k")];
        assert!(
            matches!(store.enqueue(batch).await, Err(Error::InvalidJob(_))),
            "group {bad:?}"
        );
        assert!(
            store
                .set_group_limits(bad, GroupLimits::default())
                .await
                .is_err(),
            "limits for group {bad:?}"
        );
    }
    assert_eq!(store.counts("default").await.unwrap().pending(), 0);
    assert_eq!(store.group("fine").await.unwrap().ready, 0);
    for limits in [
        GroupLimits {
            cap: Some(0),
            ..GroupLimits::default()
        },
        GroupLimits {
            rate: Some(RateLimit {
                jobs: 0,
                per: Duration::from_secs(1),
            }),
            ..GroupLimits::default()
        },
    ] {
        assert!(matches!(
            store.set_group_limits("fine", limits).await,
            Err(Error::InvalidJob(_))
        ));
    }
    assert!(store.limited_groups(10).await.unwrap().is_empty());
}
