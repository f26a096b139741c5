//! The conformance suite against the in-memory backends.

use std::sync::Arc;

use palisade::store::partitioned::PartitionedLeaseStore;
use palisade::{FencedStore, Inspect, LeaseStore, MemoryFencedStore, MemoryLeaseStore, Stores};
use palisade_testkit::{fenced_store_suite, lease_store_suite};

fn memory() -> Stores {
    Arc::new(MemoryLeaseStore::new()).into()
}

lease_store_suite!(async { (memory(), ()) });
fenced_store_suite!(async {
    (
        Arc::new(MemoryFencedStore::new()) as Arc<dyn FencedStore>,
        (),
    )
});

/// Issue 9: 100,000 default-scoped jobs with a sink write leave the memory sink holding only
/// the live scopes once the watermark has passed and the key retention is over.
#[tokio::test]
async fn sink_state_stays_bounded_by_live_scopes() {
    let retention = std::time::Duration::from_millis(300);
    let sink = MemoryFencedStore::new().with_key_retention(retention);
    palisade_testkit::suite::drive_default_scoped_writes(&sink, 100_000, retention).await;
    assert!(
        sink.scopes_held() <= 2,
        "{} scopes held",
        sink.scopes_held()
    );
}

lease_store_suite!(list);

fn three_partitions() -> (Stores, Vec<Stores>) {
    let parts: Vec<Stores> = (0..3).map(|_| memory()).collect();
    let store = PartitionedLeaseStore::new(parts.clone()).unwrap().into();
    (store, parts)
}

/// The lease suite on a coordinator in three partitions (each a memory coordinator), but for
/// the cases partitions do not keep by design.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_holds_for_a_partitioned_coordinator() {
    let runs = lease_store_cases()
        .into_iter()
        .filter(|(name, _)| !palisade_testkit::suite::NOT_FOR_PARTITIONS.contains(name))
        .map(|(name, case)| (name.to_string(), case(three_partitions().0)))
        .collect();
    palisade_testkit::suite::run_together(runs, 8).await;
}

#[tokio::test]
async fn partitions_keep_each_scope_on_one_counter_and_share_the_work() {
    let (store, parts) = three_partitions();
    palisade_testkit::suite::partitions_keep_scopes_and_share_work(store.clone(), parts).await;
    palisade_testkit::suite::the_pair_visits_every_partition(store, 3).await;
}

#[tokio::test]
async fn a_migration_to_partitions_never_lowers_a_scopes_tokens() {
    palisade_testkit::suite::migration_never_lowers_a_scopes_tokens(
        memory(),
        three_partitions().0,
        three_partitions().0,
    )
    .await;
}

/// Found by the attack review of issue 14: claims of one queue start at every partition in
/// turn, however the worker interleaves its queues. With one rotation for all queues, a
/// worker alternating queues `a` and `b` over 2 partitions started every claim of `a` at
/// partition 0, and `a`'s backlog in partition 1 waited while partition 0 had work.
#[tokio::test]
async fn every_partition_serves_a_queue_whatever_the_queue_rotation() {
    use palisade::NewJob;
    use std::time::Duration;
    let parts: Vec<Stores> = (0..2).map(|_| memory()).collect();
    let store = PartitionedLeaseStore::new(parts.clone()).unwrap();
    let jobs = (0..200)
        .map(|_| NewJob::raw("k", "null").with_queue("a"))
        .collect();
    store.enqueue(jobs).await.unwrap();
    for _ in 0..10 {
        for queue in ["a", "b"] {
            store
                .claim(queue, "w", 5, Duration::from_secs(30))
                .await
                .unwrap();
        }
    }
    let mut leased = Vec::new();
    for part in &parts {
        leased.push(part.counts("a").await.unwrap().leased);
    }
    assert_eq!(leased.iter().sum::<u64>(), 50);
    assert!(
        leased.iter().all(|&n| n >= 20),
        "each partition serves its share of a: {leased:?}"
    );
}
