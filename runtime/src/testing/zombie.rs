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
use crate::mutation::Mutation;
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
    /// was applied once a rival had held the job, and that every counter (`HashIncr`) ends
    /// where one run without a pause left it (a change applied twice, or lost, shows there).
    /// Each world starts at this harness's time, which it leaves as it was. With a Postgres sink ([`with_postgres`](Self::with_postgres)) each world writes to
    /// your database.
    pub fn zombie(&self, job: NewJob) -> TestResult<Zombie> {
        // Each world's time is put back when it is done: the time a scenario skips (its
        // first run's lease running out) is its own, and this harness's clock never moves.
        let saved = palisade_core::clock::skipped();
        let zombie = self.block_on(async {
            // One run without a pause, to the job's end: how many writes its first attempt
            // makes, and what its counters end at.
            let clean = self.world_for_zombie().await;
            let id = clean.enqueue(vec![job.clone()]).await?[0];
            let claim = clean.claim(id, &self.settings).await?;
            let writes = clean.run(claim, &self.settings, None).await?.writes.len();
            clean.drain(None, Some(id), &self.settings).await?;
            palisade_core::clock::restore(saved);
            // Before each write, then before settling (past the cap, before settling only).
            let mut pauses: Vec<usize> = (0..writes.min(MAX_PAUSES - 1)).collect();
            pauses.push(writes);
            let mut scenarios = Vec::new();
            for at in pauses {
                let scenario = self.scenario(&job, at, &clean).await;
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

    async fn scenario(&self, job: &NewJob, at: usize, clean: &World) -> TestResult<Scenario> {
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
        let counters = counters(&writes, clean, &world);
        let leaks = leaks(&writes, id, late_from, &counters)
            .into_iter()
            .map(|found| Leak {
                paused_before: at,
                found,
            })
            .collect();
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

/// Each counter the job's writes touched (`HashIncr`: sink, key, field), with its value after
/// the clean run and after this scenario.
type Counters = BTreeMap<(String, String, String), (Option<String>, Option<String>)>;

fn counters(writes: &[Written], clean: &World, scenario: &World) -> Counters {
    let clean_writes = clean
        .writes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut found = Counters::new();
    for w in writes.iter().chain(&clean_writes) {
        for m in w.mutations.iter().flatten() {
            if let Mutation::HashIncr { key, field, .. } = m {
                let value = |world: &World| {
                    let sink = world.sink_stores.get(&w.sink)?;
                    SinkView(sink.clone()).field(key, field)
                };
                found
                    .entry((w.sink.clone(), key.clone(), field.clone()))
                    .or_insert_with(|| (value(clean), value(scenario)));
            }
        }
    }
    found
}

/// What broke fencing in a scenario of job `id`, whose first run was paused before its write
/// `late_from` while a rival ran the job (`None`: no rival did), given its `counters`:
/// - a write of the first run from its pause on (made after it woke) that was applied: a
///   newer token, or the watermark the rival's settlement moved, must refuse it;
/// - a counter that ends other than after one clean run: a change applied twice (a re-run
///   that did not repeat its write under the same key) or lost; named with every applied
///   write that changed it;
/// - for a Postgres transaction, whose statements the harness does not see: one applied by
///   a run at a position where another run had applied one under another key.
fn leaks(
    writes: &[Written],
    id: JobId,
    late_from: Option<usize>,
    counters: &Counters,
) -> Vec<Found> {
    let ours: Vec<&Written> = writes.iter().filter(|w| w.job == id).collect();
    let mut found = Vec::new();
    for w in ours.iter().filter(|w| w.applied()) {
        if late_from.is_some_and(|at| w.run == 1 && w.position >= at) {
            found.push(Found::Late {
                write: (*w).clone(),
            });
        }
    }
    for ((sink, key, field), (clean, here)) in counters {
        if clean == here {
            continue;
        }
        let changed_it = |w: &&&Written| {
            w.applied()
                && w.sink == *sink
                && w.mutations.iter().flatten().any(|m| {
                    matches!(m, Mutation::HashIncr { key: k, field: f, .. } if k == key && f == field)
                })
        };
        found.push(Found::Counter {
            sink: sink.clone(),
            key: key.clone(),
            field: field.clone(),
            clean: clean.clone(),
            here: here.clone(),
            writes: ours
                .iter()
                .filter(changed_it)
                .map(|w| (*w).clone())
                .collect(),
        });
    }
    let transactions: Vec<&&Written> = ours
        .iter()
        .filter(|w| w.applied() && w.mutations.is_none())
        .collect();
    for (i, w) in transactions.iter().enumerate() {
        let earlier = transactions[..i].iter().find(|e| {
            e.run != w.run && e.sink == w.sink && e.position == w.position && e.key != w.key
        });
        if let Some(earlier) = earlier {
            found.push(Found::Twice {
                earlier: (**earlier).clone(),
                write: (**w).clone(),
            });
        }
    }
    found
}

/// One way a zombie scenario broke fencing.
#[derive(Clone, Debug)]
pub struct Leak {
    /// The write the first run was paused before.
    pub paused_before: usize,
    /// What was found.
    pub found: Found,
}

/// What a [`Leak`] found.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Found {
    /// A write the first run made after it woke was applied, although a rival had held the
    /// job.
    Late {
        /// The write.
        write: Written,
    },
    /// A counter ended other than after one run without a pause.
    Counter {
        /// The sink.
        sink: String,
        /// The hash.
        key: String,
        /// Its field.
        field: String,
        /// Its value after the clean run.
        clean: Option<String>,
        /// Its value after this scenario.
        here: Option<String>,
        /// Every applied write that changed it, in order.
        writes: Vec<Written>,
    },
    /// Two runs applied a Postgres transaction at one position under two keys.
    Twice {
        /// The first run's.
        earlier: Written,
        /// The later run's.
        write: Written,
    },
}

/// How to fix a write applied twice.
const SAME_KEY: &str = "a re-run must repeat a write under the same idempotency key: \
    ctx.sink(..).write numbers a run's writes in order; give write_keyed a key made from the \
    job, never a fresh one";

impl fmt::Display for Leak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.paused_before;
        match &self.found {
            Found::Late { write: w } => write!(
                f,
                "paused before its write #{at}, the first run woke after its lease had run out, \
                 and its write #{} to sink {:?} was applied:\n    {}\n  a late write must be \
                 refused: write through ctx.sink or ctx.postgres, under the lease's fence",
                w.position,
                w.sink,
                w.brief()
            ),
            Found::Counter {
                sink,
                key,
                field,
                clean,
                here,
                writes,
            } => {
                let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "unset".into());
                let number =
                    |v: &Option<String>| v.as_deref().map_or(Some(0), |v| v.parse::<i128>().ok());
                let (what, fix) = match (number(here), number(clean)) {
                    (Some(h), Some(c)) if h < c => (
                        "a change lost",
                        "a re-run must make the writes its first run would have made (the first \
                         run's were refused once its lease ran out)",
                    ),
                    _ => ("a change applied twice", SAME_KEY),
                };
                write!(
                    f,
                    "paused before its write #{at}, then re-run by a rival: sink {sink:?} {key}.{field} \
                     is {} but {} after one run without a pause: {what}. The writes that changed it:",
                    show(here),
                    show(clean)
                )?;
                if writes.is_empty() {
                    write!(f, " none")?;
                }
                for w in writes {
                    write!(f, "\n    {}", w.brief())?;
                }
                write!(f, "\n  {fix}")
            }
            Found::Twice { earlier, write: w } => write!(
                f,
                "paused before its write #{at}, then re-run by a rival: a transaction at write #{} \
                 to sink {:?} was applied twice, under two keys:\n    {}\n    {}\n  {SAME_KEY}",
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

    fn counter(clean: &str, here: &str) -> Counters {
        let at = ("s".to_owned(), "acct".to_owned(), "n".to_owned());
        Counters::from([(at, (Some(clean.to_owned()), Some(here.to_owned())))])
    }

    #[test]
    fn a_re_run_under_the_same_key_is_no_leak() {
        let writes = [
            write(1, 0, "j/0", Some(5), Admission::Applied),
            write(2, 0, "j/0", Some(5), Admission::Duplicate),
            write(1, 1, "j/1", Some(5), stale()),
        ];
        assert!(leaks(&writes, job(), Some(1), &counter("5", "5")).is_empty());
    }

    #[test]
    fn a_counter_off_its_clean_value_names_every_write_that_changed_it() {
        // Whatever moved (the key, the position, a timestamp beside it): the total shows it.
        let writes = [
            write(1, 0, "credit-1", Some(5), Admission::Applied),
            write(2, 1, "credit-2", Some(5), Admission::Applied),
        ];
        let found = leaks(&writes, job(), None, &counter("5", "10"));
        assert_eq!(found.len(), 1);
        let Found::Counter { writes, .. } = &found[0] else {
            panic!("{found:?}");
        };
        assert_eq!(writes.len(), 2);
        let leak = Leak {
            paused_before: 1,
            found: found[0].clone(),
        };
        let message = leak.to_string();
        assert!(
            message.contains("acct.n is 10 but 5") && message.contains("applied twice"),
            "{message}"
        );
        assert!(
            message.contains("credit-1") && message.contains("credit-2"),
            "{message}"
        );
    }

    #[test]
    fn the_same_change_made_twice_on_purpose_is_no_leak() {
        // A signup bonus and a referral bonus of the same size: both runs end at 20.
        let writes = [
            write(1, 0, "j/0", Some(10), Admission::Applied),
            write(2, 0, "j/0", Some(10), Admission::Duplicate),
            write(2, 1, "j/1", Some(10), Admission::Applied),
        ];
        assert!(leaks(&writes, job(), None, &counter("20", "20")).is_empty());
    }

    #[test]
    fn a_late_write_is_a_leak_only_from_the_pause_on_and_only_after_a_rival() {
        let writes = [
            write(1, 0, "j/0", Some(1), Admission::Applied),
            write(1, 1, "j/1", Some(2), Admission::Applied),
        ];
        let same = counter("3", "3");
        let found = leaks(&writes, job(), Some(1), &same);
        assert_eq!(found.len(), 1);
        assert!(matches!(&found[0], Found::Late { write } if write.position == 1));
        assert!(
            leaks(&writes, job(), None, &same).is_empty(),
            "no rival: the fence allows it"
        );
    }

    #[test]
    fn a_postgres_transaction_is_compared_by_its_position() {
        let none = Counters::new();
        let writes = [
            write(1, 0, "j/tx/pay-1", None, Admission::Applied),
            write(2, 0, "j/tx/pay-2", None, Admission::Applied),
        ];
        assert_eq!(leaks(&writes, job(), None, &none).len(), 1);
        let renamed = [
            write(1, 0, "j/tx/pay", None, Admission::Applied),
            write(2, 1, "j/tx/refund", None, Admission::Applied),
        ];
        assert!(leaks(&renamed, job(), None, &none).is_empty());
    }
}
