//! The memory lease store's clock, roles, schedules and records.

use std::time::Duration;

use async_trait::async_trait;

use super::{lock, MemoryLeaseStore};
use crate::error::Result;
use crate::ids::JobId;
use crate::schedule::ScheduleSpec;
use crate::store::waitpoint::{
    check_waitpoint_id, check_waitpoint_value, Completion, Waitpoint, WAITPOINT_RETENTION,
};
use crate::store::{
    check_role_ttl, check_schedule, unix_ms, ControlStore, HistorySample, RecordStore,
    RejectionNote, WorkerBeat, HISTORY_SAMPLES, PROGRESS_RETENTION, REJECTION_JOURNAL,
};

#[async_trait]
impl ControlStore for MemoryLeaseStore {
    async fn now_ms(&self) -> Result<i64> {
        Ok(unix_ms() as i64)
    }

    async fn hold_role(&self, role: &str, holder: &str, ttl: Duration) -> Result<bool> {
        check_role_ttl(ttl)?;
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        let held_by_other = state
            .roles
            .get(role)
            .is_some_and(|(who, until)| who != holder && *until > now);
        if !held_by_other {
            state
                .roles
                .insert(role.to_owned(), (holder.to_owned(), now + ttl));
        }
        Ok(!held_by_other)
    }

    async fn beat(&self, mut beat: WorkerBeat, ttl: Duration) -> Result<()> {
        crate::job::check_name("worker name", &beat.worker)?;
        // As on Redis: at least a millisecond, at most the longest delay.
        let ttl = ttl.clamp(Duration::from_millis(1), crate::job::MAX_DELAY);
        beat.seen_ms = unix_ms();
        let mut state = lock(&self.state);
        let now = crate::clock::now();
        state.workers.retain(|_, (_, until)| *until > now);
        state.workers.insert(beat.worker.clone(), (beat, now + ttl));
        Ok(())
    }

    async fn workers(&self) -> Result<Vec<WorkerBeat>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        state.workers.retain(|_, (_, until)| *until > now);
        let mut workers: Vec<WorkerBeat> = state.workers.values().map(|(b, _)| b.clone()).collect();
        workers.sort_by(|a, b| a.worker.cmp(&b.worker));
        Ok(workers)
    }

    async fn note_history(&self, sample: HistorySample) -> Result<()> {
        let mut state = lock(&self.state);
        state.history.push_front(sample);
        state.history.truncate(HISTORY_SAMPLES);
        Ok(())
    }

    async fn history(&self, limit: usize) -> Result<Vec<HistorySample>> {
        let state = lock(&self.state);
        Ok(state.history.iter().take(limit).copied().collect())
    }

    async fn schedules(&self) -> Result<Vec<ScheduleSpec>> {
        Ok(lock(&self.state).schedules.values().cloned().collect())
    }

    async fn put_schedule(&self, spec: ScheduleSpec) -> Result<()> {
        check_schedule(&spec)?;
        lock(&self.state).schedules.insert(spec.name.clone(), spec);
        Ok(())
    }

    async fn remove_schedule(&self, name: &str) -> Result<bool> {
        let mut state = lock(&self.state);
        // A schedule added again under this name starts from then, not from the old mark.
        state.schedule_marks.remove(name);
        state.paused_schedules.remove(name);
        Ok(state.schedules.remove(name).is_some())
    }

    async fn pause_schedule(&self, name: &str, paused: bool) -> Result<bool> {
        let mut state = lock(&self.state);
        if paused {
            return Ok(state.paused_schedules.insert(name.to_owned()));
        }
        let resumed = state.paused_schedules.remove(name);
        if resumed {
            let now = unix_ms() as i64;
            let mark = state.schedule_marks.entry(name.to_owned()).or_insert(now);
            *mark = (*mark).max(now);
        }
        Ok(resumed)
    }

    async fn paused_schedules(&self) -> Result<Vec<String>> {
        Ok(lock(&self.state).paused_schedules.iter().cloned().collect())
    }

    async fn schedule_mark(&self, name: &str) -> Result<Option<i64>> {
        Ok(lock(&self.state).schedule_marks.get(name).copied())
    }

    async fn advance_schedule(&self, name: &str, through: i64) -> Result<()> {
        let mut state = lock(&self.state);
        let mark = state
            .schedule_marks
            .entry(name.to_owned())
            .or_insert(through);
        *mark = (*mark).max(through);
        Ok(())
    }
}

#[async_trait]
impl RecordStore for MemoryLeaseStore {
    async fn put_result(&self, job: JobId, json: String, ttl: Duration) -> Result<()> {
        lock(&self.state).put_note(job, true, json, ttl);
        Ok(())
    }

    async fn result(&self, job: JobId) -> Result<Option<String>> {
        Ok(lock(&self.state).note(job, true))
    }

    async fn put_progress(&self, job: JobId, json: String) -> Result<()> {
        lock(&self.state).put_note(job, false, json, PROGRESS_RETENTION);
        Ok(())
    }

    async fn progress(&self, job: JobId) -> Result<Option<String>> {
        Ok(lock(&self.state).note(job, false))
    }

    async fn note_rejections(&self, notes: Vec<RejectionNote>) -> Result<()> {
        let mut state = lock(&self.state);
        let skip = notes.len().saturating_sub(REJECTION_JOURNAL);
        for note in notes.into_iter().skip(skip) {
            state.rejections.push_front(note);
        }
        state.rejections.truncate(REJECTION_JOURNAL);
        Ok(())
    }

    async fn rejections(&self, limit: usize) -> Result<Vec<RejectionNote>> {
        let state = lock(&self.state);
        Ok(state.rejections.iter().take(limit).cloned().collect())
    }

    async fn complete_waitpoint(&self, id: &str, value: String) -> Result<Completion> {
        check_waitpoint_id(id)?;
        check_waitpoint_value(&value)?;
        let mut state = lock(&self.state);
        let kept = state.live_waitpoint(id);
        if let Some(value) = kept.as_ref().and_then(|w| w.value.clone()) {
            return Ok(Completion::Already { value });
        }
        let waiter = kept.and_then(|w| w.waiter);
        state.keep_waitpoint(Waitpoint {
            id: id.to_owned(),
            value: Some(value),
            waiter,
        });
        Ok(Completion::First { waiter })
    }

    async fn await_waitpoint(&self, id: &str, waiter: JobId) -> Result<Option<String>> {
        check_waitpoint_id(id)?;
        let mut state = lock(&self.state);
        let kept = state.live_waitpoint(id);
        if let Some(value) = kept.as_ref().and_then(|w| w.value.clone()) {
            return Ok(Some(value));
        }
        state.keep_waitpoint(Waitpoint {
            id: id.to_owned(),
            value: None,
            waiter: Some(waiter),
        });
        Ok(None)
    }

    async fn waitpoint(&self, id: &str) -> Result<Option<Waitpoint>> {
        check_waitpoint_id(id)?;
        Ok(lock(&self.state).live_waitpoint(id))
    }
}

impl super::LeaseState {
    /// Waitpoint `id` unless its time is up.
    fn live_waitpoint(&self, id: &str) -> Option<Waitpoint> {
        let (waitpoint, until) = self.waitpoints.get(id)?;
        (*until > crate::clock::now()).then(|| waitpoint.clone())
    }

    /// Keeps `waitpoint` for [`WAITPOINT_RETENTION`] from now, forgetting lapsed ones.
    fn keep_waitpoint(&mut self, waitpoint: Waitpoint) {
        let now = crate::clock::now();
        let mut held = std::mem::take(&mut self.waitpoints);
        self.waitpoint_expiries
            .forget_lapsed(&mut held, now, |(_, until)| Some(*until));
        let until = now + WAITPOINT_RETENTION;
        let id = waitpoint.id.clone();
        held.insert(id.clone(), (waitpoint, until));
        self.waitpoint_expiries
            .push(until, id, &held, |(_, until)| Some(*until));
        self.waitpoints = held;
    }
}
