//! The zombie: a run paused before each of its writes in turn while a rival finishes the job,
//! then woken, in worlds of its own; and the pure rule that names what broke fencing.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::world::{Gate, World};
use super::{Harness, Performed, SinkView, TestError, TestResult, Written};
use crate::error::Error;
use crate::ids::JobId;
use crate::job::NewJob;
use crate::store::memory::MemoryFencedStore;

/// Scenarios [`Harness::zombie`] runs at most: pauses before the first 63 writes, and one
/// before settling.
const MAX_PAUSES: usize = 64;

impl Harness {
    /// Summons a zombie: runs `job` once to count its writes, then, for each of them and for
    /// its settlement, in a world of its own (new memory stores and sinks; this harness's own
    /// are untouched): a first run pauses before that write, its lease runs out, a rival
    /// claims the job and runs it to its end, and the first run wakes and goes on.
    /// [`Zombie::assert_fenced`] then checks that no write the woken run made after its pause
    /// was applied once a rival had held the job, and that no two runs applied the same change
    /// under different keys. Each world starts at this harness's time, which it leaves as it
    /// was. With a Postgres sink ([`with_postgres`](Self::with_postgres)) each world writes to
    /// your database.
    pub fn zombie(&self, job: NewJob) -> TestResult<Zombie> {
        // Each world's time is put back when it is done: the time a scenario skips (its
        // first run's lease running out) is its own, and this harness's clock never moves.
        let saved = palisade_core::clock::skipped();
        let zombie = self.block_on(async {
            let counted = self.world_for_zombie().await;
            let id = counted.enqueue(vec![job.clone()]).await?[0];
            let claim = counted.claim(id, &self.settings).await?;
            let writes = counted.run(claim, &self.settings, None).await?.writes.len();
            palisade_core::clock::restore(saved);
            // Before each write, then before settling (past the cap, before settling only).
            let mut pauses: Vec<usize> = (0..writes.min(MAX_PAUSES - 1)).collect();
            pauses.push(writes);
            let mut scenarios = Vec::new();
            for at in pauses {
                let scenario = self.scenario(&job, at).await;
                palisade_core::clock::restore(saved);
                scenarios.push(scenario?);
            }
            Ok(Zombie { scenarios })
        });
        palisade_core::clock::restore(saved);
        zombie
    }

    /// A new world whose tokens are all newer than every earlier world's.
    async fn world_for_zombie(&self) -> World {
        self.epoch.set(self.epoch.get() + 1);
        World::new(self.epoch.get(), &self.sink_names, &self.settings).await
    }

    async fn scenario(&self, job: &NewJob, at: usize) -> TestResult<Scenario> {
        let world = self.world_for_zombie().await;
        let id = world.enqueue(vec![job.clone()]).await?[0];
        let claim = world.claim(id, &self.settings).await?;
        let gate = Arc::new(Gate {
            at,
            held: AtomicBool::new(false),
            reached: Notify::new(),
            wake: tokio::sync::watch::Sender::new(false),
        });
        let mut first = {
            let (world, settings, gate) = (world.clone(), self.settings.clone(), gate.clone());
            actix::spawn(async move { world.run(claim, &settings, Some(gate)).await })
        };
        let panicked = |e: tokio::task::JoinError| {
            TestError::from(Error::Backend(format!("the first run panicked: {e}")))
        };
        // A run that makes fewer writes this time never reaches its pause: it ran to its end.
        let ended = tokio::select! {
            () = gate.reached.notified() => None,
            ran = &mut first => Some(ran),
        };
        let (zombie, rivals, paused) = match ended {
            Some(ran) => (ran.map_err(panicked)??, Vec::new(), false),
            None => {
                // Paused past its lease: the reaper gives the job back (or, out of stalls,
                // buries it), and a rival runs it to its end. Then the first run wakes.
                palisade_core::clock::skip(self.settings.lease + Duration::from_secs(1));
                let rivals = world.drain(None, Some(id), &self.settings).await;
                gate.wake.send_replace(true);
                let ran = first.await.map_err(panicked)??;
                (ran, rivals?.runs, true)
            }
        };
        let writes = world
            .writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // A late write is a leak once a rival held the job: a newer token, or the watermark
        // its settlement moved, must refuse it. With no rival (the reaper buried the job, out
        // of stalls) the woken run's write is the job's only one, as the fence allows.
        let late_from = (paused && !rivals.is_empty()).then_some(at);
        let leaks = leaks(&writes, id, late_from);
        Ok(Scenario {
            paused_before: at,
            paused,
            zombie,
            rivals,
            leaks,
            sinks: world.sink_stores,
        })
    }
}

/// The writes in `writes` that break fencing, for job `id` whose first run was paused before
/// its write `paused` while a rival ran the job (`None`: no rival did):
/// - a write of the first run from its pause on (made after it woke) that was applied;
/// - a write applied by one run that another run had applied already under another key:
///   the same mutations to the same sink (a `ctx.sink` write), or the same position (a
///   Postgres transaction, whose statements the harness does not see). A re-run must repeat
///   a write under its key, so the sink answers `Duplicate`.
fn leaks(writes: &[Written], id: JobId, paused: Option<usize>) -> Vec<Leak> {
    let mut found = Vec::new();
    let mut applied: Vec<&Written> = Vec::new();
    for w in writes.iter().filter(|w| w.job == id && w.applied()) {
        if paused.is_some_and(|at| w.run == 1 && w.position >= at) {
            found.push(Leak {
                paused_before: paused.unwrap_or_default(),
                write: w.clone(),
                earlier: None,
            });
            continue;
        }
        let twin = applied.iter().find(|e| {
            e.run != w.run
                && e.sink == w.sink
                && e.key != w.key
                && match (&e.mutations, &w.mutations) {
                    (Some(a), Some(b)) => a == b,
                    (None, None) => e.position == w.position,
                    _ => false,
                }
        });
        match twin {
            Some(earlier) => found.push(Leak {
                paused_before: paused.unwrap_or_default(),
                write: w.clone(),
                earlier: Some((*earlier).clone()),
            }),
            None => applied.push(w),
        }
    }
    found
}

/// One way a zombie scenario broke fencing.
#[derive(Clone, Debug)]
pub struct Leak {
    /// Writes the first run had made when it paused.
    pub paused_before: usize,
    /// The write that should not have been applied.
    pub write: Written,
    /// The earlier run's write at the same position, applied before it (`None`: the write
    /// is the woken zombie's own).
    pub earlier: Option<Written>,
}

impl fmt::Display for Leak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = &self.write;
        match &self.earlier {
            None => write!(
                f,
                "paused before its write #{}, the first run woke after its lease had run out, \
                 and its write #{} to sink {:?} was applied:\n    {}\n  a late write must be \
                 refused: write through ctx.sink or ctx.postgres, under the lease's fence",
                self.paused_before,
                w.position,
                w.sink,
                w.brief()
            ),
            Some(earlier) => write!(
                f,
                "paused before its write #{}, then re-run by a rival: write #{} to sink {:?} was \
                 applied twice, under two keys:\n    {}\n    {}\n  a re-run must repeat a write \
                 under the same idempotency key: ctx.sink(..).write numbers a run's writes in \
                 order; give write_keyed a key made from the job, never a fresh one",
                self.paused_before,
                w.position,
                w.sink,
                earlier.brief(),
                w.brief()
            ),
        }
    }
}

/// One scenario of [`Harness::zombie`].
pub struct Scenario {
    /// The write the first run was to pause before (after its last: before settling).
    pub paused_before: usize,
    /// It did pause there; `false`: this run made fewer writes than the first one counted, and
    /// ran to its end.
    pub paused: bool,
    /// The first run, woken after the rivals.
    pub zombie: Performed,
    /// The rivals' runs, in order.
    pub rivals: Vec<Performed>,
    /// What broke fencing.
    pub leaks: Vec<Leak>,
    sinks: BTreeMap<String, Arc<MemoryFencedStore>>,
}

impl Scenario {
    /// Sink `name`'s contents at the scenario's end.
    pub fn sink(&self, name: &str) -> TestResult<SinkView> {
        self.sinks
            .get(name)
            .map(|s| SinkView(s.clone()))
            .ok_or_else(|| TestError::NoSink(name.to_owned()))
    }
}

/// What [`Harness::zombie`] saw, one scenario per pause.
pub struct Zombie {
    /// Paused before each write, then before its settlement.
    pub scenarios: Vec<Scenario>,
}

impl Zombie {
    /// Every leak, in every scenario.
    pub fn leaks(&self) -> impl Iterator<Item = &Leak> {
        self.scenarios.iter().flat_map(|s| &s.leaks)
    }

    /// The woken runs' writes that were refused, in every scenario.
    pub fn refused(&self) -> usize {
        self.scenarios
            .iter()
            .flat_map(|s| &s.zombie.writes)
            .filter(|w| w.refused())
            .count()
    }

    /// Panics, naming each write, if any scenario let a late write through or applied a
    /// write twice.
    #[track_caller]
    pub fn assert_fenced(&self) {
        let leaks: Vec<String> = self.leaks().map(|l| format!("- {l}")).collect();
        // (One line per leak, then its writes, indented.)
        if !leaks.is_empty() {
            panic!(
                "{} of {} zombie scenarios broke fencing:\n{}",
                self.scenarios
                    .iter()
                    .filter(|s| !s.leaks.is_empty())
                    .count(),
                self.scenarios.len(),
                leaks.join("\n")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{Admission, Rejection};
    use crate::ids::{FencingToken, IdempotencyKey};
    use crate::mutation::Mutation;

    fn job() -> JobId {
        JobId::from(uuid::Uuid::from_u128(7))
    }

    fn write(run: u32, position: usize, key: &str, by: Option<i64>, answer: Admission) -> Written {
        Written {
            sink: "s".into(),
            job: job(),
            run,
            position,
            token: FencingToken::new(1, u64::from(run)),
            key: IdempotencyKey::new(key),
            mutations: by.map(|by| {
                vec![Mutation::HashIncr {
                    key: "acct".into(),
                    field: "n".into(),
                    by,
                }]
            }),
            answer: Ok(answer),
        }
    }

    fn stale() -> Admission {
        Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::new(1, 1),
            highest: FencingToken::new(1, 2),
        })
    }

    #[test]
    fn a_re_run_under_the_same_key_is_no_leak() {
        let writes = [
            write(1, 0, "j/0", Some(5), Admission::Applied),
            write(2, 0, "j/0", Some(5), Admission::Duplicate),
            write(1, 1, "j/1", Some(5), stale()),
        ];
        assert!(leaks(&writes, job(), Some(1)).is_empty());
    }

    #[test]
    fn the_same_change_applied_by_two_runs_under_two_keys_is_applied_twice() {
        // Its position moved (the re-run wrote something else first): still the same change.
        let writes = [
            write(1, 0, "j/0", Some(5), Admission::Applied),
            write(2, 1, "j/1", Some(5), Admission::Applied),
        ];
        let found = leaks(&writes, job(), None);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].earlier.as_ref().unwrap().key.as_str(), "j/0");
        assert!(found[0].to_string().contains("applied twice"));
    }

    #[test]
    fn one_run_repeating_a_change_or_runs_making_different_ones_is_no_leak() {
        let writes = [
            write(1, 0, "j/0", Some(5), Admission::Applied),
            write(1, 1, "j/1", Some(5), Admission::Applied),
            write(2, 0, "j/audit-2", Some(6), Admission::Applied),
        ];
        assert!(leaks(&writes, job(), None).is_empty());
    }

    #[test]
    fn a_late_write_is_a_leak_only_from_the_pause_on_and_only_after_a_rival() {
        let writes = [
            write(1, 0, "j/0", Some(1), Admission::Applied),
            write(1, 1, "j/1", Some(2), Admission::Applied),
        ];
        let found = leaks(&writes, job(), Some(1));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].write.position, 1);
        assert!(found[0].earlier.is_none());
        assert!(found[0].to_string().contains("late write"));
        assert!(
            leaks(&writes, job(), None).is_empty(),
            "no rival: the fence allows it"
        );
    }

    #[test]
    fn a_postgres_transaction_is_compared_by_its_position() {
        let writes = [
            write(1, 0, "j/tx/pay-1", None, Admission::Applied),
            write(2, 0, "j/tx/pay-2", None, Admission::Applied),
        ];
        assert_eq!(leaks(&writes, job(), None).len(), 1);
        let renamed = [
            write(1, 0, "j/tx/pay", None, Admission::Applied),
            write(2, 1, "j/tx/refund", None, Admission::Applied),
        ];
        assert!(leaks(&renamed, job(), None).is_empty());
    }
}
