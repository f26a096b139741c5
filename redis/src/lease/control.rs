//! The Redis coordinator's clock, roles, schedules and records.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_redis::redis::{self, Script};

use super::RedisLeaseStore;
use crate::connection::garbage;
use crate::error::Result;
use crate::ids::JobId;
use crate::job::MAX_DELAY;
use crate::schedule::ScheduleSpec;
use crate::store::waitpoint::{
    check_waitpoint_id, check_waitpoint_value, Completion, Waitpoint, WAITPOINT_RETENTION,
};
use crate::store::{
    check_role_ttl, check_schedule, ControlStore, HistorySample, RecordStore, RejectionNote,
    WorkerBeat, HISTORY_SAMPLES, PROGRESS_RETENTION, REJECTION_JOURNAL,
};

/// The guard of the two scripts below, the rule of `common.lua`'s `wrong_layout` and
/// `wrong_format`: KEYS[2] the layout generation record, KEYS[3] the format level record,
/// ARGV[3] the caller's generation; refused, changing nothing, for another generation or a
/// level outside this build's window.
/// `e` naming `key` when it is Redis' WRONGTYPE (which names no key): the operator learns
/// which key another program wrote over.
fn named(e: crate::error::Error, key: &str) -> crate::error::Error {
    match e {
        crate::error::Error::Backend(m) if m.contains("WRONGTYPE") => crate::error::Error::Backend(
            format!("{key} holds another type ({m}); delete or repair it"),
        ),
        other => other,
    }
}

fn guarded(body: &str) -> Script {
    let (low, high) = (crate::format::LEVELS.start(), crate::format::LEVELS.end());
    Script::new(&format!(
        "if (redis.call('GET', KEYS[2]) or '0') ~= ARGV[3] then \
           return redis.error_reply('PALISADE_LAYOUT this process runs layout generation ' \
             .. ARGV[3] .. ', not the installation\\'s: restart it; nothing was changed') end \
         local f = redis.pcall('GET', KEYS[3]) \
         if type(f) ~= 'string' and f ~= false then f = '(unreadable)' end \
         if f and not (string.match(f, '^%d+$') and #f <= 9 \
             and tonumber(f) >= {low} and tonumber(f) <= {high}) then \
           return redis.error_reply('PALISADE_FORMAT this process reads and writes format \
             levels {low} to {high}, the installation is at level ' .. f .. ': run a release \
             that reads it; nothing was changed') end \
         {body}"
    ))
}

/// Raises a schedule's mark, never lowers it: KEYS[1] the marks hash, KEYS[2] and KEYS[3]
/// and ARGV[3] as [`guarded`] takes them, ARGV name, ms.
static ADVANCE_SCHEDULE: LazyLock<Script> = LazyLock::new(|| {
    guarded(
        "local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '') \
         if cur == nil or tonumber(ARGV[2]) > cur then \
           redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end \
         return 0",
    )
});
/// Completes a waitpoint once: KEYS[1] its hash (`value`, `waiter`), ARGV value, ttl ms;
/// `{"already", value}`, or `{"first", waiter or ""}` after keeping the value. (Its one
/// read refuses a record of another type before anything changed.)
static COMPLETE_WAITPOINT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local v = redis.call('HGET', KEYS[1], 'value') \
         if v then return {'already', v} end \
         local w = redis.call('HGET', KEYS[1], 'waiter') or '' \
         redis.call('HSET', KEYS[1], 'value', ARGV[1]) \
         redis.call('PEXPIRE', KEYS[1], ARGV[2]) \
         return {'first', w}",
    )
});
/// A waitpoint's value, or notes its waiter: KEYS[1] its hash, ARGV job id, ttl ms; the
/// value, or nil after keeping the waiter.
static AWAIT_WAITPOINT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local v = redis.call('HGET', KEYS[1], 'value') \
         if v then return v end \
         redis.call('HSET', KEYS[1], 'waiter', ARGV[1]) \
         redis.call('PEXPIRE', KEYS[1], ARGV[2]) \
         return false",
    )
});
/// Takes or keeps a role: KEYS[1] the role's key, KEYS[2] and KEYS[3] and ARGV[3] as
/// [`guarded`] takes them, ARGV holder, ttl ms; 1 if held.
static HOLD_ROLE: LazyLock<Script> = LazyLock::new(|| {
    guarded(
        "local cur = redis.call('GET', KEYS[1]) \
         if cur == false or cur == ARGV[1] then \
           redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end \
         return 0",
    )
});

/// Registers a worker: KEYS[1] the base, ARGV name, beat JSON, ttl ms. Keeps
/// `workers` (name -> "<ms, Redis clock> TAB <JSON>") and `workers:seen` (name -> expiry),
/// and forgets up to 100 lapsed workers. Keys of another type are refused before any change.
static BEAT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local w, seen = KEYS[1] .. 'workers', KEYS[1] .. 'workers:seen' \
         local tw, ts = redis.call('TYPE', w).ok, redis.call('TYPE', seen).ok \
         if (tw ~= 'none' and tw ~= 'hash') or (ts ~= 'none' and ts ~= 'zset') then \
           return redis.error_reply('PALISADE_CORRUPT ' .. w .. ' or ' .. seen .. ' holds another type') end \
         local t = redis.call('TIME') \
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
         for _, gone in ipairs(redis.call('ZRANGEBYSCORE', seen, '-inf', now, 'LIMIT', 0, 100)) do \
           redis.call('HDEL', w, gone) redis.call('ZREM', seen, gone) end \
         redis.call('HSET', w, ARGV[1], string.format('%d', now) .. '\t' .. ARGV[2]) \
         redis.call('ZADD', seen, now + tonumber(ARGV[3]), ARGV[1]) \
         return 0",
    )
});
/// The live workers' records (see `BEAT`), by the Redis clock, at most 1,000. Read-only.
static WORKERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local t = redis.call('TIME') \
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
         local names = redis.call('ZRANGEBYSCORE', KEYS[1] .. 'workers:seen', '(' .. now, '+inf', \
           'LIMIT', 0, 1000) \
         if #names == 0 then return {} end \
         local out = {} \
         for i, v in ipairs(redis.call('HMGET', KEYS[1] .. 'workers', unpack(names))) do \
           if v then out[#out + 1] = v end end \
         return out",
    )
});

#[async_trait]
impl ControlStore for RedisLeaseStore {
    async fn now_ms(&self) -> Result<i64> {
        let mut conn = self.conn().await?;
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(secs * 1000 + micros / 1000)
    }

    async fn hold_role(&self, role: &str, holder: &str, ttl: Duration) -> Result<bool> {
        check_role_ttl(ttl)?;
        let mut conn = self.conn().await?;
        let held: i64 = HOLD_ROLE
            .key(format!("{}role:{role}", self.base))
            .key(format!("{}layout", self.base))
            .key(format!("{}format", self.base))
            .arg(holder)
            .arg(ttl.as_millis() as u64)
            .arg(self.generation)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(held == 1)
    }

    async fn beat(&self, beat: WorkerBeat, ttl: Duration) -> Result<()> {
        crate::job::check_name("worker name", &beat.worker)?;
        let json = serde_json::to_string(&beat).map_err(garbage)?;
        let mut conn = self.conn().await?;
        BEAT.key(&self.base)
            .arg(&beat.worker)
            .arg(json)
            .arg(ttl.as_millis().clamp(1, MAX_DELAY.as_millis()) as u64)
            .invoke_async::<()>(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    async fn workers(&self) -> Result<Vec<WorkerBeat>> {
        let mut conn = self.conn().await?;
        let raw: Vec<String> = WORKERS
            .key(&self.base)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        // A record that does not parse (a newer version's) does not hide the others.
        let mut workers: Vec<WorkerBeat> = raw
            .iter()
            .filter_map(|r| {
                let (seen, json) = r.split_once('\t')?;
                let mut beat: WorkerBeat = serde_json::from_str(json).ok()?;
                beat.seen_ms = seen.parse().ok()?;
                Some(beat)
            })
            .collect();
        workers.sort_by(|a, b| a.worker.cmp(&b.worker));
        Ok(workers)
    }

    async fn note_history(&self, sample: HistorySample) -> Result<()> {
        self.push_newest("history", &[sample], HISTORY_SAMPLES)
            .await
    }

    async fn history(&self, limit: usize) -> Result<Vec<HistorySample>> {
        self.newest("history", limit, HISTORY_SAMPLES).await
    }

    async fn schedules(&self) -> Result<Vec<ScheduleSpec>> {
        let mut conn = self.conn().await?;
        let raw: Vec<String> = redis::cmd("HVALS")
            .arg(format!("{}schedules", self.base))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        // One record that does not parse (a newer version's, say) does not hide the others.
        let mut specs: Vec<ScheduleSpec> = raw
            .iter()
            .filter_map(|r| match serde_json::from_str(r) {
                Ok(spec) => Some(spec),
                Err(e) => {
                    tracing::warn!(error = %e, "a kept schedule does not parse; skipped");
                    None
                }
            })
            .collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(specs)
    }

    async fn put_schedule(&self, spec: ScheduleSpec) -> Result<()> {
        check_schedule(&spec)?;
        let json = serde_json::to_string(&spec).map_err(garbage)?;
        let mut conn = self.conn().await?;
        redis::cmd("HSET")
            .arg(format!("{}schedules", self.base))
            .arg(&spec.name)
            .arg(json)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    async fn remove_schedule(&self, name: &str) -> Result<bool> {
        let mut conn = self.conn().await?;
        // The mark goes too: a schedule added again under this name starts from then.
        let (removed, _, _): (u64, u64, u64) = redis::pipe()
            .atomic()
            .hdel(format!("{}schedules", self.base), name)
            .hdel(format!("{}schedule_marks", self.base), name)
            .srem(format!("{}schedules_paused", self.base), name)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(removed > 0)
    }

    async fn pause_schedule(&self, name: &str, paused: bool) -> Result<bool> {
        let mut conn = self.conn().await?;
        let key = format!("{}schedules_paused", self.base);
        let cmd = if paused { "SADD" } else { "SREM" };
        let changed: u64 = redis::cmd(cmd)
            .arg(&key)
            .arg(name)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
            .map_err(|e| named(e, &key))?;
        if !paused && changed > 0 {
            // (Two steps: a crash between them leaves the pause's unpassed ticks to fire, as
            // before this rule; never a tick twice.)
            let now = self.now_ms().await?;
            self.advance_schedule(name, now).await?;
        }
        Ok(changed > 0)
    }

    async fn paused_schedules(&self) -> Result<Vec<String>> {
        let mut conn = self.conn().await?;
        let key = format!("{}schedules_paused", self.base);
        let mut names: Vec<String> = redis::cmd("SMEMBERS")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
            .map_err(|e| named(e, &key))?;
        names.sort();
        Ok(names)
    }

    async fn schedule_mark(&self, name: &str) -> Result<Option<i64>> {
        let mut conn = self.conn().await?;
        let mark: Option<i64> = redis::cmd("HGET")
            .arg(format!("{}schedule_marks", self.base))
            .arg(name)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(mark)
    }

    async fn advance_schedule(&self, name: &str, through: i64) -> Result<()> {
        let mut conn = self.conn().await?;
        ADVANCE_SCHEDULE
            .key(format!("{}schedule_marks", self.base))
            .key(format!("{}layout", self.base))
            .key(format!("{}format", self.base))
            .arg(name)
            .arg(through)
            .arg(self.generation)
            .invoke_async::<()>(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }
}

#[async_trait]
impl RecordStore for RedisLeaseStore {
    async fn put_result(&self, job: JobId, json: String, ttl: Duration) -> Result<()> {
        self.put_note("result", job, json, ttl).await
    }

    async fn result(&self, job: JobId) -> Result<Option<String>> {
        self.note("result", job).await
    }

    async fn put_progress(&self, job: JobId, json: String) -> Result<()> {
        self.put_note("progress", job, json, PROGRESS_RETENTION)
            .await
    }

    async fn progress(&self, job: JobId) -> Result<Option<String>> {
        self.note("progress", job).await
    }

    async fn note_rejections(&self, notes: Vec<RejectionNote>) -> Result<()> {
        self.push_newest("rejections", &notes, REJECTION_JOURNAL)
            .await
    }

    async fn rejections(&self, limit: usize) -> Result<Vec<RejectionNote>> {
        self.newest("rejections", limit, REJECTION_JOURNAL).await
    }

    async fn complete_waitpoint(&self, id: &str, value: String) -> Result<Completion> {
        check_waitpoint_id(id)?;
        check_waitpoint_value(&value)?;
        let key = self.waitpoint_key(id);
        let mut conn = self.conn().await?;
        let (what, held): (String, String) = COMPLETE_WAITPOINT
            .key(&key)
            .arg(value)
            .arg(WAITPOINT_RETENTION.as_millis() as u64)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| named(self.link.broken(e), &key))?;
        Ok(match what.as_str() {
            "already" => Completion::Already { value: held },
            _ => Completion::First {
                waiter: uuid::Uuid::try_parse(&held).ok().map(JobId::from),
            },
        })
    }

    async fn await_waitpoint(&self, id: &str, waiter: JobId) -> Result<Option<String>> {
        check_waitpoint_id(id)?;
        let key = self.waitpoint_key(id);
        let mut conn = self.conn().await?;
        AWAIT_WAITPOINT
            .key(&key)
            .arg(waiter.to_string())
            .arg(WAITPOINT_RETENTION.as_millis() as u64)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| named(self.link.broken(e), &key))
    }

    async fn waitpoint(&self, id: &str) -> Result<Option<Waitpoint>> {
        check_waitpoint_id(id)?;
        let key = self.waitpoint_key(id);
        let mut conn = self.conn().await?;
        let (value, waiter): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("value")
            .arg("waiter")
            .query_async(&mut conn)
            .await
            .map_err(|e| named(self.link.broken(e), &key))?;
        Ok((value.is_some() || waiter.is_some()).then(|| Waitpoint {
            id: id.to_owned(),
            value,
            waiter: waiter.and_then(|w| uuid::Uuid::try_parse(&w).ok().map(JobId::from)),
        }))
    }
}

impl RedisLeaseStore {
    /// Waitpoint `id`'s hash (`value`, `waiter`), in the installation's slot.
    fn waitpoint_key(&self, id: &str) -> String {
        format!("{}waitpoint:{id}", self.base)
    }
}

/// The bounded journals kept as JSON lists, newest first: the rejection journal and the
/// console's history.
impl RedisLeaseStore {
    /// Pushes `entries` (the last one ends newest) onto list `name`, keeping its newest `cap`;
    /// in one transaction.
    async fn push_newest<T: serde::Serialize>(
        &self,
        name: &str,
        entries: &[T],
        cap: usize,
    ) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let key = format!("{}{name}", self.base);
        let mut pipe = redis::pipe();
        pipe.atomic();
        for entry in &entries[entries.len().saturating_sub(cap)..] {
            let json = serde_json::to_string(entry).map_err(garbage)?;
            pipe.lpush(&key, json).ignore();
        }
        pipe.ltrim(&key, 0, cap as isize - 1).ignore();
        let mut conn = self.conn().await?;
        pipe.query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    /// The newest `limit` (at most `cap`) entries of list `name`; an entry that does not
    /// parse (written by a newer version, say) is skipped.
    async fn newest<T: serde::de::DeserializeOwned>(
        &self,
        name: &str,
        limit: usize,
        cap: usize,
    ) -> Result<Vec<T>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        let raw: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{}{name}", self.base))
            .arg(0)
            .arg(limit.min(cap) - 1)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(raw
            .iter()
            .filter_map(|r| serde_json::from_str(r).ok())
            .collect())
    }
}
