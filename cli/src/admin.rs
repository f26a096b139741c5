//! `enqueue`, `status` and `dead list|retry|purge`: short commands against the coordinator.

use std::io::BufRead as _;
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::json;

use super::{print_lines, runtime, RedisArgs};
use palisade::store::{ControlStore, FlowStore, Inspect, LeaseStore, QueueAdmin, RecordStore};
use palisade::Registry;
use palisade::Scope;
use palisade::StepEnd;
use palisade::{Enqueued, NewJob, DEFAULT_MAX_PAYLOAD_BYTES};

/// `enqueue`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct EnqueueArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Job kind, one of the kinds this binary handles.
    kind: String,
    /// Payload as JSON, checked against the kind's payload type before anything is sent.
    /// Leave it out with --stdin.
    #[arg(required_unless_present = "stdin")]
    json: Option<String>,
    /// Read payloads from stdin instead, one JSON document per line, and enqueue them in
    /// batches of 1,000 (one round trip each). A bad line refuses the whole input. Each
    /// batch's ids are printed once it is added; if one fails, the error names the input
    /// lines not enqueued.
    #[arg(long, conflicts_with = "json")]
    stdin: bool,
    /// Protected scope (jobs sharing it run one at a time); default: the job's own
    /// `job:<id>`. `{field}` is replaced by the payload's top-level field, e.g.
    /// `--scope 'account:{account}'`.
    #[arg(long)]
    scope: Option<String>,
    /// Queue.
    #[arg(long, default_value = "default")]
    queue: String,
    /// Not claimable before this much time has passed, e.g. 30s or 5m.
    #[arg(long, value_parser = super::duration_within(Duration::ZERO, super::YEAR))]
    delay: Option<Duration>,
    /// Higher runs first (-4096..=4096).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Attempts before the job is dead (the worker's `--retry-base/--retry-max` space them).
    #[arg(long, default_value_t = palisade::limits::DEFAULT_MAX_ATTEMPTS, value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..))]
    max_attempts: u32,
    /// Expired leases (stalls) allowed before the job is dead.
    #[arg(long, default_value_t = 3)]
    max_stalls: u32,
    /// Largest payload accepted, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_PAYLOAD_BYTES)]
    max_payload_bytes: usize,
    /// Idempotent enqueue: while another job holds this unique key (queued, running, or
    /// enqueued less than --unique-ttl ago) nothing is added and that job's id is printed,
    /// with a note on stderr. `{field}` is replaced as in --scope.
    #[arg(long, value_name = "KEY")]
    unique: Option<String>,
    /// The job's id, chosen by you (a UUID), so that running this command again is the same
    /// job: while that job is known, and for a day after it was enqueued, nothing more is
    /// added and a note says so. Without it a fresh id is made, kept across this command's
    /// own retries.
    #[arg(long, value_name = "UUID", conflicts_with = "stdin")]
    id: Option<uuid::Uuid>,
    /// How long the unique key stays held after its job was enqueued, even once it is done:
    /// by default a repeat within a day (a webhook delivered twice) adds nothing however
    /// soon the first job ran. 0s gives the key up as soon as its job is done.
    #[arg(long, default_value = "24h", value_parser = super::duration_within(Duration::ZERO, super::YEAR), requires = "unique")]
    unique_ttl: Duration,
    /// The trace the job continues: a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`);
    /// an invalid one is refused. Without it, TRACEPARENT (and TRACESTATE), as a traced script
    /// passes its span on, is used if valid and otherwise ignored with a warning. Every attempt
    /// of the job is a span in that trace and its log lines carry the trace id.
    #[arg(long, value_name = "TRACEPARENT")]
    traceparent: Option<String>,
    /// The `tracestate` that goes with --traceparent.
    #[arg(long, value_name = "TRACESTATE", requires = "traceparent")]
    tracestate: Option<String>,
    /// Bounds each attempt, e.g. 30s: at the timeout the handler is told to stop and the
    /// attempt fails as retryable ("timed out"); one that does not stop is aborted after the
    /// worker's grace period. Default: the kind's timeout, if the binary sets one.
    #[arg(long, value_parser = super::duration_within(Duration::from_millis(1), super::YEAR))]
    timeout: Option<Duration>,
    /// The job is not started after this: an RFC 3339 time (2026-12-03T18:00:00Z) or a
    /// duration from now (10m). A worker that claims it later dead-letters it as "expired".
    #[arg(long, value_parser = deadline)]
    deadline: Option<std::time::SystemTime>,
    /// Times the handler may snooze before the job is dead.
    #[arg(long, default_value_t = palisade::DEFAULT_MAX_SNOOZES)]
    max_snoozes: u32,
    /// Debounces the job under KEY: while a job under KEY waits out its quiet period, this
    /// one replaces its payload and pushes its start to --quiet from now (but no later than
    /// --max-wait after the first), and the pending job's id is printed with a note on
    /// stderr. `{field}` is replaced as in --scope.
    #[arg(long, value_name = "KEY", conflicts_with_all = ["unique", "delay"])]
    debounce: Option<String>,
    /// The quiet period of --debounce.
    #[arg(long, default_value = "1s", requires = "debounce", value_parser = super::duration_within(Duration::from_millis(1), super::YEAR))]
    quiet: Duration,
    /// The longest a debounced job waits from its first enqueue.
    #[arg(long, default_value = "1m", requires = "debounce", value_parser = super::duration_within(Duration::from_millis(1), super::YEAR))]
    max_wait: Duration,
    /// The group the job shares claims with (a tenant): claims rotate over the groups with
    /// ready jobs (`palisade group` sets a group's limits). `{field}` is replaced as in
    /// --scope.
    #[arg(long)]
    group: Option<String>,
}

/// A `--deadline`: an RFC 3339 time, or a duration from now.
fn deadline(text: &str) -> Result<std::time::SystemTime, String> {
    if let Ok(d) = humantime::parse_duration(text) {
        return Ok(std::time::SystemTime::now() + d.min(super::YEAR));
    }
    humantime::parse_rfc3339_weak(text).map_err(|e| {
        format!("{e}: give an RFC 3339 time (2026-12-03T18:00:00Z) or a duration from now (10m)")
    })
}

impl EnqueueArgs {
    /// The trace asked for: --traceparent (refused if invalid), else TRACEPARENT from the
    /// environment (an invalid one, set by something else, is ignored with a warning: the
    /// W3C rule for a receiver).
    fn trace(&self) -> anyhow::Result<Option<palisade::TraceContext>> {
        if let Some(traceparent) = &self.traceparent {
            let trace = palisade::TraceContext::from_w3c(traceparent, self.tracestate.as_deref())
                .with_context(|| {
                    format!("--traceparent {traceparent:?} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")
                })?;
            return Ok(Some(trace));
        }
        let Ok(traceparent) = std::env::var("TRACEPARENT") else {
            return Ok(None);
        };
        let state = std::env::var("TRACESTATE").ok();
        let trace = palisade::TraceContext::from_w3c(&traceparent, state.as_deref());
        if trace.is_none() {
            eprintln!("warning: TRACEPARENT={traceparent:?} is not a W3C traceparent; ignored");
        }
        Ok(trace)
    }

    /// The job for one payload, checked against the handler's payload type and every
    /// backend's rules before anything is sent.
    fn job(
        &self,
        registry: &Registry,
        payload: &str,
        trace: Option<&palisade::TraceContext>,
    ) -> anyhow::Result<NewJob> {
        registry.check(&self.kind, payload)?;
        let mut job = NewJob::raw(&self.kind, payload)
            .with_queue(&self.queue)
            .with_priority(self.priority)
            .with_max_attempts(self.max_attempts)
            .with_max_stalls(self.max_stalls)
            .with_delay(self.delay.unwrap_or_default());
        if let Some(template) = &self.scope {
            job = job.with_scope(fill(template, payload)?);
        }
        if let Some(template) = &self.unique {
            job = job.with_unique_key(fill(template, payload)?, self.unique_ttl);
        }
        if let Some(template) = &self.debounce {
            job = job.with_debounce(fill(template, payload)?, self.quiet, self.max_wait);
        }
        if let Some(template) = &self.group {
            job = job.with_group(fill(template, payload)?);
        }
        if let Some(timeout) = self.timeout {
            job = job.with_timeout(timeout);
        }
        if let Some(deadline) = self.deadline {
            job = job.with_deadline(deadline);
        }
        job = job.with_max_snoozes(self.max_snoozes);
        if let Some(id) = self.id {
            job = job.with_id(palisade::JobId::from(id));
        }
        if let Some(trace) = trace {
            job = job.with_trace(trace.clone());
        }
        job.validate(self.max_payload_bytes)?;
        Ok(job)
    }
}

/// `template` with every `{field}` replaced by that top-level field of the JSON `payload`.
fn fill(template: &str, payload: &str) -> anyhow::Result<String> {
    if !template.contains('{') {
        return Ok(template.to_owned());
    }
    let value: serde_json::Value = serde_json::from_str(payload)
        .with_context(|| format!("scope {template:?}: the payload is not a JSON object"))?;
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .with_context(|| format!("scope {template:?}: unclosed '{{'"))?;
        let field = &rest[open + 1..open + close];
        let text = match value.get(field) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
            Some(v @ serde_json::Value::Bool(_)) => v.to_string(),
            Some(serde_json::Value::Number(n)) => {
                bail!("scope {template:?}: field {field:?} = {n} is not an integer")
            }
            _ => bail!("scope {template:?}: the payload has no scalar field {field:?}"),
        };
        out.push_str(&rest[..open]);
        out.push_str(&text);
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Enqueues one job, or every line of stdin, and prints the ids.
pub(super) fn enqueue(args: EnqueueArgs, registry: &Registry) -> anyhow::Result<()> {
    // Each job with its input line (none for the one argument): notes and errors name lines,
    // which blank lines make differ from jobs.
    // Read once: a warning for an invalid TRACEPARENT is said once, not per line.
    let trace = args.trace()?;
    let trace = trace.as_ref();
    let jobs: Vec<(Option<usize>, NewJob)> = match &args.json {
        Some(json) => vec![(None, args.job(registry, json, trace)?)],
        None => std::io::stdin()
            .lock()
            .lines()
            .zip(1..)
            .filter(|(line, _)| !line.as_ref().is_ok_and(|l| l.trim().is_empty()))
            .map(|(line, n)| {
                let job = line
                    .map_err(anyhow::Error::from)
                    .and_then(|line| args.job(registry, &line, trace))
                    .with_context(|| format!("stdin line {n}"))?;
                Ok((Some(n), job))
            })
            .collect::<anyhow::Result<Vec<_>>>()?,
    };
    runtime()?.block_on(async {
        let (_, store) = args.redis.store_with(args.max_payload_bytes, |s| s).await?;
        let mut unprinted = None;
        for (done, batch) in batches(&jobs) {
            // Each batch is all or nothing; say exactly how far a failure got.
            // With the same job ids on every retry (`enqueue_counted`): a lost reply cannot
            // add a line twice.
            let added = palisade::cli_support::enqueue_counted(
                &store,
                batch.iter().map(|(_, job)| job.clone()).collect(),
            )
            .await
            .map_err(|e| {
                let unknown = matches!(e, palisade::Error::OutcomeUnknown(_));
                anyhow::Error::from(e).context(not_enqueued(&jobs, done, unknown))
            })?;
            for ((line, job), outcome) in batch.iter().zip(&added) {
                if let Enqueued::Debounced(id) = outcome {
                    match line {
                        Some(n) => eprintln!(
                            "stdin line {n} replaced the payload of pending job {id} (debounced)"
                        ),
                        None => eprintln!("replaced the payload of pending job {id} (debounced)"),
                    }
                }
                if let Enqueued::Existing(id) = outcome {
                    let why = if job.id == Some(*id) {
                        format!("job {id} is already enqueued")
                    } else {
                        format!("job {id} holds its unique key")
                    };
                    match line {
                        Some(n) => eprintln!("stdin line {n} not added: {why}"),
                        None => eprintln!("job not added: {why}"),
                    }
                }
            }
            // Printed as each batch is in, so that a later batch failing leaves the ids of
            // what was enqueued; but a stdout that fails must not decide how much is
            // enqueued (a closed pipe is no failure).
            if let Err(e) = print_lines(added.iter().map(|outcome| outcome.id().to_string())) {
                unprinted.get_or_insert(e);
            }
        }
        match unprinted {
            Some(e) => Err(e.context("every job was enqueued, but not every id could be printed")),
            None => Ok(()),
        }
    })
}

/// `jobs` in batches of up to 1,000 (each all or nothing, one round trip), each with the
/// index of its first job. A debounce key ends a batch where it repeats: the lines are sent
/// in order, the later replacing the earlier (a backend refuses one key twice in a batch).
fn batches<'a>(
    jobs: &'a [(Option<usize>, NewJob)],
) -> impl Iterator<Item = (usize, &'a [(Option<usize>, NewJob)])> + 'a {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= jobs.len() {
            return None;
        }
        let mut keys = std::collections::HashSet::new();
        let end = jobs[start..]
            .iter()
            .take(1000)
            .position(|(_, job)| {
                job.debounce
                    .as_ref()
                    .is_some_and(|d| !keys.insert(d.key.as_str()))
            })
            .map_or((start + 1000).min(jobs.len()), |at| start + at);
        let batch = (start, &jobs[start..end]);
        start = end;
        Some(batch)
    })
}

/// What a failed batch, the one from `jobs[done]` on, leaves: the input lines of it and
/// every later one (never sent) are not enqueued, the jobs before it are.
fn not_enqueued(jobs: &[(Option<usize>, NewJob)], done: usize, unknown: bool) -> String {
    let lines = (
        jobs.get(done).and_then(|j| j.0),
        jobs.last().and_then(|j| j.0),
    );
    if unknown {
        // The backend may have acted before the link failed: say so, never "not enqueued".
        return match lines {
            (Some(first), Some(last)) => format!(
                "stdin lines {first}..={last} may or may not have been enqueued (the {done} \
                 jobs of the lines before were: their ids are on stdout)"
            ),
            _ => "the job may or may not have been enqueued: check before enqueueing it again \
                  without --id"
                .into(),
        };
    }
    match lines {
        (Some(first), Some(last)) if done == 0 => {
            format!("nothing was enqueued (stdin lines {first}..={last})")
        }
        (Some(first), Some(last)) => format!(
            "stdin lines {first}..={last} were not enqueued; the {done} jobs of the lines \
             before line {first} were (their ids are on stdout)"
        ),
        _ => "the job was not enqueued".into(),
    }
}

/// `status`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct StatusArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Also show the newest token granted for this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Most live leases to list.
    #[arg(long, default_value_t = 20)]
    leases: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Running flows `status` lists (the oldest first; it counts them all).
const FLOWS_SHOWN: usize = 10;

/// Groups `status` shows per queue (those with the most ready jobs).
const GROUPS_SHOWN: usize = 5;

/// Live leases `status` reads to count running jobs per kind.
const KINDS_LEASE_SCAN: usize = 10_000;

/// Prints queue counts, live leases, running flows and, for `--scope`, the newest token.
pub(super) fn status(args: StatusArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        let mut queues = Vec::new();
        for queue in store.queues().await? {
            // (One queue that cannot be read for good — a key of it another program wrote
            // over, which the error names — is left out with a warning, not the whole status,
            // as a flow is below; a backend that is down still fails it.)
            match store.counts(&queue).await {
                Ok(counts) => queues.push((queue, counts)),
                Err(e) if e.leaves_queue_out(&queue, "status") => {}
                Err(e) => return Err(anyhow::Error::from(e)),
            }
        }
        // One read of the live leases: the first --leases are listed, all are counted per kind.
        let all_leases = store.leases(args.leases.max(KINDS_LEASE_SCAN)).await?;
        let leases: Vec<_> = all_leases.iter().take(args.leases).cloned().collect();
        let paused = store.paused().await?;
        let workers = store.workers().await?;
        // Running per kind counted over every live lease read, beside each kind's cap.
        let kinds = super::kind_load(store.concurrency_caps().await?, &all_leases);
        if all_leases.len() >= KINDS_LEASE_SCAN {
            eprintln!("note: running counts per kind are of the first {KINDS_LEASE_SCAN} leases");
        }
        // Groups: each queue's with the most ready jobs, and those with limits.
        let mut top_groups = Vec::new();
        for (queue, _) in &queues {
            let top = store.groups(queue, GROUPS_SHOWN).await?;
            if !top.is_empty() {
                top_groups.push((queue.clone(), top));
            }
        }
        let limited = store.limited_groups(GROUPS_SHOWN * 4).await?;
        let mut limited_groups = Vec::new();
        for (group, _) in &limited {
            limited_groups.push(store.group(group).await?);
        }
        let (running_flows, oldest_flows) = store.running_flows(FLOWS_SHOWN).await?;
        let mut flows = Vec::with_capacity(oldest_flows.len());
        for (id, _) in oldest_flows {
            // (One flow that cannot be read — gone since it was listed, or its keys written
            // over — is left out, not the whole status.)
            match store.flow(id).await {
                Ok(Some(status)) => flows.push(status),
                Ok(None) => {}
                Err(e) => tracing::warn!(flow = %id, error = %e, "flow not read"),
            }
        }
        let mut progress = Vec::with_capacity(leases.len());
        for l in &leases {
            progress.push(store.progress(l.job).await?);
        }
        let mut out: Vec<String> = Vec::new();
        let highest = match &args.scope {
            Some(scope) => Some(store.highest_token(&Scope::new(scope.as_str())).await?),
            None => None,
        };
        if args.json {
            let json = json!({
                "queues": queues.iter().map(|(q, c)| (q.clone(), json!(c))).collect::<serde_json::Map<_, _>>(),
                // Live worker processes (arbiters) whose heartbeat lists each queue.
                "claimed_by": queues.iter().map(|(q, _)| {
                    (q.clone(), json!(workers.iter().filter(|w| w.queues.contains(q)).count()))
                }).collect::<serde_json::Map<_, _>>(),
                "kinds": kinds.iter().map(|(k, (cap, running))| (k.clone(), json!({
                    "cap": cap, "running": running,
                }))).collect::<serde_json::Map<_, _>>(),
                "workers": workers,
                "leases": leases.iter().zip(&progress).map(|(l, p)| json!({
                    "lease": l.lease, "job": l.job, "queue": l.queue, "kind": l.kind,
                    "scope": l.scope, "token": l.token,
                    "epoch": l.token.epoch(), "counter": l.token.counter(), "worker": l.worker,
                    "age_ms": l.age.as_millis() as u64, "expires_in_ms": l.expires_in.as_millis() as u64,
                    "progress": p.as_deref().and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok()),
                })).collect::<Vec<_>>(),
                "scope": args.scope.as_ref().map(|s| json!({
                    "scope": s, "highest_token": highest.flatten(),
                })),
                "paused": paused,
                "groups": top_groups.iter().map(|(q, top)| (q.clone(), json!(top))).collect::<serde_json::Map<_, _>>(),
                "limited_groups": limited_groups,
                "flows": {
                    "running": running_flows,
                    "oldest": flows.iter().map(|f| json!({
                        "id": f.id, "steps": f.steps, "released": f.released,
                        "completed": f.count(StepEnd::Completed), "dead": f.count(StepEnd::Dead),
                        "skipped": f.count(StepEnd::Skipped),
                    })).collect::<Vec<_>>(),
                },
            });
            return print_lines(std::iter::once(json.to_string()));
        }
        out.push(format!(
            "{:<20} {:>8} {:>8} {:>8} {:>8} {:>10} {:>6} {:>9}",
            "queue", "ready", "waiting", "delayed", "leased", "completed", "dead", "cancelled"
        ));
        let mut limits = std::collections::HashMap::new();
        for (queue, _) in &queues {
            if let Some(l) = store.rate_limit(queue).await? {
                limits.insert(queue.clone(), l);
            }
        }
        for (queue, c) in &queues {
            let mut mark = if paused.contains(queue) { "  (paused)".to_owned() } else { String::new() };
            if c.ready + c.waiting > 0 && !workers.iter().any(|w| w.queues.contains(queue)) {
                mark.push_str("  (no live worker claims it)");
            }
            if let Some(l) = limits.get(queue) {
                mark.push_str(&format!("  (limit {} per {})", l.jobs, humantime::format_duration(l.per)));
            }
            out.push(format!(
                "{queue:<20} {:>8} {:>8} {:>8} {:>8} {:>10} {:>6} {:>9}{mark}",
                c.ready, c.waiting, c.delayed, c.leased, c.completed, c.dead, c.cancelled
            ));
        }
        if !kinds.is_empty() {
            out.push(format!("\n{:<28} {:>8} {:>6}", "kind", "running", "cap"));
            for (kind, (cap, running)) in &kinds {
                let cap = cap.map_or_else(|| "-".to_owned(), |c| c.to_string());
                out.push(format!("{kind:<28} {running:>8} {cap:>6}"));
            }
        }
        if !top_groups.is_empty() {
            out.push("\ngroups with the most ready jobs:".to_owned());
            for (queue, top) in &top_groups {
                let listed: Vec<String> =
                    top.iter().map(|g| format!("{} {}", g.group, g.ready)).collect();
                out.push(format!("  {queue}: {}", listed.join(", ")));
            }
        }
        if !limited.is_empty() {
            let first = if limited.len() == GROUPS_SHOWN * 4 { ", the first by name" } else { "" };
            out.push(format!("\ngroups with limits ({}{first}):", limited.len()));
            for g in &limited_groups {
                out.push(format!("  {}", group_line(g)));
            }
        }
        out.push(format!("\nworkers ({}, from their heartbeats):", workers.len()));
        for w in &workers {
            // (A 0.1.0 worker does not say how it retries.)
            let retry = w.retry.as_deref().map(|r| format!("  retries {r}")).unwrap_or_default();
            out.push(format!(
                "  {}  host {}  pid {}  v{}  queues {}  running {}/{}{retry}",
                w.worker,
                w.host,
                w.pid,
                w.version,
                w.queues.join(","),
                w.running,
                w.concurrency
            ));
        }
        out.push(format!(
            "\nlive leases ({}, soonest expiry first):",
            leases.len()
        ));
        for (l, p) in leases.iter().zip(&progress) {
            let p = p.as_deref().map(|p| format!("  progress {p}")).unwrap_or_default();
            out.push(format!(
                "  {}  job {}  {}/{}  scope {}  token {}:{}  worker {}  age {:.1}s  expires in {:.1}s{p}",
                l.lease,
                l.job,
                l.queue,
                l.kind,
                l.scope,
                l.token.epoch(),
                l.token.counter(),
                l.worker,
                l.age.as_secs_f64(),
                l.expires_in.as_secs_f64()
            ));
        }
        out.push(format!(
            "\nflows running: {running_flows}{}",
            if flows.is_empty() { "" } else { " (oldest first)" }
        ));
        for f in &flows {
            out.push(format!(
                "  {}  {} steps: {}, {} released",
                f.id,
                f.steps,
                super::flow::ends_line(f),
                f.released
            ));
        }
        if let (Some(scope), Some(highest)) = (&args.scope, highest) {
            match highest {
                Some(t) => out.push(format!(
                    "\nnewest token for {scope}: {}:{} (as stored by sinks: {t})",
                    t.epoch(),
                    t.counter()
                )),
                None => out.push(format!(
                    "\nno token is held for {scope} (it has no pending work)"
                )),
            }
        }
        print_lines(out.into_iter())
    })
}

/// Arguments of `jobs`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct JobsArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The queue.
    #[arg(long, default_value = "default")]
    queue: String,
    /// Which jobs: `ready` (claimable now, next first; a group's are counted by `group`, not
    /// listed) or `delayed` (waiting for a delay or a retry, soonest due first).
    #[arg(long, default_value = "ready", value_parser = ["ready", "delayed"])]
    state: String,
    /// Most jobs listed.
    #[arg(long, default_value_t = 100, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    limit: usize,
    /// Jobs skipped from the first (the next page: --offset 100 with the default --limit).
    #[arg(long, default_value_t = 0, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=10_000))]
    offset: usize,
}

/// Lists a queue's ready or delayed jobs.
pub(super) fn jobs(args: JobsArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        palisade::cli_support::check_name("queue", &args.queue)?;
        let ready = args.state == "ready";
        let views =
            crate::reads::live_page(&store, &args.queue, ready, args.offset, args.limit).await?;
        let lines = views.into_iter().map(|v| {
            json!({
                "id": v.job.id, "kind": v.job.kind, "scope": v.job.scope, "state": v.state,
                "attempt": v.job.attempt, "max_attempts": v.job.max_attempts,
                "due_in_ms": v.due_in.map(|d| d.as_millis() as u64),
                "last_error": v.last_error, "payload": v.job.payload,
            })
            .to_string()
        });
        print_lines(lines)
    })
}

/// Arguments of `job`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct JobArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The job's id.
    id: String,
    /// Its queue, if known: a dead job is then searched among that queue's dead letters only
    /// (else among every queue's newest 5,000).
    #[arg(long)]
    queue: Option<String>,
}

/// Shows one job wherever the coordinator still knows it (exit code 2, one line, if nowhere).
pub(super) fn job(args: JobArgs) -> anyhow::Result<()> {
    use crate::reads::Found;
    let id: palisade::JobId = args
        .id
        .trim()
        .parse::<uuid::Uuid>()
        .map(palisade::JobId::from)
        .map_err(|e| anyhow::anyhow!("{:?} is not a job id: {e}", args.id))?;
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        if let Some(queue) = &args.queue {
            palisade::cli_support::check_name("queue", queue)?;
        }
        let found = crate::reads::find_job(&store, id, args.queue.as_deref()).await?;
        let progress = store.progress(id).await?;
        let out = match found {
            Some(Found::Live(v)) => json!({
                "id": id, "state": v.state, "job": v.job, "details": v.details,
                "due_in_ms": v.due_in.map(|d| d.as_millis() as u64), "lease": v.lease,
                "last_error": v.last_error, "progress": progress,
            }),
            Some(Found::Completed(c)) => json!({
                "id": id, "state": "completed", "job": c.job, "details": c.details,
                "completed_ms": c.completed_ms, "result": c.result, "progress": progress,
            }),
            Some(Found::Dead(d)) => json!({
                "id": id, "state": "dead", "job": d.job, "details": d.details,
                "reason": d.reason, "died_ms": d.died_ms, "progress": progress,
            }),
            Some(Found::Result(r)) => json!({
                "id": id, "state": "completed", "result": r, "progress": progress,
                "note": "its record is no longer kept, only its result",
            }),
            None => anyhow::bail!(
                "no live, completed or dead job has id {id} (completed jobs are kept for the \
                 workers' --keep-completed, a day by default)"
            ),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        Ok(())
    })
}

/// Arguments of `clear`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct ClearArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The queue.
    queue: String,
    /// Do it (without: say how many jobs it would cancel).
    #[arg(long)]
    yes: bool,
    /// Kept with each job's dead-letter record.
    #[arg(long, default_value = "queue cleared by an operator")]
    reason: String,
}

/// Cancels every ready and delayed job of a queue enqueued before it started (jobs enqueued
/// meanwhile stay), in rounds; prints the total.
pub(super) fn clear(args: ClearArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        palisade::cli_support::check_name("queue", &args.queue)?;
        let before = store.counts(&args.queue).await?;
        let at_most = before.ready + before.delayed;
        if !args.yes {
            println!(
                "queue {}: {} ready and {} delayed jobs would be cancelled (to the dead \
                 letters); run again with --yes",
                args.queue, before.ready, before.delayed
            );
            return Ok(());
        }
        // Jobs enqueued from now on stay.
        let now = u64::try_from(store.now_ms().await?).unwrap_or(0);
        let cancelled =
            crate::reads::clear_queue(&store, &args.queue, &args.reason, at_most, now).await?;
        let after = store.counts(&args.queue).await?;
        let mut said = format!("queue {}: {cancelled} jobs cancelled", args.queue);
        let left = after.ready + after.delayed + after.waiting;
        if left > 0 {
            said.push_str(&format!(
                "; {left} left ({} ready — of groups, or enqueued meanwhile —, {} delayed, {} \
                 waiting behind their scope)",
                after.ready, after.delayed, after.waiting
            ));
        }
        println!("{said}");
        Ok(())
    })
}

/// Arguments of `kinds`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct KindsArgs {
    /// One JSON object per kind (`{"kind": ..., "example": ...}`) instead of text.
    #[arg(long)]
    json: bool,
}

/// Lists the registry's kinds, sorted, each with its example payload when it has one.
pub(super) fn kinds(args: KindsArgs, registry: &Registry) -> anyhow::Result<()> {
    let mut kinds: Vec<&str> = registry.kinds().collect();
    kinds.sort_unstable();
    let lines = kinds.into_iter().map(|kind| {
        let example = registry.example(kind);
        if args.json {
            let example = example.and_then(|e| serde_json::from_str::<serde_json::Value>(e).ok());
            json!({ "kind": kind, "example": example }).to_string()
        } else {
            match example {
                Some(example) => format!("{kind}  {example}"),
                None => kind.to_owned(),
            }
        }
    });
    print_lines(lines)
}

/// `dead list|retry|purge`.
#[derive(Clone, Debug, clap::Subcommand)]
pub(super) enum DeadCommand {
    /// Print dead-lettered jobs with their reasons, one JSON object per line, newest first
    /// (queue by queue), a page at a time (`--page`).
    List(DeadListArgs),
    /// Move every dead-lettered job the filters take back to ready with fresh attempts,
    /// oldest first, in short steps; prints the total (and a progress bar on a terminal).
    Retry(DeadArgs),
    /// Delete every dead-lettered job the filters take for good, oldest first (workers also
    /// keep at most `--dead-retention` per queue).
    Purge(DeadArgs),
}

/// Arguments of `dead list`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct DeadListArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Queue (without it: every queue).
    #[arg(long)]
    queue: Option<String>,
    #[command(flatten)]
    filter: DeadFilterArgs,
    /// Jobs per page (per queue).
    #[arg(long, default_value_t = 100, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    limit: usize,
    /// Page to print, 1 the newest.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    page: usize,
}

/// Arguments of `dead retry|purge`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct DeadArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Queue (without it: `default`).
    #[arg(long)]
    queue: Option<String>,
    #[command(flatten)]
    filter: DeadFilterArgs,
    /// Most jobs to retry or delete (default: every one the filters take).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..))]
    limit: Option<u64>,
}

/// Which dead letters a `dead` command takes: every condition given must hold.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct DeadFilterArgs {
    /// Only jobs of this kind.
    #[arg(long, value_parser = clap::builder::NonEmptyStringValueParser::new())]
    kind: Option<String>,
    /// Only jobs whose reason contains this text (as written, case and all).
    #[arg(long, value_name = "TEXT", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    reason: Option<String>,
    /// Only jobs that died longer ago than this, e.g. 1h or 7d (this host's clock against the
    /// coordinator's time of death).
    #[arg(long, value_name = "AGE", value_parser = super::duration_within(Duration::ZERO, super::YEAR))]
    older_than: Option<Duration>,
}

impl DeadFilterArgs {
    fn filter(&self) -> palisade::DeadFilter {
        palisade::DeadFilter {
            kind: self.kind.clone(),
            reason: self.reason.clone(),
            died_before_ms: self.older_than.map(|age| {
                palisade::store::unix_ms()
                    .saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
            }),
        }
    }
}

/// `dead retry|purge` without `--queue` act on `default`: says so when other queues hold
/// dead jobs (which `dead list` shows).
async fn hint_other_dead(store: &palisade::Stores) -> anyhow::Result<()> {
    let mut others = Vec::new();
    for queue in store.queues().await? {
        if queue == "default" {
            continue;
        }
        match store.counts(&queue).await {
            Ok(counts) if counts.dead > 0 => others.push(queue),
            Ok(_) => {}
            Err(e) if e.leaves_queue_out(&queue, "status") => {}
            Err(e) => return Err(e.into()),
        }
    }
    if !others.is_empty() {
        eprintln!(
            "note: without --queue this acts on queue default; dead jobs wait in {} too",
            others.join(", ")
        );
    }
    Ok(())
}

/// Dead letters `dead list` reads per call while it filters.
const LIST_STEP: usize = 1_000;

/// Page `page` (1: the newest) of `queue`'s dead letters that `filter` takes, newest first.
async fn dead_page(
    store: &palisade::Stores,
    queue: &str,
    filter: &palisade::DeadFilter,
    per_page: usize,
    page: usize,
) -> palisade::Result<Vec<palisade::DeadJob>> {
    let skip = per_page.saturating_mul(page - 1);
    let total = usize::try_from(store.counts(queue).await?.dead).unwrap_or(usize::MAX);
    let (mut taken, mut out) = (0usize, Vec::new());
    // From the newest end backwards, a step at a time, until the page is full.
    let mut end = total;
    while end > 0 && out.len() < per_page {
        let start = end.saturating_sub(LIST_STEP);
        let mut rows = store.dead_range(queue, start, end - start).await?;
        rows.reverse();
        for dead in rows.into_iter().filter(|d| filter.matches(d)) {
            if taken >= skip && out.len() < per_page {
                out.push(dead);
            }
            taken += 1;
        }
        end = start;
    }
    Ok(out)
}

/// Runs `dead ...`.
pub(super) fn dead(command: DeadCommand) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        match command {
            DeadCommand::List(args) => {
                let (_, store) = args.redis.store().await?;
                let (queues, every) = match args.queue {
                    Some(queue) => (vec![queue], false),
                    None => (store.queues().await?, true),
                };
                let filter = args.filter.filter();
                let mut lines = Vec::new();
                for queue in queues {
                    // (Every queue's: one whose dead list another program wrote over is left
                    // out with a warning naming the key. A queue asked for by name fails.)
                    let dead = match dead_page(&store, &queue, &filter, args.limit, args.page).await
                    {
                        Ok(dead) => dead,
                        Err(e) if every && e.leaves_queue_out(&queue, "status") => continue,
                        Err(e) => return Err(e.into()),
                    };
                    for dead in dead {
                        lines.push(serde_json::to_string(&dead)?);
                    }
                }
                print_lines(lines.into_iter())?;
            }
            DeadCommand::Retry(args) => sweep(args, palisade::DeadAction::Retry).await?,
            DeadCommand::Purge(args) => sweep(args, palisade::DeadAction::Purge).await?,
        }
        anyhow::Ok(())
    })
}

/// `dead retry|purge`: the whole set the filters take, with a progress bar on a terminal and
/// the totals at the end (also when a step fails: what was done stays done).
async fn sweep(args: DeadArgs, action: palisade::DeadAction) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    let (_, store) = args.redis.store().await?;
    let queue = args.queue.as_deref().unwrap_or("default");
    palisade::cli_support::check_name("queue", queue)?;
    let filter = args.filter.filter();
    let dead = store.counts(queue).await?.dead;
    // At most what the queue holds now: a job that dies again at once while this runs waits
    // for the next command instead of being retried again and again by this one.
    let limit = args.limit.unwrap_or(u64::MAX).min(dead);
    let bar = if std::io::stderr().is_terminal() {
        indicatif::ProgressBar::new(dead)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} read, {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let (verb, done_word) = match action {
        palisade::DeadAction::Retry => ("retry", "retried"),
        palisade::DeadAction::Purge => ("purge", "deleted"),
    };
    let last = std::sync::Mutex::new(palisade::DeadSweep::default());
    let result = store
        .dead_where(queue, &filter, action, limit, &|s| {
            bar.set_position(s.scanned);
            bar.set_message(format!("{} {done_word}", s.done));
            *last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
        })
        .await;
    bar.finish_and_clear();
    let s = *last
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let kept = if s.kept > 0 {
        format!(
            "; {} matched but stay dead (their ids name live jobs again, or their records cannot be revived)",
            s.kept
        )
    } else {
        String::new()
    };
    println!(
        "{} jobs {done_word} of queue {queue} ({} dead letters read){kept}",
        s.done, s.scanned
    );
    if let Err(e) = result {
        return Err(anyhow::Error::from(e)
            .context(format!("dead {verb} stopped after {} {done_word}", s.done)));
    }
    if args.queue.is_none() {
        hint_other_dead(&store).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::fill;

    /// A code schedule that its workers also keep is listed once; a kept copy that differs is
    /// listed beside the code's, as the one fired until this binary's workers start.
    #[test]
    fn schedule_list_shows_each_schedule_once_with_its_source() {
        let job = || palisade::NewJob::raw("k", "{}");
        let code = palisade::Schedule::new("nightly", "0 3 * * *", job()).unwrap();
        let other = palisade::Schedule::new("hourly", "0 * * * *", job()).unwrap();
        let kept_only = palisade::Schedule::new("weekly", "0 3 * * 1", job()).unwrap();
        let mut differs = other.spec().clone();
        differs.pattern = "30 * * * *".into();
        let rows = super::listed(
            &[code.clone(), other],
            vec![code.spec().clone(), differs, kept_only.spec().clone()],
        );
        let shown: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|(s, src)| (s.name(), s.spec().pattern.as_str(), *src))
            .collect();
        assert_eq!(
            shown,
            [
                ("nightly", "0 3 * * *", "code (kept)"),
                ("hourly", "0 * * * *", "code (not kept yet)"),
                (
                    "hourly",
                    "30 * * * *",
                    "kept (differs from the code: fired until a worker of this binary starts)"
                ),
                ("weekly", "0 3 * * 1", "kept")
            ]
        );
    }

    #[test]
    fn scope_templates_take_payload_fields() {
        let p = r#"{"account":42,"region":"eu","vip":true}"#;
        assert_eq!(fill("account:{account}", p).unwrap(), "account:42");
        assert_eq!(fill("{region}/{account}/{vip}", p).unwrap(), "eu/42/true");
        assert_eq!(fill("plain", "not json").unwrap(), "plain");
        assert!(fill("account:{missing}", p).is_err());
        assert!(fill("account:{account", p).is_err());
    }
}

/// `pause` and `resume`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct QueueArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The queue.
    queue: String,
}

/// Pauses or resumes claims from a queue; nothing is moved or lost either way.
pub(super) fn set_paused(args: QueueArgs, paused: bool) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        warn_unknown_queue(&store, &args.queue).await?;
        if !paused && !store.paused().await?.contains(&args.queue) {
            eprintln!("warning: queue {:?} was not paused", args.queue);
        }
        store.set_paused(&args.queue, paused).await?;
        let what = if paused {
            "paused: workers claim nothing from it until `resume`"
        } else {
            "resumed"
        };
        print_lines(std::iter::once(format!("queue {} {what}", args.queue)))
    })
}

/// Says so on stderr when `queue` has never had a job (a typo, most often): the setting is
/// kept anyway, for a queue about to be used.
async fn warn_unknown_queue(store: &palisade::Stores, queue: &str) -> anyhow::Result<()> {
    if !store.queues().await?.iter().any(|q| q == queue) {
        eprintln!(
            "warning: queue {queue:?} has never had a job (known: {}); set anyway",
            store.queues().await?.join(", ")
        );
    }
    Ok(())
}

/// Forgets a queue that holds no job.
pub(super) fn forget(args: QueueArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        if store.paused().await?.contains(&args.queue)
            || store.rate_limit(&args.queue).await?.is_some()
        {
            bail!(
                "queue {} is paused or rate-limited, and forgetting it would drop that: \
                 `resume` it or lift the limit (`limit --off`) first",
                args.queue
            );
        }
        if !store.queues().await?.contains(&args.queue) {
            eprintln!(
                "warning: queue {:?} is not listed (never had a job?)",
                args.queue
            );
        }
        if !store.forget_queue(&args.queue).await? {
            let c = store.counts(&args.queue).await?;
            bail!(
                "queue {} still holds jobs ({} pending, {} dead{}): retry or purge them first",
                args.queue,
                c.pending(),
                c.dead,
                if c.pending() + c.dead == 0 {
                    ", and a flow step waiting for its dependencies"
                } else {
                    ""
                }
            );
        }
        print_lines(std::iter::once(format!("queue {} forgotten", args.queue)))
    })
}

/// The schedules `schedule list` shows, with where each comes from. Workers fire the kept
/// copies (a `palisade worker` keeps its code's schedules when it starts, over any copy of the
/// same name), so a code schedule is listed once when its kept copy is the same; when the kept
/// copy differs (an older binary's) or is missing, the code's is listed as not kept yet and
/// the kept copy — the one fired until a worker of this binary starts — as well.
fn listed(
    declared: &[palisade::Schedule],
    kept: Vec<palisade::ScheduleSpec>,
) -> Vec<(palisade::Schedule, &'static str)> {
    let mut all: Vec<_> = declared
        .iter()
        .map(|s| {
            let same = kept.iter().any(|k| k == s.spec());
            (
                s.clone(),
                if same {
                    "code (kept)"
                } else {
                    "code (not kept yet)"
                },
            )
        })
        .collect();
    for spec in kept {
        let source = match declared.iter().find(|d| d.name() == spec.name) {
            Some(d) if d.spec() == &spec => continue,
            Some(_) => "kept (differs from the code: fired until a worker of this binary starts)",
            None => "kept",
        };
        // Kept by an older version that let it in (a pattern that never fires): the
        // scheduler skips it, and the operator should hear of it.
        let name = spec.name.clone();
        match palisade::Schedule::try_from(spec) {
            Ok(s) => all.push((s, source)),
            Err(e) => eprintln!("kept schedule {name:?} skipped (`schedule remove` it): {e}"),
        }
    }
    all
}

/// `schedule list|add|remove`.
#[derive(Clone, Debug, clap::Subcommand)]
pub(super) enum ScheduleCommand {
    /// Every schedule — this binary's and those kept in Redis — with when it last fired and
    /// when it fires next.
    List {
        #[command(flatten)]
        redis: RedisArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Keep a schedule in Redis; workers pick it up within a second.
    Add(ScheduleAddArgs),
    /// Remove a schedule kept in Redis.
    Remove {
        #[command(flatten)]
        redis: RedisArgs,
        /// Its name.
        name: String,
    },
    /// Pause a schedule (kept, or this binary's own): its ticks are skipped, not saved up,
    /// until it is resumed.
    Pause {
        #[command(flatten)]
        redis: RedisArgs,
        /// Its name.
        name: String,
    },
    /// Resume a paused schedule: it fires from its next tick on.
    Resume {
        #[command(flatten)]
        redis: RedisArgs,
        /// Its name.
        name: String,
    },
}

/// `schedule add`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct ScheduleAddArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Name (replaces a kept schedule of that name).
    name: String,
    /// Cron pattern: 5 fields, or 6 with seconds first (`'*/10 * * * * *'`).
    pattern: String,
    /// Job kind, one of the kinds this binary handles.
    kind: String,
    /// Payload as JSON, checked against the kind's payload type.
    json: String,
    /// IANA time zone the pattern is read in.
    #[arg(long, default_value = "UTC")]
    tz: String,
    /// Queue.
    #[arg(long, default_value = "default")]
    queue: String,
    /// Protected scope of each tick's job (default: the job's own); `{field}` is filled from
    /// the payload, as in `enqueue --scope`.
    #[arg(long)]
    scope: Option<String>,
    /// Ticks missed for longer than --grace: none, last, or all:N (the latest N).
    #[arg(long, default_value = "last", value_parser = parse_catch_up)]
    catch_up: palisade::CatchUp,
    /// A tick late by at most this much still fires.
    #[arg(long, default_value = "60s", value_parser = super::duration_within(Duration::ZERO, super::YEAR))]
    grace: Duration,
}

fn parse_catch_up(s: &str) -> Result<palisade::CatchUp, String> {
    match s {
        "none" => Ok(palisade::CatchUp::None),
        "last" => Ok(palisade::CatchUp::Last),
        _ => s
            .strip_prefix("all:")
            .and_then(|n| n.parse().ok())
            .map(palisade::CatchUp::All)
            .ok_or_else(|| format!("{s:?}: want none, last or all:N")),
    }
}

/// Runs `schedule list|add|remove|pause|resume`.
pub(super) fn schedule(
    command: ScheduleCommand,
    registry: &Registry,
    declared: &[palisade::Schedule],
) -> anyhow::Result<()> {
    match command {
        ScheduleCommand::Add(args) => {
            registry.check(&args.kind, &args.json)?;
            let mut job = NewJob::raw(&args.kind, &args.json).with_queue(&args.queue);
            if let Some(template) = &args.scope {
                // `{field}` from the payload, as `enqueue --scope` fills it (every tick's
                // payload is the same, so it is filled once, here).
                job = job.with_scope(fill(template, &args.json)?);
            }
            let schedule = palisade::Schedule::new(&args.name, &args.pattern, job)?
                .in_time_zone(&args.tz)?
                .with_catch_up(args.catch_up)
                .with_grace(args.grace);
            if declared.iter().any(|d| d.name() == args.name) {
                bail!("this binary declares a schedule named {:?}; a kept one would be ignored", args.name);
            }
            runtime()?.block_on(async {
                let (_, store) = args.redis.store().await?;
                store.put_schedule(schedule.spec().clone()).await?;
                let paused = store.paused_schedules().await?.contains(&args.name);
                let said = if paused {
                    format!(
                        "schedule {} kept, and paused (a pause of that name stands): `schedule \
                         resume {}` to fire it",
                        args.name, args.name
                    )
                } else {
                    format!("schedule {} kept", args.name)
                };
                print_lines(std::iter::once(said))
            })
        }
        ScheduleCommand::Remove { redis, name } => runtime()?.block_on(async {
            if declared.iter().any(|d| d.name() == name) {
                // Its workers keep it again when they start, and fire it meanwhile: a remove
                // here would only pretend.
                bail!(
                    "schedule {name:?} is declared by this binary's code: remove it from the \
                     code and restart the workers"
                );
            }
            let (_, store) = redis.store().await?;
            if !store.remove_schedule(&name).await? {
                bail!("no kept schedule named {name:?}");
            }
            print_lines(std::iter::once(format!("schedule {name} removed")))
        }),
        ScheduleCommand::Pause { redis, name } => pause_schedule(redis, &name, true, declared),
        ScheduleCommand::Resume { redis, name } => pause_schedule(redis, &name, false, declared),
        ScheduleCommand::List { redis, json } => runtime()?.block_on(async {
            let (_, store) = redis.store().await?;
            let now = store.now_ms().await?;
            let paused = store.paused_schedules().await?;
            let mut rows = Vec::new();
            let kept = store.schedules().await?;
            let all = listed(declared, kept);
            for (schedule, source) in all {
                let mark = store.schedule_mark(schedule.name()).await?;
                rows.push((schedule.clone(), source, mark, schedule.next_fired(mark, now)));
            }
            // The page's formatting: a tick past year 9999 is shown raw, not a panic.
            let when = |ms: Option<i64>| {
                ms.and_then(|ms| u64::try_from(ms).ok())
                    .map(super::when)
                    .unwrap_or_else(|| "-".into())
            };
            if json {
                let out: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|(s, source, mark, next)| {
                        let paused = paused.iter().any(|p| p == s.name());
                        json!({"schedule": s.spec(), "source": source, "handled_through_ms": mark, "next_ms": next, "paused": paused})
                    })
                    .collect();
                return print_lines(std::iter::once(serde_json::Value::from(out).to_string()));
            }
            let mut out = vec![format!(
                "{:<24} {:<20} {:<16} {:<11} {:<22} {:<22} kind",
                "name", "pattern", "time zone", "source", "handled through", "next tick"
            )];
            for (s, source, mark, next) in &rows {
                let spec = s.spec();
                let next = if paused.iter().any(|p| p == s.name()) {
                    "paused".to_owned()
                } else {
                    when(*next)
                };
                out.push(format!(
                    "{:<24} {:<20} {:<16} {:<11} {:<22} {:<22} {}",
                    spec.name, spec.pattern, spec.time_zone, source, when(*mark), next, spec.job.kind
                ));
            }
            print_lines(out.into_iter())
        }),
    }
}

/// `schedule pause|resume NAME`.
fn pause_schedule(
    redis: RedisArgs,
    name: &str,
    pause: bool,
    declared: &[palisade::Schedule],
) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let (_, store) = redis.store().await?;
        let known = declared.iter().any(|d| d.name() == name)
            || store.schedules().await?.iter().any(|s| s.name == name);
        // (Resuming a name no longer known still clears it: it may have been removed from the
        // code while paused.)
        if pause && !known {
            bail!("no schedule named {name:?} (this binary's or kept)");
        }
        let said = match (pause, store.pause_schedule(name, pause).await?) {
            (true, true) => {
                format!("schedule {name} paused: its ticks are skipped until it is resumed")
            }
            (true, false) => format!("schedule {name} was paused already"),
            (false, true) => format!("schedule {name} resumed: it fires from its next tick"),
            (false, false) => format!("schedule {name} was not paused"),
        };
        print_lines(std::iter::once(said))
    })
}

/// `limit`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct LimitArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The queue.
    queue: String,
    /// Claims allowed per --per, shared by every worker (also the largest burst), or `off` to
    /// lift the limit. Without it: print the queue's limit.
    #[arg(long, value_name = "N|off", value_parser = setting)]
    jobs: Option<Setting>,
    /// The period, e.g. 1s or 1m (default 1s; only with `--jobs N`).
    #[arg(long, value_parser = super::duration_within(Duration::from_millis(1), super::YEAR))]
    per: Option<Duration>,
    /// Lift the queue's limit (as `--jobs off`).
    #[arg(long, hide = true, conflicts_with = "jobs")]
    off: bool,
}

/// A number, or `off`: what every cap and limit flag takes (`cap --running`, `limit --jobs`,
/// `group --cap` and `--jobs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Setting {
    /// Lift it.
    Off,
    /// Set it to this.
    To(u32),
}

fn setting(text: &str) -> Result<Setting, String> {
    match text.trim() {
        "off" => Ok(Setting::Off),
        n => n
            .parse()
            .map(Setting::To)
            .map_err(|_| format!("{text:?}: a whole number (0 to 4294967295), or off")),
    }
}

/// What a setting flag and its older `--off`-style alias ask: `None` to leave it, `Some(None)`
/// to lift it, `Some(Some(n))` to set it.
fn asked(value: Option<Setting>, off: bool) -> Option<Option<u32>> {
    match (value, off) {
        (Some(Setting::To(n)), _) => Some(Some(n)),
        (Some(Setting::Off), _) | (None, true) => Some(None),
        (None, false) => None,
    }
}

fn limit_line(queue: &str, limit: Option<palisade::RateLimit>) -> String {
    match limit {
        Some(l) => format!(
            "queue {queue}: at most {} jobs per {}",
            l.jobs,
            humantime::format_duration(l.per)
        ),
        None => format!("queue {queue}: no rate limit"),
    }
}

/// Sets, lifts or shows a queue's rate limit.
pub(super) fn limit(args: LimitArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        let asked = asked(args.jobs, args.off);
        if args.per.is_some() && !matches!(asked, Some(Some(_))) {
            bail!("--per goes with --jobs N (the number of claims per period)");
        }
        let Some(asked) = asked else {
            let now = store.rate_limit(&args.queue).await?;
            return print_lines(std::iter::once(limit_line(&args.queue, now)));
        };
        let limit = asked.map(|jobs| palisade::RateLimit {
            jobs,
            per: args.per.unwrap_or(Duration::from_secs(1)),
        });
        warn_unknown_queue(&store, &args.queue).await?;
        store.set_rate_limit(&args.queue, limit).await?;
        print_lines(std::iter::once(limit_line(&args.queue, limit)))
    })
}

/// `cancel`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct CancelArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The job's id (as `enqueue` printed it).
    job: uuid::Uuid,
    /// Why, kept with the dead-letter record.
    #[arg(long, default_value = "cancelled")]
    reason: String,
}

/// Cancels one job; exits non-zero if there was nothing to cancel.
pub(super) fn cancel(args: CancelArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        let job = palisade::JobId::from(args.job);
        let said = match store.cancel(job, &args.reason).await? {
            palisade::Cancelled::Removed => format!("job {job} cancelled: it was queued; now dead"),
            palisade::Cancelled::Revoked => format!(
                "job {job} cancelled: its lease is revoked (its handler stops at its next renewal); now dead"
            ),
            palisade::Cancelled::Missing => bail!("job {job} is not queued or running"),
        };
        print_lines(std::iter::once(said))
    })
}

/// `waitpoint complete|show`.
#[derive(Clone, Debug, clap::Subcommand)]
pub(super) enum WaitpointCommand {
    /// Complete a waitpoint with a JSON value and wake the run waiting for it. Completed
    /// once: a second completion changes nothing and prints the kept value (exit 0 if it is
    /// the same value, 1 if another).
    Complete(WaitpointCompleteArgs),
    /// Show a waitpoint as JSON: its value once completed, and the job waiting for it.
    Show(WaitpointShowArgs),
}

/// Arguments of `waitpoint complete`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct WaitpointCompleteArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The waitpoint's id, as the run names it (`approval:order-42`).
    id: String,
    /// The value, as JSON (`true`, `'{"approved": false}'`).
    value: String,
}

/// Arguments of `waitpoint show`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct WaitpointShowArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The waitpoint's id.
    id: String,
}

/// `waitpoint complete|show`.
pub(super) fn waitpoint(command: WaitpointCommand) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        match command {
            WaitpointCommand::Complete(args) => {
                let value: serde_json::Value = serde_json::from_str(&args.value)
                    .map_err(|e| anyhow::anyhow!("the value is not JSON: {e}"))?;
                let (_, store) = args.redis.store().await?;
                // (Waiting for the wake: this process ends when the command does.)
                let completed = palisade::cli_support::complete_waitpoint(
                    &store,
                    &args.id,
                    value.to_string(),
                    true,
                )
                .await?;
                match completed {
                    palisade::store::Completion::First { waiter } => {
                        let woke = waiter.map_or("no run waits for it yet".into(), |job| {
                            format!("woke job {job}")
                        });
                        print_lines(std::iter::once(format!(
                            "waitpoint {} completed; {woke}",
                            args.id
                        )))
                    }
                    palisade::store::Completion::Already { value: kept } => {
                        let same = serde_json::from_str::<serde_json::Value>(&kept)
                            .is_ok_and(|k| k == value);
                        if !same {
                            bail!(
                                "waitpoint {} was completed before with {kept}: nothing changed",
                                args.id
                            );
                        }
                        print_lines(std::iter::once(format!(
                            "waitpoint {} was completed before with this value: nothing changed",
                            args.id
                        )))
                    }
                }
            }
            WaitpointCommand::Show(args) => {
                let (_, store) = args.redis.store().await?;
                let Some(kept) = store.waitpoint(&args.id).await? else {
                    bail!("waitpoint {} was neither completed nor waited for", args.id);
                };
                let shown = serde_json::json!({
                    "id": kept.id,
                    "completed": kept.value.is_some(),
                    "value": kept.value.map(|v| serde_json::from_str::<serde_json::Value>(&v)
                        .unwrap_or(serde_json::Value::String(v))),
                    "waiter": kept.waiter.map(|j| j.to_string()),
                });
                print_lines(std::iter::once(shown.to_string()))
            }
        }
    })
}

/// `run show`.
#[derive(Clone, Debug, clap::Subcommand)]
pub(super) enum RunCommand {
    /// Print a durable run as JSON: its job's state and its journal in call order.
    Show(RunShowArgs),
}

/// Arguments of `run show`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct RunShowArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Where a declared fenced sink lives: `NAME=URL` (repeatable), as for `worker`.
    #[arg(long = "sink", value_name = "NAME=URL")]
    sinks: Vec<String>,
    /// The sink that keeps the run's journal (`ctx.durable(NAME)`); may be left out when the
    /// binary declares one sink.
    #[arg(long)]
    journal: Option<String>,
    /// The job's id.
    job: uuid::Uuid,
}

/// `run show`.
pub(super) fn run(command: RunCommand, declared: &[String]) -> anyhow::Result<()> {
    let RunCommand::Show(args) = command;
    let journal = match (&args.journal, declared) {
        (Some(name), _) => name.clone(),
        (None, [only]) => only.clone(),
        (None, _) => bail!(
            "say which sink keeps the journal (--journal NAME; this binary declares {})",
            if declared.is_empty() {
                "none".to_owned()
            } else {
                declared.join(", ")
            }
        ),
    };
    let urls = super::sinks::sink_urls(
        declared,
        &args.sinks,
        &super::sinks::environment(),
        &args.redis.redis,
    )?;
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        let job = palisade::JobId::from(args.job);
        let found = crate::reads::find_job(&store, job, None).await?;
        let (state, scope) = match &found {
            Some(crate::reads::Found::Live(view)) => (
                format!("{:?}", view.state).to_lowercase(),
                view.job.scope.clone(),
            ),
            Some(crate::reads::Found::Completed(done)) => {
                ("completed".into(), done.job.scope.clone())
            }
            Some(crate::reads::Found::Dead(dead)) => ("dead".into(), dead.job.scope.clone()),
            Some(crate::reads::Found::Result(_)) | None => bail!(
                "job {job} is not known to the coordinator (or its record is gone): its scope, \
                 which names its journal, cannot be read"
            ),
        };
        let installation = super::Installation {
            redis: args.redis.clone(),
            sinks: urls,
        };
        let sink = installation.sink(&journal).await?;
        let entries = palisade::durable::journal(&*sink, &scope, job).await?;
        let shown = serde_json::json!({
            "job": job.to_string(),
            "state": state,
            "scope": scope.as_str(),
            "journal_sink": journal,
            "journal": entries,
        });
        print_lines(std::iter::once(shown.to_string()))
    })
}

/// `cap`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct CapArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The job kind.
    kind: String,
    /// Most jobs of the kind running at once across every worker, or `off` to lift the cap.
    /// Without it: print the kind's cap.
    #[arg(long, value_name = "N|off", value_parser = setting)]
    running: Option<Setting>,
    /// Lift the kind's cap (as `--running off`).
    #[arg(long, hide = true, conflicts_with = "running")]
    off: bool,
}

/// Sets or lifts a kind's fleet-wide concurrency cap.
pub(super) fn cap(args: CapArgs, registry: &Registry) -> anyhow::Result<()> {
    if !registry.kinds().any(|k| k == args.kind) {
        let mut known: Vec<&str> = registry.kinds().collect();
        known.sort_unstable();
        eprintln!(
            "warning: this binary has no handler for kind {:?} (it has: {}); set anyway, for \
             another binary's workers",
            args.kind,
            known.join(", ")
        );
    }
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        let cap = match asked(args.running, args.off) {
            Some(cap) => {
                store.set_concurrency_cap(&args.kind, cap).await?;
                cap
            }
            None => store.concurrency_cap(&args.kind).await?,
        };
        let said = match cap {
            Some(n) => format!("kind {}: at most {n} running at once", args.kind),
            None => format!("kind {}: no concurrency cap", args.kind),
        };
        print_lines(std::iter::once(said))
    })
}

/// `group`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct GroupArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The group.
    group: String,
    /// Most of its jobs running at once across every worker, queue and kind, or `off` to lift
    /// its cap.
    #[arg(long, value_name = "N|off", value_parser = setting, conflicts_with = "no_cap")]
    cap: Option<Setting>,
    /// Lift its cap (as `--cap off`).
    #[arg(long, hide = true)]
    no_cap: bool,
    /// Starts allowed per --per, shared by every worker (also the largest burst), or `off` to
    /// lift its rate limit.
    #[arg(long, value_name = "N|off", value_parser = setting, conflicts_with = "no_rate")]
    jobs: Option<Setting>,
    /// The rate limit's period, e.g. 1s or 1m (default: the group's period, else 1s).
    #[arg(long, conflicts_with = "no_rate", value_parser = super::duration_within(Duration::from_millis(1), Duration::from_secs(86_400)))]
    per: Option<Duration>,
    /// Lift its rate limit (as `--jobs off`).
    #[arg(long, hide = true)]
    no_rate: bool,
    /// Start none of its jobs until --resume (they stay ready; other groups run).
    #[arg(long, conflicts_with = "resume")]
    pause: bool,
    /// Let its jobs start again.
    #[arg(long)]
    resume: bool,
}

/// A group's line: its ready and running jobs, its limits, whether it is parked.
pub(super) fn group_line(g: &palisade::GroupStatus) -> String {
    let mut line = format!("group {}: {} ready", g.group, g.ready);
    if let Some(cap) = g.limits.cap {
        line.push_str(&format!(", {} running (cap {cap})", g.running));
    }
    if let Some(rate) = g.limits.rate {
        line.push_str(&format!(
            ", at most {} per {}",
            rate.jobs,
            humantime::format_duration(rate.per)
        ));
    }
    if g.limits.paused {
        line.push_str(", paused");
    }
    if g.parked {
        line.push_str(" (out of the rotation until it can run)");
    }
    line
}

/// Shows a group, or changes what was asked of its limits (the others are kept).
pub(super) fn group(args: GroupArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        let mut limits = store.group(&args.group).await?.limits;
        let was = limits;
        let cap = asked(args.cap, args.no_cap);
        if let Some(cap) = cap {
            limits.cap = cap;
        }
        let rate = asked(args.jobs, args.no_rate);
        if rate == Some(None) {
            if args.per.is_some() {
                bail!("--per with the rate limit lifted: give --jobs a number");
            }
            limits.rate = None;
        } else if rate.is_some() || args.per.is_some() {
            // One of the two changes; the other is kept.
            let Some(jobs) = rate.flatten().or(limits.rate.map(|r| r.jobs)) else {
                bail!("group {} has no rate limit: --per needs --jobs", args.group);
            };
            let per = args
                .per
                .or(limits.rate.map(|r| r.per))
                .unwrap_or(Duration::from_secs(1));
            limits.rate = Some(palisade::RateLimit { jobs, per });
        }
        limits.paused = (limits.paused || args.pause) && !args.resume;
        if limits != was || cap.flatten().is_some() {
            // (Set again with the same cap, its running jobs are counted afresh.)
            store.set_group_limits(&args.group, limits).await?;
        }
        print_lines(std::iter::once(group_line(
            &store.group(&args.group).await?,
        )))
    })
}

/// `partitions`.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct PartitionsArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// The number of partitions the installation has used so far.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    from: u16,
    /// The number it uses from now on (then start every process with `--partitions` so).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    to: u16,
}

/// Moves the coordinator to another number of partitions (`store::partitioned::migrate`).
pub(super) fn partitions(args: PartitionsArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        // (Not `store()`: that refuses a number of partitions other than the recorded one.)
        let target = args.redis.reachable(&args.redis.redis, "Redis").await?;
        let epoch = palisade::store::redis::move_layout(
            target,
            &args.redis.prefix,
            usize::from(args.from),
            usize::from(args.to),
            |s| s,
        )
        .await
        .with_context(|| format!("--from {} --to {}", args.from, args.to))?;
        print_lines(
            [
                format!(
                    "{} -> {} partitions: the new layout grants tokens in epoch {epoch} or above",
                    args.from, args.to
                ),
                format!(
                    "start every worker and producer with --partitions {}: processes of the old \
                 layout are refused from now on (schedules, pauses, rate limits and caps moved)",
                    args.to
                ),
            ]
            .into_iter(),
        )
    })
}
