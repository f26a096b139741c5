//! The conformance suite against the in-memory backends.

mod suite;

use std::sync::Arc;

use palisade::{MemoryFencedStore, MemoryLeaseStore};

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
