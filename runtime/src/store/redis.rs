//! Redis backends: the coordinator many worker processes share, and a fenced sink.
//!
//! Every operation is one Lua script (`runtime/lua/`), loaded once and run by EVALSHA (redis-rs
//! reloads it on NOSCRIPT), so each is atomic and costs one round trip however many jobs or
//! leases it covers. Times are the Redis server's clock (`TIME`), so worker clocks never
//! decide whether a lease is current.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self, Script};
use deadpool_redis::{Manager, Pool, Runtime};
use serde::Deserialize;
use tokio::time::Instant;

use crate::admission::{Admission, Fence, Rejection};
use crate::error::{Error, Result};
use crate::ids::{FencingToken, JobId, Lease, LeaseId, Scope};
use crate::job::{Claim, DeadJob, Job, NewJob, QueueCounts, Settlement, DEFAULT_MAX_PAYLOAD_BYTES};
use crate::store::epoch::EpochSource;
use crate::store::{FencedStore, FencedWrite, LeaseInfo, LeaseStore, Reaped, Value};

macro_rules! coordinator_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../lua/common.lua"),
                include_str!(concat!("../../lua/", $file))
            ))
        })
    };
}

static ENQUEUE: LazyLock<Script> = coordinator_script!("enqueue.lua");
static CLAIM: LazyLock<Script> = coordinator_script!("claim.lua");
static RENEW: LazyLock<Script> = coordinator_script!("renew.lua");
static SETTLE: LazyLock<Script> = coordinator_script!("settle.lua");
static REAP: LazyLock<Script> = coordinator_script!("reap.lua");
static COUNTS: LazyLock<Script> = coordinator_script!("counts.lua");
static LEASES: LazyLock<Script> = coordinator_script!("leases.lua");
static RETRY_DEAD: LazyLock<Script> = coordinator_script!("retry_dead.lua");
static ESTABLISH_EPOCH: LazyLock<Script> = coordinator_script!("establish_epoch.lua");
static FENCED_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/fenced_write.lua")));

/// Priorities are folded into one sorted-set score with the enqueue order (see common.lua),
/// which keeps them exact in a double only within this range.
const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -4096..=4096;

/// `url` with any password replaced by `***`, for logs and error messages.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split_once(':').map_or("", |(user, _)| user);
            let shown = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                "***".into()
            };
            format!("{}{shown}{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// A connection pool for `url` (`redis://[user:password@]host[:port][/db]`, or `rediss://`
/// for TLS) whose operations fail within seconds when Redis is unreachable or stops answering,
/// instead of hanging. The URL is checked here; nothing connects until the first operation
/// (see [`ping`]).
pub fn pool(url: &str) -> Result<Pool> {
    pool_with_ca(url, None)
}

/// [`pool`], trusting the PEM certificate authority in `ca_file` for a `rediss://` URL
/// (otherwise the system's trust store is used).
pub fn pool_with_ca(url: &str, ca_file: Option<&std::path::Path>) -> Result<Pool> {
    let bad = |e: &dyn std::fmt::Display| {
        Error::Config(format!("invalid Redis URL {}: {e}", redacted(url)))
    };
    let mut info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| bad(&e))?;
    if url.starts_with("rediss://") {
        // One process-wide rustls provider; a second install attempt is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let root_cert = ca_file
            .map(|path| {
                std::fs::read(path)
                    .map_err(|e| Error::Config(format!("Redis CA file {}: {e}", path.display())))
            })
            .transpose()?;
        let certificates = redis::TlsCertificates {
            client_tls: None,
            root_cert,
        };
        info = redis::Client::build_with_tls(info, certificates)
            .map_err(|e| bad(&e))?
            .get_connection_info()
            .clone();
    } else if ca_file.is_some() {
        return Err(Error::Config(format!(
            "a CA file only applies to TLS (rediss://) URLs, not {}",
            redacted(url)
        )));
    }
    let limit = Duration::from_secs(5);
    let connection = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(limit))
        .set_response_timeout(Some(limit * 2));
    let manager = Manager::new_with_config(info, connection).map_err(|e| bad(&e))?;
    Pool::builder(manager)
        .max_size(64)
        .wait_timeout(Some(limit))
        .create_timeout(Some(limit))
        .recycle_timeout(Some(limit))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| Error::Config(format!("redis pool: {e}")))
}

/// One round trip, to turn "unreachable", "wrong password" and the like into an error at start.
pub async fn ping(pool: &Pool) -> Result<()> {
    let mut conn = pool.get().await.map_err(unavailable)?;
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .map(drop)
        .map_err(unavailable)
}

/// Counts one client round trip to Redis on a hot path (the throughput harness reports them
/// per job).
fn round_trip(op: &'static str) {
    metrics::counter!(crate::metrics::REDIS_ROUND_TRIPS, "op" => op).increment(1);
}

fn unavailable(e: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("redis: {e}"))
}

/// One multiplexed connection shared by all operations of a store. Concurrent requests are
/// pipelined over it, and no operation pays a pool checkout (deadpool pings Redis on every
/// checkout, which would double the round trips). A connection-level error drops it; the next
/// operation connects afresh through the pool.
#[derive(Clone)]
struct Link {
    pool: Pool,
    shared: Arc<std::sync::Mutex<Option<MultiplexedConnection>>>,
}

impl Link {
    fn new(pool: Pool) -> Self {
        Self {
            pool,
            shared: Arc::default(),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn get(&self) -> Result<MultiplexedConnection> {
        if let Some(conn) = self.slot().as_ref() {
            return Ok(conn.clone());
        }
        let conn = deadpool_redis::Connection::take(self.pool.get().await.map_err(unavailable)?);
        *self.slot() = Some(conn.clone());
        Ok(conn)
    }

    /// Maps a Redis error, forgetting the connection if the error says it is unusable.
    fn broken(&self, e: redis::RedisError) -> Error {
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_timeout()
            || e.is_connection_refusal()
        {
            *self.slot() = None;
        }
        unavailable(e)
    }
}

/// The coordinator on Redis. All keys live under one hash tag `{prefix}`.
#[derive(Clone)]
pub struct RedisLeaseStore {
    link: Link,
    base: String,
    epochs: Option<Arc<dyn EpochSource>>,
    max_payload_bytes: usize,
}

impl RedisLeaseStore {
    /// A coordinator whose keys start with `{prefix}:`.
    pub fn new(pool: Pool, prefix: &str) -> Self {
        Self {
            link: Link::new(pool),
            base: format!("{{{prefix}}}:"),
            epochs: None,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }

    /// Takes new epochs from a durable source, so recovery from a Redis data loss needs no
    /// rejected write to notice it.
    pub fn with_epoch_source(mut self, source: Arc<dyn EpochSource>) -> Self {
        self.epochs = Some(source);
        self
    }

    /// Caps encoded payload size at enqueue.
    pub fn with_max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    async fn conn(&self) -> Result<MultiplexedConnection> {
        self.link.get().await
    }

    /// Moves to a new epoch once the claim script found the counters unproven.
    async fn establish_epoch(&self) -> Result<u32> {
        round_trip("establish_epoch");
        let mut conn = self.conn().await?;
        let candidate = match &self.epochs {
            Some(source) => {
                let (epoch, floor): (Option<u32>, Option<u32>) = redis::cmd("HMGET")
                    .arg(format!("{}epoch", self.base))
                    .arg("epoch")
                    .arg("floor")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.link.broken(e))?;
                let at_least = epoch.unwrap_or(0).max(floor.unwrap_or(0)) + 1;
                source.next_epoch(at_least).await?
            }
            None => 0,
        };
        let (epoch, moved): (String, String) = ESTABLISH_EPOCH
            .key(&self.base)
            .arg(candidate)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let epoch: u32 = epoch.parse().map_err(unavailable)?;
        if moved == "1" {
            tracing::warn!(
                epoch,
                durable = self.epochs.is_some(),
                "token counters were not provably intact; moved to a new epoch"
            );
        }
        Ok(epoch)
    }

    /// A reseed moved the epoch: let the durable source know, so a later recovery starts
    /// above it even if Redis loses this epoch too.
    async fn record_reseed(&self, epoch: u32) {
        tracing::warn!(
            epoch,
            "a sink reported a newer token than a current lease: reseeded above it"
        );
        if let Some(source) = &self.epochs {
            if let Err(e) = source.next_epoch(epoch).await {
                tracing::error!(error = %e, epoch, "could not record the reseeded epoch durably");
            }
        }
    }
}

fn parse<T: std::str::FromStr>(s: &str) -> Result<T> {
    s.parse()
        .map_err(|_| Error::Unavailable(format!("redis: unexpected value {s:?}")))
}

#[async_trait]
impl LeaseStore for RedisLeaseStore {
    async fn enqueue(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>> {
        for job in &jobs {
            job.validate(self.max_payload_bytes)?;
            if !PRIORITY_RANGE.contains(&job.priority) {
                return Err(Error::InvalidJob(format!(
                    "priority {} is outside {PRIORITY_RANGE:?}",
                    job.priority
                )));
            }
        }
        let ids: Vec<JobId> = jobs.iter().map(|_| JobId::new()).collect();
        let mut invocation = ENQUEUE.key(&self.base);
        invocation.arg(jobs.len());
        for (id, job) in ids.iter().zip(jobs) {
            let meta = serde_json::to_string(&Meta {
                kind: job.kind,
                payload: job.payload,
                queue: job.queue.clone(),
                scope: job.scope.clone(),
                priority: job.priority,
                max_attempts: job.max_attempts,
                max_stalls: job.max_stalls,
            })
            .map_err(|e| Error::Payload(e.to_string()))?;
            // A job scoped to its own id stores no scope: no other job can share it.
            let shared = job
                .scope
                .map(|s| s.to_string())
                .filter(|s| *s != id.to_string());
            invocation
                .arg(id.to_string())
                .arg(job.queue)
                .arg(shared.unwrap_or_default())
                .arg(job.priority)
                .arg(job.delay.as_millis() as u64)
                .arg(meta);
        }
        round_trip("enqueue");
        let mut conn = self.conn().await?;
        let _: u64 = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(ids)
    }

    async fn claim(
        &self,
        queue: &str,
        worker: &str,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Claim>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        // A lost epoch is established once and the claim retried; a second failure in a row
        // means something keeps wiping Redis, which the caller hears about.
        for _ in 0..2 {
            let leases: Vec<String> = (0..n).map(|_| LeaseId::new().to_string()).collect();
            let mut invocation = CLAIM.key(&self.base);
            invocation
                .arg(queue)
                .arg(worker)
                .arg(ttl.as_millis() as u64)
                .arg(&leases);
            let sent = Instant::now();
            round_trip("claim");
            let mut conn = self.conn().await?;
            let rows: Vec<Vec<String>> = match invocation.invoke_async(&mut conn).await {
                Ok(rows) => rows,
                Err(e) if e.code() == Some("PALISADE_EPOCH") => {
                    drop(conn);
                    self.establish_epoch().await?;
                    continue;
                }
                Err(e) => return Err(self.link.broken(e)),
            };
            return rows
                .into_iter()
                .map(|r| {
                    let [id, lease, epoch, counter, meta, attempt, stalls] =
                        <[String; 7]>::try_from(r).map_err(|r| {
                            Error::Unavailable(format!("redis: bad claim row {r:?}"))
                        })?;
                    let meta: Meta = serde_json::from_str(&meta).map_err(unavailable)?;
                    let scope = meta.scope.unwrap_or_else(|| Scope::new(id.as_str()));
                    Ok(Claim {
                        job: Job {
                            id: JobId::from(parse::<uuid::Uuid>(&id)?),
                            queue: queue.to_owned(),
                            kind: meta.kind,
                            payload: meta.payload,
                            scope: scope.clone(),
                            attempt: parse(&attempt)?,
                            stalls: parse(&stalls)?,
                            max_attempts: meta.max_attempts,
                            max_stalls: meta.max_stalls,
                        },
                        lease: Lease {
                            id: LeaseId::from(parse::<uuid::Uuid>(&lease)?),
                            token: FencingToken::new(parse(&epoch)?, parse(&counter)?),
                            scope,
                            expires_at: sent + ttl,
                        },
                    })
                })
                .collect();
        }
        Err(Error::Unavailable(
            "redis: token counters vanished again right after a new epoch was established".into(),
        ))
    }

    async fn renew(&self, leases: &[LeaseId], ttl: Duration) -> Result<Vec<LeaseId>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = RENEW.key(&self.base);
        invocation.arg(ttl.as_millis() as u64);
        for lease in leases {
            invocation.arg(lease.to_string());
        }
        round_trip("renew");
        let mut conn = self.conn().await?;
        let lost: Vec<String> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        lost.iter()
            .map(|l| Ok(LeaseId::from(parse::<uuid::Uuid>(l)?)))
            .collect()
    }

    async fn settle(&self, settlements: Vec<(LeaseId, Settlement)>) -> Result<Vec<Result<()>>> {
        if settlements.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = SETTLE.key(&self.base);
        invocation.arg(settlements.len());
        for (lease, settlement) in &settlements {
            let (action, arg, reason) = match settlement {
                Settlement::Complete => ("complete", 0u64, ""),
                Settlement::Retry { delay, reason } => {
                    ("retry", delay.as_millis() as u64, reason.as_str())
                }
                Settlement::Dead { reason } => ("dead", 0, reason.as_str()),
                Settlement::Fenced { highest, reason } => {
                    ("fenced", u64::from(highest.epoch()), reason.as_str())
                }
            };
            invocation
                .arg(lease.to_string())
                .arg(action)
                .arg(arg)
                .arg(reason);
        }
        round_trip("settle");
        let mut conn = self.conn().await?;
        let results: Vec<String> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        drop(conn);
        let mut out = Vec::with_capacity(results.len());
        for ((lease, _), result) in settlements.iter().zip(results) {
            if result == "stale" {
                out.push(Err(Error::LeaseNotCurrent(*lease)));
                continue;
            }
            if let Some(epoch) = result.strip_prefix("reseeded:") {
                self.record_reseed(parse(epoch)?).await;
            }
            out.push(Ok(()));
        }
        Ok(out)
    }

    async fn reap(&self, max: usize) -> Result<Vec<Reaped>> {
        round_trip("reap");
        let mut conn = self.conn().await?;
        let flat: Vec<String> = REAP
            .key(&self.base)
            .arg(max)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        flat.chunks_exact(3)
            .map(|t| {
                Ok(Reaped {
                    job: JobId::from(parse::<uuid::Uuid>(&t[0])?),
                    queue: t[1].clone(),
                    dead: t[2] == "1",
                })
            })
            .collect()
    }

    async fn counts(&self, queue: &str) -> Result<QueueCounts> {
        let mut conn = self.conn().await?;
        let [ready, delayed, leased, completed, dead]: [u64; 5] = COUNTS
            .key(&self.base)
            .arg(queue)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(QueueCounts {
            ready,
            delayed,
            leased,
            completed,
            dead,
        })
    }

    async fn dead(&self, queue: &str, limit: usize) -> Result<Vec<DeadJob>> {
        #[derive(Deserialize)]
        struct Record {
            id: JobId,
            queue: String,
            kind: String,
            payload: String,
            scope: Scope,
            attempt: u32,
            stalls: u32,
            max_attempts: u32,
            max_stalls: u32,
            reason: String,
        }
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        let raw: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{}q:{queue}:dead", self.base))
            .arg(0)
            .arg(limit - 1)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        raw.iter()
            .map(|r| {
                let r: Record = serde_json::from_str(r).map_err(unavailable)?;
                Ok(DeadJob {
                    job: Job {
                        id: r.id,
                        queue: r.queue,
                        kind: r.kind,
                        payload: r.payload,
                        scope: r.scope,
                        attempt: r.attempt,
                        stalls: r.stalls,
                        max_attempts: r.max_attempts,
                        max_stalls: r.max_stalls,
                    },
                    reason: r.reason,
                })
            })
            .collect()
    }

    async fn highest_token(&self, scope: &Scope) -> Result<Option<FencingToken>> {
        // Shared scopes keep their newest token in `last`; a job's own scope only has one
        // while the job holds a lease.
        let mut conn = self.conn().await?;
        let (last, lease): (Option<String>, Option<String>) = redis::pipe()
            .cmd("HGET")
            .arg(format!("{}last", self.base))
            .arg(scope.as_str())
            .cmd("HGET")
            .arg(format!("{}job:{scope}", self.base))
            .arg("lease")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let token =
            |epoch: &str, counter: &str| Ok(FencingToken::new(parse(epoch)?, parse(counter)?));
        if let Some(last) = last {
            let (epoch, counter) = last
                .split_once(':')
                .ok_or_else(|| Error::Unavailable(format!("redis: bad token {last:?}")))?;
            return token(epoch, counter).map(Some);
        }
        let Some(lease) = lease else {
            return Ok(None);
        };
        let entry: Option<String> = redis::cmd("HGET")
            .arg(format!("{}lease_job", self.base))
            .arg(lease)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        match entry
            .as_deref()
            .map(|e| e.split('\t').collect::<Vec<_>>())
            .as_deref()
        {
            Some([_, epoch, counter, ..]) => token(epoch, counter).map(Some),
            _ => Ok(None),
        }
    }

    async fn queues(&self) -> Result<Vec<String>> {
        let mut conn = self.conn().await?;
        let mut queues: Vec<String> = redis::cmd("SMEMBERS")
            .arg(format!("{}queues", self.base))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        queues.sort();
        Ok(queues)
    }

    async fn leases(&self, limit: usize) -> Result<Vec<LeaseInfo>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        let rows: Vec<Vec<String>> = LEASES
            .key(&self.base)
            .arg(limit)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let millis = |s: &str| parse::<i64>(s).map(|ms| Duration::from_millis(ms.max(0) as u64));
        rows.into_iter()
            .map(|r| {
                let [lease, job, scope, epoch, counter, worker, age, expires_in] =
                    <[String; 8]>::try_from(r)
                        .map_err(|r| Error::Unavailable(format!("redis: bad lease row {r:?}")))?;
                Ok(LeaseInfo {
                    lease: LeaseId::from(parse::<uuid::Uuid>(&lease)?),
                    job: JobId::from(parse::<uuid::Uuid>(&job)?),
                    scope: Scope::new(scope),
                    token: FencingToken::new(parse(&epoch)?, parse(&counter)?),
                    worker,
                    age: millis(&age)?,
                    expires_in: millis(&expires_in)?,
                })
            })
            .collect()
    }

    async fn retry_dead(&self, queue: &str, limit: usize) -> Result<usize> {
        let mut conn = self.conn().await?;
        RETRY_DEAD
            .key(&self.base)
            .arg(queue)
            .arg(limit)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }
}

/// What the client writes into a job's `meta` field at enqueue and reads back at claim; the
/// scripts decode it only on rare paths (retry, stall, dead-letter).
#[derive(serde::Serialize, Deserialize)]
struct Meta {
    kind: String,
    payload: String,
    queue: String,
    scope: Option<Scope>,
    priority: i32,
    max_attempts: u32,
    max_stalls: u32,
}

/// A fenced sink on Redis: admission, mutation and idempotency record in one script.
///
/// Keys: `{prefix}:{<scope>}:fence` (a string "token TAB lease") and `:keys` per scope
/// (hash-tagged by scope), data under `{prefix}:d:<key>`. In Redis Cluster every data key a
/// write touches must hash to its scope's slot; on a single Redis (the tested setup) any key
/// works.
#[derive(Clone)]
pub struct RedisFencedStore {
    link: Link,
    prefix: String,
    retention: Duration,
    max_keys: usize,
}

impl RedisFencedStore {
    /// A sink whose keys start with `prefix:`; idempotency keys are kept 24 hours.
    pub fn new(pool: Pool, prefix: &str) -> Self {
        Self {
            link: Link::new(pool),
            prefix: prefix.to_owned(),
            retention: Duration::from_secs(24 * 3600),
            max_keys: 10_000,
        }
    }

    /// Bounds the idempotency record per scope: keys older than `retention`, and all but the
    /// newest `max_keys`, are forgotten (a same-token retry after that would apply again).
    /// Keys of older tokens are dropped at once: an older generation can never write again.
    pub fn with_key_retention(mut self, retention: Duration, max_keys: usize) -> Self {
        self.retention = retention;
        self.max_keys = max_keys.max(1);
        self
    }

    fn data_prefix(&self) -> String {
        format!("{}:d:", self.prefix)
    }

    fn fence_key(&self, scope: &Scope) -> String {
        format!("{}:{{{scope}}}:fence", self.prefix)
    }
}

/// Tokens travel as 20-digit zero-padded decimals: string order is numeric order, and Lua's
/// doubles never see them as numbers.
fn padded(token: FencingToken) -> String {
    format!("{:020}", token.as_u64())
}

#[async_trait]
impl FencedStore for RedisFencedStore {
    async fn write(&self, write: FencedWrite) -> Result<Admission> {
        self.write_batch(vec![write])
            .await?
            .pop()
            .unwrap_or_else(|| Err(Error::Unavailable("redis: empty reply".into())))
    }

    async fn write_batch(&self, writes: Vec<FencedWrite>) -> Result<Vec<Result<Admission>>> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = FENCED_WRITE.prepare_invoke();
        invocation
            .arg(self.retention.as_millis() as u64)
            .arg(self.max_keys)
            .arg(self.data_prefix());
        for write in &writes {
            let mutations = serde_json::to_string(&write.mutations)
                .map_err(|e| Error::Mutation(e.to_string()))?;
            invocation
                .key(self.fence_key(&write.scope))
                .key(format!("{}:{{{}}}:keys", self.prefix, write.scope))
                .arg(padded(write.fence.token))
                .arg(write.fence.lease.to_string())
                .arg(write.key.as_str())
                .arg(mutations);
        }
        round_trip("fenced_write");
        let mut conn = self.link.get().await?;
        let replies: Vec<Vec<String>> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let token = |s: &str| parse::<u64>(s).map(FencingToken::from_u64);
        let lease = |s: &str| parse::<uuid::Uuid>(s).map(LeaseId::from);
        Ok(writes
            .iter()
            .zip(replies)
            .map(|(write, reply)| {
                Ok(match reply.as_slice() {
                    [a] if a == "applied" => Admission::Applied,
                    [d] if d == "duplicate" => Admission::Duplicate,
                    [s, highest, _] if s == "stale" => Admission::Rejected(Rejection::StaleToken {
                        presented: write.fence.token,
                        highest: token(highest)?,
                    }),
                    [c, t, held_by] if c == "conflict" => {
                        Admission::Rejected(Rejection::TokenConflict {
                            token: token(t)?,
                            held_by: lease(held_by)?,
                            presented_by: write.fence.lease,
                        })
                    }
                    [m, why] if m == "mutation" => return Err(Error::Mutation(why.clone())),
                    other => {
                        return Err(Error::Unavailable(format!(
                            "redis: unexpected reply {other:?}"
                        )))
                    }
                })
            })
            .collect())
    }

    async fn read(&self, key: &str) -> Result<Option<Value>> {
        let key = format!("{}{key}", self.data_prefix());
        let mut conn = self.link.get().await?;
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(match kind.as_str() {
            "none" => None,
            "string" => Some(Value::Text(
                redis::cmd("GET")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.link.broken(e))?,
            )),
            "hash" => Some(Value::Hash(
                redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async::<BTreeMap<String, String>>(&mut conn)
                    .await
                    .map_err(|e| self.link.broken(e))?,
            )),
            other => return Err(Error::Unavailable(format!("redis: {key} is a {other}"))),
        })
    }

    async fn highest(&self, scope: &Scope) -> Result<Option<Fence>> {
        let mut conn = self.link.get().await?;
        let held: Option<String> = redis::cmd("GET")
            .arg(self.fence_key(scope))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let Some(held) = held else {
            return Ok(None);
        };
        let (token, lease) = held
            .split_once('\t')
            .ok_or_else(|| Error::Unavailable(format!("redis: bad fence {held:?}")))?;
        Ok(Some(Fence {
            token: FencingToken::from_u64(parse(token)?),
            lease: LeaseId::from(parse::<uuid::Uuid>(lease)?),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redacted("redis://:s3cret@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            redacted("redis://app:s3cret@host/1"),
            "redis://app:***@host/1"
        );
        assert_eq!(redacted("rediss://token@host"), "rediss://***@host");
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        let err = pool("redis://:s3cret@host:notaport")
            .err()
            .unwrap()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.contains("invalid Redis URL"), "{err}");
    }
}
