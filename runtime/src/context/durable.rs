//! Durable runs: a handler that records its steps, sleeps and waits in a **journal**, so that
//! a run resumed later (after a sleep, a wait, a crash or a stall) replays what is recorded
//! instead of doing it again. ARCHITECTURE.md §5.8 has the rules; `docs/jobs.md` the guide.
//!
//! Where Palisade differs from the durable-execution engines: a step's journal entry is
//! written **by the same fenced write as its effect**. Through a Redis or memory sink the
//! entry is one more mutation in the write's list (a field of the run's journal hash,
//! `{<scope>}:palisade:journal:<job>`, in the scope's slot on a Redis Cluster); through a
//! Postgres sink it is the result kept with the transaction's idempotency key
//! (`<job>/step/<name>`), in the same transaction as the user's rows. So a stale holder
//! that wakes mid-step is refused on both, and a re-run finds the entry and returns the
//! recorded result without running the step.
//!
//! Suspending is a settlement: a sleep or a wait not yet completed ends the attempt as a
//! snooze (the lease ends, the slot is freed), and the run resumes in a new claim with a
//! higher token. Waitpoints are kept by the coordinator
//! ([`RecordStore::await_waitpoint`](crate::store::RecordStore::await_waitpoint)); completing
//! one wakes the run ([`Client::complete_waitpoint`](crate::Client::complete_waitpoint)).
//!
//! The rules a handler keeps (the guide says them with examples): names are the journal's
//! keys, unique within a run; between steps a handler does only what it may do again
//! (reads, computing from recorded results); a run whose recorded steps no longer match the
//! code (a step renamed, removed or moved) stops with a fatal error naming both, never a
//! silently different history.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Addr;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::Instrument as _;

use crate::admission::Admission;
use crate::error::{Error, Result};
use crate::ids::{IdempotencyKey, JobId};
use crate::job::JobError;
use crate::metrics::{DURABLE_RESUME_DELAY, DURABLE_STEPS};
use crate::store::{unix_ms, Mutation, Value};
use crate::{JobContext, SinkHandle};

/// The journal format this release writes; an entry of a higher one is left alone.
const JOURNAL_VERSION: u32 = 1;

/// The longest a suspended wait sleeps before it looks at its waitpoint again, should the
/// completion's wake have been missed (its completer died while the run was settling): a
/// missed wake costs at most this, and a wait of `d` spends at most `d / WAIT_RECHECK + 1`
/// snoozes of its job's [`max_snoozes`](crate::NewJob::with_max_snoozes).
pub const WAIT_RECHECK: Duration = Duration::from_secs(3600);

/// How a wait ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Waited<T> {
    /// The waitpoint was completed with this value.
    Completed(T),
    /// Its timeout passed first.
    TimedOut,
}

/// One journal entry, as stored (JSON). Versioned; fields of a later release are kept when
/// this one rewrites the entry (a wait's outcome).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    v: u32,
    /// Its place among the run's durable calls (0-based): a changed handler is found by it.
    seq: u32,
    /// `step`, `sleep` or `wait`.
    what: String,
    /// The fencing token of the claim that recorded it.
    token: u64,
    /// When it was recorded (Unix ms, the worker's clock).
    at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    until_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    waitpoint: Option<String>,
    /// A wait's outcome, once it has one: `{"completed": value}` or `"timed_out"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outcome: Option<serde_json::Value>,
    /// The sink a step's effect and own entry went to, when not the home one (a note of it).
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    sink: Option<String>,
    /// That sink is a Postgres one (the entry is kept with its transaction, not in a journal).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pg: bool,
    #[serde(flatten)]
    unknown: serde_json::Map<String, serde_json::Value>,
}

/// A run's journal as read from one sink, by name.
type Journal = BTreeMap<String, Entry>;

/// What one run's durable calls share (every [`Durable`] handle of the run).
#[derive(Default)]
pub(crate) struct DurableState {
    /// Durable calls made so far in this attempt.
    seq: u32,
    /// Names used so far in this attempt.
    names: HashSet<String>,
    /// Journals read so far, by sink name.
    journals: BTreeMap<String, Journal>,
    /// The sinks holding a journal of this run (the home one first), to clear at its end.
    sinks: Vec<String>,
    /// A step is running: steps of one run go one at a time.
    in_step: bool,
    /// The run's job and the token of this claim, for clearing its journals at its end.
    owner: Option<(JobId, u64, String)>,
}

/// A durable run's handle: `ctx.durable("ledger")?` names the sink that keeps its journal
/// (a Redis or memory sink). Its steps may write to that sink or another
/// ([`step_in`](Self::step_in)), or to a Postgres sink ([`pg_step`](Self::pg_step)).
pub struct Durable {
    home: SinkHandle,
    job: JobId,
    kind: String,
    token: u64,
    scope: String,
    coordinator: Option<Addr<crate::Coordinator>>,
    state: Arc<Mutex<DurableState>>,
    /// Snoozes the job may still take ([`NewJob::with_max_snoozes`](crate::NewJob::with_max_snoozes)):
    /// a long wait looks again less often rather than run out of them.
    snoozes_left: u32,
}

impl Durable {
    pub(crate) fn new(
        home: SinkHandle,
        job: &crate::job::Job,
        lease: &crate::ids::Lease,
        coordinator: Option<Addr<crate::Coordinator>>,
        state: Arc<Mutex<DurableState>>,
    ) -> Self {
        {
            let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
            s.owner.get_or_insert_with(|| {
                (
                    job.id,
                    lease.token.as_u64(),
                    lease.scope.as_str().to_owned(),
                )
            });
            if !s.sinks.iter().any(|n| n == home.name()) {
                s.sinks.push(home.name().to_owned());
            }
        }
        Self {
            home,
            job: job.id,
            kind: job.kind.clone(),
            token: lease.token.as_u64(),
            scope: lease.scope.as_str().to_owned(),
            coordinator,
            state,
            snoozes_left: job.max_snoozes.saturating_sub(job.snoozes),
        }
    }

    /// Runs step `name` once per run, with its effect in the journal's own sink: `f` returns
    /// the mutations to apply and the step's result; both are written by one fenced write
    /// with the journal entry. A re-run (or a later attempt of this run) finds the entry and
    /// returns the recorded result without calling `f`. A stale holder's step is refused
    /// whole — effect and entry — as [`JobError::Fenced`].
    ///
    /// What `f` does besides returning mutations (an HTTP call) is at least once: it may run
    /// again if the run stops after `f` and before its write lands.
    pub async fn step<R, F, Fut>(&self, name: &str, f: F) -> Result<R, JobError>
    where
        R: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(Vec<Mutation>, R), JobError>>,
    {
        let sink = self.home.clone();
        self.step_in(name, &sink, f).await
    }

    /// [`step`](Self::step) with its effect in another Redis or memory sink: its entry is
    /// written there with the effect, by the same fenced write, and then noted in the home
    /// journal (which lists every call of the run, in order).
    pub async fn step_in<R, F, Fut>(
        &self,
        name: &str,
        sink: &SinkHandle,
        f: F,
    ) -> Result<R, JobError>
    where
        R: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(Vec<Mutation>, R), JobError>>,
    {
        let span = tracing::info_span!("palisade.step", step = name, job = %self.job);
        async {
            let seq = self.begin(name)?;
            let _one = OneStep::enter(&self.state, name)?;
            if let Some(entry) = self.recorded(&self.home, name, seq, "step").await? {
                if let (Some(other), false) = (&entry.sink, entry.pg) {
                    self.holds_journal(other);
                }
                self.count("replayed");
                return decode(name, entry.result.unwrap_or(serde_json::Value::Null));
            }
            let elsewhere = sink.name() != self.home.name();
            if elsewhere {
                self.holds_journal(sink.name());
            }
            let (mut mutations, result) = f().await?;
            // What a resume will get back is the JSON: the first run gets the same, or the
            // step fails before its effect (a NaN, an `Option<()>` that JSON cannot tell from
            // `None`).
            let json = serde_json::to_value(&result).map_err(|e| {
                JobError::fatal(format!("step {name:?}: its result does not encode: {e}"))
            })?;
            let result: R = round_trip(name, &json)?;
            let entry = self.entry(seq, "step", |e| e.result = Some(json));
            mutations.push(self.journal_mutation(name, &entry)?);
            let (entry, outcome) = match self.write(sink, name, mutations).await? {
                Written::Applied => (entry, "ran"),
                // Applied before, by a run whose answer was lost or a holder now stale: what
                // it recorded is what happened.
                Written::Duplicate(entry) => (*entry, "replayed"),
            };
            let entry = match elsewhere {
                true => self.note_at_home(name, entry, sink.name(), false).await?,
                false => {
                    self.remember(sink, name, entry.clone());
                    entry
                }
            };
            self.count(outcome);
            match outcome {
                "ran" => Ok(result),
                _ => decode(name, entry.result.unwrap_or(serde_json::Value::Null)),
            }
        }
        .instrument(span)
        .await
    }

    /// Runs step `name` once per run as one fenced Postgres transaction (see
    /// [`PostgresHandle::transaction`](crate::PostgresHandle::transaction)): its entry is the
    /// result Postgres keeps with the transaction's idempotency key `<job>/step/<name>`,
    /// committed with the user's rows, and is then noted in the home journal. A resume gets
    /// the recorded result without `f` running; a stale holder's `f` never runs.
    #[cfg(feature = "postgres")]
    pub async fn pg_step<R, F>(
        &self,
        name: &str,
        pg: &crate::PostgresHandle,
        f: F,
    ) -> Result<R, JobError>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
        F: crate::store::postgres::TransactionFn<R> + 'static,
    {
        let span = tracing::info_span!("palisade.step", step = name, job = %self.job);
        async {
            let seq = self.begin(name)?;
            let _one = OneStep::enter(&self.state, name)?;
            if let Some(entry) = self.recorded(&self.home, name, seq, "step").await? {
                self.count("replayed");
                return decode(name, entry.result.unwrap_or(serde_json::Value::Null));
            }
            let entry = self.entry(seq, "step", |_| {});
            let fenced = pg
                .run(step_key(self.job, name), move |tx| {
                    Box::pin(async move {
                        let result = f(tx).await?;
                        let mut entry = entry;
                        entry.result = Some(serde_json::to_value(&result)?);
                        Ok(entry)
                    })
                })
                .await?;
            let (entry, outcome) = match fenced {
                crate::store::postgres::Fenced::Applied(entry) => (entry, "ran"),
                crate::store::postgres::Fenced::Duplicate(entry) => (entry, "replayed"),
                crate::store::postgres::Fenced::Rejected(r) => {
                    self.count("refused");
                    return Err(JobError::Fenced(r));
                }
            };
            if entry.seq != seq {
                return Err(changed(name, seq, &entry));
            }
            let entry = self.note_at_home(name, entry, pg.name(), true).await?;
            self.count(outcome);
            decode(name, entry.result.unwrap_or(serde_json::Value::Null))
        }
        .instrument(span)
        .await
    }

    /// Notes a step recorded in another sink (`elsewhere`) in the home journal, with its
    /// result: the home journal lists every call of the run in order, so a changed handler is
    /// found before any effect, and a resume replays the step from it. Written after the
    /// step's own write: a run that stops between the two finds the step's write a duplicate
    /// on resume and notes it then.
    async fn note_at_home(
        &self,
        name: &str,
        mut entry: Entry,
        elsewhere: &str,
        pg: bool,
    ) -> Result<Entry, JobError> {
        entry.sink = Some(elsewhere.to_owned());
        entry.pg = pg;
        // (Its own key: the home journal may live in the same store as the step, a Postgres
        // sink's table of keys, where the step's key is taken.)
        let key = IdempotencyKey::new(format!("{}/note", step_key(self.job, name)));
        let home = self.home.clone();
        let mutation = self.journal_mutation(name, &entry)?;
        match self.write_key(&home, key, name, vec![mutation]).await? {
            Written::Applied => {
                self.remember(&home, name, entry.clone());
                Ok(entry)
            }
            Written::Duplicate(entry) => Ok(*entry),
        }
    }

    /// Sleeps `duration` durably: the first time the run reaches it, the wake-up time is
    /// journaled and the attempt ends as a snooze until then (the slot and lease are given
    /// back); the run resumes in a new claim and goes on past it. A sleep already recorded
    /// keeps its first wake-up time, however often the run resumes.
    pub async fn sleep(&self, name: &str, duration: Duration) -> Result<(), JobError> {
        let seq = self.begin(name)?;
        let now = unix_ms();
        let until = match self.recorded(&self.home, name, seq, "sleep").await? {
            Some(entry) => entry.until_ms.unwrap_or(0),
            None => {
                let until = now.saturating_add(millis(duration));
                let entry = self.entry(seq, "sleep", |e| e.until_ms = Some(until));
                self.journal_only(name, entry)
                    .await?
                    .until_ms
                    .unwrap_or(until)
            }
        };
        if now < until {
            self.count("suspended");
            return Err(JobError::snooze(Duration::from_millis(until - now)));
        }
        self.resumed(now - until);
        Ok(())
    }

    /// Waits for waitpoint `waitpoint` to be completed (by
    /// [`Client::complete_waitpoint`](crate::Client::complete_waitpoint), the HTTP API
    /// `POST /api/v1/waitpoints/{id}`, `palisade waitpoint complete`, or another job's
    /// [`JobContext::complete_waitpoint`](crate::JobContext::complete_waitpoint)), at most
    /// `timeout` from when the run first reached it. A value completed before the run got
    /// here is kept for it. Until then the attempt ends as a snooze and the completion wakes
    /// the run. The outcome is journaled, so a later resume sees the same one.
    pub async fn wait_for<T: DeserializeOwned>(
        &self,
        name: &str,
        waitpoint: &str,
        timeout: Duration,
    ) -> Result<Waited<T>, JobError> {
        crate::store::waitpoint::check_waitpoint_id(waitpoint)?;
        let seq = self.begin(name)?;
        let now = unix_ms();
        let entry = match self.recorded(&self.home, name, seq, "wait").await? {
            Some(entry) => entry,
            None => {
                let deadline = now.saturating_add(millis(timeout));
                let entry = self.entry(seq, "wait", |e| {
                    e.until_ms = Some(deadline);
                    e.waitpoint = Some(waitpoint.to_owned());
                });
                self.journal_only(name, entry).await?
            }
        };
        if entry
            .waitpoint
            .as_deref()
            .is_some_and(|kept| kept != waitpoint)
        {
            return Err(JobError::fatal(format!(
                "the handler changed since this run was recorded: wait {name:?} waits for \
                 {waitpoint:?} now, the journal has it waiting for {:?} (recorded under token {})",
                entry.waitpoint.as_deref().unwrap_or_default(),
                entry.token
            )));
        }
        if let Some(outcome) = &entry.outcome {
            self.count("replayed");
            return waited(name, outcome);
        }
        let deadline = entry.until_ms.unwrap_or(0);
        let id = waitpoint.to_owned();
        let value = self.await_waitpoint(&id).await?;
        let outcome = match &value {
            Some(json) => {
                let value: serde_json::Value = serde_json::from_str(json)
                    .map_err(|e| JobError::fatal(format!("waitpoint {id:?} holds no JSON: {e}")))?;
                serde_json::json!({ "completed": value })
            }
            None if now >= deadline => serde_json::json!("timed_out"),
            None => {
                self.count("suspended");
                let left = Duration::from_millis(deadline - now);
                return Err(JobError::snooze(recheck(left, self.snoozes_left)));
            }
        };
        // The outcome is journaled before the run goes on, so that every later resume sees
        // this one (a waitpoint is kept only so long; a timeout must not turn into a value).
        let mut done = entry;
        done.outcome = Some(outcome);
        done.token = self.token;
        let key = IdempotencyKey::new(format!("{}/done", step_key(self.job, name)));
        let done = match self
            .write_key(
                &self.home,
                key,
                name,
                vec![self.journal_mutation(name, &done)?],
            )
            .await?
        {
            Written::Applied => done,
            Written::Duplicate(_) => self.reread(&self.home, name).await?,
        };
        self.remember(&self.home, name, done.clone());
        if value.is_none() {
            self.resumed(now - deadline);
        }
        waited(
            name,
            done.outcome.as_ref().unwrap_or(&serde_json::Value::Null),
        )
    }

    /// Takes the next place for a durable call named `name`; a name used twice in one run
    /// is refused (the journal is keyed by names).
    fn begin(&self, name: &str) -> Result<u32, JobError> {
        check_name(name)?;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !state.names.insert(name.to_owned()) {
            return Err(JobError::fatal(format!(
                "durable step {name:?} is used twice in one run: names are the journal's keys"
            )));
        }
        state.seq += 1;
        Ok(state.seq - 1)
    }

    /// The entry recorded for `name` in `sink`'s journal, checked to be a `what` at place
    /// `seq`; `None` if there is none (and no later one, which would mean the code changed).
    async fn recorded(
        &self,
        sink: &SinkHandle,
        name: &str,
        seq: u32,
        what: &str,
    ) -> Result<Option<Entry>, JobError> {
        let journal = self.journal(sink).await?;
        match journal.get(name) {
            Some(entry) if entry.seq == seq && entry.what == what => Ok(Some(entry.clone())),
            Some(entry) => Err(changed(name, seq, entry)),
            None => {
                // A later place taken by another name: this call is new or moved.
                if let Some(e) = later(&journal, seq, what, name) {
                    return Err(e);
                }
                Ok(None)
            }
        }
    }

    /// `sink`'s journal of this run, read once per attempt.
    async fn journal(&self, sink: &SinkHandle) -> Result<Journal, JobError> {
        if let Some(journal) = self.lock().journals.get(sink.name()) {
            return Ok(journal.clone());
        }
        let journal = self.read_journal(sink).await?;
        self.lock()
            .journals
            .insert(sink.name().to_owned(), journal.clone());
        Ok(journal)
    }

    async fn read_journal(&self, sink: &SinkHandle) -> Result<Journal, JobError> {
        let fields = match sink.read(&self.journal_key()).await? {
            None => return Ok(Journal::new()),
            Some(Value::Hash(fields)) => fields,
            Some(Value::Text(_)) => {
                return Err(JobError::fatal(format!(
                    "{} holds a string, not a durable run's journal",
                    self.journal_key()
                )))
            }
        };
        let mut journal = Journal::new();
        for (name, json) in fields {
            // Left as it is, either way. A newer release's entry: a newer worker may resume
            // the run (retried). Not an entry at all (another program wrote there): fatal.
            let newer = serde_json::from_str::<serde_json::Value>(&json)
                .ok()
                .and_then(|v| v.get("v").and_then(serde_json::Value::as_u64))
                .is_some_and(|v| v > u64::from(JOURNAL_VERSION));
            let entry: Entry = match serde_json::from_str(&json) {
                Ok(entry) => entry,
                Err(e) if newer => {
                    return Err(JobError::retry(format!(
                        "journal entry {name:?} is of a newer version ({e}): a newer worker \
                         must resume this run"
                    )))
                }
                Err(e) => {
                    return Err(JobError::fatal(format!(
                        "journal entry {name:?} of {} is not a journal entry ({e}): left as it is",
                        self.journal_key()
                    )))
                }
            };
            if entry.v > JOURNAL_VERSION {
                return Err(JobError::retry(format!(
                    "journal entry {name:?} is of version {}, this release reads {JOURNAL_VERSION}: \
                     a newer worker must resume this run",
                    entry.v
                )));
            }
            journal.insert(name, entry);
        }
        Ok(journal)
    }

    /// A fresh entry for the call at `seq`.
    fn entry(&self, seq: u32, what: &str, fill: impl FnOnce(&mut Entry)) -> Entry {
        let mut entry = Entry {
            v: JOURNAL_VERSION,
            seq,
            what: what.to_owned(),
            token: self.token,
            at_ms: unix_ms(),
            result: None,
            until_ms: None,
            waitpoint: None,
            outcome: None,
            sink: None,
            pg: false,
            unknown: serde_json::Map::new(),
        };
        fill(&mut entry);
        entry
    }

    /// The mutation that records `entry` under `name`.
    fn journal_mutation(&self, name: &str, entry: &Entry) -> Result<Mutation, JobError> {
        let json = serde_json::to_string(entry)
            .map_err(|e| JobError::fatal(format!("journal entry {name:?}: {e}")))?;
        Ok(Mutation::HashSet {
            key: self.journal_key(),
            fields: vec![(name.to_owned(), json)],
        })
    }

    fn journal_key(&self) -> String {
        journal_key(&self.scope, self.job)
    }

    /// Writes the entry alone (a sleep or wait reached for the first time); the entry kept.
    async fn journal_only(&self, name: &str, entry: Entry) -> Result<Entry, JobError> {
        let mutation = self.journal_mutation(name, &entry)?;
        let home = self.home.clone();
        match self.write(&home, name, vec![mutation]).await? {
            Written::Applied => {
                self.remember(&home, name, entry.clone());
                Ok(entry)
            }
            Written::Duplicate(entry) => Ok(*entry),
        }
    }

    /// One fenced write of step `name`'s `mutations` under its key.
    async fn write(
        &self,
        sink: &SinkHandle,
        name: &str,
        mutations: Vec<Mutation>,
    ) -> Result<Written, JobError> {
        let key = IdempotencyKey::new(step_key(self.job, name));
        self.write_key(sink, key, name, mutations).await
    }

    /// One fenced write of `mutations` under `key`; a duplicate answers with the entry for
    /// `name` the earlier write recorded.
    async fn write_key(
        &self,
        sink: &SinkHandle,
        key: IdempotencyKey,
        name: &str,
        mutations: Vec<Mutation>,
    ) -> Result<Written, JobError> {
        match sink.write_keyed(key, mutations).await? {
            Admission::Applied => Ok(Written::Applied),
            Admission::Duplicate => {
                Ok(Written::Duplicate(Box::new(self.reread(sink, name).await?)))
            }
            Admission::Rejected(r) => {
                self.count("refused");
                Err(JobError::Fenced(r))
            }
        }
    }

    /// The entry for `name` read again from `sink` (after a duplicate: another run wrote it).
    async fn reread(&self, sink: &SinkHandle, name: &str) -> Result<Entry, JobError> {
        let journal = self.read_journal(sink).await?;
        let entry = journal.get(name).cloned().ok_or_else(|| {
            JobError::fatal(format!(
                "step {name:?} was applied before, but its journal entry is gone from sink \
                 {:?}: an earlier run of this job reached its end and cleared its journal \
                 (then did not settle), or the job id was used again within the sink's key \
                 retention; not running the rest again",
                sink.name()
            ))
        })?;
        self.lock().journals.insert(sink.name().to_owned(), journal);
        Ok(entry)
    }

    fn remember(&self, sink: &SinkHandle, name: &str, entry: Entry) {
        self.lock()
            .journals
            .entry(sink.name().to_owned())
            .or_default()
            .insert(name.to_owned(), entry);
    }

    async fn await_waitpoint(&self, id: &str) -> Result<Option<String>, JobError> {
        let Some(coordinator) = &self.coordinator else {
            return Err(JobError::fatal(
                "this run has no coordinator to wait through",
            ));
        };
        Ok(coordinator
            .send(crate::coordinator::AwaitWaitpoint {
                id: id.to_owned(),
                waiter: self.job,
            })
            .await
            .map_err(Error::from)??)
    }

    fn count(&self, outcome: &'static str) {
        metrics::counter!(DURABLE_STEPS, "kind" => self.kind.clone(), "outcome" => outcome)
            .increment(1);
    }

    fn resumed(&self, late_ms: u64) {
        metrics::histogram!(DURABLE_RESUME_DELAY, "kind" => self.kind.clone())
            .record(late_ms as f64 / 1000.0);
    }

    /// Notes that sink `name` holds a journal of this run, to be cleared at its end.
    fn holds_journal(&self, name: &str) {
        let mut s = self.lock();
        if !s.sinks.iter().any(|n| n == name) {
            s.sinks.push(name.to_owned());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DurableState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One entry of a run's journal, as [`journal`] reads it (for `palisade run show` and
/// tests).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JournalEntry {
    /// The step's, sleep's or wait's name.
    pub name: String,
    /// Its place among the run's durable calls (0-based).
    pub seq: u32,
    /// `step`, `sleep` or `wait`.
    pub what: String,
    /// The fencing token of the claim that recorded it.
    pub token: u64,
    /// When it was recorded (Unix ms, the recording worker's clock).
    pub at_ms: u64,
    /// A step's result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// A sleep's wake-up time, a wait's deadline (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// A wait's waitpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waitpoint: Option<String>,
    /// A wait's outcome once it has one: `{"completed": value}` or `"timed_out"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<serde_json::Value>,
    /// Where a step's effect went, when not to the journal's own sink (`in`).
    #[serde(rename = "in", skip_serializing_if = "Option::is_none")]
    pub sink: Option<String>,
}

/// The journal of job `job`'s run (its scope `scope`) as sink `sink` keeps it, in call order;
/// empty when it has none. Steps through a Postgres sink keep their entries with their
/// transactions instead ([`Durable::pg_step`]) and are not listed. An entry this release
/// cannot read is an error naming it (left as it is).
pub async fn journal(
    sink: &dyn crate::store::FencedStore,
    scope: &crate::ids::Scope,
    job: JobId,
) -> Result<Vec<JournalEntry>> {
    let key = journal_key(scope.as_str(), job);
    let fields = match sink.read(&key).await? {
        None => return Ok(Vec::new()),
        Some(Value::Hash(fields)) => fields,
        Some(Value::Text(_)) => {
            return Err(Error::Backend(format!(
                "{key} holds a string, not a journal"
            )))
        }
    };
    let mut entries = Vec::with_capacity(fields.len());
    for (name, json) in fields {
        let e: Entry = serde_json::from_str(&json)
            .map_err(|e| Error::Backend(format!("journal entry {name:?} does not decode: {e}")))?;
        entries.push(JournalEntry {
            name,
            seq: e.seq,
            what: e.what,
            token: e.token,
            at_ms: e.at_ms,
            result: e.result,
            until_ms: e.until_ms,
            waitpoint: e.waitpoint,
            outcome: e.outcome,
            sink: e.sink,
        });
    }
    entries.sort_by_key(|e| e.seq);
    Ok(entries)
}

/// The run's journal hash in a sink: in its scope's slot (a Redis Cluster needs a write's
/// keys there), named so no user key collides with it.
fn journal_key(scope: &str, job: JobId) -> String {
    format!("{{{scope}}}:palisade:journal:{job}")
}

/// The kind of the job a durable run's completion sets going to clear its journals. Every
/// worker runs it; a worker of an earlier release does not claim it.
pub const CLEAR: &str = crate::job::JOURNAL_CLEAR_KIND;

/// What [`CLEAR`] is given: the run's job, its scope, and the sinks holding its journals.
#[derive(Debug, Serialize, Deserialize)]
struct Clear {
    v: u32,
    job: JobId,
    scope: String,
    sinks: Vec<String>,
}

/// The end of a run whose handler succeeded. A journal entry this attempt never reached (a
/// step removed from the code) is a changed handler, fatal. Otherwise the run's journals are
/// to be cleared, so a finished run leaves nothing in its sinks and a job id used again later
/// starts afresh: by a [`CLEAR`] job in its scope, a follow-up kept with the completion. Not
/// here, before the completion: a completion refused or lost after that would leave a rival
/// run with its steps' keys applied and their results gone.
pub(crate) async fn finish(ctx: &JobContext) -> Result<(), JobError> {
    let state = ctx.durable_state();
    let (sinks, owner, loaded) = {
        let s = state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(home) = s.sinks.first() else {
            return Ok(());
        };
        (
            s.sinks.clone(),
            s.owner.clone(),
            s.journals.get(home).cloned(),
        )
    };
    let Some((job, _, scope)) = owner else {
        return Ok(());
    };
    // The home journal lists every call; read here if this attempt made none.
    let home = match loaded {
        Some(journal) => journal,
        None => {
            let sink = ctx.sink(&sinks[0])?;
            let durable = Durable::new(sink.clone(), ctx.job(), ctx.lease(), None, state.clone());
            durable.read_journal(&sink).await?
        }
    };
    {
        let s = state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((name, e)) = home.iter().find(|(name, _)| !s.names.contains(*name)) {
            return Err(JobError::fatal(format!(
                "the handler changed since this run was recorded: {} {name:?} (call {}, \
                 recorded under token {}) was not reached by this run, which ended",
                e.what, e.seq, e.token
            )));
        }
    }
    let clear = Clear {
        v: 1,
        job,
        scope: scope.clone(),
        sinks,
    };
    let id = JobId::from(uuid::Uuid::new_v5(
        &CLEAR_IDS,
        format!("{job}\n{}", ctx.lease().id).as_bytes(),
    ));
    let follow = crate::NewJob::new(CLEAR, &clear)
        .map_err(|e| JobError::fatal(e.to_string()))?
        .with_queue(ctx.job().queue.clone())
        .with_scope(scope)
        .with_id(id);
    ctx.follow_up(follow)?;
    Ok(())
}

/// The namespace of [`CLEAR`] jobs' ids: one per run's ending claim.
const CLEAR_IDS: uuid::Uuid = uuid::Uuid::from_u128(0x6c1e_a2b0_0d17_4a9e_9f3c_5b8e_2d4a_7c61);

/// Runs a [`CLEAR`] job: removes the ended run's journal from each sink (a fenced write under
/// this job's own lease, in the run's scope). A sink this worker lacks fails it, naming the
/// sink.
pub(crate) async fn clear(ctx: JobContext, payload: String) -> Result<(), JobError> {
    let clear: Clear = serde_json::from_str(&payload)
        .map_err(|e| JobError::fatal(format!("a {CLEAR} job's payload does not decode: {e}")))?;
    for name in &clear.sinks {
        let sink = ctx.sink(name)?;
        let key = IdempotencyKey::new(format!("{}/clear/{name}", ctx.job().id));
        let gone = Mutation::Delete {
            key: journal_key(&clear.scope, clear.job),
        };
        sink.write_keyed(key, vec![gone]).await?.accepted()?;
    }
    Ok(())
}

/// Marks a step running for as long as it lives: a second step of the run started meanwhile
/// (`join!` of two steps) is refused, since the journal records the order of a run's calls.
struct OneStep<'a>(&'a Mutex<DurableState>);

impl<'a> OneStep<'a> {
    fn enter(state: &'a Mutex<DurableState>, name: &str) -> Result<Self, JobError> {
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        if s.in_step {
            return Err(JobError::fatal(format!(
                "step {name:?} started while another step of this run runs: steps of one run \
                 go one at a time (their order is the journal's)"
            )));
        }
        s.in_step = true;
        Ok(Self(state))
    }
}

impl Drop for OneStep<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).in_step = false;
    }
}

/// A fatal error if `journal` holds an entry at place `seq` or after it: call `name` is new
/// or moved since the run was recorded. (A step whose error the handler swallowed is not
/// recorded either: it meets this on resume, as the guide says.)
fn later(journal: &Journal, seq: u32, what: &str, name: &str) -> Option<JobError> {
    let (other, e) = journal
        .iter()
        .filter(|(_, e)| e.seq >= seq)
        .min_by_key(|(_, e)| e.seq)?;
    Some(JobError::fatal(format!(
        "the handler changed since this run was recorded: {what} {name:?} is call {seq} now, \
         and the journal has {} {other:?} as call {} (recorded under token {}); a step whose \
         error was ignored is not recorded, and meets this too",
        e.what, e.seq, e.token
    )))
}

/// `d` in whole ms, saturating (a `Duration` past `u64` ms would wrap).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How long a wait with `left` to go sleeps before it looks again: [`WAIT_RECHECK`], or
/// longer where the job's snoozes would run out first (its last one sleeps to the deadline).
fn recheck(left: Duration, snoozes_left: u32) -> Duration {
    let budget = snoozes_left.saturating_sub(1).max(1);
    left.min(WAIT_RECHECK.max(left / budget))
}

/// The step's result as a resume will see it: decoded from its JSON, so the first run and
/// every resume get the same value (JSON tells no `Some(())` from `None`: both see `None`); a
/// value that does not come back (a NaN) is an error before the step's effect.
fn round_trip<R: DeserializeOwned>(name: &str, json: &serde_json::Value) -> Result<R, JobError> {
    serde_json::from_value(json.clone()).map_err(|e| {
        JobError::fatal(format!(
            "step {name:?}: its result does not come back from JSON ({e}); a resume could not \
             replay it"
        ))
    })
}

/// What a journaled write did.
enum Written {
    Applied,
    /// Applied before: the entry that write recorded.
    Duplicate(Box<Entry>),
}

/// The idempotency key of step `name` of job `job`: `<job>/step/<name>` (DESIGN §8's
/// namespaces), the same in every run and release.
fn step_key(job: JobId, name: &str) -> String {
    format!("{job}/step/{name}")
}

/// Step names: 1-200 bytes without `/` or control characters (they are keys).
fn check_name(name: &str) -> Result<(), JobError> {
    if name.is_empty()
        || name.len() > 200
        || name.contains('/')
        || name.chars().any(char::is_control)
    {
        return Err(JobError::fatal(format!(
            "durable step name {name:?}: use 1-200 bytes without '/' or control characters"
        )));
    }
    Ok(())
}

fn changed(name: &str, seq: u32, entry: &Entry) -> JobError {
    JobError::fatal(format!(
        "the handler changed since this run was recorded: {name:?} is call {seq} now, the \
         journal has it as {} call {} (recorded under token {})",
        entry.what, entry.seq, entry.token
    ))
}

fn decode<R: DeserializeOwned>(name: &str, json: serde_json::Value) -> Result<R, JobError> {
    serde_json::from_value(json).map_err(|e| {
        JobError::fatal(format!(
            "step {name:?}: its recorded result does not decode as the handler's type now: {e}"
        ))
    })
}

fn waited<T: DeserializeOwned>(
    name: &str,
    outcome: &serde_json::Value,
) -> Result<Waited<T>, JobError> {
    match outcome.get("completed") {
        Some(value) => serde_json::from_value(value.clone())
            .map(Waited::Completed)
            .map_err(|e| {
                JobError::fatal(format!(
                    "wait {name:?}: the waitpoint's value does not decode as the handler's type: {e}"
                ))
            }),
        None => Ok(Waited::TimedOut),
    }
}

/// Golden identities: a previous release computes the same keys.
#[cfg(test)]
mod golden {
    use super::*;

    #[test]
    fn journal_keys_are_pinned() {
        let job = JobId::from(uuid::Uuid::from_u128(
            0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
        ));
        assert_eq!(
            journal_key("order:7", job),
            "{order:7}:palisade:journal:01234567-89ab-cdef-0123-456789abcdef"
        );
    }

    #[test]
    fn step_keys_are_pinned() {
        let job = JobId::from(uuid::Uuid::from_u128(
            0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
        ));
        assert_eq!(
            step_key(job, "charge"),
            "01234567-89ab-cdef-0123-456789abcdef/step/charge"
        );
    }

    #[test]
    fn an_entry_keeps_fields_it_does_not_know() {
        let json = r#"{"v":1,"seq":2,"what":"wait","token":9,"at_ms":5,"until_ms":7,"waitpoint":"w","later":{"x":1}}"#;
        let mut entry: Entry = serde_json::from_str(json).unwrap();
        entry.outcome = Some(serde_json::json!("timed_out"));
        let again: serde_json::Value = serde_json::to_value(&entry).unwrap();
        assert_eq!(again["later"], serde_json::json!({"x": 1}));
        assert_eq!(again["outcome"], "timed_out");
    }
}
