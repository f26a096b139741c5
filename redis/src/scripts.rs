//! The coordinator's scripts (`redis/lua/`, each prefixed with `common.lua`, loaded once
//! and run by EVALSHA): the macro that declares one beside the Rust that runs it, and the
//! decoders of their structured replies (rows, tokens, watermarks): each shape is decoded
//! here and nowhere else.
//!
//! Tokens travel in two forms, each forced by its reader: coordinator scripts return a
//! token as its epoch and counter (Lua's doubles cannot hold `epoch << 40 | counter`
//! exactly), decoded by [`token`]; the sink script compares 20-digit zero-padded decimals
//! (string order = numeric order), made by `fenced::padded`.

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use super::connection::{garbage, parse};
use crate::error::Result;
use crate::ids::{FencingToken, JobId, Lease, LeaseId, Scope};
use crate::job::{Claim, Job};
use crate::store::LeaseInfo;

/// Declares a coordinator script, `common.lua` prefixed, beside the Rust that runs it:
/// `static CLAIM: LazyLock<Script> = coordinator_script!("claim.lua");` (the file under
/// `redis/lua/`). Adding an operation therefore touches no list of scripts.
macro_rules! coordinator_script {
    ($file:literal) => {
        std::sync::LazyLock::new(|| {
            deadpool_redis::redis::Script::new(concat!(
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/common.lua")),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file))
            ))
        })
    };
}
pub(super) use coordinator_script;

/// A count a script hands on to Redis as a bound (a ZRANGE's stop), at most 2^40. Lua's
/// numbers are doubles and reach Redis printed with 17 significant digits: past about 10^17
/// that is exponent form, which Redis refuses — so "all" asked as `usize::MAX` would read
/// nothing, or fail the script. (The same bound as `MAX_DEAD_RETENTION`, for the same reason.)
pub(super) fn script_count(n: usize) -> usize {
    n.min(crate::store::MAX_DEAD_RETENTION)
}

/// A token from the epoch and counter strings of a reply; out-of-range parts are a corrupt
/// record, never a panic.
pub(super) fn token(epoch: &str, counter: &str) -> Result<FencingToken> {
    FencingToken::try_new(parse(epoch)?, parse(counter)?)
        .ok_or_else(|| garbage(format_args!("token {epoch}:{counter} out of range")))
}

/// The last element of `settle.lua`'s reply: `"w:<epoch>:<counter>"` (or `"w:"` before any
/// epoch). The counter may be 2^40 — the next epoch's token 0 — so the token is built from its
/// integer value, not from parts.
pub(super) fn decode_watermark(reply: &str) -> Result<Option<FencingToken>> {
    let Some(rest) = reply.strip_prefix("w:") else {
        return Err(garbage(format_args!("bad watermark {reply:?}")));
    };
    if rest.is_empty() {
        return Ok(None);
    }
    let (epoch, counter) = rest
        .split_once(':')
        .ok_or_else(|| garbage(format_args!("bad watermark {reply:?}")))?;
    FencingToken::watermark_at(parse(epoch)?, parse(counter)?)
        .map(Some)
        .ok_or_else(|| garbage(format_args!("watermark {reply:?} out of range")))
}

/// One row of `claim.lua`: `{job id, lease id, epoch, counter, meta, attempt, stalls,
/// snoozes}`.
pub(super) fn decode_claim(row: Vec<String>, queue: &str, expires_at: Instant) -> Result<Claim> {
    let [id, lease, epoch, counter, meta, attempt, stalls, snoozes] =
        <[String; 8]>::try_from(row).map_err(|r| garbage(format_args!("bad claim row {r:?}")))?;
    let meta: Meta = serde_json::from_str(&meta).map_err(garbage)?;
    let job_id = JobId::from(parse::<uuid::Uuid>(&id)?);
    // (A snooze count another program wrote oddly reads as 0, as the scripts read it.)
    let counts = [
        parse(&attempt)?,
        parse(&stalls)?,
        snoozes.parse().unwrap_or(0),
    ];
    let job = meta.into_job(job_id, queue.to_owned(), counts);
    Ok(Claim {
        lease: Lease {
            id: LeaseId::from(parse::<uuid::Uuid>(&lease)?),
            token: token(&epoch, &counter)?,
            scope: job.scope.clone(),
            expires_at,
        },
        job,
    })
}

/// The token a `lease_job` entry names ("job id \t epoch \t counter \t ..."): `None` for an
/// entry too short to name one.
pub(super) fn entry_token(entry: &str) -> Option<Result<FencingToken>> {
    let mut fields = entry.split('\t').skip(1);
    Some(token(fields.next()?, fields.next()?))
}

/// One row of `leases.lua`: `{lease, job, scope, epoch, counter, worker, age ms, expires in
/// ms, queue, kind}`.
pub(super) fn decode_lease_row(row: Vec<String>) -> Result<LeaseInfo> {
    let millis = |s: &str| parse::<i64>(s).map(|ms| Duration::from_millis(ms.max(0) as u64));
    let [lease, job, scope, epoch, counter, worker, age, expires_in, queue, kind] =
        <[String; 10]>::try_from(row).map_err(|r| garbage(format_args!("bad lease row {r:?}")))?;
    Ok(LeaseInfo {
        lease: LeaseId::from(parse::<uuid::Uuid>(&lease)?),
        job: JobId::from(parse::<uuid::Uuid>(&job)?),
        scope: Scope::new(scope),
        token: token(&epoch, &counter)?,
        worker,
        queue,
        kind,
        age: millis(&age)?,
        expires_in: millis(&expires_in)?,
    })
}

/// What the client writes into a job's `meta` field at enqueue and reads back at claim; the
/// scripts decode it only on rare paths (retry, stall, dead-letter).
#[derive(serde::Serialize, Deserialize)]
pub(super) struct Meta {
    pub(super) kind: String,
    pub(super) payload: String,
    pub(super) queue: String,
    pub(super) scope: Option<Scope>,
    pub(super) priority: i32,
    pub(super) max_attempts: u32,
    pub(super) max_stalls: u32,
    /// The flow step a held job is (written by `hold`, absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) flow: Option<crate::flow::FlowStep>,
    /// The schedule tick it was enqueued for (kept in its dead-letter record too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) tick: Option<crate::job::Tick>,
    /// The trace it belongs to (kept in its dead-letter record too).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::traceparent::lenient"
    )]
    pub(super) trace: Option<crate::traceparent::TraceContext>,
    /// Snoozes allowed (kept in its dead-letter record too); not written when it is the
    /// default, which every record then costs nothing.
    #[serde(
        default = "crate::job::default_max_snoozes",
        skip_serializing_if = "crate::job::is_default_max_snoozes"
    )]
    pub(super) max_snoozes: u32,
    /// How long one attempt may run, ms (kept in its dead-letter record too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) timeout_ms: Option<u64>,
    /// Not started by then (Unix ms), it dies as expired (kept in its dead-letter record,
    /// dropped when it is retried from there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) deadline_ms: Option<u64>,
    /// The group it shares claims with (also the record's `group` field, which the scripts
    /// read; kept in its dead-letter record too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) group: Option<String>,
}

impl Meta {
    /// The job this record describes, with its `[attempt, stalls, snoozes]` as the caller
    /// read them (a claim and a job view read them from the job's hash).
    pub(super) fn into_job(self, id: JobId, queue: String, counts: [u32; 3]) -> Job {
        let [attempt, stalls, snoozes] = counts;
        Job {
            id,
            queue,
            kind: self.kind,
            payload: self.payload,
            scope: self.scope.unwrap_or_else(|| Scope::of_job(id)),
            attempt,
            stalls,
            snoozes,
            max_snoozes: self.max_snoozes,
            timeout: self.timeout_ms.map(Duration::from_millis),
            deadline_ms: self.deadline_ms,
            max_attempts: self.max_attempts,
            max_stalls: self.max_stalls,
            flow: self.flow,
            tick: self.tick,
            trace: self.trace,
            group: self.group,
        }
    }

    /// The record as the scripts take it (JSON), and its scope as the `scope` field they
    /// take beside it ("" for a job's default scope, which no other job can share).
    pub(super) fn encoded(&self) -> Result<(String, String)> {
        let json =
            serde_json::to_string(self).map_err(|e| crate::error::Error::Payload(e.to_string()))?;
        let scope = self
            .scope
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default();
        Ok((json, scope))
    }

    /// The record of `job` as enqueued (a flow step's `flow` is added by the caller, which
    /// reads the names it sends beside the record from here: the payload is not copied).
    pub(super) fn of(job: crate::job::NewJob) -> Self {
        Self {
            kind: job.kind,
            payload: job.payload,
            queue: job.queue,
            scope: job.scope,
            priority: job.priority,
            max_attempts: job.max_attempts,
            max_stalls: job.max_stalls,
            flow: None,
            tick: job.tick,
            trace: job.trace,
            max_snoozes: job.max_snoozes,
            timeout_ms: job.timeout.map(|t| t.as_millis() as u64),
            deadline_ms: job.deadline_ms,
            group: job.group,
        }
    }
}
