//! `Scheduler`: fires recurring [`Schedule`]s — those given in code and those kept in the
//! coordinator (`palisade schedule add`) — exactly once per tick, however many processes run
//! one.
//!
//! Every tick it asks for the coordinator's `scheduler` role ([`ControlStore::hold_role`]); the
//! holder reads "now" from the coordinator (so hosts with skewed clocks agree), works out each
//! schedule's due ticks from the mark the coordinator keeps ([`Schedule`] is pure), enqueues
//! one job per tick under the tick's unique key, and raises the mark. The role only saves
//! work: correctness comes from the unique keys — a leader paused mid-tick that wakes after
//! another took over, or two processes that both believe they hold the role, enqueue the same
//! tick's job under the same key, and the backend adds it once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use metrics::counter;

use crate::metrics as m;
use crate::schedule::{Schedule, TICK_HORIZON_YEARS};
use crate::store::{ControlStore, Stores};

/// The role's name in the store.
const ROLE: &str = "scheduler";

/// Fires schedules while it holds the coordinator's `scheduler` role.
///
/// The holder fires the schedules it was given *and* every schedule kept in the coordinator.
/// Where several binaries (or versions, during a rolling deploy) share a coordinator, keep
/// the schedules in the coordinator — `palisade worker` stores its binary's code schedules
/// there at start — so that whichever process holds the role fires all of them.
pub struct Scheduler {
    /// Its clock, role and kept schedules ([`ControlStore`]), and the hot path it enqueues on.
    store: Stores,
    /// Schedules given in code (kept ones are read from the store each tick).
    schedules: Arc<Vec<Schedule>>,
    holder: String,
    every: Duration,
    in_flight: bool,
    /// Problems the last pass found that will not go away by themselves (a kept schedule that
    /// does not check, one with no tick ahead): each is logged when it first shows, not on
    /// every pass, four times a second.
    reported: HashSet<String>,
}

impl Scheduler {
    /// A scheduler over `store` for `schedules` (and every schedule kept in the store),
    /// ticking every 250 ms.
    pub fn new(store: impl Into<Stores>, schedules: Vec<Schedule>) -> Self {
        Self {
            store: store.into(),
            schedules: Arc::new(schedules),
            holder: format!("{}/{}", std::process::id(), uuid::Uuid::new_v4()),
            every: Duration::from_millis(250),
            in_flight: false,
            reported: HashSet::new(),
        }
    }

    /// Sets how often it looks (clamped to 10 ms..=10 s); the role lasts 12 looks, so another
    /// process takes over within that long after the holder stops.
    pub fn with_interval(mut self, every: Duration) -> Self {
        self.every = every.clamp(Duration::from_millis(10), Duration::from_secs(10));
        self
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight {
            return;
        }
        self.in_flight = true;
        let (store, holder, schedules) = (
            self.store.clone(),
            self.holder.clone(),
            self.schedules.clone(),
        );
        let ttl = self.every.saturating_mul(12);
        let pass = async move {
            let mut problems = HashSet::new();
            if !store.hold_role(ROLE, &holder, ttl).await? {
                return Ok(problems);
            }
            let mut all: Vec<Schedule> = schedules.to_vec();
            for spec in store.schedules().await? {
                // A kept schedule with a code schedule's name: the code's wins.
                if all.iter().any(|s| s.name() == spec.name) {
                    continue;
                }
                match Schedule::try_from(spec) {
                    Ok(schedule) => all.push(schedule),
                    Err(e) => {
                        problems.insert(format!("kept schedule skipped: {e}"));
                    }
                }
            }
            let now = store.now_ms().await?;
            // (A set another program wrote over pauses nothing: every schedule fires, said once
            // in a while, rather than none.)
            let paused = match store.paused_schedules().await {
                Ok(paused) => paused,
                Err(e) if !e.is_retryable() => {
                    crate::repeats::warn_repeated!(error = %e, "paused schedules unreadable: none is taken as paused");
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            // One schedule failing (its job refused, say) does not hold up the others.
            for schedule in &all {
                let is_paused = paused.iter().any(|p| p == schedule.name());
                if let Err(e) = fire(&store, schedule, now, is_paused).await {
                    tracing::warn!(schedule = schedule.name(), error = %e, "schedule not fired; next pass tries again");
                    counter!(m::BACKEND_ERRORS, "op" => "schedule").increment(1);
                }
                // Checked when it was built, but a pattern with a year in it runs out.
                if schedule.next_tick(now).is_none() {
                    problems.insert(format!(
                        "schedule {} has no tick in the next {TICK_HORIZON_YEARS} years: it never fires again",
                        schedule.name()
                    ));
                }
            }
            Ok::<_, crate::Error>(problems)
        };
        ctx.spawn(pass.into_actor(self).map(|result, act, _| {
            act.in_flight = false;
            match result {
                Ok(problems) => {
                    for problem in problems.difference(&act.reported) {
                        tracing::warn!("{problem}");
                    }
                    act.reported = problems;
                }
                Err(e) => {
                    crate::repeats::warn_repeated!(error = %e, "scheduler pass failed; next tick tries again");
                    counter!(m::BACKEND_ERRORS, "op" => "schedule").increment(1);
                }
            }
        }));
    }
}

/// Enqueues `schedule`'s due ticks, then raises its mark (a crash in between re-fires the
/// same ticks next time, which their unique keys turn away). Writes nothing when nothing is
/// due. A `paused` schedule's due ticks are skipped (counted as `paused`) and its mark
/// raised all the same, so resuming it does not fire the ticks of the pause.
pub(crate) async fn fire(
    store: &Stores,
    schedule: &Schedule,
    now: i64,
    paused: bool,
) -> crate::Result<()> {
    let mark = store.schedule_mark(schedule.name()).await?;
    let (ticks, through) = schedule.due(mark, now);
    if paused {
        if !ticks.is_empty() {
            counter!(m::SCHEDULE_TICKS, "schedule" => schedule.name().to_owned(), "outcome" => "paused")
                .increment(ticks.len() as u64);
        }
        if mark.is_none() || !ticks.is_empty() {
            store.advance_schedule(schedule.name(), through).await?;
        }
        return Ok(());
    }
    for chunk in ticks.chunks(1000) {
        let jobs = chunk.iter().map(|t| schedule.job_for(*t)).collect();
        for done in crate::enqueue::enqueue_counted(store, jobs).await? {
            // (A tick's job is not debounced: its unique key decides.)
            let outcome = match done.as_str() {
                "added" => "enqueued",
                other => other,
            };
            counter!(m::SCHEDULE_TICKS, "schedule" => schedule.name().to_owned(), "outcome" => outcome)
                .increment(1);
        }
    }
    if mark.is_none() || !ticks.is_empty() {
        store.advance_schedule(schedule.name(), through).await?;
    }
    Ok(())
}

impl Actor for Scheduler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.tick(ctx);
        ctx.run_interval(self.every, Self::tick);
    }
}
