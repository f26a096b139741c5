//! `palisade demo`: the whole story on the embedded (in-memory) backends, no Redis needed.
//!
//! Several workers (each on its own arbiter thread) run a few thousand jobs; one worker is
//! "GC-prone": on its first deposit it blocks its whole thread past its lease — its renewals
//! stop with it, exactly like a stop-the-world pause — while another worker takes the job over.
//! When it wakes, its write is refused by the fenced sink and its completion by the
//! coordinator. The run ends with a summary and exits non-zero unless every balance in the
//! sink equals the expected total.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::{bail, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use palisade::{
    Coordinator, CountJobs, Drain, Enqueue, FencedSink, FencedStore, JobContext, JobError, JobId,
    MemoryFencedStore, MemoryLeaseStore, NewJob, PostgresFencedStore, RedisFencedStore, Registry,
    Sinks, Value, Worker, WorkerConfig,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{account_key, deposit, send_email, Deposit, Email, DEPOSIT, LEDGER};

/// Demo settings (the `palisade demo` flags).
#[derive(Clone, Debug, clap::Args)]
pub struct DemoArgs {
    /// Jobs to enqueue (deposits and emails, plus five slow jobs and two poison jobs).
    #[arg(long, default_value_t = 3000)]
    pub jobs: usize,
    /// Worker actors, each on its own arbiter thread; worker 0 is the GC-prone one.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Handlers per healthy worker.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Accounts the deposits spread over.
    #[arg(long, default_value_t = 40)]
    pub accounts: u32,
    /// Lease length in milliseconds; the GC-prone worker pauses for three of them.
    #[arg(long, default_value_t = 1000)]
    pub lease_ms: u64,
    /// Where to serve Prometheus `/metrics` while the demo runs.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub metrics: SocketAddr,
    /// Keep serving `/metrics` this many seconds after the summary.
    #[arg(long, default_value_t = 0)]
    pub linger_secs: u64,
    /// Random seed for the job mix (printed, so a run can be replayed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep the ledger in a real sink instead of memory: `postgres://…` (a fresh schema
    /// `palisade_demo_<id>` unless the URL names one with `?schema=`) or `redis://…` (a fresh
    /// key prefix). The coordinator stays embedded.
    #[arg(long, value_name = "URL")]
    pub sink: Option<String>,
    /// Also draw the run — jobs/s, leases lost, stale writes refused, over time — into this SVG.
    #[arg(long, value_name = "PATH")]
    pub report: Option<std::path::PathBuf>,
}

/// The demo's ledger store: memory, or a fresh namespace in the sink the user named.
async fn ledger_store(url: Option<&str>) -> anyhow::Result<Arc<dyn FencedStore>> {
    let id = format!("{:08x}", rand::random::<u32>());
    Ok(match url {
        None => Arc::new(MemoryFencedStore::new()),
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            let url = if url.contains("schema=") {
                url.to_owned()
            } else {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}schema=palisade_demo_{id}")
            };
            let store = PostgresFencedStore::connect(&url)
                .await
                .with_context(|| format!("the demo's Postgres sink at {url}"))?;
            println!("ledger: Postgres schema {}", store.sink().schema());
            Arc::new(store)
        }
        Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
            let pool = palisade::store::redis::pool(url)?;
            let prefix = format!("palisade-demo-{id}");
            println!("ledger: Redis key prefix {prefix}");
            Arc::new(RedisFencedStore::new(pool, &prefix))
        }
        Some(other) => bail!("--sink {other:?}: expected postgres://… or redis://…"),
    })
}

/// What happened to the job the GC-prone worker paused on.
#[derive(Default)]
struct Story {
    armed: AtomicBool,
    victim: OnceLock<JobId>,
    lines: Mutex<Vec<String>>,
    stale_finished: AtomicBool,
    started: OnceLock<Instant>,
}

impl Story {
    fn say(&self, line: String) {
        let at = self
            .started
            .get()
            .map_or(0.0, |s| s.elapsed().as_secs_f64());
        self.lines
            .lock()
            .unwrap()
            .push(format!("  {at:7.3}s  {line}"));
    }
}

fn describe(result: &Result<(), JobError>) -> String {
    match result {
        Ok(()) => "write Applied".into(),
        Err(JobError::Fenced(r)) => format!("write Rejected({r:?})"),
        Err(e) => format!("failed: {e}"),
    }
}

/// The deposit handler, instrumented for the story; `pause` makes this worker GC-prone.
fn registry(worker: String, story: Arc<Story>, pause: Option<Duration>) -> Registry {
    Registry::new()
        .register(crate::SEND_EMAIL, send_email)
        .register(DEPOSIT, move |ctx: JobContext, d: Deposit| {
            let (worker, story) = (worker.clone(), story.clone());
            async move {
                let (job, token) = (ctx.job().id, ctx.lease().token);
                // Pause on a deposit that will write (not one that first fails on purpose),
                // so the late write is there to be refused.
                let pausing = pause.is_some()
                    && ctx.job().attempt > d.fail_first_attempts
                    && story.armed.swap(false, Ordering::SeqCst);
                if pausing {
                    let pause = pause.unwrap();
                    let _ = story.victim.set(job);
                    story.say(format!(
                        "{worker}: claimed job {job} ({}) with token {}, lease {:?} left; \
                         stop-the-world pause for {pause:?}",
                        ctx.lease().scope,
                        token.counter(),
                        ctx.lease().remaining()
                    ));
                    // Blocks this worker's whole arbiter thread: handlers, claims and
                    // renewals all stop, as in a GC pause or SIGSTOP.
                    std::thread::sleep(pause);
                    let late = tokio::time::Instant::now()
                        .saturating_duration_since(ctx.lease().expires_at);
                    story.say(format!(
                        "{worker}: woke up; its lease expired {late:?} ago; writing with token {}",
                        token.counter()
                    ));
                }
                let result = deposit(ctx, d).await;
                if story.victim.get() == Some(&job) {
                    story.say(format!(
                        "{worker}: token {} -> {}",
                        token.counter(),
                        describe(&result)
                    ));
                }
                if pausing {
                    story.stale_finished.store(true, Ordering::SeqCst);
                }
                result
            }
        })
}

struct Plan {
    jobs: Vec<NewJob>,
    expected: BTreeMap<u32, i64>,
    deposits: u64,
    poison: u64,
    /// Jobs that wait on purpose (slow jobs, the paused deposit): excluded from throughput.
    waiting: u64,
}

fn plan(args: &DemoArgs, rng: &mut StdRng) -> Plan {
    let mut plan = Plan {
        jobs: Vec::with_capacity(args.jobs + 3),
        expected: BTreeMap::new(),
        deposits: 0,
        poison: 0,
        waiting: 6,
    };
    for i in 0..args.jobs {
        if rng.random_bool(0.8) {
            let d = Deposit {
                account: rng.random_range(0..args.accounts.max(1)),
                cents: rng.random_range(1..=500),
                fail_first_attempts: u32::from(rng.random_bool(0.03)),
                resend_write: rng.random_bool(0.05),
                hold_ms: 0,
            };
            *plan.expected.entry(d.account).or_default() += d.cents;
            plan.deposits += 1;
            plan.jobs.push(d.job());
        } else {
            let email = Email {
                to: format!("user{i}@example.com"),
                millis: rng.random_range(1..5),
            };
            plan.jobs
                .push(NewJob::new(crate::SEND_EMAIL, &email).expect("encodes"));
        }
    }
    // A few slow jobs outlive their first lease: renewals keep them alive (and prove it).
    for i in 0..5 {
        let email = Email {
            to: format!("digest{i}@example.com"),
            millis: args.lease_ms * 5 / 2,
        };
        plan.jobs
            .push(NewJob::new(crate::SEND_EMAIL, &email).expect("encodes"));
    }
    // Poison: bad input must end dead with a reason, never lost and never a panic. A payload
    // that does not decode; and two maximal deposits into one account, of which the second
    // would overflow i64: the sink refuses it whole (`Rejection::Mutation`), so exactly one
    // of the two ends dead. (A kind no worker handles is not poison: it waits for a worker
    // that has a handler.)
    plan.jobs
        .push(NewJob::raw(DEPOSIT, r#"{"account":"one","cents":5}"#));
    for _ in 0..2 {
        let huge = format!(r#"{{"account":{OVERFLOW_ACCOUNT},"cents":{}}}"#, i64::MAX);
        plan.jobs.push(
            NewJob::raw(DEPOSIT, huge)
                .with_scope(crate::account_key(OVERFLOW_ACCOUNT))
                .with_max_attempts(1),
        );
    }
    plan.poison = 2;
    plan
}

/// The account the overflow poison writes to (outside the checked accounts).
const OVERFLOW_ACCOUNT: u32 = 999_999;

/// Runs the demo; `Ok(true)` iff every invariant held.
pub fn run(args: DemoArgs) -> anyhow::Result<bool> {
    if args.workers < 2 {
        bail!("--workers must be at least 2: one GC-prone worker and one to take over");
    }
    let metrics = palisade::metrics::serve_prometheus(args.metrics).with_context(|| {
        format!(
            "serving /metrics on {} (choose another with --metrics)",
            args.metrics
        )
    })?;
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = plan(&args, &mut rng);
    let lease = Duration::from_millis(args.lease_ms);
    let pause = lease * 3;
    println!(
        "palisade demo: {} jobs ({} deposits over {} accounts, {} poison), {} workers, lease {lease:?}, seed {seed}",
        plan.jobs.len(), plan.deposits, args.accounts, plan.poison, args.workers
    );
    println!("metrics: http://{}/metrics", args.metrics);

    let story = Arc::new(Story::default());
    story.armed.store(true, Ordering::SeqCst);

    let system = System::new();
    let mut timeline = crate::report::Timeline::default();
    let run = system.block_on(drive(
        args.clone(),
        plan,
        story.clone(),
        metrics.clone(),
        &mut timeline,
    ))?;
    if let Some(path) = &args.report {
        timeline.sample(run.elapsed.as_secs_f64(), &metrics.render());
        timeline.plot(path)?;
        println!("report: {}", path.display());
    }
    let violations = summarize(&run, &story, &metrics.render(), pause);
    if args.linger_secs > 0 {
        println!("serving /metrics for {}s more", args.linger_secs);
        std::thread::sleep(Duration::from_secs(args.linger_secs));
    }
    Ok(violations.is_empty())
}

/// What a run ended with.
struct Run {
    counts: palisade::QueueCounts,
    elapsed: Duration,
    /// Time to settle all but the slow and the paused jobs.
    bulk: Duration,
    balances: BTreeMap<u32, i64>,
    plan: Plan,
}

/// Enqueues the plan, runs the workers until every job settled (or two minutes and the pause
/// passed), drains them and reads every account back.
async fn drive(
    args: DemoArgs,
    plan: Plan,
    story: Arc<Story>,
    metrics: palisade::metrics::PrometheusHandle,
    timeline: &mut crate::report::Timeline,
) -> anyhow::Result<Run> {
    let lease = Duration::from_millis(args.lease_ms);
    let pause = lease * 3;
    let total = plan.jobs.len() as u64;
    let sink_store = ledger_store(args.sink.as_deref()).await?;
    let coordinator = Coordinator::new(Arc::new(MemoryLeaseStore::new()))
        .with_reap_interval(lease / 10)
        // A demo lasts seconds: sample the queue often enough to see it drain.
        .with_sample_interval(Some(Duration::from_millis(200)))
        .start();
    let sink = FencedSink::new(LEDGER, sink_store.clone()).start();
    let sinks = Sinks::new().with(LEDGER, sink);
    for chunk in plan.jobs.chunks(500) {
        coordinator.send(Enqueue(chunk.to_vec())).await??;
    }
    let _ = story.started.set(Instant::now());
    let started = Instant::now();
    let (workers, arbiters) = start_workers(&args, &coordinator, &sinks, &story, pause).await?;

    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} jobs settled  {per_sec}  {msg}")
            .expect("static template"),
    );
    let deadline = started + Duration::from_secs(120) + pause;
    // Time to settle all but the slow and the paused jobs: the throughput figure, since
    // their waits are idle time by design.
    let mut bulk = None;
    let mut next_sample = Instant::now();
    let counts = loop {
        if args.report.is_some() && Instant::now() >= next_sample {
            timeline.sample(started.elapsed().as_secs_f64(), &metrics.render());
            next_sample += Duration::from_millis(100);
        }
        let counts = coordinator.send(CountJobs("default".into())).await??;
        bar.set_position(counts.completed + counts.dead);
        if bulk.is_none() && counts.completed + counts.dead + plan.waiting >= total {
            bulk = Some(started.elapsed());
        }
        let done = counts.pending() == 0 && story.stale_finished.load(Ordering::SeqCst);
        if done || Instant::now() > deadline {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    bar.finish_and_clear();
    for w in &workers {
        w.send(Drain {
            deadline: Duration::from_secs(5),
        })
        .await?;
    }
    for a in arbiters {
        a.stop();
    }
    let elapsed = started.elapsed();
    let mut balances = BTreeMap::new();
    for account in plan.expected.keys() {
        let v = sink_store_read(&*sink_store, &account_key(*account)).await?;
        balances.insert(*account, v);
    }
    System::current().stop();
    Ok(Run {
        counts,
        elapsed,
        bulk: bulk.unwrap_or(elapsed),
        balances,
        plan,
    })
}

/// Starts the workers, each on its own arbiter: worker 0 GC-prone (one job at a time, its first
/// deposit blocking its thread for `pause`), the others once it holds its victim.
async fn start_workers(
    args: &DemoArgs,
    coordinator: &Addr<Coordinator>,
    sinks: &Sinks,
    story: &Arc<Story>,
    pause: Duration,
) -> anyhow::Result<(Vec<Addr<Worker>>, Vec<Arbiter>)> {
    let lease = Duration::from_millis(args.lease_ms);
    let mut workers = Vec::new();
    let mut arbiters = Vec::new();
    for i in 0..args.workers {
        let name = if i == 0 {
            "worker-0 (gc-prone)".to_string()
        } else {
            format!("worker-{i}")
        };
        let config = WorkerConfig {
            concurrency: if i == 0 { 1 } else { args.concurrency },
            batch: args.concurrency,
            lease_ttl: lease,
            poll_interval: Duration::from_millis(10),
            ..WorkerConfig::new(name.clone())
        };
        let reg = registry(name, story.clone(), (i == 0).then_some(pause));
        let worker = Worker::new(config, coordinator.clone(), reg, sinks.clone())?;
        let arbiter = Arbiter::new();
        workers.push(Worker::start_in_arbiter(&arbiter.handle(), move |_| worker));
        arbiters.push(arbiter);
        if i == 0 {
            // The others start once the GC-prone worker holds its victim: on a busy
            // machine they could otherwise drain every deposit before it claims one,
            // and the story would have no stale write to refuse.
            let wait = Instant::now();
            while story.victim.get().is_none() && wait.elapsed() < Duration::from_secs(30) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }
    Ok((workers, arbiters))
}

/// Prints the stale holder's story, the summary and the invariants checked; the violations.
fn summarize(run: &Run, story: &Story, text: &str, pause: Duration) -> Vec<String> {
    let Run {
        counts,
        elapsed,
        bulk,
        balances,
        plan,
    } = run;
    let total = plan.jobs.len() as u64;
    let m = |name: &str, labels: &[(&str, &str)]| palisade::metrics::sample_sum(text, name, labels);
    let stale = m(
        palisade::metrics::FENCE_REJECTIONS,
        &[("reason", "stale_token")],
    );
    let conflicts = m(
        palisade::metrics::FENCE_REJECTIONS,
        &[("reason", "token_conflict")],
    );
    let wrong: Vec<String> = plan
        .expected
        .iter()
        .filter(|(a, want)| balances.get(a) != Some(want))
        .map(|(a, want)| {
            format!(
                "account {a}: expected {want}, sink holds {:?}",
                balances.get(a)
            )
        })
        .collect();

    println!("\nthe stale holder, step by step:");
    for line in story.lines.lock().unwrap().iter() {
        println!("{line}");
    }
    println!(
        "\nsummary ({:.2}s wall, including the {pause:?} pause):",
        elapsed.as_secs_f64()
    );
    println!(
        "  jobs       completed {:>6}   retried {:>4}   dead {:>3}   stalls {}",
        counts.completed,
        m(palisade::metrics::JOBS_FINISHED, &[("outcome", "retried")]),
        counts.dead,
        m(palisade::metrics::STALLS, &[])
    );
    println!(
        "  writes     applied   {:>6}   duplicate {:>2}   stale-rejected {}   token-conflicts {}",
        m(palisade::metrics::SINK_WRITES, &[("outcome", "applied")]),
        m(palisade::metrics::SINK_WRITES, &[("outcome", "duplicate")]),
        stale,
        conflicts
    );
    println!(
        "  leases     claimed   {:>6}   renewed {}   lost {}   settlements refused {}",
        m(palisade::metrics::CLAIMS, &[]),
        m(palisade::metrics::RENEWALS, &[("outcome", "renewed")]),
        m(palisade::metrics::LEASES_LOST, &[]),
        m(palisade::metrics::SETTLEMENTS_REFUSED, &[])
    );
    println!(
        "  throughput {:.0} jobs/s ({} jobs settled in {:.3}s, excluding the slow and the paused ones; retry backoffs included)",
        (total - plan.waiting) as f64 / bulk.as_secs_f64(),
        total - plan.waiting,
        bulk.as_secs_f64()
    );

    let mut violations = wrong;
    if counts.pending() != 0 {
        violations.push(format!(
            "{} jobs never settled (timed out)",
            counts.pending()
        ));
    }
    if counts.completed != total - plan.poison || counts.dead != plan.poison {
        violations.push(format!(
            "expected {} completed and {} dead, got {} and {}",
            total - plan.poison,
            plan.poison,
            counts.completed,
            counts.dead
        ));
    }
    if stale == 0 {
        violations.push("the stale holder's write was never refused".into());
    }
    if conflicts != 0 {
        violations.push(format!(
            "{conflicts} token conflicts: a token was granted twice"
        ));
    }
    println!(
        "  invariants {} violations; {} account balances match the expected totals",
        violations.len(),
        balances.len()
    );
    for v in &violations {
        println!("  VIOLATION: {v}");
    }
    violations
}

async fn sink_store_read(store: &dyn FencedStore, key: &str) -> anyhow::Result<i64> {
    Ok(match store.read(key).await? {
        Some(Value::Hash(h)) => h.get("balance").map_or(Ok(0), |v| v.parse())?,
        None => 0,
        Some(other) => bail!("{key} holds {other:?}, not a ledger hash"),
    })
}
