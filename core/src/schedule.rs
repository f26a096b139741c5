//! Recurring schedules: a cron pattern (seconds optional) in a time zone and the job each tick
//! enqueues. Pure: which ticks are due is a function of the last tick handled and "now" (the
//! coordinator's clock); the `Scheduler` actor does the I/O.
//!
//! Exactly one job per tick: each tick's job is enqueued with the unique key
//! `schedule:<name>:<tick ms>`, so however many schedulers fire a tick — a paused leader that
//! wakes, a restarted one, two that both believe they hold the role — the enqueue adds one job.

use std::str::FromStr as _;
use std::time::Duration;

use chrono::{DateTime, Datelike as _, TimeZone as _, Utc};
use chrono_tz::Tz;
use croner::Cron;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::job::{check_name, NewJob};

/// How far back a scheduler looks for missed ticks (catch-up never reaches further).
pub const CATCH_UP_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// How long a tick's unique key is held: longer than any tick a scheduler can still fire
/// (the catch-up window plus the longest grace), so a tick fired twice adds one job.
pub const TICK_KEY_TTL: Duration = Duration::from_secs(2 * 24 * 3600);

/// Shortest grace: a tick must survive a scheduler's look interval and a role takeover.
pub const MIN_GRACE: Duration = Duration::from_secs(5);

/// Longest grace.
pub const MAX_GRACE: Duration = Duration::from_secs(3600);

/// Most missed ticks `CatchUp::All` may fire.
pub const MAX_CATCH_UP: u32 = 1000;

/// Longest schedule name: the tick's unique key (`schedule:<name>:<ms>`) must stay a name.
pub const MAX_SCHEDULE_NAME_BYTES: usize = 400;

/// How far ahead a tick is looked for: the rest of the current year (in the schedule's time
/// zone) and this many more. A pattern with no tick that soon is refused as never firing;
/// 29 February, at most 8 years apart (2096, 2104), still fires.
pub const TICK_HORIZON_YEARS: i32 = 10;

/// What happens to ticks missed for longer than the grace period (an outage, every scheduler
/// down): none are fired, only the latest, or the latest `n`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CatchUp {
    /// Skip them.
    None,
    /// Fire the latest one.
    #[default]
    Last,
    /// Fire the latest `n`.
    All(u32),
}

/// A recurring job. Built with [`Schedule::new`], refined with the `with_*` methods.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "ScheduleSpec", into = "ScheduleSpec")]
pub struct Schedule {
    spec: ScheduleSpec,
    cron: Cron,
    tz: Tz,
}

/// A schedule as stored and sent: plain data, checked when it becomes a [`Schedule`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// Name (1..=400 bytes, no control characters).
    pub name: String,
    /// Cron pattern, 5 fields or 6 with seconds first: `0 7 * * 1-5`, `*/10 * * * * *`.
    pub pattern: String,
    /// IANA time zone the pattern is read in, e.g. `Europe/Berlin`.
    pub time_zone: String,
    /// Ticks missed for longer than `grace` (every scheduler down).
    pub catch_up: CatchUp,
    /// A tick late by at most this much is still fired (a scheduler that took over, a slow
    /// round trip); older ones are missed and follow `catch_up`.
    pub grace: Duration,
    /// The job each tick enqueues (its unique key is set per tick).
    pub job: NewJob,
}

impl ScheduleSpec {
    /// The same schedule with another pattern (not checked until it becomes a [`Schedule`]).
    pub fn with_pattern(mut self, pattern: &str) -> Self {
        self.pattern = pattern.to_owned();
        self
    }
}

impl TryFrom<ScheduleSpec> for Schedule {
    type Error = Error;

    fn try_from(spec: ScheduleSpec) -> Result<Self> {
        check_name("schedule name", &spec.name)?;
        if spec.name.len() > MAX_SCHEDULE_NAME_BYTES {
            return Err(Error::InvalidJob(format!(
                "schedule name is {} bytes, the limit is {MAX_SCHEDULE_NAME_BYTES}",
                spec.name.len()
            )));
        }
        let cron = Cron::from_str(&spec.pattern).map_err(|e| {
            Error::InvalidJob(format!(
                "schedule {}: pattern {:?}: {e}",
                spec.name, spec.pattern
            ))
        })?;
        let tz: Tz = spec.time_zone.parse().map_err(|e| {
            Error::InvalidJob(format!(
                "schedule {}: time zone {:?}: {e}",
                spec.name, spec.time_zone
            ))
        })?;
        spec.job
            .validate(crate::job::DEFAULT_MAX_PAYLOAD_BYTES)
            .map_err(|e| Error::InvalidJob(format!("schedule {}: {e}", spec.name)))?;
        if spec.job.id.is_some() {
            // Every tick is a job of its own (unique per tick): one id for all would let only
            // the first tick in, or refuse a batch of due ticks for good.
            return Err(Error::InvalidJob(format!(
                "schedule {}: its job has an id (NewJob::with_id); each tick's job gets its own",
                spec.name
            )));
        }
        if !(MIN_GRACE..=MAX_GRACE).contains(&spec.grace) {
            return Err(Error::InvalidJob(format!(
                "schedule {}: grace {:?} is outside {MIN_GRACE:?}..={MAX_GRACE:?}",
                spec.name, spec.grace
            )));
        }
        if matches!(spec.catch_up, CatchUp::All(n) if n > MAX_CATCH_UP) {
            return Err(Error::InvalidJob(format!(
                "schedule {}: catch-up reaches at most {MAX_CATCH_UP} ticks",
                spec.name
            )));
        }
        let schedule = Self { spec, cron, tz };
        // By this host's clock, not the coordinator's: years ahead, they agree.
        if schedule.next_tick(Utc::now().timestamp_millis()).is_none() {
            return Err(Error::InvalidJob(format!(
                "schedule {}: pattern {:?} never fires (no tick in the next {TICK_HORIZON_YEARS} years)",
                schedule.spec.name, schedule.spec.pattern
            )));
        }
        Ok(schedule)
    }
}

impl From<Schedule> for ScheduleSpec {
    fn from(schedule: Schedule) -> Self {
        schedule.spec
    }
}

impl Schedule {
    /// Enqueues `job` at every tick of `pattern` (UTC; see [`Schedule::in_time_zone`]).
    /// Fails on a bad name, a pattern that does not parse or never fires (no tick in the next
    /// 10 years, such as 30 February), or a job that would not validate.
    pub fn new(name: impl Into<String>, pattern: &str, job: NewJob) -> Result<Self> {
        Self::try_from(ScheduleSpec {
            name: name.into(),
            pattern: pattern.to_owned(),
            time_zone: "UTC".into(),
            catch_up: CatchUp::default(),
            grace: Duration::from_secs(60),
            job,
        })
    }

    /// Reads the pattern in the IANA time zone `tz` (daylight saving handled by the zone).
    pub fn in_time_zone(mut self, tz: &str) -> Result<Self> {
        self.spec.time_zone = tz.to_owned();
        Self::try_from(self.spec)
    }

    /// Sets what happens to ticks missed for longer than the grace period (default: fire the
    /// latest one).
    pub fn with_catch_up(mut self, catch_up: CatchUp) -> Self {
        self.spec.catch_up = catch_up;
        self
    }

    /// Sets how late a tick may be and still fire (default 60 s).
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.spec.grace = grace;
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Its plain description.
    pub fn spec(&self) -> &ScheduleSpec {
        &self.spec
    }

    /// The ticks to fire now (ms since the Unix epoch, oldest first) and the instant handled
    /// through: every tick after `last` (exclusive; `None`: never handled, so it starts now
    /// and fires nothing from before it existed) up to `now` (inclusive) that is within the
    /// grace period, plus the missed ones `catch_up` asks for.
    #[doc(hidden)]
    pub fn due(&self, last: Option<i64>, now: i64) -> (Vec<i64>, i64) {
        let grace = i64::try_from(self.spec.grace.as_millis()).unwrap_or(i64::MAX);
        let window = CATCH_UP_WINDOW.as_millis() as i64;
        let Some(last) = last else {
            return (Vec::new(), now); // new: it starts now
        };
        let keep_old = match self.spec.catch_up {
            CatchUp::None => 0,
            CatchUp::Last => 1,
            CatchUp::All(n) => n as usize,
        };
        // Forward from the last tick handled, never further back than the catch-up window.
        let from = last.max(now.saturating_sub(window));
        let mut old = std::collections::VecDeque::new();
        let mut recent = Vec::new();
        for ms in self.ticks_after(from) {
            if ms > now {
                break;
            }
            if ms > last {
                if now - ms <= grace {
                    recent.push(ms);
                } else if keep_old > 0 {
                    if old.len() == keep_old {
                        old.pop_front();
                    }
                    old.push_back(ms);
                }
            }
        }
        let mut ticks: Vec<i64> = old.into();
        ticks.extend(recent);
        (ticks, last.max(now))
    }

    /// The first tick after `ms`; `None` if there is none within the horizon.
    #[doc(hidden)]
    pub fn next_tick(&self, ms: i64) -> Option<i64> {
        self.ticks_after(ms).next()
    }

    /// The next tick a scheduler fires for this schedule, handled through `mark`, at `now`:
    /// the first after both (ticks up to `now` are fired or missed by then).
    #[doc(hidden)] // for palisade-cli's `schedule list`
    pub fn next_fired(&self, mark: Option<i64>, now: i64) -> Option<i64> {
        self.next_tick(mark.map_or(now, |mark| mark.max(now)))
    }

    /// Every tick after `ms` (exclusive) within the horizon, oldest first: the one search
    /// behind both what is due and what `schedule list` shows, so the two agree to the ms.
    ///
    /// Whole seconds: croner keeps the sub-second part of where it starts in what it finds
    /// (every second from 10:00:00.444 gives 10:00:01.444), and ticks are whole seconds. The
    /// way croner reads daylight-saving changes: a time the clocks skip fires once at the
    /// first valid time, a time they repeat fires once.
    fn ticks_after(&self, ms: i64) -> impl Iterator<Item = i64> + '_ {
        let mut at = self.at(ms.div_euclid(1000) * 1000);
        let cron = at.map(|t| self.within_horizon(t.year()));
        std::iter::from_fn(move || {
            let next = cron.as_ref()?.find_next_occurrence(&at?, false).ok()?;
            at = Some(next);
            Some(next.timestamp_millis())
        })
    }

    /// This schedule's pattern, firing only in the years `year..=year + TICK_HORIZON_YEARS`.
    /// croner looks for a date that never comes (30 February) day by day up to the year 5000,
    /// a slow search, and a scheduler searches on every pass; past the allowed years it steps
    /// a whole year at a time.
    fn within_horizon(&self, year: i32) -> Cron {
        // croner's `component::ALL_BIT`, which it does not export.
        const ALL_BIT: u8 = 1;
        let last = year.saturating_add(TICK_HORIZON_YEARS);
        let mut cron = self.cron.clone();
        // The years from a pattern with a year field (cheaper than clearing ~5,000 years one
        // by one, on every pass), less those the schedule's own year field leaves out.
        match Cron::from_str(&format!("* * * * * * {year}-{last}")) {
            Ok(window) => cron.pattern.years = window.pattern.years,
            Err(_) => return cron, // a year croner cannot represent: its own limits hold
        }
        for y in year..=last {
            if !self.cron.pattern.year_match(y).unwrap_or(false) {
                if let Ok(y) = u16::try_from(y) {
                    let _ = cron.pattern.years.unset_bit(y, ALL_BIT);
                }
            }
        }
        cron
    }

    /// The job for `tick`: this schedule's job, unique per tick, knowing its tick.
    #[doc(hidden)]
    pub fn job_for(&self, tick: i64) -> NewJob {
        let mut job = self
            .spec
            .job
            .clone()
            .with_unique_key(format!("schedule:{}:{tick}", self.spec.name), TICK_KEY_TTL);
        job.tick = Some(crate::job::Tick {
            schedule: self.spec.name.clone(),
            at_ms: tick,
        });
        // A tick starts a trace of its own (its enqueue's), never one a kept record pinned.
        job.trace = None;
        job
    }

    fn at(&self, ms: i64) -> Option<DateTime<Tz>> {
        Utc.timestamp_millis_opt(ms)
            .single()
            .map(|t| t.with_timezone(&self.tz))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_never_continues_a_trace_the_schedules_job_names() {
        let trace = crate::traceparent::TraceContext::from_w3c(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            None,
        )
        .unwrap();
        let schedule =
            Schedule::new("s", "* * * * *", NewJob::raw("k", "{}").with_trace(trace)).unwrap();
        assert_eq!(schedule.job_for(60_000).trace, None);
    }

    #[test]
    fn a_schedule_whose_job_has_an_id_is_refused() {
        let job = NewJob::raw("k", "{}").with_id(crate::ids::JobId::new());
        let refused = Schedule::new("s", "* * * * *", job);
        assert!(
            matches!(&refused, Err(Error::InvalidJob(e)) if e.contains("has an id")),
            "{:?}",
            refused.err()
        );
    }

    fn every_second() -> Schedule {
        Schedule::new("tick", "* * * * * *", NewJob::raw("k", "null")).unwrap()
    }

    const T: i64 = 1_790_000_000_000; // a whole second

    #[test]
    fn every_tick_after_the_last_one_up_to_now() {
        let s = every_second();
        assert_eq!(
            s.due(Some(T), T + 2_500),
            (vec![T + 1000, T + 2000], T + 2_500)
        );
        assert_eq!(s.due(Some(T + 2_500), T + 2_900), (vec![], T + 2_900));
        assert_eq!(
            s.due(Some(T + 2_900), T + 3_000),
            (vec![T + 3000], T + 3_000)
        );
        // Never handled: it starts now, firing nothing from before.
        assert_eq!(s.due(None, T + 2_500), (vec![], T + 2_500));
        assert_eq!(s.due(Some(T + 2_500), T + 3_100).0, vec![T + 3000]);
        // A clock that went back handles nothing twice.
        assert_eq!(s.due(Some(T + 5_000), T + 3_000), (vec![], T + 5_000));
    }

    #[test]
    fn missed_ticks_follow_catch_up() {
        let base = every_second().with_grace(Duration::from_secs(5));
        let now = T + 100_000;
        let recent: Vec<i64> = (0..=5).rev().map(|s| now - s * 1000).collect();
        let due =
            |c: CatchUp, last: i64, now: i64| base.clone().with_catch_up(c).due(Some(last), now).0;
        assert_eq!(due(CatchUp::None, T, now), recent);
        assert_eq!(
            due(CatchUp::Last, T, now),
            [vec![now - 6000], recent.clone()].concat()
        );
        assert_eq!(
            due(CatchUp::All(3), T, now),
            [vec![now - 8000, now - 7000, now - 6000], recent].concat()
        );
        // All(n) never reaches before the last tick handled, nor past the window.
        assert_eq!(
            due(CatchUp::All(1000), now - 7500, now).first(),
            Some(&(now - 7000))
        );
        let window = CATCH_UP_WINDOW.as_millis() as i64;
        let far = now + 3 * window;
        let capped = due(CatchUp::All(1000), T, far);
        assert_eq!(capped.len(), 1000 + 6);
        assert!(capped[0] > far - window);
    }

    /// The promises the constants make, in numbers (found by cargo-mutants: `24 * 3600`
    /// read as `24 + 3600` passed every other test).
    #[test]
    fn catch_up_reaches_back_a_day_and_a_tick_key_outlives_every_tick_still_fired() {
        let hourly = Schedule::new("h", "0 * * * *", NewJob::raw("k", "null"))
            .unwrap()
            .with_catch_up(CatchUp::All(100));
        let hour = 3_600_000;
        let now = utc(2026, 12, 1) + 30 * 60_000;
        // Down 20 hours: the 20 hourly ticks missed are all due (the last within its grace).
        let (ticks, _) = hourly.due(Some(now - 20 * hour), now);
        assert_eq!(ticks.len(), 20, "{ticks:?}");
        // Down 30 hours: only the last day's 24 (the window is a day).
        let (ticks, _) = hourly.due(Some(now - 30 * hour), now);
        assert_eq!(ticks.len(), 24, "{ticks:?}");
        assert!(TICK_KEY_TTL > CATCH_UP_WINDOW + MAX_GRACE);
        assert_eq!(
            CATCH_UP_WINDOW,
            Duration::from_secs(86_400),
            "documented as a day"
        );
    }

    #[test]
    fn a_schedule_keeps_its_name_up_to_the_limit() {
        let at_limit = "x".repeat(MAX_SCHEDULE_NAME_BYTES);
        let s = Schedule::new(at_limit.clone(), "* * * * *", NewJob::raw("k", "null")).unwrap();
        assert_eq!(s.name(), at_limit);
        assert!(Schedule::try_from(s.spec().clone()).is_ok());
    }

    #[test]
    fn patterns_read_in_their_time_zone() {
        // 07:00 on weekdays in Berlin: 2026-11-30 is a Monday, 07:00 CET = 06:00 UTC.
        let s = Schedule::new("standup", "0 7 * * 1-5", NewJob::raw("k", "null"))
            .unwrap()
            .in_time_zone("Europe/Berlin")
            .unwrap();
        let six_utc = Utc
            .with_ymd_and_hms(2026, 11, 30, 6, 0, 0)
            .unwrap()
            .timestamp_millis();
        assert_eq!(s.due(Some(six_utc - 1), six_utc + 10).0, vec![six_utc]);
        assert!(s.due(Some(six_utc), six_utc + 3_600_000).0.is_empty());
    }

    /// Looks at 24 hours the way a scheduler does (a pass every 10 s) and returns every tick
    /// fired.
    fn a_day_of_passes(s: &Schedule, start: i64) -> Vec<i64> {
        let (mut fired, mut mark, mut now) = (Vec::new(), start, start);
        while now < start + 86_400_000 {
            now += 10_000;
            let (ticks, through) = s.due(Some(mark), now);
            fired.extend(ticks);
            mark = through;
        }
        fired
    }

    #[test]
    fn daylight_saving_changes_fire_each_day_once() {
        let berlin = |pattern: &str| {
            Schedule::new("d", pattern, NewJob::raw("k", "null"))
                .unwrap()
                .in_time_zone("Europe/Berlin")
                .unwrap()
        };
        // Local midnight before each 2026 change, in UTC.
        let spring = Utc
            .with_ymd_and_hms(2026, 3, 28, 23, 0, 0)
            .unwrap()
            .timestamp_millis();
        let autumn = Utc
            .with_ymd_and_hms(2026, 10, 24, 22, 0, 0)
            .unwrap()
            .timestamp_millis();
        // 02:30 does not exist on 2026-03-29 in Berlin and happens twice on 2026-10-25.
        for (start, what) in [(spring, "spring forward"), (autumn, "fall back")] {
            let fired = a_day_of_passes(&berlin("30 2 * * *"), start);
            assert_eq!(fired.len(), 1, "{what}: {fired:?}");
        }
        // An hourly pattern fires once per local hour: the skipped 02:00 never, the repeated
        // 02:00 once — never twice for one local time, at most two real hours apart.
        for start in [spring, autumn] {
            let s = berlin("0 * * * *");
            let fired = a_day_of_passes(&s, start);
            let local: Vec<String> = fired
                .iter()
                .map(|ms| s.at(*ms).unwrap().format("%d %H:%M").to_string())
                .collect();
            let mut distinct = local.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), local.len(), "{local:?}");
            assert!((23..=24).contains(&fired.len()), "{local:?}");
            assert!(
                fired
                    .windows(2)
                    .all(|w| [3_600_000, 7_200_000].contains(&(w[1] - w[0]))),
                "{local:?}"
            );
        }
    }

    #[test]
    fn bad_schedules_are_refused_with_the_reason() {
        let job = || NewJob::raw("k", "null");
        for (name, pattern) in [("", "* * * * *"), ("x", "61 * * * *"), ("x", "nonsense")] {
            let e = Schedule::new(name, pattern, job()).unwrap_err();
            assert!(matches!(e, Error::InvalidJob(_)), "{e}");
        }
        assert!(Schedule::new("x".repeat(401), "* * * * *", job()).is_err());
        let ok = || Schedule::new("x", "* * * * *", job()).unwrap();
        for bad in [
            ok().with_grace(Duration::ZERO),
            ok().with_grace(Duration::from_secs(7200)),
            ok().with_catch_up(CatchUp::All(MAX_CATCH_UP + 1)),
        ] {
            assert!(Schedule::try_from(bad.spec().clone()).is_err());
        }
        let big = NewJob::raw("k", format!("\"{}\"", "x".repeat(300 * 1024)));
        assert!(Schedule::new("x", "* * * * *", big).is_err());
        let e = Schedule::new("x", "* * * * *", job())
            .unwrap()
            .in_time_zone("Mars/Olympus")
            .unwrap_err();
        assert!(e.to_string().contains("Mars/Olympus"), "{e}");
        assert!(Schedule::new("x", "* * * * *", NewJob::raw("", "null")).is_err());
    }

    #[test]
    fn each_tick_has_its_own_unique_key_and_specs_round_trip() {
        let s = every_second();
        let key = |tick| s.job_for(tick).unique.unwrap().key;
        assert_eq!(key(T), format!("schedule:tick:{T}"));
        assert_ne!(key(T), key(T + 1000));
        let json = serde_json::to_string(&s).unwrap();
        let back: Schedule = serde_json::from_str(&json).unwrap();
        assert_eq!(back.spec(), s.spec());
        let bad = json.replace("* * * * * *", "bad pattern");
        assert!(serde_json::from_str::<Schedule>(&bad).is_err());
    }

    fn utc(y: i32, mo: u32, d: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, 0, 0, 0)
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn patterns_that_never_fire_are_refused_and_rare_ones_kept() {
        let job = || NewJob::raw("k", "null");
        // 30 February (with and without seconds), 31 April, a year gone by.
        for pattern in [
            "0 0 30 2 *",
            "0 0 0 30 2 *",
            "0 0 31 4 *",
            "0 0 0 1 1 * 2020",
        ] {
            let Err(e) = Schedule::new("x", pattern, job()) else {
                panic!("{pattern} was accepted");
            };
            assert!(matches!(e, Error::InvalidJob(_)), "{pattern}: {e}");
            assert!(e.to_string().contains("never fires"), "{pattern}: {e}");
            // The same pattern as stored (`schedule add` of an older version) or sent.
            let spec = every_second().spec().clone().with_pattern(pattern);
            assert!(Schedule::try_from(spec).is_err(), "{pattern}");
        }
        // 29 February fires in leap years: kept, in any zone, even across the 8 years from
        // 2096 to 2104 (2100 is no leap year).
        let leap = Schedule::new("x", "0 0 29 2 *", job())
            .unwrap()
            .in_time_zone("Europe/Berlin")
            .unwrap();
        let berlin_midnight = |y| utc(y, 2, 29) - 3_600_000;
        assert_eq!(leap.next_tick(utc(2096, 3, 1)), Some(berlin_midnight(2104)));
        assert_eq!(leap.next_tick(utc(2027, 1, 1)), Some(berlin_midnight(2028)));
    }

    #[test]
    fn a_stored_pattern_that_never_fires_gives_up_quickly() {
        // Built the way an older version let one in: no check at all.
        let never = Schedule {
            cron: Cron::from_str("0 0 30 2 *").unwrap(),
            ..every_second()
        };
        let started = std::time::Instant::now();
        for _ in 0..10 {
            assert_eq!(never.next_tick(T), None);
            assert_eq!(never.due(Some(T), T + 10_000), (vec![], T + 10_000));
        }
        // croner alone walks to the year 5000 day by day: ~200 ms a search unoptimised.
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "{took:?}");
    }

    #[test]
    fn the_next_tick_shown_is_the_one_the_scheduler_fires() {
        let berlin = Schedule::new("standup", "0 7 * * 1-5", NewJob::raw("k", "null"))
            .unwrap()
            .in_time_zone("Europe/Berlin")
            .unwrap();
        let minutely = Schedule::new("m", "* * * * *", NewJob::raw("k", "null")).unwrap();
        for s in [every_second(), minutely, berlin] {
            for now in [T, T + 1, T + 444, T + 556, T + 999, T + 59_999] {
                let next = s.next_tick(now).unwrap();
                assert!(next > now, "{now}: {next}");
                // Handled through `now`, the scheduler fires nothing before `next`, then it.
                let early = s.due(Some(now), next - 1).0;
                assert!(early.is_empty(), "{}: {now}: {early:?}", s.name());
                assert_eq!(s.due(Some(now), next).0, vec![next], "{}: {now}", s.name());
                // What `schedule list` shows: that tick, whether the mark is behind now,
                // missing or ahead (a tick handled early by another scheduler).
                assert_eq!(s.next_fired(Some(now - 5_000), now), Some(next));
                assert_eq!(s.next_fired(None, now), Some(next));
                assert_eq!(s.next_fired(Some(next), now), s.next_tick(next));
            }
        }
    }
}
