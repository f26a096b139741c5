//! Deterministic simulation (issue 11): a coordinator, several workers and a fenced sink run
//! in one thread on virtual time, driven by one seeded RNG that also draws the faults —
//! workers paused past their lease, renewals dropped, crashes, same-token retries, coordinator
//! state loss (with and without a durable epoch), counter regression, adversarial mutation
//! lists. Every step is appended to a history; named checkers, one per invariant of
//! ARCHITECTURE.md §3, read the history and the final state.
//!
//! The simulated workers are deliberately *worse* than the real `Worker`: a paused or
//! renewal-less worker goes on writing with its old lease as if nothing happened. Only the
//! stores' answers keep the invariants.
//!
//! - `PALISADE_SIM_SEEDS=N` runs N seeds (CI: 2,000; a long run: millions), from
//!   `PALISADE_SIM_FIRST_SEED` (default 0).
//! - A failure prints the seed, the invariant and the history slice of the scope involved;
//!   `PALISADE_SIM_SEED=N cargo test -p palisade --test simulation` replays it exactly.
//! - `planted_bugs_are_caught`: sinks with a dropped fence and with a half-applied mutation
//!   list make the checkers fail — a checker that cannot fail proves nothing.
//! - The same world drives the real Redis scripts on a private server (real time, fewer seeds).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use palisade::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

const HOT_SCOPES: u32 = 3;

/// One recorded step. Times are since the start of the run.
#[derive(Clone, Debug)]
enum Event {
    Claimed {
        at: Duration,
        worker: usize,
        logical: u32,
        lease: LeaseId,
        token: FencingToken,
        scope: Scope,
        expires: Duration,
    },
    Renewed {
        at: Duration,
        lease: LeaseId,
        expires: Duration,
    },
    Ended {
        at: Duration,
        lease: LeaseId,
        how: &'static str,
    },
    Write {
        worker: usize,
        lease: LeaseId,
        token: FencingToken,
        scope: Scope,
        key: String,
        mutations: Vec<Mutation>,
        outcome: std::result::Result<Admission, String>,
        /// A refused write moved the scope's fence where it must not: a stale, conflicting or
        /// failed write moved it at all, or a content refusal moved it anywhere but to its own
        /// fence.
        fence_moved: bool,
    },
    Fault(String),
    /// The coordinator lost its state; with `epoch` the new one starts in that epoch.
    StateLoss {
        epoch: Option<u32>,
    },
    #[allow(dead_code)] // read through Debug, in failure reports
    Finished {
        logical: u32,
        completed: bool,
    },
}

/// A job as the producer sees it: re-submitted after coordinator state loss, always with the
/// same scope and write keys, so a re-run is recognised by the sink.
#[derive(Clone, Debug)]
struct Logical {
    scope: String,
    writes: Vec<Vec<Mutation>>,
    done: Option<bool>,
}

struct Held {
    claim: Claim,
    logical: u32,
    next: usize,
    last: Option<FencedWrite>,
}

#[derive(Default)]
struct SimWorker {
    held: Vec<Held>,
    paused_until: Option<Instant>,
    renewals_dropped_until: Option<Instant>,
}

/// Which backends the world runs on.
enum Backend {
    /// Memory stores on virtual time; state loss replaces the coordinator.
    Memory,
    /// Real scripts on a private Redis, real time; no state loss.
    Redis(deadpool_redis::Pool),
}

struct World {
    rng: StdRng,
    backend: Backend,
    coord: Arc<dyn LeaseStore>,
    sink: Arc<dyn FencedStore>,
    workers: Vec<SimWorker>,
    logical: Vec<Logical>,
    job_of: HashMap<JobId, u32>,
    history: Vec<Event>,
    start: Instant,
    lease: Duration,
    epoch: u32,
    /// Clock slack of the coordinator (see `one_live_lease_per_scope`).
    slack: Duration,
}

impl World {
    fn new(seed: u64, backend: Backend, sink: Arc<dyn FencedStore>, lease: Duration) -> Self {
        let backend_slack = matches!(backend, Backend::Redis(_));
        let coord: Arc<dyn LeaseStore> = match &backend {
            Backend::Memory => Arc::new(MemoryLeaseStore::new()),
            Backend::Redis(pool) => Arc::new(RedisLeaseStore::new(
                pool.clone(),
                &format!("sim-{}", uuid::Uuid::new_v4()),
            )),
        };
        Self {
            rng: StdRng::seed_from_u64(seed),
            backend,
            coord,
            sink,
            workers: (0..3).map(|_| SimWorker::default()).collect(),
            logical: Vec::new(),
            job_of: HashMap::new(),
            history: Vec::new(),
            start: Instant::now(),
            lease,
            epoch: 0,
            slack: match backend_slack {
                true => Duration::from_millis(2),
                false => Duration::ZERO,
            },
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// A job's writes: mostly counters; now and then a list the sink must refuse whole.
    fn plan(&mut self, scope: &str) -> Vec<Vec<Mutation>> {
        let incr = |key: String, by| Mutation::HashIncr {
            key,
            field: "n".into(),
            by,
        };
        (0..self.rng.random_range(1..=3))
            .map(|_| match self.rng.random_range(0..20) {
                // A type clash after a good step.
                0 => vec![
                    incr(format!("bal:{scope}"), 1),
                    Mutation::Set {
                        key: format!("bal:{scope}"),
                        value: "x".into(),
                    },
                ],
                // An overflow after a good step.
                1 => vec![incr("big".into(), i64::MAX), incr("big".into(), 1)],
                _ => vec![incr(format!("bal:{scope}"), 1), incr("total".into(), 1)],
            })
            .collect()
    }

    async fn enqueue(&mut self, logical: u32) {
        let scope = self.logical[logical as usize].scope.clone();
        let ids = self
            .coord
            .enqueue(vec![NewJob::raw("sim", "null")
                .with_scope(scope.as_str())
                .with_max_stalls(1000)
                .with_max_attempts(1000)])
            .await
            .expect("enqueue");
        self.job_of.insert(ids[0], logical);
    }

    async fn new_job(&mut self) {
        let n = self.logical.len() as u32;
        let scope = if self.rng.random_bool(0.6) {
            format!("acct:{}", self.rng.random_range(0..HOT_SCOPES))
        } else {
            format!("cold:{n}")
        };
        let writes = self.plan(&scope);
        self.logical.push(Logical {
            scope,
            writes,
            done: None,
        });
        self.enqueue(n).await;
    }

    async fn claim(&mut self, w: usize) {
        let claims = match self
            .coord
            .claim("default", &format!("w{w}"), 2, self.lease)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                self.history.push(Event::Fault(format!("claim error: {e}")));
                return;
            }
        };
        for claim in claims {
            let Some(&logical) = self.job_of.get(&claim.job.id) else {
                continue;
            };
            self.history.push(Event::Claimed {
                at: self.now(),
                worker: w,
                logical,
                lease: claim.lease.id,
                token: claim.lease.token,
                scope: claim.lease.scope.clone(),
                expires: claim.lease.expires_at - self.start,
            });
            self.workers[w].held.push(Held {
                claim,
                logical,
                next: 0,
                last: None,
            });
        }
    }

    async fn send(&mut self, w: usize, write: FencedWrite, lease: LeaseId) -> Result<Admission> {
        let before = self.sink.highest(&write.scope).await.ok().flatten();
        let outcome = self.sink.write(write.clone()).await;
        let after = self.sink.highest(&write.scope).await.ok().flatten();
        // (A collection may drop the fence during the call; moving it is what counts.) A
        // content refusal advances the fence to its own token (invariant 8), nothing else.
        let moved = after.is_some() && after != before;
        let fence_moved = match &outcome {
            Ok(Admission::Rejected(Rejection::Mutation { .. })) => {
                moved && after != Some(write.fence)
            }
            Ok(Admission::Rejected(_)) | Err(_) => moved,
            Ok(_) => false,
        };
        self.history.push(Event::Write {
            worker: w,
            lease,
            token: write.fence.token,
            scope: write.scope.clone(),
            key: write.key.as_str().to_owned(),
            mutations: write.mutations.clone(),
            outcome: outcome
                .as_ref()
                .map(Clone::clone)
                .map_err(|e| e.to_string()),
            fence_moved,
        });
        outcome
    }

    async fn settle(&mut self, w: usize, i: usize, how: Settlement) {
        let held = self.workers[w].held.remove(i);
        let name = match &how {
            Settlement::Complete { .. } => "complete",
            Settlement::Dead { .. } => "dead",
            Settlement::Fenced { .. } => "fenced",
            _ => "retry",
        };
        let ok = matches!(
            self.coord
                .settle(vec![(held.claim.lease.id, how)])
                .await
                .as_deref(),
            Ok([Ok(())])
        );
        self.history.push(Event::Ended {
            at: self.now(),
            lease: held.claim.lease.id,
            how: if ok { name } else { "refused" },
        });
        // As a real worker does after settling: pass the coordinator's low watermark on.
        if let Some(w) = self.coord.watermark() {
            self.sink.observe_watermark(w);
        }
        if ok && matches!(name, "complete" | "dead") {
            let logical = &mut self.logical[held.logical as usize];
            if logical.done.is_none() {
                logical.done = Some(name == "complete");
                self.history.push(Event::Finished {
                    logical: held.logical,
                    completed: name == "complete",
                });
            }
        }
    }

    /// One step of one held job: its next write, or its settlement.
    async fn act(&mut self, w: usize) {
        if self.workers[w].held.is_empty() {
            return;
        }
        let i = self.rng.random_range(0..self.workers[w].held.len());
        let held = &self.workers[w].held[i];
        let plan = self.logical[held.logical as usize].writes.clone();
        if held.next >= plan.len() {
            return self.settle(w, i, Settlement::completed()).await;
        }
        let write = FencedWrite {
            scope: held.claim.lease.scope.clone(),
            fence: Fence {
                token: held.claim.lease.token,
                lease: held.claim.lease.id,
            },
            key: IdempotencyKey::new(format!("L{}/{}", held.logical, held.next)),
            mutations: plan[held.next].clone(),
        };
        let lease = held.claim.lease.id;
        self.workers[w].held[i].last = Some(write.clone());
        match self.send(w, write, lease).await {
            Ok(Admission::Applied | Admission::Duplicate) => self.workers[w].held[i].next += 1,
            Ok(Admission::Rejected(r)) => {
                let how = match r.highest() {
                    Some(highest) => Settlement::Fenced {
                        highest,
                        reason: r.to_string(),
                    },
                    None => Settlement::Dead {
                        reason: r.to_string(),
                    },
                };
                self.settle(w, i, how).await;
            }
            Err(e) => {
                // Parked for a while: the scope's turn passes to its next job meanwhile.
                let retry = Settlement::Retry {
                    delay: Duration::from_millis(30),
                    reason: e.to_string(),
                };
                self.settle(w, i, retry).await;
            }
        }
    }

    async fn renew(&mut self, w: usize) {
        let leases: Vec<LeaseId> = self.workers[w]
            .held
            .iter()
            .map(|h| h.claim.lease.id)
            .collect();
        if leases.is_empty() {
            return;
        }
        // The coordinator extends from when it runs the renewal: no later than now.
        let expires = self.now() + self.lease;
        let Ok(lost) = self.coord.renew(&leases, self.lease).await else {
            return;
        };
        for lease in leases {
            if lost.contains(&lease) {
                self.history.push(Event::Ended {
                    at: self.now(),
                    lease,
                    how: "lost",
                });
                self.workers[w].held.retain(|h| h.claim.lease.id != lease);
            } else {
                self.history.push(Event::Renewed {
                    at: self.now(),
                    lease,
                    expires,
                });
            }
        }
    }

    async fn advance(&mut self, by: Duration) {
        match self.backend {
            Backend::Memory => tokio::time::advance(by).await,
            Backend::Redis(_) => tokio::time::sleep(by).await,
        }
    }

    /// The coordinator loses everything; `durable` says whether it finds its epoch again.
    async fn lose_state(&mut self, durable: bool) {
        let max_epoch = self
            .history
            .iter()
            .filter_map(|e| match e {
                Event::Claimed { token, .. } => Some(token.epoch()),
                _ => None,
            })
            .max()
            .unwrap_or(0)
            .max(self.epoch);
        self.epoch = if durable { max_epoch + 1 } else { 0 };
        self.coord = Arc::new(MemoryLeaseStore::with_epoch(self.epoch));
        self.history.push(Event::StateLoss {
            epoch: durable.then_some(self.epoch),
        });
        // The producer re-submits whatever it has not seen finish.
        for l in 0..self.logical.len() as u32 {
            if self.logical[l as usize].done.is_none() {
                self.enqueue(l).await;
            }
        }
    }

    async fn step(&mut self, faults: bool) {
        let now = Instant::now();
        let w = self.rng.random_range(0..self.workers.len());
        let paused = self.workers[w].paused_until.is_some_and(|t| t > now);
        let roll = self.rng.random_range(0..100);
        match roll {
            0..=9 if faults => self.new_job().await,
            10..=24 if !paused => self.claim(w).await,
            25..=54 if !paused => self.act(w).await,
            55..=64
                if !paused
                    && self.workers[w]
                        .renewals_dropped_until
                        .is_none_or(|t| t <= now) =>
            {
                self.renew(w).await
            }
            65..=69 => {
                if let Ok(reaped) = self.coord.reap(16).await {
                    for r in reaped {
                        self.history
                            .push(Event::Fault(format!("reaped {} dead={}", r.job, r.dead)));
                    }
                }
            }
            70..=84 => {
                let by = Duration::from_millis(self.rng.random_range(1..30));
                self.advance(by).await;
            }
            85..=87 if faults && !paused => {
                let pause = self.lease * self.rng.random_range(1..=4);
                self.workers[w].paused_until = Some(now + pause);
                self.history
                    .push(Event::Fault(format!("w{w} paused {pause:?}")));
            }
            88..=89 if faults => {
                let until = now + self.lease * self.rng.random_range(1..=3);
                self.workers[w].renewals_dropped_until = Some(until);
                self.history
                    .push(Event::Fault(format!("w{w} renewals dropped")));
            }
            90 if faults => {
                self.workers[w] = SimWorker::default();
                self.history.push(Event::Fault(format!("w{w} crashed")));
            }
            91..=93 if faults && !paused => {
                // Same-token retry of the worker's last write (a lost reply, say).
                let last = self.workers[w]
                    .held
                    .iter()
                    .filter_map(|h| h.last.clone().map(|l| (l, h.claim.lease.id)))
                    .next();
                if let Some((write, lease)) = last {
                    let _ = self.send(w, write, lease).await;
                }
            }
            94 if faults && matches!(self.backend, Backend::Memory) => {
                let durable = self.rng.random_bool(0.5);
                self.history.push(Event::Fault(format!(
                    "coordinator state loss, durable epoch: {durable}"
                )));
                self.lose_state(durable).await;
            }
            _ => {}
        }
    }

    /// Runs `steps` steps with faults, then heals (no new faults, everyone resumes) until
    /// every job has finished, or gives up after a bound.
    async fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            self.step(true).await;
        }
        for w in &mut self.workers {
            w.paused_until = None;
            w.renewals_dropped_until = None;
        }
        for _ in 0..20_000 {
            if self.logical.iter().all(|l| l.done.is_some()) {
                break;
            }
            self.step(false).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The checkers: one per invariant, each over the history (and the sink's final state).
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct Violation {
    invariant: &'static str,
    detail: String,
    scope: Option<Scope>,
}

type Check = std::result::Result<(), Violation>;

fn violation(invariant: &'static str, scope: Option<&Scope>, detail: String) -> Check {
    Err(Violation {
        invariant,
        detail,
        scope: scope.cloned(),
    })
}

/// Writes the sink accepted (applied or duplicate), in the order it decided them.
fn accepted(
    history: &[Event],
) -> impl Iterator<Item = (&Scope, FencingToken, LeaseId, &str, bool)> {
    history.iter().filter_map(|e| match e {
        Event::Write {
            scope,
            token,
            lease,
            key,
            outcome: Ok(a @ (Admission::Applied | Admission::Duplicate)),
            ..
        } => Some((
            scope,
            *token,
            *lease,
            key.as_str(),
            *a == Admission::Applied,
        )),
        _ => None,
    })
}

/// Invariants 1 and 8: once a write with token T passed a scope's ownership checks —
/// accepted, or refused only for its content — nothing below T is accepted for it.
fn no_stale_write(history: &[Event]) -> Check {
    let mut highest: HashMap<&Scope, (FencingToken, &str)> = HashMap::new();
    for e in history {
        let Event::Write {
            scope,
            token,
            key,
            outcome: Ok(admission),
            ..
        } = e
        else {
            continue;
        };
        let accepted = matches!(admission, Admission::Applied | Admission::Duplicate);
        let owned =
            accepted || matches!(admission, Admission::Rejected(Rejection::Mutation { .. }));
        if !owned {
            continue;
        }
        let h = highest.entry(scope).or_insert((*token, key));
        if accepted && *token < h.0 {
            return violation(
                "no_stale_write",
                Some(scope),
                format!(
                    "{key}: token {token} accepted after {} passed with {}",
                    h.1, h.0
                ),
            );
        }
        if *token > h.0 {
            *h = (*token, key);
        }
    }
    Ok(())
}

/// Invariant 2: one token, one lease — a sink never accepts a token from two leases.
fn one_token_one_lease(history: &[Event]) -> Check {
    let mut holder: HashMap<(&Scope, FencingToken), LeaseId> = HashMap::new();
    for (scope, token, lease, key, _) in accepted(history) {
        if *holder.entry((scope, token)).or_insert(lease) != lease {
            return violation(
                "one_token_one_lease",
                Some(scope),
                format!("{key}: token {token} accepted from two leases"),
            );
        }
    }
    Ok(())
}

/// Invariant 3: at the coordinator, a claim of a scope never overlaps another live lease of
/// it (live: claimed, not ended, not past its latest expiry). Per coordinator incarnation.
/// `slack`: how much earlier than the recorded expiry the coordinator may consider a lease
/// expired (zero in virtual time; Redis keeps milliseconds).
fn one_live_lease_per_scope(history: &[Event], slack: Duration) -> Check {
    let mut live: BTreeMap<LeaseId, (Scope, Duration)> = BTreeMap::new();
    for e in history {
        match e {
            Event::StateLoss { .. } => live.clear(),
            Event::Claimed {
                at,
                lease,
                scope,
                expires,
                token,
                ..
            } => {
                if let Some((other, (_, until))) = live
                    .iter()
                    .find(|(_, (s, until))| s == scope && *until > *at + slack)
                {
                    return violation(
                        "one_live_lease_per_scope",
                        Some(scope),
                        format!("token {token} granted at {at:?} while lease {other} was live until {until:?}"),
                    );
                }
                live.insert(*lease, (scope.clone(), *expires));
            }
            Event::Renewed { lease, expires, .. } => {
                if let Some((_, until)) = live.get_mut(lease) {
                    *until = (*until).max(*expires);
                }
            }
            Event::Ended { lease, how, .. } if *how != "refused" => {
                live.remove(lease);
            }
            _ => {}
        }
    }
    Ok(())
}

/// Invariant 4: a settlement the coordinator accepted came from a live lease — never from
/// one that had expired, ended, or belongs to a coordinator that lost its state.
fn stale_lease_is_powerless(history: &[Event], slack: Duration) -> Check {
    let mut live: BTreeMap<LeaseId, Duration> = BTreeMap::new();
    for e in history {
        match e {
            Event::StateLoss { .. } => live.clear(),
            Event::Claimed { lease, expires, .. } => {
                live.insert(*lease, *expires);
            }
            Event::Renewed { lease, expires, .. } => {
                if let Some(until) = live.get_mut(lease) {
                    *until = (*until).max(*expires);
                }
            }
            Event::Ended { at, lease, how } => {
                let until = live.remove(lease);
                let accepted = !matches!(*how, "refused" | "lost");
                if accepted && until.is_none_or(|until| until + slack <= *at) {
                    return violation(
                        "stale_lease_is_powerless",
                        None,
                        format!("lease {lease} settled ({how}) at {at:?}, live until {until:?}"),
                    );
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Invariant 5: a (scope, key) applies at most once.
fn at_most_once_per_key(history: &[Event]) -> Check {
    let mut applied: BTreeSet<(&Scope, &str)> = BTreeSet::new();
    for (scope, _, _, key, was_applied) in accepted(history) {
        if was_applied && !applied.insert((scope, key)) {
            return violation(
                "at_most_once_per_key",
                Some(scope),
                format!("{key} applied twice"),
            );
        }
    }
    Ok(())
}

/// Invariant 6: every job ends completed or dead (with its reason), and every completed
/// job's writes are each applied exactly once.
fn no_lost_job(world: &World) -> Check {
    for (l, job) in world.logical.iter().enumerate() {
        let scope = Scope::new(job.scope.as_str());
        match job.done {
            None => {
                return violation(
                    "no_lost_job",
                    Some(&scope),
                    format!("job L{l} never finished"),
                )
            }
            Some(true) => {
                for w in 0..job.writes.len() {
                    let key = format!("L{l}/{w}");
                    let n = accepted(&world.history)
                        .filter(|(s, _, _, k, a)| **s == scope && *k == key && *a)
                        .count();
                    if n != 1 {
                        return violation(
                            "no_lost_job",
                            Some(&scope),
                            format!("completed job's write {key} applied {n} times"),
                        );
                    }
                }
            }
            Some(false) => {}
        }
    }
    Ok(())
}

/// Invariant 7: after the coordinator lost its state and found its epoch again, every token
/// it grants is above every token a sink accepted before.
fn monotonic_tokens(history: &[Event]) -> Check {
    let mut accepted_max = None::<FencingToken>;
    let mut floor = None::<FencingToken>;
    for e in history {
        match e {
            Event::Write {
                token,
                outcome: Ok(Admission::Applied | Admission::Duplicate),
                ..
            } => {
                accepted_max = accepted_max.max(Some(*token));
            }
            Event::StateLoss { epoch: Some(_) } => floor = accepted_max,
            Event::StateLoss { epoch: None } => floor = None,
            Event::Claimed { token, scope, .. } => {
                if let Some(f) = floor.filter(|f| token <= f) {
                    return violation(
                        "monotonic_tokens",
                        Some(scope),
                        format!("token {token} granted after recovery, not above {f}"),
                    );
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The checker's own model of stored data: mutations applied whole or refused, from the
/// description in ARCHITECTURE.md §4 (not the library's code).
fn model_apply(data: &mut BTreeMap<String, Value>, mutations: &[Mutation]) -> bool {
    let mut next = data.clone();
    for m in mutations {
        match m {
            Mutation::Delete { key } => {
                next.remove(key);
            }
            Mutation::Set { key, value } => match next.get(key) {
                Some(Value::Hash(_)) => return false,
                _ => {
                    next.insert(key.clone(), Value::Text(value.clone()));
                }
            },
            Mutation::HashSet { key, fields } => {
                if fields.is_empty() {
                    return false;
                }
                let Value::Hash(h) = next
                    .entry(key.clone())
                    .or_insert_with(|| Value::Hash(Default::default()))
                else {
                    return false;
                };
                h.extend(fields.iter().cloned());
            }
            Mutation::HashIncr { key, field, by } => {
                let Value::Hash(h) = next
                    .entry(key.clone())
                    .or_insert_with(|| Value::Hash(Default::default()))
                else {
                    return false;
                };
                let current = match h.get(field) {
                    None => 0,
                    Some(v) => match redis_integer(v) {
                        Some(n) => n,
                        None => return false,
                    },
                };
                let Some(sum) = current.checked_add(*by) else {
                    return false;
                };
                h.insert(field.clone(), sum.to_string());
            }
        }
    }
    *data = next;
    true
}

/// Invariant 8: every applied write applied whole, every refused one not at all — the sink's
/// final data equals the model replaying exactly the applied writes.
async fn all_or_nothing(world: &World) -> Check {
    if let Some(Event::Write { scope, key, .. }) = world.history.iter().find(|e| {
        matches!(
            e,
            Event::Write {
                fence_moved: true,
                ..
            }
        )
    }) {
        return violation(
            "all_or_nothing",
            Some(scope),
            format!("{key} was refused but moved the fence"),
        );
    }
    let mut model = BTreeMap::new();
    let mut keys = BTreeSet::new();
    for e in &world.history {
        if let Event::Write {
            mutations,
            outcome,
            scope,
            key,
            ..
        } = e
        {
            for m in mutations {
                keys.insert(m.key().to_owned());
            }
            let fits = model.clone();
            let mut probe = fits.clone();
            let whole = model_apply(&mut probe, mutations);
            match outcome {
                Ok(Admission::Applied) if !whole => {
                    return violation(
                        "all_or_nothing",
                        Some(scope),
                        format!("{key} applied although its list does not fit"),
                    );
                }
                Ok(Admission::Applied) => model = probe,
                Ok(Admission::Rejected(Rejection::Mutation { why })) if whole => {
                    return violation(
                        "all_or_nothing",
                        Some(scope),
                        format!("{key} refused ({why}) although its list fits"),
                    );
                }
                _ => {}
            }
        }
    }
    for key in keys {
        let stored = world.sink.read(&key).await.map_err(|e| Violation {
            invariant: "all_or_nothing",
            detail: format!("read {key}: {e}"),
            scope: None,
        })?;
        if stored != model.get(&key).cloned() {
            return violation(
                "all_or_nothing",
                None,
                format!(
                    "{key}: sink holds {stored:?}, the applied writes make {:?}",
                    model.get(&key)
                ),
            );
        }
    }
    Ok(())
}

async fn check(world: &World) -> Check {
    let h = &world.history;
    no_stale_write(h)?;
    one_token_one_lease(h)?;
    one_live_lease_per_scope(h, world.slack)?;
    stale_lease_is_powerless(h, world.slack)?;
    at_most_once_per_key(h)?;
    monotonic_tokens(h)?;
    no_lost_job(world)?;
    all_or_nothing(world).await
}

/// The seed, the invariant, and the history slice of the scope involved (or the tail).
fn report(seed: u64, world: &World, v: &Violation) -> String {
    let mut out = format!(
        "seed {seed}: {} violated: {}\nreplay: PALISADE_SIM_SEED={seed} cargo test -p palisade --test simulation\n",
        v.invariant, v.detail
    );
    let touches = |e: &Event| match (e, &v.scope) {
        (Event::Claimed { scope, .. } | Event::Write { scope, .. }, Some(s)) => scope == s,
        (Event::StateLoss { .. }, _) => true,
        (_, None) => true,
        _ => false,
    };
    let slice: Vec<&Event> = world.history.iter().filter(|e| touches(e)).collect();
    for e in &slice[slice.len().saturating_sub(40)..] {
        let _ = writeln!(out, "  {e:?}");
    }
    out
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn seeded_fault_schedules_keep_every_invariant() {
    let (first, seeds) = match env_u64("PALISADE_SIM_SEED") {
        Some(seed) => (seed, 1),
        None => (
            env_u64("PALISADE_SIM_FIRST_SEED").unwrap_or(0),
            env_u64("PALISADE_SIM_SEEDS").unwrap_or(2_000),
        ),
    };
    let mut stats = [0usize; 3];
    for seed in first..first + seeds {
        let rt = paused_runtime();
        let outcome = rt.block_on(async {
            let mut world = World::new(
                seed,
                Backend::Memory,
                Arc::new(Flaky::new(MemoryFencedStore::new())),
                Duration::from_millis(100),
            );
            world.run(300).await;
            let counts = (
                world
                    .history
                    .iter()
                    .filter(|e| {
                        matches!(
                            e,
                            Event::Write {
                                outcome: Ok(Admission::Rejected(Rejection::StaleToken { .. })),
                                ..
                            }
                        )
                    })
                    .count(),
                world
                    .history
                    .iter()
                    .filter(|e| matches!(e, Event::Fault(_)))
                    .count(),
                world
                    .history
                    .iter()
                    .filter(|e| matches!(e, Event::StateLoss { .. }))
                    .count(),
            );
            check(&world)
                .await
                .map_err(|v| report(seed, &world, &v))
                .map(|_| counts)
        });
        match outcome {
            Ok((stale, faults, losses)) => {
                stats[0] += stale;
                stats[1] += faults;
                stats[2] += losses;
            }
            Err(report) => panic!("{report}"),
        }
    }
    println!(
        "{seeds} seeds: {} stale writes refused, {} faults injected, {} coordinator state losses",
        stats[0], stats[1], stats[2]
    );
    if seeds >= 100 {
        assert!(
            stats[0] > seeds as usize / 10,
            "the schedules hardly ever produced a stale write"
        );
        assert!(stats[2] > 0, "no state loss was ever injected");
    }
}

#[test]
fn a_seed_replays_exactly() {
    let trace = |seed| {
        paused_runtime().block_on(async {
            let mut world = World::new(
                seed,
                Backend::Memory,
                Arc::new(MemoryFencedStore::new()),
                Duration::from_millis(100),
            );
            world.run(300).await;
            // Ids are random by design; everything else must repeat.
            world
                .history
                .iter()
                .map(|e| match e {
                    Event::Write {
                        worker,
                        token,
                        scope,
                        key,
                        outcome,
                        ..
                    } => {
                        let outcome = match outcome {
                            Ok(Admission::Rejected(r)) => {
                                format!("{} {:?}", r.reason(), r.highest())
                            }
                            other => format!("{other:?}"),
                        };
                        format!("W{worker} {token} {scope} {key} {outcome}")
                    }
                    Event::Claimed {
                        at,
                        worker,
                        logical,
                        token,
                        ..
                    } => format!("C{worker} {at:?} L{logical} {token}"),
                    Event::Ended { at, how, .. } => format!("E {at:?} {how}"),
                    Event::Renewed { at, .. } => format!("R {at:?}"),
                    Event::Fault(f) if f.starts_with("reaped") => "reaped".to_owned(),
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
        })
    };
    for seed in [7, 1234] {
        let (a, b) = (trace(seed), trace(seed));
        if let Some(i) = (0..a.len().min(b.len())).find(|&i| a[i] != b[i]) {
            panic!(
                "seed {seed} did not replay at step {i}: {:?} vs {:?}",
                &a[i.saturating_sub(3)..=i],
                &b[i.saturating_sub(3)..=i]
            );
        }
        assert_eq!(a.len(), b.len(), "seed {seed} did not replay");
    }
}

// ---------------------------------------------------------------------------------------------
// Planted bugs: the checkers must catch them.
// ---------------------------------------------------------------------------------------------

/// A correct sink that fails every 23rd call before doing anything (an unreachable
/// backend), deterministically: handlers then settle `Retry`, which hands the scope's turn to
/// its next job.
struct Flaky<S> {
    inner: S,
    calls: std::sync::atomic::AtomicU64,
}

impl<S> Flaky<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            calls: Default::default(),
        }
    }
}

#[async_trait]
impl<S: FencedStore> FencedStore for Flaky<S> {
    async fn write(&self, w: FencedWrite) -> Result<Admission> {
        if self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % 23
            == 22
        {
            return Err(Error::Unavailable("sink unreachable (simulated)".into()));
        }
        self.inner.write(w).await
    }
    fn observe_watermark(&self, w: FencingToken) {
        self.inner.observe_watermark(w)
    }
    async fn read(&self, key: &str) -> Result<Option<Value>> {
        self.inner.read(key).await
    }
    async fn highest(&self, scope: &Scope) -> Result<Option<Fence>> {
        self.inner.highest(scope).await
    }
}

/// A sink that decides with the library's [`ScopeFence`] but breaks the rule one way.
#[derive(Clone, Copy, Default, PartialEq)]
enum FenceBug {
    /// Forgets fences below the watermark (as it may) but then decides without the
    /// watermark (as it must not) — the proof in the `admission` module docs, broken.
    #[default]
    Forgetful,
    /// A write refused for its content leaves the fence where it was (the rule before
    /// invariant 8), so an older holder writing after a newer one's refused write applies.
    Stuck,
}

#[derive(Default)]
struct PlantedFence {
    bug: FenceBug,
    fences: Mutex<HashMap<Scope, ScopeFence>>,
    watermark: Mutex<FencingToken>,
    data: Mutex<BTreeMap<String, Value>>,
}

impl PlantedFence {
    fn new(bug: FenceBug) -> Self {
        Self {
            bug,
            ..Self::default()
        }
    }
}

#[async_trait]
impl FencedStore for PlantedFence {
    async fn write(&self, w: FencedWrite) -> Result<Admission> {
        let mut watermark = *self.watermark.lock().unwrap();
        let mut fences = self.fences.lock().unwrap();
        if self.bug == FenceBug::Forgetful {
            for fence in fences.values_mut() {
                fence.collect(watermark);
            }
            watermark = FencingToken::ZERO;
        }
        let fence = fences.entry(w.scope.clone()).or_default();
        let decided = fence.decide(w.fence, &w.key, watermark);
        if decided == Admission::Applied
            && !model_apply(&mut self.data.lock().unwrap(), &w.mutations)
        {
            if self.bug != FenceBug::Stuck {
                fence.refuse_content(w.fence);
            }
            return Ok(Admission::Rejected(Rejection::Mutation {
                why: "does not fit".into(),
            }));
        }
        Ok(fence.admit(w.fence, &w.key, watermark))
    }
    fn observe_watermark(&self, w: FencingToken) {
        let mut mine = self.watermark.lock().unwrap();
        *mine = (*mine).max(w);
    }
    async fn read(&self, key: &str) -> Result<Option<Value>> {
        Ok(self.data.lock().unwrap().get(key).cloned())
    }
    async fn highest(&self, scope: &Scope) -> Result<Option<Fence>> {
        Ok(self
            .fences
            .lock()
            .unwrap()
            .get(scope)
            .and_then(|f| f.highest))
    }
}

/// A sink with "a lease check instead of a fence": it dedupes by key and applies whole, but
/// never compares tokens.
#[derive(Default)]
struct NoFence {
    data: Mutex<(BTreeMap<String, Value>, AppliedKeys)>,
}

type AppliedKeys = BTreeSet<(Scope, String)>;

/// A sink that fences correctly but applies a mutation list step by step, leaving the steps
/// before a failing one applied (the bug issue 7 found in the Lua script).
struct HalfApply {
    fences: Mutex<HashMap<Scope, ScopeFence>>,
    data: Mutex<BTreeMap<String, Value>>,
}

#[async_trait]
impl FencedStore for NoFence {
    async fn write(&self, w: FencedWrite) -> Result<Admission> {
        let mut state = self.data.lock().unwrap();
        if !state.1.insert((w.scope.clone(), w.key.as_str().to_owned())) {
            return Ok(Admission::Duplicate);
        }
        if !model_apply(&mut state.0, &w.mutations) {
            state.1.remove(&(w.scope, w.key.as_str().to_owned()));
            return Ok(Admission::Rejected(Rejection::Mutation {
                why: "does not fit".into(),
            }));
        }
        Ok(Admission::Applied)
    }
    async fn read(&self, key: &str) -> Result<Option<Value>> {
        Ok(self.data.lock().unwrap().0.get(key).cloned())
    }
    async fn highest(&self, _: &Scope) -> Result<Option<Fence>> {
        Ok(None)
    }
}

#[async_trait]
impl FencedStore for HalfApply {
    async fn write(&self, w: FencedWrite) -> Result<Admission> {
        let mut fences = self.fences.lock().unwrap();
        let fence = fences.entry(w.scope.clone()).or_default();
        if let Admission::Rejected(r) = fence.decide(w.fence, &w.key, FencingToken::ZERO) {
            return Ok(Admission::Rejected(r));
        }
        let mut data = self.data.lock().unwrap();
        for m in &w.mutations {
            if !model_apply(&mut data, std::slice::from_ref(m)) {
                return Ok(Admission::Rejected(Rejection::Mutation {
                    why: "step failed".into(),
                }));
            }
        }
        Ok(fence.admit(w.fence, &w.key, FencingToken::ZERO))
    }
    async fn read(&self, key: &str) -> Result<Option<Value>> {
        Ok(self.data.lock().unwrap().get(key).cloned())
    }
    async fn highest(&self, scope: &Scope) -> Result<Option<Fence>> {
        Ok(self
            .fences
            .lock()
            .unwrap()
            .get(scope)
            .and_then(|f| f.highest))
    }
}

#[test]
fn planted_bugs_are_caught() {
    let mut caught: BTreeMap<&str, Vec<&'static str>> = BTreeMap::new();
    for seed in 0..60 {
        for (name, sink) in [
            (
                "no fence",
                Arc::new(NoFence::default()) as Arc<dyn FencedStore>,
            ),
            (
                "half apply",
                Arc::new(HalfApply {
                    fences: Mutex::default(),
                    data: Mutex::default(),
                }),
            ),
            (
                "forgetful fence",
                Arc::new(PlantedFence::new(FenceBug::Forgetful)),
            ),
            ("stuck fence", Arc::new(PlantedFence::new(FenceBug::Stuck))),
        ] {
            let rt = paused_runtime();
            let found = rt.block_on(async {
                let mut world = World::new(seed, Backend::Memory, sink, Duration::from_millis(100));
                world.run(300).await;
                check(&world).await.err().map(|v| v.invariant)
            });
            if let Some(invariant) = found {
                caught.entry(name).or_default().push(invariant);
            }
        }
    }
    let no_fence = caught.get("no fence").cloned().unwrap_or_default();
    let half = caught.get("half apply").cloned().unwrap_or_default();
    assert!(
        no_fence.contains(&"no_stale_write"),
        "the dropped fence went unnoticed: {no_fence:?}"
    );
    let forgetful = caught.get("forgetful fence").cloned().unwrap_or_default();
    assert!(
        forgetful.contains(&"no_stale_write"),
        "the watermark-less collection went unnoticed: {forgetful:?}"
    );
    let stuck = caught.get("stuck fence").cloned().unwrap_or_default();
    assert!(
        stuck.contains(&"no_stale_write"),
        "the fence left behind by a content refusal went unnoticed: {stuck:?}"
    );
    assert!(
        half.contains(&"all_or_nothing"),
        "the half-applied write went unnoticed: {half:?}"
    );
}

/// The same world against the real scripts: a private Redis for the coordinator and the
/// sink, real time (leases of 150 ms), fewer seeds, no state loss (the recovery tests cover
/// Redis losing data).
#[test]
fn the_simulated_world_drives_the_redis_scripts() {
    let server = palisade_testkit::RedisServer::start();
    let pool = palisade::store::redis::pool(&server.url()).unwrap();
    let seeds = env_u64("PALISADE_SIM_REDIS_SEEDS").unwrap_or(6);
    for seed in 0..seeds {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let outcome = rt.block_on(async {
            let sink = Arc::new(RedisFencedStore::new(
                pool.clone(),
                &format!("simsink-{seed}-{}", uuid::Uuid::new_v4()),
            ));
            let mut world = World::new(
                seed,
                Backend::Redis(pool.clone()),
                sink,
                Duration::from_millis(150),
            );
            world.run(200).await;
            check(&world).await.map_err(|v| report(seed, &world, &v))
        });
        if let Err(report) = outcome {
            panic!("{report}");
        }
    }
}
