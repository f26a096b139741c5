//! The Redis store's flows (`hold.lua`, `release.lua`, `flow_home.lua`; the key layout is in
//! `common.lua`).

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_redis::redis::{self, Script};
use serde::{Deserialize, Serialize};

use super::RedisLeaseStore;
use crate::connection::{garbage, parse, round_trip};
use crate::error::{Error, Result};
use crate::flow::{
    Edge, Flow, FlowState, FlowStatus, FlowStep, Release, ReleaseAction, Step, StepEnd, StepEnded,
    FLOW_RETENTION,
};
use crate::ids::{FlowId, JobId, Scope};
use crate::job::{NewJob, MAX_DELAY};
use crate::scripts::{coordinator_script, script_count, Meta};
use crate::store::FlowStore;

static HOLD: LazyLock<Script> = coordinator_script!("hold.lua");
static RELEASE: LazyLock<Script> = coordinator_script!("release.lua");
static FLOW_HOME: LazyLock<Script> = coordinator_script!("flow_home.lua");
/// Step ends, oldest first: KEYS[1] base, ARGV[1] most; triples of job id, record and when
/// it ended (unix ms). Drops (and logs) a member that is no job id, which no pass could ever
/// forget by one.
static STEP_ENDS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if tonumber(ARGV[1]) < 1 then return {} end \
         local ids = redis.call('ZRANGE', KEYS[1] .. 'stepends', 0, tonumber(ARGV[1]) - 1, 'WITHSCORES') \
         local out = {} \
         for i = 1, #ids, 2 do \
           local id = ids[i] \
           if string.match(id, '^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$') then \
             out[#out + 1] = id \
             out[#out + 1] = redis.call('HGET', KEYS[1] .. 'stepend', id) or '' \
             out[#out + 1] = ids[i + 1] \
           else \
             redis.log(redis.LOG_WARNING, 'palisade: flow step end ' .. id .. ' is no job id: dropped') \
             redis.call('ZREM', KEYS[1] .. 'stepends', id) \
           end \
         end \
         return out",
    )
});
/// Flows with releases decided at least ARGV[1] ms ago, at most ARGV[2]; a member that is no
/// flow id is dropped.
static UNRELEASED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local t = redis.call('TIME') \
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
         local ids = redis.call('ZRANGEBYSCORE', KEYS[1] .. 'flows:out', '-inf', \
           now - tonumber(ARGV[1]), 'LIMIT', 0, tonumber(ARGV[2])) \
         local out = {} \
         for _, id in ipairs(ids) do \
           if string.match(id, '^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$') then out[#out + 1] = id \
           else redis.call('ZREM', KEYS[1] .. 'flows:out', id) end \
         end \
         return out",
    )
});
/// Held jobs kept at least ARGV[1] ms, at most ARGV[2], oldest first: job id, flow tag,
/// scope; a member that is no job id is dropped.
static HELD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local t = redis.call('TIME') \
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
         local ids = redis.call('ZRANGEBYSCORE', KEYS[1] .. 'held', '-inf', \
           now - tonumber(ARGV[1]), 'LIMIT', 0, tonumber(ARGV[2])) \
         local out = {} \
         for _, id in ipairs(ids) do \
           if not string.match(id, '^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$') then \
             redis.call('ZREM', KEYS[1] .. 'held', id) \
             id = nil \
           end \
           local f = id and redis.pcall('HMGET', KEYS[1] .. 'job:' .. id, 'flow', 'scope') \
           if type(f) == 'table' and not f.err then \
             out[#out + 1] = id \
             out[#out + 1] = f[1] or '' \
             out[#out + 1] = f[2] or '' \
           end \
         end \
         return out",
    )
});
/// A flow's status: its step count, decided count, cancelled ("1" or "0"), then pairs of step
/// and end. Read-only.
static FLOW_STATUS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local F = KEYS[1] .. 'flow:' .. ARGV[1] \
         local steps = redis.call('HGET', F, 'steps') \
         if not steps then return {} end \
                  local out = { steps, tostring(redis.call('HLEN', F .. ':decided')), \
           redis.call('HGET', F, 'cancelled') or '0' } \
         local ends = redis.call('HGETALL', F .. ':ends') \
         for _, v in ipairs(ends) do out[#out + 1] = v end \
         return out",
    )
});

/// A flow's steps for operators: KEYS[1] base, ARGV[1] flow id; four lists: the steps hash
/// (name, record), the ends hash (name, end), the decided steps' names, and the names of
/// those keys that hold another type (read as empty); nothing for a flow not kept. Read-only.
static FLOW_STEPS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local F = KEYS[1] .. 'flow:' .. ARGV[1] \
         if redis.call('EXISTS', F) == 0 then return {} end \
         local bad = {} \
         local function read(cmd, key) \
           local r = redis.pcall(cmd, key) \
           if type(r) == 'table' and not r.err then return r end \
           bad[#bad + 1] = key \
           return {} \
         end \
         return { read('HGETALL', F .. ':steps'), read('HGETALL', F .. ':ends'), \
                  read('HKEYS', F .. ':decided'), bad }",
    )
});

/// A step record as `flow_home.lua` keeps it, read for operators (fields a later release adds
/// are passed over).
#[derive(Deserialize)]
struct KeptStep {
    job: JobId,
    #[serde(default)]
    after: Vec<(String, serde_json::Value)>,
}

/// `flow_home.lua`'s arguments for `steps` (of flow `flow`): their count, then per step its
/// name, its record (`next` names only the steps among `steps` that run after it) and its
/// number of dependencies.
fn home_steps(flow: FlowId, steps: &[Step]) -> Result<Vec<String>> {
    let mut next: std::collections::HashMap<&str, Vec<&str>> = Default::default();
    for s in steps {
        for Edge { step, .. } in &s.after {
            next.entry(step.as_str()).or_default().push(&s.name);
        }
    }
    let mut args = vec![steps.len().to_string()];
    for s in steps {
        let record = HomeStep {
            job: crate::flow::step_job_id(flow, &s.name),
            scope: s.job.scope.as_ref(),
            after: s
                .after
                .iter()
                .map(|e| (e.step.as_str(), e.on_dead))
                .collect(),
            next: next.remove(s.name.as_str()).unwrap_or_default(),
        };
        args.push(s.name.clone());
        args.push(serde_json::to_string(&record).map_err(|e| Error::Payload(e.to_string()))?);
        args.push(s.after.len().to_string());
    }
    Ok(args)
}

/// Keeps step results at a flow's home: KEYS[1] base, ARGV[1] flow id, then pairs of step and
/// result. Only for a kept flow, each step's first result; a finished flow's results expire
/// with it. Checks the key's type before its first write.
static KEEP_RESULTS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local F = KEYS[1] .. 'flow:' .. ARGV[1] \
         if redis.call('EXISTS', F) == 0 then return 0 end \
         local R, S = F .. ':results', F .. ':steps' \
         for _, k in ipairs({ R, S }) do \
           local t = redis.call('TYPE', k).ok \
           if t ~= 'none' and t ~= 'hash' then return redis.error_reply('PALISADE_CORRUPT ' .. k .. ' holds a ' .. t) end \
         end \
         for i = 2, #ARGV - 1, 2 do \
           if redis.call('HEXISTS', S, ARGV[i]) == 1 then redis.call('HSETNX', R, ARGV[i], ARGV[i + 1]) end \
         end \
         local ttl = redis.call('PTTL', F) \
         if ttl >= 0 then redis.call('PEXPIRE', R, math.max(ttl, 1)) end \
         return 1",
    )
});

/// Running flows: KEYS[1] base, ARGV[1] most to list. Forgets members whose flow is gone
/// (forgotten, or written by a version that did not list its end) among the oldest
/// max(ARGV[1], 100), then returns the count and pairs of flow id and creation time (ms),
/// oldest first; a member that is no flow id is dropped.
static RUNNING: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local key = KEYS[1] .. 'flows:running' \
         local t = redis.call('TYPE', key).ok \
         if t ~= 'zset' then return { 0 } end \
         local most = tonumber(ARGV[1]) \
         local oldest = redis.call('ZRANGE', key, 0, math.max(most, 100) - 1, 'WITHSCORES') \
         local listed = {} \
         for i = 1, #oldest, 2 do \
           local id = oldest[i] \
           if not string.match(id, '^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$') \
             or redis.call('EXISTS', KEYS[1] .. 'flow:' .. id) == 0 then \
             redis.call('ZREM', key, id) \
           elseif #listed < most * 2 then \
             listed[#listed + 1] = id \
             listed[#listed + 1] = oldest[i + 1] \
           end \
         end \
         local out = { redis.call('ZCARD', key) } \
         for _, v in ipairs(listed) do out[#out + 1] = v end \
         return out",
    )
});

/// `flow_home.lua`'s answer.
struct HomeReply {
    kept: bool,
    releases: Vec<Release>,
    running: Vec<JobId>,
}

/// A step as the home keeps it (`flow:<id>:steps`).
#[derive(Serialize)]
struct HomeStep<'a> {
    job: JobId,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<&'a Scope>,
    after: Vec<(&'a str, crate::flow::OnDead)>,
    next: Vec<&'a str>,
}

impl RedisLeaseStore {
    /// Runs `flow_home.lua` and decodes its releases.
    async fn home(&self, flow: FlowId, op: &str, args: Vec<String>) -> Result<HomeReply> {
        round_trip("flow");
        let mut invocation = FLOW_HOME.key(&self.base);
        invocation
            .arg(op)
            .arg(flow.to_string())
            .arg(FLOW_RETENTION.as_millis() as u64)
            .arg(args)
            .arg(self.generation);
        let mut conn = self.conn().await?;
        let flat: Vec<String> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let [kept, k, rest @ ..] = flat.as_slice() else {
            return Err(garbage("short flow_home reply"));
        };
        let k: usize = parse(k)?;
        if rest.len() < k {
            return Err(garbage("short flow_home reply"));
        }
        let (running, rows) = rest.split_at(k);
        let running = running
            .iter()
            .map(|id| Ok(JobId::from(parse::<uuid::Uuid>(id)?)))
            .collect::<Result<Vec<_>>>()?;
        let releases = rows
            .chunks_exact(4)
            .map(|r| {
                let action = match r[3].as_str() {
                    "run" => ReleaseAction::Run,
                    "skip" => ReleaseAction::Skip,
                    other => match other.strip_prefix("fail:") {
                        Some(why) => ReleaseAction::Fail(why.to_owned()),
                        None => return Err(garbage(format_args!("bad decision {other:?}"))),
                    },
                };
                Ok(Release {
                    flow,
                    step: r[0].clone(),
                    job: JobId::from(parse::<uuid::Uuid>(&r[1])?),
                    scope: (!r[2].is_empty()).then(|| Scope::new(r[2].clone())),
                    action,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(HomeReply {
            kept: kept == "1",
            releases,
            running,
        })
    }
}

#[async_trait]
impl FlowStore for RedisLeaseStore {
    async fn hold(&self, jobs: Vec<(NewJob, FlowStep)>) -> Result<()> {
        let news: Vec<NewJob> = jobs.iter().map(|(j, _)| j.clone()).collect();
        crate::job::validate_batch(&news, self.max_payload_bytes)?;
        if jobs.is_empty() {
            return Ok(());
        }
        round_trip("hold");
        let mut invocation = HOLD.key(&self.base);
        invocation.arg(jobs.len());
        for (job, step) in jobs {
            let id = job.id.unwrap_or_else(JobId::new);
            let tag = format!("{}\t{}", step.flow, step.step);
            let delay = job.delay;
            let meta = Meta {
                flow: Some(step),
                ..Meta::of(job)
            };
            let (encoded, scope) = meta.encoded()?;
            invocation
                .arg(id.to_string())
                .arg(&meta.queue)
                .arg(&meta.kind)
                .arg(scope)
                .arg(delay.as_millis() as u64)
                .arg(encoded)
                .arg(tag);
        }
        invocation.arg(self.generation);
        let mut conn = self.conn().await?;
        invocation
            .invoke_async::<u64>(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(())
    }

    async fn release(&self, releases: Vec<Release>) -> Result<Vec<JobId>> {
        if releases.is_empty() {
            return Ok(Vec::new());
        }
        round_trip("release");
        let mut invocation = RELEASE.key(&self.base);
        invocation.arg(releases.len()).arg(self.dead_retention);
        for r in releases {
            let (action, reason) = match r.action {
                ReleaseAction::Run => ("run", String::new()),
                ReleaseAction::Fail(why) => ("fail", why),
                ReleaseAction::Skip => ("skip", String::new()),
            };
            invocation.arg(r.job.to_string()).arg(action).arg(reason);
        }
        invocation.arg(self.generation);
        let mut conn = self.conn().await?;
        let left: Vec<String> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        left.iter()
            .map(|id| Ok(JobId::from(parse::<uuid::Uuid>(id)?)))
            .collect()
    }

    async fn step_ends(&self, max: usize) -> Result<Vec<StepEnded>> {
        // As the follow-up sweep does: an end this release cannot read stays where it is for a
        // process that can (its flow waits, said on every pass), never recorded in part, and
        // a pass that meets some asks past them.
        let mut asked = max;
        loop {
            let mut conn = self.conn().await?;
            let flat: Vec<String> = STEP_ENDS
                .key(&self.base)
                .arg(script_count(asked))
                .invoke_async(&mut conn)
                .await
                .map_err(|e| self.link.broken(e))?;
            let mut ends = Vec::with_capacity(flat.len() / 3);
            let mut unreadable = 0usize;
            for triple in flat.chunks_exact(3) {
                let job = JobId::from(parse::<uuid::Uuid>(&triple[0])?);
                let at_ms = triple[2].parse::<f64>().unwrap_or(0.0) as u64;
                match decode_step_end(job, &triple[1], at_ms) {
                    Ok(end) => ends.push(end),
                    Err(why) => {
                        unreadable += 1;
                        crate::repeats::warn_repeated!(%job, record = %triple[1], %why, "a flow step end this release cannot read; left in place for a process that can (its flow waits)");
                    }
                }
            }
            let listed = flat.len() / 3;
            if unreadable == 0
                || ends.len() >= max
                || listed < asked
                || asked >= super::MAX_UNREADABLE_PASSED
            {
                metrics::counter!(crate::metrics::RECORDS_UNREADABLE, "kind" => "step_ends")
                    .increment(unreadable as u64);
                ends.truncate(max);
                return Ok(ends);
            }
            // The next listing starts from the oldest again: room for the unreadable ones met.
            asked = (max + unreadable).min(super::MAX_UNREADABLE_PASSED);
        }
    }

    async fn forget_step_ends(&self, jobs: &[JobId]) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = jobs.iter().map(JobId::to_string).collect();
        let mut conn = self.conn().await?;
        redis::pipe()
            .atomic()
            .cmd("ZREM")
            .arg(format!("{}stepends", self.base))
            .arg(&ids)
            .ignore()
            .cmd("HDEL")
            .arg(format!("{}stepend", self.base))
            .arg(&ids)
            .ignore()
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    async fn put_flow(&self, flow: &Flow) -> Result<(bool, Vec<Release>)> {
        flow.validate(self.max_payload_bytes)?;
        let args = home_steps(flow.id(), flow.steps())?;
        let reply = self.home(flow.id(), "put", args).await?;
        Ok((reply.kept, reply.releases))
    }

    async fn grow_flow(&self, flow: FlowId, step: &str, added: &[Step]) -> Result<()> {
        if added.is_empty() {
            return Ok(());
        }
        let mut args = vec![step.to_owned()];
        args.extend(home_steps(flow, added)?);
        self.home(flow, "grow", args).await.map(drop)
    }

    async fn advance_flow(
        &self,
        flow: FlowId,
        ended: &[(String, StepEnd)],
        applied: &[String],
    ) -> Result<Vec<Release>> {
        let mut args = vec![ended.len().to_string()];
        for (step, end) in ended {
            args.push(step.clone());
            args.push(end.as_str().to_owned());
        }
        args.push(applied.len().to_string());
        args.extend(applied.iter().cloned());
        Ok(self.home(flow, "advance", args).await?.releases)
    }

    async fn cancel_flow(&self, flow: FlowId) -> Result<Option<(Vec<Release>, Vec<JobId>)>> {
        if self.flow(flow).await?.is_none() {
            return Ok(None);
        }
        let reply = self.home(flow, "cancel", Vec::new()).await?;
        Ok(Some((reply.releases, reply.running)))
    }

    async fn held_jobs(&self, older_than: Duration, max: usize) -> Result<Vec<Release>> {
        let mut conn = self.conn().await?;
        let flat: Vec<String> = HELD
            .key(&self.base)
            .arg(older_than.as_millis().min(MAX_DELAY.as_millis()) as u64)
            .arg(script_count(max))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let mut held = Vec::new();
        for row in flat.chunks_exact(3) {
            let job = JobId::from(parse::<uuid::Uuid>(&row[0])?);
            let Some((flow, step)) = row[1].split_once('\t') else {
                continue; // (a record gone since it was listed)
            };
            held.push(Release {
                flow: FlowId::from(parse::<uuid::Uuid>(flow)?),
                step: step.to_owned(),
                job,
                scope: (!row[2].is_empty()).then(|| Scope::new(row[2].clone())),
                action: ReleaseAction::Skip,
            });
        }
        Ok(held)
    }

    async fn unreleased_flows(&self, older_than: Duration, max: usize) -> Result<Vec<FlowId>> {
        let mut conn = self.conn().await?;
        let ids: Vec<String> = UNRELEASED
            .key(&self.base)
            .arg(older_than.as_millis().min(MAX_DELAY.as_millis()) as u64)
            .arg(script_count(max))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        ids.iter()
            .map(|id| Ok(FlowId::from(parse::<uuid::Uuid>(id)?)))
            .collect()
    }

    async fn flow(&self, id: FlowId) -> Result<Option<FlowStatus>> {
        let mut conn = self.conn().await?;
        let flat: Vec<String> = FLOW_STATUS
            .key(&self.base)
            .arg(id.to_string())
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let [steps, decided, cancelled, rest @ ..] = flat.as_slice() else {
            return Ok(None);
        };
        let steps: usize = parse(steps)?;
        let mut ended = std::collections::HashMap::new();
        for pair in rest.chunks_exact(2) {
            let end = StepEnd::parse(&pair[1])
                .ok_or_else(|| garbage(format_args!("bad step end {:?}", pair[1])))?;
            ended.insert(pair[0].clone(), end);
        }
        let state = if cancelled == "1" {
            FlowState::Cancelled
        } else if ended.len() < steps {
            FlowState::Running
        } else if ended.values().all(|e| *e == StepEnd::Completed) {
            FlowState::Succeeded
        } else {
            FlowState::Failed
        };
        Ok(Some(FlowStatus {
            id,
            state,
            steps,
            ended,
            released: parse(decided)?,
        }))
    }

    async fn keep_results(&self, flow: FlowId, results: &[(String, String)]) -> Result<()> {
        if results.is_empty() {
            return Ok(());
        }
        let mut invocation = KEEP_RESULTS.key(&self.base);
        invocation.arg(flow.to_string());
        for (step, json) in results {
            invocation.arg(step).arg(json);
        }
        let mut conn = self.conn().await?;
        invocation
            .invoke_async::<i64>(&mut conn)
            .await
            .map(drop)
            .map_err(|e| self.link.broken(e))
    }

    async fn step_result(&self, flow: FlowId, step: &str) -> Result<Option<String>> {
        let mut conn = self.conn().await?;
        redis::cmd("HGET")
            .arg(format!("{}flow:{flow}:results", self.base))
            .arg(step)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))
    }

    async fn running_flows(&self, max: usize) -> Result<(u64, Vec<(FlowId, u64)>)> {
        let mut conn = self.conn().await?;
        // (The count comes back as an integer reply, which reads as a string too.)
        let flat: Vec<String> = RUNNING
            .key(&self.base)
            .arg(max.min(1_000_000))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let Some((count, pairs)) = flat.split_first() else {
            return Ok((0, Vec::new()));
        };
        let mut listed = Vec::new();
        for pair in pairs.chunks_exact(2) {
            let id = FlowId::from(parse::<uuid::Uuid>(&pair[0])?);
            let created = pair[1].parse::<f64>().unwrap_or(0.0) as u64;
            listed.push((id, created));
        }
        Ok((parse(count)?, listed))
    }

    async fn flow_steps(&self, id: FlowId) -> Result<Vec<crate::flow::StepStatus>> {
        use crate::flow::{StepState, StepStatus};
        let mut conn = self.conn().await?;
        let lists: Vec<Vec<String>> = FLOW_STEPS
            .key(&self.base)
            .arg(id.to_string())
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let [steps, ends, decided, unreadable] =
            <[Vec<String>; 4]>::try_from(lists).unwrap_or_default();
        if !unreadable.is_empty() {
            tracing::warn!(flow = %id, keys = ?unreadable, "a flow's keys hold another type: its steps are listed without them");
        }
        let decided: std::collections::HashSet<&str> = decided.iter().map(String::as_str).collect();
        let ends: std::collections::HashMap<&str, &str> = ends
            .chunks_exact(2)
            .map(|p| (p[0].as_str(), p[1].as_str()))
            .collect();
        let mut listed = Vec::new();
        for pair in steps.chunks_exact(2) {
            let (name, record) = (&pair[0], &pair[1]);
            // (A record this release cannot read is listed as unreadable, not the page's
            // failure: its job is the step's by name.)
            let (job, after, readable) = match serde_json::from_str::<KeptStep>(record) {
                Ok(k) => (k.job, k.after.into_iter().map(|(s, _)| s).collect(), true),
                Err(_) => (crate::flow::step_job_id(id, name), Vec::new(), false),
            };
            let state = match ends.get(name.as_str()).copied().map(StepEnd::parse) {
                Some(Some(end)) => StepState::Ended(end),
                _ if !readable => StepState::Unreadable,
                _ if decided.contains(name.as_str()) => StepState::Released,
                _ => StepState::Waiting,
            };
            listed.push(StepStatus {
                name: name.clone(),
                job,
                after,
                state,
            });
        }
        Ok(crate::flow::in_run_order(listed))
    }

    async fn flows_created(&self) -> Result<Option<u64>> {
        let mut conn = self.conn().await?;
        let n: Option<String> = redis::cmd("HGET")
            .arg(format!("{}flow_stats", self.base))
            .arg("created")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        match n.map(|n| n.parse::<u64>().map_err(|_| n)) {
            None => Ok(Some(0)),
            Some(Ok(n)) => Ok(Some(n)),
            // (Another program's text: unknown, said once in a while, not a backend error on
            // every sample.)
            Some(Err(text)) => {
                crate::repeats::warn_repeated!(count = %text, "{}flow_stats created is not a count: palisade_flows_kept_total is not exported until it is repaired", self.base);
                Ok(None)
            }
        }
    }
}

/// One step end as `note_step_end` (common.lua) keeps it: "<flow> TAB <step> TAB <end>", then
/// "TAB <added steps as JSON> TAB <result>" for a completion that added steps or kept a
/// result (either may be empty). The result is the rest of the record, tabs and all (a
/// result may hold any text), so nothing can follow it: a field a later release needs goes
/// where a reader of this release fails on it, not where it would be read as result text.
///
/// `Err` says why this release cannot read it: an end it does not know, added steps it
/// cannot decode, no flow id. The whole end is then left in place, never recorded without
/// its added steps. An empty record (none kept under a listed job) is an end of no flow,
/// which the pass forgets: there is nothing to keep.
fn decode_step_end(job: JobId, record: &str, at_ms: u64) -> std::result::Result<StepEnded, String> {
    if record.is_empty() {
        return Ok(StepEnded {
            job,
            flow: FlowId::from(uuid::Uuid::nil()),
            step: String::new(),
            end: StepEnd::Dead,
            added: Vec::new(),
            at_ms,
            result: None,
        });
    }
    let mut parts = record.splitn(5, '\t');
    let (flow, step, end) = (parts.next(), parts.next(), parts.next());
    let added = parts.next().filter(|a| !a.is_empty());
    let result = parts.next().filter(|r| !r.is_empty()).map(str::to_owned);
    let flow = flow
        .and_then(|f| f.parse::<uuid::Uuid>().ok())
        .ok_or("no flow id")?;
    let step = step.ok_or("no step name")?;
    let end = end.ok_or("no end")?;
    let end =
        StepEnd::parse(end).ok_or_else(|| format!("an end this release does not know: {end:?}"))?;
    let added: Vec<Step> = match added {
        Some(json) => serde_json::from_str(json).map_err(|e| format!("added steps: {e}"))?,
        None => Vec::new(),
    };
    Ok(StepEnded {
        job,
        flow: FlowId::from(flow),
        step: step.to_owned(),
        end,
        added,
        at_ms,
        result,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 55: an end is read whole or left in place; a result keeps its tabs.
    #[test]
    fn a_step_end_is_read_whole_or_not_at_all() {
        let (job, flow) = (JobId::new(), FlowId::new());
        let end = decode_step_end(job, &format!("{flow}\tcharge\tcompleted"), 5).unwrap();
        assert_eq!(
            (end.flow, end.step.as_str(), end.end, end.at_ms),
            (flow, "charge", StepEnd::Completed, 5)
        );
        let tabbed =
            decode_step_end(job, &format!("{flow}\tcharge\tcompleted\t\t[1,\t2]"), 5).unwrap();
        assert_eq!(tabbed.result.as_deref(), Some("[1,\t2]"));
        for unreadable in [
            format!("{flow}\tcharge\tcancelled"),
            format!("{flow}\tcharge\tcompleted\tnot json"),
            format!("{flow}\tcharge"),
            "not-a-uuid\tcharge\tcompleted".to_owned(),
        ] {
            assert!(
                decode_step_end(job, &unreadable, 5).is_err(),
                "{unreadable}"
            );
        }
        assert_eq!(
            decode_step_end(job, "", 5).unwrap().flow,
            FlowId::from(uuid::Uuid::nil())
        );
    }
}
