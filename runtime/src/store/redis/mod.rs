//! Redis backends: the coordinator many worker processes share, and a fenced sink.
//!
//! Every operation is one Lua script (`runtime/lua/`), loaded once and run by EVALSHA (redis-rs
//! reloads it on NOSCRIPT), so each is atomic and costs one round trip however many jobs or
//! leases it covers. Times are the Redis server's clock (`TIME`), so worker clocks never
//! decide whether a lease is current.

mod connection;
mod fenced;
mod lease;
mod scripts;

/// The connection pool [`pool`] returns, re-exported so users need no version-matched
/// `deadpool-redis` dependency of their own to name it.
pub use deadpool_redis::Pool;

pub use connection::{cluster, ping, pool, pool_with_ca, redacted, Cluster, Target};
pub use fenced::RedisFencedStore;
pub use lease::RedisLeaseStore;

/// The prefixes of a coordinator in `partitions` partitions: `prefix` itself for one (the
/// unpartitioned layout, unchanged), `prefix-p0`, `prefix-p1`, ... otherwise — each its own
/// hash tag, so on a Redis Cluster each partition is its own slot.
pub fn partition_prefixes(prefix: &str, partitions: usize) -> Vec<String> {
    match partitions {
        0 | 1 => vec![prefix.to_owned()],
        p => (0..p).map(|i| format!("{prefix}-p{i}")).collect(),
    }
}

/// The coordinator under `prefix` in `partitions` partitions on `target`: the plain
/// [`RedisLeaseStore`] for one, a [`PartitionedLeaseStore`] over one per
/// [`partition_prefixes`] otherwise. `configure` is applied to every partition (payload
/// limit, dead-letter retention, epoch source); `max_payload_bytes` must match it.
///
/// [`PartitionedLeaseStore`]: crate::store::partitioned::PartitionedLeaseStore
pub fn coordinator(
    target: impl Into<Target>,
    prefix: &str,
    partitions: usize,
    max_payload_bytes: usize,
    configure: impl Fn(RedisLeaseStore) -> RedisLeaseStore,
) -> crate::Result<std::sync::Arc<dyn crate::LeaseStore>> {
    let target = target.into();
    let mut parts: Vec<std::sync::Arc<dyn crate::LeaseStore>> =
        partition_prefixes(prefix, partitions)
            .iter()
            .map(|p| {
                let store = configure(
                    RedisLeaseStore::new(target.clone(), p)
                        .with_max_payload_bytes(max_payload_bytes),
                );
                std::sync::Arc::new(store) as std::sync::Arc<dyn crate::LeaseStore>
            })
            .collect();
    if parts.len() == 1 {
        return Ok(parts.remove(0));
    }
    Ok(std::sync::Arc::new(
        crate::store::partitioned::PartitionedLeaseStore::new(parts)?
            .with_max_payload_bytes(max_payload_bytes),
    ))
}
