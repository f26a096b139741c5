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
/// unpartitioned layout, unchanged); otherwise `prefix-p<i>.<n>` for partition `i`, each its
/// own hash tag, where `n` is the smallest number that puts the partition's keys in the
/// `i`-th of `partitions` equal ranges of Redis Cluster slots. A cluster whose slots are
/// allocated evenly (as `redis-cli --cluster create` does) so gets the partitions spread
/// evenly over its masters, instead of by the luck of a hash. Every process computes the
/// same names.
pub fn partition_prefixes(prefix: &str, partitions: usize) -> Vec<String> {
    if partitions <= 1 {
        return vec![prefix.to_owned()];
    }
    let p = partitions as u32;
    (0..p)
        .map(|i| {
            let (lo, hi) = (i * 16384 / p, (i + 1) * 16384 / p);
            // (A prefix with braces of its own may fix the slot whatever `n` is: then the
            // search gives up and the partition keeps the plain name.)
            (0u32..1 << 20)
                .map(|n| format!("{prefix}-p{i}.{n}"))
                .find(|candidate| {
                    // The slot of the coordinator's keys, `{<prefix>}:...`, as Redis hashes it.
                    let slot = u32::from(connection::key_slot(&format!("{{{candidate}}}:")));
                    lo <= slot && slot < hi
                })
                .unwrap_or_else(|| format!("{prefix}-p{i}"))
        })
        .collect()
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

/// The key that records how many partitions the coordinator under `prefix` has: in the
/// unpartitioned layout's hash tag, where every layout finds it.
fn layout_key(prefix: &str) -> String {
    format!("{{{prefix}}}:partitions")
}

/// Refuses to start a process with another number of partitions than the installation's
/// (which would let a scope be granted in two partitions at once): the first process records
/// its number, every later one must match it. An installation from before the record is
/// taken to have one partition.
pub async fn check_layout(
    target: impl Into<Target>,
    prefix: &str,
    partitions: usize,
) -> crate::Result<()> {
    let target = target.into();
    let want = partitions.max(1).to_string();
    // SET NX, then GET: two commands rather than SET NX GET, which needs Redis 7.
    layout_command(&target, prefix, &["SET", &want, "NX"]).await?;
    let recorded = layout_command(&target, prefix, &["GET"])
        .await?
        .unwrap_or_default();
    if recorded != want {
        return Err(crate::Error::Config(format!(
            "the coordinator {prefix:?} runs in {recorded} partition(s), not {partitions}: start \
             with --partitions {recorded}, or move with `partitions --from {recorded} --to {partitions}`"
        )));
    }
    Ok(())
}

/// Records that the coordinator under `prefix` now has `partitions` partitions (after a
/// migration).
pub async fn record_layout(
    target: impl Into<Target>,
    prefix: &str,
    partitions: usize,
) -> crate::Result<()> {
    let value = partitions.max(1).to_string();
    layout_command(&target.into(), prefix, &["SET", &value])
        .await
        .map(drop)
}

/// `command` (its name, then the arguments after the key) on the layout record.
async fn layout_command(
    target: &Target,
    prefix: &str,
    command: &[&str],
) -> crate::Result<Option<String>> {
    let link = connection::Link::new(target.clone());
    let mut conn = link.get().await?;
    let mut cmd = deadpool_redis::redis::cmd(command[0]);
    cmd.arg(layout_key(prefix)).arg(&command[1..]);
    cmd.query_async(&mut conn).await.map_err(|e| link.broken(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_take_evenly_spaced_slots() {
        assert_eq!(partition_prefixes("app", 1), ["app"]);
        for p in [2, 3, 7, 256] {
            let prefixes = partition_prefixes("app", p);
            assert_eq!(prefixes.len(), p);
            for (i, prefix) in prefixes.iter().enumerate() {
                let slot = usize::from(connection::key_slot(&format!("{{{prefix}}}:x")));
                assert!(
                    i * 16384 / p <= slot && slot < (i + 1) * 16384 / p,
                    "{prefix}: {slot}"
                );
            }
        }
        // Braces in the prefix pin the slot: where the pinned slot is out of a partition's
        // range the search ends and the name stays plain.
        let pinned = partition_prefixes("a{b}c", 2);
        assert!(
            pinned.contains(&"a{b}c-p0".to_string()) || pinned.contains(&"a{b}c-p1".to_string())
        );
    }
}
