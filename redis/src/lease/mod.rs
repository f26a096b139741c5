//! The coordinator on Redis: one Lua script per operation (`redis/lua/`, each prefixed with
//! `common.lua`); for prefix `palisade` every key starts with the hash tag `{palisade}:`.
//!
//! This file holds the store and its hot path; `admin.rs` its read-only views and queue
//! controls, `control.rs` its clock, roles, schedules and records, `flows.rs` its flows.

mod admin;
mod control;
mod flows;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_redis::redis::{self, Script};
use tokio::time::Instant;

use super::connection::{garbage, parse, round_trip, Conn, Link, Target};
use super::scripts::{
    coordinator_script, decode_claim, decode_watermark, entry_token, script_count, token, Meta,
};
use crate::error::{Error, Result};
use crate::ids::{FencingToken, JobId, LeaseId, Scope};
use crate::job::{
    Claim, CompletedRetention, Enqueued, FollowUpRecord, FollowUps, NewJob, Settlement,
    DEFAULT_MAX_PAYLOAD_BYTES, MAX_DELAY,
};
use crate::store::epoch::EpochSource;
use crate::store::{
    promotions_per_claim, settle_then_claim, ClaimRequest, LeaseStore, Reaped,
    DEFAULT_DEAD_RETENTION, MAX_DEAD_RETENTION,
};

static ENQUEUE: LazyLock<Script> = coordinator_script!("enqueue.lua");
static CLAIM: LazyLock<Script> = coordinator_script!("claim.lua");
static RENEW: LazyLock<Script> = coordinator_script!("renew.lua");
static SETTLE: LazyLock<Script> = coordinator_script!("settle.lua");
static REAP: LazyLock<Script> = coordinator_script!("reap.lua");
/// The most records a follow-up sweep or a flow pass lists in one call when it meets records
/// this release cannot read and asks past them (each is listed again by every pass).
pub(crate) const MAX_UNREADABLE_PASSED: usize = 10_000;

/// Lists accepted completions' follow-up jobs kept at least ARGV[1] ms (by the Redis clock),
/// oldest first, at most ARGV[2]: KEYS[1] the base; returns parent id, jobs JSON ("" for a
/// record gone meanwhile), ... Read-only.
static FOLLOW_UPS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local t = redis.call('TIME') \
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
         local ids = redis.call('ZRANGEBYSCORE', KEYS[1] .. 'thens', '-inf', now - tonumber(ARGV[1]), \
           'LIMIT', 0, tonumber(ARGV[2])) \
         local out = {} \
         for _, id in ipairs(ids) do \
           out[#out + 1] = id \
           out[#out + 1] = redis.call('GET', KEYS[1] .. 'then:' .. id) or '' \
         end \
         return out",
    )
});
static ESTABLISH_EPOCH: LazyLock<Script> = coordinator_script!("establish_epoch.lua");
/// Raises the epoch floor to ARGV[1] and, if the epoch in force is lower, moves to it with a
/// fresh counter (as a fenced settlement's reseed does): KEYS[1] the epoch hash, KEYS[2] the
/// counter; returns the epoch in force, or the floor when there is no epoch yet. Reads and
/// checks before it writes; a record of the wrong type fails before any change.
static RAISE_EPOCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local e = redis.call('HMGET', KEYS[1], 'epoch', 'floor') \
         local floor = tonumber(ARGV[1]) \
         local cur = tonumber(e[1] or '') \
         if tonumber(e[2] or '') == nil or tonumber(e[2]) < floor then \
           redis.call('HSET', KEYS[1], 'floor', floor) end \
         if cur == nil then return tostring(floor) end \
         if cur < floor then \
           redis.call('HSET', KEYS[1], 'epoch', floor) \
           redis.call('SET', KEYS[2], 0) \
           cur = floor end \
         return tostring(cur)",
    )
});

/// The coordinator on Redis. For prefix `palisade` every key starts with `{palisade}:` — one
/// Redis Cluster hash tag, so each script touches one slot.
#[derive(Clone)]
pub struct RedisLeaseStore {
    link: Link,
    base: String,
    epochs: Option<Arc<dyn EpochSource>>,
    max_payload_bytes: usize,
    dead_retention: usize,
    completed_retention: CompletedRetention,
    /// The low watermark from the latest settle reply (0 before any).
    watermark: Arc<AtomicU64>,
    /// Replicas every enqueue waits for, and how long; and the connection that waits (WAIT
    /// blocks its connection, which must not hold up the claims and renewals on `link`).
    durable: Option<(usize, Duration, Link)>,
    /// The layout generation this process runs (`common.lua`, `wrong_layout`): every script
    /// that acts is refused on a base that has moved to another one.
    generation: u64,
}

impl RedisLeaseStore {
    async fn put_note(&self, what: &str, job: JobId, json: String, ttl: Duration) -> Result<()> {
        let mut conn = self.conn().await?;
        redis::cmd("SET")
            .arg(format!("{}{what}:{job}", self.base))
            .arg(json)
            .arg("PX")
            .arg(ttl.as_millis().clamp(1, MAX_DELAY.as_millis()) as u64)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    async fn note(&self, what: &str, job: JobId) -> Result<Option<String>> {
        let mut conn = self.conn().await?;
        redis::cmd("GET")
            .arg(format!("{}{what}:{job}", self.base))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    /// A coordinator whose keys start with `{<prefix>}:` (the braces are literal: a hash tag),
    /// on one Redis server (a [`Pool`](super::Pool)) or a Redis [`Cluster`](super::Cluster),
    /// where all of them live in the one slot of that tag.
    pub fn new(target: impl Into<Target>, prefix: &str) -> Self {
        Self {
            link: Link::new(target.into()),
            base: format!("{{{prefix}}}:"),
            epochs: None,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            dead_retention: DEFAULT_DEAD_RETENTION,
            completed_retention: CompletedRetention::default(),
            watermark: Arc::default(),
            durable: None,
            generation: 0,
        }
    }

    /// Runs layout generation `generation` of the installation (what
    /// [`check_layout`](super::check_layout) returned): once `palisade partitions` moves the
    /// installation on, every claim, enqueue, renewal, settlement, reap, cancel, retry, role
    /// and schedule mark of this store is refused (`Error::Layout`, saying so) instead of
    /// acting on a layout that is no longer the installation's. 0 (the default) is an
    /// installation that never moved.
    pub fn with_layout_generation(mut self, generation: u64) -> Self {
        self.generation = generation;
        self
    }

    /// Makes every enqueue wait (Redis `WAIT`) until `replicas` replicas of the coordinator's
    /// primary hold the new jobs, for at most `timeout`. Replication is asynchronous: without
    /// this, jobs enqueued in the last moments before a primary dies may be missing from the
    /// replica that takes over. If fewer replicas confirm in time, enqueue fails with
    /// [`Error::OutcomeUnknown`] — the jobs are on the primary and may or may not survive
    /// its failure (enqueue again with a unique key to make the retry safe). `WAIT` narrows
    /// the window; it does not make Redis strongly consistent (a failover can still pick a
    /// replica that had not confirmed).
    pub fn with_durable_enqueue(mut self, replicas: usize, timeout: Duration) -> Self {
        self.durable = (replicas > 0).then(|| {
            let own = Link::dedicated(self.link.target().clone());
            (replicas, timeout.max(Duration::from_millis(1)), own)
        });
        self
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

    /// Keeps at most `max` (clamped to 1..=[`MAX_DEAD_RETENTION`]) dead-lettered jobs per
    /// queue; the oldest go first.
    pub fn with_dead_retention(mut self, max: usize) -> Self {
        self.dead_retention = max.clamp(1, MAX_DEAD_RETENTION);
        self
    }

    /// Keeps completed jobs to be looked up by id ([`Inspect::completed`](crate::store::Inspect::completed)) as `retention`
    /// says (by default a day's, at most 10,000; [`CompletedRetention::off`] deletes each
    /// record at completion). Each worker's settlements apply its own: give every worker the
    /// same. A kept record costs its job's size in Redis memory for that long.
    pub fn with_completed_retention(mut self, retention: CompletedRetention) -> Self {
        self.completed_retention = retention.clamped();
        self
    }

    async fn conn(&self) -> Result<Conn> {
        self.link.get().await
    }

    /// `claim.lua`'s call for `request`, with a fresh lease id per job asked for; `None`
    /// when it asks for nothing. A worker name the lease entry cannot hold is refused.
    fn claim_invocation(
        &self,
        request: &ClaimRequest,
    ) -> Result<Option<redis::ScriptInvocation<'static>>> {
        // The worker name is stored in each lease entry, fields split by tabs.
        crate::job::check_name("worker name", &request.worker)
            .map_err(|e| Error::Config(e.to_string()))?;
        if request.n == 0 {
            return Ok(None);
        }
        // Each kind once: the script reads a kind's ready set per name given, and a name
        // given twice would put a claimed job aside as well (memory filters by kind, so never).
        let mut kinds = request.kinds.clone();
        kinds.sort_unstable();
        kinds.dedup();
        let leases: Vec<String> = (0..request.n).map(|_| LeaseId::new().to_string()).collect();
        let mut invocation = CLAIM.key(&self.base);
        invocation
            .arg(&request.queue)
            .arg(&request.worker)
            .arg(request.ttl.as_millis() as u64)
            .arg(promotions_per_claim(request.n))
            .arg(kinds.len())
            .arg(&kinds)
            .arg(&leases)
            .arg(self.generation);
        Ok(Some(invocation))
    }

    /// `settle.lua`'s call for `settlements`.
    fn settle_invocation(
        &self,
        settlements: &[(LeaseId, Settlement)],
    ) -> redis::ScriptInvocation<'static> {
        let mut invocation = SETTLE.key(&self.base);
        let kept = self.completed_retention;
        invocation
            .arg(settlements.len())
            .arg(self.dead_retention)
            .arg(kept.keep.as_millis() as u64)
            .arg(kept.max);
        for (lease, settlement) in settlements {
            // A completion's follow-up jobs and flows, kept with it until enqueued, and the
            // steps it adds to its flow, kept with its step's end ("": none).
            let encode = |what: &str, json: serde_json::Result<String>| {
                json.unwrap_or_else(|e| {
                    // (Strings and numbers only: not expected.)
                    tracing::error!(error = %e, "{what} do not encode; dropped");
                    String::new()
                })
            };
            let (then, added) = match settlement {
                Settlement::Complete { then, .. } => (
                    encode(
                        "follow-up jobs",
                        FollowUpRecord::encode(&then.jobs, &then.flows),
                    ),
                    if then.steps.is_empty() {
                        String::new()
                    } else {
                        encode("added flow steps", serde_json::to_string(&then.steps))
                    },
                ),
                _ => (String::new(), String::new()),
            };
            let (action, arg, reason) = match settlement {
                // The result is kept with the completion, for RESULT_RETENTION (arg, ms; 0:
                // no result).
                Settlement::Complete { result, .. } => match result {
                    Some(json) => (
                        "complete",
                        crate::job::RESULT_RETENTION.as_millis() as u64,
                        json.as_str(),
                    ),
                    None => ("complete", 0u64, ""),
                },
                Settlement::Retry { delay, reason } => (
                    "retry",
                    delay.min(&MAX_DELAY).as_millis() as u64,
                    reason.as_str(),
                ),
                Settlement::Dead { reason } => ("dead", 0, reason.as_str()),
                Settlement::Release => ("release", 0, ""),
                Settlement::Snooze { delay } => {
                    ("snooze", delay.min(&MAX_DELAY).as_millis() as u64, "")
                }
                Settlement::Fenced { highest, reason } => {
                    ("fenced", u64::from(highest.epoch()), reason.as_str())
                }
            };
            invocation
                .arg(lease.to_string())
                .arg(action)
                .arg(arg)
                .arg(reason)
                .arg(then)
                .arg(added);
        }
        invocation.arg(self.generation);
        invocation
    }

    /// Reads `settle.lua`'s reply to `settlements`: one result each, then the watermark.
    async fn settle_results(
        &self,
        settlements: &[(LeaseId, Settlement)],
        mut results: Vec<String>,
    ) -> Result<Vec<Result<()>>> {
        if let Some(w) = results.pop() {
            if let Some(w) = decode_watermark(&w)? {
                self.watermark.fetch_max(w.as_u64(), Ordering::Relaxed);
            }
        }
        if results.len() != settlements.len() {
            return Err(garbage(format_args!(
                "{} settle results for {} settlements",
                results.len(),
                settlements.len()
            )));
        }
        let mut out = Vec::with_capacity(results.len());
        for ((lease, _), result) in settlements.iter().zip(results) {
            if result == "stale" {
                out.push(Err(Error::LeaseNotCurrent(*lease)));
                continue;
            }
            if result == "invalid" {
                out.push(Err(garbage(format_args!(
                    "lease {lease}: the settle script refused the settlement's arguments"
                ))));
                continue;
            }
            if let Some(why) = result.strip_prefix("corrupt:") {
                // Another program wrote over a key this settlement needs: it alone changed
                // nothing; the lease stays, and the reaper retries it once the key is repaired.
                out.push(Err(Error::Backend(format!(
                    "lease {lease}: PALISADE_CORRUPT {why}: nothing was changed"
                ))));
                continue;
            }
            if result == "exhausted" {
                out.push(Err(Error::Epoch(format!(
                    "lease {lease}: a sink holds a token in the largest epoch; none left above it"
                ))));
                continue;
            }
            if let Some(epoch) = result.strip_prefix("reseeded:") {
                self.record_reseed(parse(epoch)?).await;
            }
            out.push(Ok(()));
        }
        Ok(out)
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
                let at_least = epoch.unwrap_or(0).max(floor.unwrap_or(0)).saturating_add(1);
                source.next_epoch(at_least).await?
            }
            None => 0,
        };
        let (epoch, moved, fresh): (String, String, String) = ESTABLISH_EPOCH
            .key(&self.base)
            .arg(candidate)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| match e.code() {
                Some("PALISADE_EPOCH_EXHAUSTED") => Error::Epoch(format!(
                    "coordinator {}: no epoch left below {}",
                    self.base,
                    FencingToken::MAX_EPOCH
                )),
                _ => self.link.broken(e),
            })?;
        let epoch: u32 = parse(&epoch)?;
        if moved == "1" && fresh == "1" {
            // The normal first start on an empty Redis (or a Redis that lost everything,
            // which the sinks' fences cover).
            tracing::info!(
                epoch,
                durable = self.epochs.is_some(),
                "token counters initialised (no epoch record found)"
            );
        } else if moved == "1" {
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

#[async_trait]
impl LeaseStore for RedisLeaseStore {
    async fn enqueue_all(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        crate::job::validate_batch(&jobs, self.max_payload_bytes)?;
        let ids: Vec<JobId> = jobs
            .iter()
            .map(|j| j.id.unwrap_or_else(JobId::new))
            .collect();
        let mut invocation = ENQUEUE.key(&self.base);
        invocation.arg(jobs.len());
        for (id, mut job) in ids.iter().zip(jobs) {
            // (Before the keys are taken out.)
            let fingerprint = job.key_fingerprint();
            let id_ttl = job.id_key_ttl().map_or(0, |t| t.as_millis() as u64);
            let (unique, debounce) = (job.unique.take(), job.debounce.take());
            // A debounced job waits its quiet period as its delay (it takes no other).
            let delay = debounce.as_ref().map_or(job.delay, |d| d.quiet);
            let meta = Meta::of(job);
            let (encoded, scope) = meta.encoded()?;
            let (unique_key, unique_ttl) =
                unique.map_or((String::new(), 0), |u| (u.key, u.ttl.as_millis() as u64));
            invocation
                .arg(id.to_string())
                .arg(&meta.queue)
                .arg(&meta.kind)
                .arg(scope)
                .arg(meta.priority)
                .arg(delay.as_millis() as u64)
                .arg(encoded)
                .arg(unique_key)
                .arg(unique_ttl);
            // A debounced job waits its quiet period like a delay.
            match debounce {
                Some(d) => invocation
                    .arg(d.key)
                    .arg(d.quiet.as_millis() as u64)
                    .arg(d.max_wait.as_millis() as u64),
                None => invocation.arg("").arg(0).arg(0),
            };
            invocation
                .arg(meta.group.as_deref().unwrap_or(""))
                .arg(fingerprint.as_deref().unwrap_or(""))
                .arg(id_ttl);
        }
        invocation.arg(self.generation);
        round_trip("enqueue");
        let link = self.durable.as_ref().map_or(&self.link, |(_, _, own)| own);
        let mut conn = link.get().await?;
        let used: Vec<String> =
            invocation
                .invoke_async(&mut conn)
                .await
                .map_err(|e| match e.code() {
                    Some("PALISADE_INVALID") => {
                        Error::InvalidJob(e.detail().unwrap_or_default().to_owned())
                    }
                    Some("PALISADE_CONFLICT") => {
                        Error::Conflict(e.detail().unwrap_or_default().to_owned())
                    }
                    _ => link.broken(e),
                })?;
        if let Some((replicas, timeout, _)) = &self.durable {
            let (replicas, timeout) = (*replicas, *timeout);
            round_trip("wait");
            let confirmed = conn
                .wait_replicas(&self.base, replicas, timeout)
                .await
                .map_err(|e| link.broken(e))?;
            if confirmed < replicas {
                return Err(Error::OutcomeUnknown(format!(
                    "{} job(s) enqueued on the primary, but {confirmed} of {replicas} replica(s) \
                     confirmed them within {timeout:?}: they are lost if the primary fails now",
                    used.len()
                )));
            }
        }
        if used.len() != ids.len() {
            return Err(garbage(format_args!(
                "enqueue answered {} ids for {} jobs",
                used.len(),
                ids.len()
            )));
        }
        ids.into_iter()
            .zip(used)
            .map(
                |(id, used)| match (used.strip_prefix('='), used.strip_prefix('~')) {
                    (Some(holder), _) => Ok(Enqueued::Existing(JobId::from(parse::<uuid::Uuid>(
                        holder,
                    )?))),
                    (_, Some(holder)) => Ok(Enqueued::Debounced(JobId::from(parse::<uuid::Uuid>(
                        holder,
                    )?))),
                    _ if used == id.to_string() => Ok(Enqueued::Added(id)),
                    _ => Err(garbage(format_args!(
                        "enqueue answered {used} for job {id}"
                    ))),
                },
            )
            .collect()
    }

    async fn claim_kinds(
        &self,
        queue: &str,
        kinds: &[String],
        worker: &str,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Claim>> {
        let request = ClaimRequest {
            queue: queue.to_owned(),
            kinds: kinds.to_vec(),
            worker: worker.to_owned(),
            n,
            ttl,
        };
        // A lost epoch is established once and the claim retried; a second failure in a row
        // means something keeps wiping Redis, which the caller hears about.
        for _ in 0..2 {
            let Some(invocation) = self.claim_invocation(&request)? else {
                return Ok(Vec::new());
            };
            let sent = Instant::now();
            round_trip("claim");
            let mut conn = self.conn().await?;
            match invocation.invoke_async(&mut conn).await {
                Ok(rows) => return decode_claims(rows, &request, sent),
                Err(e) if e.code() == Some("PALISADE_EPOCH") => {
                    drop(conn);
                    self.establish_epoch().await?;
                }
                Err(e) => return Err(self.link.broken(e)),
            }
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
        invocation.arg(self.generation);
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
        let invocation = self.settle_invocation(&settlements);
        round_trip("settle");
        let mut conn = self.conn().await?;
        let results: Vec<String> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        drop(conn);
        self.settle_results(&settlements, results).await
    }

    /// Both scripts in one pipeline: one round trip. Each runs atomically on its own, in
    /// order, so the claim sees the scopes the settlements freed. A script Redis does not
    /// hold yet (a restart, `SCRIPT FLUSH`) or a claim that must establish an epoch first
    /// changed nothing, and that part is done again by its own call.
    async fn settle_and_claim(
        &self,
        settlements: Vec<(LeaseId, Settlement)>,
        claim: &ClaimRequest,
    ) -> (Result<Vec<Result<()>>>, Result<Vec<Claim>>) {
        let claim_call = match self.claim_invocation(claim) {
            Ok(Some(invocation)) if !settlements.is_empty() => invocation,
            _ => return settle_then_claim(self, settlements, claim).await,
        };
        let settle_call = self.settle_invocation(&settlements);
        let sent = Instant::now();
        round_trip("settle_and_claim");
        let reply = match self.conn().await {
            Ok(mut conn) => redis::pipe()
                .ignore_errors()
                .invoke_script(&settle_call)
                .invoke_script(&claim_call)
                .query_async::<(
                    redis::RedisResult<Vec<String>>,
                    redis::RedisResult<Vec<Vec<String>>>,
                )>(&mut conn)
                .await
                .map_err(|e| self.link.broken(e)),
            Err(e) => Err(e),
        };
        let (settled, claimed) = match reply {
            Ok(parts) => parts,
            Err(e) => {
                // The link failed: both parts failed alike (the claim's copy of the error
                // keeps its class, so the worker backs off both the same way).
                let twin = e.same_class();
                return (Err(e), Err(twin));
            }
        };
        let not_run = |e: &redis::RedisError| e.code() == Some("NOSCRIPT");
        let settled = match settled {
            Ok(results) => self.settle_results(&settlements, results).await,
            Err(e) if not_run(&e) => self.settle(settlements).await,
            Err(e) => Err(self.link.broken(e)),
        };
        let claimed = match claimed {
            Ok(rows) => decode_claims(rows, claim, sent),
            Err(e) if not_run(&e) || e.code() == Some("PALISADE_EPOCH") => claim.on(self).await,
            Err(e) => Err(self.link.broken(e)),
        };
        (settled, claimed)
    }

    fn watermark(&self) -> Option<FencingToken> {
        let w = self.watermark.load(Ordering::Relaxed);
        (w > 0).then(|| FencingToken::from_u64(w))
    }

    async fn follow_ups(&self, older_than: Duration, max: usize) -> Result<Vec<FollowUps>> {
        // A record this release cannot read (a later release's format during a rolling
        // deploy, or another program's write) stays where it is, for a process that reads it:
        // never delivered in part and forgotten. Every pass lists it again, so a pass that
        // meets some asks for as many more, and they never crowd out the sets it can deliver.
        let mut asked = max;
        loop {
            let mut conn = self.conn().await?;
            let flat: Vec<String> = FOLLOW_UPS
                .key(&self.base)
                .arg(older_than.as_millis().min(MAX_DELAY.as_millis()) as u64)
                .arg(script_count(asked))
                .invoke_async(&mut conn)
                .await
                .map_err(|e| self.link.broken(e))?;
            let mut sets = Vec::with_capacity(flat.len() / 2);
            let mut unreadable = 0usize;
            for pair in flat.chunks_exact(2) {
                // (A record gone since it was listed, delivered meanwhile, is "": an empty set.)
                let decoded = parse::<uuid::Uuid>(&pair[0])
                    .map_err(|e| e.to_string())
                    .and_then(|id| FollowUpRecord::decode(JobId::from(id), &pair[1]));
                match decoded {
                    Ok(set) => sets.push(set),
                    Err(why) => {
                        unreadable += 1;
                        crate::repeats::warn_repeated!(parent = %pair[0], %why, "a follow-up record this release cannot read; left in place for a process that can");
                    }
                }
            }
            let listed = flat.len() / 2;
            if unreadable == 0
                || sets.len() >= max
                || listed < asked
                || asked >= MAX_UNREADABLE_PASSED
            {
                metrics::counter!(crate::metrics::RECORDS_UNREADABLE, "kind" => "follow_ups")
                    .increment(unreadable as u64);
                sets.truncate(max);
                return Ok(sets);
            }
            // The next listing starts from the oldest again: room for the unreadable ones met.
            asked = (max + unreadable).min(MAX_UNREADABLE_PASSED);
        }
    }

    async fn forget_follow_ups(&self, parent: JobId) -> Result<()> {
        let mut conn = self.conn().await?;
        redis::pipe()
            .atomic()
            .cmd("DEL")
            .arg(format!("{}then:{parent}", self.base))
            .ignore()
            .cmd("ZREM")
            .arg(format!("{}thens", self.base))
            .arg(parent.to_string())
            .ignore()
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    async fn reap(&self, max: usize) -> Result<Vec<Reaped>> {
        round_trip("reap");
        let mut conn = self.conn().await?;
        let flat: Vec<String> = REAP
            .key(&self.base)
            .arg(script_count(max))
            .arg(self.dead_retention)
            .arg(self.generation)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        // The script has acted: a record it reaped whose ids another program wrote over is
        // left out of the answer (and said), never made to fail the others' report.
        Ok(flat
            .chunks_exact(7)
            .filter_map(|t| {
                let (Ok(job), Ok(lease)) = (parse::<uuid::Uuid>(&t[0]), parse::<uuid::Uuid>(&t[3]))
                else {
                    tracing::warn!(job = %t[0], lease = %t[3], "reaped a lease whose ids are no UUIDs (written by another program); not reported");
                    return None;
                };
                // The lease entry: "job id \t epoch \t counter \t claimed ms \t worker ...".
                let worker = t[4].split('\t').nth(4).unwrap_or_default().to_owned();
                Some(Reaped {
                    job: JobId::from(job),
                    queue: t[1].clone(),
                    dead: t[2] == "1",
                    lease: LeaseId::from(lease),
                    token: entry_token(&t[4]).and_then(Result::ok),
                    worker,
                    trace: crate::traceparent::TraceContext::stored(&t[5], Some(&t[6])),
                })
            })
            .collect())
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
            .arg(format!(
                "{}job:{}",
                self.base,
                scope.job().map(|id| id.to_string()).unwrap_or_default()
            ))
            .arg("lease")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        if let Some(last) = last {
            let (epoch, counter) = last
                .split_once(':')
                .ok_or_else(|| garbage(format_args!("bad token {last:?}")))?;
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
        entry.as_deref().and_then(entry_token).transpose()
    }

    async fn epoch(&self) -> Result<Option<u32>> {
        let mut conn = self.conn().await?;
        let epoch: Option<String> = redis::cmd("HGET")
            .arg(format!("{}epoch", self.base))
            .arg("epoch")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        epoch.map(|e| parse(&e)).transpose()
    }

    async fn raise_epoch(&self, at_least: u32) -> Result<u32> {
        if at_least > FencingToken::MAX_EPOCH {
            return Err(Error::Epoch(format!(
                "epoch {at_least} is above the largest, {}",
                FencingToken::MAX_EPOCH
            )));
        }
        let mut conn = self.conn().await?;
        let epoch: String = RAISE_EPOCH
            .key(format!("{}epoch", self.base))
            .key(format!("{}counter", self.base))
            .arg(at_least)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let epoch = parse(&epoch)?;
        if let Some(source) = &self.epochs {
            // A later recovery must start above it even if Redis loses this epoch too.
            source.next_epoch(epoch).await?;
        }
        Ok(epoch)
    }
}

/// Decodes `claim.lua`'s rows one by one: a corrupt job record must not take the good claims
/// of the same batch down with it (their leases were granted already). A row that does not
/// decode is logged and left to expire; the reaper dead-letters it.
fn decode_claims(
    rows: Vec<Vec<String>>,
    request: &ClaimRequest,
    sent: Instant,
) -> Result<Vec<Claim>> {
    let queue = request.queue.as_str();
    let mut claims = Vec::with_capacity(rows.len());
    let mut first_error = None;
    for r in rows {
        match decode_claim(r, queue, sent + request.ttl) {
            Ok(claim) => claims.push(claim),
            Err(e) => {
                tracing::error!(queue, error = %e, "claimed a job whose record does not decode; leaving it to the reaper");
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) if claims.is_empty() => Err(e),
        _ => Ok(claims),
    }
}
