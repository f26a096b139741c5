//! What a producer enqueues ([`NewJob`] and its options), the limits every job is held to,
//! and what an enqueue answers ([`Enqueued`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory as _};

use crate::error::{Error, Result};
use crate::ids::{JobId, Scope};
use crate::traceparent::TraceContext;

/// Default cap on an encoded payload; big blobs belong in object storage, not in the queue.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// Longest kind, queue or scope name, in bytes: names end up in Redis keys and metric labels.
pub const MAX_NAME_BYTES: usize = 512;

/// Priorities are folded into one sorted-set score with the enqueue order in Redis, which
/// keeps them exact in a double only within this range; every backend enforces it.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -4096..=4096;

/// The kind of the job that clears an ended durable run's journals (`palisade::durable`):
/// the one job that may take a `job:<uuid>` scope, its run's own, named in its payload
/// (`{"job": <uuid>, ...}`), so its write is fenced with that run's.
pub const JOURNAL_CLEAR_KIND: &str = "palisade.journal.clear";

/// Longest delay (ten years): keeps every deadline exact in milliseconds on every backend.
pub const MAX_DELAY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How many times a job may snooze ([`JobError::snooze`](crate::job::JobError::snooze)) unless it says otherwise
/// ([`NewJob::with_max_snoozes`]): a handler that snoozes for ever is noticed — its job dies
/// with the count as its reason — instead of going round unseen.
pub const DEFAULT_MAX_SNOOZES: u32 = 100;

/// Attempts a job gets unless it sets its own ([`NewJob::with_max_attempts`]): with the
/// default [`RetryPolicy`](crate::policy::RetryPolicy), retries over about a day.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 20;

/// `d` in whole milliseconds, as every backend keeps it (Redis scripts count in ms): so a
/// duration means the same on memory and on Redis.
pub fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[doc(hidden)]
pub fn default_max_snoozes() -> u32 {
    DEFAULT_MAX_SNOOZES
}

/// Whether a record may leave `max_snoozes` out (the Redis job record does).
pub fn is_default_max_snoozes(n: &u32) -> bool {
    *n == DEFAULT_MAX_SNOOZES
}

/// How long past its due time a debounced job takes updates if no claim took it yet (a queue
/// paused that long): then its key is forgotten, and the next enqueue under it adds a job.
pub const DEBOUNCE_KEPT: Duration = Duration::from_secs(24 * 3600);

/// How long a job enqueued with [`NewJob::with_id`] keeps its id taken, counted from its
/// enqueue, even once it is done: a day, as long as a producer may sensibly retry.
pub const ID_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How long a job's result (and a finished flow, [`FLOW_RETENTION`](crate::flow::FLOW_RETENTION))
/// is kept after the settlement that recorded it.
pub const RESULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Checks a kind, queue or scope name: non-empty, at most [`MAX_NAME_BYTES`], no control
/// characters (they would corrupt logs, keys and the tab-separated records of the Redis
/// backend) and no invisible format characters (they would let one name pass for another).
pub fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidJob(format!("{what} is empty")));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::InvalidJob(format!(
            "{what} is {} bytes, the limit is {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    // Printable ASCII (every name of most installations: job ids, kinds, queues) holds no
    // control or format character; the per-character category lookup below was a sizeable
    // share of the embedded coordinator's instructions per job (docs/performance.md, settings
    // the code cites).
    if name.bytes().all(|b| (b' '..=b'~').contains(&b)) {
        return Ok(());
    }
    if name.chars().any(char::is_control) {
        return Err(Error::InvalidJob(format!(
            "{what} {name:?} contains a control character"
        )));
    }
    // Format characters (bidirectional overrides such as U+202E, zero-width joiners and
    // spaces, the byte-order mark) are invisible: a name holding one reads as another name,
    // or reorders the text around it, on the operator page, in `status` and in logs.
    if let Some(c) = name
        .chars()
        .find(|c| c.general_category() == GeneralCategory::Format)
    {
        return Err(Error::InvalidJob(format!(
            "{what} {name:?} contains the invisible format character U+{:04X}",
            c as u32
        )));
    }
    Ok(())
}

/// A job to enqueue. Built with [`NewJob::new`] and refined with the `with_*` methods.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewJob {
    /// Queue the job waits in.
    pub queue: String,
    /// Handler name it is dispatched to.
    pub kind: String,
    /// JSON payload, kept encoded so a worker can dead-letter a payload it cannot decode.
    pub payload: String,
    /// Protected resource; `None` means the job's own default scope ([`Scope::of_job`]).
    pub scope: Option<Scope>,
    /// Higher runs first among ready jobs of one queue.
    pub priority: i32,
    /// Not claimable before this much time has passed.
    pub delay: Duration,
    /// Handler failures allowed before the job is dead.
    pub max_attempts: u32,
    /// Expired leases allowed before the job is dead.
    pub max_stalls: u32,
    /// Idempotent enqueue: see [`NewJob::with_unique_key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique: Option<UniqueKey>,
    /// The id it goes by, chosen by the producer: see [`NewJob::with_id`]. `None`: the
    /// backend mints one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<JobId>,
    /// The schedule tick it was enqueued for (set by the scheduler; see [`Job::tick`](crate::job::Job::tick)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick: Option<Tick>,
    /// The trace it continues: see [`NewJob::with_trace`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::traceparent::lenient"
    )]
    pub trace: Option<TraceContext>,
    /// Snoozes allowed before the job is dead: see [`NewJob::with_max_snoozes`].
    #[serde(default = "default_max_snoozes")]
    pub max_snoozes: u32,
    /// How long one attempt may run: see [`NewJob::with_timeout`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Not started by then (Unix ms), it dies as expired: see [`NewJob::with_deadline`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Replaces a pending job's payload instead of adding one: see [`NewJob::with_debounce`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<Debounce>,
    /// The group it shares claims with: see [`NewJob::with_group`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// A debounced enqueue ([`NewJob::with_debounce`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Debounce {
    /// The key (same rules as names); one namespace per coordinator, across queues and kinds.
    pub key: String,
    /// How long after the last enqueue under the key the job starts.
    pub quiet: Duration,
    /// The longest a job waits from its first enqueue, however often it is replaced.
    pub max_wait: Duration,
}

/// Ticks are kept below this (ms): 14 digits, which every record keeps exactly.
pub const MAX_TICK_MS: i64 = 100_000_000_000_000;

/// The schedule tick a job was enqueued for: which schedule, and the instant of the tick (not
/// when the job ran, which may be later: a catch-up, a retry, a busy queue).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tick {
    /// The schedule's name.
    pub schedule: String,
    /// The tick (ms since the Unix epoch).
    pub at_ms: i64,
}

/// A job's unique key: while another job holds it, enqueueing this one adds nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UniqueKey {
    /// The key (same rules as names: 1..=512 bytes, no control characters); one namespace
    /// per coordinator, across queues and kinds.
    pub key: String,
    /// How long the key stays held after the holding job was enqueued, even once it is done.
    pub ttl: Duration,
    /// What the key names, for an idempotency key: a later enqueue under the key whose
    /// fingerprint differs is refused ([`Error::Conflict`]) instead of answering the holder,
    /// so a reused key never hides a different request. `None`: a plain unique key, which
    /// turns any job under it away (deduplication). A job's own id key
    /// ([`NewJob::with_id`]) always carries the job's [`NewJob::fingerprint`]. Kept with the
    /// holding job's record (and its completed record); once neither is kept, a job under the
    /// key is turned away as by a plain key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// A queue's rate limit: at most `jobs` claims per `per`, shared by every worker (a token
/// bucket that refills continuously and holds at most `jobs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    /// Claims allowed per period (and the largest burst).
    pub jobs: u32,
    /// The period.
    pub per: Duration,
}

impl RateLimit {
    /// Checks the limit: at least one job, a period of 1 ms ..= 1 day.
    pub fn validate(&self) -> Result<()> {
        if self.jobs == 0 {
            return Err(Error::InvalidJob(
                "a rate limit allows at least one job (pause the queue to stop it)".into(),
            ));
        }
        if !self.per.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(Error::InvalidJob(format!(
                "rate limit period {:?} is not a whole number of milliseconds",
                self.per
            )));
        }
        if self.per < Duration::from_millis(1) || self.per > Duration::from_secs(86_400) {
            return Err(Error::InvalidJob(format!(
                "rate limit period {:?} is outside 1ms..=1 day",
                self.per
            )));
        }
        Ok(())
    }
}

/// Checks a concurrency cap: at least one (pause the queue to run none).
pub fn check_cap(cap: Option<u32>) -> Result<()> {
    if cap == Some(0) {
        return Err(Error::InvalidJob(
            "a concurrency cap of 0 would stop the kind for good; pause its queue instead".into(),
        ));
    }
    Ok(())
}

/// What cancelling a job did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cancelled {
    /// It was queued (ready, waiting, delayed): it is now dead with the reason.
    Removed,
    /// It was running: its lease is revoked (the handler's cancellation token fires at its
    /// next renewal; its late writes are refused once the watermark passes its token) and it
    /// is dead with the reason.
    Revoked,
    /// No such job is queued or running (unknown, completed, or dead already).
    Missing,
}

/// What enqueue did with one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Enqueued {
    /// A new job.
    Added(JobId),
    /// Nothing: another job holds the unique key; this is its id.
    Existing(JobId),
    /// The pending job holding the debounce key ([`NewJob::with_debounce`]) took this job's
    /// payload and options and starts later; this is its id.
    Debounced(JobId),
}

impl Enqueued {
    /// The job's id, new or existing.
    pub fn id(self) -> JobId {
        match self {
            Self::Added(id) | Self::Existing(id) | Self::Debounced(id) => id,
        }
    }

    /// What happened, as one word (`added`, `existing`, `debounced`): for a metric label or
    /// a log line, so that code outside this crate need not match every variant.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added(_) => "added",
            Self::Existing(_) => "existing",
            Self::Debounced(_) => "debounced",
        }
    }
}

impl NewJob {
    /// A journal-clearing job in the default scope of the run it clears.
    fn clears_its_scope(&self, scope: &Scope) -> bool {
        self.kind == JOURNAL_CLEAR_KIND
            && serde_json::from_str::<serde_json::Value>(&self.payload)
                .ok()
                .and_then(|p| {
                    p.get("job")?
                        .as_str()
                        .and_then(|j| uuid::Uuid::try_parse(j).ok())
                })
                .map(JobId::from)
                == scope.job()
    }
}

impl NewJob {
    /// A job of `kind` on the `default` queue with a serde payload.
    pub fn new(kind: impl Into<String>, payload: &impl Serialize) -> Result<Self> {
        let payload = serde_json::to_string(payload).map_err(|e| Error::Payload(e.to_string()))?;
        Ok(Self::raw(kind, payload))
    }

    /// A job whose payload is already JSON text (not validated here: a worker dead-letters a
    /// payload its handler cannot decode).
    pub fn raw(kind: impl Into<String>, payload: impl Into<String>) -> Self {
        Self {
            queue: "default".into(),
            kind: kind.into(),
            payload: payload.into(),
            scope: None,
            priority: 0,
            delay: Duration::ZERO,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_stalls: 3,
            unique: None,
            id: None,
            tick: None,
            trace: None,
            max_snoozes: DEFAULT_MAX_SNOOZES,
            timeout: None,
            deadline_ms: None,
            debounce: None,
            group: None,
        }
    }

    /// The job goes by `id`, chosen by the producer (for example derived from the request
    /// that made it), so a retried enqueue is the same job: while a job with this id is
    /// queued, delayed, waiting or running, and for [`ID_RETENTION`] after it was enqueued,
    /// enqueueing it again adds nothing and answers [`Enqueued::Existing`]`(id)`. The id is
    /// kept taken by the unique key `id:<id>`, unless the job has a unique key of its own,
    /// which then decides ([`NewJob::with_unique_key`]; an idempotency key, one with a
    /// [`UniqueKey::fingerprint`], keeps the id taken as well). Ids must differ within one
    /// batch.
    ///
    /// `Client`, the `Coordinator` actor and
    /// `palisade enqueue` give every job without one an id of their own before the first
    /// attempt, kept for [`ENQUEUE_RETRY_WINDOW`], and retry a transient failure with it.
    pub fn with_id(self, id: JobId) -> Self {
        self.with_id_for(id, ID_RETENTION)
    }

    /// [`with_id`](Self::with_id), the id kept taken for `ttl`.
    #[doc(hidden)]
    pub fn with_id_for(mut self, id: JobId, ttl: Duration) -> Self {
        self.id = Some(id);
        if self.unique.is_none() {
            self.unique = Some(UniqueKey {
                key: format!("id:{id}"),
                ttl,
                fingerprint: None,
            });
        }
        self
    }

    /// Makes the enqueue idempotent under `key`: while another job enqueued with the same
    /// key is queued, delayed, waiting or running — or was enqueued less than `ttl` ago,
    /// even if it is done — enqueueing this one adds nothing and returns that job's id
    /// ([`Enqueued::Existing`]). Decided atomically by the backend, so concurrent producers
    /// add exactly one job. A dead job gives its key up after `ttl` like a completed one;
    /// retrying it from the dead letters does not take the key back.
    pub fn with_unique_key(mut self, key: impl Into<String>, ttl: Duration) -> Self {
        self.unique = Some(UniqueKey {
            key: key.into(),
            ttl,
            fingerprint: None,
        });
        self
    }

    /// What this job asks for, as a short stable string (`v1:` and 32 hex digits of a
    /// SHA-256): its queue, kind, payload, scope, priority, delay, attempts, stalls, snoozes,
    /// timeout, deadline, group and tick — not its id, unique or debounce key, or trace (a
    /// retried request carries a new traceparent). The same job gives the same fingerprint
    /// on every machine and release that writes `v1`; pinned by a golden test.
    pub fn fingerprint(&self) -> String {
        #[derive(Serialize)]
        struct V1<'a> {
            queue: &'a str,
            kind: &'a str,
            payload: &'a str,
            scope: Option<&'a str>,
            priority: i32,
            delay_ms: u128,
            max_attempts: u32,
            max_stalls: u32,
            max_snoozes: u32,
            timeout_ms: Option<u128>,
            deadline_ms: Option<u64>,
            group: Option<&'a str>,
            tick: Option<&'a Tick>,
        }
        let identity = V1 {
            queue: &self.queue,
            kind: &self.kind,
            payload: &self.payload,
            scope: self.scope.as_ref().map(Scope::as_str),
            priority: self.priority,
            delay_ms: self.delay.as_millis(),
            max_attempts: self.max_attempts,
            max_stalls: self.max_stalls,
            max_snoozes: self.max_snoozes,
            timeout_ms: self.timeout.map(|t| t.as_millis()),
            deadline_ms: self.deadline_ms,
            group: self.group.as_deref(),
            tick: self.tick.as_ref(),
        };
        // (Serializing plain strings and numbers cannot fail.)
        digest(&serde_json::to_vec(&identity).unwrap_or_default())
    }

    /// The fingerprint a store keeps with this job's unique key and compares a later job
    /// under the key with: the key's own ([`UniqueKey::fingerprint`]); for the job's own id
    /// key ([`NewJob::with_id`]), the job's; none for a debounced job, whose id key the job it
    /// folds into holds (a debounce key folds different payloads by design).
    #[doc(hidden)] // for the stores
    pub fn key_fingerprint(&self) -> Option<String> {
        let unique = self.unique.as_ref()?;
        if let Some(fingerprint) = &unique.fingerprint {
            return Some(fingerprint.clone());
        }
        let own = self.id.is_some_and(|id| unique.key == format!("id:{id}"));
        (own && self.debounce.is_none()).then(|| self.fingerprint())
    }

    /// How long a store keeps this job's own id key (`id:<id>`) taken beside an idempotency
    /// key of another name (one with a [`UniqueKey::fingerprint`], such as the HTTP API's
    /// `Idempotency-Key`): [`ID_RETENTION`], so the id stays that request's job and another
    /// job under it is refused or turned away. `None` for a plain unique key, which decides
    /// alone as [`NewJob::with_id`] says, for a job whose id key is its unique key already,
    /// and for a job with no id.
    #[doc(hidden)] // for the stores
    pub fn id_key_ttl(&self) -> Option<Duration> {
        let id = self.id?;
        let unique = self.unique.as_ref()?;
        let idempotency = unique.fingerprint.is_some() && unique.key != format!("id:{id}");
        (idempotency && self.debounce.is_none()).then_some(ID_RETENTION)
    }

    /// Sets the queue.
    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Sets the protected scope (jobs sharing it run one at a time).
    pub fn with_scope(mut self, scope: impl Into<Scope>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// Sets the priority.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Delays the first claim.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Sets how many handler failures are retried.
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Continues `trace` (a W3C trace context, [`TraceContext::from_w3c`]): every attempt of
    /// the job is a span in that trace, and its log lines carry its `trace_id`. Without one,
    /// an enqueue continues the current span's trace (feature `otel`) or, with no tracer,
    /// starts none.
    pub fn with_trace(mut self, trace: TraceContext) -> Self {
        self.trace = Some(trace);
        self
    }

    /// Continues `trace` unless the job names a trace of its own (a follow-up, a flow step).
    #[doc(hidden)]
    pub fn inherit_trace(&mut self, trace: Option<&TraceContext>) {
        if self.trace.is_none() {
            self.trace = trace.cloned();
        }
    }

    /// Sets how many stalls (expired leases) are tolerated.
    pub fn with_max_stalls(mut self, max_stalls: u32) -> Self {
        self.max_stalls = max_stalls;
        self
    }

    /// Sets how many times the job may snooze ([`JobError::snooze`](crate::job::JobError::snooze)) before it is dead
    /// ([`DEFAULT_MAX_SNOOZES`] unless set).
    pub fn with_max_snoozes(mut self, max_snoozes: u32) -> Self {
        self.max_snoozes = max_snoozes;
        self
    }

    /// Bounds each attempt to `timeout` (overriding the kind's default,
    /// `Registry::with_timeout`). At `timeout` the handler's
    /// cancellation token fires and the attempt fails as retryable with the reason "timed
    /// out"; a handler that has not returned `WorkerConfig::timeout_grace`
    /// later is aborted (dropped at its next `.await`) and its slot freed. Independent of the
    /// lease: a handler that ignores its token stays fenced — once its job runs again, or its
    /// lease is gone, the fence refuses what it still writes.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(whole_ms(timeout));
        self
    }

    /// A job not started by `deadline` is not run late: the worker that claims it after then
    /// dead-letters it with the reason "expired" without running its handler. Judged by the
    /// claiming worker's clock, so keep deadlines well above clock skew.
    pub fn with_deadline(mut self, deadline: std::time::SystemTime) -> Self {
        let ms = deadline
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        self.deadline_ms = Some(u64::try_from(ms).unwrap_or(u64::MAX));
        self
    }

    /// Debounces the job under `key`: it starts `quiet` after its enqueue, and while it has
    /// not started (it waits out its quiet period), another enqueue under the same key
    /// replaces its payload and options and pushes its start to `quiet` after that enqueue —
    /// but never past `max_wait` after the first one, so a steady stream of updates still
    /// runs. A burst of updates runs once, with the latest payload. The replacing enqueue
    /// answers [`Enqueued::Debounced`] with the pending job's id. Decided atomically by the
    /// backend. Once the job was claimed (or snoozed, retried, released), the next enqueue
    /// under the key makes a new job; so does one a day after the job was due and still not
    /// claimed (a queue paused that long). A job already due keeps its due time (an update
    /// never holds back a job that may run now). The replacing job must name the same queue,
    /// kind and scope (else the enqueue is refused whole); a debounced job takes no delay and
    /// no unique key of its own. Durations count in whole milliseconds.
    pub fn with_debounce(
        mut self,
        key: impl Into<String>,
        quiet: Duration,
        max_wait: Duration,
    ) -> Self {
        self.debounce = Some(Debounce {
            key: key.into(),
            quiet: whole_ms(quiet),
            max_wait: whole_ms(max_wait),
        });
        self
    }

    /// Puts the job in `group` (a tenant, a customer: a name with the usual rules). Claims
    /// rotate round-robin over the groups that have ready jobs, so a group with a million
    /// jobs waiting takes its turn like one with ten; jobs without a group share one turn of
    /// their own. Within a group, priority and enqueue order decide as in a queue. A group
    /// may have a concurrency cap, a rate limit and be paused
    /// ([`QueueAdmin::set_group_limits`](crate::store::QueueAdmin::set_group_limits)),
    /// across every queue and kind; a group that cannot run leaves the rotation until it can,
    /// so a claim costs the same however many groups wait. Scopes still hold: a scope's jobs
    /// run one at a time whatever their groups. A flow step takes no group (yet).
    pub fn with_group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Checks what every backend requires before accepting the job: names (see
    /// [`MAX_NAME_BYTES`]; a named scope may not take the reserved form of a default scope,
    /// `job:<uuid>`), payload size, [`PRIORITY_RANGE`], [`MAX_DELAY`], at least one attempt.
    pub fn validate(&self, max_payload_bytes: usize) -> Result<()> {
        check_name("kind", &self.kind)?;
        check_name("queue", &self.queue)?;
        if let Some(tick) = &self.tick {
            check_name("tick schedule", &tick.schedule)?;
            // Kept exact through every record (Redis' cjson writes 14 digits): until 5138.
            if !(0..MAX_TICK_MS).contains(&tick.at_ms) {
                return Err(Error::InvalidJob(format!(
                    "tick {} ms is outside 0..{MAX_TICK_MS}",
                    tick.at_ms
                )));
            }
        }
        if let Some(group) = &self.group {
            check_name("group", group)?;
        }
        if let Some(scope) = &self.scope {
            check_name("scope", scope.as_str())?;
            if scope.job().is_some() && !self.clears_its_scope(scope) {
                return Err(Error::InvalidJob(format!(
                    "scope {scope} is reserved: `job:<uuid>` is the default scope of a job"
                )));
            }
        }
        if !PRIORITY_RANGE.contains(&self.priority) {
            return Err(Error::InvalidJob(format!(
                "priority {} is outside {PRIORITY_RANGE:?}",
                self.priority
            )));
        }
        if self.delay > MAX_DELAY {
            return Err(Error::InvalidJob(format!(
                "delay {:?} is longer than {MAX_DELAY:?}",
                self.delay
            )));
        }
        if self.payload.len() > max_payload_bytes {
            return Err(Error::InvalidJob(format!(
                "payload is {} bytes, the limit is {max_payload_bytes}",
                self.payload.len()
            )));
        }
        if self.max_attempts == 0 {
            return Err(Error::InvalidJob("max_attempts must be at least 1".into()));
        }
        if let Some(unique) = &self.unique {
            check_name("unique key", &unique.key)?;
            if let Some(f) = &unique.fingerprint {
                // Kept with the job and compared byte for byte: short, visible ASCII.
                if f.is_empty() || f.len() > 64 || !f.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(Error::InvalidJob(format!(
                        "unique key fingerprint {f:?} is not 1 to 64 visible ASCII characters"
                    )));
                }
            }
            if unique.ttl > MAX_DELAY {
                return Err(Error::InvalidJob(format!(
                    "unique key ttl {:?} is longer than {MAX_DELAY:?}",
                    unique.ttl
                )));
            }
        }
        // (Whole milliseconds, as every backend counts them: the builders round; a field set
        // by hand to a finer duration would mean one thing in memory and another on Redis.)
        let within = |what: &str, d: Duration| {
            if d < Duration::from_millis(1) || d > MAX_DELAY {
                return Err(Error::InvalidJob(format!(
                    "{what} {d:?} is outside 1 ms ..= {MAX_DELAY:?}"
                )));
            }
            if d != whole_ms(d) {
                return Err(Error::InvalidJob(format!(
                    "{what} {d:?} is not a whole number of milliseconds"
                )));
            }
            Ok(())
        };
        if let Some(timeout) = self.timeout {
            within("timeout", timeout)?;
        }
        if let Some(deadline) = self.deadline_ms {
            if deadline >= MAX_TICK_MS as u64 {
                return Err(Error::InvalidJob(format!(
                    "deadline {deadline} ms is outside 0..{MAX_TICK_MS}"
                )));
            }
        }
        if let Some(debounce) = &self.debounce {
            check_name("debounce key", &debounce.key)?;
            within("debounce quiet period", debounce.quiet)?;
            within("debounce maximum wait", debounce.max_wait)?;
            if debounce.max_wait < debounce.quiet {
                return Err(Error::InvalidJob(format!(
                    "debounce maximum wait {:?} is shorter than its quiet period {:?}",
                    debounce.max_wait, debounce.quiet
                )));
            }
            if !self.delay.is_zero() {
                return Err(Error::InvalidJob(
                    "a debounced job starts after its quiet period: it takes no delay".into(),
                ));
            }
            // (`with_id` gives a job the unique key `id:<id>`: that one is the producer's
            // retry guard, not a competing rule, and is kept.)
            if self.unique.as_ref().is_some_and(|u| {
                Some(u.key.as_str()) != self.id.map(|id| format!("id:{id}")).as_deref()
            }) {
                return Err(Error::InvalidJob(
                    "a job takes a unique key or a debounce key, not both".into(),
                ));
            }
        }
        Ok(())
    }
}

/// How long ids that `Client`, the `Coordinator` actor
/// and `palisade enqueue` give jobs stay taken ([`NewJob::with_id`]): longer than they retry
/// ([`ENQUEUE_RETRY_FOR`]), so no retry can add a job twice.
pub const ENQUEUE_RETRY_WINDOW: Duration = Duration::from_secs(120);

/// How long those producers retry an enqueue that failed transiently (the backend was
/// unreachable, or the reply was lost after it acted), with the same ids.
pub const ENQUEUE_RETRY_FOR: Duration = Duration::from_secs(30);

/// Checks every job of a batch ([`NewJob::validate`]) and that no two share an id: a batch is
/// all or nothing, so one bad job refuses it whole.
pub fn validate_batch(jobs: &[NewJob], max_payload_bytes: usize) -> Result<()> {
    let mut ids = std::collections::HashSet::new();
    let mut debounced = std::collections::HashSet::new();
    for job in jobs {
        job.validate(max_payload_bytes)?;
        if let Some(id) = job.id {
            if !ids.insert(id) {
                return Err(Error::InvalidJob(format!(
                    "job id {id} appears twice in one batch"
                )));
            }
        }
        // One enqueue replaces a pending job once: two of one batch under one key would
        // leave which payload wins to the order of the batch.
        if let Some(d) = &job.debounce {
            if !debounced.insert(d.key.as_str()) {
                return Err(Error::InvalidJob(format!(
                    "debounce key {:?} appears twice in one batch",
                    d.key
                )));
            }
        }
    }
    Ok(())
}

/// `v1:` and the first 128 bits of the SHA-256 of `bytes`, in hex.
fn digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(bytes);
    let mut out = String::with_capacity(35);
    out.push_str("v1:");
    for byte in &digest[..16] {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// One fingerprint for a batch of jobs, from each job's fingerprint in order
/// ([`NewJob::fingerprint`], or one its caller computed as that does): for idempotency keys
/// that name a whole batch, so another batch under them (a job changed, added or left out)
/// is refused whole.
pub fn batch_fingerprint<'a>(each: impl IntoIterator<Item = &'a str>) -> String {
    let each: Vec<&str> = each.into_iter().collect();
    digest(&serde_json::to_vec(&each).unwrap_or_default())
}

/// The error for a job refused because its idempotency key is held by `holder`, a job
/// enqueued with a different request (`UniqueKey::fingerprint`); every store says it so.
#[doc(hidden)] // for the stores
pub fn conflict(key: &str, holder: &str) -> Error {
    Error::Conflict(format!(
        "unique key {key:?} is held by job {holder}, enqueued with a different request: \
         nothing was changed (send a new key for a new request)"
    ))
}

/// Most follow-up jobs, flows and added steps one completion may carry together
/// (`JobContext::follow_up`, `start_flow`, `add_step`; a flow counts once).
pub const MAX_FOLLOW_UPS: usize = 1000;

/// Most bytes of JSON one completion's follow-up jobs may take together: they travel in the
/// settlement and are kept with it until enqueued.
pub const MAX_FOLLOW_UP_BYTES: usize = 16 * 1024 * 1024;
