//! The conformance suite against the in-memory backends.

mod suite;

use std::sync::Arc;

use palisade::store::partitioned::PartitionedLeaseStore;
use palisade::{LeaseStore, MemoryFencedStore, MemoryLeaseStore};

lease_store_suite!(async { Arc::new(MemoryLeaseStore::new()) });
fenced_store_suite!(async { Arc::new(MemoryFencedStore::new()) });

/// Issue 9: 100,000 default-scoped jobs with a sink write leave the memory sink holding only
/// the live scopes once the watermark has passed and the key retention is over.
#[tokio::test]
async fn sink_state_stays_bounded_by_live_scopes() {
    let retention = std::time::Duration::from_millis(300);
    let sink = MemoryFencedStore::new().with_key_retention(retention);
    suite::drive_default_scoped_writes(&sink, 100_000, retention).await;
    assert!(
        sink.scopes_held() <= 2,
        "{} scopes held",
        sink.scopes_held()
    );
}

lease_store_suite!(list);

fn three_partitions() -> (Arc<dyn LeaseStore>, Vec<Arc<dyn LeaseStore>>) {
    let parts: Vec<Arc<dyn LeaseStore>> = (0..3)
        .map(|_| Arc::new(MemoryLeaseStore::new()) as Arc<dyn LeaseStore>)
        .collect();
    let store = Arc::new(PartitionedLeaseStore::new(parts.clone()).unwrap());
    (store, parts)
}

/// The lease suite on a coordinator in three partitions (each a memory coordinator), but for
/// the cases partitions do not keep by design.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_holds_for_a_partitioned_coordinator() {
    let runs = lease_store_cases()
        .into_iter()
        .filter(|(name, _)| !suite::NOT_FOR_PARTITIONS.contains(name))
        .map(|(name, case)| (name.to_string(), case(three_partitions().0)))
        .collect();
    suite::run_together(runs, 8).await;
}

#[tokio::test]
async fn partitions_keep_each_scope_on_one_counter_and_share_the_work() {
    let (store, parts) = three_partitions();
    suite::partitions_keep_scopes_and_share_work(store, parts).await;
}

#[tokio::test]
async fn a_migration_to_partitions_never_lowers_a_scopes_tokens() {
    suite::migration_never_lowers_a_scopes_tokens(
        Arc::new(MemoryLeaseStore::new()),
        three_partitions().0,
        three_partitions().0,
    )
    .await;
}
