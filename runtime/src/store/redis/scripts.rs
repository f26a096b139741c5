//! The coordinator's scripts (`runtime/lua/`, each prefixed with `common.lua`), loaded once
//! and run by EVALSHA, with the decoders of their replies beside them: every reply shape is
//! decoded here and nowhere else.
//!
//! Tokens travel in two forms, each forced by its reader: coordinator scripts return a
//! token as its epoch and counter (Lua's doubles cannot hold `epoch << 40 | counter`
//! exactly), decoded by [`token`]; the sink script compares 20-digit zero-padded decimals
//! (string order = numeric order), made by `fenced::padded`.

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::Script;
use serde::Deserialize;
use tokio::time::Instant;

use super::connection::{garbage, parse};
use crate::error::Result;
use crate::ids::{FencingToken, JobId, Lease, LeaseId, Scope};
use crate::job::{Claim, Job};
use crate::store::LeaseInfo;

macro_rules! coordinator_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../../lua/common.lua"),
                include_str!(concat!("../../../lua/", $file))
            ))
        })
    };
}

pub(super) static ENQUEUE: LazyLock<Script> = coordinator_script!("enqueue.lua");
pub(super) static CLAIM: LazyLock<Script> = coordinator_script!("claim.lua");
pub(super) static RENEW: LazyLock<Script> = coordinator_script!("renew.lua");
pub(super) static SETTLE: LazyLock<Script> = coordinator_script!("settle.lua");
pub(super) static REAP: LazyLock<Script> = coordinator_script!("reap.lua");
pub(super) static COUNTS: LazyLock<Script> = coordinator_script!("counts.lua");
pub(super) static LEASES: LazyLock<Script> = coordinator_script!("leases.lua");
pub(super) static RETRY_DEAD: LazyLock<Script> = coordinator_script!("retry_dead.lua");
pub(super) static ESTABLISH_EPOCH: LazyLock<Script> = coordinator_script!("establish_epoch.lua");
pub(super) static PURGE_DEAD: LazyLock<Script> = coordinator_script!("purge_dead.lua");
pub(super) static OLDEST: LazyLock<Script> = coordinator_script!("oldest.lua");
pub(super) static CANCEL: LazyLock<Script> = coordinator_script!("cancel.lua");
/// Raises a schedule's mark, never lowers it: KEYS[1] the marks hash, KEYS[2] the layout
/// generation record, ARGV name, ms and the caller's generation (refused, changing nothing,
/// for another: `common.lua`, `wrong_layout`).
pub(super) static ADVANCE_SCHEDULE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if (redis.call('GET', KEYS[2]) or '0') ~= ARGV[3] then \
           return redis.error_reply('PALISADE_LAYOUT this process runs layout generation ' \
             .. ARGV[3] .. ', not the installation\\'s: restart it; nothing was changed') end \
         local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '') \
         if cur == nil or tonumber(ARGV[2]) > cur then \
           redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end \
         return 0",
    )
});
/// Raises the epoch floor to ARGV[1] and, if the epoch in force is lower, moves to it with a
/// fresh counter (as a fenced settlement's reseed does): KEYS[1] the epoch hash, KEYS[2] the
/// counter; returns the epoch in force, or the floor when there is no epoch yet. Reads and
/// checks before it writes; a record of the wrong type fails before any change.
pub(super) static RAISE_EPOCH: LazyLock<Script> = LazyLock::new(|| {
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
/// Takes or keeps a role: KEYS[1] the role's key, KEYS[2] the layout generation record, ARGV
/// holder, ttl ms and the caller's generation (refused for another, as above); 1 if held.
pub(super) static HOLD_ROLE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if (redis.call('GET', KEYS[2]) or '0') ~= ARGV[3] then \
           return redis.error_reply('PALISADE_LAYOUT this process runs layout generation ' \
             .. ARGV[3] .. ', not the installation\\'s: restart it; nothing was changed') end \
         local cur = redis.call('GET', KEYS[1]) \
         if cur == false or cur == ARGV[1] then \
           redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end \
         return 0",
    )
});

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

/// One row of `claim.lua`: `{job id, lease id, epoch, counter, meta, attempt, stalls}`.
pub(super) fn decode_claim(row: Vec<String>, queue: &str, expires_at: Instant) -> Result<Claim> {
    let [id, lease, epoch, counter, meta, attempt, stalls] =
        <[String; 7]>::try_from(row).map_err(|r| garbage(format_args!("bad claim row {r:?}")))?;
    let meta: Meta = serde_json::from_str(&meta).map_err(garbage)?;
    let job_id = JobId::from(parse::<uuid::Uuid>(&id)?);
    let scope = meta.scope.unwrap_or_else(|| Scope::of_job(job_id));
    Ok(Claim {
        job: Job {
            id: job_id,
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
            token: token(&epoch, &counter)?,
            scope,
            expires_at,
        },
    })
}

/// One row of `leases.lua`: `{lease, job, scope, epoch, counter, worker, age ms, expires in
/// ms}`.
pub(super) fn decode_lease_row(row: Vec<String>) -> Result<LeaseInfo> {
    let millis = |s: &str| parse::<i64>(s).map(|ms| Duration::from_millis(ms.max(0) as u64));
    let [lease, job, scope, epoch, counter, worker, age, expires_in] =
        <[String; 8]>::try_from(row).map_err(|r| garbage(format_args!("bad lease row {r:?}")))?;
    Ok(LeaseInfo {
        lease: LeaseId::from(parse::<uuid::Uuid>(&lease)?),
        job: JobId::from(parse::<uuid::Uuid>(&job)?),
        scope: Scope::new(scope),
        token: token(&epoch, &counter)?,
        worker,
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
}
