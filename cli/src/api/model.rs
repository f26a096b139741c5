//! What the HTTP API reads and writes: request and response bodies (their JSON schemas go into
//! the OpenAPI document), the JSON error every failure answers with, and the pure conversions
//! between these and the library's types. No I/O here.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::integral;
use crate::reads::Found;
use palisade::cli_support::check_name;
use palisade::Registry;
use palisade::{DeadJob, JobState, NewJob, QueueCounts};
use palisade::{Flow, FlowState, OnDead, StepEnd};
use palisade::{FlowId, JobId};

/// What the document says of a name (a queue, kind, scope, key, group or step): no control
/// or format characters of the Basic Multilingual Plane. The rest of the library's rule (at
/// most 512 bytes, no format characters past it) is checked by the server: 422.
pub(crate) const NAME_PATTERN: &str = concat!(
    r"^[^\u0000-\u001F\u007F-\u009F",
    // The Basic Multilingual Plane's format characters (Unicode's Cf): soft hyphen, Arabic
    // marks, zero-width joiners, bidirectional controls, the byte-order mark...
    r"\u00AD\u0600-\u0605\u061C\u06DD\u070F\u0890\u0891\u08E2\u180E\u200B-\u200F",
    r"\u202A-\u202E\u2060-\u2064\u2066-\u206F\uFEFF\uFFF9-\uFFFB]*$"
);

/// The document's schema of a name: a string of 1 to 512 characters matching
/// [`NAME_PATTERN`] (the server counts the 512 in bytes).
pub(crate) struct Name;

impl utoipa::PartialSchema for Name {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "A name: 1 to 512 bytes of UTF-8, no control or invisible format characters",
            ))
            .min_length(Some(1))
            .max_length(Some(512))
            .pattern(Some(NAME_PATTERN))
            .into()
    }
}

impl ToSchema for Name {}

/// The document's schema of an `Idempotency-Key`: 1 to 400 visible ASCII characters (spaces
/// inside), as [`idempotency_key`] takes it.
pub(crate) struct IdempotencyKey;

impl utoipa::PartialSchema for IdempotencyKey {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(MAX_IDEMPOTENCY_KEY_BYTES))
            .pattern(Some("^[!-~]([ -~]*[!-~])?$"))
            .into()
    }
}

impl ToSchema for IdempotencyKey {}

/// Most jobs one batch enqueue takes: one backend round trip, all or nothing.
pub(crate) const MAX_BATCH: usize = 1_000;

/// How long an `Idempotency-Key` stays taken after its job was enqueued (a retried request
/// within it adds nothing), as Stripe keeps its keys: a day, [`palisade::ID_RETENTION`].
pub(crate) const IDEMPOTENCY_TTL: Duration = palisade::ID_RETENTION;

/// How long a `unique_key` stays taken when the request does not say (as `palisade enqueue
/// --unique` does).
const UNIQUE_TTL: Duration = Duration::from_secs(24 * 3600);

/// A failure, as every endpoint answers it: `{"error": {"code", "message", "retryable"}}`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorDetail {
    /// Stable, machine-readable: `invalid_json`, `invalid_request`, `invalid_job`,
    /// `invalid_payload`, `unknown_kind`, `not_found`, `method_not_allowed`,
    /// `unsupported_media_type`, `too_large`, `unauthorized`, `forbidden`, `unknown_host`,
    /// `unavailable`, `outcome_unknown`, `backend`, `undocumented`.
    code: String,
    /// For a person.
    message: String,
    /// Whether the same request may succeed later (a backend that was unreachable; an enqueue
    /// whose outcome is unknown — send it again with the same `Idempotency-Key`). The
    /// library's `Error::is_retryable`.
    retryable: bool,
}

/// An API failure: a status and the JSON error body.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retryable: bool,
    /// A 405's `Allow` header.
    allow: Option<String>,
}

impl ApiError {
    /// Its code, as the body says it (`unauthorized`, `forbidden`, ...).
    pub(crate) fn code(&self) -> &'static str {
        self.code
    }

    /// Its HTTP status.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retryable: false,
            allow: None,
        }
    }

    /// A request the API cannot read (a field of the wrong type, a missing one, a typo).
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// For a request that carried nothing to make it idempotent (no `Idempotency-Key`, unique
    /// key or id): an outcome that is unknown is not safe to send again, it could add the job
    /// twice.
    pub(crate) fn unless_idempotent(mut self, idempotent: bool) -> Self {
        if self.code == "outcome_unknown" && !idempotent {
            self.retryable = false;
            self.message.push_str(
                "; sending the same request again could add it twice: send an Idempotency-Key \
                 to make a retry safe",
            );
        }
        self
    }

    /// This 405 with the methods the endpoint takes.
    pub(crate) fn allowing(mut self, methods: String) -> Self {
        self.allow = Some(methods);
        self
    }

    /// This failure with `what` before its message (which job of a batch, how far it got).
    pub(crate) fn within(mut self, what: &str) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }

    /// The status code and error code this failure answers with (tests read them).
    #[cfg(test)]
    pub(crate) fn parts(&self) -> (StatusCode, &'static str) {
        (self.status, self.code)
    }
}

impl From<palisade::Error> for ApiError {
    /// The library's error in its class: retryable ones are 503 with `retryable: true`;
    /// what the caller sent wrong is 422; the rest is the backend's failure (500).
    fn from(e: palisade::Error) -> Self {
        use palisade::Error as E;
        let (status, code) = match &e {
            E::InvalidJob(m) if m.starts_with("unknown job kind") => {
                (StatusCode::UNPROCESSABLE_ENTITY, "unknown_kind")
            }
            E::InvalidJob(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_job"),
            E::Payload(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_payload"),
            // (As the IETF Idempotency-Key draft asks for a key reused with another payload.)
            E::Conflict(_) => (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused"),
            E::OutcomeUnknown(_) => (StatusCode::SERVICE_UNAVAILABLE, "outcome_unknown"),
            _ if e.is_retryable() => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "backend"),
        };
        Self {
            status,
            code,
            message: e.to_string(),
            retryable: e.is_retryable(),
            allow: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(code = self.code, error = %self.message, "api: request failed");
        }
        let allow = self.allow.clone();
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
                retryable: self.retryable,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(allow) = allow.as_deref().and_then(|a| HeaderValue::from_str(a).ok()) {
            response.headers_mut().insert(header::ALLOW, allow);
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.retryable {
            // A client that honours it backs off instead of hammering a backend that is down.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// `body` read as `T`, or a 400 naming what is wrong (serde says where: line and column). An
/// empty body reads as `{}`, for actions whose fields are all optional.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    // Every body is an object: serde would read a struct from an array too (a whole job as
    // a positional list), which the document does not allow and no client means.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "request body: a JSON object is expected",
        ));
    }
    serde_json::from_slice(body).map_err(|e| {
        let code = if e.is_data() {
            "invalid_request"
        } else {
            "invalid_json"
        };
        ApiError::new(StatusCode::BAD_REQUEST, code, format!("request body: {e}"))
    })
}

fn default_queue() -> String {
    "default".into()
}

/// One job to enqueue. Only `kind` and `payload` are required; the rest has the library's
/// defaults (`NewJob::raw`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobRequest {
    /// A kind the serving binary has a handler for.
    #[schema(value_type = Name)]
    kind: String,
    /// The handler's input, any JSON; checked against the kind's payload type before
    /// anything is sent, and kept as sent (numbers are not rounded).
    #[schema(value_type = serde_json::Value)]
    payload: Box<RawValue>,
    /// Queue (default `default`).
    #[serde(default = "default_queue")]
    #[schema(value_type = Name, default = "default")]
    queue: String,
    /// Protected scope: jobs sharing it run one at a time, and their fenced writes are
    /// fenced per scope. Default: the job's own `job:<id>`.
    #[schema(value_type = Option<Name>)]
    scope: Option<String>,
    /// Higher runs first, -4096..=4096.
    #[serde(default, deserialize_with = "integral::de")]
    #[schema(minimum = -4096, maximum = 4096)]
    priority: i32,
    /// Not claimable before this many milliseconds have passed (at most a year).
    #[serde(default, deserialize_with = "integral::de")]
    #[schema(maximum = 31_536_000_000_u64)]
    delay_ms: u64,
    /// Attempts before the job is dead (default 20: with the default backoff, about a day).
    #[serde(default, deserialize_with = "integral::opt")]
    #[schema(minimum = 1, maximum = 4_294_967_295_u64)]
    max_attempts: Option<u32>,
    /// Expired leases (stalls) allowed before the job is dead (default 3).
    #[serde(default, deserialize_with = "integral::opt")]
    #[schema(maximum = 4_294_967_295_u64)]
    max_stalls: Option<u32>,
    /// Idempotent enqueue: while another job holds this key (queued, running, or enqueued
    /// less than `unique_ttl_ms` ago) nothing is added and that job's id is answered.
    #[schema(value_type = Option<Name>)]
    unique_key: Option<String>,
    /// How long `unique_key` stays held after its job was enqueued (default a day; at most a
    /// year).
    #[serde(default, deserialize_with = "integral::opt")]
    #[schema(maximum = 31_536_000_000_u64)]
    unique_ttl_ms: Option<u64>,
    /// The job's id, chosen by the caller: enqueueing it again while it is known (and for a
    /// day) adds nothing.
    id: Option<uuid::Uuid>,
    /// How long one attempt may run, in milliseconds: then the handler is told to stop and
    /// the attempt is retried as timed out (default: the kind's timeout, if any).
    #[serde(default, deserialize_with = "integral::opt")]
    #[schema(minimum = 1, maximum = 315_360_000_000_u64)]
    timeout_ms: Option<u64>,
    /// Not started by then (ms since the Unix epoch), the job is dead as expired, never run.
    #[serde(default, deserialize_with = "integral::opt")]
    #[schema(maximum = 99_999_999_999_999_u64)]
    deadline_ms: Option<u64>,
    /// Snoozes allowed before the job is dead (default 100).
    #[serde(default, deserialize_with = "integral::opt")]
    #[schema(maximum = 4_294_967_295_u64)]
    max_snoozes: Option<u32>,
    /// Debounce: while a job under the same key waits out its quiet period, this one
    /// replaces its payload and options and pushes its start (answered `debounced`, with
    /// that job's id). Takes no `delay_ms`, `unique_key` or `Idempotency-Key`.
    debounce: Option<DebounceRequest>,
    /// The group it shares claims with (a tenant, a customer): claims rotate over the groups
    /// with ready jobs, whatever their backlogs (`palisade group` sets a group's cap, rate
    /// limit or pause).
    #[schema(value_type = Option<Name>)]
    group: Option<String>,
}

/// A debounced enqueue.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DebounceRequest {
    /// The key (1..=512 bytes, no control characters).
    #[schema(value_type = Name)]
    key: String,
    /// The job starts this long after the last enqueue under the key.
    #[serde(deserialize_with = "integral::de")]
    #[schema(minimum = 1, maximum = 315_360_000_000_u64)]
    quiet_ms: u64,
    /// ...but no later than this long after the first (at least `quiet_ms`).
    #[serde(deserialize_with = "integral::de")]
    #[schema(minimum = 1, maximum = 315_360_000_000_u64)]
    max_wait_ms: u64,
}

impl JobRequest {
    /// Whether sending it again cannot add a second job: it names a unique key held a day or
    /// longer, or (without a key of its own, which would decide instead) its id, held a day.
    pub(crate) fn is_idempotent(&self) -> bool {
        match (&self.unique_key, self.unique_ttl_ms) {
            (Some(_), ttl) => ttl.is_none_or(|t| u128::from(t) >= IDEMPOTENCY_TTL.as_millis()),
            (None, _) => self.id.is_some(),
        }
    }

    /// The job, checked by every rule the library has (names, payload limit, ranges) and
    /// against the binary's handlers; `unique` is the key an `Idempotency-Key` header maps
    /// to, which the body may not set as well.
    pub(crate) fn job(
        &self,
        registry: &Registry,
        max_payload_bytes: usize,
        unique: Option<String>,
    ) -> Result<NewJob, ApiError> {
        let refuse = |why: String| {
            Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_job",
                why,
            ))
        };
        // As `palisade enqueue` bounds --delay and --unique-ttl.
        let year = crate::YEAR.as_millis();
        if u128::from(self.delay_ms) > year
            || self.unique_ttl_ms.is_some_and(|t| u128::from(t) > year)
        {
            return refuse(format!(
                "delay_ms and unique_ttl_ms are at most a year ({year} ms)"
            ));
        }
        if self
            .unique_key
            .as_deref()
            .is_some_and(|k| k.starts_with(IDEMPOTENCY_PREFIX))
        {
            return refuse(format!(
                "a unique_key may not begin with {IDEMPOTENCY_PREFIX:?} (the Idempotency-Key header's)"
            ));
        }
        let payload = self.payload.get();
        // Before anything reads it (the handler's type, the fingerprint): a payload over the
        // limit is refused unread (a 32 MiB one, parsed, took 0.9 GB).
        if payload.len() > max_payload_bytes {
            return refuse(format!(
                "payload is {} bytes, the limit is {max_payload_bytes}",
                payload.len()
            ));
        }
        registry.check(&self.kind, payload)?;
        let mut job = NewJob::raw(&self.kind, payload)
            .with_queue(&self.queue)
            .with_priority(self.priority)
            .with_delay(Duration::from_millis(self.delay_ms));
        if let Some(n) = self.max_attempts {
            job = job.with_max_attempts(n);
        }
        if let Some(n) = self.max_stalls {
            job = job.with_max_stalls(n);
        }
        if let Some(scope) = &self.scope {
            job = job.with_scope(scope.as_str());
        }
        match (&self.unique_key, unique) {
            (Some(_), Some(_)) => {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_job",
                    "give an Idempotency-Key header or a unique_key, not both",
                ))
            }
            (Some(key), None) => {
                let ttl = self.unique_ttl_ms.map_or(UNIQUE_TTL, Duration::from_millis);
                job = job.with_unique_key(key, ttl);
            }
            (None, Some(_)) if self.unique_ttl_ms.is_some() => {
                return refuse("unique_ttl_ms with an Idempotency-Key (which is kept a day)".into())
            }
            (None, Some(key)) => job = job.with_unique_key(key, IDEMPOTENCY_TTL),
            (None, None) if self.unique_ttl_ms.is_some() => {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_job",
                    "unique_ttl_ms without a unique_key",
                ))
            }
            (None, None) => {}
        }
        if let Some(id) = self.id {
            job = job.with_id(JobId::from(id));
        }
        if let Some(ms) = self.timeout_ms {
            job = job.with_timeout(Duration::from_millis(ms));
        }
        if let Some(ms) = self.deadline_ms {
            job.deadline_ms = Some(ms);
        }
        if let Some(n) = self.max_snoozes {
            job = job.with_max_snoozes(n);
        }
        if let Some(d) = &self.debounce {
            job = job.with_debounce(
                &d.key,
                Duration::from_millis(d.quiet_ms),
                Duration::from_millis(d.max_wait_ms),
            );
        }
        if let Some(group) = &self.group {
            job = job.with_group(group);
        }
        // The header's key (or the body's id) names this request: the same key with another
        // job is refused, never answered with the first one's id (a batch replaces it with the
        // batch's). Not a debounced job's id: a debounce key folds other payloads by design.
        if self.unique_key.is_none() && self.debounce.is_none() && job.unique.is_some() {
            let fingerprint = canonical(&job).fingerprint();
            if let Some(u) = job.unique.as_mut() {
                u.fingerprint = Some(fingerprint);
            }
        }
        job.validate(max_payload_bytes)?;
        Ok(job)
    }
}

/// `job` with its payload written canonically (object keys sorted, no spaces, escapes
/// resolved) for its fingerprint: a client that sends the same payload formatted otherwise
/// sends the same request. (The job keeps its payload as sent.)
fn canonical(job: &NewJob) -> NewJob {
    let mut job = job.clone();
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(&job.payload) {
        job.payload = value.to_string();
    }
    job
}

/// The prefix of every unique key an `Idempotency-Key` maps to; a body's `unique_key` may
/// not take it.
const IDEMPOTENCY_PREFIX: &str = "idem:";

/// Longest `Idempotency-Key` taken: its unique key, prefix and batch index included, stays
/// within the name limit.
pub(crate) const MAX_IDEMPOTENCY_KEY_BYTES: usize = 400;

/// The unique key an `Idempotency-Key` header maps to: `idem:one:<key>` for one job,
/// `idem:batch:<i>:<key>` for job `i` of a batch — namespaces no other request's key can
/// reach (a single key `k#0` is not a batch's first) — checked by the same name rules as any
/// key. A retried request finds the job the first one added.
pub(crate) fn idempotency_key(header: &str, index: Option<usize>) -> Result<String, ApiError> {
    check_name("Idempotency-Key", header)?;
    if header.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_job",
            format!(
                "Idempotency-Key is {} bytes, the limit is {MAX_IDEMPOTENCY_KEY_BYTES}",
                header.len()
            ),
        ));
    }
    Ok(match index {
        None => format!("{IDEMPOTENCY_PREFIX}one:{header}"),
        Some(i) => format!("{IDEMPOTENCY_PREFIX}batch:{i}:{header}"),
    })
}

/// Several jobs, enqueued all or nothing in one round trip.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchRequest {
    /// 1 to 1,000 jobs.
    #[schema(min_items = 1, max_items = 1000)]
    pub(crate) jobs: Vec<JobRequest>,
}

/// What enqueue did with one job.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Enqueued {
    /// The job's id: the new job's, or that of the job holding its unique key or id.
    #[schema(value_type = String, format = Uuid)]
    pub(crate) id: String,
    /// False when nothing was added: another job holds the unique key (a retried request),
    /// or the job was debounced into a pending one.
    pub(crate) created: bool,
    /// True when the job was folded into the pending job under its debounce key (`id`).
    pub(crate) debounced: bool,
}

impl From<palisade::Enqueued> for Enqueued {
    fn from(e: palisade::Enqueued) -> Self {
        Self {
            id: e.id().to_string(),
            created: matches!(e, palisade::Enqueued::Added(_)),
            debounced: matches!(e, palisade::Enqueued::Debounced(_)),
        }
    }
}

/// What a batch enqueue did, job by job in the order sent.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BatchEnqueued {
    pub(crate) jobs: Vec<Enqueued>,
}

/// Where a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum StateName {
    /// Claimable now.
    Ready,
    /// Ready, behind another job of its scope.
    Waiting,
    /// Waiting for its delay or retry backoff (`due_in_ms`).
    Delayed,
    /// Running under a lease.
    Leased,
    /// A flow step not released yet.
    Held,
    /// A record in none of the places above (another program's, or mid layout move).
    Unplaced,
    /// Among the dead letters (`dead_reason`).
    Dead,
    /// Completed: its record kept (`completed_ms`, `attempts`), or only its result
    /// (`result` or `result_error`).
    Completed,
}

/// One ended attempt of a job.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AttemptStatus {
    /// Its number (1 for the first).
    number: u32,
    /// When it started (Unix ms), if known.
    started_ms: Option<u64>,
    /// When it ended (Unix ms).
    ended_ms: u64,
    outcome: palisade::AttemptOutcome,
    /// Why, for a failure (clipped to 480 bytes).
    error: Option<String>,
}

impl From<JobState> for StateName {
    fn from(s: JobState) -> Self {
        match s {
            JobState::Ready => Self::Ready,
            JobState::Waiting => Self::Waiting,
            JobState::Delayed => Self::Delayed,
            JobState::Leased => Self::Leased,
            JobState::Held => Self::Held,
            JobState::Unplaced => Self::Unplaced,
        }
    }
}

/// A job: where it is, what it is, and what it produced.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct JobStatus {
    #[schema(value_type = String, format = Uuid)]
    id: String,
    state: StateName,
    /// Absent for a completed job whose record is no longer kept (only its result is).
    queue: Option<String>,
    kind: Option<String>,
    scope: Option<String>,
    /// Attempts started so far.
    attempt: Option<u32>,
    max_attempts: Option<u32>,
    /// Times it snoozed so far, and how many are allowed.
    snoozes: Option<u32>,
    max_snoozes: Option<u32>,
    /// The group it shares claims with, if any.
    group: Option<String>,
    /// The payload as enqueued.
    #[schema(value_type = Option<serde_json::Value>)]
    payload: Option<Box<RawValue>>,
    /// Time left before a delayed job is due.
    due_in_ms: Option<u64>,
    /// Why its last attempt failed, when that attempt was retried.
    last_error: Option<String>,
    /// Why it died.
    dead_reason: Option<String>,
    /// When it died (Unix ms).
    died_ms: Option<u64>,
    /// Its handler's result (kinds registered with a result), once completed.
    #[schema(value_type = Option<serde_json::Value>)]
    result: Option<Box<RawValue>>,
    /// Why a result could not be kept.
    result_error: Option<String>,
    /// Its latest progress report.
    #[schema(value_type = Option<serde_json::Value>)]
    progress: Option<Box<RawValue>>,
    /// The flow it is a step of.
    #[schema(value_type = Option<String>, format = Uuid)]
    flow: Option<String>,
    /// Its step's name in that flow.
    step: Option<String>,
    /// Higher runs first.
    priority: Option<i32>,
    /// When it was enqueued (Unix ms; absent for a record an earlier version kept).
    enqueued_ms: Option<u64>,
    /// When its latest attempt started (Unix ms).
    started_ms: Option<u64>,
    /// When it completed (Unix ms).
    completed_ms: Option<u64>,
    /// Its attempts that ended, oldest first (the newest 32).
    attempts: Vec<AttemptStatus>,
}

/// `text` as JSON when it is JSON (a payload or result as kept), else as a JSON string: a
/// record another program wrote is shown, not refused.
fn json_or_text(text: &str) -> Box<RawValue> {
    serde_json::from_str::<Box<RawValue>>(text).unwrap_or_else(|_| {
        RawValue::from_string(serde_json::Value::String(text.to_owned()).to_string())
            .expect("a JSON string is JSON")
    })
}

impl JobStatus {
    /// The job's status from where the coordinator keeps it ([`Found`]).
    pub(crate) fn of(id: JobId, found: Found, progress: Option<String>) -> Self {
        let mut status = Self {
            id: id.to_string(),
            state: StateName::Completed,
            queue: None,
            kind: None,
            scope: None,
            attempt: None,
            max_attempts: None,
            snoozes: None,
            max_snoozes: None,
            group: None,
            payload: None,
            due_in_ms: None,
            last_error: None,
            dead_reason: None,
            died_ms: None,
            result: None,
            result_error: None,
            progress: progress.as_deref().map(json_or_text),
            flow: None,
            step: None,
            priority: None,
            enqueued_ms: None,
            started_ms: None,
            completed_ms: None,
            attempts: Vec::new(),
        };
        let (job, details) = match found {
            Found::Live(view) => {
                status.state = view.state.into();
                status.due_in_ms = view
                    .due_in
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                status.last_error = view.last_error;
                (view.job, view.details)
            }
            Found::Dead(dead) => {
                status.state = StateName::Dead;
                status.dead_reason = Some(dead.reason);
                status.died_ms = dead.died_ms;
                (dead.job, dead.details)
            }
            Found::Completed(done) => {
                status.completed_ms = Some(done.completed_ms);
                if let Some(envelope) = &done.result {
                    status.keep_result(envelope);
                }
                (done.job, done.details)
            }
            Found::Result(envelope) => {
                status.keep_result(&envelope);
                return status;
            }
        };
        status.priority = Some(details.priority);
        status.enqueued_ms = details.enqueued_ms;
        status.started_ms = details.started_ms;
        status.attempts = details
            .attempts
            .into_iter()
            .map(|a| AttemptStatus {
                number: a.number,
                started_ms: a.started_ms,
                ended_ms: a.ended_ms,
                outcome: a.outcome,
                error: a.error,
            })
            .collect();
        status.queue = Some(job.queue);
        status.kind = Some(job.kind);
        status.scope = Some(job.scope.to_string());
        status.attempt = Some(job.attempt);
        status.max_attempts = Some(job.max_attempts);
        status.snoozes = Some(job.snoozes);
        status.max_snoozes = Some(job.max_snoozes);
        status.group = job.group;
        status.payload = Some(json_or_text(&job.payload));
        if let Some(step) = job.flow {
            status.flow = Some(step.flow.to_string());
            status.step = Some(step.step);
        }
        status
    }

    /// A completion's kept result envelope (`{"ok": value}` or `{"error": why}`).
    fn keep_result(&mut self, envelope: &str) {
        #[derive(Deserialize)]
        #[serde(rename_all = "lowercase")]
        enum Kept {
            Ok(Box<RawValue>),
            Error(String),
        }
        match serde_json::from_str::<Kept>(envelope) {
            Ok(Kept::Ok(value)) => self.result = Some(value),
            Ok(Kept::Error(why)) => self.result_error = Some(why),
            Err(e) => self.result_error = Some(format!("the kept result: {e}")),
        }
    }
}

/// What a cancel did.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CancelOutcome {
    /// It was queued: it is now among the dead letters.
    Removed,
    /// It was running: its lease is revoked (its late fenced writes are refused) and it is
    /// among the dead letters.
    Revoked,
}

/// A cancelled job.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CancelResult {
    pub(crate) outcome: CancelOutcome,
}

/// A queue's rate limit.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Limit {
    /// Claims allowed per period, shared by every worker.
    jobs: u32,
    /// The period in milliseconds.
    per_ms: u64,
}

/// A queue: its counts (the depth an autoscaler reads), whether it is paused, its limit.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct QueueStatus {
    name: String,
    counts: QueueCounts,
    paused: bool,
    rate_limit: Option<Limit>,
    /// How long the next ready job has been claimable, in milliseconds (none when nothing is
    /// ready).
    oldest_ready_ms: Option<u64>,
}

impl From<crate::reads::QueueRow> for QueueStatus {
    fn from(row: crate::reads::QueueRow) -> Self {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self {
            name: row.name,
            counts: row.counts,
            paused: row.paused,
            rate_limit: row.limit.map(|l| Limit {
                jobs: l.jobs,
                per_ms: ms(l.per),
            }),
            oldest_ready_ms: row.oldest.map(ms),
        }
    }
}

/// Every queue.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct QueueList {
    pub(crate) queues: Vec<QueueStatus>,
    /// Queues left out because they cannot be read until repaired (a key of theirs another
    /// program wrote over); the error names the key. Usually empty.
    pub(crate) unreadable: Vec<UnreadableQueue>,
}

/// A queue that cannot be read until repaired.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct UnreadableQueue {
    pub(crate) queue: String,
    pub(crate) error: String,
}

/// A queue paused or resumed.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Paused {
    pub(crate) queue: String,
    pub(crate) paused: bool,
}

/// A dead-lettered job.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeadEntry {
    #[schema(value_type = String, format = Uuid)]
    id: String,
    kind: String,
    scope: String,
    /// Attempts it had started.
    attempt: u32,
    #[schema(value_type = serde_json::Value)]
    payload: Box<RawValue>,
    /// Why it died.
    reason: String,
    /// When (Unix ms; absent for a record an older version kept).
    died_ms: Option<u64>,
}

impl From<DeadJob> for DeadEntry {
    fn from(d: DeadJob) -> Self {
        Self {
            id: d.job.id.to_string(),
            kind: d.job.kind,
            scope: d.job.scope.to_string(),
            attempt: d.job.attempt,
            payload: json_or_text(&d.job.payload),
            reason: d.reason,
            died_ms: d.died_ms,
        }
    }
}

/// A page of a queue's dead letters, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeadPage {
    /// Dead letters the queue keeps.
    pub(crate) total: u64,
    pub(crate) jobs: Vec<DeadEntry>,
}

/// Which of a queue's live jobs to list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct JobsQuery {
    /// `ready` (claimable now, next first; a group's are not listed) or `delayed` (soonest
    /// due first). Default `ready`.
    pub(crate) state: Option<LiveState>,
    /// Most jobs answered (default 50, at most 1,000).
    #[param(maximum = 1000)]
    pub(crate) limit: Option<usize>,
    /// Jobs skipped from the first (default 0, at most 10,000).
    #[param(maximum = 10_000)]
    pub(crate) offset: Option<usize>,
}

/// Which live jobs a page lists.
#[derive(Clone, Copy, Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LiveState {
    /// Claimable now.
    Ready,
    /// Waiting for their time.
    Delayed,
}

/// Most rows a page answers: `limit` (default 50), refused past [`MAX_ROWS`] as the document
/// says rather than cut short.
pub(crate) fn rows(limit: Option<usize>) -> Result<usize, ApiError> {
    match limit {
        Some(n) if n > MAX_ROWS => Err(ApiError::invalid(format!("limit {n}: at most {MAX_ROWS}"))),
        n => Ok(n.unwrap_or(50)),
    }
}

/// Most rows one page answers.
pub(crate) const MAX_ROWS: usize = 1_000;

/// Deepest a dead-letter page may start (dead letters skipped from the newest).
pub(crate) const MAX_DEAD_OFFSET: usize = 100_000_000;

/// A queue's ready or delayed jobs.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct JobsPage {
    pub(crate) jobs: Vec<JobStatus>,
}

/// Where to look for a job that is not live.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct JobQuery {
    /// The job's queue, if known: only its dead letters are searched.
    pub(crate) queue: Option<String>,
}

/// Which page of dead letters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeadQuery {
    /// Most entries answered (default 50, at most 1,000).
    #[param(maximum = 1000)]
    pub(crate) limit: Option<usize>,
    /// Entries skipped from the newest (default 0, at most 100,000,000).
    #[param(maximum = 100_000_000)]
    pub(crate) offset: Option<usize>,
}

/// Which dead letters to retry or delete, and how many: every condition given must hold.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryRequest {
    /// At most this many, oldest first (default: every one the queue holds now).
    #[serde(default, deserialize_with = "integral::opt")]
    #[schema(maximum = 9_007_199_254_740_991_u64)]
    pub(crate) limit: Option<usize>,
    /// Only jobs of this kind.
    #[schema(value_type = Option<Name>)]
    pub(crate) kind: Option<String>,
    /// Only jobs whose reason contains this text (as written, case and all).
    #[schema(min_length = 1)]
    pub(crate) reason: Option<String>,
    /// Only jobs that died at least this many milliseconds ago (by this server's clock,
    /// against the coordinator's time of death).
    #[serde(default, deserialize_with = "integral::opt")]
    #[schema(maximum = 315_360_000_000_u64)]
    pub(crate) older_than_ms: Option<u64>,
}

impl RetryRequest {
    /// The filter it asks for (ages by this host's clock).
    pub(crate) fn filter(&self) -> Result<palisade::DeadFilter, String> {
        if self.limit.is_some_and(|n| n > 9_007_199_254_740_991) {
            return Err("limit: at most 9007199254740991 (2^53 - 1)".into());
        }
        if self.older_than_ms.is_some_and(|ms| ms > 315_360_000_000) {
            return Err("older_than_ms: at most ten years (315360000000)".into());
        }
        if let Some(kind) = &self.kind {
            palisade::cli_support::check_name("kind", kind).map_err(|e| e.to_string())?;
        }
        // (An empty text would take every dead letter: leave the field out for that.)
        if self.reason.as_deref() == Some("") {
            return Err("reason: an empty text takes every dead letter; leave it out".into());
        }
        Ok(palisade::DeadFilter {
            kind: self.kind.clone(),
            reason: self.reason.clone(),
            died_before_ms: self
                .older_than_ms
                .map(|age| palisade::store::unix_ms().saturating_sub(age)),
        })
    }
}

/// Dead letters moved back to their queue.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Retried {
    pub(crate) retried: usize,
    /// Dead letters read to find them (absent from a one-job retry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) read: Option<u64>,
    /// Taken by the filter but left dead: their ids name live jobs again, or their records
    /// cannot be revived.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kept: Option<u64>,
}

/// What to clear of a queue.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClearRequest {
    /// Kept with each cancelled job's dead-letter record (default: "queue cleared through the
    /// HTTP API").
    #[schema(min_length = 1, max_length = 1000)]
    pub(crate) reason: Option<String>,
}

/// A cleared queue: how many jobs were cancelled, and what is left.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Cleared {
    /// Ready and delayed jobs cancelled (each among the dead letters with the reason).
    pub(crate) cancelled: u64,
    /// Ready jobs left: of groups (never listed, so never cleared) or enqueued meanwhile.
    pub(crate) ready: u64,
    pub(crate) delayed: u64,
    /// Jobs waiting behind their scope's running job.
    pub(crate) waiting: u64,
}

/// Dead letters deleted for good.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Purged {
    pub(crate) purged: u64,
    /// Dead letters read to find them.
    pub(crate) read: u64,
}

/// One dependency of a flow step.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AfterRequest {
    /// The step it runs after.
    #[schema(value_type = Name)]
    step: String,
    /// What it does if that step dies: `fail` (default: it dies too), `skip` or `run`.
    #[serde(default)]
    #[schema(value_type = OnDeadSchema)]
    on_dead: OnDead,
}

/// What a step does if a step it runs after dies (the document's name for `OnDead`).
#[derive(ToSchema)]
#[schema(as = OnDead)]
#[allow(dead_code, non_camel_case_types)] // (only its schema is used)
enum OnDeadSchema {
    fail,
    skip,
    run,
}

/// One step of a flow.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepRequest {
    /// Its name, unique in the flow (no `/`).
    #[schema(value_type = Name)]
    name: String,
    /// Its job (without `id` or `unique_key`: a step's id is the flow's).
    job: JobRequest,
    /// The steps it runs after (none: ready as soon as the flow is created).
    #[serde(default)]
    after: Vec<AfterRequest>,
}

/// A flow: a DAG of jobs, created all or nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FlowRequest {
    /// Its id, chosen by the caller (creating it again adds nothing); by default the
    /// `Idempotency-Key` header's, else a new one.
    id: Option<uuid::Uuid>,
    /// 1 to 10,000 steps.
    #[schema(min_items = 1, max_items = 10000)]
    steps: Vec<StepRequest>,
}

impl FlowRequest {
    /// Whether sending it again cannot create a second flow: it names its id.
    pub(crate) fn is_idempotent(&self) -> bool {
        self.id.is_some()
    }
}

/// An action's body: `{}` (or nothing), sent with `Content-Type: application/json` like every
/// request that changes anything.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Empty {}

impl FlowRequest {
    /// The flow, every step's job checked as an enqueue's and the whole as the library
    /// checks it; `keyed` is the id an `Idempotency-Key` header maps to.
    pub(crate) fn flow(
        &self,
        registry: &Registry,
        max_payload_bytes: usize,
        keyed: Option<FlowId>,
    ) -> Result<Flow, ApiError> {
        let id = match (self.id, keyed) {
            (Some(_), Some(_)) => {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_job",
                    "give an Idempotency-Key header or an id, not both",
                ))
            }
            (Some(id), None) => FlowId::from(id),
            (None, Some(id)) => id,
            (None, None) => FlowId::new(),
        };
        if self.steps.is_empty() || self.steps.len() > palisade::MAX_FLOW_STEPS {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_job",
                format!(
                    "{} steps; a flow has 1 to {}",
                    self.steps.len(),
                    palisade::MAX_FLOW_STEPS
                ),
            ));
        }
        let mut flow = Flow::with_id(id);
        for (i, step) in self.steps.iter().enumerate() {
            let job = step
                .job
                .job(registry, max_payload_bytes, None)
                .map_err(|e| e.within(&format!("steps[{i}] {:?}", step.name)))?;
            flow = flow.step_with(
                step.name.as_str(),
                job,
                step.after.iter().map(|a| (a.step.as_str(), a.on_dead)),
            );
        }
        flow.validate(max_payload_bytes)?;
        Ok(flow)
    }
}

/// The flow id an `Idempotency-Key` header names: the same key, the same flow, so a retried
/// request creates nothing new.
pub(crate) fn idempotent_flow_id(header: &str) -> Result<FlowId, ApiError> {
    // The same rules as a job's key.
    idempotency_key(header, None)?;
    // A fixed namespace of Palisade's own (a v4 UUID, chosen once).
    const NAMESPACE: uuid::Uuid = uuid::uuid!("0b6f9c3e-4f8a-4d7e-9b1c-5a2e8d3f6c71");
    Ok(FlowId::from(uuid::Uuid::new_v5(
        &NAMESPACE,
        format!("flow:{header}").as_bytes(),
    )))
}

/// A created flow.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FlowCreated {
    #[schema(value_type = String, format = Uuid)]
    pub(crate) id: String,
}

/// A flow's state and how each ended step ended.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FlowView {
    #[schema(value_type = String, format = Uuid)]
    id: String,
    #[schema(value_type = String)]
    state: FlowState,
    steps: usize,
    /// Steps released (ready, running or ended) so far.
    released: usize,
    /// How each step that ended ended (`completed`, `dead`, `skipped`), by step name.
    #[schema(value_type = std::collections::HashMap<String, String>)]
    ended: std::collections::HashMap<String, StepEnd>,
    /// Every step in run order (each after the steps it runs after) with where it is.
    step_list: Vec<FlowStepView>,
}

/// One step of a flow.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FlowStepView {
    name: String,
    /// Its job (`GET /api/v1/jobs/{id}`).
    #[schema(value_type = String, format = Uuid)]
    job: String,
    /// The steps it runs after.
    after: Vec<String>,
    /// `waiting` (a step it runs after has not ended), `released` (its job is ready, delayed
    /// or running), or how it ended: `completed`, `dead`, `skipped`.
    #[schema(example = "released")]
    state: String,
}

impl FlowView {
    pub(crate) fn of(s: palisade::FlowStatus, steps: Vec<palisade::StepStatus>) -> Self {
        let step_list = steps
            .into_iter()
            .map(|st| FlowStepView {
                state: st.state.as_str().into(),
                name: st.name,
                job: st.job.to_string(),
                after: st.after,
            })
            .collect();
        Self {
            id: s.id.to_string(),
            state: s.state,
            steps: s.steps,
            released: s.released,
            ended: s.ended,
            step_list,
        }
    }
}

/// A cancelled flow.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FlowCancelled {
    /// Jobs stopped (not started, ready or running).
    pub(crate) stopped: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        #[derive(Deserialize)]
        struct Mail {
            #[allow(dead_code)]
            to: String,
        }
        Registry::new().register("mail", |_ctx, _m: Mail| async { Ok(()) })
    }

    fn request(json: &str) -> Result<JobRequest, ApiError> {
        parse(json.as_bytes())
    }

    #[test]
    fn a_request_becomes_the_job_it_names() {
        let r = request(
            r#"{"kind":"mail","payload":{"to":"a@x","n":123456789012345678901234567890},
               "queue":"q","scope":"user:7","priority":-3,"delay_ms":1500,
               "max_attempts":2,"unique_key":"u","unique_ttl_ms":60000}"#,
        )
        .unwrap();
        let job = r.job(&registry(), 1 << 20, None).unwrap();
        assert_eq!(job.queue, "q");
        assert_eq!(job.scope.as_ref().unwrap().as_str(), "user:7");
        assert_eq!(job.priority, -3);
        assert_eq!(job.delay, Duration::from_millis(1500));
        assert_eq!(job.max_attempts, 2);
        let unique = job.unique.unwrap();
        assert_eq!(
            (unique.key.as_str(), unique.ttl),
            ("u", Duration::from_secs(60))
        );
        // Kept as sent: a number beyond f64 is not rounded.
        assert!(
            job.payload.contains("123456789012345678901234567890"),
            "{}",
            job.payload
        );
    }

    #[test]
    fn bad_requests_are_refused_with_their_reason() {
        let cases: &[(&str, &str)] = &[
            (r#"{"kind":"mail""#, "invalid_json"),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"prio":1}"#,
                "invalid_request",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"priority":"high"}"#,
                "invalid_request",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"priority":4294967296}"#,
                "invalid_request",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"delay_ms":-1}"#,
                "invalid_request",
            ),
            (r#"{"kind":"mail"}"#, "invalid_request"),
            (r#"[]"#, "invalid_request"),
        ];
        for (body, code) in cases {
            let err = request(body).unwrap_err();
            assert_eq!(err.parts().1, *code, "{body}: {err:?}");
        }
        let refused: &[(&str, &str)] = &[
            (r#"{"kind":"nope","payload":{}}"#, "unknown_kind"),
            (
                r#"{"kind":"mail","payload":{"too":"a"}}"#,
                "invalid_payload",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"queue":""}"#,
                "invalid_job",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"queue":"a\u202eb"}"#,
                "invalid_job",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"priority":5000}"#,
                "invalid_job",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"delay_ms":18446744073709551615}"#,
                "invalid_job",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"max_attempts":0}"#,
                "invalid_job",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"scope":"job:5b0c7f2e-3b7b-4c8e-9a55-1f0b8d7c6e5a"}"#,
                "invalid_job",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"unique_ttl_ms":5}"#,
                "invalid_job",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"delay_ms":31536000001}"#,
                "invalid_job",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"unique_key":"u","unique_ttl_ms":31536000001}"#,
                "invalid_job",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a"},"unique_key":"idem:one:k"}"#,
                "invalid_job",
            ),
            (
                r#"{"kind":"mail","payload":{"to":"a","pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}"#,
                "invalid_job",
            ),
        ];
        for (body, code) in refused {
            let err = request(body)
                .unwrap()
                .job(&registry(), 64, None)
                .unwrap_err();
            assert_eq!(
                err.parts(),
                (StatusCode::UNPROCESSABLE_ENTITY, *code),
                "{body}: {err:?}"
            );
        }
        // A header key and a body key would disagree on what makes the enqueue unique.
        let both = request(r#"{"kind":"mail","payload":{"to":"a"},"unique_key":"u"}"#).unwrap();
        let err = both.job(&registry(), 1024, Some("k".into())).unwrap_err();
        assert_eq!(err.parts().1, "invalid_job");
        let ttl = request(r#"{"kind":"mail","payload":{"to":"a"},"unique_ttl_ms":60000}"#).unwrap();
        let err = ttl.job(&registry(), 1024, Some("k".into())).unwrap_err();
        assert!(
            err.message
                .contains("unique_ttl_ms with an Idempotency-Key"),
            "{err:?}"
        );
    }

    #[test]
    fn idempotency_keys_follow_the_name_rules_and_differ_per_batch_item() {
        assert_eq!(idempotency_key("abc", None).unwrap(), "idem:one:abc");
        // A single key never names a batch's job, nor the other way round.
        assert_ne!(
            idempotency_key("a#0", None).unwrap(),
            idempotency_key("a", Some(0)).unwrap()
        );
        assert_ne!(
            idempotency_key("batch:0:a", None).unwrap(),
            idempotency_key("a", Some(0)).unwrap()
        );
        // The longest key taken still makes a valid unique key, batch index and all.
        let long = "k".repeat(MAX_IDEMPOTENCY_KEY_BYTES);
        let key = idempotency_key(&long, Some(999)).unwrap();
        palisade::cli_support::check_name("unique key", &key).unwrap();
        assert!(idempotency_key(&format!("{long}k"), None).is_err());
        assert_ne!(
            idempotency_key("abc", Some(0)).unwrap(),
            idempotency_key("abc", Some(1)).unwrap()
        );
        for bad in ["", "a\tb", "a\u{200B}b", &"k".repeat(600)] {
            assert!(idempotency_key(bad, None).is_err(), "{bad:?}");
            assert!(idempotent_flow_id(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            idempotent_flow_id("k").unwrap(),
            idempotent_flow_id("k").unwrap()
        );
        assert_ne!(
            idempotent_flow_id("k").unwrap(),
            idempotent_flow_id("l").unwrap()
        );
    }

    /// Pinned: a request retried against the other release of a rolling deploy must find the
    /// job or flow the first one made. The flow id was computed apart from this code
    /// (Python's `uuid.uuid5` over the namespace and `"flow:<key>"`). Never update a literal to
    /// make it pass.
    #[test]
    fn golden_idempotency_keys_and_flow_ids() {
        assert_eq!(
            idempotency_key("order-42", None).unwrap(),
            "idem:one:order-42"
        );
        assert_eq!(
            idempotency_key("order-42", Some(3)).unwrap(),
            "idem:batch:3:order-42"
        );
        assert_eq!(
            idempotent_flow_id("order-42").unwrap().to_string(),
            "db002956-a8d5-56b2-ae6b-7fbeb213b4eb"
        );
    }

    #[test]
    fn a_flow_request_is_checked_whole() {
        let flow: FlowRequest = parse(
            br#"{"steps":[{"name":"a","job":{"kind":"mail","payload":{"to":"x"}}},
                {"name":"b","job":{"kind":"mail","payload":{"to":"y"}},"after":[{"step":"a","on_dead":"run"}]}]}"#,
        )
        .unwrap();
        let f = flow.flow(&registry(), 1024, None).unwrap();
        assert_eq!(f.steps()[1].after[0].on_dead, OnDead::Run);
        for bad in [
            // A dependency on a step the flow does not have.
            r#"{"steps":[{"name":"a","job":{"kind":"mail","payload":{"to":"x"}},"after":[{"step":"zz"}]}]}"#,
            // A step with a unique key of its own.
            r#"{"steps":[{"name":"a","job":{"kind":"mail","payload":{"to":"x"},"unique_key":"u"}}]}"#,
            r#"{"steps":[]}"#,
        ] {
            let r: FlowRequest = parse(bad.as_bytes()).unwrap();
            assert_eq!(
                r.flow(&registry(), 1024, None).unwrap_err().parts().1,
                "invalid_job",
                "{bad}"
            );
        }
        // A bad step is named, by index and name.
        let r: FlowRequest =
            parse(br#"{"steps":[{"name":"a","job":{"kind":"nope","payload":{}}}]}"#).unwrap();
        let err = r.flow(&registry(), 1024, None).unwrap_err();
        assert!(err.message.starts_with("steps[0] \"a\": "), "{err:?}");
        assert_eq!(err.parts().1, "unknown_kind");
    }

    #[test]
    fn a_status_shows_json_as_json_and_anything_else_as_text() {
        let s = JobStatus::of(
            JobId::new(),
            Found::Result(r#"{"ok":{"total":12345678901234567890123}}"#.into()),
            Some("not json".into()),
        );
        let text = serde_json::to_string(&s).unwrap();
        assert!(
            text.contains(r#""result":{"total":12345678901234567890123}"#),
            "{text}"
        );
        assert!(text.contains(r#""progress":"not json""#), "{text}");
        assert!(text.contains(r#""state":"completed""#), "{text}");
    }

    /// An enqueue whose outcome is unknown is retryable only when a resend cannot add a second
    /// job: a unique key held a day or longer, or an id alone.
    #[test]
    fn outcome_unknown_is_retryable_only_for_an_idempotent_request() {
        let lost = || ApiError::from(palisade::Error::OutcomeUnknown("reply lost".into()));
        let cases = [
            (r#"{"kind":"mail","payload":{}}"#, false),
            (r#"{"kind":"mail","payload":{},"unique_key":"u"}"#, true),
            (
                r#"{"kind":"mail","payload":{},"unique_key":"u","unique_ttl_ms":86400000}"#,
                true,
            ),
            (
                r#"{"kind":"mail","payload":{},"unique_key":"u","unique_ttl_ms":1000}"#,
                false,
            ),
            (
                r#"{"kind":"mail","payload":{},"id":"5b0c7f2e-3b7b-4c8e-9a55-1f0b8d7c6e5a"}"#,
                true,
            ),
            (
                r#"{"kind":"mail","payload":{},"id":"5b0c7f2e-3b7b-4c8e-9a55-1f0b8d7c6e5a","unique_key":"u","unique_ttl_ms":0}"#,
                false,
            ),
        ];
        for (body, safe) in cases {
            let r = request(body).unwrap();
            assert_eq!(r.is_idempotent(), safe, "{body}");
            let e = lost().unless_idempotent(r.is_idempotent());
            assert_eq!(e.retryable, safe, "{body}");
            assert_eq!(e.message.contains("Idempotency-Key"), !safe, "{body}");
        }
        // Other errors keep their class.
        let e =
            ApiError::from(palisade::Error::Unavailable("down".into())).unless_idempotent(false);
        assert!(e.retryable);
    }

    #[test]
    fn retryable_errors_say_so() {
        let e = ApiError::from(palisade::Error::Unavailable("down".into()));
        assert_eq!(e.parts(), (StatusCode::SERVICE_UNAVAILABLE, "unavailable"));
        let response = e.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let e = ApiError::from(palisade::Error::OutcomeUnknown("lost".into()));
        assert_eq!(e.parts().1, "outcome_unknown");
        // A server's misconfiguration is not the caller's fault.
        let e = ApiError::from(palisade::Error::Config("no TLS roots".into()));
        assert_eq!(e.parts(), (StatusCode::INTERNAL_SERVER_ERROR, "backend"));
        let e = ApiError::from(palisade::Error::Backend("WRONGTYPE".into()));
        assert_eq!(e.parts(), (StatusCode::INTERNAL_SERVER_ERROR, "backend"));
    }
}

/// A waitpoint's completion: the value its run's wait receives.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitpointRequest {
    /// Any JSON (at most 64 KiB): what `wait_for` decodes (`true`, `{"approved": false}`).
    pub(crate) value: serde_json::Value,
}

/// Whether this request completed the waitpoint.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WaitpointOutcome {
    /// This value is the waitpoint's now.
    Completed,
    /// It was completed before; nothing changed.
    Already,
}

/// What completing a waitpoint did.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WaitpointCompleted {
    pub(crate) outcome: WaitpointOutcome,
    /// The value the waitpoint holds (this request's, or the first one's).
    pub(crate) value: serde_json::Value,
    /// Whether the value held equals this request's.
    pub(crate) same: bool,
    /// The job whose run was woken, if one waited.
    pub(crate) woke: Option<String>,
}

/// A waitpoint as kept.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WaitpointView {
    pub(crate) id: String,
    pub(crate) completed: bool,
    /// Its value, once completed.
    pub(crate) value: Option<serde_json::Value>,
    /// The job whose run waits for it (the latest to ask).
    pub(crate) waiter: Option<String>,
}
