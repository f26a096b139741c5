//! The conformance suite against the in-memory backends.

mod suite;

use std::sync::Arc;

use palisade::{MemoryFencedStore, MemoryLeaseStore};

lease_store_suite!(async { Arc::new(MemoryLeaseStore::new()) });
fenced_store_suite!(async { Arc::new(MemoryFencedStore::new()) });
