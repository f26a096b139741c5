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

/// The installation's layout generation (absent: 0), bumped by every [`move_layout`].
fn generation_key(prefix: &str) -> String {
    format!("{{{prefix}}}:generation")
}

/// Held by the one `move_layout` that may run for an installation at a time.
fn lock_key(prefix: &str) -> String {
    format!("{{{prefix}}}:moving")
}

/// Refuses to start a process with another number of partitions than the installation's
/// (which would let a scope be granted in two partitions at once): the first process records
/// its number, every later one must match it. An installation from before the record is
/// taken to have one partition. Returns the installation's layout generation, which the
/// process's stores must run ([`RedisLeaseStore::with_layout_generation`]) so that a later
/// [`move_layout`] refuses them instead of letting them act on a layout no longer in use.
pub async fn check_layout(
    target: impl Into<Target>,
    prefix: &str,
    partitions: usize,
) -> crate::Result<u64> {
    let target = target.into();
    let want = partitions.max(1).to_string();
    // SET NX, then GET: two commands rather than SET NX GET, which needs Redis 7.
    layout_command(&target, &layout_key(prefix), &["SET", &want, "NX"]).await?;
    let recorded = layout_command(&target, &layout_key(prefix), &["GET"])
        .await?
        .unwrap_or_default();
    if recorded != want {
        return Err(crate::Error::Config(format!(
            "the coordinator {prefix:?} runs in {recorded} partition(s), not {partitions}: start \
             with --partitions {recorded}, or move with `partitions --from {recorded} --to {partitions}`"
        )));
    }
    generation(&target, prefix).await
}

async fn generation(target: &Target, prefix: &str) -> crate::Result<u64> {
    let recorded = layout_command(target, &generation_key(prefix), &["GET"]).await?;
    recorded.map_or(Ok(0), |g| {
        g.parse().map_err(|_| {
            crate::Error::Backend(format!(
                "the layout generation record {} holds {g:?}, not a number",
                generation_key(prefix)
            ))
        })
    })
}

/// Records that the coordinator under `prefix` now has `partitions` partitions, without
/// moving anything (for an installation set up by hand; [`move_layout`] records its own).
pub async fn record_layout(
    target: impl Into<Target>,
    prefix: &str,
    partitions: usize,
) -> crate::Result<()> {
    let value = partitions.max(1).to_string();
    layout_command(&target.into(), &layout_key(prefix), &["SET", &value])
        .await
        .map(drop)
}

/// Moves the coordinator under `prefix` from `from` to `to` partitions
/// ([`migrate`](crate::store::partitioned::migrate): tokens never lower, control state
/// carried) and returns the epoch the new layout grants in. One run at a time per
/// installation (a second is refused while one holds the lock). Every base of the old and the
/// new layout is moved to the next layout generation *first*, so a process still running the
/// old layout — a worker that was paused looks exactly like a dead one — is refused from then
/// on (`PALISADE_LAYOUT`) and cannot claim, enqueue or fire a schedule tick in either layout;
/// if the move fails (the old layout still holds jobs), the bases go back to the old
/// generation. Processes started afterwards read the new generation in [`check_layout`].
pub async fn move_layout(
    target: impl Into<Target>,
    prefix: &str,
    from: usize,
    to: usize,
    configure: impl Fn(RedisLeaseStore) -> RedisLeaseStore,
) -> crate::Result<u32> {
    let target = target.into();
    let (from, to) = (from.max(1), to.max(1));
    if from == to {
        return Err(crate::Error::Config(format!(
            "the coordinator {prefix:?} already runs in {from} partition(s): nothing to move"
        )));
    }
    let token = uuid::Uuid::new_v4().to_string();
    let holder = format!("{token} pid {} since {}", std::process::id(), now_ms());
    // Held for at most ten minutes: a run that died must not block every later one.
    let taken = layout_command(
        &target,
        &lock_key(prefix),
        &["SET", &holder, "NX", "PX", "600000"],
    )
    .await?;
    if taken.is_none() {
        let other = layout_command(&target, &lock_key(prefix), &["GET"]).await?;
        return Err(crate::Error::Config(format!(
            "another `partitions` run is moving the coordinator {prefix:?} ({}); wait for it \
             to finish (its lock expires after 10 minutes)",
            other.unwrap_or_default()
        )));
    }
    let moved = move_locked(&target, prefix, from, to, configure).await;
    // Released only if still ours (compare and delete in one step).
    let release = deadpool_redis::redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end \
         return 0",
    );
    let link = connection::Link::new(target.clone());
    if let Ok(mut conn) = link.get().await {
        let _: Result<i64, _> = release
            .key(lock_key(prefix))
            .arg(&holder)
            .invoke_async(&mut conn)
            .await;
    }
    moved
}

async fn move_locked(
    target: &Target,
    prefix: &str,
    from: usize,
    to: usize,
    configure: impl Fn(RedisLeaseStore) -> RedisLeaseStore,
) -> crate::Result<u32> {
    let was = check_layout(target.clone(), prefix, from).await?;
    let next = was + 1;
    let mut bases = partition_prefixes(prefix, from);
    for base in partition_prefixes(prefix, to) {
        if !bases.contains(&base) {
            bases.push(base);
        }
    }
    let stamp = |generation: u64| {
        let bases = &bases;
        async move {
            for base in bases {
                let key = format!("{{{base}}}:layout");
                layout_command(target, &key, &["SET", &generation.to_string()]).await?;
            }
            Ok::<_, crate::Error>(())
        }
    };
    stamp(next).await?;
    let layout = |p: usize| {
        coordinator(
            target.clone(),
            prefix,
            p,
            crate::job::DEFAULT_MAX_PAYLOAD_BYTES,
            |s| configure(s).with_layout_generation(next),
        )
    };
    let moved = async {
        let (old, new) = (layout(from)?, layout(to)?);
        crate::store::partitioned::migrate(old.as_ref(), new.as_ref()).await
    }
    .await;
    let epoch = match moved {
        Ok(epoch) => epoch,
        Err(e) => {
            // Nothing moved: the old layout's processes may go on.
            stamp(was).await?;
            return Err(e);
        }
    };
    layout_command(target, &generation_key(prefix), &["SET", &next.to_string()]).await?;
    record_layout(target.clone(), prefix, to).await?;
    Ok(epoch)
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// `command` (its name, then the arguments after the key) on one of the layout records.
async fn layout_command(
    target: &Target,
    key: &str,
    command: &[&str],
) -> crate::Result<Option<String>> {
    let link = connection::Link::new(target.clone());
    let mut conn = link.get().await?;
    let mut cmd = deadpool_redis::redis::cmd(command[0]);
    cmd.arg(key).arg(&command[1..]);
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
