//! `palisade-soak soak`: a chaos soak with real processes and an offline history checker. Its
//! own crate and binary (never shipped): the `palisade` sample binary has no soak, no
//! `soak.post` kind, no `books` sink and no planted-bug switch.
//!
//! K `palisade-soak worker` processes (this binary: `palisade_cli::App` over the sample jobs
//! and `soak.post`, the user's path) run
//! `soak.post` jobs against a private Redis coordinator (AOF), a Redis sink and a Postgres
//! sink with the outbox (each worker also relays it to a local HTTP receiver that fails now
//! and then). A producer enqueues jobs on a few hot scopes (contention) and many cold ones.
//! A seeded nemesis meanwhile SIGSTOPs workers past their lease, kill -9s and restarts them,
//! restarts Redis (clean shutdown, AOF), SIGSTOPs Redis shorter and longer than the lease,
//! and wipes the coordinator (every coordinator key deleted at once, the epoch path; the
//! workers keep their epochs in Postgres, `--epoch-postgres`). Each worker reaches Redis and
//! Postgres through its own fault proxy (`palisade_testkit::FaultProxy`, seeded from the
//! run's seed), and the nemesis also partitions a worker from both past its lease, makes its
//! links lossy for a while (latency, jitter, drops, replies cut half-way), cuts the next
//! replies it gets after Redis acted, and steps the Redis host's clock ahead (past every live
//! lease), behind and back (libfaketime, `palisade_testkit::SkewedClock`).
//! Then the faults stop, the work drains, and the checker reads the evidence: the Postgres
//! ledger (one row per applied posting, serial taken under the fence lock), the Redis sink's
//! balances, the receiver's deliveries, every worker's log of write attempts and the
//! coordinator's counts.
//!
//! A wipe loses the coordinator's jobs: postings acknowledged before a wipe and never applied
//! are counted as lost *with the wipe* (the operator's loss, reported, not a violation), and
//! one whose Redis credit landed before its job vanished explains exactly its cents of the
//! difference between the sinks. Which credits landed, and how often, the checker reads from
//! the sink itself: each credit records its posting's cents in the account's hash in the same
//! write, so neither a lost reply nor a kill -9 between send and log can hide one. Everything else is checked as strictly as without wipes, and
//! a holder from before a wipe must still be refused after it.
//!
//! Not injected: kill -9 of Redis (AOF `everysec` may lose the last second, which is Redis'
//! durability setting, not ours).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use palisade::{Admission, Client, FencedStore, JobContext, JobError, Mutation, NewJob};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use palisade_jobs::{account_key, LEDGER};
use palisade_testkit::{FaultProxy, LinkFaults, SkewedClock};

/// Kind name of [`post`].
pub const POST: &str = "soak.post";
/// The Postgres sink `soak.post` writes its ledger rows to.
pub const BOOKS: &str = "books";

/// The fault that deletes the coordinator's keys.
const WIPE: &str = "coordinator wipe";

/// `soak.post` payload.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Post {
    /// The producer's sequence number: names the posting in every piece of evidence.
    pub nonce: u64,
    /// Account; the job's scope is `account:{account}`.
    pub account: u32,
    /// Amount.
    pub cents: i64,
    /// Work this long before writing (a pause or kill can land in between).
    pub hold_ms: u64,
    /// The credit carries a mutation list that does not fit (a type clash after a good
    /// step): the sink must refuse it whole, and the job dies with the reason.
    #[serde(default)]
    pub poison: bool,
}

/// One write attempt as a handler logged it (`PALISADE_SOAK_LOG`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Attempt {
    /// `ledger` (Redis) or `books` (Postgres).
    pub sink: String,
    /// The posting's nonce.
    #[serde(default)]
    pub nonce: u64,
    /// Scope written.
    pub scope: String,
    /// Token presented.
    pub token: u64,
    /// Lease presented.
    pub lease: String,
    /// Idempotency key.
    pub key: String,
    /// `applied`, `duplicate`, a rejection reason, or `error`.
    pub outcome: String,
    /// When the write was sent and when its answer came (µs since the Unix epoch; all
    /// processes run on one machine, one clock).
    pub sent_us: u64,
    /// See `sent_us`.
    pub answered_us: u64,
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn log_attempt(
    ctx: &JobContext,
    nonce: u64,
    sink: &str,
    key: &str,
    sent_us: u64,
    outcome: &palisade::Result<Admission>,
) {
    let Ok(path) = std::env::var("PALISADE_SOAK_LOG") else {
        return;
    };
    let outcome = match outcome {
        Ok(Admission::Applied) => "applied".to_owned(),
        Ok(Admission::Duplicate) => "duplicate".to_owned(),
        Ok(Admission::Rejected(r)) => r.reason().to_owned(),
        Err(_) => "error".to_owned(),
    };
    let attempt = Attempt {
        sink: sink.to_owned(),
        nonce,
        scope: ctx.lease().scope.to_string(),
        token: ctx.lease().token.as_u64(),
        lease: ctx.lease().id.to_string(),
        key: key.to_owned(),
        outcome,
        sent_us,
        answered_us: now_us(),
    };
    let mut line = serde_json::to_string(&attempt).expect("an Attempt is JSON");
    line.push('\n');
    // One append per line: lines of concurrent processes never interleave.
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = file.write_all(line.as_bytes());
    }
}

/// `soak.post`, in three fenced steps, each logged:
/// 1. a *beat* per run — keyed by the run's token, so a paused holder's beat is a new write,
///    not a duplicate: only the fence stands between it and the data (Redis counter and a
///    Postgres `soak_beats` row, whose commit order the checker reads);
/// 2. the credit in the Redis sink, keyed by job (a `poison` posting's list does not fit and
///    must be refused whole);
/// 3. the posting in the Postgres ledger with a receipt in the outbox, keyed by job.
pub async fn post(ctx: JobContext, p: Post) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(p.hold_ms)).await;
    let (job, token) = (ctx.job().id, ctx.lease().token.as_u64());
    let scope = ctx.lease().scope.to_string();
    let books = ctx.postgres(BOOKS).ok();
    let plant = Plant::from_env();
    if plant == Some(Plant::Stale) {
        unfenced_beat(&scope, token).await?;
    }

    let beat_key = format!("{job}/beat-{token}");
    let beat = vec![Mutation::HashIncr {
        key: format!("beats:{}", p.account),
        field: "n".into(),
        by: 1,
    }];
    let sent = now_us();
    let written = ctx
        .sink(LEDGER)?
        .write_keyed(palisade::IdempotencyKey::new(beat_key.as_str()), beat)
        .await;
    log_attempt(&ctx, p.nonce, LEDGER, &beat_key, sent, &written);
    written?.accepted()?;
    if let Some(books) = &books {
        let scope = scope.clone();
        let sent = now_us();
        let beat = books
            .transaction(&format!("beat-{token}"), move |tx| {
                Box::pin(async move {
                    tx.execute(
                        "INSERT INTO soak_beats (scope, token) VALUES ($1, $2)",
                        &[&scope, &(token as i64)],
                    )
                    .await?;
                    Ok(())
                })
            })
            .await;
        log_outcome(
            &ctx,
            p.nonce,
            &format!("{job}/tx/beat-{token}"),
            sent,
            &beat,
        );
        beat?.accepted()?;
    }

    let key = format!("{job}/credit");
    if plant == Some(Plant::Half) && p.poison {
        // The bug: the list split in two writes, so the good first step stays when the
        // second is refused.
        let first = vec![Mutation::HashIncr {
            key: account_key(p.account),
            field: "balance".into(),
            by: p.cents,
        }];
        let key = palisade::IdempotencyKey::new(format!("{job}/credit-half"));
        ctx.sink(LEDGER)?.write_keyed(key, first).await?;
    }
    // The credit also records its posting's cents under the posting, in the same hash and
    // the same write: the checker reads from the sink itself which postings the balance
    // holds, and how often, whatever a lost reply or a kill -9 kept out of the log.
    let mut credit = vec![
        Mutation::HashIncr {
            key: account_key(p.account),
            field: "balance".into(),
            by: p.cents,
        },
        Mutation::HashIncr {
            key: account_key(p.account),
            field: credit_field(p.nonce),
            by: p.cents,
        },
    ];
    if p.poison {
        credit.push(Mutation::Set {
            key: account_key(p.account),
            value: "not a hash".into(),
        });
    }
    let sent = now_us();
    let written = ctx
        .sink(LEDGER)?
        .write_keyed(palisade::IdempotencyKey::new(key.as_str()), credit)
        .await;
    log_attempt(&ctx, p.nonce, LEDGER, &key, sent, &written);
    written?.accepted()?;

    let Some(books) = books else {
        return Ok(()); // no Postgres sink configured: the Redis half only
    };
    let sent = now_us();
    let posted = books
        .transaction("post", move |tx| {
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO soak_ledger (nonce, scope, token, cents) VALUES ($1, $2, $3, $4)",
                    &[&(p.nonce as i64), &scope, &(token as i64), &p.cents],
                )
                .await?;
                tx.outbox("receipt").push("r", &p.nonce).await?;
                Ok(())
            })
        })
        .await;
    log_outcome(&ctx, p.nonce, &format!("{job}/tx/post"), sent, &posted);
    posted?.accepted()?;
    Ok(())
}

/// The field of an account's hash that records the cents posting `nonce` credited.
fn credit_field(nonce: u64) -> String {
    format!("posting:{nonce}")
}

/// A bug planted on purpose (`palisade-soak soak --plant`), to show the checker catches it in a
/// live run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Plant {
    /// Each run's beat also goes into the Postgres beats table around the fence (a plain
    /// INSERT): a paused holder's beat lands after its successor's.
    Stale,
    /// A poison posting's credit is sent as two writes: the good step is applied, the bad one
    /// refused — half a posting.
    Half,
}

impl Plant {
    const ENV: &'static str = "PALISADE_SOAK_PLANT";

    fn from_env() -> Option<Self> {
        match std::env::var(Self::ENV).ok()?.as_str() {
            "stale" => Some(Self::Stale),
            "half" => Some(Self::Half),
            _ => None,
        }
    }
}

/// The planted stale write: a beat row written with no fence at all.
async fn unfenced_beat(scope: &str, token: u64) -> Result<(), JobError> {
    static PLAIN: tokio::sync::OnceCell<palisade::PostgresSink> =
        tokio::sync::OnceCell::const_new();
    let sink = PLAIN
        .get_or_try_init(|| async {
            let url = std::env::var("PALISADE_SOAK_PLANT_URL").unwrap_or_default();
            palisade::PostgresSink::connect(&url).await
        })
        .await?;
    let client = sink
        .pool()
        .get()
        .await
        .map_err(|e| JobError::retry(e.to_string()))?;
    client
        .execute(
            "INSERT INTO soak_beats (scope, token) VALUES ($1, $2)",
            &[&scope, &(token as i64)],
        )
        .await
        .map_err(|e| JobError::retry(e.to_string()))?;
    Ok(())
}

fn log_outcome(
    ctx: &JobContext,
    nonce: u64,
    key: &str,
    sent: u64,
    outcome: &palisade::Result<palisade::Fenced<()>>,
) {
    let outcome = outcome
        .as_ref()
        .map(palisade::Fenced::admission)
        .map_err(|e| {
            palisade::Error::Backend(e.to_string()) // for the log line only
        });
    log_attempt(ctx, nonce, BOOKS, key, sent, &outcome);
}

/// `palisade-soak soak` flags.
#[derive(Clone, Debug, clap::Args)]
pub struct SoakArgs {
    /// How long faults are injected (then the work drains and the checker runs).
    #[arg(long, default_value_t = 2.0)]
    pub minutes: f64,
    /// Nemesis and workload seed (printed; a run with the same seed injects the same kinds
    /// of faults in the same order, though real processes never replay exactly).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Jobs enqueued per second.
    #[arg(long, default_value_t = 40)]
    pub rate: u32,
    /// PostgreSQL for the ledger and the outbox (a fresh schema, dropped afterwards).
    #[arg(
        long,
        env = "PALISADE_TEST_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    pub postgres: String,
    /// Connections each process's Postgres books sink may hold (its `pool_size`). A soak holds
    /// about (this + 2) per worker: the test suite's three soaks at once pass 4, to stay well
    /// inside Postgres's default 100 connections (at 8 they peaked at 91).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub books_pool: u16,
    /// Lease of the workers.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// Plant a bug in the workload (the checker must then fail the run): `stale` writes the
    /// Postgres beats around the fence, `half` splits poison postings in two writes.
    #[arg(long, value_enum)]
    pub plant: Option<Plant>,
}

/// Everything the checker reads.
#[derive(Debug, Default)]
pub struct Evidence {
    /// Postings the producer saw acknowledged: nonce → (account, cents).
    pub acked: BTreeMap<u64, (u32, i64)>,
    /// Ledger rows in commit order (serial taken under the fence lock): (nonce, scope,
    /// token, cents).
    pub ledger: Vec<(u64, String, u64, i64)>,
    /// Beat rows in commit order: (scope, token).
    pub beats: Vec<(String, u64)>,
    /// Every posting the producer made, acknowledged or not: nonce → (account, cents).
    pub produced: BTreeMap<u64, (u32, i64)>,
    /// Postings made as poison, acknowledged or not (their credit must be refused whole).
    pub poison: std::collections::BTreeSet<u64>,
    /// Postings the coordinator holds as dead after the drain, with the reason.
    pub dead_nonces: BTreeMap<u64, String>,
    /// Redis sink balances by account.
    pub balances: BTreeMap<u32, i64>,
    /// The Redis sink's record of credits: nonce → (account, cents credited, summed over
    /// every time the credit was applied).
    pub credits: BTreeMap<u64, (u32, i64)>,
    /// Receipts the receiver accepted, by nonce.
    pub deliveries: BTreeMap<u64, u32>,
    /// Every logged write attempt.
    pub attempts: Vec<Attempt>,
    /// Jobs still pending and dead at the coordinator after the drain.
    pub pending: u64,
    /// Dead jobs.
    pub dead: u64,
    /// Outbox entries not delivered after the drain (pending or dead).
    pub undelivered: u64,
    /// The highest nonce acknowledged before the last coordinator wipe (0: no wipe).
    pub wiped_through: u64,
}

impl Evidence {
    /// Acknowledged postings a wipe took: acknowledged before the last wipe, never applied.
    pub fn lost_with_wipe(&self) -> Vec<u64> {
        let applied: std::collections::BTreeSet<u64> =
            self.ledger.iter().map(|(n, ..)| *n).collect();
        self.acked
            .range(..=self.wiped_through)
            .map(|(n, _)| *n)
            .filter(|n| !applied.contains(n) && !self.dead_nonces.contains_key(n))
            .collect()
    }
}

/// The checker: every violation it finds, one line each (empty: all invariants hold).
pub fn check(e: &Evidence) -> Vec<String> {
    let mut violations = Vec::new();
    // No stale write, as the sinks' commit order shows it: a scope's tokens never go down in
    // the ledger or in the beats (a paused holder's beat is a new write, not a duplicate).
    for (what, rows) in [
        (
            "ledger",
            e.ledger
                .iter()
                .map(|(n, s, t, _)| (Some(*n), s.as_str(), *t))
                .collect::<Vec<_>>(),
        ),
        (
            "beats",
            e.beats
                .iter()
                .map(|(s, t)| (None, s.as_str(), *t))
                .collect(),
        ),
    ] {
        let mut highest: HashMap<&str, u64> = HashMap::new();
        for (nonce, scope, token) in rows {
            let h = highest.entry(scope).or_insert(token);
            if token < *h {
                violations.push(format!(
                    "no_stale_write: {what} row {nonce:?} on {scope} with token {token} committed after {h}"
                ));
            }
            *h = (*h).max(token);
        }
    }
    // No stale write, as the handlers saw it, per sink: a write accepted with a token below
    // one the same sink had accepted for the scope before this write was even sent.
    violations.extend(stale_by_time(&e.attempts));
    // At most once per key: one ledger row per posting.
    let mut rows: BTreeMap<u64, (u32, i64)> = BTreeMap::new();
    for (nonce, scope, _, cents) in &e.ledger {
        let account = scope
            .trim_start_matches("account:")
            .parse()
            .unwrap_or(u32::MAX);
        if rows.insert(*nonce, (account, *cents)).is_some() {
            violations.push(format!(
                "at_most_once_per_key: posting {nonce} applied twice"
            ));
        }
    }
    // No lost job: every acknowledged posting was applied — or, if poison, is dead — and
    // nothing else is dead or left over; a wipe's losses are the wipe's (see the module).
    let wiped: std::collections::BTreeSet<u64> = e.lost_with_wipe().into_iter().collect();
    for (nonce, posting) in e.acked.iter().filter(|(n, _)| !wiped.contains(n)) {
        let poison = e.poison.contains(nonce);
        match rows.get(nonce) {
            Some(_) if poison => violations.push(format!(
                "all_or_nothing: poison posting {nonce} was applied"
            )),
            Some(row) if row == posting => {}
            Some(row) => violations.push(format!(
                "no_lost_job: posting {nonce} applied as {row:?}, enqueued as {posting:?}"
            )),
            None if poison && e.dead_nonces.contains_key(nonce) => {}
            None if poison => violations.push(format!(
                "no_lost_job: poison posting {nonce} neither applied nor dead"
            )),
            None => violations.push(format!(
                "no_lost_job: acknowledged posting {nonce} never applied"
            )),
        }
    }
    // A non-poison posting that died is not lost (invariant 6: dead with its reason is an
    // end), and the checks above hold for it; it is reported apart (`unexpected_dead`) with
    // its reason, since a transient error taken for a permanent one is worth knowing.
    if e.pending > 0 {
        violations.push(format!(
            "no_lost_job: {} jobs still pending after the drain",
            e.pending
        ));
    }
    // All or nothing within the Redis sink: a credit adds to the balance and records its
    // posting in one write, so each balance is the sum of its records.
    let mut recorded: BTreeMap<u32, i64> = BTreeMap::new();
    for (account, cents) in e.credits.values() {
        *recorded.entry(*account).or_default() += cents;
    }
    for account in recorded
        .keys()
        .chain(e.balances.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (want, have) = (
            recorded.get(account).copied().unwrap_or(0),
            e.balances.get(account).copied().unwrap_or(0),
        );
        if want != have {
            violations.push(format!("all_or_nothing: account {account} holds {have} in Redis, its credits record {want}"));
        }
    }
    // Exactly once across sinks: each posting in the Postgres ledger credited once in Redis
    // (each job writes both, each keyed by job), and no other posting credited but one a
    // wipe took after its credit landed (acknowledged or not: an enqueue whose answer was
    // lost can still have run).
    for (nonce, (account, cents)) in &rows {
        match e.credits.get(nonce) {
            Some(&(credited_to, _)) if credited_to != *account => violations.push(format!(
                "all_or_nothing: posting {nonce} credited to account {credited_to} in Redis, account {account} in the ledger"
            )),
            Some(&(_, credited)) if credited == *cents => {}
            // A multiple is the credit applied that often (postings are never 0 cents).
            Some(&(_, credited)) if *cents != 0 && credited % cents == 0 => violations.push(format!(
                "at_most_once_per_key: posting {nonce} credited {} times in Redis",
                credited / cents
            )),
            Some(&(_, credited)) => violations.push(format!(
                "all_or_nothing: posting {nonce} credited {credited} in Redis, {cents} in the ledger"
            )),
            None => violations.push(format!(
                "all_or_nothing: posting {nonce} (account {account}) is in the ledger, its credit not in Redis"
            )),
        }
    }
    for (nonce, (account, credited)) in e.credits.iter().filter(|(n, _)| !rows.contains_key(n)) {
        let poison = e.poison.contains(nonce);
        let taken_by_wipe = *nonce <= e.wiped_through && !e.dead_nonces.contains_key(nonce);
        match e.produced.get(nonce) {
            None => violations.push(format!(
                "all_or_nothing: a credit in Redis for posting {nonce}, which was never made"
            )),
            _ if poison => violations.push(format!(
                "all_or_nothing: poison posting {nonce} credited {credited} in Redis"
            )),
            Some(&(made_for, _)) if made_for != *account => violations.push(format!(
                "all_or_nothing: posting {nonce} for account {made_for} credited to account {account}"
            )),
            Some(&(_, cents)) if taken_by_wipe && cents != *credited => violations.push(format!(
                "at_most_once_per_key: posting {nonce} (account {account}) credited {credited} in Redis for {cents}"
            )),
            Some(_) if taken_by_wipe => {}
            Some(_) => violations.push(format!(
                "all_or_nothing: posting {nonce} (account {account}) credited in Redis, never in the ledger"
            )),
        }
    }
    // Effects: every applied posting's receipt delivered, none for a posting never applied.
    for nonce in rows.keys() {
        if !e.deliveries.contains_key(nonce) {
            violations.push(format!("outbox: posting {nonce}'s receipt never delivered"));
        }
    }
    for nonce in e.deliveries.keys() {
        if !rows.contains_key(nonce) {
            violations.push(format!(
                "outbox: a receipt for posting {nonce}, which was never applied"
            ));
        }
    }
    if e.undelivered > 0 {
        violations.push(format!(
            "outbox: {} entries not delivered after the drain",
            e.undelivered
        ));
    }
    violations
}

/// Non-poison postings that died, with their reasons (not a violation: see `check`).
pub fn unexpected_dead(e: &Evidence) -> Vec<String> {
    e.dead_nonces
        .iter()
        .filter(|(nonce, _)| !e.poison.contains(nonce))
        .map(|(nonce, reason)| format!("posting {nonce}: {reason}"))
        .collect()
}

/// Per sink and scope: every accepted attempt's token must be at least the highest token that
/// had passed the same sink's ownership checks — answered — before the attempt was sent:
/// accepted, or refused for its content only (a content refusal still fences, invariant 8).
fn stale_by_time(attempts: &[Attempt]) -> Vec<String> {
    let accepted = |a: &Attempt| a.outcome == "applied" || a.outcome == "duplicate";
    let owned = |a: &&Attempt| accepted(a) || a.outcome == "mutation";
    let mut by_scope: HashMap<(&str, &str), Vec<&Attempt>> = HashMap::new();
    for a in attempts.iter().filter(owned) {
        by_scope
            .entry((a.sink.as_str(), a.scope.as_str()))
            .or_default()
            .push(a);
    }
    let mut violations = Vec::new();
    for ((sink, scope), mut list) in by_scope {
        list.sort_by_key(|a| a.answered_us);
        // Highest token among the first i answers.
        let prefix: Vec<u64> = list
            .iter()
            .scan(0, |max, a| {
                *max = (*max).max(a.token);
                Some(*max)
            })
            .collect();
        for a in list.iter().filter(|a| accepted(a)) {
            let before = list.partition_point(|b| b.answered_us < a.sent_us);
            if before > 0 && prefix[before - 1] > a.token {
                violations.push(format!(
                    "no_stale_write: {sink} accepted {} on {scope} with token {} after it had admitted {}",
                    a.key,
                    a.token,
                    prefix[before - 1]
                ));
            }
        }
    }
    violations
}

/// A private redis-server with an append-only file, restarted on the same port and file,
/// reading its wall clock from `clock` (the nemesis jumps it).
struct Redis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    clock: SkewedClock,
}

impl Redis {
    fn start(dir: &Path) -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut redis = Self {
            port,
            dir: dir.to_owned(),
            child: None,
            clock: SkewedClock::new(dir),
        };
        redis.spawn()?;
        Ok(redis)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .envs(self.clock.env())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("redis-server is installed (.ci/run installs it)")?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                bail!("redis-server did not come up on port {}", self.port);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }

    /// Deletes every key matching `pattern` in one script: all at once, as a wipe would.
    fn wipe(&self, pattern: &str) -> anyhow::Result<()> {
        let script = "local ks = redis.call('KEYS', ARGV[1]) \
                      for i = 1, #ks, 1000 do \
                      redis.call('DEL', unpack(ks, i, math.min(i + 999, #ks))) end \
                      return #ks";
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "EVAL", script, "0", pattern])
            .output()
            .context("redis-cli is installed with redis-server")?;
        if !out.status.success() || out.stdout.starts_with(b"(error)") {
            bail!("wipe failed: {}", String::from_utf8_lossy(&out.stdout));
        }
        Ok(())
    }

    /// Clean shutdown (the AOF is flushed), then the same server again.
    fn restart(&mut self) -> anyhow::Result<()> {
        self.signal("-CONT");
        self.signal("-TERM");
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        self.spawn()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.signal("-CONT");
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A worker's links, each through a fault proxy: to Redis (its coordinator and its ledger
/// sink) and, where the Postgres URL names a host and port, to Postgres.
struct Links {
    redis: FaultProxy,
    postgres: Option<FaultProxy>,
}

impl Links {
    fn each(&self) -> impl Iterator<Item = &FaultProxy> {
        std::iter::once(&self.redis).chain(&self.postgres)
    }
}

/// `url` (a `postgres://` URL) with its host and port replaced by `127.0.0.1:port`, and the
/// port it named; `None` for a URL without one (key=value form, a socket).
fn through(url: &str, port: u16) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((user, hostport)) => (format!("{user}@"), hostport),
        None => (String::new(), authority),
    };
    let upstream = hostport.rsplit_once(':')?.1.parse().ok()?;
    Some((format!("{scheme}://{user}127.0.0.1:{port}{tail}"), upstream))
}

/// A fault the nemesis undoes later.
enum Undo {
    /// SIGCONT a worker.
    Worker(usize),
    /// SIGCONT Redis.
    Redis,
    /// Heal a worker's links: no partition, no faults.
    Links(usize),
}

/// Lifts a worker's partition and faults.
fn heal(links: &Links) {
    for link in links.each() {
        link.set(LinkFaults::default());
        link.blackhole(false);
    }
}

/// A worker process of this binary.
struct Worker {
    child: Child,
    args: Vec<String>,
}

impl Worker {
    fn start(args: &[String], log: &Path, plant: &[(&str, String)]) -> anyhow::Result<Self> {
        // Every worker's errors, for a worker that exits on its own.
        let errors = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log.with_file_name("workers.log"))?;
        let child = Command::new(std::env::current_exe()?)
            .args(args)
            .env("PALISADE_SOAK_LOG", log)
            .envs(plant.iter().map(|(k, v)| (*k, v)))
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(errors)
            .spawn()?;
        Ok(Self {
            child,
            args: args.to_vec(),
        })
    }

    fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Receipts: a local HTTP endpoint that answers one request in ten 503 and records the body
/// (the posting's nonce) of the others.
fn receiver(deliveries: Arc<Mutex<BTreeMap<u64, u32>>>) -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { continue };
            let deliveries = deliveries.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone a socket"));
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if line.trim().is_empty() {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let status = if n % 10 == 9 {
                    "503 Service Unavailable"
                } else {
                    if let Ok(nonce) = String::from_utf8_lossy(&body).trim().parse::<u64>() {
                        *deliveries.lock().unwrap().entry(nonce).or_default() += 1;
                    }
                    "200 OK"
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            });
        }
    });
    Ok(port)
}

/// What the run did and found, for the final table.
#[derive(Debug, Default)]
pub struct Report {
    /// Postings acknowledged by enqueue.
    pub jobs: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u32>,
    /// Write attempts refused as stale, per sink.
    pub stale_refused: BTreeMap<String, usize>,
    /// Poison postings refused whole.
    pub mutations_refused: usize,
    /// Write attempts refused as a token conflict.
    pub conflicts_refused: usize,
    /// Duplicates (re-runs and retries recognised).
    pub duplicates: usize,
    /// Receipts delivered more than once (at least once, by design).
    pub redelivered: u32,
    /// The checker's findings.
    pub violations: Vec<String>,
    /// Non-poison postings that died (dead with a reason ends a job; worth a look).
    pub unexpected_dead: Vec<String>,
    /// Acknowledged postings lost with a coordinator wipe.
    pub lost_with_wipe: usize,
    /// Postings a wipe took after their credit landed (the sink's record), and how many of
    /// those no handler logged as applied or duplicate (a lost reply, a kill -9 after send).
    pub credited_with_wipe: (usize, usize),
}

/// Runs the soak; the report says what happened and what the checker found.
pub fn run(args: SoakArgs) -> anyhow::Result<Report> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = std::env::temp_dir().join(format!("palisade-soak-{seed}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let log = dir.join("attempts.jsonl");
    let mut redis = Redis::start(&dir)?;
    // Not from the seed: a rerun of a seed must not meet a schema an interrupted run left.
    let schema = format!("soak_{:08x}", rand::random::<u32>());
    let sep = if args.postgres.contains('?') {
        '&'
    } else {
        '?'
    };
    let books = format!(
        "{}{sep}schema={schema}&pool_size={}&options=-csearch_path%3D{schema}",
        args.postgres, args.books_pool
    );
    let epochs = format!("{}{sep}options=-csearch_path%3D{schema}", args.postgres);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let sink = rt
        .block_on(palisade::PostgresSink::connect(&books))
        .context("the soak's Postgres")?;
    rt.block_on(create_tables(&sink))?;
    let deliveries = Arc::new(Mutex::new(BTreeMap::new()));
    let receipts = receiver(deliveries.clone())?;
    println!(
        "palisade-soak soak: seed {seed}, {} workers, {} jobs/s, lease {:?}, {} minutes of faults",
        args.workers, args.rate, args.lease, args.minutes
    );
    println!(
        "  redis {} (AOF), postgres schema {schema}, work dir {}",
        redis.url(),
        dir.display()
    );

    // Each worker reaches Redis and Postgres through its own fault proxies.
    let links: Vec<Links> = (0..args.workers)
        .map(|i| {
            let seed = seed.wrapping_add(i as u64);
            let postgres = through(&args.postgres, 0)
                .map(|(_, upstream)| FaultProxy::start(upstream, seed ^ 0x5047));
            Links {
                redis: FaultProxy::start(redis.port, seed),
                postgres,
            }
        })
        .collect();
    let worker_args = |i: usize| -> Vec<String> {
        let redis_url = links[i].redis.redis_url();
        let (books, epochs) = match &links[i].postgres {
            Some(proxy) => (
                through(&books, proxy.port()).map_or(books.clone(), |(url, _)| url),
                through(&epochs, proxy.port()).map_or(epochs.clone(), |(url, _)| url),
            ),
            None => (books.clone(), epochs.clone()),
        };
        [
            "worker",
            "--redis",
            &redis_url,
            "--name",
            &format!("soak-{i}"),
            "--lease",
            &humantime::format_duration(args.lease).to_string(),
            "--arbiters",
            "1",
            "--concurrency",
            "8",
            "--drain",
            "2s",
            "--sink",
            &format!("{LEDGER}={redis_url}"),
            "--sink",
            &format!("{BOOKS}={books}"),
            "--relay",
            "--target",
            &format!("receipt=http://127.0.0.1:{receipts}/receipts"),
            "--outbox-lease",
            "5s",
            "--outbox-backoff",
            "50ms",
            // A wipe must not cost a refused write: epochs survive it in Postgres.
            "--epoch-postgres",
            &epochs,
        ]
        .map(String::from)
        .to_vec()
    };
    let plant: Vec<(&str, String)> = match args.plant {
        Some(plant) => vec![
            (Plant::ENV, format!("{plant:?}").to_lowercase()),
            ("PALISADE_SOAK_PLANT_URL", books.clone()),
        ],
        None => Vec::new(),
    };
    let mut workers: Vec<Worker> = (0..args.workers)
        .map(|i| Worker::start(&worker_args(i), &log, &plant))
        .collect::<Result<_, _>>()?;
    let client = rt.block_on(Client::connect(&redis.url(), "palisade"))?;

    let mut report = Report::default();
    let mut acked = BTreeMap::new();
    let mut produced = BTreeMap::new();
    let mut poison = std::collections::BTreeSet::new();
    let mut nonce = 0u64;
    let mut evidence_wiped_through = 0u64;
    let started = Instant::now();
    let faults_for = Duration::from_secs_f64(args.minutes * 60.0);
    let bar = ProgressBar::new(faults_for.as_secs()).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len}s  {msg}").expect("static template"),
    );
    let mut next_fault = Instant::now() + Duration::from_millis(rng.random_range(500..2000));
    let mut resume: Vec<(Instant, Undo)> = Vec::new(); // what to undo, when
    let tick = Duration::from_secs(1) / args.rate.max(1);
    while started.elapsed() < faults_for {
        // Produce.
        nonce += 1;
        let account = if rng.random_bool(0.7) {
            rng.random_range(0..5)
        } else {
            rng.random_range(100..100_000)
        };
        let posting = Post {
            nonce,
            account,
            cents: rng.random_range(1..1000),
            hold_ms: rng.random_range(0..300),
            poison: rng.random_bool(0.02),
        };
        let job = NewJob::new(POST, &posting)?
            .with_scope(account_key(account))
            .with_max_attempts(10_000)
            .with_max_stalls(10_000);
        let enqueued = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(2), client.enqueue(job)).await
        });
        // Every posting is known to the checker, acknowledged or not: one whose enqueue's
        // answer was lost can still have run, and its credit must still be right.
        produced.insert(nonce, (account, posting.cents));
        if posting.poison {
            poison.insert(nonce);
        }
        if let Ok(Ok(_)) = enqueued {
            acked.insert(nonce, (account, posting.cents));
        } // else: unknown; the checker only requires acknowledged postings to be applied
          // Resume what is due.
        let now = Instant::now();
        for w in &mut workers {
            if let Ok(Some(status)) = w.child.try_wait() {
                let errors = std::fs::read_to_string(dir.join("workers.log")).unwrap_or_default();
                let tail: Vec<&str> = errors.lines().rev().take(5).collect();
                bail!("a worker exited on its own ({status}): {tail:?}");
            }
        }
        for (_, undo) in resume.iter().filter(|(at, _)| *at <= now) {
            match undo {
                Undo::Worker(w) => workers[*w].signal("-CONT"),
                Undo::Redis => redis.signal("-CONT"),
                Undo::Links(w) => heal(&links[*w]),
            }
        }
        resume.retain(|(at, _)| *at > now);
        // Inject.
        if now >= next_fault {
            let w = rng.random_range(0..workers.len());
            // Every run meets the epoch path at least once, however the draws fall.
            let wipe_due = !report.faults.contains_key(WIPE) && started.elapsed() > faults_for / 2;
            let draw = if wipe_due {
                15
            } else {
                rng.random_range(0..21)
            };
            let mut fleet = Fleet {
                workers: &mut workers,
                redis: &mut redis,
                links: &links,
                resume: &mut resume,
                log: &log,
                plant: &plant,
            };
            let kind = fleet.inject(draw, w, args.lease, &mut rng, now)?;
            if kind == WIPE {
                evidence_wiped_through = nonce;
            }
            *report.faults.entry(kind).or_default() += 1;
            bar.set_message(format!("{} jobs, last fault: {kind}", acked.len()));
            next_fault = now + Duration::from_millis(rng.random_range(1000..4000));
        }
        bar.set_position(started.elapsed().as_secs());
        std::thread::sleep(tick.saturating_sub(Instant::now() - now));
    }
    bar.finish_and_clear();
    // Heal: everything resumed, every link clean, the clock right, then drain.
    redis.signal("-CONT");
    redis.clock.set(0);
    links.iter().for_each(heal);
    for w in &workers {
        w.signal("-CONT");
    }
    println!(
        "  faults stopped after {:.0}s; draining",
        started.elapsed().as_secs_f64()
    );
    // The backlog a long run's faults leave behind drains at the hot scopes' pace.
    let deadline = Instant::now() + Duration::from_secs(180).max(faults_for / 4);
    let mut evidence = Evidence {
        acked,
        produced,
        poison,
        wiped_through: evidence_wiped_through,
        ..Evidence::default()
    };
    wait_for_drain(&rt, &client, &sink, &mut evidence, deadline);
    for w in &workers {
        w.signal("-TERM");
    }
    std::thread::sleep(Duration::from_secs(3));
    workers.clear();
    // Collect the evidence.
    rt.block_on(collect_evidence(
        &sink,
        &client,
        &redis.url(),
        &schema,
        &mut evidence,
    ))?;
    evidence.deliveries = deliveries.lock().unwrap().clone();
    if let Ok(text) = std::fs::read_to_string(&log) {
        evidence.attempts = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
    }
    tally(&mut report, &evidence);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}

/// What the soak's faults act on.
struct Fleet<'a> {
    workers: &'a mut Vec<Worker>,
    redis: &'a mut Redis,
    /// Each worker's links.
    links: &'a [Links],
    /// What to undo, when.
    resume: &'a mut Vec<(Instant, Undo)>,
    log: &'a Path,
    plant: &'a [(&'a str, String)],
}

impl Fleet<'_> {
    /// Injects the fault `draw` (0..21) picks — on worker `w` where it hits a worker — and
    /// names it.
    fn inject(
        &mut self,
        draw: i32,
        w: usize,
        lease: Duration,
        rng: &mut StdRng,
        now: Instant,
    ) -> anyhow::Result<&'static str> {
        Ok(match draw {
            0..=5 => {
                let pause = lease.mul_f64(rng.random_range(0.5..3.0));
                self.workers[w].signal("-STOP");
                self.resume.push((now + pause, Undo::Worker(w)));
                "worker SIGSTOP"
            }
            6..=8 => {
                let args = self.workers[w].args.clone();
                // The process comes back on a healed host: a worker started while its link
                // cuts replies fails its start-up check of the Postgres sink and exits (found
                // by CI; start-up patience is Redis-only so far), which a supervisor would
                // restart, but this harness counts as a crash.
                heal(&self.links[w]);
                self.resume
                    .retain(|(_, undo)| !matches!(undo, Undo::Links(l) if *l == w));
                // The old one is kill -9'd on drop.
                self.workers[w] = Worker::start(&args, self.log, self.plant)?;
                "worker kill -9 + restart"
            }
            9..=11 => {
                let pause = lease.mul_f64(rng.random_range(0.3..2.0));
                self.redis.signal("-STOP");
                self.resume.push((now + pause, Undo::Redis));
                "redis SIGSTOP"
            }
            12..=14 => {
                self.redis.restart()?;
                self.resume.retain(|(_, undo)| !matches!(undo, Undo::Redis));
                "redis restart (AOF)"
            }
            16 | 17 => {
                // A partition: nothing moves between this worker and Redis or Postgres (its
                // sockets stay open, what it sent arrives when it heals), past its lease.
                let cut_off = lease.mul_f64(rng.random_range(0.5..3.0));
                self.links[w].each().for_each(|link| link.blackhole(true));
                self.resume.push((now + cut_off, Undo::Links(w)));
                "worker link partition"
            }
            18 => {
                // A bad link for a while: latency, jitter, drops, replies cut half-way.
                let faults = LinkFaults {
                    latency: Duration::from_millis(rng.random_range(1..20)),
                    jitter: Duration::from_millis(rng.random_range(0..30)),
                    drop: 0.005,
                    cut_reply: 0.02,
                };
                self.links[w].each().for_each(|link| link.set(faults));
                let lasting = lease.mul_f64(rng.random_range(2.0..6.0));
                self.resume.push((now + lasting, Undo::Links(w)));
                "worker lossy link"
            }
            19 => {
                // Replies lost after the server acted: whatever this worker asked next.
                self.links[w]
                    .redis
                    .cut_next_replies(rng.random_range(1..4), b"");
                "worker replies lost"
            }
            20 => {
                // The Redis host's clock steps, ahead (past every live lease) or behind, or
                // back to the real time; never near the sink's key retention (a day).
                let offset = match rng.random_range(0..3) {
                    0 => 0,
                    1 => rng.random_range(2..90),
                    _ => -rng.random_range(2..60),
                };
                self.redis.clock.set(offset);
                "redis clock jump"
            }
            _ => {
                self.redis.signal("-CONT");
                self.resume.retain(|(_, undo)| !matches!(undo, Undo::Redis));
                self.redis.wipe("{palisade}:*")?;
                WIPE
            }
        })
    }
}

/// The tables the `books` sink's handlers write: every posting applied, and every heartbeat.
async fn create_tables(sink: &palisade::PostgresSink) -> anyhow::Result<()> {
    let client = sink.pool().get().await?;
    client
        .batch_execute(
            "CREATE TABLE soak_ledger (id bigserial PRIMARY KEY, nonce bigint NOT NULL, \
             scope text NOT NULL, token bigint NOT NULL, cents bigint NOT NULL); \
             CREATE TABLE soak_beats (id bigserial PRIMARY KEY, scope text NOT NULL, \
             token bigint NOT NULL)",
        )
        .await?;
    Ok(())
}

/// Waits until nothing is queued or running and the outbox is delivered, or `deadline`;
/// records what is left in `evidence`.
fn wait_for_drain(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    sink: &palisade::PostgresSink,
    evidence: &mut Evidence,
    deadline: Instant,
) {
    loop {
        let counts = rt.block_on(client.counts("default"));
        let outbox = rt.block_on(sink.outbox_counts());
        if let (Ok(c), Ok(o)) = (&counts, &outbox) {
            evidence.pending = c.pending();
            evidence.dead = c.dead;
            evidence.undelivered = o.pending + o.dead;
            if c.pending() == 0 && o.pending == 0 {
                break;
            }
        }
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Reads what the run left — the books' rows, the dead letters, the ledger balances — into
/// `evidence`, and drops the run's schema.
async fn collect_evidence(
    sink: &palisade::PostgresSink,
    client: &Client,
    redis_url: &str,
    schema: &str,
    evidence: &mut Evidence,
) -> anyhow::Result<()> {
    let pg = sink.pool().get().await?;
    for row in pg
        .query(
            "SELECT nonce, scope, token, cents FROM soak_ledger ORDER BY id",
            &[],
        )
        .await?
    {
        evidence.ledger.push((
            row.get::<_, i64>(0) as u64,
            row.get(1),
            row.get::<_, i64>(2) as u64,
            row.get(3),
        ));
    }
    for row in pg
        .query("SELECT scope, token FROM soak_beats ORDER BY id", &[])
        .await?
    {
        evidence
            .beats
            .push((row.get(0), row.get::<_, i64>(1) as u64));
    }
    for dead in client.dead("default", 1_000_000).await? {
        if let Ok(p) = serde_json::from_str::<Post>(&dead.job.payload) {
            evidence.dead_nonces.insert(p.nonce, dead.reason.clone());
        }
    }
    let store = palisade::RedisFencedStore::new(
        palisade::store::redis::pool(redis_url)?,
        &format!("palisade-{LEDGER}"),
    );
    let accounts: std::collections::BTreeSet<u32> = evidence
        .ledger
        .iter()
        .filter_map(|(_, s, _, _)| s.trim_start_matches("account:").parse().ok())
        .chain(evidence.produced.values().map(|(account, _)| *account))
        .collect();
    for account in accounts {
        if let Some(palisade::Value::Hash(h)) = store.read(&account_key(account)).await? {
            evidence.balances.insert(
                account,
                h.get("balance").and_then(|b| b.parse().ok()).unwrap_or(0),
            );
            for (field, cents) in &h {
                let nonce = field.strip_prefix("posting:").and_then(|n| n.parse().ok());
                if let (Some(nonce), Ok(cents)) = (nonce, cents.parse()) {
                    evidence.credits.insert(nonce, (account, cents));
                }
            }
        }
    }
    pg.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await?;
    Ok(())
}

/// The report's figures, from the evidence.
fn tally(report: &mut Report, evidence: &Evidence) {
    report.jobs = evidence.acked.len();
    for a in evidence
        .attempts
        .iter()
        .filter(|a| a.outcome == "stale_token")
    {
        *report.stale_refused.entry(a.sink.clone()).or_default() += 1;
    }
    report.mutations_refused = evidence
        .attempts
        .iter()
        .filter(|a| a.outcome == "mutation")
        .count();
    report.conflicts_refused = evidence
        .attempts
        .iter()
        .filter(|a| a.outcome == "token_conflict")
        .count();
    report.duplicates = evidence
        .attempts
        .iter()
        .filter(|a| a.outcome == "duplicate")
        .count();
    report.redelivered = evidence
        .deliveries
        .values()
        .map(|n| n.saturating_sub(1))
        .sum();
    report.violations = check(evidence);
    report.lost_with_wipe = evidence.lost_with_wipe().len();
    let logged: std::collections::BTreeSet<u64> = evidence
        .attempts
        .iter()
        .filter(|a| a.sink == LEDGER && a.key.ends_with("/credit"))
        .filter(|a| a.outcome == "applied" || a.outcome == "duplicate")
        .map(|a| a.nonce)
        .collect();
    let in_ledger: std::collections::BTreeSet<u64> =
        evidence.ledger.iter().map(|(n, ..)| *n).collect();
    let taken: Vec<u64> = evidence
        .credits
        .keys()
        .filter(|n| !in_ledger.contains(n) && **n <= evidence.wiped_through)
        .filter(|n| !evidence.poison.contains(n) && !evidence.dead_nonces.contains_key(n))
        .copied()
        .collect();
    report.credited_with_wipe = (
        taken.len(),
        taken.iter().filter(|n| !logged.contains(n)).count(),
    );
    report.unexpected_dead = unexpected_dead(evidence);
}

/// Prints the final table.
pub fn print(report: &Report) {
    println!("\n  {:<44} {:>8}", "postings acknowledged", report.jobs);
    for (kind, n) in &report.faults {
        println!("  {:<44} {:>8}", format!("fault: {kind}"), n);
    }
    for (sink, n) in &report.stale_refused {
        println!(
            "  {:<44} {:>8}",
            format!("stale writes refused by {sink}"),
            n
        );
    }
    println!(
        "  {:<44} {:>8}",
        "poison mutation lists refused whole", report.mutations_refused
    );
    println!(
        "  {:<44} {:>8}",
        "stale writes accepted",
        report
            .violations
            .iter()
            .filter(|v| v.starts_with("no_stale_write"))
            .count()
    );
    println!(
        "  {:<44} {:>8}",
        "token conflicts refused", report.conflicts_refused
    );
    println!(
        "  {:<44} {:>8}",
        "duplicates recognised (re-runs, retries)", report.duplicates
    );
    println!(
        "  {:<44} {:>8}",
        "postings applied twice",
        report
            .violations
            .iter()
            .filter(|v| v.starts_with("at_most_once"))
            .count()
    );
    println!(
        "  {:<44} {:>8}",
        "jobs lost",
        report
            .violations
            .iter()
            .filter(|v| v.starts_with("no_lost_job"))
            .count()
    );
    println!(
        "  {:<44} {:>8}",
        "postings lost with a coordinator wipe", report.lost_with_wipe
    );
    println!(
        "  {:<44} {:>8}",
        "postings credited, then taken by a wipe", report.credited_with_wipe.0
    );
    println!(
        "  {:<44} {:>8}",
        "  of them, the credit not logged as landed", report.credited_with_wipe.1
    );
    println!(
        "  {:<44} {:>8}",
        "receipts delivered more than once", report.redelivered
    );
    println!(
        "  {:<44} {:>8}",
        "non-poison jobs dead (with reason)",
        report.unexpected_dead.len()
    );
    for d in report.unexpected_dead.iter().take(20) {
        println!("  DEAD: {d}");
    }
    println!("  {:<44} {:>8}", "violations", report.violations.len());
    for v in report.violations.iter().take(20) {
        println!("  VIOLATION: {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Posting `nonce` made and acknowledged.
    fn made(e: &mut Evidence, nonce: u64, account: u32, cents: i64) {
        e.acked.insert(nonce, (account, cents));
        e.produced.insert(nonce, (account, cents));
    }

    fn evidence() -> Evidence {
        let mut e = Evidence::default();
        for (nonce, account, token, cents) in [(1, 0, 5, 10), (2, 0, 7, 20), (3, 1, 6, 5)] {
            e.acked.insert(nonce, (account, cents));
            e.produced.insert(nonce, (account, cents));
            e.ledger
                .push((nonce, format!("account:{account}"), token, cents));
            e.deliveries.insert(nonce, 1);
            e.credits.insert(nonce, (account, cents));
        }
        e.balances = BTreeMap::from([(0, 30), (1, 5)]);
        e
    }

    #[test]
    fn a_clean_history_passes() {
        assert_eq!(check(&evidence()), Vec::<String>::new());
    }

    #[test]
    fn a_stale_write_is_caught() {
        let mut e = evidence();
        // A paused holder of token 6 committed after token 7 on account 0.
        e.ledger.push((4, "account:0".into(), 6, 1));
        made(&mut e, 4, 0, 1);
        e.produced.insert(4, (0, 1));
        e.deliveries.insert(4, 1);
        e.credits.insert(4, (0, 1));
        e.balances.insert(0, 31);
        let v = check(&e);
        assert!(v.iter().any(|v| v.starts_with("no_stale_write")), "{v:?}");
    }

    fn attempt(sink: &str, token: u64, outcome: &str, sent_us: u64, answered_us: u64) -> Attempt {
        Attempt {
            sink: sink.into(),
            nonce: 0,
            scope: "account:0".into(),
            token,
            lease: format!("lease-{token}"),
            key: format!("job/beat-{token}"),
            outcome: outcome.into(),
            sent_us,
            answered_us,
        }
    }

    #[test]
    fn a_stale_write_the_ledger_cannot_show_is_caught_by_the_attempt_times() {
        let mut e = evidence();
        e.attempts = vec![
            attempt("ledger", 7, "applied", 100, 110),
            // Overlapping in time: either order is possible, no verdict.
            attempt("ledger", 6, "applied", 105, 120),
            // Sent after 7's acceptance was answered: must have been refused.
            attempt("books", 7, "applied", 100, 110),
            attempt("books", 6, "stale_token", 200, 210),
        ];
        assert_eq!(check(&e), Vec::<String>::new());
        e.attempts.push(attempt("ledger", 6, "duplicate", 300, 310));
        let v = check(&e);
        assert!(
            v.iter().any(|v| v.contains("ledger accepted job/beat-6")),
            "{v:?}"
        );
    }

    /// A write refused for its content still fenced its token: an older one accepted after it
    /// was answered is stale (the sink before invariant 8 let it in).
    #[test]
    fn a_write_accepted_after_a_newer_content_refusal_is_caught() {
        let mut e = evidence();
        e.attempts = vec![
            attempt("ledger", 7, "mutation", 100, 110),
            attempt("ledger", 6, "stale_token", 200, 210),
        ];
        assert_eq!(check(&e), Vec::<String>::new());
        e.attempts.push(attempt("ledger", 6, "applied", 300, 310));
        let v = check(&e);
        assert!(
            v.iter().any(|v| v.contains("ledger accepted job/beat-6")),
            "{v:?}"
        );
    }

    #[test]
    fn a_stale_beat_is_caught_in_commit_order() {
        let mut e = evidence();
        e.beats = vec![("account:0".into(), 7), ("account:0".into(), 6)];
        let v = check(&e);
        assert!(
            v.iter().any(|v| v.starts_with("no_stale_write: beats")),
            "{v:?}"
        );
    }

    #[test]
    fn a_half_applied_write_is_caught() {
        let mut e = evidence();
        // A refused posting left its Redis credit behind.
        e.balances.insert(1, 5 + 700);
        let v = check(&e);
        assert!(v.iter().any(|v| v.starts_with("all_or_nothing")), "{v:?}");
    }

    #[test]
    fn a_half_applied_poison_posting_is_caught() {
        let mut e = evidence();
        // Poison posting 5 on account 1 was refused and died, but its first step stayed.
        made(&mut e, 5, 1, 40);
        e.poison.insert(5);
        e.dead_nonces.insert(5, "mutation refused".into());
        assert_eq!(check(&e), Vec::<String>::new());
        e.balances.insert(1, 5 + 40);
        let v = check(&e);
        assert!(
            v.iter().any(|v| v.starts_with("all_or_nothing: account 1")),
            "{v:?}"
        );
    }

    #[test]
    fn a_wipe_excuses_only_what_it_took() {
        let mut e = evidence();
        // Postings 4 and 5 were acknowledged before a wipe and never applied; 4's credit
        // landed in Redis before its job vanished (whatever its handler logged), and so did
        // 8's, whose enqueue was never acknowledged.
        made(&mut e, 4, 0, 100);
        made(&mut e, 5, 1, 7);
        e.wiped_through = 8;
        e.produced.insert(8, (0, 2));
        e.credits.insert(4, (0, 100));
        e.credits.insert(8, (0, 2));
        e.balances.insert(0, 30 + 100 + 2);
        assert_eq!(check(&e), Vec::<String>::new());
        assert_eq!(e.lost_with_wipe(), vec![4, 5]);
        // 4 credited twice before the wipe took it: not the wipe's doing.
        e.credits.insert(4, (0, 200));
        e.balances.insert(0, 30 + 200 + 2);
        let v = check(&e);
        assert!(
            v.iter()
                .any(|v| v.starts_with("at_most_once_per_key: posting 4")),
            "{v:?}"
        );
        e.credits.insert(4, (0, 100));
        e.balances.insert(0, 30 + 100 + 2);
        // A posting acknowledged after the wipe is owed as before, both halves.
        made(&mut e, 9, 1, 3);
        e.credits.insert(9, (1, 3));
        e.balances.insert(1, 5 + 3);
        let v = check(&e);
        assert!(
            v.iter()
                .any(|v| v.contains("acknowledged posting 9 never applied")),
            "{v:?}"
        );
        assert!(
            v.iter()
                .any(|v| v.contains("posting 9 (account 1) credited in Redis, never in the ledger")),
            "{v:?}"
        );
    }

    #[test]
    fn a_credit_missing_or_doubled_in_redis_is_caught() {
        let mut e = evidence();
        e.credits.remove(&3);
        e.balances.insert(1, 0);
        let v = check(&e);
        assert!(
            v.iter()
                .any(|v| v
                    .contains("posting 3 (account 1) is in the ledger, its credit not in Redis")),
            "{v:?}"
        );
        e.credits.insert(3, (1, 10));
        e.balances.insert(1, 10);
        let v = check(&e);
        assert!(
            v.iter().any(|v| v.contains("posting 3 credited 2 times")),
            "{v:?}"
        );
        // Credited to another account than the ledger's.
        let mut e = evidence();
        e.credits.insert(3, (0, 5));
        e.balances = BTreeMap::from([(0, 35)]);
        let v = check(&e);
        assert!(
            v.iter()
                .any(|v| v.contains("posting 3 credited to account 0")),
            "{v:?}"
        );
        // Taken by a wipe, never acknowledged, and credited twice first.
        let mut e = evidence();
        e.wiped_through = 8;
        e.produced.insert(8, (0, 2));
        e.credits.insert(8, (0, 4));
        e.balances.insert(0, 30 + 4);
        let v = check(&e);
        assert!(
            v.iter()
                .any(|v| v.starts_with("at_most_once_per_key: posting 8")),
            "{v:?}"
        );
        // A poison posting whose enqueue was never acknowledged, applied whole.
        e.credits.insert(8, (0, 2));
        e.balances.insert(0, 30 + 2);
        assert_eq!(check(&e), Vec::<String>::new());
        e.poison.insert(8);
        let v = check(&e);
        assert!(
            v.iter().any(|v| v.contains("poison posting 8 credited")),
            "{v:?}"
        );
        // A dead poison posting with a record: its list was not refused whole.
        let mut e = evidence();
        made(&mut e, 5, 1, 40);
        e.poison.insert(5);
        e.dead_nonces.insert(5, "mutation refused".into());
        e.credits.insert(5, (1, 40));
        e.balances.insert(1, 45);
        let v = check(&e);
        assert!(
            v.iter().any(|v| v.contains("poison posting 5 credited")),
            "{v:?}"
        );
    }

    #[test]
    fn lost_doubled_and_stray_effects_are_caught() {
        let mut e = evidence();
        made(&mut e, 9, 2, 1); // acknowledged, never applied
        e.ledger.push((2, "account:0".into(), 8, 20)); // applied twice
        e.deliveries.insert(77, 1); // a receipt for nothing
        e.deliveries.remove(&1); // a receipt never sent
        let v = check(&e).join("\n");
        for what in [
            "no_lost_job",
            "at_most_once_per_key",
            "never applied",
            "never delivered",
        ] {
            assert!(v.contains(what), "{what} not reported:\n{v}");
        }
    }
}
