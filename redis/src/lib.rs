//! Redis backends: the coordinator many worker processes share, and a fenced sink.
//!
//! Every operation is one Lua script (`redis/lua/`), loaded once and run by EVALSHA (redis-rs
//! reloads it on NOSCRIPT), so each is atomic and costs one round trip however many jobs or
//! leases it covers. Times are the Redis server's clock (`TIME`), so worker clocks never
//! decide whether a lease is current.

// The core's modules, so this crate's files name them as they did inside one crate.
pub(crate) use palisade_core::*;

mod connection;
mod fenced;
mod lease;
mod link;
mod scripts;
mod sentinel;

/// The connection pool [`pool`] returns, re-exported so users need no version-matched
/// `deadpool-redis` dependency of their own to name it.
pub use deadpool_redis::Pool;

pub use connection::{
    cluster, cluster_with_ca, ping, ping_until_ready, pool, pool_with_ca, redacted, Cluster, Target,
};
pub use fenced::RedisFencedStore;
pub use lease::RedisLeaseStore;
pub use sentinel::{sentinel, Sentinel};

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

/// The prefixes of the coordinator under `prefix` in layout generation `generation` with
/// `partitions` partitions: [`partition_prefixes`] of `prefix` itself in generation 0 (every
/// installation before its first move, unchanged), of `prefix-g<generation>` after that. So
/// every move goes to bases no earlier layout used: nothing stale is found there, no base is
/// shared by two layouts, and the old layout's keys stay as they were until it is retired.
pub fn layout_prefixes(prefix: &str, partitions: usize, generation: u64) -> Vec<String> {
    match generation {
        0 => partition_prefixes(prefix, partitions),
        g => partition_prefixes(&format!("{prefix}-g{g}"), partitions),
    }
}

/// The coordinator under `prefix` in `partitions` partitions and layout generation
/// `generation` (what [`check_layout`] returned; 0 for an installation never moved) on
/// `target`: the plain [`RedisLeaseStore`] for one, a [`PartitionedLeaseStore`] over one per
/// [`layout_prefixes`] otherwise, each running that generation
/// ([`RedisLeaseStore::with_layout_generation`]). `configure` is applied to every partition
/// (payload limit, dead-letter retention, epoch source); `max_payload_bytes` must match it.
///
/// [`PartitionedLeaseStore`]: crate::store::partitioned::PartitionedLeaseStore
pub fn coordinator(
    target: impl Into<Target>,
    prefix: &str,
    partitions: usize,
    generation: u64,
    max_payload_bytes: usize,
    configure: impl Fn(RedisLeaseStore) -> RedisLeaseStore,
) -> crate::Result<crate::store::Stores> {
    check_prefix(prefix)?;
    let target = target.into();
    let mut parts: Vec<crate::store::Stores> = layout_prefixes(prefix, partitions, generation)
        .iter()
        .map(|p| {
            let store = configure(
                RedisLeaseStore::new(target.clone(), p).with_max_payload_bytes(max_payload_bytes),
            )
            .with_layout_generation(generation);
            crate::store::Stores::from(std::sync::Arc::new(store))
        })
        .collect();
    if parts.len() == 1 {
        return Ok(parts.remove(0));
    }
    Ok(
        crate::store::partitioned::PartitionedLeaseStore::new(parts)?
            .with_max_payload_bytes(max_payload_bytes)
            .into(),
    )
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
/// process's coordinator must run ([`coordinator`]) so that a later [`move_layout`] refuses
/// it instead of letting it act on a layout no longer in use. Both records are read in one
/// `MGET` (and written in one `MSET`), so a process starting during a move gets the old pair
/// or the new one, never the old number with the new generation.
pub async fn check_layout(
    target: impl Into<Target>,
    prefix: &str,
    partitions: usize,
) -> crate::Result<u64> {
    check_prefix(prefix)?;
    let target = target.into();
    // A name the layouts derive from an installation that exists is that installation's
    // partition or generation: opened directly, it would be read and written around the
    // installation's own rules. (Checked against the records, so a prefix that only looks
    // derived — `acme-p1` with no `acme` — keeps working.)
    if let Some(base) = derived_from(prefix) {
        let (recorded, _) = records(&target, base).await?;
        if !recorded.is_empty() {
            return Err(crate::Error::Config(format!(
                "prefix {prefix:?} is a partition or layout generation of the installation \
                 {base:?}: use --prefix {base}"
            )));
        }
    }
    let want = partitions.max(1).to_string();
    // SET NX, then MGET: two commands rather than SET NX GET, which needs Redis 7.
    layout_command(&target, &layout_key(prefix), &["SET", &want, "NX"]).await?;
    let (recorded, generation) = records(&target, prefix).await?;
    if recorded != want {
        return Err(crate::Error::Config(format!(
            "the coordinator {prefix:?} runs in {recorded} partition(s), not {partitions}: start \
             with --partitions {recorded}, or move with `partitions --from {recorded} --to {partitions}`"
        )));
    }
    // Refused at start, as every script refuses later: a build that cannot read the level.
    let level = format_level(target, prefix, partitions, generation).await?;
    if !crate::format::LEVELS.contains(&level) {
        return Err(crate::Error::Config(format!(
            "PALISADE_FORMAT the coordinator {prefix:?} is at format level {level}; this binary \
             reads and writes levels {}..={}: run a release that reads it (`palisade upgrade plan`)",
            crate::format::LEVELS.start(),
            crate::format::LEVELS.end()
        )));
    }
    Ok(generation)
}

/// Where each base of a layout records the installation's format level (`common.lua`,
/// `wrong_format`).
fn format_key(base: &str) -> String {
    format!("{{{base}}}:format")
}

/// The format level of the coordinator under `prefix` in `partitions` partitions and layout
/// `generation` ([`crate::format`]): the highest recorded under its bases (a finalize that
/// died part-way has recorded the new level under some of them), [`FIRST`] where none is.
/// A record that is not a level is an error naming its key.
///
/// [`FIRST`]: crate::format::FIRST
pub async fn format_level(
    target: impl Into<Target>,
    prefix: &str,
    partitions: usize,
    generation: u64,
) -> crate::Result<u32> {
    let levels = recorded_levels(&target.into(), prefix, partitions, generation).await?;
    Ok(highest(&levels))
}

/// The highest of the levels recorded under a layout's bases ([`FIRST`] where none is).
///
/// [`FIRST`]: crate::format::FIRST
fn highest(levels: &[Option<u32>]) -> u32 {
    let at = |l: &Option<u32>| l.unwrap_or(crate::format::FIRST);
    levels.iter().map(at).max().unwrap_or(crate::format::FIRST)
}

/// The format level recorded under each of the layout's bases, in layout order (`None`: none).
async fn recorded_levels(
    target: &Target,
    prefix: &str,
    partitions: usize,
    generation: u64,
) -> crate::Result<Vec<Option<u32>>> {
    let mut levels = Vec::new();
    for base in layout_prefixes(prefix, partitions, generation) {
        let key = format_key(&base);
        let named = |why: String| crate::Error::Backend(format!("{key}: {why}"));
        let recorded = layout_command(target, &key, &["GET"])
            .await
            .map_err(|e| named(e.to_string()))?;
        let level = match recorded {
            None => None,
            Some(text) => Some(crate::format::parse_level(Some(&text)).map_err(named)?),
        };
        levels.push(level);
    }
    Ok(levels)
}

/// What an installation records of itself, read without changing anything (for `palisade
/// upgrade plan`, which must work where this build may not run).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Installation {
    /// Whether anything records it (its number of partitions): false for a prefix never used.
    pub exists: bool,
    /// Its number of partitions (1 if never recorded).
    pub partitions: usize,
    /// Its layout generation.
    pub generation: u64,
    /// The format level recorded under each base of its layout (`None`: none recorded).
    pub levels: Vec<Option<u32>>,
}

impl Installation {
    /// Its format level: the highest recorded under any base ([`crate::format::FIRST`] where
    /// none is).
    pub fn format(&self) -> u32 {
        highest(&self.levels)
    }

    /// Whether a level was ever recorded (by `palisade upgrade finalize`).
    pub fn recorded(&self) -> bool {
        self.levels.iter().any(Option::is_some)
    }

    /// The bases still below [`Installation::format`]: a finalize that did not finish (run it
    /// again); 0 when every base agrees.
    pub fn lagging(&self) -> usize {
        let top = self.format();
        let below = |l: &&Option<u32>| l.unwrap_or(crate::format::FIRST) < top;
        self.levels.iter().filter(below).count()
    }
}

/// Reads the installation under `prefix` ([`Installation`]), changing nothing.
pub async fn installation(target: impl Into<Target>, prefix: &str) -> crate::Result<Installation> {
    check_prefix(prefix)?;
    let target = target.into();
    let (recorded, generation) = records(&target, prefix).await?;
    let partitions = match recorded.as_str() {
        "" => 1,
        text => text
            .parse()
            .ok()
            .filter(|n| (1..=crate::store::partitioned::MAX_PARTITIONS).contains(n))
            .ok_or_else(|| {
                crate::Error::Backend(format!(
                    "the partitions record {} holds {text:?}, not a number of partitions \
                     (1..={})",
                    layout_key(prefix),
                    crate::store::partitioned::MAX_PARTITIONS
                ))
            })?,
    };
    let levels = recorded_levels(&target, prefix, partitions, generation).await?;
    Ok(Installation {
        exists: !recorded.is_empty(),
        partitions,
        generation,
        levels,
    })
}

/// Records `ARGV[2]` as the format level of one base: KEYS[1] its layout stamp, KEYS[2] its
/// level record, ARGV[1] the generation the caller read. Refused, changing nothing, when the
/// layout moved since (the stamp is another generation, or retired), when the base is at a
/// higher level (never lowered: a finalize that slept past its lock and woke after a later
/// one), or when the record is not a level (never written over).
static FINALIZE_BASE: std::sync::LazyLock<deadpool_redis::redis::Script> =
    std::sync::LazyLock::new(|| {
        deadpool_redis::redis::Script::new(
            "local stamp = redis.pcall('GET', KEYS[1]) \
             if stamp == false then stamp = '0' end \
             if stamp ~= ARGV[1] then \
               return redis.error_reply('PALISADE_LAYOUT the layout moved while finalizing (' \
                 .. KEYS[1] .. ' is no longer generation ' .. ARGV[1] .. '): run it again; \
                 nothing was changed there') end \
             local cur = redis.pcall('GET', KEYS[2]) \
             if cur ~= false then \
               if type(cur) ~= 'string' or not string.match(cur, '^%d+$') or #cur > 9 then \
                 return redis.error_reply('PALISADE_FORMAT ' .. KEYS[2] .. ' holds no level; \
                   nothing was changed') end \
               if tonumber(cur) > tonumber(ARGV[2]) then \
                 return redis.error_reply('PALISADE_FORMAT ' .. KEYS[2] .. ' is at level ' .. cur \
                   .. ', above ' .. ARGV[2] .. ': a level is never lowered') end \
             end \
             redis.call('SET', KEYS[2], ARGV[2]) \
             return 0",
        )
    });

/// What [`finalize_format`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finalized {
    /// The installation as it read it, before any change.
    pub before: Installation,
    /// The level now recorded under every base.
    pub level: u32,
}

/// Records format level `to` under every base of the coordinator under `prefix`, one run at a
/// time with layout moves (the same lock). Inside the lock it reads the installation and the
/// live workers' heartbeats and follows [`crate::format::decide_finalize`]: refused, changing
/// nothing, for a level this build does not know, below the installation's, or outside a live
/// worker's window, and for a prefix nothing records. Each base's level is written by a script
/// that refuses a base whose layout moved meanwhile or that is at a higher level. A run that
/// dies part-way is finished by running it again ([`Installation::lagging`] tells).
pub async fn finalize_format(
    target: impl Into<Target>,
    prefix: &str,
    to: u32,
) -> crate::Result<Finalized> {
    let target = target.into();
    let work = async {
        let before = installation(target.clone(), prefix).await?;
        if !before.exists {
            return Err(crate::Error::Config(format!(
                "nothing records an installation under the prefix {prefix:?}: check --prefix"
            )));
        }
        let store = coordinator(
            target.clone(),
            prefix,
            before.partitions,
            before.generation,
            crate::job::DEFAULT_MAX_PAYLOAD_BYTES,
            |s| s,
        )?;
        let live = crate::store::ControlStore::workers(&store).await?;
        crate::format::decide_finalize(before.format(), to, &live)
            .map_err(|refused| crate::Error::Config(refused.to_string()))?;
        let link = connection::Link::new(target.clone());
        let mut conn = link.get().await?;
        for base in layout_prefixes(prefix, before.partitions, before.generation) {
            FINALIZE_BASE
                .key(format!("{{{base}}}:layout"))
                .key(format_key(&base))
                .arg(before.generation)
                .arg(to)
                .invoke_async::<()>(&mut conn)
                .await
                .map_err(|e| link.broken(e))?;
        }
        Ok(Finalized { before, level: to })
    };
    locked(&target, prefix, "upgrade finalize", work).await
}

/// The recorded number of partitions (as stored) and layout generation, read together.
async fn records(target: &Target, prefix: &str) -> crate::Result<(String, u64)> {
    let link = connection::Link::new(target.clone());
    let mut conn = link.get().await?;
    let (partitions, generation): (Option<String>, Option<String>) =
        deadpool_redis::redis::cmd("MGET")
            .arg(layout_key(prefix))
            .arg(generation_key(prefix))
            .query_async(&mut conn)
            .await
            .map_err(|e| link.broken(e))?;
    let generation = match generation {
        None => 0,
        Some(g) => g.parse().map_err(|_| {
            crate::Error::Backend(format!(
                "the layout generation record {} holds {g:?}, not a number",
                generation_key(prefix)
            ))
        })?,
    };
    Ok((partitions.unwrap_or_default(), generation))
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
/// installation (a second is refused while one holds the lock). In order:
///
/// 1. refused while the old layout holds jobs or dead letters, before anything changes;
/// 2. the new layout lives in bases no layout used before ([`layout_prefixes`] of the next
///    generation), stamped with that generation; the old layout's bases are stamped retired,
///    so a process still running the old layout — a worker that was paused looks exactly like
///    a dead one — is refused from then on (`PALISADE_LAYOUT`) and can neither claim, enqueue
///    nor fire a schedule tick;
/// 3. the migration copies, only reading the old layout; if it fails, the old bases get their
///    generation back and nothing else changed there;
/// 4. the number of partitions and the generation are recorded together (`MSET`), so a
///    process starting at any moment gets the old pair or the new one ([`check_layout`]);
/// 5. the old layout forgets its control state
///    ([`retire`](crate::store::partitioned::retire)).
///
/// A run that dies part-way leaves the old layout whole and fenced; running the same move
/// again finishes it (its lock expires after a minute).
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
    locked(
        &target,
        prefix,
        "partitions",
        move_locked(&target, prefix, from, to, configure),
    )
    .await
}

/// Runs `work` holding the installation's layout lock, which one `partitions` move or
/// `upgrade finalize` holds at a time (a second is refused while one holds it): held for at
/// most a minute (either is a few dozen commands), so a run that died does not block the
/// rerun that finishes its work for long.
async fn locked<T>(
    target: &Target,
    prefix: &str,
    what: &str,
    work: impl std::future::Future<Output = crate::Result<T>>,
) -> crate::Result<T> {
    let token = uuid::Uuid::new_v4().to_string();
    let holder = format!(
        "{token} `{what}` pid {} since {}",
        std::process::id(),
        crate::store::unix_ms()
    );
    let taken = layout_command(
        target,
        &lock_key(prefix),
        &["SET", &holder, "NX", "PX", "60000"],
    )
    .await?;
    if taken.is_none() {
        let other = layout_command(target, &lock_key(prefix), &["GET"]).await?;
        return Err(crate::Error::Config(format!(
            "another `partitions` run is moving the coordinator {prefix:?}, or an `upgrade \
             finalize` runs ({}); wait for it to finish (its lock expires after a minute)",
            other.unwrap_or_default()
        )));
    }
    let done = work.await;
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
    done
}

async fn move_locked(
    target: &Target,
    prefix: &str,
    from: usize,
    to: usize,
    configure: impl Fn(RedisLeaseStore) -> RedisLeaseStore,
) -> crate::Result<u32> {
    let was = check_layout(target.clone(), prefix, from).await?;
    let next = was.checked_add(1).ok_or_else(|| {
        crate::Error::Config(format!(
            "the coordinator {prefix:?} has no layout generation left"
        ))
    })?;
    let layout = |p: usize, generation: u64| {
        coordinator(
            target.clone(),
            prefix,
            p,
            generation,
            crate::job::DEFAULT_MAX_PAYLOAD_BYTES,
            &configure,
        )
    };
    let (old, new) = (layout(from, was)?, layout(to, next)?);
    // Refused before anything changes while the old layout still has work: fencing its
    // processes out with a job in flight would refuse that job's settlement (the job would
    // run again) only for the move to be undone.
    crate::store::partitioned::check_drained(&old).await?;
    let stamp = |bases: Vec<String>, value: String| async move {
        for base in bases {
            let key = format!("{{{base}}}:layout");
            layout_command(target, &key, &["SET", &value]).await?;
        }
        Ok::<_, crate::Error>(())
    };
    let old_bases = layout_prefixes(prefix, from, was);
    // The new layout's bases are new (`layout_prefixes`): only processes of the next
    // generation may act there. The old ones are retired — a value no process holds — so a
    // process of the old generation, paused through all of this, is refused from now on.
    stamp(layout_prefixes(prefix, to, next), next.to_string()).await?;
    stamp(old_bases.clone(), format!("retired:{next}")).await?;
    // The new bases start at the installation's format level (a move never lowers it), read
    // once the old bases are retired: a finalize still writing them is refused from then on.
    let level = format_level(target.clone(), prefix, from, was).await?;
    for base in layout_prefixes(prefix, to, next) {
        layout_command(target, &format_key(&base), &["SET", &level.to_string()]).await?;
    }
    let epoch = match crate::store::partitioned::migrate(&old, &new).await {
        Ok(epoch) => epoch,
        Err(e) => {
            // Nothing moved for good (the old layout is only read until this point): its
            // processes may go on.
            stamp(old_bases, was.to_string()).await?;
            return Err(e);
        }
    };
    // Both records in one step: a process starting now gets the old pair (and is refused by
    // the retired bases) or the new one.
    let link = connection::Link::new(target.clone());
    let mut conn = link.get().await?;
    deadpool_redis::redis::cmd("MSET")
        .arg(layout_key(prefix))
        .arg(to.to_string())
        .arg(generation_key(prefix))
        .arg(next.to_string())
        .query_async::<()>(&mut conn)
        .await
        .map_err(|e| link.broken(e))?;
    // Only now, with the new layout recorded, the old one forgets its control state (a rerun
    // after a crash before this point finds it whole and moves it again).
    crate::store::partitioned::retire(&old).await;
    Ok(epoch)
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

/// The hash of where an installation's sinks live: sink name -> location.
fn sinks_key(prefix: &str) -> String {
    format!("{{{prefix}}}:sinks")
}

/// Records that sink `name` of the installation under `prefix` is the store `identity` (what
/// the store says it is: `RedisFencedStore::identity`, `PostgresSink::identity`), reached at
/// `location` (for people to read), unless one is recorded already: `None` when this
/// identity is (now or before), `Some("<identity> <location>")` of the record when another
/// is. Two workers with one sink in two places would keep two fences, each with its own
/// highest token: the caller refuses to start on `Some`.
pub async fn record_sink(
    target: impl Into<Target>,
    prefix: &str,
    name: &str,
    identity: &str,
    location: &str,
) -> crate::Result<Option<String>> {
    let target = target.into();
    let link = connection::Link::new(target.clone());
    let mut conn = link.get().await?;
    // (HSETNX then HGET: whichever worker was first, every one reads the same record.)
    let (_, recorded): (i64, Option<String>) = deadpool_redis::redis::pipe()
        .cmd("HSETNX")
        .arg(sinks_key(prefix))
        .arg(name)
        .arg(format!("{identity} {location}"))
        .cmd("HGET")
        .arg(sinks_key(prefix))
        .arg(name)
        .query_async(&mut conn)
        .await
        .map_err(|e| link.broken(e))?;
    // (Identities hold no space; the location, after the first, may.)
    let same = |recorded: &str| {
        recorded
            .strip_prefix(identity)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
    };
    Ok(recorded.filter(|recorded| !same(recorded)))
}

/// Every sink location the installation under `prefix` recorded, by name.
pub async fn sink_locations(
    target: impl Into<Target>,
    prefix: &str,
) -> crate::Result<Vec<(String, String)>> {
    let target = target.into();
    let link = connection::Link::new(target.clone());
    let mut conn = link.get().await?;
    let mut all: Vec<(String, String)> = deadpool_redis::redis::cmd("HGETALL")
        .arg(sinks_key(prefix))
        .query_async(&mut conn)
        .await
        .map_err(|e| link.broken(e))?;
    all.sort();
    Ok(all)
}

/// Forgets where sink `name` lives (to move it on purpose, every worker stopped): the next
/// worker to start records its own. `false` if none was recorded.
pub async fn forget_sink(
    target: impl Into<Target>,
    prefix: &str,
    name: &str,
) -> crate::Result<bool> {
    let target = target.into();
    let link = connection::Link::new(target.clone());
    let mut conn = link.get().await?;
    let removed: i64 = deadpool_redis::redis::cmd("HDEL")
        .arg(sinks_key(prefix))
        .arg(name)
        .query_async(&mut conn)
        .await
        .map_err(|e| link.broken(e))?;
    Ok(removed == 1)
}

/// An installation's prefix: a name by the usual rules (not empty, at most `MAX_NAME_BYTES`, no
/// control characters) and without braces (the coordinator puts its keys in `{<prefix>}`: a
/// brace of the prefix's own changes the hash tag, and puts every partition in one slot).
/// [`check_layout`] also refuses a name the layouts derive from an installation that exists.
pub fn check_prefix(prefix: &str) -> crate::Result<()> {
    let bad = |why: &str| crate::Error::Config(format!("prefix {prefix:?}: {why}"));
    crate::job::check_name("prefix", prefix).map_err(|e| bad(&e.to_string()))?;
    if prefix.contains(['{', '}']) {
        return Err(bad("no braces (the coordinator's hash tag is {<prefix>})"));
    }
    Ok(())
}

/// The installation `prefix` would be a derived name of — `<base>-p<i>.<n>` or `<base>-p<i>`
/// (a partition), `<base>-g<generation>` (a layout generation) — if it looks like one.
fn derived_from(prefix: &str) -> Option<&str> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (base, tail) = prefix.rsplit_once('-')?;
    let derived = tail.strip_prefix('g').is_some_and(digits)
        || tail.strip_prefix('p').is_some_and(|p| {
            let (i, n) = p.split_once('.').unwrap_or((p, "0"));
            digits(i) && digits(n)
        });
    // A generation's partitions are `<base>-g<g>-p<i>.<n>`: their installation is `<base>`.
    (derived && !base.is_empty()).then(|| derived_from(base).unwrap_or(base))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scripts refuse what the Rust side refuses: one window of format levels in both.
    #[test]
    fn the_scripts_and_the_build_read_one_window_of_format_levels() {
        let common = include_str!("../lua/common.lua");
        let declared = format!(
            "local FORMAT_LOWEST, FORMAT_HIGHEST = {}, {}\n",
            crate::format::LEVELS.start(),
            crate::format::LEVELS.end()
        );
        assert!(common.contains(&declared), "common.lua lacks {declared:?}");
    }

    #[test]
    fn prefixes_follow_the_name_rules() {
        for good in [
            "palisade",
            "c1",
            "team-a",
            "orders:eu",
            "acme-p1",
            "eu-g2",
            "v1.2",
        ] {
            assert!(check_prefix(good).is_ok(), "{good}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("{x}", "braces"),
            ("a}b", "braces"),
            ("a\nb", "control character"),
        ] {
            let err = check_prefix(bad).unwrap_err().to_string();
            assert!(err.contains(why) && !err.contains('\n'), "{bad:?}: {err}");
        }
        assert!(check_prefix(&"x".repeat(crate::job::MAX_NAME_BYTES + 1)).is_err());
    }

    #[test]
    fn every_derived_name_leads_back_to_its_installation() {
        for p in layout_prefixes("c1", 3, 2)
            .iter()
            .chain(&partition_prefixes("c1", 4))
        {
            assert_eq!(derived_from(p), Some("c1"), "{p}");
        }
        assert_eq!(derived_from("c1-g7"), Some("c1"));
        for plain in ["c1", "team-a", "x-page", "a-g", "-p1", "my-p"] {
            assert_eq!(derived_from(plain), None, "{plain}");
        }
    }

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
